"""scatter_mamba_states_after_mtp_verify: composition, numerics, the original's behaviour.

CPU (CI): with each scatter run by its kernel under the Triton interpreter, the composition
equals the reference for any index values (both program orders), skips empty caches, writes the
track set after the commit set, and refuses a track set without steps. GPU (``-m gpu``): the
public function equals the reference, and sglang's original (``.anchor``) bit for bit at the
model's shapes, with and without tracking.
"""

from __future__ import annotations

import contextlib
import functools
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strictops.meta.strategies import mamba_state_scatter as index_values_of
from strictops.meta.testing import examples, anchor_module, gpu, raised
from strictops.ops.mamba import conv_window_scatter
from strictops.ops.mamba import conv_window_scatter_multi
from strictops.ops.mamba import state_scatter as mamba_state_scatter
from strictops.ops.mamba import after_verify as op
from strictops.ops.mamba.after_verify import MambaCaches
from strictops.ops import scatter_mamba_states_after_mtp_verify

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_caches(layers, cache, spec, draft, ssm_state, conv_types, device, gen,
                ssm_dtype=torch.float32, conv_dtype=torch.bfloat16) -> MambaCaches:
    """Random caches: ``conv_types`` is a list of ``(dim, K-1)``; each window is an
    overlapping view of a shared ``[layers, spec, dim, draft + K - 2]`` buffer, as sglang
    lays it out."""
    def rand(*shape, dtype):
        return torch.randn(shape, generator=gen, device=gen.device).to(dtype).to(device)

    convs, windows = [], []
    for dim, km1 in conv_types:
        convs.append(rand(layers, cache, dim, km1, dtype=conv_dtype))
        shared = rand(layers, spec, dim, draft + km1 - 1, dtype=conv_dtype)
        windows.append(conv_window_scatter.window_view(shared, draft, km1))
    return MambaCaches(rand(layers, cache, *ssm_state, dtype=ssm_dtype),
                  rand(layers, spec, draft, *ssm_state, dtype=ssm_dtype), convs, windows)


@contextlib.contextmanager
def interpreted_ops(reverse_programs: bool = False):
    """Every scatter of the composition run by its kernel under the Triton interpreter."""
    with mock.patch.object(op, "fused_mamba_state_scatter_with_mask", functools.partial(
            mamba_state_scatter.launch_interpreted, reverse_programs=reverse_programs)), \
         mock.patch.object(op, "fused_conv_window_scatter_with_mask", functools.partial(
            conv_window_scatter.launch_interpreted, reverse_programs=reverse_programs)), \
         mock.patch.object(op, "fused_conv_window_scatter_multi", functools.partial(
            conv_window_scatter_multi.launch_interpreted, reverse_programs=reverse_programs)):
        yield


def _index_args(draw, n, cache, spec, draft, track: bool, with_src: bool) -> dict:
    dims = index_values_of.contract.Dims(num_layers=1, cache_size=cache, spec_size=spec,
                                         draft_tokens=draft, state_shape=(), total_requests=n,
                                         with_src_indices=with_src)
    commit = index_values_of.index_values(draw, dims)
    tracked = index_values_of.index_values(draw, dims)
    t = lambda v, dtype=torch.int64: None if v is None else torch.tensor(v, dtype=dtype)  # noqa
    return {"state_indices_tensor": t(commit["dst_indices_raw"], torch.int32),
            "last_correct_step_indices": t(commit["step_indices_raw"]),
            "mamba_track_indices": t(tracked["dst_indices_raw"]) if track else None,
            "mamba_steps_to_track": t(tracked["step_indices_raw"]) if track else None,
            "src_indices_raw": t(commit["src_indices_raw"], torch.int32)}


def _equal(caches: MambaCaches, expected) -> bool:
    ssm, convs = expected
    return torch.equal(caches.temporal, ssm) and all(
        torch.equal(c, e) for c, e in zip(caches.conv, convs))


@settings(SETTINGS, max_examples=examples(25))
@given(data=st.data())
def test_interpreted_composition_equals_reference(data):
    n, cache = data.draw(st.integers(0, 9)), data.draw(st.integers(1, 8))
    spec, draft = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 4))
    conv_types = data.draw(st.lists(st.tuples(st.integers(1, 9), st.integers(1, 4)),
                                    min_size=0, max_size=3))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    caches = make_caches(2, cache, spec, draft, (3, 5), conv_types, "cpu", gen)
    args = _index_args(data.draw, n, cache, spec, draft, data.draw(st.booleans()),
                       data.draw(st.booleans()))
    expected = op.reference(caches, **args)
    with interpreted_ops(data.draw(st.booleans())):
        scatter_mamba_states_after_mtp_verify(caches, **args)
    assert _equal(caches, expected)


def test_track_set_is_written_after_the_commit_set():
    gen = torch.Generator().manual_seed(1)
    caches = make_caches(2, 4, 3, 2, (4,), [(5, 3)], "cpu", gen)
    one = lambda *v: torch.tensor(v)  # noqa: E731
    # Request 0 commits step 1 into slot 2 and tracks step 0 into slot 2 too: the track wins.
    with interpreted_ops(reverse_programs=True):
        scatter_mamba_states_after_mtp_verify(caches, one(2, -1, -1), one(1, 0, 0),
                                              one(2, 0, 0), one(0, -1, -1))
    assert torch.equal(caches.temporal[:, 2], caches.intermediate_ssm[:, 0, 0])
    assert torch.equal(caches.conv[0][:, 2], caches.intermediate_conv_window[0][:, 0, 0])


@pytest.mark.parametrize("with_src", [False, True])
def test_conv_types_in_one_launch_without_source_rows(with_src):
    gen = torch.Generator().manual_seed(3)
    caches = make_caches(2, 6, 4, 3, (4,), [(5, 3), (7, 2)], "cpu", gen)
    one = lambda *v: torch.tensor(v)  # noqa: E731
    args = (one(1, 4, 4, 0), one(2, 0, 1, -1), one(5, 3, -1, 5), one(0, -1, 2, 1),
            one(3, 2, 1, 0) if with_src else None)
    expected = op.reference(caches, *args)
    with interpreted_ops(), \
            mock.patch.object(op, "fused_conv_window_scatter_multi",
                              wraps=op.fused_conv_window_scatter_multi) as multi, \
            mock.patch.object(op, "fused_conv_window_scatter_with_mask",
                              wraps=op.fused_conv_window_scatter_with_mask) as single:
        scatter_mamba_states_after_mtp_verify(caches, *args)
    assert (multi.call_count, single.call_count) == ((0, 4) if with_src else (1, 0))
    assert _equal(caches, expected)


def test_empty_caches_are_skipped():
    gen = torch.Generator().manual_seed(2)
    caches = make_caches(2, 4, 3, 2, (4,), [(5, 3), (6, 2)], "cpu", gen)
    caches.temporal = torch.empty(0)  # any shape: an empty cache is never checked
    caches.conv[1] = torch.empty(0)
    args = (torch.tensor([1, 3]), torch.tensor([0, 1]), None, None)
    expected = op.reference(caches, *args)
    with interpreted_ops():
        scatter_mamba_states_after_mtp_verify(caches, *args)
    assert _equal(caches, expected) and caches.temporal.numel() == 0


def test_a_track_set_without_steps_is_refused():
    caches = MambaCaches(torch.empty(0), torch.empty(0), [], [])
    idx = torch.zeros(3, dtype=torch.int64)
    err = raised(scatter_mamba_states_after_mtp_verify, caches, idx, idx, idx, None)
    assert (type(err), str(err)) == (ValueError, "Expected mamba_steps_to_track with "
                                     "mamba_track_indices, but got mamba_steps_to_track=None")


# --------------------------------------------------------------------------------------------
# GPU

LAYERS, CACHE, REQUESTS, DRAFT = 36, 512, 64, 4
SSM_STATE, CONV_TYPES = (8, 128, 128), [(2048, 3)]


def original_module():
    """sglang's module from ``.anchor``, with the pointer table its multi-pair conv path reads
    (sglang builds it as an int64 device tensor of the rows)."""
    sgl = anchor_module("sgl_mamba")
    if sgl.make_ptr_table is None:
        sgl.make_ptr_table = lambda rows, device: torch.tensor(rows, dtype=torch.int64,
                                                               device=device)
    return sgl


def model_inputs(gen, track: bool, with_src: bool, layers=LAYERS):
    caches = make_caches(layers, CACHE, REQUESTS, DRAFT, SSM_STATE, CONV_TYPES, "cuda", gen)
    slots = torch.randperm(CACHE // 2, device="cuda", generator=gen)[:REQUESTS].to(torch.int32)
    steps = torch.randint(-1, DRAFT, (REQUESTS,), device="cuda", generator=gen)
    args = {"state_indices_tensor": slots, "last_correct_step_indices": steps,
            "mamba_track_indices": None, "mamba_steps_to_track": None,
            "src_indices_raw": (torch.randperm(REQUESTS, device="cuda", generator=gen)
                                if with_src else None)}
    if track:
        args["mamba_track_indices"] = (
            torch.randperm(CACHE // 2, device="cuda", generator=gen)[:REQUESTS] + CACHE // 2)
        tracked = torch.rand(REQUESTS, device="cuda", generator=gen) < 0.2
        args["mamba_steps_to_track"] = torch.where(tracked, steps.clamp(min=0), -1)
    return caches, args


def _clone(caches: MambaCaches) -> MambaCaches:
    return MambaCaches(caches.temporal.clone(), caches.intermediate_ssm,
                       [c.clone() for c in caches.conv], caches.intermediate_conv_window)


@gpu
@pytest.mark.parametrize("track", [False, True])
@pytest.mark.parametrize("with_src", [False, True])
def test_gpu_equals_reference_and_the_original(track, with_src):
    gen = torch.Generator(device="cuda").manual_seed(3)
    caches, args = model_inputs(gen, track, with_src, layers=4)
    expected = op.reference(caches, **args)
    ours = _clone(caches)
    scatter_mamba_states_after_mtp_verify(ours, **args)
    assert _equal(ours, expected)
    theirs = _clone(caches)
    original_module().scatter_mamba_states_after_mtp_verify(theirs, **args)
    assert _equal(ours, (theirs.temporal, theirs.conv))


@gpu
def test_gpu_bit_equal_to_the_original_at_the_model_shape():
    gen = torch.Generator(device="cuda").manual_seed(4)
    caches, args = model_inputs(gen, track=True, with_src=False)
    ours = _clone(caches)
    scatter_mamba_states_after_mtp_verify(ours, **args)
    original_module().scatter_mamba_states_after_mtp_verify(caches, **args)
    assert _equal(ours, (caches.temporal, caches.conv))
