"""Benchmark: fused_commit_track_indices against sglang's original (``.anchor``, if present).

A launch-bound op (a few hundred bytes): what counts is the eager host cost per call and the
device time in a CUDA graph, ours and the original's by the same methods: one call per graph
(``graph_us``, mostly the graph's launch) and ``CALLS`` calls per graph (``graph_call_us``,
per call: back-to-back kernels, as in a serving step's graph; see
``_harness.graph_replay_us``), against a trivial kernel measured both ways in the same run.
Steady state (no L2 flush): the inputs are a few hundred bytes that the step before wrote.
Every result is checked against the reference. The kernel's tuning (requests per program,
warps: ``VARIANTS``) is A/B'd in the same process, per call in a graph of ``CALLS``.

    python benchmarks/bench_mamba_commit_indices.py [--out DIR]
"""

from __future__ import annotations


import torch

from strictops.ops import fused_commit_track_indices
from strictops.ops.mamba import commit_indices as m

from _harness import (anchor_module, arg_parser, bar_plot, begin, graph_replay_us, median_us,
                      print_variants, trivial_kernel_us, wall_us)

CALLS = 20
# (requests per program, warps); the op's default is (m.BLOCK, m.NUM_WARPS).
VARIANTS = [(128, 4), (64, 2), (32, 1), (128, 1), (256, 4), (512, 8)]
# (name, requests, draft tokens, interval, with seq_lens)
SHAPES = [("64req_track", 64, 4, 8, True), ("64req", 64, 4, 8, False),
          ("512req_track", 512, 4, 8, True)]
# The results plot's bars, per row.
SERIES = [(f"ours, graph of {CALLS} calls", "graph_call_us"),
          (f"original, graph of {CALLS} calls", "original_graph_call_us"),
          ("ours, graph of 1 call", "graph_us"), ("original, graph of 1 call", "original_graph_us"),
          ("ours, eager host wall", "eager_wall_us"),
          ("original, eager host wall", "original_eager_wall_us")]


def _original():
    sgl = anchor_module("sgl_mamba")
    return None if sgl is None else sgl.fused_commit_track_indices


def main() -> None:
    args, report, _ = begin("mamba_commit_indices", arg_parser(__doc__))
    original = _original()
    report.ceilings["trivial_kernel_graph_replay_us"] = trivial_kernel_us()
    report.ceilings["trivial_kernel_graph_call_us"] = trivial_kernel_us(CALLS, flush_l2=False)
    gen = torch.Generator().manual_seed(20261201)
    for name, batch, dtn, interval, track in SHAPES:
        b = torch.arange(batch)[:, None] * dtn
        accept_index = (b + torch.randint(0, dtn, (batch, dtn), generator=gen)).cuda()
        accept_lens = torch.randint(1, dtn + 1, (batch,), generator=gen).cuda()
        seq_lens = torch.randint(0, 1000, (batch,), generator=gen).cuda() if track else None
        call = (accept_index, accept_lens, seq_lens, dtn, interval)
        ours = lambda: fused_commit_track_indices(*call)  # noqa: E731
        exact = all(torch.equal(g, w) for g, w in zip(ours(), m.reference(*call))
                    if g is not None)
        row = report.add(shape=name, requests=batch, bit_exact=exact,
                         eager_us=median_us(ours, flush_l2=False),
                         graph_us=graph_replay_us(ours, flush_l2=False),
                         graph_call_us=graph_replay_us(ours, flush_l2=False, calls=CALLS),
                         eager_wall_us=wall_us(ours)[0])
        row["variant_graph_call_us"] = {
            f"{block}/{warps}": graph_replay_us(
                lambda block=block, warps=warps: m._run(m._commit_kernel, True, *call, block,
                                                        warps),
                flush_l2=False, calls=CALLS)
            for block, warps in VARIANTS}
        if original is not None:
            orig = lambda: original(*call)  # noqa: E731
            row["equal_to_original"] = all(
                torch.equal(g, w) for g, w in zip(ours(), orig()) if g is not None)
            row["original_eager_us"] = median_us(orig, flush_l2=False)
            row["original_graph_us"] = graph_replay_us(orig, flush_l2=False)
            row["original_graph_call_us"] = graph_replay_us(orig, flush_l2=False, calls=CALLS)
            row["original_eager_wall_us"] = wall_us(orig)[0]
            report.check_bar(row, "eager_wall_us", "<=", row["original_eager_wall_us"])
            report.check_bar(row, "graph_call_us", "<=", row["original_graph_call_us"] * 1.02)
    report.write(args.out, ["shape", "requests", "bit_exact", "equal_to_original",
                            "graph_call_us", "original_graph_call_us", "graph_us",
                            "original_graph_us", "eager_us", "original_eager_us",
                            "eager_wall_us", "original_eager_wall_us"],
                 plot=bar_plot("shape", SERIES, "fused_commit_track_indices"))
    print_variants(report, "variant_graph_call_us",
                   "requests per program / warps (per-call graph us)")


if __name__ == "__main__":
    main()
