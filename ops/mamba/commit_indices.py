"""The verify-commit index arithmetic of speculative decoding, in one launch.

After verification, request ``b`` accepted ``accept_lens[b]`` draft tokens, listed in
``accept_index[b]`` as rows of the ``batch * draft_token_num`` verify rows. This op computes,
without a host sync, the draft step whose state each request commits and (with ``seq_lens``)
the step whose state is kept in a track slot when the sequence crosses a multiple of
``mamba_track_interval``.

Registration: ``torch.library.triton_op``; the body validates through the contract in
``strictops.meta.mamba.commit_indices``, allocates the two results, and launches through
``wrap_triton``. The same body is the fake, so ``torch.compile``/``torch.export`` run the
contract on fake tensors and Inductor sees the Triton launch.

Semantics, for each request ``b`` (``n = accept_index.shape[1]``, ``I = mamba_track_interval``,
``base = b * draft_token_num``)::

    ok(b)           = 1 <= accept_lens[b] <= n
    last_correct[b] = accept_index[b, accept_lens[b] - 1] - base     if ok(b) else -1
    r, k            = seq_lens[b] % I, (seq_lens[b] % I + accept_lens[b]) // I
    steps_to_track[b] = accept_index[b, k * I - r - 1] - base        if ok(b) and
                                                                        seq_lens[b] >= 0 and k > 0
                      = -1                                          otherwise

``k > 0`` is ``seq_lens // I != (seq_lens + accept_lens) // I`` (the step crosses a multiple of
``I``) and ``k * I - r - 1`` is the last crossed multiple minus ``seq_lens + 1``: the original's
formula, written so that nothing overflows and no division sees a negative number. ``-1`` is
the value the state scatters skip, so a request with out-of-range lengths commits nothing and
no index value reads out of bounds.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from strictops.meta.mamba import commit_indices as contract
from strictops.meta._contract import CachedValidation

from strictops.ops._runtime.dispatch import can_skip_dispatcher, on_device_of
from strictops.ops._runtime.host_path import MISS, HostPath
from strictops.ops._runtime.interpret import interpreted
from strictops.ops._runtime.launcher import Launcher, keyword_constexprs

__all__ = [
    "fused_commit_track_indices",
    "reference",
    "launch_interpreted",
    "example_inputs",
]


@triton.jit
def _commit_kernel(
    accept_index_ptr,
    accept_lens_ptr,
    seq_lens_ptr,
    last_correct_ptr,
    steps_to_track_ptr,
    batch,
    accepted_tokens,
    draft_token_num,
    interval,
    accept_index_stride0,
    accept_index_stride1,
    accept_lens_stride,
    seq_lens_stride,
    HAS_TRACK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Both results for ``BLOCK`` requests.

    Grid: ``(cdiv(batch, BLOCK),)``.

    accept_index_ptr: ``[batch, accepted_tokens]`` int32/int64 through its two strides.
    accept_lens_ptr / seq_lens_ptr: ``[batch]`` int32/int64, any stride.
    last_correct_ptr / steps_to_track_ptr: ``[batch]`` int64, contiguous, written.
    """
    b = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    in_batch = b < batch
    lens = tl.load(accept_lens_ptr + b * accept_lens_stride, mask=in_batch, other=0).to(tl.int64)
    ok = in_batch & (lens >= 1) & (lens <= accepted_tokens)
    row = accept_index_ptr + b * accept_index_stride0
    base = b * draft_token_num
    last = tl.load(row + (lens - 1) * accept_index_stride1, mask=ok, other=0).to(tl.int64)
    tl.store(last_correct_ptr + b, tl.where(ok, last - base, -1), mask=in_batch)
    if HAS_TRACK:
        pre = tl.load(seq_lens_ptr + b * seq_lens_stride, mask=in_batch, other=-1).to(tl.int64)
        ok = ok & (pre >= 0)
        pre = tl.where(ok, pre, 0)  # lanes that are not ok divide nothing they read
        r = pre % interval
        k = (r + tl.where(ok, lens, 0)) // interval
        cross = ok & (k > 0)
        step = tl.load(row + (k * interval - r - 1) * accept_index_stride1, mask=cross,
                       other=0).to(tl.int64)
        tl.store(steps_to_track_ptr + b, tl.where(cross, step - base, -1), mask=in_batch)


# Requests per program: the batch is small (one program covers up to 128 requests), so the
# launch, not the kernel, is the cost; see docs/design/mamba_commit_indices.md.
BLOCK = 128
NUM_WARPS = 4


def _arguments(accept_index, accept_lens, seq_lens, draft_token_num, mamba_track_interval,
               last_correct, steps_to_track, block=BLOCK):
    """The grid and every kernel parameter, in signature order, of a call on validated inputs
    (``block``: requests per program, a power of two)."""
    batch = accept_lens.shape[0]
    track = seq_lens is not None
    lens_src = seq_lens if track else accept_lens
    return ((batch + block - 1) // block, 1, 1), (
        accept_index, accept_lens, lens_src, last_correct, steps_to_track,
        batch, accept_index.shape[1], draft_token_num, mamba_track_interval if track else 1,
        accept_index.stride(0), accept_index.stride(1), accept_lens.stride(0),
        lens_src.stride(0), track, block,
    )


def _allocate(accept_lens, seq_lens):
    """Both results (the second empty without ``seq_lens``)."""
    batch, device = accept_lens.shape[0], accept_lens.device
    return (torch.empty(batch, dtype=torch.int64, device=device),
            torch.empty(batch if seq_lens is not None else 0, dtype=torch.int64, device=device))


def _run(kernel, real_launch, accept_index, accept_lens, seq_lens, draft_token_num,
         mamba_track_interval, block=BLOCK, num_warps=NUM_WARPS):
    """Allocate both results and launch ``kernel`` (a JIT, wrapped or interpreted one)."""
    results = _allocate(accept_lens, seq_lens)
    grid, args = _arguments(accept_index, accept_lens, seq_lens, draft_token_num,
                            mamba_track_interval, *results, block=block)
    runtime, constexprs = keyword_constexprs(_commit_kernel, args)
    with on_device_of(accept_lens, real_launch):
        kernel[grid](*runtime, **constexprs, num_warps=num_warps)
    return results


def _forward(kernel, real_launch, *args):
    """Validate, then allocate and launch."""
    contract.validate(*args)
    return _run(kernel, real_launch, *args)


# The eager path: the contract's verdict cached per metadata signature, the kernel launched
# through its cached launcher (strictops.ops._runtime.launcher); the same rules and the same launch.
_VALIDATION = CachedValidation(contract.CONTRACT, contract.ARGUMENTS)
_LAUNCHER = Launcher(_commit_kernel)
_OPTIONS = (("num_warps", NUM_WARPS),)


_HOST = HostPath(_VALIDATION)
_HOST_CALL = _HOST.call


def _eager(accept_index, accept_lens, seq_lens, draft_token_num, mamba_track_interval):
    """The plain eager call: the cached verdict, both results, the cached launch; a call it
    served leaves a plan of its signature for the C++ path (strictops.ops._runtime.host_path)."""
    args = (accept_index, accept_lens, seq_lens, draft_token_num, mamba_track_interval)
    _VALIDATION(*args)
    results = _allocate(accept_lens, seq_lens)
    grid, kernel_args = _arguments(*args, *results)
    device = accept_lens.get_device()
    _LAUNCHER(grid, kernel_args, _OPTIONS, device)
    sizes = [(t.shape[0],) for t in results]
    _HOST.register(args, _LAUNCHER, grid, kernel_args, _OPTIONS, device,
                   [(size, torch.int64, False) for size in sizes], results,
                   (results[0], results[1] if seq_lens is not None else None))
    return results


@triton_op(contract.CONTRACT.op, mutates_args=())
def _fused_commit_track_indices(
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    seq_lens: Optional[torch.Tensor],
    draft_token_num: int,
    mamba_track_interval: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    # The body is also the fake: under fake tensors the launch is recorded, not run.
    kernel = wrap_triton(_commit_kernel)
    return _forward(kernel, kernel is _commit_kernel, accept_index, accept_lens, seq_lens,
                    draft_token_num, mamba_track_interval)


def fused_commit_track_indices(
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    seq_lens: Optional[torch.Tensor],
    draft_token_num: int,
    mamba_track_interval: int,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The committed draft step of every request and, with ``seq_lens``, the step to track.

    Parameters
    ----------
    accept_index : torch.Tensor
        ``[batch, accepted_tokens]`` int32/int64 CUDA tensor: accepted verify rows per request.
    accept_lens : torch.Tensor
        ``[batch]`` int32/int64: accepted tokens per request.
    seq_lens : torch.Tensor or None
        ``[batch]`` int32/int64: sequence lengths before this step; None skips tracking.
    draft_token_num : int
        Verify rows per request (>= 1).
    mamba_track_interval : int
        Track interval (>= 1 when ``seq_lens`` is given).

    Returns
    -------
    (last_correct_step_indices, mamba_steps_to_track)
        ``[batch]`` int64 each, new tensors; the second is None without ``seq_lens``. ``-1``
        marks a request with nothing to commit or track (see the module docstring).
    """
    if not torch.compiler.is_compiling():  # the C++ path, for a signature served before
        result = _HOST_CALL(accept_index, accept_lens, seq_lens, draft_token_num,
                            mamba_track_interval)
        if result is not MISS:
            return result
    args = (accept_index, accept_lens, seq_lens, draft_token_num, mamba_track_interval)
    if can_skip_dispatcher(accept_index, accept_lens, seq_lens):
        last_correct, steps_to_track = _eager(*args)
    else:
        last_correct, steps_to_track = torch.ops.strictops.fused_commit_track_indices(*args)
    return last_correct, (steps_to_track if seq_lens is not None else None)


def launch_interpreted(accept_index, accept_lens, seq_lens, draft_token_num,
                       mamba_track_interval, reverse_programs=False, block=BLOCK):
    """Run the kernel through the Triton interpreter on CPU tensors (tests, self-check), with
    ``block`` requests per program; returns what the op returns."""
    with interpreted(_commit_kernel, reverse_programs) as kernel:
        last_correct, steps_to_track = _run(kernel, False, accept_index, accept_lens, seq_lens,
                                            draft_token_num, mamba_track_interval, block)
    return last_correct, (steps_to_track if seq_lens is not None else None)


def reference(accept_index, accept_lens, seq_lens, draft_token_num, mamba_track_interval):
    """Plain-PyTorch reference (int64 arithmetic); returns what the op returns."""
    batch, n = accept_index.shape
    b = torch.arange(batch, device=accept_lens.device)
    lens = accept_lens.long()
    ok = (lens >= 1) & (lens <= n)
    base = b * draft_token_num
    index = accept_index.long()

    def pick(col, where):
        col = torch.where(where, col, 0)
        if n == 0:
            return torch.full_like(col, -1)
        value = index.gather(1, col.clamp(0, n - 1)[:, None])[:, 0] - base
        return torch.where(where, value, -1)

    last_correct = pick(lens - 1, ok)
    if seq_lens is None:
        return last_correct, None
    pre = seq_lens.long()
    ok = ok & (pre >= 0)
    interval = mamba_track_interval
    r = torch.where(ok, pre, 0) % interval
    k = (r + torch.where(ok, lens, 0)) // interval
    return last_correct, pick(k * interval - r - 1, ok & (k > 0))


def example_inputs(device: str, small: bool, generator: torch.Generator) -> dict:
    """Keyword arguments of a valid call whose values reach every path of the kernel.

    Accepted rows within each request's verify rows; accept lengths include 0, ``accepted_tokens + 1`` and a negative
    value (all give -1), sequence lengths include a negative one, and the rest cross or do not
    cross a multiple of the interval. ``small`` gives pairwise-distinct sizes >= 2 (for
    dynamic-shape tracing) on a batch that spans several programs only when not small.
    """
    batch, n, dtn, interval = (11, 5, 6, 4) if small else (300, 4, 4, 8)
    rows = torch.arange(batch)[:, None] * dtn
    accept_index = rows + torch.randint(0, dtn, (batch, n), generator=generator)
    accept_index[4, -1] = -1  # padding past the accepted tokens, as the verify step writes
    accept_lens = torch.randint(1, n + 1, (batch,), generator=generator)
    seq_lens = torch.randint(0, 4 * interval, (batch,), generator=generator)
    accept_lens[0], accept_lens[1], accept_lens[2] = 0, n + 1, -3
    seq_lens[3] = -1
    to = {"device": device}
    return {"accept_index": accept_index.to(torch.int32).to(**to),
            "accept_lens": accept_lens.to(**to), "seq_lens": seq_lens.to(torch.int32).to(**to),
            "draft_token_num": dtn, "mamba_track_interval": interval}


def selfcheck_result(on_gpu: bool) -> tuple[bool, str]:
    """The self-check's result row: both results equal the reference bit for bit."""
    device = "cuda:0" if on_gpu else "cpu"
    args = example_inputs(device, not on_gpu, torch.Generator().manual_seed(0))
    run = fused_commit_track_indices if on_gpu else (
        lambda **kw: launch_interpreted(**kw, reverse_programs=True))
    got, want = run(**args), reference(**args)
    passed = all(torch.equal(g, w) for g, w in zip(got, want))
    where = "GPU cuda:0" if on_gpu else "Triton interpreter"
    return passed, f"{where}, batch {args['accept_lens'].shape[0]}, both results"
