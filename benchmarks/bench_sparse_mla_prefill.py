"""Benchmark: FP8 sparse MLA prefill at five serving shapes, against the original and the GEMM.

For each shape ``(s_q, s_kv, h_q, d_qk, topk)``, indices uniform in ``[0, s_kv)``, one row:

- ``ours_tflops``: the op's default (on an sm_90 GPU the block-pair Gluon kernel of
  ``strictops.ops.sparse_mla.gluon_block_pair``), eager, ``do_bench`` median with the L2 flushed,
  counting ``2 * s_q * h_q * topk * (d_qk + 512)``;
- ``original_tflops``: sglang's CUTLASS ``sparse_mla_q8kv8_prefill_sm90`` on the same inputs in
  the same process, when ``.anchor`` (built by the anchor setup) is importable; else null;
- ``fp8_gemm_tflops``: the dense FP8 GEMM rate (``torch._scaled_mm`` at 8192³) of this run;
- ``rel_err_unit``: relative L2 error of ``out`` against the float64 reference on unit-scale
  data (``random_inputs``), with the largest ``max_logits``/``lse`` errors relative to
  ``1 + |value|`` and the root mean square of the ``lse`` errors (``lse_rms_err_*``);
- ``rel_err_full_range`` (first shape only): the same on full-range FP8 (per-tensor scales
  with amax -> 448, logits of standard deviation 5), and ``*_large_logits`` on the same data
  with logits of standard deviation 20, where the rounding of S decides the ``lse`` error;
- ``original_*`` errors: the original's on the same data, against the same reference;
- the plain Triton kernel's TFLOPS; on sm_90 also the shared-S kernel of
  ``strictops.ops.sparse_mla.gluon_shared_s`` (fp16 P·V, not the default: see
  ``docs/design/sparse_mla_prefill.md``); the default kernel's registers, spills and MMA
  instructions.

    python benchmarks/bench_sparse_mla_prefill.py [--shapes 0 2] [--out DIR]

Results: ``benchmarks/results/<gpu>/sparse_mla_prefill.{json,md,png}``.
"""

from __future__ import annotations

import functools
import re

import torch

from strictops.meta.sparse_mla import prefill as contract
from strictops.ops.sparse_mla import prefill as m
from strictops.ops import sparse_mla_q8kv8_prefill_fwd

from _harness import anchor_module, arg_parser, begin, fp8_gemm_tflops, grouped_bars, median_us

# (s_q, s_kv, h_q, d_qk, topk): the serving shapes the op is measured at.
SHAPES = [
    (4096, 8192, 128, 576, 2048),
    (256, 4096, 128, 576, 512),
    (4096, 32768, 128, 576, 2048),
    (4096, 8192, 64, 512, 512),
    (1024, 8192, 128, 576, 2048),
]
# The goals: this much faster than the original everywhere, and this rate at the first shape.
TARGET_VS_ORIGINAL = 1.10
TARGET_TFLOPS = 800
# The logits' standard deviation of the full-range data sets.
LOGIT_STDS = {"full_range": 5.0, "large_logits": 20.0}
# Instructions that show which MMA each product compiled to.
MMA_PATTERNS = {
    "wgmma_fp8": r"wgmma\.mma_async\S*\.e4m3\.e4m3",
    "wgmma_bf16": r"wgmma\.mma_async\S*\.bf16\.bf16",
    "wgmma_f16": r"wgmma\.mma_async\S*\.f16\.f16",
    "mma_sync": r"\bmma\.sync\.",
}


def _name(shape) -> str:
    return "x".join(str(s) for s in shape)


def tflops(shape, us: float) -> float:
    s_q, _, h_q, d_qk, topk = shape
    return 2 * s_q * h_q * topk * (d_qk + contract.D_V) / us / 1e6


def original():
    """sglang's CUTLASS kernel (``.anchor/originals.py``), or None where it is not built."""
    originals = anchor_module("originals")
    return None if originals is None else originals.sparse_mla()


def _shared_s_launch():
    """The shared-S kernel's launch, or None (no Gluon, or not an sm_90 GPU)."""
    if m._sparse_mla_sm90 is None or torch.cuda.get_device_capability() != (9, 0):
        return None
    from strictops.ops.sparse_mla import gluon_shared_s
    return gluon_shared_s.launch


def _launch_triton(args: dict, out: tuple):
    """One launch of the plain Triton kernel on validated ``args`` into ``out``."""
    return m._launch(m._sparse_mla_prefill_kernel, *(args[k] for k in m.INPUTS if k != "d_v"),
                     *out, None)


def kernel_facts(compiled) -> dict:
    """Registers, spills and MMA instruction counts of a compiled kernel (from its PTX)."""
    ptx = compiled.asm.get("ptx", "")
    facts = {name: len(re.findall(pattern, ptx)) for name, pattern in MMA_PATTERNS.items()}
    facts.update(registers=compiled.n_regs, spills=compiled.n_spills)
    return facts


def full_range_inputs(shape, gen: torch.Generator, logit_std: float) -> dict:
    """Inputs on the whole e4m3 range: per-tensor scales with amax -> 448, logits of standard
    deviation ``logit_std``."""
    s_q, s_kv, h_q, d_qk, topk = shape
    dims = contract.Dims(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, device="cuda")
    args = m.random_inputs(dims, gen, invalid_fraction=0.0, edge_rows=False)
    q = torch.randn(s_q, h_q, d_qk, device="cuda", generator=gen)
    kv = torch.randn(s_kv, 1, d_qk, device="cuda", generator=gen)
    q_scale, kv_scale = q.abs().amax() / 448, kv.abs().amax() / 448
    return args | {"q": (q / q_scale).to(contract.FP8), "kv": (kv / kv_scale).to(contract.FP8),
                   "q_scale": q_scale.reshape(1).float(), "kv_scale": kv_scale.reshape(1).float(),
                   "sm_scale": logit_std / d_qk**0.5}


def _errors(outputs, expected) -> dict:
    found = {"out": m.relative_l2(outputs[0], expected[0])}
    for name, got, want in zip(("max_logits", "lse"), outputs[1:], expected[1:]):
        finite = want.isfinite()
        err = (got.double() - want)[finite].abs() / (1 + want[finite].abs())
        found[name], found[name + "_rms"] = float(err.max()), float(err.square().mean().sqrt())
    return found


def errors(args: dict, cutlass) -> tuple[dict, dict | None]:
    """The op's and the original's (None where it is not built) errors against one float64
    reference: ``out``'s relative L2 error, the largest ``max_logits``/``lse`` errors relative
    to ``1 + |value|`` and their root mean square (``*_rms``: the largest is one row's, which
    changes with the inputs where two kernels round alike)."""
    expected = m.reference(**{k: args[k] for k in m.INPUTS})
    outputs = sparse_mla_q8kv8_prefill_fwd(**args)
    ours = _errors(outputs, expected)
    if cutlass is None:
        return ours, None
    outputs = tuple(torch.empty_like(t) for t in outputs)
    cutlass(args["q"], args["kv"], args["indices"], args["q_scale"], args["kv_scale"], *outputs,
            args["sm_scale"], None, None)
    return ours, _errors(outputs, expected)


def _error_columns(suffix: str, ours: dict | None, original: dict | None) -> dict:
    """Row entries ``rel_err_<suffix>``, ``max_logits_err_<suffix>``, ``lse_err_<suffix>``,
    ``lse_rms_err_<suffix>`` and the original's, prefixed ``original_``."""
    row = {}
    for prefix, found in (("", ours), ("original_", original)):
        for key, name in (("out", "rel_err"), ("max_logits", "max_logits_err"),
                          ("lse", "lse_err"), ("lse_rms", "lse_rms_err")):
            row[f"{prefix}{name}_{suffix}"] = None if found is None else found[key]
    return row


def measure(shape, gen: torch.Generator, gemm: float, cutlass) -> dict:
    """Every number of one shape (its tensors are freed on return)."""
    s_q, s_kv, h_q, d_qk, topk = shape
    dims = contract.Dims(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, device="cuda")
    call = m.random_inputs(dims, gen, invalid_fraction=0.0, edge_rows=False)
    error_columns = _error_columns("unit", *errors(call, cutlass))
    for data, logit_std in LOGIT_STDS.items():
        found = (errors(full_range_inputs(shape, gen, logit_std), cutlass)
                 if shape == SHAPES[0] else (None, None))
        error_columns |= _error_columns(data, *found)
    torch.cuda.empty_cache()

    gluon = m.warp_specialized(call["q"])
    outputs = sparse_mla_q8kv8_prefill_fwd(**call)
    ours_us = median_us(lambda: sparse_mla_q8kv8_prefill_fwd(**call))
    triton_outputs = tuple(torch.empty_like(t) for t in outputs)
    triton_us = median_us(functools.partial(_launch_triton, call, triton_outputs))
    inputs = [call[k] for k in m.INPUTS if k != "d_v"]
    facts = kernel_facts(m._sparse_mla_sm90.launch(*inputs, *outputs, None) if gluon
                         else _launch_triton(call, outputs))
    shared_s = _shared_s_launch()
    shared_s_us = (None if shared_s is None
                   else median_us(lambda: shared_s(*inputs, *outputs, None)))
    original_us = None
    if cutlass is not None:
        q, kv, indices, sm_scale, q_scale, kv_scale = inputs[:6]
        original_us = median_us(lambda: cutlass(q, kv, indices, q_scale, kv_scale, *outputs,
                                                sm_scale, None, None))
    row = dict(
        shape=_name(shape), kernel="gluon" if gluon else "triton", us=ours_us,
        ours_tflops=tflops(shape, ours_us),
        original_tflops=None if original_us is None else tflops(shape, original_us),
        fp8_gemm_tflops=gemm, triton_kernel_tflops=tflops(shape, triton_us),
        shared_s_kernel_tflops=None if shared_s_us is None else tflops(shape, shared_s_us),
        **error_columns, **facts,
    )
    row["vs_original"] = (None if row["original_tflops"] is None
                          else row["ours_tflops"] / row["original_tflops"])
    print({k: v for k, v in row.items()}, flush=True)
    return row


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("--shapes", type=int, nargs="*", default=range(len(SHAPES)),
                    help="which of SHAPES to run (indices; default: all)")
    args, report, gen = begin("sparse_mla_prefill", ap, seed=20261130)
    gemm = fp8_gemm_tflops()
    report.ceilings["fp8_gemm_8192_TFLOPS"] = gemm
    cutlass = original()
    for shape in (SHAPES[i] for i in args.shapes):
        torch.cuda.empty_cache()
        row = report.add(**measure(shape, gen, gemm, cutlass))
        if row["original_tflops"] is not None:
            report.check_bar(row, "vs_original", ">=", TARGET_VS_ORIGINAL)
        if shape == SHAPES[0]:
            report.check_bar(row, "ours_tflops", ">=", TARGET_TFLOPS)
            for data in ("unit", *LOGIT_STDS):
                if row[f"original_lse_err_{data}"] is not None:
                    report.check_bar(row, f"lse_err_{data}", "<=",
                                     row[f"original_lse_err_{data}"])
                    report.check_bar(row, f"rel_err_{data}", "<=",
                                     row[f"original_rel_err_{data}"])
    report.write(args.out, ["shape", "kernel", "us", "ours_tflops", "original_tflops",
                            "vs_original", "fp8_gemm_tflops", "triton_kernel_tflops",
                            "shared_s_kernel_tflops",
                            *(f"{prefix}{name}_{data}" for data in ("unit", *LOGIT_STDS)
                              for name in ("rel_err", "lse_err", "lse_rms_err")
                              for prefix in ("", "original_")),
                            "registers", "spills", "wgmma_fp8", "wgmma_f16", "wgmma_bf16",
                            "mma_sync"], plot=_plot)


def _plot(plt, report):
    series = [("ours (op default)", "ours_tflops"), ("our Triton kernel", "triton_kernel_tflops"),
              ("shared-S kernel (not default)", "shared_s_kernel_tflops"),
              ("original CUTLASS (same run)", "original_tflops")]
    fig, ax = grouped_bars(plt, report, "shape", series, "sparse_mla_q8kv8_prefill_fwd",
                           "TFLOPS (median)", log=False)
    ax.axhline(report.ceilings["fp8_gemm_8192_TFLOPS"], color="k", linestyle="--",
               label="FP8 GEMM 8192³, this run")
    ax.axhline(TARGET_TFLOPS, color="r", linestyle=":", label="goal")
    ax.set_xlabel("(s_q, s_kv, h_q, d_qk, topk)")
    ax.legend(fontsize=7)
    return fig


if __name__ == "__main__":
    main()
