"""Fused conv-window scatter with mask.

After speculative-decoding verification, copy the accepted draft step's conv window of every
request into the request's conv-state slot, for all layers, in one launch and without a host
sync, so that the call can live inside a CUDA graph. The source is the verify pass's
deduplicated window cache: one ``[dim, draft_tokens + K-2]`` buffer per (layer, request) of
which step ``t`` reads ``[:, t:t+K-1]``, passed as an overlapping ``as_strided`` view, so the
kernel reads it through all five of its strides.

Registration: ``torch.library.triton_op``. Its body validates through the contract in
``strictops.meta.mamba.conv_window_scatter`` and launches through ``wrap_triton``; the same body is
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
(``strictops.ops.mamba.conv_window_scatter_multi``).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from strictops.meta.mamba import conv_window_scatter as contract

from strictops.ops.mamba import state_scatter as mamba_state_scatter
from strictops.ops._runtime.dispatch import can_skip_dispatcher
from strictops.ops._runtime.host_path import MISS
from strictops.ops._runtime.interpret import interpreted
from strictops.ops._runtime.kernel_path import KernelPath
from strictops.ops.mamba.state_scatter import request_is_valid, written_later

__all__ = [
    "fused_conv_window_scatter_with_mask",
    "reference",
    "launch_interpreted",
    "example_inputs",
]


@triton.jit
def layers_by_elements(layer0, N: tl.constexpr, LAYERS: tl.constexpr, RUN: tl.constexpr):
    """The layer and element index of ``LAYERS`` x ``N`` lanes, in the shape that decides the
    layout of the gathering loads (Triton gives a load the layout of the store it feeds when
    their shapes and orders agree, else one of its own):

    * ``RUN > 0``: one flat ``[LAYERS * N]`` run, layer-major, whose element index Triton
      sees contiguous in groups of ``RUN`` (the values are ``f % N`` either way): each thread
      loads and stores ``RUN`` consecutive elements (a ``RUN``-element vector store), no
      exchange. A smaller ``RUN`` puts a warp's load on fewer cache lines.
    * ``RUN == 0``: a ``[LAYERS, N]`` tile: the load's pointer has no contiguity on either
      axis, Triton gives it consecutive elements in consecutive lanes, and the values reach
      the store's vectors through shared memory.
    """
    if RUN == 0:
        return layer0 + tl.arange(0, LAYERS)[:, None], tl.arange(0, N)[None, :]
    else:
        f = tl.arange(0, LAYERS * N)
        return layer0 + f // N, (f // RUN * RUN) % N + f % RUN


@triton.jit
def copy_window(dst_ptr, src_ptr, layer0, num_layers, slot, row, step, chunk, dim, km1,
                dst_layer_stride, dst_slot_stride, src_layer_stride, src_row_stride,
                src_step_stride, src_dim_stride, src_win_stride,
                BLOCK: tl.constexpr, LAYERS: tl.constexpr, RUN: tl.constexpr,
                STREAM: tl.constexpr, I32_REACH: tl.constexpr):
    """``dst[l, slot].flatten()[e] = src[l, row, step, e // km1, e % km1]`` for the layers
    ``l`` in ``[layer0, layer0 + LAYERS)`` below ``num_layers`` and the ``BLOCK`` flat entry
    elements ``e`` of ``chunk`` that lie inside the entry. ``layer0``, ``slot``, ``row``,
    ``step`` and ``chunk`` are int64, so no product wraps at 2**31.

    dst_ptr: ``[num_layers, *, dim, km1]`` through its layer and slot strides, entry
    contiguous: the stores are contiguous runs of ``BLOCK`` elements (vectors where Triton's
    specialisation of the strides and ``dim`` proves them aligned; no hint beyond it).
    src_ptr: ``[num_layers, *, *, dim, km1]`` through its five strides (overlapping windows).
    ``RUN``: the loads' layout (``layers_by_elements``). ``STREAM``: loads marked evict-first
    and streaming stores (``.cs``), so that data used once leaves L2 first.

    ``km1`` is a runtime value (never a constexpr: a size would be specialised), so ``e`` is
    decoded without a division, once for all ``LAYERS`` layers: ``e // km1 = umulhi(2e,
    ceil(2**31 / km1))``, exact while ``e * km1 < 2**31`` (the error stays below one step of
    ``1 / km1``), with int32 offsets from the run's first row while they stay below
    ``I32_REACH``. A larger entry or stride takes the int64 path. Either way ``e < dim * km1``
    bounds every access. Design note: docs/design/conv_window_scatter.md#kernel-shape
    """
    n = tl.cast(dim, tl.int64) * km1
    e0 = chunk * BLOCK
    src = src_ptr + row * src_row_stride + step * src_step_stride
    dst = dst_ptr + slot * dst_slot_stride + e0
    EVICT: tl.constexpr = "evict_first" if STREAM else ""
    STORE: tl.constexpr = ".cs" if STREAM else ""
    # Element e0 + i lies less than BLOCK rows and km1 columns past the run's first row.
    reach = (BLOCK * tl.cast(src_dim_stride, tl.int64)
             + tl.cast(km1, tl.int64) * src_win_stride)
    if (n * km1 < I32_REACH) & (reach < I32_REACH):
        layer, i = layers_by_elements(layer0, BLOCK, LAYERS, RUN)
        k = tl.maximum(tl.cast(km1, tl.int32), 1)  # km1 = 0: an empty entry, nothing copied
        magic = ((1 << 31) - 1) // tl.cast(k, tl.uint32) + 1
        first = tl.cast(e0, tl.int32)
        d0 = tl.umulhi(tl.cast(first * 2, tl.uint32), magic).to(tl.int32)
        t = first - d0 * k + i
        q = tl.umulhi(tl.cast(t * 2, tl.uint32), magic).to(tl.int32)
        off = q * tl.cast(src_dim_stride, tl.int32) + (t - q * k) * tl.cast(src_win_stride,
                                                                             tl.int32)
        window = src + d0.to(tl.int64) * src_dim_stride + layer * src_layer_stride + off
        mask = (layer < num_layers) & (i < n - e0)
        tl.store(dst + layer * dst_layer_stride + i,
                 tl.load(window, mask=mask, eviction_policy=EVICT), mask=mask,
                 cache_modifier=STORE)
    else:
        # In pieces of 128 elements: int64 decoding holds many registers per element. (A
        # local constexpr: a global one is compared on every eager launch.)
        SLOW_PIECE: tl.constexpr = 128
        piece_layer, j = layers_by_elements(layer0, SLOW_PIECE, LAYERS, 1)
        k64 = tl.maximum(tl.cast(km1, tl.uint64), 1)
        magic64 = ((1 << 63) - 1) // k64 + 1
        for p in tl.range(0, BLOCK, SLOW_PIECE, num_stages=1):
            e = e0 + p + j
            d = tl.umulhi(tl.cast(e * 2, tl.uint64), magic64).to(tl.int64)
            off64 = d * src_dim_stride + (e - d * km1) * src_win_stride
            in_run = (piece_layer < num_layers) & (p + j < BLOCK) & (e < n)
            tl.store(dst + piece_layer * dst_layer_stride + p + j,
                     tl.load(src + piece_layer * src_layer_stride + off64, mask=in_run),
                     mask=in_run)


@triton.jit
def _scatter_kernel(
    dst_ptr, src_ptr, dst_idx_ptr, step_idx_ptr, src_idx_ptr,
    n_requests, chunks, num_layers, cache_size, spec_size, draft_tokens, dim, km1,
    dst_layer_stride, dst_slot_stride,
    src_layer_stride, src_row_stride, src_step_stride, src_dim_stride, src_win_stride,
    dst_idx_stride, step_idx_stride, src_idx_stride,
    HAS_SRC_INDICES: tl.constexpr, BLOCK: tl.constexpr, LAYERS: tl.constexpr,
    RUN: tl.constexpr, STREAM: tl.constexpr, I32_REACH: tl.constexpr, SCAN: tl.constexpr,
):
    """Copy ``BLOCK`` elements of one request's conv window in ``LAYERS`` layers.

    Grid: ``(n_requests * chunks, cdiv(num_layers, LAYERS))``, ``chunks = cdiv(dim * km1,
    BLOCK)``.

    dst_ptr: ``[num_layers, cache_size, dim, km1]``, entry contiguous.
    src_ptr: ``[num_layers, spec_size, draft_tokens, dim, km1]``, any strides.
    dst_idx_ptr / step_idx_ptr / src_idx_ptr: ``[n_requests]`` int32 or int64, any stride.
    """
    pid = tl.program_id(0)
    layer0 = tl.program_id(1).to(tl.int64) * LAYERS
    req = pid // chunks
    chunk = (pid - req * chunks).to(tl.int64)

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
        copy_window(dst_ptr, src_ptr, layer0, num_layers, slot, row, step, chunk, dim, km1,
                    dst_layer_stride, dst_slot_stride, src_layer_stride, src_row_stride,
                    src_step_stride, src_dim_stride, src_win_stride, BLOCK, LAYERS, RUN,
                    STREAM, I32_REACH)


# Tuning, swept by benchmarks/bench_conv_window_scatter.py: bytes of one program's run of an
# entry, layers per program (the run's decoding and the request's index loads and scan are
# shared by them), bytes each thread loads and stores contiguously (16: 16-byte vector stores;
# 0: loads through the shared-memory exchange), whether loads and stores stream past L2
# (evict-first, .cs), and warps per program. Registers, instruction counts and measurements:
# docs/design/conv_window_scatter.md#kernel-shape.
TUNING = {"block_bytes": 2048, "layers": 2, "run_bytes": 16, "stream": False, "num_warps": 4}
# Requests compared per step of the duplicate-slot scan.
SCAN = 128
# The bound of copy_window's int32 path (e * km1 and the offsets within one run); the tests
# lower it to reach the int64 path on small tensors.
I32_REACH = 1 << 31


def block_elements(element_size: int, block_bytes: int) -> int:
    """Elements of one program's run (a power of two from the dtype only, never from a size)."""
    return max(block_bytes // element_size, 16)


def run_elements(element_size: int, run_bytes: int) -> int:
    """Elements a thread loads and stores contiguously (``RUN``): ``run_bytes`` of them, at
    least one; 0 (the shared-memory exchange) for ``run_bytes = 0``."""
    return max(run_bytes // element_size, 1) if run_bytes else 0


def _arguments(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw,
               block_bytes=TUNING["block_bytes"], layers=TUNING["layers"],
               run_bytes=TUNING["run_bytes"], stream=TUNING["stream"], i32_reach=I32_REACH):
    """The grid and every kernel parameter, in signature order, of a call on validated inputs
    (on the eager hot path: each piece of metadata read once)."""
    shape, dst_strides, src_shape, s = dst.shape, dst.stride(), src.shape, src.stride()
    block = block_elements(dst.element_size(), block_bytes)
    n_requests = step_indices_raw.shape[0]
    src_idx = step_indices_raw if src_indices_raw is None else src_indices_raw
    chunks = (shape[2] * shape[3] + block - 1) // block
    grid = (n_requests * chunks, (shape[0] + layers - 1) // layers, 1)
    return grid, (
        dst, src, dst_indices_raw, step_indices_raw, src_idx,
        n_requests, chunks, shape[0], shape[1], src_shape[1], src_shape[2], shape[2], shape[3],
        dst_strides[0], dst_strides[1], s[0], s[1], s[2], s[3], s[4],
        dst_indices_raw.stride()[0], step_indices_raw.stride()[0], src_idx.stride()[0],
        src_indices_raw is not None, block, layers, run_elements(dst.element_size(), run_bytes),
        stream, i32_reach, SCAN,
    )


# The launch paths (strictops.ops._runtime.kernel_path): the op's body (also its fake) validates
# in full and launches through ``kernel[grid]``; a plain eager call takes the contract's cached
# verdict and the cached launcher (strictops.ops._runtime.launcher); the same rules and the same
# launch. A call that path served leaves a plan for the C++ path
# (strictops.ops._runtime.host_path), which runs the storage-reach rows on every call as the
# cached verdict does.
_PATH = KernelPath(_scatter_kernel, contract.CONTRACT, contract.ARGUMENTS, _arguments,
                   TUNING["num_warps"], writes=("dst",))
_launch, _forward, _eager = _PATH.launch, _PATH.forward, _PATH.eager
_HOST_CALL = _PATH.host.call
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
    if not torch.compiler.is_compiling() and _HOST_CALL(  # a signature served before
            dst, src, dst_indices_raw, step_indices_raw, src_indices_raw) is not MISS:
        return
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
    ``step_indices_raw`` (int64) and ``src_indices_raw`` (int32) hold the state scatter's
    example values (``strictops.ops.mamba.state_scatter.example_indices``): one negative and
    one out-of-range value each, and requests 6-8 naming one slot: 7 must overwrite 6.
    """
    if small:
        d = contract.Dims(num_layers=2, cache_size=7, spec_size=13, draft_tokens=3, dim=19,
                          km1=5, total_requests=11)
    else:
        d = contract.Dims(num_layers=4, cache_size=256, spec_size=64, draft_tokens=4,
                          dim=2048, km1=3, total_requests=48)
    d = dataclasses.replace(d, device=device, with_src_indices=True,
                            index_dtypes=(torch.int32, torch.int64, torch.int32))
    slot, step, row = mamba_state_scatter.example_indices(d, generator)
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
    strides by PyTorch indexing): see ``strictops.ops.mamba.state_scatter.reference``.
    A copy is exact, so no upcast is needed.
    """
    return mamba_state_scatter.reference(dst, src, dst_indices_raw, step_indices_raw,
                                         src_indices_raw)
