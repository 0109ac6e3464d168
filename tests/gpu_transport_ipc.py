"""One producer and consumer processes exchanging tensors through a transport pool over CUDA IPC,
each consumer on the GPU it is given (run by ``tests/test_transport_pool.py`` on one GPU and on
two; needs cuda-bindings).

    python tests/gpu_transport_ipc.py --transfers 10000 [--consumer-devices 0 1] [--mode MODE]

The pool is on ``cuda:0``; consumer ``r`` maps it on ``cuda:{consumer_devices[r]}`` (a peer
mapping over NVLink when that is not ``cuda:0``), waits and acknowledges on that device's
stream and reads the bytes over the mapping. Modes:

transfers
    Tensors of random size (log-uniform, 1 B to 64 MiB) and dtype, published by
    ``copy_tensor`` into a pool too small to hold many of them at once (retrying while it is
    full); each lease goes with a position-weighted checksum of its bytes to every consumer,
    which receives it (wait, copy out, acknowledge) and checks the checksum.
graph
    One ``publish`` captured in a CUDA graph and replayed into a new lease each time (the lease
    and the source written before each replay): random sizes up to 4 MiB and random dtypes,
    checked by checksum as above.
stress
    Many small transfers (16 B to 64 KiB, multiples of 8) through 16 slots and 1 MiB, so that
    ranges are reused at once. Each lease is handed out before it is published (sometimes
    behind a short GPU sleep), so the consumers' waits are often enqueued first; the source's
    first and last 8 bytes hold the transfer's index. Each consumer, on its stream, checks the
    last 8 bytes of the range (and the first 8) as soon as its wait returns, before anything
    else, counting mismatches on the device, then acknowledges.

At the end every lease must have been recycled and no publish refused. Prints one summary line;
exits 1 on any mismatch, leak or error. Every process dumps its stack and exits after
``LIMIT_S``, so a hang fails instead of hanging.
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import queue
import random
import sys
import time
import traceback

import torch
import torch.multiprocessing as mp

from strictops.meta.testing import capture_cuda_graph
from strictops.meta.transport.pool import data_start
from strictops.ops import TransportConsumer, TransportPool
from strictops.ops.transport import pool as op

DTYPES = [torch.uint8, torch.bool, torch.int16, torch.float16, torch.bfloat16, torch.float32,
          torch.int64, torch.float64]
LIMIT_S = 1800
# Per mode: largest transfer, slots, data bytes of the pool.
SHAPES = {"transfers": (64 << 20, 64, 256 << 20), "graph": (4 << 20, 64, 64 << 20),
          "stress": (64 << 10, 16, 1 << 20)}


def checksum(t: torch.Tensor) -> int:
    """Sum of byte * (position mod 65521 + 1): a swapped, shifted or stale byte changes it."""
    b = t.reshape(-1).view(torch.uint8).to(torch.int64)
    weights = torch.arange(b.numel(), device=b.device, dtype=torch.int64) % 65521 + 1
    return int((b * weights).sum())


def consumer(rank: int, device: int, mode: str, handle, inbox, outbox) -> None:
    faulthandler.dump_traceback_later(LIMIT_S, exit=True)
    try:
        torch.cuda.set_device(device)
        pool = TransportConsumer.attach(handle, rank, device=device)
        assert pool.pool.device == torch.device("cuda", device), pool.pool.device
        mismatches = torch.zeros((), dtype=torch.int64, device=device)
        while (msg := inbox.get(timeout=600)) is not None:
            i, lease, dtype, numel, expected = msg
            if mode == "stress":
                pool.wait(lease)
                words = pool.view(lease, torch.int64, (lease.nbytes // 8,))
                mismatches += (words[-1] != i).to(torch.int64) + (words[0] != i).to(torch.int64)
                pool.acknowledge(lease)
                continue
            got = checksum(pool.receive(lease, dtype, (numel,)))
            outbox.put((rank, i, got == expected))
        pool.synchronize()
        outbox.put((rank, "stress", int(mismatches)))
        outbox.put((rank, "done", None))
    except BaseException:
        outbox.put((rank, "error", traceback.format_exc()))


def _source(rng: random.Random, gen: torch.Generator, max_bytes: int) -> torch.Tensor:
    nbytes = int(math.exp(rng.uniform(0.0, math.log(max_bytes))))
    dtype = rng.choice(DTYPES)
    numel = max(1, nbytes // dtype.itemsize)
    if dtype.is_floating_point:
        return torch.randn(numel, device="cuda", generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), device="cuda", generator=gen).bool()
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), (numel,),
                         device="cuda", generator=gen, dtype=dtype)


def _leased(pool: TransportPool, nbytes: int, stats: dict):
    start = time.monotonic()
    while (lease := pool.lease(nbytes)) is None:
        stats["full_retries"] += 1  # the consumers free ranges as they acknowledge
        if time.monotonic() - start > 120:
            raise RuntimeError("the pool stayed full for 120 s")
        time.sleep(0.0002)
    return lease


def produce_transfers(pool, send, count, rng, gen, stats) -> None:
    for i in range(count):
        src = _source(rng, gen, SHAPES["transfers"][0])
        expected = checksum(src)
        while (published := pool.copy_tensor(src))[0] is None:
            stats["full_retries"] += 1
            time.sleep(0.0002)
        send((i, published[0], src.dtype, src.numel(), expected))


def produce_graph(pool, send, count, rng, gen, stats) -> None:
    max_bytes = SHAPES["graph"][0]
    src = torch.zeros(max_bytes, dtype=torch.uint8, device="cuda")
    lease_t = torch.zeros(len(op.Lease._fields), dtype=torch.int64, device="cuda")
    state = op.new_state("cuda")
    # The warm-up call before capture publishes the zero lease: refused and counted.
    graph, _ = capture_cuda_graph(pool.publish, src, lease_t, state)
    for i in range(count):
        data = _source(rng, gen, max_bytes)
        nbytes = data.numel() * data.element_size()
        lease = _leased(pool, nbytes, stats)
        src[:nbytes].copy_(data.view(-1).view(torch.uint8))
        lease_t.copy_(torch.tensor(lease))
        graph.replay()
        send((i, lease, data.dtype, data.numel(), checksum(data)))
    torch.cuda.synchronize()
    stats["refused"] = int(state[op.ERRORS]) - 1  # all but the warm-up's


def produce_stress(pool, send, count, rng, gen, stats) -> None:
    state = op.new_state("cuda")
    for i in range(count):
        nbytes = 8 * rng.randint(2, SHAPES["stress"][0] // 8)
        src = torch.randint(0, 2**62, (nbytes // 8,), device="cuda", generator=gen)
        src[0] = src[-1] = i
        lease = _leased(pool, nbytes, stats)
        lease_t = torch.tensor(lease, device="cuda")
        send((i, lease, torch.int64, nbytes // 8, None))  # before it is published
        if rng.random() < 0.1:
            torch.cuda._sleep(rng.randint(1000, 200_000))  # the waits are enqueued first
        pool.publish(src, lease_t, state)
    torch.cuda.synchronize()
    stats["refused"] = int(state[op.ERRORS])


PRODUCERS = {"transfers": produce_transfers, "graph": produce_graph, "stress": produce_stress}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transfers", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--consumer-devices", type=int, nargs="+", default=[0, 0])
    ap.add_argument("--mode", choices=sorted(PRODUCERS), default="transfers")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(LIMIT_S, exit=True)

    consumers = len(args.consumer_devices)
    _, slots, data_bytes = SHAPES[args.mode]
    ctx = mp.get_context("spawn")
    torch.cuda.set_device(0)
    pool = TransportPool(data_start(slots, consumers) + data_bytes, device="cuda:0",
                         consumer_count=consumers, max_inflight_slices=slots,
                         recycle_interval=0.0005, name="ipc-test")
    handle = pool.export_handle()
    inboxes = [ctx.Queue() for _ in range(consumers)]
    outbox = ctx.Queue()
    procs = [ctx.Process(target=consumer, args=(r, d, args.mode, handle, inboxes[r], outbox))
             for r, d in enumerate(args.consumer_devices)]
    for p in procs:
        p.start()

    def send(msg):
        for inbox in inboxes:
            inbox.put(msg)

    rng, gen = random.Random(args.seed), torch.Generator(device="cuda").manual_seed(args.seed)
    results, errors, stress_bad = [], [], 0
    stats = {"full_retries": 0, "refused": 0}
    start = time.perf_counter()
    try:
        PRODUCERS[args.mode](pool, send, args.transfers, rng, gen, stats)
    except BaseException:
        errors.append(f"producer: {traceback.format_exc()}")
    send(None)
    done = 0
    while done < consumers:
        try:
            rank, i, ok = outbox.get(timeout=600)
        except queue.Empty:
            errors.append("consumers silent for 600 s")
            break
        if i == "done":
            done += 1
        elif i == "error":
            errors.append(f"consumer {rank}: {ok}")
            done += 1
        elif i == "stress":
            stress_bad += ok
        else:
            results.append(ok)
    for p in procs:
        p.join(timeout=60)
    deadline = time.monotonic() + 30
    while pool.active_lease_count and time.monotonic() < deadline:
        time.sleep(0.01)
    leaked = pool.active_lease_count
    refused = pool.error_count() + stats["refused"]
    pool.shutdown()
    receipts = len(results) if args.mode != "stress" else args.transfers * consumers
    bad = results.count(False) + stress_bad
    print(f"{args.mode}, consumers on {['cuda:%d' % d for d in args.consumer_devices]}: "
          f"{args.transfers} transfers, {receipts} receipts, {bad} corrupted, {leaked} leaked, "
          f"{refused} refused, {stats['full_retries']} full-pool retries, "
          f"{time.perf_counter() - start:.1f} s")
    for e in errors:
        print(e, file=sys.stderr)
    complete = args.mode == "stress" or len(results) == consumers * args.transfers
    return 0 if complete and not (bad or leaked or refused or errors) else 1


if __name__ == "__main__":
    raise SystemExit(main())
