"""One small call of the Gluon kernel (racecheck with a full hazard list)."""
import torch
from strictops.meta import sparse_mla_prefill as contract
from strictops.ops import sparse_mla_prefill as m
gen = torch.Generator(device="cuda").manual_seed(3)
a = m.random_inputs(contract.Dims(s_q=3, s_kv=300, h_q=128, d_qk=576, topk=256, with_attn_sink=True, with_buffers=True, with_errors=True, device="cuda"), gen)
out = m.sparse_mla_q8kv8_prefill_fwd(**a)
torch.cuda.synchronize()
ok, detail = m.compare_to_reference(out, m.reference(**{k: a[k] for k in m.INPUTS}), m.GPU_REL_L2_BOUND, m.GPU_LOGIT_TOL)
print("kernel gluon" if m.warp_specialized(a["q"]) else "kernel triton", ok, detail)
