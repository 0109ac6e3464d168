"""Benchmark: FP8 sparse MLA prefill (``sparse_mla_q8kv8_prefill_fwd``) at DeepSeek-V3.2 shapes.

For each shape ``(s_q, s_kv, h_q, d_qk, topk)``, indices uniform in ``[0, s_kv)``: ours in eager
mode (``do_bench`` median, L2 flushed) as TFLOPS (``2 * s_q * h_q * topk * (d_qk + d_v)`` per
call) and as a fraction of the dense FP8 GEMM rate (``torch._scaled_mm`` at 8192³) measured in
this run; the speed-up over the plain-PyTorch reference in float32; the relative L2 error of
``out`` against the float64 reference (and whether ``max_logits``/``lse`` are within the GPU
tolerance); the compiled kernel's registers, spills and MMA instructions (FP8 and fp16/bf16
``wgmma`` expected; an ``mma.sync`` means a product fell back to the slower path). "Ours" is
the op's default: on an sm_90 GPU the warp-specialised Gluon kernel. The plain Triton kernel is
measured too (TFLOPS and error), and both kernels' tuning knobs are swept at the first shape.

    python benchmarks/bench_sparse_mla_prefill.py [--shapes 0 2] [--out DIR]

Results: ``benchmarks/results/<gpu>/sparse_mla_prefill.{json,md,png}``; the design note
``docs/design/sparse_mla_prefill.md`` says what the numbers led to.
"""

from __future__ import annotations

import functools
import re

import torch

from strictops.meta import sparse_mla_prefill as contract
from strictops.ops import _sparse_mla_gluon as ws
from strictops.ops import sparse_mla_prefill as m
from strictops.ops import sparse_mla_q8kv8_prefill_fwd

from _harness import Report, arg_parser, fp8_gemm_tflops, grouped_bars, median_us, parse_args

# (s_q, s_kv, h_q, d_qk, topk): DeepSeek-V3.2 prefill (d_qk 576, topk 2048), a longer KV, the
# smaller head dim, and a shorter prefill.
SHAPES = [
    (4096, 8192, 128, 576, 2048),
    (4096, 32768, 128, 576, 2048),
    (4096, 8192, 64, 512, 512),
    (1024, 8192, 128, 576, 2048),
]
# Context, published reference speeds on an H200 (not measured by this run): the original
# CUTLASS kernel, and a plain Triton kernel of this design (P·V in bf16).
ORIGINAL_TFLOPS = {SHAPES[0]: 695, SHAPES[1]: 682, SHAPES[2]: 532, SHAPES[3]: 687}
PUBLISHED_TRITON_TFLOPS = {SHAPES[0]: 270, SHAPES[2]: 204}
# The target at the first shape.
TARGET_TFLOPS = 400
# Kernel variants swept on every run; the op's defaults are m.TUNING. No 1-stage variant:
# Triton 3.6 miscompiles it for this kernel (compute-sanitizer: out-of-bounds __shared__
# reads in the rope Q·Kᵀ wgmma on the H200; docs/design/sparse_mla_prefill.md#triton-kernel).
TUNING = [{"num_warps": w, "num_stages": s, "block_n": n}
          for w, s, n in [(8, 3, 64), (8, 2, 32)]]
# The Gluon kernel's variants (launch keywords of strictops.ops._sparse_mla_gluon.launch).
WS_TUNING = [{"num_stages": 3, "lag": 2}, {"consumer_regs": 216, "producer_regs": 72}]
# Instructions that show which MMA each product compiled to.
MMA_PATTERNS = {
    "wgmma_fp8": r"wgmma\.mma_async\S*\.e4m3\.e4m3",
    "wgmma_bf16": r"wgmma\.mma_async\S*\.bf16\.bf16",
    "wgmma_f16": r"wgmma\.mma_async\S*\.f16\.f16",
    "mma_sync": r"\bmma\.sync\.",
}


def _name(shape) -> str:
    return "x".join(str(s) for s in shape)


def _variant_name(v: dict) -> str:
    return f"{v['num_warps']}w/{v['num_stages']}s/{v['block_n']}n"


def tflops(shape, us: float) -> float:
    s_q, _, h_q, d_qk, topk = shape
    return 2 * s_q * h_q * topk * (d_qk + contract.D_V) / us / 1e6


def _launch(args: dict, out: tuple, **tuning):
    """One launch of the Triton kernel on validated ``args`` into ``out``; returns the compiled
    kernel."""
    return m._launch(m._sparse_mla_prefill_kernel, *(args[k] for k in m.INPUTS if k != "d_v"),
                     *out, None, **tuning)


def _launch_ws(args: dict, out: tuple, **tuning):
    """One launch of the Gluon kernel, likewise."""
    return ws.launch(*(args[k] for k in m.INPUTS if k != "d_v"), *out, None, **tuning)


def _sweep(shape, launch, call, outputs, variants, name) -> dict:
    """TFLOPS of each variant (or the name of the exception it raised)."""
    results = {}
    for variant in variants:
        key = name(variant)
        try:
            launch(call, outputs, **variant)
        except Exception as exc:  # e.g. out of shared memory: a variant, not the op
            results[key] = type(exc).__name__
            continue
        results[key] = tflops(shape, median_us(functools.partial(launch, call, outputs,
                                                                 **variant)))
        print(f"  {key}: {results[key]:.0f} TFLOPS", flush=True)
    return results


def kernel_facts(compiled) -> dict:
    """Registers, spills and MMA instruction counts of a compiled kernel (from its PTX)."""
    ptx = compiled.asm.get("ptx", "")
    facts = {name: len(re.findall(pattern, ptx)) for name, pattern in MMA_PATTERNS.items()}
    facts.update(registers=compiled.n_regs, spills=compiled.n_spills)
    return facts


def measure(shape, gen: torch.Generator, gemm: float, tune: bool) -> dict:
    """Every number of one shape (its tensors are freed on return); the tuning sweep only if
    ``tune``."""
    s_q, s_kv, h_q, d_qk, topk = shape
    dims = contract.Dims(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, device="cuda")
    call = m.random_inputs(dims, gen, invalid_fraction=0.0, edge_rows=False)
    inputs = {k: call[k] for k in m.INPUTS}

    outputs = sparse_mla_q8kv8_prefill_fwd(**call)
    triton_outputs = tuple(torch.empty_like(t) for t in outputs)
    _launch(call, triton_outputs)
    expected = m.reference(**inputs)
    within, detail = m.compare_to_reference(outputs, expected, m.GPU_REL_L2_BOUND,
                                            m.GPU_LOGIT_TOL)
    rel_l2 = m.relative_l2(outputs[0], expected[0])
    triton_rel_l2 = m.relative_l2(triton_outputs[0], expected[0])
    del expected  # 2 GiB of float64 at the large shapes
    torch.cuda.empty_cache()

    gluon = m.warp_specialized(call["q"])
    ours_us = median_us(lambda: sparse_mla_q8kv8_prefill_fwd(**call))
    triton_us = median_us(functools.partial(_launch, call, triton_outputs))
    facts = kernel_facts((_launch_ws if gluon else _launch)(call, outputs))
    triton_facts = kernel_facts(_launch(call, triton_outputs))
    print(f"{_name(shape)}: {ours_us:.0f} us = {tflops(shape, ours_us):.0f} TFLOPS "
          f"({'Gluon' if gluon else 'Triton'} kernel), rel_l2 {rel_l2:.2e}, {facts}; "
          f"Triton kernel {tflops(shape, triton_us):.0f} TFLOPS, rel_l2 {triton_rel_l2:.2e}",
          flush=True)
    reference_us = median_us(functools.partial(m.reference, **inputs, dtype=torch.float32),
                             warmup=1, rep=1)
    tuning = {}
    if tune:
        tuning = _sweep(shape, _launch, call, outputs, TUNING,
                        lambda v: "triton " + _variant_name(v))
        if gluon:
            tuning |= _sweep(shape, _launch_ws, call, outputs, WS_TUNING,
                             lambda v: "gluon " + ",".join(f"{k}={x}" for k, x in v.items()))
    ours = tflops(shape, ours_us)
    return dict(
        shape=_name(shape), kernel="gluon" if gluon else "triton", us=ours_us, TFLOPS=ours,
        fraction_of_fp8_gemm=ours / gemm, triton_kernel_TFLOPS=tflops(shape, triton_us),
        original_TFLOPS=ORIGINAL_TFLOPS.get(shape),
        published_triton_TFLOPS=PUBLISHED_TRITON_TFLOPS.get(shape), reference_fp32_us=reference_us,
        speedup_vs_reference=reference_us / ours_us, rel_l2=rel_l2,
        triton_kernel_rel_l2=triton_rel_l2, within_tolerance=within, check=detail,
        tuning_TFLOPS=tuning, triton_kernel_facts=triton_facts, **facts,
    )


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("--shapes", type=int, nargs="*", default=range(len(SHAPES)),
                    help="which of SHAPES to run (indices; default: all)")
    args = parse_args(ap)

    gen = torch.Generator(device="cuda").manual_seed(20261130)
    report = Report("sparse_mla_prefill")
    gemm = fp8_gemm_tflops()
    report.ceilings["fp8_gemm_8192_TFLOPS"] = gemm
    for n, shape in enumerate(SHAPES[i] for i in args.shapes):
        torch.cuda.empty_cache()
        report.add(**measure(shape, gen, gemm, tune=n == 0))  # the sweep at the first shape

    report.write(args.out, ["shape", "kernel", "us", "TFLOPS", "fraction_of_fp8_gemm",
                            "triton_kernel_TFLOPS", "original_TFLOPS", "speedup_vs_reference",
                            "rel_l2", "triton_kernel_rel_l2", "within_tolerance", "registers",
                            "spills", "wgmma_fp8", "wgmma_f16", "wgmma_bf16", "mma_sync"],
                 plot=_plot)
    for r in report.rows:
        print(r["shape"], "tuning (TFLOPS):",
              ", ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in r["tuning_TFLOPS"].items()))
    first = report.rows[0]
    print(f"bar: {TARGET_TFLOPS} TFLOPS at {first['shape']}: "
          f"{'met' if first['TFLOPS'] >= TARGET_TFLOPS else 'not met'} ({first['TFLOPS']:.0f})")


def _plot(plt, report):
    series = [("ours (op default)", "TFLOPS"), ("our Triton kernel", "triton_kernel_TFLOPS"),
              ("original CUTLASS (published)", "original_TFLOPS")]
    fig, ax = grouped_bars(plt, report, "shape", series, "sparse_mla_q8kv8_prefill_fwd",
                           "TFLOPS (median)", log=False)
    ax.axhline(report.ceilings["fp8_gemm_8192_TFLOPS"], color="k", linestyle="--",
               label="FP8 GEMM 8192³, this run")
    ax.axhline(TARGET_TFLOPS, color="r", linestyle=":", label="target")
    ax.set_xlabel("(s_q, s_kv, h_q, d_qk, topk)")
    ax.legend(fontsize=7)
    return fig


if __name__ == "__main__":
    main()
