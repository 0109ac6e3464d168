"""GPU: A/B the Gluon kernel's schedules at the benchmark shapes; each checked against the Triton kernel."""
import json, os, sys, traceback
from pathlib import Path
import torch, triton
from strictops.meta import sparse_mla_prefill as contract
from strictops.ops import sparse_mla_prefill as m
from strictops.ops import _sparse_mla_gluon as ws
OUT = Path(os.environ.get("OUT", "/tmp/out")); OUT.mkdir(parents=True, exist_ok=True)
SHAPES = [(4096, 8192, 128, 576, 2048), (4096, 32768, 128, 576, 2048), (4096, 8192, 64, 512, 512), (1024, 8192, 128, 576, 2048)]
V = json.loads(os.environ.get("WS_VARIANTS", "null")) or [
    dict(split_s=False), dict(split_s=False, pingpong=True), dict(), dict(num_stages=3, lag=2),
    dict(consumer_regs=208, producer_regs=88), dict(consumer_regs=216, producer_regs=72)]
JOBS = [(0, V), (1, V[:3]), (2, V[:3]), (3, V[:3])]
rows = []
for n, vs in JOBS:
    shape = SHAPES[n]
    s_q, s_kv, h_q, d_qk, topk = shape
    gen = torch.Generator(device="cuda").manual_seed(11)
    a = m.random_inputs(contract.Dims(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, with_attn_sink=True, device="cuda"), gen, invalid_fraction=0.05)
    a["topk_length"] = torch.full_like(a["topk_length"], topk)  # full work: TFLOPS count every row
    args = [a[k] for k in ("q", "kv", "indices", "sm_scale", "q_scale", "kv_scale", "attn_sink", "topk_length")]
    flops = 2 * s_q * h_q * topk * (d_qk + 512)
    outs = lambda: (torch.full((s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device="cuda"), torch.full((s_q, h_q), float("nan"), device="cuda"), torch.full((s_q, h_q), float("nan"), device="cuda"))
    base = outs()
    m.KERNEL = "triton"; m.sparse_mla_q8kv8_prefill_fwd(*args[:6], attn_sink=args[6], topk_length=args[7], out=base[0], max_logits=base[1], lse=base[2]); m.KERNEL = "auto"
    torch.cuda.synchronize()
    for v in vs:
        try:
            o = outs(); ws.launch(*args, *o, None, **v); torch.cuda.synchronize()
            d = (o[0].float() - base[0].float()).norm() / base[0].float().norm()
            finite = bool(torch.isfinite(o[0].float()).all())
            lse_ok = bool(torch.allclose(o[2], base[2], rtol=1e-3, atol=1e-3, equal_nan=False))
            ml_ok = bool(torch.equal(o[1], base[1]))
            ms = triton.testing.do_bench(lambda: ws.launch(*args, *o, None, **v), warmup=30, rep=250)
            row = dict(shape=shape, variant=v, us=ms * 1e3, TFLOPS=flops / ms / 1e9, rel_l2_vs_triton=float(d), finite=finite, lse_close=lse_ok, max_logits_equal=ml_ok)
        except Exception:
            row = dict(shape=shape, variant=v, error=traceback.format_exc()[-1500:])
        print("SWEEP", row, flush=True); rows.append(row)
        (OUT / "ws_sweep2.json").write_text(json.dumps(rows, indent=1, default=str))
    del a, args, base; torch.cuda.empty_cache()
