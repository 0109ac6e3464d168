"""Drive track_mamba_states_all_layers with adversarial index values, for compute-sanitizer
(run by .ci/gpu).

    compute-sanitizer --tool memcheck python3 tests/adversarial_mamba_track_states.py

Slot values: negative, just past the pool, INT32_MAX / INT32_MIN, int64 values past 2**32,
duplicate track slots; int32 and int64 index tensors, bool and integer masks (with values that
are not 0/1), strided index views, a batch size below the index tensors' length. Launch
variants: entries smaller than one chunk, spanning several chunks with a partial last one, a
scalar entry, 1-, 2- and 4-byte elements, batches over one 64-row scan block, no rows, and
pools whose slot stride skips entries (views: the skipped entries must stay untouched). Every
call must leave both pools equal to the reference, and the sanitizer must report no
out-of-bounds access.
"""

import torch

from strictops.ops.mamba import track_states as op
from strictops.ops import track_mamba_states_all_layers, track_mamba_states_if_needed

I32_MAX, I32_MIN = 2**31 - 1, -(2**31)


def _track_and_check(conv, ssm, src, mask, dst, batch_size, wholes=None) -> None:
    want = op.reference(conv, ssm, src, mask, dst, batch_size)
    want_whole = None
    if wholes is not None:
        want_whole = [w.clone() for w in wholes]
        want_whole[0][:, ::2], want_whole[1][:, ::2] = want
    track_mamba_states_all_layers(conv, ssm, src, mask, dst, batch_size)
    assert torch.equal(conv, want[0]) and torch.equal(ssm, want[1]), (conv.shape, ssm.shape)
    assert wholes is None or all(torch.equal(w, e) for w, e in zip(wholes, want_whole))


def _rotations(gen) -> int:
    layers, pool = 3, 12
    conv = torch.randn(layers, pool, 5, 3, device="cuda", generator=gen).to(torch.bfloat16)
    ssm = torch.randn(layers, pool, 2, 3, 40, device="cuda", generator=gen)
    bad = [-1, -7, pool, pool + 5, I32_MAX, I32_MIN]
    cases = 0
    for dtype in (torch.int32, torch.int64):
        extra = [2**40, -(2**40)] if dtype == torch.int64 else []
        sources = bad + extra + [0, 1, 2, 3, 4, 5]
        targets = bad[::-1] + extra + [6, 7, 8, 9, 9, 11]  # apart from the sources
        n = len(sources)
        for shift in range(n):
            src = torch.tensor(sources[shift:] + sources[:shift], device="cuda", dtype=dtype)
            dst = torch.tensor(targets, device="cuda", dtype=dtype)
            for mask in (torch.ones(n, dtype=torch.bool, device="cuda"),
                         torch.arange(n, device="cuda") % 3 - 1):  # -1, 0, 1: int64 mask
                _track_and_check(conv, ssm, src, mask, dst, n - shift % 3)
                cases += 1
        strided_src = torch.tensor(sources * 2, device="cuda", dtype=dtype)[::2]
        strided_dst = torch.tensor(targets * 2, device="cuda", dtype=dtype)[::2]
        _track_and_check(conv, ssm, strided_src, torch.ones(n, dtype=torch.int32, device="cuda"),
                         strided_dst, n)
        cases += 1
    return cases


def _column(gen, n, lo, hi, dtype):
    """``n`` slots drawn from ``[lo, hi)``, about 5% of them replaced by INT32_MAX/MIN."""
    values = torch.randint(lo, hi, (n,), device="cuda", generator=gen)
    extremes = torch.tensor([I32_MAX, I32_MIN], device="cuda")
    pick = torch.randint(0, 2, (n,), device="cuda", generator=gen)
    far = torch.rand(n, device="cuda", generator=gen) < 0.05
    return torch.where(far, extremes[pick], values).to(dtype)


def _variants(gen) -> int:
    cases = 0
    # (conv entry, conv dtype, ssm entry, ssm dtype, rows): entries below one chunk and over
    # several with a partial last one, a scalar entry, 1/2/4-byte elements, batches over one
    # scan block, no rows.
    for conv_e, conv_t, ssm_e, ssm_t, n in [
            ((64, 3), torch.bfloat16, (8, 33, 40), torch.float32, 40),
            ((2048, 3), torch.bfloat16, (3, 9000), torch.float16, 70),
            ((), torch.float32, (17,), torch.int8, 150),
            ((4097,), torch.int8, (), torch.float32, 65),
            ((7, 9), torch.bfloat16, (7, 9), torch.float32, 0)]:
        layers, pool = 2, max(2 * n, 4)
        conv = torch.randn(layers, pool, *conv_e, device="cuda", generator=gen).to(conv_t)
        ssm = torch.randn(layers, pool, *ssm_e, device="cuda", generator=gen).to(ssm_t)
        # Cache slots below pool // 2 (some negative), track slots above (some past the pool).
        src = _column(gen, n, -2, pool // 2, torch.int32)
        dst = _column(gen, n, pool // 2, pool + 2, torch.int64)
        mask = torch.rand(n, device="cuda", generator=gen) < 0.5
        _track_and_check(conv, ssm, src, mask, dst, n)
        _track_and_check(conv, ssm, src, mask, dst, n // 2)
        # Pool views that skip every other slot: any layer or slot stride is allowed.
        wholes = [torch.randn(layers, 2 * pool, *t.shape[2:], device="cuda",
                              generator=gen).to(t.dtype) for t in (conv, ssm)]
        _track_and_check(wholes[0][:, ::2], wholes[1][:, ::2], src, mask, dst, n, wholes)
        cases += 3
        if n:
            want = op.reference(conv[:1], ssm[:1], src, mask, dst, n)
            track_mamba_states_if_needed(conv[0], ssm[0], src, mask, dst, n)
            assert torch.equal(conv[:1], want[0]) and torch.equal(ssm[:1], want[1])
            cases += 1
    return cases


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = _rotations(gen) + _variants(gen)
    torch.cuda.synchronize()
    print(f"adversarial_mamba_track_states: {cases} calls, all equal to the reference")


if __name__ == "__main__":
    main()
