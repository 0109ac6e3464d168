"""track_mamba_states_all_layers / _if_needed under torch.compile, torch.export, CUDA graphs.

CPU (CI), on fake CUDA tensors: one graph, no graph break, no recompile when the batch, the
batch size, the pools or the layer count change; every rule fails at trace time with its eager
message; ``torch.export`` traces the op; the traced graph is one Triton launch with no copy or
cast of the index tensors.

GPU (``-m gpu``): Inductor and a manual CUDA graph capture equal the reference, the graph
replaying new indices and masks; ``torch.library.opcheck`` passes.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from strictops.meta.mamba import track_states as contract
from strictops.meta.testing import (
    aot_op_graph,
    assert_rule_fails_at_trace_time,
    build,
    capture_cuda_graph,
    fake_mode,
    gpu,
    kernel_launches,
)
from strictops.ops import track_mamba_states_all_layers, track_mamba_states_if_needed
from strictops.ops.mamba import track_states as op

OP = torch.ops.strictops.track_mamba_states_all_layers.default


def step(conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask,
         mamba_track_indices, batch_size, check_freed_slots=False):
    """Work before and after the op, so that it sits mid-graph."""
    track_mamba_states_all_layers(conv_states_pool, ssm_states_pool, cache_indices + 0,
                                  mamba_track_mask, mamba_track_indices, batch_size,
                                  check_freed_slots)
    return ssm_states_pool.sum()


def step_one_layer(conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask,
                   mamba_track_indices, batch_size, check_freed_slots=False):
    conv, ssm = conv_states_pool.select(0, 0), ssm_states_pool.select(0, 0)
    track_mamba_states_if_needed(conv, ssm, cache_indices, mamba_track_mask,
                                 mamba_track_indices, batch_size, check_freed_slots)
    return ssm.sum()


def _dims(i: int) -> contract.Dims:
    # Pairwise-distinct sizes >= 2 within a call (no duck sizing, no 0/1 specialisation).
    return contract.Dims(num_layers=2 + i, pool_size=19 + 2 * i, conv_state=(11 + i, 3 + i),
                         ssm_state=(5 + i, 7 + i, 9 + i), batch=23 + 4 * i,
                         batch_size=13 + 3 * i)


@pytest.mark.parametrize("fn", [step, step_one_layer])
def test_one_graph_no_break_no_recompile_across_sizes(fn):
    counter = CompileCounter()
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    with fake_mode():
        for i in range(3):
            compiled(**build(contract.valid_spec(_dims(i))))
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"
    assert not torch._dynamo.utils.counters["graph_break"]


def test_inductor_receives_one_triton_launch_and_no_index_copies():
    with fake_mode():
        gm = aot_op_graph(OP, build(contract.valid_spec(_dims(0))))
    assert len(kernel_launches(gm)) == 1, gm.code
    tensor_ops = [n.target for n in gm.graph.nodes
                  if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                  and n.target not in (torch.ops.aten.sym_stride.int, torch.ops.aten.sym_size.int)]
    assert tensor_ops == [], gm.code


@pytest.mark.parametrize("rule", contract.CONTRACT.rules)
def test_every_rule_fails_at_trace_time(rule):
    assert_rule_fails_at_trace_time(step, contract, rule, _dims(1))


class _Step(torch.nn.Module):
    def forward(self, conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask,
                mamba_track_indices):
        return step(conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask,
                    mamba_track_indices, cache_indices.shape[0])


def test_export_traces_the_op_with_dynamic_sizes():
    layers, pool, batch = (torch.export.Dim(n) for n in ("layers", "pool", "batch"))
    with fake_mode():
        spec = contract.valid_spec(_dims(0))
        spec = {k: v for k, v in spec.items() if k not in ("batch_size", "check_freed_slots")}
        args = build(spec)
        ep = torch.export.export(_Step(), (), kwargs=args, dynamic_shapes={
            "conv_states_pool": {0: layers, 1: pool}, "ssm_states_pool": {0: layers, 1: pool},
            "cache_indices": {0: batch}, "mamba_track_mask": {0: batch},
            "mamba_track_indices": {0: batch}})
    assert any("track_mamba_states_all_layers" in str(n.target) for n in ep.graph.nodes)


# --------------------------------------------------------------------------------------------
# GPU


def _real(seed: int, batch: int = 40) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    layers, pool = 3, 2 * batch + 4
    return {
        "conv_states_pool": torch.randn(layers, pool, 64, 3, device="cuda", generator=gen),
        "ssm_states_pool": torch.randn(layers, pool, 4, 32, 16, device="cuda", generator=gen),
        "cache_indices": torch.randint(-1, batch, (batch,), device="cuda", generator=gen),
        "mamba_track_mask": torch.rand(batch, device="cuda", generator=gen) < 0.4,
        "mamba_track_indices": torch.randperm(batch + 4, device="cuda", generator=gen)[:batch]
        + batch,
        "batch_size": batch,
    }


def _expected(args: dict):
    return op.reference(**args)


@gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_gpu_inductor_equals_reference(mode):
    compiled = torch.compile(step, fullgraph=True, dynamic=True, mode=mode)
    for seed, batch in enumerate((37, 64, 129)):
        args = _real(seed, batch)
        conv, ssm = _expected(args)
        compiled(**args)
        assert torch.equal(args["conv_states_pool"], conv)
        assert torch.equal(args["ssm_states_pool"], ssm)


@gpu
def test_gpu_cuda_graph_replays_new_indices():
    static = _real(0)
    graph, _ = capture_cuda_graph(step, **static)
    for seed in range(1, 5):
        fresh = _real(seed)
        for name, t in fresh.items():
            if isinstance(t, torch.Tensor):
                static[name].copy_(t)
        conv, ssm = _expected(static)
        graph.replay()
        assert torch.equal(static["conv_states_pool"], conv)
        assert torch.equal(static["ssm_states_pool"], ssm)


@gpu
def test_gpu_opcheck_all_utils():
    args = _real(7)
    torch.library.opcheck(OP, (*args.values(), False))
