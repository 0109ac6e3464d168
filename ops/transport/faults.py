"""What the transport pool does when a process dies: the consumer registry (liveness) and the
consumer's wait watchdog (timeouts).

:class:`ConsumerRegistry`
    A small table in host shared memory, made by the producer and opened by each consumer
    through the pool's handle: the producer's process and, per consumer rank, the process
    attached to it and whether the producer dropped the rank. Each word has one writer: a
    consumer writes its own process identity, the producer writes the dropped flags, so no
    update is lost. A process is identified by its pid and its start time (``/proc``), so a
    reused pid is not taken for the process that died; a zombie, or a process already exiting,
    counts as dead.

:class:`WaitWatchdog`
    Consumers wait for a lease with ``cuStreamWaitValue32(ready, generation, GEQ)``: the stream
    passes once the ready word is cyclically at or past the generation. A wait that nothing
    publishes in time is released by writing ``ABORTED`` (``INT32_MIN``) into the ready word,
    which every generation in ``[1, 0x7FFFFFFF]`` is cyclically below, and which is no
    generation: the producer's recycler, which frees a lease only once its ready word equals
    its generation, never frees an aborted lease whose bytes are still to be copied. The write
    is a compare-and-swap on the device (:func:`_abort_kernel`), so a publish that lands first
    is never overwritten, and a publish that lands after it overwrites the abort (every waiter
    was already released). The watchdog is a thread of the consumer that exists only while
    waits are armed with it: it sleeps on a condition variable until the earliest deadline,
    then runs one launch of :func:`_abort_kernel` over the expired waits on a stream of its own
    (those published meanwhile are dropped, the others aborted), and ends when none is left.
    Nothing runs on the host while data arrives in time; a wait costs the consumer one heap
    push.
"""

from __future__ import annotations

import array
import contextlib
import functools
import heapq
import logging
import math
import mmap
import os
import threading
import time
from multiprocessing import shared_memory
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from strictops.meta.transport.pool import WORD_BYTES, Lease

from strictops.ops.transport import cuda_stream as _cuda_stream

logger = logging.getLogger(__name__)

ABORTED = -(2**31)
# _abort_kernel's outcome per wait.
PUBLISHED, ABORTED_NOW, ABORTED_BEFORE = 1, 2, 3
# Deadlines closer together than this are handled in one pass (one launch, one sync).
COALESCE_S = 0.02

TIMEOUT_ENV = "STRICTOPS_TRANSPORT_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0


def default_timeout(configured: Optional[float]) -> float:
    """A wait's timeout when the call gives none: the pool's ``wait_timeout``, else the
    ``STRICTOPS_TRANSPORT_TIMEOUT`` environment variable (seconds), else 60 s."""
    if configured is not None:
        return float(configured)
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"{TIMEOUT_ENV} must be positive, got {text!r}")
    return value


# --------------------------------------------------------------------------------------------
# Liveness


def process_start(pid: int) -> Optional[int]:
    """The start time of process ``pid`` (clock ticks since boot, ``/proc/<pid>/stat``), or
    None when it is gone, a zombie or exiting. Without ``/proc``: 0 while ``kill(pid, 0)``
    succeeds."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0
    return _stat_start(stat)


# The kernel's PF_EXITING task flag (/proc/<pid>/stat field 9): set as the process starts to
# exit, before it closes its files. A process killed with a CUDA context stays in that state
# while the driver tears the context down (it may take seconds), never to run its code again.
_PF_EXITING = 0x4


def _stat_start(stat: bytes) -> Optional[int]:
    """The start time in a ``/proc/<pid>/stat`` line, or None for a process that is exiting,
    a zombie or dead."""
    fields = stat[stat.rindex(b")") + 2:].split()  # the name may hold spaces and parentheses
    if fields[0] in (b"Z", b"X") or int(fields[6]) & _PF_EXITING:
        return None
    return int(fields[19])


class ConsumerRegistry:
    """Host shared memory, int64 words: ``[MAGIC, consumer_count, max_inflight_slices,
    producer_pid, producer_start, abort_epoch]``; per rank ``[pid, start, dropped, 0]``
    (``pid == 0``: never attached); per slot the latest generation a consumer's watchdog
    aborted (written by that watchdog, which then changes ``abort_epoch``, so that the other
    consumers look for their own waits among the aborted).

    Parameters
    ----------
    consumer_count, max_inflight_slices : int
        The pool's layout.
    name : str, optional
        The segment of an existing registry (a consumer's side); None makes a new one, owned
        by this process (the producer's side), whose name :meth:`unlink` removes. The mapping
        lives as long as this object.
    """

    MAGIC = 0x5354524943544F50
    HEADER, ROW = 6, 4

    def __init__(self, consumer_count: int, max_inflight_slices: int,
                 name: Optional[str] = None) -> None:
        self._slots = self.HEADER + self.ROW * consumer_count
        size = (self._slots + max_inflight_slices) * 8
        self.consumer_count = consumer_count
        self.owner = name is None
        self._unlinked = False
        if self.owner:
            self._shm = shared_memory.SharedMemory(create=True, size=size)
            self.name = self._shm.name
            self._buf = self._shm.buf
        else:
            self._shm, self._buf = _open_segment(name)
            self.name = name
        self._words = self._buf.cast("q")[:size // 8] if len(self._buf) >= size else None
        layout = (consumer_count, max_inflight_slices)
        if self.owner:
            self._words[1:3] = array.array("q", layout)
            self._words[3], self._words[4] = os.getpid(), process_start(os.getpid()) or 0
            self._words[0] = self.MAGIC
        elif (self._words is None or self._words[0] != self.MAGIC
              or tuple(self._words[1:3]) != layout):
            raise RuntimeError(f"shared memory {name!r} is not the consumer registry of a "
                               f"pool of {max_inflight_slices} slots and {consumer_count} "
                               f"consumers")

    def _row(self, rank: int) -> int:
        return self.HEADER + self.ROW * rank

    def attach(self, rank: int, transport: str) -> None:
        """Record this process as consumer ``rank``; refuse a dropped rank, or one that another
        live process holds."""
        row = self._row(rank)
        self._refuse_dropped(rank, transport)
        pid, start = self._words[row], self._words[row + 1]
        if pid and pid != os.getpid() and process_start(pid) == start:
            raise RuntimeError(f"{transport} consumer rank {rank} is attached by process {pid}")
        self._words[row + 1] = process_start(os.getpid()) or 0
        self._words[row] = os.getpid()
        self._refuse_dropped(rank, transport)  # the producer may have dropped it meanwhile

    def _refuse_dropped(self, rank: int, transport: str) -> None:
        if self.dropped(rank):
            raise RuntimeError(
                f"{transport} consumer rank {rank} was dropped from the pool (its process "
                f"died or the producer called drop_consumer): a dropped rank is never "
                f"readmitted; the leases published since are not held for it")

    def check(self, rank: int, transport: str) -> None:
        """Raise ``RuntimeError`` if ``rank`` was dropped."""
        self._refuse_dropped(rank, transport)

    def dropped(self, rank: int) -> bool:
        return bool(self._words[self._row(rank) + 2])

    def drop(self, rank: int) -> None:
        self._words[self._row(rank) + 2] = 1

    def attached_pid(self, rank: int) -> int:
        return self._words[self._row(rank)]

    def dead_ranks(self) -> list[int]:
        """Ranks attached by a process that no longer runs and not yet dropped."""
        dead = []
        for rank in range(self.consumer_count):
            row = self._row(rank)
            pid = self._words[row]
            if pid and not self._words[row + 2] and process_start(pid) != self._words[row + 1]:
                dead.append(rank)
        return dead

    def producer_alive(self) -> bool:
        return process_start(self._words[3]) == self._words[4]

    @property
    def abort_epoch(self) -> int:
        return self._words[5]

    def record_abort(self, lease: Lease) -> None:
        """Note that a watchdog aborted ``lease``'s ready word (its compare-and-swap won)."""
        self._words[self._slots + lease.slot] = lease.generation
        self._words[5] = time.time_ns()

    def aborted(self, lease: Lease) -> bool:
        """Whether ``lease``'s generation of its slot was aborted by some watchdog."""
        return self._words[self._slots + lease.slot] == lease.generation

    def unlink(self) -> None:
        """Remove the segment's name (the owner's; idempotent): no new consumer can open it,
        those attached keep their mapping."""
        if self.owner and not self._unlinked:
            self._unlinked = True
            self._shm.unlink()

    def __del__(self) -> None:
        try:
            if self._words is not None:
                self._words.release()
            if self._shm is not None:
                self._shm.close()
            else:
                self._buf.release()
        except Exception:  # a half-built object, or interpreter shutdown
            pass


def _open_segment(name: str):
    """Map an existing shared memory segment. On Linux straight from ``/dev/shm``: a
    ``SharedMemory`` opened by name would register the segment with this process's resource
    tracker, which removes it when this process ends, under the producer and every other
    consumer."""
    path = os.path.join("/dev/shm", name.lstrip("/"))
    if not os.path.exists(path):
        shm = shared_memory.SharedMemory(name=name)
        return shm, shm.buf
    fd = os.open(path, os.O_RDWR)
    try:
        return None, memoryview(mmap.mmap(fd, os.fstat(fd).st_size))
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Timeouts


@triton.jit
def _abort_kernel(words_ptr, index_ptr, generation_ptr, outcome_ptr, ABORT: tl.constexpr):
    """For wait ``i`` (grid ``(n,)``, one program each): the int32 ready word
    ``words_ptr[index_ptr[i]]`` and the generation ``generation_ptr[i]`` waited for. Writes
    ``outcome_ptr[i]``: ``PUBLISHED`` (1) when the word is cyclically at or past the generation
    and not ``ABORTED``; ``ABORTED_BEFORE`` (3) when it is ``ABORTED``; otherwise, with
    ``ABORT``, ``ABORTED_NOW`` (2) after a compare-and-swap of the word to ``ABORTED`` that
    found the value it read (retried with the value found otherwise); without ``ABORT``, 0.

    words_ptr: int32 control words of the pool; index_ptr: ``[n]`` int64 word indices;
    generation_ptr: ``[n]`` int32; outcome_ptr: ``[n]`` int32.
    """
    _ABORTED: tl.constexpr = -2147483648
    i = tl.program_id(0)
    ptr = words_ptr + tl.load(index_ptr + i)
    generation = tl.load(generation_ptr + i).to(tl.int64)
    word = tl.load(ptr, volatile=True)
    outcome = 0
    searching = True
    while searching:
        ahead = (word.to(tl.int64) - generation) & 0xFFFFFFFF  # cyclic distance, as GEQ
        if word == _ABORTED:
            outcome = 3
            searching = False
        elif ahead < 0x80000000:
            outcome = 1
            searching = False
        elif ABORT:
            found = tl.atomic_cas(ptr, word, _ABORTED, sem="acq_rel", scope="sys")
            if found == word:
                outcome = 2
                searching = False
            else:
                word = found
        else:
            searching = False
    tl.store(outcome_ptr + i, outcome)


def wait_outcomes(words: torch.Tensor, leases: Sequence[Lease], abort: bool,
                  kernel=_abort_kernel) -> list[int]:
    """:func:`_abort_kernel` over ``leases`` (their ready words in the int32 ``words``), in
    one launch on the current stream; returns the outcomes (syncs that stream)."""
    device = words.device
    index = torch.tensor([lease.ready_byte_offset // WORD_BYTES for lease in leases],
                         dtype=torch.int64).to(device)
    generation = torch.tensor([lease.generation for lease in leases],
                              dtype=torch.int32).to(device)
    outcome = torch.zeros(len(leases), dtype=torch.int32, device=device)
    kernel[(len(leases),)](words, index, generation, outcome, ABORT=abort, num_warps=1)
    return outcome.tolist()


@functools.cache
def warm_up(device: torch.device) -> None:
    """Compile both variants of :func:`_abort_kernel` for ``device`` once per process, when a
    consumer is made, rather than at its first deadline (a first compile takes seconds): run
    on a word that shows its generation, so nothing is written."""
    word = torch.ones(2, dtype=torch.int32, device=device)
    published = Lease(0, 0, 1, 0, 1, 0, WORD_BYTES)
    with torch.cuda.device(device):
        for abort in (False, True):
            wait_outcomes(word, [published], abort)


class WaitWatchdog:
    """Aborts a consumer's waits that nothing publishes before their deadlines.

    Parameters
    ----------
    words : torch.Tensor
        The pool's int32 control words, as the consumer maps them.
    name : str
        The transport's name, for messages.
    registry : ConsumerRegistry, optional
        Where aborts are recorded for, and looked up from, the other consumers.
    kernel : optional
        :func:`_abort_kernel`, or a stand-in launched the same way (the tests' interpreted one
        on CPU words).
    """

    def __init__(self, words: torch.Tensor, name: str,
                 registry: Optional[ConsumerRegistry] = None, kernel=_abort_kernel) -> None:
        self.words = words
        self.kernel = kernel
        self.name = name
        self.registry = registry
        self._epoch = registry.abort_epoch if registry is not None else 0
        self._cond = threading.Condition()
        self._pending: list[tuple[float, int, Lease, float]] = []  # heap by deadline
        self._count = 0
        self._timed_out: list[tuple[Lease, float]] = []
        self._checking = False  # the thread holds expired waits out of _pending
        self._thread: Optional[threading.Thread] = None
        # Made here, by the thread that arms waits, before any of them is pending: the
        # watchdog's own thread makes no CUDA object while a wait it watches blocks a stream.
        self._stream = torch.cuda.Stream(words.device) if words.is_cuda else None
        self._closed = False

    def arm(self, lease: Lease, timeout: float) -> None:
        """Watch the wait for ``lease`` just enqueued: abort it if its ready word does not show
        the generation ``timeout`` seconds from now."""
        if math.isinf(timeout):
            return
        with self._cond:
            self._count += 1
            heapq.heappush(self._pending, (time.monotonic() + timeout, self._count, lease,
                                           timeout))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"{self.name} consumer watchdog")
                self._thread.start()
            elif self._pending[0][2] == lease:
                self._cond.notify()

    def raise_timeouts(self) -> None:
        """Raise ``TimeoutError`` naming every lease whose wait was aborted since the last
        call (once each). When some consumer aborted a wait since the last look, this
        consumer's armed waits are looked up first (:meth:`settle`)."""
        if self.registry is not None and self.registry.abort_epoch != self._epoch:
            self._epoch = self.registry.abort_epoch
            self.settle()
        if not self._timed_out:
            return
        with self._cond:
            timed_out, self._timed_out = self._timed_out, []
        if timed_out:
            raise TimeoutError(_timeout_message(self.name, timed_out))

    def settle(self) -> None:
        """Classify every armed wait now, without aborting any: those whose ready word was
        aborted (by this or another consumer's watchdog) are timed out, published ones are
        done, the others stay armed. For :meth:`TransportConsumer.synchronize`, after the
        stream has passed its waits. Waits the thread is checking now are waited for: their
        abort may be what released the stream."""
        with self._cond:
            while self._checking:
                self._cond.wait()
            entries, self._pending = self._pending, []
        kept = self._check(entries, abort=False)
        with self._cond:
            for entry in kept:
                heapq.heappush(self._pending, entry)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        if self.words.is_cuda:
            torch.cuda.set_device(self.words.device)
            # A pass syncs its stream: allowed during another thread's graph capture only so.
            _cuda_stream.relax_capture_mode_or_warn(logger, f"{self.name} consumer watchdog")
        while True:
            with self._cond:
                while not self._closed and self._pending and (
                        self._pending[0][0] > time.monotonic()):
                    wait = self._pending[0][0] - time.monotonic()
                    self._cond.wait(max(wait, 0.0) + COALESCE_S)
                if self._closed or not self._pending:  # the next arm starts a new thread
                    self._thread = None
                    return
                now = time.monotonic()
                expired = []
                while self._pending and self._pending[0][0] <= now:
                    expired.append(heapq.heappop(self._pending))
                self._checking = True
            failed = False
            try:
                self._check(expired, abort=True)
            except Exception:  # e.g. a CUDA error: keep the waits and retry at the next pass
                logger.warning("%s consumer watchdog pass failed", self.name, exc_info=True)
                failed = True
            with self._cond:
                if failed:
                    for entry in expired:
                        heapq.heappush(self._pending, entry)
                self._checking = False
                self._cond.notify_all()
            if failed:
                time.sleep(COALESCE_S)

    def _outcomes(self, words: torch.Tensor, leases, abort: bool) -> list[int]:
        with torch.cuda.stream(self._stream) if self._stream else contextlib.nullcontext():
            return wait_outcomes(words, leases, abort, self.kernel)

    def _check(self, entries, abort: bool):
        """Outcomes of ``entries``' waits; records the aborted ones and returns those still
        neither published nor aborted."""
        if not entries:
            return []
        outcomes = self._outcomes(self.words, [e[2] for e in entries], abort)
        kept, timed_out = [], []
        for entry, outcome in zip(entries, outcomes):
            lease = entry[2]
            if outcome == ABORTED_NOW and self.registry is not None:
                self.registry.record_abort(lease)
            # A published word may hide an abort that released this wait before the publish
            # landed (the publish then overwrote it).
            if outcome in (ABORTED_NOW, ABORTED_BEFORE) or (
                    outcome == PUBLISHED and self.registry is not None
                    and self.registry.aborted(lease)):
                timed_out.append((lease, entry[3]))
            elif outcome != PUBLISHED:
                kept.append(entry)
        if timed_out:
            with self._cond:
                self._timed_out.extend(timed_out)
        return kept


def _timeout_message(name: str, timed_out: list[tuple[Lease, float]]) -> str:
    leases = ", ".join(f"(slot={lease.slot}, generation={lease.generation}) after {t:g} s"
                       for lease, t in timed_out)
    return (f"{name} lease{'s' if len(timed_out) > 1 else ''} not published in time: {leases}; "
            f"the wait was aborted and the bytes read after it are not the lease's")
