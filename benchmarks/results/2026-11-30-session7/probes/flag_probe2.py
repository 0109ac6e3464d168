"""Session 7 probe: the flag launch's release at 256 MiB. Run 1 of session 7 measured, after
the op's copy launch: wait only +0.35 us over copy_, wait + plain store +0.32, wait + release
exchange +0.77, the op +0.93. Which part of the release costs: the fence, or the exchange's
round trip? And does a fence issued before the wait (overlapping the copy grid's drain) cost
less? Flag kernels (one program, 4 warps, a programmatic dependent launch) after the op's
copy launch, graph replays with the L2 flushed, five passes in alternating order:

  0  wait
  1  wait, plain store
  2  wait, barrier, atom.release.gpu.exch (as the op)
  3  wait, atom.relaxed.gpu.exch
  4  wait, fence.acq_rel.gpu, plain store
  5  fence.acq_rel.gpu, wait, plain store
  6  wait, barrier, st.release.gpu
  7  barrier, fence.acq_rel.gpu, wait, st.relaxed.gpu

    python .probe/flag_probe2.py --out $OUT/flag_probe2.json
    python .probe/flag_probe2.py --compile      # sm_90 SASS here
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
def _fence(dep):
    return tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r,r", [dep],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _st(ptr, value, SEM: tl.constexpr):
    return tl.inline_asm_elementwise("st." + SEM + ".gpu.global.b32 [$1], $2; mov.u32 $0, 0;",
                                     "=r,l,r", [ptr, value], dtype=tl.int32, is_pure=False,
                                     pack=1)


@triton.jit
def flag_kernel(flag_ptr, value, MODE: tl.constexpr):
    if MODE == 5:
        _fence(value)
    if MODE == 7:
        tl.debug_barrier()
        _fence(value)
    gdc_wait()
    if MODE == 1 or MODE == 5:
        tl.store(flag_ptr, value)
    elif MODE == 2:
        tl.debug_barrier()
        tl.atomic_xchg(flag_ptr, value, sem="release", scope="gpu")
    elif MODE == 3:
        tl.atomic_xchg(flag_ptr, value, sem="relaxed", scope="gpu")
    elif MODE == 4:
        _fence(value)
        tl.store(flag_ptr, value)
    elif MODE == 6:
        tl.debug_barrier()
        _st(flag_ptr, value, "release")
    elif MODE == 7:
        _st(flag_ptr, value, "relaxed")


MODES = {0: "wait", 1: "wait+store", 2: "wait+release-xchg (op)", 3: "wait+relaxed-xchg",
         4: "wait+fence+store", 5: "fence+wait+store", 6: "wait+st.release",
         7: "fence+wait+st.relaxed"}


def compile_here():
    import subprocess
    from triton.backends.compiler import GPUTarget
    b = "/work/venv/lib/python3.11/site-packages/triton/backends/nvidia/bin"
    for mode in MODES:
        src = triton.compiler.ASTSource(fn=flag_kernel,
                                        signature={"flag_ptr": "*i32", "value": "i32",
                                                   "MODE": "constexpr"},
                                        constexprs={"MODE": mode})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 4})
        open("/tmp/fp.cubin", "wb").write(k.asm["cubin"])
        sass = subprocess.run([f"{b}/cuobjdump", "-sass", "/tmp/fp.cubin"], capture_output=True,
                              text=True).stdout
        keep = [ln.split(";")[0].strip().split("*/")[-1].strip() for ln in sass.splitlines()
                if any(t in ln for t in ("STG", "ST.", "ATOM", "MEMBAR", "FENCE", "BAR", "ACQ",
                                         "EXIT", "CCTL", "ERRBAR"))]
        print(mode, MODES[mode], " | ".join(keep))


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
    r = lease.ready_byte_offset
    flag = pool.tensor[r:r + 4].view(torch.int32)
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

    def op():
        m._launch(m._publish_kernel, pool.tensor, src, lease_t, state, slots, consumers,
                  block_bytes=block, num_warps=8, two_launches=True, pdl=True)

    variants = {"copy_": lambda: dst.copy_(src), "copy-phase": copy_phase, "op": op}
    variants.update({f"{mode}: {name}": with_flag(mode) for mode, name in MODES.items()})
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
        print(f"{n:30s} ok={ok[n]} median={med:.2f} ({med - base:+.2f} us over copy_) "
              f"{[round(t, 2) for t in times[n]]}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
