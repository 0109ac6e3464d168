"""Fixtures shared by the tests."""

import pytest

from strictops.meta.testing import anchor_module, load_hypothesis_profile

load_hypothesis_profile()


@pytest.fixture
def sglang_mamba():
    """sglang's ``mamba_state_scatter_triton`` module from the repository's ``.anchor`` folder
    (a comparator for GPU tests only); the test is skipped when the folder is absent."""
    return anchor_module("sgl_mamba")


@pytest.fixture
def host_recorder():
    """The C++ eager path (strictops.ops._runtime.host_path) with its launches recorded, not made: the
    list each launch is appended to (function, grid, threads, shared memory, num_ctas, PDL,
    cooperative, stream, packed parameters, their offsets)."""
    from strictops.ops._runtime import host_path as _host_path
    launches = []
    _host_path.configure(recorder=lambda *launch: launches.append(launch))
    try:
        yield launches
    finally:
        _host_path.configure()
