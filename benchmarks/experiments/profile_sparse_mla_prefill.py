"""Launch sparse_mla_q8kv8_prefill_fwd at the benchmark's first shape a few times, for a profiler.

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \\
        -k regex:sparse_mla -c 1 python3 benchmarks/experiments/profile_sparse_mla_prefill.py

(``.ci/gpu`` runs this when ``ncu`` is installed: ``ncu-sparse_mla_prefill.txt``.)
"""

import torch

from strictops.meta.sparse_mla import prefill as contract
from strictops.ops.sparse_mla import prefill as m
from strictops.ops import sparse_mla_q8kv8_prefill_fwd


def main() -> None:
    dims = contract.Dims(s_q=4096, s_kv=8192, h_q=128, d_qk=576, topk=2048, device="cuda")
    call = m.random_inputs(dims, torch.Generator(device="cuda").manual_seed(0),
                           invalid_fraction=0.0, edge_rows=False)
    for _ in range(3):  # the first compiles; a profiler picks the launch it is told to
        sparse_mla_q8kv8_prefill_fwd(**call)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
