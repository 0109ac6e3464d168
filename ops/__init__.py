"""strictops.ops: the ops, registered in ``torch.ops.strictops``.

Import the public functions from here; each has the name, argument order and error messages of
the serving kernel it replaces::

    from strictops.ops import fused_mamba_state_scatter_with_mask
"""

from . import conv_window_scatter, conv_window_scatter_multi, mamba_after_verify
from . import mamba_commit_indices, mamba_state_scatter, mamba_track_states, sparse_mla_prefill
from .conv_window_scatter import fused_conv_window_scatter_with_mask
from .conv_window_scatter_multi import fused_conv_window_scatter_multi
from .mamba_after_verify import scatter_mamba_states_after_mtp_verify
from .mamba_commit_indices import fused_commit_track_indices
from .mamba_track_states import track_mamba_states_all_layers, track_mamba_states_if_needed
from .mamba_state_scatter import fused_mamba_state_scatter_with_mask
from .sparse_mla_prefill import sparse_mla_q8kv8_prefill_fwd
from . import transport_pool, transport_runtime
from .transport_pool import Lease, copy_and_publish
from .transport_runtime import TransportConsumer, TransportPool

# One entry per op: qualified op name -> the module holding its kernel, public function and
# plain-PyTorch reference (``reference``) and interpreter launcher (``launch_interpreted``).
OP_MODULES = {
    conv_window_scatter.contract.CONTRACT.op: conv_window_scatter,
    conv_window_scatter_multi.contract.CONTRACT.op: conv_window_scatter_multi,
    mamba_state_scatter.contract.CONTRACT.op: mamba_state_scatter,
    sparse_mla_prefill.contract.CONTRACT.op: sparse_mla_prefill,
    transport_pool.contract.CONTRACT.op: transport_pool,
    mamba_commit_indices.contract.CONTRACT.op: mamba_commit_indices,
    mamba_track_states.contract.CONTRACT.op: mamba_track_states,
}

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
