"""copy_and_publish under torch.compile, torch.export and CUDA graphs.

CPU (CI), on fake CUDA tensors: one graph, no graph break, no recompile when the source's size,
rank or dtype or the pool's size changes; every rule fails at trace time with its eager
message; ``torch.export`` traces the op and refuses a bad call with the original
``ValueError``; Inductor receives one Triton launch (two above 1 MiB) that writes the pool and
the state only.

GPU (``-m gpu``): one captured CUDA graph replayed into a different lease each time (and into a
lease that does not fit: refused and counted) delivers the right bytes and flags; Inductor
equals eager; ``torch.library.opcheck`` passes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from strictops.meta.transport import pool as contract
from strictops.meta.testing import (
    aot_op_graph,
    assert_rule_fails_at_trace_time,
    build,
    capture_cuda_graph,
    fake_mode,
    gpu,
    kernel_launches,
)
from strictops.ops import TransportConsumer, TransportPool, copy_and_publish
from strictops.ops.transport import pool as op

OP = torch.ops.strictops.copy_and_publish.default
SLOTS, CONSUMERS = 11, 3


def step(pool, src, lease, state, max_inflight_slices, consumer_count, consumers="peers"):
    """A model step around the op: work before and after it, so the op sits mid-graph."""
    total = src.sum()
    copy_and_publish(pool, src, lease, state, max_inflight_slices, consumer_count, consumers)
    return total + state.sum()


def _dims(i: int, dtype=torch.float32) -> contract.Dims:
    # Sizes >= 3 (0/1 specialise, 2 and 7 are the state's and the lease's lengths), pairwise
    # distinct within a call and different across calls.
    return contract.Dims(memory_size=(1 << 16) + 4099 * i, max_inflight_slices=SLOTS,
                         consumer_count=CONSUMERS, src_shape=(13 + i, 17 + 2 * i),
                         src_dtype=dtype)


def test_one_graph_no_break_no_recompile_across_sizes():
    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    with fake_mode():
        for i in range(4):
            compiled(**build(contract.valid_spec(_dims(i))))
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"
    assert not torch._dynamo.utils.counters["graph_break"]


def test_a_new_source_dtype_is_one_more_graph_not_one_per_size():
    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    with fake_mode():
        for i, dtype in enumerate([torch.float32, torch.bfloat16] * 2):
            compiled(**build(contract.valid_spec(_dims(i, dtype))))
    assert counter.frame_count == 2, f"{counter.frame_count} frames"


def test_inductor_receives_one_triton_launch_and_no_copy_of_the_source():
    with fake_mode():
        gm = aot_op_graph(OP, build(contract.valid_spec(_dims(1))))
    assert len(kernel_launches(gm)) == 1, gm.code
    tensor_ops = {n.target for n in gm.graph.nodes
                  if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}
    # Views of the source as bytes (and back), sizes: nothing that copies or casts.
    assert tensor_ops <= {torch.ops.aten.view.default, torch.ops.aten.view.dtype,
                          torch.ops.aten.sym_size.int}, gm.code


@pytest.mark.parametrize("consumers", contract.CONSUMER_PLACES)
def test_the_flag_scope_is_a_constant_of_the_traced_launch(consumers):
    """Where the consumers are is fixed at trace time: Inductor's launch carries the kernel's
    ``SYSTEM`` constexpr (system-scope release for peers), so a graph captured from it keeps
    that ordering on every replay."""
    dims = dataclasses.replace(_dims(1), consumers=consumers)
    with fake_mode():
        [launch] = kernel_launches(aot_op_graph(OP, build(contract.valid_spec(dims))))
    assert launch.kwargs["kwargs"]["SYSTEM"] is contract.system_scope(consumers)
    assert launch.kwargs["kwargs"]["SYSTEM"] is (consumers == "peers")


@pytest.mark.parametrize("rule", contract.CONTRACT.rules)
def test_every_rule_fails_at_trace_time(rule):
    assert_rule_fails_at_trace_time(step, contract, rule, _dims(1))


class _Step(torch.nn.Module):
    def forward(self, pool, src, lease, state):
        return step(pool, src, lease, state, SLOTS, CONSUMERS)


def _export_args(spec: dict) -> dict:
    return {k: v for k, v in build(spec).items() if isinstance(v, torch.Tensor)}


def test_export_traces_the_op_with_dynamic_sizes():
    with fake_mode():
        args = _export_args(contract.valid_spec(_dims(0)))
        dynamic = {"pool": {0: torch.export.Dim("memory", min=1 << 12)},
                   "src": {0: torch.export.Dim("rows")}, "lease": None, "state": None}
        ep = torch.export.export(_Step(), (), kwargs=args, dynamic_shapes=dynamic)
    assert any("copy_and_publish" in str(n.target) for n in ep.graph.nodes)


def test_export_refuses_a_bad_call_with_the_original_value_error():
    with fake_mode():
        args = _export_args(contract.NEAR_MISSES["src_fits"](contract.valid_spec(_dims(0))))
        _, message = contract.CONTRACT.expected_error(
            "src_fits", **args, max_inflight_slices=SLOTS, consumer_count=CONSUMERS)
        with pytest.raises(ValueError) as info:
            torch.export.export(_Step(), (), kwargs=args)
    assert message in str(info.value)


# --------------------------------------------------------------------------------------------
# GPU


def _graph_pool():
    pool = TransportPool(1 << 22, device="cuda:0", consumer_count=2, max_inflight_slices=SLOTS,
                         recycle_interval=None)
    return pool, [TransportConsumer.local(pool, r) for r in range(2)]


@gpu
def test_gpu_one_cuda_graph_publishes_into_a_new_lease_on_every_replay():
    pool, consumers = _graph_pool()
    src = torch.zeros(3000, 11, device="cuda")
    lease_t = torch.zeros(contract.LEASE_WORDS, dtype=torch.int64, device="cuda")
    state = op.new_state("cuda")
    # The warm-up call before capture publishes a refused lease (zeros): it writes nothing.
    graph, _ = capture_cuda_graph(pool.publish, src, lease_t, state)
    try:
        for k in range(6):
            nbytes = src.numel() * 4 - 13 * k  # the graph also publishes shorter payloads
            lease = pool.lease(nbytes)
            src.copy_(torch.randn(src.shape, device="cuda"))
            lease_t.copy_(torch.tensor(lease))
            graph.replay()
            for c in consumers:
                got = c.receive(lease, torch.uint8, (nbytes,))
                assert torch.equal(got, src.view(-1).view(torch.uint8)[:nbytes]), k
            torch.cuda.synchronize()
            assert pool.recycle() == [lease]
        errors_before = int(state[contract.ERRORS])
        lease_t.copy_(torch.tensor(pool.lease(64)._replace(end=1 << 30)))  # does not fit
        before = pool.tensor.clone()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(pool.tensor, before)
        assert state.tolist() == [0, errors_before + 1]
    finally:
        pool.shutdown()


def _real_inputs(seed: int) -> dict:
    return op.example_inputs("cuda:0", small=False, generator=torch.Generator().manual_seed(seed))


@gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_gpu_inductor_equals_eager(mode):
    compiled = torch.compile(step, fullgraph=True, dynamic=True, mode=mode)
    for seed in range(3):
        args = _real_inputs(seed)
        pool, state = op.reference(**args)
        compiled(**args)
        assert torch.equal(args["pool"], pool) and torch.equal(args["state"], state)


@gpu
def test_gpu_inductor_clones_only_what_the_kernel_writes():
    """Triton's mutation analysis (it needs the GPU's driver) must find the kernel's stores to
    the pool and atomics on the state alone; anything more in ``tensors_to_clone`` would make
    Inductor copy the source or the lease on every call."""
    launches = kernel_launches(aot_op_graph(OP, _real_inputs(3)))
    assert len(launches) == 2  # a 4 MB source: the copy, then the flag (see op.TUNING)
    for launch in launches:
        assert set(launch.kwargs["tensors_to_clone"]) <= {"pool_ptr", "state_ptr"}


@gpu
def test_gpu_opcheck_all_utils():
    args = _real_inputs(7)
    torch.library.opcheck(OP, tuple(args.values()))
