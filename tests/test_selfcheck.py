"""The self-check's own rows for every op (``python -m strictops``): the example call's exact
result (Triton interpreter here) and its fake-tensor trace as one graph. The bad-call rows are
the contract tests' (``tests/test_contracts.py``); these catch an op module whose example call
drifts from its contract or its kernel."""

from __future__ import annotations

import pytest

from strictops.ops import OP_MODULES, selfcheck


@pytest.mark.parametrize("op", sorted(OP_MODULES))
def test_example_call_is_exact_and_traces_as_one_graph(op):
    module = OP_MODULES[op]
    for row in (selfcheck.check_result(op, module),
                selfcheck.check_trace(op, module, selfcheck._fake_spec(module))):
        assert row.passed, f"{row.check}: {row.detail}"
