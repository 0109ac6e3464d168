"""ncu target: copy_ of 256 MiB (the floor's op) and the op's two-launch publish at 256 MiB."""
import torch
from strictops.meta.transport_pool import data_start
from strictops.ops import transport_pool as m
n = 256 << 20
src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
dst = torch.empty_like(src)
for _ in range(2):
    dst.copy_(src)
pool = m.TransportPool(data_start(64, 2) + n + (1 << 20), device="cuda:0", consumer_count=2,
                       max_inflight_slices=64, recycle_interval=None, name="ncu")
lease = pool.lease(n)
lease_t = torch.tensor(lease, device="cuda")
state = m.new_state("cuda")
for _ in range(2):
    pool.publish(src, lease_t, state)
torch.cuda.synchronize()
print("ok", int(state[1]))
