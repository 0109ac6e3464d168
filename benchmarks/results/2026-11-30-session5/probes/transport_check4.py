"""GPU check of copy_and_publish, session 5: the flag launch as a programmatic dependent launch
(PDL), cache modifiers and copy-program shapes, each candidate timed in two passes (in
opposite orders) to see the noise; plus a profile of the eager publish at 256 MiB (why its
do_bench median was 142 us against 134 us for the graph replay).

Run from the repository root on the GPU machine (strictops installed, cuda-bindings present
for the original path), under a minute on an H200:

    python .probe/transport_final_check.py --out $OUT/transport-final-check.json

CPU smoke (host logic only, kernels interpreted, no timing worth the name):

    /work/venv/bin/python .probe/transport_final_check.py --cpu-smoke --out /tmp/smoke.json

For 64 KiB, 1 MiB, 16 MiB, 256 MiB (the op's own TUNING for each), and two sizes with a partial
last block in two launches (1 MiB + 4099 B; 256 MiB with a lease 17 bytes short of its source):

* checks, before any timing, through ``TransportPool.publish`` with a lease tensor (the
  benchmark's path): the lease range poisoned with random bytes, the ready word zeroed, then
  the whole pool must equal the expected pool bit for bit (the lease's bytes and ready word
  written, nothing else) and ``state == [0, 0]``; the same for the lease 17 bytes short
  (partial last block); a refused lease (generation 0: pool unchanged, ``state[1]`` + 1);
  and one captured CUDA graph replayed into a new lease with new source bytes;
* times CUDA-graph replays (``benchmarks/_harness.graph_replay_us``: ``do_bench`` median, L2
  flushed before each replay) of the op, ``copy_`` + ``cuStreamWriteValue32`` (the original
  path) and ``copy_`` alone, against the floor (2 * bytes over the copy bandwidth measured in
  this run);
* at 256 MiB and 16 MiB, copy-phase candidates (block bytes / warps of the copy kernel; two
  launches, the flag program with TUNING's warps), each checked bit for bit first.

Prints a compact table and the bars (64 KiB op <= 7.0 us; 256 MiB op >= 0.95 of the floor);
writes everything (and each launch's ``n_regs``/``n_spills`` as loaded on the GPU) to the
JSON after every row.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from strictops.meta.transport_pool import ERRORS, data_start  # noqa: E402
from strictops.ops import transport_pool as m  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
SLOTS, CONSUMERS = 64, 2
# (name, source bytes, bytes the lease is short of the source)
SIZES = [("64KiB", 64 * KIB, 0), ("1MiB", MIB, 0), ("16MiB", 16 * MIB, 0),
         ("256MiB", 256 * MIB, 0), ("1MiB+4099", MIB + 4099, 0), ("256MiB-17", 256 * MIB, 17)]
# Copy-phase candidates (two launches): (block bytes, warps). ptxas sm_90 registers of the
# copy kernel, compiled on CPU: 4K/4w 27, 8K/4w 28, 16K/4w 40 (the op), 16K/8w 30, 32K/4w 78,
# 32K/8w 46.
def C(block, warps, two=True, pdl=True, lc="", sc="", fw=None):
    name = (f"{'2L' if two else '1L'}{'-pdl' if pdl and two else ''}/{block // KIB}K/{warps}w"
            + (f"/ld{lc}" if lc else "") + (f"/st{sc}" if sc else "")
            + (f"/flag{fw}w" if fw else ""))
    return name, dict(block_bytes=block, num_warps=warps, two_launches=two, pdl=pdl,
                      load_cache=lc, store_cache=sc, flag_num_warps=fw)


BIG = [C(4096, 4), C(4096, 8), C(4096, 8, fw=1), C(4096, 8, lc=".cg"), C(8192, 16),
       C(16384, 32), C(4096, 16), C(4096, 8, sc=".cg"), C(4096, 4, pdl=False),
       ("copy-only/4K/4w", dict(block_bytes=4096, num_warps=4, copy_only=True)),
       ("copy-only/4K/8w", dict(block_bytes=4096, num_warps=8, copy_only=True)),
       ("copy_", dict(baseline="copy")), ("copy_+write", dict(baseline="original"))]
MID = [C(4096, 4), C(4096, 8), C(16384, 4), C(16384, 8), C(8192, 16)]
SMALL = [C(4096, 4, two=False, pdl=False), C(4096, 4), C(4096, 8)]
CANDIDATES = {"64KiB": SMALL, "1MiB": SMALL, "16MiB": MID, "256MiB": BIG}
DIAGNOSTIC = ("copy_only", "baseline")
BARS = {"64KiB": ("op_us", "<=", 7.0), "256MiB": ("op_floor_ratio", ">=", 0.95)}
BUDGET_S = 200  # skip the remaining candidates past this (the script must stay under a minute)
SMOKE_SCALE = 1024  # --cpu-smoke: sizes divided by this (256 MiB -> 256 KiB), blocks too


def kernel_facts(launched) -> list:
    out = []
    for k in launched or []:
        fact = {}
        for attr in ("n_regs", "n_spills"):
            try:
                fact[attr] = getattr(k, attr)
            except Exception:  # noqa: BLE001
                pass
        out.append(fact)
    return out


class Check:
    def __init__(self, args):
        self.smoke = args.cpu_smoke
        self.out = Path(args.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        self.generation = 100
        self.result = {"env": {}, "op_tuning": repr(m.TUNING), "rows": {}, "bars": {}}
        scale = SMOKE_SCALE if self.smoke else 1
        self.sizes = [(name, n // scale + (n % scale if self.smoke else 0), short)
                      for name, n, short in SIZES]
        largest = max(n for _, n, _ in self.sizes)
        memory_size = data_start(SLOTS, CONSUMERS) + largest + MIB // scale
        if self.smoke:
            self.device = "cpu"
            self.bw = 4e6
            self.pool = _SmokePool(memory_size)
            self.cuda_stream = None
            self.result["env"] = {"device": "cpu-smoke"}
            self.gen = torch.Generator().manual_seed(0)
        else:
            from _harness import copy_bandwidth_bytes_per_us

            import triton

            self.device = "cuda"
            props = torch.cuda.get_device_properties(0)
            self.result["env"] = {"device": props.name, "sms": props.multi_processor_count,
                                  "torch": torch.__version__, "triton": triton.__version__,
                                  "cuda": torch.version.cuda}
            self.bw = copy_bandwidth_bytes_per_us()
            self.pool = m.TransportPool(memory_size, device="cuda:0", consumer_count=CONSUMERS,
                                        max_inflight_slices=SLOTS, recycle_interval=None,
                                        name="final-check")
            self.gen = torch.Generator(device="cuda").manual_seed(0)  # 256 MiB: on the GPU
            try:
                from strictops.ops import _cuda_stream

                _cuda_stream._driver()
                self.cuda_stream = _cuda_stream
            except ImportError as e:
                self.cuda_stream = None
                self.result["original_path_error"] = str(e)
        self.result["copy_bandwidth_TBps"] = self.bw / 1e6
        print(f"{self.result['env']['device']}: copy bandwidth {self.bw / 1e6:.3f} TB/s "
              f"(read + write); op TUNING {m.TUNING}", flush=True)

    # ------------------------------------------------------------------ helpers

    def elapsed(self):
        return time.time() - self.t0

    def sync(self):
        if not self.smoke:
            torch.cuda.synchronize()

    def random_bytes(self, n):
        return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=self.gen,
                             device=self.device)

    def next_generation(self):
        self.generation += 1
        return self.generation

    def launch(self, src, lease_t, state, **tuning):
        """The op (``TransportPool.publish``), or the op's kernel with forced ``tuning``."""
        if self.smoke:
            tuning = dict(tuning)
            if "block_bytes" in tuning:
                tuning["block_bytes"] = max(256, tuning["block_bytes"] // SMOKE_SCALE)
            else:  # the op's choice for the size this smoke size stands for
                full = src.numel() * SMOKE_SCALE
                tuning = {"block_bytes": max(256, m.block_bytes_for(full) // SMOKE_SCALE),
                          "two_launches": full > m.TUNING["two_launches_above"]}
            m.launch_interpreted(self.pool.tensor, src, lease_t, state, SLOTS, CONSUMERS,
                                 **tuning)
            return None
        if not tuning:
            self.pool.publish(src, lease_t, state)
            return None
        if tuning.get("copy_only"):  # the copy kernel alone, no flag: a diagnostic
            n = src.numel()
            args = (self.pool.tensor, src, lease_t, state, self.pool.tensor.shape[0], n,
                    data_start(SLOTS, CONSUMERS), m.contract.slot_bytes(CONSUMERS), SLOTS,
                    *(0,) * 7)
            return [m._publish_kernel[(n // tuning["block_bytes"],)](
                *args, LEASE_FROM_PTR=True, BLOCK=tuning["block_bytes"], PHASE=m.PHASE_COPY,
                PDL=False, LOAD_CACHE="", STORE_CACHE="", num_warps=tuning["num_warps"])]
        if "baseline" in tuning:
            dst = self.pool.tensor[self.cur_lease.start:self.cur_lease.start + src.numel()]
            dst.copy_(src)
            if tuning["baseline"] == "original":
                self.cuda_stream.write_value32(torch.cuda.current_stream(),
                                               self.pool.base_address
                                               + self.cur_lease.ready_byte_offset,
                                               int(self.cur_lease.generation))
            return None
        return m._launch(m._publish_kernel, self.pool.tensor, src, lease_t, state, SLOTS,
                         CONSUMERS, **tuning)

    def time_graph(self, fn, rep=None):
        if self.smoke:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e6
        from _harness import REP_MS, WARMUP_MS, graph_replay_us

        return graph_replay_us(fn, WARMUP_MS, rep or REP_MS)

    def capture(self, fn):
        """A replayable ``fn`` captured in a CUDA graph (``fn`` itself in the smoke run)."""
        if self.smoke:
            return fn
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        self.result.setdefault("_graphs", []).append(graph)  # kept alive
        return graph.replay

    # ------------------------------------------------------------------ checks

    def check_publish(self, publish, src, lease, lease_t, state, refused=False) -> bool:
        """Poison the lease's bytes, zero its ready word, new source bytes, ``publish()``;
        the whole pool and the state must be exactly what the reference says."""
        pool = self.pool.tensor
        src.copy_(self.random_bytes(src.numel()))
        pool[lease.start:lease.end] = self.random_bytes(lease.end - lease.start)
        pool[lease.ready_byte_offset:lease.ready_byte_offset + 4] = 0
        lease_t.copy_(torch.tensor(lease, dtype=torch.int64))
        state.zero_()
        self.sync()
        expected_pool, expected_state = m.reference(pool, src, lease_t, state, SLOTS, CONSUMERS)
        assert refused == bool(expected_state[ERRORS])
        publish()
        self.sync()
        return torch.equal(pool, expected_pool) and torch.equal(state, expected_state)

    def checks(self, src, lease, lease_t, state, **tuning) -> dict:
        short = lease._replace(nbytes=lease.nbytes - 17)
        go = lambda: self.launch(src, lease_t, state, **tuning)  # noqa: E731
        res = {
            "full": self.check_publish(go, src, lease._replace(
                generation=self.next_generation()), lease_t, state),
            "short17": self.check_publish(go, src, short._replace(
                generation=self.next_generation()), lease_t, state),
            "refused": self.check_publish(go, src, lease._replace(generation=0), lease_t, state,
                                          refused=True),
        }
        replay = self.capture(go)
        res["graph_replay"] = self.check_publish(replay, src, lease._replace(
            generation=self.next_generation()), lease_t, state)
        res["ok"] = all(res.values())
        return res

    # ------------------------------------------------------------------ the run

    def row(self, name, nbytes, short):
        src = self.random_bytes(nbytes)
        lease = self.pool.lease(nbytes)
        lease = lease._replace(nbytes=nbytes - short)
        lease_t = torch.tensor(lease, dtype=torch.int64, device=self.device)
        state = m.new_state(self.device)
        n = lease.nbytes
        floor_us = 2 * n / self.bw
        full = nbytes * SMOKE_SCALE if self.smoke else nbytes  # the size the op sees
        row = {"nbytes": n, "src_nbytes": nbytes, "floor_us": floor_us,
               "op_block_bytes": m.block_bytes_for(full),
               "op_two_launches": full > m.TUNING["two_launches_above"]}
        row["check"] = self.checks(src, lease, lease_t, state)
        # What the timings publish: the lease itself, fresh generation.
        lease_t.copy_(torch.tensor(lease._replace(generation=self.next_generation())))
        dst = self.pool.tensor[lease.start:lease.start + n]
        src_n = src[:n]
        if row["check"]["ok"]:
            row["op_us"] = self.time_graph(lambda: self.launch(src, lease_t, state))
            row["op_floor_ratio"] = floor_us / row["op_us"]
            if not self.smoke:
                row["op_kernels"] = kernel_facts(m._launch(
                    m._publish_kernel, self.pool.tensor, src, lease_t, state, SLOTS,
                    CONSUMERS))
        row["copy_us"] = self.time_graph(lambda: dst.copy_(src_n))
        if self.cuda_stream is not None:
            address = self.pool.base_address + lease.ready_byte_offset

            def original():  # the stream current at capture time: the write is in the graph
                dst.copy_(src_n)
                self.cuda_stream.write_value32(torch.cuda.current_stream(), address,
                                               lease.generation)

            row["original_us"] = self.time_graph(original)
            if "op_us" in row:
                row["op_vs_original"] = row["original_us"] / row["op_us"]
        if name in CANDIDATES:
            row["candidates"] = {}
            self.cur_lease = lease
            for cname, tuning in CANDIDATES[name]:
                if self.smoke and any(k in tuning for k in DIAGNOSTIC):
                    continue
                if self.smoke:
                    tuning = dict(tuning, pdl=False)
                if self.elapsed() > BUDGET_S and not self.smoke:
                    row["candidates"][cname] = {"skipped": "time budget"}
                    continue
                if any(k in tuning for k in DIAGNOSTIC):
                    row["candidates"][cname] = {"check": {"ok": True, "diagnostic": True}}
                    continue
                cand = {"check": self.checks(src, lease, lease_t, state, **tuning)}
                lease_t.copy_(torch.tensor(lease._replace(generation=self.next_generation())))
                row["candidates"][cname] = cand
                if not self.smoke:
                    cand["kernels"] = kernel_facts(self.launch(src, lease_t, state, **tuning))
            # Two timing passes, the second in reverse order.
            names = [c for c in row["candidates"] if row["candidates"][c].get("check", {}).get("ok")]
            tunings = dict(CANDIDATES[name])
            for p, order in enumerate((names, names[::-1], names)):
                for cname in order:
                    t = dict(tunings[cname], pdl=False) if self.smoke else tunings[cname]
                    us = self.time_graph(lambda t=t: self.launch(src, lease_t, state, **t), rep=200)
                    row["candidates"][cname][f"us{p}"] = us
            for cname in names:
                cand = row["candidates"][cname]
                cand["us"] = sorted([cand["us0"], cand["us1"], cand["us2"]])[1]
                cand["floor_ratio"] = floor_us / cand["us"]
            row["op_us_again"] = self.time_graph(lambda: self.launch(src, lease_t, state))
        if name == "256MiB" and not self.smoke:
            row["eager"] = self.eager_profile(src, lease_t, state)
        self.pool.release(lease._replace(nbytes=nbytes))
        self.result["rows"][name] = row
        self.print_row(name, row)
        self.save()

    def print_row(self, name, row):
        def us(key, r=row):
            return f"{r[key]:8.2f}" if key in r else "       -"

        check = "ok" if row["check"]["ok"] else f"FAIL {row['check']}"
        ratio = f"{row['op_floor_ratio']:.3f}" if "op_floor_ratio" in row else "-"
        regs = "/".join(str(k.get("n_regs", "?")) for k in row.get("op_kernels", []))
        print(f"{name:>11} floor {row['floor_us']:8.2f} | op {us('op_us')} ({ratio} floor, "
              f"{'2L' if row['op_two_launches'] else '1L'}/{row['op_block_bytes'] // KIB}K, "
              f"regs {regs or '-'}) | copy_+write {us('original_us')} | copy_ {us('copy_us')}"
              f" | {check}", flush=True)
        for cname, cand in row.get("candidates", {}).items():
            if "skipped" in cand:
                print(f"{'':>11}   {cname:<12} skipped ({cand['skipped']})", flush=True)
                continue
            cregs = "/".join(str(k.get("n_regs", "?")) for k in cand.get("kernels", []))
            ccheck = "ok" if cand["check"]["ok"] else f"FAIL {cand['check']}"
            fr = f"{cand['floor_ratio']:.3f}" if "floor_ratio" in cand else "-"
            print(f"{'':>11}   {cname:<24} {us('us0', cand)} {us('us1', cand)} {us('us2', cand)} ({fr} floor, "
                  f"regs {cregs or '-'}) | {ccheck}", flush=True)
        if "eager" in row:
            print(f"{'':>11}   eager: {json.dumps(row['eager'])}", flush=True)

    def eager_profile(self, src, lease_t, state) -> dict:
        """The eager publish (TransportPool.publish, lease tensor) as the benchmark times it
        (do_bench, L2 flushed), and its kernels' device times under the profiler."""
        from _harness import median_us

        publish = lambda: self.pool.publish(src, lease_t, state)  # noqa: E731
        lease = self.cur_lease._replace(generation=self.next_generation())
        by_args = lambda: self.pool._publish_lease(src, lease)  # noqa: E731
        out = {"do_bench_us": median_us(publish),
               "do_bench_args_us": median_us(by_args),
               "do_bench_noflush_us": median_us(publish, flush_l2=False)}
        # Host time of one publish call while the GPU is busy (a sync inside would show).
        torch.cuda.synchronize()
        host = []
        for _ in range(5):
            torch.cuda._sleep(20_000_000)
            t = time.perf_counter()
            publish()
            host.append((time.perf_counter() - t) * 1e6)
        torch.cuda.synchronize()
        out["host_us_gpu_busy"] = [round(h, 1) for h in host]
        flush = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                flush.zero_()
                publish()
            torch.cuda.synchronize()
        kernels = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels.setdefault(e.name[:60], []).append(round(e.device_time, 2))
        out["profiled_kernels_us"] = kernels
        return out

    def bars(self):
        for name, (key, op, goal) in BARS.items():
            v = self.result["rows"].get(name, {}).get(key)
            met = v is not None and (v <= goal if op == "<=" else v >= goal)
            self.result["bars"][name] = {"metric": key, "goal": f"{op} {goal}", "value": v,
                                         "met": met}
        print("bars:", json.dumps(self.result["bars"]), flush=True)

    def save(self):
        out = {k: v for k, v in self.result.items() if not k.startswith("_")}
        out["elapsed_s"] = self.elapsed()
        self.out.write_text(json.dumps(out, indent=2, default=str))


class _SmokePool:
    """What the check uses of TransportPool, on CPU."""

    def __init__(self, memory_size):
        self.tensor = torch.zeros(memory_size, dtype=torch.uint8)
        self.allocator = m.LeaseAllocator(memory_size, SLOTS, CONSUMERS, "final-check")
        self.base_address = self.tensor.data_ptr()
        self.lease, self.release = self.allocator.allocate, self.allocator.release

    def shutdown(self):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="transport-final-check.json")
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    check = Check(args)
    for name, nbytes, short in check.sizes:
        check.row(name, nbytes, short)
    check.bars()
    check.pool.shutdown()
    check.save()
    failed = [n for n, r in check.result["rows"].items()
              if not r["check"]["ok"] or any(not c.get("check", {"ok": True})["ok"]
                                             for c in r.get("candidates", {}).values())]
    print(f"wrote {check.out} in {check.elapsed():.0f} s; "
          f"{'all checks ok' if not failed else 'FAILED: ' + ', '.join(failed)}", flush=True)
    return int(bool(failed))


if __name__ == "__main__":
    sys.exit(main())
