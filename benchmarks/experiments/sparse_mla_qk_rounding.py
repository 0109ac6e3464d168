"""A CPU model of the rounding of S = Q·Kᵀ in the sm_90 sparse MLA kernels, and of where each
``qk_prec`` of ``strictops.ops.sparse_mla.gluon_block_pair`` starts its chains.

The model: FP8 e4m3 Q and K (float64 products, exact), summed 32 columns at a time (one
``wgmma`` m64n64k32 k-step) into an accumulator that keeps ``--bits`` mantissa bits after each
step, truncated toward zero (Hopper's FP8 ``wgmma`` keeps about 14; the research behind the
kernels found that 13-14 reproduce the measured ``lse`` errors). Logits are scaled to a
standard deviation of 20, the benchmark's ``large_logits`` data. Per chain start, the largest
and mean absolute ``lse`` error against float64 and the largest relative to ``1 + |lse|``
(the benchmark's measure):

- ``from zero``: every chain starts from 0 (``qk_prec`` 0, the default and the original's);
- ``offset``: pairs after the first (``2 * BLOCK_N`` keys a pair) start from minus half the
  row's running maximum over the pairs before (``qk_prec`` 1);
- ``offset, first pair split``: and the first pair as two chains, latent columns ``[0, 256)``
  and ``[256, 576)`` (``qk_prec`` 2);
- ``two chains everywhere``: the same split for every pair (the design note's two S
  accumulators, measured and not kept for their registers);
- ``offset from the row's true maximum``: a bound (the maximum is not known in advance).

    python benchmarks/experiments/sparse_mla_qk_rounding.py [--bits 13 14] [--rows 512]
"""

from __future__ import annotations

import argparse

import torch

from strictops.ops.sparse_mla.gluon_block_pair import BLOCK_N

D_QK, K_STEP, TOPK, LOGIT_STD = 576, 32, 2048, 20.0


def truncate(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x`` with ``bits`` mantissa bits after the leading one, truncated toward zero."""
    ulp = torch.pow(2.0, torch.floor(torch.log2(x.abs().clamp_min(1e-300))) - bits)
    return torch.trunc(x / ulp) * ulp


def chain(q, k, start, lo: int, hi: int, bits: int) -> torch.Tensor:
    """Columns ``[lo, hi)`` of Q·Kᵀ summed k-step by k-step from ``start``, less ``start``."""
    acc = start.clone()
    for c in range(lo, hi, K_STEP):
        acc = truncate(acc + torch.einsum("hd,nd->hn", q[:, c:c + K_STEP], k[:, c:c + K_STEP]),
                       bits)
    return acc - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bits", type=int, nargs="+", default=[13, 14])
    ap.add_argument("--rows", type=int, default=512, help="query rows (heads x tokens)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(args.seed)
    fp8 = torch.float8_e4m3fn
    q = (torch.randn(args.rows, D_QK, generator=gen) * 4).to(fp8).double()
    k = (torch.randn(TOPK, D_QK, generator=gen) * 8).to(fp8).double()
    exact = q @ k.T
    scale = LOGIT_STD / float(exact.std())
    pair = 2 * BLOCK_N
    first = (torch.arange(TOPK) < pair).view(1, -1)
    # The running maximum over the pairs before each key's pair (0 in the first pair).
    pair_start = torch.arange(TOPK) // pair * pair
    before = exact.cummax(-1).values[:, (pair_start - 1).clamp_min(0)]
    running = torch.where(first, torch.zeros((), dtype=torch.float64), before)
    zero = torch.zeros_like(exact)

    def lse(s):
        return torch.logsumexp(s * scale, -1)

    reference = lse(exact)
    print(f"{'bits':>4s} {'chain start':38s} {'mean':>8s} {'largest':>8s} {'rel. largest':>12s}")
    for bits in args.bits:
        def two(start):
            return chain(q, k, start, 0, 256, bits) + chain(q, k, start, 256, D_QK, bits)

        offset = chain(q, k, -0.5 * running, 0, D_QK, bits)
        starts = {
            "from zero": chain(q, k, zero, 0, D_QK, bits),
            "offset": offset,
            "offset, first pair split": torch.where(first, two(zero), offset),
            "two chains everywhere": two(zero),
            "offset from the row's true maximum": chain(
                q, k, -0.5 * exact.amax(-1, keepdim=True).expand_as(exact), 0, D_QK, bits),
        }
        for name, s in starts.items():
            err = (lse(s) - reference).abs()
            rel = err / (1 + reference.abs())
            print(f"{bits:4d} {name:38s} {float(err.mean()):8.4f} {float(err.max()):8.4f} "
                  f"{float(rel.max()):12.2e}")


if __name__ == "__main__":
    main()
