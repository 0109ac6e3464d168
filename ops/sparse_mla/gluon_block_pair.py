"""A block-pair Hopper (sm_90) kernel of sparse MLA prefill, in Gluon (``triton.experimental``).

The op's default on sm_90 (``strictops.ops.sparse_mla.sm90`` selects), the fastest of its
kernels on the H200 (numbers against the others and the original:
``docs/design/sparse_mla_prefill.md``; ``benchmarks/experiments/sparse_mla_hopper.py`` checks
and times them side by side). Importing this module needs Gluon's Hopper API (``ImportError``
otherwise). It computes what the op's kernels compute (see ``strictops.ops.sparse_mla.prefill``)
from the same validated arguments.

Grid ``(s_q * h_q // 64,)``: CTA ``pid`` computes tile ``pid``, token ``pid // (h_q // 64)``
for 64 heads; with ``PERSISTENT`` the grid is at most one CTA per SM and CTA ``pid`` computes
tiles ``pid``, ``pid + num_programs``, ... below ``n_tiles`` (pair and block numbers, and with
them every barrier phase, run on across its tiles; the producer gathers the next tile while
the consumers finish the last one; ``STAGGER``: see ``gluon_shared_s.stagger_start``).
Q is copied into shared memory before the fork (through registers), or with ``Q_ASYNC`` by the
consumers after it (``cp.async``, half the heads each, published by ``q_bar``), so that the
producer starts gathering at once. With ``PERSISTENT`` the producer copies each tile's Q
(``cp.async``) after the copies of the tile's first indices, as soon as the consumers' last
Q·Kᵀ of the tile before has completed, so that it lands while they finish that tile.
Three warpgroups (12 warps), one CTA per SM (184,432 / 196,720 bytes of shared memory at
``D_QK`` 512 / 576 with the defaults):

- the producer gathers KV block ``i`` (64 selected rows, ``D_QK`` bytes each) with ``cp.async``
  into stage ``i % NUM_STAGES``: invalid indices copy nothing (the row is zero-filled) and get
  a column bias of ``-inf``; the indices come through shared memory (``idx_smem``), copied
  two blocks ahead;
- consumer ``c`` (``c`` = 0, 1) owns the blocks ``2p + c`` of each pair ``p``: it computes the
  whole S = Q·Kᵀ of its block (FP8 ``wgmma`` m64n64k32, fp32 accumulation) and its softmax,
  writes its P (FP8, scaled by 2⁸ against e4m3's underflow) to shared memory, and runs P·V
  over both blocks of the pair for its 256 output columns ``[256c, 256c + 256)`` (FP8
  ``wgmma`` m64n256k32, V transposed to K-major in ``vt``). The row maximum is a one-way
  chain: consumer 0 publishes ``m0 = max(m, rowmax(S_2p))``, consumer 1 ``m1 = max(m0,
  rowmax(S_2p+1))``; P of block ``2p`` is relative to ``m0``, of block ``2p + 1`` to ``m1``,
  and each consumer rescales its O to ``m0`` before the first P·V of a pair and to ``m1``
  before the second. The second P·V of pair ``p`` is issued with the Q·Kᵀ of pair ``p + 1``.
  ``QK_PREC`` > 0 starts the Q·Kᵀ chains from an offset of half the row's running maximum,
  and 2, the default, the first pair's as two chains (``gluon_mma``; 0 from zero).
- V transpose (``TR_CONS``): each consumer transposes its own half of V of both blocks of a
  pair into ``vt[b % NUM_VT]`` (block ``b``) while its Q·Kᵀ runs; otherwise the producer
  transposes block ``i - LAG`` into ``vt[i % NUM_VT]`` after gathering block ``i``. With
  ``TR_EARLY`` a consumer transposes the blocks whose buffer the second P·V of pair ``p - 1``
  does not read while it runs (block ``2p`` with two buffers, both with three), the rest
  after it. With ``VT_LDSM`` it reads V as 16-bit words with ``ldmatrix.trans``, swaps bytes
  between row pairs (2 ``prmt`` per 8 bytes) and writes with ``stmatrix``, which puts row
  ``n``, column ``d`` of V at row ``ρ(d)``, column ``σ(n)`` of Vᵀ (bit permutations that keep
  both free of bank conflicts); P is stored with its columns in σ order and the output
  columns of O are read in ρ order (``gluon_transpose``). Otherwise a blocked layout
  (``LDSM``, ``PRMT``, ``STS.64``) writes ``Vᵀ[d][n]``.
- O (``O_STORE``): each consumer writes its bf16 O [64, 256] into its own halves of the first
  two Vᵀ buffers (free from its last P·V of a tile to its next transposes) and stores whole
  rows from there, 16 bytes a thread (1), or sends it by four TMA stores that drain while the
  next tile starts (2, not the default); otherwise (0) it stores 4 bytes a thread from the
  wgmma layout (a sixth of the time at topk 512: ``docs/design/sparse_mla_prefill.md``).

Softmax arithmetic is in base 2: ``t = s * scale * log2(e) + bias`` (one FFMA), ``P =
2^(t - m + 8)``; the row sums ``l`` (fp32, over the unrounded P) carry the same 2⁸, so ``lse =
(m - 8) ln 2 + ln l`` and ``max_logits = m ln 2``. An empty row (no valid index) gives out = 0,
max_logits = -inf, lse = +inf, and the attention-sink factor is applied only to rows that saw a
valid index (so a sink of +inf never meets lse = +inf).

Synchronisation, all by mbarriers in shared memory (phase = use count & 1):

- ``k_ready[s]`` (count 129): the producer's 128 threads' ``cp.async`` completions
  (``cp.async.mbarrier.arrive.noinc``) and one arrive after the bias row is stored.
- ``k_free[s]`` (count 2 with ``TR_CONS``, else 1): the owning consumer after its Q·Kᵀ and
  bias load, and the other consumer after transposing its half of the block (``TR_CONS``;
  otherwise the producer's own transpose precedes the refill in program order).
- ``vt_ready[2v + c]`` / ``vt_free[2v + c]`` (count 1, producer transpose only): half ``c``
  of ``vt[v]``, read by consumer ``c`` only. With ``TR_CONS`` each consumer writes and reads
  only its own half, after its previous P·V of that buffer has completed.
- ``mx_bar[c]`` (count 1): the maximum ``m0`` (``c = 0``) or ``m1`` in ``mx[2 (p & 1) + c]``.
- ``p_bar[c]`` (count 1): P of block ``2p + c`` in ``p_smem[2 (p & 1) + c]``. Consumer 1
  waits ``p_bar[0]`` before it arrives at ``p_bar[1]``, so neither consumer can complete a
  barrier's phase twice before the other has waited for it.
- ``l_bar`` (count 2): the row sums, exchanged once at the end.
- ``q_bar`` (count 256 with ``Q_ASYNC``, 128 with ``PERSISTENT``): the consumers' or the
  producer's ``cp.async`` completions of Q.
- ``q_free`` (count 2, ``PERSISTENT``): each consumer once its last Q·Kᵀ of a tile has
  completed, before the producer copies the next tile's Q.
"""

from __future__ import annotations

import contextvars
import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma_wait,
)

from strictops.ops._runtime.gluon_compat import async_load, thread_barrier
from strictops.ops.sparse_mla.gluon_mma import (HEADROOM, issue_pv2, issue_qk, issue_qk_split,
                                                 qk_offset, softmax_pv1, wait_qk)
from strictops.ops.sparse_mla.gluon_shared_s import (copy_q, launch_kernel, rows_to_attend,
                                                     stagger_start, store_q, tile_of, tuned,
                                                     wait_for_prior_grid)
from strictops.ops.sparse_mla.gluon_transpose import (out_descriptor, output_columns,
                                                      store_o_by_tma, store_o_through_vt,
                                                      transpose_block, transpose_ldsm, views16)

__all__ = ["TUNING", "constexprs", "launch", "sparse_mla_hopper_kernel"]

# 64 heads a CTA, 64 gathered rows a block, 512 latent (V) columns; each consumer owns 256.
BLOCK_H = 64
BLOCK_N = 64
D_V = 512
# 3 stages do not fit beside Q, Vᵀ and P at d_qk = 576; the consumers transpose V with
# ldmatrix.trans / stmatrix (the blocked transpose, the producer's and 128 columns a load
# measured slower); persistent CTAs, transposes after the second P·V (early ones measured
# slower), O stored through shared memory 16 bytes a thread (4-byte stores from the wgmma
# layout cost a sixth of the time at topk 512), 232/40 registers (setmaxnreg obeys 2 * consumer
# + producer <= 3 * max), a programmatic dependent launch (the CTAs start while the grid
# before finishes and wait for it before touching memory), CTAs with a tile of slack started in
# four groups (O's stores then do not all meet), Q·Kᵀ chains started from minus half the row's
# running maximum and a tile's first pair as two chains (the lse error at large logits halves,
# for 2-3.5% of the time). Every knob and its measurement:
# docs/design/sparse_mla_prefill.md
TUNING = {"num_stages": 2, "num_vt": 2, "lag": 1, "tr_cons": True, "tr_cols": 64,
          "vt_ldsm": True, "tr_early": False, "q_async": False, "persistent": True,
          "o_smem": True, "consumer_regs": 232, "producer_regs": 40, "max_regs": 168,
          "pdl": True, "stagger": 4, "qk_prec": 2, "o_tma": False}

_BLOCK_H = gl.constexpr(BLOCK_H)
_BLOCK_N = gl.constexpr(BLOCK_N)
_D_V = gl.constexpr(D_V)
_LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _load_indices(idx_smem, index_row, i, base, topk, layout: gl.constexpr):
    """Start the copy of block ``i``'s 64 indices into ``idx_smem[(base + i) % 4]`` and commit
    it (the group also holds the block copies issued since the last commit)."""
    j = i * _BLOCK_N + gl.arange(0, _BLOCK_N, layout)
    async_load(idx_smem.index((base + i) % 4), index_row + j, mask=j < topk)
    async_copy.commit_group()


@gluon.jit
def _valid_rows(idx_smem, i, base, n_rows, s_kv, layout: gl.constexpr):
    """Block ``i``'s indices from ``idx_smem`` in ``layout`` and whether each is valid."""
    idx = idx_smem.index((base + i) % 4).load(layout)
    j = i * _BLOCK_N + gl.arange(0, _BLOCK_N, layout)
    return idx, (idx >= 0) & (idx < s_kv) & (j < n_rows)


@gluon.jit
def _producer(kv_ptr, indices_ptr, topk_length_ptr, errors_ptr, q_ptr, token, n_rows, s_kv, h_q,
              topk, n_tiles, q_nope, q_rope, k_nope, k_rope, vt, bias, idx_smem, k_ready,
              k_free, vt_ready, vt_free, q_bar, q_free,
              D_QK: gl.constexpr, NUM_STAGES: gl.constexpr, NUM_VT: gl.constexpr,
              LAG: gl.constexpr, TR_CONS: gl.constexpr, TR_COLS: gl.constexpr,
              VT_LDSM: gl.constexpr, HAS_TOPK_LENGTH: gl.constexpr, HAS_ERRORS: gl.constexpr,
              PERSISTENT: gl.constexpr):
    """The producer of the CTA's tile, or (``PERSISTENT``) of its tiles ``pid``, ``pid +
    num_programs``, ... below ``n_tiles`` (it counts each tile's ``topk_length`` errors, and
    copies each tile's Q)."""
    if PERSISTENT:
        base = 0
        t = 0
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            tile_token, head_block = tile_of(tile, h_q)
            rows = rows_to_attend(topk_length_ptr, errors_ptr, tile_token, topk, head_block,
                                  HAS_TOPK_LENGTH, HAS_ERRORS)
            base = _produce(kv_ptr, indices_ptr, q_ptr, tile_token, rows, s_kv, h_q, topk,
                            head_block * _BLOCK_H, t, q_nope, q_rope, k_nope, k_rope,
                            vt, bias, idx_smem, k_ready, k_free, vt_ready, vt_free, q_bar,
                            q_free, base, D_QK, NUM_STAGES, NUM_VT, LAG, TR_CONS, TR_COLS,
                            VT_LDSM, True)
            t += 1
    else:
        _produce(kv_ptr, indices_ptr, q_ptr, token, n_rows, s_kv, h_q, topk, 0, 0, q_nope,
                 q_rope, k_nope, k_rope, vt, bias, idx_smem, k_ready, k_free, vt_ready, vt_free,
                 q_bar, q_free, 0, D_QK, NUM_STAGES, NUM_VT, LAG, TR_CONS, TR_COLS, VT_LDSM,
                 False)


@gluon.jit
def _produce(kv_ptr, indices_ptr, q_ptr, token, n_rows, s_kv, h_q, topk, head0, t, q_nope,
             q_rope, k_nope, k_rope, vt, bias, idx_smem, k_ready, k_free, vt_ready, vt_free,
             q_bar, q_free, base, D_QK: gl.constexpr, NUM_STAGES: gl.constexpr,
             NUM_VT: gl.constexpr, LAG: gl.constexpr, TR_CONS: gl.constexpr,
             TR_COLS: gl.constexpr, VT_LDSM: gl.constexpr, PERSISTENT: gl.constexpr):
    """Gather block ``i`` into stage ``(base + i) % NUM_STAGES``, then transpose block ``i -
    LAG``'s V; ``base`` blocks went before (earlier tiles). Returns ``base`` plus this tile's
    blocks. With ``PERSISTENT`` this is the CTA's tile ``t`` (heads from ``head0``): its Q is
    copied after the copies of its first indices, once ``q_free`` says that the consumers'
    Q·Kᵀ of tile ``t - 1`` have completed (the copy lands while they finish that tile).

    The indices travel through ``idx_smem`` (4 slots), copied two blocks ahead with
    ``cp.async``: a register prefetch would be moved into the loop-carried register at once,
    and that move waits for the load. With ``PERSISTENT`` no copy goes past the tile's last
    block (the next tile's first copies use those slots)."""
    D_ROPE: gl.constexpr = D_QK - 512
    gl.static_assert(NUM_STAGES > LAG, "a stage is refilled only after its transpose")
    # 8 threads cover a row's 128-byte segment (16 bytes, one cp.async, each), so each thread
    # holds the indices of 4 rows of a block.
    nope_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    rope_layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    flat_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    # [64 rows, 64 columns] of V per load: 8 x 4 bytes a thread, stored transposed as 4 groups
    # of 8 contiguous bytes.
    tr_layout: gl.constexpr = gl.BlockedLayout([8, 4], [8, 4], [1, 4], [1, 0])
    cols = gl.arange(0, 512, gl.SliceLayout(0, nope_layout))
    rope_cols = gl.arange(0, 64, gl.SliceLayout(0, rope_layout))
    index_row = indices_ptr + token * topk
    n_blocks = 2 * gl.maximum(gl.cdiv(n_rows, 2 * _BLOCK_N), 1)  # never past topk
    _load_indices(idx_smem, index_row, 0, base, topk, flat_layout)
    _load_indices(idx_smem, index_row, 1, base, topk, flat_layout)
    if PERSISTENT:
        if t > 0:
            mbarrier.wait(q_free, (t - 1) & 1)
        copy_q(q_ptr, q_nope, q_rope, token, h_q, head0, q_bar, 0, _BLOCK_H, D_QK)
    for i in range(n_blocks + LAG):
        if i < n_blocks:
            s = (base + i) % NUM_STAGES
            async_copy.wait_group(1)  # block i's indices (committed two blocks ago)
            thread_barrier()
            idx, valid = _valid_rows(idx_smem, i, base, n_rows, s_kv,
                                     gl.SliceLayout(1, nope_layout))
            row_ptr = kv_ptr + gl.where(valid, idx, 0).to(gl.int64) * D_QK
            mbarrier.wait(k_free.index(s), (((base + i) // NUM_STAGES) & 1) ^ 1)
            # A false mask reads no byte and writes zeros (0 * V stays finite).
            async_load(
                k_nope.index(s), gl.expand_dims(row_ptr, 1) + gl.expand_dims(cols, 0),
                mask=gl.expand_dims(valid, 1))
            if D_ROPE > 0:
                idx, valid = _valid_rows(idx_smem, i, base, n_rows, s_kv,
                                         gl.SliceLayout(1, rope_layout))
                row_ptr = kv_ptr + gl.where(valid, idx, 0).to(gl.int64) * D_QK + 512
                async_load(
                    k_rope.index(s), gl.expand_dims(row_ptr, 1) + gl.expand_dims(rope_cols, 0),
                    mask=gl.expand_dims(valid, 1))
            _, valid = _valid_rows(idx_smem, i, base, n_rows, s_kv, flat_layout)
            bias.index(s).store(gl.where(valid, 0.0, float("-inf")))
            thread_barrier()
            mbarrier.arrive(k_ready.index(s))
            async_copy.mbarrier_arrive(k_ready.index(s), increment_count=False)
            if PERSISTENT and i + 2 >= n_blocks:
                async_copy.commit_group()  # an empty group keeps wait_group(1) counting
            else:
                _load_indices(idx_smem, index_row, i + 2, base, topk, flat_layout)
        if (not TR_CONS) and i >= LAG:
            b = base + i - LAG
            s = b % NUM_STAGES
            v = b % NUM_VT
            mbarrier.wait(k_ready.index(s), (b // NUM_STAGES) & 1)
            fence_async_shared()
            for h in gl.static_range(2):
                mbarrier.wait(vt_free.index(2 * v + h), ((b // NUM_VT) & 1) ^ 1)
                if VT_LDSM:
                    k16, vt16 = views16(k_nope, vt, NUM_STAGES, NUM_VT)
                    for c in gl.static_range(h * 256, h * 256 + 256, TR_COLS):
                        transpose_ldsm(k16.index(s).slice(c // 2, TR_COLS // 2, dim=1),
                                        vt16.index(v).slice(c, TR_COLS, dim=0), TR_COLS // 2)
                else:
                    x = k_nope.index(s).slice(h * 256, 256, dim=1).load(tr_layout)
                    vt.index(v).slice(h * 256, 256, dim=0).store(gl.permute(x, (1, 0)))
                fence_async_shared()  # generic stores, then wgmma (async proxy) reads
                thread_barrier()
                mbarrier.arrive(vt_ready.index(2 * v + h))
    return base + n_blocks


@gluon.jit
def _consumer(C: gl.constexpr, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr,
              topk_length_ptr, token, head0, h_q, n_rows, topk, n_tiles, scale_log2, kv_scale,
              q_ptr, q_nope, q_rope, k_nope, k_rope, vt, bias, p_smem, mx, lsum, k_ready,
              k_free, vt_ready, vt_free, p_bar, mx_bar, l_bar, q_bar, q_free,
              D_QK: gl.constexpr, HAS_ATTN_SINK: gl.constexpr, HAS_TOPK_LENGTH: gl.constexpr,
              NUM_STAGES: gl.constexpr, NUM_VT: gl.constexpr, TR_CONS: gl.constexpr,
              TR_COLS: gl.constexpr, VT_LDSM: gl.constexpr, TR_EARLY: gl.constexpr,
              Q_ASYNC: gl.constexpr, PERSISTENT: gl.constexpr, O_STORE: gl.constexpr,
              QK_PREC: gl.constexpr):
    """Consumer ``C`` of the CTA's tile, or (``PERSISTENT``) of its tiles ``pid``, ``pid +
    num_programs``, ... below ``n_tiles``: pair numbers and barrier phases run on across
    tiles. ``O_STORE`` 2: O goes out by TMA (``out`` its descriptor), waited for at the end."""
    out = out_ptr
    if O_STORE == 2:
        out = out_descriptor(out_ptr, n_tiles * _BLOCK_H)
    if PERSISTENT:
        pairs = 0
        t = 0
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            tile_token, head_block = tile_of(tile, h_q)
            rows = rows_to_attend(topk_length_ptr, topk_length_ptr, tile_token, topk, 0,
                                  HAS_TOPK_LENGTH, False)
            _consumer_tile(C, pairs, t & 1, attn_sink_ptr, out, max_logits_ptr, lse_ptr,
                           tile_token, head_block * _BLOCK_H, h_q, rows, scale_log2,
                           kv_scale, q_ptr, q_nope, q_rope, k_nope, k_rope, vt, bias, p_smem,
                           mx, lsum, k_ready, k_free, vt_ready, vt_free, p_bar, mx_bar, l_bar,
                           q_bar, q_free, D_QK, HAS_ATTN_SINK, NUM_STAGES, NUM_VT, TR_CONS,
                           TR_COLS, VT_LDSM, TR_EARLY, False, True, O_STORE, QK_PREC)
            pairs += gl.maximum(gl.cdiv(rows, 2 * _BLOCK_N), 1)
            t += 1
    else:
        _consumer_tile(C, 0, 0, attn_sink_ptr, out, max_logits_ptr, lse_ptr, token, head0,
                       h_q, n_rows, scale_log2, kv_scale, q_ptr, q_nope, q_rope, k_nope, k_rope,
                       vt, bias, p_smem, mx, lsum, k_ready, k_free, vt_ready, vt_free, p_bar,
                       mx_bar, l_bar, q_bar, q_free, D_QK, HAS_ATTN_SINK, NUM_STAGES, NUM_VT,
                       TR_CONS, TR_COLS, VT_LDSM, TR_EARLY, Q_ASYNC, False, O_STORE,
                       QK_PREC)
    if O_STORE == 2:  # the last tile's O leaves shared memory before the CTA ends
        tma.store_wait(0)


@gluon.jit
def _consumer_tile(C: gl.constexpr, P0, phase, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr,
                   token, head0, h_q, n_rows, scale_log2, kv_scale, q_ptr, q_nope, q_rope,
                   k_nope, k_rope, vt, bias, p_smem, mx, lsum, k_ready, k_free, vt_ready,
                   vt_free, p_bar, mx_bar, l_bar, q_bar, q_free, D_QK: gl.constexpr,
                   HAS_ATTN_SINK: gl.constexpr, NUM_STAGES: gl.constexpr, NUM_VT: gl.constexpr,
                   TR_CONS: gl.constexpr, TR_COLS: gl.constexpr, VT_LDSM: gl.constexpr,
                   TR_EARLY: gl.constexpr, Q_ASYNC: gl.constexpr, PERSISTENT: gl.constexpr,
                   O_STORE: gl.constexpr, QK_PREC: gl.constexpr):
    """Consumer ``C`` of one tile: blocks ``2p + C`` (pairs numbered from ``P0``), output
    columns ``[256C, 256C + 256)``; consumer 1 also writes ``max_logits`` and ``lse``.
    ``phase``: of ``l_bar``, ``q_bar`` and ``q_free`` in this tile. Q is in shared memory
    already, or copied by both consumers (``Q_ASYNC``) or by the producer (``PERSISTENT``:
    each consumer arrives at ``q_free`` once no Q·Kᵀ of the tile reads it). ``O_STORE``: O
    stored from the wgmma layout (0), or through shared memory by the threads
    (``store_o_through_vt``, 1) or by TMA (``store_o_by_tma``, 2: ``out_ptr`` is then the
    descriptor; the stores drain while the next tile's Q·Kᵀ starts)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], [16, 64, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], [16, 256, 32])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    # wgmma groups of one Q·Kᵀ: waiting with this many outstanding leaves only them running.
    QK_GROUPS: gl.constexpr = 2 if D_QK > 512 else 1
    acc = gl.zeros([_BLOCK_H, 256], gl.float32, o_layout)
    s_zero = gl.zeros([_BLOCK_H, _BLOCK_N], gl.float32, s_layout)
    m_run = gl.full([_BLOCK_H], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([_BLOCK_H], gl.float32, row_s)
    n_pairs = gl.maximum(gl.cdiv(n_rows, 2 * _BLOCK_N), 1)
    if Q_ASYNC:
        copy_q(q_ptr, q_nope, q_rope, token, h_q, head0, q_bar, 32 * C, 32, D_QK)
    if Q_ASYNC or PERSISTENT:
        mbarrier.wait(q_bar, phase)
    # Pair 0 is peeled: carrying a Q·Kᵀ token across the loop's back edge makes ptxas
    # serialise every wgmma. QK_PREC: gluon_mma.
    if QK_PREC == 2:
        st0 = issue_qk_split(q_nope, q_rope, k_nope, k_rope, k_ready, s_zero, 2 * P0 + C, D_QK,
                             NUM_STAGES)
    else:
        st0 = issue_qk(q_nope, q_rope, k_nope, k_rope, k_ready, s_zero, 2 * P0 + C, D_QK,
                       NUM_STAGES, False)
    if O_STORE == 2:  # the last tile's O has left the Vᵀ halves the transposes write
        tma.store_wait(0)
        thread_barrier()
    if TR_CONS:
        for q in gl.static_range(2):
            transpose_block(C, q, P0, k_nope, vt, k_ready, k_free, NUM_STAGES, NUM_VT,
                             TR_COLS, VT_LDSM)
        fence_async_shared()  # generic stores, then wgmma (async proxy) reads
        thread_barrier()
    sc = wait_qk(st0, QK_PREC == 2)
    if PERSISTENT:
        if n_pairs == 1:  # this consumer's last Q·Kᵀ of the tile: the next tile's Q may land
            mbarrier.arrive(q_free)
    acc, m_run, l_i = softmax_pv1(C, P0, sc, acc, m_run, l_i, scale_log2, 0.0, bias, p_smem,
                                   mx, vt, k_free, vt_ready, vt_free, p_bar, mx_bar, NUM_STAGES,
                                   NUM_VT, TR_CONS, VT_LDSM, False)
    inv_scale_log2 = 1.0 / scale_log2  # for QK_PREC
    for p in range(1, n_pairs):
        pv = issue_pv2(C, P0 + p - 1, acc, p_smem, vt, vt_ready, p_bar, NUM_VT, TR_CONS)
        s_init = s_zero
        c = 0.0
        if QK_PREC > 0:
            c = qk_offset(m_run, inv_scale_log2)
            s_init = s_zero - gl.expand_dims(c, 1)
        st = issue_qk(q_nope, q_rope, k_nope, k_rope, k_ready, s_init, 2 * (P0 + p) + C, D_QK,
                      NUM_STAGES, QK_PREC > 0)
        # With TR_EARLY, the blocks whose Vᵀ buffer the second P·V of pair p - 1 does not read
        # (the first only with two buffers: its buffer's last reader, the first P·V of pair
        # p - 1, is done) are transposed while it runs.
        EARLY: gl.constexpr = (NUM_VT - 1 if TR_EARLY else 0) if TR_CONS else 0
        for q in gl.static_range(EARLY):
            transpose_block(C, q, P0 + p, k_nope, vt, k_ready, k_free, NUM_STAGES, NUM_VT,
                             TR_COLS, VT_LDSM)
        acc = warpgroup_mma_wait(QK_GROUPS, deps=(pv, ))
        if TR_CONS:
            for q in gl.static_range(EARLY, 2):
                transpose_block(C, q, P0 + p, k_nope, vt, k_ready, k_free, NUM_STAGES,
                                 NUM_VT, TR_COLS, VT_LDSM)
            fence_async_shared()  # generic stores, then wgmma (async proxy) reads
            thread_barrier()
        else:
            mbarrier.arrive(vt_free.index(2 * ((2 * (P0 + p) - 1) % NUM_VT) + C))
        sc = warpgroup_mma_wait(0, deps=(st, ))
        if PERSISTENT:
            if p == n_pairs - 1:
                mbarrier.arrive(q_free)
        acc, m_run, l_i = softmax_pv1(C, P0 + p, sc, acc, m_run, l_i, scale_log2, c, bias,
                                       p_smem, mx, vt, k_free, vt_ready, vt_free, p_bar, mx_bar,
                                       NUM_STAGES, NUM_VT, TR_CONS, VT_LDSM, QK_PREC > 0)
    pv = issue_pv2(C, P0 + n_pairs - 1, acc, p_smem, vt, vt_ready, p_bar, NUM_VT, TR_CONS)
    acc = warpgroup_mma_wait(0, deps=(pv, ))
    if not TR_CONS:  # the producer transposes the next tile's blocks into this buffer
        mbarrier.arrive(vt_free.index(2 * ((2 * (P0 + n_pairs) - 1) % NUM_VT) + C))

    lsum.index(C).store(l_i)
    thread_barrier()
    mbarrier.arrive(l_bar)
    mbarrier.wait(l_bar, phase)
    l_i = l_i + lsum.index(1 - C).load(row_s)
    seen = l_i > 0  # a valid row: the block holding the maximum adds 2^HEADROOM
    l_safe = gl.where(seen, l_i, 1.0)
    lse = gl.where(seen, (m_run - HEADROOM) * _LN2 + gl.log(l_safe), float("inf"))
    weight = gl.where(seen, kv_scale / l_safe, 0.0)
    heads = head0 + gl.arange(0, _BLOCK_H, row_s)
    if HAS_ATTN_SINK:
        # exp(lse) / (exp(lse) + exp(sink)) for rows that saw a valid index only: an empty
        # row (lse = +inf) with sink = +inf would give inf - inf.
        sink = gl.load(attn_sink_ptr + heads)
        weight = weight / (1.0 + gl.exp(gl.where(seen, sink - lse, 0.0)))
    row_of_head = token * h_q + heads
    if C == 1:
        gl.store(max_logits_ptr + row_of_head, gl.where(seen, m_run * _LN2, float("-inf")))
        gl.store(lse_ptr + row_of_head, lse)
    out = acc * gl.expand_dims(gl.convert_layout(weight, row_o), 1)
    if VT_LDSM:  # column r of O is output column ρ(r)
        out = output_columns(out)
    if O_STORE == 2:
        store_o_by_tma(C, out.to(gl.bfloat16), out_ptr, (token * h_q + head0).to(gl.int32), vt,
                       NUM_VT)
    elif O_STORE == 1:
        store_o_through_vt(C, out.to(gl.bfloat16), out_ptr, row_of_head, vt, NUM_VT)
    else:
        out_layout: gl.constexpr = out.type.layout
        out_rows = gl.convert_layout(row_of_head, gl.SliceLayout(1, out_layout))
        out_cols = C * 256 + gl.arange(0, 256, gl.SliceLayout(0, out_layout))
        gl.store(out_ptr + gl.expand_dims(out_rows, 1) * _D_V + gl.expand_dims(out_cols, 0),
                 out.to(gl.bfloat16))


@gluon.jit
def _consumer_1(attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr, topk_length_ptr, token, head0,
                h_q, n_rows, topk, n_tiles, scale_log2, kv_scale, q_ptr, q_nope, q_rope, k_nope,
                k_rope, vt, bias, p_smem, mx, lsum, k_ready, k_free, vt_ready, vt_free, p_bar,
                mx_bar, l_bar, q_bar, q_free, D_QK: gl.constexpr, HAS_ATTN_SINK: gl.constexpr,
                HAS_TOPK_LENGTH: gl.constexpr, NUM_STAGES: gl.constexpr, NUM_VT: gl.constexpr,
                TR_CONS: gl.constexpr, TR_COLS: gl.constexpr, VT_LDSM: gl.constexpr,
                TR_EARLY: gl.constexpr, Q_ASYNC: gl.constexpr, PERSISTENT: gl.constexpr,
                O_STORE: gl.constexpr, QK_PREC: gl.constexpr):
    _consumer(1, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr, topk_length_ptr, token, head0,
              h_q, n_rows, topk, n_tiles, scale_log2, kv_scale, q_ptr, q_nope, q_rope, k_nope,
              k_rope, vt, bias, p_smem, mx, lsum, k_ready, k_free, vt_ready, vt_free, p_bar,
              mx_bar, l_bar, q_bar, q_free, D_QK, HAS_ATTN_SINK, HAS_TOPK_LENGTH, NUM_STAGES,
              NUM_VT, TR_CONS, TR_COLS, VT_LDSM, TR_EARLY, Q_ASYNC, PERSISTENT, O_STORE, QK_PREC)


@gluon.jit
def sparse_mla_hopper_kernel(
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
    n_tiles,
    D_QK: gl.constexpr,
    HAS_TOPK_LENGTH: gl.constexpr,
    HAS_ATTN_SINK: gl.constexpr,
    HAS_ERRORS: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    NUM_VT: gl.constexpr,
    LAG: gl.constexpr,
    TR_CONS: gl.constexpr,
    TR_COLS: gl.constexpr,
    VT_LDSM: gl.constexpr,
    TR_EARLY: gl.constexpr,
    Q_ASYNC: gl.constexpr,
    PERSISTENT: gl.constexpr,
    O_STORE: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    PDL: gl.constexpr,
    STAGGER: gl.constexpr,
    QK_PREC: gl.constexpr,
):
    """Attention of one token and 64 heads (CTA ``pid``: token ``pid // (h_q // 64)``).

    Arguments as for ``strictops.ops.sparse_mla.prefill._sparse_mla_prefill_kernel``:
    q ``[s_q, h_q, D_QK]`` and kv ``[s_kv, 1, D_QK]`` float8e4m3, indices ``[s_q, 1, topk]``
    int32 (any values), one-element float32 scales, attn_sink ``[h_q]`` float32,
    topk_length ``[s_q]`` int32 (any values, clamped to ``[0, topk]``), errors ``[1]``
    int32, out ``[s_q, h_q, 512]`` bf16, max_logits and lse ``[s_q, h_q]`` float32; all
    contiguous, ``h_q`` a multiple of 64, ``topk`` of 128, ``D_QK`` 512 or 576.
    """
    gl.static_assert((not TR_CONS) or NUM_VT == 2 or NUM_VT == 3,
                     "the consumers transpose a pair into two or three Vᵀ buffers")
    gl.static_assert(not (Q_ASYNC and PERSISTENT), "the producer copies each tile's Q")
    gl.static_assert(TR_CONS or O_STORE == 0, "O passes through the consumers' own Vᵀ halves")
    head_blocks = h_q // _BLOCK_H
    pid = gl.program_id(0)
    token = (pid // head_blocks).to(gl.int64)
    head_block = pid % head_blocks
    head0 = head_block * _BLOCK_H

    fp8_smem: gl.constexpr = gl.NVMMASharedLayout(128, 8)
    fp8_64_smem: gl.constexpr = gl.NVMMASharedLayout(64, 8)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    bar_smem: gl.constexpr = mbarrier.MBarrierLayout()
    q_nope = gl.allocate_shared_memory(gl.float8e4nv, [_BLOCK_H, 512], fp8_smem)
    q_rope = gl.allocate_shared_memory(gl.float8e4nv, [_BLOCK_H, 64], fp8_64_smem)
    k_nope = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, _BLOCK_N, 512], fp8_smem)
    k_rope = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, _BLOCK_N, 64], fp8_64_smem)
    vt = gl.allocate_shared_memory(gl.float8e4nv, [NUM_VT, 512, _BLOCK_N], fp8_64_smem)
    p_smem = gl.allocate_shared_memory(gl.float8e4nv, [4, _BLOCK_H, _BLOCK_N], fp8_64_smem)
    bias = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, _BLOCK_N], flat)
    mx = gl.allocate_shared_memory(gl.float32, [4, _BLOCK_H], flat)
    lsum = gl.allocate_shared_memory(gl.float32, [2, _BLOCK_H], flat)
    idx_smem = gl.allocate_shared_memory(gl.int32, [4, _BLOCK_N], flat)
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_smem)
    k_free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_smem)
    vt_ready = gl.allocate_shared_memory(gl.int64, [2 * NUM_VT, 1], bar_smem)
    vt_free = gl.allocate_shared_memory(gl.int64, [2 * NUM_VT, 1], bar_smem)
    p_bar = gl.allocate_shared_memory(gl.int64, [2, 1], bar_smem)
    mx_bar = gl.allocate_shared_memory(gl.int64, [2, 1], bar_smem)
    l_bar = gl.allocate_shared_memory(gl.int64, [1], bar_smem)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], bar_smem)
    q_free = gl.allocate_shared_memory(gl.int64, [1], bar_smem)
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(s), count=129)  # 128 cp.async completions + the bias
        mbarrier.init(k_free.index(s), count=2 if TR_CONS else 1)
    for v in gl.static_range(2 * NUM_VT):
        mbarrier.init(vt_ready.index(v), count=1)
        mbarrier.init(vt_free.index(v), count=1)
    for c in gl.static_range(2):
        mbarrier.init(p_bar.index(c), count=1)
        mbarrier.init(mx_bar.index(c), count=1)
    mbarrier.init(l_bar, count=2)
    # The cp.async completions of Q: the consumers' (Q_ASYNC) or the producer's (PERSISTENT).
    mbarrier.init(q_bar, count=128 if PERSISTENT else 256)
    mbarrier.init(q_free, count=2)
    if PDL:  # launched as a programmatic dependent: nothing above touches global memory
        wait_for_prior_grid()
    if STAGGER > 0:
        stagger_start(pid, n_tiles, topk_length_ptr, h_q, topk, HAS_TOPK_LENGTH, STAGGER)

    kv_scale = gl.load(kv_scale_ptr)
    # fp32 whatever type sm_scale arrives as (Inductor may pass a Python float as fp64).
    scale_log2 = (sm_scale * gl.load(q_scale_ptr) * kv_scale * 1.4426950408889634).to(
        gl.float32)
    n_rows = topk  # the partitions find each tile's (PERSISTENT)
    if not PERSISTENT:
        n_rows = rows_to_attend(topk_length_ptr, errors_ptr, token, topk, head_block,
                                HAS_TOPK_LENGTH, HAS_ERRORS)

    # The proxy fence orders Q's generic stores before the consumers' wgmma reads. With
    # Q_ASYNC the consumers copy Q after the fork, while the producer starts gathering; with
    # PERSISTENT the producer copies each tile's.
    if not (Q_ASYNC or PERSISTENT):
        store_q(q_ptr, q_nope, q_rope, token, h_q, head0, D_QK)
    fence_async_shared()
    thread_barrier()

    gl.warp_specialize([
        (_consumer, (0, attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr, topk_length_ptr, token,
                     head0, h_q, n_rows, topk, n_tiles, scale_log2, kv_scale, q_ptr, q_nope,
                     q_rope, k_nope, k_rope, vt, bias, p_smem, mx, lsum, k_ready, k_free,
                     vt_ready, vt_free, p_bar, mx_bar, l_bar, q_bar, q_free, D_QK,
                     HAS_ATTN_SINK, HAS_TOPK_LENGTH, NUM_STAGES, NUM_VT, TR_CONS, TR_COLS,
                     VT_LDSM, TR_EARLY, Q_ASYNC, PERSISTENT, O_STORE, QK_PREC)),
        (_consumer_1, (attn_sink_ptr, out_ptr, max_logits_ptr, lse_ptr, topk_length_ptr, token,
                       head0, h_q, n_rows, topk, n_tiles, scale_log2, kv_scale, q_ptr, q_nope,
                       q_rope, k_nope, k_rope, vt, bias, p_smem, mx, lsum, k_ready, k_free,
                       vt_ready, vt_free, p_bar, mx_bar, l_bar, q_bar, q_free, D_QK,
                       HAS_ATTN_SINK, HAS_TOPK_LENGTH, NUM_STAGES, NUM_VT, TR_CONS, TR_COLS,
                       VT_LDSM, TR_EARLY, Q_ASYNC, PERSISTENT, O_STORE, QK_PREC)),
        (_producer, (kv_ptr, indices_ptr, topk_length_ptr, errors_ptr, q_ptr, token, n_rows,
                     s_kv, h_q, topk, n_tiles, q_nope, q_rope, k_nope, k_rope, vt, bias,
                     idx_smem, k_ready, k_free, vt_ready, vt_free, q_bar, q_free, D_QK,
                     NUM_STAGES, NUM_VT, LAG, TR_CONS, TR_COLS, VT_LDSM, HAS_TOPK_LENGTH,
                     HAS_ERRORS, PERSISTENT)),
    ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])


def constexprs(d_qk: int, has_topk_length: bool, has_attn_sink: bool, has_errors: bool,
               **tuning) -> dict:
    """The kernel's compile-time arguments for a call (``tuning`` overrides entries of
    ``TUNING``); ``max_regs`` is a launch option, not among them."""
    t = tuned(TUNING, tuning)
    return dict(D_QK=d_qk, HAS_TOPK_LENGTH=has_topk_length, HAS_ATTN_SINK=has_attn_sink,
                HAS_ERRORS=has_errors, NUM_STAGES=t["num_stages"], NUM_VT=t["num_vt"],
                LAG=t["lag"], TR_CONS=t["tr_cons"], TR_COLS=t["tr_cols"], VT_LDSM=t["vt_ldsm"],
                TR_EARLY=t["tr_early"], Q_ASYNC=t["q_async"] and not t["persistent"],
                PERSISTENT=t["persistent"],
                # O through the consumers' Vᵀ halves: stored by the threads (1) or by TMA (2)
                O_STORE=2 if t["o_tma"] else int(t["o_smem"] and t["tr_cons"]),
                CONSUMER_REGS=t["consumer_regs"], PRODUCER_REGS=t["producer_regs"],
                PDL=t["pdl"], STAGGER=t["stagger"] if t["persistent"] else 0,
                QK_PREC=t["qk_prec"])


def launch(*args, **tuning):
    """Launch the kernel on validated CUDA tensors on an sm_90 GPU (the caller checks both):
    ``args`` as for ``strictops_kernels::sparse_mla_ws_launch``, ``tuning`` overrides entries of
    ``TUNING``. One CTA per tile (token and 64 heads), or with ``persistent`` one per SM at
    most. With ``o_tma`` the CTAs' descriptors of O live in Triton's global scratch, allocated
    from torch for this launch only. Returns the compiled kernel."""
    q = args[0]
    programs, extra = programs_and_extra(q.shape[0] * (q.shape[1] // BLOCK_H), q.device.index,
                                         **tuning)
    run = functools.partial(launch_kernel, sparse_mla_hopper_kernel, constexprs, TUNING, *args,
                            programs=programs, extra=extra, **tuning)
    if not tuning.get("o_tma", TUNING["o_tma"]):  # launch_kernel checks the keys
        return run()
    # In a copied context: the allocator is set for this launch only.
    return contextvars.copy_context().run(_with_torch_scratch, q.device, run)


def _with_torch_scratch(device, run):
    """``run()`` with Triton's global scratch allocated from torch on ``device``."""
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.uint8,
                                                                      device=device))
    return run()


def programs_and_extra(tiles: int, device: int, **tuning) -> tuple[int, dict]:
    """The CTAs to launch for ``tiles`` tiles (tokens x head blocks) on CUDA device
    ``device``, and the runtime parameters the kernel takes after the 15 both Gluon kernels
    share (by name, in order)."""
    programs = tiles
    if tuning.get("persistent", TUNING["persistent"]):
        programs = min(tiles, sm_count(device))
    return programs, {"n_tiles": tiles}


@functools.cache
def sm_count(device: int) -> int:
    """The number of SMs of CUDA device ``device``."""
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count
