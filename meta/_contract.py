"""The one form every strictops op contract takes.

A contract is an ordered tuple of :class:`Check` rows. Each row is data: a rule id, a predicate
over the op's arguments, the message it raises and the exception type. The same rows are run by

* the op's eager implementation, before anything is allocated or launched,
* the op's fake (meta) registration, on fake tensors with concrete or symbolic sizes, which is
  what ``torch.compile`` and ``torch.export`` trace,
* the tests, which ask the contract which message a broken rule must produce.

Predicates receive the op's arguments as one namespace (``a.dst``) and may return a Python
``bool`` (devices, dtypes, ranks) or a ``SymBool`` (relations between sizes). Both go through
``torch._check_with``: with symbolic sizes the relation becomes a guard or a runtime assert on
the relation itself, never a specialisation on a value. The message closure is only called when
the check fails, so a passing check costs one predicate call.

Messages are formatted from *concrete* views of the arguments (:func:`concrete`): a symbolic
size is replaced by its hint, so the text raised while tracing with dynamic shapes is the text
eager mode raises (``got 12``, never ``got s69``).

A row may read tensor values (``reads_values``, e.g. lengths that must lie in a range): it runs
only in plain eager mode on plain tensors outside CUDA-graph capture (:func:`values_readable`),
never while tracing, so it costs no graph break and no host sync where those are not allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Mapping

import torch
from torch.fx.experimental.symbolic_shapes import sym_and, sym_or

Predicate = Callable[..., "bool | torch.SymBool"]
Message = Callable[..., str]


def hint(value: Any) -> Any:
    """The concrete value behind a SymInt/SymFloat/SymBool (its hint); other values unchanged."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        node = value.node
        if node.hint is not None:
            return node.hint
        return node.shape_env.size_hint(node.expr)
    return value


def hint_size(size: Iterable[Any]) -> torch.Size:
    return torch.Size([hint(s) for s in size])


class ConcreteTensor:
    """Read-only view of a tensor's metadata with every symbolic size replaced by its hint.

    Used only to *format* messages: ``f"{t.shape[0]=}"`` on this view prints the number the
    caller would see in eager mode.
    """

    __slots__ = ("_t",)

    def __init__(self, t: torch.Tensor) -> None:
        self._t = t

    @property
    def shape(self) -> torch.Size:
        return hint_size(self._t.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def stride(self, dim: int | None = None):
        strides = tuple(hint(s) for s in self._t.stride())
        return strides if dim is None else strides[dim]

    def numel(self) -> int:
        return hint(self._t.numel())

    def __getattr__(self, name: str) -> Any:  # ndim, dtype, device, is_cuda, ...
        return getattr(self._t, name)

    def __repr__(self) -> str:
        return f"ConcreteTensor(shape={tuple(self.shape)}, dtype={self._t.dtype}, device={self._t.device})"


def sym_all(conds: Iterable[Any]) -> Any:
    """``all(conds)`` for bools and SymBools, without turning a SymBool into a Python bool.

    Plain ``True`` entries are skipped cheaply (the common case in eager mode); a plain
    ``False`` decides at once; the symbolic rest is combined into one ``SymBool``, so the
    caller's ``torch._check_with`` guards on the relation, not on values.
    """
    symbolic = []
    for c in conds:
        if c is True:
            continue
        if c is False:
            return False
        symbolic.append(c)
    return sym_and(*symbolic) if symbolic else True


def sym_either(a: Any, b: Any) -> Any:
    """``a or b`` for bools and SymBools, without a guard when either side is a plain bool."""
    if a is True or b is True:
        return True
    if a is False:
        return b
    if b is False:
        return a
    return sym_or(a, b)


def sym_min(a: Any, b: Any) -> Any:
    """``min(a, b)`` for ints and SymInts: the builtin on two ints (``torch.sym_min`` costs
    ~1 µs on an eager call's path), ``torch.sym_min`` when either is symbolic."""
    return min(a, b) if a.__class__ is int and b.__class__ is int else torch.sym_min(a, b)


def sym_max(a: Any, b: Any) -> Any:
    """``max(a, b)`` for ints and SymInts, as :func:`sym_min`."""
    return max(a, b) if a.__class__ is int and b.__class__ is int else torch.sym_max(a, b)


def contiguous_from(t: torch.Tensor, first_dim: int) -> Any:
    """Whether dims ``first_dim..`` of ``t`` are contiguous (a size-1 dim's stride is free), as
    one condition: a walk with no Python branch on a size, so tracing guards on the relation
    only."""
    shape, strides = t.shape, t.stride()
    expected, conds = 1, []
    for i in range(len(shape) - 1, first_dim - 1, -1):
        conds.append(sym_either(shape[i] == 1, strides[i] == expected))
        expected = expected * shape[i]
    return sym_all(conds)


def concrete(value: Any) -> Any:
    """A tensor's :class:`ConcreteTensor`, a list or tuple of them (a ``Tensor[]`` argument),
    or the hint of any other value."""
    if isinstance(value, torch.Tensor):
        return ConcreteTensor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(concrete(v) for v in value)
    return hint(value)


@dataclass(frozen=True)
class Check:
    """One rule of a contract.

    Attributes
    ----------
    rule:
        Short stable id (``"same_device"``); tests and strategies refer to rules by it.
    ok:
        Predicate over the op's arguments, given as one namespace (``a.dst``); ``True`` (or a
        true ``SymBool``) when the rule holds. One positional argument keeps the eager cost of
        a check to a single cheap call.
    message:
        Builds the error text from the op's arguments, given by keyword as concrete views, so
        that ``f"{dst.shape[0]=}"`` reads ``dst.shape[0]=12`` as the original message did.
    error:
        Exception type raised when the rule is broken.
    reads_values:
        The predicate reads tensor values, not only metadata: a host sync on a GPU tensor, and
        impossible on a fake one. Such a row runs only where :func:`values_readable` allows it;
        elsewhere it is skipped (the op must then cope with any value, e.g. in its kernel).
    reads_memory:
        The predicate reads where tensors lie in memory (storage identity, overlapping byte
        ranges), which the metadata signature of :class:`CachedValidation` does not hold: such a
        row runs on every call, a cached verdict never covers it.
    only_with:
        Names of arguments without which the row always holds: where every one of them is
        ``None``, the predicate returns ``True`` without reading any other argument. A cached
        verdict skips such a ``reads_values``/``reads_memory`` row for a signature in which
        they are all ``None`` (empty: the row runs on every call). The tests hold the claim
        to account.
    disjoint:
        Pairs of argument names: the row is exactly "no two tensors of a pair share a byte"
        (:func:`disjoint`; ``None`` shares nothing). Built by :func:`disjoint_check`, whose
        predicate is made from the pairs, so the rule has one definition; the C++ eager path
        (``strictops.ops._runtime.host_path``) runs such a row from its pairs.
    inside:
        None, or a function of the arguments' namespace that returns tensors: the row is
        exactly "each of them lies inside its storage" (:func:`inside_storage`). Built by
        :func:`inside_check`; the C++ eager path runs such a row on the tensors it names.
    """

    rule: str
    ok: Predicate
    message: Message
    error: type[Exception] = ValueError
    reads_values: bool = False
    reads_memory: bool = False
    only_with: tuple[str, ...] = ()
    disjoint: tuple[tuple[str, str], ...] = ()
    inside: Callable[[Any], Iterable[Any]] | None = None


def disjoint(x: Any, y: Any) -> "bool | torch.SymBool":
    """True unless tensors ``x`` and ``y`` share a byte of memory (``None`` shares none).

    No ``data_ptr()``: storage identity (``_is_alias_of``) is known for fake tensors too, and it
    is a plain bool, so the common case (separate storages) adds no guard. Within one storage,
    each is taken as the byte range from its offset over its ``numel`` elements (exact for the
    contiguous tensors the contracts using it have checked by then); an empty one shares none.
    """
    if x is None or y is None or not torch._C._is_alias_of(x, y):
        return True
    x_start, y_start = x.storage_offset() * x.element_size(), y.storage_offset() * y.element_size()
    x_end, y_end = x_start + x.numel() * x.element_size(), y_start + y.numel() * y.element_size()
    return sym_either(sym_either(x_start == x_end, y_start == y_end),
                      sym_either(x_end <= y_start, y_end <= x_start))


def reach(t: Any):
    """The largest element offset ``t`` reaches in its storage, from its sizes, strides and
    storage offset (meaningless when ``t`` is empty)."""
    out = t.storage_offset()
    for size, stride in zip(t.shape, t.stride()):
        out = out + (size - 1) * stride
    return out


def inside_storage(t: Any) -> "bool | torch.SymBool":
    """Every element of ``t`` lies inside its untyped storage. Symbolic on fake tensors, whose
    storage size is an expression in the sizes of the tensor the storage was made for."""
    nbytes = t.untyped_storage().nbytes()
    return sym_either(t.numel() == 0, (reach(t) + 1) * t.element_size() <= nbytes)


def inside_check(rule: str, tensors: Callable[[Any], Iterable[Any]], message: Message,
                 error: type[Exception] = ValueError) -> Check:
    """A ``reads_memory`` row that holds when every tensor ``tensors(a)`` gives lies inside
    its storage (:func:`inside_storage`)."""
    def ok(a):
        return sym_all(inside_storage(t) for t in tensors(a))

    return Check(rule, ok, message, error, reads_memory=True, inside=tensors)


def disjoint_check(rule: str, pairs: tuple[tuple[str, str], ...], message: Message,
                   only_with: tuple[str, ...] | None = None,
                   error: type[Exception] = ValueError) -> Check:
    """A ``reads_memory`` row that holds when no pair of ``pairs`` (argument names) shares a
    byte (:func:`disjoint`). ``only_with``: names of which every pair holds one (so the row
    holds where they are all ``None``); by default every name of the pairs."""
    def ok(a):
        return sym_all(disjoint(getattr(a, x), getattr(a, y)) for x, y in pairs)

    if only_with is None:
        only_with = tuple(dict.fromkeys(n for pair in pairs for n in pair))
    if not all(x in only_with or y in only_with for x, y in pairs):
        raise TypeError(f"{rule}: only_with {only_with} misses a pair of {pairs}")
    return Check(rule, ok, message, error, reads_memory=True, only_with=only_with,
                 disjoint=pairs)


@dataclass(frozen=True)
class Contract:
    """The ordered checks of one op; the first failing check is the one reported.

    Attributes
    ----------
    op:
        Qualified op name, ``"strictops::<name>"``.
    stem:
        The op's name in the flat folders (``tests/test_<stem>.py``,
        ``compile_tests/test_<stem>_compile.py``, ``benchmarks/bench_<stem>.py``,
        ``meta/strategies/<stem>.py``, ``docs/design/<stem>.md``).
    checks:
        The rules, in the order they are checked.
    mutates:
        Names of the arguments the op writes in place (declared in its schema).
    module:
        The op's module in its family folder, the same under ``ops/`` and ``meta/``
        (``"mamba.state_scatter"``: ``strictops.ops.mamba.state_scatter`` and
        ``strictops.meta.mamba.state_scatter``).
    """

    op: str
    stem: str
    checks: tuple[Check, ...]
    mutates: tuple[str, ...] = ()
    module: str = ""

    def __post_init__(self) -> None:
        rules = [c.rule for c in self.checks]
        if len(set(rules)) != len(rules):
            raise TypeError(f"{self.op}: duplicate rule ids in {rules}")

    @property
    def rules(self) -> tuple[str, ...]:
        return tuple(c.rule for c in self.checks)

    def check(self, rule: str) -> Check:
        for c in self.checks:
            if c.rule == rule:
                return c
        raise KeyError(f"{self.op} has no rule {rule!r}; rules: {self.rules}")

    def validate(self, **args: Any) -> None:
        """Run every check in order; raise the first failing one's error with its message.
        A ``reads_values`` row runs only where :func:`values_readable` allows it."""
        self.validate_rows(self.checks, args)

    def validate_rows(self, checks: Iterable[Check], args: Mapping[str, Any]) -> None:
        """:meth:`validate` restricted to ``checks`` (rows of this contract, in its order)."""
        namespace = SimpleNamespace(**args)
        for c in checks:
            if c.reads_values and not values_readable(args.values()):
                continue
            ok = c.ok(namespace)
            # A plain True needs no guard and no message closure: the eager fast path.
            # Anything else (False, or a SymBool while tracing) goes through _check_with.
            if ok is not True:
                torch._check_with(c.error, ok, _lazy_message(c, args))

    def broken_rule(self, **args: Any) -> str | None:
        """The rule :meth:`validate` reports for these arguments: the first whose predicate
        fails, or None. The arguments may be real or fake (a ``reads_values`` row is skipped
        where :meth:`validate` skips it); with symbolic sizes a relation is evaluated on its
        hints (for tests, not for tracing)."""
        namespace = SimpleNamespace(**args)
        return next((c.rule for c in self.checks
                     if not (c.reads_values and not values_readable(args.values()))
                     and not hint(c.ok(namespace))), None)

    def expected_error(self, rule: str, **args: Any) -> tuple[type[Exception], str]:
        """The (type, message) that breaking ``rule`` on these arguments must raise."""
        c = self.check(rule)
        return c.error, _lazy_message(c, args)()


# What plain eager mode must not have: a dispatch mode, a torch-function mode, a functorch
# transform (each call returns a false value when absent). The C++ eager path calls the same.
EAGER_GATE = (torch._C._len_torch_dispatch_stack, torch._C._len_torch_function_stack,
              torch._C._are_functorch_transforms_active)
_DISPATCH_MODES, _FUNCTION_MODES, _FUNCTORCH = EAGER_GATE


def plain_eager_mode() -> bool:
    """Whether Python runs in plain eager mode: not while ``torch.compile``/``torch.export``
    trace, under no dispatch or function mode (such as ``FakeTensorMode``), with no functorch
    transform active (:data:`EAGER_GATE`). The one test of it, for the contract and the ops'
    eager paths."""
    return not (torch.compiler.is_compiling() or _DISPATCH_MODES() or _FUNCTION_MODES()
                or _FUNCTORCH())


def values_readable(values: Iterable[Any]) -> bool:
    """Whether a check may read the values of the tensors among ``values``: in
    :func:`plain_eager_mode`, on plain ``torch.Tensor``s only, and not while the current
    stream captures a CUDA graph (a read of a CUDA tensor would sync the host, which capture
    forbids; no capture runs before CUDA is initialised)."""
    if not plain_eager_mode():
        return False
    for v in values:
        if type(v) is not torch.Tensor and isinstance(v, torch.Tensor):
            return False
    return not (torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())


class CachedValidation:
    """A contract's eager validation with its verdict cached per metadata signature.

    ``validation(*args)`` (the op's arguments in the order of ``names``) does what
    ``contract.validate(**dict(zip(names, args)))`` does, raising the same error with the same
    message. The signature of a call holds, for each argument, the class, layout, shape,
    strides, storage offset, dtype and device of a tensor, the class and each item's signature
    of a list or tuple (a list of tensor pairs), or the type and value of anything else
    (``None`` included). A call whose signature passed before skips the rows that read
    only metadata, which a change of any of those pieces could break, and still runs every
    ``reads_values`` and ``reads_memory`` row, except those whose ``only_with`` arguments are
    all ``None`` in the signature (they hold). A failing call is never cached; nor a call
    whose signature cannot be computed or hashed (it is validated in full).

    Eager only: the op calls it where it skips the dispatcher (plain tensors, no tracing); the
    fake and traced paths run :meth:`Contract.validate`.
    """

    # Cached signatures kept per contract before the cache starts over.
    MAX_ENTRIES = 1024

    def __init__(self, contract: Contract, names: tuple[str, ...]) -> None:
        self.contract = contract
        self.names = names
        self.per_call = tuple(c for c in contract.checks if c.reads_values or c.reads_memory)
        unknown = sorted({n for c in self.per_call for n in c.only_with} - set(names))
        if unknown:
            raise TypeError(f"{contract.op}: only_with names {unknown}, not arguments {names}")
        # Per passed signature: the per-call rows its calls run (an empty tuple: none).
        self.passed: dict[tuple, tuple[Check, ...]] = {}
        self.signature = _signature_function(names)
        self.namespace = eval(f"lambda {', '.join(names)}: SimpleNamespace("  # noqa: S307
                              f"{', '.join(f'{n}={n}' for n in names)})",
                              {"SimpleNamespace": SimpleNamespace})

    def _rows_of(self, args: tuple) -> tuple[Check, ...]:
        """The per-call rows calls of ``args``'s signature run: those with an ``only_with``
        argument given, or with none named."""
        index = {n: i for i, n in enumerate(self.names)}
        return tuple(c for c in self.per_call
                     if not c.only_with or any(args[index[n]] is not None for n in c.only_with))

    def _validate_per_call(self, rows: tuple[Check, ...], args: tuple) -> None:
        """The per-call ``rows``, as :meth:`Contract.validate` runs them (the argument mapping
        for a message is built only when one fails)."""
        namespace = self.namespace(*args)
        for c in rows:
            if c.reads_values and not values_readable(args):
                continue
            ok = c.ok(namespace)
            if ok is not True:
                torch._check_with(c.error, ok, _lazy_message(c, dict(zip(self.names, args))))

    def rows_for(self, args: tuple) -> tuple[Check, ...] | None:
        """The per-call rows of a passed signature's calls, or None where the signature of
        ``args`` has not passed (or has none)."""
        try:
            return self.passed.get(self.signature(*args))
        except Exception:
            return None

    def __call__(self, *args: Any) -> None:
        try:
            key = self.signature(*args)
            rows = self.passed.get(key)
        except Exception:  # e.g. a sparse tensor's strides, an unhashable scalar
            key = rows = None
        if rows is not None:
            if rows:
                self._validate_per_call(rows, args)
            return
        self.contract.validate(**dict(zip(self.names, args)))
        if key is not None:
            if len(self.passed) >= self.MAX_ENTRIES:
                self.passed.clear()
            self.passed[key] = self._rows_of(args)


def _signature_function(names: tuple[str, ...]) -> Callable[..., tuple]:
    """A function of the arguments ``names`` that returns their metadata signature (see
    :class:`CachedValidation`), written out argument by argument: one call, no loop."""
    parts = ", ".join(
        f"(None if {n} is None else ({n}.__class__, {n}.layout, {n}.shape, {n}.stride(), "
        f"{n}.storage_offset(), {n}.dtype, {n}.device) if isinstance({n}, Tensor) "
        f"else sequence({n}) if {n}.__class__ in SEQUENCES else ({n}.__class__, {n}))"
        for n in names)
    source = f"def signature({', '.join(names)}):\n    return ({parts},)\n"
    namespace = {"Tensor": torch.Tensor, "SEQUENCES": _SEQUENCES,
                 "sequence": _sequence_signature}
    exec(source, namespace)  # noqa: S102 - the names are the op's own argument names
    return namespace["signature"]


_SEQUENCES = (list, tuple)


def _sequence_signature(items) -> tuple:
    """The signature of a list or tuple argument: its class and each item's, a tensor's as in
    :class:`CachedValidation`, a list's or tuple's likewise, anything else its class and
    value."""
    return (items.__class__, tuple(
        (x.__class__, x.layout, x.shape, x.stride(), x.storage_offset(), x.dtype, x.device)
        if isinstance(x, torch.Tensor)
        else _sequence_signature(x) if x.__class__ in _SEQUENCES else (x.__class__, x)
        for x in items))


def _lazy_message(c: Check, args: Mapping[str, Any]) -> Callable[[], str]:
    return lambda: c.message(**{k: concrete(v) for k, v in args.items()})
