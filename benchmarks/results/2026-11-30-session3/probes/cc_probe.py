"""GPU: consumers-convert vs producer-convert, real work (full topk, no invalid rows)."""
import json, os, traceback
from pathlib import Path
import torch, triton
from strictops.meta import sparse_mla_prefill as contract
from strictops.ops import sparse_mla_prefill as m
from strictops.ops import _sparse_mla_gluon as ws
OUT = Path(os.environ.get("OUT", "/tmp/out")); OUT.mkdir(parents=True, exist_ok=True)
rows = []
def save(): (OUT / "cc_probe.json").write_text(json.dumps(rows, indent=1, default=str))
# correctness
for d_qk, h_q in ((576, 128), (512, 64)):
    for cc in (False, True):
        gen = torch.Generator(device="cuda").manual_seed(5)
        a = m.random_inputs(contract.Dims(s_q=64, s_kv=3000, h_q=h_q, d_qk=d_qk, topk=512, with_attn_sink=True, with_buffers=True, with_errors=True, device="cuda"), gen)
        args = [a[k] for k in ("q", "kv", "indices", "sm_scale", "q_scale", "kv_scale", "attn_sink", "topk_length")]
        ws.launch(*args, a["out"], a["max_logits"], a["lse"], a["topk_length_errors"], consumers_convert=cc)
        ok, detail = m.compare_to_reference((a["out"], a["max_logits"], a["lse"]), m.reference(**{k: a[k] for k in m.INPUTS}), m.GPU_REL_L2_BOUND, m.GPU_LOGIT_TOL)
        rows.append(dict(check=(d_qk, h_q, cc), ok=ok, detail=detail)); print("CHECK", rows[-1], flush=True)
save()
SHAPES = [(4096, 8192, 128, 576, 2048), (4096, 8192, 64, 512, 512)]
VARIANTS = [dict(), dict(num_stages=3, lag=2), dict(consumers_convert=True, consumer_regs=232, producer_regs=40),
            dict(consumers_convert=True, consumer_regs=232, producer_regs=40, num_stages=3, lag=2),
            dict(consumers_convert=True), dict(consumers_convert=True, consumer_regs=240, producer_regs=24)]
for shape in SHAPES:
    s_q, s_kv, h_q, d_qk, topk = shape
    gen = torch.Generator(device="cuda").manual_seed(7)
    a = m.random_inputs(contract.Dims(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, device="cuda"), gen, invalid_fraction=0.0, edge_rows=False)
    args = [a[k] for k in ("q", "kv", "indices", "sm_scale", "q_scale", "kv_scale", "attn_sink", "topk_length")]
    assert args[-1] is None and args[-2] is None
    o = (torch.empty((s_q, h_q, 512), dtype=torch.bfloat16, device="cuda"), torch.empty((s_q, h_q), device="cuda"), torch.empty((s_q, h_q), device="cuda"))
    flops = 2 * s_q * h_q * topk * (d_qk + 512)
    for v in VARIANTS:
        try:
            ws.launch(*args, *o, None, **v)
            ms = triton.testing.do_bench(lambda: ws.launch(*args, *o, None, **v), warmup=30, rep=300)
            rows.append(dict(shape=shape, variant=v, us=ms * 1e3, TFLOPS=flops / ms / 1e9))
        except Exception:
            rows.append(dict(shape=shape, variant=v, error=traceback.format_exc()[-600:]))
        print("SPEED", rows[-1], flush=True); save()
