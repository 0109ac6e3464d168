"""Drive the op with adversarial index values, for compute-sanitizer (run by .ci/gpu).

    compute-sanitizer --tool memcheck python3 tests/adversarial_mamba_state_scatter.py

Index values: negative, just past each bound, INT32_MAX / INT32_MIN, int64 values past 2**32,
duplicates; int32 and int64 index tensors, with and without src_indices_raw, strided index
views. Every variant of the launch: state entries smaller than one program's block and spanning
several blocks with a partial last one, a scalar state, 1-, 2- and 4-byte elements (different
blocks), more requests than one step of the duplicate-slot scan, no requests, layer counts that
are not a multiple of the layer-loop kernel's group or tile, and a ``dst``
whose slot stride skips entries (a view: the entries it skips must stay untouched). Every call
must leave dst equal to the reference, and the sanitizer must report no out-of-bounds access.
Every call runs with each kernel (``op.PATHS``).
"""

import torch

from strictops.ops import fused_mamba_state_scatter_with_mask
from strictops.ops.mamba import state_scatter as op

I32_MAX, I32_MIN = 2**31 - 1, -(2**31)


def _scatter_and_check(dst, src, slots, steps, rows=None, whole=None) -> None:
    """One call; ``dst`` (and ``whole``, the tensor ``dst`` views, if any) must equal the
    reference afterwards."""
    expected = op.reference(dst, src, slots, steps, rows)
    expected_whole = None
    if whole is not None:
        expected_whole = whole.clone()
        expected_whole[:, ::2] = expected
    fused_mamba_state_scatter_with_mask(dst, src, slots, steps, rows)
    assert torch.equal(dst, expected), (tuple(dst.shape), dst.dtype, slots.dtype)
    assert whole is None or torch.equal(whole, expected_whole)


def _rotations(gen) -> int:
    """Every rotation of a list of bad, duplicate and valid values as slots, steps and rows."""
    layers, cache, spec, draft, state = 3, 6, 5, 4, (3, 40)
    dst = torch.randn(layers, cache, *state, device="cuda", generator=gen)
    src = torch.randn(layers, spec, draft, *state, device="cuda", generator=gen)
    bad = [-1, -7, cache, spec, draft, I32_MAX, I32_MIN]
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
                _scatter_and_check(dst, src, slots, steps, src_rows)
                cases += 1
        strided = torch.tensor(values * 2, device="cuda", dtype=dtype)[::2]
        _scatter_and_check(dst, src, strided, strided.flip(0))
        cases += 1
    return cases


def _random_indices(gen, n: int, cache: int, spec: int, draft: int):
    """Slots, steps and rows of ``n`` requests: mostly valid, with bad values and many
    duplicate slots (so the duplicate-slot scan finds later writers)."""
    def column(upper: int, dtype) -> torch.Tensor:
        values = torch.randint(-2, upper + 2, (n,), device="cuda", generator=gen)
        extremes = torch.tensor([I32_MAX, I32_MIN], device="cuda")
        pick = torch.randint(0, 2, (n,), device="cuda", generator=gen)
        far = torch.rand(n, device="cuda", generator=gen) < 0.05
        return torch.where(far, extremes[pick], values).to(dtype)

    return (column(cache, torch.int32), column(draft, torch.int64), column(spec, torch.int32))


def _variants(gen) -> int:
    cases = 0
    # (state shape, dtype, requests, layers): entries below and above one block (4 KiB) and
    # one persistent work item (32 KiB), a scalar state, 1/2/4-byte elements, more requests
    # than one scan step (128), none at all; 13 and 37 layers: the layer-loop kernel's last
    # group short and its last tile masked.
    for state, dtype, n, layers in [((5, 1000), torch.float32, 40, 2),
                                    ((3, 2000), torch.bfloat16, 40, 2),
                                    ((9, 1000), torch.float32, 70, 13),
                                    ((4097,), torch.int8, 40, 37), ((), torch.float32, 300, 2),
                                    ((7, 9), torch.bfloat16, 300, 13),
                                    ((7, 9), torch.float32, 0, 2)]:
        cache, spec, draft = 9, max(n, 1), 3
        src = torch.randn(layers, spec, draft, *state, device="cuda", generator=gen)
        dst = torch.randn(layers, cache, *state, device="cuda", generator=gen)
        src, dst = src.to(dtype), dst.to(dtype)
        slots, steps, rows = _random_indices(gen, n, cache, spec, draft)
        _scatter_and_check(dst, src, slots, steps, rows)
        _scatter_and_check(dst, src, slots, steps)
        # A view that skips every other cache entry: any layer or slot stride is allowed.
        whole = torch.randn(layers, 2 * cache, *state, device="cuda", generator=gen).to(dtype)
        _scatter_and_check(whole[:, ::2], src, slots, steps, rows, whole=whole)
        cases += 3
    return cases


def main() -> None:
    cases = 0
    for kernel in op.PATHS:
        op.TUNING["kernel"] = kernel
        gen = torch.Generator(device="cuda").manual_seed(0)
        cases += _rotations(gen) + _variants(gen)
    torch.cuda.synchronize()
    print(f"adversarial_mamba_state_scatter: {cases} calls ({', '.join(op.PATHS)} kernels), "
          "all equal to the reference")


if __name__ == "__main__":
    main()
