"""The shared-S warp-specialised sm_90 kernel of sparse MLA prefill, in Gluon
(``triton.experimental``), and the pieces both Gluon kernels share (:func:`launch_kernel`,
:func:`rows_to_attend`, :func:`store_q`, :func:`tuned`) or the block-pair kernel takes from
here (:func:`copy_q`, :func:`stagger_start`, :func:`tile_of`, :func:`wait_for_prior_grid`).

Not the op's default on sm_90 (``strictops.ops.sparse_mla.sm90`` selects; the block-pair
kernel of ``gluon_block_pair`` runs by default): this kernel runs P·V in fp16, with about
2.6x lower ``out`` error than the block-pair kernel's FP8 P·V at about 0.6x its speed on the
H200. It computes what the op's other kernels compute (see ``strictops.ops.sparse_mla.prefill``)
from the same validated arguments. Importing this module needs Gluon's Hopper API (Triton 3.6 to
3.9, the names that differ taken from :mod:`strictops.ops._runtime.gluon_compat`;
``ImportError`` otherwise). Why this design, with what was measured and rejected:
docs/design/sparse_mla_prefill.md#gluon-kernel-sm_90

Grid ``(s_q * h_q // 64,)``: CTA ``pid`` computes token ``pid // (h_q // 64)`` for 64 heads,
with three warpgroups (12 warps), one CTA per SM (181 KiB of shared memory at ``d_qk = 576``):

- a producer gathers the 64 selected KV rows of step ``i`` straight into stage
  ``i % NUM_STAGES`` of shared memory with ``cp.async`` (16-byte copies; an invalid index
  copies nothing and zero-fills its row, which is never read), then, ``LAG`` steps later,
  converts that block's V part (its first 512 columns) from FP8 to fp16 for P·V, one half per
  consumer;
- two consumers share one S = Q·Kᵀ of each 64-row block: consumer ``h`` computes the FP8
  product (``wgmma``, fp32 accumulation) and the softmax for rows ``[32h, 32h + 32)``; they
  exchange their row maxima through shared memory, each writes its half of P (fp16), and each
  runs P·V over all 64 rows in fp16 (``wgmma``) for its output columns ``[256h, 256h + 256)``.
  Each keeps the row sums of its own rows; they are added at the end. Consumer 0 writes
  ``max_logits`` and ``lse``.

Synchronisation, by mbarriers in shared memory (phase = use count & 1):

- ``q_ready`` (count 1): Q, stored by the launching warpgroup before ``warp_specialize``.
- ``k_ready[s]`` (count 1) / ``k_free[s]`` (count 2, both consumers): stage ``s`` of the
  gathered blocks, published once the producer's copies have landed (after a proxy fence).
- ``v_ready[h]`` / ``v_free[h]`` (count 1): consumer ``h``'s half of the fp16 V block, each
  half with its own buffer so that one consumer running ahead does not hold up the other.
- ``x_bar`` (count 2): the row maxima of each block, and the row sums at the end, exchanged
  through ``x_f32``; ``p_bar`` (count 2): both halves of P are in ``p_f16``.

Registers move from the producer to the consumers with ``setmaxnreg`` (``TUNING``).

The launch path the op takes on sm_90 (eager and traced) is in ``strictops.ops.sparse_mla.sm90``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from strictops.ops._runtime.gluon_compat import async_load, thread_barrier

__all__ = ["TUNING", "constexprs", "launch", "sparse_mla_ws_kernel"]

# 64 heads a CTA, 64 gathered rows a step, 512 latent (V) columns; each consumer owns 256.
BLOCK_H = 64
BLOCK_N = 64
D_V = 512
# Stages of gathered blocks (3 win at d_qk = 576, lose at 512), the producer's lag before it
# publishes a block, and setmaxnreg registers (2 * 128 * consumer + 128 * producer <= 12 * 32 *
# max_regs). Measured on the H200: docs/design/sparse_mla_prefill.md#tuning
TUNING = {"num_stages": 2, "lag": 1, "consumer_regs": 224, "producer_regs": 56, "max_regs": 168}

_BLOCK_H = gl.constexpr(BLOCK_H)
_BLOCK_N = gl.constexpr(BLOCK_N)
_D_V = gl.constexpr(D_V)


@gluon.jit
def rows_to_attend(topk_length_ptr, errors_ptr, token, topk, head_block,
                   HAS_TOPK_LENGTH: gl.constexpr, HAS_ERRORS: gl.constexpr):
    """How many of the token's ``topk`` selected rows it attends to: its ``topk_length``
    clamped to ``[0, topk]`` (``HAS_TOPK_LENGTH``), else ``topk``. With ``HAS_ERRORS``, head
    block 0 adds 1 to ``errors_ptr[0]`` when the value was out of range."""
    n_rows = topk
    if HAS_TOPK_LENGTH:
        requested = gl.load(topk_length_ptr + token)
        n_rows = gl.maximum(gl.minimum(requested, topk), 0)
        if HAS_ERRORS:
            out_of_range = (requested < 0) | (requested > topk)
            gl.atomic_add(errors_ptr, 1, mask=out_of_range & (head_block == 0))
    return n_rows


@gluon.jit
def store_q(q_ptr, q_nope, q_rope, token, h_q, head0, D_QK: gl.constexpr):
    """Rows ``[head0, head0 + 64)`` of token ``token`` of q (``[s_q, h_q, D_QK]`` FP8) into
    shared memory: columns ``[0, 512)`` into ``q_nope``, the rope part into ``q_rope``. In
    four column chunks, so that few registers are live before ``warp_specialize`` hands them
    out. The caller fences (generic stores, then ``wgmma`` reads) and publishes."""
    q_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    q_rows = token * h_q + head0 + gl.arange(0, _BLOCK_H, gl.SliceLayout(1, q_layout))
    q_cols = gl.arange(0, 128, gl.SliceLayout(0, q_layout))
    for c in gl.static_range(4):
        q_nope.slice(c * 128, 128, dim=1).store(
            gl.load(q_ptr + gl.expand_dims(q_rows * D_QK, 1)
                    + gl.expand_dims(c * 128 + q_cols, 0)))
    if D_QK > 512:
        rope_layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
        r_rows = token * h_q + head0 + gl.arange(0, _BLOCK_H, gl.SliceLayout(1, rope_layout))
        r_cols = 512 + gl.arange(0, 64, gl.SliceLayout(0, rope_layout))
        q_rope.store(gl.load(q_ptr + gl.expand_dims(r_rows * D_QK, 1)
                             + gl.expand_dims(r_cols, 0)))


@gluon.jit
def copy_q(q_ptr, q_nope, q_rope, token, h_q, head0, q_bar, ROW0: gl.constexpr,
           ROWS: gl.constexpr, D_QK: gl.constexpr):
    """Start the copy of rows ``[ROW0, ROW0 + ROWS)`` of a tile's 64 heads of Q (token
    ``token``, heads from ``head0``) into shared memory by ``cp.async``; each thread arrives at
    ``q_bar`` once its copies have landed. A Q·Kᵀ waits for ``q_bar``, and its proxy fence
    orders the copies before its reads."""
    nope_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    rope_layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    rows = token * h_q + head0 + ROW0 + gl.arange(0, ROWS, gl.SliceLayout(1, nope_layout))
    cols = gl.arange(0, 512, gl.SliceLayout(0, nope_layout))
    async_load(
        q_nope.slice(ROW0, ROWS, dim=0),
        q_ptr + gl.expand_dims(rows * D_QK, 1) + gl.expand_dims(cols, 0))
    if D_QK > 512:
        rows = token * h_q + head0 + ROW0 + gl.arange(0, ROWS, gl.SliceLayout(1, rope_layout))
        cols = 512 + gl.arange(0, 64, gl.SliceLayout(0, rope_layout))
        async_load(
            q_rope.slice(ROW0, ROWS, dim=0),
            q_ptr + gl.expand_dims(rows * D_QK, 1) + gl.expand_dims(cols, 0))
    async_copy.mbarrier_arrive(q_bar, increment_count=False)


@gluon.jit
def tile_of(tile, h_q):
    """Tile ``tile``'s token (int64) and head block: 64 heads of one token, ``h_q // 64``
    tiles a token."""
    head_blocks = h_q // _BLOCK_H
    return (tile // head_blocks).to(gl.int64), tile % head_blocks


@gluon.jit
def stagger_start(pid, n_tiles, topk_length_ptr, h_q, topk, HAS_TOPK_LENGTH: gl.constexpr,
                  GROUPS: gl.constexpr):
    """For persistent CTAs (CTA ``pid`` computes tiles ``pid``, ``pid + num_programs``, ...
    below ``n_tiles``): one that computes a tile fewer than the busiest starts late, by
    ``(pid % GROUPS) / GROUPS`` of its first tile's estimated time (3 µs a pair of 64-row
    blocks and 3 µs more, from that tile's rows; ``nanosleep``, at most 1 ms), so that the
    CTAs' epilogues, 64 KiB of O each, do not all reach DRAM at once. It still ends before the
    busiest CTA where its tiles are alike. The busiest CTAs, and every CTA where all compute
    as many tiles, start at once."""
    grid = gl.num_programs(0)
    if gl.cdiv(n_tiles - pid, grid) < gl.cdiv(n_tiles, grid):
        token, _ = tile_of(pid, h_q)
        rows = rows_to_attend(topk_length_ptr, topk_length_ptr, token, topk, 0,
                              HAS_TOPK_LENGTH, False)
        tile_ns = gl.maximum(gl.cdiv(rows, 128), 1) * 3000 + 3000
        delay = gl.minimum((pid % GROUPS) * tile_ns // GROUPS, 1000000)
        gl.inline_asm_elementwise("nanosleep.u32 $1;\n\tmov.u32 $0, 0;", "=r,r", [delay],
                                  dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def wait_for_prior_grid():
    """``griddepcontrol.wait``: block until the grid this one depends on (the stream's
    previous kernel, where this one is launched as a programmatic dependent) has completed and
    its memory is visible; then ``griddepcontrol.launch_dependents``: the next such grid may
    start its CTAs as this one's leave the SMs."""
    gl.inline_asm_elementwise("griddepcontrol.wait; griddepcontrol.launch_dependents; // $0",
                              "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _producer(kv_ptr, indices_ptr, token, n_rows, s_kv, topk,
              k_nope, k_rope, v_f16, k_ready, k_free, v_ready, v_free,
              D_QK: gl.constexpr, NUM_STAGES: gl.constexpr, LAG: gl.constexpr):
    """Gather step ``i``'s rows into stage ``i % NUM_STAGES``; ``LAG`` steps later, when
    those copies have landed, publish the stage and convert its V part to fp16."""
    D_ROPE: gl.constexpr = D_QK - 512
    gl.static_assert(NUM_STAGES > LAG, "a stage is refilled only after it was converted")
    # 16 bytes (one cp.async) per thread and row segment; a warp covers 512 contiguous
    # bytes of one row (latent part) or 4 bytes x 16 of eight rows (rope part).
    nope_layout: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [4, 1], [1, 0])
    rope_layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    conv_layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    cols = gl.arange(0, 512, gl.SliceLayout(0, nope_layout))
    rows = gl.arange(0, _BLOCK_N, gl.SliceLayout(1, nope_layout))
    rope_cols = gl.arange(0, 64, gl.SliceLayout(0, rope_layout))
    rope_rows = gl.arange(0, _BLOCK_N, gl.SliceLayout(1, rope_layout))
    index_row = indices_ptr + token * topk
    n_steps = gl.cdiv(n_rows, _BLOCK_N)
    for i in range(n_steps + LAG):
        if i < n_steps:
            s = i % NUM_STAGES
            mbarrier.wait(k_free.index(s), ((i // NUM_STAGES) & 1) ^ 1)
            # Invalid indices and rows past n_rows copy nothing: cp.async with a false
            # mask reads no byte and writes zeros (a zero row keeps 0 * V finite).
            j = i * _BLOCK_N + rows
            idx = gl.load(index_row + j, mask=j < n_rows, other=-1)
            valid = (idx >= 0) & (idx < s_kv)
            row_ptr = kv_ptr + gl.where(valid, idx, 0).to(gl.int64) * D_QK
            async_load(
                k_nope.index(s), gl.expand_dims(row_ptr, 1) + gl.expand_dims(cols, 0),
                mask=gl.expand_dims(valid, 1))
            if D_ROPE > 0:
                j = i * _BLOCK_N + rope_rows
                idx = gl.load(index_row + j, mask=j < n_rows, other=-1)
                valid = (idx >= 0) & (idx < s_kv)
                row_ptr = kv_ptr + gl.where(valid, idx, 0).to(gl.int64) * D_QK + 512
                async_load(
                    k_rope.index(s),
                    gl.expand_dims(row_ptr, 1) + gl.expand_dims(rope_cols, 0),
                    mask=gl.expand_dims(valid, 1))
            async_copy.commit_group()
        if i >= LAG:
            p = i - LAG
            s = p % NUM_STAGES
            if i < n_steps:
                async_copy.wait_group(LAG)  # this thread's copies of step p have landed
            else:
                async_copy.wait_group(0)
            # cp.async writes through the generic proxy, wgmma reads through the async
            # one: fence, then make every producer thread's copies visible to the arrive.
            fence_async_shared()
            thread_barrier()
            mbarrier.arrive(k_ready.index(s))
            # Each half has its own buffer and barriers, so one consumer running ahead is
            # not held up by the other.
            for h in gl.static_range(2):
                mbarrier.wait(v_free.index(h), (p & 1) ^ 1)
                for c in gl.static_range(4):
                    x = k_nope.index(s).slice(h * 256 + c * 64, 64, dim=1).load(conv_layout)
                    v_f16.index(h).slice(c * 64, 64, dim=1).store(x.to(gl.float16))
                fence_async_shared()
                thread_barrier()
                mbarrier.arrive(v_ready.index(h))

@gluon.jit
def _consumer(half, indices_ptr, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr,
              token, head0, h_q, n_rows, s_kv, topk, scale, kv_scale,
              q_nope, q_rope, k_nope, k_rope, v_f16, p_f16, x_f32, q_ready, k_ready,
              k_free, v_ready, v_free, x_bar, p_bar, D_QK: gl.constexpr,
              HAS_ATTN_SINK: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Attention of 64 heads over the gathered blocks, output columns
    ``[half * 256, half * 256 + 256)``; S and the softmax for rows
    ``[half * 32, half * 32 + 32)`` of each block. The ``half == 0`` consumer also writes
    ``max_logits`` and ``lse``.

    Per block: S of this consumer's rows (FP8 ``wgmma``); the row maxima exchanged through
    ``x_f32`` (``x_bar``); this half of P written to ``p_f16`` (``p_bar``); P·V over all
    64 rows from both halves of P. Buffer reuse: the other consumer reads this
    consumer's slot of ``x_f32`` before it arrives at ``p_bar``, and finishes its P·V of
    a block before it arrives at ``x_bar`` of the next one, so a slot is rewritten only
    once the barrier that follows its last read has been passed.
    """
    D_ROPE: gl.constexpr = D_QK - 512
    HALF_N: gl.constexpr = _BLOCK_N // 2
    LOG2E: gl.constexpr = 1.4426950408889634
    s_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], [16, HALF_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], [16, 256, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    orow_layout: gl.constexpr = gl.SliceLayout(1, o_layout)

    m_i = gl.full([_BLOCK_H], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([_BLOCK_H], gl.float32, row_layout)  # over this consumer's rows
    acc = gl.zeros([_BLOCK_H, 256], gl.float32, o_layout)
    s_zero = gl.zeros([_BLOCK_H, HALF_N], gl.float32, s_layout)
    cols = half * HALF_N + gl.arange(0, HALF_N, gl.SliceLayout(0, s_layout))
    index_row = indices_ptr + token * topk
    n_steps = gl.cdiv(n_rows, _BLOCK_N)
    v_half = v_f16.index(half)
    mine = x_f32.index(half)
    theirs = x_f32.index(1 - half)
    mbarrier.wait(q_ready, 0)
    for i in range(n_steps):
        s = i % NUM_STAGES
        mbarrier.wait(k_ready.index(s), (i // NUM_STAGES) & 1)
        k_rows = k_nope.index(s).slice(half * HALF_N, HALF_N, dim=0)
        st = warpgroup_mma(q_nope, k_rows.permute((1, 0)), s_zero, use_acc=False,
                           is_async=True)
        if D_ROPE > 0:
            r_rows = k_rope.index(s).slice(half * HALF_N, HALF_N, dim=0)
            st = warpgroup_mma(q_rope, r_rows.permute((1, 0)), st, is_async=True)
        j = i * _BLOCK_N + cols  # the index loads overlap the MMA
        idx = gl.load(index_row + j, mask=j < n_rows, other=-1)
        valid = (idx >= 0) & (idx < s_kv)
        sc = warpgroup_mma_wait(0, deps=(st, ))
        mbarrier.arrive(k_free.index(s))
        sc = gl.where(gl.expand_dims(valid, 0), sc * scale, float("-inf"))
        m_own = gl.max(sc, 1)
        mine.store(m_own)
        thread_barrier()
        mbarrier.arrive(x_bar)
        mbarrier.wait(x_bar, i & 1)
        m_new = gl.maximum(m_i, gl.maximum(m_own, theirs.load(row_layout)))
        # While every row so far was invalid the max is -inf; subtracting 0 instead keeps
        # exp(-inf - m) at 0 rather than NaN.
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2((m_i - m_ref) * LOG2E)
        pr = gl.exp2((sc - gl.expand_dims(m_ref, 1)) * LOG2E)
        l_i = l_i * alpha + gl.sum(pr, 1)
        m_i = m_new
        p_f16.index(half).store(pr.to(gl.float16))
        fence_async_shared()  # generic stores, then wgmma (async proxy) reads
        thread_barrier()
        mbarrier.arrive(p_bar)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, orow_layout), 1)
        mbarrier.wait(v_ready.index(half), i & 1)
        mbarrier.wait(p_bar, i & 1)
        acc = warpgroup_mma(p_f16.index(0), v_half.slice(0, HALF_N, dim=0), acc,
                            is_async=True)
        acc = warpgroup_mma(p_f16.index(1), v_half.slice(HALF_N, HALF_N, dim=0), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(v_free.index(half))

    # The row sums of both halves (the slot's last reader has passed p_bar).
    mine.store(l_i)
    thread_barrier()
    mbarrier.arrive(x_bar)
    mbarrier.wait(x_bar, n_steps & 1)
    l_i = l_i + theirs.load(row_layout)

    seen = l_i > 0  # at least one valid row: its own term is exp(0) = 1
    l_safe = gl.where(seen, l_i, 1.0)
    lse = gl.where(seen, m_i + gl.log(l_safe), float("inf"))
    weight = gl.where(seen, kv_scale / l_safe, 0.0)
    heads = head0 + gl.arange(0, _BLOCK_H, row_layout)
    if HAS_ATTN_SINK:
        # exp(lse) / (exp(lse) + exp(sink)) as 1 / (1 + exp(sink - lse)), which cannot
        # give inf / inf. An empty row's weight is 0 already; its lse (+inf) is not
        # subtracted, since for sink = +inf that is inf - inf = NaN.
        sink = gl.load(attn_sink_ptr + heads)
        weight = weight / (1.0 + gl.exp(sink - gl.where(seen, lse, 0.0)))
    row_of_head = token * h_q + heads
    if half == 0:
        gl.store(max_logits_ptr + row_of_head, m_i)
        gl.store(lse_ptr + row_of_head, lse)
    out = acc * gl.expand_dims(gl.convert_layout(weight, orow_layout), 1)
    out_rows = gl.convert_layout(row_of_head, orow_layout)
    out_cols = half * 256 + gl.arange(0, 256, gl.SliceLayout(0, o_layout))
    gl.store(out_ptr + gl.expand_dims(out_rows, 1) * _D_V + gl.expand_dims(out_cols, 0),
             out.to(gl.bfloat16))

@gluon.jit
def _second_consumer(indices_ptr, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr,
                     token, head0, h_q, n_rows, s_kv, topk, scale, kv_scale,
                     q_nope, q_rope, k_nope, k_rope, v_f16, p_f16, x_f32, q_ready,
                     k_ready, k_free, v_ready, v_free, x_bar, p_bar, D_QK: gl.constexpr,
                     HAS_ATTN_SINK: gl.constexpr, NUM_STAGES: gl.constexpr):
    _consumer(1, indices_ptr, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr,
              token, head0, h_q, n_rows, s_kv, topk, scale, kv_scale,
              q_nope, q_rope, k_nope, k_rope, v_f16, p_f16, x_f32, q_ready, k_ready,
              k_free, v_ready, v_free, x_bar, p_bar, D_QK, HAS_ATTN_SINK, NUM_STAGES)

@gluon.jit
def sparse_mla_ws_kernel(
    q_ptr,
    kv_ptr,
    indices_ptr,
    q_scale_ptr,
    kv_scale_ptr,
    attn_sink_ptr,
    topk_length_ptr,
    errors_ptr,
    out_ptr,
    max_logits_ptr,
    lse_ptr,
    sm_scale,
    s_kv,
    h_q,
    topk,
    D_QK: gl.constexpr,
    HAS_TOPK_LENGTH: gl.constexpr,
    HAS_ATTN_SINK: gl.constexpr,
    HAS_ERRORS: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    LAG: gl.constexpr,
):
    """Attention of one token and 64 heads (CTA ``pid``: token ``pid // (h_q // 64)``).

    Arguments as for ``strictops.ops.sparse_mla.prefill._sparse_mla_prefill_kernel``:
    q ``[s_q, h_q, D_QK]`` and kv ``[s_kv, 1, D_QK]`` float8e4m3, indices ``[s_q, 1, topk]``
    int32 (any values), one-element float32 scales, attn_sink ``[h_q]`` float32,
    topk_length ``[s_q]`` int32 (any values, clamped to ``[0, topk]``), errors ``[1]``
    int32, out ``[s_q, h_q, 512]`` bf16, max_logits and lse ``[s_q, h_q]`` float32; all
    contiguous, ``h_q`` a multiple of 64, ``topk`` of 128, ``D_QK`` 512 or 576.
    """
    head_blocks = h_q // _BLOCK_H
    pid = gl.program_id(0)
    token = (pid // head_blocks).to(gl.int64)
    head_block = pid % head_blocks
    head0 = head_block * _BLOCK_H

    fp8_smem: gl.constexpr = gl.NVMMASharedLayout(128, 8)
    rope_smem: gl.constexpr = gl.NVMMASharedLayout(64, 8)
    v_smem: gl.constexpr = gl.NVMMASharedLayout(128, 16)
    bar_smem: gl.constexpr = mbarrier.MBarrierLayout()
    q_nope = gl.allocate_shared_memory(gl.float8e4nv, [_BLOCK_H, 512], fp8_smem)
    q_rope = gl.allocate_shared_memory(gl.float8e4nv, [_BLOCK_H, 64], rope_smem)
    k_nope = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, _BLOCK_N, 512], fp8_smem)
    k_rope = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, _BLOCK_N, 64], rope_smem)
    v_f16 = gl.allocate_shared_memory(gl.float16, [2, _BLOCK_N, 256], v_smem)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], bar_smem)
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_smem)
    k_free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_smem)
    v_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_smem)
    v_free = gl.allocate_shared_memory(gl.int64, [2, 1], bar_smem)
    x_bar = gl.allocate_shared_memory(gl.int64, [1], bar_smem)
    p_bar = gl.allocate_shared_memory(gl.int64, [1], bar_smem)
    p_f16 = gl.allocate_shared_memory(gl.float16, [2, _BLOCK_H, _BLOCK_N // 2],
                                      gl.NVMMASharedLayout(64, 16))
    x_f32 = gl.allocate_shared_memory(gl.float32, [2, _BLOCK_H],
                                      gl.SwizzledSharedLayout(1, 1, 1, [0]))
    mbarrier.init(q_ready, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=2)  # both consumers
    for h in gl.static_range(2):
        mbarrier.init(v_ready.index(h), count=1)
        mbarrier.init(v_free.index(h), count=1)
    mbarrier.init(x_bar, count=2)
    mbarrier.init(p_bar, count=2)

    kv_scale = gl.load(kv_scale_ptr)
    # fp32 whatever type sm_scale arrives as (Inductor may pass a Python float as fp64).
    scale = (sm_scale * gl.load(q_scale_ptr) * kv_scale).to(gl.float32)
    n_rows = rows_to_attend(topk_length_ptr, errors_ptr, token, topk, head_block,
                            HAS_TOPK_LENGTH, HAS_ERRORS)

    # Q into shared memory by this (the first consumer's) warpgroup, then published to
    # the other consumer; the proxy fence orders the generic stores before wgmma reads.
    store_q(q_ptr, q_nope, q_rope, token, h_q, head0, D_QK)
    fence_async_shared()
    thread_barrier()
    mbarrier.arrive(q_ready)

    gl.warp_specialize([
        (_consumer, (0, indices_ptr, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr,
                     token, head0, h_q, n_rows, s_kv, topk, scale, kv_scale, q_nope,
                     q_rope, k_nope, k_rope, v_f16, p_f16, x_f32, q_ready, k_ready, k_free,
                     v_ready, v_free, x_bar, p_bar, D_QK, HAS_ATTN_SINK, NUM_STAGES)),
        (_second_consumer, (indices_ptr, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr,
                            token, head0, h_q, n_rows, s_kv, topk, scale, kv_scale,
                            q_nope, q_rope, k_nope, k_rope, v_f16, p_f16, x_f32, q_ready,
                            k_ready, k_free, v_ready, v_free, x_bar, p_bar, D_QK,
                            HAS_ATTN_SINK, NUM_STAGES)),
        (_producer, (kv_ptr, indices_ptr, token, n_rows, s_kv, topk, k_nope, k_rope,
                     v_f16, k_ready, k_free, v_ready, v_free, D_QK, NUM_STAGES, LAG)),
    ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])


def tuned(defaults: dict, tuning: dict) -> dict:
    """``defaults`` (a module's ``TUNING``) with the entries of ``tuning``, each of which must
    be one of its keys."""
    unknown = set(tuning) - set(defaults)
    if unknown:
        raise TypeError(f"unknown tuning keys {sorted(unknown)}; "
                        f"expected some of {sorted(defaults)}")
    return defaults | tuning


def constexprs(d_qk: int, has_topk_length: bool, has_attn_sink: bool, has_errors: bool,
               **tuning) -> dict:
    """The kernel's compile-time arguments for a call (``tuning`` overrides entries of
    ``TUNING``); ``max_regs`` is a launch option, not among them."""
    t = tuned(TUNING, tuning)
    return dict(D_QK=d_qk, HAS_TOPK_LENGTH=has_topk_length, HAS_ATTN_SINK=has_attn_sink,
                HAS_ERRORS=has_errors, NUM_STAGES=t["num_stages"],
                CONSUMER_REGS=t["consumer_regs"], PRODUCER_REGS=t["producer_regs"],
                LAG=t["lag"])


def launch_options(defaults: dict, tuning: dict) -> dict:
    """The launch (and compile) options of a Gluon sparse MLA kernel whose ``TUNING`` is
    ``defaults``, overridden by ``tuning``: one warpgroup's 4 warps a partition, the register
    limit, the programmatic dependent launch, and multiplies and adds fused where the compiler
    finds them. Fusion is pinned rather than left to Triton's default (off from Triton 3.10
    on): the kernels' rounding and instruction counts are those measured with it."""
    t = tuned(defaults, tuning)
    return {"num_warps": 4, "maxnreg": t["max_regs"], "launch_pdl": t.get("pdl", False),
            "enable_fp_fusion": True}


def launch_kernel(kernel, constexprs_of, defaults, q, kv, indices, sm_scale, q_scale, kv_scale,
                  attn_sink, topk_length, out, max_logits, lse, topk_length_errors,
                  programs=None, extra=None, **tuning):
    """Launch a Gluon sparse MLA ``kernel`` (this module's or ``gluon_block_pair``'s: the
    same runtime parameters, and ``extra`` ones by name) on validated CUDA tensors on an sm_90
    GPU (the caller checks both), its compile-time arguments from ``constexprs_of`` and its
    register limit from ``defaults`` (the kernel's ``TUNING``), both overridden by ``tuning``;
    ``programs`` CTAs (default: one per token and 64 heads). Returns the compiled kernel."""
    s_q, h_q, d_qk = q.shape
    return kernel[(programs or s_q * (h_q // BLOCK_H),)](
        q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, topk_length_errors,
        out, max_logits, lse, sm_scale, kv.shape[0], h_q, indices.shape[2], **(extra or {}),
        **constexprs_of(d_qk, topk_length is not None, attn_sink is not None,
                        topk_length_errors is not None, **tuning),
        **launch_options(defaults, tuning),
    )


def launch(*args, **tuning):
    """:func:`launch_kernel` of this module's kernel; ``args`` as for
    ``strictops_kernels::sparse_mla_ws_launch``, ``tuning`` overrides entries of ``TUNING``."""
    return launch_kernel(sparse_mla_ws_kernel, constexprs, TUNING, *args, **tuning)


def programs_and_extra(tiles: int, device: int, **tuning) -> tuple[int, dict]:
    """One CTA per tile (token and 64 heads); no runtime parameter past the 15 shared ones."""
    return tiles, {}
