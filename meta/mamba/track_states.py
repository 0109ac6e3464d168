"""Contract of ``strictops::track_mamba_states_all_layers`` (also behind
``track_mamba_states_if_needed``, which passes its per-layer states with a layer dim of 1).

Arguments
---------
conv_states_pool : Tensor ``[num_layers, pool_size, *conv_state]``, CUDA, mutated in place.
    Dims ``2..`` of one ``(layer, slot)`` entry are contiguous; layer and slot strides are free.
ssm_states_pool : Tensor ``[num_layers, pool_size', *ssm_state]``, same rules, same layers.
cache_indices, mamba_track_indices : Tensor ``[>= batch_size]``, int32 or int64, any stride.
mamba_track_mask : Tensor ``[>= batch_size]``, bool, int32 or int64 (non-zero: track).
batch_size : int, ``0 <= batch_size <= `` every index tensor's length.
check_freed_slots : bool, accepted for the original's signature (out-of-range slots are always
    skipped).

The original launcher checks nothing (a wrong rank or a non-contiguous entry copies the wrong
elements, a bad batch size reads past the index tensors); every rule here is added.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strictops.meta._contract import Check, Contract, contiguous_from, sym_all
from strictops.meta._specs import TensorSpec, other_device as _other_device, with_changes as _with

OP_NAME = "track_mamba_states_all_layers"

INDEX_DTYPES = (torch.int32, torch.int64)
MASK_DTYPES = (torch.bool, torch.int32, torch.int64)
_INDEX_NAMES = ("cache_indices", "mamba_track_mask", "mamba_track_indices")


def _all(a):
    return (a.conv_states_pool, a.ssm_states_pool, a.cache_indices, a.mamba_track_mask,
            a.mamba_track_indices)


def _lengths(**kw) -> str:
    return " ".join(f"{n}.shape={tuple(kw[n].shape)}" for n in _INDEX_NAMES)


CHECKS = (
    Check(
        "same_device",
        lambda a: all(t.device == a.conv_states_pool.device for t in _all(a)),
        lambda conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask,
        mamba_track_indices, **_: (
            "Expected every tensor on conv_states_pool's device, but got "
            f"{conv_states_pool.device=} {ssm_states_pool.device=} {cache_indices.device=} "
            f"{mamba_track_mask.device=} {mamba_track_indices.device=}"
        ),
    ),
    Check(
        "cuda",
        lambda a: a.conv_states_pool.is_cuda,
        lambda conv_states_pool, **_: (
            f"{OP_NAME} only supports CUDA tensors, but got {conv_states_pool.device=}"
        ),
    ),
    Check(
        "ranks",
        lambda a: a.conv_states_pool.ndim >= 2 and a.ssm_states_pool.ndim >= 2,
        lambda conv_states_pool, ssm_states_pool, **_: (
            "Expected conv_states_pool and ssm_states_pool of shape [num_layers, pool_size, ...], "
            f"but got {conv_states_pool.shape=} {ssm_states_pool.shape=}"
        ),
    ),
    Check(
        "layers",
        lambda a: a.conv_states_pool.shape[0] == a.ssm_states_pool.shape[0],
        lambda conv_states_pool, ssm_states_pool, **_: (
            "Expected as many conv as ssm layers, but got "
            f"{conv_states_pool.shape[0]=} vs {ssm_states_pool.shape[0]=}"
        ),
    ),
    Check(
        "indices_1d",
        lambda a: a.cache_indices.ndim == 1 and a.mamba_track_mask.ndim == 1
        and a.mamba_track_indices.ndim == 1,
        lambda **kw: f"Expected 1-D index tensors, but got {_lengths(**kw)}",
    ),
    Check(
        "index_dtypes",
        lambda a: a.cache_indices.dtype in INDEX_DTYPES
        and a.mamba_track_indices.dtype in INDEX_DTYPES,
        lambda cache_indices, mamba_track_indices, **_: (
            "Expected int32 or int64 indices, but got "
            f"{cache_indices.dtype=} {mamba_track_indices.dtype=}"
        ),
    ),
    Check(
        "mask_dtype",
        lambda a: a.mamba_track_mask.dtype in MASK_DTYPES,
        lambda mamba_track_mask, **_: (
            f"Expected a bool, int32 or int64 mamba_track_mask, but got {mamba_track_mask.dtype=}"
        ),
    ),
    Check(
        "batch_size",
        lambda a: sym_all([a.batch_size >= 0] + [
            a.batch_size <= getattr(a, n).shape[0] for n in _INDEX_NAMES]),
        lambda batch_size, **kw: (
            "Expected 0 <= batch_size <= the length of every index tensor, but got "
            f"batch_size={batch_size} {_lengths(**kw)}"
        ),
    ),
    Check(
        "conv_entry_contiguous",
        lambda a: contiguous_from(a.conv_states_pool, 2),
        lambda conv_states_pool, **_: (
            f"Expected conv_states_pool entry dims (dims 2..{conv_states_pool.ndim - 1}) "
            f"contiguous, but got shape={tuple(conv_states_pool.shape)} "
            f"strides={tuple(conv_states_pool.stride())}"
        ),
    ),
    Check(
        "ssm_entry_contiguous",
        lambda a: contiguous_from(a.ssm_states_pool, 2),
        lambda ssm_states_pool, **_: (
            f"Expected ssm_states_pool entry dims (dims 2..{ssm_states_pool.ndim - 1}) "
            f"contiguous, but got shape={tuple(ssm_states_pool.shape)} "
            f"strides={tuple(ssm_states_pool.stride())}"
        ),
    ),
)

CONTRACT = Contract(op=f"strictops::{OP_NAME}", stem="mamba_track_states",
                    module="mamba.track_states",
                    checks=CHECKS,
                    mutates=("conv_states_pool", "ssm_states_pool"))


ARGUMENTS = ("conv_states_pool", "ssm_states_pool", "cache_indices", "mamba_track_mask",
             "mamba_track_indices", "batch_size", "check_freed_slots")


def validate(conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask,
             mamba_track_indices, batch_size, check_freed_slots=False) -> None:
    """Run the contract on real, fake or symbolic arguments; raise the first broken rule."""
    CONTRACT.validate(**dict(zip(ARGUMENTS, (
        conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask, mamba_track_indices,
        batch_size, check_freed_slots))))


# --------------------------------------------------------------------------------------------
# The input space, as data: valid calls and one near miss per rule.


@dataclass(frozen=True)
class Dims:
    """Free parameters of a valid call."""

    num_layers: int
    pool_size: int
    conv_state: tuple[int, ...]
    ssm_state: tuple[int, ...]
    batch: int
    batch_size: int | None = None  # None: batch
    conv_dtype: torch.dtype = torch.bfloat16
    ssm_dtype: torch.dtype = torch.float32
    index_dtypes: tuple[torch.dtype, torch.dtype] = (torch.int64, torch.int64)
    mask_dtype: torch.dtype = torch.bool
    device: str = "cuda:0"


def valid_spec(d: Dims) -> dict:
    src, dst = d.index_dtypes
    return {
        "conv_states_pool": TensorSpec((d.num_layers, d.pool_size, *d.conv_state), d.conv_dtype,
                                       d.device),
        "ssm_states_pool": TensorSpec((d.num_layers, d.pool_size, *d.ssm_state), d.ssm_dtype,
                                      d.device),
        "cache_indices": TensorSpec((d.batch,), src, d.device),
        "mamba_track_mask": TensorSpec((d.batch,), d.mask_dtype, d.device),
        "mamba_track_indices": TensorSpec((d.batch,), dst, d.device),
        "batch_size": d.batch if d.batch_size is None else d.batch_size,
        "check_freed_slots": False,
    }


def _gap_entry(name: str):
    """Near miss: an entry dim of ``spec[name]`` no longer contiguous (one made to hold two
    elements first where the entry has none larger than one)."""

    def mutate(spec: dict) -> dict:
        t = spec[name]
        if all(s == 1 for s in t.shape[2:]):
            t = t.replace(shape=(*t.shape, 2))
        dim = max(i for i in range(2, len(t.shape)) if t.shape[i] > 1)
        return {**spec, name: t.with_gap(dim)}

    return mutate


NEAR_MISSES = {
    "same_device": lambda s: _with(s, mamba_track_indices={
        "device": _other_device(s["conv_states_pool"].device)}),
    "cuda": lambda s: {k: (v.replace(device="cpu") if isinstance(v, TensorSpec) else v)
                       for k, v in s.items()},
    "ranks": lambda s: _with(s, ssm_states_pool={"shape": s["ssm_states_pool"].shape[:1]}),
    "layers": lambda s: _with(s, ssm_states_pool={
        "shape": (s["ssm_states_pool"].shape[0] + 1, *s["ssm_states_pool"].shape[1:])}),
    "indices_1d": lambda s: _with(s, mamba_track_mask={
        "shape": (*s["mamba_track_mask"].shape, 1)}),
    "index_dtypes": lambda s: _with(s, cache_indices={"dtype": torch.float32}),
    "mask_dtype": lambda s: _with(s, mamba_track_mask={"dtype": torch.float16}),
    "batch_size": lambda s: {**s, "batch_size": s["cache_indices"].shape[0] + 1},
    "conv_entry_contiguous": _gap_entry("conv_states_pool"),
    "ssm_entry_contiguous": _gap_entry("ssm_states_pool"),
}
