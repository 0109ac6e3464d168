"""Fixtures shared by the tests."""

import sys
from pathlib import Path

import pytest
import torch

ANCHOR = Path(__file__).resolve().parents[1] / ".anchor"


@pytest.fixture
def sglang_mamba():
    """sglang's ``mamba_state_scatter_triton`` module from the repository's ``.anchor`` checkout
    (a comparator for GPU tests only); the test is skipped when the checkout is absent. Its
    pointer-table helper is not part of the file: here it is one int64 tensor of the rows."""
    if not (ANCHOR / "sgl_mamba.py").is_file():
        pytest.skip("sglang's original (.anchor/sgl_mamba.py) is absent")
    sys.path.insert(0, str(ANCHOR))
    import sgl_mamba

    if sgl_mamba.make_ptr_table is None:
        sgl_mamba.make_ptr_table = lambda rows, device: torch.tensor(rows, dtype=torch.int64,
                                                                     device=device)
    return sgl_mamba
