"""The transport pool's leases: which byte range of the pool's data region, and which slot, a
tensor in flight holds (:class:`LeaseAllocator`, pure Python), and the lease as sglang's
keywords give it (:func:`lease_words`). The layout and the lease format are in
:mod:`strictops.meta.transport.pool`.
"""

from __future__ import annotations

import bisect
from typing import Optional, Sequence

from strictops.meta.transport import pool as contract
from strictops.meta.transport.pool import (
    DATA_ALIGNMENT,
    MAX_GENERATION,
    WORD_BYTES,
    Lease,
    align_up,
)

__all__ = ["DEFAULT_MAX_INFLIGHT_SLICES", "LeaseAllocator", "lease_words"]

DEFAULT_MAX_INFLIGHT_SLICES = 4096


class LeaseAllocator:
    """Leases of the pool's data region: best-fit 256-byte-aligned ranges, merged when freed,
    and slots whose generation grows on every lease.

    Pure Python (no tensor, no device, no lock): :class:`TransportPool` calls it under its lock,
    and the tests drive it directly.

    Parameters
    ----------
    memory_size, max_inflight_slices, consumer_count : int
        The pool's layout (:mod:`strictops.meta.transport.pool`), already validated.
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


