"""The V transpose of the block-pair sparse MLA kernel (``gluon_block_pair``) by
``ldmatrix.trans``, ``prmt`` and ``stmatrix``, the register relabellings that go with it, and
the kernel's other uses of its Vᵀ buffers: a consumer's transpose of its half of a block
(:func:`transpose_block`, by either method) and O stored through them, by the threads
(:func:`store_o_through_vt`) or by TMA (:func:`out_descriptor`, :func:`store_o_by_tma`).

V [64 rows n, 512 columns d] (FP8, a gathered block in shared memory, 128-byte swizzle) becomes
Vᵀ [512, 64] (64-byte swizzle, the K-major B operand of the P·V ``wgmma``) with V[n][d] at
Vᵀ[ρ(d)][σ(n)]: σ moves bit 3 of n to bit 1 (bits 1, 2 up to 2, 3) and ρ swaps bits 0 and 3 of
d, so that every 8x8 matrix of ``ldmatrix`` and ``stmatrix`` covers 8 distinct 16-byte bank
groups. The kernel stores P with its columns in σ order and reads O's columns in ρ order.
Why and the SASS: ``docs/design/sparse_mla_prefill.md`` (V transpose by ldmatrix.trans and
stmatrix).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from strictops.ops._runtime.gluon_compat import reinterpret, thread_barrier, tma_store

__all__ = ["O_COLS", "P_COLS", "TR_JOIN", "TR_SPLIT", "output_columns", "p_columns",
           "out_descriptor", "store_o_by_tma", "store_o_through_vt", "transpose_block",
           "transpose_ldsm", "views16"]

# Permutations of the index bits (most significant first); the test models them.
TR_SPLIT = gl.constexpr((0, 1, 3, 4, 6, 5, 2))  # [n5 n4 n3 n2 n1 n0 j] -> [n5 n4 n2 n1 j n0 n3]
TR_JOIN = gl.constexpr((4, 9, 6, 7, 5, 0, 1, 2, 3, 8))  # -> [j>>3, d0, j1, j0, j2 | σ(n) >> 1]
P_COLS = gl.constexpr((0, 1, 2, 4, 5, 3, 6))  # [h n5 n4 n3 n2 n1 n0] -> [h | σ(n)]
O_COLS = gl.constexpr((0, 1, 5, 3, 4, 2))  # [h r>>4 r3 r2 r1 r0] -> [h | ρ(r)]


@gluon.constexpr_function
def _vt_load_layout(j):
    """Registers of V read as int16 ``[64 rows, j]`` (two FP8 columns a word) the way
    ``ldmatrix.trans`` delivers them: register 0 holds rows n, n + 1 (one 32-bit register),
    lanes 0-1 rows +2, +4 (eight consecutive rows per 8x8 matrix: the 128-byte swizzle puts
    them in distinct banks), lanes 2-4 the eight words of a 16-byte row, registers 1-3 rows
    +8, +16, +32, warps words +8, +16, further registers words +32, +64."""
    reg = [[1, 0], [8, 0], [16, 0], [32, 0]]
    k = 32
    while k < j:
        reg.append([0, k])
        k *= 2
    return gl.DistributedLinearLayout(reg, [[2, 0], [4, 0], [0, 1], [0, 2], [0, 4]],
                                      [[0, 8], [0, 16]], [], [64, j])


@gluon.constexpr_function
def _packs_rows(layout):
    """Whether register 0 of ``layout`` (linear) steps along the last axis (rows n, n + 1)."""
    return layout.reg_bases[0] == [0] * (len(layout.shape) - 1) + [1]


@gluon.jit
def transpose_ldsm(src, dst, J: gl.constexpr):
    """``Vᵀ[ρ(d)][σ(n)] = V[n][d]`` for FP8 ``V`` [64 rows n, 2J columns d] given as its int16
    view ``src`` [64, J] (word j: columns 2j, 2j + 1), into ``dst``, the int16 view [2J, 32]
    of ``Vᵀ`` [2J, 64]. Per thread per 8 bytes: half an ``ldmatrix.trans`` (x4), 2 ``PRMT``,
    half an ``stmatrix`` (x4); both access 8 distinct 16-byte bank groups per matrix."""
    x = gl.reshape(src.load(_vt_load_layout(J)), [2, 2, 2, 2, 2, 2, J])
    a, b = gl.split(gl.permute(x, TR_SPLIT.value))  # rows with bit 3 clear, set
    gl.static_assert(_packs_rows(gl.to_linear_layout(a.type.layout, a.shape)),
                     "inline asm packs registers 0 and 1: they must hold rows n, n + 1")
    # A register of a packs words j of rows n, n + 1: bytes V[n][2j], V[n][2j + 1],
    # V[n + 1][2j], V[n + 1][2j + 1]; of b, rows n + 8, n + 9. o0 gets column 2j of the four
    # rows, o1 column 2j + 1: Vᵀ words in σ order.
    o0, o1 = gl.inline_asm_elementwise(
        "prmt.b32 $0, $2, $3, 0x6420;\n\tprmt.b32 $1, $2, $3, 0x7531;", "=r,=r,r,r", [a, b],
        dtype=(gl.int16, gl.int16), is_pure=True, pack=2)
    y = gl.reshape(gl.join(o0, o1), [2, 2, 2, 2, J // 8, 2, 2, 2, 2, 2])
    dst.store(gl.reshape(gl.permute(y, TR_JOIN.value), [2 * J, 32]))


@gluon.constexpr_function
def _pairs_first(layout):
    """``layout`` (linear, 2-D) with the register basis of the next column first, so that
    stores write two columns at once."""
    reg = [list(b) for b in layout.reg_bases]
    i = reg.index([0, 1])
    reg[0], reg[i] = reg[i], reg[0]
    return gl.DistributedLinearLayout(reg, layout.lane_bases, layout.warp_bases,
                                      layout.block_bases, layout.shape)


@gluon.jit
def p_columns(p):
    """P [64, 64] with column σ(n) holding column n (the same registers, relabelled)."""
    return gl.reshape(gl.permute(gl.reshape(p, [64, 2, 2, 2, 2, 2, 2]), P_COLS.value), [64, 64])


@gluon.jit
def output_columns(o):
    """O [64, 256] of a P·V on a Vᵀ slice of 256 rows, with column ρ(r) holding column r: the
    output's column order (registers relabelled, then renamed so that stores pair columns)."""
    o = gl.reshape(gl.permute(gl.reshape(o, [64, 16, 2, 2, 2, 2]), O_COLS.value), [64, 256])
    return gl.convert_layout(o, _pairs_first(o.type.layout))


@gluon.jit
def views16(k_nope, vt, NUM_STAGES: gl.constexpr, NUM_VT: gl.constexpr):
    """int16 views of the gathered rows' first 512 columns and of the Vᵀ buffers (the same
    bytes: the swizzles permute 16-byte chunks)."""
    return (reinterpret(k_nope, gl.int16, [NUM_STAGES, 64, 256], gl.NVMMASharedLayout(128, 16)),
            reinterpret(vt, gl.int16, [NUM_VT, 512, 32], gl.NVMMASharedLayout(64, 16)))


@gluon.jit
def transpose_block(C: gl.constexpr, q: gl.constexpr, p, k_nope, vt, k_ready, k_free,
                    NUM_STAGES: gl.constexpr, NUM_VT: gl.constexpr, TR_COLS: gl.constexpr,
                    VT_LDSM: gl.constexpr):
    """Half ``C`` of V of block ``b = 2p + q``, transposed into rows ``[256C, 256C + 256)`` of
    ``vt[b % NUM_VT]``, ``TR_COLS`` columns per load; releases the block if it is the other
    consumer's. The caller fences and synchronises before the P·V reads."""
    # [64 rows, 64 columns] per 8 x 4 bytes of a thread, stored transposed as 4 groups of 8
    # contiguous bytes.
    tr_layout: gl.constexpr = gl.BlockedLayout([8, 4], [8, 4], [1, 4], [1, 0])
    b = 2 * p + q
    s = b % NUM_STAGES
    v = b % NUM_VT
    if q != C:  # this consumer's own block was waited for before its Q·Kᵀ
        mbarrier.wait(k_ready.index(s), (b // NUM_STAGES) & 1)
    for c in gl.static_range(C * 256, C * 256 + 256, TR_COLS):
        if VT_LDSM:
            k16, vt16 = views16(k_nope, vt, NUM_STAGES, NUM_VT)
            transpose_ldsm(k16.index(s).slice(c // 2, TR_COLS // 2, dim=1),
                           vt16.index(v).slice(c, TR_COLS, dim=0), TR_COLS // 2)
        else:
            x = k_nope.index(s).slice(c, TR_COLS, dim=1).load(tr_layout)
            vt.index(v).slice(c, TR_COLS, dim=0).store(gl.permute(x, (1, 0)))
    if q != C:
        mbarrier.arrive(k_free.index(s))


@gluon.jit
def store_o_through_vt(C: gl.constexpr, out, out_ptr, row_of_head, vt, NUM_VT: gl.constexpr):
    """Store this consumer's bf16 O [64, 256] (output columns ``[256C, 256C + 256)``) through
    its halves of the first two Vᵀ buffers (no P·V of this consumer reads them until its next
    transposes): 128 columns into each, then read back 16 bytes a thread and stored as whole
    rows (16-byte stores instead of 4-byte ones)."""
    # [2v + c]: half c of vt[v] (16 KiB), as [64, 128] bf16.
    o_buf = reinterpret(vt, gl.bfloat16, [2 * NUM_VT, 64, 128], gl.NVMMASharedLayout(128, 16))
    lo, hi = gl.split(gl.permute(gl.reshape(out, [64, 2, 128]), (0, 2, 1)))
    o_buf.index(C).store(lo)
    o_buf.index(2 + C).store(hi)
    thread_barrier()
    row_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    rows = gl.convert_layout(row_of_head, gl.SliceLayout(1, row_layout))
    cols = gl.arange(0, 128, gl.SliceLayout(0, row_layout))
    for h in gl.static_range(2):
        x = o_buf.index(2 * h + C).load(row_layout)
        gl.store(out_ptr + gl.expand_dims(rows, 1) * 512 + gl.expand_dims(C * 256 + h * 128
                                                                          + cols, 0), x)
    thread_barrier()  # every warp's reads, before its next transposes overwrite Vᵀ


@gluon.jit
def out_descriptor(out_ptr, rows):
    """A TMA descriptor of ``out`` as ``[rows, 512]`` bf16 in boxes of ``[64, 64]`` (128-byte
    swizzle), made on the device (Triton's global scratch holds it: the launch needs an
    allocator, ``triton.set_allocator``)."""
    return tma.make_tensor_descriptor(out_ptr, [rows, 512], [512, 1], [64, 64],
                                      gl.NVMMASharedLayout(128, 16))


@gluon.jit
def store_o_by_tma(C: gl.constexpr, out, desc, row0, vt, NUM_VT: gl.constexpr):
    """Store this consumer's bf16 O [64, 256] (output columns ``[256C, 256C + 256)``, rows
    ``row0 + [0, 64)`` of ``desc``) through its halves of the first two Vᵀ buffers as four
    ``[64, 64]`` boxes (8 KiB each, 128-byte swizzle), each sent by one asynchronous TMA store.
    The stores read shared memory after this returns: the caller waits for them
    (``tma.store_wait(0)``, then a barrier) before it next writes those halves."""
    # [4v + 2c + k]: columns [64k, 64k + 64) of half c of vt[v] (16 KiB), as [64, 64] bf16.
    boxes = reinterpret(vt, gl.bfloat16, [4 * NUM_VT, 64, 64], gl.NVMMASharedLayout(128, 16))
    # Columns 64j + x of O, j = 2 j1 + j0, go to box 4 j1 + 2C + j0.
    j0_0, j0_1 = gl.split(gl.permute(gl.reshape(out, [64, 2, 2, 64]), (0, 3, 1, 2)))
    box_0, box_2 = gl.split(j0_0)
    box_1, box_3 = gl.split(j0_1)
    boxes.index(2 * C).store(box_0)
    boxes.index(2 * C + 1).store(box_1)
    boxes.index(2 * C + 4).store(box_2)
    boxes.index(2 * C + 5).store(box_3)
    fence_async_shared()  # generic stores, then the TMA (async proxy) reads
    thread_barrier()
    for j in gl.static_range(4):
        tma_store(desc, [row0, C * 256 + 64 * j], boxes.index(4 * (j // 2) + 2 * C + j % 2))
