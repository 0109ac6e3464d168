"""Benchmark: the host cost of eager calls, ours against the originals', for every op.

Where no CUDA graph is captured, a serving engine pays each call's host time. For each op and
shape, two timings of back-to-back calls in plain eager mode (inputs and buffers made once):

* ``*_us``: wall time per call, the median of five rounds of 1000 calls after warm-up, each
  round ended by a synchronisation (``_harness.wall_us``): the host's cost, or the GPU's where
  the GPU is the slower;
* ``*_host_us``: the host's time per call alone: 300 calls after a synchronisation and 50
  calls (fewer than the launch queue holds, so the host never waits for the GPU), the median
  of five rounds;
* ``*_device_us``: the GPU's time per call (``do_bench``, L2 flushed before each call), the
  floor of the wall time.

The originals, from the anchor folder ``.anchor`` at the repository root when present (else
``null``): sglang's Triton mamba scatter, the CUTLASS sparse MLA prefill entry (it takes its
outputs preallocated: without ``out=`` the original's row allocates them as its caller must,
three ``torch.empty``), and the original transport publish (``copy_`` into the lease, then
``cuStreamWriteValue32``).

    python benchmarks/bench_eager_host_cost.py --out benchmarks/results/h200
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from strictops.meta.sparse_mla import prefill as smp
from strictops.meta.transport.pool import data_start
from strictops.ops import (
    TransportPool,
    fused_mamba_state_scatter_with_mask,
    sparse_mla_q8kv8_prefill_fwd,
)
from strictops.ops._runtime import host_path as _host_path
from strictops.ops.sparse_mla import prefill as sparse

from _harness import (Report, anchor_module, arg_parser, begin, grouped_bars, median_us,
                      wall_us)

ROUNDS, CALLS, WARM_CALLS, HOST_CALLS = 5, 1000, 50, 300
# (name, layers, cache slots, state shape, dtype, requests, draft tokens, valid requests): the
# SSM shape of bench_mamba_state_scatter.py with one request, and with 64.
MAMBA = [("1 request", 36, 512, (8, 128, 128), torch.float32, 1, 4, 1),
         ("64 requests", 36, 512, (8, 128, 128), torch.float32, 64, 4, 51)]
# (name, s_q, s_kv, h_q, d_qk, topk, out= buffers given)
SPARSE = [("64x128x576 topk512", 64, 8192, 128, 576, 512, False),
          ("64x128x576 topk512 out=", 64, 8192, 128, 576, 512, True),
          ("1024x128x576 topk2048", 1024, 32768, 128, 576, 2048, False)]
TRANSPORT = [("64KiB", 64 << 10), ("1MiB", 1 << 20), ("16MiB", 16 << 20)]


def _originals():
    """The anchor's ``originals`` module, or None without the anchor folder."""
    return anchor_module("originals")


def host_us(fn, round_start=None) -> float:
    """The host's time per call of ``fn``: median over ROUNDS rounds of HOST_CALLS calls, each
    round after a synchronisation and WARM_CALLS untimed calls (the first calls after a wait
    are slower); the launches of a round fit in the launch queue, so the host never waits.
    ``round_start``: called right after each synchronisation (e.g. to queue GPU work)."""
    samples = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        if round_start is not None:
            round_start()
        for _ in range(WARM_CALLS):
            fn()
        t0 = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        samples.append((time.perf_counter() - t0) / HOST_CALLS * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def measure(report: Report, op: str, shape: str, ours, original) -> dict:
    row = report.add(op=op, shape=shape, ours_us=wall_us(ours, CALLS, ROUNDS)[0],
                     original_us=None if original is None else wall_us(original, CALLS,
                                                                       ROUNDS)[0],
                     ours_host_us=host_us(ours),
                     original_host_us=None if original is None else host_us(original),
                     ours_device_us=median_us(ours),
                     original_device_us=None if original is None else median_us(original))
    row["ours_le_original"] = None if original is None else row["ours_us"] <= row["original_us"]
    print(row, flush=True)
    return row


def mamba_rows(report: Report, originals, gen) -> None:
    for name, layers, cache, state, dtype, requests, draft, valid in MAMBA:
        dst = torch.randn(layers, cache, *state, device="cuda", generator=gen).to(dtype)
        src = torch.randn(layers, requests, draft, *state, device="cuda", generator=gen).to(dtype)
        slots = torch.randperm(cache, device="cuda", generator=gen)[:requests].to(torch.int32)
        steps = torch.randint(0, draft, (requests,), device="cuda", generator=gen,
                              dtype=torch.int32)
        steps[torch.randperm(requests, device="cuda", generator=gen)[:requests - valid]] = -1
        original = None if originals is None else (
            lambda: originals.mamba_scatter(dst, src, slots, steps))
        measure(report, "mamba_state_scatter", f"{name}, {layers}x{cache}x{state}",
                lambda: fused_mamba_state_scatter_with_mask(dst, src, slots, steps), original)
        del dst, src
        torch.cuda.empty_cache()


def sparse_rows(report: Report, originals, gen, build: bool) -> None:
    q8kv8 = None if originals is None or not build else originals.sparse_mla()
    for name, s_q, s_kv, h_q, d_qk, topk, buffers in SPARSE:
        dims = smp.Dims(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, device="cuda",
                        with_buffers=buffers)
        args = sparse.random_inputs(dims, gen, invalid_fraction=0.0, edge_rows=False)
        buffers_given = {k: args.pop(k) for k in smp.BUFFERS}
        args.pop("topk_length_errors")
        fixed = sparse.sparse_mla_q8kv8_prefill_fwd(**args)  # the original's outputs
        ours = (lambda: sparse_mla_q8kv8_prefill_fwd(**args, **buffers_given)) if buffers else (
            lambda: sparse_mla_q8kv8_prefill_fwd(**args))
        original = None
        if q8kv8 is not None:
            call = (args["q"], args["kv"], args["indices"], args["q_scale"], args["kv_scale"])
            if buffers:
                def original():
                    q8kv8(*call, *fixed, args["sm_scale"], None, None)
            else:
                def original():  # its caller allocates what our op allocates
                    out = torch.empty((s_q, h_q, 512), dtype=torch.bfloat16, device="cuda")
                    ml = torch.empty((s_q, h_q), dtype=torch.float32, device="cuda")
                    lse = torch.empty((s_q, h_q), dtype=torch.float32, device="cuda")
                    q8kv8(*call, out, ml, lse, args["sm_scale"], None, None)
        measure(report, "sparse_mla_prefill", name, ours, original)
        del args, fixed, buffers_given
        torch.cuda.empty_cache()


def transport_rows(report: Report, originals) -> None:
    """Two rows a size: ``copy_tensor`` (lease, publish, the lease's view; the lease released
    after, as the consumers' acknowledgements would) against the same with the original's
    publish in place of ours; and the publish alone, into one lease, against the original's."""
    slots, consumers = 64, 2
    pool = TransportPool(data_start(slots, consumers) + 2 * TRANSPORT[-1][1] + (1 << 20),
                         device="cuda:0", consumer_count=consumers, max_inflight_slices=slots,
                         recycle_interval=None, name="bench")
    for name, nbytes in TRANSPORT:
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()

        def ours():
            lease, _ = pool.copy_tensor(src)
            pool.release(lease)

        def original():
            lease = pool.lease(nbytes)
            originals.transport_publish(pool.tensor, src, lease.start, lease.ready_byte_offset,
                                        lease.generation)
            pool.tensor[lease.start:lease.start + nbytes]  # copy_tensor returns this view
            pool.release(lease)

        measure(report, "transport_copy_tensor", name, ours,
                None if originals is None else original)
        lease = pool.lease(nbytes)
        measure(report, "transport_publish", name, lambda: pool._publish_lease(src, lease),
                None if originals is None else lambda: originals.transport_publish(
                    pool.tensor, src, lease.start, lease.ready_byte_offset, lease.generation))
        pool.release(lease)
    pool.shutdown()


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("--no-cutlass", action="store_true",
                    help="no CUTLASS original (its first build takes minutes): null instead")
    args, report, gen = begin("eager_host_cost", ap, seed=20261201)
    originals = _originals()
    one = torch.zeros(1, device="cuda")
    report.ceilings["trivial_op_wall_us"] = wall_us(lambda: one.add_(1), CALLS, ROUNDS)[0]
    report.ceilings["trivial_op_host_us"] = host_us(lambda: one.add_(1))
    report.ceilings["originals"] = originals is not None
    # Whether this installation has the C++ eager path (strictops.ops._runtime.host_path): without
    # it, every call below takes the Python path.
    report.ceilings["cxx_eager_path"] = _host_path.available()
    # Sparse MLA last: the CUTLASS original's first build takes minutes; the results so far are
    # written after each op.
    transport_rows(report, originals)
    _write(report, args.out)
    mamba_rows(report, originals, gen)
    _write(report, args.out)
    sparse_rows(report, originals, gen, build=not args.no_cutlass)
    _write(report, args.out)


def _write(report: Report, out: Path) -> None:
    """The results so far, with the bars: each row at most its original's wall time, and the
    first (smallest) shape of each op at most 25 us."""
    report.bars = []
    for row in report.rows:
        if row["original_us"] is not None:
            report.check_bar(row, "ours_us", "<=", round(row["original_us"], 2))
    smallest = {}
    for row in report.rows:
        smallest.setdefault(row["op"], row)
    for row in smallest.values():
        report.check_bar(row, "ours_us", "<=", 25.0)
    report.write(out, ["op", "shape", "ours_us", "original_us", "ours_host_us",
                       "original_host_us", "ours_device_us", "original_device_us",
                       "ours_le_original"], plot=_plot)


def _plot(plt, report):
    fig, ax = grouped_bars(plt, report, lambda row: f"{row['op']}\n{row['shape']}",
                           [("ours, wall", "ours_us"), ("original, wall", "original_us"),
                            ("ours, host", "ours_host_us"), ("original, host", "original_host_us")],
                           "Eager host cost per call (back to back)", "us per call")
    ax.legend(fontsize=7)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=6)
    return fig


if __name__ == "__main__":
    main()
