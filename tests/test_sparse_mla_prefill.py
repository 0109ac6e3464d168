"""sparse_mla_q8kv8_prefill_fwd: contract messages, the value rule, numerics.

CPU (CI): every rule's message on fake CUDA tensors, pinned with expecttest (every near miss on
the eager, fake and traced paths: ``tests/test_contracts.py``); the aliasing rule on shared,
overlapping and disjoint buffers; the ``topk_length`` value rule on real CPU tensors (its
message, its place in the original's order, and no value read where it must not sync); the
reference and the kernel under the Triton interpreter with sinks of +-inf and empty tokens (no
NaN); the kernel against the float64 reference on small shapes (both head dims, invalid
indices, empty rows, partial ``topk_length``, ``attn_sink``, no load of a row that must not be
read, out-of-range lengths counted); the Gluon kernels built for sm_90 with wgmma for both
products, as many as Triton 3.6 builds; the kernel choice by device capability; a Gluon kernel
that does not build falling back to the Triton kernel with one warning, on every path. GPU
(``-m gpu``): the same on real CUDA tensors at moderate shapes, fresh random inputs every run,
for both kernels (the Triton one and the warp-specialised Gluon one that sm_90 runs by
default), the block-pair kernel with each of its schedules, persistent CTAs over many tiles,
and the value rule's order through the public op.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import re
import secrets
import subprocess
import sys
import types
import unittest
import warnings

import expecttest
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from triton.runtime import interpreter

from strictops.meta.sparse_mla import prefill as contract
from strictops.meta import strategies
from strictops.meta._contract import Contract
from strictops.meta.strategies import sparse_mla_prefill as calls_of
from strictops.meta.testing import (
    examples,
    CAN_NAME_SECOND_GPU,
    assert_every_rule_pinned,
    build,
    fake_mode,
    gpu,
    near_miss_message,
    raised,
)
from strictops.ops.sparse_mla import prefill as op
from strictops.ops import sparse_mla_q8kv8_prefill_fwd
from strictops.ops._runtime.dispatch import device_capability
from strictops.ops._runtime.interpret import interpreted

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Sizes for the pinned messages: distinct, so a message that shows the wrong size shows it.
DIMS = contract.Dims(s_q=3, s_kv=200, h_q=128, d_qk=576, topk=256)
SECOND_GPU = unittest.skipIf(not CAN_NAME_SECOND_GPU, "a real single-GPU machine has no cuda:1")
# The contract's rows but those that need CUDA tensors, in order: on real CPU tensors, whose
# values can be read, they show what an eager call checks and in which order, the value rule
# included (which never runs on fake tensors).
CPU_CONTRACT = Contract(op=contract.CONTRACT.op, stem=contract.CONTRACT.stem,
                        checks=tuple(c for c in contract.CHECKS if not c.rule.endswith("_cuda")))
CPU_DIMS = dataclasses.replace(DIMS, device="cpu")


# The message each rule's near miss raises on fake tensors.
_message_on_fake = functools.partial(near_miss_message, sparse_mla_q8kv8_prefill_fwd, contract,
                                     dims=DIMS)


def _inputs(args: dict) -> dict:
    """The arguments of a call that the reference takes."""
    return {k: args[k] for k in op.INPUTS}


class TestMessages(expecttest.TestCase):
    """Every rule (the original's and the added ones) on fake CUDA tensors, message pinned."""

    def test_q_rank(self):
        self.assertExpectedInline(_message_on_fake("q_rank"), """q must have shape (s_q, h_q, d_qk), got (3, 128)""")

    def test_kv_rank(self):
        self.assertExpectedInline(_message_on_fake("kv_rank"), """kv must have shape (s_kv, h_kv, d_qk), got (200, 576)""")

    def test_indices_rank(self):
        self.assertExpectedInline(_message_on_fake("indices_rank"), """indices must have shape (s_q, h_kv, topk), got (3, 256)""")

    def test_q_cuda(self):
        self.assertExpectedInline(_message_on_fake("q_cuda"), """q must be a CUDA tensor""")

    def test_kv_cuda(self):
        self.assertExpectedInline(_message_on_fake("kv_cuda"), """kv must be a CUDA tensor""")

    def test_indices_cuda(self):
        self.assertExpectedInline(_message_on_fake("indices_cuda"), """indices must be a CUDA tensor""")

    @SECOND_GPU
    def test_kv_device(self):
        self.assertExpectedInline(_message_on_fake("kv_device"), """kv must be on q's device cuda:0, got cuda:1""")

    @SECOND_GPU
    def test_indices_device(self):
        self.assertExpectedInline(_message_on_fake("indices_device"), """indices must be on q's device cuda:0, got cuda:1""")

    def test_q_dtype(self):
        self.assertExpectedInline(_message_on_fake("q_dtype"), """q must be torch.float8_e4m3fn, got torch.float8_e5m2""")

    def test_kv_dtype(self):
        self.assertExpectedInline(_message_on_fake("kv_dtype"), """kv must be torch.float8_e4m3fn, got torch.bfloat16""")

    def test_q_contiguous(self):
        self.assertExpectedInline(_message_on_fake("q_contiguous"), """q must be contiguous""")

    def test_kv_contiguous(self):
        self.assertExpectedInline(_message_on_fake("kv_contiguous"), """kv must be contiguous""")

    def test_indices_contiguous(self):
        self.assertExpectedInline(_message_on_fake("indices_contiguous"), """indices must be contiguous""")

    def test_d_qk_match(self):
        self.assertExpectedInline(_message_on_fake("d_qk_match"), """kv d_qk must match q d_qk=576, got 640""")

    def test_h_q(self):
        self.assertExpectedInline(_message_on_fake("h_q"), """sparse_mla_q8kv8_prefill_fwd requires h_q padded to a positive multiple of 64, got 16""")

    def test_h_kv(self):
        self.assertExpectedInline(_message_on_fake("h_kv"), """sparse_mla_q8kv8_prefill_fwd requires h_kv=1, got 2""")

    def test_d_qk_supported(self):
        self.assertExpectedInline(_message_on_fake("d_qk_supported"), """sparse_mla_q8kv8_prefill_fwd supports d_qk=512/576, got 640""")

    def test_indices_shape(self):
        self.assertExpectedInline(_message_on_fake("indices_shape"), """indices must have shape (3, 1, topk), got (4, 1, 256)""")

    def test_indices_dtype(self):
        self.assertExpectedInline(_message_on_fake("indices_dtype"), """indices must be int32, got torch.int64""")

    def test_topk(self):
        self.assertExpectedInline(_message_on_fake("topk"), """Q8KV8 sparse-prefill topk width must be a positive multiple of 128, got 320""")

    def test_topk_length_shape_dtype(self):
        self.assertExpectedInline(_message_on_fake("topk_length_shape_dtype"), """topk_length must be int32 with shape (3,), got (3,)/torch.int64""")

    def test_topk_length_cuda(self):
        self.assertExpectedInline(_message_on_fake("topk_length_cuda"), """topk_length must be a CUDA tensor""")

    @SECOND_GPU
    def test_topk_length_device(self):
        self.assertExpectedInline(_message_on_fake("topk_length_device"), """topk_length must be on q's device cuda:0, got cuda:1""")

    def test_topk_length_contiguous(self):
        self.assertExpectedInline(_message_on_fake("topk_length_contiguous"), """topk_length must be contiguous""")

    def test_d_v(self):
        self.assertExpectedInline(_message_on_fake("d_v"), """sparse_mla_q8kv8_prefill_fwd only supports d_v=512, got 576""")

    def test_attn_sink_needs_topk_length(self):
        self.assertExpectedInline(_message_on_fake("attn_sink_needs_topk_length"), """attn_sink requires topk_length to be provided as well""")

    def test_attn_sink_shape_dtype(self):
        self.assertExpectedInline(_message_on_fake("attn_sink_shape_dtype"), """attn_sink must be float32 with shape (128,), got (129,)/torch.float32""")

    def test_attn_sink_cuda(self):
        self.assertExpectedInline(_message_on_fake("attn_sink_cuda"), """attn_sink must be a CUDA tensor""")

    @SECOND_GPU
    def test_attn_sink_device(self):
        self.assertExpectedInline(_message_on_fake("attn_sink_device"), """attn_sink must be on q's device cuda:0, got cuda:1""")

    def test_attn_sink_contiguous(self):
        self.assertExpectedInline(_message_on_fake("attn_sink_contiguous"), """attn_sink must be contiguous""")

    def test_q_scale_tensor(self):
        self.assertExpectedInline(_message_on_fake("q_scale_tensor"), """q_scale must be a torch.Tensor""")

    def test_q_scale_cuda(self):
        self.assertExpectedInline(_message_on_fake("q_scale_cuda"), """q_scale must be a CUDA tensor""")

    @SECOND_GPU
    def test_q_scale_device(self):
        self.assertExpectedInline(_message_on_fake("q_scale_device"), """q_scale must be on q's device cuda:0, got cuda:1""")

    def test_q_scale_dtype(self):
        self.assertExpectedInline(_message_on_fake("q_scale_dtype"), """q_scale must be float32, got torch.float64""")

    def test_q_scale_scalar(self):
        self.assertExpectedInline(_message_on_fake("q_scale_scalar"), """q_scale must be a scalar tensor, got shape (2,)""")

    def test_kv_scale_tensor(self):
        self.assertExpectedInline(_message_on_fake("kv_scale_tensor"), """kv_scale must be a torch.Tensor""")

    def test_kv_scale_cuda(self):
        self.assertExpectedInline(_message_on_fake("kv_scale_cuda"), """kv_scale must be a CUDA tensor""")

    @SECOND_GPU
    def test_kv_scale_device(self):
        self.assertExpectedInline(_message_on_fake("kv_scale_device"), """kv_scale must be on q's device cuda:0, got cuda:1""")

    def test_kv_scale_dtype(self):
        self.assertExpectedInline(_message_on_fake("kv_scale_dtype"), """kv_scale must be float32, got torch.float64""")

    def test_kv_scale_scalar(self):
        self.assertExpectedInline(_message_on_fake("kv_scale_scalar"), """kv_scale must be a scalar tensor, got shape (2,)""")

    def test_out_shape(self):
        self.assertExpectedInline(_message_on_fake("out_shape"), """out must have shape (3, 128, 512), got (3, 129, 512)""")

    def test_out_dtype(self):
        self.assertExpectedInline(_message_on_fake("out_dtype"), """out must have dtype torch.bfloat16, got torch.float16""")

    @SECOND_GPU
    def test_out_device(self):
        self.assertExpectedInline(_message_on_fake("out_device"), """out must be on device cuda:0, got cuda:1""")

    def test_out_contiguous(self):
        self.assertExpectedInline(_message_on_fake("out_contiguous"), """out must be contiguous""")

    def test_max_logits_shape(self):
        self.assertExpectedInline(_message_on_fake("max_logits_shape"), """max_logits must have shape (3, 128), got (3, 129)""")

    def test_max_logits_dtype(self):
        self.assertExpectedInline(_message_on_fake("max_logits_dtype"), """max_logits must have dtype torch.float32, got torch.float16""")

    @SECOND_GPU
    def test_max_logits_device(self):
        self.assertExpectedInline(_message_on_fake("max_logits_device"), """max_logits must be on device cuda:0, got cuda:1""")

    def test_max_logits_contiguous(self):
        self.assertExpectedInline(_message_on_fake("max_logits_contiguous"), """max_logits must be contiguous""")

    def test_lse_shape(self):
        self.assertExpectedInline(_message_on_fake("lse_shape"), """lse must have shape (3, 128), got (3, 129)""")

    def test_lse_dtype(self):
        self.assertExpectedInline(_message_on_fake("lse_dtype"), """lse must have dtype torch.float32, got torch.float16""")

    @SECOND_GPU
    def test_lse_device(self):
        self.assertExpectedInline(_message_on_fake("lse_device"), """lse must be on device cuda:0, got cuda:1""")

    def test_lse_contiguous(self):
        self.assertExpectedInline(_message_on_fake("lse_contiguous"), """lse must be contiguous""")

    def test_buffers_alias(self):
        self.assertExpectedInline(_message_on_fake("buffers_alias"), """out, max_logits and lse must not alias each other""")

    def test_topk_length_errors_shape_dtype(self):
        self.assertExpectedInline(_message_on_fake("topk_length_errors_shape_dtype"), """topk_length_errors must be int32 with shape (1,), got (1,)/torch.int64""")

    def test_topk_length_errors_cuda(self):
        self.assertExpectedInline(_message_on_fake("topk_length_errors_cuda"), """topk_length_errors must be a CUDA tensor""")

    @SECOND_GPU
    def test_topk_length_errors_device(self):
        self.assertExpectedInline(_message_on_fake("topk_length_errors_device"), """topk_length_errors must be on q's device cuda:0, got cuda:1""")

    def test_topk_length_errors_alias(self):
        self.assertExpectedInline(_message_on_fake("topk_length_errors_alias"), """topk_length_errors must not alias out, max_logits or lse""")

    def test_every_rule_has_a_pinned_message(self):
        assert_every_rule_pinned(self, contract)  # near misses: tests/test_registry.py

    def test_topk_length_values(self):
        # Eager only (it reads values): real CPU tensors through the contract's CPU rows.
        spec = contract.NEAR_MISSES["topk_length_values"](contract.valid_spec(CPU_DIMS))
        err = raised(CPU_CONTRACT.validate, **build(spec))
        self.assertIs(type(err), ValueError)
        self.assertExpectedInline(str(err), """topk_length values must satisfy 0 <= topk_length <= topk (256)""")


@settings(SETTINGS, max_examples=examples(30))
@given(dims=calls_of.dims())
def test_valid_calls_pass_on_fake_tensors_and_return_the_given_buffers(dims):
    with fake_mode():
        args = build(contract.valid_spec(dims))
        out, max_logits, lse = sparse_mla_q8kv8_prefill_fwd(**args)
    assert out.shape == (dims.s_q, dims.h_q, contract.D_V) and out.dtype == torch.bfloat16
    assert max_logits.shape == lse.shape == (dims.s_q, dims.h_q)
    for name, got in (("out", out), ("max_logits", max_logits), ("lse", lse)):
        assert (got is args[name]) == dims.with_buffers


def _buffers_from(storage_elems: int, offsets: dict, dims: contract.Dims = DIMS) -> dict:
    """A valid call on fake tensors whose buffers are float32 views of one storage, starting
    at the given element offsets (``out`` as bf16 pairs)."""
    args = build(contract.valid_spec(dims))
    base = torch.empty(storage_elems, dtype=torch.float32, device="cuda:0")
    s_q, h_q = dims.s_q, dims.h_q
    sizes = {"out": s_q * h_q * contract.D_V // 2, "max_logits": s_q * h_q, "lse": s_q * h_q,
             "topk_length_errors": 1}
    for name, start in offsets.items():
        view = base.narrow(0, start, sizes[name])
        if name == "out":
            view = view.view(torch.bfloat16).view(s_q, h_q, contract.D_V)
        elif name == "topk_length_errors":
            view = view.view(torch.int32)
        else:
            view = view.view(s_q, h_q)
        args[name] = view
    return args


@pytest.mark.parametrize("offsets, refused", [
    # One allocation split into disjoint buffers: the original accepted it, so does this.
    ({"out": 0, "max_logits": 384 * 256, "lse": 384 * 257}, None),
    ({"max_logits": 0, "lse": 384}, None),
    ({"lse": 384, "topk_length_errors": 0}, None),
    # Overlaps: same start (what data_ptr() saw), and partial overlaps it missed.
    ({"max_logits": 0, "lse": 0}, "buffers_alias"),
    ({"max_logits": 0, "lse": 383}, "buffers_alias"),
    ({"out": 0, "max_logits": 384 * 256 - 1}, "buffers_alias"),
    ({"lse": 5, "topk_length_errors": 388}, "topk_length_errors_alias"),
])
def test_aliasing_rules_read_storage_overlap_on_fake_tensors(offsets, refused):
    with fake_mode():
        args = _buffers_from(384 * 258 + 8, offsets)
        if refused is None:
            sparse_mla_q8kv8_prefill_fwd(**args)
            return
        err = raised(sparse_mla_q8kv8_prefill_fwd, **args)
    assert (type(err), str(err)) == contract.CONTRACT.expected_error(refused, **args)


def test_the_same_tensor_passed_twice_is_refused():
    with fake_mode():
        args = build(contract.valid_spec(DIMS))
        args["max_logits"] = args["lse"] = torch.empty(3, 128, device="cuda:0")
        err = raised(sparse_mla_q8kv8_prefill_fwd, **args)
    assert str(err) == "out, max_logits and lse must not alias each other"


def test_empty_buffers_never_alias():
    """With s_q = 0 every buffer is empty: nothing can be overwritten (the original's
    data_ptr() comparison refused two empty buffers that happened to share an address)."""
    dims = contract.Dims(s_q=0, s_kv=5)
    with fake_mode():
        args = _buffers_from(4, {"out": 0, "max_logits": 0, "lse": 0}, dims)
        sparse_mla_q8kv8_prefill_fwd(**args)


# --------------------------------------------------------------------------------------------
# The topk_length value check


@pytest.mark.parametrize("lengths, refused", [([0, 256, 7], False), ([0, 257, 3], True),
                                             ([5, -1, 0], True)])
def test_topk_length_values_on_real_tensors(lengths, refused):
    args = build(contract.valid_spec(dataclasses.replace(CPU_DIMS, with_topk_length=True)))
    args["topk_length"] = torch.tensor(lengths, dtype=torch.int32)
    if not refused:
        CPU_CONTRACT.validate(**args)
        return
    err = raised(CPU_CONTRACT.validate, **args)
    assert (type(err), str(err)) == CPU_CONTRACT.expected_error("topk_length_values", **args)


_RULES = CPU_CONTRACT.rules
# Later rules whose near miss passes a counter or drops topk_length: no values are read then.
_VALUES_NOT_READ = ("attn_sink_needs_topk_length", "topk_length_errors_shape_dtype",
                    "topk_length_errors_alias")


@pytest.mark.parametrize("other", [r for r in _RULES
                                   if r != "topk_length_values" and not r.endswith("_device")])
def test_topk_length_values_are_checked_in_the_originals_place(other):
    """Out-of-range lengths and one other broken rule, on real CPU tensors: an eager call
    reports the rule the original checks first. A rule before the value rule (``topk_length``'s
    own checks and all before them) wins over it; the value rule wins over every rule after it
    (``d_v``, ``attn_sink``, the scales, the buffers), but where no value is read."""
    bad_lengths = contract.NEAR_MISSES["topk_length_values"](contract.valid_spec(CPU_DIMS))
    args = build(contract.NEAR_MISSES[other](bad_lengths))
    first = _RULES.index(other) < _RULES.index("topk_length_values")
    expected = other if first or other in _VALUES_NOT_READ else "topk_length_values"
    err = raised(CPU_CONTRACT.validate, **args)
    assert (type(err), str(err)) == CPU_CONTRACT.expected_error(expected, **args)
    assert CPU_CONTRACT.broken_rule(**args) == expected
    if args["topk_length"] is not None:  # ``other`` is broken in this call
        args["topk_length"].zero_()  # in place: its strides may be what ``other`` is about
        assert CPU_CONTRACT.broken_rule(**args) == other


def _meta_call(**changes) -> dict:
    """A valid call with ``topk_length`` on meta tensors, whose values cannot be read."""
    spec = contract.valid_spec(dataclasses.replace(DIMS, device="meta", with_topk_length=True))
    return {**build(spec), **changes}


def test_meta_values_cannot_be_read():
    """The probe the next test relies on: in plain eager mode the value rule reads the
    values, and reading a meta tensor's raises."""
    with pytest.raises((NotImplementedError, RuntimeError)):
        CPU_CONTRACT.validate(**_meta_call())


def test_value_rule_never_reads_values_where_it_must_not_sync(monkeypatch):
    """With a counter, on fake tensors and while compiling, the contract passes without
    reading the values (a meta tensor's cannot be read, a fake tensor's would be data
    dependent), so it cannot sync the host there."""
    CPU_CONTRACT.validate(**_meta_call(
        topk_length_errors=torch.zeros(1, dtype=torch.int32, device="meta")))
    with fake_mode():
        spec = contract.NEAR_MISSES["topk_length_values"](contract.valid_spec(DIMS))
        contract.validate(**build(spec))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    CPU_CONTRACT.validate(**_meta_call())


# --------------------------------------------------------------------------------------------
# The kernel under the Triton interpreter


def _check_interpreted(args: dict, reverse_programs: bool = False):
    expected = op.reference(**_inputs(args))
    outputs = op.launch_interpreted(**args, reverse_programs=reverse_programs)
    passed, detail = op.compare_to_reference(outputs, expected, op.REL_L2_BOUND, op.LOGIT_TOL)
    assert passed, detail
    return outputs, expected


@settings(SETTINGS, max_examples=examples(25))
@given(data=st.data())
def test_interpreted_kernel_matches_the_reference(data):
    """Any mix of valid and invalid indices, lengths, sink and buffers, both head dims:
    within REL_L2_BOUND of the float64 reference, empty rows exact, every buffer written."""
    dims = data.draw(calls_of.dims(device="cpu", small=True))
    args = op.random_inputs(
        dims, torch.Generator().manual_seed(data.draw(st.integers(0, 2**16))),
        invalid_fraction=data.draw(st.sampled_from([0.0, 1 / 8, 1 / 2, 1.0])),
        edge_rows=data.draw(st.booleans()))
    outputs, _ = _check_interpreted(args, reverse_programs=data.draw(st.booleans()))
    for name, got in zip(contract.BUFFERS, outputs):
        assert (got is args[name]) == dims.with_buffers
    if dims.with_errors:
        assert args["topk_length_errors"].item() == 0


@pytest.mark.parametrize("d_qk", contract.D_QKS)
@pytest.mark.parametrize("with_attn_sink", [False, True])
def test_empty_rows_give_zero_out_minus_inf_max_and_plus_inf_lse(d_qk, with_attn_sink):
    dims = contract.Dims(s_q=4, s_kv=150, d_qk=d_qk, with_topk_length=True,
                         with_attn_sink=with_attn_sink, device="cpu")
    args = op.random_inputs(dims, torch.Generator().manual_seed(d_qk))
    (out, max_logits, lse), _ = _check_interpreted(args)
    # Token 0 selects only invalid indices; token 1 has topk_length 0.
    assert torch.equal(out[:2], torch.zeros_like(out[:2]))
    assert bool((max_logits[:2] == float("-inf")).all() and (lse[:2] == float("inf")).all())
    assert bool(out[2:].abs().amax(dim=-1).gt(0).all() and lse[2:].isfinite().all())


# Sinks at the ends of the range: +inf takes all the weight (out = 0), -inf none.
SINKS = [0.75, float("inf"), float("-inf")]


def _sink_case(sink: float, device: str, generator: torch.Generator) -> dict:
    """A call whose every head has ``attn_sink = sink``, with NaN-poisoned buffers and the
    three kinds of token: 0 selects only invalid indices, 1 has ``topk_length`` 0, 2 and 3
    have 70 and ``topk`` rows (the edge rows of ``random_inputs``)."""
    dims = contract.Dims(s_q=6, s_kv=300, h_q=64 if device == "cpu" else 128, d_qk=576,
                         topk=128, with_attn_sink=True, with_buffers=True, device=device)
    args = op.random_inputs(dims, generator)
    args["attn_sink"].fill_(sink)
    return args


def _assert_sink_semantics(sink: float, outputs) -> None:
    """No NaN anywhere; the empty tokens 0 and 1 give out 0, max -inf, lse +inf whatever the
    sink; the others a finite lse, and out 0 exactly when the sink is +inf."""
    out, max_logits, lse = (t.double() for t in outputs)
    assert not any(bool(t.isnan().any()) for t in (out, max_logits, lse))
    assert torch.equal(out[:2], torch.zeros_like(out[:2]))
    assert bool((max_logits[:2] == float("-inf")).all() and (lse[:2] == float("inf")).all())
    assert bool(lse[2:4].isfinite().all() and max_logits[2:4].isfinite().all())
    nonzero = out[2:4].abs().amax(dim=-1) > 0
    assert bool((~nonzero).all() if sink == float("inf") else nonzero.all())


@pytest.mark.parametrize("sink", SINKS)
def test_reference_sink_at_any_value_and_empty_rows_give_no_nan(sink):
    args = _sink_case(sink, "cpu", torch.Generator().manual_seed(11))
    outputs = op.reference(**_inputs(args))
    _assert_sink_semantics(sink, outputs)
    if sink == float("-inf"):  # no weight to the sink: the result without one
        plain = op.reference(**_inputs({**args, "attn_sink": None}))
        assert all(torch.equal(a, b) for a, b in zip(outputs, plain))


@pytest.mark.parametrize("sink", SINKS)
def test_interpreted_kernel_sink_at_any_value_and_empty_rows_give_no_nan(sink):
    args = _sink_case(sink, "cpu", torch.Generator().manual_seed(12))
    outputs, _ = _check_interpreted(args)
    _assert_sink_semantics(sink, outputs)


@pytest.mark.parametrize("d_qk", contract.D_QKS)
def test_rows_that_must_not_be_read_are_never_read(d_qk, monkeypatch):
    """Every address the kernel loads, recorded by the interpreter: none in kv's row 0, where
    invalid indices clamp their address and which every index past topk_length names (no
    index in range does), and none in the guard rows around kv."""
    dims = contract.Dims(s_q=4, s_kv=140, d_qk=d_qk, topk=256, with_topk_length=True,
                         device="cpu")
    args = op.random_inputs(dims, torch.Generator().manual_seed(7), invalid_fraction=1 / 4,
                            edge_rows=False)
    guarded = torch.zeros(dims.s_kv + 3, 1, d_qk, dtype=contract.FP8)  # 1 guard row, kv, 2
    guarded[1:-2] = args["kv"]
    args["kv"] = guarded[1:-2]
    indices, lengths = args["indices"][:, 0], torch.tensor([200, 64, 1, 255])
    indices[indices == 0] = 1
    indices[torch.arange(256)[None, :] >= lengths[:, None]] = 0
    args["topk_length"] = lengths.to(torch.int32)

    loads = []
    builder = interpreter.interpreter_builder
    original = builder.create_masked_load

    def record(ptrs, mask, *rest):
        loads.append(ptrs.data[mask.data])
        return original(ptrs, mask, *rest)

    monkeypatch.setattr(builder, "create_masked_load", record)
    _check_interpreted(args)
    read = np.concatenate([a.ravel() for a in loads])
    row, base = d_qk, guarded.data_ptr()

    def rows_read(first: int, last: int) -> bool:  # rows of ``guarded``, last excluded
        return bool(((read >= base + first * row) & (read < base + last * row)).any())

    assert not rows_read(0, 2) and not rows_read(dims.s_kv + 1, dims.s_kv + 3)
    assert rows_read(2, dims.s_kv + 1)  # the recording sees the rows that are read


def test_out_of_range_topk_lengths_are_clamped_and_counted_once_per_token():
    """The kernel's side of the value check: any length is memory-safe (clamped to
    [0, topk]) and each out-of-range one adds 1 to the counter, once per token although
    h_q = 128 runs two programs per token; the counter accumulates across calls."""
    dims = contract.Dims(s_q=4, s_kv=90, h_q=128, d_qk=512, with_topk_length=True,
                         with_errors=True, device="cpu")
    args = op.random_inputs(dims, torch.Generator().manual_seed(3), edge_rows=False)
    args["topk_length"] = torch.tensor([-3, 129, 2**31 - 1, 50], dtype=torch.int32)
    for calls in (1, 2):
        _check_interpreted(args)
        assert args["topk_length_errors"].item() == 3 * calls


# --------------------------------------------------------------------------------------------
# GPU


@pytest.mark.parametrize("capability, expected", [((9, 0), True), ((8, 0), False),
                                                   ((10, 0), False)])
def test_auto_picks_the_gluon_kernel_on_sm90_devices_only(capability, expected, monkeypatch):
    """The kernel choice on fake CUDA tensors of a device of each capability; asked once
    per device index. (A fake CUDA tensor makes a real one on a machine with a GPU: there,
    device 0, which exists; and CUDA's lazy initialisation then asks for capabilities too,
    so the op's own queries are counted by their cache.)"""
    asked = []
    index = 0 if torch.cuda.is_available() else 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda index: asked.append(index) or capability)
    device_capability.cache_clear()
    try:
        with fake_mode():
            q = torch.empty(3, 64, 576, dtype=contract.FP8, device=f"cuda:{index}")
            picks = [op.warp_specialized(q) for _ in range(3)]
            queries = device_capability.cache_info()
    finally:
        device_capability.cache_clear()
    available = op._sparse_mla_sm90 is not None
    assert picks == [expected and available] * 3
    assert (queries.misses, queries.hits) == ((1, 2) if available else (0, 0))
    if available:
        assert asked[-1] == index


def test_the_op_imports_on_a_triton_without_gluon():
    """Where Gluon's Hopper API is missing, the package imports and the op keeps to its
    Triton kernel."""
    code = ("import sys; sys.modules['triton.experimental.gluon.language.nvidia.hopper'] = None\n"
            "from strictops.ops.sparse_mla import prefill as op\n"
            "op.KERNEL = 'gluon'\n"
            "assert op._sparse_mla_sm90 is None and not op.warp_specialized(None)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def _sm90_ptx(kernel: str, d_qk: int, **tuning) -> str:
    """PTX of an sm_90 Gluon kernel (a key of ``_sparse_mla_sm90.KERNELS``) built ahead of
    time with what its ``launch()`` compiles (every optional argument given); asserts that its
    shared memory fits the H200's 227 KiB, that no MMA falls back to ``mma.sync`` and that
    registers move between the warpgroups (``setmaxnreg``)."""
    compiled = op._sparse_mla_sm90.compile_for_sm90(kernel, d_qk, **tuning)
    assert compiled.metadata.shared <= 227 * 1024
    ptx = compiled.asm["ptx"]
    assert "mma.sync" not in ptx and "setmaxnreg" in ptx
    return ptx


def _wgmma(ptx: str) -> collections.Counter:
    """How many ``wgmma`` instructions of each shape and type the PTX has."""
    return collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.([\w.]+)", ptx))


# Every wgmma of each build, pinned at what Triton 3.6 (the build measured on the GPU) compiles;
# every later Triton must compile the same products. Shared S, per consumer: Q·Kᵀ of its 32 rows
# of a block is d_qk / 32 m64n32k32 (the consumers share one S), P·V over all 64 rows 64 / 16
# m64n256k16 in fp16. Block pair, per consumer: Q·Kᵀ of a whole block is d_qk / 32 m64n64k32,
# written out twice (the peeled first pair and the loop); P·V two m64n256k32 (k = 64 rows) at
# four places (the first and second P·V, each peeled and in the loop); both in FP8.
WGMMA = {("shared_s", 576): {"m64n32k32.f32.e4m3.e4m3": 36, "m64n256k16.f32.f16.f16": 8},
         ("shared_s", 512): {"m64n32k32.f32.e4m3.e4m3": 32, "m64n256k16.f32.f16.f16": 8},
         ("block_pair", 576): {"m64n64k32.f32.e4m3.e4m3": 72, "m64n256k32.f32.e4m3.e4m3": 16},
         ("block_pair", 512): {"m64n64k32.f32.e4m3.e4m3": 64, "m64n256k32.f32.e4m3.e4m3": 16}}


@pytest.mark.skipif(op._sparse_mla_sm90 is None, reason="this Triton has no Gluon")
@pytest.mark.parametrize("d_qk", contract.D_QKS)
def test_gluon_kernel_builds_for_sm90_with_wgmma_for_both_products(d_qk):
    """Without a GPU: the shared-S kernel compiles for sm_90 (a Gluon API change
    would fail here first), both products are wgmma (Q·Kᵀ FP8, P·V fp16; no mma.sync
    fallback), exactly as many as on Triton 3.6, S is shared between the consumers, registers
    move with setmaxnreg, and shared memory fits the H200's 227 KiB."""
    assert _wgmma(_sm90_ptx("shared_s", d_qk)) == WGMMA["shared_s", d_qk]


@pytest.mark.skipif(op._sparse_mla_sm90 is None, reason="this Triton has no Gluon")
@pytest.mark.parametrize(("d_qk", "tuning"),
                         [(576, {}), (512, {}), (576, {"tr_cons": False}),
                          (576, {"vt_ldsm": False}), (576, {"persistent": False})])
def test_hopper_kernel_builds_for_sm90_with_fp8_wgmma_for_both_products(d_qk, tuning):
    """Without a GPU: the block-pair kernel (the op's default on sm_90; see
    ``benchmarks/experiments/sparse_mla_hopper.py``) compiles for sm_90 with either V
    transpose by either method, and one CTA a tile, both products are FP8 wgmma (no fp16 P·V),
    exactly as many as on Triton 3.6, each consumer computes the whole S of its own blocks,
    the ``vt_ldsm`` transpose is ``ldmatrix.trans`` and ``stmatrix`` with two ``prmt`` per
    pair of 32-bit words, and only persistent CTAs stagger their start (one ``nanosleep``)."""
    from strictops.ops.sparse_mla import gluon_block_pair as hopper

    tr_cons, vt_ldsm = tuning.get("tr_cons", True), tuning.get("vt_ldsm", True)
    ptx = _sm90_ptx("block_pair", d_qk, **tuning)
    assert _wgmma(ptx) == WGMMA["block_pair", d_qk]
    # A warpgroup moves 16 KiB (64 rows x 256 columns) in 8 x4 instructions; the consumers
    # transpose two such halves per pair at two places each (peeled and in the loop), the
    # producer both halves of a block at one; each P store is 2 stmatrix per consumer and place.
    transposes = 8 * (2 * 2 * 2 if tr_cons else 2)
    ldsm_t = ptx.count("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16")
    assert ldsm_t == (transposes if vt_ldsm else 0)
    # O through shared memory (with the consumers' transposes): 16 per consumer.
    o_stores = 2 * 16 if tr_cons and tuning.get("o_smem", hopper.TUNING["o_smem"]) else 0
    if vt_ldsm:
        assert ptx.count("stmatrix.sync.aligned.m8n8.x4.shared.b16") == (
            transposes + 2 * 2 * 2 + o_stores)
        assert ptx.count("prmt.b32") == ptx.count("0x6420") + ptx.count("0x7531") == 4 * ldsm_t
    assert ptx.count("nanosleep.u32") == (1 if tuning.get("persistent", True) else 0)


@pytest.mark.skipif(op._sparse_mla_sm90 is None, reason="this Triton has no Gluon")
@pytest.mark.parametrize("d_qk", contract.D_QKS)
def test_hopper_kernel_qk_chains_start_from_the_offset_only_where_asked(d_qk):
    """Without a GPU: a Q·Kᵀ chain that starts from 0 is a ``wgmma`` m64n64k32 whose
    accumulator input is off (a literal 0 operand). ``qk_prec`` 0 starts each consumer's two
    chains from 0 (the peeled first pair's and the loop's); ``qk_prec`` 1 starts the loop's from
    the offset in registers; ``qk_prec`` 2 (the default) also splits the first pair's into two
    chains from 0 (``gluon_mma``). Each builds with the same products."""
    from_zero = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n64k32\.f32\.e4m3\.e4m3\s*"
                           r"\{[^}]*\},\s*[^,]+,\s*[^,]+,\s*0\s*,")
    for qk_prec, starts in ((0, 2 * 2), (1, 2 * 1), (2, 2 * 2)):
        ptx = _sm90_ptx("block_pair", d_qk, qk_prec=qk_prec)
        assert _wgmma(ptx) == WGMMA["block_pair", d_qk]
        assert len(from_zero.findall(ptx)) == starts, qk_prec


def _float_ops(ptx: str) -> collections.Counter:
    """How many fp32 multiplies, adds, subtractions, negations and fused multiply-adds."""
    return collections.Counter(re.findall(r"^\s*((?:fma|mul|add|sub|neg)\.[a-z.]*f32)\b", ptx,
                                          re.M))


@pytest.mark.skipif(op._sparse_mla_sm90 is None, reason="this Triton has no Gluon")
def test_hopper_kernel_rounds_alike_with_persistent_ctas_and_one_cta_a_tile():
    """Without a GPU: the persistent kernel and one CTA a tile compile the same fp32
    arithmetic (which multiplies and adds fuse is decided by the code around them, so the Q·Kᵀ
    offset comes back by explicit fused multiply-adds); the GPU test of persistent CTAs holds
    them to the same bits."""
    counts = [_float_ops(_sm90_ptx("block_pair", 576, persistent=persistent))
              for persistent in (True, False)]
    assert counts[0] == counts[1]
    assert counts[0]["fma.rn.f32"] > 0


@pytest.mark.skipif(op._sparse_mla_sm90 is None, reason="this Triton has no Gluon")
def test_hopper_kernel_fuses_multiplies_and_adds_whatever_triton_defaults_to(monkeypatch):
    """Without a GPU: the Gluon kernels' launch options pin fused multiply-adds, so that a
    Triton whose default is no fusion (``TRITON_DEFAULT_FP_FUSION=0``, the default from Triton
    3.10 on) compiles the arithmetic measured."""
    fused = _float_ops(_sm90_ptx("block_pair", 576))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert _float_ops(_sm90_ptx("block_pair", 576)) == fused


# The block-pair kernel with one CTA a tile (the default is persistent).
ONE_TILE = {"persistent": False, "tr_early": False, "consumer_regs": 224, "producer_regs": 56}


@pytest.mark.skipif(op._sparse_mla_sm90 is None, reason="this Triton has no Gluon")
@pytest.mark.parametrize("d_qk", contract.D_QKS)
@pytest.mark.parametrize("tuning", [{}, ONE_TILE], ids=["persistent", "one-tile"])
def test_hopper_kernel_stores_o_by_tma_where_asked(d_qk, tuning):
    """Without a GPU: with ``o_tma`` each consumer sends its O as four TMA stores of [64, 64]
    (a 2-D bulk tensor copy from shared memory, each its own group) and no thread stores
    O's rows; its descriptor takes 128 bytes of Triton's global scratch a consumer and CTA.
    The default stores O's rows from the threads (16 bytes each) and needs no scratch."""
    bulk = "cp.async.bulk.tensor.2d.global.shared::cta"
    for o_tma in (False, True):
        compiled = op._sparse_mla_sm90.compile_for_sm90("block_pair", d_qk, o_tma=o_tma,
                                                        **tuning)
        ptx = compiled.asm["ptx"]
        assert _wgmma(ptx) == WGMMA["block_pair", d_qk]
        assert ptx.count(bulk) == (2 * 4 if o_tma else 0)
        assert ptx.count("st.global.v4") == (0 if o_tma else 2 * 16)
        assert compiled.metadata.global_scratch_size == (2 * 128 if o_tma else 0)


@pytest.mark.skipif(op._sparse_mla_sm90 is None, reason="this Triton has no Gluon")
def test_o_by_tma_launch_sets_a_scratch_allocator_for_that_launch_only(monkeypatch):
    """Without a GPU (the launch itself stood in for): an ``o_tma`` launch runs with Triton's
    global-scratch allocator set to one that hands out torch bytes of the size asked, and the
    allocator in force before it is in force again after it; a default launch sets none."""
    from triton.runtime import _allocation

    from strictops.ops.sparse_mla import gluon_block_pair as hopper

    seen = []

    def launch_kernel(*args, **kwargs):
        buffer = _allocation._allocator.get()(384, 128, None)
        seen.append((kwargs.get("o_tma", False), buffer.dtype, buffer.numel()))

    def before(size, alignment, stream):
        raise AssertionError("the allocator in force before the launch")

    monkeypatch.setattr(hopper, "launch_kernel", launch_kernel)
    monkeypatch.setattr(hopper, "programs_and_extra", lambda *args, **tuning: (1, {}))
    token = _allocation._allocator.set(before)
    try:
        q = torch.empty(4, 64, 576)
        hopper.launch(q, o_tma=True)
        assert _allocation._allocator.get() is before
        with pytest.raises(AssertionError, match="in force before"):
            hopper.launch(q)
    finally:
        _allocation._allocator.reset(token)
    assert seen == [(True, torch.uint8, 384)]


# Where the Gluon kernel does not build: its first compile is made to fail (the compat name
# the block-pair kernel calls resolves to nothing, as ``thread_barrier`` did from Triton 3.7 on),
# without a GPU: CPU tensors, the contract stood in for (its own tests cover it), the Gluon
# launches stood in for by what a real first launch does before it launches (an sm_90 compile),
# the Triton kernel run by the interpreter.


def _missing_barrier(**builtin_arguments):
    raise AttributeError("module 'triton.experimental.gluon.language' has no attribute "
                         "'thread_barrier'")


_missing_barrier.__triton_builtin__ = True  # called by the kernel like Gluon's own builtins


@pytest.fixture
def sm90_on_cpu(monkeypatch):
    """The op's sm_90 paths on CPU tensors (see above), the block-pair kernel's build made to
    fail; returns a stand-in for the op's cached Triton launcher (``(grid, args, options,
    device)``) that runs the kernel in the interpreter."""
    ws = op._sparse_mla_sm90
    if ws is None:
        pytest.skip("this Triton has no Gluon")
    from triton import knobs
    from strictops.ops.sparse_mla import gluon_block_pair as hopper

    monkeypatch.setattr(ws, "UNBUILDABLE", None)
    monkeypatch.setattr(ws, "KERNEL", "block_pair")
    monkeypatch.setattr(op, "KERNEL", "auto")
    monkeypatch.setattr(hopper, "thread_barrier", _missing_barrier)
    monkeypatch.setattr(knobs.compilation, "always_compile", True)  # no cached build
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(op, "_is_sm90", lambda index: True)
    monkeypatch.setattr(op, "_VALIDATION", lambda *args: None)
    monkeypatch.setattr(op.contract, "validate", lambda *args: None)
    monkeypatch.setattr(op, "on_device_of", lambda *args: contextlib.nullcontext())
    monkeypatch.setattr(ws, "on_device_of", lambda *args: contextlib.nullcontext())
    monkeypatch.setattr(hopper, "sm_count", lambda device: 132)

    def gluon_launch(*args, **tuning):  # raises where the kernel does not build
        ws.compile_for_sm90(ws.KERNEL, 576)

    monkeypatch.setattr(ws, "launch", gluon_launch)
    monkeypatch.setattr(ws, "_LAUNCHERS", dict.fromkeys(ws.KERNELS, gluon_launch))
    params = op._sparse_mla_prefill_kernel.params

    def interpreting(grid, args, options, device):
        with interpreted(op._sparse_mla_prefill_kernel) as kernel:
            kernel[grid](*(a for a, p in zip(args, params) if not p.is_constexpr),
                         **{p.name: a for a, p in zip(args, params) if p.is_constexpr},
                         **dict(options))

    return interpreting


def _fallback_call() -> dict:
    dims = contract.Dims(s_q=4, s_kv=200, h_q=64, d_qk=576, topk=128, with_topk_length=True,
                         with_attn_sink=True, with_buffers=True, with_errors=True, device="cpu")
    return op.random_inputs(dims, torch.Generator().manual_seed(5))


@pytest.mark.parametrize("first", ["eager", "dispatcher", "traced op"])
def test_a_gluon_kernel_that_does_not_build_falls_back_to_the_triton_kernel(sm90_on_cpu,
                                                                          monkeypatch, first):
    """Whichever path meets the failed build first (the eager path, the op through the
    dispatcher, the opaque launch op of a traced call): one ``GluonBuildWarning`` naming the
    reason, no exception, the Triton kernel's result (within ``REL_L2_BOUND`` of float64,
    every element written); from then on every path takes the Triton kernel without trying
    the Gluon one again, and the eager plans' guards see the change."""
    ws = op._sparse_mla_sm90
    registered = []
    monkeypatch.setattr(op, "_LAUNCHER", sm90_on_cpu)
    monkeypatch.setattr(op, "_HOST", types.SimpleNamespace(
        register=lambda *args: registered.append(args)))

    def eager(a):
        op._eager(*(a[k] for k in contract.ARGUMENTS))

    def dispatcher(a):
        with interpreted(op._sparse_mla_prefill_kernel) as kernel:
            op._forward(kernel, True, *(a[k] for k in contract.ARGUMENTS))

    def traced_op(a):
        with interpreted(op._sparse_mla_prefill_kernel) as kernel, monkeypatch.context() as m:
            m.setattr(op, "_sparse_mla_prefill_kernel", kernel)
            torch.ops.strictops_kernels.sparse_mla_ws_launch(
                *(a[k] for k in contract.ARGUMENTS if k != "d_v"))

    paths = {"eager": eager, "dispatcher": dispatcher, "traced op": traced_op}
    q = _fallback_call()["q"]
    assert op.warp_specialized(q, real=True)
    for name in (first, *(p for p in paths if p != first)):
        args = _fallback_call()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            paths[name](args)
        built = [str(w.message) for w in caught if w.category is ws.GluonBuildWarning]
        assert len(built) == (name == first), (name, built)
        assert all(ws.UNBUILDABLE in message for message in built)
        expected = op.reference(**_inputs(args))
        outputs = (args["out"], args["max_logits"], args["lse"])
        passed, detail = op.compare_to_reference(outputs, expected, op.REL_L2_BOUND,
                                                 op.LOGIT_TOL)
        assert passed, f"{name}: {detail}"
    assert ws.UNBUILDABLE == ("CompilationError: module 'triton.experimental.gluon.language' "
                              "has no attribute 'thread_barrier'")  # the innermost error's
    assert not op.warp_specialized(q, real=True) and not op.warp_specialized(q)
    (plan,) = registered  # the eager call's: the Triton launch, guarded on the failed build
    assert plan[1] is sm90_on_cpu and (vars(ws), "UNBUILDABLE") in plan[-1]
    assert op.kernel_choice(torch.device("cpu")) == (
        "triton", f"the Gluon kernel does not build on this Triton: {ws.UNBUILDABLE}")


def test_hopper_vt_transpose_index_algebra():
    """The ``vt_ldsm`` transpose's index algebra, modelled with the kernel's own permutations:
    the int16 words it loads, split, byte-permuted (``prmt``), joined and stores give Vᵀ with
    rows ρ(d) and columns σ(n), and P with columns relabelled by σ times that Vᵀ, its columns
    relabelled by ρ, is P·V exactly (integers in float64)."""
    tr = pytest.importorskip("strictops.ops.sparse_mla.gluon_transpose")

    def prmt(a, b, selector):  # PTX prmt.b32 on 32-bit words held in int64
        source = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF
                                                            for i in range(4)]
        return sum(source[(selector >> (4 * i)) & 0xF] << (8 * i) for i in range(4))

    def packed(t):  # registers 0 and 1 in one 32-bit word, register 0 in the low half
        return (t[..., 0].long() & 0xFFFF) | ((t[..., 1].long() & 0xFFFF) << 16)

    def unpacked(w):  # the inverse: int16 [..., 2]
        return torch.stack([w & 0xFFFF, w >> 16], -1).to(torch.int32).to(torch.int16)

    gen = torch.Generator().manual_seed(0)
    for j in (32, 64, 128):
        v = torch.randint(0, 256, (64, 2 * j), generator=gen, dtype=torch.uint8)
        words = v.view(torch.int16)  # little endian: word j = column 2j | column 2j + 1 << 8
        x = words.reshape(2, 2, 2, 2, 2, 2, j).permute(tr.TR_SPLIT.value)
        a, b = packed(x[..., 0]), packed(x[..., 1])
        o0, o1 = unpacked(prmt(a, b, 0x6420)), unpacked(prmt(a, b, 0x7531))
        y = torch.stack([o0, o1], -1).reshape(2, 2, 2, 2, j // 8, 2, 2, 2, 2, 2)
        vt = y.permute(tr.TR_JOIN.value).reshape(2 * j, 32).contiguous().view(torch.uint8)
        p = torch.randint(-8, 9, (64, 64), generator=gen).double()
        p_cols = p.reshape(64, 2, 2, 2, 2, 2, 2).permute(tr.P_COLS.value).reshape(64, 64)
        o = p_cols @ vt.double().T  # what the P·V wgmma computes: [64 heads, 2j rows of Vᵀ]
        rho = [(d & ~9) | ((d & 1) << 3) | ((d >> 3) & 1) for d in range(2 * j)]
        assert torch.equal(o, (p @ v.double())[:, rho])  # column r of O is column ρ(r)
        if j == 128:  # one consumer's 256 output columns, relabelled as the epilogue does
            out = o.reshape(64, 16, 2, 2, 2, 2).permute(tr.O_COLS.value).reshape(64, 256)
            assert torch.equal(out, p @ v.double())


@pytest.fixture(params=["auto", "triton"])
def kernel(request, monkeypatch):
    """The kernel the op launches: its default choice (on an H200 the Gluon kernel) and the
    Triton kernel."""
    monkeypatch.setattr(op, "KERNEL", request.param)
    return request.param


def _fresh_generator() -> tuple[torch.Generator, int]:
    """A CUDA generator with a fresh seed each run (reported in failures to reproduce them)."""
    seed = secrets.randbits(62)
    return torch.Generator(device="cuda").manual_seed(seed), seed


def _check_on_gpu(args: dict, seed: int):
    expected = op.reference(**_inputs(args))
    outputs = sparse_mla_q8kv8_prefill_fwd(**args)
    passed, detail = op.compare_to_reference(outputs, expected, op.GPU_REL_L2_BOUND,
                                             op.GPU_LOGIT_TOL)
    assert passed, f"seed {seed}: {detail}"
    return outputs


@gpu
@pytest.mark.parametrize("d_qk", contract.D_QKS)
@pytest.mark.parametrize("variant", ["plain", "topk_length", "attn_sink"])
def test_gpu_matches_the_reference_and_writes_every_element(d_qk, variant, kernel):
    """Poisoned (NaN) buffers, -1 and >= s_kv indices, a fully invalid token, zero and
    partial lengths: within ``GPU_REL_L2_BOUND`` (2.5e-2) of float64, every element written."""
    gen, seed = _fresh_generator()
    dims = contract.Dims(s_q=96, s_kv=3000, h_q=128, d_qk=d_qk, topk=512,
                         with_topk_length=variant != "plain", with_attn_sink=variant == "attn_sink",
                         with_buffers=True, with_errors=variant != "plain", device="cuda")
    args = op.random_inputs(dims, gen)
    out, max_logits, lse = _check_on_gpu(args, seed)
    assert out is args["out"] and max_logits is args["max_logits"] and lse is args["lse"]
    assert torch.equal(out[0], torch.zeros_like(out[0])) and bool(lse[0].isinf().all())
    if variant != "plain":
        assert args["topk_length_errors"].item() == 0


@gpu
@pytest.mark.parametrize("sink", SINKS)
def test_gpu_sink_at_any_value_and_empty_rows_give_no_nan(sink, kernel):
    gen, seed = _fresh_generator()
    args = _sink_case(sink, "cuda", gen)
    _assert_sink_semantics(sink, _check_on_gpu(args, seed))


@gpu
@pytest.mark.parametrize("h_q", [64, 192])
def test_gpu_any_multiple_of_64_heads(h_q, kernel):
    gen, seed = _fresh_generator()
    dims = contract.Dims(s_q=33, s_kv=700, h_q=h_q, d_qk=576, topk=256, with_attn_sink=True,
                         with_buffers=True, device="cuda")
    _check_on_gpu(op.random_inputs(dims, gen), seed)


@gpu
def test_gpu_index_offsets_past_2_pow_31_bytes(kernel):
    """kv rows past 2**31 bytes from its start: the gather's address arithmetic is 64-bit."""
    gen, seed = _fresh_generator()
    dims = contract.Dims(s_q=8, s_kv=(2**31 // 576) + 4096, h_q=64, d_qk=576, topk=128,
                         device="cuda")
    args = op.random_inputs(dims, gen, edge_rows=False)
    args["indices"] = torch.randint(dims.s_kv - 4096, dims.s_kv, args["indices"].shape,
                                    device="cuda", generator=gen, dtype=torch.int32)
    _check_on_gpu(args, seed)


@gpu
@pytest.mark.parametrize(("sm90_kernel", "bound"), [("block_pair", 1.5e-2), ("shared_s", 4e-3)])
def test_gpu_hopper_runs_a_warp_specialized_kernel_close_to_the_triton_one(monkeypatch,
                                                                           sm90_kernel, bound):
    """On sm_90 the default is a Gluon kernel; each differs from the Triton kernel in how P is
    rounded for P·V (block pair: FP8 with 2**8 headroom; shared S: fp16; Triton: bf16), and
    the block-pair kernel's default also in how S is rounded (its Q·Kᵀ chains start from an
    offset: ``gluon_mma``). Each is held to float64 within the GPU bounds, the shared-S
    kernel's ``lse`` to the Triton kernel's within 1e-4, and so the block-pair kernel's with
    chains from zero (``qk_prec`` 0)."""
    gen, seed = _fresh_generator()
    dims = contract.Dims(s_q=40, s_kv=1000, h_q=128, d_qk=576, topk=256, with_attn_sink=True,
                         device="cuda")
    args = op.random_inputs(dims, gen)
    hopper = torch.cuda.get_device_capability() == (9, 0) and op._sparse_mla_sm90 is not None
    assert op.warp_specialized(args["q"]) == hopper
    if not hopper:
        pytest.skip("the Gluon kernels need Gluon and an sm_90 GPU")
    monkeypatch.setattr(op._sparse_mla_sm90, "KERNEL", sm90_kernel)
    ours = _check_on_gpu(args, seed)
    monkeypatch.setattr(op, "KERNEL", "triton")
    theirs = sparse_mla_q8kv8_prefill_fwd(**args)
    assert op.relative_l2(ours[0], theirs[0]) <= bound, f"seed {seed}"
    assert torch.equal(ours[1].isinf(), theirs[1].isinf()), f"seed {seed}"
    lse = ours[2]
    if sm90_kernel == "block_pair":
        from_zero = tuple(torch.empty_like(x) for x in ours)
        _launch_block_pair(args, from_zero, qk_prec=0)
        lse = from_zero[2]
    assert torch.allclose(lse, theirs[2], rtol=1e-4, atol=1e-4), f"seed {seed}"


def _block_pair():
    """``strictops.ops.sparse_mla.gluon_block_pair``; the test is skipped without Gluon or sm_90."""
    if op._sparse_mla_sm90 is None or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the block-pair kernel needs Gluon and an sm_90 GPU")
    from strictops.ops.sparse_mla import gluon_block_pair
    return gluon_block_pair


def _launch_block_pair(args: dict, outputs: tuple, **tuning) -> None:
    """The block-pair kernel on a call's validated ``args``, into ``outputs``."""
    _block_pair().launch(*(args[k] for k in op.INPUTS if k != "d_v"), *outputs,
                         args["topk_length_errors"], **tuning)


@gpu
@pytest.mark.parametrize("d_qk", contract.D_QKS)
@pytest.mark.parametrize("tuning", [{}, {"vt_ldsm": False}, {"tr_cons": False},
                                    {"tr_cols": 128}, {"num_vt": 3, "tr_early": True},
                                    {"tr_early": True}, {"o_smem": False},
                                    {"qk_prec": 0}, {"qk_prec": 1}, {"o_tma": True},
                                    ONE_TILE, ONE_TILE | {"tr_early": True, "q_async": True}],
                         ids=["default", "blocked-transpose", "producer-transpose", "tr128",
                              "3-buffers-early", "early", "o-global", "qk-from-zero",
                              "qk-offset-first-pair-whole", "o-tma", "one-tile",
                              "one-tile-early-q-async"])
def test_gpu_block_pair_kernel_matches_the_reference(d_qk, tuning):
    """The block-pair kernel (``gluon_block_pair``, the op's default on sm_90) on an sm_90 GPU
    with each V transpose, schedule, store of O and Q·Kᵀ chain start: poisoned buffers,
    invalid indices, empty rows, partial lengths, attn_sink; within the GPU bounds of float64
    (its P·V in FP8 costs accuracy), nothing counted."""
    _block_pair()
    gen, seed = _fresh_generator()
    dims = contract.Dims(s_q=96, s_kv=3000, h_q=128, d_qk=d_qk, topk=512, with_topk_length=True,
                         with_attn_sink=True, with_buffers=True, with_errors=True,
                         device="cuda")
    args = op.random_inputs(dims, gen)
    expected = op.reference(**_inputs(args))
    outputs = (args["out"], args["max_logits"], args["lse"])
    _launch_block_pair(args, outputs, **tuning)
    passed, detail = op.compare_to_reference(outputs, expected, op.GPU_REL_L2_BOUND,
                                             op.GPU_LOGIT_TOL)
    assert passed, f"seed {seed}: {detail}"
    assert int(args["topk_length_errors"].item()) == 0


@gpu
@pytest.mark.parametrize("d_qk", contract.D_QKS)
@pytest.mark.parametrize("h_q", [64, 128])
def test_gpu_persistent_ctas_over_many_tiles_of_unequal_length(d_qk, h_q):
    """More tiles than SMs, so that each persistent CTA computes several in a row, of unequal
    lengths (``topk_length`` from 0 to ``topk``, tokens whose every index is invalid): pair
    numbers, barrier phases and each tile's Q carry over from tile to tile. Within the GPU
    bounds of float64, and bit for bit what one CTA a tile computes."""
    hopper = _block_pair()
    gen, seed = _fresh_generator()
    s_q = 5 * hopper.sm_count(torch.cuda.current_device()) * 64 // h_q + 7
    dims = contract.Dims(s_q=s_q, s_kv=2000, h_q=h_q, d_qk=d_qk, topk=384,
                         with_topk_length=True, with_attn_sink=True, with_buffers=True,
                         with_errors=True, device="cuda")
    args = op.random_inputs(dims, gen)
    args["topk_length"][::3] = 0
    results = []
    for tuning in ({"persistent": True}, ONE_TILE):
        outputs = tuple(torch.full_like(args[k], float("nan"))
                        for k in ("out", "max_logits", "lse"))
        _launch_block_pair(args, outputs, **tuning)
        results.append(outputs)
    expected = op.reference(**_inputs(args))
    passed, detail = op.compare_to_reference(results[0], expected, op.GPU_REL_L2_BOUND,
                                             op.GPU_LOGIT_TOL)
    assert passed, f"seed {seed}: {detail}"
    for ours, one_tile in zip(*results):
        assert torch.equal(ours, one_tile), f"seed {seed}"


@gpu
@pytest.mark.parametrize("tuning", [{}, ONE_TILE], ids=["persistent", "one-tile"])
def test_gpu_o_by_tma_writes_what_the_threads_write(tuning):
    """``o_tma`` (O sent by TMA from shared memory) writes every output bit for bit as the
    default's thread stores do, over more tiles than SMs with unequal lengths, into buffers
    poisoned with NaN; the lse and max_logits the same."""
    hopper = _block_pair()
    gen, seed = _fresh_generator()
    dims = contract.Dims(s_q=3 * hopper.sm_count(torch.cuda.current_device()) + 5, s_kv=2000,
                         h_q=128, d_qk=576, topk=384, with_topk_length=True,
                         with_attn_sink=True, with_buffers=True, with_errors=True,
                         device="cuda")
    args = op.random_inputs(dims, gen)
    args["topk_length"][::3] = 0
    results = []
    for o_tma in (False, True):
        outputs = tuple(torch.full_like(args[k], float("nan"))
                        for k in ("out", "max_logits", "lse"))
        _launch_block_pair(args, outputs, o_tma=o_tma, **tuning)
        results.append(outputs)
    for default, by_tma in zip(*results):
        assert torch.equal(default, by_tma), f"seed {seed}"


@gpu
def test_gpu_functional_buffer_and_dispatcher_calls_agree_bit_for_bit():
    gen, _ = _fresh_generator()
    dims = contract.Dims(s_q=40, s_kv=1000, h_q=128, d_qk=576, topk=256, with_attn_sink=True,
                         device="cuda")
    args = op.random_inputs(dims, gen)
    fresh = sparse_mla_q8kv8_prefill_fwd(**args)
    buffers = {"out": torch.empty_like(fresh[0]), "max_logits": torch.empty_like(fresh[1]),
               "lse": torch.empty_like(fresh[2])}
    versions = [b._version for b in buffers.values()]
    given_buffers = sparse_mla_q8kv8_prefill_fwd(**{**args, **buffers})
    via_ops = torch.ops.strictops.sparse_mla_q8kv8_prefill_fwd(**args)
    partial = sparse_mla_q8kv8_prefill_fwd(**{**args, "lse": torch.empty_like(fresh[2])})
    for got in (given_buffers, via_ops, partial):
        assert all(torch.equal(a, b) for a, b in zip(fresh, got))
    assert all(b._version > v for b, v in zip(buffers.values(), versions))


@gpu
@settings(SETTINGS, max_examples=examples(40))
@given(call=strategies.calls(calls_of.OP, device="cuda:0", valid=False, values=True))
def test_gpu_real_tensors_raise_the_contract_error_and_write_nothing(call):
    args, kwargs = call.build()  # zero-filled
    named = call.named(args, kwargs)
    before = {k: named[k].clone() for k in call.contract.mutates
              if isinstance(named[k], torch.Tensor)}
    err = raised(sparse_mla_q8kv8_prefill_fwd, *args, **kwargs)
    assert (type(err), str(err)) == call.expected_error(args, kwargs)
    assert all(torch.equal(named[k], v) for k, v in before.items())


@gpu
@pytest.mark.parametrize("other", ["d_v", "attn_sink_shape_dtype", "q_scale_dtype",
                                   "kv_scale_scalar", "out_dtype", "lse_contiguous",
                                   "buffers_alias"])
def test_gpu_topk_length_values_are_checked_before_later_rules(other):
    """Out-of-range lengths and a later broken rule, real CUDA tensors: the public function
    and the op through the dispatcher raise the value error, as the original did."""
    spec = contract.valid_spec(dataclasses.replace(DIMS, device="cuda:0"))
    args = build(contract.NEAR_MISSES[other](contract.NEAR_MISSES["topk_length_values"](spec)))
    want = contract.CONTRACT.expected_error("topk_length_values", **args)
    for fn in (sparse_mla_q8kv8_prefill_fwd, torch.ops.strictops.sparse_mla_q8kv8_prefill_fwd):
        err = raised(fn, **args)
        assert (type(err), str(err)) == want, fn


@gpu
def test_gpu_topk_length_values_eager_counter_and_capture(kernel):
    """Eager: refused with the original message. With a counter: no host sync, counted.
    Inside CUDA-graph capture without a counter: no check (no sync), clamped, no error."""
    gen, _ = _fresh_generator()
    dims = contract.Dims(s_q=8, s_kv=500, h_q=64, d_qk=512, topk=128, with_topk_length=True,
                         device="cuda")
    args = op.random_inputs(dims, gen)
    args["topk_length"][2:4] = torch.tensor([-1, 129], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"0 <= topk_length <= topk \(128\)"):
        sparse_mla_q8kv8_prefill_fwd(**args)
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    expected = sparse_mla_q8kv8_prefill_fwd(**{**args, "topk_length_errors": counter})
    assert counter.item() == 2
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile both variants before capture
        sparse_mla_q8kv8_prefill_fwd(**{**args, "topk_length_errors": counter})
        sparse_mla_q8kv8_prefill_fwd(**{**args, "topk_length": args["topk_length"].clamp(0, 128)})
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sparse_mla_q8kv8_prefill_fwd(**args)
        sparse_mla_q8kv8_prefill_fwd(**{**args, "topk_length_errors": counter})
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert counter.item() == 2 * 5
    assert all(torch.equal(a, b) for a, b in zip(expected, captured))
