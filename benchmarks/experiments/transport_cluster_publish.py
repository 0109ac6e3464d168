"""A small publish whose programs meet at a thread-block-cluster barrier instead of a global
arrival counter: candidates, side by side with the original and the op, in CUDA-graph replay at
64 KiB and 1 MiB, with the flag ordered for every observer ("peers", system scope).

The op's one-launch path (``strictops.ops.transport.pool``) ends each program with a CTA
barrier and one thread's GPU-scope acquire-release add on the arrival counter (a memory barrier
that waits for the program's stores, then a round trip to L2); the last program to arrive
writes the flag with a system-scope release. On sm_90 the programs of one cluster can meet at
``barrier.cluster`` instead, a hardware barrier whose arrive has release and whose wait has
acquire semantics at cluster scope. The cluster's rank-0 CTA then writes the flag (one
cluster), or arrives for its cluster at the counter (several clusters: 16 arrivals at 1 MiB
instead of 256).

What orders the bytes before the flag, for every observer: each CTA's stores precede its
``barrier.cluster.arrive.release``, which synchronises with rank 0's
``barrier.cluster.wait.acquire`` (every CTA is in the cluster, so cluster scope is morally
strong between them); the flag is ``st.release.sys``, which is cumulative, so it orders every
store that happens before it, for observers anywhere in the system. With several clusters the
rank-0 CTAs' GPU-scope acquire-release adds carry their clusters' stores to the last one, as in
the op.

Candidates (``Variant``): the cluster size (``num_ctas`` of the launch: 8 or 16 CTAs; 16 is
the non-portable size Triton's launcher allows on sm_90) and the bytes per CTA. The ``c1``
row runs the same kernel without clusters (one CTA per cluster, the CTA barrier in place of the
cluster one). Sizes here are whole blocks.

The lease is read from its device tensor and checked (``lease_fits``, the op's terms) as in the
op, so the candidates do the op's work. Each is checked bit for bit (bytes, ready word, no
refused lease) after an eager call and after a replay.

Times, µs per publish (medians over the rounds of ``transport_flag_variants.sample``, the
variants alternating within a round): ``graph_us``, one publish per graph, L2 flushed before
each replay; ``graph20_us``, 20 back-to-back publishes per graph, per publish.

    python benchmarks/experiments/transport_cluster_publish.py --out $OUT/cluster_publish.json
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

import triton
import triton.language as tl

from strictops.meta.transport import pool as contract

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from transport_lean_publish import _read_lease  # noqa: E402
from transport_flag_variants import (  # noqa: E402
    CONSUMERS, SLOTS, _inputs, bit_exact, candidate_rows, main_of, original_and_op, sample,
    selected, write_rows)

SIZES = [("64KiB", 64 << 10), ("1MiB", 1 << 20)]


@triton.jit
def _cluster_publish_kernel(pool_ptr, src_ptr, lease_ptr, state_ptr, memory_size, src_nbytes,
                            data_start, slot_bytes, n_slots, BLOCK: tl.constexpr,
                            CLUSTER: tl.constexpr, LAST: tl.constexpr):
    """Grid ``(src_nbytes // BLOCK,)`` clusters of ``num_ctas`` CTAs (Triton splits the
    ``BLOCK`` bytes of a program across its cluster's CTAs). ``CLUSTER``: meet at
    ``barrier.cluster`` (else at a CTA barrier: ``num_ctas`` 1). ``LAST``: the number of
    programs less one; 0 writes the flag after the barrier without a counter."""
    block_start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = tl.arange(0, BLOCK)
    data = tl.load(src_ptr + block_start + offs, volatile=True)
    fits, nbytes, generation, dst_ptr, ready_ptr = _read_lease(
        pool_ptr, lease_ptr, memory_size, src_nbytes, data_start, slot_bytes, n_slots)
    if fits & (block_start + BLOCK <= nbytes):
        tl.store(dst_ptr + block_start + offs, data)
    if CLUSTER:
        tl.inline_asm_elementwise(
            "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;"
            " mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.debug_barrier()
    if fits:
        if LAST == 0:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; .reg .b32 t, r; mov.u32 t, %tid.x; mov.u32 r, %cluster_ctarank;"
                " or.b32 t, t, r; setp.eq.u32 p, t, 0;"
                " @p st.release.sys.global.b32 [$1], $2; mov.u32 $0, 0; }",
                "=r,l,r", [ready_ptr, generation.to(tl.int32)], dtype=tl.int32, is_pure=False,
                pack=1)
        else:
            tl.inline_asm_elementwise(
                "{ .reg .pred p, q; .reg .b32 t, r, old; mov.u32 t, %tid.x;"
                " mov.u32 r, %cluster_ctarank; or.b32 t, t, r; setp.eq.u32 p, t, 0;"
                " @p atom.acq_rel.gpu.global.add.u32 old, [$3], 1;"
                " setp.eq.and.u32 q, old, $4, p;"
                " @q st.release.sys.global.b32 [$1], $2;"
                " @q st.relaxed.gpu.global.b32 [$3], 0; mov.u32 $0, 0; }",
                "=r,l,r,l,r", [ready_ptr, generation.to(tl.int32), state_ptr, LAST],
                dtype=tl.int32, is_pure=False, pack=1)


class Variant(NamedTuple):
    name: str
    num_ctas: int  # CTAs per cluster (1: no cluster)
    cta_bytes: int  # bytes per CTA
    num_warps: int


VARIANTS = [
    Variant("c1: 4KiB/4w CTAs, CTA barrier, thread-0 count", 1, 4096, 4),
    Variant("c16: 4KiB/4w CTAs", 16, 4096, 4),
    Variant("c16: 4KiB/8w CTAs", 16, 4096, 8),
    Variant("c8: 4KiB/4w CTAs", 8, 4096, 4),
    Variant("c8: 8KiB/8w CTAs", 8, 8192, 8),
]


def _candidate(v: Variant, pool, src, lease_t, state):
    block = v.num_ctas * v.cta_bytes
    nbytes = src.numel()
    programs = nbytes // block
    layout = (pool.numel(), nbytes, contract.data_start(SLOTS, CONSUMERS),
              contract.slot_bytes(CONSUMERS), SLOTS)

    def publish():
        _cluster_publish_kernel[(programs,)](pool, src, lease_t, state, *layout, BLOCK=block,
                                             CLUSTER=v.num_ctas > 1, LAST=programs - 1,
                                             num_warps=v.num_warps, num_ctas=v.num_ctas)
    return publish


def measure(out: Path | None, only: list | None = None) -> None:
    rows = []
    for size, nbytes in SIZES:
        pool, src, lease_t, state, lease = _inputs("cuda", nbytes)
        publishers = original_and_op(pool, src, lease_t, state, lease)
        publishers.update({v.name: _candidate(v, pool, src, lease_t, state) for v in VARIANTS})
        publishers = selected(publishers, only)
        exact = bit_exact(publishers, pool, src, state, lease)
        rows += candidate_rows(size, nbytes, sample(publishers), exact)
    write_rows(out, rows)


def main() -> None:
    main_of(measure, __doc__)


if __name__ == "__main__":
    main()
