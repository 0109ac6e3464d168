"""Calls of ``track_mamba_states_all_layers``: dimensions and slot/mask values."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from strictops.meta.mamba import track_states as contract

OP = contract.OP_NAME
I32_MAX, I32_MIN = 2**31 - 1, -(2**31)


@st.composite
def dims(draw, device: str = "cuda:0", max_entry: int = 40, max_batch: int = 140) -> contract.Dims:
    """Valid call dimensions: layers, pool, conv and SSM entries (rank 0-3, at most
    ``max_entry`` elements), a batch of 0..``max_batch`` (over two 64-row scan blocks) and a
    batch size up to it, state, index and mask dtypes."""
    def state():
        shape = []
        for _ in range(draw(st.integers(0, 3))):
            budget = max_entry // max(1, math.prod(shape))
            shape.append(draw(st.integers(1, max(1, min(budget, 9)))))
        return tuple(shape)

    batch = draw(st.integers(0, max_batch))
    return contract.Dims(
        num_layers=draw(st.integers(1, 3)), pool_size=draw(st.integers(2, 12)),
        conv_state=state(), ssm_state=state(), batch=batch,
        batch_size=draw(st.integers(0, batch)),
        conv_dtype=draw(st.sampled_from([torch.bfloat16, torch.float32, torch.int8])),
        ssm_dtype=draw(st.sampled_from([torch.float32, torch.float16])),
        index_dtypes=tuple(draw(st.sampled_from(contract.INDEX_DTYPES)) for _ in range(2)),
        mask_dtype=draw(st.sampled_from(contract.MASK_DTYPES)), device=device)


def values(draw, d: contract.Dims, device: str, generator: torch.Generator) -> dict:
    """The call's arguments as real tensors on ``device``: random states; cache slots in the
    lower half of the pool and track slots in the upper half (apart, as in serving), mixed
    with negative, out-of-range and int32-extreme slots; masks with zero and non-zero values."""
    spec = contract.valid_spec(d)
    half, n = d.pool_size // 2, d.batch
    bad = st.sampled_from([-1, -5, d.pool_size, d.pool_size + 3, I32_MAX, I32_MIN])

    def column(lo, hi, dtype):
        vals = draw(st.lists(st.one_of(st.integers(lo, hi - 1), st.integers(lo, hi - 1), bad),
                             min_size=n, max_size=n))
        return torch.tensor(vals, dtype=dtype, device=device)

    out = {}
    for name in ("conv_states_pool", "ssm_states_pool"):
        s = spec[name]
        out[name] = (torch.randn(s.shape, generator=generator) * 50).to(s.dtype).to(device)
    mask = draw(st.lists(st.sampled_from([0, 1, 1, 7, I32_MIN]), min_size=n, max_size=n))
    out.update(cache_indices=column(0, half, d.index_dtypes[0]),
               mamba_track_mask=torch.tensor(mask, device=device).to(d.mask_dtype),
               mamba_track_indices=column(half, d.pool_size, d.index_dtypes[1]),
               batch_size=spec["batch_size"], check_freed_slots=False)
    return out
