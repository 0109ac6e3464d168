"""Track states: variants of the kernel's entry, walk and cache policies, side by side with the
op and sglang's original, per call in a CUDA graph of 20 back-to-back calls (L2 flushed per
replay), at 0, 1, 8 and 64 tracked rows of 64.

The variant kernel is the op's (``ops/mamba/track_states``: the same row reads, writer
resolution and chunk copy, imported) with switches:

- ``ENTRY``: ``"early_mask"`` (the op's: the first block's mask read is the kernel's first
  instruction, and a call that marks no row in one block ends there; the walk then reads the
  block's three tensors), ``"early"`` (the first block's three index reads first, the exit on
  a row that would write), ``"late"`` (the walk's set-up first: its divisions, then the
  reads), ``"mask_first"`` (after the walk's set-up, each block's mask alone first; the slots
  only for a block with a tracked row). With ``PREFETCH`` an L2 prefetch of the slots is
  issued beside the mask read (inline PTX): 1 from every thread, 2 from the first ``SCAN``
  threads only (each row once).
- ``BARRIER``: a barrier before every work item (the program's warps in step).
- ``LAYER_FAST``: items ordered (row, chunk, layer), the layer fastest.
- ``RELOAD``: each item reads its writer's two slots from memory again (L1 hits), as sglang's
  original does, instead of keeping them in registers.
- ``LOAD_POLICY`` / ``STORE_POLICY``: the copy's L2 eviction policies.

Launch tunings (programs an SM, warps, ``maxnreg``, step bytes) go through the op's own
argument builder. Every variant's result is checked bit for bit against the reference on the
first index set. Model shapes as in ``benchmarks/bench_mamba_track_states.py``.

    python benchmarks/experiments/mamba_track_states_variants.py [NAME ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from strictops.ops.mamba import track_states as m
from strictops.ops.mamba.track_states import _copy_chunk, _rows, _sum_pair, _writers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _harness import graph_replay_us  # noqa: E402
from bench_mamba_track_states import (  # noqa: E402
    CALLS, REQUESTS, TRACKED, _cycling, _index_sets, model_pools, with_original)


@triton.jit
def _prefetch_l2(ptrs, mask, MODE: tl.constexpr):
    """An L2 prefetch of every address of ``ptrs`` where ``mask`` (no register waits on it):
    from every thread holding it (``MODE`` 1), or from threads below ``ptrs``' length only
    (2: a row held by several warps is prefetched once)."""
    if MODE == 1:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        length = tl.full(ptrs.shape, ptrs.shape[0], tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p, q; .reg .u32 t; mov.u32 t, %tid.x; setp.ne.b32 p, $2, 0; "
            "setp.lt.u32 q, t, $3; and.pred p, p, q; "
            "@p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r,r", [ptrs, mask.to(tl.int32), length], dtype=tl.int32, is_pure=False,
            pack=1)


@triton.jit(do_not_specialize=["batch_size", "num_layers", "pool"])
def _variant_kernel(conv_ptr, ssm_ptr, src_ptr, mask_ptr, dst_ptr, batch_size, num_layers, pool,
                    conv_numel, ssm_numel, conv_layer_stride, conv_slot_stride,
                    ssm_layer_stride, ssm_slot_stride, src_stride, mask_stride, dst_stride,
                    CONV_CHUNK: tl.constexpr, SSM_CHUNK: tl.constexpr,
                    CONV_BLOCK: tl.constexpr, SSM_BLOCK: tl.constexpr, SCAN: tl.constexpr,
                    TILE: tl.constexpr, LOAD_POLICY: tl.constexpr, STORE_POLICY: tl.constexpr,
                    ENTRY: tl.constexpr, PREFETCH: tl.constexpr, BARRIER: tl.constexpr,
                    LAYER_FAST: tl.constexpr, RELOAD: tl.constexpr):
    """``_track_kernel`` with the switches of the module docstring; the same grid and result."""
    go = True
    if ENTRY == "early":
        valid, _, _ = _rows(tl.arange(0, SCAN).to(tl.int64), src_ptr, mask_ptr, dst_ptr,
                            batch_size, pool, src_stride, mask_stride, dst_stride)
        go = (tl.sum(valid.to(tl.int32), axis=0) > 0) | (batch_size > SCAN)
    if ENTRY == "early_mask":
        first = tl.arange(0, SCAN).to(tl.int64)
        in_first = first < batch_size
        marked = tl.load(mask_ptr + first * mask_stride, mask=in_first, other=0) != 0
        if PREFETCH:
            _prefetch_l2(src_ptr + first * src_stride, in_first, PREFETCH)
            _prefetch_l2(dst_ptr + first * dst_stride, in_first, PREFETCH)
        go = (tl.max(marked.to(tl.int32), axis=0) > 0) | (batch_size > SCAN)
    if go:
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        conv_chunks = tl.cdiv(conv_numel, CONV_CHUNK)
        chunks = conv_chunks + tl.cdiv(ssm_numel, SSM_CHUNK)
        per_row = chunks * num_layers
        phase = pid * 0
        for r0 in range(0, batch_size, SCAN):
            rows = r0 + tl.arange(0, SCAN).to(tl.int64)
            tracked = True
            if ENTRY == "mask_first":
                in_batch = rows < batch_size
                marked = tl.load(mask_ptr + rows * mask_stride, mask=in_batch, other=0) != 0
                if PREFETCH:
                    _prefetch_l2(src_ptr + rows * src_stride, in_batch, PREFETCH)
                    _prefetch_l2(dst_ptr + rows * dst_stride, in_batch, PREFETCH)
                tracked = tl.max(marked.to(tl.int32), axis=0) > 0
            if tracked:
                valid, src, dst = _rows(rows, src_ptr, mask_ptr, dst_ptr, batch_size, pool,
                                        src_stride, mask_stride, dst_stride)
                n_valid = tl.sum(valid.to(tl.int32), axis=0)
                if n_valid > 0:
                    writes = _writers(r0, rows, valid, dst, n_valid == 1, src_ptr, mask_ptr,
                                      dst_ptr, batch_size, pool, src_stride, mask_stride,
                                      dst_stride, SCAN, TILE)
                    rank = tl.where(writes != 0, tl.cumsum(writes, axis=0), 0)
                    for k in range(1, tl.sum(writes, axis=0) + 1):
                        if RELOAD:
                            row_k = tl.sum(tl.where(rank == k, rows, 0), axis=0)
                        else:
                            s, d = tl.reduce((tl.where(rank == k, src, 0),
                                              tl.where(rank == k, dst, 0)), 0, _sum_pair)
                        for j in range((pid - phase + programs) % programs, per_row, programs):
                            if BARRIER:
                                tl.debug_barrier()
                            if RELOAD:
                                s = tl.load(src_ptr + row_k * src_stride).to(tl.int64)
                                d = tl.load(dst_ptr + row_k * dst_stride).to(tl.int64)
                            if LAYER_FAST:
                                chunk = j // num_layers
                                layer = j - chunk * num_layers
                            else:
                                layer = j // chunks
                                chunk = j - layer * chunks
                            layer = layer.to(tl.int64)
                            if chunk < conv_chunks:
                                _copy_chunk(conv_ptr + layer * conv_layer_stride,
                                            s * conv_slot_stride, d * conv_slot_stride,
                                            chunk * CONV_CHUNK, conv_numel, CONV_CHUNK,
                                            CONV_BLOCK, LOAD_POLICY, STORE_POLICY)
                            else:
                                _copy_chunk(ssm_ptr + layer * ssm_layer_stride,
                                            s * ssm_slot_stride, d * ssm_slot_stride,
                                            (chunk - conv_chunks) * SSM_CHUNK, ssm_numel,
                                            SSM_CHUNK, SSM_BLOCK, LOAD_POLICY, STORE_POLICY)
                        phase = (phase + per_row % programs) % programs


def variant(entry="early", prefetch=0, barrier=False, layer_fast=False, reload=False,
            load_policy="", store_policy="", programs_per_sm=None, num_warps=None,
            maxnreg=m.TUNING["maxnreg"], **tuning):
    """A launch ``fn(conv, ssm, src, mask, dst, batch_size)`` of the variant kernel, with the
    op's tuning changed by ``tuning`` (``chunk_bytes``, ``block_bytes``) and the launch
    options given."""
    per_sm = programs_per_sm or m.TUNING["programs_per_sm"]
    options = {"num_warps": num_warps or m.TUNING["num_warps"]}
    if maxnreg:
        options["maxnreg"] = maxnreg
    flags = {"ENTRY": entry, "PREFETCH": prefetch, "BARRIER": barrier,
             "LAYER_FAST": layer_fast, "RELOAD": reload}

    def launch(conv, ssm, src, mask, dst, batch_size, kernel=_variant_kernel):
        sms = torch.cuda.get_device_properties(conv.device).multi_processor_count
        grid, args = m._arguments(per_sm * sms, conv, ssm, src, mask, dst, batch_size,
                                  load_policy=load_policy, store_policy=store_policy, **tuning)
        kernel[grid](*args, **flags, **options)

    return launch


EVICT_LAST, EVICT_FIRST = "evict_last", "evict_first"
VARIANTS = {
    "late": variant(entry="late"),
    "late_barrier": variant(entry="late", barrier=True),
    "late_layer_fast": variant(entry="late", layer_fast=True),
    "late_reload": variant(entry="late", reload=True),
    "late_reload_no_maxnreg": variant(entry="late", reload=True, maxnreg=None),
    "late_3_per_sm": variant(entry="late", programs_per_sm=3),
    "late_8_per_sm_4_warps_16k_steps": variant(entry="late", programs_per_sm=8, num_warps=4,
                                               block_bytes=16384),
    "late_evict_first_loads": variant(entry="late", load_policy=EVICT_FIRST),
    "late_evict_last_loads": variant(entry="late", load_policy=EVICT_LAST),
    "late_evict_first_stores": variant(entry="late", store_policy=EVICT_FIRST),
    "late_evict_last_stores": variant(entry="late", store_policy=EVICT_LAST),
    "late_evict_first_loads_evict_last_stores": variant(entry="late", load_policy=EVICT_FIRST,
                                                        store_policy=EVICT_LAST),
    "mask_first": variant(entry="mask_first"),
    "mask_first_evict_last_loads_evict_first_stores": variant(
        entry="mask_first", load_policy=EVICT_LAST, store_policy=EVICT_FIRST),
    "mask_first_prefetch": variant(entry="mask_first", prefetch=1),
    "mask_first_prefetch_2_per_sm_no_maxnreg": variant(entry="mask_first", prefetch=1,
                                                       programs_per_sm=2, maxnreg=None),
    "early": variant(),
    "early_mask_evict_last_loads_evict_first_stores": variant(
        entry="early_mask", load_policy=EVICT_LAST, store_policy=EVICT_FIRST),
    "early_mask_prefetch_once_evict_last_loads_evict_first_stores": variant(
        entry="early_mask", prefetch=2, load_policy=EVICT_LAST, store_policy=EVICT_FIRST),
    "early_reload": variant(reload=True),
    "early_2_per_sm_no_maxnreg": variant(programs_per_sm=2, maxnreg=None),
    "early_evict_last_loads": variant(load_policy=EVICT_LAST),
    "early_evict_last_loads_evict_first_stores": variant(load_policy=EVICT_LAST,
                                                         store_policy=EVICT_FIRST),
    "early_evict_last_loads_evict_last_stores": variant(load_policy=EVICT_LAST,
                                                        store_policy=EVICT_LAST),
}


def main() -> None:
    chosen = sys.argv[1:] or list(VARIANTS)
    kernels = with_original({"op": m.track_mamba_states_all_layers,
                             **{n: VARIANTS[n] for n in chosen}})
    gen = torch.Generator(device="cuda").manual_seed(20261202)
    conv, ssm = model_pools(gen)
    print(f"us per call, graph of {CALLS} calls (L2 flushed per replay): two rounds, the "
          "second in reverse order")
    for tracked in TRACKED:
        sets = _index_sets(tracked, gen)
        for name, launch in kernels.items():
            pools = (conv.clone(), ssm.clone())
            want = m.reference(*pools, *sets[0], REQUESTS)
            launch(*pools, *sets[0], REQUESTS)
            if not (torch.equal(pools[0], want[0]) and torch.equal(pools[1], want[1])):
                print(f"{name}: NOT EXACT at {tracked} tracked rows")
            del pools, want
            torch.cuda.empty_cache()
        times = {name: [] for name in kernels}
        for order in (list(kernels), list(reversed(kernels))):
            for name in order:
                times[name].append(graph_replay_us(_cycling(kernels[name], conv, ssm, sets),
                                                   calls=CALLS))
        print(f"{tracked}of{REQUESTS}_tracked: " + "; ".join(
            f"{name} {'/'.join(f'{t:.2f}' for t in ts)}" for name, ts in times.items()),
            flush=True)


if __name__ == "__main__":
    main()
