"""Back-to-back sparse MLA calls, with and without a programmatic dependent launch (PDL).

Where the GPU, not the host, bounds a stream of calls (small prefills), the time between two
kernels counts: launched as a programmatic dependent, the block-pair kernel's CTAs start as the
kernel before leaves the SMs and wait for it (``griddepcontrol.wait``) only before touching
memory. Per shape, µs per call (medians of 11 rounds):

* ``graph_pdl`` / ``graph_no_pdl``: 20 calls of the kernel captured in one CUDA graph, replayed
  (the GPU alone, no host in between), with ``pdl`` on and off;
* ``graph_original``: the same for sglang's CUTLASS kernel, where ``.anchor`` has it built;
* ``eager_wall`` / ``original_eager_wall``: back-to-back eager calls of the public op (the
  default tuning) and of the original, outputs preallocated, 1000 calls a round.

    python benchmarks/experiments/sparse_mla_pdl.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from strictops.meta.sparse_mla import prefill as smp
from strictops.ops.sparse_mla import prefill as sparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _harness import anchor_module, captured, wall_us  # noqa: E402

SHAPES = [(64, 8192, 128, 576, 512), (256, 8192, 128, 576, 512), (64, 8192, 128, 576, 2048),
          (1024, 32768, 128, 576, 2048)]
CALLS_PER_GRAPH, ROUNDS = 20, 11


def graph_us(call) -> float:
    """µs per call of ``CALLS_PER_GRAPH`` calls of ``call`` captured in one CUDA graph."""
    graph = captured(call, CALLS_PER_GRAPH, on_side_stream=True)
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / (5 * CALLS_PER_GRAPH))
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    ws = sparse._sparse_mla_sm90
    originals = anchor_module("originals")
    q8kv8 = originals.sparse_mla() if originals is not None else None
    rows = []
    for s_q, s_kv, h_q, d_qk, topk in SHAPES:
        dims = smp.Dims(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, device="cuda",
                        with_buffers=True)
        a = sparse.random_inputs(dims, torch.Generator(device="cuda").manual_seed(0),
                                 invalid_fraction=0.0, edge_rows=False)
        a.pop("topk_length_errors")
        launch_args = (a["q"], a["kv"], a["indices"], a["sm_scale"], a["q_scale"],
                       a["kv_scale"], None, None, a["out"], a["max_logits"], a["lse"], None)
        row = {"shape": [s_q, s_kv, h_q, d_qk, topk]}
        for pdl in (True, False):
            row["graph_pdl" if pdl else "graph_no_pdl"] = graph_us(
                lambda: ws.launch(*launch_args, pdl=pdl))
        public = {k: v for k, v in a.items()}
        row["eager_wall"] = wall_us(lambda: sparse.sparse_mla_q8kv8_prefill_fwd(**public))[0]
        if q8kv8 is not None:
            call = (a["q"], a["kv"], a["indices"], a["q_scale"], a["kv_scale"], a["out"],
                    a["max_logits"], a["lse"], a["sm_scale"], None, None)
            row["graph_original"] = graph_us(lambda: q8kv8(*call))
            row["original_eager_wall"] = wall_us(lambda: q8kv8(*call))[0]
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v
                          for k, v in row.items()}), flush=True)
        rows.append(row)
        del a, public, launch_args
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sparse_mla_pdl.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
