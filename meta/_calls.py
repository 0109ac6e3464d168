"""Calls of an op as data, and the checks every call must pass (no pytest, no hypothesis).

A :class:`Call` is one call of a public op described as data: its arguments as
:class:`~strictops.meta._specs.TensorSpec` entries (and plain values), and the contract rule it
breaks (``None`` for a valid call). :func:`failures` runs a function on a call's fake tensors
along the paths a serving stack takes (eager, a dynamic-shape trace, ``torch.compile``) and says
where the contract's outcome was not met; the tests and the self-check both use it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Iterator, Mapping

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)

from strictops.meta._specs import TensorSpec, build_value


@contextlib.contextmanager
def fake_mode() -> Iterator[FakeTensorMode]:
    """Fake tensors with a shape environment: ``torch.empty(..., device="cuda:1")`` works
    without a GPU, and Dynamo can trace them with symbolic sizes."""
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        yield mode


def error_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from (a tracing error wraps the op's own error)."""
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def _zeros(spec: TensorSpec) -> torch.Tensor:
    # Zeros, not uninitialised memory: index 0, a topk_length of 0 and a zero state word are
    # valid values, so a built valid call is also safe to run on a real GPU. A spec that sets
    # its own values (a value rule's near miss) keeps them. Zeroed through the whole storage:
    # a view whose elements overlap cannot be filled element by element.
    t = spec.empty()
    if not spec.sets_values:
        t.untyped_storage().fill_(0)
    return t


def build_symbolic(spec: Mapping[str, Any], mode: FakeTensorMode) -> dict:
    """Fake tensors for ``spec`` whose every size and stride is a symbol of ``mode``'s shape
    env: the tensors a dynamic-shape trace sees. Entries that are not tensor specs pass
    unchanged, and a spec that is not ``symbolic`` (a view into shared or offset storage) is
    built as is."""
    def make(s: TensorSpec) -> torch.Tensor:
        if not s.symbolic:
            return s.empty()
        real = torch.empty_strided(s.shape, s.strides, dtype=s.dtype, device="meta")
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * len(s.shape))
        sym = mode.from_tensor(real, symbolic_context=ctx)  # symbolic sizes, device "meta"
        return torch.empty_strided(sym.shape, sym.stride(), dtype=s.dtype, device=s.device)

    return {name: build_value(s, make) for name, s in spec.items()}


@dataclass(frozen=True)
class Call:
    """One call of a public op.

    Attributes
    ----------
    op:
        The public function's name (``strictops.ops.<op>``).
    spec:
        Argument name -> :class:`TensorSpec` (built into a tensor) or plain value (``None``,
        ints, floats), in the public function's argument order.
    rule:
        ``None`` for a valid call; otherwise the one contract rule this call breaks.
    contract_module:
        The op's contract module, ``strictops.meta.<family>.<module>``: its ``CONTRACT``, its
        ``NEAR_MISSES`` and, optionally, ``KEYWORD_ONLY`` (the public function's keyword-only
        arguments).
    """

    op: str
    spec: Mapping[str, Any]
    rule: str | None
    contract_module: ModuleType  # strictops.meta.<family>.<module>, also the source of near misses

    @property
    def contract(self):
        """The op's :class:`~strictops.meta.Contract`."""
        return self.contract_module.CONTRACT

    @property
    def eager_only(self) -> bool:
        """Whether the broken rule reads tensor values (``reads_values``): it runs on real
        tensors in plain eager mode only, never on fake tensors or while tracing."""
        return self.rule is not None and self.contract.check(self.rule).reads_values

    def near_miss(self, rule: str) -> "Call":
        """This (valid) call with exactly ``rule`` broken, by the contract's near miss."""
        if self.rule is not None:
            raise ValueError(f"{self.op}: a near miss starts from a valid call, not one "
                             f"breaking {self.rule!r}")
        spec = self.contract_module.NEAR_MISSES[rule](dict(self.spec))
        return Call(self.op, spec, rule, self.contract_module)

    def split(self, values: Mapping[str, Any]) -> tuple[tuple, dict]:
        """``(args, kwargs)`` for the public function: arguments before the first
        keyword-only one go by position, the rest by keyword."""
        keyword_only = getattr(self.contract_module, "KEYWORD_ONLY", ())
        names = list(values)
        cut = next((i for i, n in enumerate(names) if n in keyword_only), len(names))
        return (tuple(values[n] for n in names[:cut]),
                {n: values[n] for n in names[cut:]})

    def build(self) -> tuple[tuple, dict]:
        """``(args, kwargs)`` of the call, its tensors created (zero-filled) on their devices
        under whatever mode is current: inside ``FakeTensorMode`` they are fake."""
        return self.split({k: build_value(v, _zeros) for k, v in self.spec.items()})

    def build_symbolic(self, mode: FakeTensorMode) -> tuple[tuple, dict]:
        """Like :meth:`build`, with every size a symbol of ``mode`` (see :func:`build_symbolic`)."""
        return self.split(build_symbolic(self.spec, mode))

    def named(self, args: tuple, kwargs: Mapping[str, Any]) -> dict:
        """The built ``(args, kwargs)`` as one ``{argument name: value}`` dict."""
        return {**dict(zip(self.spec, args)), **kwargs}

    def expected_error(self, args: tuple, kwargs: Mapping[str, Any]):
        """``(exception type, message)`` the op raises on these built arguments, or ``None``
        for a valid call. For an :attr:`eager_only` rule, on real tensors in eager mode."""
        if self.rule is None:
            return None
        return self.contract.expected_error(self.rule, **self.named(args, kwargs))


def _raised(fn: Callable, args: tuple, kwargs: Mapping[str, Any]) -> BaseException | None:
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 -- the caller compares it with the contract's
        return exc
    return None


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "no error"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def failures(fn: Callable, call: Call, *, traced: bool = True) -> list[str]:
    """Where ``fn`` (a function with the op's signature) misses the call's contract outcome;
    an empty list when it meets it everywhere.

    A near miss must raise exactly its rule's ``(type, message)``

    * on fake tensors with concrete sizes (what an eager call computes),
    * on fake tensors with symbolic sizes (what a dynamic-shape trace computes),
    * and, with ``traced``, while ``torch.compile(fn, fullgraph=True, dynamic=True)`` traces
      it (the tracing error carries the rule's error in its chain, with concrete numbers).

    A valid call must pass the contract and, with ``traced``, trace as one graph. So must a
    near miss of an :attr:`~Call.eager_only` rule: the rule reads tensor values, which fake
    tensors do not have and a trace must not sync on, so it runs on real tensors in eager mode
    only (the op copes with any value in its kernel); its error is for an eager call on real
    tensors to check. Each traced check starts from a reset compile cache, so it traces afresh.
    """
    out = []
    with fake_mode():
        args, kwargs = call.build()
        want = None if call.eager_only else call.expected_error(args, kwargs)
        if want is None:
            broken = call.contract.broken_rule(**call.named(args, kwargs))
            if broken is not None:
                what = "the valid call" if call.rule is None else f"the {call.rule} near miss"
                out.append(f"{what} breaks {broken!r} on fake tensors")
        else:
            got = _raised(fn, args, kwargs)
            if got is None or (type(got), str(got)) != want:
                out.append(f"eager: {_describe(got)}")
    if want is not None:
        with fake_mode() as mode:
            got = _raised(fn, *call.build_symbolic(mode))
        if got is None or (type(got), str(got)) != want:
            out.append(f"symbolic: {_describe(got)}")
    if traced:
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="eager", fullgraph=True, dynamic=True)
        with fake_mode():
            got = _raised(compiled, *call.build())
        if want is None:
            if got is not None:
                out.append(f"traced: {_describe(got)}")
        elif got is None or not any((type(e), str(e)) == want for e in error_chain(got)):
            out.append(f"traced: {_describe(got)}")
    return out
