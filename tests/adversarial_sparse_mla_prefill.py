"""Drive the op with adversarial index and length values, for compute-sanitizer (.ci/gpu).

    compute-sanitizer --tool memcheck python3 tests/adversarial_sparse_mla_prefill.py [KERNEL...]

Both kernels (on an sm_90 GPU the warp-specialised Gluon kernel, then the Triton one; elsewhere
the Triton one) and every variant of each: both head dims (512, 576), one and two head blocks (h_q 64, 128),
and each optional-argument combination: none, ``topk_length``, ``topk_length`` with
``attn_sink``; each with the device-side error counter and without it; and 300 tokens of 64
heads (more tiles than SMs, so a persistent CTA computes several). Index values: -1,
``s_kv`` and just past it, INT32_MAX / INT32_MIN, every index of a token invalid, duplicates.
``topk_length`` values below 0, above ``topk`` and at the INT32 extremes: with a counter in an
eager call (counted on the device, no host sync), without one inside a captured CUDA graph
(where the op skips its eager value check: clamped, not counted). ``kv`` and the index tensors
are exact-size allocations, so a read past either end is an out-of-bounds access the sanitizer
reports. Every call must match the float64 reference within the GPU tolerance and count
exactly the out-of-range lengths.
"""

import sys

import torch

from strictops.meta.sparse_mla import prefill as contract
from strictops.meta.testing import capture_cuda_graph
from strictops.ops.sparse_mla import prefill as op
from strictops.ops import sparse_mla_q8kv8_prefill_fwd

I32_MAX, I32_MIN = 2**31 - 1, -(2**31)
# (with_topk_length, with_attn_sink): the argument combinations the contract allows.
VARIANTS = {"plain": (False, False), "topk_length": (True, False), "attn_sink": (True, True)}


def _inputs(gen, d_qk: int, h_q: int, topk: int, variant: str, counter: bool,
            s_q: int = 12) -> dict:
    with_topk_length, with_attn_sink = VARIANTS[variant]
    dims = contract.Dims(s_q=s_q, s_kv=97, h_q=h_q, d_qk=d_qk, topk=topk,
                         with_topk_length=with_topk_length, with_attn_sink=with_attn_sink,
                         with_buffers=True, with_errors=counter, device="cuda")
    args = op.random_inputs(dims, gen, invalid_fraction=1 / 2)
    edges = torch.tensor([-1, dims.s_kv, dims.s_kv + 1, I32_MAX, I32_MIN, 0, dims.s_kv - 1,
                          dims.s_kv - 1], dtype=torch.int32)
    args["indices"][5, 0, :len(edges)] = edges.cuda()
    return args


def _check(args: dict, outputs, what) -> None:
    expected = op.reference(**{k: args[k] for k in op.INPUTS})
    passed, detail = op.compare_to_reference(outputs, expected, op.GPU_REL_L2_BOUND,
                                             op.GPU_LOGIT_TOL)
    assert passed, (what, detail)


def main() -> None:
    cases = 0
    hopper = op.warp_specialized(torch.empty(0, device="cuda"))
    kernels = ["gluon", "triton"] if hopper else ["triton"]
    kernels = [k for k in kernels if k in sys.argv[1:]] or kernels  # e.g. only the Gluon one
    for kernel in kernels:
        op.KERNEL = kernel
        cases += _run_every_variant(torch.Generator(device="cuda").manual_seed(0), kernel)
    op.KERNEL = "auto"
    torch.cuda.synchronize()
    print(f"adversarial_sparse_mla_prefill: {cases} calls ({', '.join(kernels)} kernels), all "
          f"within tolerance of the reference")


def _run_every_variant(gen: torch.Generator, kernel: str) -> int:
    cases = 0
    for d_qk in contract.D_QKS:
        for h_q, topk in ((64, 128), (128, 256)):
            bad_lengths = [-1, topk + 1, I32_MAX, I32_MIN]
            for variant, (with_topk_length, _) in VARIANTS.items():
                for counter in (True, False):
                    what = (kernel, d_qk, h_q, variant, "counter" if counter else "no counter")
                    args = _inputs(gen, d_qk, h_q, topk, variant, counter)
                    if not with_topk_length:  # a counter without lengths counts nothing
                        _check(args, sparse_mla_q8kv8_prefill_fwd(**args), what)
                        assert not counter or args["topk_length_errors"].item() == 0, what
                    elif counter:  # eager: counted on the device
                        args["topk_length"][-len(bad_lengths):] = torch.tensor(bad_lengths)
                        _check(args, sparse_mla_q8kv8_prefill_fwd(**args), what)
                        assert args["topk_length_errors"].item() == len(bad_lengths), what
                    else:  # captured: no eager check, the kernel clamps
                        graph, outputs = capture_cuda_graph(sparse_mla_q8kv8_prefill_fwd, **args)
                        args["topk_length"][-len(bad_lengths):] = torch.tensor(bad_lengths)
                        graph.replay()
                        _check(args, outputs, what)
                    cases += 1
        # More tiles than an H200 has SMs: a persistent CTA computes several in a row.
        what = (kernel, d_qk, "many tiles")
        args = _inputs(gen, d_qk, 64, 256, "attn_sink", True, s_q=300)
        args["topk_length"][::3] = 0
        args["topk_length"][1::7] = I32_MAX
        _check(args, sparse_mla_q8kv8_prefill_fwd(**args), what)
        assert args["topk_length_errors"].item() == len(range(1, 300, 7)), what
        cases += 1
    return cases


if __name__ == "__main__":
    main()
