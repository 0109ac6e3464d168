"""Contract of ``strictops::fused_commit_track_indices``.

Arguments
---------
accept_index : Tensor ``[batch, accepted_tokens]``, int32 or int64, CUDA, any strides. Row ``b``
    holds the accepted draft tokens of request ``b`` as indices into ``batch * draft_token_num``
    verify rows.
accept_lens : Tensor ``[batch]``, int32 or int64, on ``accept_index``'s device.
seq_lens : Tensor ``[batch]`` or None, int32 or int64: sequence lengths before this step
    (``None``: no interval tracking, the second result is None).
draft_token_num : int >= 1, verify rows per request.
mamba_track_interval : int >= 1 when ``seq_lens`` is given (unused otherwise).

The original kernel has no checks of its own (a bad call reads out of bounds or divides by
zero); every rule here is added, in the project's "Expected X, but got Y" form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strictops.meta._contract import Check, Contract
from strictops.meta._specs import TensorSpec, other_device as _other_device, with_changes as _with

OP_NAME = "fused_commit_track_indices"

INDEX_DTYPES = (torch.int32, torch.int64)


def _of(t, attr: str):
    """``t.<attr>``, or None for an absent optional tensor (for messages)."""
    return None if t is None else getattr(t, attr)


def _tensors(a):
    return [t for t in (a.accept_index, a.accept_lens, a.seq_lens) if t is not None]


CHECKS = (
    Check(
        "same_device",
        lambda a: all(t.device == a.accept_index.device for t in _tensors(a)),
        lambda accept_index, accept_lens, seq_lens, **_: (
            f"Expected every tensor on accept_index's device, but got {accept_index.device=} "
            f"{accept_lens.device=} seq_lens.device={_of(seq_lens, 'device')!r}"
        ),
    ),
    Check(
        "cuda",
        lambda a: all(t.is_cuda for t in _tensors(a)),
        lambda accept_index, accept_lens, seq_lens, **_: (
            f"{OP_NAME} only supports CUDA tensors, but got {accept_index.device=} "
            f"{accept_lens.device=} seq_lens.device={_of(seq_lens, 'device')!r}"
        ),
    ),
    Check(
        "ranks",
        lambda a: a.accept_index.ndim == 2 and a.accept_lens.ndim == 1
        and (a.seq_lens is None or a.seq_lens.ndim == 1),
        lambda accept_index, accept_lens, seq_lens, **_: (
            "Expected accept_index [batch, accepted_tokens], accept_lens [batch] and seq_lens "
            f"[batch], but got {accept_index.shape=} {accept_lens.shape=} "
            f"seq_lens.shape={_of(seq_lens, 'shape')!r}"
        ),
    ),
    Check(
        "batch",
        lambda a: a.accept_index.shape[0] == a.accept_lens.shape[0],
        lambda accept_index, accept_lens, **_: (
            "Expected one accept_index row per request, but got "
            f"{accept_index.shape[0]=} vs {accept_lens.shape[0]=}"
        ),
    ),
    Check(
        "seq_lens_batch",
        lambda a: a.seq_lens is None or a.seq_lens.shape[0] == a.accept_lens.shape[0],
        lambda accept_lens, seq_lens, **_: (
            "Expected one seq_lens entry per request, but got "
            f"{seq_lens.shape[0]=} vs {accept_lens.shape[0]=}"
        ),
    ),
    Check(
        "index_dtypes",
        lambda a: all(t.dtype in INDEX_DTYPES for t in _tensors(a)),
        lambda accept_index, accept_lens, seq_lens, **_: (
            f"Expected int32 or int64 index tensors, but got {accept_index.dtype=} "
            f"{accept_lens.dtype=} seq_lens.dtype={_of(seq_lens, 'dtype')!r}"
        ),
    ),
    Check(
        "draft_token_num",
        lambda a: a.draft_token_num >= 1,
        lambda draft_token_num, **_: (
            f"Expected draft_token_num >= 1, but got draft_token_num={draft_token_num}"
        ),
    ),
    Check(
        "track_interval",
        lambda a: a.seq_lens is None or a.mamba_track_interval >= 1,
        lambda mamba_track_interval, **_: (
            "Expected mamba_track_interval >= 1 with seq_lens given, but got "
            f"mamba_track_interval={mamba_track_interval}"
        ),
    ),
)

CONTRACT = Contract(op=f"strictops::{OP_NAME}", stem="mamba_commit_indices",
                    module="mamba.commit_indices",
                    checks=CHECKS)


ARGUMENTS = ("accept_index", "accept_lens", "seq_lens", "draft_token_num", "mamba_track_interval")


def validate(accept_index, accept_lens, seq_lens, draft_token_num, mamba_track_interval) -> None:
    """Run the contract on real, fake or symbolic arguments; raise the first broken rule."""
    CONTRACT.validate(**dict(zip(ARGUMENTS, (accept_index, accept_lens, seq_lens,
                                              draft_token_num, mamba_track_interval))))


# --------------------------------------------------------------------------------------------
# The input space, as data: valid calls and one near miss per rule.


@dataclass(frozen=True)
class Dims:
    """Free parameters of a valid call."""

    batch: int
    accepted_tokens: int
    draft_token_num: int = 4
    mamba_track_interval: int = 8
    with_seq_lens: bool = True
    index_dtypes: tuple[torch.dtype, torch.dtype, torch.dtype] = (torch.int64,) * 3
    device: str = "cuda:0"


def valid_spec(d: Dims) -> dict:
    ai, al, sl = d.index_dtypes
    return {
        "accept_index": TensorSpec((d.batch, d.accepted_tokens), ai, d.device),
        "accept_lens": TensorSpec((d.batch,), al, d.device),
        "seq_lens": TensorSpec((d.batch,), sl, d.device) if d.with_seq_lens else None,
        "draft_token_num": d.draft_token_num,
        "mamba_track_interval": d.mamba_track_interval,
    }


def _with_seq_lens(spec: dict) -> dict:
    if spec["seq_lens"] is not None:
        return spec
    return {**spec, "seq_lens": spec["accept_lens"]}


NEAR_MISSES = {
    "cuda": lambda s: {k: (v.replace(device="cpu") if isinstance(v, TensorSpec) else v)
                       for k, v in s.items()},
    "same_device": lambda s: _with(s, accept_lens={
        "device": _other_device(s["accept_index"].device)}),
    "ranks": lambda s: _with(s, accept_lens={"shape": (*s["accept_lens"].shape, 1)}),
    "batch": lambda s: _with(s, accept_index={
        "shape": (s["accept_index"].shape[0] + 1, s["accept_index"].shape[1])}),
    "seq_lens_batch": lambda s: _with(_with_seq_lens(s), seq_lens={
        "shape": (s["accept_lens"].shape[0] + 2,)}),
    "index_dtypes": lambda s: _with(s, accept_lens={"dtype": torch.float32}),
    "draft_token_num": lambda s: {**s, "draft_token_num": 0},
    "track_interval": lambda s: {**_with_seq_lens(s), "mamba_track_interval": 0},
}
