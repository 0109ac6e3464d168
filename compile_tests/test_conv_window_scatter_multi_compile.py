"""fused_conv_window_scatter_multi under torch.compile, torch.export and CUDA graphs.

CPU (CI), on fake CUDA tensors: one graph, no graph break, no recompile when the request sets,
the pool, the layer count or the windows change (``src`` overlapping window views, as sglang
passes them), with one or two request sets; every rule fails at trace time with its eager
message; ``torch.export`` traces the op; the traced graph is one Triton launch for all pairs,
with no copy or cast of the index tensors.

GPU (``-m gpu``): Inductor, ``mode="reduce-overhead"`` and a manual ``torch.cuda.graph``
capture replayed with new indices equal eager bit for bit; ``torch.library.opcheck`` passes.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from strictops.meta.mamba import conv_window_scatter_multi as contract
from strictops.meta.testing import (
    aot_op_graph,
    assert_rule_fails_at_trace_time,
    build,
    capture_cuda_graph,
    fake_mode,
    gpu,
    kernel_launches,
    written_arguments,
)
from strictops.ops.mamba import conv_window_scatter as one
from strictops.ops.mamba import conv_window_scatter_multi as op
from strictops.ops import fused_conv_window_scatter_multi

OP = torch.ops.strictops.fused_conv_window_scatter_multi.default


def step(pairs, dst_indices_raw, step_indices_raw, dst_indices2_raw=None,
         step_indices2_raw=None):
    """A model step around the op: work before and after it, so the op sits mid-graph."""
    step_indices_raw = step_indices_raw - 1
    fused_conv_window_scatter_multi(pairs, dst_indices_raw, step_indices_raw, dst_indices2_raw,
                                    step_indices2_raw)
    return sum(p[0].sum() for p in pairs)


def _dims(i: int, second_set: bool = True) -> contract.Dims:
    # Pairwise-distinct sizes >= 2 within each call, the shared buffers' widths (draft + K-2)
    # too (equal sizes would be duck-sized into one symbol, and 0/1 are specialised), and
    # different across calls.
    return contract.Dims(num_layers=2 + i, cache_size=61 + 3 * i, spec_size=5 + i,
                         draft_tokens=3 + i,
                         windows=((101 + i, 4 + 5 * i, torch.bfloat16),
                                  (131 + i, 11 + 5 * i, torch.float32)),
                         n1=37 + 2 * i, n2=43 + 2 * i if second_set else None)


def _sglang_call(i: int, second_set: bool = True) -> dict:
    """Fake tensors as sglang passes them: every ``src`` a window view of a shared buffer."""
    d = _dims(i, second_set)
    args = build(contract.valid_spec(d))
    args["pairs"] = [(dst, one.window_view(torch.empty(d.num_layers, d.spec_size, dim,
                                                       d.draft_tokens + km1 - 1, dtype=dtype,
                                                       device=d.device), d.draft_tokens, km1))
                     for (dst, _), (dim, km1, dtype) in zip(args["pairs"], d.windows)]
    return args


@pytest.mark.parametrize("second_set", [False, True])
def test_one_graph_no_break_no_recompile_across_sizes(second_set):
    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    with fake_mode():
        for i in range(4):
            compiled(**_sglang_call(i, second_set))
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"
    assert counter.op_count >= 3
    assert not torch._dynamo.utils.counters["graph_break"]


def test_inductor_receives_one_triton_launch_and_no_index_copies():
    with fake_mode():
        gm = aot_op_graph(OP, op.op_arguments(**_sglang_call(0)))
    assert len(kernel_launches(gm)) == 1, gm.code
    tensor_ops = [n.target for n in gm.graph.nodes
                  if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                  and n.target not in (torch.ops.aten.sym_stride.int, torch.ops.aten.sym_size.int,
                                       torch.ops.aten.sym_storage_offset.default)]
    assert tensor_ops == [], gm.code  # no copy, cast or contiguous of any input


# Dynamo does not model an input's storage size (see the one-pair op's compile tests).
STORAGE_RULES = ("src_inside_storage", "dst_inside_storage")


@pytest.mark.parametrize("rule", [r for r in contract.CONTRACT.rules if r not in STORAGE_RULES])
def test_every_rule_fails_at_trace_time(rule):
    assert_rule_fails_at_trace_time(step, contract, rule, _dims(1))


class _Step(torch.nn.Module):
    def forward(self, conv, window, dst_indices_raw, step_indices_raw):
        return step([(conv, window)], dst_indices_raw, step_indices_raw)


def test_export_traces_the_op_with_dynamic_sizes():
    layers, cache, n = torch.export.Dim("layers"), torch.export.Dim("cache"), torch.export.Dim("n")
    with fake_mode():
        args = build(contract.valid_spec(_dims(0, second_set=False)))
        kwargs = {"conv": args["pairs"][0][0], "window": args["pairs"][0][1],
                  "dst_indices_raw": args["dst_indices_raw"],
                  "step_indices_raw": args["step_indices_raw"]}
        ep = torch.export.export(_Step(), (), kwargs=kwargs, dynamic_shapes={
            "conv": {0: layers, 1: cache}, "window": {0: layers},
            "dst_indices_raw": {0: n}, "step_indices_raw": {0: n}})
    assert any("fused_conv_window_scatter_multi" in str(n.target) for n in ep.graph.nodes)


# --------------------------------------------------------------------------------------------
# GPU


def _real_inputs(seed: int, n1: int = 24, n2: int = 9) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    layers, cache, spec, draft = 3, 60, 30, 5
    pairs = []
    for dim, km1, dtype in ((300, 3, torch.bfloat16), (77, 2, torch.float32)):
        dst = torch.randn(layers, cache, dim, km1, device="cuda", generator=gen).to(dtype)
        shared = torch.randn(layers, spec, dim, draft + km1 - 1, device="cuda", generator=gen)
        pairs.append((dst, one.window_view(shared.to(dtype), draft, km1)))

    def indices(n, upper):
        return torch.randint(-2, upper + 2, (n,), device="cuda", generator=gen)

    return {"pairs": pairs, "dst_indices_raw": indices(n1, cache).int(),
            "step_indices_raw": indices(n1, draft), "dst_indices2_raw": indices(n2, cache),
            "step_indices2_raw": indices(n2, draft).int()}


def _expected(args: dict) -> list:
    return op.reference(**{**args, "step_indices_raw": args["step_indices_raw"] - 1})


@gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_gpu_inductor_equals_eager(mode):
    compiled = torch.compile(step, fullgraph=True, dynamic=True, mode=mode)
    for seed in range(4):  # several batch sizes and values, one compile
        args = _real_inputs(seed, n1=24 + 5 * seed, n2=9 + seed)
        expected = _expected(args)
        compiled(**args)
        assert all(torch.equal(d, e) for (d, _), e in zip(args["pairs"], expected))


@gpu
def test_gpu_manual_cuda_graph_replays_new_indices():
    static = _real_inputs(0)
    graph, _ = capture_cuda_graph(step, **static)
    for seed in range(1, 6):
        fresh = _real_inputs(seed)
        for name in ("dst_indices_raw", "step_indices_raw", "dst_indices2_raw",
                     "step_indices2_raw"):
            static[name].copy_(fresh[name])
        for (dst, src), (new_dst, new_src) in zip(static["pairs"], fresh["pairs"]):
            dst.copy_(new_dst)
            src.untyped_storage().copy_(new_src.untyped_storage())
        expected = _expected(static)
        graph.replay()
        assert all(torch.equal(d, e) for (d, _), e in zip(static["pairs"], expected))


@gpu
def test_gpu_inductor_clones_only_what_the_kernel_writes():
    """Triton's mutation analysis must see that the kernel stores to the dsts alone."""
    gm = aot_op_graph(OP, op.op_arguments(**_real_inputs(3)))
    (launch,) = kernel_launches(gm)
    assert set(launch.kwargs["tensors_to_clone"]) <= {"dst0", "dst1"}, gm.code


@gpu
def test_gpu_opcheck_all_utils():
    args = op.op_arguments(**_real_inputs(7))
    torch.library.opcheck(OP, tuple(args.values()))
    torch.library.opcheck(OP, tuple(args.values())[:4])


@pytest.mark.parametrize("second_set", [False, True])
def test_mutation_analysis_finds_only_the_dsts_written(second_set):
    """Without a GPU: Triton's mutation analysis finds only the pairs' ``dst`` written."""
    pairs = [(torch.zeros(3, 5, dim, km1),
              one.window_view(torch.zeros(3, 4, dim, 3 + km1 - 1), 3, km1))
             for dim, km1 in ((7, 2), (5, 3))]
    slots, steps = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)
    _, parameters = op._arguments(pairs, slots, steps,
                                  *((slots, steps) if second_set else (None, None)))
    kwargs = dict(zip(op._scatter_multi_kernel.arg_names, parameters))
    assert written_arguments(op._scatter_multi_kernel, kwargs) == ["dst0", "dst1"]
