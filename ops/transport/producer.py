"""The transport pool's producer: :class:`TransportPool` owns one preallocated CUDA byte pool,
leases its ranges, copies tensors in and publishes them (:func:`strictops.ops.transport.pool.
copy_and_publish`: the bytes, then the lease's generation in its ready word), recycles the ranges
every consumer has acknowledged, and exports the pool to consumer processes over CUDA IPC
(:class:`PoolHandle`; the consumers' side is :mod:`strictops.ops.transport.consumer`).

The pool lives on the producer's GPU; a consumer may sit on another GPU (sglang's tensor-parallel
ranks, one per GPU): it maps the pool on its own device (a peer mapping over NVLink), waits and
acknowledges on its own device's stream, and reads the bytes over the mapping. The pool's
``consumers`` (``"peers"``, the default, or ``"same_device"``) sets the scope at which the
publish releases the ready word, so that a peer sees the bytes before the word. The layout and
the lease format are in :mod:`strictops.meta.transport.pool`.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from strictops.meta._contract import CachedValidation
from strictops.meta.transport import pool as contract
from strictops.meta.transport.pool import ERRORS, WORD_BYTES, Lease
from strictops.ops._runtime.host_path import MISS, HostPath, Slice
from strictops.ops._runtime.launcher import Pointer
from strictops.ops.transport import cuda_stream as _cuda_stream
from strictops.ops.transport import pool as _publish
from strictops.ops.transport.faults import ConsumerRegistry
from strictops.ops.transport.leases import DEFAULT_MAX_INFLIGHT_SLICES, LeaseAllocator, lease_words
from strictops.ops.transport.pool import copy_and_publish, launch_eager

__all__ = ["PoolHandle", "TransportPool", "STATE_ROW_WORDS"]

logger = logging.getLogger(__name__)

# copy_tensor's checks of its source, cached per metadata signature (the pool's layout was
# checked when it was made; the lease and state are its own).
_SOURCE_VALIDATION = CachedValidation(contract.SOURCE, ("pool", "src", "max_inflight_slices",
                                                        "consumer_count", "name"))
# copy_tensor's C++ eager path (strictops.ops._runtime.host_path): a plan per signature of the pool
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
        row = Pointer(state, torch.int32)  # also the lease pointer, which the kernel leaves unread
        return launch_eager(self.tensor, source, row, row, self.max_inflight_slices,
                            self.consumer_count, lease, self.consumers)

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


