"""Compile the op's _publish_kernel for sm_90 here; registers/spills and vector facts per launch."""
import re, subprocess
import triton
from triton.backends.compiler import GPUTarget
from strictops.ops import transport_pool as m
PTXAS = "/work/venv/lib/python3.11/site-packages/triton/backends/nvidia/bin/ptxas"
sig = {"pool_ptr": "*u8", "src_ptr": "*u8", "lease_ptr": "*i64", "state_ptr": "*i32",
       "memory_size": "i64", "src_nbytes": "i64", "data_start": "i64", "slot_bytes": "i64", "n_slots": "i64",
       "start_arg": "i64", "end_arg": "i64", "nbytes_arg": "i64", "slot_arg": "i64",
       "generation_arg": "i64", "ready_arg": "i64", "ack_arg": "i64"}
attrs = {(i,): [["tt.divisibility", 16]] for i in range(6)}
for block, phase, warps in [(4096, 0, 4), (16384, 1, 4), (4096, 1, 4), (16384, 1, 8), (32768, 1, 8), (16384, 2, 4)]:
    const = {"LEASE_FROM_PTR": True, "BLOCK": block, "PHASE": phase}
    src = triton.compiler.ASTSource(fn=m._publish_kernel, signature=dict(sig, **{k: "constexpr" for k in const}), constexprs=const, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": warps})
    ptx = k.asm["ptx"]; open("/tmp/t.ptx", "w").write(ptx)
    r = subprocess.run([PTXAS, "-arch=sm_90a", "-v", "/tmp/t.ptx", "-o", "/tmp/t.cubin"], capture_output=True, text=True)
    info = " ".join(l.strip() for l in r.stderr.splitlines() if "Used" in l or "spill" in l)
    print(block, phase, warps, "ld.v4", len(re.findall(r"ld\.global(?:\.[\w:]+)*\.v4\.b32", ptx)), "st.v4", len(re.findall(r"st\.global(?:\.[\w:]+)*\.v4\.b32", ptx)),
          "atoms", re.findall(r"atom\.global\.[\w.]+", ptx), info[-120:])
