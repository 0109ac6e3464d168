"""The self-check behind ``python -m strictops``.

For every registered op (:data:`strictops.ops.OP_MODULES`) it says which kernel the op's calls
run here and why (the op module's ``kernel_choice(device) -> (kernel, why)`` where it has one,
else its one ``@triton.jit`` kernel), and shows three things:

1. **Exact result.** The op on a valid call whose index tensors mix valid, negative,
   out-of-range and duplicate values (the op module's ``example_inputs``) leaves its output
   bit-identical to the op module's plain-PyTorch ``reference``. With a GPU the public op runs
   on CUDA at a moderate shape; without one the kernel runs in the Triton interpreter on small
   CPU tensors.
2. **Clean trace.** ``torch.compile(fullgraph=True, dynamic=True)`` traces a call of the public
   op on fake CUDA tensors (no GPU needed) as one graph.
3. **Bad calls fail at trace time.** For every rule of the op's contract, the contract's near
   miss (a valid call that breaks exactly that rule) raises that rule's error with its message
   verbatim on fake tensors with concrete and with symbolic sizes, and fails while tracing
   with that error in the chain (:func:`strictops.meta._calls.failures`, which the tests use
   too). A rule that reads tensor values (``reads_values``) runs on real tensors in eager mode
   only: its near miss must pass on fake tensors and trace as one graph.

It prints one table row per check and a summary line, and returns 0 when every check passes,
1 otherwise.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable

import torch
from triton.runtime.jit import JITFunction

from strictops.meta import CONTRACTS
from strictops.meta._calls import Call, failures, fake_mode
from strictops.meta._specs import TensorSpec, build_value, buildable_here
from strictops.ops import OP_MODULES
from strictops.ops._runtime import host_path as _host_path

SEED = 0
# Fake tensors may name a CUDA device even in a CPU-only build of torch.
FAKE_DEVICE = "cuda:0"
PREVIEW = 70


@dataclass(frozen=True)
class Row:
    """One line of the report."""

    op: str
    check: str
    passed: bool
    detail: str
    skipped: bool = False


def _preview(text: str) -> str:
    """First line of ``text``, cut to about ``PREVIEW`` characters."""
    lines = text.strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= PREVIEW else line[:PREVIEW] + "..."


def _short(op: str) -> str:
    """``"strictops::name"`` -> ``"name"``."""
    return op.split("::", 1)[1]


def _public_function(op: str, module) -> Callable:
    """The op's public function: its module's attribute named like the op."""
    return getattr(module, _short(op))


def _example(module, device: str, small: bool) -> dict:
    """The op module's example call, the same one on every run."""
    return module.example_inputs(device, small, torch.Generator().manual_seed(SEED))


def _fake_spec(module) -> dict:
    """The small example call as tensor specs on ``FAKE_DEVICE``.

    Its sizes are pairwise distinct and >= 2, so a dynamic trace keeps each one a separate
    symbol. Strides are left contiguous, as ``valid_spec`` describes them, so the near misses
    can change shapes freely.
    """
    return {  # tensors, also in lists and pairs; None, Python scalars: passed as they are
        name: build_value(t, lambda t: TensorSpec(tuple(t.shape), t.dtype, FAKE_DEVICE),
                          torch.Tensor)
        for name, t in _example(module, "cpu", small=True).items()
    }


def check_result(op: str, module) -> Row:
    """Run the kernel on the example call and compare its output with the reference.

    An op module may define ``selfcheck_result(on_gpu) -> (passed, detail)`` when its result
    is not one tensor written in place and compared bit for bit (e.g. a tolerance on an
    attention output); otherwise the in-place comparison below is used.
    """
    custom = getattr(module, "selfcheck_result", None)
    if custom is not None:
        passed, detail = custom(torch.cuda.is_available())
        return Row(op, "result", passed, detail)
    if torch.cuda.is_available():
        args = _example(module, "cuda:0", small=False)
        run, where = _public_function(op, module), "GPU cuda:0"
    else:
        args = _example(module, "cpu", small=True)
        # Reverse program order: on a GPU programs run in no set order, so neither may matter.
        run = functools.partial(module.launch_interpreted, reverse_programs=True)
        where = "Triton interpreter"
    (name,) = CONTRACTS[op].mutates
    before = args[name].clone()
    expected = module.reference(**args)
    run(**args)
    detail = f"{where}, {name} shape {list(before.shape)}"
    # An example that writes nothing would let a kernel that does nothing pass.
    if torch.equal(expected, before):
        return Row(op, "exact result", False, f"{detail}: the example call writes nothing")
    return Row(op, "exact result", torch.equal(args[name], expected), detail)


def check_kernel(op: str, module) -> Row:
    """The kernel the op's calls run here (on ``cuda:0``, or without a GPU on CPU tensors) and
    why: the module's ``kernel_choice(device)`` where it defines one, else the one
    ``@triton.jit`` kernel it defines (by the package's naming, a name ending in ``_kernel``).
    A row of information: it fails only where the choice itself raises."""
    on_gpu = torch.cuda.is_available()
    choice = getattr(module, "kernel_choice", None)
    if choice is not None:
        name, why = choice(torch.device("cuda:0" if on_gpu else "cpu"))
    else:
        kernels = sorted(n for n, v in vars(module).items() if isinstance(v, JITFunction)
                         and n.endswith("_kernel") and v.__module__ == module.__name__)
        name = kernels[0] if len(kernels) == 1 else "triton"
        why = "its one Triton kernel" if len(kernels) == 1 else (
            f"one of {', '.join(kernels)}; the module has no kernel_choice")
        why += "" if on_gpu else "; no GPU: the Triton interpreter"
    return Row(op, "kernel", True, f"{name} ({why})")


def _call(op: str, module, spec: dict) -> Call:
    return Call(_short(op), spec, None, module.contract)


def _failed(op: str, check: str, detail: str, problems: list[str]) -> Row:
    if problems:
        return Row(op, check, False, f"{detail}: {_preview('; '.join(problems))}")
    return Row(op, check, True, detail)


def check_trace(op: str, module, spec: dict) -> Row:
    """Trace a valid call of the public op on fake CUDA tensors, as one graph."""
    problems = failures(_public_function(op, module), _call(op, module, spec))
    detail = f"one graph (fullgraph, dynamic shapes, fake {FAKE_DEVICE})"
    return _failed(op, "compile trace", detail, problems)


def check_rule(op: str, module, spec: dict, rule: str) -> Row:
    """The rule's near miss raises the rule's error, message verbatim: eager and symbolic on
    fake tensors, and while tracing. A rule that reads tensor values is eager only (real
    tensors): its near miss must pass on fake tensors and trace as one graph instead."""
    call = _call(op, module, spec).near_miss(rule)
    if not buildable_here(call.spec):
        return Row(op, "bad call", True, f"{rule}: needs a second GPU on this machine",
                   skipped=True)
    problems = failures(_public_function(op, module), call)
    if call.eager_only:
        detail = f"{rule}: reads values, eager only; none read on fake tensors or traced"
        return _failed(op, "bad call", detail, problems)
    with fake_mode():
        _, message = call.expected_error(*call.build())
    return _failed(op, "bad call", f"{rule}: {_preview(message)}", problems)


def _guarded(op: str, check: str, run: Callable[[], Row]) -> Row:
    """``run()``, with a crash reported as a failed check so the other checks still run."""
    try:
        return run()
    except Exception as exc:
        return Row(op, check, False, _preview(f"{type(exc).__name__}: {exc}"))


def check_op(op: str, module) -> list[Row]:
    """Every check of one op, in report order."""
    spec = _fake_spec(module)
    rows = [
        _guarded(op, "kernel", functools.partial(check_kernel, op, module)),
        _guarded(op, "exact result", functools.partial(check_result, op, module)),
        _guarded(op, "compile trace", functools.partial(check_trace, op, module, spec)),
    ]
    for rule in CONTRACTS[op].rules:
        check = functools.partial(check_rule, op, module, spec, rule)
        rows.append(_guarded(op, "bad call", check))
    return rows


def print_table(rows: list[Row]) -> None:
    """Left-aligned plain-text columns; the last column is not padded."""
    cells = [("op", "check", "result", "detail")]
    cells += [(_short(r.op), r.check, "SKIP" if r.skipped else "PASS" if r.passed else "FAIL",
               r.detail) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    lines = ["  ".join([*(f"{v:<{w}}" for v, w in zip(c, widths)), c[3]]) for c in cells]
    lines.insert(1, "  ".join([*("-" * w for w in widths), "-" * 6]))
    print("\n".join(lines))


def main() -> int:
    """Run every check of every op, print the report; 0 if all pass, else 1."""
    start = time.perf_counter()
    rows = [row for op, module in OP_MODULES.items() for row in check_op(op, module)]
    print_table(rows)
    failed = sum(not r.passed for r in rows)
    skipped = sum(r.skipped for r in rows)
    print(f"\n{len(OP_MODULES)} op(s), {len(rows)} checks: {len(rows) - failed - skipped} passed, "
          f"{skipped} skipped, "
          f"{failed} failed ({time.perf_counter() - start:.1f} s)")
    print("C++ eager path: " + ("built" if _host_path.available() else
                                "not built (every eager call takes the Python path)"))
    return 1 if failed else 0
