"""Calls of ``copy_and_publish``: pool layouts, sources that fit, and lease values."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from strictops.meta.transport import pool as contract

OP = contract.OP_NAME
SRC_DTYPES = (torch.uint8, torch.bool, torch.bfloat16, torch.float32, torch.int64)


@st.composite
def dims(draw, device: str = "cuda:0", max_data: int = 2048) -> contract.Dims:
    """Valid call dimensions: pool layout, a data region of 1..``max_data`` bytes (not always a
    multiple of 256), a source of any rank (0-2) and dtype that fits it, and where the
    consumers are."""
    slots, consumers = draw(st.integers(1, 9)), draw(st.integers(1, 4))
    data = draw(st.integers(1, max_data))
    dtype = draw(st.sampled_from(SRC_DTYPES))
    most = max(1, data // dtype.itemsize)
    if most * dtype.itemsize > data:  # not even one element fits: bytes do
        dtype = torch.uint8
    numel = draw(st.integers(1, most))
    rank = draw(st.integers(0 if numel == 1 else 1, 2))
    if rank == 0:
        shape = ()
    elif rank == 1:
        shape = (numel,)
    else:
        rows = draw(st.sampled_from([d for d in range(1, numel + 1) if numel % d == 0]))
        shape = (rows, numel // rows)
    return contract.Dims(memory_size=contract.data_start(slots, consumers) + data,
                         max_inflight_slices=slots, consumer_count=consumers, src_shape=shape,
                         src_dtype=dtype, device=device,
                         consumers=draw(st.sampled_from(contract.CONSUMER_PLACES)))


def src_nbytes(d: contract.Dims) -> int:
    """Bytes of the source of a call with dims ``d``."""
    return math.prod(d.src_shape) * d.src_dtype.itemsize


@st.composite
def lease(draw, d: contract.Dims) -> contract.Lease:
    """Lease values for a call with dims ``d``: a fitting lease, or one broken in one or two
    ways, each just past one bound of :func:`~strictops.meta.transport.pool.lease_fits`
    (misaligned, in the control words, past the range or the pool, longer than the source,
    a slot that does not exist, an ack word for the ready word, generation 0 / 2**31) or one
    field set to any int64."""
    tp = contract
    start0 = tp.data_start(d.max_inflight_slices, d.consumer_count)
    nbytes_src = src_nbytes(d)
    start = draw(st.sampled_from(range(start0, d.memory_size, tp.DATA_ALIGNMENT)))
    nbytes = draw(st.integers(1, min(nbytes_src, d.memory_size - start)))
    end = draw(st.integers(start + nbytes, d.memory_size))
    slot = draw(st.integers(0, d.max_inflight_slices - 1))
    ready = slot * tp.slot_bytes(d.consumer_count)
    fitting = tp.Lease(start, end, nbytes, slot, draw(st.integers(1, tp.MAX_GENERATION)),
                       ready, ready + tp.WORD_BYTES)
    if draw(st.booleans()):
        return fitting
    stride = tp.slot_bytes(d.consumer_count)

    def in_slot(k: int) -> dict:  # a slot with its own ready and ack words
        return {"slot": k, "ready_byte_offset": k * stride,
                "ack_byte_offset": k * stride + tp.WORD_BYTES}

    # Each breaks one term of lease_fits and keeps the others where it can.
    breaks = [
        {"start": start + draw(st.integers(1, tp.DATA_ALIGNMENT - 1)), "end": d.memory_size},
        {"start": start0 - tp.DATA_ALIGNMENT},
        {"end": start - 1},
        {"end": start + nbytes - 1},
        {"end": d.memory_size + draw(st.integers(1, 2**40))},
        {"nbytes": draw(st.sampled_from([0, -1, -(2**63)]))},
        {"nbytes": nbytes_src + 1, "end": d.memory_size},
        in_slot(-draw(st.integers(1, 3))),
        in_slot(d.max_inflight_slices + draw(st.integers(0, 2))),
        {"ready_byte_offset": ready + tp.WORD_BYTES, "ack_byte_offset": ready + 2 * tp.WORD_BYTES},
        {"ack_byte_offset": ready + 2 * tp.WORD_BYTES},
        {"generation": draw(st.sampled_from([0, -1, tp.MAX_GENERATION + 1,
                                             2**32 + fitting.generation]))},
        {draw(st.sampled_from(tp.Lease._fields)): draw(st.integers(-(2**63), 2**63 - 1))},
    ]
    # Mostly one break, so that each term of the rule is the only one to fail now and then.
    count = draw(st.sampled_from([1, 1, 1, 2]))
    out = fitting
    for change in draw(st.lists(st.sampled_from(breaks), min_size=count, max_size=count)):
        out = out._replace(**change)
    return out
