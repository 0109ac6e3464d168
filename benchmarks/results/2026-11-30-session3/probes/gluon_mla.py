"""Draft: warp-specialised Gluon sparse MLA kernel (compile for sm_90 locally)."""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier, fence_async_shared, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.language.nvidia.ampere import async_copy

BLOCK_H = 64
BLOCK_N = 64
D_V = 512
HALF_V = 256


@gluon.jit
def _producer(kv_ptr, indices_ptr, token, n_rows, s_kv, topk,
              k_nope, k_rope, v_bf16, k_ready, k_free, v_ready, v_free,
              D_QK: gl.constexpr, NUM_STAGES: gl.constexpr, NUM_V: gl.constexpr,
              CONVERT: gl.constexpr, GATHER: gl.constexpr):
    D_ROPE: gl.constexpr = D_QK - 512
    BN: gl.constexpr = 64
    gl.static_assert(NUM_STAGES >= 2, "the producer converts step i - 1 after issuing step i")
    nope_layout: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [4, 1], [1, 0])
    rope_layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    conv_layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    cols = gl.arange(0, 512, gl.SliceLayout(0, nope_layout))
    rows_n = gl.arange(0, BN, gl.SliceLayout(1, nope_layout))
    rope_cols = gl.arange(0, 64, gl.SliceLayout(0, rope_layout))
    rows_r = gl.arange(0, BN, gl.SliceLayout(1, rope_layout))
    index_row = indices_ptr + token * topk
    n_steps = gl.cdiv(n_rows, BN)
    for i in range(n_steps + 1):
        if i < n_steps:
            s = i % NUM_STAGES
            mbarrier.wait(k_free.index(s), ((i // NUM_STAGES) & 1) ^ 1)
            j = i * BN + rows_n
            idx = gl.load(index_row + j, mask=j < n_rows, other=-1)
            valid = (idx >= 0) & (idx < s_kv)
            base = kv_ptr + gl.where(valid, idx, 0).to(gl.int64) * D_QK
            if GATHER:
                async_copy.async_copy_global_to_shared(
                    k_nope.index(s), gl.expand_dims(base, 1) + gl.expand_dims(cols, 0),
                    mask=gl.expand_dims(valid, 1))
            if D_ROPE > 0 and GATHER:
                jr = i * BN + rows_r
                idx_r = gl.load(index_row + jr, mask=jr < n_rows, other=-1)
                valid_r = (idx_r >= 0) & (idx_r < s_kv)
                base_r = kv_ptr + gl.where(valid_r, idx_r, 0).to(gl.int64) * D_QK + 512
                async_copy.async_copy_global_to_shared(
                    k_rope.index(s), gl.expand_dims(base_r, 1) + gl.expand_dims(rope_cols, 0),
                    mask=gl.expand_dims(valid_r, 1))
            async_copy.commit_group()
        if i > 0:
            p = i - 1
            s = p % NUM_STAGES
            if i < n_steps:
                async_copy.wait_group(1)
            else:
                async_copy.wait_group(0)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(k_ready.index(s))
            v = p % NUM_V
            mbarrier.wait(v_free.index(v), ((p // NUM_V) & 1) ^ 1)
            if CONVERT:
                for h in gl.static_range(2):
                    for c in gl.static_range(4):
                        x = k_nope.index(s).slice(h * 256 + c * 64, 64, dim=1).load(conv_layout)
                        v_bf16.index(v * 2 + h).slice(c * 64, 64, dim=1).store(
                            x.to(v_bf16.dtype))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(v_ready.index(v))


@gluon.jit
def _consumer(half, indices_ptr, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr,
              token, head0, h_q, n_rows, s_kv, topk, scale, kv_scale,
              q_nope, q_rope, k_nope, k_rope, v_bf16, q_ready, k_ready, k_free, v_ready, v_free,
              D_QK: gl.constexpr, HAS_ATTN_SINK: gl.constexpr,
              NUM_STAGES: gl.constexpr, NUM_V: gl.constexpr, DO_PV: gl.constexpr):
    D_ROPE: gl.constexpr = D_QK - 512
    BN: gl.constexpr = 64
    LOG2E: gl.constexpr = 1.4426950408889634
    s_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], [16, 64, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], [16, 256, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(0, o_layout, 2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    orow_layout: gl.constexpr = gl.SliceLayout(1, o_layout)

    m_i = gl.full([64], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([64], gl.float32, row_layout)
    acc = gl.zeros([64, 256], gl.float32, o_layout)
    s_zero = gl.zeros([64, 64], gl.float32, s_layout)
    cols = gl.arange(0, BN, col_layout)
    index_row = indices_ptr + token * topk
    n_steps = gl.cdiv(n_rows, BN)
    mbarrier.wait(q_ready, 0)
    for i in range(n_steps):
        s = i % NUM_STAGES
        mbarrier.wait(k_ready.index(s), (i // NUM_STAGES) & 1)
        st = warpgroup_mma(q_nope, k_nope.index(s).permute((1, 0)), s_zero, use_acc=False,
                           is_async=True)
        if D_ROPE > 0:
            st = warpgroup_mma(q_rope, k_rope.index(s).permute((1, 0)), st, is_async=True)
        j = i * BN + cols
        idx = gl.load(index_row + j, mask=j < n_rows, other=-1)
        valid = (idx >= 0) & (idx < s_kv)
        sc, _, _ = warpgroup_mma_wait(0, deps=(st, k_nope.index(s), k_rope.index(s)))
        mbarrier.arrive(k_free.index(s))
        sc = gl.where(gl.expand_dims(valid, 0), sc * scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sc, 1))
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2((m_i - m_ref) * LOG2E)
        pr = gl.exp2((sc - gl.expand_dims(m_ref, 1)) * LOG2E)
        l_i = l_i * alpha + gl.sum(pr, 1)
        m_i = m_new
        p = gl.convert_layout(pr.to(v_bf16.dtype), p_layout)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, orow_layout), 1)
        v = i % NUM_V
        vb = v_bf16.index(v * 2 + half)
        mbarrier.wait(v_ready.index(v), (i // NUM_V) & 1)
        if DO_PV:
            acc = warpgroup_mma(p, vb, acc, is_async=True)
            acc, _ = warpgroup_mma_wait(0, deps=(acc, vb))
        mbarrier.arrive(v_free.index(v))

    seen = l_i > 0
    l_safe = gl.where(seen, l_i, 1.0)
    lse = gl.where(seen, m_i + gl.log(l_safe), float("inf"))
    weight = gl.where(seen, kv_scale / l_safe, 0.0)
    heads = head0 + gl.arange(0, 64, row_layout)
    if HAS_ATTN_SINK:
        sink = gl.load(attn_sink_ptr + heads)
        weight = weight / (1.0 + gl.exp(sink - lse))
    row_of_head = token * h_q + heads
    if half == 0:
        gl.store(max_logits_ptr + row_of_head, m_i)
        gl.store(lse_ptr + row_of_head, lse)
    o = acc * gl.expand_dims(gl.convert_layout(weight, orow_layout), 1)
    orow = gl.convert_layout(row_of_head, orow_layout)
    ocols = half * 256 + gl.arange(0, 256, gl.SliceLayout(0, o_layout))
    gl.store(out_ptr + gl.expand_dims(orow, 1) * 512 + gl.expand_dims(ocols, 0),
             o.to(gl.bfloat16))


@gluon.jit
def _consumer_worker(indices_ptr, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr,
                     token, head0, h_q, n_rows, s_kv, topk, scale, kv_scale,
                     q_nope, q_rope, k_nope, k_rope, v_bf16, q_ready, k_ready, k_free, v_ready,
                     v_free, D_QK: gl.constexpr, HAS_ATTN_SINK: gl.constexpr,
                     NUM_STAGES: gl.constexpr, NUM_V: gl.constexpr, DO_PV: gl.constexpr):
    _consumer(1, indices_ptr, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr,
              token, head0, h_q, n_rows, s_kv, topk, scale, kv_scale,
              q_nope, q_rope, k_nope, k_rope, v_bf16, q_ready, k_ready, k_free, v_ready, v_free,
              D_QK, HAS_ATTN_SINK, NUM_STAGES, NUM_V, DO_PV)


@gluon.jit
def sparse_mla_ws_kernel(
    q_ptr, kv_ptr, indices_ptr, q_scale_ptr, kv_scale_ptr, attn_sink_ptr, topk_length_ptr,
    errors_ptr, out_ptr, max_logits_ptr, lse_ptr, sm_scale, s_kv, h_q, topk,
    D_QK: gl.constexpr, HAS_TOPK_LENGTH: gl.constexpr, HAS_ATTN_SINK: gl.constexpr,
    HAS_ERRORS: gl.constexpr, NUM_STAGES: gl.constexpr, NUM_V: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
    V_F16: gl.constexpr = False, CONVERT: gl.constexpr = True, DO_PV: gl.constexpr = True,
    GATHER: gl.constexpr = True,
):
    D_ROPE: gl.constexpr = D_QK - 512
    head_blocks = h_q // 64
    pid = gl.program_id(0)
    token = (pid // head_blocks).to(gl.int64)
    head_block = pid % head_blocks
    head0 = head_block * 64

    fp8_layout: gl.constexpr = gl.NVMMASharedLayout(128, 8)
    rope_smem_layout: gl.constexpr = gl.NVMMASharedLayout(64, 8)
    v_layout: gl.constexpr = gl.NVMMASharedLayout(128, 16)
    v_dtype: gl.constexpr = gl.float16 if V_F16 else gl.bfloat16
    q_nope = gl.allocate_shared_memory(gl.float8e4nv, [64, 512], fp8_layout)
    q_rope = gl.allocate_shared_memory(gl.float8e4nv, [64, 64], rope_smem_layout)
    k_nope = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, 64, 512], fp8_layout)
    k_rope = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, 64, 64], rope_smem_layout)
    v_bf16 = gl.allocate_shared_memory(v_dtype, [NUM_V * 2, 64, 256], v_layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_ready = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    k_free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_V, 1], bar_layout)
    v_free = gl.allocate_shared_memory(gl.int64, [NUM_V, 1], bar_layout)
    mbarrier.init(q_ready, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=2)
    for i in gl.static_range(NUM_V):
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_free.index(i), count=2)

    kv_scale = gl.load(kv_scale_ptr)
    scale = (sm_scale * gl.load(q_scale_ptr) * kv_scale).to(gl.float32)
    n_rows = topk
    if HAS_TOPK_LENGTH:
        requested = gl.load(topk_length_ptr + token)
        n_rows = gl.maximum(gl.minimum(requested, topk), 0)
        if HAS_ERRORS:
            out_of_range = (requested < 0) | (requested > topk)
            gl.atomic_add(errors_ptr, 1, mask=out_of_range & (head_block == 0))

    # Q into shared memory (generic stores, then a proxy fence for wgmma).
    q_load_layout: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [4, 1], [1, 0])
    q_rows = (token * h_q + head0 + gl.arange(0, 64, gl.SliceLayout(1, q_load_layout))) * D_QK
    q_cols = gl.arange(0, 512, gl.SliceLayout(0, q_load_layout))
    q_nope.store(gl.load(q_ptr + gl.expand_dims(q_rows, 1) + gl.expand_dims(q_cols, 0)))
    if D_ROPE > 0:
        rope_load_layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
        r_rows = (token * h_q + head0 + gl.arange(0, 64, gl.SliceLayout(1, rope_load_layout))) * D_QK
        r_cols = 512 + gl.arange(0, 64, gl.SliceLayout(0, rope_load_layout))
        q_rope.store(gl.load(q_ptr + gl.expand_dims(r_rows, 1) + gl.expand_dims(r_cols, 0)))
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(q_ready)

    gl.warp_specialize([
        (_consumer, (0, indices_ptr, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr,
                     token, head0, h_q, n_rows, s_kv, topk, scale, kv_scale,
                     q_nope, q_rope, k_nope, k_rope, v_bf16, q_ready, k_ready, k_free, v_ready,
                     v_free, D_QK, HAS_ATTN_SINK, NUM_STAGES, NUM_V, DO_PV)),
        (_consumer_worker, (indices_ptr, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr,
                            token, head0, h_q, n_rows, s_kv, topk, scale, kv_scale,
                            q_nope, q_rope, k_nope, k_rope, v_bf16, q_ready, k_ready, k_free,
                            v_ready, v_free, D_QK, HAS_ATTN_SINK, NUM_STAGES, NUM_V, DO_PV)),
        (_producer, (kv_ptr, indices_ptr, token, n_rows, s_kv, topk, k_nope, k_rope, v_bf16,
                     k_ready, k_free, v_ready, v_free, D_QK, NUM_STAGES, NUM_V, CONVERT, GATHER)),
    ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])


if __name__ == "__main__":
    import re, sys, time
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    d_qk = int(sys.argv[1]) if len(sys.argv) > 1 else 576
    sig = {"q_ptr": "*fp8e4nv", "kv_ptr": "*fp8e4nv", "indices_ptr": "*i32", "q_scale_ptr": "*fp32",
           "kv_scale_ptr": "*fp32", "attn_sink_ptr": "*fp32", "topk_length_ptr": "*i32",
           "errors_ptr": "*i32", "out_ptr": "*bf16", "max_logits_ptr": "*fp32", "lse_ptr": "*fp32",
           "sm_scale": "fp32", "s_kv": "i32", "h_q": "i32", "topk": "i32",
           "D_QK": "constexpr", "HAS_TOPK_LENGTH": "constexpr", "HAS_ATTN_SINK": "constexpr",
           "HAS_ERRORS": "constexpr", "NUM_STAGES": "constexpr", "NUM_V": "constexpr",
           "CONSUMER_REGS": "constexpr", "PRODUCER_REGS": "constexpr", "V_F16": "constexpr",
           "CONVERT": "constexpr", "DO_PV": "constexpr", "GATHER": "constexpr"}
    const = {"D_QK": d_qk, "HAS_TOPK_LENGTH": True, "HAS_ATTN_SINK": True, "HAS_ERRORS": True,
             "NUM_STAGES": 2, "NUM_V": 1, "CONSUMER_REGS": 232, "PRODUCER_REGS": 40,
             "V_F16": len(sys.argv) > 2, "CONVERT": True, "DO_PV": True, "GATHER": True}
    t = time.time()
    src = gluon._runtime.GluonASTSource(fn=sparse_mla_ws_kernel, signature=sig, constexprs=const,
        attrs={(i,): [["tt.divisibility", 16]] for i in range(11)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 64),
                       options={"num_warps": 4, "maxnreg": 168})
    print("compiled in", time.time() - t)
    ptx = k.asm["ptx"]
    open("/tmp/gluon_mla.ptx", "w").write(ptx)
    open("/tmp/gluon_mla.ttgir", "w").write(k.asm["ttgir"])
    print("shared", k.metadata.shared, "regs?", getattr(k, "n_regs", None))
    for pat in ["wgmma.mma_async", "cp.async", "setmaxnreg", "mbarrier", "mma.sync", "bar.sync", "ld.shared", "st.shared"]:
        print(pat, len(re.findall(re.escape(pat), ptx)))
