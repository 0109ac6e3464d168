"""Contract of ``strictops::sparse_mla_q8kv8_prefill_fwd``.

Arguments
---------
q : Tensor ``[s_q, h_q, d_qk]`` float8_e4m3fn, contiguous; ``h_q`` a positive multiple of 64,
    ``d_qk`` 512 or 576.
kv : Tensor ``[s_kv, 1, d_qk]`` float8_e4m3fn, contiguous, on ``q``'s device.
indices : Tensor ``[s_q, 1, topk]`` int32, contiguous; ``topk`` a positive multiple of 128.
sm_scale : float.
q_scale, kv_scale : one-element float32 CUDA tensors, contiguous.
d_v : int, must be 512.
attn_sink : Tensor ``[h_q]`` float32 or None; needs ``topk_length``.
topk_length : Tensor ``[s_q]`` int32 or None.
out, max_logits, lse : Tensors ``[s_q, h_q, d_v]`` bf16, ``[s_q, h_q]`` fp32, ``[s_q, h_q]``
    fp32, or None; written in place when given. They must not overlap in memory.
topk_length_errors : Tensor ``[1]`` int32 or None (*added*): the device-side count of
    out-of-range ``topk_length`` values, see ``strictops.ops.sparse_mla.prefill``.

The rules up to ``buffers_alias`` are the original kernel's, in its order and wording, with
two changes. The aliasing rule reads storage identity and byte ranges instead of
``data_ptr()``, so that it runs on fake tensors while tracing; it refuses buffers that overlap
(the original compared start addresses only, so it let a partial overlap through and refused
two empty buffers). The original's contiguity check of ``q_scale``/``kv_scale`` has no rule:
it follows the one-element check, and a one-element tensor is always contiguous. The
out-buffer messages keep the original's ``tuple(...)`` shapes.

The ``topk_length`` *value* rule (``0 <= topk_length <= topk``, ``topk_length_values``) reads
the tensor's values, a host sync, so it is a ``reads_values`` row: it runs in the original's
place (right after ``topk_length``'s own checks) in plain eager mode on plain tensors outside
CUDA-graph capture, and only when no ``topk_length_errors`` counter is passed. Everywhere else
(``torch.compile``, ``torch.export``, fake tensors, capture, or with a counter) it does not run,
and the kernel clamps the values and counts the bad ones instead.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import ClassVar
from types import SimpleNamespace

import torch
from strictops.meta._contract import Check, Contract, disjoint_check, sym_all, sym_either
from strictops.meta._specs import TensorSpec, other_device, with_changes as _with

OP_NAME = "sparse_mla_q8kv8_prefill_fwd"

FP8 = torch.float8_e4m3fn
HEAD_BLOCK = 64  # h_q granularity: one program handles 64 heads
TOPK_BLOCK = 128  # topk granularity of the original kernel
D_QKS = (512, 576)
D_V = 512
BUFFERS = ("out", "max_logits", "lse")
KEYWORD_ONLY = (*BUFFERS, "topk_length_errors")  # the public function's keyword-only arguments


def _shape_is(t, shape) -> "bool | torch.SymBool":
    """``tuple(t.shape) == tuple(shape)`` as one symbolic condition (ranks are static)."""
    if t.ndim != len(shape):
        return False
    return sym_all(x == y for x, y in zip(t.shape, shape))


def _buffer_shape(name: str, q, d_v) -> tuple:
    s_q, h_q = q.shape[0], q.shape[1]
    return (s_q, h_q, d_v) if name == "out" else (s_q, h_q)


def _topk_lengths_in_range(a) -> bool:
    """Every ``topk_length`` value in ``[0, topk]``; not read (True) without ``topk_length`` or
    with a ``topk_length_errors`` counter, which asks for the device-side count instead."""
    t = a.topk_length
    if t is None or a.topk_length_errors is not None:
        return True
    return not bool(((t < 0) | (t > a.indices.shape[2])).any())


# Rule families: one factory per kind of check the original repeats for several arguments.
# ``None`` passes every rule of an optional argument except those about its presence.


def _rank3(name: str, dims: str) -> Check:
    return Check(
        f"{name}_rank",
        lambda a: getattr(a, name).ndim == 3,
        lambda **k: f"{name} must have shape ({dims}), got {tuple(k[name].shape)}",
    )


def _cuda(name: str) -> Check:
    def ok(a):
        t = getattr(a, name)
        return t is None or t.is_cuda

    return Check(f"{name}_cuda", ok, lambda **_: f"{name} must be a CUDA tensor")


def _on_q_device(name: str) -> Check:
    def ok(a):
        t = getattr(a, name)
        return t is None or t.device == a.q.device

    return Check(
        f"{name}_device", ok,
        lambda q, **k: f"{name} must be on q's device {q.device}, got {k[name].device}",
    )


def _contiguous(name: str) -> Check:
    def ok(a):
        t = getattr(a, name)
        return t is None or t.is_contiguous()

    return Check(f"{name}_contiguous", ok, lambda **_: f"{name} must be contiguous")


def _fp8(name: str) -> Check:
    return Check(
        f"{name}_dtype",
        lambda a: getattr(a, name).dtype == FP8,
        lambda **k: f"{name} must be torch.float8_e4m3fn, got {k[name].dtype}",
    )


def _vector(name: str, dtype: torch.dtype, length_of) -> Check:
    """``name`` is None or a ``[length_of(a)]`` tensor of ``dtype`` (the original's combined
    shape/dtype check of ``topk_length`` and ``attn_sink``)."""

    def ok(a):
        t = getattr(a, name)
        if t is None:
            return True
        if t.dtype != dtype:
            return False
        return _shape_is(t, (length_of(a),))

    def message(**k):
        t = k[name]
        length = length_of(SimpleNamespace(**k))
        return (f"{name} must be {str(dtype)[len('torch.'):]} with shape ({length},), "
                f"got {tuple(t.shape)}/{t.dtype}")

    return Check(f"{name}_shape_dtype", ok, message)


def _scale_rules(name: str) -> tuple[Check, ...]:
    def tensor(a):
        return isinstance(getattr(a, name), torch.Tensor)

    return (
        Check(f"{name}_tensor", tensor, lambda **_: f"{name} must be a torch.Tensor"),
        _cuda(name),
        _on_q_device(name),
        Check(
            f"{name}_dtype",
            lambda a: getattr(a, name).dtype == torch.float32,
            lambda **k: f"{name} must be float32, got {k[name].dtype}",
        ),
        Check(
            f"{name}_scalar",
            lambda a: getattr(a, name).numel() == 1,
            lambda **k: f"{name} must be a scalar tensor, got shape {tuple(k[name].shape)}",
        ),
        # The original's "{name} must be contiguous" comes next; it can never fail (a
        # one-element tensor is contiguous whatever its strides), so it has no rule here.
    )


def _buffer_rules(name: str, dtype: torch.dtype) -> tuple[Check, ...]:
    def shape_ok(a):
        t = getattr(a, name)
        return t is None or _shape_is(t, _buffer_shape(name, a.q, a.d_v))

    def dtype_ok(a):
        t = getattr(a, name)
        return t is None or t.dtype == dtype

    def device_ok(a):
        t = getattr(a, name)
        return t is None or t.device == a.q.device

    return (
        Check(
            f"{name}_shape", shape_ok,
            lambda q, d_v, **k: (f"{name} must have shape {_buffer_shape(name, q, d_v)}, "
                                 f"got {tuple(k[name].shape)}"),
        ),
        Check(f"{name}_dtype", dtype_ok,
              lambda **k: f"{name} must have dtype {dtype}, got {k[name].dtype}"),
        Check(f"{name}_device", device_ok,
              lambda q, **k: f"{name} must be on device {q.device}, got {k[name].device}"),
        _contiguous(name),
    )


CHECKS = (
    _rank3("q", "s_q, h_q, d_qk"),
    _rank3("kv", "s_kv, h_kv, d_qk"),
    _rank3("indices", "s_q, h_kv, topk"),
    _cuda("q"),
    _cuda("kv"),
    _cuda("indices"),
    _on_q_device("kv"),
    _on_q_device("indices"),
    _fp8("q"),
    _fp8("kv"),
    _contiguous("q"),
    _contiguous("kv"),
    _contiguous("indices"),
    Check(
        "d_qk_match",
        lambda a: a.kv.shape[2] == a.q.shape[2],
        lambda q, kv, **_: f"kv d_qk must match q d_qk={q.shape[2]}, got {kv.shape[2]}",
    ),
    Check(
        "h_q",
        lambda a: sym_all((a.q.shape[1] != 0, a.q.shape[1] % HEAD_BLOCK == 0)),
        lambda q, **_: ("sparse_mla_q8kv8_prefill_fwd requires h_q padded to a positive "
                        f"multiple of 64, got {q.shape[1]}"),
    ),
    Check(
        "h_kv",
        lambda a: a.kv.shape[1] == 1,
        lambda kv, **_: f"sparse_mla_q8kv8_prefill_fwd requires h_kv=1, got {kv.shape[1]}",
    ),
    Check(
        "d_qk_supported",
        lambda a: sym_either(a.q.shape[2] == D_QKS[0], a.q.shape[2] == D_QKS[1]),
        lambda q, **_: f"sparse_mla_q8kv8_prefill_fwd supports d_qk=512/576, got {q.shape[2]}",
    ),
    Check(
        "indices_shape",
        lambda a: sym_all((a.indices.shape[0] == a.q.shape[0],
                           a.indices.shape[1] == a.kv.shape[1])),
        lambda q, kv, indices, **_: (f"indices must have shape ({q.shape[0]}, {kv.shape[1]}, "
                                     f"topk), got {tuple(indices.shape)}"),
    ),
    Check(
        "indices_dtype",
        lambda a: a.indices.dtype == torch.int32,
        lambda indices, **_: f"indices must be int32, got {indices.dtype}",
    ),
    Check(
        "topk",
        lambda a: sym_all((a.indices.shape[2] != 0, a.indices.shape[2] % TOPK_BLOCK == 0)),
        lambda indices, **_: ("Q8KV8 sparse-prefill topk width must be a positive multiple of "
                              f"128, got {indices.shape[2]}"),
    ),
    _vector("topk_length", torch.int32, lambda a: a.q.shape[0]),
    _cuda("topk_length"),
    _on_q_device("topk_length"),
    _contiguous("topk_length"),
    Check(
        "topk_length_values",
        _topk_lengths_in_range,
        lambda indices, **_: ("topk_length values must satisfy 0 <= topk_length <= topk "
                              f"({indices.shape[2]})"),
        reads_values=True,
        only_with=("topk_length",),
    ),
    Check(
        "d_v",
        lambda a: a.d_v == D_V,
        lambda d_v, **_: f"sparse_mla_q8kv8_prefill_fwd only supports d_v=512, got {d_v}",
    ),
    Check(
        "attn_sink_needs_topk_length",
        lambda a: a.attn_sink is None or a.topk_length is not None,
        lambda **_: "attn_sink requires topk_length to be provided as well",
    ),
    _vector("attn_sink", torch.float32, lambda a: a.q.shape[1]),
    _cuda("attn_sink"),
    _on_q_device("attn_sink"),
    _contiguous("attn_sink"),
    *_scale_rules("q_scale"),
    *_scale_rules("kv_scale"),
    *_buffer_rules("out", torch.bfloat16),
    *_buffer_rules("max_logits", torch.float32),
    *_buffer_rules("lse", torch.float32),
    disjoint_check(
        "buffers_alias",
        (("out", "max_logits"), ("out", "lse"), ("max_logits", "lse")),
        lambda **_: "out, max_logits and lse must not alias each other",
        only_with=("max_logits", "lse"),
    ),
    # Added: the device-side error counter (an argument the original did not have).
    _vector("topk_length_errors", torch.int32, lambda a: 1),
    _cuda("topk_length_errors"),
    _on_q_device("topk_length_errors"),
    disjoint_check(
        "topk_length_errors_alias",
        tuple(("topk_length_errors", b) for b in BUFFERS),
        lambda **_: "topk_length_errors must not alias out, max_logits or lse",
        only_with=("topk_length_errors",),
    ),
)

CONTRACT = Contract(op=f"strictops::{OP_NAME}", stem="sparse_mla_prefill",
                    module="sparse_mla.prefill",
                    checks=CHECKS,
                    mutates=(*BUFFERS, "topk_length_errors"))


# The op's arguments, in order.
ARGUMENTS = ("q", "kv", "indices", "sm_scale", "q_scale", "kv_scale", "d_v", "attn_sink",
             "topk_length", "out", "max_logits", "lse", "topk_length_errors")


def validate(q, kv, indices, sm_scale, q_scale, kv_scale, d_v=D_V, attn_sink=None,
             topk_length=None, out=None, max_logits=None, lse=None,
             topk_length_errors=None) -> None:
    """Run the contract on real, fake or symbolic tensors; raise the first broken rule."""
    CONTRACT.validate(
        q=q, kv=kv, indices=indices, sm_scale=sm_scale, q_scale=q_scale, kv_scale=kv_scale,
        d_v=d_v, attn_sink=attn_sink, topk_length=topk_length, out=out,
        max_logits=max_logits, lse=lse, topk_length_errors=topk_length_errors,
    )


# --------------------------------------------------------------------------------------------
# The input space, as data: valid calls and one near miss per rule. Tests, compile tests and the
# self-check build every call from these.


@dataclass(frozen=True)
class Dims:
    """Free parameters of a valid call."""

    s_q: int
    s_kv: int
    h_q: int = 64
    d_qk: int = 576
    topk: int = 128
    with_topk_length: bool = False
    with_attn_sink: bool = False  # implies with_topk_length (a rule)
    with_buffers: bool = False
    with_errors: bool = False
    device: str = "cuda:0"


@dataclass(frozen=True)
class FilledSpec(TensorSpec):
    """A tensor spec that builds with every element ``fill``: eager calls read ``topk_length``'s
    values, so a valid call gets in-range ones (0) and the value rule's near miss others."""

    fill: int = 0
    sets_values: ClassVar[bool] = True

    def empty(self) -> torch.Tensor:
        return super().empty().fill_(self.fill)


def valid_spec(d: Dims) -> dict:
    """Keyword arguments of a valid call (tensor specs, Python scalars, None) in the public
    function's argument order."""
    topk_length = d.with_topk_length or d.with_attn_sink
    buffers = {name: None for name in BUFFERS}
    if d.with_buffers:
        buffers = {"out": TensorSpec((d.s_q, d.h_q, D_V), torch.bfloat16, d.device),
                   "max_logits": TensorSpec((d.s_q, d.h_q), torch.float32, d.device),
                   "lse": TensorSpec((d.s_q, d.h_q), torch.float32, d.device)}
    return {
        "q": TensorSpec((d.s_q, d.h_q, d.d_qk), FP8, d.device),
        "kv": TensorSpec((d.s_kv, 1, d.d_qk), FP8, d.device),
        "indices": TensorSpec((d.s_q, 1, d.topk), torch.int32, d.device),
        "sm_scale": d.d_qk ** -0.5,
        "q_scale": TensorSpec((1,), torch.float32, d.device),
        "kv_scale": TensorSpec((1,), torch.float32, d.device),
        "d_v": D_V,
        "attn_sink": TensorSpec((d.h_q,), torch.float32, d.device) if d.with_attn_sink else None,
        "topk_length": FilledSpec((d.s_q,), torch.int32, d.device) if topk_length else None,
        **buffers,
        "topk_length_errors": (TensorSpec((1,), torch.int32, d.device) if d.with_errors
                               else None),
    }


class _Storage:
    """One byte allocation that several :class:`SharedSpec` view, from its first byte.

    Built once per fake mode (a spec built again under a new mode gets a tensor of that mode),
    or once for real tensors.
    """

    def __init__(self, nbytes: int, device: str) -> None:
        self.spec = TensorSpec((nbytes,), torch.uint8, device)
        self.fake: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.real: list[torch.Tensor] = []

    def base(self) -> torch.Tensor:
        mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
        if mode is None:
            if not self.real:
                self.real.append(self.spec.empty())
            return self.real[0]
        if mode not in self.fake:
            self.fake[mode] = self.spec.empty()
        return self.fake[mode]


@dataclass(frozen=True)
class SharedSpec(TensorSpec):
    """A contiguous tensor spec that builds to a view of ``storage``'s first bytes: specs of
    one storage overlap, which is how a near miss passes overlapping buffers."""

    storage: _Storage = None
    symbolic: ClassVar[bool] = False  # its point is the storage it shares

    def empty(self) -> torch.Tensor:
        return self.storage.base().narrow(0, 0, self.nbytes).view(self.dtype).view(self.shape)




def _present(spec: dict, *names: str) -> dict:
    """``spec`` with each optional argument of ``names`` given (valid) where it was None."""
    q = spec["q"]
    s_q, h_q = q.shape[0], q.shape[1]
    valid = {
        "topk_length": FilledSpec((s_q,), torch.int32, q.device),
        "attn_sink": TensorSpec((h_q,), torch.float32, q.device),
        "out": TensorSpec((s_q, h_q, D_V), torch.bfloat16, q.device),
        "max_logits": TensorSpec((s_q, h_q), torch.float32, q.device),
        "lse": TensorSpec((s_q, h_q), torch.float32, q.device),
        "topk_length_errors": TensorSpec((1,), torch.int32, q.device),
    }
    out = dict(spec)
    for name in names:
        if out[name] is None:
            out[name] = valid[name]
    if out["attn_sink"] is not None and out["topk_length"] is None:
        out["topk_length"] = valid["topk_length"]
    return out


def _grow(shape: tuple, dim: int, by: int = 1) -> tuple:
    return tuple(s + by if i == dim else s for i, s in enumerate(shape))


def _changed(name: str, **fields):
    """Near miss: ``spec[name]`` (given, if optional) with ``fields`` replaced."""

    def mutate(spec: dict) -> dict:
        spec = _present(spec, name)
        return {**spec, name: spec[name].replace(**fields)}

    return mutate


def _moved(name: str):
    """Near miss: ``spec[name]`` (given, if optional) on a GPU other than ``q``'s. (The
    ``*_device`` rules follow the ``*_cuda`` ones, so the CPU would break another rule; a
    one-GPU machine with real CUDA cannot build these.)"""

    def mutate(spec: dict) -> dict:
        spec = _present(spec, name)
        device = other_device(spec["q"].device, gpu=True)
        return {**spec, name: spec[name].replace(device=device)}

    return mutate


def _grown(name: str, dim: int, by: int = 1):
    """Near miss: ``spec[name]`` (given, if optional) ``by`` longer in ``dim``."""

    def mutate(spec: dict) -> dict:
        spec = _present(spec, name)
        return {**spec, name: spec[name].replace(shape=_grow(spec[name].shape, dim, by))}

    return mutate


def _two_tokens(spec: dict) -> dict:
    """``spec`` with ``s_q`` at least 2 (every tensor whose dim 0 is ``s_q``)."""
    if spec["q"].shape[0] >= 2:
        return spec
    return {name: (t.replace(shape=(2, *t.shape[1:])) if name in TOKEN_MAJOR and t is not None
                   else t) for name, t in spec.items()}


TOKEN_MAJOR = ("q", "indices", "topk_length", *BUFFERS)


def _strided(name: str):
    """Near miss: ``spec[name]`` (given, if optional) no longer contiguous; a one-token
    ``topk_length`` (one element: contiguous whatever its stride) gets a second token."""

    def mutate(spec: dict) -> dict:
        spec = _two_tokens(_present(spec, name))
        t = spec[name]
        return {**spec, name: t.strided()}

    return mutate


def _overlapping(first: str, second: str):
    """Near miss: ``first`` and ``second`` (given, if optional) start at the same byte."""

    def mutate(spec: dict) -> dict:
        spec = _present(spec, first, second)
        a, b = spec[first], spec[second]
        storage = _Storage(max(a.nbytes, b.nbytes), a.device)
        return {**spec, first: SharedSpec(a.shape, a.dtype, a.device, storage=storage),
                second: SharedSpec(b.shape, b.dtype, b.device, storage=storage)}

    return mutate


def _lengths_past_topk(spec: dict) -> dict:
    """Near miss of the value rule: ``topk_length`` (given, if optional) is ``topk + 1`` for
    every token, and no counter is passed (with one, the values are not read)."""
    spec = _present(spec, "topk_length")
    t = spec["topk_length"]
    bad = FilledSpec(t.shape, t.dtype, t.device, t.stride, fill=spec["indices"].shape[2] + 1)
    return {**spec, "topk_length": bad, "topk_length_errors": None}


def _scale_near_misses(name: str) -> dict:
    return {
        f"{name}_tensor": lambda s: {**s, name: 1.0},
        f"{name}_cuda": _changed(name, device="cpu"),
        f"{name}_device": _moved(name),
        f"{name}_dtype": _changed(name, dtype=torch.float64),
        f"{name}_scalar": _changed(name, shape=(2,)),
    }


def _buffer_near_misses(name: str) -> dict:
    return {
        f"{name}_shape": _grown(name, dim=1),
        f"{name}_dtype": _changed(name, dtype=torch.float16),
        f"{name}_device": _moved(name),
        f"{name}_contiguous": _strided(name),
    }


def _device_near_misses(name: str) -> dict:
    return {
        f"{name}_cuda": _changed(name, device="cpu"),
        f"{name}_device": _moved(name),
    }


NEAR_MISSES = {
    "q_rank": lambda s: _with(s, q={"shape": s["q"].shape[:2]}),
    "kv_rank": lambda s: _with(s, kv={"shape": (s["kv"].shape[0], s["kv"].shape[2])}),
    "indices_rank": lambda s: _with(s, indices={"shape": (s["indices"].shape[0],
                                                          s["indices"].shape[2])}),
    "q_cuda": _changed("q", device="cpu"),
    **_device_near_misses("kv"),
    **_device_near_misses("indices"),
    "q_dtype": _changed("q", dtype=torch.float8_e5m2),
    "kv_dtype": _changed("kv", dtype=torch.bfloat16),
    "q_contiguous": _strided("q"),
    "kv_contiguous": _strided("kv"),
    "indices_contiguous": _strided("indices"),
    "d_qk_match": _grown("kv", dim=2, by=64),
    "h_q": lambda s: _with(s, q={"shape": (s["q"].shape[0], 16, s["q"].shape[2])}),
    "h_kv": _grown("kv", dim=1),
    "d_qk_supported": lambda s: _with(s, q={"shape": (*s["q"].shape[:2], 640)},
                                      kv={"shape": (*s["kv"].shape[:2], 640)}),
    "indices_shape": _grown("indices", dim=0),
    "indices_dtype": _changed("indices", dtype=torch.int64),
    "topk": _grown("indices", dim=2, by=64),
    "topk_length_shape_dtype": _changed("topk_length", dtype=torch.int64),
    **_device_near_misses("topk_length"),
    "topk_length_contiguous": _strided("topk_length"),
    "topk_length_values": _lengths_past_topk,  # eager only: a value, not metadata
    "d_v": lambda s: {**s, "d_v": 576},
    "attn_sink_needs_topk_length": lambda s: {**_present(s, "attn_sink"), "topk_length": None},
    "attn_sink_shape_dtype": _grown("attn_sink", dim=0),
    **_device_near_misses("attn_sink"),
    "attn_sink_contiguous": _strided("attn_sink"),
    **_scale_near_misses("q_scale"),
    **_scale_near_misses("kv_scale"),
    **_buffer_near_misses("out"),
    **_buffer_near_misses("max_logits"),
    **_buffer_near_misses("lse"),
    "buffers_alias": _overlapping("max_logits", "lse"),
    "topk_length_errors_shape_dtype": _changed("topk_length_errors", dtype=torch.int64),
    **_device_near_misses("topk_length_errors"),
    "topk_length_errors_alias": _overlapping("lse", "topk_length_errors"),
}
