"""Benchmark: the one-launch conv-window scatter over several pairs and two request sets.

Conv states ``[36, 512, 2048, 3]`` bf16 (one pair, then two: a second conv type of the same
shape), 64 requests with 4 draft tokens: set 1 the accept commit (about 51 accepted), set 2 the
interval-crossing track set (8 of 64). Ours and sglang's original (``.anchor``, with its
pointer table as one int64 tensor) in one run, eager and replayed from a CUDA graph, against
the copy floors of ``bench_conv_window_scatter``; bit equality with the reference and the
original; a tuning sweep; eager host wall time.

    python benchmarks/bench_conv_window_scatter_multi.py [--out DIR]   # default: benchmarks/results/<gpu>/
"""

from __future__ import annotations

import functools

import torch

from strictops.ops.mamba import conv_window_scatter_multi as m
from strictops.ops import fused_conv_window_scatter_multi

from _harness import arg_parser, bar_plot, begin, print_variants
from bench_conv_window_scatter import (SERIES, floors_us, make_inputs, original, time_side_by_side,
                                       tuning_name)

# A few of bench_conv_window_scatter's tunings (graph replay): the op's defaults are m.TUNING.
TUNING = [{"block_bytes": b, "layers": l, "run_bytes": r, "stream": s, "num_warps": w}
          for b, l, r, s, w in [(2048, 1, 16, False, 4), (2048, 2, 16, False, 4),
                                (2048, 2, 8, False, 4), (2048, 2, 16, True, 4)]]
# (name, pairs, layers, cache, dim, K-1, dtype, requests, draft tokens, valid set 1, valid set 2)
SHAPES = [
    ("1pair_2sets", 1, 36, 512, 2048, 3, torch.bfloat16, 64, 4, 51, 8),
    ("2pairs_2sets", 2, 36, 512, 2048, 3, torch.bfloat16, 64, 4, 51, 8),
    ("2pairs_1set", 2, 36, 512, 2048, 3, torch.bfloat16, 64, 4, 51, None),
]


def main() -> None:
    args, report, gen = begin("conv_window_scatter_multi", arg_parser(__doc__), seed=20261202)
    sgl = original()
    bw = report.copy_ceiling()

    for name, n_pairs, layers, cache, dim, km1, dtype, requests, draft, valid1, valid2 in SHAPES:
        pairs = []
        for _ in range(n_pairs):
            dst, src, slots, steps = make_inputs(layers, cache, dim, km1, dtype, requests, draft,
                                                 valid1, gen)
            pairs.append((dst, src))
        # Set 2 names slots set 1 does not (sglang's track slots are their own).
        free = torch.ones(cache, dtype=torch.bool, device="cuda")
        free[slots.long()] = False
        sets = [slots, steps]
        n_valid = int((steps >= 0).sum())
        if valid2 is not None:
            slots2 = free.nonzero().flatten()[:requests].to(torch.int32)
            steps2 = torch.full((requests,), -1, dtype=torch.int32, device="cuda")
            steps2[torch.randperm(requests, device="cuda", generator=gen)[:valid2]] = draft - 1
            sets += [slots2, steps2]
            n_valid += int((steps2 >= 0).sum())
        floor_us, touched_us = floors_us(layers, n_valid * n_pairs, dim, km1, draft,
                                         pairs[0][0].element_size(), bw)
        dsts = [d for d, _ in pairs]

        def ours():
            fused_conv_window_scatter_multi(pairs, *sets)

        expected = m.reference(pairs, *sets)
        # Both start from the same pools.
        theirs_pairs = [(d.clone(), s) for d, s in pairs] if sgl is not None else None
        ours()
        row = {"shape": name, "pairs": n_pairs, "dst": f"{list(dsts[0].shape)} {str(dtype)[6:]}",
               "valid": n_valid, "floor_us": floor_us, "touched_floor_us": touched_us,
               "bit_exact": all(torch.equal(a, b) for a, b in zip(dsts, expected))}
        del expected
        if sgl is not None:
            sgl.fused_conv_window_scatter_multi(theirs_pairs, *sets)
            row["equal_to_original"] = all(torch.equal(a, t) for a, (t, _) in
                                           zip(dsts, theirs_pairs))
            del theirs_pairs

            def theirs():
                sgl.fused_conv_window_scatter_multi(pairs, *sets)
        else:
            theirs = None
        padded = sets + [None] * (4 - len(sets))
        time_side_by_side(report, row, ours, theirs, floor_us, {
            tuning_name(v): functools.partial(
                m._launch, m._scatter_multi_kernel, pairs, *padded, **v)
            for v in TUNING})
        report.add(**row)
        del pairs, dsts
        torch.cuda.empty_cache()

    report.write(args.out, ["shape", "pairs", "dst", "valid", "bit_exact", "equal_to_original",
                            "floor_us", "touched_floor_us", "graph_us", "original_graph_us",
                            "eager_us", "original_eager_us", "eager_wall_us",
                            "original_eager_wall_us", "graph_floor_ratio", "graph_vs_original",
                            "eager_vs_original", "wall_vs_original", "best_tuning",
                            "best_tuning_us"],
                 plot=bar_plot("shape", SERIES, "fused_conv_window_scatter_multi"))
    print_variants(report, "tuning_graph_us", "tuning (graph us)")


if __name__ == "__main__":
    main()
