"""Fused Mamba state scatter with mask: ``fused_mamba_state_scatter_with_mask``.

After speculative-decoding verification, copy the accepted draft step's recurrent state of every
request into the request's cache slot, for all layers, in one launch and without a host sync, so
that the call can live inside a CUDA graph.

Registration: ``torch.library.triton_op``. Its body validates through the contract in
``strictops.meta.mamba.state_scatter`` and launches through ``wrap_triton``; the same body is the
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

Kernels: ``_layer_loop_kernel`` (default), a program per (request, chunk, group of layers)
that reads and compares its request's indices once and copies the chunk for each of its layers,
so an invalid request costs ``cdiv(num_layers, layers_per_program)`` times fewer programs than
in ``_per_chunk_kernel``, a program per (request, layer, chunk); ``_scatter_kernel``,
persistent over the writing requests' work items only. ``TUNING["kernel"]`` picks one
(docs/design/mamba_state_scatter.md#grid, #layer-loop).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from strictops.meta.mamba import state_scatter as contract
from strictops.meta._contract import sym_min

from strictops.ops._runtime.dispatch import can_skip_dispatcher
from strictops.ops._runtime.interpret import interpreted
from strictops.ops._runtime.host_path import MISS
from strictops.ops._runtime.kernel_path import KernelPath

# The public function. ``reference``, ``unfused_torch``, ``launch_interpreted``,
# ``example_inputs`` and ``example_indices`` are for tests, benchmarks and the self-check:
# importable by name, not exported.
__all__ = ["fused_mamba_state_scatter_with_mask"]


@triton.jit
def request_is_valid(slot, row, step, cache_size, spec_size, draft_tokens):
    """Whether a request's int64 indices all lie in range (it copies)."""
    return ((step >= 0) & (step < draft_tokens) & (slot >= 0) & (slot < cache_size)
            & (row >= 0) & (row < spec_size))


@triton.jit
def load_requests(rows, dst_idx_ptr, step_idx_ptr, src_idx_ptr, n_requests, cache_size,
                  spec_size, draft_tokens, dst_idx_stride, step_idx_stride, src_idx_stride,
                  HAS_SRC_INDICES: tl.constexpr):
    """Requests ``rows`` (int64; those past ``n_requests`` read nothing): whether each is valid,
    and its slot, source row and step (int64)."""
    in_range = rows < n_requests
    step = tl.load(step_idx_ptr + rows * step_idx_stride, mask=in_range, other=-1).to(tl.int64)
    slot = tl.load(dst_idx_ptr + rows * dst_idx_stride, mask=in_range, other=-1).to(tl.int64)
    if HAS_SRC_INDICES:
        row = tl.load(src_idx_ptr + rows * src_idx_stride, mask=in_range, other=-1).to(tl.int64)
    else:
        row = rows
    valid = in_range & request_is_valid(slot, row, step, cache_size, spec_size, draft_tokens)
    return valid, slot, row, step


@triton.jit
def written_later(slot, first, n, dst_idx_ptr, step_idx_ptr, src_idx_ptr, dst_idx_stride,
                  step_idx_stride, src_idx_stride, cache_size, spec_size, draft_tokens,
                  HAS_SRC_INDICES: tl.constexpr, SCAN: tl.constexpr):
    """Whether a valid request ``j`` in ``[first, n)`` of one index set also writes ``slot``
    (request ``j`` reads row ``src_idx[j]``, or ``j``). Its loads depend on ``first`` only,
    so they are in flight together with the caller's own index loads."""
    later = tl.zeros([SCAN], dtype=tl.int32)
    for j0 in tl.range(first, n, SCAN, num_stages=1):
        j = (j0 + tl.arange(0, SCAN)).to(tl.int64)
        v_j, d_j, _, _ = load_requests(j, dst_idx_ptr, step_idx_ptr, src_idx_ptr, n, cache_size,
                                       spec_size, draft_tokens, dst_idx_stride,
                                       step_idx_stride, src_idx_stride, HAS_SRC_INDICES)
        later = later | (v_j & (d_j == slot)).to(tl.int32)
    return tl.max(later, axis=0) > 0


@triton.jit
def _writers(r0, rows, dst_idx_ptr, step_idx_ptr, src_idx_ptr, n_requests, cache_size,
             spec_size, draft_tokens, dst_idx_stride, step_idx_stride, src_idx_stride,
             HAS_SRC_INDICES: tl.constexpr, SCAN: tl.constexpr, TILE: tl.constexpr):
    """``[SCAN]`` int32: 1 where request ``rows[k]`` writes (valid, and no later valid request
    names its slot), plus the requests' slots, source rows and steps (int64)."""
    valid, slot, row, step = load_requests(rows, dst_idx_ptr, step_idx_ptr, src_idx_ptr,
                                           n_requests, cache_size, spec_size, draft_tokens,
                                           dst_idx_stride, step_idx_stride, src_idx_stride,
                                           HAS_SRC_INDICES)
    key = tl.where(valid, slot, -1)  # -1: no write (never equal to a later key)
    # The block against itself from registers, then the later requests TILE at a time.
    key_j = tl.where(valid, slot, -2)
    same = (key[:, None] == key_j[None, :]) & (rows[None, :] > rows[:, None])
    later = tl.max(same.to(tl.int32), axis=1)
    if tl.max(valid.to(tl.int32), axis=0) > 0:  # no valid request here: nothing to compare
        for j0 in range(r0 + SCAN, n_requests, TILE):
            cols = j0 + tl.arange(0, TILE).to(tl.int64)
            v_j, d_j, _, _ = load_requests(cols, dst_idx_ptr, step_idx_ptr, src_idx_ptr,
                                           n_requests, cache_size, spec_size, draft_tokens,
                                           dst_idx_stride, step_idx_stride, src_idx_stride,
                                           HAS_SRC_INDICES)
            key_j = tl.where(v_j, d_j, -2)
            same = (key[:, None] == key_j[None, :]) & (cols[None, :] > rows[:, None])
            later = later | tl.max(same.to(tl.int32), axis=1)
    return (valid & (later == 0)).to(tl.int32), slot, row, step


@triton.jit(do_not_specialize=["n_requests", "num_layers", "cache_size", "spec_size",
                               "draft_tokens"])
def _scatter_kernel(
    dst_ptr,
    src_ptr,
    dst_idx_ptr,
    step_idx_ptr,
    src_idx_ptr,
    n_requests,
    num_layers,
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
    CHUNK: tl.constexpr,
    SCAN: tl.constexpr,
    TILE: tl.constexpr,
):
    """Persistent copy of every writing request's entries, all layers.

    Grid: ``(P,)`` for any ``P >= 1``. Work items are ``(writing request, layer, chunk)`` in
    that order, the chunk fastest; program ``p`` takes items ``p, p + P, ...``. Every program
    reads the index tensors ``SCAN`` requests at a time and finds the writing requests of a
    block itself (valid, and no later valid request with the slot: compared ``TILE`` later
    requests at a time), so a request that does not write is never a work item: an all-invalid
    call costs one read of the index tensors per program.

    dst_ptr: ``[num_layers, cache_size, entry_numel]`` through ``dst_layer_stride`` /
        ``dst_slot_stride``; the entry itself is contiguous.
    src_ptr: ``[num_layers, spec_size, draft_tokens, entry_numel]``, contiguous.
    dst_idx_ptr / step_idx_ptr / src_idx_ptr: ``[n_requests]`` int32 or int64, any stride.
    Each item copies ``CHUNK`` elements (fewer in an entry's last chunk) in one load and one
    store.
    """
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    chunks = tl.cdiv(entry_numel, CHUNK).to(tl.int64)
    per_writer = chunks * num_layers
    src_layer = tl.cast(spec_size, tl.int64) * draft_tokens * entry_numel  # elements a layer
    offs = tl.arange(0, CHUNK)
    done = tl.zeros([], dtype=tl.int64)  # writing requests in earlier blocks
    for r0 in range(0, n_requests, SCAN):
        rows = r0 + tl.arange(0, SCAN).to(tl.int64)  # 64-bit: times a stride of any size
        writes, slot, row, step = _writers(r0, rows, dst_idx_ptr, step_idx_ptr, src_idx_ptr,
                                           n_requests, cache_size, spec_size, draft_tokens,
                                           dst_idx_stride, step_idx_stride, src_idx_stride,
                                           HAS_SRC_INDICES, SCAN, TILE)
        rank = tl.cumsum(writes, axis=0)  # 1-based among this block's writers
        count = tl.sum(writes, axis=0)
        entry = row * draft_tokens + step  # the source entry within a layer
        first = done * per_writer
        start = first + (pid + programs - first % programs) % programs
        for item in range(start, (done + count) * per_writer, programs):
            k = item // per_writer  # 0-based among all writers
            rem = item - k * per_writer
            layer = rem // chunks
            e0 = (rem - layer * chunks) * CHUNK
            pick = (rank == k - done + 1) & (writes != 0)
            # Offsets as picked index times a size or stride, never a picked offset: the
            # compiler then sees them divisible as the size or stride is (16-byte accesses).
            src = (src_ptr + layer * src_layer
                   + tl.sum(tl.where(pick, entry, 0), axis=0) * entry_numel + e0)
            dst = (dst_ptr + layer * dst_layer_stride
                   + tl.sum(tl.where(pick, slot, 0), axis=0) * dst_slot_stride + e0)
            mask = offs < tl.minimum(entry_numel - e0, CHUNK).to(tl.int32)
            tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
        done += count


@triton.jit
def _per_chunk_kernel(
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

    Grid: ``(n_requests * cdiv(entry_numel, BLOCK), num_layers)``: a program for every
    request, valid or not, and each scans the later requests for its slot.

    Tensors as in ``_scatter_kernel``.
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
    valid = request_is_valid(slot, row, step, cache_size, spec_size, draft_tokens)
    # Last writer wins: skip if a later valid request targets the same slot (the scan's loads
    # are in flight together with this request's, so the copy waits for one round of index
    # loads, not two).
    later = written_later(slot, req + 1, n_requests, dst_idx_ptr, step_idx_ptr, src_idx_ptr,
                          dst_idx_stride, step_idx_stride, src_idx_stride, cache_size,
                          spec_size, draft_tokens, HAS_SRC_INDICES, SCAN)
    if (not valid) or later:
        return

    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < entry_numel
    # int64 from the left: layer, row and step are int64, so no product wraps at 2**31.
    src_entry = (layer * spec_size + row) * draft_tokens + step
    src_base = src_ptr + src_entry * entry_numel
    dst_base = dst_ptr + layer * dst_layer_stride + slot * dst_slot_stride
    data = tl.load(src_base + offs, mask=mask)
    tl.store(dst_base + offs, data, mask=mask)


@triton.jit(do_not_specialize=["n_requests", "num_layers", "cache_size", "spec_size",
                               "draft_tokens"])
def _layer_loop_kernel(
    dst_ptr,
    src_ptr,
    dst_idx_ptr,
    step_idx_ptr,
    src_idx_ptr,
    n_requests,
    num_layers,
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
    LAYERS_PER_PROGRAM: tl.constexpr,
    LAYER_TILE: tl.constexpr,
):
    """Copy one ``BLOCK``-element chunk of one request's entry for ``LAYERS_PER_PROGRAM``
    layers.

    Grid: ``(n_requests * cdiv(entry_numel, BLOCK), cdiv(num_layers, LAYERS_PER_PROGRAM))``;
    program ``(p, g)`` takes request ``p // chunks``, chunk ``p % chunks`` and layers
    ``g * LAYERS_PER_PROGRAM`` up to the next group or ``num_layers``. It reads its request's
    indices and compares them with the later requests' (``SCAN`` at a time) once, exits unless
    the request writes (valid, and no later valid request names its slot), then copies its
    layers ``LAYER_TILE`` at a time: one masked ``[LAYER_TILE, BLOCK]`` load, then its store.

    Tensors as in ``_scatter_kernel``.
    """
    pid = tl.program_id(0)
    chunks = tl.cdiv(entry_numel, BLOCK)
    req = (pid // chunks).to(tl.int64)  # 64-bit: times an index stride of any size
    e0 = (pid % chunks).to(tl.int64) * BLOCK  # the chunk's first element in the entry
    # This request's indices, loaded here and not through ``load_requests``: Triton's mutation
    # analysis (Inductor's clones) would count every argument of a called function that the
    # store addresses depend on as written.
    step = tl.load(step_idx_ptr + req * step_idx_stride).to(tl.int64)
    slot = tl.load(dst_idx_ptr + req * dst_idx_stride).to(tl.int64)
    if HAS_SRC_INDICES:
        row = tl.load(src_idx_ptr + req * src_idx_stride).to(tl.int64)
    else:
        row = req
    valid = request_is_valid(slot, row, step, cache_size, spec_size, draft_tokens)
    # Last writer wins: a later valid request with the slot takes the write.
    later = written_later(slot, req + 1, n_requests, dst_idx_ptr, step_idx_ptr, src_idx_ptr,
                          dst_idx_stride, step_idx_stride, src_idx_stride, cache_size,
                          spec_size, draft_tokens, HAS_SRC_INDICES, SCAN)
    if (not valid) or later:
        return

    # Offsets as index times a size or stride (int64 from the left), so the compiler sees them
    # divisible as the size or stride is: 16-byte accesses.
    src_layer = tl.cast(spec_size, tl.int64) * draft_tokens * entry_numel  # elements a layer
    src_chunk = src_ptr + (row * draft_tokens + step) * entry_numel + e0
    dst_chunk = dst_ptr + slot * dst_slot_stride + e0
    offs = tl.arange(0, BLOCK)
    in_entry = offs < tl.minimum(entry_numel - e0, BLOCK).to(tl.int32)
    first = tl.program_id(1) * LAYERS_PER_PROGRAM
    last = tl.minimum(first + LAYERS_PER_PROGRAM, num_layers)
    for l0 in range(first, last, LAYER_TILE):
        layers = l0 + tl.arange(0, LAYER_TILE)
        mask = (layers < last)[:, None] & in_entry[None, :]
        layers = layers.to(tl.int64)[:, None]
        data = tl.load(src_chunk + layers * src_layer + offs[None, :], mask=mask)
        tl.store(dst_chunk + layers * dst_layer_stride + offs[None, :], data, mask=mask)


# The kernel a call launches, and each kernel's tuning. Why these values, with the numbers:
# docs/design/mamba_state_scatter.md#grid, #layer-loop and #tuning.
# "layer_loop", the default: 4 KiB chunks (per_chunk's program size, 0.94 of the copy
#   bandwidth on the H200), 12 layers a program, so a 36-layer model's request costs 3 programs
#   a chunk, not 36, and one request still has ~6 MB in flight (128 chunks x 3 programs x a
#   [4, 4 KiB] tile); 56-62 registers for sm_90 offline, 8 programs an SM.
# "per_chunk": a program per (request, layer, 4 KiB chunk) / 4 warps: 0.94 of the copy
#   bandwidth on a full commit, but ~190 µs for 64 requests of which 1 is valid.
# "persistent": 32 KiB work items copied by 8 warps (the work shape of sglang's persistent
#   state-tracking kernel); 3 programs per SM, all that would fit at the 80 registers ptxas
#   gives it for sm_90 offline. It is 8-20x faster than per_chunk when most requests are
#   invalid but 5-8% slower on full commits (it loads at 240 registers a thread on the H200,
#   one program per SM), and Inductor clones the index tensors it reads.
TUNING = {
    "kernel": "layer_loop",
    "persistent": {"chunk_bytes": 32768, "num_warps": 8, "programs_per_sm": 3},
    "per_chunk": {"block_bytes": 4096, "num_warps": 4},
    "layer_loop": {"block_bytes": 4096, "num_warps": 4, "layers_per_program": 12,
                   "layer_tile": 4},
}
# Requests read per block of the persistent kernel, and later requests compared per step
# (a SCAN x TILE comparison of 64-bit slots; SCAN 64 costs 124 registers). The per-chunk and
# layer-loop kernels compare SCAN_PER_CHUNK requests per step: one vector of loads, so up to
# 128 requests are one round trip (docs/design/mamba_state_scatter.md#kernel).
SCAN, TILE = 32, 32
SCAN_PER_CHUNK = 128
# Programs per SM times this when no GPU can be asked (tracing on a CPU-only machine): an
# H200's SMs. The result does not depend on the program count.
DEFAULT_SMS = 132


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    if device_index < 0 or not torch.cuda.is_available():
        return DEFAULT_SMS
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _arguments(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw,
               chunk_bytes=TUNING["persistent"]["chunk_bytes"], programs=None, scan=SCAN,
               tile=TILE):
    """The grid and every parameter of ``_scatter_kernel``, in signature order, of a call on
    validated inputs: ``min(items, programs)`` programs (default: ``programs_per_sm`` per SM
    of ``dst``'s device), ``items`` the most work items any index values can give.

    On the eager hot path, so it reads each piece of metadata once and avoids helpers with
    per-call overhead (``triton.cdiv`` costs more than the rest of this function together).
    """
    shape, dst_strides, src_shape = dst.shape, dst.stride(), src.shape
    entry_numel = math.prod(shape[2:])
    chunk = max(chunk_bytes // dst.element_size(), 16)
    n_requests = step_indices_raw.shape[0]
    src_idx = step_indices_raw if src_indices_raw is None else src_indices_raw
    if programs is None:
        programs = TUNING["persistent"]["programs_per_sm"] * _sm_count(dst.get_device())
    items = n_requests * shape[0] * ((entry_numel + chunk - 1) // chunk)
    return (sym_min(items, programs), 1, 1), (
        dst, src, dst_indices_raw, step_indices_raw, src_idx,
        n_requests, shape[0], shape[1], src_shape[1], src_shape[2], entry_numel,
        dst_strides[0], dst_strides[1],
        dst_indices_raw.stride()[0], step_indices_raw.stride()[0], src_idx.stride()[0],
        src_indices_raw is not None, chunk, scan, tile,
    )


def _per_chunk_arguments(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw,
                         block_bytes=TUNING["per_chunk"]["block_bytes"]):
    """The grid and every parameter of ``_per_chunk_kernel``, in signature order."""
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
        src_indices_raw is not None, block, SCAN_PER_CHUNK,
    )


def _layer_loop_arguments(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw,
                          block_bytes=TUNING["layer_loop"]["block_bytes"],
                          layers_per_program=TUNING["layer_loop"]["layers_per_program"],
                          layer_tile=TUNING["layer_loop"]["layer_tile"]):
    """The grid and every parameter of ``_layer_loop_kernel``, in signature order."""
    shape, dst_strides, src_shape = dst.shape, dst.stride(), src.shape
    entry_numel = math.prod(shape[2:])
    block = max(block_bytes // dst.element_size(), 16)
    n_requests = step_indices_raw.shape[0]
    src_idx = step_indices_raw if src_indices_raw is None else src_indices_raw
    grid = (n_requests * ((entry_numel + block - 1) // block),
            (shape[0] + layers_per_program - 1) // layers_per_program, 1)
    return grid, (
        dst, src, dst_indices_raw, step_indices_raw, src_idx,
        n_requests, shape[0], shape[1], src_shape[1], src_shape[2], entry_numel,
        dst_strides[0], dst_strides[1],
        dst_indices_raw.stride()[0], step_indices_raw.stride()[0], src_idx.stride()[0],
        src_indices_raw is not None, block, SCAN_PER_CHUNK, layers_per_program, layer_tile,
    )


# The launch paths of each kernel (strictops.ops._runtime.kernel_path): the op's body (also its
# fake) validates in full and launches through ``kernel[grid]``; a plain eager call takes the
# contract's cached verdict and the cached launcher (strictops.ops._runtime.launcher); the same
# rules and the same launch. ``TUNING["kernel"]`` picks one on every call. A call a path served
# leaves a plan for its C++ path (strictops.ops._runtime.host_path, ``_HOSTS``), which serves the
# signature while ``TUNING`` is unchanged.
PATHS = {
    "persistent": KernelPath(_scatter_kernel, contract.CONTRACT, contract.ARGUMENTS,
                             _arguments, TUNING["persistent"]["num_warps"], writes=("dst",),
                             settings=((globals(), "TUNING"),)),
    "per_chunk": KernelPath(_per_chunk_kernel, contract.CONTRACT, contract.ARGUMENTS,
                            _per_chunk_arguments, TUNING["per_chunk"]["num_warps"],
                            writes=("dst",), settings=((globals(), "TUNING"),)),
    "layer_loop": KernelPath(_layer_loop_kernel, contract.CONTRACT, contract.ARGUMENTS,
                             _layer_loop_arguments, TUNING["layer_loop"]["num_warps"],
                             writes=("dst",), settings=((globals(), "TUNING"),)),
}
_HOSTS = {name: path.host.call for name, path in PATHS.items()}
_PATH = PATHS["persistent"]
_launch, _forward = _PATH.launch, _PATH.forward
_VALIDATION, _LAUNCHER, _OPTIONS = _PATH.validation, _PATH.launcher, _PATH.options


def _eager(*args) -> None:
    PATHS[TUNING["kernel"]].eager(*args)


@contextlib.contextmanager
def kernel_variant(name: str):
    """Calls of the op in this block (and CUDA graphs captured in it) launch ``PATHS[name]``'s
    kernel: benchmarks time both kernels in one process. A ``torch.compile``d graph keeps the
    kernel it was traced with. Not thread-safe."""
    if name not in PATHS:
        raise ValueError(f"Expected a kernel in {list(PATHS)}, but got {name!r}")
    default = TUNING["kernel"]
    TUNING["kernel"] = name
    try:
        yield
    finally:
        TUNING["kernel"] = default


def kernel_choice(device: torch.device) -> tuple[str, str]:
    """The kernel that calls on ``device`` run, and why (the self-check's row): the one
    ``TUNING["kernel"]`` names, on any device."""
    name = TUNING["kernel"]
    where = "" if device.type == "cuda" else "; no GPU: the Triton interpreter"
    return PATHS[name].jit_fn.__name__, f'TUNING["kernel"] = "{name}"{where}'


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
    path = PATHS[TUNING["kernel"]]
    kernel = wrap_triton(path.jit_fn)
    path.forward(kernel, kernel is path.jit_fn, dst, src, dst_indices_raw, step_indices_raw,
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
    In plain eager mode the call skips the dispatcher (see ``strictops.ops._runtime.dispatch``);
    ``torch.ops.strictops.fused_mamba_state_scatter_with_mask`` is the same op through it.
    """
    if not torch.compiler.is_compiling() and _HOSTS[TUNING["kernel"]](  # served before
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
                       reverse_programs=False, kernel=None, **tuning):
    """Run a kernel through the Triton interpreter on CPU tensors (tests, self-check).

    The public op keeps its CUDA-only contract; this launcher exists so that CI, which has no
    GPU, can check the kernels' arithmetic and their handling of bad index values.
    ``reverse_programs`` runs the programs in reverse grid order (see ``_interpret``);
    ``kernel`` names the kernel (default ``TUNING["kernel"]``); ``tuning`` goes to its
    arguments function (the persistent kernel's ``programs`` defaults to 5 here).
    """
    path = PATHS[kernel or TUNING["kernel"]]
    if path is PATHS["persistent"]:
        tuning.setdefault("programs", 5)
    with interpreted(path.jit_fn, reverse_programs) as interpreted_kernel:
        path.launch(interpreted_kernel, dst, src, dst_indices_raw, step_indices_raw,
                    src_indices_raw, **tuning)


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
    slot, step, row = example_indices(dims, generator)
    values = {"dst_indices_raw": slot, "step_indices_raw": step, "src_indices_raw": row}
    out = {}
    for name, spec in contract.valid_spec(dims).items():
        value = values.get(name)
        if value is None:
            value = torch.randn(spec.shape, generator=generator, dtype=spec.dtype)
        out[name] = value.to(device=spec.device, dtype=spec.dtype)
    return out


def example_indices(dims, generator: torch.Generator):
    """``(slot, step, row)``: int64 CPU ``[dims.total_requests]`` index values of the example
    calls of this op and of the conv-window scatter (``dims``: either contract's ``Dims``).

    Random valid values, except one negative and one out-of-range value in each (requests
    0-5), and requests 6-8 naming one slot with 6 and 7 valid and 8 skipped.
    """
    n = dims.total_requests
    slot = torch.randint(0, dims.cache_size, (n,), generator=generator)
    step = torch.randint(0, dims.draft_tokens, (n,), generator=generator)
    row = torch.randint(0, dims.spec_size, (n,), generator=generator)
    slot[0], slot[1] = -1, dims.cache_size
    step[2], step[3] = -1, dims.draft_tokens
    row[4], row[5] = -1, dims.spec_size
    slot[7] = slot[8] = slot[6]
    step[8] = -1
    return slot, step, row


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
