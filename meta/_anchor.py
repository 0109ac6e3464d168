"""The original kernels, for side-by-side tests and benchmarks only.

A machine that compares ours with the kernels they replace builds them into the repository
root's ``.anchor`` folder; nothing in ``strictops`` needs it, and where it is absent the
comparisons are skipped. sglang's ``mamba_state_scatter_triton`` (``sgl_mamba``) imports its
pointer-table helper from elsewhere in sglang; here that helper is one int64 tensor of the rows.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import torch

FOLDER = Path(__file__).resolve().parents[1] / ".anchor"


def _pointer_table(rows, device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64, device=device)


def load(name: str) -> ModuleType | None:
    """The module ``name`` of the ``.anchor`` folder, or None when it is absent."""
    if not (FOLDER / f"{name}.py").is_file():
        return None
    if str(FOLDER) not in sys.path:
        sys.path.insert(0, str(FOLDER))
    module = importlib.import_module(name)
    if name == "sgl_mamba" and module.make_ptr_table is None:
        module.make_ptr_table = _pointer_table
    return module
