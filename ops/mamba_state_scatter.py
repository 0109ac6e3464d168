"""Fused Mamba state scatter with mask: ``fused_mamba_state_scatter_with_mask``.

After speculative-decoding verification, copy the accepted draft step's recurrent state of every
request into the request's cache slot, for all layers, in one launch and without a host sync, so
that the call can live inside a CUDA graph.

Registration: ``torch.library.triton_op``. Its body validates through the contract in
``strictops.meta.mamba_state_scatter`` and launches through ``wrap_triton``; the same body is the
fake implementation, so ``torch.compile``/``torch.export`` run the contract on fake tensors (a bad
call fails at trace time with the eager message) and Inductor sees the Triton launch itself
instead of an opaque custom op.

Semantics: for each request ``i`` with ``row = src_indices_raw[i]`` (or ``i``)::

    valid(i) = step[i] >= 0 and step[i] < draft_tokens
               and 0 <= dst_indices_raw[i] < cache_size and 0 <= row < spec_size
    dst[l, dst_indices_raw[i]] = src[l, row, step[i]]   for every layer l, if valid(i)

Invalid requests touch no memory. When several valid requests name the same cache slot the
last one (largest ``i``) wins, as in a sequential loop, so the result never depends on the
order in which programs run.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from strictops.meta import mamba_state_scatter as contract

from ._dispatch import can_skip_dispatcher
from ._interpret import interpreted
from ._host_path import MISS
from ._kernel_path import KernelPath

# The public function. ``reference``, ``unfused_torch``, ``launch_interpreted`` and
# ``example_inputs`` are for tests, benchmarks and the self-check: importable by name, not
# exported.
__all__ = ["fused_mamba_state_scatter_with_mask"]


@triton.jit
def _scatter_kernel(
    dst_ptr,
    src_ptr,
    dst_idx_ptr,
    step_idx_ptr,
    src_idx_ptr,
    n_requests,
    cache_size,
    spec_size,
    draft_tokens,
    entry_numel,
    dst_layer_stride,
    dst_slot_stride,
    dst_idx_stride,
    step_idx_stride,
    src_idx_stride,
    HAS_SRC_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,
    SCAN: tl.constexpr,
):
    """Copy one ``BLOCK``-element chunk of one (request, layer) entry.

    Grid: ``(n_requests * cdiv(entry_numel, BLOCK), num_layers)``.

    dst_ptr: ``[num_layers, cache_size, entry_numel]`` through ``dst_layer_stride`` /
        ``dst_slot_stride``; the entry itself is contiguous.
    src_ptr: ``[num_layers, spec_size, draft_tokens, entry_numel]``, contiguous (its strides
        follow from the sizes; fewer arguments make a cheaper launch).
    dst_idx_ptr / step_idx_ptr / src_idx_ptr: ``[n_requests]`` int32 or int64, any stride.
    """
    pid = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    chunks_per_entry = tl.cdiv(entry_numel, BLOCK)
    req = pid // chunks_per_entry
    chunk = (pid % chunks_per_entry).to(tl.int64)

    step = tl.load(step_idx_ptr + req * step_idx_stride).to(tl.int64)
    slot = tl.load(dst_idx_ptr + req * dst_idx_stride).to(tl.int64)
    if HAS_SRC_INDICES:
        row = tl.load(src_idx_ptr + req * src_idx_stride).to(tl.int64)
    else:
        row = req.to(tl.int64)
    valid = (step >= 0) & (step < draft_tokens) & (slot >= 0) & (slot < cache_size)
    valid = valid & (row >= 0) & (row < spec_size)

    # Last writer wins: skip if a later valid request targets the same slot. The scan's loads
    # do not depend on this request's indices, so they are in flight together with them and
    # the data copy waits for one round of index loads, not two.
    later = tl.zeros([SCAN], dtype=tl.int32)
    for j0 in range(0, n_requests, SCAN):
        j = j0 + tl.arange(0, SCAN)
        in_range = (j > req) & (j < n_requests)
        s_j = tl.load(step_idx_ptr + j * step_idx_stride, mask=in_range, other=-1).to(tl.int64)
        d_j = tl.load(dst_idx_ptr + j * dst_idx_stride, mask=in_range, other=-1).to(tl.int64)
        if HAS_SRC_INDICES:
            r_j = tl.load(src_idx_ptr + j * src_idx_stride, mask=in_range, other=-1).to(tl.int64)
        else:
            r_j = j.to(tl.int64)
        v_j = in_range & (s_j >= 0) & (s_j < draft_tokens) & (d_j == slot)
        v_j = v_j & (r_j >= 0) & (r_j < spec_size)
        later = later | v_j.to(tl.int32)
    if (not valid) or (tl.max(later, axis=0) > 0):
        return

    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < entry_numel
    # int64 from the left: layer, row and step are int64, so no product wraps at 2**31.
    src_entry = (layer * spec_size + row) * draft_tokens + step
    src_base = src_ptr + src_entry * entry_numel
    dst_base = dst_ptr + layer * dst_layer_stride + slot * dst_slot_stride
    data = tl.load(src_base + offs, mask=mask)
    tl.store(dst_base + offs, data, mask=mask)


# Bytes one program copies and warps per program: 4 KiB / 4 warps reach 0.94 of the copy
# bandwidth on the large SSM shape on the H200 (16 KiB: 0.91); the benchmark sweeps the rest.
# Why: docs/design/mamba_state_scatter.md#tuning
TUNING = {"block_bytes": 4096, "num_warps": 4}
# Requests compared per step of the duplicate-slot scan: one vector of loads per step, so a
# batch of up to 128 requests is one round trip (docs/design/mamba_state_scatter.md#kernel).
SCAN = 128


def _arguments(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw,
               block_bytes=TUNING["block_bytes"]):
    """The grid and every kernel parameter, in signature order, of a call on validated inputs.

    On the eager hot path, so it reads each piece of metadata once and avoids helpers with
    per-call overhead (``triton.cdiv`` costs more than the rest of this function together).
    """
    shape, dst_strides, src_shape = dst.shape, dst.stride(), src.shape
    entry_numel = math.prod(shape[2:])
    block = max(block_bytes // dst.element_size(), 16)
    chunks_per_entry = (entry_numel + block - 1) // block
    n_requests = step_indices_raw.shape[0]
    src_idx = step_indices_raw if src_indices_raw is None else src_indices_raw
    grid = (n_requests * chunks_per_entry, shape[0], 1)
    return grid, (
        dst, src, dst_indices_raw, step_indices_raw, src_idx,
        n_requests, shape[1], src_shape[1], src_shape[2], entry_numel,
        dst_strides[0], dst_strides[1],
        dst_indices_raw.stride()[0], step_indices_raw.stride()[0], src_idx.stride()[0],
        src_indices_raw is not None, block, SCAN,
    )


# The launch paths (strictops.ops._kernel_path): the op's body (also its fake) validates in
# full and launches through ``kernel[grid]``; a plain eager call takes the contract's cached
# verdict and the cached launcher (strictops.ops._launcher); the same rules and the same launch.
_PATH = KernelPath(_scatter_kernel, contract.CONTRACT, contract.ARGUMENTS, _arguments,
                   TUNING["num_warps"], writes=("dst",))
_launch, _forward, _eager = _PATH.launch, _PATH.forward, _PATH.eager
_VALIDATION, _LAUNCHER, _OPTIONS = _PATH.validation, _PATH.launcher, _PATH.options
_HOST_CALL = _PATH.host.call


@triton_op(contract.CONTRACT.op, mutates_args=contract.CONTRACT.mutates)
def _fused_mamba_state_scatter_with_mask(
    dst: torch.Tensor,
    src: torch.Tensor,
    dst_indices_raw: torch.Tensor,
    step_indices_raw: torch.Tensor,
    src_indices_raw: Optional[torch.Tensor] = None,
) -> None:
    # The body is also the fake: under fake tensors the launch is recorded, not run
    # (wrap_triton returns the kernel itself outside tracing: a real launch).
    kernel = wrap_triton(_scatter_kernel)
    _forward(kernel, kernel is _scatter_kernel, dst, src, dst_indices_raw, step_indices_raw,
             src_indices_raw)


def fused_mamba_state_scatter_with_mask(
    dst: torch.Tensor,
    src: torch.Tensor,
    dst_indices_raw: torch.Tensor,
    step_indices_raw: torch.Tensor,
    src_indices_raw: Optional[torch.Tensor] = None,
) -> None:
    """Scatter each accepted draft step's state into its cache slot, for all layers, in place.

    Parameters
    ----------
    dst : torch.Tensor
        ``[num_layers, cache_size, *state_shape]`` CUDA tensor, written in place. The entry
        dims (``2..``) must be contiguous; layer and slot strides may be anything.
    src : torch.Tensor
        ``[num_layers, spec_size, draft_tokens, *state_shape]``, contiguous, ``dst.dtype``,
        on ``dst``'s device.
    dst_indices_raw : torch.Tensor
        ``[total_requests]`` int32/int64: the cache slot of each request.
    step_indices_raw : torch.Tensor
        ``[total_requests]`` int32/int64: the accepted draft step; ``< 0`` skips the request.
    src_indices_raw : torch.Tensor, optional
        ``[total_requests]`` int32/int64: the ``src`` row of each request (default: ``i``).

    Notes
    -----
    ``dst[l, dst_indices_raw[i]] = src[l, row_i, step_indices_raw[i]]`` for every layer and
    every request whose indices are all in range; other requests are skipped without touching
    memory, and when two valid requests name one slot the later request wins. One kernel
    launch, no host sync, no copy of the index tensors. Bad metadata raises ``ValueError``
    before launch in eager mode and at trace time under ``torch.compile``/``torch.export``.
    In plain eager mode the call skips the dispatcher (see ``strictops.ops._dispatch``);
    ``torch.ops.strictops.fused_mamba_state_scatter_with_mask`` is the same op through it.
    """
    if not torch.compiler.is_compiling() and _HOST_CALL(  # a signature served before
            dst, src, dst_indices_raw, step_indices_raw, src_indices_raw) is not MISS:
        return
    if can_skip_dispatcher(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw):
        _eager(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw)
        torch.autograd.graph.increment_version(dst)  # what the dispatcher does for a(!) args
        return
    torch.ops.strictops.fused_mamba_state_scatter_with_mask(
        dst, src, dst_indices_raw, step_indices_raw, src_indices_raw
    )


def launch_interpreted(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None,
                       reverse_programs=False, **tuning):
    """Run the kernel through the Triton interpreter on CPU tensors (tests, self-check).

    The public op keeps its CUDA-only contract; this launcher exists so that CI, which has no
    GPU, can check the kernel's arithmetic and its handling of bad index values.
    ``reverse_programs`` runs the programs in reverse grid order (see ``_interpret``).
    """
    with interpreted(_scatter_kernel, reverse_programs) as kernel:
        _launch(kernel, dst, src, dst_indices_raw, step_indices_raw, src_indices_raw, **tuning)


def example_inputs(device: str, small: bool, generator: torch.Generator) -> dict:
    """Keyword arguments of a valid call whose index values reach every path of the kernel.

    Parameters
    ----------
    device : str
        Device of every tensor: ``"cpu"`` for :func:`launch_interpreted`, ``"cuda:N"`` for the op.
    small : bool
        Interpreter-sized shapes instead of a moderate GPU shape. The small sizes are pairwise
        distinct and >= 2, so the self-check can also trace them with dynamic shapes without
        Dynamo specialising (0/1) or duck-sizing (equal sizes) any of them.
    generator : torch.Generator
        CPU generator behind every random value.

    Returns
    -------
    dict
        ``dst`` ``[num_layers, cache_size, *state_shape]`` and ``src``
        ``[num_layers, spec_size, draft_tokens, *state_shape]``: random float32.
        ``dst_indices_raw`` (int32), ``step_indices_raw`` (int64) and ``src_indices_raw``
        (int32), each ``[total_requests]``: random valid values, except that each holds one
        negative and one out-of-range value (requests 0-5), and requests 6-8 name one slot with
        6 and 7 valid and 8 skipped: 7 must overwrite 6, and 8 must not count as a writer.
    """
    if small:
        dims = contract.Dims(num_layers=2, cache_size=7, spec_size=13, draft_tokens=3,
                             state_shape=(4, 5), total_requests=11)
    else:
        dims = contract.Dims(num_layers=4, cache_size=256, spec_size=64, draft_tokens=4,
                             state_shape=(8, 64, 32), total_requests=48)
    dims = dataclasses.replace(dims, device=device, with_src_indices=True,
                               index_dtypes=(torch.int32, torch.int64, torch.int32))
    n = dims.total_requests
    slot = torch.randint(0, dims.cache_size, (n,), generator=generator)
    step = torch.randint(0, dims.draft_tokens, (n,), generator=generator)
    row = torch.randint(0, dims.spec_size, (n,), generator=generator)
    slot[0], slot[1] = -1, dims.cache_size
    step[2], step[3] = -1, dims.draft_tokens
    row[4], row[5] = -1, dims.spec_size
    slot[7] = slot[8] = slot[6]
    step[8] = -1
    values = {"dst_indices_raw": slot, "step_indices_raw": step, "src_indices_raw": row}
    out = {}
    for name, spec in contract.valid_spec(dims).items():
        value = values.get(name)
        if value is None:
            value = torch.randn(spec.shape, generator=generator, dtype=spec.dtype)
        out[name] = value.to(device=spec.device, dtype=spec.dtype)
    return out


def _valid_last_writer(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw):
    """Boolean ``[n]`` mask of requests that write (valid, and no later valid request shares
    their slot), plus the int64 slot / row / step of every request."""
    n = step_indices_raw.shape[0]
    slot = dst_indices_raw.long()
    step = step_indices_raw.long()
    row = (src_indices_raw.long() if src_indices_raw is not None
           else torch.arange(n, device=step.device))
    valid = ((step >= 0) & (step < src.shape[2]) & (slot >= 0) & (slot < dst.shape[1])
             & (row >= 0) & (row < src.shape[1]))
    same_slot_later = (slot[None, :] == slot[:, None]) & valid[None, :]
    same_slot_later = torch.triu(same_slot_later, diagonal=1).any(dim=1)
    return valid & ~same_slot_later, slot, row, step


def reference(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None):
    """Plain-PyTorch reference: returns a new tensor equal to ``dst`` after the op.

    Works on any device; O(n²) in the number of requests (it resolves duplicate slots
    explicitly), which is fine for tests. A copy is exact, so no upcast is needed.
    """
    out = dst.clone()
    writes, slot, row, step = _valid_last_writer(dst, src, dst_indices_raw, step_indices_raw,
                                                 src_indices_raw)
    w = writes.nonzero(as_tuple=True)[0]
    out[:, slot[w]] = src[:, row[w], step[w]]
    return out


def unfused_torch(dst, src, dst_indices_raw, step_indices_raw):
    """The unfused PyTorch path the fused kernel replaces (benchmark baseline):
    ``nonzero`` + ``index_select`` + ``index_put``; it syncs the host."""
    valid = (step_indices_raw >= 0).nonzero(as_tuple=True)[0]
    slots = dst_indices_raw.index_select(0, valid).long()
    steps = step_indices_raw.index_select(0, valid).long()
    dst[:, slots] = src[:, valid, steps]
