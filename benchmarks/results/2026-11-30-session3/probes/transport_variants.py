"""GPU probe: copy_and_publish kernel variants against copy_, the original path and HEAD.

Run from the repository root on the GPU machine (after ``pip install --no-deps
--no-build-isolation -e .``):

    OUT=/tmp/out python .probe/transport_variants.py            # ~2-3 min on an H200
    OUT=/tmp/out python .probe/transport_variants.py --quick    # a smaller sweep

For 64 KiB, 1 MiB, 16 MiB and 256 MiB it times CUDA-graph replays (triton.testing.do_bench,
median, L2 flushed before every replay, as benchmarks/_harness.py does) of: ``copy_`` alone;
the original path (``copy_`` + ``cuStreamWriteValue32``); the kernel at HEAD with its own
configuration (a copy of it below); the new kernel with the op's default (``m.TUNING``); the
new kernel one block per program (HEAD's grid); a persistent grid (programs per SM x block
bytes x warps x depth x one/two launches); a few-program small path (1/2/4 programs x warps x
block bytes). Before timing, every variant is checked bit for bit against ``m.reference`` over
the whole pool and state, eagerly and on a graph replay, and eagerly with a lease 3 bytes
short (the partial block and the last bytes); once per size an unaligned source too. The
copy-bandwidth ceiling is measured as the harness does. A variant that raises is recorded
and the sweep goes on (a device fault poisons the context: later rows then fail too).

Writes ``$OUT/transport_variants.json`` (OUT defaults to /tmp/out) and prints a table per
size; at the end the best few per size are timed again with longer runs (``confirm``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _harness import copy_bandwidth_bytes_per_us, median_us  # noqa: E402

from strictops.meta.transport_pool import Lease, data_start, slot_bytes  # noqa: E402
from strictops.ops import TransportPool  # noqa: E402
from strictops.ops import transport_pool as m  # noqa: E402
# The HEAD kernel below resolves these globals from this module.
from strictops.ops.transport_pool import (  # noqa: E402,F401
    _ACK, _ALIGN, _ARRIVALS, _BOTH, _COPY, _END, _ERRORS, _FLAG, _GENERATION, _MAX_GENERATION,
    _NBYTES, _READY, _SLOT, _START, _WORD,
)

SIZES = [("64KiB", 64 << 10), ("256MiB", 256 << 20), ("16MiB", 16 << 20), ("1MiB", 1 << 20)]
SMOKE_SIZES = [("64KiB", 64 << 10), ("1MiB", 1 << 20)]
SLOTS, CONSUMERS = 64, 2
KB = 1024
# --cpu-smoke: the same code path on CPU tensors through the Triton interpreter (no timing
# worth the name), to catch a broken script before it costs a GPU run.
SMOKE = False
DEVICE = "cuda"


def sync():
    if not SMOKE:
        torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------
# The kernel at HEAD (47c0574), verbatim apart from its name: one block per program.

@triton.jit(do_not_specialize=["start_arg", "end_arg", "nbytes_arg", "slot_arg",
                               "generation_arg", "ready_arg", "ack_arg"])
def _head_publish_kernel(
    pool_ptr, src_ptr, lease_ptr, state_ptr, memory_size, src_nbytes, data_start, slot_bytes,
    n_slots, start_arg, end_arg, nbytes_arg, slot_arg, generation_arg, ready_arg, ack_arg,
    LEASE_FROM_PTR: tl.constexpr, BLOCK: tl.constexpr, PHASE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    block_end = (pid + 1) * BLOCK
    data = tl.zeros([BLOCK], tl.uint8)
    if PHASE != _FLAG:
        if block_end <= src_nbytes:
            data = tl.load(src_ptr + offs)
        else:
            data = tl.load(src_ptr + offs, mask=offs < src_nbytes, other=0)
    if LEASE_FROM_PTR:
        start = tl.load(lease_ptr + _START)
        end = tl.load(lease_ptr + _END)
        nbytes = tl.load(lease_ptr + _NBYTES)
        slot = tl.load(lease_ptr + _SLOT)
        generation = tl.load(lease_ptr + _GENERATION)
        ready = tl.load(lease_ptr + _READY)
        ack = tl.load(lease_ptr + _ACK)
    else:
        start = start_arg.to(tl.int64)
        end = end_arg.to(tl.int64)
        nbytes = nbytes_arg.to(tl.int64)
        slot = slot_arg.to(tl.int64)
        generation = generation_arg.to(tl.int64)
        ready = ready_arg.to(tl.int64)
        ack = ack_arg.to(tl.int64)
    fits = (start >= data_start) & (start <= end) & (end <= memory_size)
    fits = fits & (start % _ALIGN == 0) & (nbytes > 0) & (nbytes <= end - start)
    fits = fits & (nbytes <= src_nbytes) & (slot >= 0) & (slot < n_slots)
    fits = fits & (ready == slot * slot_bytes) & (ack == ready + _WORD)
    fits = fits & (generation > 0) & (generation <= _MAX_GENERATION)
    ready_ptr = (pool_ptr + ready).to(tl.pointer_type(tl.int32))
    if fits:
        if PHASE != _FLAG:
            dst_ptr = pool_ptr + (start // _ALIGN) * _ALIGN
            if block_end <= nbytes:
                tl.store(dst_ptr + offs, data)
            else:
                tl.store(dst_ptr + offs, data, mask=offs < nbytes)
        if PHASE == _BOTH:
            tl.debug_barrier()
            arrived = tl.atomic_add(state_ptr + _ARRIVALS, 1, sem="acq_rel", scope="gpu")
            if arrived == tl.num_programs(0) - 1:
                tl.atomic_xchg(state_ptr + _ARRIVALS, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(ready_ptr, generation.to(tl.int32), sem="release", scope="sys")
        if PHASE == _FLAG:
            tl.atomic_xchg(ready_ptr, generation.to(tl.int32), sem="release", scope="sys")
    else:
        if (pid == 0) & (PHASE != _FLAG):
            tl.atomic_add(state_ptr + _ERRORS, 1, sem="relaxed", scope="gpu")


# --------------------------------------------------------------------------------------------


class Recorder:
    """A kernel stand-in for ``m._launch``: launches the real one and keeps what it compiled
    (registers, spills) with each launch's grid and constexprs."""

    def __init__(self, fn):
        self.fn = fn
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if SMOKE:
                from strictops.ops._interpret import interpreted

                with interpreted(self.fn) as kernel:
                    compiled = kernel[grid](*args, **kwargs)
            else:
                compiled = self.fn[grid](*args, **kwargs)
            self.launches.append((tuple(grid), {k: v for k, v in kwargs.items()
                                                if k != "LEASE_FROM_PTR"}, compiled))
            return compiled
        return launch

    def facts(self) -> dict:
        out = []
        for grid, kw, k in self.launches:
            regs = getattr(k, "n_regs", None)
            warps = kw.get("num_warps", 4)
            fact = {"grid": grid[0] if len(grid) else None, **{x: kw.get(x) for x in
                                                               ("BLOCK", "PHASE", "DEPTH")},
                    "num_warps": warps, "regs": regs, "spills": getattr(k, "n_spills", None)}
            if regs:
                per_cta = -(-regs // 8) * 8 * 32 * warps
                fact["ctas_per_sm"] = min(65536 // per_cta, 2048 // (32 * warps), 32)
            out.append(fact)
        return {"launches": out}


def head_launch(kernel, pool, src, lease_t, state, block, two_launches, num_warps=4):
    src_bytes = src.view(-1).view(torch.uint8)
    n = src_bytes.numel()
    args = (pool, src_bytes, lease_t, state, pool.shape[0], n, data_start(SLOTS, CONSUMERS),
            slot_bytes(CONSUMERS), SLOTS, 0, 0, 0, 0, 0, 0, 0)
    kernel[(triton.cdiv(n, block),)](*args, LEASE_FROM_PTR=True, BLOCK=block,
                                     PHASE=m.PHASE_COPY if two_launches else m.PHASE_BOTH,
                                     num_warps=num_warps)
    if two_launches:
        kernel[(1,)](*args, LEASE_FROM_PTR=True, BLOCK=block, PHASE=m.PHASE_FLAG, num_warps=1)


class _Replay:
    def __init__(self, fn):
        self.replay = fn


def time_us(fn, warmup_ms, rep_ms):
    if SMOKE:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    return median_us(fn, warmup_ms, rep_ms)


class _SmokePool:
    """What the sweep uses of TransportPool, on CPU."""

    def __init__(self, memory_size):
        self.tensor = torch.zeros(memory_size, dtype=torch.uint8)
        self.allocator = m.LeaseAllocator(memory_size, SLOTS, CONSUMERS, "probe")
        self.base_address = self.tensor.data_ptr()
        self.lease, self.release = self.allocator.allocate, self.allocator.release


def capture(fn):
    """``fn`` captured in a CUDA graph (run once on a side stream first, as the harness)."""
    if SMOKE:
        return _Replay(fn)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def variant_name(v: dict) -> str:
    if v.get("programs_per_sm"):
        grid = f"pps{v['programs_per_sm']}"
    elif v.get("programs"):
        grid = f"p{v['programs']}"
    else:
        grid = "1bpp"
    return (f"{grid}/{v['block_bytes'] // KB}K/{v.get('num_warps', 4)}w/d{v.get('depth', 1)}/"
            f"{2 if v.get('two_launches') else 1}L")


def fits_per_thread(block, warps, most=128):
    """At most ``most`` bytes of one block per thread (32 registers)."""
    return block // (32 * warps) <= most


def persistent_variants(quick: bool, small_size: bool) -> list[dict]:
    pps = [1, 2, 4] if small_size or quick else [1, 2, 4, 8]
    launches = [False] if small_size else [False, True]
    shapes = [(b * KB, w) for b in (4, 8, 16, 32) for w in (4, 8) if fits_per_thread(b * KB, w)]
    if quick or small_size:
        shapes = [(4 * KB, 4), (8 * KB, 4), (16 * KB, 4), (16 * KB, 8)]
    out = [{"block_bytes": b, "num_warps": w, "programs_per_sm": p, "depth": 1,
            "two_launches": two} for (b, w), p, two in itertools.product(shapes, pps, launches)]
    if not small_size:
        out += [{"block_bytes": b, "num_warps": w, "programs_per_sm": p, "depth": 2,
                 "two_launches": False}
                for (b, w), p in itertools.product([(8 * KB, 4), (8 * KB, 8), (16 * KB, 8)],
                                                   [2, 4])]
    return out


def small_variants(quick: bool) -> list[dict]:
    shapes = [(b * KB, w) for b in (8, 16, 32) for w in (4, 8, 16) if fits_per_thread(b * KB, w)]
    if quick:
        shapes = [(16 * KB, 8), (16 * KB, 16), (32 * KB, 16)]
    out = [{"block_bytes": b, "num_warps": w, "programs": p, "depth": 1}
           for p, (b, w) in itertools.product([1, 2, 4], shapes)]
    out += [{"block_bytes": b, "num_warps": w, "programs": 1, "depth": 2}
            for b, w in [(8 * KB, 16), (16 * KB, 8), (16 * KB, 16)]]
    return out


def one_block_variants() -> list[dict]:
    return [{"block_bytes": b, "num_warps": 4, "two_launches": two}
            for b, two in [(4 * KB, False), (4 * KB, True), (16 * KB, False), (16 * KB, True)]]


class Sweep:
    def __init__(self, args):
        self.args = args
        self.deadline = time.time() + args.budget_s
        self.out = Path(os.environ.get("OUT", "/tmp/out"))
        self.out.mkdir(parents=True, exist_ok=True)
        props = (torch.cuda.get_device_properties(0) if not SMOKE else
                 argparse.Namespace(name="cpu-smoke", multi_processor_count=None))
        self.result = {"env": {"device": props.name, "sms": props.multi_processor_count,
                               "op_sm_count": m.sm_count(torch.device(DEVICE)),
                               "torch": torch.__version__, "triton": triton.__version__,
                               "tuning": [[b, r] for b, r in m.TUNING]},
                       "settings": vars(args), "sizes": {}}
        t = time.time()
        self.bw = copy_bandwidth_bytes_per_us() if not SMOKE else 4e6
        self.result["copy_bandwidth_TBps"] = self.bw / 1e6
        self.result["copy_bandwidth_s"] = round(time.time() - t, 1)
        print(f"{props.name}: copy bandwidth {self.bw / 1e6:.3f} TB/s (read + write)", flush=True)
        largest = max(n for _, n in (SMOKE_SIZES if SMOKE else SIZES))
        memory_size = data_start(SLOTS, CONSUMERS) + largest + (1 << 20)
        self.pool = (_SmokePool(memory_size) if SMOKE else
                     TransportPool(memory_size, device="cuda:0", consumer_count=CONSUMERS,
                                   max_inflight_slices=SLOTS, recycle_interval=None,
                                   name="probe"))

    # One size ----------------------------------------------------------------------------

    def run_size(self, name: str, nbytes: int) -> None:
        pool = self.pool
        gen = torch.Generator(device=DEVICE).manual_seed(nbytes)
        src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=DEVICE, generator=gen)
        lease = pool.lease(nbytes)
        short = lease._replace(nbytes=nbytes - 3)
        lease_t = torch.tensor(lease, device=DEVICE)
        short_t = torch.tensor(short, device=DEVICE)
        state = m.new_state(DEVICE)
        dst = pool.tensor[lease.start:lease.start + nbytes]
        ready = pool.tensor[lease.ready_byte_offset:lease.ready_byte_offset + 4].view(torch.int32)
        floor = 2 * nbytes / self.bw
        size = {"bytes": nbytes, "floor_us": floor, "lease": list(lease), "rows": []}
        self.result["sizes"][name] = size
        print(f"\n== {name}: floor {floor:.2f} us", flush=True)

        def check(publish, lease_tensor, how):
            """Run ``publish(lease_tensor)`` (or a graph replay) on a pool whose lease range and
            ready word are zeroed; compare the whole pool and state with the reference."""
            dst.zero_()
            ready.zero_()
            expected_pool, expected_state = m.reference(pool.tensor, src, lease_tensor, state,
                                                        SLOTS, CONSUMERS)
            publish()
            sync()
            ok = torch.equal(pool.tensor, expected_pool) and torch.equal(state, expected_state)
            del expected_pool
            if not ok:
                raise AssertionError(f"not bit-exact ({how}); state={state.tolist()}")

        def measure(label, kind, params, launch_with, flag_checked=True, recorder=None,
                    short_checked=True):
            """``launch_with(lease_tensor)`` publishes; verify, capture, time."""
            row = {"name": label, "kind": kind, **params}
            size["rows"].append(row)
            if time.time() > self.deadline:
                row["skipped"] = "time budget"
                return row
            t = time.time()
            try:
                state.zero_()  # what an earlier, broken variant left there must not leak
                if flag_checked:
                    check(lambda: launch_with(lease_t), lease_t, "eager")
                    if recorder is not None:
                        row.update(recorder.facts())
                        launches = row["launches"]
                        first = launches[0] if launches else {}
                        sms = self.result["env"]["sms"]
                        if (kind == "persistent" and sms and first.get("ctas_per_sm")
                                and first["grid"] > first["ctas_per_sm"] * sms):
                            row["skipped"] = (f"not co-resident: {first['regs']} registers, "
                                              f"{first['ctas_per_sm']} CTAs per SM for a grid "
                                              f"of {first['grid']}")
                            return row
                    if short_checked:
                        check(lambda: launch_with(short_t), short_t, "eager, 3 bytes short")
                graph = capture(lambda: launch_with(lease_t))
                if flag_checked:
                    check(graph.replay, lease_t, "graph replay")
                else:  # copy_ alone: the bytes only
                    dst.zero_()
                    graph.replay()
                    sync()
                    if not torch.equal(dst, src):
                        raise AssertionError("copy_ not exact")
                row["ok"] = True
                row["us"] = time_us(graph.replay, self.args.warmup_ms, self.args.rep_ms)
                row["floor_ratio"] = floor / row["us"]
                row["_graph"] = graph  # kept for the confirm pass, dropped before saving
            except Exception as e:  # noqa: BLE001 - record it and go on
                row["ok"] = False
                row["error"] = f"{type(e).__name__}: {e}"[:600]
                row["traceback"] = traceback.format_exc()[-3000:]
                print(f"   {label}: {row['error']}", flush=True)
            row["seconds"] = round(time.time() - t, 2)
            return row

        def new_kernel(params):
            rec = Recorder(m._publish_kernel)

            def launch_with(lt):
                rec.launches.clear()
                m._launch(rec, pool.tensor, src, lt, state, SLOTS, CONSUMERS, **params)
            return launch_with, rec

        def original(lt):
            del lt  # the original path writes the host's lease
            dst.copy_(src)
            m._cuda_stream.write_value32(torch.cuda.current_stream(),
                                         pool.base_address + lease.ready_byte_offset,
                                         lease.generation)

        # Baselines
        measure("copy_", "baseline", {}, lambda lt: dst.copy_(src), flag_checked=False)
        try:
            if SMOKE:
                raise ImportError("no stream writes in --cpu-smoke")
            m._cuda_stream._driver()
            measure("copy_+cuStreamWriteValue32", "baseline", {}, original, short_checked=False)
        except ImportError as e:
            size["rows"].append({"name": "copy_+cuStreamWriteValue32", "kind": "baseline",
                                 "ok": False, "error": str(e)})
        head_block = 4096 if nbytes <= (1 << 20) else 16384
        head_two = nbytes > (1 << 20)
        head = Recorder(_head_publish_kernel)

        def head_with(lt):
            head.launches.clear()
            head_launch(head, pool.tensor, src, lt, state, head_block, head_two)
        measure(f"HEAD/{head_block // KB}K/4w/{2 if head_two else 1}L", "head",
                {"block_bytes": head_block, "two_launches": head_two}, head_with, recorder=head)
        launch_with, rec = new_kernel({})
        measure("default(TUNING)", "default", m.launch_config(nbytes), launch_with, recorder=rec)

        # Sweeps
        variants = [("one-block", v) for v in one_block_variants()]
        if nbytes <= (1 << 20):
            variants += [("small", v) for v in small_variants(self.args.quick)]
        if nbytes >= (1 << 20):
            variants += [("persistent", v) for v in
                         persistent_variants(self.args.quick, small_size=nbytes <= (1 << 20))]
        for kind, v in variants:
            launch_with, rec = new_kernel(v)
            measure(variant_name(v), kind, v, launch_with, recorder=rec)

        # An unaligned source (1 byte into its storage: the bytewise loop), checked only.
        try:
            storage = torch.randint(0, 256, (nbytes + 1,), dtype=torch.uint8, device=DEVICE)
            odd = storage[1:]
            for params in ({}, {"block_bytes": 16 * KB, "num_warps": 4, "programs_per_sm": 2}):
                dst.zero_()
                ready.zero_()
                exp_pool, exp_state = m.reference(pool.tensor, odd, short_t, state, SLOTS,
                                                  CONSUMERS)
                m._launch(Recorder(m._publish_kernel), pool.tensor, odd, short_t, state, SLOTS,
                          CONSUMERS, **params)
                sync()
                size.setdefault("unaligned_source_ok", []).append(
                    [params, torch.equal(pool.tensor, exp_pool) and
                     torch.equal(state, exp_state)])
                del exp_pool
        except Exception as e:  # noqa: BLE001
            size["unaligned_source_ok"] = f"{type(e).__name__}: {e}"[:600]

        self.print_size(name)
        self.save_rows()
        pool.release(lease)
        self._keep = getattr(self, "_keep", [])
        self._keep.append((name, src, lease_t, state))  # the graphs read them

    # Output -----------------------------------------------------------------------------

    def save_rows(self):
        clean = json.loads(json.dumps(self.result, default=lambda o: None))
        for size in clean["sizes"].values():
            for row in size["rows"]:
                row.pop("_graph", None)
        (self.out / "transport_variants.json").write_text(json.dumps(clean, indent=1))

    def print_size(self, name):
        size = self.result["sizes"][name]
        rows = size["rows"]
        timed = sorted((r for r in rows if r.get("us")), key=lambda r: r["us"])
        base = [r for r in rows if r["kind"] in ("baseline", "head", "default")]
        print(f"{'variant':34} {'us':>8} {'floor/us':>8} {'regs':>5} {'grid':>6}")
        for r in base + [r for r in timed if r not in base][:self.args.top]:
            launches = r.get("launches") or [{}]
            us = f"{r['us']:8.2f}" if r.get("us") else "       -"
            ratio = f"{r['floor_ratio']:8.3f}" if r.get("us") else "       -"
            note = r.get("error") or r.get("skipped") or ""
            print(f"{r['name']:34} {us} {ratio} {str(launches[0].get('regs', '')):>5} "
                  f"{str(launches[0].get('grid', '')):>6} {note[:60]}")
        skipped = sum(1 for r in rows if r.get("skipped"))
        failed = sum(1 for r in rows if r.get("ok") is False)
        print(f"({len(timed)} timed, {skipped} skipped, {failed} failed)", flush=True)

    def confirm(self):
        """Time the best few per size and the baselines again with longer runs."""
        for name, size in self.result["sizes"].items():
            rows = [r for r in size["rows"] if r.get("us") and "_graph" in r]
            best = sorted((r for r in rows if r["kind"] not in ("baseline",)),
                          key=lambda r: r["us"])[:self.args.confirm]
            for r in [r for r in rows if r["kind"] in ("baseline", "head", "default")] + best:
                if r.get("confirm_us") is not None:
                    continue
                try:
                    r["confirm_us"] = time_us(r["_graph"].replay, 50, 400)
                    r["confirm_floor_ratio"] = size["floor_us"] / r["confirm_us"]
                except Exception as e:  # noqa: BLE001
                    r["confirm_error"] = f"{type(e).__name__}: {e}"[:300]
            conf = sorted((r for r in size["rows"] if r.get("confirm_us")),
                          key=lambda r: r["confirm_us"])
            print(f"\n== {name} confirm (rep 400 ms): " + ", ".join(
                f"{r['name']}={r['confirm_us']:.2f}us({r['confirm_floor_ratio']:.3f})"
                for r in conf), flush=True)
            size["best"] = conf[0]["name"] if conf else None

    def bars(self):
        sizes = self.result["sizes"]
        bars = {}
        if "64KiB" in sizes:
            ours = [r for r in sizes["64KiB"]["rows"]
                    if r["kind"] not in ("baseline",) and r.get("confirm_us")]
            best = min(ours, key=lambda r: r["confirm_us"], default=None)
            bars["64KiB<=7us"] = best and {"variant": best["name"], "us": best["confirm_us"],
                                           "met": best["confirm_us"] <= 7.0}
        if "256MiB" in sizes:
            ours = [r for r in sizes["256MiB"]["rows"]
                    if r["kind"] not in ("baseline",) and r.get("confirm_us")]
            best = max(ours, key=lambda r: r["confirm_floor_ratio"], default=None)
            bars["256MiB>=0.95floor"] = best and {
                "variant": best["name"], "floor_ratio": best["confirm_floor_ratio"],
                "met": best["confirm_floor_ratio"] >= 0.95}
        self.result["bars"] = bars
        print("\nbars:", json.dumps(bars, indent=1), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a smaller sweep")
    ap.add_argument("--sizes", default=",".join(n for n, _ in SIZES),
                    help="comma-separated subset of " + ",".join(n for n, _ in SIZES))
    ap.add_argument("--warmup-ms", type=int, default=20)
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--budget-s", type=float, default=140,
                    help="stop starting new variants after this (then confirm)")
    ap.add_argument("--top", type=int, default=12, help="rows printed per size")
    ap.add_argument("--confirm", type=int, default=4, help="best variants re-timed per size")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run the script's logic on CPU through the interpreter (no GPU)")
    args = ap.parse_args()
    global SMOKE, DEVICE
    if args.cpu_smoke:
        SMOKE, DEVICE = True, "cpu"
        args.quick = True
    t0 = time.time()
    sweep = Sweep(args)
    wanted = args.sizes.split(",")
    for name, nbytes in (SMOKE_SIZES if SMOKE else SIZES):
        if name in wanted or SMOKE:
            sweep.run_size(name, nbytes)
    sweep.confirm()
    sweep.bars()
    sweep.result["total_s"] = round(time.time() - t0, 1)
    sweep.save_rows()
    print(f"\nwrote {sweep.out / 'transport_variants.json'} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
