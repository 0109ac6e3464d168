"""Benchmark: fused Mamba state scatter at the SPEC §1 shapes.

For each shape: ours in eager mode, ours replayed from a CUDA graph, the unfused PyTorch path
(nonzero + index_select + index_put), and the floor (bytes read + written over the copy
bandwidth measured in this run). Also checks every output bit for bit against the reference,
sweeps the kernel's tuning knobs, and times an eager call's host wall time.

    python benchmarks/bench_mamba_state_scatter.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch

from strictops.ops import fused_mamba_state_scatter_with_mask
from strictops.ops import mamba_state_scatter as m

from _harness import Report, copy_bandwidth_bytes_per_us, graph_replay_us, median_us, wall_us

# (name, num_layers, cache_size, state_shape, dtype, requests, draft_tokens, valid requests)
SHAPES = [
    ("ssm_64req", 36, 512, (8, 128, 128), torch.float32, 64, 4, 51),
    ("ssm_1req", 36, 512, (8, 128, 128), torch.float32, 1, 4, 1),
    ("conv_64req", 36, 512, (2048, 3), torch.bfloat16, 64, 4, 51),
]
# (bytes per program, warps, eviction policy): swept on every run, reported as floor / time of
# a graph replay; the op's defaults are the row marked in ops/mamba_state_scatter.py.
TUNING = [(8192, 4, ""), (16384, 4, ""), (8192, 2, "evict_first"), (8192, 4, "evict_first"),
          (16384, 2, "evict_first"), (16384, 4, "evict_first"), (32768, 8, "evict_first")]


def make_inputs(layers, cache, state, dtype, requests, draft, valid, gen):
    dst = torch.randn(layers, cache, *state, device="cuda", dtype=torch.float32,
                      generator=gen).to(dtype)
    src = torch.randn(layers, requests, draft, *state, device="cuda", dtype=torch.float32,
                      generator=gen).to(dtype)
    slots = torch.randperm(cache, device="cuda", generator=gen)[:requests].to(torch.int32)
    steps = torch.randint(0, draft, (requests,), device="cuda", generator=gen, dtype=torch.int32)
    rejected = torch.randperm(requests, device="cuda", generator=gen)[: requests - valid]
    steps[rejected] = -1
    return dst, src, slots, steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()

    gen = torch.Generator(device="cuda").manual_seed(20261130)
    report = Report("mamba_state_scatter")
    bw = copy_bandwidth_bytes_per_us()
    report.ceilings["copy_bandwidth_TBps"] = bw / 1e6

    for name, layers, cache, state, dtype, requests, draft, valid in SHAPES:
        dst, src, slots, steps = make_inputs(layers, cache, state, dtype, requests, draft,
                                             valid, gen)
        expected = m.reference(dst, src, slots, steps)
        n_valid = int((steps >= 0).sum())
        entry_bytes = dst[0, 0].numel() * dst.element_size()
        floor_us = 2 * layers * n_valid * entry_bytes / bw

        def ours():
            fused_mamba_state_scatter_with_mask(dst, src, slots, steps)

        ours()
        exact = torch.equal(dst, expected)
        del expected

        tuning = {}
        for block_bytes, warps, eviction in TUNING:
            launch = functools.partial(m._launch, m._scatter_kernel, dst, src, slots, steps,
                                       None, block_bytes=block_bytes, num_warps=warps,
                                       eviction=eviction)
            tuning[f"{block_bytes}B/{warps}w/{eviction or 'normal'}"] = (
                floor_us / graph_replay_us(launch))

        eager_us = median_us(ours)
        graph_us = graph_replay_us(ours)
        wall = wall_us(ours)
        dispatcher_wall = wall_us(lambda: torch.ops.strictops.fused_mamba_state_scatter_with_mask(
            dst, src, slots, steps))
        unfused_us = median_us(lambda: m.unfused_torch(dst, src, slots, steps))
        report.add(
            shape=name, dst=f"{list(dst.shape)} {str(dtype)[6:]}", requests=requests,
            valid=n_valid, bit_exact=exact, floor_us=floor_us, eager_us=eager_us,
            graph_us=graph_us, eager_wall_us=wall, dispatcher_wall_us=dispatcher_wall,
            unfused_us=unfused_us,
            eager_bw_ratio=floor_us / eager_us, graph_bw_ratio=floor_us / graph_us,
            speedup_vs_unfused=unfused_us / eager_us, tuning_bw_ratio=tuning,
        )
        del dst, src
        torch.cuda.empty_cache()

    report.write(args.out, ["shape", "dst", "valid", "bit_exact", "floor_us", "eager_us",
                            "graph_us", "eager_wall_us", "dispatcher_wall_us", "unfused_us", "eager_bw_ratio",
                            "graph_bw_ratio", "speedup_vs_unfused"], plot=_plot)
    for r in report.rows:
        print(r["shape"], "tuning (floor/time):",
              ", ".join(f"{k}={v:.3f}" for k, v in r["tuning_bw_ratio"].items()))


def _plot(plt, report):
    fig, ax = plt.subplots(figsize=(8, 4))
    names = [r["shape"] for r in report.rows]
    series = [("floor", "floor_us"), ("ours, graph", "graph_us"), ("ours, eager", "eager_us"),
              ("unfused PyTorch", "unfused_us")]
    width = 0.2
    for i, (label, key) in enumerate(series):
        ax.bar([x + i * width for x in range(len(names))], [r[key] for r in report.rows],
               width, label=label)
    ax.set_xticks([x + 1.5 * width for x in range(len(names))], names)
    ax.set_yscale("log")
    ax.set_ylabel("µs (median, log scale)")
    ax.set_title(f"fused_mamba_state_scatter_with_mask on {report.env['device']}")
    ax.legend()
    return fig


if __name__ == "__main__":
    main()
