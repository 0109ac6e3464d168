"""The transport pool's runtime: lease allocator, producer pool and consumers.

A producer copies a tensor into a leased range of one preallocated CUDA byte pool and publishes
it (:func:`strictops.ops.transport_pool.copy_and_publish`: the bytes, then the lease's
generation in its ready word); consumer processes, attached to the same pool over CUDA IPC,
wait for that word in stream order, read the bytes and write the generation into their own ack
word; a range is free again once every consumer has acknowledged. The layout and the lease
format are in :mod:`strictops.meta.transport_pool`.

The pool lives on the producer's GPU; a consumer may sit on another GPU (sglang's tensor-parallel
ranks, one per GPU): it maps the pool on its own device (a peer mapping over NVLink), waits and
acknowledges on its own device's stream, and reads the bytes over the mapping. The pool's
``consumers`` (``"peers"``, the default, or ``"same_device"``) sets the scope at which the
publish releases the ready word, so that a peer sees the bytes before the word.

:class:`LeaseAllocator` (pure Python: best-fit 256-byte-aligned ranges, merged when freed,
slots with generations), :class:`TransportPool` (the producer: pool tensor, ``copy_tensor``,
recycler, ``cancel_lease``, IPC export) and :class:`TransportConsumer` (wait, read,
acknowledge). Waits and acks use ``cuStreamWaitValue32``/``cuStreamWriteValue32``
(:mod:`._cuda_stream`), imported on first use.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from strictops.meta import transport_pool as contract
from strictops.meta._contract import CachedValidation
from strictops.meta.transport_pool import (
    DATA_ALIGNMENT,
    ERRORS,
    MAX_GENERATION,
    WORD_BYTES,
    Lease,
    align_up,
    lease_fits,
)

from . import _cuda_stream
from . import transport_pool as _publish
from ._host_path import MISS, HostPath, Slice
from ._launcher import Pointer
from ._transport_faults import ConsumerRegistry, WaitWatchdog, default_timeout, warm_up
from ._transport_peers import check_placement, device_index, open_mapped
from .transport_pool import copy_and_publish, launch_eager

# copy_tensor's checks of its source, cached per metadata signature (the pool's layout was
# checked when it was made; the lease and state are its own).
_SOURCE_VALIDATION = CachedValidation(contract.SOURCE, ("pool", "src", "max_inflight_slices",
                                                        "consumer_count", "name"))
# copy_tensor's C++ eager path (strictops.ops._host_path): a plan per signature of the pool
# and the source (one _SOURCE_VALIDATION passed) and the flag's scope, published in one
# launch; the lease's fields and its state row's address are per-call integers, and the plan
# returns the lease's bytes of the pool.
_PUBLISH_HOST = HostPath(_SOURCE_VALIDATION,
                         names=("pool", "src", "max_inflight_slices", "consumer_count", "system"),
                         per_call=("state", *Lease._fields))
_PUBLISH_CALL = _PUBLISH_HOST.call
_PUBLISH_KNOWN = _PUBLISH_HOST.known
_PUBLISH_VIEW = Slice("pool", "start", "nbytes")
# The kernel parameters the plan takes by name, by index: the source's address, the state row
# (also the lease pointer, unread when the lease's fields are given) and the lease's fields.
_names = _publish._publish_kernel.arg_names
_PUBLISH_NAMED = {_names.index("src_ptr"): "src", _names.index("lease_ptr"): "state",
                  _names.index("state_ptr"): "state",
                  **{_names.index("start_arg") + k: field for k, field in enumerate(Lease._fields)}}
del _names
# What the plan's launch depends on besides its key (checked on each of its calls).
_PUBLISH_SETTINGS = ((vars(_publish), "TUNING"), (vars(_publish), "EAGER_TWO_LAUNCHES_ABOVE"))
# Int32 words per slot's state row: STATE_WORDS used, padded so every row's address is a
# multiple of 16 (one specialisation of the kernel for every slot).
STATE_ROW_WORDS = 4

__all__ = [
    "LeaseAllocator",
    "PoolHandle",
    "TransportConsumer",
    "TransportPool",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_INFLIGHT_SLICES = 4096


class LeaseAllocator:
    """Leases of the pool's data region: best-fit 256-byte-aligned ranges, merged when freed,
    and slots whose generation grows on every lease.

    Pure Python (no tensor, no device, no lock): :class:`TransportPool` calls it under its lock,
    and the tests drive it directly.

    Parameters
    ----------
    memory_size, max_inflight_slices, consumer_count : int
        The pool's layout (:mod:`strictops.meta.transport_pool`), already validated.
    name : str
        The transport's name, for messages.
    """

    def __init__(self, memory_size: int, max_inflight_slices: int, consumer_count: int,
                 name: str) -> None:
        self.name = name
        self.memory_size = memory_size
        self.consumer_count = consumer_count
        self.data_start = contract.data_start(max_inflight_slices, consumer_count)
        self.slot_bytes = contract.slot_bytes(consumer_count)
        self._free = [(self.data_start, memory_size)]  # sorted, disjoint, never adjacent
        self._free_slots = list(reversed(range(max_inflight_slices)))  # lowest slot on top
        self._generations = [0] * max_inflight_slices
        self._active: dict[int, Lease] = {}
        self._dropped: set[int] = set()

    @property
    def active(self) -> tuple[Lease, ...]:
        return tuple(self._active.values())

    @property
    def free_ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple(self._free)

    @property
    def dropped(self) -> frozenset[int]:
        """Consumer ranks no lease waits for (:meth:`drop`)."""
        return frozenset(self._dropped)

    def drop(self, rank: int) -> None:
        """Stop waiting for consumer ``rank``'s acknowledgements, for good: from the next
        :meth:`recycle` on, a lease is free once the other consumers acknowledged it."""
        if not 0 <= rank < self.consumer_count:
            raise ValueError(f"{self.name} consumer rank {rank} is outside "
                             f"[0, {self.consumer_count})")
        self._dropped.add(rank)

    def generation(self, slot: int) -> int:
        """The generation of ``slot``'s latest lease (0: never leased)."""
        return self._generations[slot]

    def allocate(self, nbytes: int) -> Optional[Lease]:
        """A lease of ``nbytes`` bytes (rounded up to 256), or None if no range or slot is free.

        Best fit: the smallest free range that holds it, the lowest address among equals; the
        lease takes the range's start. Raises ``RuntimeError`` when the slot's generation would
        pass ``0x7FFFFFFF``, before anything changes.
        """
        if nbytes <= 0:
            raise ValueError(f"{self.name} lease size must be positive, got {nbytes}")
        size = align_up(nbytes, DATA_ALIGNMENT)
        fits = [(end - start, start, i) for i, (start, end) in enumerate(self._free)
                if end - start >= size]
        if not fits or not self._free_slots:
            return None
        _, start, i = min(fits)
        slot = self._free_slots[-1]
        generation = self._generations[slot] + 1
        if generation > MAX_GENERATION:
            raise RuntimeError(f"{self.name} pool slot generation exhausted")
        self._free_slots.pop()
        self._generations[slot] = generation
        range_end = self._free[i][1]
        if start + size < range_end:
            self._free[i] = (start + size, range_end)
        else:
            del self._free[i]
        ready = slot * self.slot_bytes
        lease = Lease(start, start + size, nbytes, slot, generation, ready, ready + WORD_BYTES)
        self._active[slot] = lease
        return lease

    def active_lease(self, slot: int) -> Optional[Lease]:
        """The live lease of ``slot``, or None."""
        return self._active.get(slot)

    def require_active(self, lease: Lease, action: str) -> None:
        """Raise ``RuntimeError`` unless ``lease`` is the live lease of its slot."""
        if self._active.get(lease.slot) != lease:
            raise RuntimeError(f"Cannot {action} inactive {self.name} pool lease "
                               f"(slot={lease.slot}, generation={lease.generation})")

    def release(self, lease: Lease) -> None:
        """Free ``lease``'s range (merged with free neighbours) and slot."""
        self.require_active(lease, "release")
        del self._active[lease.slot]
        self._free_slots.append(lease.slot)
        start, end = lease.start, lease.end
        i = bisect.bisect(self._free, (start, end))
        if i < len(self._free) and self._free[i][0] == end:  # merge with the next range
            end = self._free.pop(i)[1]
        if i > 0 and self._free[i - 1][1] == start:  # ... and the previous one
            i -= 1
            start = self._free.pop(i)[0]
        self._free.insert(i, (start, end))

    def recycle(self, control_words: Sequence[Sequence[int]]) -> list[Lease]:
        """Release every live lease that is published and acknowledged by every consumer not
        dropped; return those leases.

        ``control_words[slot]`` is the slot's row of int32 control words as read from the
        pool: ``[ready, ack_0, ..., ack_{consumer_count-1}]``. A lease is published when its
        ready word equals its generation (not the abort word a consumer's watchdog may have
        written: its bytes may still be on their way), acknowledged by a rank when that rank's
        ack word equals it (a stale generation or another slot's word frees nothing).
        """
        live = [1 + rank for rank in range(self.consumer_count) if rank not in self._dropped]
        done = [lease for lease in self._active.values()
                if control_words[lease.slot][0] == lease.generation
                and all(control_words[lease.slot][i] == lease.generation for i in live)]
        for lease in done:
            self.release(lease)
        return done


@dataclass(frozen=True)
class PoolHandle:
    """What a consumer process needs to attach to a pool: picklable (send it through a
    ``torch.multiprocessing`` queue or pipe). ``rebuild(*args)`` opens the pool's CUDA IPC
    handle (``torch.multiprocessing.reductions.reduce_tensor``); ``registry`` names the pool's
    consumer registry (host shared memory); ``wait_timeout`` is the pool's default timeout of
    a consumer's wait (None: the environment's, or 60 s); ``device`` is the pool's CUDA device
    index and ``consumers`` its placement (``TransportPool``)."""

    rebuild: Callable[..., torch.Tensor]
    args: tuple
    max_inflight_slices: int
    consumer_count: int
    name: str
    registry: Optional[str] = None
    wait_timeout: Optional[float] = None
    device: Optional[int] = None
    consumers: str = contract.PEERS


def lease_words(lease: Optional[Lease], ready_byte_offset: Optional[int],
                ack_byte_offset: Optional[int], generation: Optional[int]) -> tuple[int, int, int]:
    """``(ready_byte_offset, ack_byte_offset, generation)`` of a lease given whole or as
    sglang's three keywords (all three, and no lease); ``TypeError`` for any other mix."""
    keywords = (ready_byte_offset, ack_byte_offset, generation)
    if lease is not None and all(k is None for k in keywords):
        return lease.ready_byte_offset, lease.ack_byte_offset, lease.generation
    if lease is None and all(k is not None for k in keywords):
        return keywords
    raise TypeError("cancel_lease takes a lease, or ready_byte_offset, ack_byte_offset "
                    "and generation")


class TransportPool:
    """The producer's side: a CUDA byte pool, its leases, the publish, the recycler, and the
    consumers' liveness.

    Parameters
    ----------
    memory_size : int
        Bytes of the pool, control words included.
    byte_tensor : torch.Tensor, optional
        The pool's memory, given by the caller: a contiguous 1-D uint8 CUDA tensor of at least
        ``memory_size`` bytes, 256-byte aligned in its storage; the pool is its first
        ``memory_size`` bytes. Default: a new allocation.
    base_address : int, optional
        ``byte_tensor``'s first byte, when the caller states it (checked).
    device : torch.device or str, optional
        CUDA device of the pool (default: ``byte_tensor``'s, else the current one);
        ``device_id`` (an index) is the same.
    consumer_count : int
        Consumers that must acknowledge every lease (until dropped).
    max_inflight_slices : int
        Slots, i.e. leases live at once.
    recycle_interval : float or None
        Seconds between the background recycler's passes; None starts no recycler (call
        :meth:`recycle`). The recycler's thread does not disturb a CUDA graph captured in
        another thread (its capture mode is relaxed; needs cuda-bindings).
    name : str
        The transport's name in messages (``"{name} requires a CUDA tensor"``);
        ``transport_name`` is the same.
    wait_timeout : float, optional
        Default seconds a consumer's wait lasts before it is aborted (``TimeoutError``);
        None: the ``STRICTOPS_TRANSPORT_TIMEOUT`` environment variable, else 60 s.
    liveness_interval : float or None
        Seconds between checks, during :meth:`recycle`, that each attached consumer's process
        still runs (a dead one is dropped: :meth:`drop_consumer`); None: no checks.
    consumers : str
        Where the consumers may be: ``"peers"`` (default, as sglang deploys the pool: each on
        its own GPU, or on the pool's), whose publishes release the ready word at system
        scope; or ``"same_device"``, every consumer on the pool's GPU (a GPU-scope release,
        cheaper; :meth:`TransportConsumer.attach` then refuses a consumer on another device).

    The constructor takes sglang's ``StreamOrderedMmFeaturePool`` keywords (``byte_tensor``,
    ``base_address``, ``device_id``, ``transport_name``) beside its own.
    """

    def __init__(self, memory_size: int, *, byte_tensor: Optional[torch.Tensor] = None,
                 base_address: Optional[int] = None, device=None,
                 device_id: Optional[int] = None, consumer_count: int = 1,
                 max_inflight_slices: int = DEFAULT_MAX_INFLIGHT_SLICES,
                 recycle_interval: Optional[float] = 0.005, name: str = "CUDA IPC",
                 transport_name: Optional[str] = None, wait_timeout: Optional[float] = None,
                 liveness_interval: Optional[float] = 0.1,
                 consumers: str = contract.PEERS) -> None:
        if transport_name is not None:
            if name not in ("CUDA IPC", transport_name):
                raise ValueError(f"name={name!r} and transport_name={transport_name!r} disagree")
            name = transport_name
        if device_id is not None:
            if device is not None and torch.device(device) != torch.device("cuda", device_id):
                raise ValueError(f"device={device!r} and device_id={device_id} disagree")
            device = torch.device("cuda", device_id)
        if memory_size <= 0:
            raise ValueError("memory_size must be positive")
        if recycle_interval is not None and recycle_interval <= 0:
            raise ValueError("recycle_interval must be positive")
        if wait_timeout is not None and not wait_timeout > 0:
            raise ValueError(f"wait_timeout must be positive, got {wait_timeout}")
        if byte_tensor is not None:
            device = _check_byte_tensor(byte_tensor, memory_size, device, base_address)
        # The layout rules on a meta tensor: a bad layout is refused before any allocation.
        contract.LAYOUT.validate(pool=torch.empty(memory_size, dtype=torch.uint8, device="meta"),
                                 max_inflight_slices=max_inflight_slices,
                                 consumer_count=consumer_count, name=name)
        contract.PLACEMENT.validate(consumers=consumers, name=name)
        self.device = torch.device(device if device is not None else "cuda")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.name = name
        self.memory_size = memory_size
        self.max_inflight_slices = max_inflight_slices
        self.consumer_count = consumer_count
        self.consumers = consumers
        self._system = contract.system_scope(consumers)
        self.wait_timeout = wait_timeout
        self.allocator = LeaseAllocator(memory_size, max_inflight_slices, consumer_count, name)
        if byte_tensor is None:
            self.tensor = torch.empty(memory_size, dtype=torch.uint8, device=self.device)
        else:
            self.tensor = byte_tensor[:memory_size]
            contract.LAYOUT.validate(pool=self.tensor, max_inflight_slices=max_inflight_slices,
                                     consumer_count=consumer_count, name=name)
        self._control = _control_words(self.tensor, max_inflight_slices, consumer_count)
        self._control.zero_()
        # One state row per slot: publishes in flight at once have different slots.
        self._state = torch.zeros(max_inflight_slices, STATE_ROW_WORDS, dtype=torch.int32,
                                  device=self.device)
        self._state_address = self._state.data_ptr()
        # Zeroed before any other stream, thread or process reads a control word.
        torch.cuda.synchronize(self.device)
        self.base_address = self.tensor.data_ptr()
        self.registry = ConsumerRegistry(consumer_count, max_inflight_slices)
        self._unlink_registry = weakref.finalize(self, self.registry.unlink)
        self._liveness_interval = liveness_interval
        self._next_liveness = 0.0
        self._recycle_stream = torch.cuda.Stream(self.device)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._recycler = None
        if recycle_interval is not None:
            self._recycler = threading.Thread(target=self._recycle_loop, args=(recycle_interval,),
                                              name=f"{name} pool recycler", daemon=True)
            self._recycler.start()

    @property
    def usable_size(self) -> int:
        """Bytes of the data region: ``memory_size`` less the control words and padding."""
        return self.memory_size - self.allocator.data_start

    @property
    def active_lease_count(self) -> int:
        with self._lock:
            return len(self.allocator.active)

    @property
    def dropped_consumers(self) -> frozenset[int]:
        with self._lock:
            return self.allocator.dropped

    def lease(self, nbytes: int) -> Optional[Lease]:
        """A lease of ``nbytes`` bytes, or None when no range or slot is free (for callers that
        publish through :meth:`publish`, e.g. from a CUDA graph)."""
        with self._lock:
            return self.allocator.allocate(nbytes)

    def release(self, lease: Lease) -> None:
        """Free a lease that was never handed to a consumer (a published one is freed by its
        consumers' acknowledgements, or by :meth:`cancel_lease`). A lease handed out and not
        published must be published (late), not released: a consumer's watchdog may still
        abort its slot's ready word, which would release the waits for the slot's next lease."""
        with self._lock:
            self.allocator.release(lease)

    def publish(self, src: torch.Tensor, lease: torch.Tensor, state: torch.Tensor) -> None:
        """:func:`copy_and_publish` into this pool: ``lease`` and ``state`` are device tensors,
        so this call can be captured in a CUDA graph and replayed into new leases."""
        copy_and_publish(self.tensor, src, lease, state, self.max_inflight_slices,
                         self.consumer_count, self.consumers)

    def copy_tensor(self, tensor: torch.Tensor
                    ) -> tuple[Optional[Lease], Optional[torch.Tensor]]:
        """Copy ``tensor`` into a new lease and publish it on the current stream.

        Returns ``(lease, view)``, ``view`` being the lease's bytes in the pool (uint8
        ``[nbytes]``), or ``(None, None)`` when no range or slot is free. The source is checked
        before anything is leased; if the launch fails the lease is released.
        """
        source = tensor.contiguous()
        key = (self.tensor, source, self.max_inflight_slices, self.consumer_count, self._system)
        if _PUBLISH_KNOWN(*key) is not True:  # a signature the C++ path has not seen pass
            _SOURCE_VALIDATION(self.tensor, source, self.max_inflight_slices,
                               self.consumer_count, self.name)
        lease = self.lease(source.nbytes)
        if lease is None:
            return None, None
        state = self._state_row(lease.slot)
        try:
            view = _PUBLISH_CALL(*key, state, *lease)
            if view is MISS:
                self._publish_and_plan(key, source, lease, state)
                view = self.tensor[lease.start:lease.start + lease.nbytes]
        except BaseException:
            self.release(lease)
            raise
        return lease, view

    def _publish_lease(self, source: torch.Tensor, lease: Lease,
                       state: Optional[int] = None) -> list:
        """Publish ``source`` into ``lease`` through the cached launcher; return its launches
        (``(grid, kernel parameters, options)``). ``state``: the slot's state row's address."""
        # The lease is on the host: its values go to the kernel as arguments (no copy to the
        # device first), with the slot's own state row (its address: no view per call).
        if state is None:
            state = self._state_row(lease.slot)
        return launch_eager(self.tensor, source, Pointer(state, torch.int32),
                            self.max_inflight_slices, self.consumer_count, lease, self.consumers)

    def _state_row(self, slot: int) -> int:
        """The address of ``slot``'s own state row."""
        return self._state_address + slot * (STATE_ROW_WORDS * WORD_BYTES)

    def _publish_and_plan(self, key: tuple, source: torch.Tensor, lease: Lease,
                          state: int) -> None:
        """The Python path of :meth:`copy_tensor`'s publish, then the C++ path's plan of its
        signature (one launch only)."""
        launches = self._publish_lease(source, lease, state)
        if len(launches) == 1:
            (grid, kernel_args, options), = launches
            _PUBLISH_HOST.register(
                (*key, state, *lease), _publish._LAUNCHER, grid, kernel_args, options,
                self.tensor.get_device(), result=_PUBLISH_VIEW, settings=_PUBLISH_SETTINGS,
                named=_PUBLISH_NAMED, validated=(self.tensor, source, self.max_inflight_slices,
                                                 self.consumer_count, self.name))

    def cancel_lease(self, lease: Optional[Lease] = None, *,
                     ready_byte_offset: Optional[int] = None,
                     ack_byte_offset: Optional[int] = None,
                     generation: Optional[int] = None) -> None:
        """Acknowledge, for every consumer, a published lease that was never dispatched: in
        stream order after its publish, so the recycler frees it once the publish is done.

        The lease is given whole, or as sglang's keywords ``ready_byte_offset``,
        ``ack_byte_offset`` and ``generation``. Raises ``RuntimeError`` for offsets that are
        not a slot's ready and first ack word (``Invalid {name} pool lease offsets``) and for a
        lease that is not live (``Cannot cancel inactive {name} pool lease (...)``).
        """
        ready_byte_offset, ack_byte_offset, generation = lease_words(
            lease, ready_byte_offset, ack_byte_offset, generation)
        stride = self.allocator.slot_bytes
        if (ready_byte_offset < 0 or ready_byte_offset % stride
                or ready_byte_offset // stride >= self.max_inflight_slices
                or ack_byte_offset != ready_byte_offset + WORD_BYTES):
            raise RuntimeError(f"Invalid {self.name} pool lease offsets")
        slot = ready_byte_offset // stride
        with self._lock:
            active = self.allocator.active_lease(slot)
            if active is None or active.generation != generation:
                raise RuntimeError(f"Cannot cancel inactive {self.name} pool lease "
                                   f"(slot={slot}, generation={generation})")
        stream = torch.cuda.current_stream(self.device)
        _cuda_stream.wait_value32(stream, self.base_address + ready_byte_offset, generation)
        for rank in range(self.consumer_count):
            _cuda_stream.write_value32(
                stream, self.base_address + ack_byte_offset + rank * WORD_BYTES, generation)

    def drop_consumer(self, rank: int) -> list[Lease]:
        """Stop waiting for consumer ``rank``, for good: no lease waits for its acknowledgement
        any more, leases that waited only for it are freed now (returned), and the rank is
        refused from then on (its consumer's calls and a new attach raise ``RuntimeError``).
        The recycler does this by itself for a consumer whose process has ended."""
        with self._lock:
            self.allocator.drop(rank)
        self.registry.drop(rank)
        return self._recycle_words()

    def recycle(self) -> list[Lease]:
        """Free every lease that is published and acknowledged by every consumer not dropped;
        return them. First drops the consumers whose processes have ended (at most every
        ``liveness_interval`` seconds).

        Reads the control words on a stream of its own, so it waits for no producer work.
        """
        now = time.monotonic()
        if self._liveness_interval is not None and now >= self._next_liveness:
            self._next_liveness = now + self._liveness_interval
            for rank in self.registry.dead_ranks():
                logger.warning("%s consumer rank %d: process %d has ended; dropped from the "
                               "pool", self.name, rank, self.registry.attached_pid(rank))
                with self._lock:
                    self.allocator.drop(rank)
                self.registry.drop(rank)
        return self._recycle_words()

    def _recycle_words(self) -> list[Lease]:
        with torch.cuda.stream(self._recycle_stream):
            words = self._control.to("cpu").tolist()
        with self._lock:
            return self.allocator.recycle(words)

    def error_count(self) -> int:
        """Publishes from :meth:`copy_tensor` the device refused (syncs the host: diagnostics)."""
        return int(self._state[:, ERRORS].sum())

    def export_handle(self) -> PoolHandle:
        """A picklable handle through which another process attaches to this pool."""
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, args = reduce_tensor(self.tensor)
        return PoolHandle(rebuild, args, self.max_inflight_slices, self.consumer_count,
                          self.name, self.registry.name, self.wait_timeout, self.device.index,
                          self.consumers)

    def shutdown(self) -> None:
        """Stop the recycler thread (leases stay as they are) and remove the consumer
        registry (consumers attached keep theirs; no new one can attach)."""
        self._stop.set()
        if self._recycler is not None and self._recycler.is_alive():
            self._recycler.join()
        self._unlink_registry()

    def _recycle_loop(self, interval: float) -> None:
        torch.cuda.set_device(self.device)
        # Each pass copies the control words to the host and waits: allowed while the
        # producer's thread captures a CUDA graph (a publish) only in the relaxed mode.
        _cuda_stream.relax_capture_mode_or_warn(logger, f"{self.name} pool recycler")
        while not self._stop.is_set():
            try:
                self.recycle()
            except Exception:  # a failed pass must not end the thread: the next may succeed
                logger.warning("%s pool recycle failed", self.name, exc_info=True)
            self._stop.wait(interval)


def _check_byte_tensor(byte_tensor: torch.Tensor, memory_size: int, device,
                       base_address: Optional[int]) -> torch.device:
    """The device of a caller's pool memory, checked as sglang checks it (same message)."""
    device = torch.device(device) if device is not None else byte_tensor.device
    if (not byte_tensor.is_cuda or device.type != "cuda"
            or (device.index is not None and byte_tensor.device.index != device.index)
            or byte_tensor.dtype != torch.uint8 or byte_tensor.ndim != 1
            or not byte_tensor.is_contiguous() or byte_tensor.numel() < memory_size):
        raise ValueError("byte_tensor must be a sufficiently large contiguous uint8 tensor "
                         f"on {device}")
    if base_address is not None and base_address != byte_tensor.data_ptr():
        raise ValueError(f"base_address {base_address:#x} is not byte_tensor's first byte "
                         f"{byte_tensor.data_ptr():#x}")
    return byte_tensor.device


def _control_words(pool: torch.Tensor, max_inflight_slices: int,
                   consumer_count: int) -> torch.Tensor:
    """The int32 ``[max_inflight_slices, 1 + consumer_count]`` control words of ``pool``."""
    words = 1 + consumer_count
    control = pool[:max_inflight_slices * words * WORD_BYTES].view(torch.int32)
    return control.view(max_inflight_slices, words)


class TransportConsumer:
    """One consumer's side of a pool: wait for a lease, read it, acknowledge it, all in stream
    order on the current stream of the consumer's device, ``pool``'s (no host polling).

    A wait is armed with a timeout: if the lease is not published by then, the consumer's
    watchdog releases the stream (the ready word becomes the abort word, see
    :mod:`._transport_faults`) and the next call of this consumer (or :meth:`synchronize`)
    raises ``TimeoutError`` naming the lease. The bytes the stream read after an aborted wait
    are not the lease's: work enqueued before the error was raised must be discarded.
    The bound needs the process's kernels that follow a wait to be loaded before it: with
    CUDA's lazy loading a kernel's first launch waits for the device, and behind a wait that
    is never published every CUDA call of the process, the watchdog's too, then blocks
    (``docs/reliability.md``; ``CUDA_MODULE_LOADING=EAGER`` loads them all up front).

    Parameters
    ----------
    pool : torch.Tensor
        The pool (``[memory_size]`` uint8 CUDA) as this consumer maps it: the producer's own
        tensor, or the pool's IPC handle opened on the consumer's device (:meth:`attach`),
        which is then this consumer's device (its streams, its watchdog's launches).
    rank : int
        This consumer's ack word, ``0 <= rank < consumer_count``.
    max_inflight_slices, consumer_count : int
        The pool's layout.
    name : str
        The transport's name, for messages.
    registry : ConsumerRegistry, optional
        The pool's consumer registry, with this rank attached (:meth:`attach`, :meth:`local`):
        a dropped rank is refused, and aborts are shared with the other consumers.
    wait_timeout : float, optional
        Default timeout of :meth:`wait` and :meth:`receive`, in seconds (None: the
        ``STRICTOPS_TRANSPORT_TIMEOUT`` environment variable, else 60 s).
    """

    def __init__(self, pool: torch.Tensor, *, rank: int, max_inflight_slices: int,
                 consumer_count: int, name: str = "CUDA IPC",
                 registry: Optional[ConsumerRegistry] = None,
                 wait_timeout: Optional[float] = None) -> None:
        contract.LAYOUT.validate(pool=pool, max_inflight_slices=max_inflight_slices,
                                 consumer_count=consumer_count, name=name)
        if not 0 <= rank < consumer_count:
            raise ValueError(f"{name} consumer rank {rank} is outside [0, {consumer_count})")
        self.pool = pool
        self.rank = rank
        self.max_inflight_slices = max_inflight_slices
        self.consumer_count = consumer_count
        self.name = name
        self.registry = registry
        self.wait_timeout = default_timeout(wait_timeout)
        self.base_address = pool.data_ptr()
        self._acknowledged: dict[int, int] = {}  # slot -> latest generation acknowledged
        self._watchdog: Optional[WaitWatchdog] = None
        if pool.is_cuda:
            warm_up(pool.device)

    @classmethod
    def attach(cls, handle: PoolHandle, rank: int, device=None) -> "TransportConsumer":
        """Open the pool of another process through its :meth:`TransportPool.export_handle`,
        mapped on ``device`` (a CUDA device or its index; default: the current device): the
        consumer waits, reads and acknowledges there, on that device's current stream, reading
        the bytes over a peer mapping when the pool is on another GPU. (A handle that names no
        device, made by hand, is opened as its ``rebuild`` opens it.)

        Raises ``RuntimeError``, before the rank is taken, when ``device`` cannot map the
        pool's device (``torch.cuda.can_device_access_peer``) or the pool was made for
        consumers on its own device only; and for a rank the producer dropped."""
        index = None if device is None and handle.device is None else device_index(device)
        if index is not None:
            check_placement(handle, index)
        registry = None
        if handle.registry is not None:
            registry = ConsumerRegistry(handle.consumer_count, handle.max_inflight_slices,
                                        handle.registry)
            registry.attach(rank, handle.name)
        pool = handle.rebuild(*handle.args) if index is None else open_mapped(handle, index)
        return cls(pool, rank=rank, max_inflight_slices=handle.max_inflight_slices,
                   consumer_count=handle.consumer_count, name=handle.name, registry=registry,
                   wait_timeout=handle.wait_timeout)

    @classmethod
    def local(cls, pool: TransportPool, rank: int) -> "TransportConsumer":
        """A consumer in the producer's own process."""
        pool.registry.attach(rank, pool.name)
        return cls(pool.tensor, rank=rank, max_inflight_slices=pool.max_inflight_slices,
                   consumer_count=pool.consumer_count, name=pool.name, registry=pool.registry,
                   wait_timeout=pool.wait_timeout)

    def _checked(self, lease: Sequence[int], raise_timeouts: bool = True) -> Lease:
        # Lease values arrive from another process: checked on the host before they become
        # device addresses for a wait, a view or a write.
        if raise_timeouts and self._watchdog is not None:
            self._watchdog.raise_timeouts()
        if self.registry is not None:
            self.registry.check(self.rank, self.name)
        if not lease_fits(lease, self.pool.numel(), self.max_inflight_slices,
                          self.consumer_count):
            raise ValueError(f"{self.name} lease does not fit this pool: {tuple(lease)}")
        lease = Lease(*lease)
        if lease.generation <= self._acknowledged.get(lease.slot, 0):
            raise RuntimeError(
                f"{self.name} lease (slot={lease.slot}, generation={lease.generation}) is "
                f"stale: this consumer acknowledged generation "
                f"{self._acknowledged[lease.slot]} of that slot")
        return lease

    def wait(self, lease: Sequence[int], timeout: Optional[float] = None) -> None:
        """Make the current stream wait until ``lease`` is published, for at most ``timeout``
        seconds (default: the consumer's ``wait_timeout``; ``math.inf``: no bound). Raises
        ``TimeoutError`` for an earlier wait that was aborted."""
        lease = self._checked(lease)
        timeout = self.wait_timeout if timeout is None else timeout
        if not math.isinf(timeout) and self._watchdog is None:  # before the wait blocks
            self._watchdog = WaitWatchdog(_control_words(
                self.pool, self.max_inflight_slices, self.consumer_count).view(-1),
                self.name, self.registry)
        stream = torch.cuda.current_stream(self.pool.device)
        _cuda_stream.wait_value32(stream, self.base_address + lease.ready_byte_offset,
                                  lease.generation, _cuda_stream.WAIT_VALUE_GEQ)
        if not math.isinf(timeout):
            self._watchdog.arm(lease, timeout)

    def view(self, lease: Sequence[int], dtype: torch.dtype,
             shape: Sequence[int]) -> torch.Tensor:
        """The lease's bytes as a ``dtype`` tensor of ``shape`` (no copy; valid until
        acknowledged)."""
        lease = self._checked(lease)
        return self.pool[lease.start:lease.start + lease.nbytes].view(dtype).view(shape)

    def acknowledge(self, lease: Sequence[int]) -> None:
        """Write this consumer's ack once the current stream's prior work (its reads) is done.
        An aborted lease is acknowledged too: the producer frees it once it is published."""
        lease = self._checked(lease, raise_timeouts=False)
        _cuda_stream.write_value32(
            torch.cuda.current_stream(self.pool.device),
            self.base_address + lease.ack_byte_offset + self.rank * WORD_BYTES, lease.generation)
        self._acknowledged[lease.slot] = lease.generation

    def receive(self, lease: Sequence[int], dtype: torch.dtype, shape: Sequence[int],
                timeout: Optional[float] = None) -> torch.Tensor:
        """Wait for ``lease`` (``timeout`` as :meth:`wait`), copy it out, acknowledge it;
        returns the copy. ``lease``, as for :meth:`wait` and :meth:`view`: a :class:`Lease`
        or any sequence of its seven ints."""
        self.wait(lease, timeout)
        lease = Lease(*lease)  # checked by wait
        out = self.pool[lease.start:lease.start + lease.nbytes].view(dtype).view(shape).clone()
        self.acknowledge(lease)
        return out

    def synchronize(self) -> None:
        """Block the host until the current stream's work is done (each wait on it either
        published or aborted, so at most until its timeout), then raise ``TimeoutError`` if
        any of this consumer's waits was aborted, by its own watchdog or another consumer's."""
        torch.cuda.current_stream(self.pool.device).synchronize()
        if self._watchdog is not None:
            self._watchdog.settle()
            self._watchdog.raise_timeouts()

    def close(self) -> None:
        """Stop the watchdog thread (waits still armed are no longer watched)."""
        if self._watchdog is not None:
            self._watchdog.close()

