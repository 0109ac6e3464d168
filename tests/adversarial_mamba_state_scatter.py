"""Drive the op with adversarial index values, for compute-sanitizer (run by .ci/gpu).

    compute-sanitizer --tool memcheck python3 tests/adversarial_mamba_state_scatter.py

Index values: negative, just past each bound, INT32_MAX / INT32_MIN, int64 values past 2**32,
duplicates; int32 and int64 index tensors, with and without src_indices_raw, strided index
views. Every call must leave dst equal to the reference, and the sanitizer must report no
out-of-bounds access.
"""

import torch

from strictops.ops import fused_mamba_state_scatter_with_mask
from strictops.ops import mamba_state_scatter as op


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    layers, cache, spec, draft, state = 3, 6, 5, 4, (3, 40)
    dst = torch.randn(layers, cache, *state, device="cuda", generator=gen)
    src = torch.randn(layers, spec, draft, *state, device="cuda", generator=gen)
    i32_max, i32_min = 2**31 - 1, -(2**31)
    bad = [-1, -7, cache, spec, draft, i32_max, i32_min]
    cases = 0
    for dtype in (torch.int32, torch.int64):
        extra = [2**40, -(2**40)] if dtype == torch.int64 else []
        values = bad + extra + [0, 1, 2, 3, 3, 3]
        n = len(values)
        for shift in range(n):
            slots = torch.tensor(values[shift:] + values[:shift], device="cuda", dtype=dtype)
            steps = torch.tensor(values[::-1], device="cuda", dtype=dtype)
            rows = torch.tensor(values, device="cuda", dtype=dtype).roll(shift + 1)
            for src_rows in (None, rows):
                expected = op.reference(dst, src, slots, steps, src_rows)
                fused_mamba_state_scatter_with_mask(dst, src, slots, steps, src_rows)
                assert torch.equal(dst, expected), (dtype, shift, src_rows is not None)
                cases += 1
        strided = torch.tensor(values * 2, device="cuda", dtype=dtype)[::2]
        expected = op.reference(dst, src, strided, strided.flip(0))
        fused_mamba_state_scatter_with_mask(dst, src, strided, strided.flip(0))
        assert torch.equal(dst, expected)
        cases += 1
    torch.cuda.synchronize()
    print(f"adversarial_mamba_state_scatter: {cases} calls, all equal to the reference")


if __name__ == "__main__":
    main()
