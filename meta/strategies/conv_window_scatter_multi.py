"""Calls of ``fused_conv_window_scatter_multi``: dimensions, index values and real tensors."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from strictops.meta.mamba import conv_window_scatter_multi as contract
from strictops.meta.strategies import conv_window_scatter, mamba_state_scatter

OP = contract.OP_NAME


@st.composite
def dims(draw, device: str = "cuda:0", max_pairs: int = contract.MAX_PAIRS) -> contract.Dims:
    """Valid call dimensions: 1 to ``max_pairs`` pairs of any dims (1-20), window widths (1-5)
    and dtypes, one or two request sets (either may be empty), overlapping or contiguous
    windows."""
    one = draw(conv_window_scatter.dims(device=device))
    windows = draw(st.lists(
        st.tuples(st.integers(1, 20), st.integers(1, 5),
                  st.sampled_from(conv_window_scatter.DTYPES)),
        min_size=1, max_size=max_pairs))
    return contract.Dims(
        num_layers=one.num_layers, cache_size=one.cache_size, spec_size=one.spec_size,
        draft_tokens=one.draft_tokens, windows=tuple(windows), n1=one.total_requests,
        n2=draw(st.one_of(st.none(), st.integers(0, 8))),
        index_dtypes=tuple(draw(st.sampled_from(contract.mamba_state_scatter.INDEX_DTYPES))
                           for _ in range(4)),
        overlapping=one.overlapping, device=device,
    )


def index_values(draw, d: contract.Dims) -> dict:
    """Index values of both request sets, drawn as the state scatter's are (a request's row is
    its position, so a set longer than ``spec_size`` has out-of-range rows too)."""
    def one_set(n):
        return mamba_state_scatter.index_values(draw, contract.mamba_state_scatter.Dims(
            d.num_layers, d.cache_size, d.spec_size, d.draft_tokens, (), n))

    first = one_set(d.n1)
    second = one_set(d.n2) if d.n2 is not None else None
    return {
        "dst_indices_raw": first["dst_indices_raw"],
        "step_indices_raw": first["step_indices_raw"],
        "dst_indices2_raw": None if second is None else second["dst_indices_raw"],
        "step_indices2_raw": None if second is None else second["step_indices_raw"],
    }


def tensors(d: contract.Dims, values: dict, device: str, gen: torch.Generator) -> dict:
    """Real arguments for ``d``: every pair's ``dst`` random, its ``src`` an overlapping window
    view of a random shared buffer (``d.overlapping``) or a random contiguous tensor, and the
    index ``values`` (``{name: list or None}``)."""
    def random(dtype, *shape):
        if dtype.is_floating_point:
            return torch.randn(shape, generator=gen).to(dtype=dtype, device=device)
        return torch.randint(-100, 100, shape, generator=gen).to(dtype=dtype, device=device)

    L, spec, draft = d.num_layers, d.spec_size, d.draft_tokens
    pairs = []
    for dim, km1, dtype in d.windows:
        if d.overlapping:
            width = draft + km1 - 1
            src = random(dtype, L, spec, dim, width).as_strided(
                (L, spec, draft, dim, km1), (spec * dim * width, dim * width, 1, width, 1))
        else:
            src = random(dtype, L, spec, draft, dim, km1)
        pairs.append((random(dtype, L, d.cache_size, dim, km1), src))
    specs = contract.valid_spec(d)
    return {"pairs": pairs, **{
        name: None if vals is None else torch.tensor(vals, dtype=specs[name].dtype, device=device)
        for name, vals in values.items()}}
