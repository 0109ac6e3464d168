"""The block-pair kernel's (``gluon_block_pair``) consumer steps around its ``wgmma``: S = Q·Kᵀ
of one 64-row block, with what keeps its rounding small at large logits; the block's softmax,
the max chain between the consumers and the first P·V of a pair (:func:`softmax_pv1`); the
second P·V of a pair (:func:`issue_pv2`).

One block's S is a chain of FP8 ``wgmma`` k-steps (m64n64k32: 16 over the 512 latent columns,
2 more over the 64 rope columns) into one fp32 accumulator. Hopper's FP8 ``wgmma`` adds each
step into the accumulator keeping fewer bits than fp32 (about 14), so every step of a large
S's chain loses bits in proportion to the accumulator's magnitude, and the row's largest S,
which decides its ``lse`` and ``max_logits``, loses the most. ``QK_PREC`` (compile time) picks:

- 0: every chain starts from 0;
- 1: the chain of a pair after a tile's first starts from ``-c`` in each row, ``c`` half the
  row's running maximum in S units (:func:`qk_offset`). The row's largest S then runs from
  ``-c`` to about ``+c`` instead of from 0 to about ``2c``: half the magnitude on average
  along its chain. The softmax is invariant to a row's shift, so the consumer adds ``c``
  (scaled) back to the row's maximum only, not to each S;
- 2: as 1, and the tile's first pair, which has no running maximum yet, as two chains
  (latent columns ``[0, 256)``; ``[256, 512)`` and rope) summed once (:func:`issue_qk_split`).

``docs/design/sparse_mla_prefill.md`` gives the error model behind this and the measurements.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from strictops.ops._runtime.gluon_compat import thread_barrier
from strictops.ops.sparse_mla.gluon_transpose import p_columns

__all__ = ["HEADROOM", "issue_pv2", "issue_qk", "issue_qk_split", "qk_offset", "softmax_pv1",
           "wait_qk"]

# P = 2^(t - m + HEADROOM): the largest P is 256, below e4m3's 448, and small P stay normal.
HEADROOM = gl.constexpr(8.0)


@gluon.jit
def issue_qk(q_nope, q_rope, k_nope, k_rope, k_ready, s_init, i, D_QK: gl.constexpr,
             NUM_STAGES: gl.constexpr, USE_INIT: gl.constexpr):
    """Start S = Q·Kᵀ of block ``i`` (asynchronous) into a chain that starts from ``s_init``
    (``USE_INIT``) or from 0; returns its token."""
    s = i % NUM_STAGES
    mbarrier.wait(k_ready.index(s), (i // NUM_STAGES) & 1)
    fence_async_shared()  # cp.async writes, then wgmma (async proxy) reads
    st = warpgroup_mma(q_nope, k_nope.index(s).permute((1, 0)), s_init, use_acc=USE_INIT,
                       is_async=True)
    if D_QK > 512:
        st = warpgroup_mma(q_rope, k_rope.index(s).permute((1, 0)), st, is_async=True)
    return st


@gluon.jit
def issue_qk_split(q_nope, q_rope, k_nope, k_rope, k_ready, s_zero, i, D_QK: gl.constexpr,
                   NUM_STAGES: gl.constexpr):
    """Start S of block ``i`` as two chains from 0 (latent columns ``[0, 256)``; ``[256,
    512)`` and rope); returns their two tokens (:func:`wait_qk` sums them)."""
    s = i % NUM_STAGES
    mbarrier.wait(k_ready.index(s), (i // NUM_STAGES) & 1)
    fence_async_shared()  # cp.async writes, then wgmma (async proxy) reads
    k = k_nope.index(s)
    sa = warpgroup_mma(q_nope.slice(0, 256, dim=1), k.slice(0, 256, dim=1).permute((1, 0)),
                       s_zero, use_acc=False, is_async=True)
    sb = warpgroup_mma(q_nope.slice(256, 256, dim=1), k.slice(256, 256, dim=1).permute((1, 0)),
                       s_zero, use_acc=False, is_async=True)
    if D_QK > 512:
        sb = warpgroup_mma(q_rope, k_rope.index(s).permute((1, 0)), sb, is_async=True)
    return sa, sb


@gluon.jit
def wait_qk(st, SPLIT: gl.constexpr):
    """Wait for every outstanding ``wgmma`` and return S from :func:`issue_qk`'s token, or
    (``SPLIT``) the sum of :func:`issue_qk_split`'s two."""
    if SPLIT:
        sa, sb = warpgroup_mma_wait(0, deps=st)
        return sa + sb
    else:
        return warpgroup_mma_wait(0, deps=(st, ))


@gluon.jit
def qk_offset(m_run, inv_scale_log2):
    """``c`` for rows whose running maximum of ``t = s * scale_log2 + bias`` is ``m_run``
    (``inv_scale_log2 = 1 / scale_log2``): the chain starts from ``-c``, half the maximum in S
    units (0 where that is not finite: no valid row yet, a scale of 0 or a subnormal one), and
    the softmax adds ``c * scale_log2`` back to the row's maximum (:func:`softmax_pv1`)."""
    c = 0.5 * m_run * inv_scale_log2
    return gl.where(gl.abs(c) < float("inf"), c, 0.0)


@gluon.jit
def issue_pv2(C: gl.constexpr, p, acc, p_smem, vt, vt_ready, p_bar, NUM_VT: gl.constexpr,
              TR_CONS: gl.constexpr):
    """Start the second P·V of pair ``p`` (block ``2p + 1``) into ``acc``; returns its token."""
    b = 2 * p + 1
    v = b % NUM_VT
    if not TR_CONS:
        mbarrier.wait(vt_ready.index(2 * v + C), (b // NUM_VT) & 1)
    if C == 0:
        mbarrier.wait(p_bar.index(1), p & 1)
    return warpgroup_mma(p_smem.index(2 * (p & 1) + 1),
                         vt.index(v).slice(C * 256, 256, dim=0).permute((1, 0)), acc,
                         is_async=True)


@gluon.jit
def softmax_pv1(C: gl.constexpr, p, sc, acc, m_run, l_i, scale_log2, c, bias, p_smem, mx,
                 vt, k_free, vt_ready, vt_free, p_bar, mx_bar, NUM_STAGES: gl.constexpr,
                 NUM_VT: gl.constexpr, TR_CONS: gl.constexpr, VT_LDSM: gl.constexpr,
                 OFFSET: gl.constexpr):
    """Softmax of this consumer's block ``2p + C`` (S in ``sc``; with ``OFFSET`` S less ``c``
    a row: :func:`qk_offset`), the max chain, P to shared memory, and the
    first P·V of pair ``p`` (block ``2p``). Returns ``acc`` and ``l_i`` relative to ``m1`` and
    ``m1``, the pair's final maximum."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], [16, 64, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], [16, 256, 32])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    par = p & 1
    i = 2 * p + C
    s = i % NUM_STAGES
    t = sc * scale_log2 + gl.expand_dims(bias.index(s).load(col_s), 0)
    mbarrier.arrive(k_free.index(s))
    m_blk = gl.max(t, 1)
    # The offset comes back as explicit fused multiply-adds: left to the compiler, whether a
    # multiply and an add fuse depends on the code around them, and two schedules of the
    # kernel would round the same S differently.
    if OFFSET:
        m_blk = gl.fma(c, scale_log2, m_blk)
    if C == 0:
        m_new = gl.maximum(m_run, m_blk)
        mx.index(2 * par).store(m_new)
        thread_barrier()
        mbarrier.arrive(mx_bar.index(0))
        m0 = m_new
    else:
        mbarrier.wait(mx_bar.index(0), par)
        m0 = mx.index(2 * par).load(row_s)
        m_new = gl.maximum(m0, m_blk)
        mx.index(2 * par + 1).store(m_new)
        thread_barrier()
        mbarrier.arrive(mx_bar.index(1))
    # While every row so far was invalid the max is -inf; a reference of 0 keeps
    # 2^(-inf - ref) at 0 rather than NaN.
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    shift = m_ref - HEADROOM
    if OFFSET:
        shift = gl.fma(-c, scale_log2, shift)
    pr = gl.exp2(t - gl.expand_dims(shift, 1))
    l_i = l_i * gl.exp2(m_run - m_ref) + gl.sum(pr, 1)
    p8 = pr.to(gl.float8e4nv)
    if VT_LDSM:  # column σ(n) of P meets column σ(n) of Vᵀ
        p8 = p_columns(p8)
    p_smem.index(2 * par + C).store(p8)
    fence_async_shared()  # generic stores, then wgmma (async proxy) reads
    thread_barrier()
    if C == 1:
        mbarrier.wait(p_bar.index(0), par)
    mbarrier.arrive(p_bar.index(C))
    m0_ref = gl.where(m0 == float("-inf"), 0.0, m0)
    acc = acc * gl.expand_dims(gl.convert_layout(gl.exp2(m_run - m0_ref), row_o), 1)
    b = 2 * p
    v = b % NUM_VT
    if not TR_CONS:
        mbarrier.wait(vt_ready.index(2 * v + C), (b // NUM_VT) & 1)
    acc = warpgroup_mma(p_smem.index(2 * par), vt.index(v).slice(C * 256, 256, dim=0)
                        .permute((1, 0)), acc, is_async=True)
    if C == 0:
        mbarrier.wait(mx_bar.index(1), par)
        m1 = mx.index(2 * par + 1).load(row_s)
    else:
        m1 = m_new
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    if not TR_CONS:
        mbarrier.arrive(vt_free.index(2 * v + C))
    m1_ref = gl.where(m1 == float("-inf"), 0.0, m1)
    beta = gl.exp2(m0_ref - m1_ref)
    acc = acc * gl.expand_dims(gl.convert_layout(beta, row_o), 1)
    if C == 0:
        l_i = l_i * beta
    return acc, m1, l_i
