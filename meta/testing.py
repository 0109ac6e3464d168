"""pytest-side helpers built on the contracts: GPU markers, fake-tensor tracing, assertions.

Importing this module needs pytest and hypothesis (the ``test`` extra); the ops never import it.
The calls the tests draw come from :mod:`strictops.meta.strategies`, which is generated from the
contracts, so the tests exercise exactly the input space each contract declares.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import pytest
import torch

from strictops.meta.sparse_mla import prefill as smp
from strictops.meta._specs import build, buildable_here
from strictops.meta._calls import Call, build_symbolic, error_chain, failures, fake_mode

HAS_CUDA = torch.cuda.is_available()
HAS_TWO_GPUS = HAS_CUDA and torch.cuda.device_count() >= 2
# Fake tensors may name a second GPU on a machine without CUDA, but not where CUDA is real and
# there is one GPU.
CAN_NAME_SECOND_GPU = not HAS_CUDA or HAS_TWO_GPUS
# The sparse MLA rules whose near miss puts a tensor on a second GPU.
SPARSE_MLA_SECOND_GPU_RULES = frozenset(r for r in smp.CONTRACT.rules if r.endswith("_device"))
# The sparse MLA rules that read tensor values: they run on real tensors in eager mode only,
# never on fake ones, so a fake or traced near miss of them raises nothing.
SPARSE_MLA_VALUE_RULES = frozenset(c.rule for c in smp.CONTRACT.checks if c.reads_values)


# Hypothesis profiles, chosen by STRICTOPS_HYPOTHESIS (tests/conftest.py and
# compile_tests/conftest.py load it before any test module is imported):
# - "ci", the default: derandomized (a fixed seed: a failure repeats on every run), no example
#   database, and each property test's examples scaled to 0.4 of its nominal count
#   (:func:`examples`): the CPU suite's size;
# - "thorough" (.ci/gpu, and developers before a change lands): random seeds, 4 times the
#   nominal count.
PROFILE = os.environ.get("STRICTOPS_HYPOTHESIS", "ci")
_SCALE = {"ci": 0.4, "thorough": 4.0}


def load_hypothesis_profile() -> None:
    """Register both profiles and load :data:`PROFILE`."""
    from hypothesis import settings
    settings.register_profile("ci", derandomize=True, database=None, deadline=None)
    settings.register_profile("thorough", deadline=None)
    if PROFILE not in _SCALE:
        raise ValueError(f"STRICTOPS_HYPOTHESIS={PROFILE!r}: expected one of {sorted(_SCALE)}")
    settings.load_profile(PROFILE)


def examples(nominal: int) -> int:
    """A property test's example count under the loaded profile: ``nominal`` scaled (at least
    3)."""
    return max(3, round(nominal * _SCALE[PROFILE]))


def gpu(fn):
    """Mark a test as needing a CUDA GPU (``-m gpu`` selects it; skipped without CUDA)."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")(fn))


def multi_gpu(fn):
    """Mark a test as needing two CUDA GPUs (``-m multi_gpu`` selects it; skipped with fewer).
    It is a GPU test too, so ``-m gpu`` selects it as well."""
    two = pytest.mark.skipif(not HAS_TWO_GPUS, reason="needs two CUDA GPUs")
    return pytest.mark.gpu(pytest.mark.multi_gpu(two(fn)))


def dynamo_error_text(exc: BaseException) -> str:
    """The text of a tracing error, including the chained original error."""
    return "\n".join(f"{type(e).__name__}: {e}" for e in error_chain(exc))


# Contract helpers


def raised(fn, *args, **kwargs) -> BaseException:
    """The exception ``fn(*args, **kwargs)`` raises; the calling test fails if it raises none."""
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    return info.value


def near_miss_message(fn, contract_module, rule: str, dims) -> str:
    """The text of the ``ValueError`` that ``fn`` raises on fake tensors for the near miss of
    ``rule`` (``contract_module``: an op's ``strictops.meta`` module; ``dims``: its ``Dims``)."""
    spec = contract_module.NEAR_MISSES[rule](contract_module.valid_spec(dims))
    with fake_mode():
        err = raised(fn, **build(spec))
    assert type(err) is ValueError, err
    return str(err)


def assert_rule_fails_at_trace_time(fn, contract_module, rule: str, dims) -> None:
    """The near miss of ``rule`` from a valid call with ``dims`` raises exactly the rule's
    error on ``fn`` (a function with the op's signature, e.g. a model step around it), eager
    and with symbolic sizes on fake tensors, and while ``torch.compile(fn, fullgraph=True,
    dynamic=True)`` traces it (:func:`strictops.meta._calls.failures`)."""
    valid = Call(contract_module.OP_NAME, contract_module.valid_spec(dims), None, contract_module)
    call = valid.near_miss(rule)
    if not buildable_here(call.spec):
        pytest.skip("the near miss names a GPU this machine lacks")
    assert failures(fn, call) == []


def assert_every_rule_pinned(testcase, contract_module) -> None:
    """Every rule of the contract has a ``test_<rule>`` on ``testcase`` (its pinned message)."""
    pinned = {name[len("test_"):] for name in dir(testcase) if name.startswith("test_")}
    testcase.assertEqual(set(contract_module.CONTRACT.rules) - pinned, set())


def kernel_launches(gm: torch.fx.GraphModule) -> list:
    """The kernel launches of a traced graph: Triton launches (``wrap_triton``) and the ops of
    the ``strictops_kernels`` namespace (launches Inductor cannot compile itself, such as a
    Gluon kernel's), directly or functionalised."""
    def launches(n) -> bool:
        if "triton_kernel_wrapper" in str(n.target):
            return True
        functionalized = (torch.ops.higher_order.auto_functionalized,
                          torch.ops.higher_order.auto_functionalized_v2)
        target = n.args[0] if n.target in functionalized else n.target
        return getattr(target, "namespace", None) == "strictops_kernels"
    return [n for n in gm.graph.nodes if n.op == "call_function" and launches(n)]


def written_arguments(kernel, kwargs: dict) -> list[str]:
    """The arguments of Triton kernel ``kernel`` (called with ``kwargs``: every parameter by
    name) that Triton's mutation analysis finds written, which Inductor clones before each
    launch; from the kernel's TTIR for sm_90, so no GPU is needed."""
    import torch._higher_order_ops.triton_kernel_wrap as wrap
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    class Sm90:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    saved = driver._active
    driver.set_active(Sm90())
    try:
        if hasattr(wrap, "identify_accessed_tensors"):  # torch >= 2.12
            accesses = wrap.identify_accessed_tensors(kernel, kwargs, {})
            return sorted(dep.name for dep in accesses.read_writes.writes)
        return sorted(wrap.identify_mutated_tensors(kernel, kwargs, {}))
    finally:
        driver._active = saved


def capture_cuda_graph(fn, *args, **kwargs):
    """``(graph, result)``: ``fn(*args, **kwargs)`` run once on a side stream (compiling and
    loading its kernels), then captured in a CUDA graph; ``result`` is the captured call's."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(*args, **kwargs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn(*args, **kwargs)
    return graph, result


def run_script(args: list, timeout: float, tail: int = 4000) -> subprocess.CompletedProcess:
    """Run ``args`` in a session of its own, its output captured; returns the completed
    process. Past ``timeout`` seconds the whole session is killed (the processes the script
    started too: they hold its output pipes, and waiting for them would outlast any bound) and
    ``AssertionError`` is raised with the last ``tail`` characters of what it printed."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # every process of it had ended
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(map(str, args))} ran past {timeout:g} s and was "
                             f"killed; it printed:\n{out[-tail:]}\n{err[-tail:]}") from None
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


class _GraphCaptured(Exception):
    pass


def aot_forward_graph(fn, args: dict):
    """The forward graph AOTAutograd hands to Inductor for ``fn(**args)`` (fullgraph, dynamic).

    The graph is captured at compile time; running it may need a GPU, so the "compiled"
    function stops the call instead.
    """
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)

        def stop(*_):
            raise _GraphCaptured

        return stop

    compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=capture), fullgraph=True,
                             dynamic=True)
    with pytest.raises(_GraphCaptured):
        compiled(**args)
    return graphs[0]


def aot_op_graph(op, args: dict) -> torch.fx.GraphModule:
    """:func:`aot_forward_graph` of one call of ``op`` (an ``OpOverload``) on ``args``, returning
    its result and the arguments its schema writes."""
    written = [a.name for a in op._schema.arguments
               if a.alias_info is not None and a.alias_info.is_write]

    def call(**kwargs):
        return op(**kwargs), *(kwargs[name] for name in written)

    return aot_forward_graph(call, args)


__all__ = [
    "CAN_NAME_SECOND_GPU",
    "HAS_CUDA",
    "HAS_TWO_GPUS",
    "SPARSE_MLA_SECOND_GPU_RULES",
    "SPARSE_MLA_VALUE_RULES",
    "aot_forward_graph",
    "aot_op_graph",
    "assert_every_rule_pinned",
    "assert_rule_fails_at_trace_time",
    "build",
    "build_symbolic",
    "capture_cuda_graph",
    "dynamo_error_text",
    "error_chain",
    "fake_mode",
    "gpu",
    "kernel_launches",
    "multi_gpu",
    "near_miss_message",
    "raised",
    "run_script",
]


# --------------------------------------------------------------------------------------------
# The original kernels, for side-by-side tests (optional: the repository root's ``.anchor``
# folder, built only on machines that compare against them).


def anchor_module(name: str):
    """The module ``name`` of the repository root's ``.anchor`` folder; the calling test is
    skipped when the folder or the module is absent."""
    from strictops.meta import _anchor

    module = _anchor.load(name)
    if module is None:
        pytest.skip(f"no original to compare with: .anchor/{name}.py is absent")
    return module


__all__ += ["anchor_module"]
