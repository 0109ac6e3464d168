"""Every compile test starts from a fresh Dynamo: no cached graph, no counted graph break or
recompile from an earlier test; the suite's hypothesis profile (strictops.meta.testing)."""

import pytest
import torch

from strictops.meta.testing import load_hypothesis_profile

load_hypothesis_profile()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()
