"""Benchmark: track_mamba_states_all_layers against sglang's original (``.anchor``, if present).

Model shapes: SSM pool ``[36, 512, 8, 128, 128]`` fp32 and conv pool ``[36, 512, 2048, 3]``
bf16, 64 requests, 0 / 1 / 8 / 64 of them tracked. Ours and the original in one run, eager
(device time and host wall time) and CUDA-graph replay, against the floor (bytes read + written
over the copy bandwidth measured in this run). Every result is checked bit for bit against the
reference (and the original).

    python benchmarks/bench_mamba_track_states.py [--out DIR]
"""

from __future__ import annotations


import torch

from strictops.ops import mamba_track_states as m
from strictops.ops import track_mamba_states_all_layers

from _harness import (
    anchor_module,
    arg_parser,
    parse_args,
    Report,
    copy_bandwidth_bytes_per_us,
    graph_replay_us,
    grouped_bars,
    median_us,
    wall_us,
)

LAYERS, POOL, REQUESTS = 36, 512, 64
CONV, SSM = ((2048, 3), torch.bfloat16), ((8, 128, 128), torch.float32)
TRACKED = [0, 1, 8, 64]
# Kernel variants swept at 8 tracked rows (graph replay, floor / time); the op's defaults are
# m.TUNING.
VARIANTS = [{"chunk_bytes": c, "block": b, "num_warps": w, "programs_per_sm": p}
            for c, b, w, p in [(32768, 8192, 8, 4), (32768, 8192, 8, 2), (32768, 4096, 4, 8),
                               (16384, 4096, 4, 8), (65536, 8192, 8, 4)]]


def _original():
    sgl = anchor_module("sgl_mamba")
    return None if sgl is None else sgl.track_mamba_states_all_layers


def main() -> None:
    args = parse_args(arg_parser(__doc__))
    original = _original()
    gen = torch.Generator(device="cuda").manual_seed(20261201)
    report = Report("mamba_track_states")
    bw = copy_bandwidth_bytes_per_us()
    report.ceilings["copy_bandwidth_TBps"] = bw / 1e6
    one = torch.zeros(1, device="cuda")
    report.ceilings["trivial_kernel_graph_replay_us"] = graph_replay_us(lambda: one.add_(1))
    conv = torch.randn(LAYERS, POOL, *CONV[0], device="cuda", generator=gen).to(CONV[1])
    ssm = torch.randn(LAYERS, POOL, *SSM[0], device="cuda", generator=gen)
    entry_bytes = conv[0, 0].numel() * conv.element_size() + ssm[0, 0].numel() * 4
    src = torch.randperm(POOL // 2, device="cuda", generator=gen)[:REQUESTS].to(torch.int32)
    dst = torch.randperm(POOL // 2, device="cuda", generator=gen)[:REQUESTS] + POOL // 2
    for tracked in TRACKED:
        mask = torch.zeros(REQUESTS, dtype=torch.bool, device="cuda")
        mask[torch.randperm(REQUESTS, device="cuda", generator=gen)[:tracked]] = True
        call = (conv, ssm, src, mask, dst, REQUESTS)
        expected = m.reference(*call)
        ours = lambda: track_mamba_states_all_layers(*call)  # noqa: E731
        ours()
        exact = torch.equal(conv, expected[0]) and torch.equal(ssm, expected[1])
        del expected
        floor_us = 2 * LAYERS * tracked * entry_bytes / bw
        row = report.add(shape=f"{tracked}of{REQUESTS}_tracked", tracked=tracked,
                         bit_exact=exact, floor_us=floor_us, eager_us=median_us(ours),
                         graph_us=graph_replay_us(ours), eager_wall_us=wall_us(ours)[0])
        if original is not None:
            orig = lambda: original(*call, check_freed_slots=True)  # noqa: E731
            theirs = (conv.clone(), ssm.clone())
            original(*theirs, src, mask, dst, REQUESTS, check_freed_slots=True)
            row["equal_to_original"] = (torch.equal(conv, theirs[0])
                                        and torch.equal(ssm, theirs[1]))
            del theirs
            row["original_eager_us"] = median_us(orig)
            row["original_graph_us"] = graph_replay_us(orig)
            row["original_eager_wall_us"] = wall_us(orig)[0]
            row["graph_vs_original"] = row["original_graph_us"] / row["graph_us"]
            report.check_bar(row, "graph_vs_original", ">=", 0.98)
            report.check_bar(row, "eager_wall_us", "<=", row["original_eager_wall_us"] * 1.05)
        if tracked:
            row["graph_bw_ratio"] = floor_us / row["graph_us"]
        if tracked == 8:
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            row["tuning_bw_ratio"] = {
                "/".join(str(x) for x in v.values()): floor_us / graph_replay_us(
                    lambda v=v: m._launch(m._track_kernel, v["programs_per_sm"] * sms, *call,
                                          chunk_bytes=v["chunk_bytes"], block=v["block"],
                                          num_warps=v["num_warps"]))
                for v in VARIANTS}
        torch.cuda.empty_cache()
    report.write(args.out, ["shape", "bit_exact", "equal_to_original", "floor_us", "graph_us",
                            "original_graph_us", "graph_vs_original", "graph_bw_ratio",
                            "eager_us", "original_eager_us", "eager_wall_us",
                            "original_eager_wall_us"], plot=_plot)
    for r in report.rows:
        if "tuning_bw_ratio" in r:
            print(r["shape"], "tuning (chunk/block/warps/programs per SM: floor/time):",
                  ", ".join(f"{k}={v:.3f}" for k, v in r["tuning_bw_ratio"].items()))


def _plot(plt, report):
    series = [("floor (bytes / copy bandwidth)", "floor_us"), ("ours, graph", "graph_us"),
              ("original, graph", "original_graph_us"), ("ours, eager", "eager_us"),
              ("original, eager", "original_eager_us")]
    fig, ax = grouped_bars(plt, report, "shape", series, "track_mamba_states_all_layers",
                           "µs (median, log scale)")
    ax.legend(fontsize=7)
    return fig


if __name__ == "__main__":
    main()
