"""Host cost of an eager publish: one launch (64 KiB) against two (16 MiB); cProfile of the latter."""
import cProfile, io, pstats, time, sys
import torch
from strictops.meta.transport_pool import data_start
from strictops.ops import transport_pool as m

pool = m.TransportPool(data_start(64, 2) + (32 << 20), device="cuda:0", consumer_count=2,
                       max_inflight_slices=64, recycle_interval=None, name="host")
state = m.new_state("cuda")

def per_call(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / n * 1e6
    return round(host, 1), round(wall, 1)

for nbytes in (64 << 10, 16 << 20):
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    lease = pool.lease(nbytes)
    lease_t = torch.tensor(lease, device="cuda")
    out = {
        "publish(tensor)": per_call(lambda: pool.publish(src, lease_t, state)),
        "_publish_lease(args)": per_call(lambda: pool._publish_lease(src, lease)),
        "_launch(tensor)": per_call(lambda: m._launch(m._publish_kernel, pool.tensor, src, lease_t, state, 64, 2)),
        "_launch(tensor, pdl off)": per_call(lambda: m._launch(m._publish_kernel, pool.tensor, src, lease_t, state, 64, 2, pdl=False)),
        "validate": per_call(lambda: m.contract.validate(pool.tensor, src, lease_t, state, 64, 2)),
    }
    print(nbytes, "(host us/call, wall us/call):", out, flush=True)
    if nbytes > (1 << 20):
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            pool.publish(src, lease_t, state)
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue()[:6000])
    pool.release(lease)
