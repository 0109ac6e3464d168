"""fused_conv_window_scatter_with_mask under torch.compile, torch.export and CUDA graphs.

CPU (CI), on fake CUDA tensors: one graph, no graph break, no recompile when the number of
requests, the pool, the layer count or the window shape changes (``src`` an overlapping window
view, as sglang passes it); every rule fails at trace time with its eager message;
``torch.export`` traces the op and refuses bad inputs with the original ``ValueError``; the
traced graph is one Triton launch, with no copy or cast of the index tensors.

GPU (``-m gpu``): Inductor, ``mode="reduce-overhead"`` and a manual ``torch.cuda.graph``
capture replayed with new indices equal eager bit for bit; ``torch.library.opcheck`` passes.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from strictops.meta.mamba import conv_window_scatter as contract
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
from strictops.ops.mamba import conv_window_scatter as op
from strictops.ops import fused_conv_window_scatter_with_mask

OP = torch.ops.strictops.fused_conv_window_scatter_with_mask.default


def step(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None):
    """A model step around the op: work before and after it, so the op sits mid-graph."""
    step_indices_raw = step_indices_raw - 1
    fused_conv_window_scatter_with_mask(dst, src, dst_indices_raw, step_indices_raw,
                                        src_indices_raw)
    return dst.sum()


def _dims(i: int, with_src: bool = False) -> contract.Dims:
    # Pairwise-distinct sizes >= 2 within each call (equal sizes would be duck-sized into one
    # symbol, and 0/1 are specialised), and different across calls.
    return contract.Dims(num_layers=2 + i, cache_size=11 + 3 * i, spec_size=5 + i,
                         draft_tokens=3 + i, dim=17 + i, km1=4 + 3 * i,
                         total_requests=7 + 2 * i, with_src_indices=with_src)


def _sglang_call(i: int, with_src: bool) -> dict:
    """Fake tensors as sglang passes them: ``src`` a window view of a shared buffer."""
    d = _dims(i, with_src)
    args = build(contract.valid_spec(d))
    shared = torch.empty(d.num_layers, d.spec_size, d.dim, d.draft_tokens + d.km1 - 1,
                         dtype=d.dtype, device=d.device)
    return {**args, "src": op.window_view(shared, d.draft_tokens, d.km1)}


@pytest.mark.parametrize("with_src", [False, True])
def test_one_graph_no_break_no_recompile_across_sizes(with_src):
    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    with fake_mode():
        for i in range(4):
            compiled(**_sglang_call(i, with_src))
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"
    assert counter.op_count >= 3
    assert not torch._dynamo.utils.counters["graph_break"]


def test_no_recompile_when_only_the_batch_changes():
    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    with fake_mode():
        base = _sglang_call(0, True)
        for n in (7, 12, 29):
            idx = {k: torch.empty(n, dtype=base[k].dtype, device="cuda:0")
                   for k in ("dst_indices_raw", "step_indices_raw", "src_indices_raw")}
            compiled(**{**base, **idx})
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"


def test_inductor_receives_one_triton_launch_and_no_index_copies():
    with fake_mode():
        gm = aot_op_graph(OP, _sglang_call(0, with_src=True))
    assert len(kernel_launches(gm)) == 1, gm.code
    tensor_ops = [n.target for n in gm.graph.nodes
                  if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                  and n.target not in (torch.ops.aten.sym_stride.int, torch.ops.aten.sym_size.int,
                                       torch.ops.aten.sym_storage_offset.default)]
    assert tensor_ops == [], gm.code  # no copy, cast or contiguous of any input


# Dynamo does not model an input's storage size: it fakeifies a view with a storage that fits
# the view (or its base), so a storage shrunk after the view was made is invisible to tracing.
STORAGE_RULES = ("src_inside_storage", "dst_inside_storage")


@pytest.mark.parametrize("rule", [r for r in contract.CONTRACT.rules if r not in STORAGE_RULES])
def test_every_rule_fails_at_trace_time(rule):
    assert_rule_fails_at_trace_time(step, contract, rule, _dims(1))


@pytest.mark.parametrize("rule", STORAGE_RULES)
def test_a_shrunk_storage_is_refused_when_the_compiled_call_runs(rule):
    """Tracing sees a storage that fits; the op's own check still refuses the real call (with
    the eager backend, which runs the op's body)."""
    compiled = torch.compile(step, backend="eager", fullgraph=True, dynamic=True)
    with fake_mode():
        args = build(contract.NEAR_MISSES[rule](contract.valid_spec(_dims(1))))
        _, message = contract.CONTRACT.expected_error(rule, **args)
        with pytest.raises(ValueError) as info:
            compiled(**args)
    assert str(info.value) == message


class _Step(torch.nn.Module):
    def forward(self, dst, src, dst_indices_raw, step_indices_raw):
        return step(dst, src, dst_indices_raw, step_indices_raw)


def _export_dynamic_shapes():
    layers, cache = torch.export.Dim("layers"), torch.export.Dim("cache")
    spec, draft, n = torch.export.Dim("spec"), torch.export.Dim("draft"), torch.export.Dim("n")
    return {
        "dst": {0: layers, 1: cache},
        "src": {0: layers, 1: spec, 2: draft},
        "dst_indices_raw": {0: n},
        "step_indices_raw": {0: n},
    }


def test_export_traces_the_op_with_dynamic_sizes():
    with fake_mode():
        args = build(contract.valid_spec(_dims(0)))
        args.pop("src_indices_raw")
        ep = torch.export.export(_Step(), (), kwargs=args, dynamic_shapes=_export_dynamic_shapes())
    assert any("fused_conv_window_scatter_with_mask" in str(n.target) for n in ep.graph.nodes)


def test_export_refuses_a_bad_call_with_the_original_value_error():
    with fake_mode():
        args = build(contract.NEAR_MISSES["window_dims"](contract.valid_spec(_dims(0))))
        args.pop("src_indices_raw")
        _, message = contract.CONTRACT.expected_error("window_dims", **args)
        with pytest.raises(ValueError) as info:
            torch.export.export(_Step(), (), kwargs=args)
    assert message in str(info.value)


# --------------------------------------------------------------------------------------------
# GPU


def _real_inputs(seed: int, n: int = 24, with_src: bool = True) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    layers, cache, spec, draft, dim, km1 = 3, 40, 30, 5, 300, 3
    dst = torch.randn(layers, cache, dim, km1, device="cuda", generator=gen).to(torch.bfloat16)
    shared = torch.randn(layers, spec, dim, draft + km1 - 1, device="cuda", generator=gen)
    src = op.window_view(shared.to(torch.bfloat16), draft, km1)
    slots = torch.randint(-2, cache + 2, (n,), device="cuda", generator=gen, dtype=torch.int32)
    steps = torch.randint(-1, draft + 1, (n,), device="cuda", generator=gen)
    rows = (torch.randint(-1, spec + 1, (n,), device="cuda", generator=gen)
            if with_src else None)
    return {"dst": dst, "src": src, "dst_indices_raw": slots, "step_indices_raw": steps,
            "src_indices_raw": rows}


def _expected(args: dict) -> torch.Tensor:
    return op.reference(**{**args, "step_indices_raw": args["step_indices_raw"] - 1})


@gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_gpu_inductor_equals_eager(mode):
    compiled = torch.compile(step, fullgraph=True, dynamic=True, mode=mode)
    for seed in range(4):  # several batch sizes and values, one compile
        args = _real_inputs(seed, n=24 + 5 * seed)
        expected = _expected(args)
        compiled(**args)
        assert torch.equal(args["dst"], expected)


@gpu
def test_gpu_manual_cuda_graph_replays_new_indices():
    static = _real_inputs(0)
    graph, _ = capture_cuda_graph(step, **static)
    for seed in range(1, 6):
        fresh = _real_inputs(seed)
        for name in ("dst", "dst_indices_raw", "step_indices_raw", "src_indices_raw"):
            static[name].copy_(fresh[name])
        static["src"].untyped_storage().copy_(fresh["src"].untyped_storage())
        expected = _expected(static)
        graph.replay()
        assert torch.equal(static["dst"], expected)


@gpu
def test_gpu_inductor_clones_only_what_the_kernel_writes():
    """Triton's mutation analysis must see that the kernel stores to ``dst`` alone."""
    gm = aot_op_graph(OP, _real_inputs(3))
    (launch,) = kernel_launches(gm)
    assert launch.kwargs["tensors_to_clone"] in ([], ["dst_ptr"]), gm.code


@gpu
def test_gpu_opcheck_all_utils():
    for with_src in (False, True):
        args = _real_inputs(7, with_src=with_src)
        torch.library.opcheck(OP, tuple(args.values()))


@pytest.mark.parametrize("with_src", [False, True])
def test_mutation_analysis_finds_only_dst_written(with_src):
    """Without a GPU: Triton's mutation analysis (what Inductor clones before a launch) finds
    only ``dst`` written, the index tensors read through the shared helpers included."""
    dst = torch.zeros(3, 5, 7, 2)
    src = op.window_view(torch.zeros(3, 4, 7, 3 + 2 - 1), 3, 2)
    slots, steps = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)
    _, parameters = op._arguments(dst, src, slots, steps, slots.clone() if with_src else None)
    kwargs = dict(zip(op._scatter_kernel.arg_names, parameters))
    assert written_arguments(op._scatter_kernel, kwargs) == ["dst_ptr"]
