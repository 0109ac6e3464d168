"""The C++ eager path's plan cache (strictops.ops._runtime.host_path), on CPU.

A plan serves a call only where the call's key equals the planned one's, so the key must be at
least as fine as everything a plan assumes: the contract's cached signature and the cached
launcher's specialisation. These tests change one piece of a planned call at a time and require
a MISS; they check that the gate refuses every mode the dispatcher must see, that launch hooks
and rebound globals refuse plans, and that a plan's per-call ``disjoint`` rows give the
contract's verdict on aliasing views. The launches a plan makes are compared with the Python
path's in tests/test_launcher.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from strictops.meta._contract import (CachedValidation, Check, Contract, disjoint, disjoint_check,
                                      inside_check, inside_storage)

host_plans = pytest.importorskip("strictops.ops._runtime._host_plans",
                                 reason="built without the C++ eager path")
from strictops.ops._runtime import host_path as _host_path  # noqa: E402
from strictops.ops._runtime.host_path import MISS, HostPath  # noqa: E402
from strictops.meta.testing import examples  # noqa: E402


def _spec(pairs=(), result_kind=0, result=(), bump=(), guards=None):
    """A plan without allocations that launches a one-parameter kernel (argument 0's
    address) on a CPU "device" (record mode)."""
    launch = (1234, (1, 1, 1), 128, 0, 1, False, False, (0, bytes(8), bytes(8)))
    return (-1, tuple(r for p in pairs for r in p), (), launch, bump, result_kind, result,
            guards)


def _base():
    x = torch.zeros(4, 8)
    return (x, torch.zeros(8, dtype=torch.int32), None, 3, 0.5, True)


def _variants(args):
    """Calls that each differ from ``args`` in one piece of what a key holds."""
    x, y, *rest = args
    storage = torch.zeros(64)
    yield "dtype", (x.double(), y, *rest)
    yield "shape", (torch.zeros(4, 9), y, *rest)
    yield "rank", (torch.zeros(32), y, *rest)
    yield "stride", (torch.empty_strided((4, 8), (1, 4)), y, *rest)
    yield "storage offset", (storage[16:48].view(4, 8), y, *rest)
    yield "alignment", (storage[1:33].view(4, 8), y, *rest)
    yield "None for a tensor", (x, None, *rest)
    yield "a tensor for None", (x, y, torch.zeros(1), *rest[1:])
    yield "int value", (x, y, None, 4, *rest[2:])
    yield "int for float", (x, y, None, 3, 1, True)
    yield "float value", (x, y, None, 3, 0.25, True)
    yield "bool value", (x, y, None, 3, 0.5, False)
    yield "int for bool", (x, y, None, 3, 0.5, 1)
    yield "one tensor twice", (x, x.view(4, 8), None, 3, 0.5, True)
    yield "subclass", (torch.nn.Parameter(x, requires_grad=False), y, *rest)
    yield "requires grad", (x.clone().requires_grad_(), y, *rest)
    yield "a list", (x, [y], *rest)
    yield "another type", (x, y, None, 3, 0.5, "yes")
    yield "fewer arguments", (x, y, None, 3, 0.5)


def test_per_call_integers_are_not_keyed_and_are_checked_per_call(host_recorder):
    """A cache keyed on its first two arguments: the rest are per-call integers a parameter
    takes (here an int32, an int64 and a 16-byte-aligned address) or a result slice's bounds."""
    cache = host_plans.PlanCache(keyed=2)
    x, y = torch.zeros(64, dtype=torch.uint8), torch.zeros(8, dtype=torch.int32)
    launch = (1234, (1, 1, 1), 128, 0, 1, False, False,
              (0, (2, "i"), (3, "q"), (4, "A"), bytes(8), bytes(8)))
    spec = (-1, (), (), launch, (), 1, ((0, 5, 6),), None)
    assert cache.add((x, y, 1, 2, 16, 8, 4), spec) is True
    view = cache(x, y, -7, 1 << 40, 4096, 8, 4)
    assert view.data_ptr() == x.data_ptr() + 8 and view.shape == (4,)
    params, offsets = host_recorder[-1][8], host_recorder[-1][9]
    assert int.from_bytes(params[offsets[1]:offsets[1] + 4], "little", signed=True) == -7
    assert int.from_bytes(params[offsets[2]:offsets[2] + 8], "little") == 1 << 40
    assert int.from_bytes(params[offsets[3]:offsets[3] + 8], "little") == 4096
    assert cache.known(x, y) is True and cache.known(x, y, "anything") is True
    for bad in ((1 << 31, 2, 16, 8, 4), (1, 2.0, 16, 8, 4), (1, 2, 24, 8, 4), (1, 2, -16, 8, 4),
                (1, 2, 16, 60, 5), (1, 2, 16, -1, 4), (1, 2, 16, 8), (1, 2, 16, 8, 4, 0)):
        assert cache(x, y, *bad) is MISS, bad
    assert cache(x.double(), y, 1, 2, 16, 8, 4) is MISS  # the keyed arguments still are
    with pytest.raises(ValueError, match="names an argument"):  # a per-call index in the key
        cache.add((x, y, 1, 2, 16, 8, 4), (*spec[:6], ((0, 1, 6),), None))


def test_a_call_that_differs_in_one_piece_misses(host_recorder):
    cache = host_plans.PlanCache()
    args = _base()
    assert cache(*args) is MISS and cache.known(*args) is False
    assert cache.add(args, _spec()) is True
    assert cache(*args) is None and len(host_recorder) == 1
    # The same metadata in other tensors: the plan, with their addresses.
    again = (torch.zeros(4, 8), torch.zeros(8, dtype=torch.int32), None, 3, 0.5, True)
    assert cache(*again) is None
    assert int.from_bytes(host_recorder[-1][8][:8], "little") == again[0].data_ptr()
    for what, variant in _variants(args):
        assert cache(*variant) is MISS, what
    assert len(host_recorder) == 2


def test_one_tensor_twice_is_its_own_key(host_recorder):
    cache = host_plans.PlanCache()
    x = torch.zeros(4)
    assert cache.add((x, x), _spec(result_kind=2, result=(0, 1))) is True
    assert cache(x, torch.zeros(4)) is MISS
    assert cache(torch.zeros(4), torch.zeros(4)) is MISS
    y = torch.zeros(4)
    out = cache(y, y)
    assert out[0] is y and out[1] is y


def test_no_key_for_other_argument_kinds():
    cache = host_plans.PlanCache()
    for odd in ([[[torch.zeros(1)]]], ["a"], "a", 2**70, torch.zeros(2).to_sparse(), object(),
                [(torch.zeros(1), object())]):
        assert cache.known(odd) is None and cache.add((odd,), None) is False


def test_lists_of_tensor_pairs_are_keyed_by_their_items(host_recorder):
    """A list (or tuple) argument's key is its type, length and items; plans name its tensors
    by their index among the call's leaves (here [x0, y0, x1, y1, i])."""
    cache = host_plans.PlanCache()
    pairs = [(torch.zeros(4, 8), torch.zeros(8)), (torch.zeros(2, 3), torch.zeros(3))]
    index = torch.zeros(5, dtype=torch.int32)
    launch = (1234, (1, 1, 1), 128, 0, 1, False, False, (2, 4, bytes(8), bytes(8)))
    # leaves 1 and 3 inside their storage, version bumps of 0 and 2, leaf 2 returned
    spec = (-1, (), (), launch, (0, 2), 1, (2,), None, (1, 3))
    assert cache.add((pairs, index), spec) is True
    other = [(torch.ones(4, 8), torch.ones(8)), (torch.ones(2, 3), torch.ones(3))]
    versions = [d._version for d, _ in other]
    assert cache(other, index) is other[1][0]
    assert [d._version for d, _ in other] == [v + 1 for v in versions]
    params, offsets = host_recorder[-1][8], host_recorder[-1][9]
    assert int.from_bytes(params[:8], "little") == other[1][0].data_ptr()
    assert int.from_bytes(params[offsets[1]:offsets[1] + 8], "little") == index.data_ptr()
    x0, y0 = pairs[0]
    for what, variant in (
            ("tuple for list", (tuple(pairs), index)),
            ("list for tuple", ([list(p) for p in pairs], index)),
            ("one pair fewer", (pairs[:1], index)),
            ("an item's shape", ([(torch.zeros(4, 9), y0), pairs[1]], index)),
            ("an item's dtype", ([(x0, y0.double()), pairs[1]], index)),
            ("an item's alignment", ([(x0, torch.zeros(9)[1:]), pairs[1]], index))):
        assert cache(*variant) is MISS, what
    # A view whose storage was shrunk under it: outside its storage, so the Python path.
    short = torch.zeros(8)
    short.untyped_storage().resize_(7 * 4)
    assert cache([(x0, short), pairs[1]], index) is MISS
    assert cache([(x0, torch.zeros(8)), pairs[1]], index) is pairs[1][0]


def test_the_gate_refuses_what_the_dispatcher_must_see(host_recorder):
    cache = host_plans.PlanCache()
    args = _base()
    cache.add(args, _spec())

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passthrough():
        assert cache(*args) is MISS
    with torch.overrides.TorchFunctionMode():
        assert cache(*args) is MISS
    with torch.no_grad():  # grad mode off: an input that requires grad is fine
        grad_args = (args[0].clone().requires_grad_(), *args[1:])
        assert cache.known(*grad_args) is True
    assert cache.known(*grad_args) is None  # grad mode on: no key
    seen = []
    torch.func.vmap(lambda t: seen.append(cache(t[0], *args[1:])) or t)(args[0][None])
    assert seen == [MISS]
    assert cache(*args) is None and len(host_recorder) == 1


def test_launch_hooks_and_knobs_refuse_plans(host_recorder):
    from triton import knobs
    cache = host_plans.PlanCache()
    args = _base()
    cache.add(args, _spec())
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert cache(*args) is MISS
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    debug = knobs.runtime.debug
    knobs.runtime.debug = not debug
    try:
        assert cache(*args) is MISS
    finally:
        knobs.runtime.debug = debug
    assert cache(*args) is None


def test_plan_guards_on_a_setting_that_changes_in_place(host_recorder):
    settings = {"num_warps": 8}
    cache = host_plans.PlanCache()
    args = _base()
    cache.add(args, _spec(guards=((settings, ("num_warps",), 8, True),)))
    assert cache(*args) is None
    settings["num_warps"] = 4
    assert cache(*args) is MISS
    settings["num_warps"] = 8
    assert cache(*args) is None


def test_plan_guards_on_a_rebound_global(host_recorder):
    namespace = {"SCALE": 2}
    cache = host_plans.PlanCache()
    args = _base()
    cache.add(args, _spec(guards=((namespace, ("SCALE",), namespace["SCALE"]),)))
    assert cache(*args) is None
    namespace["SCALE"] = 3
    assert cache(*args) is MISS
    del namespace["SCALE"]
    assert cache(*args) is MISS


def test_version_counters_and_results(host_recorder):
    cache = host_plans.PlanCache()
    args = _base()
    cache.add(args, _spec(result_kind=1, result=(1,), bump=(0,)))
    x = torch.zeros(4, 8)
    version = x._version
    assert cache(x, *args[1:]) is args[1] and x._version == version + 1
    with torch.inference_mode():
        z = torch.zeros(4, 8)
    assert cache(z, *args[1:]) is args[1]  # an inference tensor has no version counter


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 24), st.sampled_from(
    [torch.float32, torch.int16, torch.uint8])), min_size=2, max_size=2),
    st.booleans())
def test_disjoint_rows_give_the_contract_verdict(views, shared):
    """Two views (offset, length, dtype) of one storage or of two: the plan serves the call
    exactly when the contract's ``disjoint`` row holds."""
    _host_path.configure(recorder=lambda *launch: None)
    try:
        storages = [torch.zeros(256, dtype=torch.uint8) for _ in range(2)]
        tensors = []
        for i, (offset, length, dtype) in enumerate(views):
            base = storages[0 if shared else i]
            size = torch.empty(0, dtype=dtype).element_size()
            start = offset - offset % size
            tensors.append(base[start:start + length * size].view(dtype))
        row = disjoint_check("apart", (("a", "b"),), lambda **_: "a and b overlap")
        cache = host_plans.PlanCache()
        cache.add(tuple(tensors), _spec(pairs=((0, 1),)))
        served = cache(*tensors) is not MISS
        assert served == bool(row.ok(type("A", (), {"a": tensors[0], "b": tensors[1]})))
        assert served == bool(disjoint(*tensors))
    finally:
        _host_path.configure()


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=3), st.data())
def test_inside_rows_give_the_contract_verdict(sizes, data):
    """A view of random sizes (empty ones too), strides and offset whose storage may be shrunk
    under it: the plan serves the call exactly when the contract's ``inside`` row holds."""
    _host_path.configure(recorder=lambda *launch: None)
    try:
        strides = [data.draw(st.integers(0, 6)) for _ in sizes]
        offset = data.draw(st.integers(0, 5))
        reach = offset + sum(max(n - 1, 0) * s for n, s in zip(sizes, strides))
        storage = torch.zeros(reach + 1 + data.draw(st.integers(0, 2)))
        view = storage.as_strided(sizes, strides, offset)
        row = inside_check("inside", lambda a: (a.x,), lambda **_: "outside its storage")
        cache = host_plans.PlanCache()
        cache.add((view,), (*_spec(), (0,)))
        storage.untyped_storage().resize_(4 * data.draw(st.integers(0, storage.numel())))
        served = cache(view) is not MISS
        assert served == bool(row.ok(type("A", (), {"x": view})))
        assert served == bool(inside_storage(view))
    finally:
        _host_path.configure()


def test_no_plan_for_a_signature_with_other_per_call_rows():
    """A signature whose per-call rows include one that reads values gets an entry of None:
    its calls stay on the Python path, which runs that row."""
    values = Check("values", lambda a: True, lambda **_: "", reads_values=True)
    apart = disjoint_check("apart", (("a", "b"),), lambda **_: "overlap")
    validation = CachedValidation(Contract("strictops::stand_in", "stand_in", (apart, values)),
                                  ("a", "b"))
    host = HostPath(validation)
    args = (torch.zeros(4), torch.zeros(4))
    validation(*args)
    host.register(args, launcher=None, grid=(1,), kernel_args=(), options=(), device=-1)
    assert host.cache.known(*args) is True and host.call(*args) is MISS


def test_disjoint_check_needs_only_with_to_cover_every_pair():
    with pytest.raises(TypeError, match="misses a pair"):
        disjoint_check("apart", (("a", "b"), ("c", "d")), lambda **_: "", only_with=("a",))


# On a GPU: the plans' results are the Python path's, bit for bit; a planned signature still
# gets the contract's error for a call that breaks a rule; a planned call captures and replays
# in a CUDA graph.

from strictops.meta.testing import gpu  # noqa: E402


def _sparse_args(seed=1, **changes):
    from strictops.meta.sparse_mla import prefill as smp
    from strictops.ops.sparse_mla import prefill as sparse
    dims = smp.Dims(s_q=5, s_kv=700, h_q=128, d_qk=576, topk=256, device="cuda")
    args = sparse.random_inputs(dims, torch.Generator(device="cuda").manual_seed(seed))
    for name in (*smp.BUFFERS, "topk_length_errors", "topk_length", "attn_sink"):
        args.pop(name, None)
    args.update(changes)
    return args


@gpu
@pytest.mark.parametrize("with_out", [False, True])
def test_gpu_sparse_mla_plan_equals_python_path(with_out):
    from strictops.meta.sparse_mla import prefill as smp
    from strictops.ops.sparse_mla import prefill as sparse
    args = _sparse_args()
    if with_out:
        args["out"] = torch.empty(5, 128, 512, dtype=torch.bfloat16, device="cuda")
    through = torch.ops.strictops.sparse_mla_q8kv8_prefill_fwd(
        *(args.get(n) for n in smp.ARGUMENTS))
    before = len(sparse._HOST.cache)
    first = [t.clone() for t in sparse.sparse_mla_q8kv8_prefill_fwd(**args)]  # Python path
    assert len(sparse._HOST.cache) == before + 1
    planned = sparse.sparse_mla_q8kv8_prefill_fwd(**args)
    assert sparse._HOST.call(*(args.get(n) for n in smp.ARGUMENTS)) is not MISS
    for a, b in zip(first, planned):
        assert torch.equal(a, b)
    if with_out:  # the dispatcher returns the outputs it allocated
        assert planned[0] is args["out"] and torch.equal(first[1], through[0])
    else:
        assert torch.equal(first[0], through[0])


@gpu
def test_gpu_planned_signature_still_raises():
    from strictops.ops.sparse_mla import prefill as sparse
    args = _sparse_args()
    sparse.sparse_mla_q8kv8_prefill_fwd(**args)
    sparse.sparse_mla_q8kv8_prefill_fwd(**args)
    bad = dict(args, out=torch.empty(5, 128, 512, dtype=torch.float16, device="cuda"))
    with pytest.raises(ValueError, match="out"):
        sparse.sparse_mla_q8kv8_prefill_fwd(**bad)
    shared = torch.empty(2 * 5 * 128, dtype=torch.float32, device="cuda")
    alias = dict(args, max_logits=shared[:640].view(5, 128), lse=shared[320:960].view(5, 128))
    for _ in range(2):  # the signature of two overlapping views: the contract's error each time
        with pytest.raises(ValueError, match="must not alias"):
            sparse.sparse_mla_q8kv8_prefill_fwd(**alias)
    apart = dict(args, max_logits=shared[:640].view(5, 128), lse=shared[640:].view(5, 128))
    sparse.sparse_mla_q8kv8_prefill_fwd(**apart)
    sparse.sparse_mla_q8kv8_prefill_fwd(**apart)  # planned: its disjoint row runs per call
    overlapping = dict(apart, lse=shared[320:960].view(5, 128))
    assert overlapping["lse"].storage_offset() != apart["lse"].storage_offset()
    with pytest.raises(ValueError, match="must not alias"):
        sparse.sparse_mla_q8kv8_prefill_fwd(**overlapping)


@gpu
def test_gpu_mamba_scatter_plan_equals_reference():
    from strictops.ops.mamba import state_scatter as mss
    g = torch.Generator(device="cuda").manual_seed(3)
    dst = torch.randn(3, 9, 4, 32, device="cuda", generator=g)
    src = torch.randn(3, 6, 4, 4, 32, device="cuda", generator=g)
    for seed in range(3):  # the Python path, then the plan, twice
        slots = torch.randint(-2, 11, (6,), device="cuda", dtype=torch.int32, generator=g)
        steps = torch.randint(-1, 5, (6,), device="cuda", dtype=torch.int64, generator=g)
        expected = mss.reference(dst, src, slots, steps)
        mss.fused_mamba_state_scatter_with_mask(dst, src, slots, steps)
        assert torch.equal(dst, expected)
    default = mss.TUNING["kernel"]
    assert mss._HOSTS[default](dst, src, slots, steps, None) is not MISS
    other = next(name for name in mss.PATHS if name != default)
    with mss.kernel_variant(other):  # another kernel chosen: the default's plan stands aside
        assert mss._HOSTS[default](dst, src, slots, steps, None) is MISS
        for _ in range(2):  # the other kernel's Python path, then its own plan
            mss.fused_mamba_state_scatter_with_mask(dst, src, slots, steps)
        assert mss._HOSTS[other](dst, src, slots, steps, None) is not MISS
    assert torch.equal(dst, expected)


@gpu
def test_gpu_planned_call_captures_in_a_cuda_graph():
    from strictops.ops.sparse_mla import prefill as sparse
    args = _sparse_args()
    expected = [t.clone() for t in sparse.sparse_mla_q8kv8_prefill_fwd(**args)]
    sparse.sparse_mla_q8kv8_prefill_fwd(**args)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = sparse.sparse_mla_q8kv8_prefill_fwd(**args)
    torch.cuda.current_stream().wait_stream(stream)
    for t in captured:
        t.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(expected, captured):
        assert torch.equal(a, b)


@gpu
@pytest.mark.parametrize("track", [False, True])
def test_gpu_commit_indices_plan_equals_reference(track):
    from strictops.ops.mamba import commit_indices as mci
    for seed in range(3):  # the Python path, then the plan, twice
        args = mci.example_inputs("cuda", False, torch.Generator().manual_seed(seed))
        if not track:
            args["seq_lens"] = None
        expected = mci.reference(**args)
        got = mci.fused_commit_track_indices(**args)
        assert torch.equal(got[0], expected[0])
        assert (got[1] is None) if not track else torch.equal(got[1], expected[1])
    assert mci._HOST_CALL(*args.values()) is not MISS
