"""The Mamba state commit after speculative verification, composed of strict ops.

``scatter_mamba_states_after_mtp_verify`` writes, for every request, the SSM state and the
conv windows of its last accepted draft step into its cache slot, and (with track indices) the
states of the step to track into its track slot. It is a Python composition, not an op of its
own: under ``torch.compile`` it traces into the ops it calls, each with its contract and its
Triton launch, as one graph with no break and no recompile when the batch or the accepted
lengths change (index values are read on the device only).

* SSM: ``fused_mamba_state_scatter_with_mask(temporal, intermediate_ssm, ...)``, once with
  ``(state_indices_tensor, last_correct_step_indices)``, once more with the track set.
* Conv: without ``src_indices_raw``, one ``fused_conv_window_scatter_multi`` over every conv
  type and both sets (as the original's multi-pair path, whose pointer table this replaces);
  otherwise, or for pairs that one launch cannot serve,
  ``fused_conv_window_scatter_with_mask(conv[i], intermediate_conv_window[i], ...)`` for every
  conv type with the commit set, then with the track set. Both write the same: the track set
  after the commit set, and within a set the later of two requests naming one slot.

Empty caches (``numel() == 0``) are skipped, as in the original; emptiness is decided from
sizes known at trace time only, so a traced call never guards on a size.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from strictops.meta.mamba.conv_window_scatter_multi import MAX_PAIRS

from strictops.ops.mamba.conv_window_scatter import fused_conv_window_scatter_with_mask
from strictops.ops.mamba.conv_window_scatter_multi import fused_conv_window_scatter_multi
from strictops.ops.mamba.state_scatter import fused_mamba_state_scatter_with_mask

__all__ = ["MambaCaches", "scatter_mamba_states_after_mtp_verify", "reference"]


@dataclasses.dataclass
class MambaCaches:
    """What ``scatter_mamba_states_after_mtp_verify`` reads of its cache argument; sglang's
    speculative cache object, or any other object with these attributes, will do as well."""

    temporal: torch.Tensor  # [num_layers, cache_size, *ssm_state]
    intermediate_ssm: torch.Tensor  # [num_layers, spec_size, draft_tokens, *ssm_state]
    conv: Sequence[torch.Tensor]  # each [num_layers, cache_size, dim_i, K_i - 1]
    intermediate_conv_window: Sequence[torch.Tensor]  # each [.., spec_size, draft_tokens, ..]


def _empty(t: torch.Tensor) -> bool:
    # True only when the size is known to be 0 (a concrete size, or a traced size specialised
    # to 0); a symbolic size is not empty, and asking adds no guard.
    return statically_known_true(t.numel() == 0)


def _one_launch_serves(pairs) -> bool:
    """Whether ``fused_conv_window_scatter_multi`` takes these pairs: 1 to ``MAX_PAIRS`` of
    them sharing layers, cache slots, verify rows and draft steps (sglang's conv types always
    do). Decided on sizes known equal (concrete, or one symbol), never by a guard."""
    if not 0 < len(pairs) <= MAX_PAIRS:
        return False
    (dst0, src0), shared = pairs[0], []
    for dst, src in pairs[1:]:
        shared += [dst.shape[0] == dst0.shape[0], dst.shape[1] == dst0.shape[1],
                   src.shape[0] == src0.shape[0], src.shape[1] == src0.shape[1],
                   src.shape[2] == src0.shape[2]]
    return all(statically_known_true(c) for c in shared)


def _check_track_set(mamba_track_indices, mamba_steps_to_track) -> None:
    if mamba_track_indices is not None and mamba_steps_to_track is None:
        raise ValueError("Expected mamba_steps_to_track with mamba_track_indices, but got "
                         "mamba_steps_to_track=None")


def scatter_mamba_states_after_mtp_verify(
    mamba_caches: MambaCaches,
    state_indices_tensor: torch.Tensor,
    last_correct_step_indices: torch.Tensor,
    mamba_track_indices: Optional[torch.Tensor],
    mamba_steps_to_track: Optional[torch.Tensor],
    src_indices_raw: Optional[torch.Tensor] = None,
) -> None:
    """Commit the accepted step's SSM and conv states of every request, in place.

    Parameters
    ----------
    mamba_caches : MambaCaches
        ``temporal`` / ``intermediate_ssm`` (the SSM cache and the per-step verify states),
        ``conv`` / ``intermediate_conv_window`` (per conv type: the conv cache and the verify
        windows, an overlapping view is fine).
    state_indices_tensor : torch.Tensor
        ``[n]`` int32/int64: each request's cache slot.
    last_correct_step_indices : torch.Tensor
        ``[n]`` int32/int64: the step to commit; ``< 0`` skips the request.
    mamba_track_indices, mamba_steps_to_track : torch.Tensor or None
        ``[n]`` each: track slots and the steps to keep there (``< 0`` skips); both or neither.
    src_indices_raw : torch.Tensor, optional
        ``[n]``: each request's verify row (default: row ``i``).

    Notes
    -----
    Requests with an index out of range are skipped; within one scatter, when two requests name
    one slot the later one wins, and the track set is written after the commit set. Each
    scatter's contract raises its ``ValueError`` before anything is launched for it.
    """
    _check_track_set(mamba_track_indices, mamba_steps_to_track)
    index_sets = [(state_indices_tensor, last_correct_step_indices)]
    if mamba_track_indices is not None:
        index_sets.append((mamba_track_indices, mamba_steps_to_track))

    ssm, intermediate_ssm = mamba_caches.temporal, mamba_caches.intermediate_ssm
    if not _empty(ssm):
        for slots, steps in index_sets:
            fused_mamba_state_scatter_with_mask(ssm, intermediate_ssm, slots, steps,
                                                src_indices_raw)
    pairs = [(conv, window)
             for conv, window in zip(mamba_caches.conv, mamba_caches.intermediate_conv_window)
             if not _empty(conv)]
    if src_indices_raw is None and _one_launch_serves(pairs):
        fused_conv_window_scatter_multi(pairs, state_indices_tensor, last_correct_step_indices,
                                        mamba_track_indices, mamba_steps_to_track)
        return
    for slots, steps in index_sets:
        for conv, window in pairs:
            fused_conv_window_scatter_with_mask(conv, window, slots, steps, src_indices_raw)


def reference(mamba_caches, state_indices_tensor, last_correct_step_indices,
              mamba_track_indices, mamba_steps_to_track, src_indices_raw=None):
    """Plain-PyTorch reference: ``(ssm, [conv_i])``, new tensors equal to the caches after the
    call (each scatter's own reference, applied in the order above)."""
    from strictops.ops.mamba import conv_window_scatter
    from strictops.ops.mamba import state_scatter as mamba_state_scatter

    _check_track_set(mamba_track_indices, mamba_steps_to_track)
    index_sets = [(state_indices_tensor, last_correct_step_indices)]
    if mamba_track_indices is not None:
        index_sets.append((mamba_track_indices, mamba_steps_to_track))
    ssm = mamba_caches.temporal
    convs = list(mamba_caches.conv)
    for slots, steps in index_sets:
        if ssm.numel():
            ssm = mamba_state_scatter.reference(ssm, mamba_caches.intermediate_ssm, slots, steps,
                                                src_indices_raw)
        convs = [conv_window_scatter.reference(c, w, slots, steps, src_indices_raw)
                 if c.numel() else c
                 for c, w in zip(convs, mamba_caches.intermediate_conv_window)]
    return ssm, convs
