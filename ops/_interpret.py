"""Run a ``@triton.jit`` kernel through the Triton interpreter on CPU tensors, in-process.

``TRITON_INTERPRET=1`` must be set before Triton is imported and then turns *every* kernel into
an interpreted one, which would also change what ``wrap_triton`` sees while tracing. The tests
need both in one process: real JIT kernels for fake-tensor tracing, interpreted runs for the
kernels' arithmetic. :func:`interpreted` gives the second without the environment variable.
"""

from __future__ import annotations

import contextlib
import threading

from triton.runtime import interpreter
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_lock = threading.Lock()


def _as_device_call(self: JITFunction, *args, **kwargs):
    # What a nested call does under TRITON_INTERPRET=1 (an interpreted device-function call),
    # except that the language patches it makes are undone on return: they would otherwise
    # outlive the launch and break the compilation of real JIT kernels later in the process.
    scope = interpreter._patch_lang(self.fn)
    try:
        return InterpretedFunction(self.fn).rewrite()(*args, **kwargs)
    finally:
        scope.restore()


_original_patch_lang_tensor = interpreter._patch_lang_tensor


def _patch_lang_tensor(tensor, scope):
    _original_patch_lang_tensor(tensor, scope)
    # The interpreter holds scalar arguments as 1-element arrays and turns them into loop
    # bounds with int(array), which NumPy >= 2.4 refuses for arrays with ndim > 0.
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))


@contextlib.contextmanager
def interpreted(kernel: JITFunction, reverse_programs: bool = False):
    """Yield an interpreted version of ``kernel``.

    Inside the block, calls from the kernel into other ``@triton.jit`` functions (the standard
    library's ``tl.zeros``, ``tl.max``, ...) run their Python bodies against the interpreter's
    patched ``triton.language``, which is what ``TRITON_INTERPRET=1`` arranges at import time.

    The interpreter runs programs one at a time in grid order, which can hide a result that
    depends on the order programs run in (on a GPU they run concurrently, in no set order).
    ``reverse_programs=True`` runs them in the opposite order, so a test can check that the
    result does not depend on it.
    """
    builder = interpreter.interpreter_builder
    with _lock:
        original_call, original_idx = JITFunction.__call__, builder.set_grid_idx
        JITFunction.__call__ = _as_device_call
        interpreter._patch_lang_tensor = _patch_lang_tensor
        if reverse_programs:
            def set_grid_idx(x, y, z):
                nx, ny, nz = builder.grid_dim
                original_idx(nx - 1 - x, ny - 1 - y, nz - 1 - z)

            builder.set_grid_idx = set_grid_idx
        try:
            yield InterpretedFunction(kernel.fn)
        finally:
            JITFunction.__call__ = original_call
            interpreter._patch_lang_tensor = _original_patch_lang_tensor
            builder.set_grid_idx = original_idx
