"""Every compile test starts from a fresh Dynamo: no cached graph, no counted graph break or
recompile from an earlier test."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()
