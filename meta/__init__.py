"""strictops.meta: the contracts of every strictops op.

``CONTRACTS`` maps each op's qualified name (``"strictops::<name>"``) to its :class:`Contract`;
the op's eager path and fake registration both run it, and the tests derive their inputs from it.
"""

from ._contract import Check, ConcreteTensor, Contract, concrete, hint, hint_size
from . import mamba_state_scatter

CONTRACTS: dict[str, Contract] = {
    c.op: c
    for c in (mamba_state_scatter.CONTRACT,)
}

__all__ = [
    "CONTRACTS",
    "Check",
    "ConcreteTensor",
    "Contract",
    "concrete",
    "hint",
    "hint_size",
    "mamba_state_scatter",
]
