"""The sm_90 sparse MLA kernels side by side: build facts, correctness, speed.

On an H200 (the default variants; about 100 s when the original is already built)::

    python benchmarks/experiments/sparse_mla_hopper.py --out $OUT

Variants (``--kernels``; ``VARIANTS``, the default set in ``DEFAULT``): ``old``
(``strictops.ops._sparse_mla_gluon``, the op's default), ``cutlass`` (sglang's original, where
``.anchor`` has it built), ``new`` (``strictops.ops._sparse_mla_hopper`` with its ``TUNING``:
the consumers transpose V with ``ldmatrix.trans`` / ``stmatrix``, 64 columns a load),
``new_blocked`` (the same with the transpose through a blocked layout: ``LDSM`` + ``PRMT`` +
``STS.64``), ``new_tr128`` / ``new_tr256`` (128 / 256 columns a load: fewer partition
barriers, more registers; ``_r232``: 232/40 registers; ``_early``: the consumers
transpose block 2p while the second P·V of pair p - 1 runs, ``_vt3_early`` both blocks into
three Vᵀ buffers; ``_qasync``: the consumers copy
Q with ``cp.async`` after the fork; ``_persistent``: at most one CTA per SM, each looping over
tiles), ``new_prod_tr`` (the producer
transposes), ``new_prod_tr_vt3`` (and three Vᵀ buffers; ``new_prod_tr128_vt3`` 128 columns a
load, ``new_prod_tr_vt3_r216`` 216/72 registers), and the ablations in ``ABLATIONS`` (wrong
results, timing only, first shape only). Each variant is compiled first, all at once, in
processes of their own.

Without a GPU (``--build``): compiles every variant of ``strictops.ops._sparse_mla_hopper``
(and ``_sparse_mla_gluon``) for sm_90a with the Triton wheel's ptxas and prints registers,
spills, ptxas warnings, shared memory and the SASS instruction mix.

On an H200: each variant against the float64 reference (both d_qk, topk_length, attn_sink in
{finite, +inf, -inf}, h_q 64/192, invalid indices, empty rows, poisoned buffers: one line per
case and variant), then at the four benchmark shapes one line per variant: TFLOPS
(``do_bench`` median, L2 flushed), the largest absolute ``out`` error, relative errors of
``out`` (L2), ``max_logits`` and ``lse`` (largest, relative to ``1 + |value|``) against
float64, and the number of NaN; at the first shape also on full-range FP8 data. The same rows
as JSON lines in ``--out``/results.jsonl.

    python benchmarks/experiments/sparse_mla_hopper.py --build
    python benchmarks/experiments/sparse_mla_hopper.py --out $OUT --kernels new new_tr128
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from strictops.meta import sparse_mla_prefill as contract
from strictops.ops import sparse_mla_prefill as m

SHAPES = [
    (4096, 8192, 128, 576, 2048),
    (4096, 32768, 128, 576, 2048),
    (4096, 8192, 64, 512, 512),
    (1024, 8192, 128, 576, 2048),
]
SIGNATURE = {"q_ptr": "*fp8e4nv", "kv_ptr": "*fp8e4nv", "indices_ptr": "*i32",
             "q_scale_ptr": "*fp32", "kv_scale_ptr": "*fp32", "attn_sink_ptr": "*fp32",
             "topk_length_ptr": "*i32", "errors_ptr": "*i32", "out_ptr": "*bf16",
             "max_logits_ptr": "*fp32", "lse_ptr": "*fp32", "sm_scale": "fp32",
             "s_kv": "i32", "h_q": "i32", "topk": "i32"}


# Diagnostic copies of the kernel (timing only, wrong results): text replacements in its
# source, and the tuning they run with.
ABLATIONS = {
    # no V transpose: the consumers publish nothing to Vᵀ (its loads and PRMT go too)
    "new_no_vt_store": ([("dst.store(gl.reshape(gl.permute(y, _TR_JOIN.value), [2 * J, 32]))",
                          "pass")], {}),
    # the same with the producer's blocked transpose
    "new_no_transpose": ([("vt.index(v).slice(h * 256, 256, dim=0).store(gl.permute(x, (1, 0)))",
                           "pass")], {"tr_cons": False, "vt_ldsm": False}),
    # no proxy fence between the wait for a block's copies and the producer's transpose
    "new_no_prefence": ([("mbarrier.wait(k_ready.index(s), (b // NUM_STAGES) & 1)\n            fence_async_shared()",
                          "mbarrier.wait(k_ready.index(s), (b // NUM_STAGES) & 1)")],
                        {"tr_cons": False}),
    # no gather: every row invalid, so no cp.async copies a byte (softmax of -inf)
    "new_no_gather": ([("return idx, (idx >= 0) & (idx < s_kv) & (j < n_rows)",
                        "return idx, (idx >= 0) & (idx < s_kv) & (j < 0)")], {}),
}
# Block-pair variants: tuning overrides of strictops.ops._sparse_mla_hopper.TUNING.
VARIANTS = {
    "new": {},
    "new_blocked": {"vt_ldsm": False},
    "new_tr128": {"tr_cols": 128},
    "new_tr256": {"tr_cols": 256},
    "new_r232": {"consumer_regs": 232, "producer_regs": 40},
    "new_tr128_r232": {"tr_cols": 128, "consumer_regs": 232, "producer_regs": 40},
    "new_early": {"tr_early": True},
    "new_r232_early": {"tr_early": True, "consumer_regs": 232, "producer_regs": 40},
    "new_qasync": {"q_async": True},
    "new_r232_qasync": {"q_async": True, "consumer_regs": 232, "producer_regs": 40},
    "new_r232_early_qasync": {"q_async": True, "tr_early": True, "consumer_regs": 232,
                              "producer_regs": 40},
    "new_vt3_early_r232": {"num_vt": 3, "tr_early": True, "consumer_regs": 232,
                           "producer_regs": 40},
    "new_persistent": {"persistent": True},
    "new_persistent_r232": {"persistent": True, "consumer_regs": 232, "producer_regs": 40},
    "new_persistent_r232_early": {"persistent": True, "tr_early": True, "consumer_regs": 232,
                                  "producer_regs": 40},
    "new_prod_tr": {"tr_cons": False},
    "new_prod_tr_vt3": {"tr_cons": False, "num_vt": 3},
    "new_prod_tr128_vt3": {"tr_cons": False, "num_vt": 3, "tr_cols": 128},
    "new_prod_tr_vt3_r216": {"tr_cons": False, "num_vt": 3, "consumer_regs": 216,
                             "producer_regs": 72},
}
DEFAULT = ["old", "cutlass", "new", "new_blocked", "new_r232", "new_early", "new_r232_early",
           "new_vt3_early_r232", "new_qasync", "new_r232_early_qasync", "new_persistent",
           "new_persistent_r232", "new_persistent_r232_early", "new_no_vt_store"]


def _ablated(name: str):
    """A copy of the kernel module with ``ABLATIONS[name]`` applied, imported from a file."""
    import importlib.util
    from strictops.ops import _sparse_mla_hopper as hopper
    source = Path(hopper.__file__).read_text()
    for old, new in ABLATIONS[name][0]:
        assert old in source, (name, old)
        source = source.replace(old, new)
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    # In the package, so that its relative imports resolve.
    spec = importlib.util.spec_from_file_location(f"strictops.ops.{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Original:
    """sglang's CUTLASS kernel with the ``launch`` of the Gluon modules (no ``attn_sink`` or
    ``topk_length``: the speed rows only)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def launch(self, q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length, out,
               max_logits, lse, errors):
        if attn_sink is not None or topk_length is not None:
            raise NotImplementedError("the original is timed without attn_sink/topk_length")
        self.kernel(q, kv, indices, q_scale, kv_scale, out, max_logits, lse, sm_scale, None,
                    None)


def kernels(names=None, build_only=False) -> dict:
    """name -> (module, tuning) of the variants in ``names`` (every one for ``None``)."""
    from strictops.ops import _sparse_mla_gluon as old
    from strictops.ops import _sparse_mla_hopper as hopper
    found = {}
    for name in names or ["old", "cutlass", *VARIANTS, *ABLATIONS]:
        if name == "old":
            found[name] = (old, {})
        elif name == "cutlass":
            if build_only:
                continue
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from bench_sparse_mla_prefill import original
            kernel = original()
            if kernel is None:
                print("cutlass: not built here (.anchor), skipped", flush=True)
                continue
            found[name] = (_Original(kernel), {})
        elif name in VARIANTS:
            found[name] = (hopper, VARIANTS[name])
        elif name in ABLATIONS:
            found[name] = (_ablated(name), ABLATIONS[name][1])
        else:
            raise SystemExit(f"unknown variant {name}: expected one of old, cutlass, "
                             f"{', '.join(VARIANTS)}, {', '.join(ABLATIONS)}")
    return found


def build(module, kernel, d_qk: int, tuning: dict, name: str) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    constexprs = module.constexprs(d_qk, True, True, True, **tuning)
    signature = SIGNATURE | ({"n_tiles": "i32"} if "n_tiles" in kernel.arg_names else {})
    source = GluonASTSource(kernel, signature | {k: "constexpr" for k in constexprs},
                            constexprs, {(i,): [["tt.divisibility", 16]] for i in range(11)})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4,
                                       "maxnreg": (module.TUNING | tuning)["max_regs"]})
    ptx = compiled.asm["ptx"]
    bin_dir = Path(triton.__file__).parent / "backends/nvidia/bin"
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        src.write_text(ptx)
        r = subprocess.run([bin_dir / "ptxas", "-arch=sm_90a", "-v", src, "-o", cubin],
                           capture_output=True, text=True)
        sass = subprocess.run([bin_dir / "cuobjdump", "-sass", cubin], capture_output=True,
                              text=True).stdout
    facts = " | ".join(line.strip() for line in r.stderr.splitlines()
                       if any(w in line for w in ("spill", "Used", "C75", "arning")))
    ops = {}
    for line in sass.splitlines():
        hit = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if hit:
            ops[hit.group(2)] = ops.get(hit.group(2), 0) + 1
    mmas = sorted(set(re.findall(r"wgmma\.mma_async\.\S+", ptx)))
    print(f"== {name} d_qk={d_qk}: smem={compiled.metadata.shared} {facts}")
    print("   setmaxnreg", re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx),
          "commit_group", ptx.count("wgmma.commit_group"), mmas)
    top = dict(sorted(ops.items(), key=lambda x: -x[1])[:24])
    print("   ", top)


def run_build(names=None) -> None:
    for name, (module, tuning) in kernels(names, build_only=True).items():
        kernel = getattr(module, "sparse_mla_hopper_kernel", None) or module.sparse_mla_ws_kernel
        for d_qk in contract.D_QKS:
            try:
                build(module, kernel, d_qk, tuning, name)
            except Exception as exc:  # a variant that does not build: report, go on
                print(f"== {name} d_qk={d_qk}: FAILED {type(exc).__name__}: {str(exc)[-2000:]}")


def _call(module, tuning, args):
    out = args.get("out")
    buffers = m._allocate(args["q"], args["d_v"], args.get("out"), args.get("max_logits"),
                          args.get("lse"))[:3]
    module.launch(*(args[k] for k in m.INPUTS if k != "d_v"), *buffers,
                  args.get("topk_length_errors"), **tuning)
    del out
    return buffers


def _errors(outputs, expected) -> dict:
    out, ml, lse = outputs
    res = {"out": m.relative_l2(out, expected[0]),
           "max_abs": float((out.double() - expected[0]).abs().nan_to_num(float("inf")).max()),
           "nan": int(out.isnan().sum() + ml.isnan().sum() + lse.isnan().sum())}
    for name, got, want in (("max_logits", ml, expected[1]), ("lse", lse, expected[2])):
        finite = want.isfinite()
        diff = (got.double()[finite] - want[finite]).abs() / (1 + want[finite].abs())
        res[name] = float(diff.max()) if diff.numel() else 0.0
        res[name + "_inf_exact"] = bool(torch.equal(got.double()[~finite], want[~finite]))
    return res


# The specialisations a variant is compiled for (d_qk, optional arguments given): those of the
# speed rows and of the checks, whose sizes are multiples of 16 like the benchmark shapes'.
SPECIALISATIONS = [(576, False), (512, False), (576, True)]


def check_cases(gen):
    """(name, args) of the correctness cases, in the specialisations of ``SPECIALISATIONS``."""
    cases = []
    for d_qk, variant in ((576, "plain"), (512, "plain"), (576, "attn_sink")):
        dims = contract.Dims(s_q=96, s_kv=3008, h_q=128, d_qk=d_qk, topk=512,
                             with_topk_length=variant != "plain",
                             with_attn_sink=variant == "attn_sink", with_buffers=True,
                             with_errors=variant != "plain", device="cuda")
        cases.append((f"{variant}-{d_qk}", m.random_inputs(dims, gen)))
    for h_q, topk in ((64, 128), (192, 256), (64, 384)):
        dims = contract.Dims(s_q=33, s_kv=704, h_q=h_q, d_qk=576, topk=topk,
                             with_topk_length=True, with_attn_sink=True, with_buffers=True,
                             with_errors=True, device="cuda")
        cases.append((f"h{h_q}-topk{topk}", m.random_inputs(dims, gen)))
    for sink in (float("inf"), float("-inf")):
        dims = contract.Dims(s_q=24, s_kv=512, h_q=64, d_qk=576, topk=256,
                             with_topk_length=True, with_attn_sink=True, with_buffers=True,
                             with_errors=True, device="cuda")
        args = m.random_inputs(dims, gen)
        args["attn_sink"][::2] = sink
        cases.append((f"sink{sink}", args))
    return cases


def full_range(shape, gen):
    """Per-tensor scales with amax -> 448 and logits of std 5 (the benchmark's data)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench_sparse_mla_prefill import full_range_inputs
    return full_range_inputs(shape, gen)


def warm(names) -> None:
    """Compile (by one small call each) every specialisation of the variants in ``names``
    into Triton's cache."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    for name, (module, tuning) in kernels(names).items():
        for d_qk, optional in SPECIALISATIONS:
            dims = contract.Dims(s_q=2, s_kv=512, h_q=128, d_qk=d_qk, topk=128,
                                 with_topk_length=optional, with_attn_sink=optional,
                                 with_errors=optional, device="cuda")
            try:
                _call(module, tuning, m.random_inputs(dims, gen))
            except NotImplementedError:  # the original: no optional arguments
                pass
    torch.cuda.synchronize()


def warm_in_parallel(names, timeout_s: float = 240) -> list:
    """:func:`warm` each variant in a process of its own, all at once (compiling takes most of
    a run otherwise). Returns ``names`` without the variants whose process did not finish in
    ``timeout_s`` (a hang); one that failed is compiled again, and its error reported, later."""
    procs = {name: subprocess.Popen([sys.executable, __file__, "--warm", "--kernels", name],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name in names if name != "cutlass"}
    deadline = time.time() + timeout_s
    hung = []
    for name, proc in procs.items():
        try:
            proc.wait(timeout=max(deadline - time.time(), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            hung.append(name)
            print(f"{name}: its small calls did not finish in {timeout_s:.0f} s (a hang?), "
                  "left out", flush=True)
    return [name for name in names if name not in hung]


def run_smoke(names) -> None:
    """One small call per kernel (run under ``timeout``: a hang is the failure it catches)."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    dims = contract.Dims(s_q=8, s_kv=900, h_q=128, d_qk=576, topk=384, with_topk_length=True,
                         with_attn_sink=True, with_buffers=True, with_errors=True,
                         device="cuda")
    args = m.random_inputs(dims, gen)
    expected = m.reference(**{k: args[k] for k in m.INPUTS})
    for name, (module, tuning) in kernels(names).items():
        if name == "cutlass":
            continue
        outputs = _call(module, tuning, dict(args))
        torch.cuda.synchronize()
        print(name, m.compare_to_reference(outputs, expected, m.GPU_REL_L2_BOUND,
                                           m.GPU_LOGIT_TOL), flush=True)


def _line(row: dict) -> str:
    """One readable line of a result row."""
    head = (f"{row['kind']:5} {row.get('case') or row.get('shape_name')} "
            f"{row.get('data', '')} {row['kernel']:16}")
    if "error" in row:
        return f"{head} ERROR {row['error'][-300:]}"
    speed = "" if row.get("tflops") is None else f"{row['tflops']:7.1f} TFLOPS "
    ok = "" if "ok" not in row else ("ok   " if row["ok"] else "FAIL ")
    return (f"{head} {ok}{speed}max_abs {row['max_abs']:.2e} out {row['out']:.2e} "
            f"max_logits {row['max_logits']:.2e} lse {row['lse']:.2e} nan {row['nan']}"
            + ("" if row.get("counted") is None else f" counted {row['counted']}")
            + ("" if row.get("max_logits_inf_exact", True) and row.get("lse_inf_exact", True)
               else " INF-MISMATCH"))


def run_gpu(out_dir: Path, names=None) -> None:
    from triton.testing import do_bench
    out_dir.mkdir(parents=True, exist_ok=True)
    log = open(out_dir / "results.jsonl", "a")

    def emit(**row):
        print(_line(row), flush=True)
        log.write(json.dumps(row) + "\n")
        log.flush()

    t0 = time.time()
    names = warm_in_parallel(names)
    print(f"compiled in {time.time() - t0:.0f} s", flush=True)
    variants = kernels(names)
    gen = torch.Generator(device="cuda").manual_seed(1)
    for case, args in check_cases(gen):
        expected = m.reference(**{k: args[k] for k in m.INPUTS})
        # The reference's empty rows with attn_sink = +inf give sigmoid(inf - inf) = NaN;
        # the contract says 0.
        expected = (torch.nan_to_num(expected[0], nan=0.0), *expected[1:])
        for name, (module, tuning) in variants.items():
            if name in ("old", "cutlass") or name in ABLATIONS:  # old: the test suite's
                continue
            fresh = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
            try:
                outputs = _call(module, tuning, fresh)
                torch.cuda.synchronize()
            except Exception as exc:
                emit(kind="check", case=case, kernel=name, error=repr(exc)[-500:])
                continue
            ok, detail = m.compare_to_reference(outputs, expected, m.GPU_REL_L2_BOUND,
                                                m.GPU_LOGIT_TOL)
            errors = fresh.get("topk_length_errors")
            emit(kind="check", case=case, kernel=name, ok=ok, detail=detail,
                 counted=None if errors is None else int(errors.item()),
                 **_errors(outputs, expected))
    for shape_name, shape in zip("ABCD", SHAPES):
        s_q, s_kv, h_q, d_qk, topk = shape
        flops = 2 * s_q * h_q * topk * (d_qk + 512)
        dims = contract.Dims(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, device="cuda")
        args = m.random_inputs(dims, gen, invalid_fraction=0.0, edge_rows=False)
        data = {"unit": args}
        if shape == SHAPES[0]:
            data["full_range"] = full_range(shape, gen)
        for data_name, a in data.items():
            expected = m.reference(**{k: a[k] for k in m.INPUTS})
            for name, (module, tuning) in variants.items():
                if name in ABLATIONS and shape != SHAPES[0]:
                    continue
                try:
                    outputs = _call(module, tuning, a)
                    torch.cuda.synchronize()
                    errs = _errors(outputs, expected)
                    us = (do_bench(lambda: _call(module, tuning, a), warmup=25, rep=100,
                                   return_mode="median") * 1e3 if data_name == "unit" else None)
                except Exception as exc:
                    emit(kind="speed", shape=shape, shape_name=shape_name, data=data_name,
                         kernel=name, error=repr(exc)[-500:])
                    continue
                emit(kind="speed", shape=shape, shape_name=shape_name, data=data_name,
                     kernel=name, us=us, tflops=None if us is None else flops / us / 1e6,
                     **errs)
            del expected
            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="store_true", help="compile for sm_90a only (no GPU)")
    ap.add_argument("--smoke", action="store_true", help="one small call per kernel")
    ap.add_argument("--warm", action="store_true", help="compile the variants (a GPU's)")
    ap.add_argument("--kernels", nargs="*",
                    help="which variants (default: DEFAULT; --build: every one)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/mla-hopper")))
    args = ap.parse_args()
    if args.build:
        run_build(args.kernels)
    elif args.smoke:
        run_smoke(args.kernels)
    elif args.warm:
        warm(args.kernels)
    else:
        t0 = time.time()
        run_gpu(args.out, args.kernels or DEFAULT)
        print(f"done in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
