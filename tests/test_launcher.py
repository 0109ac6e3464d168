"""The cached launcher (strictops.ops._runtime.launcher) against Triton's own launch path, on CPU.

Two checks: its specialisation key is at least as fine as ``JITFunction``'s own specialisation
(two calls with one key never differ in Triton's), over many random argument sets; and, under
a recording stand-in for the CUDA driver (the kernels are really compiled for sm_90), a cached
launch passes the C launcher exactly what ``JITFunction.run`` passes, and a call of another
specialisation compiles its own kernel; likewise each op's eager launch (the Gluon sparse MLA
kernel, the mamba scatter, the transport publish) against its ``kernel[grid]`` launch, and
sparse MLA's eager path launches into exactly the outputs it returns.
"""

from __future__ import annotations

import inspect
import random
import struct
from types import SimpleNamespace
from typing import NamedTuple

import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import CudaLauncher
from triton.compiler import make_backend
from triton.runtime.driver import driver
from triton.runtime.jit import create_function_from_signature

from strictops.meta.testing import gpu
from strictops.ops._runtime.launcher import Launcher, Pointer, keyword_constexprs


@triton.jit(do_not_specialize=["n_plain"], do_not_specialize_on_alignment=["n_unaligned"])
def _probe_kernel(x_ptr, y_ptr, z_ptr, n, n_plain, n_unaligned, scale, flag, BLOCK: tl.constexpr,
                  HAS_Z: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if HAS_Z:
        x += tl.load(z_ptr + offs, mask=mask)
    if flag:
        x = x * scale
    tl.store(y_ptr + offs, x + n_plain + n_unaligned, mask=mask)


TARGET = GPUTarget("cuda", 90, 32)
BOUNDARY_INTS = [0, 1, 2, 15, 16, 17, 32, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16,
                 -(2**31), -(2**31) - 1, -(2**31) - 16, 2**63 - 1, 2**63, 2**63 + 16,
                 -(2**63), 2**64 - 16, 2**64 - 1]
# Values Triton refuses to specialise (OverflowError): their key differs from every other.
REFUSED_INTS = [-(2**63) - 16, -(2**63) - 1, 2**64, 2**64 + 16]


def _binder(fn):
    return create_function_from_signature(fn.signature, fn.params, make_backend(TARGET))


def _random_args(rng: random.Random, storage: torch.Tensor):
    def pointer():
        dtype = rng.choice([torch.float32, torch.float16, torch.int32, torch.uint8])
        offset = rng.choice([0, 0, 1, 2, 4, 8, 16, 3])  # bytes
        if rng.random() < 0.25:  # an address typed as dtype, without a view
            return Pointer(storage.data_ptr() + offset, dtype)
        return storage[offset:offset + 64].view(dtype) if offset % 4 == 0 or dtype == \
            torch.uint8 else storage[offset:offset + 64]

    def integer():
        return rng.choice(BOUNDARY_INTS + [rng.randrange(-2**40, 2**40) * rng.choice([1, 16])])

    return [pointer(), pointer(), rng.choice([None, pointer()]), integer(), integer(), integer(),
            rng.choice([0.5, 2.0]), rng.choice([True, False]), rng.choice([16, 32]),
            rng.choice([True, False])]


def _int_key(value: int):
    """The key of an int argument (``n`` of the probe kernel)."""
    launcher = Launcher(_probe_kernel)
    return launcher.arguments([None, None, None, value, 5, 7, 0.5, True, 16, False])[0][10:12]


def test_int_key_matches_triton_boundaries():
    """Every boundary of Triton's int specialisation (1, multiples of 16, the int32 / int64 /
    uint64 ranges) changes the key."""
    from triton._C.libtriton import native_specialize_impl
    backend = type(make_backend(TARGET))
    seen = {}
    for value in BOUNDARY_INTS:
        triton_spec = native_specialize_impl(backend, value, False, True, True)
        seen.setdefault(_int_key(value), set()).add(triton_spec)
    assert all(len(specs) == 1 for specs in seen.values()), seen
    for value in REFUSED_INTS:
        with pytest.raises(OverflowError):
            native_specialize_impl(backend, value, False, True, True)
        assert _int_key(value) not in seen


def test_key_is_at_least_as_fine_as_triton_specialisation():
    rng = random.Random(0)
    storage = torch.zeros(256, dtype=torch.uint8)
    binder = _binder(_probe_kernel)
    launcher = Launcher(_probe_kernel)
    triton_of_key = {}
    keys = set()
    for _ in range(3000):
        args = _random_args(rng, storage)
        key, values = launcher.arguments(args)
        assert key is not None
        _, specialization, _ = binder(*args)
        triton_of_key.setdefault(key, set()).add(str(specialization))
        keys.add(key)
        # The values passed: pointers as their addresses, everything else as given.
        assert values == tuple(a.data_ptr() if isinstance(a, (torch.Tensor, Pointer)) else a
                               for a in args)
    assert all(len(specs) == 1 for specs in triton_of_key.values())
    assert len(keys) > 200  # the draws do cover many specialisations


def test_unsupported_arguments_have_no_key():
    launcher = Launcher(_probe_kernel)
    storage = torch.zeros(64)
    args = _random_args(random.Random(1), storage.view(torch.uint8))
    for odd in (torch.nn.Parameter(storage), (1, 2), 1 + 2j, torch.float32):
        assert launcher.arguments([odd, *args[1:]]) == (None, None)


# Whether this Triton's CudaLauncher calls one generic C ``launch`` (Triton 3.7 on: the
# signature as data, the arguments as a tuple) rather than a C launcher compiled per signature.
_GENERIC_LAUNCHER = "kernel_metadata" in inspect.signature(CudaLauncher.__call__).parameters


class _RecordingLauncher(CudaLauncher):
    """CudaLauncher (its real ``__call__``) whose C ``launch`` records its arguments."""

    calls: list = []

    def __init__(self, src, metadata) -> None:
        if _GENERIC_LAUNCHER:  # the real constructor, over the recording driver's utils
            super().__init__(src, metadata)
            return
        self.num_ctas = getattr(metadata, "num_ctas", 1)
        self.global_scratch_size = metadata.global_scratch_size
        self.global_scratch_align = metadata.global_scratch_align
        self.profile_scratch_size = metadata.profile_scratch_size
        self.profile_scratch_align = metadata.profile_scratch_align
        self.launch_cooperative_grid = metadata.launch_cooperative_grid
        self.launch_pdl = metadata.launch_pdl
        self.launch = _record


def _record(*args) -> None:
    _RecordingLauncher.calls.append(args)


class Launched(NamedTuple):
    """A recorded C launch, by field, whatever this Triton's layout."""

    grid: tuple
    stream: int
    function: int
    cooperative: bool
    pdl: bool
    metadata: tuple
    hooks: tuple  # launch metadata, enter hook, exit hook
    scratch: tuple
    args: tuple


def _launched(call) -> Launched:
    if _GENERIC_LAUNCHER:
        return Launched(call[:3], call[3], call[4], call[5], call[6], call[7], call[8:11],
                        call[11:13], tuple(call[15]))
    return Launched(call[:3], call[3], call[4], call[5], call[6], call[9], call[10:13],
                    call[7:9], call[13:])


class _RecordingDriver:
    launcher_cls = _RecordingLauncher

    def __init__(self) -> None:
        self.handles = iter(range(1000, 2000))
        self.utils = SimpleNamespace(
            load_binary=lambda name, kernel, shared, device: ("module", next(self.handles), 32,
                                                              0, 1024),
            get_device_properties=lambda device: {"max_shared_mem": 232448},
            unload_module=lambda module: None,
            # The generic launcher's C helpers: the packed signature as a tuple, the launch
            # recorded.
            build_signature_metadata=tuple, launch=_record)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 77

    def get_current_target(self):
        return TARGET

    def get_active_torch_device(self):
        return torch.device("cpu")


@pytest.fixture
def recording_driver(monkeypatch):
    fake, previous = _RecordingDriver(), driver._active
    if _GENERIC_LAUNCHER:
        # What the generic launcher's constructor takes from the compiled cuda_utils module
        # (which needs libcuda): its argument annotations, as plain values.
        from triton.backends.nvidia import driver as nvidia
        monkeypatch.setattr(nvidia, "PyKernelArg", SimpleNamespace)
        for name in ("ARG_CONSTEXPR", "ARG_KERNEL", "ARG_TUPLE"):
            monkeypatch.setattr(nvidia, name, name)
    driver.set_active(fake)
    _RecordingLauncher.calls = []
    try:
        yield fake
    finally:
        driver.set_active(previous)  # no CUDA driver here: reset_active() would raise


def _fresh_kernel():
    """A new JITFunction of the probe kernel, so no compiled kernel of another test's driver
    is reused."""
    return triton.jit(_probe_kernel.fn, do_not_specialize=["n_plain"],
                      do_not_specialize_on_alignment=["n_unaligned"])


def _as_launched(call):
    """A recorded launch's arguments with every tensor replaced by its address."""
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in call)


def _same_launch(cached, reference) -> None:
    """A cached launch passes the C launcher what ``JITFunction.run`` passes it, except the
    launch metadata and the (empty) hook chains, for which it passes None."""
    cached, reference = _launched(cached), _launched(reference)
    assert cached.hooks == (None, None, None)
    assert cached._replace(hooks=None, args=None) == reference._replace(hooks=None, args=None)
    assert cached.args == _as_launched(reference.args)


def test_cached_launch_passes_what_jit_run_passes(recording_driver):
    fn = _fresh_kernel()
    launcher = Launcher(fn)
    storage = torch.zeros(512, dtype=torch.float32)
    x, y, z = storage[:64], storage[64:128], storage[128:192]
    options = (("num_warps", 2),)
    calls = [[x, y, None, 64, 5, 7, 0.5, True, 16, False],
             [x, y, z, 48, 1, 1, 2.0, False, 16, True],
             [x, y, None, 64, 9, 33, 0.25, True, 16, False]]
    for args in calls:
        launcher((4, 1, 1), args, options)  # first of its key: JITFunction.run
        first = _RecordingLauncher.calls.pop()
        launcher((4, 1, 1), args, options)  # cached
        cached = _RecordingLauncher.calls.pop()
        fn[(4,)](*args, num_warps=2)
        reference = _RecordingLauncher.calls.pop()
        # Triton passes launch metadata and its (empty) hook chains; the rest must be equal.
        _same_launch(cached, reference)
        # The first call of a key launched through JITFunction.run itself.
        first, reference = _launched(first), _launched(reference)
        assert first._replace(args=None, hooks=None) == reference._replace(args=None, hooks=None)
        assert _as_launched(first.args) == _as_launched(reference.args)
    # calls 0 and 2 share a specialisation (same dtypes, aligned pointers, no int is 1 or a
    # multiple of 16 where Triton looks); call 1 (z given, 48 % 16 == 0, n_plain == 1) not.
    assert len(launcher.prepared) == 2


def test_other_alignment_compiles_another_kernel(recording_driver):
    fn = _fresh_kernel()
    launcher = Launcher(fn)
    storage = torch.zeros(512, dtype=torch.float32)
    aligned = [storage[:64], storage[64:128], None, 64, 5, 7, 0.5, True, 16, False]
    shifted = [storage[1:65], storage[64:128], None, 64, 5, 7, 0.5, True, 16, False]
    k_aligned = launcher((1,), aligned, (("num_warps", 2),))
    k_shifted = launcher((1,), shifted, (("num_warps", 2),))
    assert k_aligned is not k_shifted and len(launcher.prepared) == 2
    assert launcher((1,), shifted, (("num_warps", 2),)) is k_shifted
    # Other options are another specialisation too.
    assert launcher((1,), aligned, (("num_warps", 4),)) is not k_aligned


def test_load_compiles_and_loads_without_launching(recording_driver, monkeypatch):
    """``Launcher.load`` compiles and loads a call's kernel once and launches nothing; the
    call then loads nothing more (as a CUDA graph capture, which refuses a module load)."""
    loads = []
    load_binary = recording_driver.utils.load_binary
    monkeypatch.setattr(recording_driver.utils, "load_binary",
                        lambda *a: loads.append(a[0]) or load_binary(*a))
    launcher = Launcher(_fresh_kernel())
    storage = torch.zeros(128, dtype=torch.float32)
    args, options = [storage[:64], storage[64:], None, 64, 5, 7, 0.5, True, 16, False], (
        ("num_warps", 2),)
    for _ in range(2):
        launcher.load((1,), args, options)
    assert len(loads) == 1 and not _RecordingLauncher.calls and len(launcher.loaded) == 1
    launcher((1,), args, options)
    launcher((1,), args, options)
    assert len(loads) == 1 and len(_RecordingLauncher.calls) == 2


def test_launch_hooks_take_the_jit_path(recording_driver):
    from triton import knobs
    fn = _fresh_kernel()
    launcher = Launcher(fn)
    storage = torch.zeros(128, dtype=torch.float32)
    args = [storage[:64], storage[64:], None, 64, 5, 7, 0.5, True, 16, False]
    launcher((1,), args)
    launcher((1,), args)
    assert _launched(_RecordingLauncher.calls.pop()).hooks[1] is None  # cached: no hooks
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        launcher((1,), args)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    # JITFunction.run passed its hook chain, which the C launcher calls.
    assert _launched(_RecordingLauncher.calls.pop()).hooks[1] is knobs.runtime.launch_enter_hook


def test_changed_global_raises_as_triton_does(recording_driver):
    fn = triton.jit(_global_kernel.fn)
    launcher = Launcher(fn)
    x = torch.zeros(16)
    launcher((1,), [x])
    global _SCALE
    try:
        _SCALE = tl.constexpr(3)
        with pytest.raises(RuntimeError, match="Global variable _SCALE has changed"):
            launcher((1,), [x])
    finally:
        _SCALE = tl.constexpr(2)


_SCALE = tl.constexpr(2)


@triton.jit
def _global_kernel(x_ptr):
    offs = tl.arange(0, 16)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) * _SCALE)


# The ops' eager launches against their JIT launches, under the recording driver: each op's
# kernel is compiled for sm_90 here (the Gluon one included), launched through the op's own
# eager code with a fresh launcher, and the C launcher must get what JITFunction.run gives it.


def _eager_and_jit(launch_eager, launch_jit):
    launch_eager()  # first of its key: JITFunction.run
    _RecordingLauncher.calls.clear()
    launch_eager()
    eager = list(_RecordingLauncher.calls)
    _RecordingLauncher.calls.clear()
    launch_jit()
    jit = list(_RecordingLauncher.calls)
    assert len(eager) == len(jit) > 0
    for cached, reference in zip(eager, jit):
        _same_launch(cached, reference)


@pytest.mark.parametrize("sm90_kernel", ["block_pair", "shared_s"])
def test_gluon_sparse_mla_eager_launch(recording_driver, monkeypatch, sm90_kernel):
    from strictops.ops.sparse_mla import prefill as sparse
    ws = sparse._sparse_mla_sm90
    if ws is None:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(ws, "KERNEL", sm90_kernel)
    monkeypatch.setattr(ws, "_LAUNCHERS", {name: Launcher(launcher.fn)
                                           for name, launcher in ws._LAUNCHERS.items()})
    # The persistent block-pair kernel launches at most one CTA per SM (no device here).
    monkeypatch.setattr(ws.KERNELS["block_pair"], "sm_count", lambda device: 132)
    q = torch.zeros(2, 64, 576, dtype=torch.float8_e4m3fn)
    kv = torch.zeros(300, 1, 576, dtype=torch.float8_e4m3fn)
    indices = torch.zeros(2, 1, 128, dtype=torch.int32)
    lengths, scale = torch.zeros(2, dtype=torch.int32), torch.ones(1)
    out, stats = torch.zeros(2, 64, 512, dtype=torch.bfloat16), torch.zeros(2, 2, 64)
    call = (q, kv, indices, 0.04, scale, scale, None, lengths, out, stats[0], stats[1], None)
    grid, runtime = sparse._runtime_arguments(*call)
    _eager_and_jit(lambda: ws.launch_eager(grid, runtime, 576, True, False, False, 0),
                   lambda: ws.launch(*call))


def _sparse_mla_module():
    from strictops.ops.sparse_mla import prefill as sparse
    if sparse._sparse_mla_sm90 is None:
        pytest.skip("this Triton has no Gluon")
    return sparse


def _sparse_eager_on_cpu(recording_driver, monkeypatch):
    """The sparse MLA op's eager path on CPU tensors under the recording driver: the contract
    stood in for (its own tests cover it), the sm_90 Gluon kernel chosen, fresh launchers, a
    CPU "device" of 132 SMs. Returns the op module and its sm_90 launch module."""
    sparse = _sparse_mla_module()
    ws = sparse._sparse_mla_sm90
    monkeypatch.setattr(sparse, "_VALIDATION", lambda *args: None)
    monkeypatch.setattr(sparse, "_is_sm90", lambda index: True)
    monkeypatch.setattr(ws, "_LAUNCHERS", {name: Launcher(launcher.fn)
                                           for name, launcher in ws._LAUNCHERS.items()})
    monkeypatch.setattr(recording_driver, "get_current_device", lambda: -1)
    monkeypatch.setattr(ws.KERNELS["block_pair"], "sm_count", lambda device: 132)
    return sparse, ws


def _sparse_cpu_inputs():
    """q, kv, indices, one scale and the three buffers of a 3-token call of 64 heads."""
    q = torch.zeros(3, 64, 576, dtype=torch.float8_e4m3fn)
    kv = torch.zeros(300, 1, 576, dtype=torch.float8_e4m3fn)
    indices, scale = torch.zeros(3, 1, 128, dtype=torch.int32), torch.ones(1)
    buffers = {"out": torch.zeros(3, 64, 512, dtype=torch.bfloat16),
               "max_logits": torch.zeros(3, 64), "lse": torch.zeros(3, 64)}
    return q, kv, indices, scale, buffers


@pytest.mark.parametrize("given", ["", "out", "max_logits", "lse", "out,max_logits,lse"])
def test_sparse_mla_eager_allocates_and_launches_its_outputs(recording_driver, monkeypatch,
                                                            given):
    """The eager path's outputs: the buffers given, the rest allocated (``max_logits`` and
    ``lse``, when both are missing, as the halves of one allocation), each the one the launch
    writes. The contract is stood in for (its own tests cover it; these are CPU tensors)."""
    sparse, ws = _sparse_eager_on_cpu(recording_driver, monkeypatch)
    q, kv, indices, scale, buffers = _sparse_cpu_inputs()
    passed = {name: buffers[name] if name in given.split(",") else None for name in buffers}
    for _ in range(2):  # the first launch of its key through JITFunction.run, then cached
        outputs = sparse._eager(q, kv, indices, 0.04, scale, scale, 512, None, None,
                                passed["out"], passed["max_logits"], passed["lse"], None)
    launched = _launched(_RecordingLauncher.calls[-1]).args[8:11]  # out, max_logits, lse
    assert launched == tuple(t.data_ptr() for t in outputs)
    for name, t, shape, dtype in zip(buffers, outputs, ((3, 64, 512), (3, 64), (3, 64)),
                                     (torch.bfloat16, torch.float32, torch.float32)):
        assert t is passed[name] if passed[name] is not None else (
            t.shape == shape and t.dtype == dtype and t.is_contiguous())
    ml, lse = outputs[1:]
    assert (ml.untyped_storage().data_ptr() == lse.untyped_storage().data_ptr()) == (
        passed["max_logits"] is None and passed["lse"] is None)


@pytest.mark.parametrize("kernel", ["persistent", "per_chunk", "layer_loop"])
def test_mamba_scatter_eager_launch(recording_driver, kernel):
    from strictops.ops.mamba import state_scatter as mss
    path = mss.PATHS[kernel]
    launcher = Launcher(path.jit_fn)
    dst, src = torch.zeros(2, 5, 3, 16), torch.zeros(2, 4, 3, 3, 16)
    slots, steps = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)
    call = (dst, src, slots, steps, None)
    grid, args = path.arguments(*call)
    _eager_and_jit(lambda: launcher(grid, args, path.options, 0),
                   lambda: path.launch(path.jit_fn, *call))


@pytest.mark.parametrize("src_indices", [False, True])
def test_conv_window_scatter_eager_launch(recording_driver, monkeypatch, src_indices):
    from strictops.ops.mamba import conv_window_scatter as cws
    monkeypatch.setattr(cws, "_LAUNCHER", Launcher(cws._scatter_kernel))
    dst = torch.zeros(2, 5, 19, 3, dtype=torch.bfloat16)
    src = cws.window_view(torch.zeros(2, 4, 19, 3 + 3 - 1, dtype=torch.bfloat16), 3, 3)
    slots, steps = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)
    call = (dst, src, slots, steps, slots if src_indices else None)
    grid, args = cws._arguments(*call)
    _eager_and_jit(lambda: cws._LAUNCHER(grid, args, cws._OPTIONS, 0),
                   lambda: cws._launch(cws._scatter_kernel, *call))


@pytest.mark.parametrize("second_set", [False, True])
def test_conv_window_scatter_multi_eager_launch(recording_driver, monkeypatch, second_set):
    from strictops.ops.mamba import conv_window_scatter as cws
    from strictops.ops.mamba import conv_window_scatter_multi as multi
    monkeypatch.setattr(multi, "_LAUNCHER", Launcher(multi._scatter_multi_kernel))
    pairs = [(torch.zeros(2, 5, dim, km1, dtype=dtype),
              cws.window_view(torch.zeros(2, 4, dim, 3 + km1 - 1, dtype=dtype), 3, km1))
             for dim, km1, dtype in ((19, 3, torch.bfloat16), (7, 2, torch.float32))]
    slots, steps = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)
    call = (pairs, slots, steps, *((steps, slots) if second_set else (None, None)))
    grid, args = multi._arguments(*call)
    _eager_and_jit(lambda: multi._LAUNCHER(grid, args, multi._OPTIONS, 0),
                   lambda: multi._launch(multi._scatter_multi_kernel, *call))


@pytest.mark.parametrize("nbytes", [1000, 3 << 20])
@pytest.mark.parametrize("lease_on", ["host", "device", "device_graph"])
def test_transport_eager_launch(recording_driver, monkeypatch, nbytes, lease_on):
    """One launch up to EAGER_TWO_LAUNCHES_ABOVE (the op's own choice would be two at 3 MiB),
    the lease as kernel arguments (``copy_tensor``) or read from its tensor (the graph API);
    a call captured in a CUDA graph (``device_graph``) makes TUNING's launches, the flag's a
    PDL."""
    from strictops.meta.transport import pool as contract
    from strictops.ops.transport import pool as tp
    monkeypatch.setattr(tp, "_LAUNCHER", Launcher(tp._publish_kernel))
    monkeypatch.setattr(tp, "_has_pdl", lambda index: True)
    start = contract.data_start(4, 2)
    pool = torch.zeros(start + nbytes + 256, dtype=torch.uint8)
    src, state = torch.zeros(nbytes, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.int32)
    lease = contract.Lease(start, start + nbytes, nbytes, 1, 7, 12, 16)
    if lease_on == "host":
        row = Pointer(state.data_ptr() + 8, torch.int32)
        _eager_and_jit(lambda: tp.launch_eager(pool, src, row, row, 4, 2, lease),
                       lambda: tp._launch(tp._publish_kernel, pool, src, state[1], state[1], 4,
                                          2, values=lease, two_launches=False))
        return
    lease_t, graph = torch.tensor(lease), lease_on == "device_graph"
    _eager_and_jit(lambda: tp.launch_eager(pool, src, lease_t, state[1], 4, 2, graph=graph),
                   lambda: tp._launch(tp._publish_kernel, pool, src, lease_t, state[1], 4, 2,
                                      two_launches=None if graph else False))
    assert len(_RecordingLauncher.calls) == (2 if graph and nbytes > 1 << 20 else 1)


def test_mamba_track_states_eager_launch(recording_driver, monkeypatch):
    from strictops.ops.mamba import track_states as mts
    monkeypatch.setattr(mts, "_LAUNCHER", Launcher(mts._track_kernel))
    conv = torch.zeros(2, 6, 5, 3, dtype=torch.bfloat16)
    ssm = torch.zeros(2, 6, 4, 16)
    src, dst = torch.zeros(5, dtype=torch.int32), torch.zeros(5, dtype=torch.int64)
    mask = torch.zeros(5, dtype=torch.bool)
    call = (conv, ssm, src, mask, dst, 4)
    grid, args = mts._arguments(7, *call)
    _eager_and_jit(lambda: mts._LAUNCHER(grid, args, mts._OPTIONS, 0),
                   lambda: mts._launch(mts._track_kernel, 7, *call))


@pytest.mark.parametrize("with_seq_lens", [False, True])
def test_mamba_commit_indices_eager_launch(recording_driver, monkeypatch, with_seq_lens):
    from strictops.ops.mamba import commit_indices as mci
    monkeypatch.setattr(mci, "_LAUNCHER", Launcher(mci._commit_kernel))
    accept_index = torch.zeros(6, 4, dtype=torch.int32)
    lens = torch.zeros(6, dtype=torch.int64)
    call = (accept_index, lens, lens if with_seq_lens else None, 4, 8)
    results = mci._allocate(lens, call[2])
    grid, args = mci._arguments(*call, *results)
    runtime, constexprs = keyword_constexprs(mci._commit_kernel, args)  # the same results
    _eager_and_jit(lambda: mci._LAUNCHER(grid, args, mci._OPTIONS, 0),
                   lambda: mci._commit_kernel[grid](*runtime, **constexprs,
                                                    num_warps=mci.NUM_WARPS))


# On a GPU: eager calls whose pointers are not 16-byte aligned get a kernel of their own and
# the right result; the eager path and the dispatcher's give the same bits.


@gpu
def test_gpu_mamba_scatter_misaligned_dst_view():
    from strictops.ops import fused_mamba_state_scatter_with_mask
    from strictops.ops.mamba import state_scatter as mss
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (3, 9, 4, 8)
    src = torch.randn(3, 5, 2, 4, 8, device="cuda", generator=gen)
    slots = torch.tensor([4, 0, 7, 4], dtype=torch.int32, device="cuda")
    steps = torch.tensor([1, 0, -1, 0], dtype=torch.int64, device="cuda")
    for offset in (0, 1, 0, 3):  # elements (4 bytes): aligned, not, aligned again, not
        base = torch.randn(offset + 3 * 9 * 4 * 8, device="cuda", generator=gen)
        dst = base[offset:].view(shape)
        expected = mss.reference(dst, src, slots, steps)
        fused_mamba_state_scatter_with_mask(dst, src, slots, steps)
        assert torch.equal(dst, expected), offset
    launcher = mss.PATHS[mss.TUNING["kernel"]].launcher
    aligned = {key[5] for key in launcher.prepared}  # dst's alignment: after 4 + dtype
    assert {True, False} <= aligned


@gpu
def test_gpu_unknown_launch_layout_gives_the_reference_result(monkeypatch):
    """With no launcher layout known (as on a Triton whose launcher changed again), the Mamba
    scatter and sparse MLA eager calls launch through ``JITFunction.run`` only (no fast
    launch, no C++ plan) and give the reference result."""
    from strictops.meta.sparse_mla import prefill as smp
    from strictops.ops._runtime import triton_abi as _triton_abi
    from strictops.ops.mamba import state_scatter as mss
    from strictops.ops.sparse_mla import prefill as sparse
    from strictops.ops._runtime.kernel_path import KernelPath
    monkeypatch.setattr(_triton_abi, "LAYOUTS", ())
    kernel = mss.TUNING["kernel"]
    real = mss.PATHS[kernel]
    path = KernelPath(real.jit_fn, real.contract, mss.contract.ARGUMENTS, real.arguments,
                      real.num_warps, writes=("dst",))
    monkeypatch.setattr(mss, "_eager", path.eager)
    monkeypatch.setitem(mss._HOSTS, kernel, path.host.call)
    gen = torch.Generator(device="cuda").manual_seed(0)
    dst = torch.randn(3, 9, 4, 8, device="cuda", generator=gen)
    src = torch.randn(3, 5, 2, 4, 8, device="cuda", generator=gen)
    slots = torch.tensor([4, 0, 7, 4], dtype=torch.int32, device="cuda")
    steps = torch.tensor([1, 0, -1, 0], dtype=torch.int64, device="cuda")
    for _ in range(3):
        expected = mss.reference(dst, src, slots, steps)
        mss.fused_mamba_state_scatter_with_mask(dst, src, slots, steps)
        assert torch.equal(dst, expected)
        src.add_(1)
    assert [p.fast for p in path.launcher.prepared.values()] == [None]
    assert path.host.call(dst, src, slots, steps, None) is mss.MISS
    # Sparse MLA: its eager path's launchers (the Gluon one on sm_90), fresh.
    ws = sparse._sparse_mla_sm90
    monkeypatch.setattr(sparse, "_LAUNCHER", Launcher(sparse._LAUNCHER.fn))
    if ws is not None:
        monkeypatch.setattr(ws, "_LAUNCHERS", {name: Launcher(launcher.fn)
                                               for name, launcher in ws._LAUNCHERS.items()})
    monkeypatch.setattr(sparse, "_HOST", sparse.HostPath(
        sparse._VALIDATION, writes=(*smp.BUFFERS, "topk_length_errors")))
    monkeypatch.setattr(sparse, "_HOST_CALL", sparse._HOST.call)
    dims = smp.Dims(s_q=5, s_kv=700, h_q=128, d_qk=576, topk=256, with_attn_sink=True,
                    device="cuda")
    args = sparse.random_inputs(dims, torch.Generator(device="cuda").manual_seed(1))
    args.pop("topk_length_errors")
    for name in smp.BUFFERS:
        args.pop(name)
    expected = sparse.reference(**{k: args[k] for k in sparse.INPUTS})
    for _ in range(2):
        outputs = sparse.sparse_mla_q8kv8_prefill_fwd(**args)
        passed, detail = sparse.compare_to_reference(outputs, expected,
                                                     sparse.GPU_REL_L2_BOUND,
                                                     sparse.GPU_LOGIT_TOL)
        assert passed, detail
    launchers = [sparse._LAUNCHER, *(ws._LAUNCHERS.values() if ws is not None else ())]
    prepared = [p for launcher in launchers for p in launcher.prepared.values()]
    assert prepared and all(p.fast is None for p in prepared)
    assert sparse._HOST.call(*(args.get(n) for n in smp.ARGUMENTS)) is sparse.MISS


@gpu
def test_gpu_copy_tensor_misaligned_source():
    from strictops.meta.transport.pool import data_start
    from strictops.ops import TransportPool
    pool = TransportPool(data_start(4, 1) + (8 << 20), device="cuda:0", max_inflight_slices=4,
                         consumer_count=1, recycle_interval=None, name="launcher-test")
    try:
        base = torch.randint(0, 256, ((2 << 20) + 7,), dtype=torch.uint8, device="cuda")
        # Each case three times: the Python path, then the C++ path's plan where it has one
        # (each slot's state row and lease values per call).
        for offset, nbytes in ((0, 4096), (1, 4096), (3, 1000), (5, 2 << 20)):
            src = base[offset:offset + nbytes]
            leases = []
            for _ in range(3):
                base[offset:offset + nbytes].random_(0, 256)
                lease, view = pool.copy_tensor(src)
                torch.cuda.synchronize()
                assert torch.equal(view, src), (offset, nbytes)
                assert view.data_ptr() == pool.tensor.data_ptr() + lease.start
                ready = pool.tensor[lease.ready_byte_offset:lease.ready_byte_offset + 4]
                assert int(ready.view(torch.int32)) == lease.generation
                leases.append(lease)
            for lease in leases:
                pool.release(lease)
        assert pool.error_count() == 0
    finally:
        pool.shutdown()


@gpu
@pytest.mark.parametrize("kernel", ["auto", "triton"])
def test_gpu_sparse_mla_eager_equals_dispatcher(monkeypatch, kernel):
    from strictops.meta.sparse_mla import prefill as smp
    from strictops.ops.sparse_mla import prefill as sparse
    monkeypatch.setattr(sparse, "KERNEL", kernel)
    dims = smp.Dims(s_q=5, s_kv=700, h_q=128, d_qk=576, topk=256, with_attn_sink=True,
                    device="cuda")
    args = sparse.random_inputs(dims, torch.Generator(device="cuda").manual_seed(1))
    args.pop("topk_length_errors")
    for name in smp.BUFFERS:
        args.pop(name)
    eager = sparse.sparse_mla_q8kv8_prefill_fwd(**args)
    eager_again = sparse.sparse_mla_q8kv8_prefill_fwd(**args)  # the cached launch
    through = torch.ops.strictops.sparse_mla_q8kv8_prefill_fwd(
        *(args.get(n) for n in smp.ARGUMENTS))
    for a, b, c in zip(eager, eager_again, through):
        assert torch.equal(a, b) and torch.equal(a, c)
    max_logits, lse = eager[1], eager[2]  # the two halves of one allocation
    assert max_logits.untyped_storage().data_ptr() == lse.untyped_storage().data_ptr()


# The C++ eager path (strictops.ops._runtime.host_path) against the Python path: under the recording
# driver and a recorder of the C++ launches, a call served by a plan launches the kernel the
# Python path launched, with the same grid, block, shared memory and parameters (each pointer
# the address of the tensor the Python path passed there), and returns the same kind of result.

def _needs_host_path(test):
    from strictops.ops._runtime import host_path as _host_path
    return pytest.mark.skipif(not _host_path.available(),
                              reason="built without the C++ eager path")(test)


def _params(launch, signature):
    """A recorded C++ launch's parameters, decoded by the kernel's signature: pointers as
    addresses, scalars as Triton packs them (floats rounded to the parameter's type)."""
    blob, offsets = launch[8], launch[9]
    kinds = [k for k in signature.values() if k != "constexpr"]
    assert len(offsets) == len(kinds) + 2  # and Triton's two scratch pointers, null
    assert blob[offsets[-2]:offsets[-2] + 16] == bytes(16)
    from strictops.ops._runtime.host_path import _SCALAR_FORMATS
    return [struct.unpack_from("<Q" if k.startswith("*") else "<" + _SCALAR_FORMATS[k],
                               blob, o)[0] for k, o in zip(kinds, offsets)]


def _triton_params(call, signature):
    """A recorded Triton launch's runtime parameters (its C launcher also takes the
    constexprs), pointers as addresses, floats as fp32."""
    return [a.data_ptr() if isinstance(a, (torch.Tensor, Pointer)) else
            struct.unpack("<f", struct.pack("<f", a))[0] if isinstance(a, float) else a
            for a, kind in zip(_launched(call).args, signature.values()) if kind != "constexpr"]


@_needs_host_path
@pytest.mark.parametrize("given", ["", "out", "out,max_logits,lse", "errors"])
def test_sparse_mla_plan_launches_what_the_python_path_launches(
        recording_driver, host_recorder, monkeypatch, given):
    from strictops.ops._runtime.host_path import HostPath
    real = _sparse_mla_module()._VALIDATION
    sparse, ws = _sparse_eager_on_cpu(recording_driver, monkeypatch)
    # CPU tensors: the contract (its own tests cover it) passes every call, with the per-call
    # rows of its signature, which the plan runs from their pairs.
    validation = SimpleNamespace(names=real.names, rows_for=real._rows_of)
    host = HostPath(validation, writes=(*sparse.contract.BUFFERS, "topk_length_errors"))
    monkeypatch.setattr(sparse, "_HOST", host)
    monkeypatch.setattr(sparse, "_HOST_CALL", host.call)
    q, kv, indices, scale, buffers = _sparse_cpu_inputs()
    kw = {name: buffers[name] for name in buffers if name in given.split(",")}
    if given == "errors":
        kw["topk_length_errors"] = torch.zeros(1, dtype=torch.int32)
    versions = {name: t._version for name, t in kw.items()}
    call = lambda: sparse.sparse_mla_q8kv8_prefill_fwd(  # noqa: E731
        q, kv, indices, 0.04, scale, scale, **kw)
    python_outputs = call()  # the Python path: it plans the signature
    python_launch = _RecordingLauncher.calls[-1]
    assert not host_recorder and len(host.cache) == 1
    planned_outputs = call()  # the plan
    assert len(host_recorder) == 1 and _RecordingLauncher.calls[-1] is python_launch
    launch = host_recorder[0]
    function, grid, threads, shared, num_ctas, pdl, cooperative = launch[:7]
    triton = _launched(python_launch)
    num_warps, _, triton_shared = triton.metadata
    assert (function, grid, threads, shared, num_ctas, pdl, cooperative) == (
        triton.function, triton.grid, 32 * num_warps, triton_shared, 1, triton.pdl,
        triton.cooperative)
    kernel = next(iter(ws._LAUNCHERS[ws.KERNEL].prepared.values())).kernel
    planned = _params(launch, kernel.src.signature)
    expected = _triton_params(python_launch, kernel.src.signature)
    # The outputs the plan allocated take the places of those the Python path allocated.
    for mine, theirs in zip(planned_outputs, python_outputs):
        if mine is not theirs:
            assert mine.shape == theirs.shape and mine.dtype == theirs.dtype
            assert mine.is_contiguous() and mine.data_ptr() != theirs.data_ptr()
            expected = [mine.data_ptr() if p == theirs.data_ptr() else p for p in expected]
    assert planned == expected
    for name, t in kw.items():  # bumped once by each call, as the dispatcher does
        assert t._version == versions[name] + 2
    ml, lse = planned_outputs[1:]
    assert (ml.untyped_storage().data_ptr() == lse.untyped_storage().data_ptr()) == (
        "max_logits" not in kw)
    # Another kernel choice or tuning: the plan no longer serves the signature.
    args = (q, kv, indices, 0.04, scale, scale, 512, None, None, kw.get("out"),
            kw.get("max_logits"), kw.get("lse"), kw.get("topk_length_errors"))
    for module, value in ((sparse, "triton"), (ws, "shared_s")):
        saved, module.KERNEL = module.KERNEL, value
        try:
            assert host.call(*args) is sparse.MISS
        finally:
            module.KERNEL = saved
    monkeypatch.setitem(sparse.TUNING, "num_warps", 4)
    assert host.call(*args) is sparse.MISS


class _UnknownLayoutLauncher(_RecordingLauncher):
    """The launcher of a Triton whose C ``launch`` takes a layout no fast path knows: one
    item more after the function."""

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):
        self.launch(grid_x, grid_y, grid_z, stream, function, "unknown", *args)


class _ClassLaunchLauncher(_RecordingLauncher):
    """A launcher whose C ``launch`` is no attribute of the instance, so nothing can be
    recorded there."""

    launch = staticmethod(_record)

    def __init__(self, src, metadata) -> None:
        super().__init__(src, metadata)
        del self.launch


def test_launcher_with_nothing_to_record_still_launches_once(recording_driver, monkeypatch):
    """Where the launch cannot be recorded, the first call still launches, once, through
    ``JITFunction.run``, and the key keeps no fast launch."""
    monkeypatch.setattr(recording_driver, "launcher_cls", _ClassLaunchLauncher)
    launcher = Launcher(_fresh_kernel())
    storage = torch.zeros(128, dtype=torch.float32)
    args = [storage[:64], storage[64:], None, 64, 5, 7, 0.5, True, 16, False]
    for calls in (1, 2):
        launcher((1,), args)
        assert len(_RecordingLauncher.calls) == calls
    assert [p.fast for p in launcher.prepared.values()] == [None]


def _mamba_scatter_on_cpu(monkeypatch, recording_driver, kernel):
    """The Mamba scatter's eager path with a fresh launcher and C++ path (a contract without
    rules stands in: CPU tensors), on the recording driver; returns its KernelPath."""
    from strictops.meta._contract import Contract
    from strictops.ops.mamba import state_scatter as mss
    from strictops.ops._runtime.kernel_path import KernelPath
    real = mss.PATHS[kernel]
    path = KernelPath(real.jit_fn, Contract(mss.contract.CONTRACT.op, "stand_in", ()),
                      mss.contract.ARGUMENTS, real.arguments, real.num_warps, writes=("dst",))
    monkeypatch.setattr(recording_driver, "get_current_device", lambda: -1)
    monkeypatch.setitem(mss.TUNING, "kernel", kernel)
    monkeypatch.setattr(mss, "_eager", path.eager)
    monkeypatch.setitem(mss._HOSTS, kernel, path.host.call)
    return path


@_needs_host_path
def test_unknown_launch_layout_takes_the_jit_path(recording_driver, host_recorder,
                                                  monkeypatch):
    """On a Triton whose launcher takes a layout the fast path does not know, no call is
    launched any other way than through ``JITFunction.run``: no fast launch is kept, no C++
    plan is made, and every call reaches Triton's own launcher."""
    from collections import defaultdict
    from strictops.ops.mamba import state_scatter as mss
    for kernel in ("layer_loop", "per_chunk"):  # compiled kernels of this test's own
        fn = mss.PATHS[kernel].jit_fn
        monkeypatch.setattr(fn, "device_caches", defaultdict(fn.create_binder))
    monkeypatch.setattr(recording_driver, "launcher_cls", _UnknownLayoutLauncher)
    path = _mamba_scatter_on_cpu(monkeypatch, recording_driver, "layer_loop")
    dst, src = torch.zeros(2, 5, 3, 16), torch.zeros(2, 4, 3, 3, 16)
    slots, steps = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)
    for _ in range(3):
        assert mss.fused_mamba_state_scatter_with_mask(dst, src, slots, steps) is None
    assert [prepared.fast for prepared in path.launcher.prepared.values()] == [None]
    assert not host_recorder and path.host.call(dst, src, slots, steps, None) is mss.MISS
    calls = _RecordingLauncher.calls
    assert len(calls) == 3 and all(call[5] == "unknown" for call in calls)
    # The same kernel on a known layout: a fast launch and a plan.
    monkeypatch.setattr(recording_driver, "launcher_cls", _RecordingLauncher)
    path = _mamba_scatter_on_cpu(monkeypatch, recording_driver, "per_chunk")
    for _ in range(3):
        mss.fused_mamba_state_scatter_with_mask(dst, src, slots, steps)
    assert all(p.fast is not None for p in path.launcher.prepared.values())
    assert len(host_recorder) == 2  # the second and third calls, from the plan


@_needs_host_path
@pytest.mark.parametrize("kernel", ["persistent", "per_chunk", "layer_loop"])
def test_mamba_scatter_plan_launches_what_the_python_path_launches(
        recording_driver, host_recorder, monkeypatch, kernel):
    from strictops.ops.mamba import state_scatter as mss
    path = _mamba_scatter_on_cpu(monkeypatch, recording_driver, kernel)
    dst, src = torch.zeros(2, 5, 3, 16), torch.zeros(2, 4, 3, 3, 16)
    slots, steps = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)
    version = dst._version
    for _ in range(2):
        assert mss.fused_mamba_state_scatter_with_mask(dst, src, slots, steps) is None
    assert len(host_recorder) == 1 and len(path.host.cache) == 1
    python_launch, launch = _RecordingLauncher.calls[-1], host_recorder[0]
    kernel = next(iter(path.launcher.prepared.values())).kernel
    assert (launch[1], launch[0]) == (_launched(python_launch).grid,
                                   _launched(python_launch).function)
    assert _params(launch, kernel.src.signature) == _triton_params(python_launch, kernel.src.signature)
    assert dst._version == version + 2
    # Another tensor as the same argument, same signature: the plan, with its address.
    other = torch.zeros(4, dtype=torch.int64)
    mss.fused_mamba_state_scatter_with_mask(dst, src, slots, other)
    assert other.data_ptr() in _params(host_recorder[-1], kernel.src.signature)
    # A tensor of another specialisation (an address not a multiple of 16): the Python path,
    # which compiles and plans its own.
    shifted = torch.zeros(5, dtype=torch.int64)[1:]
    mss.fused_mamba_state_scatter_with_mask(dst, src, slots, shifted)
    assert len(host_recorder) == 2 and len(path.host.cache) == 2 and len(path.launcher.prepared) == 2


@_needs_host_path
@pytest.mark.parametrize("with_seq_lens", [False, True])
def test_mamba_commit_indices_plan_launches_what_the_python_path_launches(
        recording_driver, host_recorder, monkeypatch, with_seq_lens):
    from strictops.meta._contract import CachedValidation, Contract
    from strictops.ops.mamba import commit_indices as mci
    from strictops.ops._runtime.host_path import HostPath
    # CPU tensors: a contract without rules stands in (the op's own tests cover its rules).
    validation = CachedValidation(Contract(mci.contract.CONTRACT.op, "stand_in", ()),
                                  mci.contract.ARGUMENTS)
    host = HostPath(validation)
    monkeypatch.setattr(mci, "_VALIDATION", validation)
    monkeypatch.setattr(mci, "_HOST", host)
    monkeypatch.setattr(mci, "_HOST_CALL", host.call)
    monkeypatch.setattr(mci, "_LAUNCHER", Launcher(mci._commit_kernel))
    monkeypatch.setattr(recording_driver, "get_current_device", lambda: -1)
    accept_index = torch.zeros(6, 4, dtype=torch.int32)
    lens = torch.zeros(6, dtype=torch.int64)
    call = (accept_index, lens, lens.clone() if with_seq_lens else None, 4, 8)
    python = mci.fused_commit_track_indices(*call)
    python_launch = _RecordingLauncher.calls[-1]
    planned = mci.fused_commit_track_indices(*call)
    assert len(host_recorder) == 1 and _RecordingLauncher.calls[-1] is python_launch
    assert (planned[1] is None) == (python[1] is None) == (not with_seq_lens)
    for mine, theirs in zip(planned, python):
        if theirs is not None:
            assert mine.shape == theirs.shape and mine.dtype == theirs.dtype
    kernel = next(iter(mci._LAUNCHER.prepared.values())).kernel
    expected = _triton_params(python_launch, kernel.src.signature)
    launched = _params(host_recorder[0], kernel.src.signature)
    # Each result's address in the Python path's launch is the plan's result's in its own
    # (an empty result has none: 0 in both).
    by_python_address = {theirs.data_ptr(): mine.data_ptr()
                         for mine, theirs in zip(planned, python) if theirs is not None}
    assert launched == [by_python_address.get(p, p) for p in expected]
    assert host_recorder[0][1] == _launched(python_launch).grid


def _cpu_pool(rt, slots, consumers, nbytes):
    """A TransportPool's producer state over a CPU byte tensor (its constructor needs CUDA):
    what copy_tensor reads."""
    import threading
    from strictops.meta.transport import pool as contract
    pool = object.__new__(rt.TransportPool)
    memory_size = contract.data_start(slots, consumers) + nbytes
    pool.tensor = torch.zeros(memory_size, dtype=torch.uint8)
    pool.name, pool.max_inflight_slices, pool.consumer_count = "launcher-test", slots, consumers
    pool.consumers, pool._system = contract.PEERS, True
    pool._state = torch.zeros(slots, rt.STATE_ROW_WORDS, dtype=torch.int32)
    pool._state_address = pool._state.data_ptr()
    pool.allocator = rt.LeaseAllocator(memory_size, slots, consumers, pool.name)
    pool._lock = threading.Lock()
    return pool


@_needs_host_path
def test_copy_tensor_plan_launches_what_the_python_path_launches(
        recording_driver, host_recorder, monkeypatch):
    from strictops.meta._contract import CachedValidation, Contract
    from strictops.ops.transport import pool as tp
    from strictops.ops.transport import producer as rt
    from strictops.ops._runtime.host_path import MISS, HostPath
    # CPU tensors: a contract without rules stands in (the op's own tests cover its rules).
    validation = CachedValidation(Contract(tp.contract.CONTRACT.op, "stand_in", ()),
                                  rt._SOURCE_VALIDATION.names)
    real = rt._PUBLISH_HOST
    host = HostPath(validation, names=real.names[:real.keyed], per_call=real.names[real.keyed:])
    for name, value in (("_SOURCE_VALIDATION", validation), ("_PUBLISH_HOST", host),
                        ("_PUBLISH_CALL", host.call), ("_PUBLISH_KNOWN", host.known)):
        monkeypatch.setattr(rt, name, value)
    monkeypatch.setattr(tp, "_LAUNCHER", Launcher(tp._publish_kernel))
    monkeypatch.setattr(recording_driver, "get_current_device", lambda: -1)
    pool = _cpu_pool(rt, slots=4, consumers=2, nbytes=1 << 16)
    src = torch.zeros(1000, dtype=torch.float32)  # 4000 bytes: one launch, a partial block
    first, _ = pool.copy_tensor(src)  # the Python path: it plans the signature
    assert not host_recorder and len(host.cache) == 1
    second, view = pool.copy_tensor(src)  # the plan, with the second lease's values
    assert len(host_recorder) == 1 and second.slot != first.slot
    assert view.shape == (src.nbytes,) and view.dtype == torch.uint8
    assert view.data_ptr() == pool.tensor.data_ptr() + second.start
    # What the Python path launches for the second lease, parameter by parameter.
    pool._publish_lease(src, second)
    python_launch = _RecordingLauncher.calls[-1]
    kernel = next(iter(tp._LAUNCHER.prepared.values())).kernel
    assert host_recorder[0][:2] == (_launched(python_launch).function,
                                 _launched(python_launch).grid)
    assert _params(host_recorder[0], kernel.src.signature) == _triton_params(
        python_launch, kernel.src.signature)
    # Per-call values outside what the plan's kernel was specialised for miss it: a state row
    # not 16-byte aligned, a lease field past int32, a slice past the pool, a non-int.
    key = (pool.tensor, src, 4, 2, True)
    state = pool._state_address + second.slot * rt.STATE_ROW_WORDS * 4
    assert host.call(*key, state, *second) is not MISS
    for bad in ((state + 8, *second), (state, second.start + (1 << 31), *second[1:]),
                (state, pool.tensor.numel(), *second[1:]), (state, float(second.start),
                                                            *second[1:])):
        assert host.call(*key, *bad) is MISS, bad
    # Another scope or tuning: the plan no longer serves.
    assert host.call(pool.tensor, src, 4, 2, False, state, *second) is MISS
    monkeypatch.setitem(tp.TUNING, "one_launch", {"block_bytes": 2048, "num_warps": 4})
    assert host.call(*key, state, *second) is MISS


def _publish_on_cpu(monkeypatch, recording_driver):
    """The graph API's eager path (``copy_and_publish``, the lease read from its tensor) on
    CPU tensors with a fresh cached launcher and C++ path, on the recording driver: every rule
    of the contract but ``src_cuda`` stands in for it. Returns the op module and its
    HostPath."""
    from strictops.meta._contract import CachedValidation, Contract
    from strictops.meta.transport import pool as contract
    from strictops.ops._runtime.host_path import HostPath
    from strictops.ops.transport import pool as tp
    stand_in = Contract(contract.CONTRACT.op, "stand_in",
                        tuple(c for c in contract.CHECKS if c.rule != "src_cuda"))
    validation = CachedValidation(stand_in, tp._VALIDATION.names)
    host = HostPath(validation, writes=("pool", "state"), names=tp._HOST.names)
    for name, value in (("_VALIDATION", validation), ("_HOST", host), ("_HOST_CALL", host.call),
                        ("_LAUNCHER", Launcher(tp._publish_kernel))):
        monkeypatch.setattr(tp, name, value)
    monkeypatch.setattr(tp, "_has_pdl", lambda index: True)
    monkeypatch.setattr(recording_driver, "get_current_device", lambda: -1)
    return tp, host


def _publish_inputs(nbytes: int, leases: int = 2):
    """A pool of 4 slots and 2 consumers, a source of ``nbytes`` bytes (float32), a state and
    ``leases`` lease tensors of one signature, each a fitting lease of another slot."""
    from strictops.meta.transport import pool as contract
    start, stride = contract.data_start(4, 2), contract.slot_bytes(2)
    pool = torch.zeros(start + 2 * nbytes + 512, dtype=torch.uint8)
    lease_tensors = [torch.tensor(contract.Lease(start, start + nbytes + 256, nbytes, k,
                                                 7 + k, k * stride, k * stride + 4))
                     for k in range(leases)]
    return pool, torch.zeros(nbytes // 4), lease_tensors, torch.zeros(2, dtype=torch.int32)


@_needs_host_path
def test_publish_plan_launches_what_the_python_path_launches(recording_driver, host_recorder,
                                                             monkeypatch):
    """``copy_and_publish`` with its lease on the device (``TransportPool.publish``): the
    Python path plans the signature, the placement keyed as its scope; the plan launches
    what the Python path launches, parameter by parameter (another lease tensor's address),
    and bumps the pool's and the state's versions as the Python path does. A placement the
    contract refuses has no plan (the contract's error), another scope its own plan; a
    tuning change, or a call while a CUDA graph is captured, takes the Python path."""
    from strictops.meta.transport import pool as contract
    tp, host = _publish_on_cpu(monkeypatch, recording_driver)
    pool, src, (first, second), state = _publish_inputs(4000)  # one launch, a partial block
    versions = (pool._version, state._version)
    tp.copy_and_publish(pool, src, first, state, 4, 2)  # the Python path: it plans
    assert not host_recorder and len(host.cache) == 1
    tp.copy_and_publish(pool, src, second, state, 4, 2)  # the plan
    assert len(host_recorder) == 1
    assert (pool._version, state._version) == (versions[0] + 2, versions[1] + 2)
    # What the Python path launches for the second lease, parameter by parameter.
    tp.launch_eager(pool, src, second, state, 4, 2)
    python_launch = _RecordingLauncher.calls[-1]
    kernel = next(iter(tp._LAUNCHER.prepared.values())).kernel
    assert host_recorder[0][:2] == (_launched(python_launch).function,
                                    _launched(python_launch).grid)
    planned = _params(host_recorder[0], kernel.src.signature)
    assert planned == _triton_params(python_launch, kernel.src.signature)
    assert second.data_ptr() in planned and first.data_ptr() not in planned
    # An unknown placement: no plan (its key is None), the contract's error.
    key = (pool, src, second, state, 4, 2)
    assert host.call(*key, None) is tp.MISS
    expected = contract.CONTRACT.expected_error("consumers_known", pool=pool, src=src,
                                                lease=second, state=state,
                                                max_inflight_slices=4, consumer_count=2,
                                                consumers="other_gpus")
    with pytest.raises(ValueError) as info:
        tp.copy_and_publish(*key, "other_gpus")
    assert (type(info.value), str(info.value)) == expected and len(host_recorder) == 1
    # The other placement: its own plan (GPU scope).
    for _ in range(2):
        tp.copy_and_publish(*key, "same_device")
    assert len(host.cache) == 2 and len(host_recorder) == 2
    assert host.call(*key, False) is None and len(host_recorder) == 3
    # While a CUDA graph is captured: the Python path (TUNING's launches, no plan).
    monkeypatch.setattr(tp, "stream_capturing", lambda: True)
    calls = len(_RecordingLauncher.calls)
    tp.copy_and_publish(*key)
    assert len(host_recorder) == 3 and len(_RecordingLauncher.calls) == calls + 1
    monkeypatch.setattr(tp, "stream_capturing", lambda: False)
    # Another tuning: the plan no longer serves.
    monkeypatch.setitem(tp.TUNING, "one_launch", {"block_bytes": 2048, "num_warps": 4})
    assert host.call(*key, True) is tp.MISS


@_needs_host_path
def test_publish_loads_the_launches_of_a_graph_before_its_capture(recording_driver,
                                                                  host_recorder, monkeypatch):
    """At 3 MiB an eager publish makes one launch (planned) and a CUDA graph captured from it
    two (TUNING's): the eager call compiles and loads those two, so the capture compiles and
    loads nothing (a capture refuses a module load), and launches what ``kernel[grid]``
    launches."""
    from collections import defaultdict
    tp, host = _publish_on_cpu(monkeypatch, recording_driver)
    fn = tp._publish_kernel  # compiled kernels of this test's own
    monkeypatch.setattr(fn, "device_caches", defaultdict(fn.create_binder))
    loads = []
    load_binary = recording_driver.utils.load_binary
    monkeypatch.setattr(recording_driver.utils, "load_binary",
                        lambda *a: loads.append(a[0]) or load_binary(*a))
    pool, src, (lease, _), state = _publish_inputs(3 << 20)
    tp.copy_and_publish(pool, src, lease, state, 4, 2)
    assert len(_RecordingLauncher.calls) == 1 and len(host.cache) == 1
    assert len(loads) == 3 and len(fn.device_caches[-1][0]) == 3  # the eager kernel, two more
    monkeypatch.setattr(tp, "stream_capturing", lambda: True)
    _RecordingLauncher.calls.clear()
    tp.copy_and_publish(pool, src, lease, state, 4, 2)
    captured = list(_RecordingLauncher.calls)
    assert len(captured) == 2 and not host_recorder
    assert len(loads) == 3 and len(fn.device_caches[-1][0]) == 3
    _RecordingLauncher.calls.clear()
    tp._launch(fn, pool, src, lease, state, 4, 2)
    for mine, reference in zip(captured, _RecordingLauncher.calls, strict=True):
        mine, reference = _launched(mine), _launched(reference)  # each through JITFunction.run
        assert mine._replace(args=None, hooks=None) == reference._replace(args=None, hooks=None)
        assert [a.data_ptr() if isinstance(a, Pointer) else a for a in _as_launched(mine.args)
                ] == list(_as_launched(reference.args))
    assert _launched(captured[1]).pdl


def _conv_inputs(multi_pairs: bool):
    """A conv-window scatter call on CPU tensors: one pair, or two of different dims and
    dtypes with both request sets; each ``src`` an overlapping window view."""
    from strictops.ops.mamba import conv_window_scatter as cws
    pairs = [(torch.zeros(2, 5, dim, km1, dtype=dtype),
              cws.window_view(torch.zeros(2, 4, dim, 3 + km1 - 1, dtype=dtype), 3, km1))
             for dim, km1, dtype in ((19, 3, torch.bfloat16), (7, 2, torch.float32))]
    slots, steps = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)
    if multi_pairs:
        return (pairs, slots, steps, steps, slots)
    return (*pairs[0], slots, steps, None)


@_needs_host_path
@pytest.mark.parametrize("multi_pairs", [False, True])
def test_conv_window_scatter_plan_launches_what_the_python_path_launches(
        recording_driver, host_recorder, monkeypatch, multi_pairs):
    """The one-pair and multi-pair ops' plans: the Python path's launch, parameter by
    parameter, the pairs' tensors named inside the list; the storage-reach rows on every call
    (a storage shrunk under a planned signature takes the Python path, which raises)."""
    from strictops.meta._contract import Contract
    from strictops.ops.mamba import conv_window_scatter as cws
    from strictops.ops.mamba import conv_window_scatter_multi as multi
    from strictops.ops._runtime.kernel_path import KernelPath
    module = multi if multi_pairs else cws
    real = module._PATH
    # CPU tensors: the contract's storage-reach rows alone stand in for it (the op's own tests
    # cover the other rules, which need CUDA tensors).
    stand_in = Contract(real.contract.op, "stand_in",
                        tuple(c for c in real.contract.checks if c.inside))
    assert len(stand_in.checks) == 2
    path = KernelPath(real.jit_fn, stand_in, real.validation.names, real.arguments,
                      real.num_warps, real.launch_tensor,
                      writes=multi._dsts if multi_pairs else ("dst",))
    monkeypatch.setattr(module, "_eager", path.eager)
    monkeypatch.setattr(module, "_HOST_CALL", path.host.call)
    monkeypatch.setattr(recording_driver, "get_current_device", lambda: -1)
    call = _conv_inputs(multi_pairs)
    public = multi.fused_conv_window_scatter_multi if multi_pairs else (
        cws.fused_conv_window_scatter_with_mask)
    dsts = [p[0] for p in call[0]] if multi_pairs else [call[0]]
    versions = [d._version for d in dsts]
    for _ in range(2):
        assert public(*call) is None
    assert len(host_recorder) == 1 and len(path.host.cache) == 1
    assert [d._version for d in dsts] == [v + 2 for v in versions]
    python_launch, launch = _RecordingLauncher.calls[-1], host_recorder[0]
    kernel = next(iter(path.launcher.prepared.values())).kernel
    assert (launch[1], launch[0]) == (_launched(python_launch).grid,
                                   _launched(python_launch).function)
    assert _params(launch, kernel.src.signature) == _triton_params(python_launch,
                                                                   kernel.src.signature)
    # The same signature over a src whose storage was shrunk after the view was made.
    shrunk = _conv_inputs(multi_pairs)
    src = shrunk[0][-1][1] if multi_pairs else shrunk[1]
    src.untyped_storage().resize_(src.untyped_storage().nbytes() - src.element_size())
    with pytest.raises(ValueError, match="storage"):
        public(*shrunk)
    assert len(host_recorder) == 1
