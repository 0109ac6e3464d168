"""Contract of ``strictops::fused_mamba_state_scatter_with_mask``.

Arguments
---------
dst : Tensor ``[num_layers, cache_size, *state_shape]``, mutated in place. Dims ``2..`` of one
    ``(layer, slot)`` entry are contiguous; the layer and slot strides may be anything.
src : Tensor ``[num_layers, spec_size, draft_tokens, *state_shape]``, contiguous, ``dst.dtype``.
dst_indices_raw, step_indices_raw : Tensor ``[total_requests]``, int32 or int64, on ``dst``'s
    device (any stride: they are read in place, never copied or cast).
src_indices_raw : Tensor ``[total_requests]`` or None; the source row of each request
    (``None`` means request ``i`` reads row ``i``).

The first nine rules are the original kernel's, in its order and wording. The rules marked
*added* close holes the original left open: a float index tensor was truncated silently, a CPU
index tensor reached the launch, and ``src.dtype != dst.dtype`` reinterpreted bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from strictops.meta._contract import Check, Contract, contiguous_from, sym_all
from strictops.meta._specs import TensorSpec, other_device as _other_device, with_changes as _with

OP_NAME = "fused_mamba_state_scatter_with_mask"

INDEX_DTYPES = (torch.int32, torch.int64)


def _entry_dims_contiguous(a):
    return contiguous_from(a.dst, 2)


def _trailing_dims_equal(a):
    if a.dst.ndim - 2 != a.src.ndim - 3:  # ranks are static: a plain branch specialises nothing
        return False
    return sym_all(x == y for x, y in zip(a.dst.shape[2:], a.src.shape[3:]))


CHECKS = (
    Check(
        "same_device",
        lambda a: a.dst.device == a.src.device,
        lambda dst, src, **_: f"dst and src must be on the same device. {dst.device=} {src.device=}",
    ),
    Check(
        "cuda",
        lambda a: a.dst.is_cuda and a.src.is_cuda,
        lambda **_: "fused_mamba_state_scatter_with_mask only supports CUDA tensors.",
    ),
    Check(
        "ranks",
        lambda a: a.dst.ndim >= 2 and a.src.ndim >= 3,
        lambda dst, src, **_: f"Unexpected tensor ranks: {dst.ndim=} {src.ndim=}",
    ),
    Check(
        "layer_dim",
        lambda a: a.dst.shape[0] == a.src.shape[0],
        lambda dst, src, **_: f"Layer dimension mismatch: {dst.shape[0]=} vs {src.shape[0]=}",
    ),
    Check(
        "trailing_dims",
        _trailing_dims_equal,
        lambda dst, src, **_: f"Trailing dims mismatch: {dst.shape[2:]=} vs {src.shape[3:]=}",
    ),
    Check(  # added
        "same_dtype",
        lambda a: a.dst.dtype == a.src.dtype,
        lambda dst, src, **_: f"dst and src must have the same dtype. {dst.dtype=} {src.dtype=}",
    ),
    Check(
        "indices_1d",
        lambda a: a.dst_indices_raw.ndim == 1 and a.step_indices_raw.ndim == 1,
        lambda dst_indices_raw, step_indices_raw, **_: (
            f"indices must be 1D: {dst_indices_raw.shape=} {step_indices_raw.shape=}"
        ),
    ),
    Check(
        "src_indices_1d",
        lambda a: a.src_indices_raw is None or a.src_indices_raw.ndim == 1,
        lambda dst_indices_raw, src_indices_raw, **_: (
            f"indices must be 1D: {dst_indices_raw.shape=} {src_indices_raw.shape=}"
        ),
    ),
    Check(
        "indices_length",
        lambda a: a.dst_indices_raw.shape[0] == a.step_indices_raw.shape[0],
        lambda dst_indices_raw, step_indices_raw, **_: (
            f"indices length mismatch: {dst_indices_raw.shape[0]=} vs {step_indices_raw.shape[0]=}"
        ),
    ),
    Check(
        "src_indices_length",
        lambda a: a.src_indices_raw is None
        or a.dst_indices_raw.shape[0] == a.src_indices_raw.shape[0],
        lambda dst_indices_raw, src_indices_raw, **_: (
            f"indices length mismatch: {dst_indices_raw.shape[0]=} vs {src_indices_raw.shape[0]=}"
        ),
    ),
    Check(  # added
        "indices_dtype",
        lambda a: a.dst_indices_raw.dtype in INDEX_DTYPES
        and a.step_indices_raw.dtype in INDEX_DTYPES,
        lambda dst_indices_raw, step_indices_raw, **_: (
            f"indices must be int32 or int64: {dst_indices_raw.dtype=} {step_indices_raw.dtype=}"
        ),
    ),
    Check(  # added
        "src_indices_dtype",
        lambda a: a.src_indices_raw is None or a.src_indices_raw.dtype in INDEX_DTYPES,
        lambda dst_indices_raw, src_indices_raw, **_: (
            f"indices must be int32 or int64: {dst_indices_raw.dtype=} {src_indices_raw.dtype=}"
        ),
    ),
    Check(  # added
        "indices_device",
        lambda a: a.dst_indices_raw.device == a.dst.device
        and a.step_indices_raw.device == a.dst.device,
        lambda dst, dst_indices_raw, step_indices_raw, **_: (
            f"indices must be on dst's device: {dst.device=} "
            f"{dst_indices_raw.device=} {step_indices_raw.device=}"
        ),
    ),
    Check(  # added
        "src_indices_device",
        lambda a: a.src_indices_raw is None or a.src_indices_raw.device == a.dst.device,
        lambda dst, src_indices_raw, **_: (
            f"indices must be on dst's device: {dst.device=} {src_indices_raw.device=}"
        ),
    ),
    Check(
        "dst_entry_contiguous",
        _entry_dims_contiguous,
        lambda dst, **_: (
            "fused_mamba_state_scatter_with_mask: dst entry dims "
            f"(dims 2..{dst.ndim - 1}) must be contiguous; "
            f"got shape={tuple(dst.shape)} strides={tuple(dst.stride())}"
        ),
    ),
    Check(
        "src_contiguous",
        lambda a: a.src.is_contiguous(),
        lambda **_: "src tensor must be contiguous",
    ),
)

CONTRACT = Contract(op=f"strictops::{OP_NAME}", stem="mamba_state_scatter",
                    module="mamba.state_scatter",
                    checks=CHECKS,
                    mutates=("dst",))


# The op's arguments, in order.
ARGUMENTS = ("dst", "src", "dst_indices_raw", "step_indices_raw", "src_indices_raw")


def validate(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None) -> None:
    """Run the contract on real, fake or symbolic tensors; raise the first broken rule."""
    CONTRACT.validate(
        dst=dst,
        src=src,
        dst_indices_raw=dst_indices_raw,
        step_indices_raw=step_indices_raw,
        src_indices_raw=src_indices_raw,
    )


# --------------------------------------------------------------------------------------------
# The input space, as data: valid calls and one near miss per rule. Tests, compile tests and the
# self-check build every call from these.


@dataclass(frozen=True)
class Dims:
    """Free parameters of a valid call."""

    num_layers: int
    cache_size: int
    spec_size: int
    draft_tokens: int
    state_shape: tuple[int, ...]
    total_requests: int
    dtype: torch.dtype = torch.float32
    index_dtypes: tuple[torch.dtype, torch.dtype, torch.dtype] = (torch.int64,) * 3
    with_src_indices: bool = False
    device: str = "cuda:0"


def valid_spec(d: Dims) -> dict:
    idx = [TensorSpec((d.total_requests,), dt, d.device) for dt in d.index_dtypes]
    return {
        "dst": TensorSpec((d.num_layers, d.cache_size, *d.state_shape), d.dtype, d.device),
        "src": TensorSpec((d.num_layers, d.spec_size, d.draft_tokens, *d.state_shape), d.dtype,
                          d.device),
        "dst_indices_raw": idx[0],
        "step_indices_raw": idx[1],
        "src_indices_raw": idx[2] if d.with_src_indices else None,
    }


def _ensure_src_indices(spec: dict) -> dict:
    if spec["src_indices_raw"] is not None:
        return spec
    return {**spec, "src_indices_raw": spec["dst_indices_raw"]}


def _grow_last(spec: dict) -> dict:
    """Make the innermost state dim (or, without state dims, add one) hold 2 elements."""
    dst, src = spec["dst"], spec["src"]
    if len(dst.shape) == 2:
        return _with(spec, dst={"shape": (*dst.shape, 2)}, src={"shape": (*src.shape, 2)})
    return _with(spec, dst={"shape": (*dst.shape[:-1], 2)}, src={"shape": (*src.shape[:-1], 2)})


def _break_contiguity(name: str, first_dim: int):
    """Near miss: ``spec[name]`` no longer contiguous in dims ``first_dim..``."""

    def mutate(spec: dict) -> dict:
        gapped = spec[name].strided(first_dim)
        if gapped is None:  # every dim there has one element: make one hold two
            spec = _grow_last(spec)
            gapped = spec[name].strided(first_dim)
        return {**spec, name: gapped}

    return mutate


def _everything_on(spec: dict, device: str) -> dict:
    return {k: (v.replace(device=device) if v is not None else None) for k, v in spec.items()}


NEAR_MISSES = {
    "same_device": lambda s: _with(s, src={"device": _other_device(s["dst"].device)}),
    "cuda": lambda s: _everything_on(s, "cpu"),
    "ranks": lambda s: _with(s, dst={"shape": s["dst"].shape[:1]}),
    "layer_dim": lambda s: _with(s, src={"shape": (s["src"].shape[0] + 1, *s["src"].shape[1:])}),
    "trailing_dims": lambda s: _with(s, src={"shape": (*s["src"].shape, 3)}),
    "same_dtype": lambda s: _with(
        s, src={"dtype": torch.float16 if s["dst"].dtype != torch.float16 else torch.float32}),
    "indices_1d": lambda s: _with(s, step_indices_raw={"shape": (*s["step_indices_raw"].shape, 1)}),
    "src_indices_1d": lambda s: _with(
        _ensure_src_indices(s), src_indices_raw={"shape": (1, s["dst_indices_raw"].shape[0])}),
    "indices_length": lambda s: _with(
        s, step_indices_raw={"shape": (s["dst_indices_raw"].shape[0] + 1,)}),
    "src_indices_length": lambda s: _with(
        _ensure_src_indices(s), src_indices_raw={"shape": (s["dst_indices_raw"].shape[0] + 2,)}),
    "indices_dtype": lambda s: _with(s, dst_indices_raw={"dtype": torch.float32}),
    "src_indices_dtype": lambda s: _with(_ensure_src_indices(s),
                                         src_indices_raw={"dtype": torch.int16}),
    "indices_device": lambda s: _with(s, step_indices_raw={"device": "cpu"}),
    "src_indices_device": lambda s: _with(_ensure_src_indices(s),
                                          src_indices_raw={"device": "cpu"}),
    "dst_entry_contiguous": _break_contiguity("dst", first_dim=2),
    "src_contiguous": _break_contiguity("src", first_dim=0),
}
