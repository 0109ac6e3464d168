"""The after-verify path under torch.compile and CUDA graphs.

CPU (CI), on fake CUDA tensors: ``scatter_mamba_states_after_mtp_verify``, alone and in the
whole step (``fused_commit_track_indices``, the scatter, ``track_mamba_states_all_layers``),
traces as one graph with no break, and three pairwise-distinct batch sizes (with their
accepted lengths) reuse it; a bad cache fails at trace time with the scatter's message.

GPU (``-m gpu``): Inductor equals the reference; a CUDA graph of the whole step, captured once,
replays new indices and lengths and equals the reference each time.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from strictops.meta.mamba import conv_window_scatter as conv_contract
from strictops.meta._specs import TensorSpec
from strictops.meta.testing import build, capture_cuda_graph, dynamo_error_text, fake_mode, gpu
from strictops.ops.mamba.conv_window_scatter import window_view
from strictops.ops.mamba.after_verify import MambaCaches
from strictops.ops import (
    fused_commit_track_indices,
    scatter_mamba_states_after_mtp_verify,
    track_mamba_states_all_layers,
)
from strictops.ops.mamba import after_verify as mamba_after_verify
from strictops.ops.mamba import commit_indices as mamba_commit_indices
from strictops.ops.mamba import track_states as mamba_track_states

# Fixed model sizes (pairwise distinct, none equal to a batch size below).
LAYERS, CACHE, DRAFT, SSM_STATE, CONV_TYPES, INTERVAL = 3, 40, 4, (5, 6), [(11, 2), (17, 5)], 8
BATCHES = (7, 9, 13)


def _spec(batch: int, device: str = "cuda:0") -> dict:
    f32, i64, i32 = torch.float32, torch.int64, torch.int32
    spec = {
        "temporal": TensorSpec((LAYERS, CACHE, *SSM_STATE), f32, device),
        "intermediate_ssm": TensorSpec((LAYERS, batch, DRAFT, *SSM_STATE), f32, device),
        "accept_index": TensorSpec((batch, DRAFT), i32, device),
        "accept_lens": TensorSpec((batch,), i32, device),
        "seq_lens": TensorSpec((batch,), i64, device),
        "state_indices_tensor": TensorSpec((batch,), i32, device),
        "mamba_track_indices": TensorSpec((batch,), i64, device),
        "mamba_track_mask": TensorSpec((batch,), torch.bool, device),
    }
    for k, (dim, km1) in enumerate(CONV_TYPES):
        spec[f"conv{k}"] = TensorSpec((LAYERS, CACHE, dim, km1), torch.bfloat16, device)
        spec[f"window{k}"] = conv_contract.window_view_spec(LAYERS, batch, DRAFT, dim, km1,
                                                           torch.bfloat16, device)
    return spec


def _split(args: dict) -> tuple[MambaCaches, dict]:
    n = len(CONV_TYPES)
    caches = MambaCaches(args.pop("temporal"), args.pop("intermediate_ssm"),
                    [args.pop(f"conv{k}") for k in range(n)],
                    [args.pop(f"window{k}") for k in range(n)])
    return caches, args


def scatter_only(caches, accept_index, accept_lens, seq_lens, state_indices_tensor,
                 mamba_track_indices, mamba_track_mask):
    steps = accept_lens.long() - 1
    scatter_mamba_states_after_mtp_verify(caches, state_indices_tensor, steps,
                                          mamba_track_indices, steps - 1)
    return caches.temporal.sum()


def whole_step(caches, accept_index, accept_lens, seq_lens, state_indices_tensor,
               mamba_track_indices, mamba_track_mask):
    """The after-verify step: commit indices, the scatter, then tracking (its conv pool is the
    first conv type's, its SSM pool the temporal cache)."""
    last, to_track = fused_commit_track_indices(accept_index, accept_lens, seq_lens, DRAFT,
                                                INTERVAL)
    scatter_mamba_states_after_mtp_verify(caches, state_indices_tensor, last,
                                          mamba_track_indices, to_track)
    track_mamba_states_all_layers(caches.conv[0], caches.temporal, state_indices_tensor,
                                  mamba_track_mask, mamba_track_indices,
                                  state_indices_tensor.shape[0])
    return last, to_track


@pytest.mark.parametrize("fn", [scatter_only, whole_step])
def test_one_graph_no_break_no_recompile_across_batch_sizes(fn):
    counter = CompileCounter()
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    with fake_mode():
        for batch in BATCHES:
            caches, args = _split(build(_spec(batch)))
            compiled(caches, **args)
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"
    assert not torch._dynamo.utils.counters["graph_break"]


def test_a_bad_cache_fails_at_trace_time_with_the_scatter_message():
    compiled = torch.compile(scatter_only, backend="eager", fullgraph=True, dynamic=True)
    with fake_mode():
        caches, args = _split(build(_spec(BATCHES[0])))
        caches.intermediate_ssm = torch.empty(LAYERS + 1, BATCHES[0], DRAFT, *SSM_STATE,
                                              device="cuda:0")
        with pytest.raises(Exception) as info:
            compiled(caches, **args)
    assert "Layer dimension mismatch: dst.shape[0]=3 vs src.shape[0]=4" in dynamo_error_text(
        info.value)


# --------------------------------------------------------------------------------------------
# GPU


def _real(seed: int, batch: int) -> tuple[MambaCaches, dict]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    args = {}
    for name, s in _spec(batch, "cuda").items():
        if not name.startswith("window"):
            args[name] = torch.randn(s.shape, device="cuda", generator=gen).to(s.dtype)
    for k, (dim, km1) in enumerate(CONV_TYPES):  # overlapping views of shared buffers
        shared = torch.randn(LAYERS, batch, dim, DRAFT + km1 - 1, device="cuda",
                             generator=gen).to(torch.bfloat16)
        args[f"window{k}"] = window_view(shared, DRAFT, km1)
    b = torch.arange(batch, device="cuda")[:, None] * DRAFT
    args["accept_index"] = (b + torch.randint(0, DRAFT, (batch, DRAFT), device="cuda",
                                              generator=gen)).to(torch.int32)
    args["accept_lens"] = torch.randint(0, DRAFT + 1, (batch,), device="cuda", generator=gen,
                                        dtype=torch.int32)
    args["seq_lens"] = torch.randint(0, 100, (batch,), device="cuda", generator=gen)
    args["state_indices_tensor"] = torch.randperm(CACHE // 2, device="cuda",
                                                  generator=gen)[:batch].to(torch.int32)
    args["mamba_track_indices"] = (torch.randperm(CACHE // 2, device="cuda", generator=gen)
                                   [:batch] + CACHE // 2)
    args["mamba_track_mask"] = torch.rand(batch, device="cuda", generator=gen) < 0.3
    return _split(args)


def _expected(caches: MambaCaches, args: dict):
    last, to_track = mamba_commit_indices.reference(args["accept_index"], args["accept_lens"],
                                                    args["seq_lens"], DRAFT, INTERVAL)
    ssm, convs = mamba_after_verify.reference(caches, args["state_indices_tensor"], last,
                                              args["mamba_track_indices"], to_track)
    conv0, ssm = mamba_track_states.reference(
        convs[0], ssm, args["state_indices_tensor"], args["mamba_track_mask"],
        args["mamba_track_indices"], args["state_indices_tensor"].shape[0])
    return last, to_track, ssm, [conv0, *convs[1:]]


def _check(caches: MambaCaches, out, expected) -> None:
    last, to_track, ssm, convs = expected
    assert torch.equal(out[0], last) and torch.equal(out[1], to_track)
    assert torch.equal(caches.temporal, ssm)
    assert all(torch.equal(c, e) for c, e in zip(caches.conv, convs))


@gpu
def test_gpu_inductor_equals_reference():
    compiled = torch.compile(whole_step, fullgraph=True, dynamic=True)
    for seed, batch in enumerate(BATCHES):
        caches, args = _real(seed, batch)
        expected = _expected(caches, args)
        _check(caches, compiled(caches, **args), expected)


@gpu
def test_gpu_cuda_graph_of_the_whole_step_replays_new_indices():
    caches, static = _real(0, BATCHES[1])
    graph, out = capture_cuda_graph(whole_step, caches, **static)
    for seed in range(1, 5):
        _, fresh = _real(seed, BATCHES[1])
        for name, t in fresh.items():
            static[name].copy_(t)
        expected = _expected(caches, static)
        graph.replay()
        _check(caches, out, expected)
