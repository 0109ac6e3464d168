"""Drive both conv-window ops with adversarial index values, for compute-sanitizer (run by
.ci/gpu for every tests/adversarial_*.py).

    compute-sanitizer --tool memcheck python3 tests/adversarial_conv_window_scatter.py

Index values: negative, just past each bound, INT32_MAX / INT32_MIN, int64 values past 2**32
(which sglang's original casts to int32 and wraps into range), duplicates within a set and
across the two sets; int32 and int64 index tensors, with and without src_indices_raw, strided
index views. Windows: overlapping views of a shared buffer whose every element past the view's
reach is a sentinel that must stay unread and unwritten (the buffer is the view's whole
storage, so a read past it is a sanitizer error), entries below and above one program's run
with a partial last run, K-1 of 1, 3 and 6 (runs starting and ending inside a window row),
1-, 2- and 4-byte elements, more requests than one step of the duplicate-slot scan, no
requests, a ``dst`` whose slot stride skips entries, and the multi-pair op with eight pairs of
mixed shapes. The kernel's other tunings (layers per program, load layouts, the int64 path)
run on the bf16 conv shape. Every call must leave every ``dst`` equal to the reference. Each
part prints when it is done, so that a run cut short by a time limit still shows how far it
got without a sanitizer error.
"""

import torch

from strictops.ops.mamba import conv_window_scatter as one
from strictops.ops.mamba import conv_window_scatter_multi as multi
from strictops.ops import fused_conv_window_scatter_multi, fused_conv_window_scatter_with_mask

I32_MAX, I32_MIN = 2**31 - 1, -(2**31)


def _window(gen, L, spec, draft, dim, km1, dtype):
    """An overlapping window view whose storage is exactly the shared buffer."""
    shared = torch.randn(L, spec, dim, draft + km1 - 1, device="cuda", generator=gen)
    return one.window_view(shared.to(dtype), draft, km1)


def _cpu(*tensors):
    # The references run on CPU copies: on the GPU their many small kernels, each one
    # instrumented, would take most of a sanitizer run's time.
    return [None if t is None else t.cpu() for t in tensors]


def _one_call(dst, src, slots, steps, rows=None, whole=None, tuning=None) -> None:
    expected = one.reference(*_cpu(dst, src, slots, steps, rows))
    expected_whole = None
    if whole is not None:
        expected_whole = whole.cpu()
        expected_whole[:, ::2] = expected
    src_before = bytes(src.untyped_storage().cpu())
    if tuning is None:
        fused_conv_window_scatter_with_mask(dst, src, slots, steps, rows)
    else:  # the kernel itself, on metadata the contract accepts
        one._launch(one._scatter_kernel, dst, src, slots, steps, rows, **tuning)
    assert torch.equal(dst.cpu(), expected), (tuple(dst.shape), dst.dtype, slots.dtype)
    assert whole is None or torch.equal(whole.cpu(), expected_whole)
    assert bytes(src.untyped_storage().cpu()) == src_before


def _rotations(gen) -> int:
    """Every rotation of a list of bad, duplicate and valid values as slots, steps and rows."""
    L, cache, spec, draft, dim, km1 = 3, 6, 5, 4, 40, 3
    dst = torch.randn(L, cache, dim, km1, device="cuda", generator=gen)
    src = _window(gen, L, spec, draft, dim, km1, torch.float32)
    bad = [-1, -7, cache, spec, draft, I32_MAX, I32_MIN]
    cases = 0
    for dtype in (torch.int32, torch.int64):
        extra = [2**32 + 1, -(2**40)] if dtype == torch.int64 else []
        values = bad + extra + [0, 1, 2, 3, 3, 3]
        for shift in range(len(values)):
            slots = torch.tensor(values[shift:] + values[:shift], device="cuda", dtype=dtype)
            steps = torch.tensor(values[::-1], device="cuda", dtype=dtype)
            rows = torch.tensor(values, device="cuda", dtype=dtype).roll(shift + 1)
            for src_rows in (None, rows):
                _one_call(dst, src, slots, steps, src_rows)
                cases += 1
            sets = [slots, steps, rows.flip(0), steps.roll(shift)]
            _multi_call([(dst, src)], sets)
            cases += 1
        strided = torch.tensor(values * 2, device="cuda", dtype=dtype)[::2]
        _one_call(dst, src, strided, strided.flip(0))
        cases += 1
    return cases


def _random_indices(gen, n: int, cache: int, spec: int, draft: int):
    def column(upper: int, dtype) -> torch.Tensor:
        values = torch.randint(-2, upper + 2, (n,), device="cuda", generator=gen)
        extremes = torch.tensor([I32_MAX, I32_MIN], device="cuda")
        pick = torch.randint(0, 2, (n,), device="cuda", generator=gen)
        far = torch.rand(n, device="cuda", generator=gen) < 0.05
        return torch.where(far, extremes[pick], values).to(dtype)

    return (column(cache, torch.int32), column(draft, torch.int64), column(spec, torch.int32))


def _variants(gen) -> int:
    cases = 0
    # (dim, K-1, dtype, requests): below and above one tile, K-1 of 1, 3, 6, 1/2/4-byte
    # elements, more requests than one scan step (128), none at all.
    for dim, km1, dtype, n in [(1000, 3, torch.bfloat16, 40), (2048, 3, torch.bfloat16, 40),
                               (333, 6, torch.float32, 40), (4097, 1, torch.int8, 40),
                               (7, 3, torch.float16, 300), (9, 3, torch.bfloat16, 0)]:
        L, cache, spec, draft = 2, 9, max(n, 1), 3
        src = _window(gen, L, spec, draft, dim, km1, dtype)
        dst = torch.randn(L, cache, dim, km1, device="cuda", generator=gen).to(dtype)
        slots, steps, rows = _random_indices(gen, n, cache, spec, draft)
        _one_call(dst, src, slots, steps, rows)
        _one_call(dst, src, slots, steps)
        whole = torch.randn(L, 2 * cache, dim, km1, device="cuda", generator=gen).to(dtype)
        _one_call(whole[:, ::2], src, slots, steps, rows, whole=whole)
        _multi_call([(dst, src), (whole[:, ::2], src)], [slots, steps, rows.long(), steps.int()])
        cases += 4
    return cases


# Tunings other than the default (ops/mamba/conv_window_scatter.py TUNING): one layer a program,
# 8-byte runs streaming, 4-byte runs, the shared-memory exchange, 4 KiB runs of four layers by
# 8 warps, the int64 path.
TUNINGS = [{"layers": 1}, {"run_bytes": 8, "stream": True}, {"run_bytes": 4}, {"run_bytes": 0},
           {"block_bytes": 4096, "layers": 4, "num_warps": 8}, {"i32_reach": 0}]


def _tunings(gen) -> int:
    cases = 0
    for dim, km1, dtype, n in [(2048, 3, torch.bfloat16, 40)]:
        L, cache, spec, draft = 3, 9, n, 3
        src = _window(gen, L, spec, draft, dim, km1, dtype)
        whole = torch.randn(L, 2 * cache, dim, km1, device="cuda", generator=gen).to(dtype)
        slots, steps, rows = _random_indices(gen, n, cache, spec, draft)
        for tuning in TUNINGS:
            _one_call(whole[:, ::2], src, slots, steps, rows, whole=whole, tuning=tuning)
            cases += 1
    return cases


def _multi_call(pairs, sets) -> None:
    expected = multi.reference([_cpu(*pair) for pair in pairs], *_cpu(*sets))
    fused_conv_window_scatter_multi(pairs, *sets)
    for (got, _), want in zip(pairs, expected):
        assert torch.equal(got.cpu(), want), (tuple(got.shape), got.dtype)


def _eight_pairs(gen) -> int:
    L, cache, spec, draft, n = 2, 11, 70, 4, 70
    dtypes = (torch.bfloat16, torch.float32, torch.int8, torch.float16)
    pairs = []
    for k in range(multi.contract.MAX_PAIRS):
        dim, km1, dtype = 5 + 300 * k, 1 + k % 5, dtypes[k % 4]
        dst = torch.randn(L, cache, dim, km1, device="cuda", generator=gen).to(dtype)
        pairs.append((dst, _window(gen, L, spec, draft, dim, km1, dtype)))
    slots, steps, _ = _random_indices(gen, n, cache, spec, draft)
    slots2, steps2, _ = _random_indices(gen, n + 3, cache, spec, draft)
    _multi_call(pairs, [slots, steps, slots2, steps2])
    _multi_call(pairs, [slots, steps])
    return 2


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = 0
    for part in (_rotations, _tunings, _variants, _eight_pairs):
        cases += part(gen)
        torch.cuda.synchronize()
        print(f"adversarial_conv_window_scatter: {part.__name__[1:]} done, {cases} calls so far",
              flush=True)
    print(f"adversarial_conv_window_scatter: {cases} calls, all equal to the reference")


if __name__ == "__main__":
    main()
