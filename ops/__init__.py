"""strictops.ops: the ops, registered in ``torch.ops.strictops``.

Import the public functions from here; each has the name, argument order and error messages of
the serving kernel it replaces::

    from strictops.ops import fused_mamba_state_scatter_with_mask

The ops live in one folder per family: :mod:`strictops.ops.mamba`,
:mod:`strictops.ops.sparse_mla`, :mod:`strictops.ops.transport`; what they share at run time,
in :mod:`strictops.ops._runtime`.
"""

import importlib

from strictops.meta import CONTRACTS
from strictops.ops.mamba.after_verify import scatter_mamba_states_after_mtp_verify
from strictops.ops.mamba.commit_indices import fused_commit_track_indices
from strictops.ops.mamba.conv_window_scatter import fused_conv_window_scatter_with_mask
from strictops.ops.mamba.conv_window_scatter_multi import fused_conv_window_scatter_multi
from strictops.ops.mamba.state_scatter import fused_mamba_state_scatter_with_mask
from strictops.ops.mamba.track_states import (track_mamba_states_all_layers,
                                              track_mamba_states_if_needed)
from strictops.ops.sparse_mla.prefill import sparse_mla_q8kv8_prefill_fwd
from strictops.ops.transport.consumer import TransportConsumer
from strictops.ops.transport.pool import Lease, copy_and_publish
from strictops.ops.transport.producer import TransportPool

# One entry per op: qualified op name -> the module holding its kernel, public function and
# plain-PyTorch reference (``reference``) and interpreter launcher (``launch_interpreted``):
# ``strictops.ops.<family>.<module>``, the contract's module path (its contract is
# ``strictops.meta.<family>.<module>``).
OP_MODULES = {op: importlib.import_module(f"strictops.ops.{contract.module}")
              for op, contract in CONTRACTS.items()}

__all__ = [
    "OP_MODULES",
    "Lease",
    "TransportConsumer",
    "TransportPool",
    "copy_and_publish",
    "fused_commit_track_indices",
    "fused_conv_window_scatter_multi",
    "fused_conv_window_scatter_with_mask",
    "fused_mamba_state_scatter_with_mask",
    "scatter_mamba_states_after_mtp_verify",
    "sparse_mla_q8kv8_prefill_fwd",
    "track_mamba_states_all_layers",
    "track_mamba_states_if_needed",
]
