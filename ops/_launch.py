"""Eager launches of a Triton kernel with less host work per call.

``JITFunction.run`` binds the arguments, specialises each one, builds the cache key, resolves the
options and only then calls the compiled launcher: about 20 µs of Python per call on the H200
machine, more than the 1-request Mamba scatter's kernel. :class:`EagerLauncher` keeps a map from
Triton's own specialisation of the arguments (``native_specialize_impl`` with the kernel's
backend: dtype and 16-byte alignment of each pointer, integer width, divisibility by 16, the
value 1) plus the constexprs and ``num_warps`` to the compiled kernel, and on a hit calls the
compiled launcher directly. A miss, and any call while a Triton launch hook is installed, goes
through ``JITFunction.run`` unchanged, which compiles, launches and returns the kernel to cache.

Because the key is Triton's own specialisation, a cached kernel is only reused for arguments
Triton itself would have sent to that same compiled kernel.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from triton import knobs
from triton.runtime.jit import JITFunction

try:  # Triton >= 3.3 specialises arguments natively; older releases use the plain path.
    from triton.runtime.jit import native_specialize_impl
except ImportError:  # pragma: no cover - depends on the Triton release
    native_specialize_impl = None


class EagerLauncher:
    """``launcher[grid](*args, num_warps=..., **constexprs)``, like ``kernel[grid](...)``.

    Constexprs must be passed by keyword and follow the runtime arguments in the kernel's
    signature (as they do in every strictops kernel).
    """

    def __init__(self, kernel: JITFunction) -> None:
        self.kernel = kernel
        self._constexpr_names = [p.name for p in kernel.params if p.is_constexpr]
        self._compiled: dict = {}

    def __getitem__(self, grid):
        return functools.partial(self._run, grid)

    def _run(self, grid, *args, num_warps: int, **constexprs):
        if (native_specialize_impl is None or knobs.runtime.launch_enter_hook is not None
                or knobs.runtime.launch_exit_hook is not None):
            self.kernel[grid](*args, num_warps=num_warps, **constexprs)
            return
        device = torch.cuda.current_device()  # where Triton launches, as in JITFunction.run
        backend = self.kernel.device_caches[device][3]
        consts = [constexprs[name] for name in self._constexpr_names]  # signature order
        key = (device, num_warps, *consts,
               *(native_specialize_impl(backend, a, False, True, True) for a in args))
        compiled = self._compiled.get(key)
        if compiled is None:
            self._compiled[key] = self.kernel[grid](*args, num_warps=num_warps, **constexprs)
            return
        stream = torch._C._cuda_getCurrentRawStream(device)
        grid = tuple(grid) + (1,) * (3 - len(grid))
        compiled.run(grid[0], grid[1], grid[2], stream, compiled.function,
                     compiled.packed_metadata, None, None, None, *args, *consts)


def on_device_of(t: torch.Tensor):
    """Make ``t``'s CUDA device current for a launch (Triton launches on the current device)."""
    if t.get_device() == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(t.device)
