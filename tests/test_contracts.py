"""Every op's contract, through its public strategies (``strictops.meta.strategies``).

For every public op: each near miss (one rule broken at a time) raises exactly that rule's
``ValueError`` on the eager path (fake tensors, concrete sizes) and on the fake path (symbolic
sizes, what ``torch.compile``/``torch.export`` trace), and again while ``torch.compile`` traces
the public function; each valid call passes the contract and traces as one graph.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

import strictops.ops
from strictops.meta import CONTRACTS, strategies

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _public(op: str):
    return getattr(strictops.ops, op)


def test_every_op_has_strategies():
    assert {c.op.split("::", 1)[1] for c in CONTRACTS.values()} <= set(strategies.OPS)
    assert set(strategies.OPS) <= set(strictops.ops.__all__)


@pytest.mark.parametrize("op", strategies.OPS)
def test_near_misses_raise_the_rule_error_eager_and_fake(op):
    @settings(SETTINGS, max_examples=60)
    @given(call=strategies.calls(op, valid=False))
    def check(call):
        assert call.rule is not None
        assert strategies.failures(_public(op), call, traced=False) == []

    check()


@pytest.mark.parametrize("op", strategies.OPS)
def test_near_misses_fail_while_tracing(op):
    @settings(SETTINGS, max_examples=12)
    @given(call=strategies.calls(op, valid=False))
    def check(call):
        assert strategies.failures(_public(op), call) == []

    check()


@pytest.mark.parametrize("op", strategies.OPS)
def test_valid_calls_pass_and_trace_as_one_graph(op):
    @settings(SETTINGS, max_examples=8)
    @given(call=strategies.calls(op))
    def check(call):
        assert call.rule is None
        assert strategies.failures(_public(op), call) == []

    check()
