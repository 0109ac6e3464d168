"""Track states: what the copy leaves in L2 for the kernels after it.

The kernel loads its sources evict-last and stores evict-first (``TUNING["load_policy"]``,
``TUNING["store_policy"]``). Lines loaded evict-last are given up after the normal ones, so a
copy could leave the L2 holding its dead source lines while the next kernel's working set,
loaded normally, is evicted. This measures it: after each op, a
"victim" buffer is read twice and the second read is timed (an L2 hit if the buffer kept its
lines). The ops: ours, ours with the default L2 policies, and sglang's original
(``.anchor``, if present); "none" runs no op. L2 is flushed (a 256 MB write) before every op.

    python benchmarks/experiments/mamba_track_states_l2.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from strictops.ops.mamba import track_states as m

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_mamba_track_states import (  # noqa: E402
    REQUESTS, _index_sets, model_pools, tuned_launch, with_original)

REPS = 40


def _reread_us(op, victim: torch.Tensor, flush: torch.Tensor) -> float:
    """Median time of the victim's second read after ``op``, microseconds."""
    times = []
    for _ in range(REPS):
        flush.fill_(1)
        op()
        victim.sum()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        victim.sum()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(7)
    conv, ssm = model_pools(gen)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    ops = with_original({
        "none": lambda *call: None,
        "ours": lambda *call: m.track_mamba_states_all_layers(*call),
        "ours_default_policies": tuned_launch({"load_policy": "", "store_policy": ""}),
    })
    print("victim's second read after the op, us (median of %d)" % REPS)
    for tracked in (1, 8, 64):
        src, mask, dst = _index_sets(tracked, gen)[0]
        for mb in (16, 40):
            victim = torch.ones(mb << 18, device="cuda")  # fp32: mb MiB
            cells = []
            for name, op in ops.items():
                us = _reread_us(lambda op=op: op(conv, ssm, src, mask, dst, REQUESTS), victim,
                                flush)
                cells.append(f"{name} {us:.2f}")
            print(f"{tracked}of{REQUESTS}_tracked, victim {mb} MiB: " + "; ".join(cells),
                  flush=True)


if __name__ == "__main__":
    main()
