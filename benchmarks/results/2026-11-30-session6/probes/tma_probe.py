"""Session 6 probe: does a TMA bulk copy (Gluon, sm_90) move bytes faster than the LDG copy
kernel of the transport op, and than copy_ (the copy engine)? At 256 MiB (the issue's size)
and 4 GiB (the floor's size), do_bench medians with the L2 flushed, graph replays, three
passes in alternating order, each variant checked bit for bit first.

    python .probe/tma_probe.py --out $OUT/tma_probe.json          # GPU
    python .probe/tma_probe.py --compile                          # sm_90 compile here, no GPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, fence_async_shared
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

ROW = 256


@gluon.jit
def tma_copy_kernel(src_desc, dst_desc, n_blocks, dst_row0, STAGES: gl.constexpr):
    ROWS: gl.constexpr = src_desc.block_type.shape[0]
    BYTES: gl.constexpr = src_desc.block_type.nbytes
    pid = gl.program_id(0)
    grid = gl.num_programs(0)
    smem = gl.allocate_shared_memory(gl.uint8, [STAGES] + src_desc.block_type.shape,
                                     src_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    mine = (n_blocks - pid + grid - 1) // grid
    for i in gl.static_range(STAGES):
        if i < mine:
            mbarrier.expect(bars.index(i), BYTES)
            tma.async_copy_global_to_shared(src_desc, [(pid + i * grid) * ROWS, 0],
                                            bars.index(i), smem.index(i))
    for k in range(mine):
        s = k % STAGES
        mbarrier.wait(bars.index(s), (k // STAGES) & 1)
        tma.async_copy_shared_to_global(dst_desc, [dst_row0 + (pid + k * grid) * ROWS, 0],
                                        smem.index(s))
        j = k - 1 + STAGES
        if (k >= 1) & (j < mine):
            # Every store but the latest has read its stage: the previous block's is free.
            tma.store_wait(1)
            p = (k - 1) % STAGES
            mbarrier.expect(bars.index(p), BYTES)
            tma.async_copy_global_to_shared(src_desc, [(pid + j * grid) * ROWS, 0],
                                            bars.index(p), smem.index(p))
    tma.store_wait(0)


@triton.jit
def ldg_copy_kernel(src, dst, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + o, tl.load(src + o))


def tma_launcher(src, dst, rows, stages, ctas_per_sm, warps, sms):
    layout = gl.NVMMASharedLayout(0, 8, 2)
    s2 = src.view(-1, ROW)
    d2 = dst.view(-1, ROW)
    sd = TensorDescriptor.from_tensor(s2, [rows, ROW], layout)
    dd = TensorDescriptor.from_tensor(d2, [rows, ROW], layout)
    n_blocks = s2.shape[0] // rows
    grid = (min(n_blocks, sms * ctas_per_sm),)

    def run():
        tma_copy_kernel[grid](sd, dd, n_blocks, 0, STAGES=stages, num_warps=warps)
    return run


def ldg_launcher(src, dst, block, warps):
    grid = (src.numel() // block,)

    def run():
        ldg_copy_kernel[grid](src, dst, BLOCK=block, num_warps=warps)
    return run


TMA = [(64, 4, 1, 1), (64, 4, 2, 1), (64, 6, 1, 1), (32, 8, 1, 1), (32, 4, 2, 1),
       (128, 4, 1, 1), (16, 8, 2, 1), (64, 3, 2, 1), (32, 6, 2, 1), (16, 4, 4, 1)]


def compile_here():
    from triton.backends.compiler import GPUTarget
    PTXAS = "/work/venv/lib/python3.11/site-packages/triton/backends/nvidia/bin/ptxas"
    import subprocess
    for rows, stages, _, warps in TMA:
        desc = (f"tensordesc<u8[{rows}, 256],NVMMASharedLayout(swizzle_byte_width=0, "
                "element_bitwidth=8, rank=2, transposed=False, fp4_padded=False, cga_layout=[])>")
        sig = {"src_desc": desc, "dst_desc": desc, "n_blocks": "i32", "dst_row0": "i32",
               "STAGES": "constexpr"}
        src = gluon._runtime.GluonASTSource(fn=tma_copy_kernel, signature=sig,
                                            constexprs={"STAGES": stages})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": warps})
        open("/tmp/tma.ptx", "w").write(k.asm["ptx"])
        r = subprocess.run([PTXAS, "-arch=sm_90a", "-v", "/tmp/tma.ptx", "-o", "/tmp/tma.cubin"],
                           capture_output=True, text=True)
        used = " ".join(l.strip() for l in r.stderr.splitlines() if "Used" in l)
        print(rows, stages, warps, "smem", k.metadata.shared, used, r.returncode)
    print([l for l in k.asm["ptx"].splitlines() if "cp.async.bulk" in l][:6])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    if args.compile:
        compile_here()
        return
    from _harness import graph_replay_us, median_us
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = {"rows": []}
    for size_name, nbytes in [("256MiB", 256 << 20), ("4GiB", 4 << 30), ("16MiB", 16 << 20)]:
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
        dst = torch.empty_like(src)
        variants = {"copy_": lambda: dst.copy_(src),
                    "ldg-4K/8w": ldg_launcher(src, dst, 4096, 8)}
        for rows, stages, cps, warps in TMA:
            variants[f"tma-{rows * ROW // 1024}K/{stages}st/{cps}cta/{warps}w"] = tma_launcher(
                src, dst, rows, stages, cps, warps, sms)
        ok = {}
        for name, fn in variants.items():
            dst.zero_()
            fn()
            torch.cuda.synchronize()
            ok[name] = bool(torch.equal(dst, src))
        names = list(variants)
        times = {n: [] for n in names}
        gtimes = {n: [] for n in names}
        for p in range(3):
            order = names if p % 2 == 0 else names[::-1]
            for n in order:
                times[n].append(median_us(variants[n]))
                if nbytes < (1 << 30):
                    gtimes[n].append(graph_replay_us(variants[n]))
        floor_bw = 2 * nbytes / min(sorted(times["copy_"]))
        for n in names:
            row = dict(size=size_name, variant=n, exact=ok[n], us=times[n], graph_us=gtimes[n],
                       TBps=[2 * nbytes / t / 1e6 for t in times[n]])
            results["rows"].append(row)
            print(f"{size_name:7s} {n:28s} ok={ok[n]} us={[round(t, 2) for t in times[n]]} "
                  f"graph={[round(t, 2) for t in gtimes[n]]} "
                  f"TB/s={[round(2 * nbytes / t / 1e6, 3) for t in times[n]]}", flush=True)
        del src, dst
        torch.cuda.empty_cache()
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
