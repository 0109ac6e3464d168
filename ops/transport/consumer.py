"""The transport pool's consumers: :class:`TransportConsumer` attaches to a producer's pool
(over CUDA IPC, on the pool's GPU or through a peer mapping on its own), waits for a lease's
ready word in stream order (``cuStreamWaitValue32``), reads its bytes, and acknowledges it by
writing the generation into its own ack word (``cuStreamWriteValue32``); a range is free again
once every consumer has acknowledged. The producer is :mod:`strictops.ops.transport.producer`.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from strictops.meta.transport import pool as contract
from strictops.meta.transport.pool import WORD_BYTES, Lease, lease_fits
from strictops.ops.transport import cuda_stream as _cuda_stream
from strictops.ops.transport.faults import ConsumerRegistry, WaitWatchdog, default_timeout, warm_up
from strictops.ops.transport.peers import check_placement, device_index, open_mapped
from strictops.ops.transport.producer import PoolHandle, TransportPool, _control_words

__all__ = ["TransportConsumer"]


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


