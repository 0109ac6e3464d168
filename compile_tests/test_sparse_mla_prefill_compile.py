"""sparse_mla_q8kv8_prefill_fwd under torch.compile, torch.export and CUDA graphs.

CPU (CI), on fake CUDA tensors, for both kernels (the Triton kernel, and the warp-specialised
Gluon kernel that sm_90 runs, whose launch is the ``strictops_kernels::sparse_mla_ws_launch``
op): one graph, no graph break, no recompile when ``s_q``, ``s_kv``, ``topk`` (and ``h_q``)
change; ``h_q = 16`` (the unpadded tensor-parallel heads that hung the original in serving) and
every other rule fail at trace time with the eager message, but the ``topk_length`` value rule,
which never runs while tracing (the call traces as one graph); overlapping buffers are refused
at trace time; ``torch.export`` traces the op and refuses bad inputs with the original
``ValueError``; Inductor receives one kernel launch and the allocations of the outputs the
caller did not pass, nothing else; once the Gluon kernel failed to build in the process, the
launch traced is the Triton kernel's.

GPU (``-m gpu``), for both kernels: Inductor, ``mode="reduce-overhead"`` and a manual
``torch.cuda.graph`` capture equal eager bit for bit, and ``torch.library.opcheck`` passes
with all its test utils but ``test_schema``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from strictops.meta.sparse_mla import prefill as contract
from strictops.meta._specs import TensorSpec
from strictops.meta.testing import (
    CAN_NAME_SECOND_GPU,
    SPARSE_MLA_SECOND_GPU_RULES,
    SPARSE_MLA_VALUE_RULES,
    aot_op_graph,
    assert_rule_fails_at_trace_time,
    build,
    capture_cuda_graph,
    dynamo_error_text,
    fake_mode,
    gpu,
    kernel_launches,
)
from strictops.ops.sparse_mla import prefill as op
from strictops.ops import sparse_mla_q8kv8_prefill_fwd

OP = torch.ops.strictops.sparse_mla_q8kv8_prefill_fwd.default
WS_LAUNCH = torch.ops.strictops_kernels.sparse_mla_ws_launch.default


@pytest.fixture(params=["triton", "gluon"])
def kernel(request, monkeypatch):
    """The kernel the op launches (``op.KERNEL``), read when a call is traced."""
    if request.param == "gluon" and op._sparse_mla_sm90 is None:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(op, "KERNEL", request.param)
    return request.param


def step(q, kv, indices, sm_scale, q_scale, kv_scale, d_v=512, attn_sink=None,
         topk_length=None, out=None, max_logits=None, lse=None, topk_length_errors=None):
    """A model step around the op: work after it, so the op sits mid-graph. (Work before it
    would hand the op new tensors, hiding e.g. a strided input from the contiguity rules.)
    Pointwise, so compiled and eager results compare bit for bit."""
    out, max_logits, lse = sparse_mla_q8kv8_prefill_fwd(
        q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out=out,
        max_logits=max_logits, lse=lse, topk_length_errors=topk_length_errors)
    return out, max_logits, lse, lse - max_logits


def _dims(i: int, **flags) -> contract.Dims:
    # Pairwise-distinct sizes >= 2 within each call (equal sizes would be duck-sized into one
    # symbol, and 0/1 are specialised), and different across calls.
    return contract.Dims(s_q=3 + 2 * i, s_kv=200 + 37 * i, h_q=64 * (1 + i % 3), d_qk=576,
                         topk=128 * (2 + i), **flags)


FLAGS = {
    "functional": {},
    "every_argument": {"with_attn_sink": True, "with_buffers": True, "with_errors": True},
    "partial_buffers": {"with_topk_length": True},
}


def _flagged(flags: dict, i: int = 0) -> dict:
    """The spec of call ``i``; ``partial_buffers`` passes only ``lse``."""
    spec = contract.valid_spec(_dims(i, **FLAGS[flags]))
    if flags == "partial_buffers":
        s = spec["q"]
        spec["lse"] = TensorSpec(s.shape[:2], torch.float32, s.device)
    return spec


@pytest.mark.parametrize("flags", list(FLAGS))
def test_one_graph_no_break_no_recompile_across_sizes(flags, kernel):
    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    with fake_mode():
        for i in range(4):
            compiled(**build(_flagged(flags, i)))
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"
    assert counter.op_count >= 3
    assert not torch._dynamo.utils.counters["graph_break"]


def test_h_q_16_fails_at_trace_time(kernel):
    """The case that hung the original in serving: 16 heads per rank, unpadded."""
    compiled = torch.compile(step, backend="eager", fullgraph=True, dynamic=True)
    with fake_mode():
        spec = contract.valid_spec(_dims(0))
        q = spec["q"]
        args = build({**spec, "q": q.replace(shape=(q.shape[0], 16, q.shape[2]))})
        with pytest.raises(Exception) as info:
            compiled(**args)
    assert type(info.value).__name__ == "TorchRuntimeError"
    assert ("sparse_mla_q8kv8_prefill_fwd requires h_q padded to a positive multiple of 64, "
            "got 16") in dynamo_error_text(info.value)


@pytest.mark.parametrize("rule", [
    pytest.param(r, marks=pytest.mark.skipif(
        not CAN_NAME_SECOND_GPU and r in SPARSE_MLA_SECOND_GPU_RULES,
        reason="a real single-GPU machine has no cuda:1"))
    for r in contract.CONTRACT.rules if r not in SPARSE_MLA_VALUE_RULES])
def test_every_rule_fails_at_trace_time(rule, kernel):
    assert_rule_fails_at_trace_time(step, contract, rule, _dims(1))


@pytest.mark.parametrize("rule", sorted(SPARSE_MLA_VALUE_RULES))
def test_value_rules_never_run_while_tracing(rule, kernel):
    """Out-of-range ``topk_length`` values trace in one graph, no error and no read of a
    value (a fake tensor has none): the kernel clamps and counts them instead."""
    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    with fake_mode():
        compiled(**build(contract.NEAR_MISSES[rule](contract.valid_spec(_dims(1)))))
    assert counter.frame_count == 1
    assert not torch._dynamo.utils.counters["graph_break"]


def _overlapping(args: dict, case: str) -> dict:
    """``args`` with ``lse`` the very tensor passed as ``max_logits``, or starting one element
    into its storage, or (``separate``) as it was."""
    if case == "same_tensor":
        return {**args, "lse": args["max_logits"]}
    if case == "one_element_in":
        s_q, h_q = args["lse"].shape
        base = torch.empty(s_q * h_q + 1, device="cuda:0")
        return {**args, "max_logits": base.narrow(0, 0, s_q * h_q).view(s_q, h_q),
                "lse": base.narrow(0, 1, s_q * h_q).view(s_q, h_q)}
    return args


@pytest.mark.parametrize("case", ["same_tensor", "one_element_in", "separate"])
def test_overlapping_buffers_are_refused_at_trace_time(case):
    compiled = torch.compile(step, backend="eager", fullgraph=True, dynamic=True)
    with fake_mode():
        args = _overlapping(build(contract.valid_spec(_dims(0, with_buffers=True))), case)
        if case == "separate":
            compiled(**args)
            return
        with pytest.raises(Exception) as info:
            compiled(**args)
    assert type(info.value).__name__ == "TorchRuntimeError"
    assert "out, max_logits and lse must not alias each other" in dynamo_error_text(info.value)


@pytest.mark.parametrize("flags, allocations", [("functional", 3), ("every_argument", 0),
                                                ("partial_buffers", 2)])
def test_inductor_receives_one_launch_and_only_the_missing_allocations(flags, allocations,
                                                                       kernel):
    with fake_mode():
        gm = aot_op_graph(OP, build(_flagged(flags)))
    (launch,) = kernel_launches(gm)
    launches_ws = launch.args[:1] == (WS_LAUNCH,)  # auto_functionalized(WS_LAUNCH, ...)
    assert launches_ws == (kernel == "gluon"), gm.code
    tensor_ops = [n.target for n in gm.graph.nodes
                  if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                  and n.target not in (torch.ops.aten.sym_stride.int, torch.ops.aten.sym_size.int)]
    # No copy, cast or contiguous of any input; with every buffer given, nothing allocated.
    assert tensor_ops == [torch.ops.aten.empty.memory_format] * allocations, gm.code


def test_after_a_failed_gluon_build_a_trace_records_the_triton_launch(monkeypatch):
    """Once the Gluon kernel failed to build in this process (``_sparse_mla_sm90.UNBUILDABLE``,
    set by its first compile), a traced call records the Triton kernel's launch where it
    recorded the Gluon one's (``KERNEL = "gluon"``: on any device)."""
    if op._sparse_mla_sm90 is None:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(op, "KERNEL", "gluon")
    monkeypatch.setattr(op._sparse_mla_sm90, "UNBUILDABLE", "CompilationError: (a reason)")
    with fake_mode():
        gm = aot_op_graph(OP, build(_flagged("functional")))
    (launch,) = kernel_launches(gm)
    assert launch.args[:1] != (WS_LAUNCH,) and "triton_kernel_wrapper" in str(launch.target)


class _Prefill(torch.nn.Module):
    def forward(self, q, kv, indices, q_scale, kv_scale, attn_sink, topk_length):
        return sparse_mla_q8kv8_prefill_fwd(q, kv, indices, 576 ** -0.5, q_scale, kv_scale,
                                            attn_sink=attn_sink, topk_length=topk_length)


def _export_kwargs(spec: dict) -> dict:
    args = build(spec)
    return {k: args[k] for k in ("q", "kv", "indices", "q_scale", "kv_scale", "attn_sink",
                                 "topk_length")}


def test_export_traces_the_op_once_for_every_size(kernel):
    s_q, s_kv = torch.export.Dim("s_q"), torch.export.Dim("s_kv")
    topk = 128 * torch.export.Dim("topk_blocks")  # the contract's topk % 128 == 0, declared
    shapes = {"q": {0: s_q}, "kv": {0: s_kv}, "indices": {0: s_q, 2: topk}, "q_scale": None,
              "kv_scale": None, "attn_sink": None, "topk_length": {0: s_q}}
    with fake_mode():
        kwargs = _export_kwargs(contract.valid_spec(_dims(0, with_attn_sink=True)))
        ep = torch.export.export(_Prefill(), (), kwargs=kwargs, dynamic_shapes=shapes)
        assert [n.target for n in ep.graph.nodes].count(OP) == 1
        # Other sizes of the same head count run through the one exported program.
        other = dataclasses.replace(_dims(2, with_attn_sink=True), h_q=_dims(0).h_q)
        out, max_logits, lse = ep.module()(**_export_kwargs(contract.valid_spec(other)))
    assert out.shape == (other.s_q, other.h_q, contract.D_V)


def test_export_refuses_a_bad_call_with_the_original_value_error(kernel):
    with fake_mode():
        spec = contract.NEAR_MISSES["topk"](contract.valid_spec(_dims(0, with_attn_sink=True)))
        kwargs = _export_kwargs(spec)
        _, message = contract.CONTRACT.expected_error("topk", **build(spec))
        with pytest.raises(ValueError) as info:
            torch.export.export(_Prefill(), (), kwargs=kwargs)
    assert message in str(info.value)


# --------------------------------------------------------------------------------------------
# GPU


def _real_inputs(seed: int, i: int = 0, **flags) -> dict:
    dims = dataclasses.replace(_dims(i, **flags), device="cuda")
    return op.random_inputs(dims, torch.Generator(device="cuda").manual_seed(seed))


def _clone(args: dict) -> dict:
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def _bitwise_equal(a: tuple, b: tuple) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("flags", ["functional", "every_argument"])
def test_gpu_inductor_equals_eager_bit_for_bit(mode, flags, kernel):
    compiled = torch.compile(step, fullgraph=True, dynamic=True, mode=mode)
    for i in range(3):  # several sizes, one compile
        args = _real_inputs(i, i, **FLAGS[flags])
        eager_args = _clone(args)
        assert _bitwise_equal(compiled(**args), step(**eager_args))
        assert all(torch.equal(args[name], eager_args[name])
                   for name in contract.CONTRACT.mutates if args[name] is not None)


@gpu
def test_gpu_manual_cuda_graph_replays_equal_eager(kernel):
    flags = FLAGS["every_argument"]
    static = _real_inputs(0, **flags)
    graph, captured = capture_cuda_graph(step, **static)
    for seed in range(1, 4):
        fresh = _real_inputs(seed, **flags)
        for name, t in fresh.items():
            if isinstance(t, torch.Tensor):
                static[name].copy_(t)
        graph.replay()
        assert _bitwise_equal(captured, step(**_clone(fresh)))


@gpu
@pytest.mark.parametrize("flags", list(FLAGS))
def test_gpu_opcheck(flags, kernel):
    """Every opcheck util but ``test_schema``, whose mutation check compares inputs with
    arithmetic that has no Float8_e4m3fn kernel ("mul_cuda" not implemented, torch 2.11).
    The schema's mutations are checked by the version-counter and buffer tests instead."""
    args = _real_inputs(7, **FLAGS[flags])
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_static",
             "test_aot_dispatch_dynamic")
    torch.library.opcheck(OP, tuple(args.values()), test_utils=utils)
