"""Drive copy_and_publish with lease values that do not fit, for compute-sanitizer (run by
.ci/gpu for every ``tests/adversarial_*.py``).

    compute-sanitizer --tool memcheck python3 tests/adversarial_transport_pool.py

Every field of a fitting lease is replaced in turn by values past its bounds and by int64
extremes, read from a lease tensor and passed as kernel arguments; each call must leave the
pool and the state equal to the reference (a refused lease writes nothing and is counted), and
the sanitizer must report no out-of-bounds access.
"""

import torch

from strictops.meta.transport_pool import Lease, data_start, slot_bytes
from strictops.ops import copy_and_publish
from strictops.ops import transport_pool as op


def main() -> None:
    slots, consumers = 5, 2
    start0 = data_start(slots, consumers)
    memory_size = start0 + 64 * 1024 + 100
    gen = torch.Generator(device="cuda").manual_seed(0)
    pool = torch.randint(0, 256, (memory_size,), device="cuda", dtype=torch.uint8, generator=gen)
    src = torch.randn(5000, device="cuda", generator=gen)  # 20000 bytes
    ready = 3 * slot_bytes(consumers)
    good = Lease(start0 + 512, start0 + 512 + 20224, 19999, 3, 7, ready, ready + 4)
    extremes = [-1, 0, 1, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, -(2**63), memory_size,
                memory_size + 1, start0 - 4, 20001]
    cases = 0
    for field in Lease._fields:
        for value in extremes + [getattr(good, field) + d for d in (-256, -4, -1, 1, 4, 256)]:
            lease = good._replace(**{field: value})
            for as_tensor in (True, False):
                state = op.new_state("cuda")
                expected = op.reference(pool, src, lease, state, slots, consumers)
                if as_tensor:
                    copy_and_publish(pool, src, torch.tensor(lease, device="cuda"), state, slots,
                                     consumers)
                else:
                    with torch.cuda.device(pool.device):
                        op._launch(op._publish_kernel, pool, src, state, state, slots, consumers,
                                   values=lease)
                assert torch.equal(pool, expected[0]) and torch.equal(state, expected[1]), lease
                cases += 1
    torch.cuda.synchronize()
    print(f"adversarial_transport_pool: {cases} calls, all equal to the reference")


if __name__ == "__main__":
    main()
