"""The self-check's own rows for every op (``python -m strictops``): the kernel its calls run
here and why, the example call's exact result (Triton interpreter here) and its fake-tensor
trace as one graph. The bad-call rows are the contract tests' (``tests/test_contracts.py``);
these catch an op module whose example call drifts from its contract or its kernel."""

from __future__ import annotations

import types

import pytest
import torch
import triton
import triton.language as tl

from strictops.ops import OP_MODULES, selfcheck
from strictops.ops.sparse_mla import prefill as sparse


@pytest.mark.parametrize("op", sorted(OP_MODULES))
def test_example_call_is_exact_and_traces_as_one_graph(op):
    module = OP_MODULES[op]
    for row in (selfcheck.check_result(op, module),
                selfcheck.check_trace(op, module, selfcheck._fake_spec(module))):
        assert row.passed, f"{row.check}: {row.detail}"


@pytest.mark.parametrize("op", sorted(OP_MODULES))
def test_each_op_reports_its_kernel_first(op, monkeypatch):
    """Every op's rows start with its kernel row (the other checks stood in for: they have
    their own tests), which names a kernel and why."""
    def stand_in(op, module, *args):
        return selfcheck.Row(op, "stand-in", True, "")

    for check in ("check_result", "check_trace", "check_rule"):
        monkeypatch.setattr(selfcheck, check, stand_in)
    kernel, *others = selfcheck.check_op(op, OP_MODULES[op])
    assert (kernel.check, kernel.passed) == ("kernel", True) and kernel.detail.endswith(")")
    assert others and all(row.check == "stand-in" for row in others)


def test_sparse_mla_reports_the_triton_kernel_here_and_whether_gluon_builds_for_sm90():
    """Without a GPU: the Triton kernel in the interpreter, and the sm_90 Gluon kernel built
    offline on this Triton (every Triton strictops supports builds it)."""
    if torch.cuda.is_available():
        pytest.skip("a GPU machine reports its GPU's kernel")
    row = selfcheck.check_kernel(sparse.contract.CONTRACT.op, sparse)
    if sparse._sparse_mla_sm90 is None:
        assert row.detail == "triton (this Triton has no Gluon Hopper API)"
        return
    assert row.detail == ("triton (no GPU: the Triton interpreter; on sm_90 gluon block_pair, "
                          f"which builds on triton {triton.__version__})")


def test_sparse_mla_reports_the_gluon_kernel_on_sm90_and_why_not_elsewhere(monkeypatch):
    ws = sparse._sparse_mla_sm90
    if ws is None:
        pytest.skip("this Triton has no Gluon")
    capability = {}
    monkeypatch.setattr(ws, "device_capability", lambda index: capability["now"])
    monkeypatch.setattr(ws, "build_problem", lambda kernel: None)
    cuda = torch.device("cuda:0")
    capability["now"] = (9, 0)
    assert sparse.kernel_choice(cuda) == ("gluon block_pair",
                                          f"sm_90, builds on triton {triton.__version__}")
    capability["now"] = (10, 0)
    assert sparse.kernel_choice(cuda) == ("triton", "sm_100: the Gluon kernels are sm_90 only")
    monkeypatch.setattr(ws, "build_problem", lambda kernel: "PTXASError: (a reason)")
    capability["now"] = (9, 0)
    assert sparse.kernel_choice(cuda) == (
        "triton", "the Gluon kernel does not build on this Triton: PTXASError: (a reason)")
    monkeypatch.setattr(sparse, "KERNEL", "triton")
    assert sparse.kernel_choice(cuda) == ("triton", 'KERNEL = "triton"')


@triton.jit
def _stand_in_kernel(x_ptr):
    tl.store(x_ptr, 1)


def test_a_module_without_kernel_choice_reports_its_one_triton_kernel():
    """The generic row: a module's one ``@triton.jit`` kernel (named ``*_kernel``, defined in
    it) where it has no ``kernel_choice``; ``kernel_choice`` where it has one."""
    module = types.ModuleType(__name__)  # _stand_in_kernel was defined in a module of this name
    module._stand_in_kernel = _stand_in_kernel
    where = "" if torch.cuda.is_available() else "; no GPU: the Triton interpreter"
    row = selfcheck.check_kernel("strictops::stand_in", module)
    assert row.detail == f"_stand_in_kernel (its one Triton kernel{where})"
    module.kernel_choice = lambda device: ("fast", f"on {device.type}")
    row = selfcheck.check_kernel("strictops::stand_in", module)
    assert row.detail == f"fast (on {'cuda' if torch.cuda.is_available() else 'cpu'})"


def test_mamba_state_scatter_reports_the_kernel_its_tuning_picks(monkeypatch):
    """The state scatter has three kernels: its row names the one ``TUNING["kernel"]`` picks."""
    from strictops.ops.mamba import state_scatter as mss
    cuda = torch.device("cuda", 0)
    assert mss.kernel_choice(cuda) == ("_layer_loop_kernel", 'TUNING["kernel"] = "layer_loop"')
    monkeypatch.setitem(mss.TUNING, "kernel", "per_chunk")
    name, why = mss.kernel_choice(torch.device("cpu"))
    assert (name, why) == ("_per_chunk_kernel",
                           'TUNING["kernel"] = "per_chunk"; no GPU: the Triton interpreter')
