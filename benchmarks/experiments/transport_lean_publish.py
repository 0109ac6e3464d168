"""The one-launch publish taken apart: its code shape and arrival, side by side with the
original and the op, in CUDA-graph replay at 64 KiB and 1 MiB, with the flag ordered for every
observer ("peers", system scope), and the bounds that place it.

``_lean_publish_kernel`` does the op's one-launch work (``strictops.ops.transport.pool``,
``PHASE_BOTH``: the lease read from its device tensor and checked with the op's terms, any
``nbytes`` up to the source's size, a partial block as whole 16-byte vectors under a mask whose
bound is a multiple of 16 and then its last bytes), with switches:

- ``hoist``: 0, the source load under a branch on the block being whole (ptxas then computes
  the lease checks, which wait for the lease's DRAM round trip, before it issues the source
  load: two round trips in a row); 1, the load unconditional under a 16-byte-vector mask; 2, and
  a CTA barrier after it, which ptxas moves no memory access across (the op's code);
- ``arrive``: after a CTA barrier, one thread's GPU-scope acquire-release add on the counter
  and, in the last program, the flag's ``st.release.sys`` (``ARRIVE_CTA``, the op's); each
  warp's lane 0 arriving after a warp barrier (``ARRIVE_WARP``); a system-scope fence in every
  program before a relaxed add, and again in the last (``ARRIVE_SYS_FIRST``);
- ``prefetch``: thread 0 of each program asks L2 for the counter's line
  (``prefetch.global.L2``) right after issuing the source load. The flush before each replay
  leaves that line in DRAM, so without it each arrival's atomic waits for a DRAM round trip
  after the program's copy; in the sm_90 SASS the prefetch (``CCTL.E.PF2``) issues after the
  source loads and before the CTA barrier, so that round trip overlaps the copy's.

What orders the bytes before the flag (``ARRIVE_CTA``): each thread's stores precede the
barrier; the arriving thread's ``atom.acq_rel.gpu`` releases them, cumulatively, and the last
one acquires every earlier arrival's; its ``st.release.sys`` of the flag is cumulative, so it
orders every store that happens before it, for observers anywhere in the system.

Bounds, not candidates: ``copy only`` (no counter, no flag); ``no counter`` (program 0 writes
the flag after its own stores: nothing orders the other programs' bytes); ``one program ... no
counter`` (the same with one 64 KiB program, which at 64 KiB is a correct publish: its own
stores are all the bytes, so no counter is needed; the price is one SM's bandwidth);
``GPU scope`` (the flag's release at GPU scope) and the op with ``consumers="same_device"``:
the system scope's cost; ``copy_`` alone, the original's copy node without its write node; a
bare copy kernel (addresses as arguments, no lease); the one-element ``add_`` (a graph's launch
floor).

Times, µs per publish (medians over the rounds of ``transport_flag_variants.sample``, the
variants alternating within a round): ``graph_us``, one publish per graph, L2 flushed before
each replay; ``graph20_us``, 20 back-to-back publishes per graph, per publish. Every candidate
is checked bit for bit (the lease's bytes, the ready word, no refused lease) after an eager
call and after a replay, also with an ``nbytes`` that ends inside a block and inside a 16-byte
vector.

    python benchmarks/experiments/transport_lean_publish.py --out $OUT/lean_publish.json
    python benchmarks/experiments/transport_lean_publish.py --only "prefetch|GPU scope"

``--only`` times the publishers whose name holds one of the ``|``-separated substrings, beside
the original and the op.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from strictops.meta.transport import pool as contract
from strictops.ops.transport import pool as m

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from transport_flag_variants import (  # noqa: E402
    CONSUMERS, SLOTS, _inputs, bit_exact, candidate_rows, main_of, original_and_op, sample,
    selected, write_rows)

SIZES = [("64KiB", 64 << 10), ("1MiB", 1 << 20)]
ARRIVE_NONE, ARRIVE_CTA, ARRIVE_WARP, COPY_ONLY, ARRIVE_SYS_FIRST = 0, 1, 2, 3, 4


@triton.jit
def _read_lease(pool_ptr, lease_ptr, memory_size, src_nbytes, data_start, slot_bytes, n_slots):
    """The lease read from its tensor and checked with the op's terms (``lease_fits``):
    ``(fits, nbytes, generation, dst_ptr, ready_ptr)``. Inlined into each kernel here."""
    start = tl.load(lease_ptr + 0)
    end = tl.load(lease_ptr + 1)
    nbytes = tl.load(lease_ptr + 2)
    slot = tl.load(lease_ptr + 3)
    generation = tl.load(lease_ptr + 4)
    ready = tl.load(lease_ptr + 5)
    ack = tl.load(lease_ptr + 6)
    fits = (start >= data_start) & (start <= end) & (end <= memory_size)
    fits = fits & (start % 256 == 0) & (nbytes > 0) & (nbytes <= end - start)
    fits = fits & (nbytes <= src_nbytes) & (slot >= 0) & (slot < n_slots)
    fits = fits & (ready == slot * slot_bytes) & (ack == ready + 4)
    fits = fits & (generation > 0) & (generation <= 0x7FFFFFFF)
    dst_ptr = pool_ptr + (start // 256) * 256
    ready_ptr = (pool_ptr + ready).to(tl.pointer_type(tl.int32))
    return fits, nbytes, generation, dst_ptr, ready_ptr


@triton.jit
def _lean_publish_kernel(pool_ptr, src_ptr, lease_ptr, state_ptr, memory_size, src_nbytes,
                         data_start, slot_bytes, n_slots, BLOCK: tl.constexpr,
                         ARRIVE: tl.constexpr, LAST: tl.constexpr, SYSTEM: tl.constexpr,
                         HOIST: tl.constexpr, PREFETCH: tl.constexpr):
    """Grid ``(cdiv(src_nbytes, BLOCK),)``. ``LAST``: the number of arrivals less one
    (programs, or programs times warps for ``ARRIVE_WARP``). ``PREFETCH``: thread 0 of each
    program asks L2 for the counter's line (``prefetch.global.L2``) after issuing the source
    load, so that the arrivals do not wait for its DRAM round trip when L2 is cold."""
    block_start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = tl.arange(0, BLOCK)
    if HOIST:
        # Unconditional: the source's whole 16-byte vectors of the block (a mask whose bound
        # is a multiple of 16 keeps 16-byte accesses), so no branch holds the load back.
        src_vectors = (src_nbytes // 16 * 16 - block_start).to(tl.int32)
        data = tl.load(src_ptr + block_start + offs, mask=offs < src_vectors, volatile=True)
        if PREFETCH:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; .reg .b32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0;"
                " @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                "=r,l", [state_ptr], dtype=tl.int32, is_pure=False, pack=1)
        if HOIST == 2:
            # ptxas moves no memory access across a CTA barrier: the lease loads, and the
            # checks that wait for them, stay behind the source load's issue.
            tl.debug_barrier()
    elif block_start + BLOCK <= src_nbytes:
        data = tl.load(src_ptr + block_start + offs, volatile=True)
    else:
        data = tl.zeros([BLOCK], dtype=tl.uint8)
    fits, nbytes, generation, dst_ptr, ready_ptr = _read_lease(
        pool_ptr, lease_ptr, memory_size, src_nbytes, data_start, slot_bytes, n_slots)
    if fits:
        if block_start + BLOCK <= nbytes:
            tl.store(dst_ptr + block_start + offs, data)
        else:
            # The block holding the end of nbytes, or past it (every mask empty).
            vector_end = nbytes // 16 * 16
            in_vectors = offs < (vector_end - block_start).to(tl.int32)
            tail = tl.load(src_ptr + block_start + offs, mask=in_vectors)
            tl.store(dst_ptr + block_start + offs, tail, mask=in_vectors)
            last = tl.arange(0, 16)
            in_last = (last < (nbytes - vector_end).to(tl.int32)) & (vector_end >= block_start)
            in_last = in_last & (vector_end < block_start + BLOCK)
            byte = tl.load(src_ptr + vector_end + last, mask=in_last)
            tl.store(dst_ptr + vector_end + last, byte, mask=in_last)
        flag = generation.to(tl.int32)
        if ARRIVE == 1:
            tl.debug_barrier()
            if SYSTEM:
                tl.inline_asm_elementwise(
                    "{ .reg .pred p, q; .reg .b32 t, old; mov.u32 t, %tid.x;"
                    " setp.eq.u32 p, t, 0; @p atom.acq_rel.gpu.global.add.u32 old, [$3], 1;"
                    " setp.eq.and.u32 q, old, $4, p; @q st.release.sys.global.b32 [$1], $2;"
                    " @q st.relaxed.gpu.global.b32 [$3], 0; mov.u32 $0, 0; }",
                    "=r,l,r,l,r", [ready_ptr, flag, state_ptr, LAST], dtype=tl.int32,
                    is_pure=False, pack=1)
            else:
                tl.inline_asm_elementwise(
                    "{ .reg .pred p, q; .reg .b32 t, old; mov.u32 t, %tid.x;"
                    " setp.eq.u32 p, t, 0; @p atom.acq_rel.gpu.global.add.u32 old, [$3], 1;"
                    " setp.eq.and.u32 q, old, $4, p; @q st.release.gpu.global.b32 [$1], $2;"
                    " @q st.relaxed.gpu.global.b32 [$3], 0; mov.u32 $0, 0; }",
                    "=r,l,r,l,r", [ready_ptr, flag, state_ptr, LAST], dtype=tl.int32,
                    is_pure=False, pack=1)
        elif ARRIVE == 4:
            # The system-scope fence in every program before a relaxed arrival, and again
            # (the acquire of the other programs' arrivals, and the flag's release) in the
            # last one.
            tl.debug_barrier()
            tl.inline_asm_elementwise(
                "{ .reg .pred p, q; .reg .b32 t, old; mov.u32 t, %tid.x;"
                " setp.eq.u32 p, t, 0; @p fence.acq_rel.sys;"
                " @p atom.relaxed.gpu.global.add.u32 old, [$3], 1;"
                " setp.eq.and.u32 q, old, $4, p; @q fence.acq_rel.sys;"
                " @q st.relaxed.sys.global.b32 [$1], $2;"
                " @q st.global.b32 [$3], 0; mov.u32 $0, 0; }",
                "=r,l,r,l,r", [ready_ptr, flag, state_ptr, LAST], dtype=tl.int32,
                is_pure=False, pack=1)
        elif ARRIVE == 2:
            tl.inline_asm_elementwise(
                "{ .reg .pred p, q; .reg .b32 t, old; mov.u32 t, %laneid; bar.warp.sync -1;"
                " setp.eq.u32 p, t, 0; @p atom.acq_rel.gpu.global.add.u32 old, [$3], 1;"
                " setp.eq.and.u32 q, old, $4, p; @q st.release.sys.global.b32 [$1], $2;"
                " @q st.relaxed.gpu.global.b32 [$3], 0; mov.u32 $0, 0; }",
                "=r,l,r,l,r", [ready_ptr, flag, state_ptr, LAST], dtype=tl.int32,
                is_pure=False, pack=1)
        elif ARRIVE == 0:
            tl.debug_barrier()
            if block_start == 0:
                tl.inline_asm_elementwise(
                    "{ .reg .pred p; .reg .b32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0;"
                    " @p st.release.sys.global.b32 [$1], $2; mov.u32 $0, 0; }",
                    "=r,l,r", [ready_ptr, flag], dtype=tl.int32, is_pure=False, pack=1)
    else:
        if block_start == 0:
            tl.atomic_add(state_ptr + 1, 1, sem="relaxed", scope="gpu")


@triton.jit
def _bare_copy_kernel(dst_ptr, src_ptr, BLOCK: tl.constexpr, VOLATILE: tl.constexpr):
    """A bound: the copy alone, addresses as kernel arguments, no lease; grid
    ``(nbytes // BLOCK,)``."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, volatile=VOLATILE))


class Variant(NamedTuple):
    name: str
    block: int
    num_warps: int
    arrive: int = ARRIVE_CTA
    system: bool = True
    candidate: bool = True
    hoist: int = 0  # 1: the source load unconditional; 2: and a CTA barrier after it
    prefetch: bool = False  # the counter's line asked of L2 at the start


VARIANTS = [
    Variant("lean 4KiB/4w", 4096, 4),
    Variant("lean 4KiB/4w, hoisted", 4096, 4, hoist=1),
    Variant("lean 4KiB/4w, hoisted, barrier", 4096, 4, hoist=2),
    Variant("lean 2KiB/4w, hoisted, barrier", 2048, 4, hoist=2),
    Variant("lean 8KiB/8w, hoisted, barrier", 8192, 8, hoist=2),
    Variant("lean 16KiB/8w, hoisted, barrier", 16384, 8, hoist=2),
    Variant("lean 4KiB/4w, hoisted, warp arrivals", 4096, 4, ARRIVE_WARP, hoist=2),
    Variant("lean 8KiB/8w, hoisted, sys fence first", 8192, 8, ARRIVE_SYS_FIRST, hoist=2),
    Variant("lean 8KiB/8w, hoisted, barrier, prefetch", 8192, 8, hoist=2, prefetch=True),
    Variant("lean 4KiB/4w, hoisted, barrier, prefetch", 4096, 4, hoist=2, prefetch=True),
    Variant("lean 2KiB/4w, hoisted, barrier, prefetch", 2048, 4, hoist=2, prefetch=True),
    Variant("lean 16KiB/8w, hoisted, barrier, prefetch", 16384, 8, hoist=2, prefetch=True),
    Variant("lean 16KiB/16w, hoisted, barrier, prefetch", 16384, 16, hoist=2, prefetch=True),
    Variant("bound: 8KiB/8w GPU scope, prefetch", 8192, 8, ARRIVE_CTA, False, False, 2, True),
    Variant("bound: 4KiB/4w GPU scope, barrier", 4096, 4, ARRIVE_CTA, False, False, 2),
    Variant("bound: 4KiB/4w no counter, barrier", 4096, 4, ARRIVE_NONE, True, False, 2),
    Variant("bound: one program 64KiB/32w, no counter", 65536, 32, ARRIVE_NONE, True, False, 2),
    Variant("bound: one program 64KiB/16w, no counter", 65536, 16, ARRIVE_NONE, True, False, 2),
    Variant("bound: 4KiB/4w copy only, barrier", 4096, 4, COPY_ONLY, True, False, 2),
    Variant("bound: 4KiB/4w copy only", 4096, 4, COPY_ONLY, True, False),
]


def _candidate(v: Variant, pool, src, lease_t, state):
    nbytes = src.numel()
    programs = triton.cdiv(nbytes, v.block)
    last = programs * (v.num_warps if v.arrive == ARRIVE_WARP else 1) - 1
    layout = (pool.numel(), nbytes, contract.data_start(SLOTS, CONSUMERS),
              contract.slot_bytes(CONSUMERS), SLOTS)

    def publish():
        _lean_publish_kernel[(programs,)](pool, src, lease_t, state, *layout, BLOCK=v.block,
                                          ARRIVE=v.arrive, LAST=last, SYSTEM=v.system,
                                          HOIST=v.hoist, PREFETCH=v.prefetch,
                                          num_warps=v.num_warps)
    return publish


def _exact_partial(v: Variant, pool, src, state, lease) -> bool:
    """Bit-exact with ``nbytes`` ending inside a block and inside a 16-byte vector, and the
    bytes past it untouched."""
    ok = True
    for nbytes in (lease.nbytes - v.block // 2 - 5, lease.nbytes - 3, 17):
        short = lease._replace(nbytes=nbytes)
        lease_t = torch.tensor(short, device="cuda")
        pool.zero_()
        _candidate(v, pool, src, lease_t, state)()
        torch.cuda.synchronize()
        word = pool[short.ready_byte_offset:short.ready_byte_offset + 4].view(torch.int32)
        ok &= torch.equal(pool[short.start:short.start + nbytes], src[:nbytes])
        ok &= not bool(pool[short.start + nbytes:].any())
        ok &= int(word) == short.generation and int(state[contract.ERRORS]) == 0
    return bool(ok)


def measure(out: Path | None, only: list | None = None) -> None:
    rows = []
    for size, nbytes in SIZES:
        pool, src, lease_t, state, lease = _inputs("cuda", nbytes)
        dst = pool[lease.start:lease.start + nbytes]
        publishers = original_and_op(pool, src, lease_t, state, lease)
        publishers["copy_ alone"] = lambda: dst.copy_(src)
        publishers.update({v.name: _candidate(v, pool, src, lease_t, state) for v in VARIANTS})
        publishers["op, same_device"] = lambda: m.copy_and_publish(
            pool, src, lease_t, state, SLOTS, CONSUMERS, contract.SAME_DEVICE)
        one = torch.zeros(1, device="cuda")
        publishers["bound: trivial kernel"] = lambda: one.add_(1)
        publishers["bound: bare copy 4KiB/4w volatile"] = lambda: _bare_copy_kernel[
            (nbytes // 4096,)](dst, src, BLOCK=4096, VOLATILE=True, num_warps=4)
        publishers = selected(publishers, only)
        exact = bit_exact({name: p for name, p in publishers.items()
                           if "bound" not in name and name != "copy_ alone"},
                          pool, src, state, lease)
        for v in VARIANTS:
            if v.candidate and v.name in publishers:
                exact[v.name] = exact[v.name] and _exact_partial(v, pool, src, state, lease)
        rows += candidate_rows(size, nbytes, sample(publishers), exact)
    write_rows(out, rows)


def main() -> None:
    main_of(measure, __doc__)


if __name__ == "__main__":
    main()
