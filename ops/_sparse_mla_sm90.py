"""The sm_90 launch path of sparse MLA prefill: which Gluon kernel runs, its eager launch through
the cached launcher, and its launch as an op of its own for traced calls.

Two Gluon kernels compute the op on sm_90 from the same validated arguments, grid
``(s_q * h_q // 64,)`` and runtime parameters (``strictops.ops.sparse_mla_prefill`` has the
semantics):

- ``"block_pair"`` (:mod:`._sparse_mla_hopper`, the default): each consumer warpgroup owns
  whole KV blocks, P·V in FP8 on a Vᵀ transposed on chip;
- ``"shared_s"`` (:mod:`._sparse_mla_gluon`): both consumers share each block's S, P·V in fp16
  (about 2.6x lower ``out`` error, about 0.6x the speed on the H200).

Why the default, with the numbers: docs/design/sparse_mla_prefill.md. Importing this module
needs Gluon's Hopper API (``ImportError`` otherwise); the op module decides, in one place,
whether it has it.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from . import _sparse_mla_gluon, _sparse_mla_hopper
from ._dispatch import on_device_of
from ._launcher import Launcher

__all__ = ["KERNEL", "KERNELS", "launch", "launch_eager", "launch_on_device"]

KERNELS = {"block_pair": _sparse_mla_hopper, "shared_s": _sparse_mla_gluon}
# The kernel sm_90 calls run; the other stays selectable for A/B runs and tests.
KERNEL = "block_pair"

_LAUNCHERS = {
    "block_pair": Launcher(_sparse_mla_hopper.sparse_mla_hopper_kernel),
    "shared_s": Launcher(_sparse_mla_gluon.sparse_mla_ws_kernel),
}


def launch(*args, **tuning):
    """The ``launch`` of the ``KERNEL`` module: ``args`` as for
    ``strictops_kernels::sparse_mla_ws_launch``, ``tuning`` overrides entries of its
    ``TUNING``. Returns the compiled kernel."""
    return KERNELS[KERNEL].launch(*args, **tuning)


@functools.cache
def _eager_constants(kernel: str, d_qk: int, has_topk_length: bool, has_attn_sink: bool,
                     has_errors: bool) -> tuple[tuple, tuple]:
    """The compile-time arguments (in the kernel's parameter order) and launch options of a
    call with the default tuning."""
    module = KERNELS[kernel]
    values = module.constexprs(d_qk, has_topk_length, has_attn_sink, has_errors)
    return tuple(values.values()), (("num_warps", 4), ("maxnreg", module.TUNING["max_regs"]),
                                    ("launch_pdl", module.TUNING.get("pdl", False)))


def launch_eager(grid, runtime_args, d_qk, has_topk_length, has_attn_sink, has_errors, device):
    """:func:`launch` with the default tuning through the cached launcher: ``grid`` one CTA
    per token and 64 heads (the kernel's ``programs_and_extra`` gives what it launches),
    ``runtime_args`` the 15 parameters both kernels take first (those of :func:`launch`'s
    call, in order). Returns the launch made: ``(launcher, grid, kernel arguments,
    options)``."""
    constants, options = _eager_constants(KERNEL, d_qk, has_topk_length, has_attn_sink,
                                          has_errors)
    programs, extra = KERNELS[KERNEL].programs_and_extra(grid[0], device)
    launcher, grid = _LAUNCHERS[KERNEL], (programs, 1, 1)
    arguments = (*runtime_args, *extra.values(), *constants)
    launcher(grid, arguments, options, device)
    return launcher, grid, arguments, options


def launch_on_device(q, *args):
    """:func:`launch` on ``q``'s device (made current for the launch if it is not)."""
    with on_device_of(q):
        return launch(q, *args)


@torch.library.custom_op("strictops_kernels::sparse_mla_ws_launch",
                         mutates_args=("out", "max_logits", "lse", "topk_length_errors"))
def _ws_launch(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    q_scale: torch.Tensor,
    kv_scale: torch.Tensor,
    attn_sink: Optional[torch.Tensor],
    topk_length: Optional[torch.Tensor],
    out: torch.Tensor,
    max_logits: torch.Tensor,
    lse: torch.Tensor,
    topk_length_errors: Optional[torch.Tensor],
) -> None:
    """The Gluon kernel's launch as an op of its own, for traced calls of
    ``strictops::sparse_mla_q8kv8_prefill_fwd`` only.

    Inductor compiles ``wrap_triton`` launches of ``@triton.jit`` kernels, not Gluon ones, so
    a traced call of the public op records this op instead: the contract has already run in
    the public op's body (this op is never called on unvalidated arguments), and the outputs
    are already allocated, so its fake has nothing to check or allocate. Eager calls launch
    directly.
    """
    launch_on_device(q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length, out,
                     max_logits, lse, topk_length_errors)


@_ws_launch.register_fake
def _(q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length, out, max_logits,
      lse, topk_length_errors) -> None:
    return None
