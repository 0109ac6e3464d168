"""track_mamba_states_all_layers / _if_needed: contract messages, eager/fake parity, numerics.

CPU (CI): messages on fake CUDA tensors pinned with expecttest; near misses raise the same error
on the eager path (concrete sizes) and the fake path (symbolic sizes); the kernel under the
Triton interpreter equals the reference for any index values, any program count and both
program orders, and equals the original kernel (interpreted, when ``.anchor`` is present) on
the calls the original handles. GPU (``-m gpu``): the op equals the reference and the original.
"""

from __future__ import annotations

import unittest

import expecttest
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strictops.meta import mamba_track_states as contract
from strictops.meta.testing import (
    HAS_CUDA,
    HAS_TWO_GPUS,
    anchor_module,
    assert_every_rule_pinned,
    assert_near_miss_parity,
    gpu,
    near_miss_message,
    raised,
)
from strictops.ops import track_mamba_states_all_layers, track_mamba_states_if_needed
from strictops.ops import mamba_track_states as op
from strictops.ops._interpret import interpreted

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIMS = contract.Dims(num_layers=3, pool_size=9, conv_state=(4, 2), ssm_state=(2, 5, 3), batch=6,
                     batch_size=5)
I32_MAX, I32_MIN = 2**31 - 1, -(2**31)


def _message_on_fake(rule: str) -> str:
    return near_miss_message(track_mamba_states_all_layers, contract, rule, DIMS)


class TestMessages(expecttest.TestCase):
    @unittest.skipIf(HAS_CUDA and not HAS_TWO_GPUS, "a real single-GPU machine has no cuda:1")
    def test_same_device(self):
        self.assertExpectedInline(_message_on_fake("same_device"), """Expected every tensor on conv_states_pool's device, but got conv_states_pool.device=device(type='cuda', index=0) ssm_states_pool.device=device(type='cuda', index=0) cache_indices.device=device(type='cuda', index=0) mamba_track_mask.device=device(type='cuda', index=0) mamba_track_indices.device=device(type='cuda', index=1)""")

    def test_cuda(self):
        self.assertExpectedInline(_message_on_fake("cuda"), """track_mamba_states_all_layers only supports CUDA tensors, but got conv_states_pool.device=device(type='cpu')""")

    def test_ranks(self):
        self.assertExpectedInline(_message_on_fake("ranks"), """Expected conv_states_pool and ssm_states_pool of shape [num_layers, pool_size, ...], but got conv_states_pool.shape=torch.Size([3, 9, 4, 2]) ssm_states_pool.shape=torch.Size([3])""")

    def test_layers(self):
        self.assertExpectedInline(_message_on_fake("layers"), """Expected as many conv as ssm layers, but got conv_states_pool.shape[0]=3 vs ssm_states_pool.shape[0]=4""")

    def test_indices_1d(self):
        self.assertExpectedInline(_message_on_fake("indices_1d"), """Expected 1-D index tensors, but got cache_indices.shape=(6,) mamba_track_mask.shape=(6, 1) mamba_track_indices.shape=(6,)""")

    def test_index_dtypes(self):
        self.assertExpectedInline(_message_on_fake("index_dtypes"), """Expected int32 or int64 indices, but got cache_indices.dtype=torch.float32 mamba_track_indices.dtype=torch.int64""")

    def test_mask_dtype(self):
        self.assertExpectedInline(_message_on_fake("mask_dtype"), """Expected a bool, int32 or int64 mamba_track_mask, but got mamba_track_mask.dtype=torch.float16""")

    def test_batch_size(self):
        self.assertExpectedInline(_message_on_fake("batch_size"), """Expected 0 <= batch_size <= the length of every index tensor, but got batch_size=7 cache_indices.shape=(6,) mamba_track_mask.shape=(6,) mamba_track_indices.shape=(6,)""")

    def test_conv_entry_contiguous(self):
        self.assertExpectedInline(_message_on_fake("conv_entry_contiguous"), """Expected conv_states_pool entry dims (dims 2..3) contiguous, but got shape=(3, 9, 4, 2) strides=(144, 16, 4, 2)""")

    def test_ssm_entry_contiguous(self):
        self.assertExpectedInline(_message_on_fake("ssm_entry_contiguous"), """Expected ssm_states_pool entry dims (dims 2..4) contiguous, but got shape=(3, 9, 2, 5, 3) strides=(540, 60, 30, 6, 2)""")

    def test_every_rule_has_a_pinned_message(self):
        assert_every_rule_pinned(self, contract)

    def test_negative_batch_size(self):
        spec = {**contract.valid_spec(DIMS), "batch_size": -1}
        from strictops.meta.testing import build, fake_mode
        with fake_mode():
            err = raised(track_mamba_states_all_layers, **build(spec))
        assert "but got batch_size=-1" in str(err)

    def test_if_needed_reports_the_pool_rules(self):
        spec = contract.valid_spec(DIMS)
        from strictops.meta.testing import build, fake_mode
        with fake_mode():
            args = build(spec)
            args.pop("conv_states_pool")
            args["conv_states"] = torch.empty((9, 4, 2), device="cuda:0")
            args.pop("ssm_states_pool")
            args["ssm_states"] = torch.empty_strided((9, 2, 5, 3), (60, 30, 6, 2),
                                                     device="cuda:0")
            err = raised(track_mamba_states_if_needed, **args)
        assert str(err).startswith("Expected ssm_states_pool entry dims (dims 2..4) contiguous")


@st.composite
def track_dims(draw, device: str = "cuda:0", max_entry: int = 40) -> contract.Dims:
    def state():
        rank = draw(st.integers(0, 3))
        dims = []
        for _ in range(rank):
            budget = max_entry // max(1, _prod(dims))
            dims.append(draw(st.integers(1, max(1, min(budget, 9)))))
        return tuple(dims)

    batch = draw(st.integers(0, 140))
    return contract.Dims(
        num_layers=draw(st.integers(1, 3)), pool_size=draw(st.integers(2, 12)),
        conv_state=state(), ssm_state=state(), batch=batch,
        batch_size=draw(st.integers(0, batch)),
        conv_dtype=draw(st.sampled_from([torch.bfloat16, torch.float32, torch.int8])),
        ssm_dtype=draw(st.sampled_from([torch.float32, torch.float16])),
        index_dtypes=tuple(draw(st.sampled_from(contract.INDEX_DTYPES)) for _ in range(2)),
        mask_dtype=draw(st.sampled_from(contract.MASK_DTYPES)), device=device)


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


@st.composite
def track_near_miss(draw, device: str = "cuda:0"):
    rule = draw(st.sampled_from(contract.CONTRACT.rules))
    return rule, contract.NEAR_MISSES[rule](contract.valid_spec(draw(track_dims(device))))


@settings(SETTINGS, max_examples=60)
@given(case=track_near_miss())
def test_near_miss_eager_and_fake_paths_agree(case):
    assert_near_miss_parity(track_mamba_states_all_layers, contract, *case)


def _fill(d: contract.Dims, draw, device: str, gen: torch.Generator) -> dict:
    """Real tensors: random states; cache slots in the lower half of the pool and track slots
    in the upper half (never both, as in serving), mixed with bad and extreme values."""
    spec = contract.valid_spec(d)
    half, n = d.pool_size // 2, d.batch
    bad = st.sampled_from([-1, -5, d.pool_size, d.pool_size + 3, I32_MAX, I32_MIN])

    def column(lo, hi, dtype):
        values = draw(st.lists(st.one_of(st.integers(lo, hi - 1), st.integers(lo, hi - 1), bad),
                               min_size=n, max_size=n))
        return torch.tensor(values, dtype=dtype, device=device)

    args = {"cache_indices": column(0, half, d.index_dtypes[0]),
            "mamba_track_indices": column(half, d.pool_size, d.index_dtypes[1]),
            "mamba_track_mask": torch.tensor(
                draw(st.lists(st.sampled_from([0, 1, 1, 7, -(2**31)]), min_size=n, max_size=n)),
                device=device).to(d.mask_dtype)}
    for name in ("conv_states_pool", "ssm_states_pool"):
        s = spec[name]
        args[name] = (torch.randn(s.shape, generator=gen) * 50).to(s.dtype).to(device)
    return {**args, "batch_size": spec["batch_size"]}


@settings(SETTINGS, max_examples=100)
@given(data=st.data())
def test_interpreted_kernel_equals_reference(data):
    d = data.draw(track_dims(device="cpu"))
    args = _fill(d, data.draw, "cpu", torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    tuning = data.draw(st.sampled_from([{"chunk_bytes": 16, "block": 4},
                                        {"chunk_bytes": 64, "block": 8}, {}]))
    expected = op.reference(**args)
    op.launch_interpreted(**args, reverse_programs=data.draw(st.booleans()),
                          programs=data.draw(st.integers(1, 9)), **tuning)
    assert torch.equal(args["conv_states_pool"], expected[0])
    assert torch.equal(args["ssm_states_pool"], expected[1])


@pytest.mark.parametrize("reverse_programs", [False, True])
def test_duplicate_track_slots_last_tracked_row_wins(reverse_programs):
    conv, ssm = torch.randn(2, 6, 3), torch.randn(2, 6, 2, 2)
    src = torch.tensor([0, 1, 2, 0])
    dst = torch.tensor([4, 4, 4, 5])[:, None].expand(4, 2)[:, 0]  # strided: (2,) step
    mask = torch.tensor([True, True, False, True])  # row 2 is not tracked: row 1 wins slot 4
    want = (conv.clone(), ssm.clone())
    want[0][:, 4], want[1][:, 4] = conv[:, 1], ssm[:, 1]
    want[0][:, 5], want[1][:, 5] = conv[:, 0], ssm[:, 0]
    op.launch_interpreted(conv, ssm, src, mask, dst, 4, reverse_programs=reverse_programs,
                          programs=3, chunk_bytes=4, block=2)
    assert torch.equal(conv, want[0]) and torch.equal(ssm, want[1])


def _interpreted_original(args: dict, all_layers: bool):
    sgl = anchor_module("sgl_mamba")
    original = sgl.track_mamba_state_if_needed_kernel
    with interpreted(original) as kernel:
        sgl.track_mamba_state_if_needed_kernel = kernel
        try:
            if all_layers:
                sgl.track_mamba_states_all_layers(**args, check_freed_slots=True)
            else:
                sgl.track_mamba_states_if_needed(**args, check_freed_slots=True)
        finally:
            sgl.track_mamba_state_if_needed_kernel = original


def _original_case(seed: int):
    """A call the original handles: slots in range or -1 (check_freed_slots), bool mask,
    distinct track slots, cache and track slots apart."""
    gen = torch.Generator().manual_seed(seed)
    layers, pool, n = 2, 20, 9
    conv = torch.randn(layers, pool, 3, 5, generator=gen).to(torch.bfloat16)
    ssm = torch.randn(layers, pool, 2, 3, 4, generator=gen)
    src = torch.randint(0, 10, (n,), generator=gen)
    dst = torch.randperm(10, generator=gen)[:n] + 10
    src[2], dst[5] = -1, -1
    mask = torch.rand(n, generator=gen) < 0.6
    return {"cache_indices": src.to(torch.int32), "mamba_track_mask": mask,
            "mamba_track_indices": dst, "batch_size": n - 1}, conv, ssm


@pytest.mark.parametrize("all_layers", [True, False])
def test_interpreted_original_kernel_agrees(all_layers):
    index_args, conv, ssm = _original_case(0)
    if not all_layers:
        conv, ssm = conv[1], ssm[1]
    names = ("conv_states_pool", "ssm_states_pool") if all_layers else ("conv_states",
                                                                        "ssm_states")
    ours = {names[0]: conv.clone(), names[1]: ssm.clone(), **index_args}
    theirs = {names[0]: conv.clone(), names[1]: ssm.clone(), **index_args}
    _interpreted_original(theirs, all_layers)
    pools = [(t if all_layers else t.unsqueeze(0)) for t in (ours[names[0]], ours[names[1]])]
    op.launch_interpreted(*pools, index_args["cache_indices"], index_args["mamba_track_mask"],
                          index_args["mamba_track_indices"], index_args["batch_size"])
    assert torch.equal(ours[names[0]], theirs[names[0]])
    assert torch.equal(ours[names[1]], theirs[names[1]])
    assert not torch.equal(ours[names[1]], ssm)  # the case copies something


# --------------------------------------------------------------------------------------------
# GPU


@gpu
@settings(SETTINGS, max_examples=40)
@given(data=st.data())
def test_gpu_op_equals_reference(data):
    d = data.draw(track_dims(device="cuda", max_entry=5000))
    args = _fill(d, data.draw, "cuda", torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    expected = op.reference(**args)
    track_mamba_states_all_layers(**args)
    assert torch.equal(args["conv_states_pool"], expected[0])
    assert torch.equal(args["ssm_states_pool"], expected[1])


@gpu
@pytest.mark.parametrize("all_layers", [True, False])
def test_gpu_bit_equal_to_the_original_at_model_shapes(all_layers):
    sgl = anchor_module("sgl_mamba")
    gen = torch.Generator(device="cuda").manual_seed(1)
    layers, pool, n = (36 if all_layers else 1), 130, 64
    conv = torch.randn(layers, pool, 2048, 3, device="cuda", generator=gen).to(torch.bfloat16)
    ssm = torch.randn(layers, pool, 8, 128, 128, device="cuda", generator=gen)
    src = torch.randint(0, 64, (n,), device="cuda", generator=gen, dtype=torch.int32)
    dst = torch.randperm(64, device="cuda", generator=gen) + 64
    mask = torch.rand(n, device="cuda", generator=gen) < 0.2
    pools = [(conv.clone(), ssm.clone()) for _ in range(2)]
    if all_layers:
        track_mamba_states_all_layers(*pools[0], src, mask, dst, n)
        sgl.track_mamba_states_all_layers(*pools[1], src, mask, dst, n)
    else:
        track_mamba_states_if_needed(pools[0][0][0], pools[0][1][0], src, mask, dst, n)
        sgl.track_mamba_states_if_needed(pools[1][0][0], pools[1][1][0], src, mask, dst, n)
    assert torch.equal(pools[0][0], pools[1][0]) and torch.equal(pools[0][1], pools[1][1])
    assert not torch.equal(pools[0][1], ssm)


@gpu
@settings(SETTINGS, max_examples=20)
@given(case=track_near_miss(device="cuda:0"))
def test_gpu_real_tensors_raise_the_contract_error_and_write_nothing(case):
    from strictops.meta._specs import buildable_here
    rule, spec = case
    if not buildable_here(spec):
        return
    args = {k: (v.empty().zero_() if hasattr(v, "empty") else v) for k, v in spec.items()}
    before = args["ssm_states_pool"].clone()
    want = contract.CONTRACT.expected_error(rule, **args)
    err = raised(track_mamba_states_all_layers, **args)
    assert (type(err), str(err)) == want
    assert torch.equal(args["ssm_states_pool"], before)
