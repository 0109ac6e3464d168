"""Session 6 probe, two questions:

1. At 64 KiB the benchmark's tuning sweep times the op's own one-launch kernel (m._launch,
   4 KiB / 4 warps) at 6.3-6.8 us, and ``pool.publish`` (the same launch through the op) at
   6.7-7.1 us, in every run. Same kernel, same arguments: what differs? Both graphs are
   captured here, their nodes dumped, and both timed alternately, five times each.
2. Copy-kernel shape by size (two launches, PDL flag): 4 KiB / 8 warps (the op) against
   16 KiB / 4 warps, 8 KiB / 4 warps and 8 KiB / 8 warps, from 2 to 128 MiB: where does
   16 KiB / 4 warps (0.54 against 0.51 at 16 MiB, every run) stop winning?

    python .probe/small_probe.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from _harness import graph_replay_us, median_us
    from strictops.meta.transport_pool import data_start
    from strictops.ops import TransportPool
    from strictops.ops import transport_pool as m

    slots, consumers = 64, 2
    pool = TransportPool(data_start(slots, consumers) + (128 << 20) + (1 << 20), device="cuda:0",
                         consumer_count=consumers, max_inflight_slices=slots,
                         recycle_interval=None, name="probe")
    out = {}

    # 1. The op against its own launch at 64 KiB.
    nbytes = 64 << 10
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    lease = pool.lease(nbytes)
    lease_t = torch.tensor(lease, device="cuda")
    state = m.new_state("cuda")
    fns = {"op": lambda: pool.publish(src, lease_t, state),
           "launch": lambda: m._launch(m._publish_kernel, pool.tensor, src, lease_t, state,
                                       slots, consumers, block_bytes=4096, num_warps=4,
                                       two_launches=False)}
    for name, fn in fns.items():
        g = torch.cuda.CUDAGraph()
        g.enable_debug_mode()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            fn()
        g.debug_dump(str(args.out / f"graph-{name}.dot"))
    times = {n: [] for n in fns}
    for i in range(5):
        for n in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            times[n].append(graph_replay_us(fns[n]))
    eager = {n: [median_us(fns[n]) for _ in range(3)] for n in fns}
    out["64KiB"] = {"graph_us": times, "eager_us": eager}
    print("64KiB graph", {n: [round(t, 2) for t in v] for n, v in times.items()})
    print("64KiB eager", {n: [round(t, 2) for t in v] for n, v in eager.items()}, flush=True)
    pool.release(lease)

    # 2. Copy-kernel shapes by size.
    shapes = [(4096, 8), (16384, 4), (8192, 4), (8192, 8), (16384, 8)]
    out["shapes"] = []
    for mib in [2, 4, 8, 16, 32, 64, 128]:
        nbytes = mib << 20
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
        lease = pool.lease(nbytes)
        lease_t = torch.tensor(lease, device="cuda")
        dst = pool.tensor[lease.start:lease.start + nbytes]
        row = {"MiB": mib, "copy_": graph_replay_us(lambda: dst.copy_(src))}
        for block, warps in shapes:
            def fn(block=block, warps=warps):
                m._launch(m._publish_kernel, pool.tensor, src, lease_t, state, slots,
                          consumers, block_bytes=block, num_warps=warps, two_launches=True,
                          pdl=True)
            dst.zero_()
            fn()
            torch.cuda.synchronize()
            assert torch.equal(dst, src), (mib, block, warps)
            row[f"{block // 1024}K/{warps}w"] = [graph_replay_us(fn) for _ in range(2)]
        out["shapes"].append(row)
        print(f"{mib:4d} MiB copy_ {row['copy_']:.2f} " + " ".join(
            f"{k}={min(v):.2f}" for k, v in row.items() if isinstance(v, list)), flush=True)
        pool.release(lease)
    pool.shutdown()
    (args.out / "small_probe.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
