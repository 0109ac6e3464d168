"""Benchmark: publishing a tensor into the transport pool.

For 64 KiB, 1 MiB, 16 MiB and 256 MiB: ours (one launch up to 1 MiB, two above; the lease
read from a device tensor, as a captured graph does, and the lease as kernel arguments, the
pool's eager ``copy_tensor`` path; with the default placement ``consumers="peers"``, whose
flag is released at system scope, and the same publish with ``"same_device"``, GPU scope,
eager and in graph replay), the original path (``copy_`` into the lease, then
``cuStreamWriteValue32`` of the ready word), ``copy_`` alone, and the floor (bytes read +
written over the copy bandwidth, measured between timing rounds). Device-time medians
(``do_bench``, L2 flushed before each call) and CUDA-graph replays, in ``ROUNDS`` rounds per
size; every publish is checked bit for bit (bytes and ready word); a tuning sweep of the
kernel; the host wall time of an eager publish (ours and the original path's); and the
op's bars (``BARS``, on the median over the rounds, for the default placement), written
with the results.

With two GPUs, the read of a peer consumer: a process on ``cuda:1`` maps the pool (on
``cuda:0``) as :meth:`TransportConsumer.attach` does and copies a lease out over NVLink, as its
``receive`` does, against ``copy_`` from ``cuda:0`` to ``cuda:1`` in the same run (rows
``... peer``; skipped with one GPU).

An eager timing can include the GPU's wait for the host: ``do_bench`` fills the L2 before each
call, and when the host takes longer to launch the publish than the GPU takes for that fill,
the GPU waits and the wait is counted (``docs/design/transport_pool.md``). The graph replays
are the kernel's numbers; ``eager_wall_us`` is the host's.

Needs cuda-bindings (the original path).

    python benchmarks/bench_transport_pool.py --out benchmarks/results [--all]

By default the sizes of the bars (64 KiB, 256 MiB) without the tuning sweep: an estimated
40 s on the H200 (each of the ~30 timings per size is a ``do_bench`` of about half a second of
GPU time, L2 flushes included); ``--all`` runs every size and the sweep (estimated two
minutes).
"""

from __future__ import annotations

import statistics

import torch
import torch.multiprocessing as mp

from strictops.meta.transport.pool import data_start
from strictops.ops import TransportConsumer, TransportPool, copy_and_publish
from strictops.ops.transport import cuda_stream as _cuda_stream
from strictops.ops.transport import pool as m

from _harness import (
    Report,
    arg_parser,
    copy_bandwidth_bytes_per_us,
    graph_replay_us,
    grouped_bars,
    median_us,
    parse_args,
    wall_us,
)

SIZES = [("64KiB", 64 << 10), ("1MiB", 1 << 20), ("16MiB", 16 << 20), ("256MiB", 256 << 20)]
SLOTS, CONSUMERS = 64, 2
# Kernel variants swept on every run (bytes per program, warps of the copy programs, one or
# two launches, the flag launch a programmatic dependent launch or not, its warps when not
# TUNING's), reported as floor / graph-replay time; the op picks them by size from m.TUNING
# (4 KiB/4 warps in one launch up to 1 MiB; in two above, the flag launch a PDL of 4 warps,
# 16 KiB/4 warps up to 16 MiB and 4 KiB/8 warps above).
TUNING = [{"block_bytes": b, "num_warps": w, "two_launches": two, **extra}
          for b, w, two, extra in [(2048, 2, False, {}), (4096, 4, False, {}),
                                   (4096, 4, True, {"pdl": True}), (4096, 8, True, {"pdl": True}),
                                   (4096, 8, True, {"pdl": False}),
                                   (4096, 8, True, {"pdl": True, "flag_num_warps": 1}),
                                   (16384, 4, True, {"pdl": True}),
                                   (8192, 16, True, {"pdl": True})]]
# Timing rounds per size (see main), and the ratios each round reports: floor / time.
ROUNDS = 3
RATIOS = {"ours_bw_ratio": "ours_us", "ours_graph_bw_ratio": "ours_graph_us",
          "original_graph_bw_ratio": "original_graph_us", "copy_graph_bw_ratio": "copy_graph_us",
          "same_device_graph_bw_ratio": "same_device_graph_us"}
# Sizes of the peer consumer's read (two GPUs).
PEER_SIZES = [("64KiB", 64 << 10), ("256MiB", 256 << 20)]
# The op's bars: a 64 KiB publish in at most 7 us, and at 256 MiB at least 0.95 of the
# floor's bandwidth (graph replay, and the eager call).
BARS = [("64KiB", "ours_graph_us", "<=", 7.0), ("256MiB", "ours_graph_bw_ratio", ">=", 0.95),
        ("256MiB", "ours_bw_ratio", ">=", 0.95)]


def _variant_name(v: dict) -> str:
    pdl = "-pdl" if v.get("pdl") else ""
    flag = f"-flag{v['flag_num_warps']}w" if "flag_num_warps" in v else ""
    return f"{v['block_bytes']}B/{v['num_warps']}w/{2 if v['two_launches'] else 1}L{pdl}{flag}"


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("--all", action="store_true",
                    help="every size (not only the bars') and the tuning sweep")
    args = parse_args(ap)
    bar_sizes = {size for size, *_ in BARS}
    sizes = SIZES if args.all else [(n, b) for n, b in SIZES if n in bar_sizes]

    report = Report("transport_pool")
    bw = copy_bandwidth_bytes_per_us()
    report.ceilings["copy_bandwidth_TBps"] = bw / 1e6
    pool = TransportPool(data_start(SLOTS, CONSUMERS) + SIZES[-1][1] + (1 << 20),
                         device="cuda:0", consumer_count=CONSUMERS, max_inflight_slices=SLOTS,
                         recycle_interval=None, name="bench")
    for name, nbytes in sizes:
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
        lease = pool.lease(nbytes)
        lease_t = torch.tensor(lease, device="cuda")
        state = m.new_state("cuda")
        dst = pool.tensor[lease.start:lease.start + nbytes]
        ready = pool.tensor[lease.ready_byte_offset:lease.ready_byte_offset + 4].view(torch.int32)

        def ours_tensor():
            pool.publish(src, lease_t, state)

        def ours_args():
            pool._publish_lease(src, lease)

        def ours_same_device():
            copy_and_publish(pool.tensor, src, lease_t, state, SLOTS, CONSUMERS, "same_device")

        def original():
            # The stream current when called: under graph capture, the capturing stream (a
            # stream taken outside would run the write at capture time, not in the graph).
            dst.copy_(src)
            _cuda_stream.write_value32(torch.cuda.current_stream(),
                                       pool.base_address + lease.ready_byte_offset,
                                       lease.generation)

        exact = True
        for publish in (ours_tensor, ours_args, ours_same_device):
            dst.zero_()
            ready.zero_()
            publish()
            torch.cuda.synchronize()
            exact &= torch.equal(dst, src) and int(ready) == lease.generation

        tuning_us = {}
        for variant in TUNING if args.all else ():
            def launch(variant=variant):
                m._launch(m._publish_kernel, pool.tensor, src, lease_t, state, SLOTS, CONSUMERS,
                          **variant)
            tuning_us[_variant_name(variant)] = graph_replay_us(launch)
        wall, wall_min = wall_us(ours_args, calls=200)
        original_wall, _ = wall_us(original, calls=200)
        timed = {"copy_us": lambda: median_us(lambda: dst.copy_(src)),
                 "original_us": lambda: median_us(original),
                 "ours_us": lambda: median_us(ours_tensor),
                 "ours_args_us": lambda: median_us(ours_args),
                 "copy_graph_us": lambda: graph_replay_us(lambda: dst.copy_(src)),
                 "original_graph_us": lambda: graph_replay_us(original),
                 "ours_graph_us": lambda: graph_replay_us(ours_tensor),
                 "same_device_us": lambda: median_us(ours_same_device),
                 "same_device_graph_us": lambda: graph_replay_us(ours_same_device)}
        # ROUNDS rounds of every timing, the copy bandwidth measured before the first and after
        # each: a round's floor is the mean of the two that bracket it, so a drift of the GPU's
        # speed during the run (seen: 1% between two runs minutes apart) moves the floor with
        # the timings it is compared with. A row reports medians over the rounds.
        bandwidths = [copy_bandwidth_bytes_per_us()]
        rounds = []
        for _ in range(ROUNDS):
            one = {key: measure() for key, measure in timed.items()}
            bandwidths.append(copy_bandwidth_bytes_per_us())
            one["floor_us"] = 2 * nbytes / ((bandwidths[-2] + bandwidths[-1]) / 2)
            for ratio, key in RATIOS.items():
                one[ratio] = one["floor_us"] / one[key]
            rounds.append(one)
        row = report.add(size=name, bytes=nbytes, bit_exact=exact and int(state[m.ERRORS]) == 0,
                         eager_wall_us=wall, eager_wall_min_us=wall_min,
                         original_wall_us=original_wall, rounds=rounds,
                         copy_bandwidth_TBps=[bw / 1e6 for bw in bandwidths])
        row.update({key: statistics.median(r[key] for r in rounds) for key in rounds[0]})
        row["tuning_bw_ratio"] = {k: row["floor_us"] / us for k, us in tuning_us.items()}
        row["speedup_vs_original"] = row["original_us"] / row["ours_us"]
        row["graph_speedup_vs_original"] = row["original_graph_us"] / row["ours_graph_us"]
        row["system_scope_graph_cost_us"] = row["ours_graph_us"] - row["same_device_graph_us"]
        pool.release(lease)
    _peer_read_rows(report, pool)
    pool.shutdown()
    rows = {r["size"]: r for r in report.rows}
    for size, key, op, goal in BARS:
        report.check_bar(rows[size], key, op, goal)

    report.write(args.out, ["size", "bit_exact", "floor_us", "copy_us", "original_us",
                            "ours_us", "ours_args_us", "copy_graph_us", "original_graph_us",
                            "ours_graph_us", "eager_wall_us", "eager_wall_min_us",
                            "original_wall_us",
                            "ours_bw_ratio", "ours_graph_bw_ratio", "original_graph_bw_ratio",
                            "copy_graph_bw_ratio", "speedup_vs_original",
                            "graph_speedup_vs_original", "same_device_us", "same_device_graph_us",
                            "system_scope_graph_cost_us", "peer_read_us", "peer_copy_us",
                            "peer_read_GBps", "peer_copy_GBps", "peer_read_vs_copy"],
                 plot=_plot)
    for bar in report.bars:
        print("bar:", bar)
    for r in (r for r in report.rows if "rounds" in r):
        print(r["size"], "rounds (floor/time, graph):",
              ", ".join(f"ours {x['ours_graph_bw_ratio']:.3f} original "
                        f"{x['original_graph_bw_ratio']:.3f} copy_ {x['copy_graph_bw_ratio']:.3f}"
                        for x in r["rounds"]))
        if r["tuning_bw_ratio"]:
            print(r["size"], "tuning (floor/time):",
                  ", ".join(f"{k}={v:.3f}" for k, v in r["tuning_bw_ratio"].items()))


def _peer_reader(handle, leases: list, out) -> None:
    """A consumer process on ``cuda:1``: maps the pool of ``handle`` there and reports the
    median time of copying each lease's bytes out over the mapping, as ``receive`` does."""
    try:
        torch.cuda.set_device(1)
        consumer = TransportConsumer.attach(handle, 0, device=1)
        times = {}
        for name, lease in leases:
            view = consumer.view(lease, torch.uint8, (lease.nbytes,))
            dst = torch.empty(lease.nbytes, dtype=torch.uint8, device="cuda:1")
            times[name] = median_us(lambda: dst.copy_(view))
            if not torch.equal(dst, view):
                raise RuntimeError(f"{name}: the bytes read over the mapping differ")
        consumer.close()
        out.put(times)
    except BaseException as exc:
        out.put(repr(exc))


def _peer_read_rows(report: Report, pool: TransportPool) -> None:
    """Rows ``<size> peer``: a consumer on ``cuda:1`` reading a lease of the pool on ``cuda:0``
    over its peer mapping, against ``copy_`` from ``cuda:0`` to ``cuda:1`` (skipped with one
    GPU, or without peer access)."""
    if torch.cuda.device_count() < 2 or not torch.cuda.can_device_access_peer(1, 0):
        print("peer read: skipped (needs two GPUs with peer access)")
        return
    leases = []
    for name, nbytes in PEER_SIZES:
        lease = pool.lease(nbytes)
        pool.tensor[lease.start:lease.start + nbytes].random_(0, 256)
        leases.append((name, lease))
    torch.cuda.synchronize()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    reader = ctx.Process(target=_peer_reader, args=(pool.export_handle(), leases, out))
    reader.start()
    read_us = out.get(timeout=600)
    reader.join(timeout=60)
    if isinstance(read_us, str):
        raise RuntimeError(f"peer reader: {read_us}")
    for name, lease in leases:
        src = pool.tensor[lease.start:lease.start + lease.nbytes]
        dst = torch.empty(lease.nbytes, dtype=torch.uint8, device="cuda:1")
        copy_us = median_us(lambda: dst.copy_(src))  # on cuda:0's current stream
        report.add(size=f"{name} peer", bytes=lease.nbytes, peer_read_us=read_us[name],
                   peer_copy_us=copy_us, peer_read_GBps=lease.nbytes / read_us[name] / 1e3,
                   peer_copy_GBps=lease.nbytes / copy_us / 1e3,
                   peer_read_vs_copy=copy_us / read_us[name])
        pool.release(lease)


def _plot(plt, report):
    series = [("floor (bytes / copy bandwidth)", "floor_us"), ("copy_ alone", "copy_us"),
              ("copy_ + cuStreamWriteValue32", "original_us"),
              ("ours, lease tensor", "ours_us"), ("ours, lease arguments", "ours_args_us"),
              ("copy_ + cuStreamWriteValue32, graph", "original_graph_us"),
              ("ours, graph", "ours_graph_us"),
              ("ours, same_device (GPU-scope flag), graph", "same_device_graph_us"),
              ("peer consumer's read over NVLink", "peer_read_us"),
              ("copy_ cuda:0 -> cuda:1", "peer_copy_us")]
    fig, ax = grouped_bars(plt, report, "size", series, "copy_and_publish",
                           "µs (median, log scale)")
    ax.legend(fontsize=7)
    return fig


if __name__ == "__main__":
    main()
