"""strictops.meta: the contracts of every strictops op.

``CONTRACTS`` maps each op's qualified name (``"strictops::<name>"``) to its :class:`Contract`;
the op's eager path and fake registration both run it. Each contract module
(``strictops.meta.<stem>``) also declares the op's valid input space and one near miss per
rule, from which :mod:`strictops.meta.strategies` (hypothesis, the ``fuzz`` extra) draws calls
for the tests, the self-check and users fuzzing their own models.
"""

from ._contract import Check, ConcreteTensor, Contract, concrete, hint, hint_size
from . import conv_window_scatter, conv_window_scatter_multi, mamba_commit_indices
from . import mamba_state_scatter, mamba_track_states
from . import sparse_mla_prefill
from . import transport_pool

CONTRACTS: dict[str, Contract] = {
    c.op: c
    for c in (conv_window_scatter.CONTRACT, conv_window_scatter_multi.CONTRACT,
              mamba_commit_indices.CONTRACT, mamba_state_scatter.CONTRACT,
              mamba_track_states.CONTRACT,
              sparse_mla_prefill.CONTRACT, transport_pool.CONTRACT)
}

__all__ = [
    "CONTRACTS",
    "Check",
    "ConcreteTensor",
    "Contract",
    "concrete",
    "conv_window_scatter",
    "conv_window_scatter_multi",
    "hint",
    "hint_size",
    "mamba_commit_indices",
    "mamba_state_scatter",
    "mamba_track_states",
    "sparse_mla_prefill",
    "transport_pool",
]
