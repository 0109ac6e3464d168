"""``strictops::copy_and_publish``: the transport pool's copy-and-publish op.

A producer copies a tensor into a leased range of one preallocated CUDA byte pool and then
publishes it by writing the lease's generation into the lease's ready word; consumers wait for
that word in stream order (:mod:`strictops.ops.transport.producer`). The layout and the lease
format are in :mod:`strictops.meta.transport.pool`.

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
which at large sizes costs more than the second launch (``TUNING``). Keeping the masked
partial block out of the many-program copy kernel keeps that kernel's registers low (``ptxas``
allocates for the union of a kernel's paths), hence many programs per SM and many bytes in
flight.

The lease is read from an int64 CUDA tensor, so one captured CUDA graph publishes into a new
lease on every replay (write the tensor, replay). Its values are checked on the device against
the pool's layout, which is a trace-time constant: a lease that is not a 256-byte-aligned part
of the data region of at most ``src``'s size, with its slot's own ready word and a positive int32
generation (:func:`strictops.meta.transport.pool.lease_fits`), is skipped without touching the
pool, and ``state[ERRORS]`` is incremented for the host to read when it likes.

Registration: ``torch.library.triton_op``, whose body runs the contract and launches through
``wrap_triton``: the same body is the fake, so ``torch.compile``/``torch.export`` fail at trace
time with the eager message, and Inductor sees the Triton launch. A plain eager call skips the
dispatcher, its contract's verdict cached, and a signature served before runs in C++.

Why each tuning and code-shape choice, with the measurements: ``docs/design/transport_pool.md``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from strictops.meta.transport import pool as contract
from strictops.meta._contract import CachedValidation, hint
from strictops.meta.transport.pool import (
    ARRIVALS,
    DATA_ALIGNMENT,
    ERRORS,
    LEASE_WORDS,
    MAX_GENERATION,
    STATE_WORDS,
    WORD_BYTES,
    Lease,
    align_up,
    lease_fits,
)

from strictops.ops._runtime.dispatch import (can_skip_dispatcher, device_capability,
                                             on_device_of, stream_capturing)
from strictops.ops._runtime.host_path import MISS, HostPath
from strictops.ops._runtime.interpret import interpreted
from strictops.ops._runtime.launcher import Launcher, Pointer, keyword_constexprs

# Test helpers (reference, launch_interpreted, example_inputs, selfcheck_result) are importable
# by name but not part of the public API.
__all__ = ["Lease", "copy_and_publish", "new_state"]

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
        if block_start + BLOCK <= src_nbytes:
            data = tl.load(src_ptr + block_start + offs)
        else:
            data = tl.load(src_ptr + block_start + offs, mask=block_start + offs < src_nbytes,
                           other=0)
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

    if PHASE == _BOTH:
        if fits:
            if block_start + BLOCK <= nbytes:
                tl.store(dst_ptr + block_start + offs, data)
            else:
                tl.store(dst_ptr + block_start + offs, data, mask=block_start + offs < nbytes)
            tl.debug_barrier()
            arrived = tl.atomic_add(state_ptr + _ARRIVALS, 1, sem="acq_rel", scope="gpu")
            if arrived == tl.num_programs(0) - 1:
                _publish_flag(ready_ptr, generation.to(tl.int32), SYSTEM, PTX)
                # The counter back to 0 after the flag, not before: the flag's release would
                # wait for that write to complete first. Every program has arrived, and the
                # next publish on this state follows in stream order, so a plain store does
                # (an exchange waits for its reply before the program can end).
                tl.store(state_ptr + _ARRIVALS, 0)
        else:
            if block_start == 0:
                tl.atomic_add(state_ptr + _ERRORS, 1, sem="relaxed", scope="gpu")
    elif PHASE == _COPY:
        # Whole blocks only (a partial one is the flag program's), so no mask: stores only
        # where the block was loaded (nbytes <= src_nbytes when the lease fits).
        if fits & (block_start + BLOCK <= nbytes):
            tl.store(dst_ptr + block_start + offs, data)
    else:
        if fits:
            # The partial last block, [tail, nbytes): its whole 16-byte vectors under a mask
            # whose bound is a multiple of 16 (the compiler keeps such a mask per vector, so
            # they stay 16-byte accesses), then the last nbytes % 16 bytes one by one. Empty
            # when nbytes is a multiple of BLOCK.
            tail = nbytes // BLOCK * BLOCK
            vector_end = nbytes // _VECTOR * _VECTOR
            in_vectors = offs < (vector_end - tail).to(tl.int32)
            last = tl.arange(0, _VECTOR)
            in_last = last < (nbytes - vector_end).to(tl.int32)
            data = tl.load(src_ptr + tail + offs, mask=in_vectors)
            data_last = tl.load(src_ptr + vector_end + last, mask=in_last)
            tl.store(dst_ptr + tail + offs, data, mask=in_vectors)
            tl.store(dst_ptr + vector_end + last, data_last, mask=in_last)
            # Every thread's tail stores before thread 0's release (the one-launch pattern);
            # the copy kernel's stores precede this kernel in stream order, or, launched as a
            # dependent, once the wait returns.
            if PDL:
                gdc_wait()
            tl.debug_barrier()
            _publish_flag(ready_ptr, generation.to(tl.int32), SYSTEM, PTX)
        else:
            tl.atomic_add(state_ptr + _ERRORS, 1, sem="relaxed", scope="gpu")


# Bytes and warps per program, one launch (up to ``two_launches_above`` bytes) or two (the copy
# of whole blocks, then a one-program launch that copies the partial last block and writes the
# flag, with ``flag_num_warps`` warps, a programmatic dependent launch when ``pdl`` on sm_90+);
# above ``large_above`` bytes the copy takes the shape of ``large``. Speed choices only: under
# tracing they are taken from the size's hint without a guard, so no size recompiles.
# Measurements behind each value: docs/design/transport_pool.md.
TUNING = {"one_launch": {"block_bytes": 4096, "num_warps": 4},
          "two_launches": {"block_bytes": 16384, "num_warps": 4, "flag_num_warps": 4,
                           "pdl": True},
          "two_launches_above": 1 << 20,
          "large": {"block_bytes": 4096, "num_warps": 8},
          "large_above": 16 << 20}


def _launch(kernel, pool, src, lease, state, max_inflight_slices, consumer_count,
            values: Optional[Sequence[int]] = None, two_launches=None,
            consumers: str = contract.PEERS, **tuning):
    """Launch ``kernel`` (JIT, wrapped or interpreted) on validated inputs; ``values``: the
    lease's fields on the host (``lease`` is then not read); ``consumers``: the flag's scope
    (:func:`strictops.meta.transport.pool.system_scope`). ``two_launches`` and ``tuning``
    (``block_bytes``: a power of two, at least 16; ``num_warps``; with two launches
    ``flag_num_warps`` and ``pdl``) override ``TUNING``; ``pdl`` only ever applies to a real
    launch on an sm_90+ device (:func:`_pdl_launch`). Returns what the launches return
    (compiled kernels, for a probe's ``n_regs``)."""
    src_bytes = src.view(-1).view(torch.uint8)  # a view: the kernel reads any dtype as bytes
    launched = []
    for grid, args, options in _launches(kernel, pool, src_bytes, src_bytes.shape[0], lease,
                                         state, max_inflight_slices, consumer_count, values,
                                         two_launches, consumers, **tuning):
        runtime, constexprs = keyword_constexprs(_LAUNCHER.fn, args)
        launched.append(kernel[grid](*runtime, **constexprs, **dict(options)))
    return launched


def _launches(kernel, pool, src_bytes, src_nbytes, lease, state, max_inflight_slices,
              consumer_count, values, two_launches=None, consumers=contract.PEERS,
              **tuning) -> list:
    """The launches of one publish (see :func:`_launch`) as ``(grid, every kernel parameter
    in signature order, launch options)``; ``src_bytes``: the source as uint8 (a view, or a
    :class:`~strictops.ops._runtime.launcher.Pointer`), ``src_nbytes`` bytes."""
    size = hint(src_nbytes)
    if two_launches is None:
        two_launches = size > TUNING["two_launches_above"]
    if not two_launches:
        defaults = TUNING["one_launch"]
    elif size > TUNING["large_above"]:
        defaults = {**TUNING["two_launches"], **TUNING["large"]}
    else:
        defaults = TUNING["two_launches"]
    if tuning:  # the eager path gives none: no sets, no merged dict per call
        unknown = set(tuning) - set(TUNING["two_launches"])
        if unknown:
            raise TypeError(f"unknown tuning keys {sorted(unknown)}")
        tuning = {**defaults, **tuning}
    else:
        tuning = defaults
    block = tuning["block_bytes"]
    assert block >= 16 and block & (block - 1) == 0, block  # whole 16-byte vectors per block
    pdl = two_launches and _pdl_launch(kernel, pool, tuning.get("pdl", False))
    lease_args = (0,) * LEASE_WORDS if values is None else values
    # Every constexpr, PDL=False included: Inductor's analysis of a wrapped kernel's mutations
    # takes no default. PTX: the inline-PTX flag store, for the JIT kernel only. SYSTEM: the
    # flag's release at system scope.
    head = (pool, src_bytes, lease, state, pool.shape[0], src_nbytes,
            contract.data_start(max_inflight_slices, consumer_count),
            contract.slot_bytes(consumer_count), max_inflight_slices, *lease_args,
            values is None, block)
    tail = (pdl, kernel is _publish_kernel, contract.system_scope(consumers))
    if not two_launches:
        grid = ((src_nbytes + block - 1) // block,)
        return [(grid, (*head, PHASE_BOTH, *tail), (("num_warps", tuning["num_warps"]),))]
    # Two launches: the copy's grid covers the whole source blocks only (possibly none), so
    # its programs load unmasked; the flag program copies the rest of the lease.
    flag_options = (("num_warps", tuning["flag_num_warps"]),) + (
        (("launch_pdl", True),) if pdl else ())
    return [((src_nbytes // block,), (*head, PHASE_COPY, *tail),
             (("num_warps", tuning["num_warps"]),)),
            ((1,), (*head, PHASE_FLAG, *tail), flag_options)]


# The eager path (the dispatcher skipped; also the pool's copy_tensor, its lease on the host):
# the verdict cached per signature, launches prepared once per specialisation by the cached
# launcher, and a C++ plan per signature (docs/design/eager_host_cost.md).
_LAUNCHER = Launcher(_publish_kernel)
# Eagerly the host, not the GPU, bounds a publish up to here, and each launch costs it about
# 13 us on the H200 machine (two launches: 39 us at 2 MiB): one launch up to 16 MiB, where
# the copy itself takes about 8 us; two above, as graphs.
EAGER_TWO_LAUNCHES_ABOVE = 16 << 20
_VALIDATION = CachedValidation(contract.CONTRACT, contract.ARGUMENTS[:-1])  # name: the default
_HOST = HostPath(_VALIDATION, writes=("pool", "state"),
                 names=(*_VALIDATION.names[:-1], "system"))  # consumers: _plan_scope's key
_HOST_CALL = _HOST.call
_SETTINGS = ((globals(), "TUNING"), (globals(), "EAGER_TWO_LAUNCHES_ABOVE"))
_SOURCE_PARAMETER = {_publish_kernel.arg_names.index("src_ptr"): "src"}  # a Pointer, no view


def _plan_scope(consumers) -> Optional[bool]:
    """``consumers`` as a plan's key (a str has none): its scope if the contract knows it."""
    known = consumers.__class__ is str and contract.known_placement(consumers)
    return contract.system_scope(consumers) if known else None


def launch_eager(pool, src, lease, state, max_inflight_slices, consumer_count, values=None,
                 consumers=contract.PEERS, graph=False) -> list:
    """``_launch(_publish_kernel, ...)`` through the cached launcher on ``pool``'s device, in
    one launch up to ``EAGER_TWO_LAUNCHES_ABOVE`` bytes, or as ``TUNING`` chooses for a call
    captured in a CUDA graph (``graph``); ``values``: the lease's fields on the host, as kernel
    arguments (``lease`` unread), else the kernel reads ``lease``. The source goes as a uint8
    pointer. Validated CUDA tensors only. Returns ``(grid, parameters, options)`` per launch."""
    nbytes, device = src.nbytes, pool.get_device()
    launches = _launches(_publish_kernel, pool, Pointer(src.data_ptr(), torch.uint8), nbytes,
                         lease, state, max_inflight_slices, consumer_count, values,
                         None if graph else nbytes > EAGER_TWO_LAUNCHES_ABOVE, consumers)
    for grid, args, options in launches:
        _LAUNCHER(grid, args, options, device)
    return launches


def _eager(pool, src, lease, state, max_inflight_slices, consumer_count, consumers,
           capturing=False) -> None:
    """A plain eager call (``capturing``: into a CUDA graph): the cached verdict, then
    :func:`launch_eager`; outside capture, one launch leaves the plan of its signature, and
    the launches a CUDA graph captured from the call would make are loaded."""
    args = (pool, src, lease, state, max_inflight_slices, consumer_count, consumers)
    _VALIDATION(*args)
    launches = launch_eager(pool, src, lease, state, max_inflight_slices, consumer_count,
                            consumers=consumers, graph=capturing)
    if capturing or len(launches) != 1:
        return
    (grid, kernel_args, options), = launches
    device = pool.get_device()
    _HOST.register((*args[:-1], _plan_scope(consumers)), _LAUNCHER, grid, kernel_args, options,
                   device, settings=_SETTINGS, named=_SOURCE_PARAMETER, validated=args)
    if src.nbytes > TUNING["two_launches_above"]:
        # A graph captured from this call makes two launches: compiled and loaded now, since
        # a capture refuses a module load.
        for launch in _launches(_publish_kernel, pool, kernel_args[1], src.nbytes, lease, state,
                                max_inflight_slices, consumer_count, None, None, consumers):
            _LAUNCHER.load(*launch, device)


def _pdl_launch(kernel, pool: torch.Tensor, wanted: bool) -> bool:
    """Whether the flag launch is a programmatic dependent launch: when ``wanted``, for the
    JIT kernel launched for real (not recorded under tracing, where ``wrap_triton`` takes no
    ``launch_pdl``, nor interpreted, which has no ``griddepcontrol``) on an sm_90+ device."""
    return wanted and kernel is _publish_kernel and _has_pdl(pool.get_device())


def _has_pdl(device_index: int) -> bool:
    """Whether CUDA device ``device_index`` has programmatic dependent launch (sm_90+)."""
    return device_capability(device_index) >= (9, 0)


def _validate_and_launch(kernel, pool, src, lease, state, max_inflight_slices, consumer_count,
                         consumers):
    contract.validate(pool, src, lease, state, max_inflight_slices, consumer_count, consumers)
    # A real launch goes to the pool's device; a wrapped kernel (tracing) is only recorded.
    real = kernel is _publish_kernel
    with on_device_of(pool, real):
        _launch(kernel, pool, src, lease, state, max_inflight_slices, consumer_count,
                consumers=consumers)


@triton_op(contract.CONTRACT.op, mutates_args=contract.CONTRACT.mutates)
def _copy_and_publish(
    pool: torch.Tensor,
    src: torch.Tensor,
    lease: torch.Tensor,
    state: torch.Tensor,
    max_inflight_slices: int,
    consumer_count: int,
    consumers: str = contract.PEERS,
) -> None:
    # The body is also the fake: under fake tensors the launch is recorded, not run
    # (wrap_triton returns the kernel itself outside tracing).
    _validate_and_launch(wrap_triton(_publish_kernel), pool, src, lease, state,
                         max_inflight_slices, consumer_count, consumers)


def copy_and_publish(
    pool: torch.Tensor,
    src: torch.Tensor,
    lease: torch.Tensor,
    state: torch.Tensor,
    max_inflight_slices: int,
    consumer_count: int,
    consumers: str = contract.PEERS,
) -> None:
    """Copy ``src``'s first ``nbytes`` bytes into the lease's range of ``pool``, then write
    the lease's generation into its ready word; no host sync, capturable. One launch, two
    above 1 MiB in a CUDA graph or a trace; a plain eager call outside capture makes one up to
    ``EAGER_TWO_LAUNCHES_ABOVE`` (16 MiB), where the host's time is the publish's.

    Parameters
    ----------
    pool : torch.Tensor
        ``[memory_size]`` uint8 CUDA tensor laid out as in
        :mod:`strictops.meta.transport.pool`, written in place.
    src : torch.Tensor
        Any shape and dtype, contiguous, non-empty, on ``pool``'s device.
    lease : torch.Tensor
        ``[7]`` int64 on ``pool``'s device: ``torch.tensor(lease)`` of a :class:`Lease`.
    state : torch.Tensor
        ``[2]`` int32 on ``pool``'s device, zero when first used (:func:`new_state`); written:
        ``state[1]`` counts refused leases. Publishes that may overlap need separate states.
    max_inflight_slices, consumer_count : int
        The pool's layout.
    consumers : str
        ``"peers"`` (default): consumers may wait and read on other GPUs (or the host), and
        the flag is released at system scope; ``"same_device"``: every consumer is on
        ``pool``'s GPU, a GPU-scope release. A trace-time constant.

    Notes
    -----
    With ``start, end, nbytes, slot, generation, ready, _ = lease``::

        pool[start:start + nbytes] = src.view(-1).view(uint8)[:nbytes]
        pool[ready:ready + 4].view(int32) = generation    # after every byte above is visible

    if the lease fits (``lease_fits``); otherwise nothing is written to ``pool`` and
    ``state[1] += 1``. Bad metadata raises ``ValueError`` before launch in eager mode and at
    trace time under ``torch.compile``/``torch.export``. In plain eager mode the call skips
    the dispatcher (``strictops.ops._runtime.dispatch``), and a signature served before runs
    from its C++ plan; ``torch.ops.strictops.copy_and_publish`` is the same op through it.
    """
    if not torch.compiler.is_compiling():
        capturing = stream_capturing()
        # The C++ path, for a signature served before (while capturing, the Python path makes
        # TUNING's launches, which the eager plan may not).
        if not capturing and _HOST_CALL(pool, src, lease, state, max_inflight_slices,
                                        consumer_count, _plan_scope(consumers)) is not MISS:
            return
        if can_skip_dispatcher(pool, src, lease, state):
            _eager(pool, src, lease, state, max_inflight_slices, consumer_count, consumers,
                   capturing)
            torch.autograd.graph.increment_version((pool, state))  # as the dispatcher does
            return
    torch.ops.strictops.copy_and_publish(pool, src, lease, state, max_inflight_slices,
                                         consumer_count, consumers)


def new_state(device) -> torch.Tensor:
    """A fresh ``state`` argument: ``[2]`` int32 zeros on ``device``."""
    return torch.zeros(STATE_WORDS, dtype=torch.int32, device=device)


def launch_interpreted(pool, src, lease, state, max_inflight_slices, consumer_count,
                       consumers=contract.PEERS, reverse_programs=False, **tuning):
    """Run the kernel through the Triton interpreter on CPU tensors (tests, self-check).

    ``lease`` may be a tensor (read by the kernel) or a :class:`Lease` / sequence of ints
    (passed as kernel arguments, the pool's eager path). ``reverse_programs`` runs programs in
    reverse grid order, so that the last program to arrive is not the last one in the grid.
    """
    values = None if isinstance(lease, torch.Tensor) else lease
    lease_t = state if values is not None else lease
    with interpreted(_publish_kernel, reverse_programs) as kernel:
        _launch(kernel, pool, src, lease_t, state, max_inflight_slices, consumer_count,
                values=values, consumers=consumers, **tuning)


def reference(pool, src, lease, state, max_inflight_slices, consumer_count,
              consumers=contract.PEERS):
    """Plain-PyTorch reference: new ``(pool, state)`` equal to the op's result.

    ``lease`` may be a tensor or a sequence of ints (as :func:`launch_interpreted`). A copy is
    exact, so no upcast is needed; ``consumers`` changes only the flag's ordering, not what
    is written.
    """
    pool_out, state_out = pool.clone(), state.clone()
    values = lease.tolist() if isinstance(lease, torch.Tensor) else list(lease)
    src_bytes = src.reshape(-1).view(torch.uint8)
    if lease_fits(values, pool.numel(), max_inflight_slices, consumer_count, src_bytes.numel()):
        start, _, nbytes, _, generation, ready, _ = values
        pool_out[start:start + nbytes] = src_bytes[:nbytes]
        word = torch.tensor([generation], dtype=torch.int32, device=pool.device)
        pool_out[ready:ready + WORD_BYTES] = word.view(torch.uint8)
    else:
        state_out[ERRORS] += 1
    return pool_out, state_out


def example_inputs(device: str, small: bool, generator: torch.Generator) -> dict:
    """Keyword arguments of a valid call that publishes into a lease in the middle of the pool.

    Parameters
    ----------
    device : str
        ``"cpu"`` for :func:`launch_interpreted`, ``"cuda:N"`` for the op.
    small : bool
        Interpreter-sized shapes (pairwise-distinct sizes >= 3, apart from the fixed-size lease
        and state, so a dynamic trace keeps each a separate symbol) instead of a moderate GPU
        shape.
    generator : torch.Generator
        CPU generator behind every random value.

    Returns
    -------
    dict
        ``pool`` ``[memory_size]`` uint8, random bytes everywhere (the op must change exactly
        one range and one word); ``src`` ``[rows, cols]`` float32, random; ``lease`` int64
        ``[7]``: a fitting lease whose ``nbytes`` is 3 bytes short of ``src``'s, so the copy
        ends mid-element and mid-block; ``state`` int32 ``[2]`` zeros; the layout ints.
    """
    if small:
        dims = contract.Dims(memory_size=6400, max_inflight_slices=5, consumer_count=3,
                             src_shape=(37, 9))
    else:
        dims = contract.Dims(memory_size=64 << 20, max_inflight_slices=64, consumer_count=2,
                             src_shape=(1024, 1021))
    spec = contract.valid_spec(dims)
    src_nbytes = dims.src_shape[0] * dims.src_shape[1] * 4
    slot = dims.max_inflight_slices - 2
    ready = slot * contract.slot_bytes(dims.consumer_count)
    start = contract.data_start(dims.max_inflight_slices, dims.consumer_count) + 2 * DATA_ALIGNMENT
    lease = Lease(start=start, end=start + align_up(src_nbytes, DATA_ALIGNMENT),
                  nbytes=src_nbytes - 3, slot=slot, generation=12345,
                  ready_byte_offset=ready, ack_byte_offset=ready + WORD_BYTES)
    return {
        "pool": torch.randint(0, 256, spec["pool"].shape, generator=generator,
                              dtype=torch.uint8).to(device),
        "src": torch.randn(dims.src_shape, generator=generator).to(device),
        "lease": torch.tensor(lease, dtype=torch.int64, device=device),
        "state": new_state(device),
        "max_inflight_slices": dims.max_inflight_slices,
        "consumer_count": dims.consumer_count,
        "consumers": contract.PEERS,
    }


def selfcheck_result(on_gpu: bool) -> tuple[bool, str]:
    """The self-check's result row: the example call's pool and state, bit for bit against
    the reference (the op writes two tensors, so the default one-tensor check does not fit).
    Without a GPU the kernel runs interpreted, in small blocks so that several programs loop
    and the last to arrive is not the last in the grid."""
    args = example_inputs("cuda:0" if on_gpu else "cpu", small=not on_gpu,
                          generator=torch.Generator().manual_seed(0))
    before = args["pool"].clone()
    pool, state = reference(**args)
    if on_gpu:
        copy_and_publish(**args)
        where = "GPU cuda:0"
    else:
        launch_interpreted(**args, reverse_programs=True, block_bytes=64)
        where = "Triton interpreter"
    detail = f"{where}, pool {before.numel()} B, lease {args['lease'].tolist()}"
    if torch.equal(pool, before):
        return False, f"{detail}: the example call writes nothing"
    return torch.equal(args["pool"], pool) and torch.equal(args["state"], state), detail
