"""Probe-only: a persistent grid-stride copy kernel (whole blocks, warps independent, one block
loaded ahead, moved as int32 words so that no byte unpacking waits on the load)."""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents


@triton.jit
def persist_copy(pool_ptr, src_ptr, lease_ptr, n_blocks, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0).to(tl.int64)
    programs = tl.num_programs(0).to(tl.int64)
    WORDS: tl.constexpr = BLOCK // 4
    offs = tl.arange(0, WORDS)
    src = src_ptr.to(tl.pointer_type(tl.int32))
    b = pid
    data = tl.load(src + b * WORDS + offs, mask=b < n_blocks)
    start = tl.load(lease_ptr)
    dst = (pool_ptr + (start // 256) * 256).to(tl.pointer_type(tl.int32))
    iters = (n_blocks - pid + programs - 1) // programs
    for _ in range(iters):
        nb = b + programs
        nxt = tl.load(src + nb * WORDS + offs, mask=nb < n_blocks)
        tl.store(dst + b * WORDS + offs, data)
        data = nxt
        b = nb
