"""GPU: sweep the Gluon kernel's tuning at the benchmark shapes (bit-checked against the default)."""
import json, os, sys, traceback
from pathlib import Path
import torch, triton
from strictops.meta import sparse_mla_prefill as contract
from strictops.ops import sparse_mla_prefill as m
from strictops.ops import _sparse_mla_gluon as ws
OUT = Path(os.environ.get("OUT", "/tmp/out")); OUT.mkdir(parents=True, exist_ok=True)
SHAPES = [(4096, 8192, 128, 576, 2048), (4096, 32768, 128, 576, 2048), (4096, 8192, 64, 512, 512), (1024, 8192, 128, 576, 2048)]
VARIANTS = [dict(), dict(consumer_regs=216, producer_regs=72), dict(consumer_regs=208, producer_regs=88),
            dict(num_stages=3, lag=1), dict(num_stages=3, lag=2), dict(num_stages=3, lag=1, consumer_regs=216, producer_regs=72),
            dict(pipeline_qk=True, num_stages=3, consumer_regs=232, producer_regs=40),
            dict(pipeline_qk=True, num_stages=3, consumer_regs=240, producer_regs=24),
            dict(pipeline_qk=True, num_stages=3, consumer_regs=224, producer_regs=56)]
rows = []
JOBS = [(0, VARIANTS[:6]), (1, VARIANTS[:2]), (2, VARIANTS[:2]), (3, VARIANTS[:2]), (0, VARIANTS[6:])]
for n, vs in JOBS:
    shape = SHAPES[n]
    s_q, s_kv, h_q, d_qk, topk = shape
    gen = torch.Generator(device="cuda").manual_seed(11)
    a = m.random_inputs(contract.Dims(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, with_attn_sink=True, device="cuda"), gen, invalid_fraction=0.05)
    args = [a[k] for k in ("q", "kv", "indices", "sm_scale", "q_scale", "kv_scale", "attn_sink", "topk_length")]
    flops = 2 * s_q * h_q * topk * (d_qk + 512)
    outs = lambda: (torch.full((s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device="cuda"), torch.full((s_q, h_q), float("nan"), device="cuda"), torch.full((s_q, h_q), float("nan"), device="cuda"))
    base = outs(); ws.launch(*args, *base, None)
    for v in vs:
        try:
            o = outs(); ws.launch(*args, *o, None, **v); torch.cuda.synchronize()
            same = all(torch.equal(x, y) for x, y in zip(o, base))
            ms = triton.testing.do_bench(lambda: ws.launch(*args, *o, None, **v), warmup=30, rep=250)
            row = dict(shape=shape, variant=v, us=ms * 1e3, TFLOPS=flops / ms / 1e9, equal_to_default=same)
        except Exception:
            row = dict(shape=shape, variant=v, error=traceback.format_exc()[-800:])
        print("SWEEP", row, flush=True); rows.append(row)
        (OUT / "ws_sweep.json").write_text(json.dumps(rows, indent=1, default=str))
    del a, args, base; torch.cuda.empty_cache()
(OUT / "ws_sweep.json").write_text(json.dumps(rows, indent=1, default=str))
