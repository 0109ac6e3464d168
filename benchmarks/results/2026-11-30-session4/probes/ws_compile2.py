"""Compile strictops.ops._sparse_mla_gluon for sm_90 here and report ptxas facts (tuning via kwargs)."""
import re, subprocess, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from strictops.ops import _sparse_mla_gluon as w
PTXAS = "/work/venv/lib/python3.11/site-packages/triton/backends/nvidia/bin/ptxas"
sig = {"q_ptr": "*fp8e4nv", "kv_ptr": "*fp8e4nv", "indices_ptr": "*i32", "q_scale_ptr": "*fp32",
       "kv_scale_ptr": "*fp32", "attn_sink_ptr": "*fp32", "topk_length_ptr": "*i32",
       "errors_ptr": "*i32", "out_ptr": "*bf16", "max_logits_ptr": "*fp32", "lse_ptr": "*fp32",
       "sm_scale": "fp32", "s_kv": "i32", "h_q": "i32", "topk": "i32"}
def compile(d_qk=576, flags=True, **tuning):
    const = w.constexprs(d_qk, flags, flags, flags, **tuning)
    s = dict(sig, **{k: "constexpr" for k in const})
    src = gluon._runtime.GluonASTSource(fn=w.sparse_mla_ws_kernel, signature=s, constexprs=const,
        attrs={(i,): [["tt.divisibility", 16]] for i in range(11)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 4, "maxnreg": (w.TUNING | tuning)["max_regs"]})
    ptx = k.asm["ptx"]
    open("/tmp/ws.ptx", "w").write(ptx)
    r = subprocess.run([PTXAS, "-arch=sm_90a", "-v", "/tmp/ws.ptx", "-o", "/tmp/ws.cubin"], capture_output=True, text=True)
    info = " ".join(l.strip() for l in r.stderr.splitlines() if "spill" in l or "Used" in l)
    mm = {p: len(re.findall(p, ptx)) for p in ["wgmma.mma_async.*e4m3", "wgmma.mma_async.*f16.f16", "mma.sync"]}
    shapes = sorted(set(re.findall(r"wgmma.mma_async.sync.aligned.(m\d+n\d+k\d+)", ptx)))
    print(f"d_qk={d_qk} {tuning}: smem {k.metadata.shared} {mm} {shapes} {info}", flush=True)
    return k
if __name__ == "__main__":
    import ast
    for arg in sys.argv[1:] or ["{}"]:
        kw = ast.literal_eval(arg)
        try:
            compile(**kw)
        except Exception as e:
            print(kw, "FAILED", str(e)[-3000:])
