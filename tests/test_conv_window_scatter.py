"""fused_conv_window_scatter_with_mask: contract messages, eager/fake parity, kernel numerics.

CPU (CI): messages on fake CUDA tensors pinned with expecttest; near misses drawn from the
contract raise the same error on the eager path (concrete sizes) and the fake path (symbolic
sizes); the kernel under the Triton interpreter equals the reference exactly for any index
values, in both program orders. GPU (``-m gpu``): the same on real CUDA tensors, and bit
equality with sglang's original kernel where its checkout is present (``.anchor``).
"""

from __future__ import annotations

import unittest

import expecttest
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strictops.meta.mamba import conv_window_scatter as contract
from strictops.meta import strategies
from strictops.meta.strategies import conv_window_scatter as calls_of
from strictops.meta.testing import (
    examples,
    HAS_CUDA,
    HAS_TWO_GPUS,
    anchor_module,
    assert_every_rule_pinned,
    gpu,
    near_miss_message,
    raised,
)
from strictops.ops.mamba import conv_window_scatter as op
from strictops.ops import fused_conv_window_scatter_with_mask

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIMS = contract.Dims(num_layers=3, cache_size=7, spec_size=5, draft_tokens=4, dim=6, km1=3,
                     total_requests=4)


def _message_on_fake(rule: str, dims: contract.Dims = DIMS) -> str:
    return near_miss_message(fused_conv_window_scatter_with_mask, contract, rule, dims)


class TestMessages(expecttest.TestCase):
    """Every rule (the original's and the added ones) on fake CUDA tensors, message pinned."""

    @unittest.skipIf(HAS_CUDA and not HAS_TWO_GPUS, "a real single-GPU machine has no cuda:1")
    def test_cuda_same_device(self):
        self.assertExpectedInline(_message_on_fake("cuda_same_device"), """fused_conv_window_scatter_with_mask requires dst and src to be CUDA tensors on the same device (dst.device=device(type='cuda', index=0), src.device=device(type='cuda', index=1)).""")

    def test_ranks(self):
        self.assertExpectedInline(_message_on_fake("ranks"), """Unexpected ranks: dst.ndim=3 (want 4) src.ndim=5 (want 5)""")

    def test_layer_dim(self):
        self.assertExpectedInline(_message_on_fake("layer_dim"), """Layer dim mismatch: dst.shape[0]=3 vs src.shape[0]=4""")

    def test_window_dims(self):
        self.assertExpectedInline(_message_on_fake("window_dims"), """Window dims mismatch: dst.shape[2:]=torch.Size([6, 3]) vs src.shape[3:]=torch.Size([6, 4])""")

    def test_same_dtype(self):
        self.assertExpectedInline(_message_on_fake("same_dtype"), """dst and src must have the same dtype. dst.dtype=torch.bfloat16 src.dtype=torch.float16""")

    def test_indices_1d(self):
        self.assertExpectedInline(_message_on_fake("indices_1d"), """indices must be 1D: dst_indices_raw.shape=torch.Size([4]) step_indices_raw.shape=torch.Size([4, 1])""")

    def test_indices_length(self):
        self.assertExpectedInline(_message_on_fake("indices_length"), """indices length mismatch: dst_indices_raw.shape[0]=4 vs step_indices_raw.shape[0]=5""")

    def test_indices_dtype(self):
        self.assertExpectedInline(_message_on_fake("indices_dtype"), """indices must be int32 or int64: dst_indices_raw.dtype=torch.float32 step_indices_raw.dtype=torch.int64""")

    def test_indices_device(self):
        self.assertExpectedInline(_message_on_fake("indices_device"), """indices must be on dst's device: dst.device=device(type='cuda', index=0) dst_indices_raw.device=device(type='cuda', index=0) step_indices_raw.device=device(type='cpu')""")

    def test_dst_entry_contiguous(self):
        self.assertExpectedInline(_message_on_fake("dst_entry_contiguous"), """fused_conv_window_scatter_with_mask: dst entry dims (dims 2..3) must be contiguous; got shape=(3, 7, 6, 3) strides=(252, 36, 6, 2)""")

    def test_src_indices_shape(self):
        self.assertExpectedInline(_message_on_fake("src_indices_shape"), """source indices length mismatch: src_indices_raw.shape=torch.Size([6]) vs step_indices_raw.shape=torch.Size([4])""")

    def test_src_indices_dtype(self):
        self.assertExpectedInline(_message_on_fake("src_indices_dtype"), """indices must be int32 or int64: dst_indices_raw.dtype=torch.int64 src_indices_raw.dtype=torch.int16""")

    def test_src_indices_device(self):
        self.assertExpectedInline(_message_on_fake("src_indices_device"), """indices must be on dst's device: dst.device=device(type='cuda', index=0) src_indices_raw.device=device(type='cpu')""")

    def test_src_inside_storage(self):
        self.assertExpectedInline(_message_on_fake("src_inside_storage"), """Expected src's largest element offset to be < its storage size of 539 elements (2 bytes each), but got 539 (src.shape=(3, 5, 4, 6, 3), src.stride()=(180, 36, 1, 6, 1), src.storage_offset()=0)""")

    def test_dst_inside_storage(self):
        self.assertExpectedInline(_message_on_fake("dst_inside_storage"), """Expected dst's largest element offset to be < its storage size of 377 elements (2 bytes each), but got 377 (dst.shape=(3, 7, 6, 3), dst.stride()=(126, 18, 3, 1), dst.storage_offset()=0)""")

    def test_every_rule_has_a_pinned_message(self):
        assert_every_rule_pinned(self, contract)  # near misses: tests/test_registry.py

    def test_zero_requests_are_still_validated(self):
        dims = contract.Dims(**{**DIMS.__dict__, "total_requests": 0})
        self.assertIn("Layer dim mismatch", _message_on_fake("layer_dim", dims))

    def test_a_cpu_src_fails_the_device_rule_on_any_machine(self):
        spec = contract.valid_spec(DIMS)
        spec = {**spec, "src": spec["src"].replace(device="cpu")}
        from strictops.meta.testing import build, fake_mode
        with fake_mode():
            err = raised(fused_conv_window_scatter_with_mask, **build(spec))
        self.assertIn("to be CUDA tensors on the same device", str(err))


def fill(dims: contract.Dims, values: dict, device: str, gen: torch.Generator) -> dict:
    """Real tensors for ``dims``: random conv states (never all zeros), ``src`` an overlapping
    window view of a random shared buffer when ``dims.overlapping``, and the drawn indices."""
    def random(*shape):
        if dims.dtype.is_floating_point:
            return torch.randn(shape, generator=gen).to(dtype=dims.dtype, device=device)
        return torch.randint(-100, 100, shape, generator=gen).to(dtype=dims.dtype, device=device)

    L, spec, draft, dim, km1 = (dims.num_layers, dims.spec_size, dims.draft_tokens, dims.dim,
                                dims.km1)
    if dims.overlapping:
        src = op.window_view(random(L, spec, dim, draft + km1 - 1), draft, km1)
    else:
        src = random(L, spec, draft, dim, km1)
    args = {"dst": random(L, dims.cache_size, dim, km1), "src": src}
    specs = contract.valid_spec(dims)
    for name, vals in values.items():
        args[name] = (None if vals is None
                      else torch.tensor(vals, dtype=specs[name].dtype, device=device))
    return args


@settings(SETTINGS, max_examples=examples(120))
@given(data=st.data())
def test_interpreted_kernel_equals_reference(data):
    """Any index values (negative, out of range, near INT32_MAX, duplicate slots), any window
    width, run length and layers per program, either decoding path: the kernel writes exactly
    what the reference writes, in either program order, and leaves ``src`` (and the rest of
    its shared buffer) untouched."""
    dims = data.draw(calls_of.dims(device="cpu"))
    values = calls_of.index_values(data.draw, dims)
    tuning = data.draw(calls_of.TUNINGS)
    reverse = data.draw(st.booleans())
    args = fill(dims, values, "cpu", torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    expected = op.reference(**args)
    storage_before = bytes(args["src"].untyped_storage())
    op.launch_interpreted(**args, reverse_programs=reverse, **tuning)
    assert torch.equal(args["dst"], expected)
    assert bytes(args["src"].untyped_storage()) == storage_before


def test_interpreted_kernel_reads_strided_index_tensors_in_place():
    """Index tensors with a stride are read through it, not copied."""
    gen = torch.Generator().manual_seed(0)
    dst = torch.randn(2, 6, 5, 3, generator=gen)
    src = op.window_view(torch.randn(2, 4, 5, 3 + 3 - 1, generator=gen), 3, 3)
    slots = torch.tensor([5, -1, 0, -1, 3, -1, 2, -1], dtype=torch.int32)[::2]
    steps = torch.tensor([2, 9, 0, 9, 9, 9, 1, 9], dtype=torch.int64)[::2]
    expected = op.reference(dst, src, slots, steps)
    op.launch_interpreted(dst, src, slots, steps)
    assert torch.equal(dst, expected)
    # slot 3's request asked for step 9 >= draft_tokens: skipped; the other three were written.
    assert torch.equal(dst[:, 5], src[:, 0, 2]) and torch.equal(dst[:, 2], src[:, 3, 1])


def test_windows_overlap_as_sglang_lays_them_out():
    """Step t's window is the shared buffer's columns t..t+K-2: the view and the reference
    agree with slicing the buffer directly."""
    shared = torch.arange(2 * 3 * 4 * 6, dtype=torch.float32).reshape(2, 3, 4, 6)
    src = op.window_view(shared, 4, 3)
    dst = torch.zeros(2, 5, 4, 3)
    slots, steps = torch.tensor([4, 0, 2]), torch.tensor([3, 0, 1])
    op.launch_interpreted(dst, src, slots, steps)
    for i, (slot, step) in enumerate(zip(slots.tolist(), steps.tolist())):
        assert torch.equal(dst[:, slot], shared[:, i, :, step:step + 3])


@pytest.mark.parametrize("km1", [1, 2, 3, 4, 5, 7, 1000, 46340, 2**31 - 1])
def test_division_free_decoding_is_exact_up_to_its_bound(km1):
    """The kernel's ``e // km1 = umulhi(2e, ceil(2**31 / km1))`` (uint32) for the ``e`` it is
    used on (``e * km1 < 2**31``): at the ends of the rows next to the bound and everywhere
    below 2**16. Its 64-bit twin holds for ``e * km1 < 2**63`` the same way."""
    magic = (2**31 - 1) // km1 + 1
    bound = (2**31 - 1) // km1 + 1  # e < bound  <=>  e * km1 < 2**31
    near = {m * km1 + r for m in (bound // km1 - 1, bound // km1)
            for r in (-2, -1, 0, 1, 2, km1 - 2, km1 - 1)}
    es = [e for e in near | set(range(min(bound, 2**16))) if 0 <= e < bound]
    assert all((2 * e * magic) >> 32 == e // km1 for e in es)
    magic64 = (2**63 - 1) // km1 + 1
    bound64 = (2**63 - 1) // km1 + 1
    assert all((2 * e * magic64) >> 64 == e // km1
               for e in (bound64 - 1, bound64 - km1, bound64 // 2, 12345))


@pytest.mark.parametrize("reverse_programs", [False, True])
def test_duplicate_slots_last_valid_request_wins(reverse_programs):
    gen = torch.Generator().manual_seed(1)
    dst = torch.randn(2, 3, 4, 3, generator=gen)
    src = op.window_view(torch.randn(2, 4, 4, 2 + 3 - 1, generator=gen), 2, 3)
    slots = torch.tensor([1, 1, 1, 1])
    steps = torch.tensor([0, 1, 1, -1])  # request 3 is rejected: request 2 is the last writer
    op.launch_interpreted(dst, src, slots, steps, reverse_programs=reverse_programs,
                          block_bytes=16)
    assert torch.equal(dst[:, 1], src[:, 2, 1])


# --------------------------------------------------------------------------------------------
# GPU


@gpu
@settings(SETTINGS, max_examples=examples(30))
@given(data=st.data())
def test_gpu_op_equals_reference(data):
    dims = data.draw(calls_of.dims(device="cuda"))
    values = calls_of.index_values(data.draw, dims)
    args = fill(dims, values, "cuda", torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    expected = op.reference(**args)
    fused_conv_window_scatter_with_mask(**args)
    assert torch.equal(args["dst"], expected)


@gpu
@settings(SETTINGS, max_examples=examples(30))
@given(call=strategies.calls(calls_of.OP, device="cuda:0", valid=False))
def test_gpu_real_tensors_raise_the_contract_error_and_write_nothing(call):
    args, kwargs = call.build()
    dst_before = bytes(args[0].untyped_storage().cpu())
    err = raised(fused_conv_window_scatter_with_mask, *args, **kwargs)
    assert (type(err), str(err)) == call.expected_error(args, kwargs)
    assert bytes(args[0].untyped_storage().cpu()) == dst_before


@gpu
def test_gpu_direct_and_dispatcher_paths_agree_and_bump_the_version():
    gen = torch.Generator().manual_seed(5)
    dims = contract.Dims(3, 9, 6, 4, 300, 3, 12, with_src_indices=True, device="cuda")
    values = {"dst_indices_raw": [0, 3, 3, -1, 8, 9, 2, 5, 5, 1, 7, 4],
              "step_indices_raw": [1, 0, 2, 3, -1, 0, 4, 1, 2, 0, 3, 2],
              "src_indices_raw": [0, 1, 2, 3, 4, 5, 6, -1, 0, 1, 2, 3]}
    direct = fill(dims, values, "cuda", gen)
    via_ops = {k: (v.clone() if k == "dst" else v) for k, v in direct.items()}
    expected = op.reference(**direct)
    version = direct["dst"]._version
    fused_conv_window_scatter_with_mask(**direct)
    torch.ops.strictops.fused_conv_window_scatter_with_mask(**via_ops)
    assert torch.equal(direct["dst"], expected) and torch.equal(via_ops["dst"], expected)
    assert direct["dst"]._version > version


def sglang_shapes_inputs(seed: int, layers=4, cache=64, spec=16, draft=4, dim=2048, km1=3,
                         dtype=torch.bfloat16, src_indices=False):
    """Inputs the original handles deterministically: distinct slots, valid src rows; a few
    requests rejected (step -1), out of range (step or slot), as the original skips them."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dst = torch.randn(layers, cache, dim, km1, device="cuda", generator=gen).to(dtype)
    shared = torch.randn(layers, spec, dim, draft + km1 - 1, device="cuda", generator=gen)
    src = op.window_view(shared.to(dtype), draft, km1)
    slots = torch.randperm(cache, device="cuda", generator=gen)[:spec].to(torch.int32)
    steps = torch.randint(0, draft, (spec,), device="cuda", generator=gen)
    steps[::5] = -1
    steps[1] = draft
    slots[2] = cache
    rows = (torch.randperm(spec, device="cuda", generator=gen).to(torch.int64)
            if src_indices else None)
    return dst, src, slots, steps, rows


@gpu
@pytest.mark.parametrize("tuning", [{"layers": 1}, {"layers": 4}, {"run_bytes": 8},
                                    {"run_bytes": 4}, {"run_bytes": 0}, {"stream": True},
                                    {"block_bytes": 4096, "num_warps": 8}, {"i32_reach": 0}])
@pytest.mark.parametrize("dtype,dim,km1", [(torch.bfloat16, 2048, 3), (torch.float16, 77, 5),
                                           (torch.int8, 300, 1)])
def test_gpu_every_tuning_equals_reference(tuning, dtype, dim, km1):
    """The kernel's other tunings (layers, run widths, the exchange, streaming, 4 KiB runs by
    8 warps, the int64 path), on entries whose runs are aligned (vector stores) or not,
    with rejected and out-of-range requests, src rows given."""
    dst, src, slots, steps, rows = sglang_shapes_inputs(7, dim=dim, km1=km1, dtype=dtype,
                                                        src_indices=True)
    expected = op.reference(dst, src, slots, steps, rows)
    op._launch(op._scatter_kernel, dst, src, slots, steps, rows, **tuning)
    assert torch.equal(dst, expected)


@gpu
@pytest.mark.parametrize("src_indices", [False, True])
@pytest.mark.parametrize("dtype,dim,km1", [(torch.bfloat16, 2048, 3), (torch.float32, 300, 1),
                                           (torch.float16, 77, 5)])
def test_gpu_bit_equal_to_sglang_original(src_indices, dtype, dim, km1):
    sgl = anchor_module("sgl_mamba")
    for seed in range(3):
        dst, src, slots, steps, rows = sglang_shapes_inputs(seed, dim=dim, km1=km1, dtype=dtype,
                                                            src_indices=src_indices)
        theirs = dst.clone()
        sgl.fused_conv_window_scatter_with_mask(theirs, src, slots, steps, rows)
        fused_conv_window_scatter_with_mask(dst, src, slots, steps, rows)
        assert torch.equal(dst, theirs)
