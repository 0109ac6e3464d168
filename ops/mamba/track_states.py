"""Mamba state tracking: copy the conv and SSM states of the rows marked in a mask from their
cache slots into their track slots, for every layer, in one launch.

``track_mamba_states_all_layers`` is the op (``[num_layers, pool_size, ...]`` pools);
``track_mamba_states_if_needed`` is the same op on one layer's ``[pool_size, ...]`` states,
passed as views with a layer dim of 1 (its errors therefore name the pool arguments).

Registration: ``torch.library.triton_op``. Its body validates through the contract in
``strictops.meta.mamba.track_states`` and launches through ``wrap_triton``; the same body is
the fake, so ``torch.compile``/``torch.export`` run the contract on fake tensors and Inductor
sees the Triton launch.

Semantics: with ``n = min(conv pool size, ssm pool size)``, row ``i < batch_size`` writes when
``mamba_track_mask[i] != 0`` and both ``cache_indices[i]`` and ``mamba_track_indices[i]`` lie in
``[0, n)``, and no later writing row has the same track slot (the last one wins, as in a loop)::

    conv_states_pool[l, mamba_track_indices[i]] = conv_states_pool[l, cache_indices[i]]
    ssm_states_pool[l, mamba_track_indices[i]] = ssm_states_pool[l, cache_indices[i]]

for every layer ``l``. Other rows touch no memory. A track slot that is also the cache slot of
another writing row is a read/write race (as in the original); serving never produces one.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from strictops.meta.mamba import track_states as contract
from strictops.meta._contract import CachedValidation, sym_min

from strictops.ops._runtime.dispatch import can_skip_dispatcher, on_device_of
from strictops.ops._runtime.interpret import interpreted
from strictops.ops._runtime.launcher import Launcher, keyword_constexprs

__all__ = [
    "track_mamba_states_all_layers",
    "track_mamba_states_if_needed",
    "reference",
    "launch_interpreted",
    "example_inputs",
]


@triton.jit
def _copy_chunk(base, src_slot_off, dst_slot_off, start, numel, CHUNK: tl.constexpr,
                BLOCK: tl.constexpr, LOAD_POLICY: tl.constexpr, STORE_POLICY: tl.constexpr):
    """Copy elements ``[start, min(start + CHUNK, numel))`` of one entry, ``BLOCK`` at a time,
    loading and storing with the L2 eviction policies ``LOAD_POLICY`` and ``STORE_POLICY``.

    The 64-bit parts (slot offsets, ``start``) go into two scalar pointers; the per-element
    offsets stay 32-bit, which halves the registers the addresses need."""
    src = base + src_slot_off + start
    dst = base + dst_slot_off + start
    left = tl.minimum(numel - start, CHUNK).to(tl.int32)
    for off in tl.static_range(0, CHUNK, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        mask = offs < left
        tl.store(dst + offs, tl.load(src + offs, mask=mask, eviction_policy=LOAD_POLICY),
                 mask=mask, eviction_policy=STORE_POLICY)


@triton.jit
def _sum_pair(a0, b0, a1, b1):
    """Sums two reductions at once (one pass through shared memory, not two)."""
    return a0 + a1, b0 + b1


@triton.jit
def _tracked(rows, mask_ptr, batch_size, mask_stride):
    """Rows ``rows`` (int64): whether each is in the batch and marked in the mask."""
    # != 0, not a cast: a wide mask value like 2**32 must not truncate to 0
    return tl.load(mask_ptr + rows * mask_stride, mask=rows < batch_size, other=0) != 0


@triton.jit
def _rows(rows, src_ptr, mask_ptr, dst_ptr, batch_size, pool, src_stride, mask_stride,
          dst_stride):
    """Rows ``rows`` (int64; those past ``batch_size`` read nothing): whether each writes if no
    later row takes its track slot (tracked, both slots in ``[0, pool)``), and its cache and
    track slots (int64). The three reads are independent: one round trip."""
    in_batch = rows < batch_size
    tracked = _tracked(rows, mask_ptr, batch_size, mask_stride)
    src = tl.load(src_ptr + rows * src_stride, mask=in_batch, other=-1).to(tl.int64)
    dst = tl.load(dst_ptr + rows * dst_stride, mask=in_batch, other=-1).to(tl.int64)
    valid = in_batch & tracked & (src >= 0) & (src < pool) & (dst >= 0) & (dst < pool)
    return valid, src, dst


@triton.jit
def _writers(r0, rows, valid, dst, alone, src_ptr, mask_ptr, dst_ptr, batch_size, pool,
             src_stride, mask_stride, dst_stride, SCAN: tl.constexpr, TILE: tl.constexpr):
    """``[SCAN]`` int32: 1 where row ``rows[k]`` writes: ``valid``, and no later valid row has
    its track slot ``dst``.

    The rows from the block's first on (from the next block's first when the block holds one
    valid row, ``alone``) are read ``TILE`` at a time and compared with the block; the block's
    own rows hit L1 again."""
    key = tl.where(valid, dst, -1)  # -1: the row does not write (never equal to a later key)
    later = tl.zeros([SCAN], dtype=tl.int32)
    for j0 in range(tl.where(alone, r0 + SCAN, r0), batch_size, TILE):
        cols = j0 + tl.arange(0, TILE).to(tl.int64)
        v_j, _, d_j = _rows(cols, src_ptr, mask_ptr, dst_ptr, batch_size, pool, src_stride,
                            mask_stride, dst_stride)
        hit = (tl.where(v_j, d_j, -2)[:, None] == key[None, :]) & (cols[:, None] > rows[None, :])
        later = later | tl.max(hit.to(tl.int32), axis=0)
    return (valid & (later == 0)).to(tl.int32)


@triton.jit(do_not_specialize=["batch_size", "num_layers", "pool"])
def _track_kernel(
    conv_ptr,
    ssm_ptr,
    src_ptr,
    mask_ptr,
    dst_ptr,
    batch_size,
    num_layers,
    pool,
    conv_numel,
    ssm_numel,
    conv_layer_stride,
    conv_slot_stride,
    ssm_layer_stride,
    ssm_slot_stride,
    src_stride,
    mask_stride,
    dst_stride,
    CONV_CHUNK: tl.constexpr,
    SSM_CHUNK: tl.constexpr,
    CONV_BLOCK: tl.constexpr,
    SSM_BLOCK: tl.constexpr,
    SCAN: tl.constexpr,
    TILE: tl.constexpr,
    LOAD_POLICY: tl.constexpr,
    STORE_POLICY: tl.constexpr,
):
    """Persistent copy of every writing row's entries, all layers.

    Grid: ``(P,)`` for any ``P >= 1``. Work items are ``(writing row, layer, chunk)``, the
    chunk fastest; program ``p`` takes items ``p, p + P, ...``. Rows are read ``SCAN`` at a
    time: a block without a tracked row with slots in range costs one read of the three index
    tensors per program and nothing else; in a block with one, every program finds the
    writing rows itself (no host sync, no second launch). The first block's mask read is the
    kernel's first instruction: a call that marks no row in a batch of at most ``SCAN`` rows
    ends after that one read, before the slot reads and any of the walk's arithmetic.

    conv_ptr / ssm_ptr: ``[num_layers, pool, conv_numel | ssm_numel]`` through their layer and
        slot strides; entries contiguous. Chunks of ``CONV_CHUNK`` / ``SSM_CHUNK`` elements,
        each copied in ``CONV_BLOCK`` / ``SSM_BLOCK``-element steps, loaded and stored with
        the L2 eviction policies ``LOAD_POLICY`` and ``STORE_POLICY``.
    src_ptr / mask_ptr / dst_ptr: ``[>= batch_size]`` any stride.
    """
    first = _tracked(tl.arange(0, SCAN).to(tl.int64), mask_ptr, batch_size, mask_stride)
    if (tl.max(first.to(tl.int32), axis=0) > 0) | (batch_size > SCAN):
        _copy_writers(conv_ptr, ssm_ptr, src_ptr, mask_ptr, dst_ptr, batch_size, num_layers,
                      pool, conv_numel, ssm_numel, conv_layer_stride, conv_slot_stride,
                      ssm_layer_stride, ssm_slot_stride, src_stride, mask_stride, dst_stride,
                      CONV_CHUNK, SSM_CHUNK, CONV_BLOCK, SSM_BLOCK, SCAN, TILE, LOAD_POLICY,
                      STORE_POLICY)


@triton.jit
def _copy_writers(conv_ptr, ssm_ptr, src_ptr, mask_ptr, dst_ptr, batch_size, num_layers, pool,
                  conv_numel, ssm_numel, conv_layer_stride, conv_slot_stride, ssm_layer_stride,
                  ssm_slot_stride, src_stride, mask_stride, dst_stride,
                  CONV_CHUNK: tl.constexpr, SSM_CHUNK: tl.constexpr, CONV_BLOCK: tl.constexpr,
                  SSM_BLOCK: tl.constexpr, SCAN: tl.constexpr, TILE: tl.constexpr,
                  LOAD_POLICY: tl.constexpr, STORE_POLICY: tl.constexpr):
    """The walk of ``_track_kernel``: every block of rows from the first (the first block's
    mask read hits L1 again), its writers, and this program's items of each."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    conv_chunks = tl.cdiv(conv_numel, CONV_CHUNK)
    chunks = conv_chunks + tl.cdiv(ssm_numel, SSM_CHUNK)
    # A row's items in 32-bit arithmetic: layers times an entry's chunks, at most the pools'
    # bytes over the chunk bytes plus the layer count, far below 2**31 for pools in memory.
    per_row = chunks * num_layers
    phase = pid * 0  # (writers so far * per_row) % P: where the next writer's items start
    for r0 in range(0, batch_size, SCAN):
        rows = r0 + tl.arange(0, SCAN).to(tl.int64)  # 64-bit: times a stride of any size
        valid, src, dst = _rows(rows, src_ptr, mask_ptr, dst_ptr, batch_size, pool, src_stride,
                                mask_stride, dst_stride)
        n_valid = tl.sum(valid.to(tl.int32), axis=0)
        if n_valid > 0:
            writes = _writers(r0, rows, valid, dst, n_valid == 1, src_ptr, mask_ptr, dst_ptr,
                              batch_size, pool, src_stride, mask_stride, dst_stride, SCAN, TILE)
            rank = tl.where(writes != 0, tl.cumsum(writes, axis=0), 0)  # 1-based, 0: none
            for k in range(1, tl.sum(writes, axis=0) + 1):
                # The writer's slots once (one paired reduction); then its items that fall
                # to this program.
                s, d = tl.reduce((tl.where(rank == k, src, 0), tl.where(rank == k, dst, 0)), 0,
                                 _sum_pair)
                for j in range((pid - phase + programs) % programs, per_row, programs):
                    layer = j // chunks
                    chunk = j - layer * chunks
                    layer = layer.to(tl.int64)
                    if chunk < conv_chunks:
                        _copy_chunk(conv_ptr + layer * conv_layer_stride, s * conv_slot_stride,
                                    d * conv_slot_stride, chunk * CONV_CHUNK, conv_numel,
                                    CONV_CHUNK, CONV_BLOCK, LOAD_POLICY, STORE_POLICY)
                    else:
                        _copy_chunk(ssm_ptr + layer * ssm_layer_stride, s * ssm_slot_stride,
                                    d * ssm_slot_stride, (chunk - conv_chunks) * SSM_CHUNK,
                                    ssm_numel, SSM_CHUNK, SSM_BLOCK, LOAD_POLICY, STORE_POLICY)
                phase = (phase + per_row % programs) % programs


def _triton_version(version: str = triton.__version__) -> tuple[int, int]:
    """``(major, minor)`` of a Triton version string (``"3.6.0"``, ``"3.10.0+git1a2b3c4"``)."""
    import re  # here, not at the top: the kernels' line numbers (and so their line info) stay

    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()
    return int(major), int(minor)


def _tuning(version: tuple[int, int]) -> dict:
    """The default tuning under Triton ``version`` (``(major, minor)``).

    32 KiB work items (the original's), each copied in one step of 32 KiB by 8 warps. Steps
    sized in bytes give the two pools' copies tensors of different lengths when their element
    sizes differ: Triton then lays each copy out on its own, with no shuffle through shared
    memory between load and store. Sources loaded evict-last and destinations stored
    evict-first (the L2 gives up the copy's written lines before its read ones): each faster
    than the default policy at every row count that copies.

    Programs per SM, and the register cap that keeps them all resident, follow the compiler
    (ptxas -v, sm_90, the three specialisations of the sm_90 CPU test):

    - before 3.7 (3.6 is the benchmarks' Triton): 4 programs per SM under ``maxnreg`` 64
      (118-128 registers uncapped; at 64, 16-36 bytes spilled, all outside the copy loop);
    - from 3.7 on: that build spills up to 88 bytes on 3.7.1 (some before the exit of a call
      that tracks nothing) and 72-140 bytes on 3.8.0 and 3.9.0, against the test's 64.
      Instead 2 programs per SM under ``maxnreg`` 128 (112-126 registers, no spill). On an
      H200 under triton 3.6, 2 programs per SM uncapped ran within 0.7% of the default at 8
      and 64 rows and faster at 0 and 1.

    See docs/design/mamba_track_states.md, "Registers and residency" (its "sm_90 builds per
    Triton version") and "L2 eviction policy"."""
    programs_per_sm, maxnreg = (4, 64) if version < (3, 7) else (2, 128)
    return {"chunk_bytes": 32768, "block_bytes": 32768, "block_elements": None, "num_warps": 8,
            "programs_per_sm": programs_per_sm, "maxnreg": maxnreg,
            "load_policy": "evict_last", "store_policy": "evict_first"}


TUNING = _tuning(_triton_version())
SCAN = 64
TILE = 32
# Programs when no GPU can be asked (tracing on a CPU-only machine): an H200's 132 SMs. The
# result does not depend on the program count.
DEFAULT_SMS = 132


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _programs(t: torch.Tensor, real_launch: bool) -> int:
    sms = _sm_count(t.get_device()) if real_launch or torch.cuda.is_available() else DEFAULT_SMS
    return TUNING["programs_per_sm"] * sms


def _arguments(programs, conv, ssm, cache_indices, mask, track_indices, batch_size,
               chunk_bytes=TUNING["chunk_bytes"], block_bytes=TUNING["block_bytes"],
               block_elements=TUNING["block_elements"], load_policy=TUNING["load_policy"],
               store_policy=TUNING["store_policy"]):
    """The grid and every kernel parameter, in signature order, of a call on validated inputs
    (``sym_min``: sizes may be symbolic). Copy steps of ``block_bytes``, or of
    ``block_elements`` elements in both pools when that is given; loads and stores with the L2
    eviction policies ``load_policy`` and ``store_policy`` (``""``: the default)."""
    conv_shape, ssm_shape = conv.shape, ssm.shape
    conv_numel, ssm_numel = math.prod(conv_shape[2:]), math.prod(ssm_shape[2:])
    conv_block = block_elements or max(1, block_bytes // conv.element_size())
    ssm_block = block_elements or max(1, block_bytes // ssm.element_size())
    conv_chunk = max(conv_block, chunk_bytes // conv.element_size())
    ssm_chunk = max(ssm_block, chunk_bytes // ssm.element_size())
    items = batch_size * conv_shape[0] * (
        (conv_numel + conv_chunk - 1) // conv_chunk + (ssm_numel + ssm_chunk - 1) // ssm_chunk)
    conv_strides, ssm_strides = conv.stride(), ssm.stride()
    return (sym_min(items, programs), 1, 1), (
        conv, ssm, cache_indices, mask, track_indices,
        batch_size, conv_shape[0], sym_min(conv_shape[1], ssm_shape[1]),
        conv_numel, ssm_numel,
        conv_strides[0], conv_strides[1], ssm_strides[0], ssm_strides[1],
        cache_indices.stride(0), mask.stride(0), track_indices.stride(0),
        conv_chunk, ssm_chunk, conv_block, ssm_block, SCAN, TILE, load_policy, store_policy,
    )


def _options(num_warps=TUNING["num_warps"], maxnreg=TUNING["maxnreg"]) -> tuple:
    """The launch options: ``num_warps``, and ``maxnreg`` unless it is None."""
    return (("num_warps", num_warps),) + ((("maxnreg", maxnreg),) if maxnreg else ())


def _launch(kernel, programs, conv, ssm, cache_indices, mask, track_indices, batch_size,
            chunk_bytes=TUNING["chunk_bytes"], block_bytes=TUNING["block_bytes"],
            block_elements=TUNING["block_elements"], num_warps=TUNING["num_warps"],
            maxnreg=TUNING["maxnreg"], load_policy=TUNING["load_policy"],
            store_policy=TUNING["store_policy"]):
    """Launch ``kernel`` (a JIT, wrapped or interpreted Triton kernel) on validated inputs."""
    grid, args = _arguments(programs, conv, ssm, cache_indices, mask, track_indices,
                            batch_size, chunk_bytes, block_bytes, block_elements, load_policy,
                            store_policy)
    runtime, constexprs = keyword_constexprs(_track_kernel, args)
    kernel[grid](*runtime, **constexprs, **dict(_options(num_warps, maxnreg)))


def _forward(kernel, real_launch, conv, ssm, cache_indices, mask, track_indices, batch_size,
             check_freed_slots):
    contract.validate(conv, ssm, cache_indices, mask, track_indices, batch_size,
                      check_freed_slots)
    # A traced launch (torch.compile, export) carries no maxnreg: Inductor's launch of a user
    # kernel takes its parameters and num_warps, so the cap is for real launches only.
    with on_device_of(conv, real_launch):
        _launch(kernel, _programs(conv, real_launch), conv, ssm, cache_indices, mask,
                track_indices, batch_size, maxnreg=TUNING["maxnreg"] if real_launch else None)


# The eager path: the contract's verdict cached per metadata signature, the kernel launched
# through its cached launcher (strictops.ops._runtime.launcher); the same rules and the same launch.
_VALIDATION = CachedValidation(contract.CONTRACT, contract.ARGUMENTS)
_LAUNCHER = Launcher(_track_kernel)
_OPTIONS = _options()


def _eager(conv, ssm, cache_indices, mask, track_indices, batch_size, check_freed_slots):
    _VALIDATION(conv, ssm, cache_indices, mask, track_indices, batch_size, check_freed_slots)
    device = conv.get_device()
    grid, args = _arguments(TUNING["programs_per_sm"] * _sm_count(device), conv, ssm,
                            cache_indices, mask, track_indices, batch_size)
    _LAUNCHER(grid, args, _OPTIONS, device)


@triton_op(contract.CONTRACT.op, mutates_args=contract.CONTRACT.mutates)
def _track_mamba_states_all_layers(
    conv_states_pool: torch.Tensor,
    ssm_states_pool: torch.Tensor,
    cache_indices: torch.Tensor,
    mamba_track_mask: torch.Tensor,
    mamba_track_indices: torch.Tensor,
    batch_size: int,
    check_freed_slots: bool,
) -> None:
    # No default for check_freed_slots in the schema (see sparse_mla_prefill's registration).
    # The body is also the fake: under fake tensors the launch is recorded, not run.
    kernel = wrap_triton(_track_kernel)
    _forward(kernel, kernel is _track_kernel, conv_states_pool, ssm_states_pool, cache_indices,
             mamba_track_mask, mamba_track_indices, batch_size, check_freed_slots)


def track_mamba_states_all_layers(
    conv_states_pool: torch.Tensor,
    ssm_states_pool: torch.Tensor,
    cache_indices: torch.Tensor,
    mamba_track_mask: torch.Tensor,
    mamba_track_indices: torch.Tensor,
    batch_size: int,
    check_freed_slots: bool = False,
) -> None:
    """Copy the tracked rows' conv and SSM states into their track slots, every layer, in place.

    Parameters
    ----------
    conv_states_pool, ssm_states_pool : torch.Tensor
        ``[num_layers, pool_size, ...]`` CUDA tensors (any dtypes), written in place; the entry
        dims (``2..``) contiguous, layer and slot strides free.
    cache_indices : torch.Tensor
        ``[>= batch_size]`` int32/int64: each row's cache slot (the source).
    mamba_track_mask : torch.Tensor
        ``[>= batch_size]`` bool/int32/int64: non-zero rows are tracked.
    mamba_track_indices : torch.Tensor
        ``[>= batch_size]`` int32/int64: each row's track slot (the destination).
    batch_size : int
        Rows to consider.
    check_freed_slots : bool
        Kept for the original's signature: slots outside the pools (the freed slot ``-1``
        among them) are always skipped.

    Notes
    -----
    One launch, no host sync, no copy of the index tensors; see the module docstring for the
    exact semantics. Bad metadata raises ``ValueError`` before launch, and at trace time under
    ``torch.compile``/``torch.export``.
    """
    args = (conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask,
            mamba_track_indices, batch_size, check_freed_slots)
    if can_skip_dispatcher(*args[:5]):
        _eager(*args)
        torch.autograd.graph.increment_version(conv_states_pool)
        torch.autograd.graph.increment_version(ssm_states_pool)
        return
    torch.ops.strictops.track_mamba_states_all_layers(*args)


def track_mamba_states_if_needed(
    conv_states: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    mamba_track_mask: torch.Tensor,
    mamba_track_indices: torch.Tensor,
    batch_size: int,
    check_freed_slots: bool = False,
) -> None:
    """:func:`track_mamba_states_all_layers` for one layer: ``conv_states`` and ``ssm_states``
    are ``[pool_size, ...]`` (entry dims ``1..`` contiguous), written in place."""
    track_mamba_states_all_layers(conv_states.unsqueeze(0), ssm_states.unsqueeze(0),
                                  cache_indices, mamba_track_mask, mamba_track_indices,
                                  batch_size, check_freed_slots)


def launch_interpreted(conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask,
                       mamba_track_indices, batch_size, check_freed_slots=False,
                       reverse_programs=False, programs=5, **tuning):
    """Run the kernel through the Triton interpreter on CPU tensors (tests, self-check), with
    ``programs`` persistent programs."""
    with interpreted(_track_kernel, reverse_programs) as kernel:
        _launch(kernel, programs, conv_states_pool, ssm_states_pool, cache_indices,
                mamba_track_mask, mamba_track_indices, batch_size, **tuning)


def _writing_rows(conv, ssm, cache_indices, mask, track_indices, batch_size):
    n = batch_size
    src, dst = cache_indices[:n].long(), track_indices[:n].long()
    pool = min(conv.shape[1], ssm.shape[1])
    valid = (mask[:n] != 0) & (src >= 0) & (src < pool) & (dst >= 0) & (dst < pool)
    later = torch.triu((dst[None, :] == dst[:, None]) & valid[None, :], diagonal=1).any(dim=1)
    w = (valid & ~later).nonzero(as_tuple=True)[0]
    return src[w], dst[w]


def reference(conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask,
              mamba_track_indices, batch_size, check_freed_slots=False):
    """Plain-PyTorch reference: new tensors ``(conv, ssm)`` equal to the pools after the op
    (gather every source first, then scatter)."""
    src, dst = _writing_rows(conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask,
                             mamba_track_indices, batch_size)
    conv, ssm = conv_states_pool.clone(), ssm_states_pool.clone()
    conv[:, dst] = conv_states_pool[:, src]
    ssm[:, dst] = ssm_states_pool[:, src]
    return conv, ssm


def example_inputs(device: str, small: bool, generator: torch.Generator) -> dict:
    """Keyword arguments of a valid call whose index values reach every path of the kernel.

    Cache slots in the lower half of the pool, track slots in the upper half (serving keeps
    them apart); rows 0-3 carry a negative or out-of-range slot, rows 4-6 share one track slot
    (5 and 6 tracked: 6 wins), and about half the rows are tracked. ``small``: interpreter-sized,
    pairwise-distinct sizes >= 2 and entries spanning several chunks; else 64 requests at a
    moderate GPU shape.
    """
    if small:
        dims = contract.Dims(num_layers=2, pool_size=17, conv_state=(5, 3), ssm_state=(7, 4),
                             batch=11, batch_size=9)
    else:
        dims = contract.Dims(num_layers=4, pool_size=256, conv_state=(2048, 3),
                             ssm_state=(8, 64, 64), batch=64)
    import dataclasses

    dims = dataclasses.replace(dims, device=device, index_dtypes=(torch.int32, torch.int64))
    half, n = dims.pool_size // 2, dims.batch
    src = torch.randint(0, half, (n,), generator=generator)
    dst = torch.randint(half, dims.pool_size, (n,), generator=generator)
    mask = torch.rand(n, generator=generator) < 0.5
    src[0], dst[1], src[2], dst[3] = -1, dims.pool_size, 2**31 - 1, -(2**31)
    dst[5] = dst[6] = dst[4]
    mask[:7] = True
    mask[4] = False
    values = {"cache_indices": src, "mamba_track_mask": mask, "mamba_track_indices": dst}
    out = {}
    for name, spec in contract.valid_spec(dims).items():
        if not hasattr(spec, "empty"):
            out[name] = spec
            continue
        value = values.get(name)
        if value is None:
            value = torch.randn(spec.shape, generator=generator)
        out[name] = value.to(device=spec.device, dtype=spec.dtype)
    return out


def selfcheck_result(on_gpu: bool) -> tuple[bool, str]:
    """The self-check's result row: both pools equal the reference bit for bit."""
    device = "cuda:0" if on_gpu else "cpu"
    args = example_inputs(device, not on_gpu, torch.Generator().manual_seed(0))
    want = reference(**args)
    before = args["ssm_states_pool"].clone()
    if on_gpu:
        track_mamba_states_all_layers(**args)
    else:
        launch_interpreted(**args, reverse_programs=True)
    got = (args["conv_states_pool"], args["ssm_states_pool"])
    # An example that writes nothing would let a kernel that does nothing pass.
    passed = not torch.equal(want[1], before) and all(
        torch.equal(g, w) for g, w in zip(got, want))
    where = "GPU cuda:0" if on_gpu else "Triton interpreter"
    return passed, f"{where}, pools {list(got[0].shape)} and {list(got[1].shape)}"
