"""Every op in the ``strictops`` namespace has a contract, a fake, a reference, an interpreter
launcher, tests, compile tests and a benchmark; the package installs under ``strictops`` only."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import strictops.ops  # noqa: F401  (registers torch.ops.strictops.*)
from strictops.meta import CONTRACTS
from strictops.meta._specs import TensorSpec, build, build_value
from strictops.meta.testing import fake_mode
from strictops.ops import OP_MODULES

ROOT = Path(__file__).resolve().parents[1]
REGISTERED = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("strictops::"))


def test_ops_are_registered():
    assert REGISTERED, "no op in torch.ops.strictops"
    assert set(REGISTERED) == set(CONTRACTS) == set(OP_MODULES)


@pytest.mark.parametrize("op", REGISTERED)
def test_op_has_every_part(op):
    contract = CONTRACTS[op]
    module = OP_MODULES[op]
    meta = importlib.import_module(f"strictops.meta.{contract.module}")
    assert module.__name__ == f"strictops.ops.{contract.module}"
    assert meta.CONTRACT is contract and module.contract is meta
    path = contract.module.replace(".", "/")
    for part in ("reference", "launch_interpreted", "example_inputs", op.split("::")[1]):
        assert callable(getattr(module, part, None)), f"{op}: ops/{path}.py lacks {part}"
    assert set(meta.NEAR_MISSES) == set(contract.rules)
    for path in (f"ops/{path}.py", f"meta/{path}.py", f"meta/strategies/{contract.stem}.py",
                 f"tests/test_{contract.stem}.py",
                 f"compile_tests/test_{contract.stem}_compile.py",
                 f"benchmarks/bench_{contract.stem}.py"):
        assert (ROOT / path).is_file(), f"{op}: missing {path}"


@pytest.mark.parametrize("op", REGISTERED)
def test_schema_declares_exactly_the_contract_mutations(op):
    namespace, name = op.split("::")
    schema = getattr(getattr(torch.ops, namespace), name).default._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == set(CONTRACTS[op].mutates)


@pytest.mark.parametrize("op", REGISTERED)
def test_fake_registration_runs_the_contract(op):
    """The fake is registered and is not a bare allocator: a near miss fails on fake tensors."""
    entry = torch._library.simple_registry.singleton.find(op)
    assert entry.fake_impl.kernel is not None, f"{op} has no fake implementation"
    module = OP_MODULES[op]
    spec = {k: build_value(t, lambda t: TensorSpec(tuple(t.shape), t.dtype, "cuda:0"),
                           torch.Tensor)  # None, Python scalars: passed as they are
            for k, t in module.example_inputs("cpu", True, torch.Generator().manual_seed(0)).items()}
    rule = CONTRACTS[op].rules[-1]
    with fake_mode():
        args = build(module.contract.NEAR_MISSES[rule](spec))
        _, message = CONTRACTS[op].expected_error(rule, **args)
        namespace, name = op.split("::")
        # The op's own arguments, where the public function takes them in another form.
        op_args = getattr(module, "op_arguments", lambda **kw: kw)(**args)
        with pytest.raises(ValueError) as info:
            getattr(getattr(torch.ops, namespace), name)(**op_args)
    assert str(info.value) == message


@pytest.mark.parametrize("bare", ["ops", "meta"])
def test_no_bare_top_level_package(bare, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", f"import {bare}"], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr
