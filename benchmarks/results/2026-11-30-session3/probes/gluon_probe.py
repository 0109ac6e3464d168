"""GPU probe: correctness and speed of the warp-specialised Gluon kernel (.probe/gluon_mla.py)."""
import json, os, sys, time, traceback
from pathlib import Path
import torch
import triton
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
import gluon_mla as g
from strictops.meta import sparse_mla_prefill as contract
from strictops.ops import sparse_mla_prefill as m

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
results = {"checks": [], "speed": []}


from gluon_probe_launch import launch


def check(name, dims, kern=None, **kw):
    gen = torch.Generator(device="cuda").manual_seed(hash(name) % 1000)
    a = m.random_inputs(dims, gen, **kw)
    s_q, h_q = a["q"].shape[:2]
    out = torch.full((s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    ml = torch.full((s_q, h_q), float("nan"), device="cuda")
    lse = torch.full((s_q, h_q), float("nan"), device="cuda")
    errors = torch.zeros(1, dtype=torch.int32, device="cuda") if a.get("topk_length") is not None else None
    try:
        launch(a, out, ml, lse, errors, **(kern or {}))
        torch.cuda.synchronize()
        expected = m.reference(**{k: a[k] for k in m.INPUTS})
        ok, detail = m.compare_to_reference((out, ml, lse), expected, m.GPU_REL_L2_BOUND, m.GPU_LOGIT_TOL)
        # the Triton kernel on the same inputs, bit comparison of structure
        ref_out = m.sparse_mla_q8kv8_prefill_fwd(**{k: a[k] for k in m.INPUTS})
        detail += f"; vs triton kernel rel {m.relative_l2(out, ref_out[0]):.2e}"
        detail += f"; errors {None if errors is None else int(errors.item())}"
    except Exception as exc:
        ok, detail = False, traceback.format_exc()[-2000:]
    print(f"CHECK {name}: {'PASS' if ok else 'FAIL'} {detail}", flush=True)
    results["checks"].append({"name": name, "ok": ok, "detail": detail})
    return ok


D = contract.Dims
ok = check("small576 all", D(s_q=8, s_kv=300, h_q=128, d_qk=576, topk=256, with_attn_sink=True, device="cuda"))
ok &= check("small576 plain", D(s_q=8, s_kv=300, h_q=64, d_qk=576, topk=128, device="cuda"), edge_rows=False)
ok &= check("small512 all", D(s_q=8, s_kv=500, h_q=64, d_qk=512, topk=384, with_attn_sink=True, device="cuda"))
ok &= check("mid576", D(s_q=64, s_kv=4096, h_q=128, d_qk=576, topk=2048, with_attn_sink=True, device="cuda"))
ok &= check("f16 small576 all", D(s_q=8, s_kv=300, h_q=128, d_qk=576, topk=256, with_attn_sink=True, device="cuda"), dict(V_F16=True))
ok &= check("f16 mid576", D(s_q=64, s_kv=4096, h_q=128, d_qk=576, topk=2048, with_attn_sink=True, device="cuda"), dict(V_F16=True))
ok &= check("f16 mid576 noinvalid", D(s_q=64, s_kv=4096, h_q=128, d_qk=576, topk=2048, device="cuda"), dict(V_F16=True), invalid_fraction=0.0, edge_rows=False)
ok &= check("f16 mid512", D(s_q=64, s_kv=4096, h_q=64, d_qk=512, topk=512, with_topk_length=True, device="cuda"), dict(V_F16=True, NUM_STAGES=3))
ok &= check("mid512 plain", D(s_q=64, s_kv=4096, h_q=64, d_qk=512, topk=512, device="cuda"), invalid_fraction=0.0, edge_rows=False)

from _harness import fp8_gemm_tflops
SHAPES = [(4096, 8192, 128, 576, 2048), (4096, 32768, 128, 576, 2048), (4096, 8192, 64, 512, 512), (1024, 8192, 128, 576, 2048)]
VARIANTS = [dict(V_F16=True), dict(NUM_STAGES=2), dict(V_F16=True, NUM_STAGES=3),
            dict(V_F16=True, CONVERT=False), dict(V_F16=True, DO_PV=False),
            dict(V_F16=True, CONVERT=False, DO_PV=False), dict(V_F16=True, GATHER=False),
            dict(V_F16=True, GATHER=False, CONVERT=False, DO_PV=False),
            dict(V_F16=True, regs=(224, 56))]
if ok or os.environ.get("FORCE_SPEED"):
    results["gemm_tflops"] = fp8_gemm_tflops()
    for n, shape in enumerate(SHAPES):
        s_q, s_kv, h_q, d_qk, topk = shape
        gen = torch.Generator(device="cuda").manual_seed(7)
        a = m.random_inputs(D(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, device="cuda"), gen,
                            invalid_fraction=0.0, edge_rows=False)
        out = torch.empty((s_q, h_q, 512), dtype=torch.bfloat16, device="cuda")
        ml = torch.empty((s_q, h_q), device="cuda"); lse = torch.empty_like(ml)
        flops = 2 * s_q * h_q * topk * (d_qk + 512)
        for v in VARIANTS if n == 0 else VARIANTS[:1]:
            try:
                launch(a, out, ml, lse, **v)
                ms = triton.testing.do_bench(lambda: launch(a, out, ml, lse, **v), warmup=50, rep=300)
                row = {"shape": shape, "variant": str(v), "us": ms * 1e3, "TFLOPS": flops / ms / 1e9}
            except Exception as exc:
                row = {"shape": shape, "variant": str(v), "error": repr(exc)[:500]}
            print("SPEED", row, flush=True)
            results["speed"].append(row)
        if False:
            ms = triton.testing.do_bench(lambda: m.sparse_mla_q8kv8_prefill_fwd(**{k: a[k] for k in m.INPUTS}), warmup=20, rep=200)
            print("SPEED triton kernel", flops / ms / 1e9, flush=True)
            results["triton_TFLOPS"] = flops / ms / 1e9
        del a, out
        torch.cuda.empty_cache()
(OUT / "gluon_probe.json").write_text(json.dumps(results, indent=1, default=str))
