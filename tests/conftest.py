"""Fixtures shared by the tests."""

import pytest

from strictops.meta.testing import anchor_module


@pytest.fixture
def sglang_mamba():
    """sglang's ``mamba_state_scatter_triton`` module from the repository's ``.anchor`` folder
    (a comparator for GPU tests only); the test is skipped when the folder is absent."""
    return anchor_module("sgl_mamba")
