"""The sm_90 sparse MLA kernels side by side: build facts, correctness, speed.

On an H200 (the default variants; about 100 s when the original is already built)::

    python benchmarks/experiments/sparse_mla_hopper.py --out $OUT

Variants (``--kernels``; ``VARIANTS``, the default set in ``DEFAULT``): ``old`` (the shared-S
kernel of ``strictops.ops.sparse_mla.gluon_shared_s``), ``cutlass`` (sglang's original, where
``.anchor`` has it built), ``new`` (``strictops.ops.sparse_mla.gluon_block_pair`` with its ``TUNING``:
persistent CTAs, the consumers transposing V with ``ldmatrix.trans`` / ``stmatrix``, 64
columns a load, after the second P·V, O through shared memory, 232/40 registers, the CTAs
with a tile of slack started in four staggered groups, the Q·Kᵀ chains after a tile's first
pair started from minus half the row's running maximum and the first pair's as two chains:
``qk_prec`` 2, ``strictops.ops.sparse_mla.gluon_mma``), the same with one knob changed
(``_no_stagger``: every CTA starts at once; ``_stagger8``: eight groups; ``_r224``: 224/56
registers; ``_early``: the transposes whose Vᵀ buffer is free while the second P·V runs;
``_vt3``: three Vᵀ buffers; ``_o_global``: O stored straight from the wgmma layout, 4 bytes a
thread; ``_qk_zero``: every Q·Kᵀ chain from 0, as the original; ``_qk_offset``: the first
pair's as one chain (``qk_prec`` 1); ``_o_tma``: O sent by four TMA stores a consumer that
drain while the next tile starts; ``_tr128``: 128 columns a load;
``_blocked``: the transpose through a blocked layout, ``LDSM`` + ``PRMT`` + ``STS.64``;
``_prod_tr``: the producer transposes), ``one_tile`` (one CTA a tile, late transposes, 224/56 registers, Q stored
before the fork) and its variants (``_r232_early_qasync``: 232/40, early, the consumers copy
Q with ``cp.async`` after the fork), and the ablations in ``ABLATIONS`` (wrong results,
timing only, first and third shapes only). Each variant is compiled first, all at once, in
processes of their own. ``--extra-shapes`` adds ``EXTRA_SHAPES`` to the speed rows.

Without a GPU (``--build``): compiles every variant of ``strictops.ops.sparse_mla.gluon_block_pair``
(and ``gluon_shared_s``) for sm_90a with the Triton wheel's ptxas and prints registers,
spills, ptxas warnings, shared memory and the SASS instruction mix.

On an H200: each variant against the float64 reference (both d_qk, topk_length, attn_sink in
{finite, +inf, -inf}, h_q 64/192, invalid indices, empty rows, poisoned buffers: one line per
case and variant), then at the four benchmark shapes one line per variant: TFLOPS
(``do_bench`` median, L2 flushed), the largest absolute ``out`` error, relative errors of
``out`` (L2), ``max_logits`` and ``lse`` (largest, relative to ``1 + |value|``) against
float64, and the number of NaN; at the first shape also on full-range FP8 data with logits of
standard deviation 5 and 20 (the benchmark's data sets). The same rows as JSON lines in
``--out``/results.jsonl.

    python benchmarks/experiments/sparse_mla_hopper.py --build
    python benchmarks/experiments/sparse_mla_hopper.py --out $OUT --kernels new new_tr128
    python benchmarks/experiments/sparse_mla_hopper.py --out $OUT --extra-shapes
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

from strictops.meta.sparse_mla import prefill as contract
from strictops.ops.sparse_mla import prefill as m

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


# Diagnostic copies of the kernel (timing only, wrong results, first and third shapes): text
# replacements in its source, and the tuning they run with.
ABLATIONS = {
    # no gather: every row invalid, so no cp.async copies a byte (softmax of -inf)
    "new_no_gather": ([("return idx, (idx >= 0) & (idx < s_kv) & (j < n_rows)",
                        "return idx, (idx >= 0) & (idx < s_kv) & (j < 0)")], {}),
    # no output store (every element masked off): what the epilogue's stores cost
    # (of O stored from the wgmma layout, the default before O went through shared memory)
    "abl_no_out_store": ([("                 out.to(gl.bfloat16))",
                           "                 out.to(gl.bfloat16), "
                           "mask=gl.expand_dims(out_rows < 0, 1))")], {"o_smem": False}),
    # the consumers do not wait for each tile's Q: how long its copy keeps them
    "abl_no_q_wait": ([("    if Q_ASYNC or PERSISTENT:\n        mbarrier.wait(q_bar, phase)",
                        "    if Q_ASYNC or PERSISTENT:\n        pass")], {}),
    # the producer does not wait for the last Q·Kᵀ of a tile before the next tile's Q
    "abl_no_q_free": ([("            mbarrier.wait(q_free, (t - 1) & 1)", "            pass")],
                      {}),
    # the consumers do not wait for each other's row sums at the end of a tile
    "abl_no_l_wait": ([("    mbarrier.wait(l_bar, phase)", "    pass")], {}),
    # no Vᵀ stores: the transposes' ldmatrix.trans and prmt run, their stmatrix never does
    # (under a branch no CTA takes): what the stores, and the barriers between them, cost;
    # a P·V that reads V where it was gathered would save at most this
    "abl_no_vt_store": ([], {}, [(
        "    dst.store(gl.reshape(gl.permute(y, TR_JOIN.value), [2 * J, 32]))",
        "    if gl.program_id(0) > 1 << 30:\n"
        "        dst.store(gl.reshape(gl.permute(y, TR_JOIN.value), [2 * J, 32]))")]),
    # no output store of the default epilogue (O through shared memory, 16 bytes a thread)
    "abl_no_o_store": ([], {}, [(
        "                                                                          + cols, 0), x)",
        "                                                                          + cols, 0), x,"
        " mask=gl.expand_dims(rows < 0, 1))")]),
}
# Block-pair variants: tuning overrides of strictops.ops.sparse_mla.gluon_block_pair.TUNING (persistent
# CTAs, early transposes, 232/40 registers).
ONE_TILE = {"persistent": False, "tr_early": False, "consumer_regs": 224, "producer_regs": 56}
VARIANTS = {
    "new": {},
    "new_no_stagger": {"stagger": 0},
    "new_stagger8": {"stagger": 8},
    "new_r224": {"consumer_regs": 224, "producer_regs": 56},
    "new_early": {"tr_early": True},
    "new_vt3": {"num_vt": 3},
    "new_vt3_early": {"num_vt": 3, "tr_early": True},
    "new_o_global": {"o_smem": False},
    "new_qk_zero": {"qk_prec": 0},
    "new_qk_offset": {"qk_prec": 1},
    "new_o_tma": {"o_tma": True},
    "new_tr128": {"tr_cols": 128},
    "new_blocked": {"vt_ldsm": False},
    "new_prod_tr": {"tr_cons": False, "consumer_regs": 224, "producer_regs": 56},
    "new_prod_tr_vt3": {"tr_cons": False, "num_vt": 3, "consumer_regs": 224,
                        "producer_regs": 56},
    # one CTA a tile
    "one_tile": ONE_TILE,
    "one_tile_r232_early_qasync": ONE_TILE | {"tr_early": True, "q_async": True,
                                              "consumer_regs": 232, "producer_regs": 40},
    "one_tile_tr128": ONE_TILE | {"tr_cols": 128},
    "one_tile_blocked": ONE_TILE | {"vt_ldsm": False},
}
DEFAULT = ["cutlass", "new", "new_qk_zero", "new_qk_offset", "new_o_tma", "new_o_global",
           "one_tile"]
# Shapes that tell the costs apart (``--extra-shapes``, speed on unit data only): heads,
# d_qk and topk one at a time from the third benchmark shape, where tiles are shortest.
EXTRA_SHAPES = [
    (4096, 8192, 64, 512, 1024),
    (4096, 8192, 64, 512, 2048),
    (4096, 8192, 128, 512, 512),
    (4096, 8192, 64, 576, 512),
]


def _rewritten(module, replacements, name: str, folder: Path):
    """A copy of ``module`` with the text ``replacements`` applied, imported from a file in
    ``folder`` as ``strictops.ops.sparse_mla.<name>`` (so that imports of it resolve)."""
    import importlib.util
    source = Path(module.__file__).read_text()
    for old, new in replacements:
        assert old in source, (name, old)
        source = source.replace(old, new)
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"strictops.ops.sparse_mla.{name}", path)
    copy = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = copy
    spec.loader.exec_module(copy)
    return copy


def _ablated(name: str):
    """A copy of the kernel module with ``ABLATIONS[name]`` applied (a third entry: to a copy
    of ``gluon_transpose``, which the kernel's copy then imports)."""
    from strictops.ops.sparse_mla import gluon_block_pair as hopper
    from strictops.ops.sparse_mla import gluon_transpose
    replacements, _, *transpose = ABLATIONS[name]
    folder = Path(tempfile.mkdtemp())
    if transpose:
        _rewritten(gluon_transpose, transpose[0], f"{name}_transpose", folder)
        replacements = [*replacements, (
            "from strictops.ops.sparse_mla.gluon_transpose import",
            f"from strictops.ops.sparse_mla.{name}_transpose import")]
    return _rewritten(hopper, replacements, name, folder)


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
    from strictops.ops.sparse_mla import gluon_shared_s as old
    from strictops.ops.sparse_mla import gluon_block_pair as hopper
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
    from strictops.ops.sparse_mla.gluon_shared_s import launch_options
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options=launch_options(module.TUNING, tuning))
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


def full_range(shape, gen, data: str):
    """Per-tensor scales with amax -> 448 and the logits of the benchmark's data set ``data``
    (``full_range``: standard deviation 5, ``large_logits``: 20)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench_sparse_mla_prefill import LOGIT_STDS, full_range_inputs
    return full_range_inputs(shape, gen, LOGIT_STDS[data])


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
    if "out" not in row:  # a speed-only row
        return f"{head} {speed}{row.get('shape')}"
    return (f"{head} {ok}{speed}max_abs {row['max_abs']:.2e} out {row['out']:.2e} "
            f"max_logits {row['max_logits']:.2e} lse {row['lse']:.2e} nan {row['nan']}"
            + ("" if row.get("counted") is None else f" counted {row['counted']}")
            + ("" if row.get("max_logits_inf_exact", True) and row.get("lse_inf_exact", True)
               else " INF-MISMATCH"))


def run_gpu(out_dir: Path, names=None, extra_shapes: bool = False) -> None:
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
    shapes = SHAPES + (EXTRA_SHAPES if extra_shapes else [])
    for shape_name, shape in zip("ABCDEFGH", shapes):
        s_q, s_kv, h_q, d_qk, topk = shape
        flops = 2 * s_q * h_q * topk * (d_qk + 512)
        dims = contract.Dims(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, device="cuda")
        args = m.random_inputs(dims, gen, invalid_fraction=0.0, edge_rows=False)
        data = {"unit": args}
        if shape == SHAPES[0]:
            for data_name in ("full_range", "large_logits"):
                data[data_name] = full_range(shape, gen, data_name)
        full = shape in SHAPES  # the extra shapes: speed only
        for data_name, a in data.items():
            expected = m.reference(**{k: a[k] for k in m.INPUTS}) if full else None
            for name, (module, tuning) in variants.items():
                if name in ABLATIONS and shape not in (SHAPES[0], SHAPES[2]):
                    continue
                try:
                    outputs = _call(module, tuning, a)
                    torch.cuda.synchronize()
                    errs = _errors(outputs, expected) if full else {}
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
    ap.add_argument("--extra-shapes", action="store_true",
                    help="time EXTRA_SHAPES too (speed only)")
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
        run_gpu(args.out, args.kernels or DEFAULT, args.extra_shapes)
        print(f"done in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
