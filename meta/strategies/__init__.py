"""strictops.meta.strategies: hypothesis strategies of calls to every public op.

For a user who wraps the ops in a model and wants hypothesis to find the shapes that break it::

    from strictops.meta import strategies

    strategies.OPS                                   # the public ops' names
    strategies.calls("fused_mamba_state_scatter_with_mask")              # valid calls
    strategies.calls("fused_mamba_state_scatter_with_mask", valid=False) # near misses

Each drawn :class:`Call` has ``build()``, returning ``(args, kwargs)`` for the public function
(``strictops.ops.<op>``) with its tensors created on ``device`` under whatever mode is current
(inside ``FakeTensorMode`` they are fake, so no GPU is needed), and ``rule``: ``None`` for a
valid call, otherwise the one contract rule the near miss breaks. A valid call traces under
``torch.compile(fullgraph=True, dynamic=True)`` on fake tensors; a near miss raises
``ValueError`` with that rule's message (``call.expected_error(args, kwargs)``), in eager mode
and while tracing. :func:`failures` checks both for any function with the op's signature.

Every call is generated from the op's contract (``strictops.meta.<family>.<module>``): its ``Dims``,
``valid_spec`` and ``NEAR_MISSES``, so the strategies cover exactly the input space the contract
declares. Near misses that name a device this machine cannot build (a second GPU where CUDA is
real and there is one) are not drawn, nor, unless asked for, those of rules that read tensor
values (such as a length that must lie in a range): those run on real tensors in eager mode
only, never on fake tensors or while tracing.

One module per op
-----------------
Every public module of this package (a name without a leading underscore) describes one op and
is found automatically; adding an op adds a module and edits nothing else here. It defines

``OP``
    The public function's name in ``strictops.ops``.
``contract``
    The op's contract module (``strictops.meta.<family>.<module>``), with ``CONTRACT``, ``Dims``,
    ``valid_spec(dims) -> {argument: TensorSpec | value}`` in the function's argument order,
    ``NEAR_MISSES`` (rule -> function breaking exactly that rule of a valid spec) and, if the
    function has keyword-only arguments, ``KEYWORD_ONLY`` (their names: ``build()`` passes
    them, and every argument after the first of them, by keyword).
``dims(device="cuda:0")``
    A hypothesis strategy of ``contract.Dims`` for valid calls on ``device``.
and may add the op's own value strategies (index values, lease values) for its tests.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from hypothesis import strategies as st

from strictops.meta._specs import buildable_here
from strictops.meta._calls import Call, build_symbolic, error_chain, failures, fake_mode


def _discover() -> dict[str, ModuleType]:
    modules = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        modules[module.OP] = module
    return dict(sorted(modules.items()))


MODULES: dict[str, ModuleType] = _discover()
OPS: tuple[str, ...] = tuple(MODULES)


def _module(op: str) -> ModuleType:
    try:
        return MODULES[op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; strictops.meta.strategies.OPS = {OPS}") from None


def calls(op: str, *, device: str = "cuda:0", valid: bool = True,
          values: bool = False) -> st.SearchStrategy[Call]:
    """A hypothesis strategy of :class:`Call` objects for the public function ``op``.

    Parameters
    ----------
    op : one of :data:`OPS`.
    device : the CUDA device the call's tensors are built on (a near miss may move one
        elsewhere: that is its rule).
    valid : valid calls (``call.rule is None``) or near misses, each breaking exactly one
        contract rule (``call.rule``), every rule drawn.
    values : near misses of the rules that read tensor values too (``call.eager_only``).
        Such a rule runs only on real tensors in plain eager mode, so its near miss raises
        nothing on fake tensors or while tracing: ask for them only for calls built on real
        tensors and run eagerly.
    """
    module = _module(op)
    valid_calls = module.dims(device=device).map(
        lambda d: Call(op, module.contract.valid_spec(d), None, module.contract))
    if valid:
        return valid_calls
    contract = module.contract.CONTRACT
    rules = st.sampled_from([c.rule for c in contract.checks if values or not c.reads_values])
    return st.builds(Call.near_miss, valid_calls, rules).filter(
        lambda c: buildable_here(c.spec))


__all__ = [
    "Call",
    "MODULES",
    "OPS",
    "build_symbolic",
    "calls",
    "error_chain",
    "failures",
    "fake_mode",
]
