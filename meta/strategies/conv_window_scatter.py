"""Calls of ``fused_conv_window_scatter_with_mask``: dimensions and index values."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from strictops.meta.mamba import conv_window_scatter as contract
from strictops.meta.strategies import mamba_state_scatter

OP = contract.OP_NAME
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.int8)
# Kernel tunings (``launch_interpreted`` keywords, of this op and the multi-pair op) that the
# interpreter tests draw: runs shorter than a window row and longer than an entry, one to
# four layers a program (``dims`` draws 1-3 layers), every load layout (16-, 8- and 2-byte
# runs a thread, the shared-memory exchange), streaming loads and stores, and the int64 path
# (an ``i32_reach`` below the small tensors' offsets).
TUNINGS = st.sampled_from([{}, {"block_bytes": 16, "layers": 1}, {"block_bytes": 256},
                           {"block_bytes": 64, "layers": 2, "run_bytes": 0},
                           {"block_bytes": 128, "layers": 4, "run_bytes": 8, "stream": True},
                           {"block_bytes": 64, "layers": 2, "run_bytes": 2, "i32_reach": 48},
                           {"block_bytes": 16, "layers": 4, "i32_reach": 0}])


@st.composite
def dims(draw, device: str = "cuda:0") -> contract.Dims:
    """Valid call dimensions: every size >= 1 (window widths 1-6, so that a program's run of
    the entry starts and ends inside a window row or on its edge), overlapping or contiguous
    windows, any dtypes."""
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
