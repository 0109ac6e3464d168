"""Calls of ``fused_conv_window_scatter_with_mask``: dimensions and index values."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from .. import conv_window_scatter as contract
from . import mamba_state_scatter

OP = contract.OP_NAME
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.int8)


@st.composite
def dims(draw, device: str = "cuda:0") -> contract.Dims:
    """Valid call dimensions: every size >= 1 (window widths 1-6, so that a tile's column
    block is partial, whole or repeated), overlapping or contiguous windows, any dtypes."""
    return contract.Dims(
        num_layers=draw(st.integers(1, 3)),
        cache_size=draw(st.integers(1, 9)),
        spec_size=draw(st.integers(1, 6)),
        draft_tokens=draw(st.integers(1, 4)),
        dim=draw(st.integers(1, 40)),
        km1=draw(st.integers(1, 6)),
        total_requests=draw(st.integers(0, 8)),
        dtype=draw(st.sampled_from(DTYPES)),
        index_dtypes=tuple(draw(st.sampled_from(contract.INDEX_DTYPES)) for _ in range(3)),
        with_src_indices=draw(st.booleans()),
        overlapping=draw(st.booleans()),
        device=device,
    )


def index_values(draw, d: contract.Dims) -> dict:
    """Index values of a call with dims ``d``: as the state scatter's are drawn."""
    return mamba_state_scatter.index_values(draw, d)
