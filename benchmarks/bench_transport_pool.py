"""Benchmark: publishing a tensor into the transport pool.

For 64 KiB, 1 MiB, 16 MiB and 256 MiB, both of the pool's publishing APIs against the original
path (``copy_`` into the lease, then ``cuStreamWriteValue32`` of the ready word: sglang's, from
``.anchor/originals.py`` where the anchor folder is present, else the same two calls written
out here), in the same run:

* ``publish`` (the graph API, ``copy_and_publish``): the lease read from a device tensor, so
  one captured graph publishes into a new lease on every replay; one launch up to 1 MiB and
  two above in a graph (``TUNING``), one up to 16 MiB eagerly, where the host's time is the
  publish's (``EAGER_TWO_LAUNCHES_ABOVE``); the default placement ``consumers="peers"``, its
  flag released at system scope, and the same with ``"same_device"`` (GPU scope);
* ``copy_tensor`` (the host-lease API): lease, publish with the lease's fields as kernel
  arguments (one launch up to 16 MiB), the lease's view; in a graph, its publish alone.

Per API, per size: the CUDA-graph replay time (``<api>.graph_us``; the kernel's number) against
the original's graph replay, and the eager wall time per call (``<api>.eager_wall_us``: back to
back, ``_harness.wall_us``; the host's number for small sizes) against the original's, each as
``*_speedup_vs_original`` (the original's time over ours: above 1 is faster). Besides: device
time medians (``do_bench``, L2 flushed before each call) of ours and the original, ``copy_``
alone, and the floor (bytes read + written over the copy bandwidth, measured between timing
rounds), in ``ROUNDS`` rounds per size; every publish checked bit for bit (bytes and ready
word); with ``--all`` a tuning sweep of the kernel; and the op's bars (``BARS``, on the median
over the rounds, for the default placement), written with the results.

With two GPUs, the read of a peer consumer: a process on ``cuda:1`` maps the pool (on
``cuda:0``) as :meth:`TransportConsumer.attach` does and copies a lease out over NVLink, as its
``receive`` does, against ``copy_`` from ``cuda:0`` to ``cuda:1`` in the same run (rows
``... peer``; skipped with one GPU).

A ``do_bench`` eager timing can include the GPU's wait for the host: ``do_bench`` fills the
L2 before each call, and when the host takes longer to launch the publish than the GPU takes
for that fill, the GPU waits and the wait is counted (``docs/design/transport_pool.md``).

Needs cuda-bindings (the original path).

    python benchmarks/bench_transport_pool.py --out benchmarks/results/h200 [--all]

About two minutes on an H100 or H200 (each of the ~35 timings per size is a ``do_bench`` of
about half a second of GPU time, L2 flushes included); ``--all`` adds the tuning sweep.
"""

from __future__ import annotations

import statistics

import torch
import torch.multiprocessing as mp

from strictops.meta.transport.pool import data_start
from strictops.ops import TransportConsumer, TransportPool, copy_and_publish
from strictops.ops.transport import cuda_stream as _cuda_stream
from strictops.ops.transport import pool as m

from _harness import (Report, anchor_module, arg_parser, bar_plot, begin,
                      copy_bandwidth_bytes_per_us, graph_replay_us, median_us, wall_us)

SIZES = [("64KiB", 64 << 10), ("1MiB", 1 << 20), ("16MiB", 16 << 20), ("256MiB", 256 << 20)]
SLOTS, CONSUMERS = 64, 2
# The two publishing APIs (see the module docstring).
APIS = ("publish", "copy_tensor")
# Kernel variants swept with --all (bytes per program, warps of the copy programs, one or
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
# The op's bars, for the default placement ("peers"): each API at least as fast as the original
# at every size, in graph replay and in eager wall time; an eager 64 KiB call in at most 25 us
# of wall time; at 256 MiB at least 0.95 of the floor's bandwidth in graph replay.
BARS = ([(size, f"{api}.{key}", ">=", 1.0) for size, _ in SIZES for api in APIS
         for key in ("graph_speedup_vs_original", "eager_wall_speedup_vs_original")]
        + [("64KiB", f"{api}.eager_wall_us", "<=", 25.0) for api in APIS]
        + [("256MiB", "ours_graph_bw_ratio", ">=", 0.95)])
# The results plot's bars, per size.
SERIES = [("floor (bytes / copy bandwidth)", "floor_us"),
          ("copy_ alone, graph", "copy_graph_us"),
          ("copy_ + cuStreamWriteValue32, graph", "original_graph_us"),
          ("publish, graph", "publish.graph_us"),
          ("copy_tensor's publish, graph", "copy_tensor.graph_us"),
          ("publish, same_device (GPU-scope flag), graph", "same_device_graph_us"),
          ("original publish, eager wall", "publish.original_eager_wall_us"),
          ("publish, eager wall", "publish.eager_wall_us"),
          ("original copy_tensor, eager wall", "copy_tensor.original_eager_wall_us"),
          ("copy_tensor, eager wall", "copy_tensor.eager_wall_us"),
          ("peer consumer's read over NVLink", "peer_read_us"),
          ("copy_ cuda:0 -> cuda:1", "peer_copy_us")]


def _variant_name(v: dict) -> str:
    pdl = "-pdl" if v.get("pdl") else ""
    flag = f"-flag{v['flag_num_warps']}w" if "flag_num_warps" in v else ""
    return f"{v['block_bytes']}B/{v['num_warps']}w/{2 if v['two_launches'] else 1}L{pdl}{flag}"


def _original_publish():
    """The original publish ``(pool_u8, src, start, ready_byte_offset, generation)``: the
    anchor's, or the same two calls on the current stream (under graph capture, the capturing
    stream: a stream taken outside would run the write at capture time, not in the graph)."""
    originals = anchor_module("originals")
    if originals is not None:
        return originals.transport_publish, "anchor originals.transport_publish"

    def publish(pool_u8, src, start, ready_byte_offset, generation):
        nbytes = src.numel() * src.element_size()
        pool_u8[start:start + nbytes].copy_(src.reshape(-1).view(torch.uint8))
        _cuda_stream.write_value32(torch.cuda.current_stream(),
                                   pool_u8.data_ptr() + ready_byte_offset, generation)

    return publish, "copy_ + cuStreamWriteValue32 (inline)"


def _per_api(row: dict, walls: dict) -> None:
    """The row's per-API results: graph replay and eager wall time, ours and the
    original's, and their speedups (the original's time over ours)."""
    graphs = {"publish": "ours_graph_us", "copy_tensor": "ours_args_graph_us"}
    for api in APIS:
        (wall, wall_min), (original, original_min) = walls[api]
        row[api] = {"graph_us": row[graphs[api]], "original_graph_us": row["original_graph_us"],
                    "graph_speedup_vs_original": row["original_graph_us"] / row[graphs[api]],
                    "eager_wall_us": wall, "eager_wall_min_us": wall_min,
                    "original_eager_wall_us": original, "original_eager_wall_min_us": original_min,
                    "eager_wall_speedup_vs_original": original / wall}


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("--all", action="store_true", help="also the tuning sweep of the kernel")
    args, report, _ = begin("transport_pool", ap)
    original_publish, original_name = _original_publish()
    report.copy_ceiling()
    report.ceilings["original"] = original_name
    # Room for a lease of the largest size and a copy_tensor lease beside it.
    pool = TransportPool(data_start(SLOTS, CONSUMERS) + 2 * SIZES[-1][1] + (1 << 20),
                         device="cuda:0", consumer_count=CONSUMERS, max_inflight_slices=SLOTS,
                         recycle_interval=None, name="bench")
    for name, nbytes in SIZES:
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
            original_publish(pool.tensor, src, lease.start, lease.ready_byte_offset,
                             lease.generation)

        def ours_copy_tensor():
            pool.release(pool.copy_tensor(src)[0])

        def original_copy_tensor():  # what copy_tensor does, the original's publish in ours'
            leased = pool.lease(nbytes)
            original_publish(pool.tensor, src, leased.start, leased.ready_byte_offset,
                             leased.generation)
            pool.tensor[leased.start:leased.start + nbytes]  # copy_tensor returns this view
            pool.release(leased)

        exact = True
        for publish in (ours_tensor, ours_args, ours_same_device, original):
            dst.zero_()
            ready.zero_()
            publish()
            torch.cuda.synchronize()
            exact &= torch.equal(dst, src) and int(ready) == lease.generation
        leased, view = pool.copy_tensor(src)
        torch.cuda.synchronize()
        word = pool.tensor[leased.ready_byte_offset:leased.ready_byte_offset + 4]
        exact &= torch.equal(view, src) and int(word.view(torch.int32)) == leased.generation
        pool.release(leased)

        tuning_us = {}
        for variant in TUNING if args.all else ():
            def launch(variant=variant):
                m._launch(m._publish_kernel, pool.tensor, src, lease_t, state, SLOTS, CONSUMERS,
                          **variant)
            tuning_us[_variant_name(variant)] = graph_replay_us(launch)
        # Eager wall time of whole calls, back to back: each API against the original.
        walls = {"publish": (wall_us(ours_tensor), wall_us(original)),
                 "copy_tensor": (wall_us(ours_copy_tensor), wall_us(original_copy_tensor))}
        timed = {"copy_us": lambda: median_us(lambda: dst.copy_(src)),
                 "original_us": lambda: median_us(original),
                 "ours_us": lambda: median_us(ours_tensor),
                 "ours_args_us": lambda: median_us(ours_args),
                 "copy_graph_us": lambda: graph_replay_us(lambda: dst.copy_(src)),
                 "original_graph_us": lambda: graph_replay_us(original),
                 "ours_graph_us": lambda: graph_replay_us(ours_tensor),
                 "ours_args_graph_us": lambda: graph_replay_us(ours_args),
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
                         rounds=rounds, copy_bandwidth_TBps=[bw / 1e6 for bw in bandwidths])
        row.update({key: statistics.median(r[key] for r in rounds) for key in rounds[0]})
        row["tuning_bw_ratio"] = {k: row["floor_us"] / us for k, us in tuning_us.items()}
        row["speedup_vs_original"] = row["original_us"] / row["ours_us"]
        row["system_scope_graph_cost_us"] = row["ours_graph_us"] - row["same_device_graph_us"]
        _per_api(row, walls)
        pool.release(lease)
    _peer_read_rows(report, pool)
    pool.shutdown()
    rows = {r["size"]: r for r in report.rows}
    for size, key, op, goal in BARS:
        report.check_bar(rows[size], key, op, goal)

    report.write(args.out, ["size", "bit_exact", "floor_us", "copy_graph_us",
                            "original_graph_us", "publish.graph_us",
                            "publish.graph_speedup_vs_original", "copy_tensor.graph_us",
                            "copy_tensor.graph_speedup_vs_original",
                            "publish.original_eager_wall_us", "publish.eager_wall_us",
                            "publish.eager_wall_speedup_vs_original",
                            "copy_tensor.original_eager_wall_us", "copy_tensor.eager_wall_us",
                            "copy_tensor.eager_wall_speedup_vs_original",
                            "copy_us", "original_us", "ours_us", "ours_args_us",
                            "ours_bw_ratio", "ours_graph_bw_ratio", "original_graph_bw_ratio",
                            "copy_graph_bw_ratio", "speedup_vs_original", "same_device_us",
                            "same_device_graph_us", "system_scope_graph_cost_us",
                            "peer_read_us", "peer_copy_us", "peer_read_GBps", "peer_copy_GBps",
                            "peer_read_vs_copy"],
                 plot=bar_plot("size", SERIES, "copy_and_publish", legend_fontsize=6))
    for bar in report.bars:
        print("bar:", bar)
    for r in (r for r in report.rows if "rounds" in r):
        print(r["size"], "rounds (floor/time, graph):",
              ", ".join(f"ours {x['ours_graph_bw_ratio']:.3f} original "
                        f"{x['original_graph_bw_ratio']:.3f} copy_ {x['copy_graph_bw_ratio']:.3f}"
                        for x in r["rounds"]))
        print(r["size"], "ours / original, graph and eager wall:", ", ".join(
            f"{api} {r[api]['graph_speedup_vs_original']:.3f}x "
            f"{r[api]['eager_wall_speedup_vs_original']:.3f}x" for api in APIS))
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


if __name__ == "__main__":
    main()
