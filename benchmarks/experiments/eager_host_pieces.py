"""Experiment: where an eager call's host time goes, piece by piece, on this machine's GPU.

Times (``timeit``, best of five rounds, microseconds per call; no synchronisation inside, so
these are host costs) the pieces of each op's eager path at its smallest benchmark shape: the
dispatch gate, the contract in full and cached, the allocations, the launch through
``JITFunction.run`` and through the cached launcher, and the whole path before (validation in
full, ``kernel[grid]``) and after. The GPU runs the launched kernels meanwhile; each round of
calls is short enough for the launch queue.

    python benchmarks/experiments/eager_host_pieces.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import timeit

import torch

from strictops.meta import mamba_state_scatter as mss_contract
from strictops.meta import sparse_mla_prefill as smp
from strictops.meta._contract import CachedValidation
from strictops.meta.transport_pool import data_start
from strictops.ops import TransportPool
from strictops.ops import mamba_state_scatter as mss
from strictops.ops import sparse_mla_prefill as sparse
from strictops.ops import transport_pool as tp
from strictops.ops._dispatch import can_skip_dispatcher

ws = sparse._sparse_mla_sm90  # the sm_90 launch path; None on a Triton without Gluon

CALLS = 200


def per_call_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    best = min(timeit.repeat(fn, number=CALLS, repeat=5)) / CALLS * 1e6
    torch.cuda.synchronize()
    return best


def sparse_pieces() -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    dims = smp.Dims(s_q=64, s_kv=8192, h_q=128, d_qk=576, topk=512, device="cuda")
    a = sparse.random_inputs(dims, gen, invalid_fraction=0.0, edge_rows=False)
    args = tuple(a[n] for n in smp.ARGUMENTS)
    q = a["q"]
    s_q, h_q, _ = q.shape
    out, ml, lse = sparse.sparse_mla_q8kv8_prefill_fwd(*args[:9])
    cached = CachedValidation(smp.CONTRACT, smp.ARGUMENTS)
    launch_args = (q, a["kv"], a["indices"], a["sm_scale"], a["q_scale"], a["kv_scale"], None,
                   None, out, ml, lse, None)
    gluon = sparse.warp_specialized(q)
    grid, runtime = sparse._runtime_arguments(*launch_args)
    return {
        "kernel": "gluon" if gluon else "triton",
        "gate": per_call_us(lambda: can_skip_dispatcher(*(t for t in args if t is None or
                                                          isinstance(t, torch.Tensor)))),
        "contract_full": per_call_us(lambda: smp.validate(*args)),
        "contract_cached": per_call_us(lambda: cached(*args)),
        "signature": per_call_us(lambda: cached.signature(*args)),
        "empty_out": per_call_us(lambda: torch.empty((s_q, h_q, 512), dtype=torch.bfloat16,
                                                     device=q.device)),
        "empty_stats_x2": per_call_us(lambda: (
            torch.empty((s_q, h_q), dtype=torch.float32, device=q.device),
            torch.empty((s_q, h_q), dtype=torch.float32, device=q.device))),
        "empty_stats_joint_unbind": per_call_us(lambda: torch.empty(
            (2, s_q, h_q), dtype=torch.float32, device=q.device).unbind(0)),
        "launch_jit": per_call_us(
            (lambda: ws.launch(*launch_args)) if gluon else
            (lambda: sparse._launch(sparse._sparse_mla_prefill_kernel, *launch_args))),
        "launch_cached": per_call_us(
            (lambda: ws.launch_eager(grid, runtime, 576, False, False, False, 0)) if gluon else
            (lambda: sparse._LAUNCHER(grid, (*runtime, 576, False, False, False, 64, 64),
                                      (("num_warps", 8), ("num_stages", 2)), 0))),
        "path_before": per_call_us(lambda: sparse._forward(sparse._sparse_mla_prefill_kernel,
                                                           True, *args)),
        "path_after": per_call_us(lambda: sparse._eager(*args)),
        "public_no_out": per_call_us(lambda: sparse.sparse_mla_q8kv8_prefill_fwd(*args[:9])),
        "public_out": per_call_us(lambda: sparse.sparse_mla_q8kv8_prefill_fwd(
            *args[:9], out=out, max_logits=ml, lse=lse)),
        "dispatcher_op": per_call_us(lambda: torch.ops.strictops.sparse_mla_q8kv8_prefill_fwd(
            *args)),
    }


def mamba_pieces() -> dict:
    dst = torch.zeros(36, 512, 8, 128, 128, device="cuda")
    src = torch.zeros(36, 1, 4, 8, 128, 128, device="cuda")
    slots = torch.zeros(1, dtype=torch.int32, device="cuda")
    steps = torch.zeros(1, dtype=torch.int32, device="cuda")
    args = (dst, src, slots, steps, None)
    cached = CachedValidation(mss_contract.CONTRACT, mss_contract.ARGUMENTS)
    grid, kernel_args = mss._arguments(*args)
    return {
        "gate": per_call_us(lambda: can_skip_dispatcher(*args)),
        "contract_full": per_call_us(lambda: mss_contract.validate(*args)),
        "contract_cached": per_call_us(lambda: cached(*args)),
        "arguments": per_call_us(lambda: mss._arguments(*args)),
        "launch_jit": per_call_us(lambda: mss._launch(mss._scatter_kernel, *args)),
        "launch_cached": per_call_us(lambda: mss._LAUNCHER(grid, kernel_args, mss._OPTIONS, 0)),
        "path_before": per_call_us(lambda: mss._forward(mss._scatter_kernel, True, *args)),
        "path_after": per_call_us(lambda: mss._eager(*args)),
        "public": per_call_us(lambda: mss.fused_mamba_state_scatter_with_mask(*args)),
    }


def transport_pieces() -> dict:
    pool = TransportPool(data_start(64, 2) + (4 << 20), device="cuda:0", consumer_count=2,
                         max_inflight_slices=64, recycle_interval=None, name="pieces")
    out = {}
    for name, nbytes in (("64KiB", 64 << 10), ("1MiB", 1 << 20), ("2MiB", 2 << 20)):
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        lease = pool.lease(nbytes)
        state = pool._state[lease.slot]

        def copy_tensor():
            leased, _ = pool.copy_tensor(src)
            pool.release(leased)

        out[name] = {
            "source_contract_full": per_call_us(lambda: tp.contract.SOURCE.validate(
                pool=pool.tensor, src=src, max_inflight_slices=64, consumer_count=2,
                name="pieces")),
            "lease_and_release": per_call_us(lambda: pool.release(pool.lease(nbytes))),
            "view_of_lease": per_call_us(lambda: pool.tensor[lease.start:lease.start + nbytes]),
            "launch_jit": per_call_us(lambda: tp._launch(tp._publish_kernel, pool.tensor, src,
                                                         state, state, 64, 2, values=lease)),
            "launch_cached": per_call_us(lambda: pool._publish_lease(src, lease)),
            "copy_tensor": per_call_us(copy_tensor),
            "copy_": per_call_us(lambda: pool.tensor[lease.start:lease.start + nbytes].copy_(
                src)),
        }
        pool.release(lease)
    pool.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    one = torch.zeros(1, device="cuda")
    result = {"trivial_op": per_call_us(lambda: one.add_(1)),
              "empty_1": per_call_us(lambda: torch.empty(1, device="cuda")),
              "sparse_mla_prefill": sparse_pieces(),
              "mamba_state_scatter": mamba_pieces(),
              "transport_publish": transport_pieces()}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
