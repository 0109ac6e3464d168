"""Calls of ``sparse_mla_q8kv8_prefill_fwd``: dimensions, optional arguments at random."""

from __future__ import annotations

from hypothesis import strategies as st

from strictops.meta.sparse_mla import prefill as contract

OP = contract.OP_NAME


@st.composite
def dims(draw, device: str = "cuda:0", small: bool = False) -> contract.Dims:
    """Valid call dimensions, optional arguments at random. ``small``: interpreter-sized
    (``s_q <= 4``, ``h_q = 64``, ``topk = 128``, ``s_kv <= 300``)."""
    with_attn_sink = draw(st.booleans())
    return contract.Dims(
        s_q=draw(st.integers(1, 4 if small else 9)),
        s_kv=draw(st.integers(1, 300)),
        h_q=64 if small else draw(st.sampled_from([64, 128, 192])),
        d_qk=draw(st.sampled_from(contract.D_QKS)),
        topk=128 if small else draw(st.sampled_from([128, 256])),
        with_topk_length=with_attn_sink or draw(st.booleans()),
        with_attn_sink=with_attn_sink,
        with_buffers=draw(st.booleans()),
        with_errors=draw(st.booleans()),
        device=device,
    )
