"""strictops.ops: the ops, registered in ``torch.ops.strictops``.

Import the public functions from here; each has the name, argument order and error messages of
the serving kernel it replaces::

    from strictops.ops import fused_mamba_state_scatter_with_mask
"""

from . import mamba_state_scatter
from .mamba_state_scatter import fused_mamba_state_scatter_with_mask

# One entry per op: qualified op name -> the module holding its kernel, public function and
# plain-PyTorch reference (``reference``) and interpreter launcher (``launch_interpreted``).
OP_MODULES = {
    mamba_state_scatter.contract.CONTRACT.op: mamba_state_scatter,
}

__all__ = ["OP_MODULES", "fused_mamba_state_scatter_with_mask"]
