"""Calls of ``fused_mamba_state_scatter_with_mask``: dimensions and index values."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from strictops.meta.mamba import state_scatter as contract

OP = contract.OP_NAME
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int8)


@st.composite
def dims(draw, device: str = "cuda:0", max_state_elems: int = 96) -> contract.Dims:
    """Valid call dimensions: layer counts, state shapes (rank 0-3, at most
    ``max_state_elems`` elements), dtypes and index dtypes at random."""
    state = []
    for _ in range(draw(st.integers(0, 3))):
        budget = max_state_elems // max(1, math.prod(state))
        state.append(draw(st.integers(1, max(1, min(budget, 16)))))
    return contract.Dims(
        num_layers=draw(st.integers(1, 4)),
        cache_size=draw(st.integers(1, 9)),
        spec_size=draw(st.integers(1, 6)),
        draft_tokens=draw(st.integers(1, 4)),
        state_shape=tuple(state),
        total_requests=draw(st.integers(0, 8)),
        dtype=draw(st.sampled_from(DTYPES)),
        index_dtypes=tuple(draw(st.sampled_from(contract.INDEX_DTYPES)) for _ in range(3)),
        with_src_indices=draw(st.booleans()),
        device=device,
    )


def index_values(draw, d: contract.Dims) -> dict:
    """Index values for a call with dims ``d`` (``draw``: hypothesis's, from ``st.data()``):
    valid, negative, out-of-range (also near INT32_MAX) and duplicate values mixed."""
    n = d.total_requests

    def column(upper: int) -> list[int]:
        return draw(st.lists(
            st.one_of(st.integers(0, max(upper - 1, 0)), st.integers(-3, -1),
                      st.integers(upper, upper + 2), st.just(2**31 - 1), st.just(-(2**31))),
            min_size=n, max_size=n))

    return {
        "dst_indices_raw": column(d.cache_size),
        "step_indices_raw": column(d.draft_tokens),
        "src_indices_raw": column(d.spec_size) if d.with_src_indices else None,
    }
