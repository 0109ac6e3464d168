"""strictops.meta: the contracts of every strictops op.

``CONTRACTS`` maps each op's qualified name (``"strictops::<name>"``) to its :class:`Contract`;
the op's eager path and fake registration both run it. Each contract module
(``strictops.meta.<family>.<module>``, one folder per family as in :mod:`strictops.ops`: the
contract's ``module``) also declares the op's valid input space and one near miss per
rule, from which :mod:`strictops.meta.strategies` (hypothesis, the ``fuzz`` extra) draws calls
for the tests, the self-check and users fuzzing their own models.
"""

from strictops.meta._contract import Check, ConcreteTensor, Contract, concrete, hint, hint_size
from strictops.meta.mamba import commit_indices as _commit_indices
from strictops.meta.mamba import conv_window_scatter as _conv_window_scatter
from strictops.meta.mamba import conv_window_scatter_multi as _conv_window_scatter_multi
from strictops.meta.mamba import state_scatter as _state_scatter
from strictops.meta.mamba import track_states as _track_states
from strictops.meta.sparse_mla import prefill as _sparse_mla_prefill
from strictops.meta.transport import pool as _transport_pool

CONTRACTS: dict[str, Contract] = {
    m.CONTRACT.op: m.CONTRACT
    for m in (_conv_window_scatter, _conv_window_scatter_multi, _commit_indices, _state_scatter,
              _track_states, _sparse_mla_prefill, _transport_pool)
}

__all__ = ["CONTRACTS", "Check", "ConcreteTensor", "Contract", "concrete", "hint", "hint_size"]
