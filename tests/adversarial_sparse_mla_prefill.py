"""Drive the op with adversarial index and length values, for compute-sanitizer (.ci/gpu).

    compute-sanitizer --tool memcheck python3 tests/adversarial_sparse_mla_prefill.py

Index values: -1, ``s_kv`` and just past it, INT32_MAX / INT32_MIN, every index of a token
invalid, duplicates; ``topk_length`` values below 0, above ``topk`` and at INT32 extremes
(counted on the device, no host sync); both head dims, one and two head blocks, with and
without ``attn_sink``. ``kv`` and the index tensors are exact-size allocations, so a read past
either end is an out-of-bounds access the sanitizer reports. Every call must match the float64
reference within the GPU tolerance and count exactly the out-of-range lengths.
"""

import torch

from strictops.meta import sparse_mla_prefill as contract
from strictops.ops import sparse_mla_prefill as op
from strictops.ops import sparse_mla_q8kv8_prefill_fwd


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    i32_max, i32_min = 2**31 - 1, -(2**31)
    cases = 0
    for d_qk in contract.D_QKS:
        for h_q, topk in ((64, 128), (128, 256)):
            for with_attn_sink in (False, True):
                dims = contract.Dims(s_q=12, s_kv=97, h_q=h_q, d_qk=d_qk, topk=topk,
                                     with_topk_length=True, with_attn_sink=with_attn_sink,
                                     with_errors=True, device="cuda")
                args = op.random_inputs(dims, gen, invalid_fraction=1 / 2)
                bad_lengths = [-1, topk + 1, i32_max, i32_min]
                args["topk_length"][-len(bad_lengths):] = torch.tensor(bad_lengths)
                edges = torch.tensor([-1, dims.s_kv, dims.s_kv + 1, i32_max, i32_min, 0,
                                      dims.s_kv - 1, dims.s_kv - 1], dtype=torch.int32)
                args["indices"][5, 0, :len(edges)] = edges.cuda()
                expected = op.reference(**{k: args[k] for k in op.INPUTS})
                outputs = sparse_mla_q8kv8_prefill_fwd(**args)
                passed, detail = op.compare_to_reference(outputs, expected,
                                                         op.GPU_REL_L2_BOUND, op.GPU_LOGIT_TOL)
                assert passed, (d_qk, h_q, with_attn_sink, detail)
                assert args["topk_length_errors"].item() == len(bad_lengths)
                cases += 1
    torch.cuda.synchronize()
    print(f"adversarial_sparse_mla_prefill: {cases} calls, all within tolerance of the reference")


if __name__ == "__main__":
    main()
