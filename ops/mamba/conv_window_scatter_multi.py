"""Fused conv-window scatter over several (conv, window) pairs and two request sets, in one
launch.

sglang commits the accepted conv windows of every conv type (one ``(conv_states,
conv_window)`` pair each) and, in the same launch, the windows of the requests that cross a
tracking interval (a second request set). Each pair is what ``fused_conv_window_scatter_with_mask``
scatters (``strictops.ops.mamba.conv_window_scatter``, whose device functions this kernel calls).

Registration: ``torch.library.triton_op`` over two ``Tensor[]`` (``dsts``, ``srcs``), as for
the one-pair op: the body validates through
``strictops.meta.mamba.conv_window_scatter_multi`` and is
the fake. Every pair's tensors are kernel arguments of their own (up to eight pairs, unused
ones ``None``): no table of ``data_ptr()`` values, so a traced or captured call reads the
tensors it is given.

Semantics: the requests of set 1 (``dst_indices_raw``, ``step_indices_raw``; request ``i``
reads row ``i``) followed by those of set 2 (``dst_indices2_raw``, ``step_indices2_raw``; its
request ``j`` reads row ``j``) form one sequence; for every pair ``(dst, src)``, every layer
``l`` and every request ``r`` of it whose indices are all in range::

    dst[l, slot_r] = src[l, row_r, step_r]

and when several valid requests name one slot, the last in the sequence wins: the result of
``fused_conv_window_scatter_with_mask`` over every pair with set 1, then again with set 2.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from strictops.meta.mamba import conv_window_scatter_multi as contract
from strictops.meta._contract import sym_max

from strictops.ops.mamba import conv_window_scatter as one
from strictops.ops._runtime.dispatch import can_skip_dispatcher
from strictops.ops._runtime.host_path import MISS
from strictops.ops._runtime.interpret import interpreted
from strictops.ops._runtime.kernel_path import KernelPath
from strictops.ops.mamba.conv_window_scatter import copy_window
from strictops.ops.mamba.state_scatter import request_is_valid, written_later

__all__ = [
    "fused_conv_window_scatter_multi",
    "reference",
    "launch_interpreted",
    "example_inputs",
]


@triton.jit
def _scatter_multi_kernel(
    dst_idx_ptr, step_idx_ptr, dst_idx2_ptr, step_idx2_ptr,
    n1, n2, num_layers, cache_size, spec_size, draft_tokens, chunks,
    dst_idx_stride, step_idx_stride, dst_idx2_stride, step_idx2_stride,
    dst0, src0, dim0, km1_0, dl0, ds0, sl0, sr0, ss0, sd0, sw0,
    dst1, src1, dim1, km1_1, dl1, ds1, sl1, sr1, ss1, sd1, sw1,
    dst2, src2, dim2, km1_2, dl2, ds2, sl2, sr2, ss2, sd2, sw2,
    dst3, src3, dim3, km1_3, dl3, ds3, sl3, sr3, ss3, sd3, sw3,
    dst4, src4, dim4, km1_4, dl4, ds4, sl4, sr4, ss4, sd4, sw4,
    dst5, src5, dim5, km1_5, dl5, ds5, sl5, sr5, ss5, sd5, sw5,
    dst6, src6, dim6, km1_6, dl6, ds6, sl6, sr6, ss6, sd6, sw6,
    dst7, src7, dim7, km1_7, dl7, ds7, sl7, sr7, ss7, sd7, sw7,
    NUM_PAIRS: tl.constexpr, BLOCK: tl.constexpr, LAYERS: tl.constexpr,
    RUN: tl.constexpr, STREAM: tl.constexpr, I32_REACH: tl.constexpr, SCAN: tl.constexpr,
):
    """Copy ``BLOCK`` elements of one request's window of one pair in ``LAYERS`` layers.

    Grid: ``((n1 + n2) * chunks, cdiv(num_layers, LAYERS), NUM_PAIRS)``, ``chunks`` the most
    ``cdiv(dim_k * km1_k, BLOCK)`` of any pair (a smaller pair's extra chunks mask every
    element off).

    Pair ``k``: ``dst{k}`` ``[num_layers, cache_size, dim{k}, km1_{k}]`` through its layer and
    slot strides ``dl{k}``, ``ds{k}``, entry contiguous; ``src{k}``
    ``[num_layers, spec_size, draft_tokens, dim{k}, km1_{k}]`` through its five strides
    ``sl{k}, sr{k}, ss{k}, sd{k}, sw{k}``. Pairs ``>= NUM_PAIRS`` are ``None``.
    Index sets: ``[n1]`` and ``[n2]`` int32 or int64 tensors, any stride.
    """
    pid = tl.program_id(0)
    layer0 = tl.program_id(1).to(tl.int64) * LAYERS
    pair = tl.program_id(2)
    req = pid // chunks
    chunk = (pid - req * chunks).to(tl.int64)

    in2 = req >= n1
    i1 = req.to(tl.int64)
    i2 = i1 - n1
    step = tl.where(in2, tl.load(step_idx2_ptr + i2 * step_idx2_stride, mask=in2, other=-1),
                    tl.load(step_idx_ptr + i1 * step_idx_stride, mask=not in2, other=-1))
    slot = tl.where(in2, tl.load(dst_idx2_ptr + i2 * dst_idx2_stride, mask=in2, other=-1),
                    tl.load(dst_idx_ptr + i1 * dst_idx_stride, mask=not in2, other=-1))
    step = step.to(tl.int64)
    slot = slot.to(tl.int64)
    row = tl.where(in2, i2, i1)
    valid = request_is_valid(slot, row, step, cache_size, spec_size, draft_tokens)
    # Last writer wins over set 1 followed by set 2.
    later = written_later(slot, req + 1, n1, dst_idx_ptr, step_idx_ptr, step_idx_ptr,
                          dst_idx_stride, step_idx_stride, 0, cache_size, spec_size,
                          draft_tokens, False, SCAN)
    later2 = written_later(slot, tl.maximum(req + 1 - n1, 0), n2, dst_idx2_ptr, step_idx2_ptr,
                           step_idx2_ptr, dst_idx2_stride, step_idx2_stride, 0, cache_size,
                           spec_size, draft_tokens, False, SCAN)
    if valid and not (later or later2):
        if pair == 0:
            copy_window(dst0, src0, layer0, num_layers, slot, row, step, chunk, dim0,
                        km1_0, dl0, ds0, sl0, sr0, ss0, sd0, sw0, BLOCK, LAYERS, RUN,
                        STREAM, I32_REACH)
        if NUM_PAIRS > 1:
            if pair == 1:
                copy_window(dst1, src1, layer0, num_layers, slot, row, step, chunk, dim1,
                            km1_1, dl1, ds1, sl1, sr1, ss1, sd1, sw1, BLOCK, LAYERS, RUN,
                            STREAM, I32_REACH)
        if NUM_PAIRS > 2:
            if pair == 2:
                copy_window(dst2, src2, layer0, num_layers, slot, row, step, chunk, dim2,
                            km1_2, dl2, ds2, sl2, sr2, ss2, sd2, sw2, BLOCK, LAYERS, RUN,
                            STREAM, I32_REACH)
        if NUM_PAIRS > 3:
            if pair == 3:
                copy_window(dst3, src3, layer0, num_layers, slot, row, step, chunk, dim3,
                            km1_3, dl3, ds3, sl3, sr3, ss3, sd3, sw3, BLOCK, LAYERS, RUN,
                            STREAM, I32_REACH)
        if NUM_PAIRS > 4:
            if pair == 4:
                copy_window(dst4, src4, layer0, num_layers, slot, row, step, chunk, dim4,
                            km1_4, dl4, ds4, sl4, sr4, ss4, sd4, sw4, BLOCK, LAYERS, RUN,
                            STREAM, I32_REACH)
        if NUM_PAIRS > 5:
            if pair == 5:
                copy_window(dst5, src5, layer0, num_layers, slot, row, step, chunk, dim5,
                            km1_5, dl5, ds5, sl5, sr5, ss5, sd5, sw5, BLOCK, LAYERS, RUN,
                            STREAM, I32_REACH)
        if NUM_PAIRS > 6:
            if pair == 6:
                copy_window(dst6, src6, layer0, num_layers, slot, row, step, chunk, dim6,
                            km1_6, dl6, ds6, sl6, sr6, ss6, sd6, sw6, BLOCK, LAYERS, RUN,
                            STREAM, I32_REACH)
        if NUM_PAIRS > 7:
            if pair == 7:
                copy_window(dst7, src7, layer0, num_layers, slot, row, step, chunk, dim7,
                            km1_7, dl7, ds7, sl7, sr7, ss7, sd7, sw7, BLOCK, LAYERS, RUN,
                            STREAM, I32_REACH)


# Arguments of one pair: dst, src, dim, km1, two dst strides, five src strides.
PAIR_ARGS = 11


def _arguments(pairs, dst_indices_raw, step_indices_raw, dst_indices2_raw, step_indices2_raw,
               block_bytes=one.TUNING["block_bytes"], layers=one.TUNING["layers"],
               run_bytes=one.TUNING["run_bytes"], stream=one.TUNING["stream"],
               i32_reach=one.I32_REACH):
    """The grid and every kernel parameter, in signature order, of a call on validated
    inputs."""
    esize = max(d.element_size() for d, _ in pairs)
    block = one.block_elements(esize, block_bytes)
    pair_args, chunks = [], 1
    for dst, src in pairs:
        shape, d, s = dst.shape, dst.stride(), src.stride()
        pair_args += [dst, src, shape[2], shape[3], d[0], d[1], s[0], s[1], s[2], s[3], s[4]]
        chunks = sym_max(chunks, (shape[2] * shape[3] + block - 1) // block)
    pair_args += [None] * (PAIR_ARGS * (contract.MAX_PAIRS - len(pairs)))
    if step_indices2_raw is None:  # no second set: any tensors, never read
        dst_indices2_raw, step_indices2_raw = dst_indices_raw, step_indices_raw
        n2 = 0
    else:
        n2 = step_indices2_raw.shape[0]
    n1 = step_indices_raw.shape[0]
    dst0, src0 = pairs[0]
    grid = ((n1 + n2) * chunks, (dst0.shape[0] + layers - 1) // layers, len(pairs))
    return grid, (
        dst_indices_raw, step_indices_raw, dst_indices2_raw, step_indices2_raw,
        n1, n2, dst0.shape[0], dst0.shape[1], src0.shape[1], src0.shape[2], chunks,
        dst_indices_raw.stride(0), step_indices_raw.stride(0), dst_indices2_raw.stride(0),
        step_indices2_raw.stride(0),
        *pair_args,
        len(pairs), block, layers, one.run_elements(esize, run_bytes), stream, i32_reach,
        one.SCAN,
    )


def _first_dst(args):
    """The tensor the launch runs on the device of: the first pair's ``dst``."""
    return args[0][0][0]


def _dsts(args):
    """The tensors a call writes: every pair's ``dst``."""
    return [pair[0] for pair in args[0]]


# The launch paths (strictops.ops._runtime.kernel_path), as the one-pair op's: the op's body (also
# its fake) validates in full and launches through ``kernel[grid]``; a plain eager call takes the
# contract's verdict cached per metadata signature (each pair's tensors' metadata in order; the
# storage-reach rows run on every call) and the cached launcher, and leaves a plan for the C++
# path (keyed by the list of pairs' items, in order).
_PATH = KernelPath(_scatter_multi_kernel, contract.CONTRACT, contract.ARGUMENTS, _arguments,
                   one.TUNING["num_warps"], _first_dst, writes=_dsts)
_launch, _forward, _eager = _PATH.launch, _PATH.forward, _PATH.eager
_HOST_CALL = _PATH.host.call
_VALIDATION, _LAUNCHER, _OPTIONS = _PATH.validation, _PATH.launcher, _PATH.options


@triton_op(contract.CONTRACT.op, mutates_args=contract.CONTRACT.mutates)
def _fused_conv_window_scatter_multi(
    dsts: List[torch.Tensor],
    srcs: List[torch.Tensor],
    dst_indices_raw: torch.Tensor,
    step_indices_raw: torch.Tensor,
    dst_indices2_raw: Optional[torch.Tensor] = None,
    step_indices2_raw: Optional[torch.Tensor] = None,
) -> None:
    # The body is also the fake (see strictops.ops.mamba.conv_window_scatter). The public function
    # passes lists of one length; a direct call with others fails in zip, before the contract.
    kernel = wrap_triton(_scatter_multi_kernel)
    pairs = list(zip(dsts, srcs, strict=True))
    _forward(kernel, kernel is _scatter_multi_kernel, pairs, dst_indices_raw, step_indices_raw,
             dst_indices2_raw, step_indices2_raw)


def op_arguments(pairs, dst_indices_raw, step_indices_raw, dst_indices2_raw=None,
                 step_indices2_raw=None) -> dict:
    """The op's (``torch.ops.strictops.fused_conv_window_scatter_multi``) arguments for a call
    of the public function: the pairs split into ``dsts`` and ``srcs``."""
    return {"dsts": [p[0] for p in pairs], "srcs": [p[1] for p in pairs],
            "dst_indices_raw": dst_indices_raw, "step_indices_raw": step_indices_raw,
            "dst_indices2_raw": dst_indices2_raw, "step_indices2_raw": step_indices2_raw}


def public_arguments(dsts, srcs, dst_indices_raw, step_indices_raw, dst_indices2_raw=None,
                     step_indices2_raw=None) -> dict:
    """The public function's arguments (its contract's) for a call of the op: the inverse of
    :func:`op_arguments`."""
    return {"pairs": list(zip(dsts, srcs)), "dst_indices_raw": dst_indices_raw,
            "step_indices_raw": step_indices_raw, "dst_indices2_raw": dst_indices2_raw,
            "step_indices2_raw": step_indices2_raw}


def fused_conv_window_scatter_multi(
    pairs,
    dst_indices_raw: torch.Tensor,
    step_indices_raw: torch.Tensor,
    dst_indices2_raw: Optional[torch.Tensor] = None,
    step_indices2_raw: Optional[torch.Tensor] = None,
) -> None:
    """Scatter the accepted conv windows of every (conv_states, conv_window) pair, for one or
    two request sets, in one launch, in place.

    Parameters
    ----------
    pairs : sequence of (torch.Tensor, torch.Tensor)
        1 to 8 pairs ``(dst, src)``, each as ``fused_conv_window_scatter_with_mask`` takes
        them: ``dst`` ``[num_layers, cache_size, dim, K-1]`` (written in place, entry
        contiguous), ``src`` ``[num_layers, spec_size, draft_tokens, dim, K-1]`` (any strides).
        All pairs share ``num_layers``, ``cache_size``, ``spec_size``, ``draft_tokens`` and
        one CUDA device; ``dim``, ``K`` and the dtype may differ between pairs.
    dst_indices_raw, step_indices_raw : torch.Tensor
        ``[n1]`` int32/int64: slot and accepted step of the first set's requests (request
        ``i`` reads row ``i``; a step ``< 0`` skips it).
    dst_indices2_raw, step_indices2_raw : torch.Tensor, optional
        ``[n2]`` int32/int64, both or neither: the second set (its request ``j`` reads row
        ``j``), applied after the first.

    Notes
    -----
    For every pair: ``dst[l, slot_r] = src[l, row_r, step_r]`` for each request of set 1 then
    set 2 whose indices are all in range; others are skipped without touching memory, and the
    last valid request naming a slot wins. One kernel launch, no host sync, no copy of the
    index tensors, no pointer table. Bad metadata raises ``ValueError`` before launch in eager
    mode and at trace time under ``torch.compile``/``torch.export``.
    """
    pairs = [(dst, src) for dst, src in pairs]
    if not torch.compiler.is_compiling() and _HOST_CALL(  # a signature served before
            pairs, dst_indices_raw, step_indices_raw, dst_indices2_raw,
            step_indices2_raw) is not MISS:
        return
    if can_skip_dispatcher(*(t for pair in pairs for t in pair), dst_indices_raw,
                           step_indices_raw, dst_indices2_raw, step_indices2_raw):
        _eager(pairs, dst_indices_raw, step_indices_raw, dst_indices2_raw, step_indices2_raw)
        for dst, _ in pairs:
            torch.autograd.graph.increment_version(dst)  # what the dispatcher does for a(!)
        return
    torch.ops.strictops.fused_conv_window_scatter_multi(
        **op_arguments(pairs, dst_indices_raw, step_indices_raw, dst_indices2_raw,
                       step_indices2_raw))


def launch_interpreted(pairs, dst_indices_raw, step_indices_raw, dst_indices2_raw=None,
                       step_indices2_raw=None, reverse_programs=False, **tuning):
    """Run the kernel through the Triton interpreter on CPU tensors (tests, self-check);
    ``reverse_programs`` runs the programs in reverse grid order (see ``_interpret``)."""
    with interpreted(_scatter_multi_kernel, reverse_programs) as kernel:
        _launch(kernel, pairs, dst_indices_raw, step_indices_raw, dst_indices2_raw,
                step_indices2_raw, **tuning)


def example_inputs(device: str, small: bool, generator: torch.Generator) -> dict:
    """Keyword arguments of a valid call: two pairs of different dims, widths and dtypes
    (``small``: interpreter-sized, pairwise-distinct sizes >= 2), and two request sets whose
    values reach every path of the kernel: one negative and one out-of-range value in each
    column, a slot named by both sets (set 2 must win), a slot named twice within set 1 by
    valid requests (the later must win)."""
    if small:
        L, cache, spec, draft, windows = 2, 9, 7, 3, ((19, 5, torch.bfloat16), (11, 2, torch.float32))
        n1, n2 = 6, 5
    else:
        L, cache, spec, draft = 4, 256, 64, 4
        windows, n1, n2 = ((2048, 3, torch.bfloat16), (1024, 3, torch.bfloat16)), 48, 48
    slot1 = torch.randperm(cache, generator=generator)[:n1]
    step1 = torch.randint(0, draft, (n1,), generator=generator)
    slot2 = torch.randperm(cache, generator=generator)[:n2]
    step2 = torch.randint(0, draft, (n2,), generator=generator)
    slot1[0], step1[1], slot2[0], step2[1] = -1, draft, cache, -1
    slot1[3] = slot1[2]  # valid twice in set 1: request 3 wins
    slot2[2] = slot1[4]  # set 2 overwrites set 1
    dsts, srcs = [], []
    for dim, km1, dtype in windows:
        dsts.append(torch.randn(L, cache, dim, km1, generator=generator)
                    .to(device=device, dtype=dtype))
        shared = torch.randn(L, spec, dim, draft + km1 - 1, generator=generator)
        srcs.append(one.window_view(shared.to(device=device, dtype=dtype), draft, km1))
    return {
        "pairs": list(zip(dsts, srcs)),
        "dst_indices_raw": slot1.to(device=device, dtype=torch.int32),
        "step_indices_raw": step1.to(device=device, dtype=torch.int64),
        "dst_indices2_raw": slot2.to(device=device, dtype=torch.int64),
        "step_indices2_raw": step2.to(device=device, dtype=torch.int32),
    }


def reference(pairs, dst_indices_raw, step_indices_raw, dst_indices2_raw=None,
              step_indices2_raw=None):
    """Plain-PyTorch reference: new tensors equal to the pairs' ``dst`` after the op: for each
    pair, the one-pair op's reference with set 1, then with set 2."""
    out = []
    for dst, src in pairs:
        dst = one.reference(dst, src, dst_indices_raw, step_indices_raw)
        if step_indices2_raw is not None:
            dst = one.reference(dst, src, dst_indices2_raw, step_indices2_raw)
        out.append(dst)
    return out


def selfcheck_result(on_gpu: bool) -> tuple[bool, str]:
    """The self-check's exact-result check: the example call (on the GPU, or interpreted in
    reverse program order) leaves every pair's ``dst`` equal to the reference, and writes."""
    args = example_inputs("cuda:0" if on_gpu else "cpu", not on_gpu,
                          torch.Generator().manual_seed(0))
    before = [d.clone() for d, _ in args["pairs"]]
    expected = reference(**args)
    if on_gpu:
        fused_conv_window_scatter_multi(**args)
    else:
        launch_interpreted(**args, reverse_programs=True)
    written = any(not torch.equal(a, b) for a, b in zip(expected, before))
    exact = all(torch.equal(d, e) for (d, _), e in zip(args["pairs"], expected))
    where = "GPU cuda:0" if on_gpu else "Triton interpreter"
    return written and exact, f"{where}, {len(before)} pairs" + ("" if written else ": writes nothing")
