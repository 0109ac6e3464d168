"""Experiment: where an eager call's host time goes, piece by piece, on this machine's GPU.

Times (``timeit``, best of five rounds, microseconds per call; no synchronisation inside, so
these are host costs) the pieces of each op's eager path at its smallest benchmark shape: the
dispatch gate, the contract in full and cached, the allocations, the launch through
``JITFunction.run``, through the cached launcher and the C launch alone (the driver's part),
and the whole path before (validation in full, ``kernel[grid]``) and after. Each public call
is also timed as ``bench_eager_host_cost.py`` times it (``*_bench_host``: median of five rounds
of 300 calls after a synchronisation and 50 calls, the garbage collector on), and the mamba
scatter besides on a tiny state (the same host path, next to no GPU work), with 64 requests
(the GPU slower than the host) and back to back on the GPU (``device_back_to_back``: events
around 200 calls), which tells a host-bound call from a GPU-bound one. ``*_gpu_busy``: the
benchmark's host time with a spin kernel keeping the GPU busy throughout, which tells whether a
launch costs the host more when the GPU is idle. A piece the code under test lacks is ``null``.

    python benchmarks/experiments/eager_host_pieces.py [--json out.json] [--before DIR]

``--before DIR``: also time the same pieces with the ``strictops`` of the checkout ``DIR`` (an
older revision, e.g. ``git archive REV --prefix=.before/ | tar -x``), in a second process, and
print both side by side with their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

import torch

from strictops.meta.mamba import state_scatter as mss_contract
from strictops.meta.sparse_mla import prefill as smp
from strictops.meta._contract import CachedValidation
from strictops.meta.transport.pool import data_start
from strictops.ops import TransportPool
from strictops.ops.mamba import state_scatter as mss
from strictops.ops.sparse_mla import prefill as sparse
from strictops.ops.transport import pool as tp
from strictops.ops._runtime.dispatch import can_skip_dispatcher
from strictops.ops._runtime.host_path import MISS
from strictops.ops._runtime.launcher import Launcher

# The sm_90 launch path (an older checkout: the Gluon kernel module); None without Gluon.
ws = getattr(sparse, "_sparse_mla_sm90", getattr(sparse, "gluon_shared_s", None))

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_eager_host_cost import host_us as bench_host_us  # noqa: E402

CALLS = 200


def per_call_us(fn) -> float | None:
    """Best of five rounds of CALLS calls (timeit: the garbage collector off); None when the
    code under test lacks what ``fn`` calls."""
    try:
        fn()
    except (AttributeError, TypeError, KeyError, StopIteration):
        return None
    torch.cuda.synchronize()
    best = min(timeit.repeat(fn, number=CALLS, repeat=5)) / CALLS * 1e6
    torch.cuda.synchronize()
    return best


def busy_gpu_host_us(fn) -> float:
    """:func:`bench_host_us` with the GPU kept busy by a spin kernel queued at the start of each
    round (about 20 ms at 2 GHz, longer than the round's launches take): the launches queue
    behind it, so this is the host's time per call when the GPU is never idle."""
    return bench_host_us(fn, round_start=lambda: torch.cuda._sleep(40_000_000))


def back_to_back_device_us(fn, calls: int = 200) -> float:
    """GPU time per call over ``calls`` back-to-back calls (events around them all)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def recorded_launch(call) -> tuple:
    """``(launcher, grid, args, options)`` of the last launch ``call()`` makes through a cached
    launcher (:class:`~strictops.ops._runtime.launcher.Launcher`), so that the pieces launch exactly
    what the eager path launches."""
    real, seen = Launcher.__call__, []

    def spy(self, grid, args, options=(), device=None):
        seen.append((self, tuple(grid), tuple(args), options))
        return real(self, grid, args, options, device)

    Launcher.__call__ = spy
    try:
        call()
    finally:
        Launcher.__call__ = real
    return seen[-1]


def c_launch_us(launcher, grid, args, options) -> float | None:
    """The C launch of a prepared specialisation alone, its argument values made once: what
    the driver and Triton's C launcher cost, without the Python around them."""
    try:
        prepared = launcher.prepared[launcher.key(args, options)]
        values = launcher.arguments(args)[1]
    except (AttributeError, TypeError, KeyError):
        return None
    stream = torch.cuda.current_stream().cuda_stream
    grid = (*grid, 1, 1)[:3]
    fast = prepared.fast
    if fast is None:
        return None
    if fast.flat:
        return per_call_us(lambda: fast.launch(*grid, stream, *fast.head, *values))
    return per_call_us(lambda: fast.launch(*grid, stream, *fast.head, values))


def python_path(module, calls: dict) -> dict:
    """``per_call_us`` of each of ``calls`` with ``module``'s C++ eager path off (every call
    takes the Python path)."""
    hosts = getattr(module, "_HOSTS", None)  # one C++ path per kernel
    saved = dict(hosts) if hosts is not None else module._HOST_CALL
    if hosts is not None:
        hosts.update({name: lambda *args: MISS for name in hosts})
    else:
        module._HOST_CALL = lambda *args: MISS
    try:
        return {name: per_call_us(fn) for name, fn in calls.items()}
    finally:
        if hosts is not None:
            hosts.update(saved)
        else:
            module._HOST_CALL = saved


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
    launcher, grid, kernel_args, options = recorded_launch(lambda: sparse._eager(*args))
    public = lambda: sparse.sparse_mla_q8kv8_prefill_fwd(*args[:9])  # noqa: E731
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
        "launch_cached": per_call_us(lambda: launcher(grid, kernel_args, options, 0)),
        "launcher_key": per_call_us(lambda: launcher.arguments(kernel_args)),
        "launch_c_only": c_launch_us(launcher, grid, kernel_args, options),
        "path_before": per_call_us(lambda: sparse._forward(sparse._sparse_mla_prefill_kernel,
                                                           True, *args)),
        "path_after": per_call_us(lambda: sparse._eager(*args)),
        "public_no_out": per_call_us(public),
        "public_out": per_call_us(lambda: sparse.sparse_mla_q8kv8_prefill_fwd(
            *args[:9], out=out, max_logits=ml, lse=lse)),
        "public_no_out_bench_host": bench_host_us(public),
        "plan_no_out": per_call_us(lambda: sparse._HOST.call(*args)),
        "plan_out": per_call_us(lambda: sparse._HOST.call(*args[:9], out, ml, lse, None)),
        **python_path(sparse, {
            "public_no_out_python_path": public,
            "public_out_python_path": lambda: sparse.sparse_mla_q8kv8_prefill_fwd(
                *args[:9], out=out, max_logits=ml, lse=lse)}),
        "dispatcher_op": per_call_us(lambda: torch.ops.strictops.sparse_mla_q8kv8_prefill_fwd(
            *args)),
    }


def _mamba_call(layers, cache, state, requests=1, draft=4):
    dst = torch.zeros(layers, cache, *state, device="cuda")
    src = torch.zeros(layers, requests, draft, *state, device="cuda")
    slots = torch.arange(requests, dtype=torch.int32, device="cuda")
    steps = torch.zeros(requests, dtype=torch.int32, device="cuda")
    return dst, src, slots, steps, None


def mamba_pieces() -> dict:
    args = _mamba_call(36, 512, (8, 128, 128))  # bench_eager_host_cost's 1-request shape
    tiny = _mamba_call(1, 4, (16,))  # the same host path, next to no GPU work
    busy = _mamba_call(36, 512, (8, 128, 128), requests=64)  # the GPU slower than the host
    cached = CachedValidation(mss_contract.CONTRACT, mss_contract.ARGUMENTS)
    launcher, grid, kernel_args, options = recorded_launch(lambda: mss._eager(*args))
    public = lambda: mss.fused_mamba_state_scatter_with_mask(*args)  # noqa: E731
    public_tiny = lambda: mss.fused_mamba_state_scatter_with_mask(*tiny)  # noqa: E731
    return {
        "gate": per_call_us(lambda: can_skip_dispatcher(*args)),
        "contract_full": per_call_us(lambda: mss_contract.validate(*args)),
        "contract_cached": per_call_us(lambda: cached(*args)),
        "arguments": per_call_us(lambda: mss._arguments(*args)),
        "launch_jit": per_call_us(lambda: mss._launch(mss._scatter_kernel, *args)),
        "launch_cached": per_call_us(lambda: launcher(grid, kernel_args, options, 0)),
        "launcher_key": per_call_us(lambda: launcher.arguments(kernel_args)),
        "launch_c_only": c_launch_us(launcher, grid, kernel_args, options),
        "path_before": per_call_us(lambda: mss._forward(mss._scatter_kernel, True, *args)),
        "path_after": per_call_us(lambda: mss._eager(*args)),
        "public": per_call_us(public),
        "public_bench_host": bench_host_us(public),
        "public_tiny": per_call_us(public_tiny),
        "public_tiny_bench_host": bench_host_us(public_tiny),
        "plan": per_call_us(lambda: mss._HOSTS[mss.TUNING["kernel"]](*args)),
        **python_path(mss, {"public_python_path": public,
                            "public_tiny_python_path": public_tiny}),
        "public_bench_host_gpu_busy": busy_gpu_host_us(public),
        "public_64_requests_bench_host": bench_host_us(
            lambda: mss.fused_mamba_state_scatter_with_mask(*busy)),
        "device_back_to_back": back_to_back_device_us(public),
    }


def transport_pieces() -> dict:
    pool = TransportPool(data_start(64, 2) + (4 << 20), device="cuda:0", consumer_count=2,
                         max_inflight_slices=64, recycle_interval=None, name="pieces")
    out = {}
    for name, nbytes in (("64KiB", 64 << 10), ("1MiB", 1 << 20)):
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        lease = pool.lease(nbytes)
        state = pool._state[lease.slot]
        launcher, grid, kernel_args, options = recorded_launch(
            lambda: pool._publish_lease(src, lease))

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
            "publish": per_call_us(lambda: pool._publish_lease(src, lease)),
            "publish_bench_host": bench_host_us(lambda: pool._publish_lease(src, lease)),
            "publish_bench_host_gpu_busy": busy_gpu_host_us(
                lambda: pool._publish_lease(src, lease)),
            "launch_cached": per_call_us(lambda: launcher(grid, kernel_args, options, 0)),
            "launcher_key": per_call_us(lambda: launcher.arguments(kernel_args)),
            "launch_c_only": c_launch_us(launcher, grid, kernel_args, options),
            "copy_tensor": per_call_us(copy_tensor),
            "copy_tensor_bench_host": bench_host_us(copy_tensor),
            "copy_": per_call_us(lambda: pool.tensor[lease.start:lease.start + nbytes].copy_(
                src)),
        }
        pool.release(lease)
    pool.shutdown()
    return out


def pieces() -> dict:
    one = torch.zeros(1, device="cuda")
    return {"trivial_op": per_call_us(lambda: one.add_(1)),
            "trivial_op_bench_host": bench_host_us(lambda: one.add_(1)),
            "trivial_op_bench_host_gpu_busy": busy_gpu_host_us(lambda: one.add_(1)),
            "empty_1": per_call_us(lambda: torch.empty(1, device="cuda")),
            "sparse_mla_prefill": sparse_pieces(),
            "mamba_state_scatter": mamba_pieces(),
            "transport_publish": transport_pieces()}


def before_pieces(checkout: Path) -> dict:
    """:func:`pieces` with the ``strictops`` of ``checkout``, in a second process."""
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(checkout.resolve(), Path(tmp) / "strictops")
        result = Path(tmp) / "before.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [tmp, *filter(None, [os.environ.get("PYTHONPATH")])])}
        subprocess.run([sys.executable, __file__, "--json", str(result)], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        return json.loads(result.read_text())


def side_by_side(before: dict, after: dict, prefix: str = "") -> list[str]:
    """``piece  before  after  after/before`` lines, one per piece of either."""
    lines = []
    for key in {**before, **after}:
        b, a = before.get(key), after.get(key)
        if isinstance(a, dict) or isinstance(b, dict):
            lines += side_by_side(b or {}, a or {}, f"{prefix}{key}.")
            continue
        fmt = lambda v: f"{v:8.2f}" if isinstance(v, float) else f"{v!s:>8}"  # noqa: E731
        ratio = f"{a / b:6.2f}" if isinstance(a, float) and isinstance(b, float) else ""
        lines.append(f"{prefix + key:52s} {fmt(b)} {fmt(a)} {ratio}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--before", type=Path, default=None,
                    help="a checkout of an older revision to time beside this one")
    args = ap.parse_args()
    result = pieces()
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    if args.before:
        torch.cuda.empty_cache()  # the second process allocates the same again
        before = before_pieces(args.before)
        print(f"\n{'piece (us per call)':52s} {'before':>8} {'after':>8} after/before")
        print("\n".join(side_by_side(before, result)))


if __name__ == "__main__":
    main()
