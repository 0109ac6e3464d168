"""Prepared in session 6 for the next GPU session, not yet run: more ways to read the lease in
the copy launch (run 9 of session 6: seven scalar loads cost 0.80 us against the lease as
arguments at 256 MiB; evict_last and .cg 0.07 us less; a vector load with where/sum +9.6 us):

  0  seven scalar loads after the source load (as the op)
  1  the same loads before the source load
  2  ld.global.nc (the read-only path), by inline asm
  3  volatile loads (no L1: tells whether L1 hits are what the op gets now)
  4  the lease as arguments (no load)
  5  a volatile source load: ptxas cannot move it below the lease checks

Found in session 6 by reading the sm_90 SASS of the op's copy launch: ptxas moves the plain
source load below the lease checks that guard the store (an early exit, then the load), so
each program waits for the lease loads and only then issues its source load. Modes 0-3 all
compile that way; modes 4 and 5 issue the source load at once. The branch
next/transport-load-order makes the op's copy-phase load volatile.

Graph replays with the L2 flushed, five passes in alternating order, 4 KiB / 8 warps at
256 MiB. Follow with ncu on modes 0 and 4 (stall reasons at the stores) if a mode helps.

    python .probe/lease_probe2.py --out $OUT/lease_probe2.json
    python .probe/lease_probe2.py --compile        # sm_90 PTX facts here
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))


@triton.jit
def _nc(ptr):
    return tl.inline_asm_elementwise("ld.global.nc.b64 $0, [$1];", "=l,l", [ptr],
                                     dtype=tl.int64, is_pure=True, pack=1)


@triton.jit(do_not_specialize=["start_arg", "end_arg", "nbytes_arg", "slot_arg",
                               "generation_arg", "ready_arg", "ack_arg"])
def copy_phase_kernel(pool_ptr, src_ptr, lease_ptr, memory_size, src_nbytes, data_start,
                      slot_bytes, n_slots, start_arg, end_arg, nbytes_arg, slot_arg,
                      generation_arg, ready_arg, ack_arg, MODE: tl.constexpr,
                      BLOCK: tl.constexpr):
    block_start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = tl.arange(0, BLOCK)
    if MODE == 1:
        start = tl.load(lease_ptr + 0)
        end = tl.load(lease_ptr + 1)
        nbytes = tl.load(lease_ptr + 2)
        slot = tl.load(lease_ptr + 3)
        generation = tl.load(lease_ptr + 4)
        ready = tl.load(lease_ptr + 5)
        ack = tl.load(lease_ptr + 6)
        data = tl.load(src_ptr + block_start + offs)
    else:
        if MODE == 5:
            data = tl.load(src_ptr + block_start + offs, volatile=True)
        else:
            data = tl.load(src_ptr + block_start + offs)
        if MODE == 4:
            start = start_arg.to(tl.int64)
            end = end_arg.to(tl.int64)
            nbytes = nbytes_arg.to(tl.int64)
            slot = slot_arg.to(tl.int64)
            generation = generation_arg.to(tl.int64)
            ready = ready_arg.to(tl.int64)
            ack = ack_arg.to(tl.int64)
        elif MODE == 2:
            start = _nc(lease_ptr + 0)
            end = _nc(lease_ptr + 1)
            nbytes = _nc(lease_ptr + 2)
            slot = _nc(lease_ptr + 3)
            generation = _nc(lease_ptr + 4)
            ready = _nc(lease_ptr + 5)
            ack = _nc(lease_ptr + 6)
        elif MODE == 3:
            start = tl.load(lease_ptr + 0, volatile=True)
            end = tl.load(lease_ptr + 1, volatile=True)
            nbytes = tl.load(lease_ptr + 2, volatile=True)
            slot = tl.load(lease_ptr + 3, volatile=True)
            generation = tl.load(lease_ptr + 4, volatile=True)
            ready = tl.load(lease_ptr + 5, volatile=True)
            ack = tl.load(lease_ptr + 6, volatile=True)
        else:
            start = tl.load(lease_ptr + 0)
            end = tl.load(lease_ptr + 1)
            nbytes = tl.load(lease_ptr + 2)
            slot = tl.load(lease_ptr + 3)
            generation = tl.load(lease_ptr + 4)
            ready = tl.load(lease_ptr + 5)
            ack = tl.load(lease_ptr + 6)
    fits = (start >= data_start) & (start <= end) & (end <= memory_size)
    fits = fits & (start % 256 == 0) & (nbytes > 0) & (nbytes <= end - start)
    fits = fits & (nbytes <= src_nbytes) & (slot >= 0) & (slot < n_slots)
    fits = fits & (ready == slot * slot_bytes) & (ack == ready + 4)
    fits = fits & (generation > 0) & (generation <= 0x7FFFFFFF)
    dst_ptr = pool_ptr + (start // 256) * 256
    if fits & (block_start + BLOCK <= nbytes):
        tl.store(dst_ptr + block_start + offs, data)


MODES = {0: "scalar loads after src (op)", 1: "scalar loads before src", 2: "ld.global.nc",
         3: "volatile lease loads", 4: "arguments", 5: "volatile source load"}


def compile_here():
    import re
    import subprocess
    from triton.backends.compiler import GPUTarget
    ptxas = "/work/venv/lib/python3.11/site-packages/triton/backends/nvidia/bin/ptxas"
    sig = {"pool_ptr": "*u8", "src_ptr": "*u8", "lease_ptr": "*i64", "memory_size": "i64",
           "src_nbytes": "i64", "data_start": "i64", "slot_bytes": "i64", "n_slots": "i64",
           "start_arg": "i64", "end_arg": "i64", "nbytes_arg": "i64", "slot_arg": "i64",
           "generation_arg": "i64", "ready_arg": "i64", "ack_arg": "i64",
           "MODE": "constexpr", "BLOCK": "constexpr"}
    for mode in MODES:
        src = triton.compiler.ASTSource(fn=copy_phase_kernel, signature=sig,
                                        constexprs={"MODE": mode, "BLOCK": 4096},
                                        attrs={(i,): [["tt.divisibility", 16]] for i in range(5)})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 8})
        ptx = k.asm["ptx"]
        open("/tmp/lp.ptx", "w").write(ptx)
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", "/tmp/lp.ptx", "-o", "/tmp/lp.cubin"],
                           capture_output=True, text=True)
        used = re.search(r"Used \d+ registers", r.stderr)
        loads = re.findall(r"ld\.(?:volatile\.)?global[\w.:]*", ptx)
        print(mode, MODES[mode], used.group(0) if used else r.stderr[-300:], loads,
              "bar.sync" in ptx, "shfl" in ptx)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    if args.compile:
        compile_here()
        return
    from _harness import graph_replay_us
    from strictops.meta import transport_pool as contract
    from strictops.ops import TransportPool

    slots, consumers, nbytes, block = 64, 2, 256 << 20, 4096
    pool = TransportPool(contract.data_start(slots, consumers) + nbytes + (1 << 20),
                         device="cuda:0", consumer_count=consumers, max_inflight_slices=slots,
                         recycle_interval=None, name="probe")
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    lease = pool.lease(nbytes)
    lease_t = torch.tensor(lease, device="cuda")
    dst = pool.tensor[lease.start:lease.start + nbytes]

    def variant(mode):
        def run():
            copy_phase_kernel[(nbytes // block,)](
                pool.tensor, src, lease_t, pool.tensor.shape[0], nbytes,
                contract.data_start(slots, consumers), contract.slot_bytes(consumers), slots,
                *lease, MODE=mode, BLOCK=block, num_warps=8)
        return run

    variants = {"copy_": lambda: dst.copy_(src)}
    variants.update({f"{mode}: {name}": variant(mode) for mode, name in MODES.items()})
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
        out.append(dict(variant=n, ok=ok[n], graph_us=times[n], median_us=med))
        print(f"{n:28s} ok={ok[n]} median={med:.2f} ({med - base:+.2f} us over copy_) "
              f"{[round(t, 2) for t in times[n]]}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
