"""GPU probe: persistent grid-stride copy (probe kernel .probe/persist_kernel.py) against the op's
one-block-per-program copy, 256 MiB and 16 MiB, graph replays, three passes."""
import json, sys, time
from pathlib import Path
import torch
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks")); sys.path.insert(0, str(REPO / ".probe"))
from _harness import copy_bandwidth_bytes_per_us, graph_replay_us
from strictops.meta.transport_pool import data_start, slot_bytes
from strictops.ops import transport_pool as m
from strictops.ops import _cuda_stream
from persist_kernel import persist_copy

SLOTS, CONS = 64, 2
SMS = torch.cuda.get_device_properties(0).multi_processor_count
out = {"rows": {}}
bw = copy_bandwidth_bytes_per_us(); out["bw_TBps"] = bw / 1e6
print(f"copy bandwidth {bw/1e6:.3f} TB/s", flush=True)
pool = m.TransportPool(data_start(SLOTS, CONS) + (256 << 20) + (1 << 20), device="cuda:0",
                       consumer_count=CONS, max_inflight_slices=SLOTS, recycle_interval=None, name="p")
state = m.new_state("cuda")

def fit(kernel, warps):
    regs = (kernel.n_regs + 7) // 8 * 8
    return min(2048 // (32 * warps), 65536 // (regs * 32 * warps), 32)

for name, n in (("256MiB", 256 << 20), ("16MiB", 16 << 20)):
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    lease = pool.lease(n)
    lease_t = torch.tensor(lease, device="cuda")
    dst = pool.tensor[lease.start:lease.start + n]
    ready = pool.tensor[lease.ready_byte_offset:lease.ready_byte_offset + 4].view(torch.int32)
    floor = 2 * n / bw
    base = (pool.tensor, src, lease_t, state, pool.tensor.shape[0], n, data_start(SLOTS, CONS),
            slot_bytes(CONS), SLOTS, *(0,) * 7)

    def persistent(block, warps, per_sm, flag):
        nb = n // block
        k = persist_copy[(1,)](pool.tensor, src, lease_t, 0, BLOCK=block, PDL=flag, num_warps=warps)
        grid = min(nb, SMS * min(per_sm, fit(k, warps)))
        def go():
            persist_copy[(grid,)](pool.tensor, src, lease_t, nb, BLOCK=block, PDL=flag, num_warps=warps)
            if flag:
                m._publish_kernel[(1,)](*base, LEASE_FROM_PTR=True, BLOCK=block, PHASE=m.PHASE_FLAG,
                                        PDL=True, launch_pdl=True, num_warps=4)
        return go, {"grid": grid, "regs": k.n_regs, "fit": fit(k, warps)}

    def real_copy_only(block, warps):
        def go():
            m._publish_kernel[(n // block,)](*base, LEASE_FROM_PTR=True, BLOCK=block, PHASE=m.PHASE_COPY,
                                             PDL=False, num_warps=warps)
        return go, {}

    def original():
        dst.copy_(src)
        _cuda_stream.write_value32(torch.cuda.current_stream(), pool.base_address + lease.ready_byte_offset,
                                   lease.generation)

    variants = {"op": (lambda: pool.publish(src, lease_t, state), {}),
                "copy-only/4K/8w": real_copy_only(4096, 8),
                "copy_": (lambda: dst.copy_(src), {}), "copy_+write": (original, {})}
    for block, warps, per_sm in [(4096, 8, 8), (4096, 8, 4), (4096, 8, 6), (8192, 8, 8), (8192, 8, 4),
                                 (4096, 4, 16), (4096, 4, 8), (2048, 4, 16), (2048, 2, 32), (16384, 16, 4)]:
        for flag in (False, True):
            if flag and (block, warps) not in ((4096, 8), (4096, 4), (8192, 8)):
                continue
            key = f"persist{'+pdlflag' if flag else ' copy-only'}/{block//1024}K/{warps}w/{per_sm}perSM"
            variants[key] = persistent(block, warps, per_sm, flag)
    row = {}
    for key, (go, info) in variants.items():
        dst.zero_(); ready.zero_(); torch.cuda.synchronize()
        go(); torch.cuda.synchronize()
        ok = torch.equal(dst, src)
        if "pdlflag" in key or key == "op" or key == "copy_+write":
            ok = ok and int(ready) == lease.generation
        row[key] = dict(info, ok=ok, us=[])
    for p, order in enumerate((list(variants), list(variants)[::-1], list(variants))):
        for key in order:
            if row[key]["ok"]:
                row[key]["us"].append(graph_replay_us(variants[key][0], rep=200))
    for key, r in row.items():
        if r["us"]:
            r["median_us"] = sorted(r["us"])[1]
            r["floor_ratio"] = floor / r["median_us"]
        print(f"{name} {key:<40} {' '.join(f'{u:8.2f}' for u in r['us'])} "
              f"{r.get('floor_ratio', 0):.3f} ok={r['ok']} {r.get('grid','')} regs={r.get('regs','')} fit={r.get('fit','')}", flush=True)
    out["rows"][name] = dict(floor_us=floor, variants=row)
    pool.release(lease)
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
