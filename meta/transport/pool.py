"""Contract of ``strictops::copy_and_publish``, the copy-and-publish step of the GPU transport
pool.

Pool layout (bytes of one 1-D uint8 CUDA tensor, shared with consumer processes)::

    [0, control_bytes)           int32 control words, max_inflight_slices rows of
                                 (1 ready word, then 1 ack word per consumer)
    [control_bytes, data_start)  padding, data_start = align_up(control_bytes, 256)
    [data_start, memory_size)    data, leased in 256-byte-aligned ranges

Arguments of the op
-------------------
pool : Tensor ``[memory_size]`` uint8, contiguous, starting 256-byte aligned in its storage;
    mutated (one lease's data range and its ready word).
src : Tensor, any shape and dtype, contiguous, non-empty, on ``pool``'s device; its first
    ``nbytes`` bytes (a field of the lease) are copied.
lease : Tensor ``[LEASE_WORDS]`` int64 on ``pool``'s device: the fields of :class:`Lease`, in
    order. Read on the device, so one captured CUDA graph can publish into a new lease on every
    replay; its values are checked there (:func:`lease_fits`), never on the host.
state : Tensor ``[STATE_WORDS]`` int32 on ``pool``'s device, zero when first used; mutated.
    ``state[ARRIVALS]`` is the kernel's own arrival counter (back to 0 after every launch);
    ``state[ERRORS]`` counts publishes refused because the lease did not fit, for the host to
    read whenever it likes.
max_inflight_slices, consumer_count : int
    The pool's layout. Known at trace time, so the bounds the kernel checks lease values
    against cannot themselves come from device memory.
consumers : str
    Where the flag's observers may be (``CONSUMER_PLACES``): ``"peers"`` (the default: on
    other GPUs too, through a peer or fabric mapping of the pool; the flag is released at
    system scope) or ``"same_device"`` (only on the pool's GPU; a GPU-scope release). A
    trace-time constant, so a captured graph keeps the ordering it was traced with.

The op's metadata rules are below (``CHECKS``), in order; ``{name}`` is the transport's name
(``copy_and_publish`` when the op is called directly, the pool's name from ``copy_tensor``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Sequence

import torch
from strictops.meta._contract import Check, Contract, hint
from strictops.meta._specs import TensorSpec, other_device as _other_device, with_changes as _with

OP_NAME = "copy_and_publish"

WORD_BYTES = 4
DATA_ALIGNMENT = 256
MAX_GENERATION = 0x7FFFFFFF
# Where a pool's consumers may be: the first is the default (sglang's deployment).
PEERS, SAME_DEVICE = "peers", "same_device"
CONSUMER_PLACES = (PEERS, SAME_DEVICE)


class Lease(NamedTuple):
    """One leased data range and its slot, as the pool hands it out; all offsets are bytes
    from the start of the pool. ``torch.tensor(lease)`` is the op's ``lease`` argument."""

    start: int
    end: int
    nbytes: int
    slot: int
    generation: int
    ready_byte_offset: int
    ack_byte_offset: int


LEASE_WORDS = len(Lease._fields)
STATE_WORDS = 2
ARRIVALS, ERRORS = 0, 1


def align_up(value, alignment: int):
    """Smallest multiple of ``alignment`` >= ``value`` (ints or SymInts)."""
    return (value + alignment - 1) // alignment * alignment


def slot_bytes(consumer_count):
    """Bytes of one slot's control words: its ready word and one ack word per consumer."""
    return (1 + consumer_count) * WORD_BYTES


def data_start(max_inflight_slices, consumer_count):
    """First data byte: the control words, rounded up to the data alignment."""
    return align_up(max_inflight_slices * slot_bytes(consumer_count), DATA_ALIGNMENT)


def lease_fits(lease: Sequence[int], memory_size: int, max_inflight_slices: int,
               consumer_count: int, src_nbytes: int | None = None) -> bool:
    """The device-side rule for lease values, on the host (reference, consumers).

    A lease fits when its range is a 256-byte-aligned part of the data region holding
    ``0 < nbytes <= src_nbytes`` bytes, its slot exists, its ready and ack offsets are that
    slot's ready word and first ack word, and its generation is a positive int32. The kernel
    evaluates the same conjunction on the device and skips (and counts) a lease that fails it.
    """
    start, end, nbytes, slot, generation, ready, ack = (int(v) for v in lease)
    stride = slot_bytes(consumer_count)
    return (data_start(max_inflight_slices, consumer_count) <= start <= end <= memory_size
            and start % DATA_ALIGNMENT == 0
            and 0 < nbytes <= end - start
            and (src_nbytes is None or nbytes <= src_nbytes)
            and 0 <= slot < max_inflight_slices
            and ready == slot * stride and ack == ready + WORD_BYTES
            and 0 < generation <= MAX_GENERATION)


def known_placement(consumers) -> bool:
    """Whether ``consumers`` names a placement of ``CONSUMER_PLACES`` (the ``consumers_known``
    rule)."""
    return consumers in CONSUMER_PLACES


def _src_nbytes(src):
    return src.numel() * src.element_size()


def _data_bytes(a):
    return a.pool.numel() - data_start(a.max_inflight_slices, a.consumer_count)


def _descriptor_checks(arg: str, dtype: torch.dtype, words: int) -> tuple[Check, ...]:
    """Format, device and contiguity rules of ``lease`` or ``state``: fixed-size descriptors,
    whose length is a constant of the op, so a guard on it specialises nothing that varies."""
    dtype_name = str(dtype).removeprefix("torch.")
    return (
        Check(
            f"{arg}_format",
            lambda a: (getattr(a, arg).dtype == dtype and getattr(a, arg).ndim == 1
                       and getattr(a, arg).shape[0] == words),
            lambda name=OP_NAME, **args: (
                f"{name} {arg} must be {dtype_name} with shape ({words},), "
                f"got {tuple(args[arg].shape)}/{args[arg].dtype}"
            ),
        ),
        Check(
            f"{arg}_device",
            lambda a: getattr(a, arg).device == a.pool.device,
            lambda pool, name=OP_NAME, **args: (
                f"{name} {arg} must be on the pool's device {pool.device}, "
                f"got {args[arg].device}"
            ),
        ),
        Check(
            f"{arg}_contiguous",
            lambda a: getattr(a, arg).is_contiguous(),
            lambda name=OP_NAME, **_: f"{name} {arg} must be contiguous",
        ),
    )


CHECKS = (
    Check(
        "src_cuda",
        lambda a: a.src.is_cuda,
        lambda name=OP_NAME, **_: f"{name} requires a CUDA tensor",
    ),
    Check(
        "src_nonempty",
        lambda a: a.src.numel() != 0,
        lambda name=OP_NAME, **_: f"{name} cannot transport an empty tensor",
    ),
    Check(
        "src_contiguous",
        lambda a: a.src.is_contiguous(),
        lambda src, name=OP_NAME, **_: (
            f"{name} source must be contiguous; got shape={tuple(src.shape)} "
            f"strides={tuple(src.stride())}"
        ),
    ),
    Check(
        "same_device",
        lambda a: a.pool.device == a.src.device,
        lambda pool, src, name=OP_NAME, **_: (
            f"{name} pool and source must be on the same device. {pool.device=} {src.device=}"
        ),
    ),
    Check(
        "pool_format",
        lambda a: a.pool.dtype == torch.uint8 and a.pool.ndim == 1 and a.pool.is_contiguous(),
        lambda pool, name=OP_NAME, **_: (
            f"{name} pool must be a contiguous 1-D uint8 tensor; got dtype={pool.dtype} "
            f"shape={tuple(pool.shape)} strides={tuple(pool.stride())}"
        ),
    ),
    Check(  # control words are int32 and data ranges 256-byte aligned from the pool's start
        "pool_aligned",
        lambda a: a.pool.storage_offset() % DATA_ALIGNMENT == 0,
        lambda pool, name=OP_NAME, **_: (
            f"{name} pool must start {DATA_ALIGNMENT}-byte aligned in its storage; "
            f"got storage_offset={hint(pool.storage_offset())}"
        ),
    ),
    Check(
        "slots_positive",
        lambda a: a.max_inflight_slices > 0,
        lambda max_inflight_slices, **_: (
            f"max_inflight_slices must be positive, got {max_inflight_slices}"
        ),
    ),
    Check(
        "consumers_positive",
        lambda a: a.consumer_count > 0,
        lambda consumer_count, **_: f"consumer_count must be positive, got {consumer_count}",
    ),
    Check(
        "pool_size",
        lambda a: _data_bytes(a) > 0,
        lambda pool, max_inflight_slices, consumer_count, name=OP_NAME, **_: (
            f"{name} pool is too small after control metadata: pool={pool.numel()}, "
            f"control={data_start(max_inflight_slices, consumer_count)}"
        ),
    ),
    Check(
        "src_fits",
        lambda a: _src_nbytes(a.src) <= _data_bytes(a),
        lambda pool, src, max_inflight_slices, consumer_count, name=OP_NAME, **_: (
            f"{name} source of {_src_nbytes(src)} bytes does not fit the pool's data region "
            f"of {pool.numel() - data_start(max_inflight_slices, consumer_count)} bytes"
        ),
    ),
    *_descriptor_checks("lease", torch.int64, LEASE_WORDS),
    *_descriptor_checks("state", torch.int32, STATE_WORDS),
    Check(
        "consumers_known",
        lambda a: known_placement(a.consumers),
        lambda consumers, name=OP_NAME, **_: (
            f"{name} consumers must be one of {CONSUMER_PLACES}, got {consumers!r}"
        ),
    ),
)

CONTRACT = Contract(op=f"strictops::{OP_NAME}", stem="transport_pool",
                    module="transport.pool",
                    checks=CHECKS,
                    mutates=("pool", "state"))


def _subset(rules: tuple[str, ...]) -> Contract:
    """The same ``Check`` rows, restricted to ``rules`` and kept in contract order."""
    return Contract(op=CONTRACT.op, stem=CONTRACT.stem, module=CONTRACT.module,
                    checks=tuple(c for c in CHECKS if c.rule in rules))


# What a pool checks when it is made (no source, lease or state yet) ...
LAYOUT = _subset(("pool_format", "pool_aligned", "slots_positive", "consumers_positive",
                  "pool_size"))
# ... with where its consumers are ...
PLACEMENT = _subset(("consumers_known",))
# ... and, per copy_tensor, before it leases a range: its layout and placement were checked when
# it was made, the lease values come from its own allocator (as kernel arguments) and the state
# row is its own.
SOURCE = _subset(tuple(r for r in CONTRACT.rules
                       if r not in LAYOUT.rules + PLACEMENT.rules
                       and not r.startswith(("lease_", "state_"))))


# The op's arguments, in order (``name`` only names the transport in messages).
ARGUMENTS = ("pool", "src", "lease", "state", "max_inflight_slices", "consumer_count",
             "consumers", "name")


def validate(pool, src, lease, state, max_inflight_slices, consumer_count,
             consumers: str = PEERS, name: str = OP_NAME) -> None:
    """Run the contract on real, fake or symbolic tensors; raise the first broken rule."""
    CONTRACT.validate(pool=pool, src=src, lease=lease, state=state,
                      max_inflight_slices=max_inflight_slices, consumer_count=consumer_count,
                      consumers=consumers, name=name)


def system_scope(consumers: str) -> bool:
    """Whether the flag of a pool with ``consumers`` is released at system scope: unless every
    consumer is on the pool's own GPU."""
    return consumers != SAME_DEVICE


# --------------------------------------------------------------------------------------------
# The input space, as data: valid calls and one near miss per rule. Tests, compile tests and the
# self-check build every call from these.


@dataclass(frozen=True)
class Dims:
    """Free parameters of a valid call: ``src_shape`` x ``src_dtype`` must fit the data region."""

    memory_size: int
    max_inflight_slices: int
    consumer_count: int
    src_shape: tuple[int, ...]
    src_dtype: torch.dtype = torch.float32
    device: str = "cuda:0"
    consumers: str = PEERS


def valid_spec(d: Dims) -> dict:
    return {
        "pool": TensorSpec((d.memory_size,), torch.uint8, d.device),
        "src": TensorSpec(d.src_shape, d.src_dtype, d.device),
        "lease": TensorSpec((LEASE_WORDS,), torch.int64, d.device),
        "state": TensorSpec((STATE_WORDS,), torch.int32, d.device),
        "max_inflight_slices": d.max_inflight_slices,
        "consumer_count": d.consumer_count,
        "consumers": d.consumers,
    }


@dataclass(frozen=True)
class OffsetSpec(TensorSpec):
    """A 1-D tensor that starts ``offset`` elements into its storage (a plain
    :class:`TensorSpec` always starts at 0)."""

    offset: int = 0
    symbolic: ClassVar[bool] = False  # its point is its storage offset

    def empty(self) -> torch.Tensor:
        base = torch.empty(self.shape[0] + self.offset, dtype=self.dtype, device=self.device)
        return base.narrow(0, self.offset, self.shape[0])


def _strided(t: TensorSpec) -> TensorSpec:
    """``t`` with a gap after every element of its last dim, which first grows to 2 elements
    if it has fewer (a 0-d tensor becomes ``[2]``)."""
    if not t.shape or t.shape[-1] < 2:
        t = t.replace(shape=(*t.shape[:-1], 2))
    return t.strided()


def _data_region(spec: dict) -> int:
    return spec["pool"].shape[0] - data_start(spec["max_inflight_slices"], spec["consumer_count"])


NEAR_MISSES = {
    "src_cuda": lambda s: _with(s, src={"device": "cpu"}),
    "src_nonempty": lambda s: _with(s, src={"shape": (*s["src"].shape[:-1], 0)}),
    "src_contiguous": lambda s: {**s, "src": _strided(s["src"])},
    "same_device": lambda s: _with(s, pool={"device": _other_device(s["src"].device)}),
    "pool_format": lambda s: _with(s, pool={"dtype": torch.int8}),
    "pool_aligned": lambda s: {**s, "pool": OffsetSpec(**vars(s["pool"]), offset=4)},
    "slots_positive": lambda s: {**s, "max_inflight_slices": 0},
    "consumers_positive": lambda s: {**s, "consumer_count": -1},
    "pool_size": lambda s: _with(s, pool={"shape": (data_start(s["max_inflight_slices"],
                                                               s["consumer_count"]),)}),
    "src_fits": lambda s: _with(s, src={"shape": (_data_region(s) + 1,), "dtype": torch.uint8}),
    "lease_format": lambda s: _with(s, lease={"dtype": torch.int32}),
    "lease_device": lambda s: _with(s, lease={"device": "cpu"}),
    "lease_contiguous": lambda s: {**s, "lease": s["lease"].with_gap(0)},
    "state_format": lambda s: _with(s, state={"shape": (STATE_WORDS + 1,)}),
    "state_device": lambda s: _with(s, state={"device": "cpu"}),
    "state_contiguous": lambda s: {**s, "state": s["state"].with_gap(0)},
    "consumers_known": lambda s: {**s, "consumers": "other_gpus"},
}
