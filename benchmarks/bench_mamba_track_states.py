"""Benchmark: track_mamba_states_all_layers against sglang's original (``.anchor``, if present).

Model shapes: SSM pool ``[36, 512, 8, 128, 128]`` fp32 and conv pool ``[36, 512, 2048, 3]``
bf16, 64 requests, 0 / 1 / 8 / 64 of them tracked. Ours and the original in one run, by the
same methods: eager (device time and host wall time) and CUDA-graph replay, both with one call
per graph (``graph_us``) and with ``CALLS`` calls per graph (``graph_call_us``, per call: the
figure that compares launch-bound kernels, see ``_harness.graph_replay_us``). The calls of a
graph cycle through ``CALLS`` index sets with distinct rows, so a call does not find the rows
the previous one copied in L2; L2 is flushed before every replay. Against the floor: bytes read
+ written over the copy bandwidth measured in this run. The first index set is checked bit for
bit against the reference and the original.

The kernel's tuning switches (``VARIANTS``, each a change to ``m.TUNING``) are A/B'd in the
same process at 0, 1, 8 and 64 tracked rows (per-call graph time).

    python benchmarks/bench_mamba_track_states.py [--out DIR]
"""

from __future__ import annotations

import torch

from strictops.ops.mamba import track_states as m
from strictops.ops import track_mamba_states_all_layers

from _harness import (anchor_module, arg_parser, bar_plot, begin, graph_replay_us, median_us,
                      print_variants, trivial_kernel_us, wall_us)

LAYERS, POOL, REQUESTS = 36, 512, 64
CONV, SSM = ((2048, 3), torch.bfloat16), ((8, 128, 128), torch.float32)
TRACKED = [0, 1, 8, 64]
CALLS = 20
# Changes to m.TUNING measured side by side ("default": none).
VARIANTS = {
    "default": {},
    "default_load_policy": {"load_policy": ""},
    "evict_first_loads": {"load_policy": "evict_first"},
    "default_store_policy": {"store_policy": ""},
    "evict_last_stores": {"store_policy": "evict_last"},
    "no_maxnreg": {"maxnreg": None},
    "2_per_sm": {"programs_per_sm": 2},
    "2_per_sm_no_maxnreg": {"programs_per_sm": 2, "maxnreg": None},
    "16k_steps": {"block_bytes": 16384},
    "16k_items": {"chunk_bytes": 16384, "block_bytes": 16384},
    "8192_element_steps": {"block_elements": 8192},
    "4_warps_no_maxnreg": {"num_warps": 4, "maxnreg": None},
}
VARIANT_ROWS = (0, 1, 8, 64)
# The results plot's bars, per row.
SERIES = [("floor (bytes / copy bandwidth)", "floor_us"),
          (f"ours, graph of {CALLS} calls", "graph_call_us"),
          (f"original, graph of {CALLS} calls", "original_graph_call_us"),
          ("ours, graph of 1 call", "graph_us"), ("original, graph of 1 call", "original_graph_us")]


def _original():
    sgl = anchor_module("sgl_mamba")
    return None if sgl is None else sgl.track_mamba_states_all_layers


def with_original(kernels: dict) -> dict:
    """``kernels`` (name: ``fn(conv, ssm, src, mask, dst, batch_size)``) and, where ``.anchor``
    holds it, sglang's original as ``"original"``, skipping freed (-1) slots as the op does."""
    original = _original()
    if original is not None:
        kernels["original"] = lambda *call: original(*call, check_freed_slots=True)
    return kernels


def model_pools(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random conv ``[LAYERS, POOL, 2048, 3]`` bf16 and SSM ``[LAYERS, POOL, 8, 128, 128]`` fp32
    pools on the GPU."""
    conv = torch.randn(LAYERS, POOL, *CONV[0], device="cuda", generator=gen).to(CONV[1])
    return conv, torch.randn(LAYERS, POOL, *SSM[0], device="cuda", generator=gen)


def _index_sets(tracked: int, gen: torch.Generator) -> list[tuple]:
    """``CALLS`` (cache slots, mask, track slots): cache slots in the pool's lower half, track
    slots in its upper half, ``tracked`` rows tracked; the sets' tracked rows differ."""
    sets = []
    for _ in range(CALLS):
        src = torch.randperm(POOL // 2, device="cuda", generator=gen)[:REQUESTS].to(torch.int32)
        dst = torch.randperm(POOL // 2, device="cuda", generator=gen)[:REQUESTS] + POOL // 2
        mask = torch.zeros(REQUESTS, dtype=torch.bool, device="cuda")
        mask[torch.randperm(REQUESTS, device="cuda", generator=gen)[:tracked]] = True
        sets.append((src, mask, dst))
    return sets


def _cycling(call, conv, ssm, sets):
    """A function that calls ``call(conv, ssm, src, mask, dst, REQUESTS)`` with the next index
    set on every call (captured into a graph, each captured call keeps its set)."""
    state = {"i": 0}

    def fn():
        src, mask, dst = sets[state["i"] % len(sets)]
        state["i"] += 1
        call(conv, ssm, src, mask, dst, REQUESTS)

    return fn


def tuned_launch(change: dict):
    """``fn(conv, ssm, src, mask, dst, batch_size)``: the kernel launched through the op's
    argument builder with ``m.TUNING`` changed by ``change``, on validated inputs."""
    tuning = {**m.TUNING, **change}
    programs = tuning.pop("programs_per_sm") * torch.cuda.get_device_properties(
        0).multi_processor_count
    return lambda *call: m._launch(m._track_kernel, programs, *call, **tuning)


def _variant_us(conv, ssm, sets, variant: dict) -> float:
    return graph_replay_us(_cycling(tuned_launch(variant), conv, ssm, sets), calls=CALLS)


def main() -> None:
    args, report, gen = begin("mamba_track_states", arg_parser(__doc__), seed=20261201)
    original = _original()
    bw = report.copy_ceiling()
    report.ceilings["trivial_kernel_graph_replay_us"] = trivial_kernel_us()
    report.ceilings["trivial_kernel_graph_call_us"] = trivial_kernel_us(calls=CALLS)
    conv, ssm = model_pools(gen)
    entry_bytes = conv[0, 0].numel() * conv.element_size() + ssm[0, 0].numel() * 4
    for tracked in TRACKED:
        sets = _index_sets(tracked, gen)
        call = (conv, ssm, *sets[0], REQUESTS)
        expected = m.reference(*call)
        ours = lambda: track_mamba_states_all_layers(*call)  # noqa: E731
        ours()
        exact = torch.equal(conv, expected[0]) and torch.equal(ssm, expected[1])
        del expected
        floor_us = 2 * LAYERS * tracked * entry_bytes / bw
        row = report.add(
            shape=f"{tracked}of{REQUESTS}_tracked", tracked=tracked, bit_exact=exact,
            floor_us=floor_us, eager_us=median_us(ours), graph_us=graph_replay_us(ours),
            graph_call_us=graph_replay_us(
                _cycling(track_mamba_states_all_layers, conv, ssm, sets), calls=CALLS),
            eager_wall_us=wall_us(ours)[0])
        if original is not None:
            orig = lambda: original(*call, check_freed_slots=True)  # noqa: E731
            theirs = (conv.clone(), ssm.clone())
            original(*theirs, *sets[0], REQUESTS, check_freed_slots=True)
            row["equal_to_original"] = (torch.equal(conv, theirs[0])
                                        and torch.equal(ssm, theirs[1]))
            del theirs
            checked = lambda *a: original(*a, check_freed_slots=True)  # noqa: E731
            row["original_eager_us"] = median_us(orig)
            row["original_graph_us"] = graph_replay_us(orig)
            row["original_graph_call_us"] = graph_replay_us(
                _cycling(checked, conv, ssm, sets), calls=CALLS)
            row["original_eager_wall_us"] = wall_us(orig)[0]
            row["graph_vs_original"] = row["original_graph_us"] / row["graph_us"]
            row["graph_call_vs_original"] = (row["original_graph_call_us"]
                                             / row["graph_call_us"])
            report.check_bar(row, "graph_call_vs_original", ">=", 0.98)
            report.check_bar(row, "eager_wall_us", "<=", row["original_eager_wall_us"] * 1.05)
        if tracked:
            row["graph_bw_ratio"] = floor_us / row["graph_call_us"]
        if tracked in VARIANT_ROWS:
            row["variant_graph_call_us"] = {name: _variant_us(conv, ssm, sets, v)
                                            for name, v in VARIANTS.items()}
        torch.cuda.empty_cache()
    report.write(args.out, ["shape", "bit_exact", "equal_to_original", "floor_us",
                            "graph_call_us", "original_graph_call_us", "graph_call_vs_original",
                            "graph_bw_ratio", "graph_us", "original_graph_us",
                            "graph_vs_original", "eager_us", "original_eager_us",
                            "eager_wall_us", "original_eager_wall_us"],
                 plot=bar_plot("shape", SERIES, "track_mamba_states_all_layers",
                               "µs per call (median, log scale)"))
    print_variants(report, "variant_graph_call_us", "tuning variants (per-call graph us)")


if __name__ == "__main__":
    main()
