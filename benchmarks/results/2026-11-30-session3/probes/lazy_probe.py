"""GPU: lazy rescale (correctness incl. wide logits, and speed at the 4 shapes)."""
import json, os, traceback
from pathlib import Path
import torch, triton
from strictops.meta import sparse_mla_prefill as contract
from strictops.ops import sparse_mla_prefill as m
from strictops.ops import _sparse_mla_gluon as ws
OUT = Path(os.environ.get("OUT", "/tmp/out")); OUT.mkdir(parents=True, exist_ok=True)
rows = []
def save(): (OUT / "lazy_probe.json").write_text(json.dumps(rows, indent=1, default=str))
KEYS = ("q", "kv", "indices", "sm_scale", "q_scale", "kv_scale", "attn_sink", "topk_length")
for d_qk, h_q, sm_scale, sink in ((576, 128, None, True), (512, 64, None, True), (576, 128, 1.0, True), (512, 64, 1.0, False), (576, 64, 3.0, False)):
    for lazy in (False, True):
        try:
            gen = torch.Generator(device="cuda").manual_seed(5)
            a = m.random_inputs(contract.Dims(s_q=64, s_kv=3000, h_q=h_q, d_qk=d_qk, topk=512, with_attn_sink=sink, with_buffers=True, with_errors=sink, device="cuda"), gen)
            if sm_scale is not None:
                a["sm_scale"] = sm_scale
            ws.launch(*[a[k] for k in KEYS], a["out"], a["max_logits"], a["lse"], a["topk_length_errors"], lazy_rescale=lazy)
            exp = m.reference(**{k: a[k] for k in m.INPUTS})
            ok, detail = m.compare_to_reference((a["out"], a["max_logits"], a["lse"]), exp, m.GPU_REL_L2_BOUND, m.GPU_LOGIT_TOL)
            fin = exp[1].isfinite()
            rows.append(dict(check=(d_qk, h_q, sm_scale, sink, lazy), ok=ok, detail=detail, logit_spread=float((exp[1][fin] - exp[2][fin]).abs().mean())))
        except Exception:
            rows.append(dict(check=(d_qk, h_q, sm_scale, sink, lazy), ok=False, detail=traceback.format_exc()[-800:]))
        print("CHECK", rows[-1], flush=True); save()
SHAPES = [(4096, 8192, 128, 576, 2048), (4096, 32768, 128, 576, 2048), (4096, 8192, 64, 512, 512), (1024, 8192, 128, 576, 2048)]
V0 = [dict(), dict(lazy_rescale=True), dict(lazy_rescale=True, consumer_regs=232, producer_regs=40), dict(lazy_rescale=True, num_stages=3, lag=2)]
for n, shape in enumerate(SHAPES):
    s_q, s_kv, h_q, d_qk, topk = shape
    gen = torch.Generator(device="cuda").manual_seed(7)
    a = m.random_inputs(contract.Dims(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, device="cuda"), gen, invalid_fraction=0.0, edge_rows=False)
    args = [a[k] for k in KEYS]
    o = (torch.empty((s_q, h_q, 512), dtype=torch.bfloat16, device="cuda"), torch.empty((s_q, h_q), device="cuda"), torch.empty((s_q, h_q), device="cuda"))
    flops = 2 * s_q * h_q * topk * (d_qk + 512)
    for v in (V0 if n == 0 else V0[:2]):
        try:
            ws.launch(*args, *o, None, **v)
            ms = triton.testing.do_bench(lambda: ws.launch(*args, *o, None, **v), warmup=25, rep=200)
            rows.append(dict(shape=shape, variant=v, us=ms * 1e3, TFLOPS=flops / ms / 1e9))
        except Exception:
            rows.append(dict(shape=shape, variant=v, error=traceback.format_exc()[-600:]))
        print("SPEED", rows[-1], flush=True); save()
    del a, args, o; torch.cuda.empty_cache()
