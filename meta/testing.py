"""Testing helpers built on the contracts: fake-tensor tracing, GPU markers, hypothesis strategies.

Importing this module needs pytest and hypothesis (the ``test`` extra); the ops never import it.
Everything a test draws comes from a contract module's ``Dims``/``valid_spec``/``NEAR_MISSES``,
so the tests exercise exactly the input space the contract declares.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from . import mamba_state_scatter as mss
from ._specs import build

HAS_CUDA = torch.cuda.is_available()
HAS_TWO_GPUS = HAS_CUDA and torch.cuda.device_count() >= 2


def gpu(fn):
    """Mark a test as needing a CUDA GPU (``-m gpu`` selects it; skipped without CUDA)."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")(fn))


@contextlib.contextmanager
def fake_mode():
    """Fake tensors with a shape environment: ``torch.empty(..., device="cuda:1")`` works
    without a GPU, and Dynamo can trace them with symbolic sizes."""
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        yield mode


def dynamo_error_text(exc: BaseException) -> str:
    """The text of a tracing error, including the chained original error."""
    parts = []
    while exc is not None:
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# fused_mamba_state_scatter_with_mask


@st.composite
def mamba_dims(draw, device: str = "cuda:0", max_state_elems: int = 96) -> mss.Dims:
    """Valid call dimensions: layer counts, state shapes, dtypes and index dtypes at random."""
    state_rank = draw(st.integers(0, 3))
    state = []
    for _ in range(state_rank):
        budget = max_state_elems // max(1, _prod(state))
        state.append(draw(st.integers(1, max(1, min(budget, 16)))))
    return mss.Dims(
        num_layers=draw(st.integers(1, 4)),
        cache_size=draw(st.integers(1, 9)),
        spec_size=draw(st.integers(1, 6)),
        draft_tokens=draw(st.integers(1, 4)),
        state_shape=tuple(state),
        total_requests=draw(st.integers(0, 8)),
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int8])),
        index_dtypes=tuple(draw(st.sampled_from(mss.INDEX_DTYPES)) for _ in range(3)),
        with_src_indices=draw(st.booleans()),
        device=device,
    )


def mamba_index_values(draw, d: mss.Dims) -> dict:
    """Index values mixing valid, negative, out-of-range (also near INT32_MAX) and duplicates."""
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


@st.composite
def mamba_near_miss(draw, device: str = "cuda:0"):
    """(rule, spec) where ``spec`` breaks exactly ``rule`` of the contract."""
    rule = draw(st.sampled_from(mss.CONTRACT.rules))
    spec = mss.NEAR_MISSES[rule](mss.valid_spec(draw(mamba_dims(device=device))))
    return rule, spec


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


__all__ = [
    "HAS_CUDA",
    "HAS_TWO_GPUS",
    "build",
    "dynamo_error_text",
    "fake_mode",
    "gpu",
    "mamba_dims",
    "mamba_index_values",
    "mamba_near_miss",
]
