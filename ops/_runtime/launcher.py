"""Cached eager launches of compiled Triton and Gluon kernels.

``kernel[grid](*args, **kwargs)`` (``JITFunction.run``, Triton 3.6) does on every call what
only changes with the kernel's specialisation: it binds the arguments to the signature,
specialises each one (``native_specialize_impl``), turns the specialisation and the options into
a string key, checks the kernel's global constants, builds launch metadata for the launch hooks,
wraps scratch allocation in closures, and in the C launcher calls ``data_ptr()`` and
``cuPointerGetAttribute`` for every pointer. :class:`Launcher` keeps, per specialisation, the
compiled kernel's C ``launch`` function, its handle and packed metadata, and per call computes
only the key and the argument values, then calls ``launch`` directly.

The key is at least as fine as Triton's own specialisation of the same call, which it must be
(a launch of a kernel compiled for another specialisation corrupts memory):

* a tensor (or a :class:`Pointer`): its dtype and whether ``data_ptr()`` is a multiple of 16
  (Triton's pointer alignment specialisation);
* an ``int``: whether it equals 1, whether it is a multiple of 16, and its range (int32, int64,
  uint64), which decide Triton's ``constexpr``/``"D"`` specialisation and its type;
* a ``bool``, a ``float``, ``None``: their type (Triton passes floats as fp32, bools as u1,
  ``None`` as a ``constexpr``);
* a constexpr parameter: its value (as Triton's own cache, which also takes ``True`` for
  ``1``);
* the options (``num_warps``, ``num_stages``, ``maxnreg``, ``launch_pdl``, ...), the current
  device, and the two global knobs Triton adds to the options (``debug``,
  ``instrumentation_mode``).

Anything else (tensor subclasses, tuples, tensor descriptors, other types) and any call while a
launch hook or pre-run hook is installed (profilers) goes through ``JITFunction.run`` unchanged.
The first call of each key compiles, then launches through ``JITFunction.run`` with the C
launch recorded; the compiled kernel is kept with the direct call that equals the recorded one
(:mod:`strictops.ops._runtime.triton_abi`: the running Triton's launcher layout, verified, never
assumed). A kernel whose launch matches no known layout keeps taking ``JITFunction.run``.

Pointers reach the C launcher as integers (their ``data_ptr()``), which skips the launcher's
``cuPointerGetAttribute`` check that a pointer is device memory: callers launch only on
arguments their contract has checked (CUDA tensors on the launch device).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from triton import knobs
from triton.language import constexpr
from triton.runtime.driver import driver

from strictops.ops._runtime.triton_abi import c_parameters_known, fast_launch

__all__ = ["Launcher", "Pointer", "keyword_constexprs"]

class Pointer:
    """A device address typed as ``dtype``: what a kernel takes as a pointer, without a tensor
    view to carry the type (``Pointer(t.data_ptr(), torch.uint8)`` for ``t.view(torch.uint8)``
    of a contiguous ``t``). Triton's own launch path takes it too (``data_ptr()``, ``dtype``)."""

    __slots__ = ("address", "dtype")

    def __init__(self, address: int, dtype: torch.dtype) -> None:
        self.address = address
        self.dtype = dtype

    def data_ptr(self) -> int:
        return self.address


# One runtime parameter's part of the generated ``arguments`` function: the value ``v{i}`` the C
# launcher takes and the parameter's two items of the flat key, ``d{i}`` and ``k{i}``. A tensor
# or ``Pointer``: its dtype and whether its address is a multiple of 16. An int: ``int`` and, in
# [0, 2**31), a code (True: it is 1, 16: a multiple of 16, 0: neither), else the tuple of what
# decides Triton's specialisation (whether 1, whether a multiple of 16, whether in int32, int64,
# uint64; Triton refuses the rest). A float, bool or None: its class, twice.
_RUNTIME_PARAMETER = """
    c = a{i}.__class__
    if c is Tensor:
        v{i} = a{i}.data_ptr()
        d{i} = a{i}.dtype
        k{i} = not v{i} & 15
    elif c is int:
        v{i} = a{i}
        d{i} = int
        k{i} = (a{i} == 1 or (not a{i} & 15) * 16) if 0 <= a{i} < 0x80000000 else (
            a{i} == 1, not a{i} & 15, -0x80000000 <= a{i} < 0x80000000,
            -0x8000000000000000 <= a{i} < 0x8000000000000000,
            0 <= a{i} < 0x10000000000000000)
    elif c is Pointer:
        v{i} = a{i}.address
        d{i} = a{i}.dtype
        k{i} = not v{i} & 15
    elif a{i} is None or c is float or c is bool:
        v{i} = a{i}
        d{i} = k{i} = c
    else:
        return None, None"""


def _arguments_function(constexpr: Sequence[bool]):
    """``arguments(args, device, options, debug, mode) -> (key, values)`` for a kernel whose
    parameters are constexprs where ``constexpr`` says: the flat specialisation key of a call
    (the device, the options and the two knobs, then per parameter a constexpr's value or a
    runtime parameter's two items; see the module docstring) and the values the C launcher
    takes (pointers as integers); or ``(None, None)`` for an argument only ``JITFunction.run``
    handles. Written out parameter by parameter: no loop, no list, one flat key tuple."""
    names = [f"a{i}" for i in range(len(constexpr))]
    body = "".join(_RUNTIME_PARAMETER.format(i=i) for i, c in enumerate(constexpr) if not c)
    key = ", ".join(f"a{i}" if c else f"d{i}, k{i}" for i, c in enumerate(constexpr))
    values = ", ".join(f"a{i}" if c else f"v{i}" for i, c in enumerate(constexpr))
    source = (f"def arguments(args, device=None, options=(), debug=None, mode=None):\n"
              f"    {', '.join(names)}, = args{body}\n"
              f"    return (device, options, debug, mode, {key}), ({values},)\n")
    namespace = {"Tensor": torch.Tensor, "Pointer": Pointer}
    exec(source, namespace)  # noqa: S102 - generated from the parameter count only
    return namespace["arguments"]


class _Prepared:
    """One compiled specialisation: its verified fast launch (None where the running Triton's
    launch matched no known layout or needs scratch memory: then every call takes
    ``JITFunction.run``), whether a C++ plan may pack its parameters, and the globals it
    read."""

    __slots__ = ("kernel", "fast", "launch", "head", "flat", "c_parameters", "globals")

    def __init__(self, kernel, fast, globals_used) -> None:
        self.kernel = kernel
        self.fast = fast
        # The fast launch's parts, read per call: the C launch (None: JITFunction.run), what
        # it takes after the grid and stream, and whether the values follow flat.
        self.launch, self.head, self.flat = (None, (), True) if fast is None else fast[:3]
        self.c_parameters = fast is not None and c_parameters_known(kernel)
        # Per global the kernel reads: its name, the value it was compiled with, that value's
        # own value when it is a constexpr (compared directly: constexpr's != builds two
        # constexpr objects per call), and the namespace holding it.
        self.globals = tuple((name, value, value.value if value.__class__ is constexpr
                              else _NOTHING, namespace)
                             for (name, _), (value, namespace) in globals_used.items())


_NOTHING = object()


class Launcher:
    """Eager launches of one ``@triton.jit`` or ``@gluon.jit`` kernel, prepared once per
    specialisation.

    ``launcher(grid, args, options)`` launches like ``kernel[grid](*args, **dict(options))``
    on the current device and stream, where ``args`` holds every parameter of the kernel in
    signature order (constexprs included) and ``options`` is a hashable tuple of
    ``(name, value)`` launch options. Every tensor in ``args`` must be a CUDA tensor on the
    current device (not checked here). Returns the compiled kernel.
    """

    def __init__(self, fn) -> None:
        self.fn = fn
        self.constexpr = tuple(p.is_constexpr for p in fn.params)
        self.arguments = _arguments_function(self.constexpr)
        self.prepared: dict[tuple, _Prepared] = {}
        self.loaded: set = set()  # keys compiled and loaded by load(), not yet launched
        self._device = None
        self._stream = None

    def key(self, args: Sequence[Any], options: tuple) -> tuple | None:
        """The cache key of a call on the current device (tests compare it with Triton's)."""
        return self.arguments(args, self._current_device(), options, knobs.runtime.debug,
                              knobs.compilation.instrumentation_mode)[0]

    def prepared_for(self, args: Sequence[Any], options: tuple, device: int):
        """The compiled specialisation a call of ``args`` and ``options`` on CUDA device
        ``device`` launches (see :class:`_Prepared`), or None where it has none yet, takes
        ``JITFunction.run`` (argument kinds, an installed hook, no verified fast launch), or
        where its launcher's C code does not pack the parameters as a C++ plan does."""
        runtime = knobs.runtime
        if runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls or \
                self.fn.pre_run_hooks:
            return None
        key = self.arguments(args, device, options, runtime.debug,
                             knobs.compilation.instrumentation_mode)[0]
        try:
            prepared = None if key is None else self.prepared.get(key)
        except TypeError:
            return None
        return None if prepared is None or not prepared.c_parameters else prepared

    def load(self, grid: Sequence[int], args: Sequence[Any], options: tuple = (),
             device: int | None = None) -> None:
        """Compile and load the kernel that ``self(grid, args, options, device)`` would launch,
        without launching it: a later call, such as one captured in a CUDA graph (a capture
        refuses a module load), then compiles and loads nothing."""
        if device is not None and device != self._current_device():
            with torch.cuda.device(device):
                return self.load(grid, args, options)
        key = self.key(args, options)
        if key is not None and (key in self.prepared or key in self.loaded):
            return
        kernel = self.fn.run(*args, grid=grid, warmup=True, **dict(options))
        if hasattr(kernel, "result"):  # an asynchronous compile
            kernel = kernel.result()
        kernel.run  # noqa: B018 - a compiled kernel loads its module on first use
        if key is not None:
            self.loaded.add(key)

    def _current_device(self) -> int:
        if self._device is None:
            active = driver.active
            self._device, self._stream = active.get_current_device, active.get_current_stream
            if self._device is torch.cuda.current_device:  # the same, without its Python
                self._device = torch._C._cuda_getDevice
        return self._device()

    def __call__(self, grid: Sequence[int], args: Sequence[Any], options: tuple = (),
                 device: int | None = None):
        """Launch on the current device, or on CUDA device ``device`` when given (made
        current for the launch if it is not)."""
        current = self._current_device()
        if device is not None and device != current:
            with torch.cuda.device(device):
                return self(grid, args, options)
        runtime = knobs.runtime
        if runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls or \
                self.fn.pre_run_hooks:
            return self.fn.run(*args, grid=grid, warmup=False, **dict(options))
        key, values = self.arguments(args, current, options, runtime.debug,
                                     knobs.compilation.instrumentation_mode)
        if key is None:
            return self.fn.run(*args, grid=grid, warmup=False, **dict(options))
        try:
            prepared = self.prepared.get(key)
        except TypeError:  # an unhashable constexpr
            return self.fn.run(*args, grid=grid, warmup=False, **dict(options))
        if prepared is None:
            return self._prepare(key, grid, args, options, current, values).kernel
        launch = prepared.launch
        if launch is None:
            return self.fn.run(*args, grid=grid, warmup=False, **dict(options))
        for name, value, raw, namespace in prepared.globals:
            # What JITFunction.run checks on every launch: the global still equals its value.
            now = namespace.get(name, _NOTHING)
            if not (now.__class__ is constexpr and now.value == raw) and now != value:
                raise RuntimeError(f"Global variable {name} has changed since we compiled "
                                   f"this kernel, from {value} to {namespace.get(name)}")
        if len(grid) == 3:
            grid_0, grid_1, grid_2 = grid
        else:
            grid_0, grid_1, grid_2 = grid[0], grid[1] if len(grid) > 1 else 1, 1
        if prepared.flat:
            launch(grid_0, grid_1, grid_2, self._stream(current), *prepared.head, *values)
        else:
            launch(grid_0, grid_1, grid_2, self._stream(current), *prepared.head, values)
        return prepared.kernel

    def _prepare(self, key, grid, args, options, device, values) -> _Prepared:
        """The first call of ``key``: compile, then launch once through ``JITFunction.run``,
        recorded, to find the fast launch whose call equals Triton's (see
        :func:`strictops.ops._runtime.triton_abi.fast_launch`)."""
        kwargs = dict(options)
        kernel = self.fn.run(*args, grid=grid, warmup=True, **kwargs)
        if hasattr(kernel, "result"):  # an asynchronous compile
            kernel = kernel.result()
        grid3 = (*grid, 1, 1)[:3]
        fast = fast_launch(kernel, lambda: self.fn.run(*args, grid=grid, warmup=False, **kwargs),
                           grid3, self._stream(device), values)
        prepared = self.prepared[key] = _Prepared(kernel, fast, self.fn.used_global_vals)
        return prepared


def keyword_constexprs(fn, args: Sequence[Any]) -> tuple[tuple, dict]:
    """``args`` (every parameter of ``fn`` in signature order) as ``fn[grid](*runtime,
    **constexprs)`` takes them: the runtime arguments, then the constexprs by name (what
    ``wrap_triton`` and the interpreter are given)."""
    runtime = tuple(a for a, p in zip(args, fn.params) if not p.is_constexpr)
    return runtime, {p.name: a for a, p in zip(args, fn.params) if p.is_constexpr}
