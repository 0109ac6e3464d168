"""fused_mamba_state_scatter_with_mask: contract messages, eager/fake parity, kernel numerics.

CPU (CI): messages on fake CUDA tensors pinned with expecttest; near misses drawn from the
contract raise the same error on the eager path (concrete sizes) and the fake path (symbolic
sizes); the kernel under the Triton interpreter equals the reference exactly for any index
values. GPU (``-m gpu``): the same numerics and near misses on real CUDA tensors.
"""

from __future__ import annotations

import unittest

import expecttest
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strictops.meta.mamba import state_scatter as contract
from strictops.meta import strategies
from strictops.meta.strategies import mamba_state_scatter as calls_of
from strictops.meta.testing import (
    examples,
    HAS_CUDA,
    HAS_TWO_GPUS,
    assert_every_rule_pinned,
    capture_cuda_graph,
    gpu,
    near_miss_message,
    raised,
)
from strictops.ops import fused_mamba_state_scatter_with_mask
from strictops.ops.mamba import state_scatter as op

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIMS = contract.Dims(num_layers=3, cache_size=7, spec_size=5, draft_tokens=4,
                     state_shape=(2, 6), total_requests=4)


def _message_on_fake(rule: str, dims: contract.Dims = DIMS) -> str:
    return near_miss_message(fused_mamba_state_scatter_with_mask, contract, rule, dims)


class TestMessages(expecttest.TestCase):
    """Every rule (the original's and the added ones) on fake CUDA tensors, message pinned."""

    @unittest.skipIf(HAS_CUDA and not HAS_TWO_GPUS, "a real single-GPU machine has no cuda:1")
    def test_same_device(self):  # cuda:0 against cuda:1, as a misplaced tensor in serving
        self.assertExpectedInline(_message_on_fake("same_device"), """dst and src must be on the same device. dst.device=device(type='cuda', index=0) src.device=device(type='cuda', index=1)""")

    def test_cuda(self):
        self.assertExpectedInline(_message_on_fake("cuda"), """fused_mamba_state_scatter_with_mask only supports CUDA tensors.""")

    def test_ranks(self):
        self.assertExpectedInline(_message_on_fake("ranks"), """Unexpected tensor ranks: dst.ndim=1 src.ndim=5""")

    def test_layer_dim(self):
        self.assertExpectedInline(_message_on_fake("layer_dim"), """Layer dimension mismatch: dst.shape[0]=3 vs src.shape[0]=4""")

    def test_trailing_dims(self):
        self.assertExpectedInline(_message_on_fake("trailing_dims"), """Trailing dims mismatch: dst.shape[2:]=torch.Size([2, 6]) vs src.shape[3:]=torch.Size([2, 6, 3])""")

    def test_same_dtype(self):
        self.assertExpectedInline(_message_on_fake("same_dtype"), """dst and src must have the same dtype. dst.dtype=torch.float32 src.dtype=torch.float16""")

    def test_indices_1d(self):
        self.assertExpectedInline(_message_on_fake("indices_1d"), """indices must be 1D: dst_indices_raw.shape=torch.Size([4]) step_indices_raw.shape=torch.Size([4, 1])""")

    def test_src_indices_1d(self):
        self.assertExpectedInline(_message_on_fake("src_indices_1d"), """indices must be 1D: dst_indices_raw.shape=torch.Size([4]) src_indices_raw.shape=torch.Size([1, 4])""")

    def test_indices_length(self):
        self.assertExpectedInline(_message_on_fake("indices_length"), """indices length mismatch: dst_indices_raw.shape[0]=4 vs step_indices_raw.shape[0]=5""")

    def test_src_indices_length(self):
        self.assertExpectedInline(_message_on_fake("src_indices_length"), """indices length mismatch: dst_indices_raw.shape[0]=4 vs src_indices_raw.shape[0]=6""")

    def test_indices_dtype(self):
        self.assertExpectedInline(_message_on_fake("indices_dtype"), """indices must be int32 or int64: dst_indices_raw.dtype=torch.float32 step_indices_raw.dtype=torch.int64""")

    def test_src_indices_dtype(self):
        self.assertExpectedInline(_message_on_fake("src_indices_dtype"), """indices must be int32 or int64: dst_indices_raw.dtype=torch.int64 src_indices_raw.dtype=torch.int16""")

    def test_indices_device(self):
        self.assertExpectedInline(_message_on_fake("indices_device"), """indices must be on dst's device: dst.device=device(type='cuda', index=0) dst_indices_raw.device=device(type='cuda', index=0) step_indices_raw.device=device(type='cpu')""")

    def test_src_indices_device(self):
        self.assertExpectedInline(_message_on_fake("src_indices_device"), """indices must be on dst's device: dst.device=device(type='cuda', index=0) src_indices_raw.device=device(type='cpu')""")

    def test_dst_entry_contiguous(self):
        self.assertExpectedInline(_message_on_fake("dst_entry_contiguous"), """fused_mamba_state_scatter_with_mask: dst entry dims (dims 2..3) must be contiguous; got shape=(3, 7, 2, 6) strides=(168, 24, 12, 2)""")

    def test_src_contiguous(self):
        self.assertExpectedInline(_message_on_fake("src_contiguous"), """src tensor must be contiguous""")

    def test_every_rule_has_a_pinned_message(self):
        assert_every_rule_pinned(self, contract)  # near misses: tests/test_registry.py

    def test_zero_requests_are_still_validated(self):
        dims = contract.Dims(**{**DIMS.__dict__, "total_requests": 0})
        self.assertIn("Layer dimension mismatch", _message_on_fake("layer_dim", dims))


def _fill(dims: contract.Dims, values: dict, device: str, gen: torch.Generator) -> dict:
    """Real tensors for ``dims``: random state data (never zeros) and the drawn index values."""
    spec = contract.valid_spec(dims)
    args = {}
    for name in ("dst", "src"):
        s = spec[name]
        if s.dtype.is_floating_point:
            t = torch.randn(s.shape, generator=gen).to(s.dtype)
        else:
            t = torch.randint(-100, 100, s.shape, generator=gen).to(s.dtype)
        args[name] = t.to(device)
    for name, vals in values.items():
        s = spec[name]
        args[name] = None if vals is None else torch.tensor(vals, dtype=s.dtype, device=device)
    return args


KERNELS = tuple(op.PATHS)  # "persistent", "per_chunk" and "layer_loop" (the default)


def _tunings(kernel: str):
    """Tunings of ``kernel`` that reach its edge cases on interpreter-sized calls: several
    chunks an entry, requests read and compared in blocks of 2 (the persistent kernel), one
    program or a few doing many items, layer groups and tiles that do not divide the layers
    or each other (the layer-loop kernel)."""
    if kernel == "per_chunk":
        return st.sampled_from([{}, {"block_bytes": 16}, {"block_bytes": 64}])
    if kernel == "layer_loop":
        return st.fixed_dictionaries({
            "block_bytes": st.sampled_from([16, 64, op.TUNING["layer_loop"]["block_bytes"]]),
            "layers_per_program": st.sampled_from([1, 2, 3, 5, 36]),
            "layer_tile": st.sampled_from([1, 2, 4]),
        })
    return st.fixed_dictionaries({
        "chunk_bytes": st.sampled_from([16, 64, op.TUNING["persistent"]["chunk_bytes"]]),
        "programs": st.integers(1, 7),
        "scan": st.sampled_from([2, 4, op.SCAN]),
        "tile": st.sampled_from([2, op.TILE]),
    })


@settings(SETTINGS, max_examples=examples(120))
@given(data=st.data())
def test_interpreted_kernel_equals_reference(data):
    """Any index values (negative, out of range, near INT32_MAX, duplicate slots): each kernel
    writes exactly what the reference writes and reads nothing it should not."""
    dims = data.draw(calls_of.dims(device="cpu"))
    values = calls_of.index_values(data.draw, dims)
    kernel = data.draw(st.sampled_from(KERNELS))
    tuning = data.draw(_tunings(kernel))
    reverse = data.draw(st.booleans())  # the result must not depend on program order
    args = _fill(dims, values, "cpu", torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    expected = op.reference(**args)
    src_before = args["src"].clone()
    op.launch_interpreted(**args, reverse_programs=reverse, kernel=kernel, **tuning)
    assert torch.equal(args["dst"], expected)
    assert torch.equal(args["src"], src_before)


@pytest.mark.parametrize("kernel", KERNELS)
def test_interpreted_kernel_reads_strided_index_tensors_in_place(kernel):
    """Index tensors with a stride are read through it, not copied."""
    gen = torch.Generator().manual_seed(0)
    dst, src = torch.randn(2, 6, 3, generator=gen), torch.randn(2, 4, 3, 3, generator=gen)
    slots = torch.tensor([5, -1, 0, -1, 3, -1, 2, -1], dtype=torch.int32)[::2]
    steps = torch.tensor([2, 9, 0, 9, 9, 9, 1, 9], dtype=torch.int64)[::2]
    expected = op.reference(dst, src, slots, steps)
    op.launch_interpreted(dst, src, slots, steps, kernel=kernel)
    assert torch.equal(dst, expected)
    # slot 3's request asked for step 9 >= draft_tokens: skipped; the other three were written.
    assert torch.equal(dst[:, 5], src[:, 0, 2]) and torch.equal(dst[:, 2], src[:, 3, 1])


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("reverse_programs", [False, True])
def test_duplicate_slots_last_valid_request_wins(kernel, reverse_programs):
    gen = torch.Generator().manual_seed(1)
    dst, src = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 4, 2, 4, generator=gen)
    slots = torch.tensor([1, 1, 1, 1])
    steps = torch.tensor([0, 1, 1, -1])  # request 3 is rejected: request 2 is the last writer
    op.launch_interpreted(dst, src, slots, steps, reverse_programs=reverse_programs,
                          kernel=kernel)
    assert torch.equal(dst[:, 1], src[:, 2, 1])


@pytest.mark.parametrize("reverse_programs", [False, True])
@pytest.mark.parametrize("programs", [1, 3, 64])
def test_persistent_duplicates_across_blocks_and_many_items(reverse_programs, programs):
    """More requests than one block of the default ``SCAN``, duplicate slots whose writers lie
    in different blocks (and in different compared tiles), entries of several chunks, and
    programs doing one item or many: equal to the reference, the later request winning."""
    gen = torch.Generator().manual_seed(2)
    n, cache = 3 * op.SCAN + 5, 40
    dst, src = torch.randn(3, cache, 2, 9, generator=gen), torch.randn(3, n, 2, 2, 9,
                                                                      generator=gen)
    slots = torch.randint(0, cache - 1, (n,), generator=gen)  # duplicates among them too
    slots[slots == 7] = cache - 1
    steps = torch.randint(-1, 2, (n,), generator=gen)
    slots[[0, op.SCAN + 1, 2 * op.SCAN + 2, n - 1]] = 7  # one slot, four blocks
    steps[[0, op.SCAN + 1, 2 * op.SCAN + 2]] = 1
    steps[n - 1] = 2  # out of range: the third of them is the last writer
    expected = op.reference(dst, src, slots, steps)
    op.launch_interpreted(dst, src, slots, steps, reverse_programs=reverse_programs,
                          kernel="persistent", chunk_bytes=32, programs=programs)
    assert torch.equal(dst, expected)
    assert torch.equal(dst[:, 7], src[:, 2 * op.SCAN + 2, 1])


def test_persistent_default_tuning_at_a_moderate_shape():
    """The default item size (32 KiB: several items an entry, 16-byte vectors), ``SCAN`` and
    ``TILE`` on 48 requests with every kind of bad index and a duplicate slot, 13 programs in
    reverse order: the reference's bits."""
    args = op.example_inputs("cpu", False, torch.Generator().manual_seed(0))
    expected = op.reference(**args)
    op.launch_interpreted(**args, reverse_programs=True, kernel="persistent", programs=13)
    assert torch.equal(args["dst"], expected)


def _sm90_registers(kernel: str, dtype: str, index_dtype: str, has_src_indices: bool,
                    unit_index_strides: bool = False) -> tuple:
    """``(registers, spilled bytes, 16-byte loads, 16-byte stores)`` of a kernel compiled for
    sm_90 without a GPU with its default tuning: pointers, entry size and strides marked
    multiples of 16, as Triton's specialisation marks them in serving (``ptxas -v`` on its
    PTX); with ``unit_index_strides`` the index tensors' strides are the constant 1, as Triton
    specialises contiguous index tensors."""
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas

    path = op.PATHS[kernel]
    fn, tuning = path.jit_fn, op.TUNING[kernel]
    esize = {"fp32": 4, "bf16": 2, "i8": 1}[dtype]
    if kernel == "persistent":
        constexprs = {"CHUNK": tuning["chunk_bytes"] // esize, "SCAN": op.SCAN, "TILE": op.TILE}
    else:
        constexprs = {"BLOCK": tuning["block_bytes"] // esize, "SCAN": op.SCAN_PER_CHUNK}
    if kernel == "layer_loop":
        constexprs.update(LAYERS_PER_PROGRAM=tuning["layers_per_program"],
                          LAYER_TILE=tuning["layer_tile"])
    constexprs["HAS_SRC_INDICES"] = has_src_indices
    if unit_index_strides:
        constexprs.update(dst_idx_stride=1, step_idx_stride=1, src_idx_stride=1)
    hinted = ("dst_ptr", "src_ptr", "dst_idx_ptr", "step_idx_ptr", "src_idx_ptr", "entry_numel",
              "dst_layer_stride", "dst_slot_stride")
    signature = {name: "constexpr" if name in constexprs else
                 f"*{dtype}" if name in ("dst_ptr", "src_ptr") else
                 f"*{index_dtype}" if name.endswith("_ptr") else "i32"
                 for name in fn.arg_names}
    source = triton.compiler.ASTSource(
        fn=fn, signature=signature,
        constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
        attrs={(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in hinted
               if k not in constexprs})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": tuning["num_warps"]})
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/k.ptx", "w") as f:
            f.write(compiled.asm["ptx"])
        info = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f"{tmp}/k.ptx", "-o",
                               f"{tmp}/k.cubin"], capture_output=True, text=True, check=True)
    registers = int(re.search(r"Used (\d+) registers", info.stderr).group(1))
    spilled = sum(map(int, re.findall(r"(\d+) bytes spill", info.stderr)))
    ptx = compiled.asm["ptx"]
    return registers, spilled, ptx.count("ld.global.v4"), ptx.count("st.global.v4")


@pytest.mark.parametrize("dtype, index_dtype, has_src_indices",
                         [("fp32", "i32", False), ("bf16", "i64", True)])
def test_persistent_kernel_fits_its_programs_per_sm_on_sm90(dtype, index_dtype,
                                                           has_src_indices):
    """Without a GPU: the persistent kernel compiled for sm_90 spills nothing, copies with
    16-byte loads, and its registers let every program of its grid (``programs_per_sm`` of
    ``num_warps`` warps) be resident at once on a 64K-register SM; a program that is not
    would run its whole share after the others."""
    registers, spilled, vector_loads, _ = _sm90_registers("persistent", dtype, index_dtype,
                                                          has_src_indices)
    tuning = op.TUNING["persistent"]
    per_warp = -(-registers * 32 // 256) * 256  # allocated per warp in 256-register units
    assert spilled == 0 and vector_loads > 0
    assert per_warp * tuning["num_warps"] * tuning["programs_per_sm"] <= 65536, registers


# Registers of the layer-loop kernel at its default tuning, at most: 8 programs of 4 warps
# share an SM (64 x 128 x 8 = 64K), each with one [4, 4 KiB] tile in flight. ptxas gives 56-62
# for sm_90 (docs/design/mamba_state_scatter.md#layer-loop).
LAYER_LOOP_MAX_REGISTERS = 64


@pytest.mark.parametrize("unit_index_strides", [False, True])
@pytest.mark.parametrize("dtype, index_dtype, has_src_indices",
                         [("fp32", "i32", False), ("fp32", "i64", True), ("bf16", "i64", True),
                          ("i8", "i32", False)])
def test_layer_loop_kernel_copies_in_16_byte_vectors_without_spills_on_sm90(
        dtype, index_dtype, has_src_indices, unit_index_strides):
    """Without a GPU: the layer-loop kernel compiled for sm_90 spills nothing, keeps its
    registers within ``LAYER_LOOP_MAX_REGISTERS``, and copies a whole ``[LAYER_TILE, BLOCK]``
    tile per step with 16-byte loads and stores only (every thread's share of each layer's
    chunk)."""
    registers, spilled, vector_loads, vector_stores = _sm90_registers(
        "layer_loop", dtype, index_dtype, has_src_indices, unit_index_strides)
    tuning = op.TUNING["layer_loop"]
    vectors = tuning["layer_tile"] * tuning["block_bytes"] // (16 * 32 * tuning["num_warps"])
    assert spilled == 0 and registers <= LAYER_LOOP_MAX_REGISTERS, (registers, spilled)
    assert vector_loads == vector_stores == vectors, (vector_loads, vector_stores)


@pytest.mark.parametrize("reverse_programs", [False, True])
@pytest.mark.parametrize("layers, layers_per_program, layer_tile",
                         [(5, 2, 4), (5, 3, 2), (7, 12, 4), (7, 4, 4), (3, 1, 1), (37, 12, 4)])
def test_layer_loop_layer_groups_and_tiles_that_do_not_divide(reverse_programs, layers,
                                                              layers_per_program, layer_tile):
    """Layer counts that are not a multiple of the group (the last group short), groups not a
    multiple of the tile (the last tile of each group masked), a group wider than the model,
    with duplicate slots and invalid requests: every layer written, none past the last, as the
    reference."""
    gen = torch.Generator().manual_seed(layers * 100 + layers_per_program * 10 + layer_tile)
    n, cache = 9, 6
    dst = torch.randn(layers, cache, 3, 8, generator=gen)
    src = torch.randn(layers, n, 3, 3, 8, generator=gen)
    slots = torch.tensor([0, 5, 2, 2, -1, 5, 3, 6, 1], dtype=torch.int32)
    steps = torch.tensor([1, 2, 0, 2, 1, -1, 3, 0, 2])
    expected = op.reference(dst, src, slots, steps)
    op.launch_interpreted(dst, src, slots, steps, reverse_programs=reverse_programs,
                          kernel="layer_loop", block_bytes=64,
                          layers_per_program=layers_per_program, layer_tile=layer_tile)
    assert torch.equal(dst, expected)
    assert torch.equal(dst[:, 2], src[:, 3, 2]) and torch.equal(dst[:, 5], src[:, 1, 2])


def test_layer_loop_default_tuning_at_a_moderate_shape():
    """The default tuning (4 KiB chunks, 16-byte vectors, a group of 12 layers wider than the
    model's 4, one tile of 4) on 48 requests with every kind of bad index and a duplicate
    slot, in reverse program order: the reference's bits."""
    args = op.example_inputs("cpu", False, torch.Generator().manual_seed(0))
    expected = op.reference(**args)
    op.launch_interpreted(**args, reverse_programs=True, kernel="layer_loop")
    assert torch.equal(args["dst"], expected)


def test_layer_loop_grid_is_requests_times_chunks_by_layer_groups():
    dst, src = torch.randn(37, 8, 1000), torch.randn(37, 5, 2, 1000)
    slots = torch.zeros(5, dtype=torch.int32)
    grid, _ = op._layer_loop_arguments(dst, src, slots, slots, None, block_bytes=1024,
                                       layers_per_program=12)
    assert grid == (5 * 4, 4, 1)  # 4 chunks of 256 floats; layers 0-11, 12-23, 24-35, 36


def test_kernel_variant_switches_the_kernel_for_a_block_only():
    gen = torch.Generator().manual_seed(9)
    dst, src = torch.randn(2, 4, 3, generator=gen), torch.randn(2, 3, 2, 3, generator=gen)
    slots, steps = torch.tensor([2, 0, 2]), torch.tensor([1, -1, 0])
    expected = op.reference(dst, src, slots, steps)
    default = op.TUNING["kernel"]
    with op.kernel_variant("per_chunk"):
        assert op.TUNING["kernel"] == "per_chunk"
        op.launch_interpreted(dst, src, slots, steps, reverse_programs=True)
    assert op.TUNING["kernel"] == default and torch.equal(dst, expected)
    with pytest.raises(ValueError, match="Expected a kernel in"):
        with op.kernel_variant("per_request"):
            pass


_INVALID = {  # (slot, step, row) of a request that must not write, one broken index each
    "negative slot": (-1, 0, 0), "slot past the cache": (5, 0, 0), "negative step": (0, -1, 0),
    "step past the draft": (0, 2, 0), "negative row": (0, 0, -1), "row past spec": (0, 0, 3),
    "INT32_MAX slot": (2**31 - 1, 0, 0), "INT32_MIN step": (0, -(2**31), 0),
    "2**40 row": (0, 0, 2**40),
}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_all_invalid_requests_write_nothing(kernel, index_dtype):
    """Every request invalid, each in its own way (int32 tensors hold what fits): ``dst``
    unchanged, bit for bit."""
    gen = torch.Generator().manual_seed(3)
    dst, src = torch.randn(2, 5, 6, generator=gen), torch.randn(2, 3, 2, 6, generator=gen)
    limit = torch.iinfo(index_dtype).max
    cases = [v for v in _INVALID.values() if max(map(abs, v)) <= limit]
    slots, steps, rows = (torch.tensor(c, dtype=index_dtype) for c in zip(*cases))
    before = dst.clone()
    for rows_given in (rows, None):
        if rows_given is None:  # request i reads row i: rows past spec from the count alone
            slots, steps = slots[:1].repeat(4), steps[:1].repeat(4)
        op.launch_interpreted(dst, src, slots, steps, rows_given, kernel=kernel)
        assert torch.equal(dst, before)


def test_persistent_grid_does_not_grow_with_the_requests():
    """The persistent kernel's grid is the smaller of its program count and the work items any
    index values can give: 1000 requests launch as many programs as 100."""
    gen = torch.Generator().manual_seed(4)
    dst, src = torch.randn(2, 8, 64), torch.randn(2, 1000, 2, 64)
    grids = []
    for n in (1, 100, 1000):
        slots = torch.randint(0, 8, (n,), generator=gen)
        grid, _ = op._arguments(dst, src, slots, slots, None, chunk_bytes=64, programs=300)
        grids.append(grid[0])
    assert grids == [1 * 2 * 4, 300, 300]  # 1 request x 2 layers x 4 chunks of 16 floats


# --------------------------------------------------------------------------------------------
# GPU


@gpu
@settings(SETTINGS, max_examples=examples(30))
@given(data=st.data())
def test_gpu_op_equals_reference(data):
    dims = data.draw(calls_of.dims(device="cuda"))
    values = calls_of.index_values(data.draw, dims)
    args = _fill(dims, values, "cuda", torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    expected = op.reference(**args)
    fused_mamba_state_scatter_with_mask(**args)
    assert torch.equal(args["dst"], expected)


@gpu
@settings(SETTINGS, max_examples=examples(30))
@given(call=strategies.calls(calls_of.OP, device="cuda:0", valid=False))
def test_gpu_real_tensors_raise_the_contract_error_and_write_nothing(call):
    args, kwargs = call.build()
    dst_before = args[0].clone()
    err = raised(fused_mamba_state_scatter_with_mask, *args, **kwargs)
    assert (type(err), str(err)) == call.expected_error(args, kwargs)
    assert torch.equal(args[0], dst_before)


@gpu
def test_gpu_direct_and_dispatcher_paths_agree_and_bump_the_version():
    gen = torch.Generator().manual_seed(5)
    dims = contract.Dims(3, 9, 6, 4, (5, 33), 12, with_src_indices=True, device="cuda")
    values = {"dst_indices_raw": [0, 3, 3, -1, 8, 9, 2, 5, 5, 1, 7, 4],
              "step_indices_raw": [1, 0, 2, 3, -1, 0, 4, 1, 2, 0, 3, 2],
              "src_indices_raw": [0, 1, 2, 3, 4, 5, 6, -1, 0, 1, 2, 3]}
    direct = _fill(dims, values, "cuda", gen)
    via_ops = {k: (v.clone() if v is not None else None) for k, v in direct.items()}
    expected = op.reference(**direct)
    version = direct["dst"]._version
    fused_mamba_state_scatter_with_mask(**direct)
    torch.ops.strictops.fused_mamba_state_scatter_with_mask(**via_ops)
    assert torch.equal(direct["dst"], expected) and torch.equal(via_ops["dst"], expected)
    assert direct["dst"]._version > version


@gpu
def test_gpu_alternating_pointer_alignment_and_specialised_sizes():
    """Alternate 16-byte-aligned and misaligned pointers and sizes that Triton specialises
    (1, multiples of 16): each call must get a kernel compiled for its own arguments."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    layers, cache, spec, draft, most = 3, 7, 5, 2, 33
    base_dst = torch.randn(layers * cache * most + 1, device="cuda", generator=gen)
    base_src = torch.randn(layers * spec * draft * most + 1, device="cuda", generator=gen)
    slots = torch.tensor([1, 6, 3, 6], device="cuda", dtype=torch.int32)
    steps = torch.tensor([0, 1, -1, 1], device="cuda")
    for offset in (0, 1, 0, 1):  # one float past an aligned start: a 4-byte-aligned pointer
        for entry in (33, 32, 1, 16, 33):
            dst = base_dst[offset:offset + layers * cache * entry].view(layers, cache, entry)
            src = base_src[offset:offset + layers * spec * draft * entry].view(
                layers, spec, draft, entry)
            expected = op.reference(dst, src, slots, steps)
            fused_mamba_state_scatter_with_mask(dst, src, slots, steps)
            assert torch.equal(dst, expected), (offset, entry)


@gpu
def test_gpu_large_entry_and_large_strides():
    """Entries past 2**31 bytes of dst offset: index arithmetic is 64-bit."""
    dst = torch.empty(2, 3, 1 << 28, dtype=torch.float16, device="cuda")  # 3 GiB
    src = torch.randn(2, 1, 1, 1 << 28, device="cuda").to(torch.float16)
    slots = torch.tensor([2], device="cuda", dtype=torch.int32)
    steps = torch.tensor([0], device="cuda", dtype=torch.int32)
    fused_mamba_state_scatter_with_mask(dst, src, slots, steps)
    assert torch.equal(dst[:, 2], src[:, 0, 0])


def _assert_every_kernel_writes(expected, monkeypatch, dst, src, slots, steps) -> None:
    """Each kernel's call on a copy of ``dst`` leaves ``expected``, bit for bit."""
    for kernel in KERNELS:
        monkeypatch.setitem(op.TUNING, "kernel", kernel)
        out = dst.clone()
        fused_mamba_state_scatter_with_mask(out, src, slots, steps)
        assert torch.equal(out, expected), kernel


def _many_requests(n: int, valid: int, cache: int, gen: torch.Generator):
    """Slots (int32, duplicates among them) and steps (int64) of ``n`` requests, ``valid`` of
    them valid, on the GPU."""
    slots = torch.randint(0, cache, (n,), generator=gen).to(torch.int32)
    steps = torch.randint(0, 4, (n,), generator=gen)
    steps[torch.randperm(n, generator=gen)[valid:]] = -1
    return slots.cuda(), steps.cuda()


@gpu
@pytest.mark.parametrize("n, valid", [(64, 0), (64, 1), (64, 51), (300, 250)])
def test_gpu_every_kernel_writes_the_same_bits(monkeypatch, n, valid):
    """Every kernel, at a model-like entry (128 KiB fp32, several chunks) and more requests than
    several blocks of ``SCAN`` with duplicate slots: the reference's bits, each."""
    gen = torch.Generator().manual_seed(n + valid)
    dst = torch.randn(3, 40, 8, 64, 64, generator=gen).cuda()
    src = torch.randn(3, n, 4, 8, 64, 64, generator=gen).cuda()
    slots, steps = _many_requests(n, valid, 40, gen)
    _assert_every_kernel_writes(op.reference(dst, src, slots, steps), monkeypatch, dst, src,
                                slots, steps)


@gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_gpu_graph_replay_reads_new_index_values(monkeypatch, kernel):
    """A captured call replayed after its index tensors change in place (all invalid, one
    valid, many valid with duplicates) writes what the new values ask for."""
    monkeypatch.setitem(op.TUNING, "kernel", kernel)
    gen = torch.Generator().manual_seed(7)
    dst = torch.randn(4, 24, 3, 1000, generator=gen).cuda()
    src = torch.randn(4, 70, 4, 3, 1000, generator=gen).cuda()
    slots, steps = _many_requests(70, 0, 24, gen)
    graph, _ = capture_cuda_graph(fused_mamba_state_scatter_with_mask, dst, src, slots, steps)
    for valid in (0, 1, 60):
        new_slots, new_steps = _many_requests(70, valid, 24, gen)
        slots.copy_(new_slots)
        steps.copy_(new_steps)
        expected = op.reference(dst, src, slots, steps)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(dst, expected), valid


@gpu
@pytest.mark.xfail(strict=True, reason="on the H200 the persistent kernel loads at 240 "
                   "registers a thread (80 in ptxas offline): one program per SM fits, not "
                   "three; why it is not the default (docs/design/mamba_state_scatter.md)")
def test_gpu_persistent_programs_are_all_resident():
    """The compiled persistent kernels' registers (as loaded on this GPU) let
    ``programs_per_sm`` programs share an SM, as the grid assumes."""
    args = op.example_inputs("cuda:0", False, torch.Generator().manual_seed(8))
    fused_mamba_state_scatter_with_mask(**args)
    torch.cuda.synchronize()
    regs_per_sm = getattr(torch.cuda.get_device_properties(0), "regs_per_multiprocessor", 65536)
    tuning = op.TUNING["persistent"]
    compiled = list(op._scatter_kernel.device_caches[torch.cuda.current_device()][0].values())
    assert compiled
    for kernel in compiled:
        kernel._init_handles()
        per_warp = -(-kernel.n_regs * 32 // 256) * 256
        assert per_warp * tuning["num_warps"] * tuning["programs_per_sm"] <= regs_per_sm, (
            kernel.n_regs)


@gpu
@pytest.mark.parametrize("layers, valid", [(36, 51), (36, 1), (13, 40), (5, 0)])
def test_gpu_every_kernel_equals_the_original_bit_for_bit(monkeypatch, sglang_mamba, layers,
                                                          valid):
    """Each kernel beside sglang's original at a model-like entry (128 KiB fp32) on 64 requests
    with distinct slots (the original leaves duplicates to the order its programs run in):
    a full commit, one valid request, layer counts that are not a multiple of the layer-loop
    group, none valid."""
    gen = torch.Generator(device="cuda").manual_seed(layers + valid)
    dst = torch.randn(layers, 96, 8, 64, 64, device="cuda", generator=gen)
    src = torch.randn(layers, 64, 4, 8, 64, 64, device="cuda", generator=gen)
    slots = torch.randperm(96, device="cuda", generator=gen)[:64].to(torch.int32)
    steps = torch.randint(0, 4, (64,), device="cuda", generator=gen)
    steps[torch.randperm(64, device="cuda", generator=gen)[valid:]] = -1
    theirs = dst.clone()
    sglang_mamba.fused_mamba_state_scatter_with_mask(theirs, src, slots, steps)
    _assert_every_kernel_writes(theirs, monkeypatch, dst, src, slots, steps)


# As loaded on the H200 (its specialisation: unit index strides) the layer-loop kernel takes 92
# registers, against 56-62 from ptxas offline: 5 programs of 4 warps an SM. The GPU bound is 4.
LAYER_LOOP_MAX_REGISTERS_LOADED = 128


@gpu
def test_gpu_layer_loop_kernel_loads_within_its_registers_without_spills():
    """The layer-loop kernel a default call launches, as loaded on this GPU, spills nothing and
    keeps at least 4 programs of 4 warps an SM resident (fp32 with int32 slots, bf16 with int64
    slots and source rows; model-like shapes, so entries and pointers are multiples of 16)."""
    tuning = op.TUNING["layer_loop"]
    cache = op._layer_loop_kernel.device_caches[torch.cuda.current_device()][0]
    for dtype, index_dtype, with_rows in ((torch.float32, torch.int32, False),
                                          (torch.bfloat16, torch.int64, True)):
        args = op.example_inputs("cuda:0", False, torch.Generator().manual_seed(8))
        args["dst"], args["src"] = args["dst"].to(dtype), args["src"].to(dtype)
        args["dst_indices_raw"] = args["dst_indices_raw"].to(index_dtype)
        if not with_rows:
            args["src_indices_raw"] = None
        with op.kernel_variant("layer_loop"):
            fused_mamba_state_scatter_with_mask(**args)
        torch.cuda.synchronize()
        # The call's own kernel: compiling its arguments again finds it in the kernel's cache
        # (other tests of the process compile other tunings and specialisations).
        grid, params = op._layer_loop_arguments(args["dst"], args["src"],
                                                args["dst_indices_raw"],
                                                args["step_indices_raw"],
                                                args["src_indices_raw"])
        cached = len(cache)
        kernel = op._layer_loop_kernel.warmup(*params, grid=grid, num_warps=tuning["num_warps"])
        assert len(cache) == cached
        kernel._init_handles()
        assert kernel.n_spills == 0 and kernel.n_regs <= LAYER_LOOP_MAX_REGISTERS_LOADED, (
            kernel.n_regs, kernel.n_spills, dtype, index_dtype)
