"""Fault injection for the transport pool, with processes (run by
``tests/test_transport_runtime.py`` on one GPU and on two; needs cuda-bindings).

    python tests/gpu_transport_faults.py SCENARIO [--consumer-devices 1 0]

The pool is on ``cuda:0``; consumer process ``r`` maps it on ``cuda:{consumer_devices[r]}``
(default: both on ``cuda:0``), so with ``1 0`` consumer 0 is a peer on a second GPU: its waits
and acks run on its own device, and its watchdog's abort goes to the pool's ready word through
its peer mapping.

consumer-killed
    One producer streams 2,000 1 MiB tensors through a pool of 16 slots to two consumer
    processes; consumer 1 is SIGKILLed after 500. The producer must keep publishing: the
    recycler finds the dead process within a second and drops rank 1, the pool's capacity
    comes back within a second of that, every one of the survivor's 2,000 checksums is right,
    and every lease is recycled at the end.
producer-killed
    A producer process publishes 100 tensors to two consumer processes, then enqueues three
    more behind a long GPU sleep, hands out their leases and is SIGKILLed. Each consumer
    receives the 100 with the right checksums, and for each of the three raises
    ``TimeoutError`` within its timeout (2 s) plus 1 s; then it exits by itself, status 0.
never-published
    The producer hands out a lease and never publishes it: both consumers raise
    ``TimeoutError`` within 2 s + 1 s, then receive the next lease, published normally, with the
    right checksum, and exit cleanly; the producer publishes the first lease late, and both
    leases are recycled.
wrong-acks
    A consumer acknowledges a stale generation of a slot, and another slot's generation: nothing
    is freed until the right acknowledgements arrive; the consumer's own API refuses both.

Prints ``SCENARIO: ok`` and exits 0, or prints what failed and exits 1. Every process dumps
its stack and exits if it runs past ``LIMIT_S``, so a hang fails instead of hanging.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import queue
import signal
import sys
import time
import traceback

import torch
import torch.multiprocessing as mp

from strictops.meta.transport.pool import data_start
from strictops.ops import TransportConsumer, TransportPool
from strictops.ops.transport import cuda_stream as _cuda_stream
from strictops.ops.transport import pool as op

LIMIT_S = float(os.environ.get("STRICTOPS_FAULTS_LIMIT_S", 120))
TIMEOUT_S = 2.0
# Consumers launch their checksum kernels once before their first wait (see ``_consumer``);
# ``STRICTOPS_FAULTS_COLD=1`` leaves that out, to show the lazy-loading hazard it avoids.
COLD = os.environ.get("STRICTOPS_FAULTS_COLD") == "1"


def checksum(t: torch.Tensor) -> int:
    """Sum of byte * (position mod 65521 + 1): a swapped, shifted or stale byte changes it."""
    b = t.reshape(-1).view(torch.uint8).to(torch.int64)
    weights = torch.arange(b.numel(), device=b.device, dtype=torch.int64) % 65521 + 1
    return int((b * weights).sum())


def _bounded() -> None:
    faulthandler.dump_traceback_later(LIMIT_S, exit=True)


def _consumer(rank: int, device: int, inbox, outbox) -> None:
    """Attach with the first message; then for each ``(i, lease, numel, expected)``: receive,
    synchronize, check. Reports ``(rank, i, ok, seconds)`` per lease, with ``ok`` "timeout"
    when the wait was aborted; ends on None, or when nothing comes for 5 s."""
    _bounded()
    try:
        torch.cuda.set_device(device)
        if not COLD:
            # With CUDA's lazy loading a kernel is loaded at its first launch, which may wait
            # for the device to be idle; behind a wait that is never published that is never,
            # and the watchdog's own launches then block too (docs/reliability.md).
            for nbytes in (1, 4096, 8192, 65536, 1 << 20):  # the sizes the scenarios send
                checksum(torch.zeros(nbytes, dtype=torch.uint8, device="cuda"))
        reader = TransportConsumer.attach(inbox.get(timeout=60), rank, device=device)
        while True:
            try:
                msg = inbox.get(timeout=5)
            except queue.Empty:
                break
            if msg is None:
                break
            i, lease, numel, expected = msg
            start = time.monotonic()
            try:
                got = checksum(reader.receive(lease, torch.uint8, (numel,), timeout=TIMEOUT_S))
                reader.synchronize()
                ok = got == expected
            except TimeoutError as exc:
                ok = "timeout" if f"generation={lease.generation})" in str(exc) else str(exc)
            outbox.put((rank, i, ok, time.monotonic() - start))
        reader.close()
        outbox.put((rank, "done", None, 0.0))
    except BaseException:
        outbox.put((rank, "error", traceback.format_exc(), 0.0))


# Where each consumer process maps the pool (set from the command line).
CONSUMER_DEVICES = [0, 0]


def _start_consumers(ctx, count: int):
    """Consumer processes, each with its own inbox and outbox: a process killed while it holds
    a queue's lock must not block the others' queues."""
    inboxes = [ctx.Queue() for _ in range(count)]
    outboxes = [ctx.Queue() for _ in range(count)]
    procs = [ctx.Process(target=_consumer, args=(r, CONSUMER_DEVICES[r], inboxes[r],
                                                 outboxes[r]))
             for r in range(count)]
    for p in procs:
        p.start()
    return inboxes, outboxes, procs


def _collect(outbox, errors: list) -> list:
    """One consumer's reports ``(i, ok, seconds)`` until it says done."""
    reports = []
    while True:
        try:
            rank, i, ok, seconds = outbox.get(timeout=60)
        except queue.Empty:
            errors.append("a consumer was silent for 60 s")
            return reports
        if i in ("done", "error"):
            if i == "error":
                errors.append(f"consumer {rank}: {ok}")
            return reports
        reports.append((i, ok, seconds))


def _join(procs, errors: list) -> None:
    for p in procs:
        p.join(timeout=30)
        if p.exitcode != 0 and p.exitcode != -signal.SIGKILL:
            errors.append(f"process {p.pid} exit code {p.exitcode}")


def _random_bytes(gen: torch.Generator, nbytes: int) -> torch.Tensor:
    return torch.randint(0, 256, (nbytes,), device="cuda", dtype=torch.uint8, generator=gen)


def consumer_killed(errors: list) -> None:
    ctx = mp.get_context("spawn")
    slots, nbytes, transfers, kill_after = 16, 1 << 20, 2000, 500
    pool = TransportPool(data_start(slots, 2) + slots * nbytes, device="cuda:0",
                         consumer_count=2, max_inflight_slices=slots, recycle_interval=0.0005,
                         liveness_interval=0.05, name="faults")
    inboxes, outboxes, procs = _start_consumers(ctx, 2)
    handle = pool.export_handle()
    for inbox in inboxes:
        inbox.put(handle)
    gen = torch.Generator(device="cuda").manual_seed(0)
    t_kill = t_drop = None
    stall_after_drop = 0.0
    for i in range(transfers):
        src = _random_bytes(gen, nbytes)
        expected = checksum(src)
        start = time.monotonic()
        while (lease := pool.copy_tensor(src)[0]) is None:
            if t_drop is None and pool.dropped_consumers:
                t_drop = time.monotonic()
            if time.monotonic() - start > 30:
                errors.append(f"transfer {i}: the pool stayed full for 30 s")
                return
            time.sleep(0.0002)
        if t_drop is None and pool.dropped_consumers:
            t_drop = time.monotonic()
        if t_drop is not None:
            stall_after_drop = max(stall_after_drop, time.monotonic() - max(start, t_drop))
        for rank, inbox in enumerate(inboxes):
            if rank not in pool.dropped_consumers:
                inbox.put((i, lease, nbytes, expected))
        if i + 1 == kill_after:
            os.kill(procs[1].pid, signal.SIGKILL)
            inboxes[1].cancel_join_thread()  # its feeder may block on a pipe nobody reads
            t_kill = time.monotonic()
    dropped = set(pool.dropped_consumers)  # the survivor's clean exit below is seen too
    inboxes[0].put(None)
    reports = _collect(outboxes[0], errors)
    _join(procs, errors)
    deadline = time.monotonic() + 10
    while pool.active_lease_count and time.monotonic() < deadline:
        time.sleep(0.01)
    print(f"killed after {kill_after}: dropped {dropped} during the stream, "
          f"{(t_drop - t_kill) if t_drop else float('nan'):.3f} s after the kill; longest "
          f"full-pool wait after the drop {stall_after_drop:.3f} s; survivor "
          f"{len(reports)} receipts, {sum(ok is not True for _, ok, _ in reports)} bad; "
          f"{pool.active_lease_count} leases left, {pool.error_count()} refused")
    if dropped != {1} or t_drop is None or t_drop - t_kill > 1.0:
        errors.append("the dead consumer was not dropped within 1 s")
    if stall_after_drop > 1.0:
        errors.append("capacity did not come back within 1 s of the drop")
    if sorted(i for i, _, _ in reports) != list(range(transfers)):
        errors.append("the survivor missed transfers")
    if any(ok is not True for _, ok, _ in reports):
        errors.append("the survivor read wrong bytes")
    if pool.active_lease_count or pool.error_count():
        errors.append("leases left or publishes refused")
    pool.shutdown()


def _producer_then_killed(inboxes, control) -> None:
    _bounded()
    torch.cuda.set_device(0)
    pool = TransportPool(data_start(16, 2) + (16 << 20), device="cuda:0", consumer_count=2,
                         max_inflight_slices=16, recycle_interval=0.0005, name="faults")
    handle = pool.export_handle()
    for inbox in inboxes:
        inbox.put(handle)
    gen = torch.Generator(device="cuda").manual_seed(1)
    for i in range(103):
        if i == 100:
            torch.cuda._sleep(int(60e9))  # ~30 s of GPU time: the next publishes wait behind it
        src = _random_bytes(gen, 64 << 10)
        expected = checksum(src) if i < 100 else -1
        while (lease := pool.copy_tensor(src)[0]) is None:
            time.sleep(0.0002)
        for inbox in inboxes:
            inbox.put((i, lease, src.numel(), expected))
    control.put("published")
    time.sleep(LIMIT_S)


def producer_killed(errors: list) -> None:
    ctx = mp.get_context("spawn")
    inboxes, outboxes, procs = _start_consumers(ctx, 2)
    control = ctx.Queue()
    producer = ctx.Process(target=_producer_then_killed, args=(inboxes, control))
    producer.start()
    control.get(timeout=60)
    time.sleep(0.2)
    os.kill(producer.pid, signal.SIGKILL)
    producer.join(timeout=30)
    reports = [_collect(outbox, errors) for outbox in outboxes]
    _join(procs, errors)
    for rank, got in enumerate(reports):
        good = [ok for i, ok, _ in got if i < 100]
        stuck = [(ok, s) for i, ok, s in got if i >= 100]
        print(f"consumer {rank}: {good.count(True)}/100 right; stuck leases: "
              + ", ".join(f"{ok} after {s:.2f} s" for ok, s in stuck))
        if good != [True] * 100:
            errors.append(f"consumer {rank}: wrong or missing bytes before the kill")
        if len(stuck) != 3 or any(ok != "timeout" or s > TIMEOUT_S + 1 for ok, s in stuck):
            errors.append(f"consumer {rank}: a stuck lease did not time out within "
                          f"{TIMEOUT_S} + 1 s")


def never_published(errors: list) -> None:
    ctx = mp.get_context("spawn")
    pool = TransportPool(data_start(16, 2) + (1 << 20), device="cuda:0", consumer_count=2,
                         max_inflight_slices=16, recycle_interval=0.0005, name="faults")
    inboxes, outboxes, procs = _start_consumers(ctx, 2)
    handle = pool.export_handle()
    gen = torch.Generator(device="cuda").manual_seed(2)
    withheld = pool.lease(4096)  # handed out, never published (until the end)
    src = _random_bytes(gen, 8192)
    for inbox in inboxes:
        inbox.put(handle)
        inbox.put((0, withheld, withheld.nbytes, -1))
    first = []  # both time out first
    for rank, outbox in enumerate(outboxes):
        try:
            first.append(outbox.get(timeout=30)[1:])
        except queue.Empty:
            errors.append(f"consumer {rank} reported nothing within 30 s of a lease never "
                          f"published: its wait of {TIMEOUT_S} s was not aborted")
            for p in procs:
                p.kill()
            pool.shutdown()
            return
    lease, _ = pool.copy_tensor(src)
    for inbox in inboxes:
        inbox.put((1, lease, src.numel(), checksum(src)))
        inbox.put(None)
    reports = [[seen] + _collect(outbox, errors) for seen, outbox in zip(first, outboxes)]
    _join(procs, errors)
    # The late publish overwrites the abort word; both consumers acknowledged the lease.
    late = torch.tensor(withheld, dtype=torch.int64, device="cuda")
    pool.publish(_random_bytes(gen, withheld.nbytes), late, op.new_state("cuda"))
    deadline = time.monotonic() + 10
    while pool.active_lease_count and time.monotonic() < deadline:
        time.sleep(0.01)
    for rank, got in enumerate(reports):
        print(f"consumer {rank}: " + ", ".join(f"lease {i}: {ok} after {s:.2f} s"
                                               for i, ok, s in got))
        if [(i, ok) for i, ok, _ in got] != [(0, "timeout"), (1, True)] or (
                got[0][2] > TIMEOUT_S + 1):
            errors.append(f"consumer {rank}: expected a timeout within {TIMEOUT_S} + 1 s, "
                          f"then the right bytes")
    if pool.active_lease_count:
        errors.append(f"{pool.active_lease_count} leases left after the late publish")
    pool.shutdown()


def wrong_acks(errors: list) -> None:
    pool = TransportPool(data_start(4, 2) + (1 << 20), device="cuda:0", consumer_count=2,
                         max_inflight_slices=4, recycle_interval=None, name="faults")
    readers = [TransportConsumer.local(pool, rank) for rank in range(2)]
    src = torch.arange(1000, device="cuda", dtype=torch.int32)
    for _ in range(2):  # slot 0 reaches generation 3, slot 1 stays at 1
        lease, _ = pool.copy_tensor(src)
        for reader in readers:
            reader.receive(lease, src.dtype, src.shape)
        torch.cuda.synchronize()
        assert pool.recycle() == [lease]
    first, _ = pool.copy_tensor(src)
    second, _ = pool.copy_tensor(src)
    assert (first.slot, first.generation, second.slot, second.generation) == (0, 3, 1, 1)
    stream = torch.cuda.current_stream()
    for rank in range(2):
        for word, value in [(first.ack_byte_offset, first.generation - 1),  # stale
                            (first.ack_byte_offset, second.generation),  # another slot's
                            (second.ack_byte_offset, first.generation)]:
            _cuda_stream.write_value32(stream, pool.base_address + word + 4 * rank, value)
    torch.cuda.synchronize()
    if pool.recycle() != [] or pool.active_lease_count != 2:
        errors.append("a wrong acknowledgement freed a lease")
    for bad, kind in [(first._replace(slot=1), ValueError),
                      (first._replace(generation=2), RuntimeError)]:
        try:
            readers[0].acknowledge(bad)
            errors.append(f"the consumer acknowledged {bad}")
        except kind:
            pass
    for reader in readers:
        for lease in (first, second):
            if not torch.equal(reader.receive(lease, src.dtype, src.shape), src):
                errors.append("wrong bytes")
    torch.cuda.synchronize()
    if sorted(pool.recycle()) != sorted([first, second]):
        errors.append("the right acknowledgements did not free the leases")
    print(f"stale and cross-slot acknowledgements freed nothing; {pool.active_lease_count} left")
    pool.shutdown()


SCENARIOS = {"consumer-killed": consumer_killed, "producer-killed": producer_killed,
             "never-published": never_published, "wrong-acks": wrong_acks}


def main() -> int:
    _bounded()
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--consumer-devices", type=int, nargs=2, default=CONSUMER_DEVICES)
    args = ap.parse_args()
    scenario = args.scenario
    CONSUMER_DEVICES[:] = args.consumer_devices
    if scenario == "wrong-acks" and CONSUMER_DEVICES != [0, 0]:
        raise SystemExit("wrong-acks runs its consumers in the producer's process, on cuda:0")
    errors: list[str] = []
    start = time.monotonic()
    SCENARIOS[scenario](errors)
    for e in errors:
        print(e, file=sys.stderr)
    print(f"{scenario}: {'ok' if not errors else 'FAILED'} ({time.monotonic() - start:.1f} s)")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
