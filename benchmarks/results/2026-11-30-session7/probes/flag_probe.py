"""Session 7 probe: what the flag launch costs at 256 MiB, after the op's own copy launch
(4 KiB / 8 warps, lease from the tensor, PDL trigger). Graph replays (L2 flushed), five passes
in alternating order:

* copy_; the op's copy launch alone; the op (copy + its flag launch);
* the op's copy launch followed by probe flag kernels, each a programmatic dependent launch of
  one program of 4 warps: wait only (no store), wait + relaxed store, wait + release exchange
  (the flag pointer as an argument), and the op's flag phase as a plain (non-PDL) launch.

    python .probe/flag_probe.py --out $OUT/flag_probe.json
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
from triton.language.extra.cuda import gdc_wait

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


@triton.jit
def flag_kernel(flag_ptr, value, MODE: tl.constexpr):
    gdc_wait()
    if MODE == 1:
        tl.store(flag_ptr, value)
    elif MODE == 2:
        tl.debug_barrier()
        tl.atomic_xchg(flag_ptr, value, sem="release", scope="gpu")


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
    flag = pool.tensor[lease.ready_byte_offset:lease.ready_byte_offset + 4].view(torch.int32)
    common = (pool.tensor, src, lease_t, state, pool.tensor.shape[0], nbytes,
              contract.data_start(slots, consumers), contract.slot_bytes(consumers), slots,
              *(0,) * 7)

    def copy_phase():
        m._publish_kernel[(nbytes // block,)](*common, LEASE_FROM_PTR=True, BLOCK=block,
                                              PHASE=m.PHASE_COPY, PDL=True, num_warps=8)

    def with_flag(mode):
        def run():
            copy_phase()
            flag_kernel[(1,)](flag, lease.generation, MODE=mode, num_warps=4, launch_pdl=True)
        return run

    def op_plain_flag():
        copy_phase()
        m._publish_kernel[(1,)](*common, LEASE_FROM_PTR=True, BLOCK=block, PHASE=m.PHASE_FLAG,
                                PDL=False, num_warps=4)

    def op():
        m._launch(m._publish_kernel, pool.tensor, src, lease_t, state, slots, consumers,
                  block_bytes=block, num_warps=8, two_launches=True, pdl=True)

    variants = {"copy_": lambda: dst.copy_(src), "copy-phase": copy_phase, "op": op,
                "copy+wait-only": with_flag(0), "copy+wait+relaxed": with_flag(1),
                "copy+wait+release": with_flag(2), "copy+op-flag-plain": op_plain_flag}
    ok = {}
    for name, fn in variants.items():
        dst.zero_()
        flag.zero_()
        fn()
        torch.cuda.synchronize()
        ok[name] = (bool(torch.equal(dst, src)), int(flag.item()))
    names = list(variants)
    times = {n: [] for n in names}
    for p in range(5):
        for n in (names if p % 2 == 0 else names[::-1]):
            times[n].append(graph_replay_us(variants[n]))
    base = statistics.median(times["copy_"])
    out = []
    for n in names:
        med = statistics.median(times[n])
        out.append(dict(variant=n, ok=ok[n], graph_us=times[n], median_us=med))
        print(f"{n:22s} ok={ok[n]} median={med:.2f} ({med - base:+.2f} us over copy_) "
              f"{[round(t, 2) for t in times[n]]}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
