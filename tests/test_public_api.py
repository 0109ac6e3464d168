"""What users import and call stays put: the public names of ``strictops.ops`` and the
registered op names, whatever the layout of the modules behind them."""

from __future__ import annotations

import inspect

import torch

import strictops.ops
from strictops.meta import CONTRACTS

PUBLIC = {
    # name: the family module that defines it
    "Lease": "strictops.meta.transport.pool",
    "TransportConsumer": "strictops.ops.transport.consumer",
    "TransportPool": "strictops.ops.transport.producer",
    "copy_and_publish": "strictops.ops.transport.pool",
    "fused_commit_track_indices": "strictops.ops.mamba.commit_indices",
    "fused_conv_window_scatter_multi": "strictops.ops.mamba.conv_window_scatter_multi",
    "fused_conv_window_scatter_with_mask": "strictops.ops.mamba.conv_window_scatter",
    "fused_mamba_state_scatter_with_mask": "strictops.ops.mamba.state_scatter",
    "scatter_mamba_states_after_mtp_verify": "strictops.ops.mamba.after_verify",
    "sparse_mla_q8kv8_prefill_fwd": "strictops.ops.sparse_mla.prefill",
    "track_mamba_states_all_layers": "strictops.ops.mamba.track_states",
    "track_mamba_states_if_needed": "strictops.ops.mamba.track_states",
}
REGISTERED = [
    "strictops::copy_and_publish",
    "strictops::fused_commit_track_indices",
    "strictops::fused_conv_window_scatter_multi",
    "strictops::fused_conv_window_scatter_with_mask",
    "strictops::fused_mamba_state_scatter_with_mask",
    "strictops::sparse_mla_q8kv8_prefill_fwd",
    "strictops::track_mamba_states_all_layers",
    "strictops_kernels::sparse_mla_ws_launch",
]


def test_public_names_are_pinned():
    assert sorted(strictops.ops.__all__) == sorted(["OP_MODULES", *PUBLIC])
    for name, module in PUBLIC.items():
        value = getattr(strictops.ops, name)
        assert inspect.getmodule(value).__name__ == module, name


def test_registered_op_names_are_pinned():
    names = sorted(n for n in torch._C._dispatch_get_all_op_names()
                   if n.split("::")[0] in ("strictops", "strictops_kernels"))
    assert names == REGISTERED
    assert sorted(CONTRACTS) == [n for n in REGISTERED if n.startswith("strictops::")]
