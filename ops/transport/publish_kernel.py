"""The transport pool's publish kernel, ``_publish_kernel``: a copy into a lease of the pool,
then the lease's ready word, ordered for the pool's consumers. The op around it is
:mod:`strictops.ops.transport.pool`.

One Triton launch copies ``lease.nbytes`` bytes of ``src`` to ``pool[lease.start:]`` and then
writes ``lease.generation`` into ``pool``'s int32 word at ``lease.ready_byte_offset``. Every byte
is visible before the flag, across programs, by a last-arrival counter: each program copies its
blocks, passes a CTA barrier (``tl.debug_barrier``: every thread's stores precede what thread 0
does next) and adds 1 to ``state[ARRIVALS]`` with acquire-release semantics at GPU scope (a
release of the CTA's stores, and an acquire of those of every program that arrived before it).
The program that arrives last therefore sees every byte of the copy; it writes the flag with a
release and then resets the counter to 0 for the next launch. This is the pattern of CUDA's own
grid-wide barrier (bar.sync, then one thread's fenced atomic). The counter is per ``state``
tensor: two publishes that may run concurrently need two ``state`` tensors (the pool keeps one
per slot).

The flag's release has the scope of ``consumers``, a trace-time constant (the kernel's
``SYSTEM`` constexpr). ``"peers"``, the default: system scope (``st.release.sys``), which orders
the whole copy before the flag for every observer, on this GPU, on a peer GPU that maps the
pool (a consumer that waits for the word with ``cuStreamWaitValue32`` on its own device and
reads the bytes over NVLink), or on the host; ``cuStreamWriteValue32``, which the original
uses, puts a system-wide barrier before its write for the same reason. ``"same_device"``: GPU
scope (``st.release.gpu``), enough when every consumer waits and reads on the pool's GPU, and
cheaper. Only the flag needs the wider scope: a release is cumulative, so it orders every
write that precedes it, including the other programs' bytes that the GPU-scope arrivals made
visible to the flag's program (``docs/design/transport_pool.md``).

Above 1 MiB (in a CUDA graph or a trace; above 16 MiB in a plain eager call, whose host time
is the publish's) the same kernel runs as two launches instead: the copy of every whole block, with
no counter and no mask, then one program that copies the partial last block (if any) and
writes the flag (a release of the consumers' scope after a CTA barrier, as above); the stream
orders the copy kernel before it. On sm_90+ that program is a programmatic dependent launch:
it is resident before the copy ends, copies the partial block, and waits
(``griddepcontrol.wait``) for the copy grid to complete and its memory to be visible, the
guarantee stream order gives, before it writes the flag. One launch saves the second launch,
most of a small publish; but every program of one launch adds an atomic on one counter word,
which at large sizes costs more than the second launch (``TUNING`` in the op's module).
Keeping the masked partial block out of the many-program copy kernel keeps that kernel's
registers low (``ptxas`` allocates for the union of a kernel's paths), hence many programs
per SM and many bytes in flight.

Why each tuning and code-shape choice, with the measurements: ``docs/design/transport_pool.md``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from strictops.meta.transport.pool import (ARRIVALS, DATA_ALIGNMENT, ERRORS, MAX_GENERATION,
                                           WORD_BYTES, Lease)

# The kernel's phases (see _publish_kernel).
PHASE_BOTH, PHASE_COPY, PHASE_FLAG = 0, 1, 2
# The constants _publish_kernel defines in its body, by name (a test checks the two agree).
# They are not globals of the kernel: on every launch Triton compares each global constant a
# kernel reads with its value at compile time, which costs host time per launch
# (docs/design/transport_pool.md).
KERNEL_CONSTANTS = {
    # words of the lease tensor (the fields of Lease, in order) and of the state tensor
    "_START": Lease._fields.index("start"),
    "_END": Lease._fields.index("end"),
    "_NBYTES": Lease._fields.index("nbytes"),
    "_SLOT": Lease._fields.index("slot"),
    "_GENERATION": Lease._fields.index("generation"),
    "_READY": Lease._fields.index("ready_byte_offset"),
    "_ACK": Lease._fields.index("ack_byte_offset"),
    "_ARRIVALS": ARRIVALS,
    "_ERRORS": ERRORS,
    "_ALIGN": DATA_ALIGNMENT,
    "_WORD": WORD_BYTES,
    "_MAX_GENERATION": MAX_GENERATION,
    "_VECTOR": 16,  # bytes of the widest global access (ld/st.v4.b32)
    "_BOTH": PHASE_BOTH,
    "_COPY": PHASE_COPY,
}


@triton.jit
def _release_store(ptr, value, SYSTEM: tl.constexpr):
    """``*ptr = value`` by thread 0 of the program, a release store at system scope
    (``st.release.sys``, ``SYSTEM``) or GPU scope (``st.release.gpu``): the ordering of
    ``tl.atomic_xchg(ptr, value, sem="release", scope=...)`` without its reply, which the
    program waits for before it can end. Inline PTX, so only for a kernel launched for real
    (``PTX``): the interpreter runs none, and Inductor's analysis of a wrapped kernel's
    mutations takes any non-pure inline asm to write every argument."""
    if SYSTEM:
        tl.inline_asm_elementwise(
            "{ .reg .pred first; .reg .b32 tid; mov.u32 tid, %tid.x; setp.eq.u32 first, tid, 0;"
            " @first st.release.sys.global.b32 [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [ptr, value], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise(
            "{ .reg .pred first; .reg .b32 tid; mov.u32 tid, %tid.x; setp.eq.u32 first, tid, 0;"
            " @first st.release.gpu.global.b32 [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [ptr, value], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _arrive_and_publish(arrivals_ptr, ready_ptr, generation, last, SYSTEM: tl.constexpr):
    """Thread 0 of the program: ``old = atom.acq_rel.gpu.add(*arrivals_ptr, 1)``; if ``old ==
    last`` (every other program arrived), ``*ready_ptr = generation`` with a release at system
    scope (``SYSTEM``) or GPU scope, then ``*arrivals_ptr = 0`` for the next launch (a plain
    store, after the flag: the release would otherwise wait for it). Run after a CTA barrier,
    so that the add releases every thread's stores. One thread's inline PTX: the count needs no
    second CTA barrier to reach the thread that writes the flag. Real launches only (see
    :func:`_release_store`)."""
    if SYSTEM:
        tl.inline_asm_elementwise(
            "{ .reg .pred first, done; .reg .b32 tid, old; mov.u32 tid, %tid.x;"
            " setp.eq.u32 first, tid, 0; @first atom.acq_rel.gpu.global.add.u32 old, [$1], 1;"
            " setp.eq.and.u32 done, old, $4, first; @done st.release.sys.global.b32 [$2], $3;"
            " @done st.global.b32 [$1], 0; mov.u32 $0, 0; }",
            "=r,l,l,r,r", [arrivals_ptr, ready_ptr, generation, last], dtype=tl.int32,
            is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise(
            "{ .reg .pred first, done; .reg .b32 tid, old; mov.u32 tid, %tid.x;"
            " setp.eq.u32 first, tid, 0; @first atom.acq_rel.gpu.global.add.u32 old, [$1], 1;"
            " setp.eq.and.u32 done, old, $4, first; @done st.release.gpu.global.b32 [$2], $3;"
            " @done st.global.b32 [$1], 0; mov.u32 $0, 0; }",
            "=r,l,l,r,r", [arrivals_ptr, ready_ptr, generation, last], dtype=tl.int32,
            is_pure=False, pack=1)


@triton.jit
def _publish_flag(ready_ptr, generation, SYSTEM: tl.constexpr, PTX: tl.constexpr):
    """Write the flag: ``*ready_ptr = generation`` (int32) with a release at system scope
    (``SYSTEM``) or GPU scope; by :func:`_release_store` in a real launch (``PTX``), else by a
    release exchange of the same scope (Inductor's wrapped kernel; the interpreter, which runs
    programs one after another, so any order holds there)."""
    if PTX:
        _release_store(ready_ptr, generation, SYSTEM)
    elif SYSTEM:
        tl.atomic_xchg(ready_ptr, generation, sem="release", scope="sys")
    else:
        tl.atomic_xchg(ready_ptr, generation, sem="release", scope="gpu")


@triton.jit(do_not_specialize=["start_arg", "end_arg", "nbytes_arg", "slot_arg",
                               "generation_arg", "ready_arg", "ack_arg"])
def _publish_kernel(
    pool_ptr,
    src_ptr,
    lease_ptr,
    state_ptr,
    memory_size,
    src_nbytes,
    data_start,
    slot_bytes,
    n_slots,
    start_arg,
    end_arg,
    nbytes_arg,
    slot_arg,
    generation_arg,
    ready_arg,
    ack_arg,
    LEASE_FROM_PTR: tl.constexpr,
    BLOCK: tl.constexpr,
    PHASE: tl.constexpr,
    PDL: tl.constexpr,
    PTX: tl.constexpr,
    SYSTEM: tl.constexpr,
):
    """One phase of a publish: ``PHASE_BOTH`` (one launch), or ``PHASE_COPY`` then
    ``PHASE_FLAG`` (two).

    ``PHASE_BOTH``, grid ``(cdiv(src_nbytes, BLOCK),)``: program ``pid`` copies the bytes of
    ``[pid * BLOCK, (pid + 1) * BLOCK)`` that lie below the lease's ``nbytes`` (a partial
    block masked), then arrives at the counter; the last program to arrive writes the flag.

    ``PHASE_COPY``, grid ``(src_nbytes // BLOCK,)`` (whole source blocks only, possibly none):
    program ``pid`` copies its block, unmasked, if the whole block lies below ``nbytes``, and
    does nothing otherwise. ``PHASE_FLAG``, grid ``(1,)``, after ``PHASE_COPY`` in stream
    order (so after every whole block): copies the partial last block
    ``[nbytes // BLOCK * BLOCK, nbytes)`` itself, masked, and then writes the
    flag, or counts a lease that does not fit. So the many-program copy kernel holds no masked
    path: ``ptxas`` allocates registers for the union of a kernel's paths, and the per-byte
    masked path with its 64-bit offsets would take most of them. (The lease is read in the
    kernel body rather than in a helper function: torch 2.11's mutation analysis counts a
    pointer passed to a called function as written, and Inductor would then clone the lease
    tensor.)

    One block per program and no loop (a grid-stride loop was slower).

    ``PDL`` (sm_90+, two launches): the flag launch is a programmatic dependent launch. Every
    copy program first signals ``griddepcontrol.launch_dependents``, so the flag program is
    resident before the copy ends; it copies the partial block (bytes no copy program writes)
    and runs ``griddepcontrol.wait`` before its release. That wait returns once the copy grid
    has completed and its memory is visible, the guarantee stream order gives without PDL;
    launched without the attribute, both instructions are no-ops.

    ``PTX``: launched for real (the JIT kernel, not wrapped for Inductor nor interpreted): the
    flag is written by :func:`_release_store` rather than a release exchange.

    ``SYSTEM``: the flag's release is at system scope (consumers may be on other devices),
    else at GPU scope (:func:`_publish_flag`). Either way the arrivals stay at GPU scope: every
    program is on this GPU.

    pool_ptr: ``[memory_size]`` uint8, 256-byte aligned.
    src_ptr: ``[src_nbytes]`` uint8 (the source's bytes).
    lease_ptr: ``[LEASE_WORDS]`` int64, read when ``LEASE_FROM_PTR``; otherwise the lease is
        ``start_arg .. ack_arg`` (an eager publish from the pool, whose lease is on the host).
    state_ptr: ``[STATE_WORDS]`` int32: arrival counter (0 between launches), error count.
    data_start, slot_bytes, n_slots: the pool's layout (trace-time constants).
    """
    # KERNEL_CONSTANTS, defined here rather than read as globals (see there).
    _START: tl.constexpr = 0
    _END: tl.constexpr = 1
    _NBYTES: tl.constexpr = 2
    _SLOT: tl.constexpr = 3
    _GENERATION: tl.constexpr = 4
    _READY: tl.constexpr = 5
    _ACK: tl.constexpr = 6
    _ARRIVALS: tl.constexpr = 0
    _ERRORS: tl.constexpr = 1
    _ALIGN: tl.constexpr = 256
    _WORD: tl.constexpr = 4
    _MAX_GENERATION: tl.constexpr = 0x7FFFFFFF
    _VECTOR: tl.constexpr = 16
    _BOTH: tl.constexpr = 0
    _COPY: tl.constexpr = 1  # and anything else is the flag phase

    # The source block's addresses do not depend on the lease: it is loaded first, so that its
    # latency and the lease's overlap (the source has src_nbytes >= nbytes bytes). Whole
    # blocks go unmasked: a mask against a runtime bound splits the 16-byte vectors into
    # single bytes. One int64 base per block (sources past 2 GiB) and int32 offsets within it.
    block_start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = tl.arange(0, BLOCK)
    if PHASE == _BOTH:
        # Every program loads the source's whole 16-byte vectors in its block, unconditionally
        # (a mask whose bound is a multiple of 16 keeps them 16-byte accesses; a partial block's
        # last bytes are the tail's, below). Volatile, and a CTA barrier after it: ptxas moves
        # no memory access across the barrier, so the lease loads, and the checks that wait for
        # them, stay behind this load's issue. Without it ptxas computed the checks first, or
        # unpacked the loaded bytes first, and each program waited for two DRAM round trips in
        # a row instead of one (sm_90 SASS). A lease given as arguments has no load to keep
        # behind.
        src_vectors = (src_nbytes // _VECTOR * _VECTOR - block_start).to(tl.int32)
        data = tl.load(src_ptr + block_start + offs, mask=offs < src_vectors, volatile=True)
        if LEASE_FROM_PTR:
            tl.debug_barrier()
    elif PHASE == _COPY:
        if PDL:
            gdc_launch_dependents()
        # The grid has whole source blocks only. Volatile, so that ptxas keeps the load here:
        # it moved a plain load below the lease checks that guard the store (sm_90 SASS), and
        # each program then waited for the lease and only then for its source bytes.
        data = tl.load(src_ptr + block_start + offs, volatile=True)

    # The lease, and lease_fits on the device (in the body, not a helper: see above). Every
    # term is evaluated: a difference that wraps for a wild value is only ever combined with a
    # term that is already false for it.
    if LEASE_FROM_PTR:
        start = tl.load(lease_ptr + _START)
        end = tl.load(lease_ptr + _END)
        nbytes = tl.load(lease_ptr + _NBYTES)
        slot = tl.load(lease_ptr + _SLOT)
        generation = tl.load(lease_ptr + _GENERATION)
        ready = tl.load(lease_ptr + _READY)
        ack = tl.load(lease_ptr + _ACK)
    else:
        start = start_arg.to(tl.int64)
        end = end_arg.to(tl.int64)
        nbytes = nbytes_arg.to(tl.int64)
        slot = slot_arg.to(tl.int64)
        generation = generation_arg.to(tl.int64)
        ready = ready_arg.to(tl.int64)
        ack = ack_arg.to(tl.int64)
    fits = (start >= data_start) & (start <= end) & (end <= memory_size)
    fits = fits & (start % _ALIGN == 0) & (nbytes > 0) & (nbytes <= end - start)
    fits = fits & (nbytes <= src_nbytes) & (slot >= 0) & (slot < n_slots)
    fits = fits & (ready == slot * slot_bytes) & (ack == ready + _WORD)
    fits = fits & (generation > 0) & (generation <= _MAX_GENERATION)
    # start is a multiple of 256 where it is used; saying so in arithmetic (a tl.multiple_of
    # hint is lost on a kernel argument) lets the stores be 16-byte vectors.
    dst_ptr = pool_ptr + (start // _ALIGN) * _ALIGN
    ready_ptr = (pool_ptr + ready).to(tl.pointer_type(tl.int32))

    if PHASE == _COPY:
        # Whole blocks only (a partial one is the flag program's), so no mask: stores only
        # where the block was loaded (nbytes <= src_nbytes when the lease fits).
        if fits & (block_start + BLOCK <= nbytes):
            tl.store(dst_ptr + block_start + offs, data)
    elif fits:
        # The bytes from `tail` to nbytes that lie in this block: a one-launch program whose
        # block holds the end of nbytes (or lies past it: nothing), or the flag program, whose
        # block is the partial last one, [nbytes // BLOCK * BLOCK, nbytes) (empty when nbytes
        # is a multiple of BLOCK).
        if PHASE == _BOTH:
            tail = block_start
            partial = block_start + BLOCK > nbytes
            if block_start + BLOCK <= nbytes:
                tl.store(dst_ptr + block_start + offs, data)
        else:
            tail = nbytes // BLOCK * BLOCK
            partial = tail < nbytes
        if partial:
            # Its whole 16-byte vectors under a mask whose bound is a multiple of 16 (the
            # compiler keeps such a mask per vector, so they stay 16-byte accesses), then the
            # last nbytes % 16 bytes one by one, by the program whose block holds them.
            vector_end = nbytes // _VECTOR * _VECTOR
            in_vectors = offs < (vector_end - tail).to(tl.int32)
            last = tl.arange(0, _VECTOR)
            last_count = tl.where(vector_end >= tail, nbytes - vector_end, 0).to(tl.int32)
            in_last = last < last_count
            tail_data = tl.load(src_ptr + tail + offs, mask=in_vectors)
            data_last = tl.load(src_ptr + vector_end + last, mask=in_last)
            tl.store(dst_ptr + tail + offs, tail_data, mask=in_vectors)
            tl.store(dst_ptr + vector_end + last, data_last, mask=in_last)
        if PHASE == _BOTH:
            # Every thread's stores before thread 0's arrival (a CTA barrier), then the
            # last-arrival count and the flag.
            tl.debug_barrier()
            if PTX:
                _arrive_and_publish(state_ptr + _ARRIVALS, ready_ptr, generation.to(tl.int32),
                                    tl.num_programs(0) - 1, SYSTEM)
            else:
                arrived = tl.atomic_add(state_ptr + _ARRIVALS, 1, sem="acq_rel", scope="gpu")
                if arrived == tl.num_programs(0) - 1:
                    _publish_flag(ready_ptr, generation.to(tl.int32), SYSTEM, PTX)
                    # The counter back to 0 after the flag, not before: the flag's release
                    # would wait for that write to complete first. Every program has arrived,
                    # and the next publish on this state follows in stream order, so a plain
                    # store does (an exchange waits for its reply before the program can end).
                    tl.store(state_ptr + _ARRIVALS, 0)
        else:
            # Every thread's tail stores before thread 0's release (the one-launch pattern);
            # the copy kernel's stores precede this kernel in stream order, or, launched as a
            # dependent, once the wait returns.
            if PDL:
                gdc_wait()
            tl.debug_barrier()
            _publish_flag(ready_ptr, generation.to(tl.int32), SYSTEM, PTX)
    elif (PHASE != _BOTH) | (block_start == 0):
        tl.atomic_add(state_ptr + _ERRORS, 1, sem="relaxed", scope="gpu")
