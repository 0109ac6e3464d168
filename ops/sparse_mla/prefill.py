"""Sparse MLA prefill attention with FP8 Q and FP8 KV: ``sparse_mla_q8kv8_prefill_fwd``.

DeepSeek-V3.2-style sparse attention: each query token attends to its own ``topk`` selected
rows of one shared latent KV (MLA, one KV head). Q and KV are float8 e4m3 with one float32
scale each; the output is bf16.

Registration: ``torch.library.triton_op``, one op for every way of calling the public
function. Its body validates through the contract in ``strictops.meta.sparse_mla.prefill``,
then allocates the outputs the caller did not pass, then launches through ``wrap_triton``; the
same body is the fake, so ``torch.compile``/``torch.export`` run the contract on fake tensors
and Inductor sees the Triton launch. The schema declares the optional buffers ``out``,
``max_logits``, ``lse`` and ``topk_length_errors`` as mutated and returns the list of the
outputs it allocated (none, some or all three): a custom op may not return its inputs, and
allocating inside the op is what keeps "validate, then allocate" true for a call that passes
some buffers and not others.

Two paths (``KERNEL``, ``warp_specialized``): on an sm_90 GPU a warp-specialised Gluon
kernel (``strictops.ops.sparse_mla.sm90`` chooses it: by default the block-pair kernel, 2.5x
the Triton kernel here on the H200; docs/design/sparse_mla_prefill.md), everywhere else the
Triton kernel below (other GPUs, the Triton interpreter, tracing without a GPU, a Triton on
which the Gluon kernel failed to build). Inductor cannot compile a Gluon kernel from a
``wrap_triton`` launch, so a traced call of the Gluon path records an opaque op,
``strictops_kernels::sparse_mla_ws_launch``, after the contract has run in this op's body; an
eager call launches it directly. The choice is a trace-time constant of the device, never of a
size. Semantics (the formula, empty rows, infinite sinks, out-of-range ``topk_length``):
:func:`sparse_mla_q8kv8_prefill_fwd`, and as math :func:`reference`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from strictops.meta.sparse_mla import prefill as contract
from strictops.meta._contract import CachedValidation
from strictops.meta._specs import TensorSpec

from strictops.ops._runtime.dispatch import can_skip_dispatcher, device_capability, on_device_of
from strictops.ops._runtime.host_path import MISS, HostPath
from strictops.ops._runtime.interpret import interpreted
from strictops.ops._runtime.launcher import Launcher

try:  # the one place that decides whether this Triton has Gluon's Hopper API
    from strictops.ops.sparse_mla import sm90 as _sparse_mla_sm90
except ImportError as error:  # without it, the Triton kernel runs everywhere
    if not (error.name or "").startswith("triton"):
        raise
    _sparse_mla_sm90 = None

# The public function. The reference and the helpers of tests, benchmarks and the self-check
# (``reference``, ``relative_l2``, ``compare_to_reference``, ``launch_interpreted``,
# ``random_inputs``, ``example_inputs``, ``selfcheck_result``, ``kernel_choice``) are importable
# by name, not exported.
__all__ = ["sparse_mla_q8kv8_prefill_fwd"]


@triton.jit
def _sparse_mla_prefill_kernel(
    q_ptr,
    kv_ptr,
    indices_ptr,
    q_scale_ptr,
    kv_scale_ptr,
    attn_sink_ptr,
    topk_length_ptr,
    errors_ptr,
    out_ptr,
    max_logits_ptr,
    lse_ptr,
    sm_scale,
    s_kv,
    h_q,
    topk,
    D_QK: tl.constexpr,
    HAS_TOPK_LENGTH: tl.constexpr,
    HAS_ATTN_SINK: tl.constexpr,
    HAS_ERRORS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Attention of one token and ``BLOCK_H`` heads over the token's selected KV rows.

    Grid: ``(s_q * h_q // BLOCK_H,)``; program ``pid`` takes token ``pid // (h_q // BLOCK_H)``,
    so the programs of one token's head blocks run side by side and share its rows in L2.
    Every tensor is contiguous (the contract checks it), so strides follow from sizes.

    q_ptr: ``[s_q, h_q, D_QK]`` float8e4m3; the first 512 columns are the latent part, the
        other ``D_QK - 512`` (0 or 64) the rope part, which enters Q·Kᵀ only.
    kv_ptr: ``[s_kv, 1, D_QK]`` float8e4m3; K is the whole row, V its first 512 columns.
    indices_ptr: ``[s_q, 1, topk]`` int32, any values; valid when ``0 <= idx < s_kv``.
    q_scale_ptr, kv_scale_ptr: one float32 each.
    attn_sink_ptr: ``[h_q]`` float32 (``HAS_ATTN_SINK``).
    topk_length_ptr: ``[s_q]`` int32, any values, clamped to ``[0, topk]`` (``HAS_TOPK_LENGTH``).
    errors_ptr: ``[1]`` int32; the token's head-block-0 program adds 1 when the token's
        ``topk_length`` was out of range (``HAS_ERRORS``).
    out_ptr: ``[s_q, h_q, 512]`` bf16. max_logits_ptr, lse_ptr: ``[s_q, h_q]`` float32.

    Per step, ``BLOCK_N`` rows are gathered through the indices (invalid ones masked, their
    addresses clamped to row 0 and never loaded), S = Q·Kᵀ runs in FP8 with fp32 accumulation,
    the online softmax runs in natural units (the max and lse are reported in them), and P·V
    runs with P and V in bf16 (V's FP8 values are exact in bf16; P rounds to 8 bits): about
    2e-3 relative L2 error against float64, where P in FP8 gives 1.9e-2.
    """
    D_V: tl.constexpr = 512
    D_ROPE: tl.constexpr = D_QK - D_V
    LOG2E: tl.constexpr = 1.4426950408889634
    head_blocks = h_q // BLOCK_H
    pid = tl.program_id(0)
    token = (pid // head_blocks).to(tl.int64)
    head_block = pid % head_blocks
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    row_of_head = token * h_q + heads  # int64: s_q * h_q * D_QK can pass 2**31
    cols = tl.arange(0, D_V)

    q_rows = q_ptr + row_of_head[:, None] * D_QK
    q_latent = tl.load(q_rows + cols[None, :])
    if D_ROPE > 0:
        rope_cols = tl.arange(0, D_ROPE)
        q_rope = tl.load(q_rows + D_V + rope_cols[None, :])
    kv_scale = tl.load(kv_scale_ptr)
    # fp32 whatever type sm_scale arrives as (Inductor may pass a Python float as fp64).
    scale = (sm_scale * tl.load(q_scale_ptr) * kv_scale).to(tl.float32)

    n_rows = topk
    if HAS_TOPK_LENGTH:
        requested = tl.load(topk_length_ptr + token)
        n_rows = tl.minimum(requested, topk)  # a negative length runs no step: 0 rows
        if HAS_ERRORS:
            out_of_range = (requested < 0) | (requested > topk)
            tl.atomic_add(errors_ptr, 1, mask=out_of_range & (head_block == 0))

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D_V], tl.float32)
    index_row = indices_ptr + token * topk
    for start in range(0, n_rows, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        idx = tl.load(index_row + j, mask=j < n_rows, other=-1)
        valid = (idx >= 0) & (idx < s_kv)
        kv_rows = kv_ptr + tl.where(valid, idx, 0).to(tl.int64)[:, None] * D_QK
        k_latent = tl.load(kv_rows + cols[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q_latent, tl.trans(k_latent))
        if D_ROPE > 0:
            k_rope = tl.load(kv_rows + D_V + rope_cols[None, :], mask=valid[:, None], other=0.0)
            s = tl.dot(q_rope, tl.trans(k_rope), s)
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # While every row so far was invalid the max is -inf; subtracting 0 instead keeps
        # exp(-inf - m) at 0 rather than NaN.
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2((m_i - m_ref) * LOG2E)
        p = tl.exp2((s - m_ref[:, None]) * LOG2E)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), k_latent.to(tl.bfloat16))
        m_i = m_new

    seen = l_i > 0  # at least one valid row: its own term is exp(0) = 1
    l_safe = tl.where(seen, l_i, 1.0)
    lse = tl.where(seen, m_i + tl.log(l_safe), float("inf"))
    weight = tl.where(seen, kv_scale / l_safe, 0.0)
    if HAS_ATTN_SINK:
        # exp(lse) / (exp(lse) + exp(sink)) as 1 / (1 + exp(sink - lse)), which cannot give
        # inf / inf. An empty row's weight is 0 already; its lse (+inf) is not subtracted,
        # since for sink = +inf that is inf - inf = NaN (0 / (1 + exp(sink)) is 0 for any sink).
        sink = tl.load(attn_sink_ptr + heads)
        weight = weight / (1.0 + tl.exp(sink - tl.where(seen, lse, 0.0)))
    out = acc * weight[:, None]
    tl.store(out_ptr + row_of_head[:, None] * D_V + cols[None, :], out.to(tl.bfloat16))
    tl.store(max_logits_ptr + row_of_head, m_i)
    tl.store(lse_ptr + row_of_head, lse)


# Triton kernel: 8 warps, 2 stages and 64 rows a step were the best on the H200 (262 TFLOPS);
# Triton 3.6 miscompiles 1 stage. Why: docs/design/sparse_mla_prefill.md#triton-kernel
TUNING = {"num_warps": 8, "num_stages": 2, "block_n": 64}
# Which kernel a CUDA call runs: "auto" (a warp-specialised Gluon kernel on sm_90 when this
# Triton has Gluon, the Triton kernel elsewhere), "gluon" or "triton" (tests, A/B runs).
KERNEL = "auto"


def _runtime_arguments(q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length,
                       out, max_logits, lse, topk_length_errors):
    """The grid and the 15 runtime parameters (those both kernels take first, in order)."""
    s_q, h_q, d_qk = q.shape
    return (s_q * (h_q // contract.HEAD_BLOCK), 1, 1), (
        q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, topk_length_errors,
        out, max_logits, lse, sm_scale, kv.shape[0], h_q, indices.shape[2])


def _launch(kernel, q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length,
            out, max_logits, lse, topk_length_errors, num_warps=TUNING["num_warps"],
            num_stages=TUNING["num_stages"], block_n=TUNING["block_n"]):
    """Launch ``kernel`` (a JIT, wrapped or interpreted Triton kernel) on validated inputs;
    return what the launch returns (for a JIT kernel, the compiled kernel: the benchmark
    reads its registers, spills and instructions)."""
    grid, runtime = _runtime_arguments(q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink,
                                       topk_length, out, max_logits, lse, topk_length_errors)
    return kernel[grid](
        *runtime, D_QK=q.shape[2], HAS_TOPK_LENGTH=topk_length is not None,
        HAS_ATTN_SINK=attn_sink is not None, HAS_ERRORS=topk_length_errors is not None,
        BLOCK_H=contract.HEAD_BLOCK, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages,
    )


def _allocate(q, d_v, out, max_logits, lse, allocations=None, fresh=None):
    """The three output buffers, allocating those not given (see :func:`_allocated`, which
    records each allocation in ``allocations`` and the new tensors in ``fresh``); also the list
    of new ones."""
    s_q, h_q = q.shape[0], q.shape[1]
    allocations = [] if allocations is None else allocations
    fresh = [] if fresh is None else fresh
    if out is None:
        out = _allocated(allocations, fresh, (s_q, h_q, d_v), torch.bfloat16, q)
    if max_logits is None:
        max_logits = _allocated(allocations, fresh, (s_q, h_q), torch.float32, q)
    if lse is None:
        lse = _allocated(allocations, fresh, (s_q, h_q), torch.float32, q)
    return out, max_logits, lse, fresh


def _allocated(allocations, fresh, sizes, dtype, q, split=False):
    """``torch.empty(sizes, dtype)`` on ``q``'s device (``split``: its views along dim 0),
    recorded in ``allocations`` (as ``(sizes, dtype, split)``) and ``fresh``."""
    t = torch.empty(sizes, dtype=dtype, device=q.device)
    allocations.append((sizes, dtype, split))
    if not split:
        fresh.append(t)
        return t
    parts = t.unbind(0)
    fresh.extend(parts)
    return parts


def warp_specialized(q: torch.Tensor, real: bool = False) -> bool:
    """Whether calls on ``q``'s device run the warp-specialised Gluon kernel (see ``KERNEL``;
    never once it failed to build): a trace-time constant of the device, never of a size.
    ``real``: ``q`` is a real CUDA tensor (the eager path), so a GPU is there to ask."""
    if KERNEL == "triton" or _sparse_mla_sm90 is None or _sparse_mla_sm90.UNBUILDABLE:
        return False
    if KERNEL == "gluon":  # also on fake CUDA tensors without a GPU: CI traces this path
        return True
    return (real or torch.cuda.is_available()) and _is_sm90(q.get_device())


def _is_sm90(device_index: int) -> bool:
    """Whether CUDA device ``device_index`` is a Hopper (sm_90)."""
    return device_capability(device_index) == (9, 0)


def kernel_choice(device: torch.device) -> tuple[str, str]:
    """The kernel that calls on ``device`` run, and why (the self-check's row)."""
    if KERNEL == "triton" or _sparse_mla_sm90 is None:
        return "triton", ("this Triton has no Gluon Hopper API" if _sparse_mla_sm90 is None
                          else 'KERNEL = "triton"')
    return _sparse_mla_sm90.kernel_choice(device, KERNEL == "gluon")


def _forward(kernel, real_launch, q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink,
             topk_length, out, max_logits, lse, topk_length_errors) -> list[torch.Tensor]:
    """Validate (the ``topk_length`` values too, where the contract may read them), allocate
    what is missing, launch; return the outputs allocated here."""
    contract.validate(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length,
                      out, max_logits, lse, topk_length_errors)
    out, max_logits, lse, fresh = _allocate(q, d_v, out, max_logits, lse)
    launch_args = (q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length, out,
                   max_logits, lse, topk_length_errors)
    gluon = warp_specialized(q)
    if gluon and not real_launch:
        torch.ops.strictops_kernels.sparse_mla_ws_launch(*launch_args)
    elif not (gluon and _sparse_mla_sm90.launch_on_device(*launch_args)):
        with on_device_of(q, real_launch):  # the Triton kernel, also where Gluon did not build
            _launch(kernel, *launch_args)
    return fresh


# The eager path: the contract's verdict cached per metadata signature, the kernels launched
# through their cached launchers (strictops.ops._runtime.launcher); the same rules and launches. A
# call it served leaves a plan of its signature for the C++ path
# (strictops.ops._runtime.host_path).
_VALIDATION = CachedValidation(contract.CONTRACT, contract.ARGUMENTS)
_LAUNCHER = Launcher(_sparse_mla_prefill_kernel)
_HOST = HostPath(_VALIDATION, writes=(*contract.BUFFERS, "topk_length_errors"))


def _eager(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out,
           max_logits, lse, topk_length_errors) -> tuple:
    """:func:`_forward` of a real launch in plain eager mode; returns ``(out, max_logits,
    lse)``. Missing ``max_logits`` and ``lse`` are the halves of one ``[2, s_q, h_q]``
    allocation."""
    args = (q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out,
            max_logits, lse, topk_length_errors)
    _VALIDATION(*args)
    s_q, h_q, d_qk = q.shape
    # Each allocation as (sizes, dtype, split along dim 0), and the tensors it gave, in order:
    # what a plan of this signature allocates.
    allocations, fresh = [], []
    if max_logits is None and lse is None:
        max_logits, lse = _allocated(allocations, fresh, (2, s_q, h_q), torch.float32, q, True)
    out, max_logits, lse, _ = _allocate(q, d_v, out, max_logits, lse, allocations, fresh)
    grid, runtime = _runtime_arguments(q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink,
                                       topk_length, out, max_logits, lse, topk_length_errors)
    flags = (topk_length is not None, attn_sink is not None, topk_length_errors is not None)
    device = q.get_device()
    launch = warp_specialized(q, real=True) and _sparse_mla_sm90.launch_eager(
        grid, runtime, d_qk, *flags, device)  # None where the Gluon kernel does not build
    if not launch:
        t = TUNING
        launch = (_LAUNCHER, grid, (*runtime, d_qk, *flags, contract.HEAD_BLOCK, t["block_n"]),
                  (("num_warps", t["num_warps"]), ("num_stages", t["num_stages"])))
        _LAUNCHER(*launch[1:], device)
    _HOST.register(args, *launch, device, allocations, fresh, (out, max_logits, lse),
                   _SETTINGS)
    return out, max_logits, lse


_HOST_CALL = _HOST.call
# What the eager path reads to choose its launch (a failed Gluon build too), which a plan must
# see unchanged.
_SETTINGS = ((globals(), "KERNEL"), (globals(), "TUNING"))
if _sparse_mla_sm90 is not None:
    _SETTINGS += ((vars(_sparse_mla_sm90), "KERNEL"), (vars(_sparse_mla_sm90), "UNBUILDABLE"))


@triton_op(contract.CONTRACT.op, mutates_args=contract.CONTRACT.mutates)
def _sparse_mla_q8kv8_prefill_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    q_scale: Optional[torch.Tensor],
    kv_scale: Optional[torch.Tensor],
    d_v: int,
    attn_sink: Optional[torch.Tensor],
    topk_length: Optional[torch.Tensor],
    out: Optional[torch.Tensor],
    max_logits: Optional[torch.Tensor],
    lse: Optional[torch.Tensor],
    topk_length_errors: Optional[torch.Tensor],
) -> list[torch.Tensor]:
    # No defaults in the schema: torch 2.11 drops trailing arguments equal to their defaults
    # before its version-counter bump of the mutated ones, which then indexes past the end.
    # The body is also the fake: under fake tensors the launch is recorded, not run.
    kernel = wrap_triton(_sparse_mla_prefill_kernel)
    return _forward(kernel, kernel is _sparse_mla_prefill_kernel, q, kv, indices, sm_scale,
                    q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits, lse,
                    topk_length_errors)


def sparse_mla_q8kv8_prefill_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    q_scale: torch.Tensor,
    kv_scale: torch.Tensor,
    d_v: int = contract.D_V,
    attn_sink: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
    max_logits: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
    topk_length_errors: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FP8 sparse MLA prefill attention: each token attends to its own ``topk`` KV rows.

    Parameters
    ----------
    q : torch.Tensor
        ``[s_q, h_q, d_qk]`` float8_e4m3fn CUDA tensor, contiguous; ``h_q`` a positive
        multiple of 64, ``d_qk`` 512 or 576 (the last 64 columns of 576 are the rope part).
    kv : torch.Tensor
        ``[s_kv, 1, d_qk]`` float8_e4m3fn, contiguous, on ``q``'s device. V is
        ``kv[:, 0, :d_v]``.
    indices : torch.Tensor
        ``[s_q, 1, topk]`` int32, contiguous; ``topk`` a positive multiple of 128. Values
        outside ``[0, s_kv)`` select nothing and are never read.
    sm_scale : float
        Softmax scale, in natural units (not log2).
    q_scale, kv_scale : torch.Tensor
        One-element float32 tensors on ``q``'s device: the dequantisation scales.
    d_v : int
        Must be 512.
    attn_sink : torch.Tensor, optional
        ``[h_q]`` float32: a per-head logit that takes part in the softmax normaliser but has
        no value row. Needs ``topk_length``.
    topk_length : torch.Tensor, optional
        ``[s_q]`` int32: token ``t`` uses only its first ``topk_length[t]`` indices. Values
        must lie in ``[0, topk]``; see Notes for what happens otherwise.
    out, max_logits, lse : torch.Tensor, optional
        Buffers to write instead of allocating: ``[s_q, h_q, d_v]`` bf16, ``[s_q, h_q]`` float32,
        ``[s_q, h_q]`` float32, contiguous, on ``q``'s device, not overlapping each other.
    topk_length_errors : torch.Tensor, optional
        ``[1]`` int32 on ``q``'s device (added; the original has no such argument): each call
        adds the number of tokens whose ``topk_length`` was outside ``[0, topk]``.

    Returns
    -------
    tuple of torch.Tensor
        ``(out, max_logits, lse)``: ``[s_q, h_q, d_v]`` bf16 and two ``[s_q, h_q]`` float32; the
        given buffers where passed. For each token ``t`` and head ``h`` over the valid rows
        ``j``: ``s_j = sm_scale * q_scale * kv_scale * q[t, h] · kv[idx_j, 0]``,
        ``max_logits = max_j s_j``, ``lse = log Σ_j exp(s_j)``,
        ``out = Σ_j softmax(s)_j kv_scale kv[idx_j, 0, :d_v]``, times
        ``exp(lse) / (exp(lse) + exp(attn_sink[h]))`` with a sink (0 for a sink of ``+inf``).
        A row with no valid index gives ``out = 0`` whatever the sink, ``max_logits = -inf``,
        ``lse = +inf``.

    Notes
    -----
    Bad metadata raises ``ValueError`` before anything is allocated or launched in eager mode,
    and at trace time under ``torch.compile``/``torch.export``, with the original messages.

    ``topk_length`` values outside ``[0, topk]`` are clamped into it by the kernel. In plain
    eager mode outside CUDA-graph capture the call also reads them first (a host sync) and
    raises ``ValueError("topk_length values must satisfy 0 <= topk_length <= topk (...)")``
    where the original did: after ``topk_length``'s own checks, before those of ``d_v``,
    ``attn_sink``, the scales and the buffers. To learn about bad values without a host sync,
    in any mode, pass ``topk_length_errors`` (e.g. ``torch.zeros(1, dtype=torch.int32,
    device=q.device)``, kept across calls): the eager check is then skipped, and the count
    accumulates on the device until the caller reads (``.item()``, off the hot path) or zeroes
    it.

    In plain eager mode the call skips the dispatcher (see ``strictops.ops._runtime.dispatch``), and
    a ``max_logits`` and ``lse`` it allocates are the two halves of one allocation;
    ``torch.ops.strictops.sparse_mla_q8kv8_prefill_fwd`` is the same op through it and returns
    the list of outputs it allocated.
    """
    # The schema types the scales as optional tensors: anything else reaches the contract as
    # None, which its first scale rule refuses with the original message.
    q_scale = q_scale if isinstance(q_scale, torch.Tensor) else None
    kv_scale = kv_scale if isinstance(kv_scale, torch.Tensor) else None
    if not torch.compiler.is_compiling():  # the C++ path, for a signature served before
        result = _HOST_CALL(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink,
                            topk_length, out, max_logits, lse, topk_length_errors)
        if result is not MISS:
            return result
    args = (q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out,
            max_logits, lse, topk_length_errors)
    written = (out, max_logits, lse, topk_length_errors)
    if can_skip_dispatcher(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, *written):
        outputs = _eager(*args)
        for t in written:
            if t is not None:  # what the dispatcher does for the a(!) arguments
                torch.autograd.graph.increment_version(t)
        return outputs
    fresh = iter(torch.ops.strictops.sparse_mla_q8kv8_prefill_fwd(*args))
    return tuple([next(fresh) if t is None else t for t in (out, max_logits, lse)])


def launch_interpreted(q, kv, indices, sm_scale, q_scale, kv_scale, d_v=contract.D_V,
                       attn_sink=None, topk_length=None, *, out=None, max_logits=None, lse=None,
                       topk_length_errors=None, reverse_programs=False, **tuning):
    """Run the kernel through the Triton interpreter on CPU tensors (tests, self-check).

    The public op keeps its CUDA-only contract; this launcher exists so that CI, which has no
    GPU, can check the kernel's arithmetic and its handling of bad index values. It allocates
    the buffers not given, does not validate, and returns ``(out, max_logits, lse)``.
    ``reverse_programs`` runs the programs in reverse grid order (see ``_interpret``).
    """
    out, max_logits, lse, _ = _allocate(q, d_v, out, max_logits, lse)
    with interpreted(_sparse_mla_prefill_kernel, reverse_programs) as kernel:
        _launch(kernel, q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length,
                out, max_logits, lse, topk_length_errors, **tuning)
    return out, max_logits, lse


# The reference gathers the selected rows of as many tokens at a time as fit in this many
# bytes, which keeps it near 1 GiB of float64 at the benchmark shapes.
REFERENCE_GATHER_BYTES = 1 << 30


def reference(q, kv, indices, sm_scale, q_scale, kv_scale, d_v=contract.D_V, attn_sink=None,
              topk_length=None, dtype=torch.float64):
    """Plain-PyTorch reference on the dequantised inputs, in ``dtype`` (float64 by default).

    Returns ``(out [s_q, h_q, d_v], max_logits [s_q, h_q], lse [s_q, h_q])`` in ``dtype``.

    With ``Q = q * q_scale`` and ``K = kv[:, 0] * kv_scale`` (exact in float32/float64), for
    token ``t`` the valid selected rows are ``J_t = {j : 0 <= idx[t, j] < s_kv and j < L_t}``
    with ``L_t = clamp(topk_length[t], 0, topk)`` (``topk`` without ``topk_length``; the
    clamp is what the kernel does with an out-of-range value). Then, for every head ``h``::

        s_j        = sm_scale * Q[t, h] · K[idx[t, j]]                     for j in J_t
        max_logits = max_j s_j                        (-inf when J_t is empty)
        lse        = log Σ_j exp(s_j)                 (+inf when J_t is empty)
        out        = Σ_j exp(s_j - lse) K[idx[t, j], :d_v]                 (0 when empty)
        out       *= sigmoid(lse - attn_sink[h])      (= exp(lse) / (exp(lse) + exp(sink)))

    With ``attn_sink[h] = +inf`` the sink takes all the weight: ``out = 0``. With ``-inf`` it
    takes none: ``out`` is as without a sink. An empty token (``J_t`` empty) has ``out = 0``
    whatever the sink, ``+inf`` included (where ``lse - sink`` would be NaN); ``max_logits``
    and ``lse`` never depend on the sink. No output is NaN for any sink in ``[-inf, +inf]``.

    Tokens are processed in chunks so that the gathered rows stay near
    ``REFERENCE_GATHER_BYTES``.
    """
    s_q, h_q, d_qk = q.shape
    s_kv, topk = kv.shape[0], indices.shape[2]
    dq = q.to(dtype) * q_scale.to(dtype)
    # A zero row at s_kv stands in for every invalid index, so no index is ever out of range.
    # The rows are gathered as bytes and dequantised after: the whole kv in float64 could take
    # more memory than the kernel's inputs by far.
    k_bytes = torch.zeros(s_kv + 1, d_qk, dtype=torch.uint8, device=kv.device)
    k_bytes[:s_kv] = kv[:, 0].view(torch.uint8)
    idx = indices[:, 0].long()
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        lengths = topk_length.long().clamp(0, topk)
        valid &= torch.arange(topk, device=idx.device)[None, :] < lengths[:, None]
    idx = torch.where(valid, idx, s_kv)
    out = torch.empty(s_q, h_q, d_v, dtype=dtype, device=q.device)
    max_logits = torch.empty(s_q, h_q, dtype=dtype, device=q.device)
    lse = torch.empty(s_q, h_q, dtype=dtype, device=q.device)
    chunk = max(1, REFERENCE_GATHER_BYTES // (topk * d_qk * dtype.itemsize))
    for t0 in range(0, s_q, chunk):
        t = slice(t0, t0 + chunk)
        rows = k_bytes[idx[t]].view(kv.dtype).to(dtype) * kv_scale.to(dtype)  # [t, topk, d_qk]
        s = sm_scale * torch.einsum("thd,tjd->thj", dq[t], rows)
        s = s.masked_fill(~valid[t, None, :], float("-inf"))
        max_logits[t] = s.amax(dim=-1)
        row_lse = torch.logsumexp(s, dim=-1)
        row_lse = torch.where(valid[t].any(dim=-1)[:, None], row_lse, float("inf"))
        lse[t] = row_lse
        # exp(-inf - lse) is 0 for invalid rows, and for every row of an empty token.
        out[t] = torch.einsum("thj,tjd->thd", torch.exp(s - row_lse[..., None]),
                              rows[..., :d_v])
    if attn_sink is not None:
        gate = torch.sigmoid(lse - attn_sink.to(dtype)[None, :])
        # An empty token's out is 0 already; its gate is NaN for sink = +inf (inf - inf).
        out *= torch.where(valid.any(dim=-1)[:, None], gate, 0.0)[..., None]
    return out, max_logits, lse


def relative_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64; 0 when both are 0 (every row
    empty), inf when only ``expected`` is."""
    diff = float(torch.linalg.vector_norm(actual.double() - expected.double()))
    norm = float(torch.linalg.vector_norm(expected.double()))
    return diff / norm if norm else (0.0 if diff == 0 else float("inf"))


# Relative L2 error of ``out`` against the float64 reference that the kernel's arithmetic
# allows. P is rounded to bf16 for P·V and ``out`` is stored as bf16: two roundings to nearest,
# unit roundoff 2**-8 each; everything else is exact (FP8 V in bf16, products of bf16 in fp32)
# or far finer (fp32 accumulation). On random data the two give about 1.8e-3 (measured here in
# the interpreter, about 2e-3 on the GPU). The bound is their worst case for an
# element that is a convex combination of same-signed values, 2 * 2**-8, which leaves room for
# cancellation; what it must catch costs more: P in FP8 1.9e-2, a wrong row, scale or mask O(1).
REL_L2_BOUND = 2**-7
# The GPU tests' bound on that error (the original CUTLASS kernel measures 1.9e-2).
GPU_REL_L2_BOUND = 2.5e-2
# max_logits and lse: error relative to 1 + |value|. In the interpreter they are fp32 sums of
# exact FP8 products (fp32 rounding of 576-term sums: ~1e-6). Hopper's FP8 MMA keeps fewer
# accumulator bits (about 14; DeepSeek-V3 measured up to 2e-2 relative error at K = 4096, so
# ~3e-3 at K = 576), hence the looser GPU value. A missing scale or rope term costs O(0.1).
LOGIT_TOL = 1e-5
GPU_LOGIT_TOL = 1e-2


def compare_to_reference(outputs, expected, rel_l2_bound: float, logit_tol: float):
    """``(passed, detail)``: ``outputs = (out, max_logits, lse)`` of a kernel against the
    reference's ``expected``.

    ``out`` must be within ``rel_l2_bound`` relative L2 error and free of NaN; ``max_logits``
    and ``lse`` within ``logit_tol * (1 + |expected|)``, with the empty-row infinities exact.
    A NaN anywhere (e.g. a poisoned element the kernel did not write) fails.
    """
    out, max_logits, lse = outputs
    err = relative_l2(out, expected[0])
    failures = []
    if not (err <= rel_l2_bound) or out.isnan().any():
        failures.append(f"out rel-L2 {err:.3g} > {rel_l2_bound:.3g} or NaN")
    for name, got, want in (("max_logits", max_logits, expected[1]), ("lse", lse, expected[2])):
        got = got.double()
        finite = want.isfinite()
        close = (got[finite] - want[finite]).abs() <= logit_tol * (1 + want[finite].abs())
        if not (close.all() and torch.equal(got[~finite], want[~finite])):
            failures.append(f"{name} differs")
    detail = f"out rel-L2 {err:.2e} (bound {rel_l2_bound:.2e})"
    return not failures, "; ".join([detail, *failures])


def random_inputs(dims: contract.Dims, generator: torch.Generator,
                  invalid_fraction: float = 1 / 8, edge_rows: bool = True) -> dict:
    """Keyword arguments of a valid call for ``dims``, with random values.

    Parameters
    ----------
    dims : Dims
        Sizes, which optional arguments to pass, and the device of every tensor.
    generator : torch.Generator
        Source of every random value; the values are drawn on its device, then moved.
    invalid_fraction : float
        Chance of each index to be invalid: -1, ``s_kv``, ``s_kv + 5``, INT32_MAX or
        INT32_MIN. The others are uniform in ``[0, s_kv)``, duplicates included.
    edge_rows : bool
        Make the first tokens edge cases: token 0 selects only invalid indices and, with
        ``topk_length``, token 1 has length 0, token 2 stops mid-block (70) and every fourth
        token from token 3 on uses its full ``topk``.

    Returns
    -------
    dict
        ``q``, ``kv`` (dequantised values near N(0, 1) with logits spread over a few units, so
        the online softmax rescales as new maxima arrive), ``indices``, ``sm_scale``,
        ``q_scale``, ``kv_scale``, ``d_v`` and, as ``dims`` asks, ``attn_sink`` (N(0, 1)),
        ``topk_length`` (uniform in ``[0, topk]``), the buffers ``out``/``max_logits``/``lse``
        filled with NaN (an element the kernel leaves unwritten stays NaN) and a zeroed
        ``topk_length_errors``; None for what it does not ask.
    """
    s_q, s_kv, h_q, d_qk, topk = dims.s_q, dims.s_kv, dims.h_q, dims.d_qk, dims.topk
    spec = contract.valid_spec(dims)
    on = {"generator": generator, "device": generator.device}
    indices = torch.randint(0, s_kv, (s_q, 1, topk), **on)
    invalid = torch.tensor([-1, s_kv, s_kv + 5, 2**31 - 1, -(2**31)], device=generator.device)
    bad = torch.rand(indices.shape, **on) < invalid_fraction
    indices = torch.where(bad, invalid[torch.randint(0, len(invalid), indices.shape, **on)],
                          indices)
    lengths = torch.randint(0, topk + 1, (s_q,), **on)
    if edge_rows:
        indices[:1] = invalid[torch.arange(topk, device=generator.device) % len(invalid)]
        lengths[1:2], lengths[2:3], lengths[3::4] = 0, min(70, topk), topk
    values = {
        "q": (torch.randn(s_q, h_q, d_qk, **on) * 4).to(contract.FP8),
        "kv": (torch.randn(s_kv, 1, d_qk, **on) * 8).to(contract.FP8),
        "indices": indices,
        "q_scale": torch.tensor([0.5]),
        "kv_scale": torch.tensor([0.25]),
        "attn_sink": torch.randn(h_q, **on),
        "topk_length": lengths,
        "topk_length_errors": torch.zeros(1),
    }
    if dims.with_buffers:
        values |= {name: torch.full(spec[name].shape, float("nan"), device=generator.device)
                   for name in contract.BUFFERS}
    return {name: (values[name].to(device=s.device, dtype=s.dtype)
                   if isinstance(s, TensorSpec) else s)  # None, sm_scale, d_v: as specified
            for name, s in spec.items()}


def example_inputs(device: str, small: bool, generator: torch.Generator) -> dict:
    """Keyword arguments of a valid call whose values reach every path of the kernel, on
    ``device`` (``"cpu"`` for :func:`launch_interpreted`), every value drawn from the CPU
    ``generator``: :func:`random_inputs` with every optional argument given and the edge rows
    (an empty token, a zero ``topk_length``, one that stops mid-block, one in eight indices
    invalid). ``small``: interpreter-sized shapes (``s_q=4, s_kv=200, h_q=64, d_qk=576,
    topk=128``: pairwise distinct and >= 2, so a dynamic-shape trace keeps each one a symbol);
    else a moderate GPU shape (``s_q=256, s_kv=4096, h_q=128, d_qk=576, topk=512``).
    """
    dims = (contract.Dims(s_q=4, s_kv=200, h_q=64, d_qk=576, topk=128) if small
            else contract.Dims(s_q=256, s_kv=4096, h_q=128, d_qk=576, topk=512))
    return random_inputs(dataclasses.replace(dims, with_attn_sink=True, with_buffers=True,
                                             with_errors=True, device=device), generator)


# The arguments of a call that are inputs (what the reference takes), in order.
INPUTS = ("q", "kv", "indices", "sm_scale", "q_scale", "kv_scale", "d_v", "attn_sink",
          "topk_length")


def selfcheck_result(on_gpu: bool) -> tuple[bool, str]:
    """The self-check's result row: the example call against the float64 reference.

    On a GPU the public op runs at the moderate shape within the GPU tolerances; without one
    the kernel runs in the Triton interpreter (programs in reverse order) at the small shape
    within :data:`REL_L2_BOUND`. The outputs start as NaN, so an unwritten element fails, and
    the error counter must stay 0 (every ``topk_length`` of the example is in range).
    """
    args = example_inputs("cuda:0" if on_gpu else "cpu", small=not on_gpu,
                          generator=torch.Generator().manual_seed(0))
    expected = reference(**{k: args[k] for k in INPUTS})
    if on_gpu:
        outputs = sparse_mla_q8kv8_prefill_fwd(**args)
        passed, detail = compare_to_reference(outputs, expected, GPU_REL_L2_BOUND, GPU_LOGIT_TOL)
        where = "GPU cuda:0"
    else:
        outputs = launch_interpreted(**args, reverse_programs=True)
        passed, detail = compare_to_reference(outputs, expected, REL_L2_BOUND, LOGIT_TOL)
        where = "Triton interpreter"
    errors = int(args["topk_length_errors"].item())
    if errors:
        passed, detail = False, f"{detail}; {errors} topk_length errors counted, expected 0"
    return passed, f"{where}, out shape {list(outputs[0].shape)}: {detail}"
