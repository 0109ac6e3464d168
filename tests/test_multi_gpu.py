"""Two GPUs: every op refuses a call whose tensors span two devices, and runs on the second GPU.

For every op and every tensor argument of it (the arguments of its example call, which is
built from its contract's ``valid_spec`` with every optional tensor given; a CPU test checks
that they are all of the op's schema's tensor arguments), that one argument goes to ``cuda:1``
and the rest stay on ``cuda:0``. The contract then reports a device rule whose message names
the second GPU, and:

* an eager call (the public function, and ``torch.ops.strictops`` through the dispatcher)
  raises exactly that rule's type and message, before any launch;
* ``torch.compile(fullgraph=True, dynamic=True)``, with the ``eager`` backend and with
  Inductor, fails while tracing (``TorchRuntimeError``) with that error chained, verbatim;
* afterwards both devices synchronise without a CUDA error and no argument changed a byte.

A control runs each op with every tensor on ``cuda:1`` while ``cuda:0`` is the current device
(eager, and compiled with Inductor): it must write something, and what it writes and returns
must equal the same call on ``cuda:0`` bit for bit, so the op launched on its tensors' GPU.

CPU (CI): the argument list against the schemas, and the refusals on fake ``cuda:0``/``cuda:1``
tensors. The rest is marked ``multi_gpu`` and needs two real GPUs.
"""

from __future__ import annotations

import pytest
import torch

from strictops.meta import CONTRACTS
from strictops.meta.testing import (
    CAN_NAME_SECOND_GPU,
    error_chain,
    fake_mode,
    multi_gpu,
    raised,
)
from strictops.ops import OP_MODULES

OPS = sorted(OP_MODULES)
# How the call is made: None is a plain call; otherwise torch.compile with that backend.
HOW = [None, "eager", "inductor"]
HOW_IDS = ["call", "compile-eager", "compile-inductor"]
SECOND = "cuda:1"


def _name(op: str) -> str:
    return op.split("::")[1]


def _example(op: str) -> dict:
    """The op's example call on the CPU: every optional tensor argument given, random valid
    values (from a seeded CPU generator, so that every device gets the same values)."""
    module = OP_MODULES[op]
    args = module.example_inputs("cpu", small=True, generator=torch.Generator().manual_seed(0))
    # The op's own arguments, where the public function takes them in another form.
    return getattr(module, "op_arguments", lambda **kw: kw)(**args)


def _public_arguments(op: str, args: dict) -> dict:
    """The public function's (and its contract's) arguments for the op's ``args``."""
    return getattr(OP_MODULES[op], "public_arguments", lambda **kw: kw)(**args)


def _is_tensors(v) -> bool:
    """A tensor argument, or a ``Tensor[]`` one (a list of tensors)."""
    return isinstance(v, torch.Tensor) or (isinstance(v, list) and bool(v)
                                           and all(isinstance(t, torch.Tensor) for t in v))


def _each(v, fn):
    """``fn`` of a tensor, or of every tensor of a list."""
    return [fn(t) for t in v] if isinstance(v, list) else fn(v)


def _tensor_arguments(op: str) -> list[str]:
    return [k for k, v in _example(op).items() if _is_tensors(v)]


CASES = [(op, name) for op in OPS for name in _tensor_arguments(op)]
CASE_IDS = [f"{_name(op)}-{name}" for op, name in CASES]


def _call(op: str, devices: dict, fake: bool = False) -> dict:
    """The example call with tensor argument ``name`` on ``devices.get(name, "cuda:0")``: real
    copies, or (``fake``, inside a fake mode) fake tensors of the same metadata."""
    out = {}
    for name, v in _example(op).items():
        if _is_tensors(v):
            device = devices.get(name, "cuda:0")
            v = _each(v, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                       device=device) if fake else t.to(device))
        out[name] = v
    return out


def _entry_points(op: str) -> list:
    """The public function (which skips the dispatcher in plain eager mode), called with the
    op's arguments, and the op itself."""
    public = getattr(OP_MODULES[op], _name(op))

    def call_public(**args):
        return public(**_public_arguments(op, args))

    return [call_public, getattr(torch.ops.strictops, _name(op))]


def _device_error(op: str, args: dict) -> tuple[type[Exception], str]:
    """The error the contract reports for ``args``, which must be a device rule whose message
    names the second GPU (as ``cuda:1`` or as ``device(type='cuda', index=1)``)."""
    contract = CONTRACTS[op]
    args = _public_arguments(op, args)
    rule = contract.broken_rule(**args)
    assert rule is not None and rule.endswith("device"), rule
    error, message = contract.expected_error(rule, **args)
    assert "cuda:1" in message or "index=1" in message, message
    return error, message


def _assert_refused(op: str, args: dict, backend: str | None) -> None:
    """``backend=None``: every eager entry point raises the contract's device error exactly.
    Else ``torch.compile`` with ``backend`` fails while tracing, that error chained verbatim."""
    want = _device_error(op, args)
    if backend is None:
        for fn in _entry_points(op):
            err = raised(fn, **args)
            assert (type(err), str(err)) == want, fn
        return
    torch._dynamo.reset()
    compiled = torch.compile(_entry_points(op)[0], backend=backend, fullgraph=True, dynamic=True)
    err = raised(compiled, **args)
    assert type(err).__name__ == "TorchRuntimeError", err  # raised while tracing, not running
    assert any((type(e), str(e)) == want for e in error_chain(err)), err


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes, so that NaN compares equal to itself (the sparse MLA buffers start NaN)."""
    return t.detach().reshape(-1).view(torch.uint8)


def _same_bytes(a: dict, b: dict) -> bool:
    def flat(args):
        return [t for k in sorted(args) if _is_tensors(args[k])
                for t in (args[k] if isinstance(args[k], list) else [args[k]])]

    return all(torch.equal(_bytes(x).cpu(), _bytes(y).cpu()) for x, y in zip(flat(a), flat(b)))


def _clones(args: dict) -> dict:
    return {k: (_each(v, torch.clone) if _is_tensors(v) else v) for k, v in args.items()}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# --------------------------------------------------------------------------------------------
# CPU


@pytest.mark.parametrize("op", OPS, ids=_name)
def test_the_cases_cover_every_tensor_argument_of_the_schema(op):
    schema = getattr(torch.ops.strictops, _name(op)).default._schema
    optional_tensor = torch._C.OptionalType(torch._C.TensorType.get())
    tensor_list = torch._C.ListType(torch._C.TensorType.get())
    in_schema = [a.name for a in schema.arguments
                 if a.type.isSubtypeOf(optional_tensor) or a.type.isSubtypeOf(tensor_list)]
    assert _tensor_arguments(op) == in_schema


@pytest.mark.skipif(not CAN_NAME_SECOND_GPU, reason="a real single-GPU machine has no cuda:1")
@pytest.mark.parametrize("backend", HOW, ids=HOW_IDS)
@pytest.mark.parametrize("op, name", CASES, ids=CASE_IDS)
def test_fake_argument_on_second_gpu_is_refused(op, name, backend):
    with fake_mode():
        _assert_refused(op, _call(op, {name: SECOND}, fake=True), backend)


# --------------------------------------------------------------------------------------------
# Two GPUs


@multi_gpu
@pytest.mark.parametrize("backend", HOW, ids=HOW_IDS)
@pytest.mark.parametrize("op, name", CASES, ids=CASE_IDS)
def test_argument_on_second_gpu_is_refused_and_nothing_runs(op, name, backend):
    args = _call(op, {name: SECOND})
    before = _clones(args)
    _assert_refused(op, args, backend)
    for device in range(2):
        torch.cuda.synchronize(device)  # a launch that went wrong would surface here
    assert _same_bytes(args, before)


def _run(op: str, device: str, compiled: bool):
    """The example call with every tensor on ``device``; returns its arguments afterwards (the
    op writes some in place), what it returned, and its arguments before."""
    args = _call(op, dict.fromkeys(_tensor_arguments(op), device))
    before = _clones(args)
    fn = _entry_points(op)[0]
    if compiled:
        fn = torch.compile(fn, fullgraph=True, dynamic=True)
    returned = fn(**args)
    torch.cuda.synchronize(device)
    return args, returned, before


@multi_gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
@pytest.mark.parametrize("op", OPS, ids=_name)
def test_call_on_second_gpu_runs_there_and_equals_the_first(op, compiled):
    assert torch.cuda.current_device() == 0  # so the op must switch to its tensors' GPU
    first, first_returned, _ = _run(op, "cuda:0", compiled)
    second, second_returned, before = _run(op, SECOND, compiled)
    assert torch.cuda.current_device() == 0
    written = [k for k in CONTRACTS[op].mutates if second[k] is not None]
    assert not _same_bytes({k: second[k] for k in written}, before), "the call wrote nothing"
    assert _same_bytes(second, first)
    returned = [t for t in (second_returned or ()) if isinstance(t, torch.Tensor)]
    assert all(t.device == torch.device(SECOND) for t in returned)
    assert _same_bytes(dict(enumerate(returned)), dict(enumerate(first_returned or ())))
