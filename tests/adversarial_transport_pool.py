"""Drive copy_and_publish and the pool runtime with leases that do not fit, sources of awkward
sizes and a pool that fills up, for compute-sanitizer (run by .ci/gpu for every
``tests/adversarial_*.py``).

    compute-sanitizer --tool memcheck python3 tests/adversarial_transport_pool.py

1. Refused leases: every field of a fitting lease is replaced in turn by values past its
   bounds and by int64 extremes, read from a lease tensor and passed as kernel arguments; each
   call must leave the pool and the state equal to the reference (a refused lease writes
   nothing and is counted).
2. Fitting leases for sources from 1 byte to over 16 MiB, each size ending mid-block for any
   power-of-two block size from 256 bytes up (whatever the launch's tuning): the reference
   again; then, for each size, one- and two-launch publishes forced at 4 KiB and 16 KiB blocks
   of the whole source and of a lease 17 bytes short of it (the two-launch flag program copies
   the partial last block of ``nbytes``, not of the source); the plain publishes with the flag
   released at system scope (consumers on peers, the default) and at GPU scope.
3. The runtime (needs cuda-bindings): ``copy_tensor`` until the pool refuses ``(None, None)``,
   consumers wait, read and acknowledge some leases in stream order, ``cancel_lease`` the
   others, and every lease is recycled; each received tensor equals its source. Then the
   faults: a lease handed out and not published, whose waits time out (the watchdog's abort
   kernel swaps its ready word) before a late publish recycles it, and a dropped consumer.

The pool and every source are exact-size allocations, so an access past either end is one the
sanitizer reports.
"""

import torch

from strictops.meta.transport.pool import Lease, data_start, slot_bytes
from strictops.ops import TransportConsumer, TransportPool, copy_and_publish
from strictops.ops.transport import pool as op


def _publish_and_check(pool, src, lease, slots, consumers, as_tensor: bool,
                       placement: str = "peers", **tuning) -> None:
    state = op.new_state("cuda")
    expected = op.reference(pool, src, lease, state, slots, consumers)
    if as_tensor and not tuning:
        copy_and_publish(pool, src, torch.tensor(lease, device="cuda"), state, slots, consumers,
                         placement)
    elif as_tensor:  # the op's kernel with a forced tuning
        with torch.cuda.device(pool.device):
            op._launch(op._publish_kernel, pool, src, torch.tensor(lease, device="cuda"), state,
                       slots, consumers, consumers=placement, **tuning)
    else:  # the pool's own eager path: the lease's fields as kernel arguments
        with torch.cuda.device(pool.device):
            op._launch(op._publish_kernel, pool, src, state, state, slots, consumers,
                       values=lease, consumers=placement, **tuning)
    assert torch.equal(pool, expected[0]) and torch.equal(state, expected[1]), lease


def _refused_leases(gen) -> int:
    slots, consumers = 5, 2
    start0 = data_start(slots, consumers)
    memory_size = start0 + 64 * 1024 + 100
    pool = torch.randint(0, 256, (memory_size,), device="cuda", dtype=torch.uint8, generator=gen)
    src = torch.randn(5000, device="cuda", generator=gen)  # 20000 bytes
    ready = 3 * slot_bytes(consumers)
    good = Lease(start0 + 512, start0 + 512 + 20224, 19999, 3, 7, ready, ready + 4)
    extremes = [-1, 0, 1, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, -(2**63), memory_size,
                memory_size + 1, start0 - 4, 20001]
    cases = 0
    for field in Lease._fields:
        for value in extremes + [getattr(good, field) + d for d in (-256, -4, -1, 1, 4, 256)]:
            for as_tensor in (True, False):
                _publish_and_check(pool, src, good._replace(**{field: value}), slots, consumers,
                                   as_tensor)
                cases += 1
    return cases


def _awkward_sources(gen) -> int:
    slots, consumers = 3, 1
    start0 = data_start(slots, consumers)
    sizes = [1, 3, 255, 4095, 4097, 16385, 5 * 8192 + 13, (16 << 20) + 4099]
    memory_size = start0 + max(sizes) + 256
    pool = torch.randint(0, 256, (memory_size,), device="cuda", dtype=torch.uint8, generator=gen)
    cases = 0
    for nbytes in sizes:
        src = torch.randint(0, 256, (nbytes,), device="cuda", dtype=torch.uint8, generator=gen)
        ready = 2 * slot_bytes(consumers)
        lease = Lease(start0, memory_size, nbytes, 2, 11 + cases, ready, ready + 4)
        for as_tensor in (True, False):
            for placement in ("peers", "same_device"):  # the flag's release scope
                _publish_and_check(pool, src, lease._replace(generation=11 + cases), slots,
                                   consumers, as_tensor, placement)
                cases += 1
        for short in (0, 17) if nbytes > 17 else (0,):
            for block_bytes in (4096, 16384):
                # One launch, then two: with the flag launch a programmatic dependent launch
                # (sm_90+) and without.
                for tuning in ({"two_launches": False}, {"two_launches": True, "pdl": True},
                               {"two_launches": True, "pdl": False}):
                    _publish_and_check(pool, src, lease._replace(nbytes=nbytes - short,
                                                                 generation=11 + cases),
                                       slots, consumers, True, block_bytes=block_bytes,
                                       **tuning)
                    cases += 1
    return cases


def _runtime(gen) -> int:
    slots, consumers = 6, 2
    pool = TransportPool(data_start(slots, consumers) + 8 * 4096, device="cuda",
                         consumer_count=consumers, max_inflight_slices=slots,
                         recycle_interval=None, name="adversarial")
    readers = [TransportConsumer.local(pool, rank) for rank in range(consumers)]
    try:
        published = []
        for i in range(slots + 1):  # a slot per lease: the last copy finds none free
            src = torch.randint(-100, 100, (1000 + 7 * i,), device="cuda", dtype=torch.int32,
                                generator=gen)
            lease, view = pool.copy_tensor(src)
            if lease is None:
                assert view is None and i == slots, i
                break
            published.append((lease, src))
        assert pool.copy_tensor(torch.ones(3000, device="cuda")) == (None, None)  # no slot
        for k, (lease, src) in enumerate(published):
            if k % 2:
                pool.cancel_lease(lease)
                continue
            for reader in readers:
                assert torch.equal(reader.receive(lease, src.dtype, src.shape), src), k
        torch.cuda.synchronize()
        recycled = pool.recycle()
        assert sorted(recycled) == sorted(lease for lease, _ in published), recycled
        assert pool.active_lease_count == 0 and pool.error_count() == 0
        return len(published) + _faults(pool, readers, gen)
    finally:
        pool.shutdown()


def _faults(pool, readers, gen) -> int:
    withheld = pool.lease(5000)
    for reader in readers:
        reader.receive(withheld, torch.uint8, (5000,), timeout=0.2)
    for reader in readers:
        try:
            reader.synchronize()
            raise AssertionError("a wait for an unpublished lease did not time out")
        except TimeoutError:
            pass
    late = torch.randint(0, 256, (5000,), device="cuda", dtype=torch.uint8, generator=gen)
    pool.publish(late, torch.tensor(withheld, device="cuda"), op.new_state("cuda"))
    torch.cuda.synchronize()
    assert pool.recycle() == [withheld]
    lease, _ = pool.copy_tensor(late)
    assert torch.equal(readers[0].receive(lease, torch.uint8, (5000,)), late)
    torch.cuda.synchronize()
    assert pool.drop_consumer(1) == [lease] and pool.active_lease_count == 0
    return 2


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = _refused_leases(gen) + _awkward_sources(gen) + _runtime(gen)
    torch.cuda.synchronize()
    print(f"adversarial_transport_pool: {cases} calls, all equal to the reference")


if __name__ == "__main__":
    main()
