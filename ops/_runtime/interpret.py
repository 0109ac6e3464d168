"""Run a ``@triton.jit`` kernel through the Triton interpreter on CPU tensors, in-process.

``TRITON_INTERPRET=1`` must be set before Triton is imported and then turns *every* kernel into
an interpreted one, which would also change what ``wrap_triton`` sees while tracing. The tests
need both in one process: real JIT kernels for fake-tensor tracing, interpreted runs for the
kernels' arithmetic. :func:`interpreted` gives the second without the environment variable.

The interpreter (and NumPy, which it runs on) is imported on first use only: the ops
themselves need neither.
"""

from __future__ import annotations

import contextlib
import threading

import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

_lock = threading.Lock()


def _as_device_call(self: JITFunction, *args, **kwargs):
    # What a nested call does under TRITON_INTERPRET=1 (an interpreted device-function call),
    # except that the language patches it makes are undone on return: they would otherwise
    # outlive the launch and break the compilation of real JIT kernels later in the process.
    from triton.runtime import interpreter

    scope = interpreter._patch_lang(self.fn)
    try:
        return interpreter.InterpretedFunction(self.fn).rewrite()(*args, **kwargs)
    finally:
        scope.restore()


def _patch_lang_tensor_with(original):
    def patch(tensor, scope):
        original(tensor, scope)
        # The interpreter holds scalar arguments as 1-element arrays and turns them into loop
        # bounds with int(array), which NumPy >= 2.4 refuses for arrays with ndim > 0.
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    return patch


def _bf16_as_fp32(handle):
    import numpy as np
    from triton.runtime import interpreter

    if handle.dtype != tl.bfloat16:
        return handle
    return interpreter.TensorHandle((handle.data.astype(np.uint32) << 16).view(np.float32),
                                    tl.float32)


@contextlib.contextmanager
def _gpu_bf16_arithmetic(builder):
    """Make the interpreter's bf16 arithmetic the GPU's.

    Triton 3.6's interpreter holds bf16 as uint16 bits. Its float32 -> bf16 cast truncates (the
    GPU rounds to nearest even), which doubles and biases the error of a bf16 product; its
    ``tl.dot`` multiplies bf16 operands as those integers (FP8 operands it converts first).
    Here the cast rounds through torch, and the dot widens bf16 to float32 first: exact, as are
    the products of two bf16 in float32, so the dot computes what a bf16 MMA with fp32
    accumulation computes.
    """
    import numpy as np
    from triton.runtime import interpreter

    original_dot, original_cast = builder.create_dot, builder.cast_impl

    def create_dot(a, b, d, input_precision, max_num_imprecise_acc):
        return original_dot(_bf16_as_fp32(a), _bf16_as_fp32(b), d, input_precision,
                            max_num_imprecise_acc)

    def cast_impl(src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return original_cast(src, dst_type)
        rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
        return interpreter.TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16),
                                        tl.bfloat16)

    builder.create_dot, builder.cast_impl = create_dot, cast_impl
    try:
        yield
    finally:
        builder.create_dot, builder.cast_impl = original_dot, original_cast


@contextlib.contextmanager
def interpreted(kernel: JITFunction, reverse_programs: bool = False):
    """Yield an interpreted version of ``kernel``.

    Inside the block, calls from the kernel into other ``@triton.jit`` functions (the standard
    library's ``tl.zeros``, ``tl.max``, ...) run their Python bodies against the interpreter's
    patched ``triton.language``, which is what ``TRITON_INTERPRET=1`` arranges at import time;
    bf16 casts and dots compute what the GPU computes (:func:`_gpu_bf16_arithmetic`).

    The interpreter runs programs one at a time in grid order, which can hide a result that
    depends on the order programs run in (on a GPU they run concurrently, in no set order).
    ``reverse_programs=True`` runs them in the opposite order, so a test can check that the
    result does not depend on it.
    """
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    with _lock:
        original_call, original_idx = JITFunction.__call__, builder.set_grid_idx
        original_patch = interpreter._patch_lang_tensor
        JITFunction.__call__ = _as_device_call
        interpreter._patch_lang_tensor = _patch_lang_tensor_with(original_patch)
        if reverse_programs:
            def set_grid_idx(x, y, z):
                nx, ny, nz = builder.grid_dim
                original_idx(nx - 1 - x, ny - 1 - y, nz - 1 - z)

            builder.set_grid_idx = set_grid_idx
        try:
            with _gpu_bf16_arithmetic(builder):
                yield interpreter.InterpretedFunction(kernel.fn)
        finally:
            JITFunction.__call__ = original_call
            interpreter._patch_lang_tensor = original_patch
            builder.set_grid_idx = original_idx
