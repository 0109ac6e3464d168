"""Drive fused_commit_track_indices with adversarial lengths and rows, for compute-sanitizer
(run by .ci/gpu).

    compute-sanitizer --tool memcheck python3 tests/adversarial_mamba_commit_indices.py

Accept lengths 0, negative, past the row, INT32/INT64 extremes; sequence lengths negative and
extreme; accepted rows holding any value; int32 and int64 tensors, strided views, no accepted
columns, batches of 0, 1, 127, 128, 129 and 1000 requests (one and several programs). Every
call must equal the reference, and the sanitizer must report no out-of-bounds access.
"""

import torch

from strictops.ops import fused_commit_track_indices
from strictops.ops.mamba import commit_indices as op

EXTREMES = [-1, 0, -(2**31), 2**31 - 1, -(2**63), 2**63 - 1]


def _check(*args) -> None:
    got, want = fused_commit_track_indices(*args), op.reference(*args)
    assert all((g is None and w is None) or torch.equal(g, w) for g, w in zip(got, want)), args


def _column(gen, n, lo, hi, dtype):
    values = torch.randint(lo, hi, (n,), device="cuda", generator=gen)
    info = torch.iinfo(dtype)
    extremes = torch.tensor([max(min(v, info.max), info.min) for v in EXTREMES], device="cuda")
    far = torch.rand(n, device="cuda", generator=gen) < 0.1
    pick = torch.randint(0, len(EXTREMES), (n,), device="cuda", generator=gen)
    return torch.where(far, extremes[pick], values).to(dtype)


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = 0
    for batch in (0, 1, 127, 128, 129, 1000):
        for cols in (0, 1, 4):
            for dtype in (torch.int32, torch.int64):
                dtn, interval = 4, 3
                index = _column(gen, batch * cols, -1, batch * dtn, dtype).reshape(batch, cols)
                lens = _column(gen, batch, -1, cols + 2, dtype)
                seq = _column(gen, batch, -1, 50, dtype)
                for seq_lens in (None, seq):
                    _check(index, lens, seq_lens, dtn, interval)
                    cases += 1
                wide = torch.zeros(batch, 2 * cols, dtype=dtype, device="cuda")
                wide[:, ::2] = index
                _check(wide[:, ::2], lens.repeat_interleave(2)[::2], seq, dtn, 1)
                cases += 1
    torch.cuda.synchronize()
    print(f"adversarial_mamba_commit_indices: {cases} calls, all equal to the reference")


if __name__ == "__main__":
    main()
