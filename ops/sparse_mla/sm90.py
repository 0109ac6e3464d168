"""The sm_90 launch path of sparse MLA prefill: which Gluon kernel runs, whether it builds on
this Triton, its eager launch through the cached launcher, and its launch as an op of its own
for traced calls.

Two Gluon kernels compute the op on sm_90 from the same validated arguments, grid
``(s_q * h_q // 64,)`` and runtime parameters (``strictops.ops.sparse_mla.prefill`` has the
semantics):

- ``"block_pair"`` (:mod:`.gluon_block_pair`, the default): each consumer warpgroup owns
  whole KV blocks, P·V in FP8 on a Vᵀ transposed on chip;
- ``"shared_s"`` (:mod:`.gluon_shared_s`): both consumers share each block's S, P·V in fp16
  (about 2.6x lower ``out`` error, about 0.6x the speed on the H200).

Why the default, with the numbers: docs/design/sparse_mla_prefill.md. Importing this module
needs Gluon's Hopper API (``ImportError`` otherwise); the op module decides, in one place,
whether it has it.

Where a Gluon kernel does not build on the running Triton (its first compile raises one of
:data:`BUILD_ERRORS`, before anything is launched), :func:`built` records why in
:data:`UNBUILDABLE` and warns once (:class:`GluonBuildWarning`): from then on the process takes
the op's Triton kernel, in eager calls, traced calls and this module's traced launch alike.
:func:`build_problem` tells the same without a GPU, from an offline sm_90 build
(:func:`compile_for_sm90`).
"""

from __future__ import annotations

import functools
import warnings
from typing import Optional

import torch
import triton
from triton.compiler.errors import CompilationError
from triton.runtime.errors import PTXASError

from strictops.ops.sparse_mla import gluon_shared_s
from strictops.ops.sparse_mla import gluon_block_pair
from strictops.ops._runtime.dispatch import device_capability, on_device_of
from strictops.ops._runtime.launcher import Launcher

__all__ = ["BUILD_ERRORS", "GluonBuildWarning", "KERNEL", "KERNELS", "UNBUILDABLE",
           "build_problem", "built", "compile_for_sm90", "kernel_choice", "launch",
           "launch_eager", "launch_on_device"]

KERNELS = {"block_pair": gluon_block_pair, "shared_s": gluon_shared_s}
# The kernel sm_90 calls run; the other stays selectable for A/B runs and tests.
KERNEL = "block_pair"

_KERNEL_FNS = {"block_pair": gluon_block_pair.sparse_mla_hopper_kernel,
               "shared_s": gluon_shared_s.sparse_mla_ws_kernel}
_LAUNCHERS = {name: Launcher(fn) for name, fn in _KERNEL_FNS.items()}

# What a kernel that does not build on this Triton raises at its first compile, before anything
# is launched (the Gluon front end's error, ptxas's); a launch's own errors are never caught.
BUILD_ERRORS = (CompilationError, PTXASError)
# Why a Gluon kernel did not build in this process (see :func:`built`), None while none failed:
# once set, the op's ``warp_specialized`` says False, and the op's eager plans, which guard on
# this setting, stop serving the Gluon launches they were made for.
UNBUILDABLE: Optional[str] = None


class GluonBuildWarning(UserWarning):
    """The sm_90 Gluon kernel does not build on this Triton; the op runs its Triton kernel."""


def build_error_reason(error: BaseException) -> str:
    """The first line of what ``error`` (one of :data:`BUILD_ERRORS`) says went wrong: for a
    Gluon compile error, that of the innermost compile error it was raised from (the outer ones
    only name their call sites)."""
    while isinstance(error.__cause__, CompilationError):
        error = error.__cause__
    text = str(getattr(error, "error_message", None) or error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def built(launch_gluon, *args) -> bool:
    """Make the launch ``launch_gluon(*args)`` of a Gluon kernel (compiling it the first
    time) and return True; where the compile fails with one of :data:`BUILD_ERRORS`, nothing
    is launched: set :data:`UNBUILDABLE` to the reason, warn (:class:`GluonBuildWarning`, once:
    the op asks no more) and return False, for the caller to launch the Triton kernel."""
    global UNBUILDABLE
    try:
        launch_gluon(*args)
        return True
    except BUILD_ERRORS as error:
        UNBUILDABLE = build_error_reason(error)
    warnings.warn(f"the sm_90 Gluon kernel of sparse MLA prefill does not build on triton "
                  f"{triton.__version__} ({UNBUILDABLE}); this process runs the Triton kernel",
                  GluonBuildWarning, stacklevel=3)
    return False


# The runtime parameters of both kernels as an offline build types them (``n_tiles``: the
# block-pair kernel's only).
_SIGNATURE = {"q_ptr": "*fp8e4nv", "kv_ptr": "*fp8e4nv", "indices_ptr": "*i32",
              "q_scale_ptr": "*fp32", "kv_scale_ptr": "*fp32", "attn_sink_ptr": "*fp32",
              "topk_length_ptr": "*i32", "errors_ptr": "*i32", "out_ptr": "*bf16",
              "max_logits_ptr": "*fp32", "lse_ptr": "*fp32", "sm_scale": "fp32", "s_kv": "i32",
              "h_q": "i32", "topk": "i32", "n_tiles": "i32"}


def compile_for_sm90(kernel: str, d_qk: int, **tuning):
    """Gluon kernel ``kernel`` (a key of :data:`KERNELS`) built ahead of time for sm_90, no GPU
    needed, as its ``launch()`` compiles it for a call of head dim ``d_qk`` with every optional
    argument and 16-byte aligned pointers (as fresh allocations are); ``tuning`` overrides
    entries of its ``TUNING``. Returns the compiled kernel (``asm["ptx"]``, ``metadata``);
    raises one of :data:`BUILD_ERRORS` where it does not build."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    module, fn = KERNELS[kernel], _KERNEL_FNS[kernel]
    constexprs = module.constexprs(d_qk, True, True, True, **tuning)
    signature = {name: "constexpr" if name in constexprs else _SIGNATURE[name]
                 for name in fn.arg_names}
    pointers = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
                if _SIGNATURE.get(name, "").startswith("*")}
    return triton.compile(GluonASTSource(fn, signature, constexprs, pointers),
                          target=GPUTarget("cuda", 90, 32),
                          options=gluon_shared_s.launch_options(module.TUNING, tuning))


@functools.cache
def build_problem(kernel: str) -> Optional[str]:
    """Why Gluon kernel ``kernel`` does not build for sm_90 on this Triton (see
    :func:`build_error_reason`), or None where it builds: one offline build (head dim 576,
    every optional argument), once per process."""
    try:
        compile_for_sm90(kernel, 576)
    except BUILD_ERRORS as error:
        return build_error_reason(error)
    return None


def kernel_choice(device: torch.device, forced: bool) -> tuple[str, str]:
    """The op's kernel for calls on ``device`` and why, where the op would take the Gluon
    kernel on sm_90 (``forced``: on any device): the Triton kernel on another GPU, where the
    Gluon kernel does not build (in this process, or in one offline build: see
    :func:`build_problem`) or without a GPU (the Triton interpreter)."""
    on_gpu = device.type == "cuda"
    capability = device_capability(device.index or 0) if on_gpu else None
    if capability not in (None, (9, 0)) and not forced:
        return "triton", "sm_%d%d: the Gluon kernels are sm_90 only" % capability
    problem = UNBUILDABLE or build_problem(KERNEL)
    if problem:
        return "triton", f"the Gluon kernel does not build on this Triton: {problem}"
    builds = f"builds on triton {triton.__version__}"
    return (f"gluon {KERNEL}", f"sm_90, {builds}") if on_gpu else (
        "triton", f"no GPU: the Triton interpreter; on sm_90 gluon {KERNEL}, which {builds}")


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
    return (tuple(values.values()),
            tuple(gluon_shared_s.launch_options(module.TUNING, {}).items()))


def launch_eager(grid, runtime_args, d_qk, has_topk_length, has_attn_sink, has_errors, device):
    """:func:`launch` with the default tuning through the cached launcher: ``grid`` one CTA
    per token and 64 heads (the kernel's ``programs_and_extra`` gives what it launches),
    ``runtime_args`` the 15 parameters both kernels take first (those of :func:`launch`'s
    call, in order). Returns the launch made: ``(launcher, grid, kernel arguments,
    options)``; None where the kernel does not build on this Triton (:func:`built`)."""
    constants, options = _eager_constants(KERNEL, d_qk, has_topk_length, has_attn_sink,
                                          has_errors)
    programs, extra = KERNELS[KERNEL].programs_and_extra(grid[0], device)
    launcher, grid = _LAUNCHERS[KERNEL], (programs, 1, 1)
    arguments = (*runtime_args, *extra.values(), *constants)
    if not built(launcher, grid, arguments, options, device):
        return None
    return launcher, grid, arguments, options


def launch_on_device(q, *args) -> bool:
    """:func:`launch` on ``q``'s device (made current for the launch if it is not); False,
    with nothing launched, where the kernel does not build on this Triton (:func:`built`)."""
    with on_device_of(q):
        return built(launch, q, *args)


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
    directly. Where the Gluon kernel does not build (now, or earlier in the process), the op's
    Triton kernel runs instead (:func:`built`).
    """
    args = (q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length, out,
            max_logits, lse, topk_length_errors)
    if UNBUILDABLE is None and launch_on_device(*args):
        return
    from strictops.ops.sparse_mla import prefill as op  # loaded already: it imports this module

    with on_device_of(q):
        op._launch(op._sparse_mla_prefill_kernel, *args)


@_ws_launch.register_fake
def _(q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length, out, max_logits,
      lse, topk_length_errors) -> None:
    return None
