"""When a public op may skip the PyTorch dispatcher.

A call of ``torch.ops.strictops.<op>`` from Python costs tens of microseconds of dispatcher
overhead (argument parsing against the schema, the autograd and ADInplaceOrView keys, the Python
kernel trampoline), which on small shapes is more than the kernel itself. In plain eager mode
with plain tensors none of that machinery does anything for these ops, so the public functions
call the op's implementation (the same contract, the same launch) directly.

Everything that needs the dispatcher still gets it: Dynamo tracing, any Python dispatch or
torch-function mode (``FakeTensorMode``, ``FunctionalTensorMode``, proxy tracing), functorch
transforms, tensor subclasses, and autograd on the inputs (so that the usual in-place rules
apply).

Also the eager launch path's device helpers: the device to launch on (:func:`on_device_of`),
its compute capability, asked once per device (:func:`device_capability`), and whether the
current stream captures a CUDA graph (:func:`stream_capturing`).
"""

from __future__ import annotations

import contextlib
import functools

import torch

from strictops.meta._contract import plain_eager_mode


def can_skip_dispatcher(*tensors: torch.Tensor | None) -> bool:
    """True when calling the implementation directly behaves exactly like the dispatcher."""
    if not plain_eager_mode():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or (grad and t.requires_grad)):
            return False
    return True


def on_device_of(t: torch.Tensor, real_launch: bool = True):
    """Make ``t``'s CUDA device current for a launch: Triton launches on the current device,
    so a call on ``cuda:1`` tensors from code whose current device is ``cuda:0`` would
    otherwise launch on the wrong GPU. A traced launch (``real_launch=False``: fake tensors,
    possibly without any GPU) needs no device and gets a no-op."""
    if not real_launch or t.get_device() == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(t.device)


@functools.lru_cache(maxsize=None)
def device_capability(device_index: int) -> tuple[int, int]:
    """CUDA device ``device_index``'s compute capability, asked once per device: eager calls
    that pick a kernel or a launch mode by it ask on every call."""
    return torch.cuda.get_device_capability(device_index)


_IS_CAPTURING = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def stream_capturing() -> bool:
    """Whether the current CUDA stream captures a CUDA graph (False before CUDA is initialised,
    and in a build without CUDA): an eager call whose launch choice differs between graphs and
    eager calls asks it."""
    return _IS_CAPTURING is not None and torch.cuda.is_initialized() and _IS_CAPTURING()
