"""track_mamba_states_all_layers / _if_needed: contract messages, eager/fake parity, numerics.

CPU (CI): messages on fake CUDA tensors pinned with expecttest (near misses on the eager and
fake paths: tests/test_contracts.py); the kernel under the
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

from strictops.meta.mamba import track_states as contract
from strictops.meta import strategies
from strictops.meta.strategies import mamba_track_states as calls_of
from strictops.meta.testing import (
    examples,
    HAS_CUDA,
    HAS_TWO_GPUS,
    anchor_module,
    build,
    fake_mode,
    assert_every_rule_pinned,
    gpu,
    near_miss_message,
    raised,
)
from strictops.ops import track_mamba_states_all_layers, track_mamba_states_if_needed
from strictops.ops.mamba import track_states as op
from strictops.ops._runtime.interpret import interpreted

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIMS = contract.Dims(num_layers=3, pool_size=9, conv_state=(4, 2), ssm_state=(2, 5, 3), batch=6,
                     batch_size=5)


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
        with fake_mode():
            err = raised(track_mamba_states_all_layers, **build(spec))
        assert "but got batch_size=-1" in str(err)

    def test_if_needed_reports_the_pool_rules(self):
        spec = contract.valid_spec(DIMS)
        with fake_mode():
            args = build(spec)
            args.pop("conv_states_pool")
            args["conv_states"] = torch.empty((9, 4, 2), device="cuda:0")
            args.pop("ssm_states_pool")
            args["ssm_states"] = torch.empty_strided((9, 2, 5, 3), (60, 30, 6, 2),
                                                     device="cuda:0")
            err = raised(track_mamba_states_if_needed, **args)
        assert str(err).startswith("Expected ssm_states_pool entry dims (dims 2..4) contiguous")


@settings(SETTINGS, max_examples=examples(50))
@given(data=st.data())
def test_interpreted_kernel_equals_reference(data):
    d = data.draw(calls_of.dims(device="cpu"))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    args = calls_of.values(data.draw, d, "cpu", gen)
    tuning = data.draw(st.sampled_from([{"chunk_bytes": 16, "block_bytes": 8},
                                        {"chunk_bytes": 64, "block_bytes": 32},
                                        {"chunk_bytes": 64, "block_elements": 4}, {}]))
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
                          programs=3, chunk_bytes=8, block_bytes=4)
    assert torch.equal(conv, want[0]) and torch.equal(ssm, want[1])


@pytest.mark.parametrize("reverse_programs", [False, True])
def test_lone_writer_of_a_block_loses_to_a_later_block(reverse_programs):
    """The only valid row of the first 64-row block skips comparing within its block, never
    with later blocks: row 66 takes row 3's track slot, row 5's slot is its own."""
    n = op.SCAN + 6
    conv, ssm = torch.randn(2, 12, 3), torch.randn(2, 12, 2, 2)
    src = torch.zeros(n, dtype=torch.int64)
    dst = torch.full((n,), 10, dtype=torch.int32)
    mask = torch.zeros(n, dtype=torch.int64)
    mask[[3, 5, op.SCAN + 2]] = 2**32  # a wide value: tracked
    src[[3, 5, op.SCAN + 2]] = torch.tensor([1, 2, 4])
    dst[5], dst[3] = 20, 8  # row 5: out of range, so row 3 is its block's only valid row
    dst[op.SCAN + 2] = 8
    want = (conv.clone(), ssm.clone())
    want[0][:, 8], want[1][:, 8] = conv[:, 4], ssm[:, 4]
    op.launch_interpreted(conv, ssm, src, mask, dst, n, reverse_programs=reverse_programs,
                          programs=4, chunk_bytes=8, block_bytes=4)
    assert torch.equal(conv, want[0]) and torch.equal(ssm, want[1])


def _sm90_build(conv: str, ssm: str, index: str, mask: str, maxnreg) -> tuple:
    """``(registers, spilled bytes, TTGIR, SASS lines)`` of the kernel compiled for sm_90
    without a GPU, with the default tuning for ``conv`` / ``ssm`` element types: pointers,
    entry sizes and strides marked multiples of 16, as Triton's specialisation marks them in
    serving (``ptxas -v`` and ``cuobjdump -sass`` from the Triton wheel)."""
    import os
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas

    fn, tuning = op._track_kernel, op.TUNING
    size = {"bf16": 2, "fp32": 4}
    blocks = {t: tuning["block_bytes"] // size[t] for t in (conv, ssm)}
    constexprs = {"CONV_BLOCK": blocks[conv], "SSM_BLOCK": blocks[ssm],
                  "CONV_CHUNK": max(blocks[conv], tuning["chunk_bytes"] // size[conv]),
                  "SSM_CHUNK": max(blocks[ssm], tuning["chunk_bytes"] // size[ssm]),
                  "SCAN": op.SCAN, "TILE": op.TILE, "LOAD_POLICY": tuning["load_policy"],
                  "STORE_POLICY": tuning["store_policy"]}
    pointers = {"conv_ptr": conv, "ssm_ptr": ssm, "src_ptr": index, "dst_ptr": index,
                "mask_ptr": mask}
    hinted = [*pointers, "conv_numel", "ssm_numel", "conv_layer_stride", "conv_slot_stride",
              "ssm_layer_stride", "ssm_slot_stride"]
    signature = {name: "constexpr" if name in constexprs else
                 f"*{pointers[name]}" if name in pointers else "i32" for name in fn.arg_names}
    source = triton.compiler.ASTSource(
        fn=fn, signature=signature,
        constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
        attrs={(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in hinted})
    options = {"num_warps": tuning["num_warps"]}
    if maxnreg:
        options["maxnreg"] = maxnreg
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/k.ptx", "w") as f:
            f.write(compiled.asm["ptx"])
        info = subprocess.run([ptxas, "-arch=sm_90a", "-v", f"{tmp}/k.ptx", "-o",
                               f"{tmp}/k.cubin"], capture_output=True, text=True, check=True)
        sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "cuobjdump"), "-sass",
                               f"{tmp}/k.cubin"], capture_output=True, text=True,
                              check=True).stdout
    registers = int(re.search(r"Used (\d+) registers", info.stderr).group(1))
    spilled = sum(map(int, re.findall(r"(\d+) bytes spill", info.stderr)))
    lines = [line for line in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/", line)]
    return registers, spilled, compiled.asm["ttgir"], lines


def test_tuning_follows_the_triton_version_as_numbers():
    """``TUNING`` is ``_tuning`` of the running Triton's ``(major, minor)``: before 3.7 four
    programs per SM under a 64-register cap, from 3.7 on two under 128 (either way 8-warp
    programs that fill a 64K-register SM). Versions compare as numbers: 3.10 is after 3.7."""
    import triton

    assert op._triton_version("3.6.0") == (3, 6)
    assert op._triton_version("3.10.1+git1a2b3c4") == (3, 10)
    assert op._triton_version("4.0.0rc1") == (4, 0)
    assert op.TUNING == op._tuning(op._triton_version(triton.__version__))
    for version, residency in {(3, 5): (4, 64), (3, 6): (4, 64), (3, 7): (2, 128),
                               (3, 9): (2, 128), (3, 10): (2, 128), (4, 0): (2, 128)}.items():
        tuning = op._tuning(version)
        assert (tuning["programs_per_sm"], tuning["maxnreg"]) == residency, version
        assert tuning["num_warps"] * 32 * tuning["programs_per_sm"] * tuning["maxnreg"] == 65536
        assert {k: v for k, v in tuning.items() if k not in ("programs_per_sm", "maxnreg")} == {
            "chunk_bytes": 32768, "block_bytes": 32768, "block_elements": None, "num_warps": 8,
            "load_policy": "evict_last", "store_policy": "evict_first"}


@pytest.mark.parametrize("conv, ssm, index, mask", [("bf16", "fp32", "i32", "i1"),
                                                    ("bf16", "fp32", "i64", "i64"),
                                                    ("fp32", "bf16", "i64", "i32")])
def test_kernel_on_sm90_keeps_its_programs_resident_and_copies_in_registers(conv, ssm, index,
                                                                            mask):
    """Without a GPU: compiled for sm_90 with the running Triton's default tuning
    (``TUNING``), every program of the grid (``programs_per_sm`` of ``num_warps`` warps) fits
    on a 64K-register SM at once; the copies use 16-byte accesses, loads evict-last, go from
    load to store in registers (no layout change through shared memory between them), and no
    spill lies between a chunk's first load and last store. A call that marks no row ends
    after one load, the first block's mask, which comes before the slot loads and any of the
    walk's arithmetic (a division) or a spill."""
    import re

    tuning = op.TUNING
    registers, spilled, ttgir, sass = _sm90_build(conv, ssm, index, mask, tuning["maxnreg"])
    per_warp = -(-registers * 32 // 256) * 256  # allocated per warp in 256-register units
    assert per_warp * tuning["num_warps"] * tuning["programs_per_sm"] <= 65536, registers
    assert not re.search(r"convert_layout .*tensor<\d{4,}x", ttgir)
    copy = re.compile(r"(LDG\.E\.EL|STG\.E(\.EF|\.EL)?)\.128")  # any store policy
    copies = [i for i, line in enumerate(sass) if copy.search(line)]
    assert copies and spilled <= 64
    assert not any(re.search(r"\b(LDL|STL)\b", line) for line in sass[copies[0]:copies[-1]])
    assert not any("LDG.E.128" in line for line in sass)  # every copy load evict-last
    first_exit = next(i for i, line in enumerate(sass) if "EXIT" in line)
    head = sass[:first_exit]
    assert sum("LDG" in line for line in head) == 1  # the mask's
    assert not any(re.search(r"MUFU|\b(LDL|STL)\b", line) for line in head)


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
@settings(SETTINGS, max_examples=examples(40))
@given(data=st.data())
def test_gpu_op_equals_reference(data):
    d = data.draw(calls_of.dims(device="cuda", max_entry=5000))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    args = calls_of.values(data.draw, d, "cuda", gen)
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
@pytest.mark.parametrize("tuning", [{}, {"maxnreg": None}, {"block_bytes": 16384},
                                    {"load_policy": "", "store_policy": ""},
                                    {"store_policy": "evict_last"},
                                    {"block_elements": 8192},
                                    {"chunk_bytes": 16384, "block_bytes": 16384},
                                    {"chunk_bytes": 256, "block_bytes": 64}])
@pytest.mark.parametrize("programs", [1, 264, 528])
def test_gpu_tuning_variants_equal_reference(tuning, programs):
    """The tunings the benchmark A/Bs (and a small-chunk one) give the reference's bits on
    64 rows with out-of-range and duplicate track slots, for any program count."""
    gen = torch.Generator().manual_seed(programs)
    args = op.example_inputs("cuda", False, gen)
    n = args["cache_indices"].shape[0]
    args["mamba_track_indices"][n - 1] = args["mamba_track_indices"][2 * n // 3]
    expected = op.reference(**args)
    op._launch(op._track_kernel, programs, args["conv_states_pool"], args["ssm_states_pool"],
               args["cache_indices"], args["mamba_track_mask"], args["mamba_track_indices"],
               args["batch_size"], **tuning)
    assert torch.equal(args["conv_states_pool"], expected[0])
    assert torch.equal(args["ssm_states_pool"], expected[1])


@gpu
@settings(SETTINGS, max_examples=examples(20))
@given(call=strategies.calls(calls_of.OP, device="cuda:0", valid=False))
def test_gpu_real_tensors_raise_the_contract_error_and_write_nothing(call):
    args, kwargs = call.build()
    before = args[1].clone()
    err = raised(track_mamba_states_all_layers, *args, **kwargs)
    assert (type(err), str(err)) == call.expected_error(args, kwargs)
    assert torch.equal(args[1], before)
