"""Input descriptions shared by contracts, tests and the self-check.

A contract describes its valid inputs as :class:`TensorSpec` dicts and, for each rule, a
*near miss*: a function that takes a valid description and breaks exactly that rule. The
hypothesis strategies, the self-check and the compile tests all build their inputs from these
descriptions, so every way of calling an op is generated from the contract module.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar, Mapping, Optional

import torch


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class TensorSpec:
    """Metadata of one tensor argument: enough to build a real or a fake tensor."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str
    stride: Optional[tuple[int, ...]] = None  # None: contiguous
    # Whether a dynamic-shape test may rebuild it with symbolic sizes; a spec whose point is
    # where it lies in its storage (a view, an offset) says False and is always built as is.
    symbolic: ClassVar[bool] = True
    # Whether :meth:`empty` sets the elements itself (a spec whose values a rule reads); the
    # values of the others are whatever the builder writes (zeros, for a built call).
    sets_values: ClassVar[bool] = False

    def replace(self, **changes) -> "TensorSpec":
        return dataclasses.replace(self, **changes)

    @property
    def strides(self) -> tuple[int, ...]:
        return self.stride if self.stride is not None else contiguous_strides(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's elements (``numel * itemsize``)."""
        return math.prod(self.shape) * self.dtype.itemsize

    def empty(self) -> torch.Tensor:
        """An uninitialised tensor (real, or fake under an active ``FakeTensorMode``)."""
        return torch.empty_strided(self.shape, self.strides, dtype=self.dtype, device=self.device)

    def with_gap(self, dim: int, gap: int = 1) -> "TensorSpec":
        """Same shape, but stepping along ``dim`` skips ``gap`` extra elements: the tensor is
        no longer contiguous at ``dim`` whenever ``shape[dim] > 1``."""
        strides, acc = [0] * len(self.shape), 1
        for i in reversed(range(len(self.shape))):
            if i == dim:
                acc += gap
            strides[i] = acc
            acc *= max(self.shape[i], 1)
        return self.replace(stride=tuple(strides))

    def strided(self, first_dim: int = 0) -> "TensorSpec | None":
        """Same shape, not contiguous in dims ``first_dim..``: a gap after every step of the
        innermost of those dims that holds more than one element; ``None`` when none does
        (such a tensor is contiguous there whatever its strides, so a near miss must first
        grow a dim)."""
        for dim in reversed(range(first_dim, len(self.shape))):
            if self.shape[dim] > 1:
                return self.with_gap(dim)
        return None


def with_changes(spec: dict, **changes: dict) -> dict:
    """A copy of ``spec`` with ``changes[name]`` applied to the TensorSpec ``spec[name]``."""
    out = dict(spec)
    for name, fields in changes.items():
        out[name] = out[name].replace(**fields)
    return out


def other_device(device: str, gpu: bool = False) -> str:
    """A device other than ``device`` for a cross-device near miss.

    Fake tensors may name ``cuda:1`` on a CPU-only build; where CUDA is real, torch refuses an
    ordinal the machine lacks, so a one-GPU machine gets the CPU instead (a near miss whose rule
    comes before any CUDA check still breaks only that rule). ``gpu``: always another CUDA
    ordinal, for a rule that comes after a CUDA check (such a near miss cannot be built on a
    one-GPU machine: see :func:`buildable_here`).
    """
    if not gpu and torch.cuda.is_available() and torch.cuda.device_count() < 2:
        return "cpu"
    return "cuda:1" if device != "cuda:1" else "cuda:0"


def buildable_here(spec: Mapping[str, object]) -> bool:
    """Whether every tensor of ``spec`` can be built (fake or real) on this machine: with real
    CUDA, only the ordinals it has (a CPU-only build fakes any)."""
    if not torch.cuda.is_available():
        return True
    count = torch.cuda.device_count()
    for v in _flat(spec.values()):
        if isinstance(v, TensorSpec):
            d = torch.device(v.device)
            if d.type == "cuda" and d.index is not None and d.index >= count:
                return False
    return True


def build(spec: Mapping[str, object]) -> dict:
    """Uninitialised tensors for every :class:`TensorSpec` of ``spec``, also inside a list (a
    ``Tensor[]`` argument); other entries (``None``, Python scalars) are passed through."""
    return {k: build_value(v, lambda s: s.empty()) for k, v in spec.items()}


def build_value(v, make, kind=TensorSpec):
    """``make(v)`` for a ``kind`` (a :class:`TensorSpec`), the same structure of them for a
    list or tuple (a ``Tensor[]`` argument, a list of tensor pairs), ``v`` itself otherwise."""
    if isinstance(v, kind):
        return make(v)
    if isinstance(v, (list, tuple)):
        return type(v)(build_value(x, make, kind) for x in v)
    return v


def _flat(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        else:
            yield v
