"""How the running Triton's NVIDIA launcher is called, found per compiled kernel and checked
against Triton's own launch before the eager fast paths use it.

``JITFunction.run`` launches a compiled kernel through ``CompiledKernel.run``, a
``CudaLauncher``, whose ``__call__`` allocates scratch memory and calls a C function,
``CudaLauncher.launch``, that packs the parameters and calls ``cuLaunchKernelEx``. The cached
launcher (:mod:`strictops.ops._runtime.launcher`) calls that C function directly, and a C++ plan
(:mod:`strictops.ops._runtime.host_path`) packs the parameters itself. Both depend on layouts that
Triton releases change:

- what ``launch`` takes (:data:`LAYOUTS`): Triton 3.6 compiles a C launcher per signature that
  takes ``(grid, stream, function, cooperative, pdl, global_scratch, profile_scratch,
  metadata, launch_metadata, enter_hook, exit_hook, *arguments)``; later releases call one
  generic ``launch`` with the metadata before the scratch, then the argument annotations, the
  packed signature, and the arguments as one tuple;
- what the C code passes the kernel: every runtime parameter in order, then the global and the
  profile scratch pointers (:func:`c_parameters_known`), unless the kernel takes tensor
  descriptors or is instrumented (GSan adds parameters).

Nothing here is assumed from a version number. :func:`fast_launch` finds, for one compiled
kernel, the layout whose call equals the one Triton's own launch makes: it launches once through
``JITFunction.run`` with ``CudaLauncher.launch`` recorded, builds the same call the fast path
would make, and keeps the layout only if the two are equal, item by item (tensors by address;
where the fast path passes ``None`` for the launch metadata and the hook chains, Triton's values
must be ones that do nothing: no hook installed). A kernel whose launch matches no layout, or
that needs scratch memory, has no fast launch: its every call goes through ``JITFunction.run``
and no C++ plan is made for it. A wrong layout would corrupt memory silently; a refused one
costs host time only.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

__all__ = ["FastLaunch", "LAYOUTS", "c_parameters_known", "fast_launch"]


class FastLaunch(NamedTuple):
    """A verified direct call of a compiled kernel's C ``launch``: ``launch(gx, gy, gz,
    stream, *head, *values)`` where ``flat``, else ``launch(gx, gy, gz, stream, *head,
    values)``; ``values`` are all the kernel's arguments in signature order (pointers as
    addresses, constexprs as their values)."""

    launch: Callable
    head: tuple
    flat: bool
    layout: str


def _flat_head(kernel, run) -> tuple:
    # Triton 3.6's per-signature C launcher.
    return (kernel.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
            kernel.packed_metadata, None, None, None)


def _packed_head(kernel, run) -> tuple:
    # The generic launcher: metadata before the scratch, the arguments as one tuple.
    return (kernel.function, run.launch_cooperative_grid, run.launch_pdl,
            kernel.packed_metadata, None, None, None, None, None, run.arg_annotations,
            run.kernel_signature)


# Each known layout: its name, how it takes the argument values, and its head (after the grid
# and the stream, before the values) for a compiled kernel and its CudaLauncher. Tried in
# order; the first whose call equals Triton's own is kept.
LAYOUTS = (("per-signature C launcher", True, _flat_head),
           ("generic launcher, packed signature", False, _packed_head))


def _inert(value: Any) -> bool:
    """Whether Triton's value at a place where the fast path passes ``None`` does nothing at
    launch: ``None``, a hook chain with no hook, or the launch metadata (read only by hooks)."""
    if value is None:
        return True
    name = type(value).__name__
    if name == "HookChain":
        return not getattr(value, "calls", True)
    return name == "LazyDict"


def _same(mine: Any, theirs: Any) -> bool:
    """Whether the fast path's launch item ``mine`` is what Triton passed, ``theirs``."""
    if mine is None:
        return _inert(theirs)
    if isinstance(theirs, tuple) and isinstance(mine, tuple):
        return len(mine) == len(theirs) and all(map(_same, mine, theirs))
    if isinstance(theirs, torch.Tensor) or hasattr(theirs, "data_ptr") and \
            not isinstance(theirs, (int, float, bool)):
        return mine.__class__ is int and mine == theirs.data_ptr()
    return mine.__class__ is theirs.__class__ and mine == theirs or mine is theirs


def _recorded_launch(kernel, triton_launch: Callable[[], Any]) -> tuple | None:
    """The arguments ``CudaLauncher.launch`` got from ``triton_launch()`` (a real launch
    through ``JITFunction.run``, made in every case), or None where the launcher has no
    ``launch`` to record."""
    run = kernel.run
    real = getattr(run, "__dict__", {}).get("launch")  # an attribute of the instance
    if real is None:
        triton_launch()
        return None
    calls = []

    def recording(*args):
        calls.append(args)
        return real(*args)

    run.launch = recording
    try:
        triton_launch()
    finally:
        run.launch = real
    return calls[0] if len(calls) == 1 else None


def fast_launch(kernel, triton_launch: Callable[[], Any], grid: tuple, stream: int,
                values: tuple) -> FastLaunch | None:
    """The verified fast launch of ``kernel``, or None. ``triton_launch()`` launches it once
    through ``JITFunction.run`` on ``grid`` (three ints) and ``stream`` with arguments whose
    fast-path values are ``values``: that launch is made in every case, recorded, and compared
    with the call each layout of :data:`LAYOUTS` would make."""
    run = kernel.run
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        triton_launch()
        return None
    recorded = _recorded_launch(kernel, triton_launch)
    if recorded is None:
        return None
    for layout, flat, head_of in LAYOUTS:
        try:
            head = head_of(kernel, run)
        except AttributeError:
            continue
        mine = (*grid, stream, *head, *values) if flat else (*grid, stream, *head, values)
        if len(mine) == len(recorded) and all(map(_same, mine, recorded)):
            return FastLaunch(run.launch, head, flat, layout)
    return None


def c_parameters_known(kernel) -> bool:
    """Whether the C code of ``kernel``'s launcher passes the kernel exactly its runtime
    parameters in signature order, each as its signature type, then two scratch pointers:
    the packing a C++ plan makes. Read from what the launcher was built with: the packed
    signature of the generic launcher, or the parameter list of Triton 3.6's generated
    launcher source. False for anything else (tensor descriptors, instrumentation, tuples)."""
    from triton.backends.nvidia import driver as nvidia
    from triton.runtime.driver import driver

    run = kernel.run
    kinds = list(kernel.src.signature.values())
    if any(not isinstance(k, str) or k.startswith("tensordesc") for k in kinds):
        return False
    if getattr(run, "gsan_enabled", False) or getattr(kernel.metadata, "tensordesc_meta", None):
        return False
    runtime = [k for k in kinds if k != "constexpr"]
    if hasattr(run, "kernel_signature"):
        build = getattr(driver.active.utils, "build_signature_metadata", None)
        return build is not None and run.kernel_signature == build(runtime)
    make_launcher = getattr(nvidia, "make_launcher", None)
    if make_launcher is None:
        return False
    signature = dict(enumerate(kinds))
    try:
        source = make_launcher({}, signature, None)
    except Exception:  # noqa: BLE001 - an unknown generator: no plan
        return False
    params = [f"&arg{i}" for i, k in signature.items() if k != "constexpr"]
    params += ["&global_scratch", "&profile_scratch"]
    expected = f"void *params[] = {{ {', '.join(params)} }};"
    return expected in source
