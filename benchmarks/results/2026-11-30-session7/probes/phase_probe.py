"""Session 6 probe: where do the op's 1.3-1.5 us over copy_ at 256 MiB go? Graph replays (L2
flushed), five passes in alternating order, at 256 MiB:

* copy_ (the copy engine) and a bare 4 KiB / 8 warps copy kernel (no lease, no PDL);
* the op's copy phase alone (PHASE_COPY, 4 KiB / 8 warps): lease from the tensor with the
  PDL trigger (as the op runs it), without the trigger, and the lease as arguments;
* the op's two launches: PDL flag (the op), plain flag.

    python .probe/phase_probe.py --out $OUT/phase_probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


@triton.jit
def ldg_copy_kernel(src, dst, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + o, tl.load(src + o))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from _harness import graph_replay_us
    from strictops.meta import transport_pool as contract
    from strictops.ops import TransportPool
    from strictops.ops import transport_pool as m

    slots, consumers, nbytes, block = 64, 2, 256 << 20, 4096
    pool = TransportPool(contract.data_start(slots, consumers) + nbytes + (1 << 20),
                         device="cuda:0", consumer_count=consumers, max_inflight_slices=slots,
                         recycle_interval=None, name="probe")
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    lease = pool.lease(nbytes)
    lease_t = torch.tensor(lease, device="cuda")
    state = m.new_state("cuda")
    dst = pool.tensor[lease.start:lease.start + nbytes]
    common = (pool.tensor, src, lease_t, state, pool.tensor.shape[0], nbytes,
              contract.data_start(slots, consumers), contract.slot_bytes(consumers), slots)

    def phase_copy(pdl, from_ptr):
        values = (0,) * 7 if from_ptr else tuple(lease)

        def run():
            m._publish_kernel[(nbytes // block,)](*common, *values, LEASE_FROM_PTR=from_ptr,
                                                  BLOCK=block, PHASE=m.PHASE_COPY, PDL=pdl, PTX=True,
                                                  num_warps=8)
        return run

    def op(pdl):
        def run():
            m._launch(m._publish_kernel, pool.tensor, src, lease_t, state, slots, consumers,
                      block_bytes=block, num_warps=8, two_launches=True, pdl=pdl)
        return run

    variants = {"copy_": lambda: dst.copy_(src),
                "bare-ldg": lambda: ldg_copy_kernel[(nbytes // block,)](src, dst, BLOCK=block,
                                                                         num_warps=8),
                "copy-phase/ptr/trigger": phase_copy(True, True),
                "copy-phase/ptr/no-trigger": phase_copy(False, True),
                "copy-phase/args/no-trigger": phase_copy(False, False),
                "op/pdl": op(True), "op/plain": op(False)}
    ok = {}
    for name, fn in variants.items():
        dst.zero_()
        fn()
        torch.cuda.synchronize()
        ok[name] = bool(torch.equal(dst, src))
    names = list(variants)
    times = {n: [] for n in names}
    for p in range(5):
        for n in (names if p % 2 == 0 else names[::-1]):
            times[n].append(graph_replay_us(variants[n]))
    base = statistics.median(times["copy_"])
    out = []
    for n in names:
        med = statistics.median(times[n])
        out.append(dict(variant=n, ok=ok[n], graph_us=times[n], median_us=med,
                        over_copy_us=med - base))
        print(f"{n:28s} ok={ok[n]} median={med:.2f} (+{med - base:.2f} us over copy_) "
              f"{[round(t, 2) for t in times[n]]}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
