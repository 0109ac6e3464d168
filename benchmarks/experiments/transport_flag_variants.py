"""Publishing a small tensor with the flag ordered for every observer ("peers"): candidate ways,
side by side with the original and the op, timed in CUDA-graph replay at 64 KiB, 1 MiB and
16 MiB.

Each candidate copies ``nbytes`` into a lease of the pool and then writes the lease's
generation into its ready word, such that every observer (a consumer on this GPU, on a peer GPU
reading over NVLink, or the host) that sees the word also sees every byte. Each is built from
the live code (``strictops.ops.transport.pool``: its kernel, ``_launch`` and ``_launches`` with
their tuning overrides; no new kernel), and states in ``why`` what orders its bytes before its
flag:

- ``original``: ``copy_`` into the lease, then ``cuStreamWriteValue32`` of the ready word
  (sglang's; from ``.anchor/originals.py`` where present);
- ``op``: ``TransportPool.publish`` as it is (``TUNING``: one launch up to 1 MiB, two above);
- (a) the one-launch kernel, the last program to arrive at the counter releasing the flag;
- (b) the two-launch path's copy kernel alone (whole blocks: ``nbytes`` a multiple of the
  block), then the flag as its own graph node, ``cuStreamWriteValue32``, as the original does
  after ``copy_``. Its address and value are fixed when the graph is captured, so unlike the
  op it cannot publish into a new lease on each replay: a bound for a fixed lease;
- (c) two launches with the flag program at 1 warp, as a programmatic dependent launch (PDL)
  and as a plain second launch, and the two-launch default;
- (d) one launch with larger blocks (16-64 KiB): fewer programs arrive at the counter;
- ``ref``: the one launch with ``consumers="same_device"`` (GPU-scope release): not a
  candidate (a peer is outside its scope), the cost of the system scope beside (a).

Times, µs per publish (medians over ``ROUNDS`` rounds, the variants alternating within a
round): ``graph_us``, one publish per graph, L2 flushed before each replay (the benchmark's
"graph" number); ``graph20_us``, 20 back-to-back publishes per graph, per publish (each kernel
starts as the one before ends, as in a serving step). Every variant is checked bit for bit
(the lease's bytes, its ready word, no refused lease) after an eager call and after a replay.

    python benchmarks/experiments/transport_flag_variants.py --out $OUT/flag_variants.json
    python benchmarks/experiments/transport_flag_variants.py --dry-run   # CPU: the launches

``--dry-run`` needs no GPU: it builds every kernel variant's launches (grid, constexprs,
options; sm_90 assumed for PDL) from the live ``_launches`` on CPU tensors and prints them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

import torch

from strictops.meta.transport import pool as contract
from strictops.ops.transport import cuda_stream as _cuda_stream
from strictops.ops.transport import pool as m
from strictops.ops._runtime.launcher import keyword_constexprs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _harness import anchor_module, captured, graph_replay_us  # noqa: E402

SIZES = [("64KiB", 64 << 10), ("1MiB", 1 << 20), ("16MiB", 16 << 20)]
SLOTS, CONSUMERS = 64, 2
ROUNDS, REP_MS, CALLS_PER_GRAPH = 3, 200, 20

# What orders the bytes before the flag, for every observer, per mechanism.
_LAST_ARRIVAL = (
    "each program's stores, then a CTA barrier and a GPU-scope acq_rel add on the counter "
    "(every program is on the pool's GPU); the last to arrive has acquired every program's "
    "bytes and writes the flag with st.release.sys, which is cumulative: it orders those "
    "bytes too, for observers anywhere in the system")
_FLAG_PROGRAM = (
    "the copy grid's bytes precede the flag program by {order}; it copies the partial block, "
    "passes a CTA barrier and writes the flag with st.release.sys (cumulative: the copy "
    "grid's bytes, visible to it, are ordered before the flag for every observer)")
_WRITE_VALUE = (
    "cuStreamWriteValue32 without CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER runs after the copy "
    "in stream order and puts a system-wide memory barrier before its write (what the "
    "original relies on)")


class Variant(NamedTuple):
    """``kind``: ``original``, ``op``, ``kernel`` (``m._launch`` with ``settings`` as its
    overrides) or ``copy_then_write`` (the two-launch path's copy launch with ``settings``,
    then ``cuStreamWriteValue32``); ``candidate``: orders the flag for peers too."""

    name: str
    kind: str
    settings: dict
    why: str
    candidate: bool = True


VARIANTS = [
    Variant("original: copy_ + cuStreamWriteValue32", "original", {}, _WRITE_VALUE),
    Variant("op: TUNING", "op", {}, "as (a) up to 1 MiB, as (c) default above"),
    Variant("a: one launch (TUNING)", "kernel", {"two_launches": False}, _LAST_ARRIVAL),
    Variant("b: copy 16KiB/4w + cuStreamWriteValue32", "copy_then_write",
            {"block_bytes": 16384, "num_warps": 4, "pdl": False}, _WRITE_VALUE),
    Variant("b: copy 4KiB/8w + cuStreamWriteValue32", "copy_then_write",
            {"block_bytes": 4096, "num_warps": 8, "pdl": False}, _WRITE_VALUE),
    Variant("c: two launches, flag 1w, PDL", "kernel",
            {"two_launches": True, "flag_num_warps": 1, "pdl": True},
            _FLAG_PROGRAM.format(order="griddepcontrol.wait (the copy grid complete and its "
                                       "memory visible) before the barrier")),
    Variant("c: two launches, flag 1w, no PDL", "kernel",
            {"two_launches": True, "flag_num_warps": 1, "pdl": False},
            _FLAG_PROGRAM.format(order="stream order (the second launch starts after the "
                                       "first completes)")),
    Variant("c: two launches default (flag 4w, PDL)", "kernel", {"two_launches": True},
            _FLAG_PROGRAM.format(order="griddepcontrol.wait")),
    Variant("d: one launch 16KiB/4w", "kernel",
            {"two_launches": False, "block_bytes": 16384, "num_warps": 4}, _LAST_ARRIVAL),
    Variant("d: one launch 16KiB/8w", "kernel",
            {"two_launches": False, "block_bytes": 16384, "num_warps": 8}, _LAST_ARRIVAL),
    Variant("d: one launch 32KiB/8w", "kernel",
            {"two_launches": False, "block_bytes": 32768, "num_warps": 8}, _LAST_ARRIVAL),
    Variant("d: one launch 64KiB/16w", "kernel",
            {"two_launches": False, "block_bytes": 65536, "num_warps": 16}, _LAST_ARRIVAL),
    Variant("ref: one launch, same_device (GPU scope)", "kernel",
            {"two_launches": False, "consumers": contract.SAME_DEVICE},
            "st.release.gpu: orders the bytes for observers on this GPU only", False),
]


def kernel_launches(variant: Variant, pool, src, lease_t, state) -> list:
    """The launches (``(grid, every kernel parameter, options)``) the live ``_launches``
    makes for a ``kernel`` or ``copy_then_write`` variant: for the latter only the copy launch,
    which must cover the whole source (``nbytes`` a multiple of its block)."""
    settings = dict(variant.settings)
    consumers = settings.pop("consumers", contract.PEERS)
    two = settings.pop("two_launches", None) if variant.kind == "kernel" else True
    src_bytes = src.view(-1).view(torch.uint8)
    launches = m._launches(m._publish_kernel, pool, src_bytes, src_bytes.shape[0], lease_t,
                           state, SLOTS, CONSUMERS, None, two, consumers, **settings)
    if variant.kind == "copy_then_write":
        block = settings["block_bytes"]
        if src_bytes.shape[0] % block:
            raise ValueError(f"{variant.name}: {src_bytes.shape[0]} bytes are not whole "
                             f"{block}-byte blocks (the flag program copies a partial one)")
        launches = launches[:1]
    return launches


def _describe(launch) -> str:
    grid, args, options = launch
    _, constexprs = keyword_constexprs(m._publish_kernel, args)
    shown = {k: constexprs[k] for k in ("BLOCK", "PHASE", "PDL", "SYSTEM")}
    return f"grid={grid} {shown} {dict(options)}"


def dry_run() -> None:
    """Every variant's launches, from the live code, on CPU tensors (sm_90 assumed)."""
    m._has_pdl = lambda device_index: True  # this process only: no device to ask
    for name, nbytes in SIZES:
        pool, src, lease_t, state, _ = _inputs("cpu", nbytes)
        for v in VARIANTS:
            if v.kind in ("kernel", "copy_then_write"):
                launches = kernel_launches(v, pool, src, lease_t, state)
                print(f"{name:7s} {v.name:44s}", " | ".join(map(_describe, launches)))


def _inputs(device: str, nbytes: int):
    """A pool of ``SLOTS`` slots (zeroed), a random source of ``nbytes``, a fitting lease of
    slot 1 (its tensor and its fields), a zero state."""
    start = contract.data_start(SLOTS, CONSUMERS)
    stride = contract.slot_bytes(CONSUMERS)
    lease = contract.Lease(start, start + nbytes, nbytes, 1, 7, stride, stride + 4)
    pool = torch.zeros(start + nbytes, dtype=torch.uint8, device=device)
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    return pool, src, torch.tensor(lease, device=device), m.new_state(device), lease


def original_and_op(pool, src, lease_t, state, lease) -> dict:
    """The original's publish and the op's (``consumers`` as the pool's default), each a
    function that publishes once on the current stream."""
    originals = anchor_module("originals")
    ready_address = pool.data_ptr() + lease.ready_byte_offset

    def original():
        if originals is not None:
            originals.transport_publish(pool, src, lease.start, lease.ready_byte_offset,
                                        lease.generation)
            return
        pool[lease.start:lease.start + lease.nbytes].copy_(src)
        _cuda_stream.write_value32(torch.cuda.current_stream(), ready_address, lease.generation)

    def op():
        m.copy_and_publish(pool, src, lease_t, state, SLOTS, CONSUMERS)
    return {"original": original, "op": op}


def _publishers(pool, src, lease_t, state, lease) -> dict:
    """Per variant, a function that publishes once on the current stream."""
    original, op = original_and_op(pool, src, lease_t, state, lease).values()
    ready_address = pool.data_ptr() + lease.ready_byte_offset

    def kernel(v):
        settings = dict(v.settings)
        consumers = settings.pop("consumers", contract.PEERS)
        return lambda: m._launch(m._publish_kernel, pool, src, lease_t, state, SLOTS,
                                 CONSUMERS, consumers=consumers, **settings)

    def copy_then_write(v):
        [(grid, args, options)] = kernel_launches(v, pool, src, lease_t, state)
        runtime, constexprs = keyword_constexprs(m._publish_kernel, args)

        def publish():
            m._publish_kernel[grid](*runtime, **constexprs, **dict(options))
            _cuda_stream.write_value32(torch.cuda.current_stream(), ready_address,
                                       lease.generation)
        return publish

    made = {"original": lambda v: original, "op": lambda v: op, "kernel": kernel,
            "copy_then_write": copy_then_write}
    return {v.name: made[v.kind](v) for v in VARIANTS}


def _exact(publish, pool, src, state, lease) -> bool:
    """Whether ``publish()`` writes the lease's bytes and its ready word, and refuses
    nothing."""
    pool[lease.start:lease.start + lease.nbytes].zero_()
    pool[lease.ready_byte_offset:lease.ready_byte_offset + 4].zero_()
    publish()
    torch.cuda.synchronize()
    word = pool[lease.ready_byte_offset:lease.ready_byte_offset + 4].view(torch.int32)
    return (torch.equal(pool[lease.start:lease.start + lease.nbytes], src)
            and int(word) == lease.generation and int(state[contract.ERRORS]) == 0)


def sample(publishers: dict) -> dict:
    """Per publisher, its ``graph_us`` and ``graph20_us`` over ``ROUNDS`` rounds, the
    publishers alternating within a round."""
    samples = {name: {"graph_us": [], "graph20_us": []} for name in publishers}
    for _ in range(ROUNDS):
        for name, publish in publishers.items():
            samples[name]["graph_us"].append(graph_replay_us(publish, rep=REP_MS))
            samples[name]["graph20_us"].append(graph_replay_us(
                publish, rep=REP_MS, flush_l2=False, calls=CALLS_PER_GRAPH))
    return samples


def bit_exact(publishers: dict, pool, src, state, lease) -> dict:
    """Per publisher, :func:`_exact` after an eager call and after a CUDA-graph replay."""
    return {name: _exact(p, pool, src, state, lease) and
            _exact(captured(p).replay, pool, src, state, lease)
            for name, p in publishers.items()}


def candidate_rows(size: str, nbytes: int, samples: dict, exact: dict) -> list:
    """One row per publisher of :func:`sample`'s ``samples`` (medians, every round, the
    original's ``graph_us`` over the publisher's), printed as it is made; ``exact``: the
    publishers checked bit for bit (None for a bound, which is not)."""
    base = statistics.median(samples["original"]["graph_us"])
    rows = []
    for name, s in samples.items():
        row = {"size": size, "bytes": nbytes, "variant": name, "bit_exact": exact.get(name),
               **{k: statistics.median(v) for k, v in s.items()}, "rounds": s}
        row["original_over_graph_us"] = base / row["graph_us"]
        rows.append(row)
        print(f"{size:6s} {name:46s} {row['graph_us']:7.2f} {row['graph20_us']:7.2f} "
              f"{row['original_over_graph_us']:6.3f} {exact.get(name)}", flush=True)
    return rows


def write_rows(out: Path | None, rows: list) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows},
                                  indent=2))


def selected(publishers: dict, only: list | None) -> dict:
    """``publishers`` whose name holds one of the substrings ``only`` (all where None), and
    always the original and the op, which every row is compared with."""
    return {name: p for name, p in publishers.items()
            if only is None or name in ("original", "op") or any(s in name for s in only)}


def main_of(measure_fn, doc: str) -> None:
    """An experiment's command line: ``--out`` JSON and ``--only`` (a list, separated by ``|``,
    of substrings of publisher names, :func:`selected`), passed to ``measure_fn``."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    ap.add_argument("--only", type=lambda text: text.split("|"), default=None,
                    help="time only publishers whose name holds one of these substrings")
    args = ap.parse_args()
    measure_fn(args.out, args.only)


def measure(out: Path | None) -> None:
    rows = []
    for size, nbytes in SIZES:
        pool, src, lease_t, state, lease = _inputs("cuda", nbytes)
        publishers = _publishers(pool, src, lease_t, state, lease)
        exact = bit_exact(publishers, pool, src, state, lease)
        samples = sample(publishers)
        original = statistics.median(samples[VARIANTS[0].name]["graph_us"])
        for v in VARIANTS:
            s = samples[v.name]
            row = {"size": size, "bytes": nbytes, "variant": v.name, "kind": v.kind,
                   "settings": v.settings, "candidate": v.candidate, "why": v.why,
                   "bit_exact": exact[v.name],
                   **{key: statistics.median(values) for key, values in s.items()},
                   "rounds": s}
            row["original_over_graph_us"] = original / row["graph_us"]
            rows.append(row)
        del pool, src
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    result = {"env": {"device": props.name, "torch": torch.__version__,
                      "original": "anchor" if anchor_module("originals") else "inline"},
              "rows": rows}
    print(f"{'size':7s} {'variant':44s} {'graph_us':>9s} {'graph20_us':>10s} "
          f"{'orig/ours':>9s} exact")
    for r in rows:
        print(f"{r['size']:7s} {r['variant']:44s} {r['graph_us']:9.2f} {r['graph20_us']:10.2f} "
              f"{r['original_over_graph_us']:9.3f} {r['bit_exact']}")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    ap.add_argument("--dry-run", action="store_true",
                    help="print every variant's launches (CPU tensors; no GPU needed)")
    args = ap.parse_args()
    if args.dry_run:
        dry_run()
    else:
        measure(args.out)


if __name__ == "__main__":
    main()
