"""fused_conv_window_scatter_multi: contract messages, eager/fake parity, kernel numerics.

CPU (CI): messages on fake CUDA tensors pinned with expecttest; near misses drawn from the
contract raise the same error on the eager path and the fake path (symbolic sizes); the kernel
under the Triton interpreter equals the reference (the one-pair op's, set 1 then set 2, per
pair) for any index values and 1-8 pairs of mixed shapes and dtypes, in both program orders.
GPU (``-m gpu``): the same on real CUDA tensors, and bit equality with sglang's original
(``.anchor``) on the bf16 pairs it accepts.
"""

from __future__ import annotations

import unittest

import expecttest
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strictops.meta.mamba import conv_window_scatter_multi as contract
from strictops.meta import strategies
from strictops.meta.strategies import conv_window_scatter_multi as calls_of
from strictops.meta.strategies.conv_window_scatter import DTYPES, TUNINGS
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
from strictops.ops.mamba import conv_window_scatter as one
from strictops.ops.mamba import conv_window_scatter_multi as op
from strictops.ops import fused_conv_window_scatter_multi

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIMS = contract.Dims(num_layers=3, cache_size=7, spec_size=5, draft_tokens=4,
                     windows=((6, 3, torch.bfloat16), (9, 2, torch.float32)), n1=4)


def _message_on_fake(rule: str, dims: contract.Dims = DIMS) -> str:
    return near_miss_message(fused_conv_window_scatter_multi, contract, rule, dims)


class TestMessages(expecttest.TestCase):
    """Every rule on fake CUDA tensors, message pinned."""

    def test_pair_count(self):
        self.assertExpectedInline(_message_on_fake("pair_count"), """Expected 1 to 8 (conv_states, conv_window) pairs, but got 9""")

    def test_cuda_same_device(self):
        self.assertExpectedInline(_message_on_fake("cuda_same_device"), """pairs[1]: fused_conv_window_scatter_multi requires dst and src to be CUDA tensors on the same device (dst.device=device(type='cuda', index=0), src.device=device(type='cuda', index=1)).""")

    @unittest.skipUnless(CAN_NAME_SECOND_GPU, "a real single-GPU machine has no cuda:1")
    def test_one_device(self):
        self.assertExpectedInline(_message_on_fake("one_device"), """Expected every pair on pairs[0]'s device (cuda:0), but pairs[1] is on cuda:1""")

    def test_ranks(self):
        self.assertExpectedInline(_message_on_fake("ranks"), """pairs[1]: Unexpected ranks: dst.ndim=3 (want 4) src.ndim=5 (want 5)""")

    def test_layer_dim(self):
        self.assertExpectedInline(_message_on_fake("layer_dim"), """pairs[1]: Layer dim mismatch: dst.shape[0]=3 vs src.shape[0]=4""")

    def test_window_dims(self):
        self.assertExpectedInline(_message_on_fake("window_dims"), """pairs[1]: Window dims mismatch: dst.shape[2:]=torch.Size([9, 2]) vs src.shape[3:]=torch.Size([9, 3])""")

    def test_same_dtype(self):
        self.assertExpectedInline(_message_on_fake("same_dtype"), """pairs[1]: dst and src must have the same dtype. dst.dtype=torch.float32 src.dtype=torch.float16""")

    def test_shared_sizes(self):
        self.assertExpectedInline(_message_on_fake("shared_sizes"), """Expected every pair to share pairs[0]'s dst.shape[:2]=(3, 7) (layers, cache) and src.shape[1:3]=(5, 4) (spec, draft_tokens), but pairs[1] has dst.shape[:2]=(3, 8) and src.shape[1:3]=(5, 4)""")

    def test_indices_1d(self):
        self.assertExpectedInline(_message_on_fake("indices_1d"), """indices must be 1D: dst_indices_raw.shape=torch.Size([4]) step_indices_raw.shape=torch.Size([4, 1])""")

    def test_indices_length(self):
        self.assertExpectedInline(_message_on_fake("indices_length"), """indices length mismatch: dst_indices_raw.shape[0]=4 vs step_indices_raw.shape[0]=5""")

    def test_indices_dtype(self):
        self.assertExpectedInline(_message_on_fake("indices_dtype"), """indices must be int32 or int64: dst_indices_raw.dtype=torch.float32 step_indices_raw.dtype=torch.int64""")

    def test_indices_device(self):
        self.assertExpectedInline(_message_on_fake("indices_device"), """indices must be on dst's device: dst.device=device(type='cuda', index=0) dst_indices_raw.device=device(type='cuda', index=0) step_indices_raw.device=device(type='cpu')""")

    def test_indices2_together(self):
        self.assertExpectedInline(_message_on_fake("indices2_together"), """Expected dst_indices2_raw and step_indices2_raw both given or both None, but got dst_indices2_raw None and step_indices2_raw given""")

    def test_indices2_1d(self):
        self.assertExpectedInline(_message_on_fake("indices2_1d"), """indices must be 1D: dst_indices2_raw.shape=torch.Size([4]) step_indices2_raw.shape=torch.Size([4, 1])""")

    def test_indices2_length(self):
        self.assertExpectedInline(_message_on_fake("indices2_length"), """indices length mismatch: dst_indices2_raw.shape[0]=4 vs step_indices2_raw.shape[0]=5""")

    def test_indices2_dtype(self):
        self.assertExpectedInline(_message_on_fake("indices2_dtype"), """indices must be int32 or int64: dst_indices2_raw.dtype=torch.float32 step_indices2_raw.dtype=torch.int64""")

    def test_indices2_device(self):
        self.assertExpectedInline(_message_on_fake("indices2_device"), """indices must be on dst's device: dst.device=device(type='cuda', index=0) dst_indices2_raw.device=device(type='cuda', index=0) step_indices2_raw.device=device(type='cpu')""")

    def test_dst_entry_contiguous(self):
        self.assertExpectedInline(_message_on_fake("dst_entry_contiguous"), """pairs[1]: fused_conv_window_scatter_multi: dst entry dims (dims 2..3) must be contiguous; got shape=(3, 7, 9, 2) strides=(252, 36, 4, 2)""")

    def test_src_inside_storage(self):
        self.assertExpectedInline(_message_on_fake("src_inside_storage"), """pairs[1]: Expected src's largest element offset to be < its storage size of 674 elements (4 bytes each), but got 674 (src.shape=(3, 5, 4, 9, 2), src.stride()=(225, 45, 1, 5, 1), src.storage_offset()=0)""")

    def test_dst_inside_storage(self):
        self.assertExpectedInline(_message_on_fake("dst_inside_storage"), """pairs[1]: Expected dst's largest element offset to be < its storage size of 377 elements (4 bytes each), but got 377 (dst.shape=(3, 7, 9, 2), dst.stride()=(126, 18, 2, 1), dst.storage_offset()=0)""")

    def test_every_rule_has_a_pinned_message(self):
        assert_every_rule_pinned(self, contract)  # near misses: tests/test_registry.py

    def test_an_item_that_is_not_a_pair_fails_unpacking(self):
        with fake_mode():
            args = build(contract.valid_spec(DIMS))
            dst, src = args["pairs"][0]
            err = raised(fused_conv_window_scatter_multi, [(dst, src, src)],
                         args["dst_indices_raw"], args["step_indices_raw"])
        self.assertEqual(str(err), "too many values to unpack (expected 2)")

    def test_lists_of_different_lengths_through_the_op_are_refused(self):
        with fake_mode():
            args = op.op_arguments(**build(contract.valid_spec(DIMS)))
            args["srcs"] = args["srcs"][:1]
            err = raised(torch.ops.strictops.fused_conv_window_scatter_multi, **args)
        self.assertEqual(str(err), "zip() argument 2 is shorter than argument 1")

    def test_no_pairs_are_refused_even_without_requests(self):
        dims = contract.Dims(**{**DIMS.__dict__, "n1": 0})
        spec = {**contract.valid_spec(dims), "pairs": []}
        with fake_mode():
            err = raised(fused_conv_window_scatter_multi, **build(spec))
        self.assertIn("Expected 1 to 8 (conv_states, conv_window) pairs, but got 0", str(err))


@settings(SETTINGS, max_examples=examples(25))
@given(data=st.data())
def test_interpreted_kernel_equals_reference(data):
    """Any index values, 1-3 pairs of mixed dims, widths and dtypes, one or two sets, any tile
    size, either program order: exactly the reference's writes, and every ``src`` untouched.
    (All eight pairs: the next test; the interpreter runs every program in Python.)"""
    dims = data.draw(calls_of.dims(device="cpu", max_pairs=3))
    values = calls_of.index_values(data.draw, dims)
    tuning = data.draw(TUNINGS)
    reverse = data.draw(st.booleans())
    args = calls_of.tensors(dims, values, "cpu",
                            torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    expected = op.reference(**args)
    before = [bytes(s.untyped_storage()) for _, s in args["pairs"]]
    op.launch_interpreted(**args, reverse_programs=reverse, **tuning)
    for (got, _), want in zip(args["pairs"], expected):
        assert torch.equal(got, want)
    assert [bytes(s.untyped_storage()) for _, s in args["pairs"]] == before


@pytest.mark.parametrize("reverse_programs", [False, True])
def test_eight_pairs_of_every_dtype(reverse_programs):
    dims = contract.Dims(num_layers=2, cache_size=5, spec_size=3, draft_tokens=2,
                         windows=tuple((3 + k, 1 + k % 4, DTYPES[k % 4])
                                       for k in range(contract.MAX_PAIRS)), n1=3, n2=2)
    values = {"dst_indices_raw": [4, 0, 2], "step_indices_raw": [1, 0, -1],
              "dst_indices2_raw": [0, 3], "step_indices2_raw": [1, 1]}
    args = calls_of.tensors(dims, values, "cpu", torch.Generator().manual_seed(4))
    expected = op.reference(**args)
    op.launch_interpreted(**args, reverse_programs=reverse_programs)
    assert all(torch.equal(d, e) for (d, _), e in zip(args["pairs"], expected))


@pytest.mark.parametrize("reverse_programs", [False, True])
def test_the_second_set_wins_over_the_first_and_the_later_request_within_a_set(reverse_programs):
    gen = torch.Generator().manual_seed(2)
    dst = torch.randn(2, 4, 5, 3, generator=gen)
    src = one.window_view(torch.randn(2, 3, 5, 2 + 3 - 1, generator=gen), 2, 3)
    slots1, steps1 = torch.tensor([1, 1, 2]), torch.tensor([0, 1, 1])  # 1 -> request 1
    slots2, steps2 = torch.tensor([2, 3]), torch.tensor([0, -1])  # 2 -> set 2's request 0
    op.launch_interpreted([(dst, src)], slots1, steps1, slots2, steps2, block_bytes=16,
                          reverse_programs=reverse_programs)
    assert torch.equal(dst[:, 1], src[:, 1, 1]) and torch.equal(dst[:, 2], src[:, 0, 0])


def test_equals_the_one_pair_op_per_pair_and_set():
    args = op.example_inputs("cpu", True, torch.Generator().manual_seed(3))
    expected = [d.clone() for d, _ in args["pairs"]]
    for dst, (_, src) in zip(expected, args["pairs"]):
        one.launch_interpreted(dst, src, args["dst_indices_raw"], args["step_indices_raw"])
        one.launch_interpreted(dst, src, args["dst_indices2_raw"], args["step_indices2_raw"])
    op.launch_interpreted(**args)
    assert all(torch.equal(d, e) for (d, _), e in zip(args["pairs"], expected))


# --------------------------------------------------------------------------------------------
# GPU


@gpu
@settings(SETTINGS, max_examples=examples(30))
@given(data=st.data())
def test_gpu_op_equals_reference(data):
    dims = data.draw(calls_of.dims(device="cuda"))
    values = calls_of.index_values(data.draw, dims)
    args = calls_of.tensors(dims, values, "cuda",
                            torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    expected = op.reference(**args)
    fused_conv_window_scatter_multi(**args)
    assert all(torch.equal(d, e) for (d, _), e in zip(args["pairs"], expected))


@gpu
@settings(SETTINGS, max_examples=examples(30))
@given(call=strategies.calls(calls_of.OP, device="cuda:0", valid=False))
def test_gpu_real_tensors_raise_the_contract_error_and_write_nothing(call):
    args, kwargs = call.build()
    dsts = [p[0] for p in args[0] if len(p)]
    before = [bytes(d.untyped_storage().cpu()) for d in dsts]
    err = raised(fused_conv_window_scatter_multi, *args, **kwargs)
    assert (type(err), str(err)) == call.expected_error(args, kwargs)
    assert [bytes(d.untyped_storage().cpu()) for d in dsts] == before


@gpu
@pytest.mark.parametrize("second_set", [False, True])
@pytest.mark.parametrize("dims", [(2048,), (2048, 1024), (512, 96, 300)])
def test_gpu_bit_equal_to_sglang_original(sglang_mamba, second_set, dims):
    """sglang's original on bf16 pairs with K = 4 and distinct slots across both sets (its
    result with a slot named twice depends on program order)."""
    sgl = sglang_mamba
    gen = torch.Generator(device="cuda").manual_seed(11)
    layers, cache, spec, draft, km1, n = 4, 64, 16, 4, 3, 16
    pairs = []
    for dim in dims:
        dst = torch.randn(layers, cache, dim, km1, device="cuda", generator=gen).to(torch.bfloat16)
        shared = torch.randn(layers, spec, dim, draft + km1 - 1, device="cuda", generator=gen)
        pairs.append((dst, one.window_view(shared.to(torch.bfloat16), draft, km1)))
    slots = torch.randperm(cache, device="cuda", generator=gen)[:2 * n].to(torch.int32)
    steps = torch.randint(0, draft, (2 * n,), device="cuda", generator=gen)
    steps[::5] = -1
    steps[1] = draft
    slots[2] = cache
    sets = [slots[:n], steps[:n]] + ([slots[n:], steps[n:]] if second_set else [])
    theirs = [(d.clone(), s) for d, s in pairs]
    sgl.fused_conv_window_scatter_multi(theirs, *sets)
    fused_conv_window_scatter_multi(pairs, *sets)
    for (ours, _), (want, _) in zip(pairs, theirs):
        assert torch.equal(ours, want)


def _sm90_ptx(size_hints: bool) -> str:
    """The multi kernel's PTX for sm_90 with two bf16 pairs, compiled without a GPU: pointers
    16-byte aligned, and (``size_hints``) every size and stride a multiple of 16, as Triton's
    specialisation marks them when they are."""
    import triton
    from triton.backends.compiler import GPUTarget

    kernel = op._scatter_multi_kernel
    constexprs = {"NUM_PAIRS": 2, "BLOCK": 1024, "LAYERS": 2, "RUN": 8, "STREAM": False,
                  "I32_REACH": one.I32_REACH, "SCAN": one.SCAN}
    signature, hinted = {}, []
    for p in kernel.params:
        name, pair = p.name, p.name.rstrip("0123456789").rstrip("_")
        index = p.name[len(pair):].lstrip("_")
        if name in constexprs:
            signature[name] = "constexpr"
        elif index and int(index) >= 2 and pair in ("dst", "src", "dim", "km1", "dl", "ds", "sl",
                                                     "sr", "ss", "sd", "sw"):
            signature[name], constexprs[name] = "constexpr", None
        elif name.endswith("_ptr"):
            signature[name] = "*i32"
            hinted.append(p.num)
        elif pair in ("dst", "src"):
            signature[name] = "*bf16"
            hinted.append(p.num)
        else:
            signature[name] = "i32"
            if size_hints and pair in ("dim", "dl", "ds", "sl", "sr", "sd"):
                hinted.append(p.num)
    source = triton.compiler.ASTSource(
        fn=kernel, signature=signature,
        constexprs={(kernel.arg_names.index(k),): v for k, v in constexprs.items()},
        attrs={(i,): [["tt.divisibility", 16]] for i in hinted})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


def test_vector_stores_only_where_the_specialisation_proves_them_aligned():
    """A pair whose sizes Triton cannot prove multiples of 16 (an entry of an odd slot need not
    be 16-byte aligned) is stored element by element; with every size proven, in 16-byte
    vectors. (A hint that reached the unaligned case once faulted on the GPU.)"""
    assert "st.global.v4" not in _sm90_ptx(size_hints=False)
    assert "st.global.v4" in _sm90_ptx(size_hints=True)
