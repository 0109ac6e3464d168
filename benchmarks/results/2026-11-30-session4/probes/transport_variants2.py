"""GPU probe 2: copy_and_publish variants for the 64 KiB latency bar (<= 7.0 us) and the
256 MiB bandwidth bar (>= 0.95 of the copy floor).

Run from the repository root on the GPU machine (``strictops`` installed editable,
cuda-bindings present), about 60-120 s on an H200:

    python .probe/transport_variants2.py --out $OUT/transport-variants2.json

(``--no-cluster`` skips the cluster variants; ``TRITON_INTERPRET=1 python
.probe/transport_variants2.py --cpu-smoke --out /tmp/smoke.json`` runs the host logic on CPU;
``.probe/transport_variants2_cpu_check.py`` compiles every launch for sm_90 and checks every
non-cluster variant bit for bit in the interpreter.)

For 64 KiB, 1 MiB, 16 MiB and 256 MiB it checks, then times as CUDA-graph replays
(``triton.testing.do_bench``, median, L2 flushed before every replay, as
``benchmarks/_harness.py``), each variant of ``_variant_kernel`` below (a copy of
``ops/transport_pool._publish_kernel`` with knobs), and in the same run the baselines:
``copy_`` alone, the original path (``copy_`` + ``cuStreamWriteValue32``) and the current op
(``m._launch(m._publish_kernel, ...)``, its own TUNING). The floor is 2 * bytes over the copy
bandwidth the harness measures in this run.

Checks (before any timing; a variant that fails one is reported failed and not timed): the
lease's range is poisoned with random bytes and its ready word zeroed, the source gets fresh
random bytes and the lease a new generation; then the whole pool and the state must equal the
expected result bit for bit (every byte outside the lease and every other control word
unchanged; ``state == [0, errors]``, i.e. the arrival counter back to 0), for: the full
lease (eager), the lease 3 bytes short (partial last block, eager), a refused lease
(generation 0: pool untouched, ``state[ERRORS]`` + 1 exactly once), and a replay of the
captured graph (full lease, new generation, new source bytes).

Variant knobs (names in the table: ``1L``/``2L`` one or two launches, ``pdl`` the flag launch
is a programmatic dependent launch, block bytes per program or ``NxB`` chunks, warps, flag
scope, ``relarr``, ``v2``, cache modifiers, ``cluster``):

* ``scope=gpu``: the flag's release at GPU scope, not system scope. The consumers are streams of
  processes on the same GPU (``cuStreamWaitValue32`` reads the word on that GPU), so GPU scope
  is the scope that contains every observer.
* ``relarr`` (one launch): every program's arrival is ``atom.add.release.gpu`` (no acquire, no
  L1 invalidation on the 15 of 16 programs that are not last); the last arriver then runs
  ``fence.acq_rel.gpu``. Correct by the PTX model: the arrival atomic (a strong read) followed
  in program order by ``fence.acq_rel`` in the same thread is an acquire pattern, which
  synchronizes with every earlier program's release (the counter's RMWs form one release
  sequence); that thread then writes the flag with a release, cumulative over everything it
  observed. Triton predicates every scalar atomic of a program on the same thread (the probe
  records each variant's ``atom`` predicates from the PTX in ``atom_predicates``), so the
  arrival, the fence and the flag are in one thread. ``tl.debug_barrier()`` before the arrival
  stays: without it the other threads' stores are not ordered before that thread's release
  (release is cumulative only over writes the releasing thread has observed), so dropping it
  is not correct and is not measured. (The cluster variant replaces it by a cluster barrier
  that every thread arrives at with release semantics, which is correct.)
* ``v2`` lease read: ``tl.load`` of words 0..3 and 4..5 as small tensors (vectorized to three
  ``ld.global.v2.b64``) and word 6, then ``tl.reshape``/``tl.split`` down to scalars (register
  moves: no shared memory, no barrier, checked in the PTX): 4 load instructions per thread
  instead of 7, with no read past the 7 words. (The earlier one-vector version, an 8-word
  masked load + ``tl.sum(tl.where(...))``, was measured 20x slower and is not repeated.)
  Without a 16-byte aligned lease tensor Triton compiles unvectorized loads: still safe.
* ``pdl`` (two launches): the flag launch is a programmatic dependent launch
  (``launch_pdl=True``: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, captured in the
  graph as a programmatic edge); every copy program first runs
  ``griddepcontrol.launch_dependents``, so the one-program flag kernel is resident before the
  copy ends and its launch latency (~1.2 us) overlaps the copy; it runs
  ``griddepcontrol.wait`` (returns once the copy grid has completed and its memory is visible,
  the same guarantee as stream order) before writing the flag. ``early``: the flag kernel
  reads the lease and evaluates ``fits`` before the wait (the lease tensor's writers precede
  the copy kernel in stream order, and the copy kernel, launched without the attribute, starts
  only after they complete, so they are visible); only the flag write waits. If a PDL
  variant fails other than by a wrong result (PDL not capturable here, say), the remaining
  PDL variants run as plain two launches, named ``2L(pdl off)/...`` (``pdl_broken`` in the
  JSON says why).
* ``2w/4w/8w``, blocks 2-16 KiB, ``2x4K``/``4x4K`` chunks per program (contiguous, loaded all
  first, the lease read once, unrolled with constexpr ifs), ``st.cs`` (streaming store),
  ``ld.ef`` (``eviction_policy="evict_first"`` on the source).
* ``cluster8``/``cluster16`` (one launch, Hopper thread-block clusters through Triton's
  ``num_ctas``): one program is one cluster of 8 or 16 CTAs, each copying its part of a
  64 KiB block (seven scalar lease loads: the ``v2`` read does not compile in multi-CTA mode);
  every thread arrives at ``barrier.cluster.arrive.release`` then waits at
  ``barrier.cluster.wait.acquire`` (in place of ``bar.sync``); Triton runs each scalar atomic
  in thread 0 of CTA rank 0 only (checked in the PTX), so there is one arrival per cluster
  (64 KiB is one cluster: no contention), and the flag is written after the last arrival
  with a GPU-scope release, cumulative over what the cluster barrier made that thread
  observe. Triton passes the atomic's result on through shared memory and a cluster barrier
  that every CTA runs (every CTA evaluates the same ``fits``, so all of them reach it); CTAs
  other than rank 0 read their own, unwritten, shared word, so their ``arrived == last``
  branch is arbitrary, but all it holds is a fence and atomics predicated to CTA rank 0
  (a probe-only shortcut: initcheck would flag the read). Run last: a wrong guess
  about Triton's multi-CTA lowering (or a cluster of 16 that does not fit a GPC) fails
  there, after everything else is saved.

Writes the JSON after every row, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from strictops.meta.transport_pool import (  # noqa: E402
    ARRIVALS, DATA_ALIGNMENT, ERRORS, MAX_GENERATION, WORD_BYTES, Lease, data_start, slot_bytes,
)
from strictops.ops import transport_pool as m  # noqa: E402

# The kernel below reads the lease's words by position.
assert Lease._fields == ("start", "end", "nbytes", "slot", "generation", "ready_byte_offset",
                         "ack_byte_offset"), Lease._fields

KB = 1024
SLOTS, CONSUMERS = 64, 2
SIZES = [("64KiB", 64 << 10), ("256MiB", 256 << 20), ("16MiB", 16 << 20), ("1MiB", 1 << 20)]
# --cpu-smoke (run with TRITON_INTERPRET=1): the same host logic on CPU tensors through the
# interpreter, each size's variant list at a small size, to catch a broken script before a
# GPU run. No timing worth the name; no cluster variants, no original path.
SMOKE_BYTES = {"64KiB": 64 << 10, "256MiB": (192 << 10) + 4096, "16MiB": 96 << 10,
               "1MiB": 128 << 10}
SMOKE = False
DEVICE = "cuda"


def sync():
    if not SMOKE:
        torch.cuda.synchronize()

_ARRIVALS = tl.constexpr(ARRIVALS)
_ERRORS = tl.constexpr(ERRORS)
_ALIGN = tl.constexpr(DATA_ALIGNMENT)
_WORD = tl.constexpr(WORD_BYTES)
_MAX_GENERATION = tl.constexpr(MAX_GENERATION)
PHASE_BOTH, PHASE_COPY, PHASE_FLAG = 0, 1, 2
_BOTH, _COPY, _FLAG = tl.constexpr(PHASE_BOTH), tl.constexpr(PHASE_COPY), tl.constexpr(PHASE_FLAG)


# --------------------------------------------------------------------------------------------
# Device helpers. The inline-asm ones are module globals so that the CPU check can replace them
# with no-ops under the interpreter (which runs programs one at a time, in order).

@triton.jit
def _launch_dependents():
    tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _grid_dependency_wait():
    tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _fence_acq_rel_gpu():
    tl.inline_asm_elementwise("fence.acq_rel.gpu; // $0", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _cluster_sync():
    tl.inline_asm_elementwise("barrier.cluster.arrive.release;\n\t"
                              "barrier.cluster.wait.acquire; // $0", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _read_lease(lease_ptr, LEASE: tl.constexpr):
    if LEASE == 0:  # as the op: seven scalar loads
        start = tl.load(lease_ptr + 0)
        end = tl.load(lease_ptr + 1)
        nbytes = tl.load(lease_ptr + 2)
        slot = tl.load(lease_ptr + 3)
        generation = tl.load(lease_ptr + 4)
        ready = tl.load(lease_ptr + 5)
        ack = tl.load(lease_ptr + 6)
    else:  # "v2": words 0..3 and 4..5 as vectors, then split in registers
        q = tl.load(lease_ptr + tl.arange(0, 4))
        q02, q13 = tl.split(tl.reshape(q, (2, 2)))  # [start, nbytes], [end, slot]
        start, nbytes = tl.split(q02)
        end, slot = tl.split(q13)
        generation, ready = tl.split(tl.load(lease_ptr + 4 + tl.arange(0, 2)))
        ack = tl.load(lease_ptr + 6)
    return start, end, nbytes, slot, generation, ready, ack


@triton.jit
def _fits(start, end, nbytes, slot, generation, ready, ack, memory_size, src_nbytes, data_start,
          slot_bytes, n_slots):
    # Verbatim from _publish_kernel (lease_fits on the device).
    fits = (start >= data_start) & (start <= end) & (end <= memory_size)
    fits = fits & (start % _ALIGN == 0) & (nbytes > 0) & (nbytes <= end - start)
    fits = fits & (nbytes <= src_nbytes) & (slot >= 0) & (slot < n_slots)
    fits = fits & (ready == slot * slot_bytes) & (ack == ready + _WORD)
    fits = fits & (generation > 0) & (generation <= _MAX_GENERATION)
    return fits


@triton.jit
def _load_chunk(src_ptr, offs, chunk_end, src_nbytes, BLOCK: tl.constexpr,
                LD_CACHE: tl.constexpr, LD_EVICT: tl.constexpr):
    data = tl.zeros([BLOCK], tl.uint8)
    if chunk_end <= src_nbytes:  # whole chunk: unmasked, 16-byte vectors
        data = tl.load(src_ptr + offs, cache_modifier=LD_CACHE, eviction_policy=LD_EVICT)
    else:
        data = tl.load(src_ptr + offs, mask=offs < src_nbytes, other=0,
                       cache_modifier=LD_CACHE, eviction_policy=LD_EVICT)
    return data


@triton.jit
def _store_chunk(dst_ptr, offs, chunk_end, nbytes, data, ST_CACHE: tl.constexpr):
    if chunk_end <= nbytes:
        tl.store(dst_ptr + offs, data, cache_modifier=ST_CACHE)
    else:
        tl.store(dst_ptr + offs, data, mask=offs < nbytes, cache_modifier=ST_CACHE)


@triton.jit
def _variant_kernel(
    pool_ptr, src_ptr, lease_ptr, state_ptr, memory_size, src_nbytes, data_start, slot_bytes,
    n_slots,
    BLOCK: tl.constexpr,        # bytes of one chunk (of one cluster when CLUSTER > 1)
    CHUNKS: tl.constexpr,       # 1, 2 or 4 contiguous chunks per program, lease read once
    PHASE: tl.constexpr,        # _BOTH (one launch), _COPY, _FLAG (two launches)
    LEASE: tl.constexpr,        # 0: seven scalar loads; 1: "v2"
    ARRIVE: tl.constexpr,       # 0: acq_rel arrivals (the op); 1: release + fence by the last
    FLAG_SCOPE: tl.constexpr,   # "sys" (the op) or "gpu"
    PDL: tl.constexpr,          # two launches: the flag launch is programmatic-dependent
    EARLY_LEASE: tl.constexpr,  # PDL flag kernel: read the lease before griddepcontrol.wait
    LD_CACHE: tl.constexpr, LD_EVICT: tl.constexpr, ST_CACHE: tl.constexpr,
    CLUSTER: tl.constexpr,      # num_ctas of the launch (1: no cluster)
):
    pid = tl.program_id(0).to(tl.int64)
    if PDL:
        if PHASE == _COPY:
            _launch_dependents()
        if PHASE == _FLAG:
            if not EARLY_LEASE:
                _grid_dependency_wait()
    base = pid * (BLOCK * CHUNKS)
    offs = base + tl.arange(0, BLOCK)
    d0 = tl.zeros([BLOCK], tl.uint8)
    d1 = d0
    d2 = d0
    d3 = d0
    if PHASE != _FLAG:
        # Every source chunk first: its latency overlaps the lease's.
        d0 = _load_chunk(src_ptr, offs, base + BLOCK, src_nbytes, BLOCK, LD_CACHE, LD_EVICT)
        if CHUNKS > 1:
            d1 = _load_chunk(src_ptr, offs + BLOCK, base + 2 * BLOCK, src_nbytes, BLOCK,
                             LD_CACHE, LD_EVICT)
        if CHUNKS > 2:
            d2 = _load_chunk(src_ptr, offs + 2 * BLOCK, base + 3 * BLOCK, src_nbytes, BLOCK,
                             LD_CACHE, LD_EVICT)
            d3 = _load_chunk(src_ptr, offs + 3 * BLOCK, base + 4 * BLOCK, src_nbytes, BLOCK,
                             LD_CACHE, LD_EVICT)
    start, end, nbytes, slot, generation, ready, ack = _read_lease(lease_ptr, LEASE)
    fits = _fits(start, end, nbytes, slot, generation, ready, ack, memory_size, src_nbytes,
                 data_start, slot_bytes, n_slots)
    if PDL:
        if PHASE == _FLAG:
            if EARLY_LEASE:
                _grid_dependency_wait()
    ready_ptr = (pool_ptr + ready).to(tl.pointer_type(tl.int32))
    if fits:
        if PHASE != _FLAG:
            dst_ptr = pool_ptr + (start // _ALIGN) * _ALIGN
            _store_chunk(dst_ptr, offs, base + BLOCK, nbytes, d0, ST_CACHE)
            if CHUNKS > 1:
                _store_chunk(dst_ptr, offs + BLOCK, base + 2 * BLOCK, nbytes, d1, ST_CACHE)
            if CHUNKS > 2:
                _store_chunk(dst_ptr, offs + 2 * BLOCK, base + 3 * BLOCK, nbytes, d2, ST_CACHE)
                _store_chunk(dst_ptr, offs + 3 * BLOCK, base + 4 * BLOCK, nbytes, d3, ST_CACHE)
        if PHASE == _BOTH:
            if CLUSTER > 1:
                # Every thread of every CTA of the cluster. In a multi-CTA program Triton
                # itself runs each scalar atomic in thread 0 of CTA rank 0 only, and passes its
                # result on through shared memory and a cluster barrier that every CTA runs
                # (so the protocol below must not sit under a per-CTA branch).
                _cluster_sync()
            else:
                tl.debug_barrier()
            if ARRIVE == 0:
                arrived = tl.atomic_add(state_ptr + _ARRIVALS, 1, sem="acq_rel", scope="gpu")
            else:
                arrived = tl.atomic_add(state_ptr + _ARRIVALS, 1, sem="release", scope="gpu")
            if arrived == tl.num_programs(0) - 1:
                if ARRIVE == 1:
                    _fence_acq_rel_gpu()
                tl.atomic_xchg(state_ptr + _ARRIVALS, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(ready_ptr, generation.to(tl.int32), sem="release",
                               scope=FLAG_SCOPE)
        if PHASE == _FLAG:
            tl.atomic_xchg(ready_ptr, generation.to(tl.int32), sem="release", scope=FLAG_SCOPE)
    else:
        if (pid == 0) & (PHASE != _FLAG):
            tl.atomic_add(state_ptr + _ERRORS, 1, sem="relaxed", scope="gpu")


# --------------------------------------------------------------------------------------------
# Variants

DEFAULTS = dict(block=4 * KB, chunks=1, warps=4, two=False, pdl=False, lease=0, arrive=0,
                scope="sys", early=False, ld_cache="", ld_evict="", st_cache="", cluster=1)


def V(**kw) -> dict:
    v = dict(DEFAULTS, **kw)
    assert set(v) == set(DEFAULTS), kw
    return v


def variant_name(v: dict) -> str:
    parts = ["2L-pdl" if v["pdl"] else ("2L" if v["two"] else "1L")]
    if v["cluster"] > 1:
        parts.append(f"cluster{v['cluster']}x{v['block'] // v['cluster'] // KB}K")
    elif v["chunks"] > 1:
        parts.append(f"{v['chunks']}x{v['block'] // KB}K")
    else:
        parts.append(f"{v['block'] // KB}K")
    parts += [f"{v['warps']}w", v["scope"]]
    parts += [x for x, on in [("relarr", v["arrive"] == 1), ("v2", v["lease"] == 1),
                              ("early", v["early"]), ("st.cs", v["st_cache"] == ".cs"),
                              ("ld.ef", v["ld_evict"] == "evict_first"),
                              ("ld.cg", v["ld_cache"] == ".cg")] if on]
    return "/".join(parts)


def variants_for(name: str) -> list[dict]:
    pdl = dict(two=True, pdl=True, scope="gpu", lease=1, early=True)
    if name == "64KiB":
        return [
            V(block=4 * KB, scope="gpu"),
            V(block=8 * KB, scope="gpu"),
            V(block=16 * KB, scope="gpu"),
            V(block=2 * KB, warps=2, scope="gpu"),
            V(block=4 * KB, scope="gpu", arrive=1),
            V(block=8 * KB, scope="gpu", arrive=1),
            V(block=4 * KB, scope="gpu", arrive=1, lease=1),
            V(block=4 * KB, two=True, pdl=True, scope="gpu"),
            V(block=4 * KB, **pdl),
            V(block=8 * KB, **pdl),
        ]
    if name == "1MiB":
        return [
            V(block=4 * KB, scope="gpu"),
            V(block=4 * KB, scope="gpu", arrive=1, lease=1),
            V(block=4 * KB, **pdl),
            V(block=8 * KB, **pdl),
        ]
    if name == "16MiB":
        return [
            V(block=16 * KB, two=True, scope="gpu"),
            V(block=4 * KB, **pdl),
            V(block=8 * KB, **pdl),
            V(block=16 * KB, **pdl),
        ]
    if name == "256MiB":
        return [
            V(block=4 * KB, two=True, scope="gpu"),
            V(block=4 * KB, two=True, pdl=True, scope="gpu", early=True),
            V(block=4 * KB, **pdl),
            V(block=4 * KB, warps=2, **pdl),
            V(block=4 * KB, warps=8, **pdl),
            V(block=8 * KB, **pdl),
            V(block=16 * KB, **pdl),
            V(block=4 * KB, chunks=2, **pdl),
            V(block=4 * KB, chunks=4, **pdl),
            V(block=4 * KB, st_cache=".cs", **pdl),
            V(block=4 * KB, ld_evict="evict_first", **pdl),
            V(block=8 * KB, st_cache=".cs", ld_evict="evict_first", **pdl),
        ]
    raise KeyError(name)


def cluster_variants_for(name: str) -> list[dict]:
    """Run after everything else (see the module docstring)."""
    if name == "64KiB":
        return [V(block=64 * KB, cluster=8, scope="gpu", arrive=1),
                V(block=64 * KB, cluster=16, scope="gpu", arrive=1)]
    if name == "1MiB":
        return [V(block=64 * KB, cluster=16, scope="gpu", arrive=1)]
    return []


def launch_variant(v: dict, pool: torch.Tensor, src: torch.Tensor, lease_t: torch.Tensor,
                   state: torch.Tensor, kernel=None) -> list:
    """Publish ``src`` into ``lease_t`` with variant ``v``; returns the compiled kernels."""
    kernel = kernel if kernel is not None else _variant_kernel
    src_bytes = src.view(-1).view(torch.uint8)
    n = src_bytes.shape[0]
    args = (pool, src_bytes, lease_t, state, pool.shape[0], n, data_start(SLOTS, CONSUMERS),
            slot_bytes(CONSUMERS), SLOTS)
    kw = dict(BLOCK=v["block"], CHUNKS=v["chunks"], LEASE=v["lease"], ARRIVE=v["arrive"],
              FLAG_SCOPE=v["scope"], PDL=v["pdl"], EARLY_LEASE=v["early"],
              LD_CACHE=v["ld_cache"], LD_EVICT=v["ld_evict"], ST_CACHE=v["st_cache"],
              CLUSTER=v["cluster"])
    grid = (triton.cdiv(n, v["block"] * v["chunks"]),)
    out = [kernel[grid](*args, PHASE=PHASE_COPY if v["two"] else PHASE_BOTH,
                        num_warps=v["warps"], num_ctas=v["cluster"], **kw)]
    if v["two"]:
        out.append(kernel[(1,)](*args, PHASE=PHASE_FLAG, num_warps=1, launch_pdl=v["pdl"], **kw))
    return out


def use_cpu_stand_ins():
    """Under the interpreter: the inline-asm helpers become no-ops (programs run one at a
    time, in order)."""
    global _launch_dependents, _grid_dependency_wait, _fence_acq_rel_gpu

    @triton.jit
    def _noop():
        pass

    _launch_dependents = _grid_dependency_wait = _fence_acq_rel_gpu = _noop


class _SmokePool:
    """What the probe uses of TransportPool, on CPU."""

    def __init__(self, memory_size):
        self.tensor = torch.zeros(memory_size, dtype=torch.uint8)
        self.allocator = m.LeaseAllocator(memory_size, SLOTS, CONSUMERS, "probe2")
        self.base_address = self.tensor.data_ptr()
        self.lease, self.release = self.allocator.allocate, self.allocator.release

    def shutdown(self):
        pass


class _Replay:
    def __init__(self, fn):
        self.replay = fn


def kernel_facts(compiled: list) -> list[dict]:
    facts = []
    for k in compiled:
        fact = {}
        for attr in ("n_regs", "n_spills"):
            try:
                fact[attr] = getattr(k, attr)
            except Exception:  # noqa: BLE001
                pass
        try:
            ptx = k.asm["ptx"]
            fact["atom_predicates"] = sorted(set(re.findall(r"(@!?%p\d+)\s+atom\.global", ptx)))
            fact["atoms"] = re.findall(r"atom\.global\.[\w.]+", ptx)
            fact["smem_ops"] = len(re.findall(r"\b(?:ld|st)\.shared", ptx))
            fact["bar_sync"] = len(re.findall(r"\bbar\.sync", ptx))
            fact["lease_ld_v2"] = len(re.findall(r"ld\.global(?:\.\w+)*\.v2\.b64", ptx))
        except Exception:  # noqa: BLE001
            pass
        facts.append(fact)
    return facts


# --------------------------------------------------------------------------------------------
# The run


class Probe:
    def __init__(self, args):
        from _harness import copy_bandwidth_bytes_per_us

        self.args = args
        self.t0 = time.time()
        self.out = Path(args.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        props = (torch.cuda.get_device_properties(0) if not SMOKE else
                 argparse.Namespace(name="cpu-smoke", multi_processor_count=None))
        self.result = {"env": {"device": props.name, "sms": props.multi_processor_count,
                               "torch": torch.__version__, "triton": triton.__version__,
                               "cuda": torch.version.cuda, "op_tuning": repr(m.TUNING)},
                       "settings": vars(args), "sizes": {}}
        self.bw = copy_bandwidth_bytes_per_us() if not SMOKE else 4e6
        self.result["copy_bandwidth_TBps"] = self.bw / 1e6
        print(f"{props.name}: copy bandwidth {self.bw / 1e6:.3f} TB/s (read + write)",
              flush=True)
        largest = max(SMOKE_BYTES.values()) if SMOKE else max(n for _, n in SIZES)
        memory_size = data_start(SLOTS, CONSUMERS) + largest + (1 << 20)
        self.pool = (_SmokePool(memory_size) if SMOKE else
                     m.TransportPool(memory_size, device="cuda:0", consumer_count=CONSUMERS,
                                     max_inflight_slices=SLOTS, recycle_interval=None,
                                     name="probe2"))
        self.gen = 1000
        self.ctx = {}
        self.graphs = {}
        # Set when a PDL variant fails other than by a wrong result (e.g. PDL not capturable
        # here): the remaining PDL variants then run as plain two launches, named "2L(pdl
        # off)", so that their copy-phase knobs are still measured.
        self.pdl_broken = None
        try:
            if SMOKE:
                raise ImportError("no stream writes in --cpu-smoke")
            from strictops.ops import _cuda_stream

            _cuda_stream._driver()
            self.cuda_stream = _cuda_stream
        except ImportError as e:
            self.cuda_stream = None
            self.result["original_path_error"] = str(e)

    def elapsed(self):
        return time.time() - self.t0

    # Per-size context ---------------------------------------------------------------------

    def setup(self, name, nbytes):
        pool = self.pool
        lease = pool.lease(nbytes)
        # Every check and every timing reads this tensor's storage: rewritten in place.
        ctx = dict(name=name, nbytes=nbytes, lease=lease,
                   lease_t=torch.tensor(lease, dtype=torch.int64, device=DEVICE),
                   src=torch.empty(nbytes, dtype=torch.uint8, device=DEVICE).random_(0, 256),
                   state=m.new_state(DEVICE), floor_us=2 * nbytes / self.bw)
        self.ctx[name] = ctx
        self.result["sizes"].setdefault(name, {"bytes": nbytes, "floor_us": ctx["floor_us"],
                                               "lease": list(lease), "rows": []})
        return ctx

    def set_lease(self, ctx, lease):
        ctx["lease_t"].copy_(torch.tensor(lease, dtype=torch.int64))

    def next_generation(self):
        self.gen += 1
        return self.gen

    def prepare(self, ctx, lease, full_lease):
        """Poison the lease's range, zero its ready word, fresh source bytes; returns the
        expected ``(pool, state)`` after publishing ``lease``."""
        pool = self.pool.tensor
        s, e = full_lease.start, full_lease.end
        pool[s:e] = torch.randint(0, 256, (e - s,), dtype=torch.uint8, device=DEVICE)
        r = full_lease.ready_byte_offset
        pool[r:r + WORD_BYTES] = 0
        ctx["src"].random_(0, 256)
        expected = pool.clone()
        expected_state = ctx["state"].clone()
        expected_state[ARRIVALS] = 0
        fits = lease.generation > 0
        if fits:
            expected[lease.start:lease.start + lease.nbytes] = ctx["src"][:lease.nbytes]
            expected[r:r + WORD_BYTES] = torch.tensor([lease.generation], dtype=torch.int32,
                                                      device=DEVICE).view(torch.uint8)
        else:
            expected_state[ERRORS] += 1
        return expected, expected_state

    def verify(self, ctx, run, how, lease):
        expected, expected_state = self.prepare(ctx, lease, ctx["lease"])
        self.set_lease(ctx, lease)
        run()
        sync()
        ok_pool = torch.equal(self.pool.tensor, expected)
        ok_state = torch.equal(ctx["state"], expected_state)
        if not (ok_pool and ok_state):
            diff = (self.pool.tensor != expected).nonzero()
            raise AssertionError(
                f"not bit-exact ({how}): {diff.numel()} pool bytes differ "
                f"(first {diff[:4].flatten().tolist()}), state {ctx['state'].tolist()} "
                f"expected {expected_state.tolist()}")

    def capture(self, fn):
        if SMOKE:
            fn()
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

    def time_us(self, fn, rep_ms):
        if SMOKE:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e6
        from triton.testing import do_bench

        return do_bench(fn, warmup=self.args.warmup_ms, rep=rep_ms, return_mode="median") * 1e3

    # One row ------------------------------------------------------------------------------

    def measure(self, ctx, label, kind, params, run, checks=("full", "short", "refused")):
        """``run()`` publishes whatever ``ctx['lease_t']`` holds; check, capture, time."""
        size = self.result["sizes"][ctx["name"]]
        row = {"name": label, "kind": kind, "params": params}
        size["rows"].append(row)
        if kind == "variant" and self.elapsed() > self.args.budget_s:
            row["skipped"] = "time budget"
            self.save()
            return row
        t = time.time()
        state, lease = ctx["state"], ctx["lease"]
        try:
            state.zero_()
            for case in checks:
                good = lease._replace(generation=self.next_generation())
                target = {"full": good, "short": good._replace(nbytes=good.nbytes - 3),
                          "refused": good._replace(generation=0)}[case]
                self.verify(ctx, run, f"eager, {case}", target)
                if case == "full" and "compiled" in ctx:
                    row["kernels"] = kernel_facts(ctx.pop("compiled"))
            self.set_lease(ctx, lease._replace(generation=self.next_generation()))
            graph = self.capture(run)
            if checks:
                good = lease._replace(generation=self.next_generation())
                self.verify(ctx, graph.replay, "graph replay", good)
            self.set_lease(ctx, lease)  # the lease timed: valid, full
            row["ok"] = True
            row["us"] = self.time_us(graph.replay, self.args.rep_ms)
            row["floor_ratio"] = ctx["floor_us"] / row["us"]
            self.graphs[(ctx["name"], label)] = graph
        except Exception as e:  # noqa: BLE001 - record it and go on
            row["ok"] = False
            row["error"] = f"{type(e).__name__}: {e}"[:800]
            row["traceback"] = traceback.format_exc()[-2500:]
            print(f"   {ctx['name']} {label}: {row['error'][:300]}", flush=True)
            state.zero_()
        row["seconds"] = round(time.time() - t, 2)
        self.save()
        return row

    def baselines(self, ctx):
        pool, lease = self.pool, ctx["lease"]
        src, lease_t, state = ctx["src"], ctx["lease_t"], ctx["state"]
        dst = pool.tensor[lease.start:lease.start + lease.nbytes]

        def copy_only():
            dst.copy_(src)

        def copy_check():
            dst.zero_()
            src.random_(0, 256)
            copy_only()
            sync()
            if not torch.equal(dst, src):
                raise AssertionError("copy_ not exact")

        row = self.measure(ctx, "copy_", "baseline", {}, copy_only, checks=())
        try:
            copy_check()
        except Exception as e:  # noqa: BLE001
            row.update(ok=False, error=str(e))

        if self.cuda_stream is not None:
            def original():
                dst.copy_(src)
                self.cuda_stream.write_value32(torch.cuda.current_stream(),
                                               pool.base_address + lease.ready_byte_offset,
                                               lease.generation)
            row = self.measure(ctx, "copy_+cuStreamWriteValue32", "baseline", {}, original,
                               checks=())
            try:
                full = lease
                expected, _ = self.prepare(ctx, full, full)
                original()
                sync()
                if not torch.equal(pool.tensor, expected):
                    raise AssertionError("original path not exact")
            except Exception as e:  # noqa: BLE001
                row.update(ok=False, error=str(e))

        def current():
            m._launch(m._publish_kernel, pool.tensor, src, lease_t, state, SLOTS, CONSUMERS)
        self.measure(ctx, "current op", "current", {"tuning": repr(m.TUNING)}, current)

    def variant(self, ctx, v):
        pool = self.pool
        name = variant_name(v)
        if v["pdl"] and self.pdl_broken:
            v = dict(v, pdl=False)
            name = variant_name(v).replace("2L/", "2L(pdl off)/", 1)

        def run():
            compiled = launch_variant(v, pool.tensor, ctx["src"], ctx["lease_t"], ctx["state"])
            ctx.setdefault("compiled", compiled)
        ctx.pop("compiled", None)
        row = self.measure(ctx, name, "variant", v, run)
        if v["pdl"] and row.get("ok") is False and not row["error"].startswith("AssertionError"):
            self.pdl_broken = f"{ctx['name']} {name}: {row['error'][:300]}"
            self.result["pdl_broken"] = self.pdl_broken
            print("   PDL variants run without PDL from here on", flush=True)

    # Output -------------------------------------------------------------------------------

    def save(self):
        self.result["total_s"] = round(self.elapsed(), 1)
        self.out.write_text(json.dumps(self.result, indent=1, default=str))

    def table(self, name):
        size = self.result["sizes"][name]
        rows = size["rows"]
        cur = next((r for r in rows if r["kind"] == "current" and r.get("us")), None)
        print(f"\n== {name}: floor {size['floor_us']:.2f} us")
        print(f"{'variant':48} {'us':>8} {'floor/t':>8} {'cur/t':>6} {'regs':>5}  note")
        for r in sorted(rows, key=lambda r: (r["kind"] == "variant", r.get("us") or 1e9)):
            us = r.get("confirm_us") or r.get("us")
            regs = "/".join(str(k.get("n_regs", "")) for k in r.get("kernels", []))
            note = r.get("error") or r.get("skipped") or ""
            if r.get("confirm_us"):
                note = f"confirm (first {r['us']:.2f})"
            print(f"{r['name']:48} {us if us else float('nan'):8.2f} "
                  f"{size['floor_us'] / us if us else float('nan'):8.3f} "
                  f"{cur['us'] / us if us and cur else float('nan'):6.3f} {regs:>5}  "
                  f"{note[:70]}", flush=True)

    def confirm(self, name, best=3):
        """Re-time the baselines and the best ``best`` variants with longer runs."""
        size = self.result["sizes"][name]
        rows = [r for r in size["rows"] if r.get("us") and (name, r["name"]) in self.graphs]
        key = (lambda r: r["us"])
        top = sorted((r for r in rows if r["kind"] == "variant"), key=key)[:best]
        for r in [r for r in rows if r["kind"] != "variant"] + top:
            if self.elapsed() > self.args.budget_s + 12:
                break
            try:
                self.set_lease(self.ctx[name], self.ctx[name]["lease"])
                r["confirm_us"] = self.time_us(self.graphs[(name, r["name"])].replay,
                                               self.args.confirm_rep_ms)
                r["confirm_floor_ratio"] = size["floor_us"] / r["confirm_us"]
            except Exception as e:  # noqa: BLE001
                r["confirm_error"] = f"{type(e).__name__}: {e}"[:300]
        self.save()

    def bars(self):
        def us(r):
            return r.get("confirm_us") or r.get("us")
        bars = {}
        for name, goal in (("64KiB", "us<=7.0"), ("256MiB", "floor_ratio>=0.95")):
            size = self.result["sizes"].get(name)
            if not size:
                continue
            ours = [r for r in size["rows"] if r["kind"] != "baseline" and us(r)]
            best = min(ours, key=us, default=None)
            if best:
                t = us(best)
                bars[name] = {"goal": goal, "best": best["name"], "us": t,
                              "floor_ratio": size["floor_us"] / t,
                              "met": t <= 7.0 if name == "64KiB" else size["floor_us"] / t >= 0.95}
        self.result["bars"] = bars
        print("\nbars:", json.dumps(bars), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp/out"),
                                                  "transport-variants2.json"))
    ap.add_argument("--sizes", default=",".join(n for n, _ in SIZES))
    ap.add_argument("--warmup-ms", type=int, default=20)
    ap.add_argument("--rep-ms", type=int, default=60)
    ap.add_argument("--confirm-rep-ms", type=int, default=200)
    ap.add_argument("--budget-s", type=float, default=100,
                    help="no new variant starts after this many seconds (baselines still run)")
    ap.add_argument("--no-cluster", action="store_true", help="skip the cluster variants")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="the host logic on CPU through the interpreter (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    global SMOKE, DEVICE
    if args.cpu_smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("--cpu-smoke needs TRITON_INTERPRET=1")
        SMOKE, DEVICE = True, "cpu"
        args.no_cluster = True
        use_cpu_stand_ins()

    probe = Probe(args)
    wanted = [(n, SMOKE_BYTES[n] if SMOKE else b) for n, b in SIZES
              if n in args.sizes.split(",")]
    for name, nbytes in wanted:
        ctx = probe.setup(name, nbytes)
        print(f"-- {name} ({probe.elapsed():.0f} s)", flush=True)
        probe.baselines(ctx)
        for v in variants_for(name):
            probe.variant(ctx, v)
        probe.pool.release(ctx["lease"])
    if not args.no_cluster:
        for name, nbytes in wanted:
            vs = cluster_variants_for(name)
            if vs:
                ctx = probe.ctx[name]
                ctx["lease"] = probe.pool.lease(nbytes)  # the same range again (best fit)
                probe.set_lease(ctx, ctx["lease"])
                print(f"-- {name} cluster variants ({probe.elapsed():.0f} s)", flush=True)
                for v in vs:
                    probe.variant(ctx, v)
                probe.pool.release(ctx["lease"])
    for name in ("64KiB", "256MiB"):
        if name in probe.result["sizes"]:
            probe.confirm(name)
    for name, _ in wanted:
        probe.table(name)
    probe.bars()
    probe.pool.shutdown()
    probe.save()
    print(f"\nwrote {probe.out} in {probe.elapsed():.0f} s", flush=True)


if __name__ == "__main__":
    main()
