"""The eager validation with cached verdicts (strictops.meta._contract.CachedValidation).

Every call after a good call has been cached must get exactly the verdict of the full contract:
the same error type and message, or none. The calls tried differ from the cached one in one
piece of metadata at a time (each tensor's shape, strides, dtype, device, storage offset and
None-ness, each scalar's value and type), or break one rule at a time (the contracts' near
misses). Rows that read more than metadata (tensor values, memory overlap) run on every call.
The valid calls are drawn from every public op's strategies (``strictops.meta.strategies``).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from strictops.meta.mamba import state_scatter as mss
from strictops.meta.sparse_mla import prefill as smp
from strictops.meta import strategies
from strictops.meta._calls import Call
from strictops.meta._contract import CachedValidation, Check, Contract
from strictops.meta._specs import TensorSpec, build, buildable_here
from strictops.meta.testing import examples, CAN_NAME_SECOND_GPU, fake_mode

SETTINGS = settings(max_examples=examples(8), deadline=None, suppress_health_check=[HealthCheck.too_slow])
OTHER_DTYPES = (torch.float32, torch.int32, torch.int64, torch.bfloat16, torch.uint8,
                torch.float8_e4m3fn)


@dataclasses.dataclass(frozen=True)
class OffsetSpec(TensorSpec):
    """A tensor that starts ``offset`` elements into its storage."""

    offset: int = 0
    symbolic = False

    def empty(self) -> torch.Tensor:
        span = 1 + sum((s - 1) * st for s, st in zip(self.shape, self.strides))
        base = torch.empty(self.offset + max(span, 0), dtype=self.dtype, device=self.device)
        return base.as_strided(self.shape, self.strides, self.offset)


def _tensor_mutations(name: str, s: TensorSpec):
    """``(what, spec)`` pairs: the tensor ``s`` with one piece of its metadata changed (or
    None)."""
    devices = ["cpu", "cuda:1" if CAN_NAME_SECOND_GPU else "cuda:0"]
    for dim in range(len(s.shape)):
        grown = tuple(n + 1 if i == dim else n for i, n in enumerate(s.shape))
        yield f"{name}.shape[{dim}]", TensorSpec(grown, s.dtype, s.device)
        yield f"{name}.stride({dim})", TensorSpec(s.shape, s.dtype, s.device).with_gap(dim)
    for dtype in OTHER_DTYPES:
        if dtype != s.dtype:
            yield f"{name}.dtype={dtype}", TensorSpec(s.shape, dtype, s.device)
    for device in devices:
        if device != s.device:
            yield f"{name}.device={device}", TensorSpec(s.shape, s.dtype, device)
    for offset in (1, 256):
        yield f"{name}.storage_offset={offset}", OffsetSpec(s.shape, s.dtype, s.device,
                                                            offset=offset)
    yield f"{name}=None", None


def _mutations(spec: dict):
    """``(what, spec)`` pairs, each ``spec`` with one piece of metadata of one argument
    changed: of a tensor, of a scalar, or of one tensor of a list of tensor pairs."""
    for name, s in spec.items():
        if isinstance(s, TensorSpec):
            for what, changed in _tensor_mutations(name, s):
                yield what, {**spec, name: changed}
        elif isinstance(s, list):  # pairs of tensors
            for i, pair in enumerate(s):
                for j, t in enumerate(pair):
                    for what, changed in _tensor_mutations(f"{name}[{i}][{j}]", t):
                        new_pair = tuple(changed if k == j else u for k, u in enumerate(pair))
                        yield what, {**spec, name: [*s[:i], new_pair, *s[i + 1:]]}
        elif s is None:
            yield f"{name}=tensor", {**spec, name: TensorSpec((1,), torch.int32, "cuda:0")}
        elif isinstance(s, (int, float)) and not isinstance(s, bool):
            for value in (s + 1, s * 2, 0, -1, float(s) + 0.5):
                if value != s or type(value) is not type(s):
                    yield f"{name}={value!r}", {**spec, name: value}
        elif isinstance(s, str):
            yield f"{name}=other", {**spec, name: s + "_other"}


def _outcome(fn, args: dict):
    try:
        fn(**args)
    except Exception as e:  # noqa: BLE001 - the verdict, whatever it is, is compared
        return type(e), str(e)
    return None


def _cached(module):
    validation = CachedValidation(module.CONTRACT, module.ARGUMENTS)
    return validation, lambda **args: validation(*(args[n] for n in module.ARGUMENTS))


def _full_spec(call: Call) -> dict:
    """Every argument of the contract's validation (``ARGUMENTS``): the call's own, ``None``
    for an optional one it leaves out, and the op's name for ``name``."""
    module = call.contract_module
    return {n: call.spec.get(n, module.OP_NAME if n == "name" else None)
            for n in module.ARGUMENTS}


# The ops whose eager path caches its contract's verdict: their contract module names the
# validation's arguments (``ARGUMENTS``); every public op, the multi-pair conv window scatter
# (a list of tensor pairs) included.
CACHED_OPS = tuple(op for op in strategies.OPS
                   if hasattr(strategies.MODULES[op].contract, "ARGUMENTS"))


@pytest.mark.parametrize("op", CACHED_OPS)
@SETTINGS
@given(data=st.data())
def test_single_metadata_changes_get_the_full_verdict(op, data):
    call = data.draw(strategies.calls(op))
    module = call.contract_module
    valid = _full_spec(call)
    validation, cached = _cached(module)
    failures = 0
    with fake_mode():
        cached(**build(valid))
        assert len(validation.passed) == 1
        for what, spec in _mutations(valid):
            args = build(spec)
            want = _outcome(module.CONTRACT.validate, args)
            assert _outcome(cached, args) == want, what
            failures += want is not None
            cached(**build(valid))  # the good call still passes
    assert failures > 0


@pytest.mark.parametrize("op", CACHED_OPS)
@SETTINGS
@given(data=st.data())
def test_near_misses_after_a_cached_call_raise_their_rule(op, data):
    call = data.draw(strategies.calls(op))
    module = call.contract_module
    valid = _full_spec(call)
    _, cached = _cached(module)
    tried = 0
    with fake_mode():
        for check in module.CONTRACT.checks:
            if check.reads_values:  # never read on fake tensors: test_value_and_memory_rows...
                continue
            bad = call.near_miss(check.rule)
            if not buildable_here(bad.spec):  # a second GPU this machine lacks
                continue
            cached(**build(valid))
            args = build({n: bad.spec.get(n, valid[n]) for n in module.ARGUMENTS})
            assert _outcome(cached, args) == module.CONTRACT.expected_error(check.rule, **args)
            tried += 1
    assert tried > 0


def test_a_hit_skips_the_metadata_rows():
    """A cached signature does not run the contract again (what makes it cheap); a rebuilt
    call with equal metadata is a hit."""
    validation, cached = _cached(mss)
    valid = _full_spec(Call(mss.OP_NAME, mss.valid_spec(mss.Dims(2, 3, 4, 5, (6,), 7)), None, mss))
    with fake_mode():
        cached(**build(valid))
        validation.contract = SimpleNamespace(validate=lambda **_: pytest.fail("not cached"),
                                              validate_rows=None)
        cached(**build(valid))


def test_overlap_rows_run_on_every_call():
    """Overlapping buffers have the metadata signature of separate ones; the overlap rules
    (``reads_memory``) still refuse them after separate buffers were cached."""
    dims = smp.Dims(s_q=3, s_kv=50, with_buffers=True, with_errors=True)
    validation, cached = _cached(smp)
    with fake_mode():
        call = Call(smp.OP_NAME, smp.valid_spec(dims), None, smp)
        cached(**build(_full_spec(call)))
        for rule in ("buffers_alias", "topk_length_errors_alias"):
            bad = build(_full_spec(call.near_miss(rule)))
            assert validation.signature(*(bad[n] for n in smp.ARGUMENTS)) in validation.passed
            assert _outcome(cached, bad) == smp.CONTRACT.expected_error(rule, **bad)


def _toy_contract() -> Contract:
    return Contract(op="strictops::toy", stem="toy", checks=(
        Check("float", lambda a: a.x.dtype == torch.float32, lambda **_: "x must be float32"),
        Check("nonnegative", lambda a: bool((a.x >= 0).all()),
              lambda **_: "x must be nonnegative", reads_values=True),
        Check("disjoint", lambda a: a.y is None or not torch._C._is_alias_of(a.x, a.y),
              lambda **_: "x and y must not alias", reads_memory=True),
    ))


def test_value_and_memory_rows_run_on_a_hit():
    validation = CachedValidation(_toy_contract(), ("x", "y"))
    x, y = torch.ones(4), torch.ones(4)
    validation(x, y)
    with pytest.raises(ValueError, match="x must be nonnegative"):
        validation(-x, y)
    with pytest.raises(ValueError, match="x and y must not alias"):
        validation(x, x.view(4))
    assert len(validation.passed) == 1
    with pytest.raises(ValueError, match="x must be float32"):
        validation(x.double(), None)


def test_unhashable_or_odd_arguments_are_validated_in_full():
    contract = Contract(op="strictops::toy", stem="toy", checks=(
        Check("small", lambda a: len(a.x) < 3, lambda **_: "x must be short"),))
    validation = CachedValidation(contract, ("x",))
    validation({1, 2})  # a set: no signature (unhashable), validated in full, not cached
    with pytest.raises(ValueError, match="x must be short"):
        validation({1, 2, 3})
    assert not validation.passed
    validation([1, 2])  # a list: its signature holds each item
    with pytest.raises(ValueError, match="x must be short"):
        validation([1, 2, 3])
    validation((1, 2))  # a tuple of the same items: another signature
    assert len(validation.passed) == 2
    dtype_only = Contract(op="strictops::toy", stem="toy", checks=_toy_contract().checks[:1])
    validation = CachedValidation(dtype_only, ("x",))
    dense = torch.zeros(1).expand(3, 3)  # strides (0, 0), as a sparse tensor reports
    validation(dense)
    with pytest.raises(ValueError, match="x must be float32"):
        validation(torch.eye(3, dtype=torch.float64).to_sparse())
    validation(torch.eye(3).to_sparse())
    assert len(validation.passed) == 2  # the layout keeps them apart


class _Unread:
    """An argument a predicate must not read: any use but ``is None`` raises."""

    def __getattribute__(self, name):
        raise AssertionError(f"read .{name}")

    def _refuse(self, *_):
        raise AssertionError("used")

    __bool__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _refuse
    __len__ = __iter__ = __index__ = __int__ = __float__ = _refuse
    __add__ = __radd__ = __sub__ = __mul__ = __and__ = __or__ = __getitem__ = _refuse


@pytest.mark.parametrize("op", CACHED_OPS)
def test_only_with_rows_hold_without_their_arguments(op):
    """A row's ``only_with`` claim: with those arguments None it is True whatever the others
    are, so it reads none of them (each is a stand-in that refuses any use)."""
    module = strategies.MODULES[op].contract
    rows = [c for c in module.CONTRACT.checks if c.only_with]
    for c in rows:
        args = {n: None if n in c.only_with else _Unread() for n in module.ARGUMENTS}
        assert c.ok(SimpleNamespace(**args)) is True, c.rule
    if op == "sparse_mla_q8kv8_prefill_fwd":
        assert {c.rule for c in rows} == {"topk_length_values", "buffers_alias",
                                           "topk_length_errors_alias"}


def test_only_with_rows_run_only_where_their_arguments_are_given():
    fails = Contract(op="strictops::toy", stem="toy", checks=(
        Check("y_small", lambda a: a.y is None or bool((a.y < 3).all()),
              lambda **_: "y must be < 3", reads_values=True, only_with=("y",)),
        Check("always", lambda a: bool((a.x >= 0).all()), lambda **_: "x must be nonnegative",
              reads_values=True),))
    validation = CachedValidation(fails, ("x", "y"))
    x, y = torch.ones(4), torch.ones(4)
    validation(x, None)
    validation(x, y)
    assert [[c.rule for c in rows] for rows in validation.passed.values()] == [
        ["always"], ["y_small", "always"]]
    with pytest.raises(ValueError, match="y must be < 3"):
        validation(x, y + 5)  # the row runs on a hit where y is given
    with pytest.raises(ValueError, match="x must be nonnegative"):
        validation(-x, None)
    with pytest.raises(TypeError, match="only_with names"):
        CachedValidation(fails, ("x", "z"))
