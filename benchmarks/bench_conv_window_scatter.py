"""Benchmark: fused conv-window scatter at the model's conv-state shape.

Conv states ``[36, 512, 2048, 3]`` bf16 (K = 4), 64 requests, 4 draft tokens, about 51 of them
accepted; ``src`` is the verify pass's deduplicated window cache, an overlapping view of a
shared ``[36, 64, 2048, 6]`` buffer. For each case: ours and sglang's original (from the
``.anchor`` checkout, when present) in one run, eager and replayed from a CUDA graph, against
the copy floor (bytes / copy bandwidth measured in this run). Two floors: the bytes the op must
move (the window read and written), and the bytes it touches (a window is half of each
12-byte row of the shared buffer, so DRAM sectors carry the whole buffer). Also: bit equality
with the reference and the original, a sweep of the kernel's tuning, and an eager call's host
wall time.

    python benchmarks/bench_conv_window_scatter.py [--out DIR]   # default: benchmarks/results/<gpu>/
"""

from __future__ import annotations

import functools

import torch

from strictops.ops.mamba import conv_window_scatter as m
from strictops.ops import fused_conv_window_scatter_with_mask

from _harness import (anchor_module, arg_parser, bar_plot, begin, graph_replay_us, median_us,
                      print_variants, wall_us)

# (name, layers, cache, dim, K-1, dtype, requests, draft tokens, valid requests)
SHAPES = [
    ("conv_64req", 36, 512, 2048, 3, torch.bfloat16, 64, 4, 51),
    ("conv_1req", 36, 512, 2048, 3, torch.bfloat16, 1, 4, 1),
]
# The kernel's tunings swept in graph replay (bytes of a program's run, layers per program,
# bytes a thread loads and stores contiguously, 0 for the shared-memory exchange, loads and
# stores streaming past L2, warps); the op's defaults are m.TUNING.
TUNING = [{"block_bytes": b, "layers": l, "run_bytes": r, "stream": s, "num_warps": w}
          for b, l, r, s, w in [(2048, 1, 16, False, 4), (2048, 2, 16, False, 4),
                                (2048, 4, 16, False, 4), (2048, 2, 8, False, 4),
                                (2048, 2, 4, False, 4), (2048, 2, 16, True, 4),
                                (2048, 2, 8, True, 4), (2048, 2, 4, True, 4),
                                (2048, 2, 0, False, 4)]]
# (A single request sweeps the first three: its kernel is latency-bound, and each tuning
# compiles again for it, n_requests = 1 being a Triton constexpr.)
# The results plot's bars, per row: the floors, ours and the original, graph and eager.
SERIES = [("floor (bytes moved / copy bandwidth)", "floor_us"),
          ("floor (bytes touched)", "touched_floor_us"),
          ("ours, graph", "graph_us"), ("original, graph", "original_graph_us"),
          ("ours, eager", "eager_us"), ("original, eager", "original_eager_us")]


def tuning_name(v: dict) -> str:
    run = f"r{v['run_bytes']}" if v["run_bytes"] else "x"
    return (f"{v['block_bytes']}B/{v['layers']}L/{run}{'/s' if v['stream'] else ''}"
            f"/{v['num_warps']}w")


def original():
    """sglang's ``mamba_state_scatter_triton`` module (benchmark-only comparator), or None."""
    return anchor_module("sgl_mamba")


def make_inputs(layers, cache, dim, km1, dtype, requests, draft, valid, gen):
    """``dst`` pool, ``src`` window view, distinct slots, ``requests - valid`` steps of -1."""
    dst = torch.randn(layers, cache, dim, km1, device="cuda", generator=gen).to(dtype)
    shared = torch.randn(layers, requests, dim, draft + km1 - 1, device="cuda", generator=gen)
    src = m.window_view(shared.to(dtype), draft, km1)
    slots = torch.randperm(cache, device="cuda", generator=gen)[:requests].to(torch.int32)
    steps = torch.randint(0, draft, (requests,), device="cuda", generator=gen, dtype=torch.int32)
    rejected = torch.randperm(requests, device="cuda", generator=gen)[: requests - valid]
    steps[rejected] = -1
    return dst, src, slots, steps


def floors_us(layers, n_valid, dim, km1, draft, element_size, bw):
    """(moved, touched): the window's bytes read + written, and the shared buffer rows' bytes
    read + the window's written, over the copy bandwidth."""
    window = dim * km1 * element_size
    rows = dim * (draft + km1 - 1) * element_size
    return 2 * layers * n_valid * window / bw, layers * n_valid * (rows + window) / bw


def main() -> None:
    args, report, gen = begin("conv_window_scatter", arg_parser(__doc__), seed=20261201)
    sgl = original()
    bw = report.copy_ceiling()

    for name, layers, cache, dim, km1, dtype, requests, draft, valid in SHAPES:
        dst, src, slots, steps = make_inputs(layers, cache, dim, km1, dtype, requests, draft,
                                             valid, gen)
        n_valid = int((steps >= 0).sum())
        floor_us, touched_us = floors_us(layers, n_valid, dim, km1, draft, dst.element_size(), bw)

        def ours():
            fused_conv_window_scatter_with_mask(dst, src, slots, steps)

        expected = m.reference(dst, src, slots, steps)
        theirs_dst = dst.clone() if sgl is not None else None  # both start from the same pool
        ours()
        row = {"shape": name, "dst": f"{list(dst.shape)} {str(dtype)[6:]}", "valid": n_valid,
               "bit_exact": torch.equal(dst, expected), "floor_us": floor_us,
               "touched_floor_us": touched_us}
        if sgl is not None:
            sgl.fused_conv_window_scatter_with_mask(theirs_dst, src, slots, steps)
            row["equal_to_original"] = torch.equal(theirs_dst, dst)

            def theirs():
                sgl.fused_conv_window_scatter_with_mask(dst, src, slots, steps)
        else:
            theirs = None
        del expected
        time_side_by_side(report, row, ours, theirs, floor_us, {
            tuning_name(v): functools.partial(
                m._launch, m._scatter_kernel, dst, src, slots, steps, None, **v)
            for v in (TUNING if requests > 1 else TUNING[:3])})
        row["dispatcher_wall_us"], _ = wall_us(
            lambda: torch.ops.strictops.fused_conv_window_scatter_with_mask(dst, src, slots, steps))
        report.add(**row)
        del dst, src
        torch.cuda.empty_cache()

    report.write(args.out, ["shape", "dst", "valid", "bit_exact", "equal_to_original",
                            "floor_us", "touched_floor_us", "graph_us", "original_graph_us",
                            "eager_us", "original_eager_us", "eager_wall_us",
                            "original_eager_wall_us", "dispatcher_wall_us",
                            "graph_floor_ratio", "graph_vs_original", "eager_vs_original",
                            "wall_vs_original", "best_tuning", "best_tuning_us"],
                 plot=bar_plot("shape", SERIES, "fused_conv_window_scatter_with_mask"))
    print_variants(report, "tuning_graph_us", "tuning (graph us)")


def time_side_by_side(report, row: dict, ours, theirs, floor_us: float, variants: dict) -> None:
    """Time ``ours`` and ``theirs`` (the original, or None) eager, in graph replay and by host
    wall time into ``row``; the tuning ``variants`` in graph replay; ratios, and the bars
    (at least as fast as the original, each way)."""
    if theirs is not None:
        row["original_eager_us"] = median_us(theirs)
        row["original_graph_us"] = graph_replay_us(theirs)
        row["original_eager_wall_us"], _ = wall_us(theirs)
    row["eager_us"] = median_us(ours)
    row["graph_us"] = graph_replay_us(ours)
    row["eager_wall_us"], row["eager_wall_min_us"] = wall_us(ours)
    row["graph_floor_ratio"] = floor_us / row["graph_us"]
    row["tuning_graph_us"] = {name: graph_replay_us(fn) for name, fn in variants.items()}
    if variants:
        row["best_tuning"] = min(row["tuning_graph_us"], key=row["tuning_graph_us"].get)
        row["best_tuning_us"] = row["tuning_graph_us"][row["best_tuning"]]
    if theirs is not None:
        row["graph_vs_original"] = row["original_graph_us"] / row["graph_us"]
        row["eager_vs_original"] = row["original_eager_us"] / row["eager_us"]
        row["wall_vs_original"] = row["original_eager_wall_us"] / row["eager_wall_us"]
        for key in ("graph_vs_original", "eager_vs_original", "wall_vs_original"):
            report.check_bar(row, key, ">=", 1.0)


if __name__ == "__main__":
    main()
