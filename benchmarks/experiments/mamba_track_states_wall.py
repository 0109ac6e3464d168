"""Track states: the eager wall time of back-to-back identical calls, per L2 policy.

``wall_us`` of the benchmark's harness (windows of back-to-back calls on one index set, no L2
flush between them, synchronised per window) beside the per-call graph time (20 calls a
graph, 20 index sets), three rounds in alternating order. The op itself, the kernel launched
through the op's argument builder with ``TUNING`` changed (``launch_*``, so that only the
tuning differs between them), and sglang's original (``.anchor``, if present). Model shapes
as in ``benchmarks/bench_mamba_track_states.py``; µs.

    python benchmarks/experiments/mamba_track_states_wall.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from strictops.ops import track_mamba_states_all_layers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _harness import graph_replay_us, wall_us  # noqa: E402
from bench_mamba_track_states import (  # noqa: E402
    CALLS, REQUESTS, _cycling, _index_sets, model_pools, tuned_launch, with_original)

# (tracked rows, calls a wall window)
ROWS = ((0, 1000), (1, 500), (8, 100), (64, 20))
TUNINGS = {"launch_default": {}, "launch_default_store_policy": {"store_policy": ""},
           "launch_evict_last_stores": {"store_policy": "evict_last"},
           "launch_default_load_policy": {"load_policy": ""}}


def main() -> None:
    kernels = with_original({"op": track_mamba_states_all_layers,
                             **{name: tuned_launch(change) for name, change in TUNINGS.items()}})
    gen = torch.Generator(device="cuda").manual_seed(5)
    conv, ssm = model_pools(gen)
    print("per kernel and round: wall median | wall min | graph per call")
    for tracked, calls in ROWS:
        sets = _index_sets(tracked, gen)
        out = {name: [] for name in kernels}
        for rnd in range(3):
            for name in (list(kernels) if rnd % 2 == 0 else list(reversed(kernels))):
                kernel = kernels[name]
                median, least = wall_us(lambda: kernel(conv, ssm, *sets[0], REQUESTS),
                                        calls=calls, windows=7)
                graph = graph_replay_us(_cycling(kernel, conv, ssm, sets), calls=CALLS)
                out[name].append(f"{median:.1f}|{least:.1f}|{graph:.2f}")
        print(f"{tracked}of{REQUESTS}_tracked")
        for name, rounds in out.items():
            print(f"  {name:28s} " + "  ".join(rounds), flush=True)


if __name__ == "__main__":
    main()
