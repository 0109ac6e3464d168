"""Contract of ``strictops::fused_conv_window_scatter_with_mask``.

Arguments
---------
dst : Tensor ``[num_layers, cache_size, dim, K-1]``, the conv-state pool, mutated in place.
    Dims ``2..3`` of one ``(layer, slot)`` entry are contiguous; layer and slot strides may be
    anything.
src : Tensor ``[num_layers, spec_size, draft_tokens, dim, K-1]``, ``dst.dtype``, any strides:
    usually an overlapping ``as_strided`` view of a shared ``[..., dim, draft_tokens + K-2]``
    buffer (step ``t``'s window is ``shared[..., :, t:t+K-1]``: step stride 1, dim stride
    ``draft_tokens + K-2``).
dst_indices_raw, step_indices_raw : Tensor ``[total_requests]``, int32 or int64, on ``dst``'s
    device (any stride: they are read in place, never copied or cast).
src_indices_raw : Tensor ``[total_requests]`` or None; the source row of each request
    (``None`` means request ``i`` reads row ``i``).

The rules without a mark are the original kernel's, in its order and wording (its device rule
said CUDA/XPU; this library runs on CUDA). The rules marked *added* close holes the original
left open: ``src.dtype != dst.dtype`` reinterpreted bytes; a float or CPU index tensor reached
the launch (cast and copied on every call); a view whose storage had been shrunk since it was
made (``untyped_storage().resize_``) was read or written past the storage's end.

``PAIR_RULES`` are the rules on one (dst, src) pair; the contract of
``fused_conv_window_scatter_multi`` applies the same rows to every pair it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import torch

from strictops.meta.mamba import state_scatter as mamba_state_scatter
from strictops.meta._contract import (Check, Contract, hint, inside_check, inside_storage, reach,
                                      sym_all,
                                      sym_either)
from strictops.meta._specs import TensorSpec, other_device as _other_device, with_changes as _with

OP_NAME = "fused_conv_window_scatter_with_mask"

INDEX_DTYPES = mamba_state_scatter.INDEX_DTYPES


def entry_dims_contiguous(dst) -> "bool | torch.SymBool":
    """Dims 2 and 3 of ``dst`` are contiguous (a size-1 dim's stride is free), as one symbolic
    condition: no Python branch on a size."""
    shape, strides = dst.shape, dst.stride()
    return sym_all([sym_either(shape[3] == 1, strides[3] == 1),
                    sym_either(shape[2] == 1, strides[2] == shape[3])])


def _storage_message(name: str, t) -> str:
    real = t._t  # the tensor behind the concrete view
    itemsize = real.element_size()
    storage = hint(real.untyped_storage().nbytes()) // itemsize
    return (f"Expected {name}'s largest element offset to be < its storage size of {storage} "
            f"elements ({itemsize} bytes each), but got {hint(reach(real))} "
            f"({name}.shape={tuple(t.shape)}, {name}.stride()={tuple(t.stride())}, "
            f"{name}.storage_offset()={hint(real.storage_offset())})")


# rule -> (predicate over one (dst, src) pair, message over concrete views of the pair, given
# the op's name). Rows only: each contract puts them in its order.
PAIR_RULES: dict[str, tuple[Callable, Callable]] = {
    "cuda_same_device": (
        lambda d, s: d.is_cuda and d.device == s.device,
        lambda op, d, s: (f"{op} requires dst and src to be CUDA tensors on the same device "
                          f"(dst.device={d.device!r}, src.device={s.device!r})."),
    ),
    "ranks": (
        lambda d, s: d.ndim == 4 and s.ndim == 5,
        lambda op, d, s: f"Unexpected ranks: dst.ndim={d.ndim} (want 4) src.ndim={s.ndim} (want 5)",
    ),
    "layer_dim": (
        lambda d, s: d.shape[0] == s.shape[0],
        lambda op, d, s: (f"Layer dim mismatch: dst.shape[0]={d.shape[0]} vs "
                          f"src.shape[0]={s.shape[0]}"),
    ),
    "window_dims": (
        lambda d, s: sym_all([d.shape[2] == s.shape[3], d.shape[3] == s.shape[4]]),
        lambda op, d, s: (f"Window dims mismatch: dst.shape[2:]={d.shape[2:]!r} vs "
                          f"src.shape[3:]={s.shape[3:]!r}"),
    ),
    "same_dtype": (  # added
        lambda d, s: d.dtype == s.dtype,
        lambda op, d, s: (f"dst and src must have the same dtype. dst.dtype={d.dtype} "
                          f"src.dtype={s.dtype}"),
    ),
    "dst_entry_contiguous": (
        lambda d, s: entry_dims_contiguous(d),
        lambda op, d, s: (f"{op}: dst entry dims (dims 2..3) must be contiguous; "
                          f"got shape={tuple(d.shape)} strides={tuple(d.stride())}"),
    ),
    "src_inside_storage": (  # added
        lambda d, s: inside_storage(s),
        lambda op, d, s: _storage_message("src", s),
    ),
    "dst_inside_storage": (  # added
        lambda d, s: inside_storage(d),
        lambda op, d, s: _storage_message("dst", d),
    ),
}


# Rows that read the storage's size, which a cached verdict's metadata signature does not hold:
# inside_storage rows, on each pair's tensor of this index (0: dst, 1: src).
INSIDE = {"src_inside_storage": 1, "dst_inside_storage": 0}


def pair_check(rule: str, op: str, pairs: Callable, prefix: Callable[[int], str]) -> Check:
    """``PAIR_RULES[rule]`` as a contract row: it holds when it holds for every pair of
    ``pairs(a)``, and its message names the first pair that breaks it (``prefix(i)``)."""
    ok, message = PAIR_RULES[rule]

    def holds(a):
        ps = pairs(a)
        if len(ps) == 1:  # the one-pair op's eager path: no generator
            return ok(*ps[0])
        return sym_all(ok(d, s) for d, s in ps)

    def text(**kw):
        views = pairs(SimpleNamespace(**kw))
        i = next((i for i, (d, s) in enumerate(views) if not hint(ok(d._t, s._t))), 0)
        return prefix(i) + message(op, *views[i])

    if rule in INSIDE:  # the predicate made from the tensors it names (inside_check)
        k = INSIDE[rule]
        return inside_check(rule, lambda a: [pair[k] for pair in pairs(a)], text)
    return Check(rule, holds, text)


def _one_pair(a):
    return ((a.dst, a.src),)


def _rule(name: str) -> Check:
    return pair_check(name, OP_NAME, _one_pair, lambda i: "")


# The index rules are the state scatter's (the same original file checks them the same way).
_state_scatter_rule = mamba_state_scatter.CONTRACT.check


CHECKS = (
    _rule("cuda_same_device"),
    _rule("ranks"),
    _rule("layer_dim"),
    _rule("window_dims"),
    _rule("same_dtype"),
    _state_scatter_rule("indices_1d"),
    _state_scatter_rule("indices_length"),
    _state_scatter_rule("indices_dtype"),  # added
    _state_scatter_rule("indices_device"),  # added
    _rule("dst_entry_contiguous"),
    Check(
        "src_indices_shape",
        lambda a: a.src_indices_raw is None or (
            a.src_indices_raw.ndim == 1
            and a.src_indices_raw.shape[0] == a.step_indices_raw.shape[0]),
        lambda src_indices_raw, step_indices_raw, **_: (
            f"source indices length mismatch: {src_indices_raw.shape=} vs "
            f"{step_indices_raw.shape=}"
        ),
    ),
    _state_scatter_rule("src_indices_dtype"),  # added
    _state_scatter_rule("src_indices_device"),  # added
    _rule("src_inside_storage"),
    _rule("dst_inside_storage"),
)

CONTRACT = Contract(op=f"strictops::{OP_NAME}", stem="conv_window_scatter",
                    module="mamba.conv_window_scatter",
                    checks=CHECKS,
                    mutates=("dst",))
# The public function's arguments, in order (the cached eager validation's signature).
ARGUMENTS = ("dst", "src", "dst_indices_raw", "step_indices_raw", "src_indices_raw")


def validate(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None) -> None:
    """Run the contract on real, fake or symbolic tensors; raise the first broken rule."""
    CONTRACT.validate(dst=dst, src=src, dst_indices_raw=dst_indices_raw,
                      step_indices_raw=step_indices_raw, src_indices_raw=src_indices_raw)


# --------------------------------------------------------------------------------------------
# The input space, as data: valid calls and one near miss per rule.


@dataclass(frozen=True)
class Dims:
    """Free parameters of a valid call. ``overlapping``: ``src`` is a window view of a shared
    ``[num_layers, spec_size, dim, draft_tokens + km1 - 1]`` buffer (else contiguous)."""

    num_layers: int
    cache_size: int
    spec_size: int
    draft_tokens: int
    dim: int
    km1: int
    total_requests: int
    dtype: torch.dtype = torch.bfloat16
    index_dtypes: tuple[torch.dtype, torch.dtype, torch.dtype] = (torch.int64,) * 3
    with_src_indices: bool = False
    overlapping: bool = True
    device: str = "cuda:0"


def window_view_spec(num_layers, spec_size, draft_tokens, dim, km1, dtype, device,
                     overlapping: bool = True) -> TensorSpec:
    """``src`` as sglang lays it out: step ``t``'s window of a shared buffer is its slice
    ``[:, t:t+km1]``, so consecutive steps overlap (step stride 1)."""
    shape = (num_layers, spec_size, draft_tokens, dim, km1)
    if not overlapping:
        return TensorSpec(shape, dtype, device)
    width = draft_tokens + km1 - 1
    row = dim * width
    return TensorSpec(shape, dtype, device, stride=(spec_size * row, row, 1, width, 1))


def valid_spec(d: Dims) -> dict:
    idx = [TensorSpec((d.total_requests,), dt, d.device) for dt in d.index_dtypes]
    return {
        "dst": TensorSpec((d.num_layers, d.cache_size, d.dim, d.km1), d.dtype, d.device),
        "src": window_view_spec(d.num_layers, d.spec_size, d.draft_tokens, d.dim, d.km1,
                                d.dtype, d.device, d.overlapping),
        "dst_indices_raw": idx[0],
        "step_indices_raw": idx[1],
        "src_indices_raw": idx[2] if d.with_src_indices else None,
    }


@dataclass(frozen=True)
class ShrunkStorageSpec(TensorSpec):
    """A tensor whose storage was shrunk after it was made, to ``keep`` elements fewer than its
    reach needs (torch refuses to *make* such a view, but ``untyped_storage().resize_`` can
    shrink the storage under an existing one). Built as is, never with symbolic sizes."""

    keep: int = 1
    symbolic = False

    def empty(self) -> torch.Tensor:
        t = super().empty()
        if t.numel():
            t.untyped_storage().resize_((hint(reach(t)) + 1 - self.keep) * t.element_size())
        return t


def shrink_storage(t: TensorSpec) -> TensorSpec:
    """Near miss: ``t``'s storage one element short of its last element (an empty tensor gets
    one element first)."""
    shape = tuple(max(s, 1) for s in t.shape)
    stride = t.stride if shape == t.shape else None
    return ShrunkStorageSpec(shape, t.dtype, t.device, stride)


def _break_entry_contiguity(spec: dict) -> dict:
    """Near miss: ``dst``'s dims 2..3 no longer contiguous. With ``dim == km1 == 1`` every
    stride of the entry is free, so ``dim`` grows to 2 in ``dst`` and ``src`` first."""
    dst, src = spec["dst"], spec["src"]
    L, cache, dim, km1 = dst.shape
    if km1 > 1:
        return {**spec, "dst": dst.replace(stride=None).with_gap(3)}
    if dim == 1:
        src = src.replace(shape=(*src.shape[:3], 2, km1), stride=None)
        dst = dst.replace(shape=(L, cache, 2, km1))
    return {**spec, "src": src, "dst": dst.replace(stride=None).with_gap(2)}


def _ensure_src_indices(spec: dict) -> dict:
    if spec["src_indices_raw"] is not None:
        return spec
    return {**spec, "src_indices_raw": spec["dst_indices_raw"]}


def _everything_on(spec: dict, device: str) -> dict:
    return {k: (v.replace(device=device) if v is not None else None) for k, v in spec.items()}


NEAR_MISSES = {
    "cuda_same_device": lambda s: _with(s, src={"device": _other_device(s["dst"].device)}),
    "ranks": lambda s: _with(s, dst={"shape": s["dst"].shape[:3]}),
    "layer_dim": lambda s: _with(
        s, src={"shape": (s["src"].shape[0] + 1, *s["src"].shape[1:]), "stride": None}),
    "window_dims": lambda s: _with(
        s, src={"shape": (*s["src"].shape[:4], s["src"].shape[4] + 1), "stride": None}),
    "same_dtype": lambda s: _with(
        s, src={"dtype": torch.float16 if s["dst"].dtype != torch.float16 else torch.float32}),
    "indices_1d": lambda s: _with(s, step_indices_raw={"shape": (*s["step_indices_raw"].shape, 1)}),
    "indices_length": lambda s: _with(
        s, step_indices_raw={"shape": (s["dst_indices_raw"].shape[0] + 1,)}),
    "indices_dtype": lambda s: _with(s, dst_indices_raw={"dtype": torch.float32}),
    "indices_device": lambda s: _with(s, step_indices_raw={"device": "cpu"}),
    "dst_entry_contiguous": _break_entry_contiguity,
    "src_indices_shape": lambda s: _with(
        _ensure_src_indices(s), src_indices_raw={"shape": (s["dst_indices_raw"].shape[0] + 2,)}),
    "src_indices_dtype": lambda s: _with(_ensure_src_indices(s),
                                         src_indices_raw={"dtype": torch.int16}),
    "src_indices_device": lambda s: _with(_ensure_src_indices(s),
                                          src_indices_raw={"device": "cpu"}),
    "src_inside_storage": lambda s: {**s, "src": shrink_storage(s["src"])},
    "dst_inside_storage": lambda s: {**s, "dst": shrink_storage(s["dst"])},
}
