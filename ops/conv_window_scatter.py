"""Fused conv-window scatter with mask.

After speculative-decoding verification, copy the accepted draft step's conv window of every
request into the request's conv-state slot, for all layers, in one launch and without a host
sync, so that the call can live inside a CUDA graph. The source is the verify pass's
deduplicated window cache: one ``[dim, draft_tokens + K-2]`` buffer per (layer, request) of
which step ``t`` reads ``[:, t:t+K-1]``, passed as an overlapping ``as_strided`` view, so the
kernel reads it through all five of its strides.

Registration: ``torch.library.triton_op``. Its body validates through the contract in
``strictops.meta.conv_window_scatter`` and launches through ``wrap_triton``; the same body is
the fake implementation, so ``torch.compile``/``torch.export`` run the contract on fake tensors
and Inductor sees the Triton launch itself instead of an opaque custom op.

Semantics: for each request ``i`` with ``row = src_indices_raw[i]`` (or ``i``)::

    valid(i) = 0 <= step[i] < draft_tokens and 0 <= dst_indices_raw[i] < cache_size
               and 0 <= row < spec_size
    dst[l, dst_indices_raw[i]] = src[l, row, step[i]]   for every layer l, if valid(i)

Invalid requests touch no memory. When several valid requests name the same slot the last one
(largest ``i``) wins, as in a sequential loop, so the result never depends on the order in
which programs run.

The device functions here are shared with ``fused_conv_window_scatter_multi``
(``strictops.ops.conv_window_scatter_multi``).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from strictops.meta import conv_window_scatter as contract


from . import mamba_state_scatter
from ._dispatch import can_skip_dispatcher
from ._interpret import interpreted
from ._kernel_path import KernelPath

__all__ = [
    "fused_conv_window_scatter_with_mask",
    "reference",
    "launch_interpreted",
    "example_inputs",
]


@triton.jit
def request_is_valid(slot, row, step, cache_size, spec_size, draft_tokens):
    """Whether a request's int64 indices all lie in range (it copies)."""
    return ((step >= 0) & (step < draft_tokens) & (slot >= 0) & (slot < cache_size)
            & (row >= 0) & (row < spec_size))


@triton.jit
def written_later(slot, first, n, dst_idx_ptr, step_idx_ptr, src_idx_ptr, dst_idx_stride,
                  step_idx_stride, src_idx_stride, cache_size, spec_size, draft_tokens,
                  HAS_SRC_INDICES: tl.constexpr, SCAN: tl.constexpr):
    """Whether a valid request ``j`` in ``[first, n)`` of one index set also writes ``slot``
    (request ``j`` reads row ``src_idx[j]``, or ``j``). Its loads depend on ``first`` only,
    so they are in flight together with the caller's own index loads."""
    later = tl.zeros([SCAN], dtype=tl.int32)
    for j0 in range(first, n, SCAN):
        j = (j0 + tl.arange(0, SCAN)).to(tl.int64)
        in_range = j < n
        s_j = tl.load(step_idx_ptr + j * step_idx_stride, mask=in_range, other=-1).to(tl.int64)
        d_j = tl.load(dst_idx_ptr + j * dst_idx_stride, mask=in_range, other=-1).to(tl.int64)
        if HAS_SRC_INDICES:
            r_j = tl.load(src_idx_ptr + j * src_idx_stride, mask=in_range, other=-1).to(tl.int64)
        else:
            r_j = j
        v_j = in_range & (d_j == slot) & request_is_valid(d_j, r_j, s_j, cache_size, spec_size,
                                                          draft_tokens)
        later = later | v_j.to(tl.int32)
    return tl.max(later, axis=0) > 0


@triton.jit
def copy_window(dst_ptr, src_ptr, layer, slot, row, step, chunk, dim, km1,
                dst_layer_stride, dst_slot_stride, src_layer_stride, src_row_stride,
                src_step_stride, src_dim_stride, src_win_stride,
                BLOCK_DIM: tl.constexpr, BLOCK_WIN: tl.constexpr):
    """``dst[layer, slot, d, :] = src[layer, row, step, d, :]`` for the ``BLOCK_DIM`` rows
    ``d`` of ``chunk``. All index arguments are int64, so no product wraps at 2**31.

    dst_ptr: ``[*, *, dim, km1]`` through its layer and slot strides, entry contiguous.
    src_ptr: ``[*, *, *, dim, km1]`` through its five strides (overlapping windows).
    Rows are whole tiles of ``BLOCK_WIN`` columns: no division by ``km1`` per element.
    """
    d = chunk * BLOCK_DIM + tl.arange(0, BLOCK_DIM)[:, None]
    src = (src_ptr + layer * src_layer_stride + row * src_row_stride + step * src_step_stride
           + d * src_dim_stride)
    dst = dst_ptr + layer * dst_layer_stride + slot * dst_slot_stride + d * km1
    for w0 in range(0, km1, BLOCK_WIN):
        w = w0 + tl.arange(0, BLOCK_WIN)[None, :]
        mask = (d < dim) & (w < km1)
        tl.store(dst + w, tl.load(src + w * src_win_stride, mask=mask), mask=mask)


@triton.jit
def _scatter_kernel(
    dst_ptr, src_ptr, dst_idx_ptr, step_idx_ptr, src_idx_ptr,
    n_requests, cache_size, spec_size, draft_tokens, dim, km1,
    dst_layer_stride, dst_slot_stride,
    src_layer_stride, src_row_stride, src_step_stride, src_dim_stride, src_win_stride,
    dst_idx_stride, step_idx_stride, src_idx_stride,
    HAS_SRC_INDICES: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_WIN: tl.constexpr,
    SCAN: tl.constexpr,
):
    """Copy ``BLOCK_DIM`` rows of one (request, layer) conv window.

    Grid: ``(n_requests * cdiv(dim, BLOCK_DIM), num_layers)``.

    dst_ptr: ``[num_layers, cache_size, dim, km1]``, entry contiguous.
    src_ptr: ``[num_layers, spec_size, draft_tokens, dim, km1]``, any strides.
    dst_idx_ptr / step_idx_ptr / src_idx_ptr: ``[n_requests]`` int32 or int64, any stride.
    """
    pid = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    chunks = tl.cdiv(dim, BLOCK_DIM)
    req = pid // chunks
    chunk = (pid % chunks).to(tl.int64)

    step = tl.load(step_idx_ptr + req.to(tl.int64) * step_idx_stride).to(tl.int64)
    slot = tl.load(dst_idx_ptr + req.to(tl.int64) * dst_idx_stride).to(tl.int64)
    if HAS_SRC_INDICES:
        row = tl.load(src_idx_ptr + req.to(tl.int64) * src_idx_stride).to(tl.int64)
    else:
        row = req.to(tl.int64)
    valid = request_is_valid(slot, row, step, cache_size, spec_size, draft_tokens)
    later = written_later(slot, req + 1, n_requests, dst_idx_ptr, step_idx_ptr, src_idx_ptr,
                          dst_idx_stride, step_idx_stride, src_idx_stride, cache_size,
                          spec_size, draft_tokens, HAS_SRC_INDICES, SCAN)
    if valid and not later:
        copy_window(dst_ptr, src_ptr, layer, slot, row, step, chunk, dim, km1,
                    dst_layer_stride, dst_slot_stride, src_layer_stride, src_row_stride,
                    src_step_stride, src_dim_stride, src_win_stride, BLOCK_DIM, BLOCK_WIN)


# Tuning, swept by benchmarks/bench_conv_window_scatter.py: bytes one program's tile spans (rows
# x BLOCK_WIN columns) and warps per program. 2 KiB is the original's 1024 elements a program;
# sm_90 registers by tile: docs/design/conv_window_scatter.md.
TUNING = {"block_bytes": 2048, "num_warps": 4}
# Columns of one tile: K-1 is 3 for the usual K = 4 (a fourth column is masked off).
BLOCK_WIN = 4
# Requests compared per step of the duplicate-slot scan.
SCAN = 128


def block_dim(element_size: int, block_bytes: int) -> int:
    """Rows of one program's tile (a power of two from the dtype only, never from a size)."""
    return max(block_bytes // (BLOCK_WIN * element_size), 16)


def _arguments(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw,
               block_bytes=TUNING["block_bytes"]):
    """The grid and every kernel parameter, in signature order, of a call on validated inputs
    (on the eager hot path: each piece of metadata read once)."""
    shape, dst_strides, src_shape, s = dst.shape, dst.stride(), src.shape, src.stride()
    rows = block_dim(dst.element_size(), block_bytes)
    n_requests = step_indices_raw.shape[0]
    src_idx = step_indices_raw if src_indices_raw is None else src_indices_raw
    grid = (n_requests * ((shape[2] + rows - 1) // rows), shape[0], 1)
    return grid, (
        dst, src, dst_indices_raw, step_indices_raw, src_idx,
        n_requests, shape[1], src_shape[1], src_shape[2], shape[2], shape[3],
        dst_strides[0], dst_strides[1], s[0], s[1], s[2], s[3], s[4],
        dst_indices_raw.stride(0), step_indices_raw.stride(0), src_idx.stride(0),
        src_indices_raw is not None, rows, BLOCK_WIN, SCAN,
    )


# The launch paths (strictops.ops._kernel_path): the op's body (also its fake) validates in
# full and launches through ``kernel[grid]``; a plain eager call takes the contract's cached
# verdict and the cached launcher (strictops.ops._launcher); the same rules and the same launch.
_PATH = KernelPath(_scatter_kernel, contract.CONTRACT, contract.ARGUMENTS, _arguments,
                   TUNING["num_warps"])
_launch, _forward, _eager = _PATH.launch, _PATH.forward, _PATH.eager
_VALIDATION, _LAUNCHER, _OPTIONS = _PATH.validation, _PATH.launcher, _PATH.options


@triton_op(contract.CONTRACT.op, mutates_args=contract.CONTRACT.mutates)
def _fused_conv_window_scatter_with_mask(
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


def fused_conv_window_scatter_with_mask(
    dst: torch.Tensor,
    src: torch.Tensor,
    dst_indices_raw: torch.Tensor,
    step_indices_raw: torch.Tensor,
    src_indices_raw: Optional[torch.Tensor] = None,
) -> None:
    """Scatter each accepted draft step's conv window into its conv-state slot, in place.

    Parameters
    ----------
    dst : torch.Tensor
        ``[num_layers, cache_size, dim, K-1]`` CUDA tensor (the conv-state pool), written in
        place. Dims 2..3 must be contiguous; layer and slot strides may be anything.
    src : torch.Tensor
        ``[num_layers, spec_size, draft_tokens, dim, K-1]``, ``dst.dtype``, on ``dst``'s device,
        any strides (usually overlapping windows of a shared ``[..., dim, draft_tokens + K-2]``
        buffer), inside its storage.
    dst_indices_raw : torch.Tensor
        ``[total_requests]`` int32/int64: the slot of each request.
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
    """
    if can_skip_dispatcher(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw):
        _eager(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw)
        torch.autograd.graph.increment_version(dst)  # what the dispatcher does for a(!) args
        return
    torch.ops.strictops.fused_conv_window_scatter_with_mask(
        dst, src, dst_indices_raw, step_indices_raw, src_indices_raw
    )


def launch_interpreted(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None,
                       reverse_programs=False, **tuning):
    """Run the kernel through the Triton interpreter on CPU tensors (tests, self-check);
    ``reverse_programs`` runs the programs in reverse grid order (see ``_interpret``)."""
    with interpreted(_scatter_kernel, reverse_programs) as kernel:
        _launch(kernel, dst, src, dst_indices_raw, step_indices_raw, src_indices_raw, **tuning)


def window_view(shared: torch.Tensor, draft_tokens: int, km1: int) -> torch.Tensor:
    """``[L, spec, draft_tokens, dim, km1]`` overlapping window view of a contiguous shared
    buffer ``[L, spec, dim, draft_tokens + km1 - 1]``: step ``t`` reads ``[..., t:t+km1]``."""
    L, spec, dim, width = shared.shape
    return shared.as_strided((L, spec, draft_tokens, dim, km1),
                             (spec * dim * width, dim * width, 1, width, 1))


def example_inputs(device: str, small: bool, generator: torch.Generator) -> dict:
    """Keyword arguments of a valid call whose index values reach every path of the kernel.

    ``small``: interpreter-sized, pairwise-distinct sizes >= 2. ``dst`` ``[L, cache, dim, km1]``
    and ``src`` (an overlapping window view) are random bf16; ``dst_indices_raw`` (int32),
    ``step_indices_raw`` (int64) and ``src_indices_raw`` (int32) hold random valid values,
    except one negative and one out-of-range value each (requests 0-5), and requests 6-8 name
    one slot with 6 and 7 valid and 8 skipped: 7 must overwrite 6.
    """
    if small:
        d = contract.Dims(num_layers=2, cache_size=7, spec_size=13, draft_tokens=3, dim=19,
                          km1=5, total_requests=11)
    else:
        d = contract.Dims(num_layers=4, cache_size=256, spec_size=64, draft_tokens=4,
                          dim=2048, km1=3, total_requests=48)
    d = dataclasses.replace(d, device=device, with_src_indices=True,
                            index_dtypes=(torch.int32, torch.int64, torch.int32))
    n = d.total_requests
    slot = torch.randint(0, d.cache_size, (n,), generator=generator)
    step = torch.randint(0, d.draft_tokens, (n,), generator=generator)
    row = torch.randint(0, d.spec_size, (n,), generator=generator)
    slot[0], slot[1] = -1, d.cache_size
    step[2], step[3] = -1, d.draft_tokens
    row[4], row[5] = -1, d.spec_size
    slot[7] = slot[8] = slot[6]
    step[8] = -1
    shared = torch.randn(d.num_layers, d.spec_size, d.dim, d.draft_tokens + d.km1 - 1,
                         generator=generator)
    return {
        "dst": torch.randn(d.num_layers, d.cache_size, d.dim, d.km1, generator=generator)
        .to(device=device, dtype=d.dtype),
        "src": window_view(shared.to(device=device, dtype=d.dtype), d.draft_tokens, d.km1),
        "dst_indices_raw": slot.to(device=device, dtype=torch.int32),
        "step_indices_raw": step.to(device=device, dtype=torch.int64),
        "src_indices_raw": row.to(device=device, dtype=torch.int32),
    }


def reference(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None):
    """Plain-PyTorch reference: a new tensor equal to ``dst`` after the op.

    The math is the state scatter's, on a window-shaped state (``src`` read through its
    strides by PyTorch indexing): see ``strictops.ops.mamba_state_scatter.reference``.
    A copy is exact, so no upcast is needed.
    """
    return mamba_state_scatter.reference(dst, src, dst_indices_raw, step_indices_raw,
                                         src_indices_raw)
