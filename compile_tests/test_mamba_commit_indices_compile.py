"""fused_commit_track_indices under torch.compile, torch.export and CUDA graphs.

CPU (CI), on fake CUDA tensors: one graph, no graph break, no recompile when the batch, the
accepted-token count, ``draft_token_num`` or the interval changes; every rule fails at trace
time with its eager message; ``torch.export`` traces the op; the traced graph is one Triton
launch and the two allocations, with no copy or cast of the inputs.

GPU (``-m gpu``): Inductor and a manual CUDA graph capture equal the reference, the graph
replaying new lengths; ``torch.library.opcheck`` passes.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from strictops.meta.mamba import commit_indices as contract
from strictops.meta.testing import (
    aot_op_graph,
    assert_rule_fails_at_trace_time,
    build,
    capture_cuda_graph,
    fake_mode,
    gpu,
    kernel_launches,
)
from strictops.ops import fused_commit_track_indices
from strictops.ops.mamba import commit_indices as op

OP = torch.ops.strictops.fused_commit_track_indices.default


def step(accept_index, accept_lens, seq_lens, draft_token_num, mamba_track_interval):
    """Work before and after the op, so that it sits mid-graph."""
    last, track = fused_commit_track_indices(accept_index, accept_lens + 0, seq_lens,
                                             draft_token_num, mamba_track_interval)
    return last + 1, (track if track is None else track * 2)


def _dims(i: int, with_seq_lens: bool = True) -> contract.Dims:
    # Pairwise-distinct sizes >= 2 within a call (no duck sizing, no 0/1 specialisation).
    return contract.Dims(batch=7 + 3 * i, accepted_tokens=2 + i, draft_token_num=4 + i,
                         mamba_track_interval=5 + 2 * i, with_seq_lens=with_seq_lens)


@pytest.mark.parametrize("with_seq_lens", [False, True])
def test_one_graph_no_break_no_recompile_across_sizes(with_seq_lens):
    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    with fake_mode():
        for i in range(3):
            last, track = compiled(**build(contract.valid_spec(_dims(i, with_seq_lens))))
            assert last.shape == (7 + 3 * i,) and last.dtype == torch.int64
            assert (track is None) == (not with_seq_lens)
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"
    assert not torch._dynamo.utils.counters["graph_break"]


def test_inductor_receives_one_triton_launch_and_no_input_copies():
    with fake_mode():
        gm = aot_op_graph(OP, build(contract.valid_spec(_dims(0))))
    assert len(kernel_launches(gm)) == 1, gm.code
    tensor_ops = {n.target for n in gm.graph.nodes
                  if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}
    tensor_ops -= {torch.ops.aten.sym_stride.int, torch.ops.aten.sym_size.int,
                   torch.ops.aten.empty.memory_format}  # the two results
    assert tensor_ops == set(), gm.code


@pytest.mark.parametrize("rule", contract.CONTRACT.rules)
def test_every_rule_fails_at_trace_time(rule):
    assert_rule_fails_at_trace_time(step, contract, rule, _dims(1))


class _Step(torch.nn.Module):
    def forward(self, accept_index, accept_lens, seq_lens):
        return step(accept_index, accept_lens, seq_lens, 4, 8)


def test_export_traces_the_op_with_dynamic_sizes():
    batch, n = torch.export.Dim("batch"), torch.export.Dim("n")
    with fake_mode():
        spec = contract.valid_spec(_dims(0))
        args = build({k: spec[k] for k in ("accept_index", "accept_lens", "seq_lens")})
        ep = torch.export.export(_Step(), (), kwargs=args, dynamic_shapes={
            "accept_index": {0: batch, 1: n}, "accept_lens": {0: batch}, "seq_lens": {0: batch}})
    assert any("fused_commit_track_indices" in str(n.target) for n in ep.graph.nodes)


# --------------------------------------------------------------------------------------------
# GPU


def _real(seed: int, batch: int = 64) -> dict:
    args = op.example_inputs("cuda", False, torch.Generator().manual_seed(seed))
    return {k: (v[:batch] if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def _expected(args: dict):
    last, track = op.reference(args["accept_index"], args["accept_lens"] + 0, args["seq_lens"],
                               args["draft_token_num"], args["mamba_track_interval"])
    return last + 1, track * 2


@gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_gpu_inductor_equals_reference(mode):
    compiled = torch.compile(step, fullgraph=True, dynamic=True, mode=mode)
    for seed, batch in enumerate((37, 64, 129, 300)):
        args = _real(seed, batch)
        got = compiled(**args)
        assert all(torch.equal(g, w) for g, w in zip(got, _expected(args)))


@gpu
def test_gpu_cuda_graph_replays_new_lengths():
    static = _real(0)
    graph, out = capture_cuda_graph(step, **static)
    for seed in range(1, 5):
        fresh = _real(seed)
        for name in ("accept_index", "accept_lens", "seq_lens"):
            static[name].copy_(fresh[name])
        graph.replay()
        assert all(torch.equal(g, w) for g, w in zip(out, _expected(static)))


@gpu
def test_gpu_opcheck_all_utils():
    for with_seq_lens in (False, True):
        args = _real(7)
        if not with_seq_lens:
            args["seq_lens"] = None
        torch.library.opcheck(OP, tuple(args.values()))
