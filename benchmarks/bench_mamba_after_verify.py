"""Benchmark: scatter_mamba_states_after_mtp_verify (the whole after-verify state commit)
against sglang's original (``.anchor``, if present).

Model shapes: SSM cache ``[36, 512, 8, 128, 128]`` fp32 with verify states
``[36, 64, 4, 8, 128, 128]``, one conv type ``[36, 512, 2048, 3]`` bf16 with its overlapping
verify windows, 64 requests, 4 draft tokens; about 80% of the requests commit, with and without
a track set (about 20% tracked), and a step where one request commits and is tracked (host
cost). Ours and the original in one run (ours with the SSM scatter's default kernel, and also
with each of its other kernels: the ``<kernel>_*`` columns), eager (device time with a cold L2, and host wall time per call)
and CUDA-graph replay, against the floor: bytes read + written over the copy bandwidth
measured in this run. Results are checked bit for bit against
the reference and the original.

    python benchmarks/bench_mamba_after_verify.py [--out DIR]
"""

from __future__ import annotations


import torch

from strictops.ops.mamba import after_verify as m
from strictops.ops.mamba import state_scatter as mss
from strictops.ops import scatter_mamba_states_after_mtp_verify
from strictops.ops.mamba.conv_window_scatter import window_view
from strictops.ops.mamba.after_verify import MambaCaches

from _harness import (anchor_module, arg_parser, bar_plot, begin, graph_replay_us, median_us,
                      trivial_kernel_us, wall_us)

LAYERS, CACHE, REQUESTS, DRAFT = 36, 512, 64, 4
SSM_STATE, CONV_DIM, KM1 = (8, 128, 128), 2048, 3
# The SSM scatter's kernels other than its default (mss.TUNING["kernel"], which "ours" runs).
OTHER_KERNELS = [k for k in mss.PATHS if k != mss.TUNING["kernel"]]
# The results plot's bars, per row.
SERIES = [("floor (bytes / copy bandwidth)", "floor_us"), ("ours, graph", "graph_us"),
          ("original, graph", "original_graph_us"), ("ours, eager", "eager_us"),
          ("original, eager", "original_eager_us"), ("ours, eager host wall", "eager_wall_us"),
          ("original, eager host wall", "original_eager_wall_us")]


def _original():
    """sglang's function, with the int64 pointer table its multi-pair conv path reads."""
    sgl = anchor_module("sgl_mamba")
    return None if sgl is None else sgl.scatter_mamba_states_after_mtp_verify


def _inputs(gen):
    def rand(*shape, dtype=torch.float32):
        return torch.randn(shape, device="cuda", generator=gen).to(dtype)

    shared = rand(LAYERS, REQUESTS, CONV_DIM, DRAFT + KM1 - 1, dtype=torch.bfloat16)
    caches = MambaCaches(rand(LAYERS, CACHE, *SSM_STATE),
                         rand(LAYERS, REQUESTS, DRAFT, *SSM_STATE),
                         [rand(LAYERS, CACHE, CONV_DIM, KM1, dtype=torch.bfloat16)],
                         [window_view(shared, DRAFT, KM1)])
    slots = torch.randperm(CACHE // 2, device="cuda", generator=gen)[:REQUESTS].to(torch.int32)
    steps = torch.randint(0, DRAFT, (REQUESTS,), device="cuda", generator=gen)
    steps[torch.rand(REQUESTS, device="cuda", generator=gen) < 0.2] = -1
    track_slots = torch.randperm(CACHE // 2, device="cuda", generator=gen)[:REQUESTS] + CACHE // 2
    track_steps = torch.where(torch.rand(REQUESTS, device="cuda", generator=gen) < 0.2,
                              steps.clamp(min=0), -1)
    return caches, slots, steps, track_slots, track_steps


def _clone(c: MambaCaches) -> MambaCaches:
    return MambaCaches(c.temporal.clone(), c.intermediate_ssm, [t.clone() for t in c.conv],
                       c.intermediate_conv_window)


def _equal(a: MambaCaches, ssm, convs) -> bool:
    return torch.equal(a.temporal, ssm) and all(torch.equal(x, y) for x, y in zip(a.conv, convs))


def main() -> None:
    args, report, gen = begin("mamba_after_verify", arg_parser(__doc__), seed=20261201)
    original = _original()
    bw = report.copy_ceiling()
    report.ceilings["trivial_kernel_graph_replay_us"] = trivial_kernel_us()
    caches, slots, steps, track_slots, track_steps = _inputs(gen)
    entry_bytes = (caches.temporal[0, 0].numel() * 4
                   + caches.conv[0][0, 0].numel() * caches.conv[0].element_size())
    # One valid request (one tracked): the device work is small, so the eager row shows the
    # host cost per call.
    one_step = torch.full_like(steps, -1)
    one_step[0] = 1
    cases = [("commit", (slots, steps, None, None)),
             ("commit+track", (slots, steps, track_slots, track_steps)),
             ("1valid+1tracked", (slots, one_step, track_slots, one_step))]
    for name, call in cases:
        rows = sum(int((s >= 0).sum()) for s in call[1::2] if s is not None)
        floor_us = 2 * LAYERS * rows * entry_bytes / bw
        ours = lambda: scatter_mamba_states_after_mtp_verify(caches, *call)  # noqa: E731
        expected = m.reference(caches, *call)
        ours()
        row = report.add(shape=name, requests=REQUESTS, rows_written=rows,
                         bit_exact=_equal(caches, *expected), floor_us=floor_us)
        del expected
        if original is not None:
            theirs = _clone(caches)
            original(theirs, *call)
            row["equal_to_original"] = _equal(caches, theirs.temporal, theirs.conv)
            del theirs
        row["eager_us"] = median_us(ours)
        row["graph_us"] = graph_replay_us(ours)
        row["eager_wall_us"] = wall_us(ours, calls=200)[0]
        row["graph_bw_ratio"] = floor_us / row["graph_us"]
        # The SSM scatter's other kernels, in the same process (design note of the scatter).
        for kernel in OTHER_KERNELS:
            with mss.kernel_variant(kernel):
                row[f"{kernel}_graph_us"] = graph_replay_us(ours)
                row[f"{kernel}_eager_us"] = median_us(ours)
        if original is not None:
            orig = lambda: original(caches, *call)  # noqa: E731
            row["original_eager_us"] = median_us(orig)
            row["original_graph_us"] = graph_replay_us(orig)
            row["original_eager_wall_us"] = wall_us(orig, calls=200)[0]
            row["graph_vs_original"] = row["original_graph_us"] / row["graph_us"]
            for kernel in OTHER_KERNELS:
                row[f"{kernel}_graph_vs_original"] = (row["original_graph_us"]
                                                      / row[f"{kernel}_graph_us"])
            row["eager_vs_original"] = row["original_eager_us"] / row["eager_us"]
            report.check_bar(row, "graph_vs_original", ">=", 0.98)
            report.check_bar(row, "eager_vs_original", ">=", 0.98)
            report.check_bar(row, "eager_wall_us", "<=", row["original_eager_wall_us"] * 1.05)
    report.write(args.out, ["shape", "rows_written", "bit_exact", "equal_to_original",
                            "floor_us", "graph_us", "original_graph_us", "graph_vs_original",
                            "graph_bw_ratio", "eager_us", "original_eager_us",
                            "eager_vs_original", "eager_wall_us", "original_eager_wall_us",
                            *(f"{kernel}_{column}" for kernel in OTHER_KERNELS
                              for column in ("graph_us", "eager_us", "graph_vs_original"))],
                 plot=bar_plot("shape", SERIES, "scatter_mamba_states_after_mtp_verify"))


if __name__ == "__main__":
    main()
