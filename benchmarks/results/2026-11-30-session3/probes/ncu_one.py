"""Launch the Gluon kernel at the first benchmark shape (for ncu)."""
import sys, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
import gluon_mla as g
from gluon_probe_launch import launch
from strictops.meta import sparse_mla_prefill as contract
from strictops.ops import sparse_mla_prefill as m
kw = eval(sys.argv[1]) if len(sys.argv) > 1 else {}
s_q, s_kv, h_q, d_qk, topk = 4096, 8192, 128, 576, 2048
gen = torch.Generator(device="cuda").manual_seed(7)
a = m.random_inputs(contract.Dims(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, device="cuda"), gen, invalid_fraction=0.0, edge_rows=False)
out = torch.empty((s_q, h_q, 512), dtype=torch.bfloat16, device="cuda")
ml = torch.empty((s_q, h_q), device="cuda"); lse = torch.empty_like(ml)
for _ in range(3):
    launch(a, out, ml, lse, **kw)
torch.cuda.synchronize()
