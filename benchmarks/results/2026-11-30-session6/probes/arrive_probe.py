"""Session 6 probe: can one launch (copy + flag by the last program to arrive) match the two
launches at 256 MiB, if the arrivals are spread over GROUPS counters (the last of each group
then arrives at one total)? The op's one-launch kernel, with one counter, reaches 0.71 of
the floor at 256 MiB: 65536 same-address acq_rel atomics. Graph replays with the L2 flushed,
three passes in alternating order, each variant checked first (bytes and flag).

    python .probe/arrive_probe.py --out $OUT/arrive_probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

STRIDE = 64  # int32 words between counters (256 bytes)


@triton.jit
def arrive_kernel(src, dst, flag, counters, n_blocks, generation, BLOCK: tl.constexpr,
                  GROUPS: tl.constexpr, STRIDE: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    base = pid.to(tl.int64) * BLOCK
    tl.store(dst + base + offs, tl.load(src + base + offs))
    tl.debug_barrier()
    if GROUPS == 1:
        arrived = tl.atomic_add(counters, 1, sem="acq_rel", scope="gpu")
        if arrived == n_blocks - 1:
            tl.atomic_xchg(flag, generation, sem="release", scope="gpu")
            tl.atomic_xchg(counters, 0, sem="relaxed", scope="gpu")
    else:
        g = pid % GROUPS
        members = (n_blocks - g + GROUPS - 1) // GROUPS
        groups = tl.minimum(n_blocks, GROUPS)
        arrived = tl.atomic_add(counters + (1 + g) * STRIDE, 1, sem="acq_rel", scope="gpu")
        if arrived == members - 1:
            total = tl.atomic_add(counters, 1, sem="acq_rel", scope="gpu")
            tl.atomic_xchg(counters + (1 + g) * STRIDE, 0, sem="relaxed", scope="gpu")
            if total == groups - 1:
                tl.atomic_xchg(flag, generation, sem="release", scope="gpu")
                tl.atomic_xchg(counters, 0, sem="relaxed", scope="gpu")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from _harness import graph_replay_us
    from strictops.meta.transport_pool import data_start
    from strictops.ops import TransportPool
    from strictops.ops import transport_pool as m

    results = []
    for size_name, nbytes in [("256MiB", 256 << 20), ("16MiB", 16 << 20), ("1MiB", 1 << 20)]:
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
        dst = torch.empty_like(src)
        flag = torch.zeros(1, dtype=torch.int32, device="cuda")
        counters = torch.zeros((1 + 1024) * STRIDE, dtype=torch.int32, device="cuda")
        gen = [0]

        def arrive(block, warps, groups):
            def run():
                gen[0] = gen[0] % 1000 + 1
                arrive_kernel[(nbytes // block,)](src, dst, flag, counters, nbytes // block,
                                                  gen[0], BLOCK=block, GROUPS=groups,
                                                  STRIDE=STRIDE, num_warps=warps)
            return run

        pool = TransportPool(data_start(64, 2) + nbytes + 4096, device="cuda:0",
                             consumer_count=2, max_inflight_slices=64, recycle_interval=None,
                             name="probe")
        lease = pool.lease(nbytes)
        lease_t = torch.tensor(lease, device="cuda")
        state = m.new_state("cuda")
        variants = {"copy_": lambda: dst.copy_(src),
                    "op": lambda: pool.publish(src, lease_t, state)}
        for block, warps in [(4096, 8), (4096, 4)]:
            for groups in [1, 64, 256, 1024]:
                variants[f"1L-{block // 1024}K/{warps}w/groups{groups}"] = arrive(block, warps,
                                                                                   groups)
        ok = {}
        for name, fn in variants.items():
            dst.zero_()
            flag.zero_()
            fn()
            torch.cuda.synchronize()
            if name.startswith("1L"):
                ok[name] = bool(torch.equal(dst, src)) and int(flag) == gen[0] and \
                    int(counters.count_nonzero()) == 0
            elif name == "op":
                ok[name] = bool(torch.equal(pool.tensor[lease.start:lease.start + nbytes], src))
            else:
                ok[name] = bool(torch.equal(dst, src))
        names = list(variants)
        times = {n: [] for n in names}
        for p in range(3):
            for n in (names if p % 2 == 0 else names[::-1]):
                times[n].append(graph_replay_us(variants[n]))
        for n in names:
            rel = [times["copy_"][i] / t for i, t in enumerate(times[n])]
            results.append(dict(size=size_name, variant=n, ok=ok[n], graph_us=times[n],
                                copy_over_time=rel))
            print(f"{size_name:7s} {n:26s} ok={ok[n]} graph_us={[round(t, 2) for t in times[n]]}"
                  f" copy_/time={[round(r, 4) for r in rel]}", flush=True)
        pool.release(lease)
        pool.shutdown()
        del src, dst, pool
        torch.cuda.empty_cache()
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
