"""fused_mamba_state_scatter_with_mask under torch.compile, torch.export and CUDA graphs.

CPU (CI), on fake CUDA tensors: one graph, no graph break, no recompile when the number of
requests, the cache size, the layer count or the draft shape changes; every rule (a ``src`` on
another device first: the serving failure the contract exists for) fails at trace time with its eager message; ``torch.export``
traces the op and refuses bad inputs with the original ``ValueError``; the traced graph is one
Triton launch, with no copy or cast of the index tensors.

GPU (``-m gpu``): Inductor, ``mode="reduce-overhead"`` and a manual ``torch.cuda.graph`` capture
equal eager bit for bit, and ``torch.library.opcheck`` passes with all its test utils.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from strictops.meta.mamba import state_scatter as contract
from strictops.meta.testing import (
    HAS_CUDA,
    HAS_TWO_GPUS,
    aot_op_graph,
    assert_rule_fails_at_trace_time,
    build,
    capture_cuda_graph,
    dynamo_error_text,
    fake_mode,
    gpu,
    kernel_launches,
    written_arguments,
)
from strictops.ops import fused_mamba_state_scatter_with_mask
from strictops.ops.mamba import state_scatter as op

OP = torch.ops.strictops.fused_mamba_state_scatter_with_mask.default


def step(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None):
    """A model step around the op: work before and after it, so the op sits mid-graph."""
    step_indices_raw = step_indices_raw - 1
    fused_mamba_state_scatter_with_mask(dst, src, dst_indices_raw, step_indices_raw,
                                        src_indices_raw)
    return dst.sum()


def _dims(i: int, with_src: bool = False) -> contract.Dims:
    # Pairwise-distinct sizes >= 2 within each call (equal sizes would be duck-sized into one
    # symbol, and 0/1 are specialised), and different across calls.
    return contract.Dims(num_layers=2 + i, cache_size=11 + 3 * i, spec_size=5 + i,
                         draft_tokens=3 + i, state_shape=(17 + i, 23 + i),
                         total_requests=7 + 2 * i, with_src_indices=with_src)


@pytest.mark.parametrize("with_src", [False, True])
def test_one_graph_no_break_no_recompile_across_sizes(with_src):
    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    with fake_mode():
        for i in range(4):
            compiled(**build(contract.valid_spec(_dims(i, with_src))))
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"
    assert counter.op_count >= 3
    assert not torch._dynamo.utils.counters["graph_break"]


@pytest.mark.parametrize("kernel", list(op.PATHS))
def test_inductor_receives_one_triton_launch_and_no_index_copies(kernel):
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    with fake_mode(), op.kernel_variant(kernel):
        gm = aot_op_graph(OP, build(contract.valid_spec(_dims(0, with_src=True))))
    (launch,) = kernel_launches(gm)
    launched = kernel_side_table.get_kernel(launch.kwargs["kernel_idx"])
    while launched is not op.PATHS[kernel].jit_fn and hasattr(launched, "fn"):
        launched = launched.fn  # wrap_triton holds a launch with options as a 1-config autotuner
    assert launched is op.PATHS[kernel].jit_fn, gm.code
    tensor_ops = [n.target for n in gm.graph.nodes
                  if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                  and n.target not in (torch.ops.aten.sym_stride.int, torch.ops.aten.sym_size.int)]
    assert tensor_ops == [], gm.code  # no copy, cast or contiguous of any input


@pytest.mark.parametrize("with_src", [False, True])
@pytest.mark.parametrize("kernel", [
    pytest.param("persistent", marks=pytest.mark.xfail(
        strict=True, reason="the analysis follows the store addresses into the called "
        "_writers and counts its index pointers as written (docs/design/"
        "mamba_state_scatter.md#grid)")),
    *(name for name in op.PATHS if name != "persistent")])
def test_mutation_analysis_finds_only_dst_written(kernel, with_src):
    """Under Inductor a launch clones every tensor the analysis finds written: anything beside
    ``dst`` would copy ``src`` or the index tensors on every call."""
    dst, src = torch.zeros(3, 5, 4, 16), torch.zeros(3, 4, 2, 4, 16)
    slots, steps = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)
    path = op.PATHS[kernel]
    _, parameters = path.arguments(dst, src, slots, steps, slots.clone() if with_src else None)
    kwargs = dict(zip(path.jit_fn.arg_names, parameters))
    assert written_arguments(path.jit_fn, kwargs) == ["dst_ptr"]


@pytest.mark.parametrize("rule", contract.CONTRACT.rules)
def test_every_rule_fails_at_trace_time(rule):
    assert_rule_fails_at_trace_time(step, contract, rule, _dims(1))


@pytest.mark.parametrize("src_device", [
    pytest.param("cuda:1", marks=pytest.mark.skipif(
        HAS_CUDA and not HAS_TWO_GPUS, reason="a real single-GPU machine has no cuda:1")),
    "cpu",
])
def test_src_on_another_device_fails_at_trace_time(src_device):
    compiled = torch.compile(step, backend="eager", fullgraph=True, dynamic=True)
    with fake_mode():
        spec = contract.valid_spec(_dims(0))
        args = build({**spec, "src": spec["src"].replace(device=src_device)})
        with pytest.raises(Exception) as info:
            compiled(**args)
    assert (f"dst and src must be on the same device. dst.device=device(type='cuda', index=0) "
            f"src.device={torch.device(src_device)!r}") in dynamo_error_text(info.value)


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
    assert any("fused_mamba_state_scatter_with_mask" in str(n.target) for n in ep.graph.nodes)


def test_export_refuses_a_bad_call_with_the_original_value_error():
    with fake_mode():
        args = build(contract.NEAR_MISSES["layer_dim"](contract.valid_spec(_dims(0))))
        args.pop("src_indices_raw")
        _, message = contract.CONTRACT.expected_error("layer_dim", **args)
        with pytest.raises(ValueError) as info:
            torch.export.export(_Step(), (), kwargs=args)
    assert message in str(info.value)


# --------------------------------------------------------------------------------------------
# GPU


def _real_inputs(seed: int, n: int = 24, with_src: bool = True) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    layers, cache, spec, draft, state = 3, 40, 30, 5, (4, 64)
    dst = torch.randn(layers, cache, *state, device="cuda", generator=gen)
    src = torch.randn(layers, spec, draft, *state, device="cuda", generator=gen)
    slots = torch.randint(-2, cache + 2, (n,), device="cuda", generator=gen, dtype=torch.int32)
    steps = torch.randint(-1, draft + 1, (n,), device="cuda", generator=gen)
    rows = (torch.randint(-1, spec + 1, (n,), device="cuda", generator=gen)
            if with_src else None)
    return {"dst": dst, "src": src, "dst_indices_raw": slots, "step_indices_raw": steps,
            "src_indices_raw": rows}


def _expected(args: dict) -> torch.Tensor:
    ref_args = {**args, "step_indices_raw": args["step_indices_raw"] - 1}
    return op.reference(**ref_args)


@gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_gpu_inductor_equals_eager(mode):
    compiled = torch.compile(step, fullgraph=True, dynamic=True, mode=mode)
    for seed in range(4):  # several sizes and values, one compile
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
        for name, t in fresh.items():
            static[name].copy_(t)
        expected = _expected(static)
        graph.replay()
        assert torch.equal(static["dst"], expected)


@gpu
def test_gpu_inductor_clones_only_what_the_kernel_writes():
    """Triton's mutation analysis must see that the default kernel stores to ``dst`` alone;
    anything else in ``tensors_to_clone`` would make Inductor copy ``src`` on every call."""
    gm = aot_op_graph(OP, _real_inputs(3))
    (launch,) = kernel_launches(gm)
    assert launch.kwargs["tensors_to_clone"] in ([], ["dst_ptr"]), gm.code


@gpu
def test_gpu_opcheck_all_utils():
    for with_src in (False, True):
        args = _real_inputs(7, with_src=with_src)
        torch.library.opcheck(OP, tuple(args.values()))
