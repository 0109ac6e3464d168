"""fused_commit_track_indices: contract messages, eager/fake parity, kernel numerics.

CPU (CI): messages on fake CUDA tensors pinned with expecttest (near misses on the eager and
fake paths: tests/test_contracts.py); the kernel under the
Triton interpreter equals the reference for any values, in both program orders; the reference
equals the original's formula wherever the original reads in bounds, and the original kernel
itself (interpreted, when ``.anchor`` is present). GPU (``-m gpu``): the op equals the reference
and sglang's original bit for bit.
"""

from __future__ import annotations

import unittest

import expecttest
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strictops.meta.mamba import commit_indices as contract
from strictops.meta import strategies
from strictops.meta.strategies import mamba_commit_indices as calls_of
from strictops.meta.testing import (
    examples,
    HAS_CUDA,
    HAS_TWO_GPUS,
    anchor_module,
    assert_every_rule_pinned,
    build,
    fake_mode,
    gpu,
    near_miss_message,
    raised,
)
from strictops.ops import fused_commit_track_indices
from strictops.ops.mamba import commit_indices as op
from strictops.ops._runtime.interpret import interpreted

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIMS = contract.Dims(batch=5, accepted_tokens=3, draft_token_num=4, mamba_track_interval=6)


def _message_on_fake(rule: str) -> str:
    return near_miss_message(fused_commit_track_indices, contract, rule, DIMS)


class TestMessages(expecttest.TestCase):
    @unittest.skipIf(HAS_CUDA and not HAS_TWO_GPUS, "a real single-GPU machine has no cuda:1")
    def test_same_device(self):
        self.assertExpectedInline(_message_on_fake("same_device"), """Expected every tensor on accept_index's device, but got accept_index.device=device(type='cuda', index=0) accept_lens.device=device(type='cuda', index=1) seq_lens.device=device(type='cuda', index=0)""")

    def test_cuda(self):
        self.assertExpectedInline(_message_on_fake("cuda"), """fused_commit_track_indices only supports CUDA tensors, but got accept_index.device=device(type='cpu') accept_lens.device=device(type='cpu') seq_lens.device=device(type='cpu')""")

    def test_ranks(self):
        self.assertExpectedInline(_message_on_fake("ranks"), """Expected accept_index [batch, accepted_tokens], accept_lens [batch] and seq_lens [batch], but got accept_index.shape=torch.Size([5, 3]) accept_lens.shape=torch.Size([5, 1]) seq_lens.shape=torch.Size([5])""")

    def test_batch(self):
        self.assertExpectedInline(_message_on_fake("batch"), """Expected one accept_index row per request, but got accept_index.shape[0]=6 vs accept_lens.shape[0]=5""")

    def test_seq_lens_batch(self):
        self.assertExpectedInline(_message_on_fake("seq_lens_batch"), """Expected one seq_lens entry per request, but got seq_lens.shape[0]=7 vs accept_lens.shape[0]=5""")

    def test_index_dtypes(self):
        self.assertExpectedInline(_message_on_fake("index_dtypes"), """Expected int32 or int64 index tensors, but got accept_index.dtype=torch.int64 accept_lens.dtype=torch.float32 seq_lens.dtype=torch.int64""")

    def test_draft_token_num(self):
        self.assertExpectedInline(_message_on_fake("draft_token_num"), """Expected draft_token_num >= 1, but got draft_token_num=0""")

    def test_track_interval(self):
        self.assertExpectedInline(_message_on_fake("track_interval"), """Expected mamba_track_interval >= 1 with seq_lens given, but got mamba_track_interval=0""")

    def test_every_rule_has_a_pinned_message(self):
        assert_every_rule_pinned(self, contract)

    def test_no_interval_check_without_seq_lens(self):
        spec = {**contract.valid_spec(DIMS), "seq_lens": None, "mamba_track_interval": 0}
        with fake_mode():
            assert contract.CONTRACT.broken_rule(**build(spec)) is None


def _equal(got, want) -> bool:
    return all((g is None and w is None) or torch.equal(g, w) for g, w in zip(got, want))


# Most programs one interpreted launch may run: the interpreter takes about 2.5 ms a program, and
# programs share no state, so more of them test nothing more.
MAX_INTERPRETED_PROGRAMS = 64


@settings(SETTINGS, max_examples=examples(80))
@given(data=st.data())
def test_interpreted_kernel_equals_reference(data):
    """Any call, in programs of 1, 4 or ``BLOCK`` requests (those that keep the launch at
    most ``MAX_INTERPRETED_PROGRAMS`` programs), run in either order."""
    d = data.draw(calls_of.dims(device="cpu"))
    args = calls_of.values(data.draw, d, "cpu")
    batch = args["accept_lens"].shape[0]
    blocks = [b for b in (1, 4) if -(-batch // b) <= MAX_INTERPRETED_PROGRAMS] + [op.BLOCK]
    got = op.launch_interpreted(**args, reverse_programs=data.draw(st.booleans()),
                                block=data.draw(st.sampled_from(blocks)))
    assert _equal(got, op.reference(**args))


def _original_formula(accept_index, accept_lens, seq_lens, draft_token_num, interval):
    """The original kernel's arithmetic, transcribed: one request at a time, Python ints."""
    last, track = [], []
    for b in range(accept_lens.shape[0]):
        al = int(accept_lens[b])
        base = b * draft_token_num
        last.append(int(accept_index[b, al - 1]) - base)
        pre = int(seq_lens[b])
        post = pre + al
        tp = (post // interval) * interval
        ti = max(tp - pre - 1, 0)
        cross = pre // interval != post // interval
        track.append(int(accept_index[b, ti]) - base if cross else -1)
    return torch.tensor(last), torch.tensor(track)


@settings(SETTINGS, max_examples=examples(150))
@given(data=st.data())
def test_reference_is_the_original_formula_where_the_original_reads_in_bounds(data):
    """In-range lengths (1..accepted_tokens) and non-negative sequence lengths."""
    b, n = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 6))
    dtn, interval = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 9))
    ints = lambda lo, hi, k: torch.tensor(data.draw(  # noqa: E731
        st.lists(st.integers(lo, hi), min_size=k, max_size=k)))
    args = (ints(-1, b * dtn, b * n).reshape(b, n), ints(1, n, b), ints(0, 100, b), dtn, interval)
    assert _equal(op.reference(*args), _original_formula(*args))


def _interpreted_original(args: dict):
    sgl = anchor_module("sgl_mamba")
    original = sgl._fused_commit_track_indices_kernel
    with interpreted(original) as kernel:
        sgl._fused_commit_track_indices_kernel = kernel
        try:
            return sgl.fused_commit_track_indices(**args)
        finally:
            sgl._fused_commit_track_indices_kernel = original


@pytest.mark.parametrize("small", [True, False])
def test_interpreted_original_kernel_agrees_where_it_reads_in_bounds(small):
    args = op.example_inputs("cpu", small, torch.Generator().manual_seed(2))
    args["accept_lens"][:3] = 1  # the example's out-of-range lengths: the original reads OOB
    args["seq_lens"][3] = 0
    assert _equal(_interpreted_original(args), op.launch_interpreted(**args))


@pytest.mark.parametrize("reverse_programs", [False, True])
def test_interpreted_kernel_reads_strided_tensors_in_place(reverse_programs):
    gen = torch.Generator().manual_seed(3)
    base = torch.randint(0, 40, (6, 8), generator=gen, dtype=torch.int32)
    accept_index = base[:, ::2]  # [6, 4], strides (8, 2)
    accept_lens = torch.tensor([1, 4, 2, 9, 3, 0, 4, 4, 1, 2, 3, 1])[::2]
    seq_lens = torch.tensor([7, 0, 3, 3, 15, 8], dtype=torch.int32)
    got = op.launch_interpreted(accept_index, accept_lens, seq_lens, 4, 8,
                                reverse_programs=reverse_programs)
    assert _equal(got, op.reference(accept_index, accept_lens, seq_lens, 4, 8))
    assert got[0][0] == accept_index[0, 0] and got[1][0] == accept_index[0, 0]  # 7 -> 8 crosses


# --------------------------------------------------------------------------------------------
# GPU


@gpu
@settings(SETTINGS, max_examples=examples(40))
@given(data=st.data())
def test_gpu_op_equals_reference(data):
    d = data.draw(calls_of.dims(device="cuda"))
    args = calls_of.values(data.draw, d, "cuda")
    assert _equal(fused_commit_track_indices(**args), op.reference(**args))


@gpu
@pytest.mark.parametrize("with_seq_lens", [False, True])
def test_gpu_bit_equal_to_the_original(with_seq_lens):
    sgl = anchor_module("sgl_mamba")
    args = op.example_inputs("cuda", False, torch.Generator().manual_seed(4))
    args["accept_lens"][:3] = 1  # in range: the original reads out of bounds otherwise
    args["seq_lens"][3] = 0
    if not with_seq_lens:
        args["seq_lens"] = None
    assert _equal(fused_commit_track_indices(**args), sgl.fused_commit_track_indices(**args))


@gpu
@settings(SETTINGS, max_examples=examples(20))
@given(call=strategies.calls(calls_of.OP, device="cuda:0", valid=False))
def test_gpu_real_tensors_raise_the_contract_error(call):
    args, kwargs = call.build()
    err = raised(fused_commit_track_indices, *args, **kwargs)
    assert (type(err), str(err)) == call.expected_error(args, kwargs)
