"""Run a ``@triton.jit`` kernel through the Triton interpreter on CPU tensors, in-process.

``TRITON_INTERPRET=1`` must be set before Triton is imported and then turns *every* kernel into
an interpreted one, which would also change what ``wrap_triton`` sees while tracing. The tests
need both in one process: real JIT kernels for fake-tensor tracing, interpreted runs for the
kernels' arithmetic. :func:`interpreted` gives the second without the environment variable.
"""

from __future__ import annotations

import contextlib
import threading

from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_lock = threading.Lock()


def _as_device_call(self: JITFunction, *args, **kwargs):
    # What a nested call does under TRITON_INTERPRET=1: an interpreted device-function call.
    return InterpretedFunction(self.fn)(*args, **kwargs)


@contextlib.contextmanager
def interpreted(kernel: JITFunction):
    """Yield an interpreted version of ``kernel``.

    Inside the block, calls from the kernel into other ``@triton.jit`` functions (the standard
    library's ``tl.zeros``, ``tl.max``, ...) run their Python bodies against the interpreter's
    patched ``triton.language``, which is what ``TRITON_INTERPRET=1`` arranges at import time.
    """
    with _lock:
        original = JITFunction.__call__
        JITFunction.__call__ = _as_device_call
        try:
            yield InterpretedFunction(kernel.fn)
        finally:
            JITFunction.__call__ = original
