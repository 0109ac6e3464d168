"""strictops.ops: the ops, registered in ``torch.ops.strictops``.

Import the public functions from here; each has the name, argument order and error messages of
the serving kernel it replaces::

    from strictops.ops import fused_mamba_state_scatter_with_mask
"""

from . import conv_window_scatter, conv_window_scatter_multi, mamba_state_scatter, sparse_mla_prefill
from .conv_window_scatter import fused_conv_window_scatter_with_mask
from .conv_window_scatter_multi import fused_conv_window_scatter_multi
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
}

__all__ = [
    "OP_MODULES",
    "Lease",
    "TransportConsumer",
    "TransportPool",
    "copy_and_publish",
    "fused_conv_window_scatter_multi",
    "fused_conv_window_scatter_with_mask",
    "fused_mamba_state_scatter_with_mask",
    "sparse_mla_q8kv8_prefill_fwd",
]
