"""Calls of ``fused_commit_track_indices``: dimensions and length/index values."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from strictops.meta.mamba import commit_indices as contract

OP = contract.OP_NAME
I64_MAX, I64_MIN = 2**63 - 1, -(2**63)


@st.composite
def dims(draw, device: str = "cuda:0", max_batch: int = 300) -> contract.Dims:
    """Valid call dimensions: batch (0..``max_batch``, several kernel programs), accepted-token
    columns (0..6), draft rows per request, interval, with or without ``seq_lens``, dtypes."""
    return contract.Dims(
        batch=draw(st.integers(0, max_batch)), accepted_tokens=draw(st.integers(0, 6)),
        draft_token_num=draw(st.integers(1, 8)), mamba_track_interval=draw(st.integers(1, 9)),
        with_seq_lens=draw(st.booleans()),
        index_dtypes=tuple(draw(st.sampled_from(contract.INDEX_DTYPES)) for _ in range(3)),
        device=device)


def values(draw, d: contract.Dims, device: str) -> dict:
    """The call's arguments as real tensors on ``device`` (``draw``: hypothesis's, from
    ``st.data()``): lengths and rows mostly in range, mixed with negative, too-long and
    extreme (int32/int64 bounds, clipped to each tensor's dtype) values."""
    b, n = d.batch, d.accepted_tokens
    extreme = st.sampled_from([-1, I64_MIN, I64_MAX, 2**31 - 1, -(2**31), n + 1])
    small = st.integers(-2, n + 1)

    def column(dtype, vals) -> torch.Tensor:
        info = torch.iinfo(dtype)
        return torch.tensor([min(max(v, info.min), info.max) for v in vals], dtype=dtype,
                            device=device)

    lens = draw(st.lists(st.one_of(small, small, extreme), min_size=b, max_size=b))
    seq = draw(st.lists(st.one_of(st.integers(0, 40), extreme), min_size=b, max_size=b))
    index = draw(st.lists(st.one_of(st.integers(-1, b * d.draft_token_num), extreme),
                          min_size=b * n, max_size=b * n))
    ai, al, sl = d.index_dtypes
    return {"accept_index": column(ai, index).reshape(b, n), "accept_lens": column(al, lens),
            "seq_lens": column(sl, seq) if d.with_seq_lens else None,
            "draft_token_num": d.draft_token_num, "mamba_track_interval": d.mamba_track_interval}
