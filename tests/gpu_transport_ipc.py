"""One producer and two consumer processes exchanging tensors through a transport pool over
CUDA IPC (run by ``tests/test_transport_pool.py`` on a GPU; needs cuda-bindings).

    python tests/gpu_transport_ipc.py --transfers 10000

The producer copies tensors of random size (log-uniform, 1 B to 64 MiB) and dtype into a pool
too small to hold many of them at once, retrying while the pool is full, and sends each lease
with a position-weighted checksum of its bytes to both consumers. Each consumer waits for the
lease in stream order, copies it out, acknowledges it and checks the checksum. At the end every
lease must have been recycled. Prints one summary line; exits 1 on any mismatch or leak.
"""

from __future__ import annotations

import argparse
import math
import queue
import random
import sys
import time
import traceback

import torch
import torch.multiprocessing as mp

from strictops.meta.transport_pool import data_start
from strictops.ops import TransportConsumer, TransportPool

DTYPES = [torch.uint8, torch.bool, torch.int16, torch.float16, torch.bfloat16, torch.float32,
          torch.int64, torch.float64]
MAX_BYTES = 64 << 20
CONSUMERS = 2
SLOTS = 64
POOL_DATA_BYTES = 256 << 20


def checksum(t: torch.Tensor) -> int:
    """Sum of byte * (position mod 65521 + 1): a swapped, shifted or stale byte changes it."""
    b = t.reshape(-1).view(torch.uint8).to(torch.int64)
    weights = torch.arange(b.numel(), device=b.device, dtype=torch.int64) % 65521 + 1
    return int((b * weights).sum())


def consumer(rank: int, handle, inbox, outbox) -> None:
    try:
        torch.cuda.set_device(0)
        pool = TransportConsumer.attach(handle, rank)
        while (msg := inbox.get()) is not None:
            i, lease, dtype, numel, expected = msg
            got = checksum(pool.receive(lease, dtype, (numel,)))
            outbox.put((rank, i, got == expected))
        outbox.put((rank, "done", None))
    except BaseException:
        outbox.put((rank, "error", traceback.format_exc()))


def _source(rng: random.Random, gen: torch.Generator) -> torch.Tensor:
    nbytes = int(math.exp(rng.uniform(0.0, math.log(MAX_BYTES))))
    dtype = rng.choice(DTYPES)
    numel = max(1, nbytes // dtype.itemsize)
    if dtype.is_floating_point:
        return torch.randn(numel, device="cuda", generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), device="cuda", generator=gen).bool()
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), (numel,),
                         device="cuda", generator=gen, dtype=dtype)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transfers", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    ctx = mp.get_context("spawn")
    pool = TransportPool(data_start(SLOTS, CONSUMERS) + POOL_DATA_BYTES, device="cuda:0",
                         consumer_count=CONSUMERS, max_inflight_slices=SLOTS,
                         recycle_interval=0.0005, name="ipc-test")
    handle = pool.export_handle()
    inboxes = [ctx.Queue() for _ in range(CONSUMERS)]
    outbox = ctx.Queue()
    procs = [ctx.Process(target=consumer, args=(r, handle, inboxes[r], outbox))
             for r in range(CONSUMERS)]
    for p in procs:
        p.start()

    rng, gen = random.Random(args.seed), torch.Generator(device="cuda").manual_seed(args.seed)
    results, errors, full_retries = [], [], 0
    start = time.perf_counter()
    for i in range(args.transfers):
        src = _source(rng, gen)
        expected = checksum(src)
        while (published := pool.copy_tensor(src))[0] is None:
            full_retries += 1  # the consumers free ranges as they acknowledge
            time.sleep(0.0002)
        lease = published[0]
        for inbox in inboxes:
            inbox.put((i, lease, src.dtype, src.numel(), expected))
    for inbox in inboxes:
        inbox.put(None)
    done = 0
    while done < CONSUMERS:
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
        else:
            results.append(ok)
    for p in procs:
        p.join(timeout=60)
    deadline = time.monotonic() + 30
    while pool.active_lease_count and time.monotonic() < deadline:
        time.sleep(0.01)
    leaked = pool.active_lease_count
    refused = pool.error_count()
    pool.shutdown()
    bad = results.count(False)
    print(f"{args.transfers} transfers, {len(results)} receipts, {bad} corrupted, {leaked} leaked, "
          f"{refused} refused, {full_retries} full-pool retries, "
          f"{time.perf_counter() - start:.1f} s")
    for e in errors:
        print(e, file=sys.stderr)
    complete = len(results) == CONSUMERS * args.transfers
    return 0 if complete and not (bad or leaked or refused or errors) else 1


if __name__ == "__main__":
    raise SystemExit(main())
