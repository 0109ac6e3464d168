"""Track states: the previous kernel against the current one and sglang's original, in one
process, per call in a CUDA graph of 20 back-to-back calls.

The previous kernel (kept here, not in ``ops/``, for this comparison only) read the mask and
both slots of a 64-row block, compared it with every row from its first on 32 at a time, and
walked its items with 64-bit divisions and two reductions per item; it copied both pools in
8192-element steps (a shuffle through shared memory in every fp32 chunk) at 122-124 registers
(two of its four programs per SM resident); its rows read through the current kernel's
``_rows`` (the same SASS as its own copy of them). The hybrid is the previous kernel with the
current row walk in front (``CURRENT_ROWS``). The current kernel is ``ops/mamba/track_states``
(docs/design/mamba_track_states.md#registers-and-residency). Model shapes as in
``benchmarks/bench_mamba_track_states.py``; every kernel's result is checked bit for bit
against the reference on the first index set.

    python benchmarks/experiments/mamba_track_states_ab.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from strictops.ops.mamba import track_states as m
from strictops.ops.mamba.track_states import _copy_chunk

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _harness import graph_replay_us  # noqa: E402
from bench_mamba_track_states import (  # noqa: E402
    CALLS, REQUESTS, TRACKED, _cycling, _index_sets, model_pools, with_original)


@triton.jit
def _old_writers(r0, rows, src_ptr, mask_ptr, dst_ptr, batch_size, pool, src_stride,
                 mask_stride, dst_stride, SCAN: tl.constexpr, TILE: tl.constexpr):
    """``[SCAN]`` int32: 1 where row ``rows[k]`` writes (tracked, slots in range, no later
    writing row with its track slot), plus the rows' cache and track slots (int64)."""
    valid, src, dst = m._rows(rows, src_ptr, mask_ptr, dst_ptr, batch_size, pool, src_stride,
                              mask_stride, dst_stride)
    key = tl.where(valid, dst, -1)  # -1: the row does not write (never equal to a later key)
    later = tl.zeros([SCAN], dtype=tl.int32)
    if tl.max(valid.to(tl.int32), axis=0) > 0:  # no writer here: nothing to compare
        for j0 in range(r0, batch_size, TILE):
            cols = j0 + tl.arange(0, TILE).to(tl.int64)
            v_j, _, d_j = m._rows(cols, src_ptr, mask_ptr, dst_ptr, batch_size, pool, src_stride,
                                  mask_stride, dst_stride)
            key_j = tl.where(v_j, d_j, -2)
            same = (key[:, None] == key_j[None, :]) & (cols[None, :] > rows[:, None])
            later = later | tl.max(same.to(tl.int32), axis=1)
    return (valid & (later == 0)).to(tl.int32), src, dst


@triton.jit(do_not_specialize=["batch_size", "num_layers", "pool"])
def _old_kernel(
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
    BLOCK: tl.constexpr,
    SCAN: tl.constexpr,
    TILE: tl.constexpr,
    CURRENT_ROWS: tl.constexpr,
):
    """Persistent copy of every writing row's entries, all layers.

    Grid: ``(P,)`` for any ``P >= 1``. Work items are ``(writing row, layer, chunk)``; program
    ``p`` takes items ``p, p + P, ...``. Rows are read ``SCAN`` at a time: every program finds
    the writing rows of a block itself (no host sync, no second launch), so a step with no
    tracked row costs one read of the index tensors per program.

    conv_ptr / ssm_ptr: ``[num_layers, pool, conv_numel | ssm_numel]`` through their layer and
        slot strides; entries contiguous. Chunks of ``CONV_CHUNK`` / ``SSM_CHUNK`` elements,
        each copied in ``BLOCK``-element steps.
    src_ptr / mask_ptr / dst_ptr: ``[>= batch_size]`` any stride.

    ``CURRENT_ROWS``: the hybrid; the blocks read and their writers found as the current
    kernel does (one round trip for the three index tensors, a block without a valid row
    skipped, a block with one valid row not compared with itself) in front of this item walk
    and copy.
    """
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    conv_chunks = tl.cdiv(conv_numel, CONV_CHUNK)
    chunks = conv_chunks + tl.cdiv(ssm_numel, SSM_CHUNK)
    per_row = chunks.to(tl.int64) * num_layers
    done = tl.zeros([], dtype=tl.int64)  # writing rows in earlier blocks
    for r0 in range(0, batch_size, SCAN):
        rows = r0 + tl.arange(0, SCAN).to(tl.int64)  # 64-bit: times a stride of any size
        any_valid = True
        if CURRENT_ROWS:
            valid, src, dst = m._rows(rows, src_ptr, mask_ptr, dst_ptr, batch_size, pool,
                                      src_stride, mask_stride, dst_stride)
            n_valid = tl.sum(valid.to(tl.int32), axis=0)
            any_valid = n_valid > 0
        if any_valid:
            if CURRENT_ROWS:
                writes = m._writers(r0, rows, valid, dst, n_valid == 1, src_ptr, mask_ptr,
                                    dst_ptr, batch_size, pool, src_stride, mask_stride,
                                    dst_stride, SCAN, TILE)
            else:
                writes, src, dst = _old_writers(r0, rows, src_ptr, mask_ptr, dst_ptr,
                                                batch_size, pool, src_stride, mask_stride,
                                                dst_stride, SCAN, TILE)
            rank = tl.cumsum(writes, axis=0)  # 1-based among this block's writers
            count = tl.sum(writes, axis=0)
            first = done * per_row
            start = first + (pid + programs - first % programs) % programs
            for item in range(start, (done + count) * per_row, programs):
                k = item // per_row  # 0-based among all writers
                rem = item - k * per_row
                layer = rem // chunks
                chunk = rem - layer * chunks
                pick = (rank == k - done + 1) & (writes != 0)
                s = tl.sum(tl.where(pick, src, 0), axis=0)
                d = tl.sum(tl.where(pick, dst, 0), axis=0)
                if chunk < conv_chunks:
                    _copy_chunk(conv_ptr + layer * conv_layer_stride, s * conv_slot_stride,
                                d * conv_slot_stride, chunk * CONV_CHUNK, conv_numel,
                                CONV_CHUNK, BLOCK, "", "")
                else:
                    _copy_chunk(ssm_ptr + layer * ssm_layer_stride, s * ssm_slot_stride,
                                d * ssm_slot_stride, (chunk - conv_chunks) * SSM_CHUNK,
                                ssm_numel, SSM_CHUNK, BLOCK, "", "")
            done += count


OLD_SCAN, OLD_TILE, OLD_BLOCK = 64, 32, 8192


def _old_launch(conv, ssm, src, mask, dst, batch_size, current_rows=False, per_sm=4):
    """The previous launch: grid ``min(items, 4 x SMs)``, 8 warps, 32 KiB chunks copied in
    8192-element steps (``per_sm`` programs an SM; ``current_rows``: the hybrid)."""
    conv_numel, ssm_numel = math.prod(conv.shape[2:]), math.prod(ssm.shape[2:])
    conv_chunk = max(OLD_BLOCK, 32768 // conv.element_size())
    ssm_chunk = max(OLD_BLOCK, 32768 // ssm.element_size())
    items = batch_size * conv.shape[0] * (triton.cdiv(conv_numel, conv_chunk)
                                          + triton.cdiv(ssm_numel, ssm_chunk))
    sms = torch.cuda.get_device_properties(conv.device).multi_processor_count
    _old_kernel[(min(items, per_sm * sms),)](
        conv, ssm, src, mask, dst, batch_size, conv.shape[0], min(conv.shape[1], ssm.shape[1]),
        conv_numel, ssm_numel, conv.stride(0), conv.stride(1), ssm.stride(0), ssm.stride(1),
        src.stride(0), mask.stride(0), dst.stride(0), CONV_CHUNK=conv_chunk,
        SSM_CHUNK=ssm_chunk, BLOCK=OLD_BLOCK, SCAN=OLD_SCAN, TILE=OLD_TILE,
        CURRENT_ROWS=current_rows, num_warps=8)


def main() -> None:
    kernels = with_original({
        "previous": _old_launch, "current": m.track_mamba_states_all_layers,
        "hybrid": lambda *call: _old_launch(*call, current_rows=True),
        "hybrid_2_per_sm": lambda *call: _old_launch(*call, current_rows=True, per_sm=2)})
    gen = torch.Generator(device="cuda").manual_seed(20261201)
    conv, ssm = model_pools(gen)
    print(f"us per call, graph of {CALLS} calls (L2 flushed per replay) | graph of 1 call")
    for tracked in TRACKED:
        sets = _index_sets(tracked, gen)
        cells = []
        for name, launch in kernels.items():
            # The pools as the timings before left them: the reference from the same state.
            pools = (conv.clone(), ssm.clone())
            want = m.reference(*pools, *sets[0], REQUESTS)
            launch(*pools, *sets[0], REQUESTS)
            exact = torch.equal(pools[0], want[0]) and torch.equal(pools[1], want[1])
            del pools
            per_call = graph_replay_us(_cycling(launch, conv, ssm, sets), calls=CALLS)
            one = graph_replay_us(lambda launch=launch: launch(conv, ssm, *sets[0], REQUESTS))
            cells.append(f"{name} {per_call:.2f} | {one:.2f}{'' if exact else ' NOT EXACT'}")
        del want
        torch.cuda.empty_cache()
        print(f"{tracked}of{REQUESTS}_tracked: " + "; ".join(cells))


if __name__ == "__main__":
    main()
