"""copy_and_publish and the transport pool: messages, allocator, kernel numerics, GPU runtime.

CPU (CI): every contract message on fake CUDA tensors and every runtime message, pinned with
expecttest; near misses raise the same error on the eager path (concrete sizes) and the fake
path (symbolic sizes), and each rule's error on the plain eager path (the dispatcher skipped,
the verdict cached), on fake and on real CPU tensors; the kernel under the Triton interpreter
equals the reference for any lease values (nothing written outside a fitting lease, a refused
lease counted); the flag's release scope for each consumer placement in sm_90 PTX. GPU
(``-m gpu``): eager publishes served by the C++ path, then a CUDA graph of the same call
replayed into new leases; the pool's publish, wait, acknowledge and recycle on one device, a
full pool that recovers, and one producer with two consumer processes over CUDA IPC
(``tests/gpu_transport_ipc.py``): both on the pool's GPU, and (``-m multi_gpu``) one of them
on a second GPU.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import re
import sys
import textwrap
import time
import unittest
from pathlib import Path

import expecttest
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strictops.meta.transport import pool as contract
from strictops.meta.strategies import transport_pool as calls_of
from strictops.meta.testing import (
    examples,
    HAS_CUDA,
    HAS_TWO_GPUS,
    assert_every_rule_pinned,
    build,
    fake_mode,
    gpu,
    multi_gpu,
    near_miss_message,
    raised,
    run_script,
)
from strictops.ops import TransportConsumer, TransportPool, copy_and_publish
from strictops.ops.transport import pool as op
from strictops.ops.transport import publish_kernel
from strictops.ops.transport import leases
from strictops.ops.transport import cuda_stream as _cuda_stream
from strictops.ops._runtime import host_path

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIMS = contract.Dims(memory_size=1000, max_inflight_slices=7, consumer_count=2,
                     src_shape=(3, 5))
ALIGN = contract.DATA_ALIGNMENT


def _message_on_fake(rule: str) -> str:
    return near_miss_message(copy_and_publish, contract, rule, DIMS)


class TestMessages(expecttest.TestCase):
    """Every rule of the op on fake CUDA tensors, and the runtime's own messages, pinned."""

    def test_src_cuda(self):
        self.assertExpectedInline(_message_on_fake("src_cuda"), """copy_and_publish requires a CUDA tensor""")

    def test_src_nonempty(self):
        self.assertExpectedInline(_message_on_fake("src_nonempty"), """copy_and_publish cannot transport an empty tensor""")

    def test_src_contiguous(self):
        self.assertExpectedInline(_message_on_fake("src_contiguous"), """copy_and_publish source must be contiguous; got shape=(3, 5) strides=(10, 2)""")

    @unittest.skipIf(HAS_CUDA and not HAS_TWO_GPUS, "a real single-GPU machine has no cuda:1")
    def test_same_device(self):
        self.assertExpectedInline(_message_on_fake("same_device"), """copy_and_publish pool and source must be on the same device. pool.device=device(type='cuda', index=1) src.device=device(type='cuda', index=0)""")

    def test_pool_format(self):
        self.assertExpectedInline(_message_on_fake("pool_format"), """copy_and_publish pool must be a contiguous 1-D uint8 tensor; got dtype=torch.int8 shape=(1000,) strides=(1,)""")

    def test_pool_aligned(self):
        self.assertExpectedInline(_message_on_fake("pool_aligned"), """copy_and_publish pool must start 256-byte aligned in its storage; got storage_offset=4""")

    def test_slots_positive(self):
        self.assertExpectedInline(_message_on_fake("slots_positive"), """max_inflight_slices must be positive, got 0""")

    def test_consumers_positive(self):
        self.assertExpectedInline(_message_on_fake("consumers_positive"), """consumer_count must be positive, got -1""")

    def test_pool_size(self):
        self.assertExpectedInline(_message_on_fake("pool_size"), """copy_and_publish pool is too small after control metadata: pool=256, control=256""")

    def test_src_fits(self):
        self.assertExpectedInline(_message_on_fake("src_fits"), """copy_and_publish source of 745 bytes does not fit the pool's data region of 744 bytes""")

    def test_lease_format(self):
        self.assertExpectedInline(_message_on_fake("lease_format"), """copy_and_publish lease must be int64 with shape (7,), got (7,)/torch.int32""")

    def test_lease_device(self):
        self.assertExpectedInline(_message_on_fake("lease_device"), """copy_and_publish lease must be on the pool's device cuda:0, got cpu""")

    def test_lease_contiguous(self):
        self.assertExpectedInline(_message_on_fake("lease_contiguous"), """copy_and_publish lease must be contiguous""")

    def test_state_format(self):
        self.assertExpectedInline(_message_on_fake("state_format"), """copy_and_publish state must be int32 with shape (2,), got (3,)/torch.int32""")

    def test_state_device(self):
        self.assertExpectedInline(_message_on_fake("state_device"), """copy_and_publish state must be on the pool's device cuda:0, got cpu""")

    def test_state_contiguous(self):
        self.assertExpectedInline(_message_on_fake("state_contiguous"), """copy_and_publish state must be contiguous""")

    def test_consumers_known(self):
        self.assertExpectedInline(_message_on_fake("consumers_known"), """copy_and_publish consumers must be one of ('peers', 'same_device'), got 'other_gpus'""")

    def test_every_rule_has_a_pinned_message(self):
        assert_every_rule_pinned(self, contract)  # near misses: tests/test_registry.py

    def test_copy_tensor_source_checks_carry_the_pool_name(self):
        """``copy_tensor`` runs the op's source rules under the transport's name (the
        original's messages), before it leases anything."""
        spec = contract.valid_spec(DIMS)
        messages = []
        with fake_mode():
            for broken in ("src_cuda", "src_nonempty"):
                args = build(contract.NEAR_MISSES[broken](spec))
                args.pop("lease"), args.pop("state")
                err = raised(contract.SOURCE.validate, **args, name="CUDA IPC")
                self.assertIs(type(err), ValueError)
                messages.append(str(err))
        self.assertExpectedInline("\n".join(messages), """\
CUDA IPC requires a CUDA tensor
CUDA IPC cannot transport an empty tensor""")

    def test_pool_too_small_is_refused_before_any_allocation(self):
        err = raised(TransportPool, memory_size=600, max_inflight_slices=64, consumer_count=2)
        self.assertIs(type(err), ValueError)
        self.assertExpectedInline(str(err), """CUDA IPC pool is too small after control metadata: pool=600, control=768""")

    def test_pool_arguments(self):
        self.assertExpectedInline(str(raised(TransportPool, memory_size=0)), """memory_size must be positive""")
        self.assertExpectedInline(str(raised(TransportPool, memory_size=1 << 20, consumers="gpu")), """CUDA IPC consumers must be one of ('peers', 'same_device'), got 'gpu'""")
        self.assertExpectedInline(
            str(raised(TransportPool, memory_size=1 << 20, recycle_interval=0.0)), """recycle_interval must be positive""")
        self.assertExpectedInline(
            str(raised(TransportPool, memory_size=1 << 20, consumer_count=0)), """consumer_count must be positive, got 0""")

    def test_inactive_lease(self):
        alloc = leases.LeaseAllocator(4096, 2, 1, "CUDA IPC")
        lease = alloc.allocate(10)
        alloc.release(lease)
        self.assertExpectedInline(str(raised(alloc.release, lease=lease)), """Cannot release inactive CUDA IPC pool lease (slot=0, generation=1)""")
        self.assertExpectedInline(str(raised(alloc.require_active, lease=lease,
                                              action="cancel")), """Cannot cancel inactive CUDA IPC pool lease (slot=0, generation=1)""")

    def test_generation_exhausted_changes_nothing(self):
        alloc = leases.LeaseAllocator(4096, 2, 1, "CUDA IPC")
        alloc._generations[0] = contract.MAX_GENERATION  # slot 0 is next to be leased
        free = alloc.free_ranges
        err = raised(alloc.allocate, nbytes=10)
        self.assertIs(type(err), RuntimeError)
        self.assertExpectedInline(str(err), """CUDA IPC pool slot generation exhausted""")
        self.assertEqual((alloc.free_ranges, alloc.active), (free, ()))
        self.assertEqual(alloc.generation(0), contract.MAX_GENERATION)

    def test_consumer_refuses_a_lease_that_does_not_fit_its_pool(self):
        pool = torch.zeros(4096, dtype=torch.uint8)  # the host-side check needs no GPU
        consumer = TransportConsumer(pool, rank=1, max_inflight_slices=4, consumer_count=2)
        good = contract.Lease(256, 512, 200, 3, 9, 36, 40)
        self.assertEqual(consumer.view(good, torch.uint8, (200,)).data_ptr(),
                         pool.data_ptr() + 256)
        self.assertExpectedInline(str(raised(consumer.view, lease=good._replace(end=8192),
                                              dtype=torch.uint8, shape=(200,))), """CUDA IPC lease does not fit this pool: (256, 8192, 200, 3, 9, 36, 40)""")
        self.assertExpectedInline(
            str(raised(TransportConsumer, pool=pool, rank=2, max_inflight_slices=4,
                        consumer_count=2)), """CUDA IPC consumer rank 2 is outside [0, 2)""")

    def test_stream_ops_without_cuda_bindings_say_how_to_install_them(self):
        saved = sys.modules.get("cuda.bindings", "absent")
        sys.modules["cuda.bindings"] = None  # makes the import fail whatever is installed
        _cuda_stream._driver.cache_clear()
        try:
            err = raised(_cuda_stream._driver)
        finally:
            if saved == "absent":
                del sys.modules["cuda.bindings"]
            else:
                sys.modules["cuda.bindings"] = saved
            _cuda_stream._driver.cache_clear()
        self.assertIs(type(err), ImportError)
        self.assertExpectedInline(str(err), """stream-ordered waits and writes need cuda-bindings: pip install 'strictops[cuda]'""")


@settings(SETTINGS, max_examples=examples(30))
@given(dims=calls_of.dims())
def test_valid_calls_pass_the_contract(dims):
    with fake_mode():
        contract.validate(**build(contract.valid_spec(dims)))


# --------------------------------------------------------------------------------------------
# The eager path's errors: the dispatcher skipped, the contract's verdict cached per signature


def _no_launch(*args, **kwargs):
    raise AssertionError("a call the contract refuses reached the launcher")


@pytest.mark.parametrize("rule", contract.CONTRACT.rules)
def test_eager_path_raises_each_rule_as_the_contract(monkeypatch, rule):
    """The plain eager path (``_eager``: the cached verdict, then the cached launch), on the
    near miss of ``rule`` (fake CUDA tensors) after the valid call's signature has passed,
    raises the rule's error as the contract and the dispatcher path do, on every call (a
    failure is never cached), and launches nothing."""
    monkeypatch.setattr(op, "_LAUNCHER", _no_launch)
    spec = contract.valid_spec(DIMS)
    with fake_mode():
        valid = build(spec)
        op._VALIDATION(*(valid[name] for name in op._VALIDATION.names))
        args = build(contract.NEAR_MISSES[rule](spec))
        if contract.CONTRACT.broken_rule(**args) != rule:
            pytest.skip("the near miss names a GPU this machine lacks")
        expected = contract.CONTRACT.expected_error(rule, **args)
        for call in (op._eager, op._eager, copy_and_publish):  # the last: the dispatcher's
            err = raised(call, **args)
            assert (type(err), str(err)) == expected


def test_plain_eager_call_on_cpu_tensors_raises_the_contract_error(monkeypatch):
    """Real CPU tensors in plain eager mode: the public call takes the eager path (no plan
    serves it) and raises the contract's first rule, as the dispatcher path does."""
    eager, calls = op._eager, []
    monkeypatch.setattr(op, "_eager", lambda *args: calls.append(args) or eager(*args))
    args = build(contract.valid_spec(dataclasses.replace(DIMS, device="cpu")))
    for _ in range(2):
        err = raised(copy_and_publish, **args)
        assert (type(err), str(err)) == (ValueError, "copy_and_publish requires a CUDA tensor")
    assert len(calls) == 2
    err = raised(torch.ops.strictops.copy_and_publish, **args)
    assert (type(err), str(err)) == (ValueError, "copy_and_publish requires a CUDA tensor")


class _StandInLauncher:
    """Records eager launches; offers no compiled kernel, so no C++ plan is made."""

    def __init__(self):
        self.launches = []

    def __call__(self, grid, args, options, device):
        self.launches.append(args)

    def prepared_for(self, args, options, device):
        return None


# The rules a near miss breaks on real CPU tensors (the others name a CUDA device).
CPU_RULES = [r for r in contract.CONTRACT.rules
             if r not in ("src_cuda", "same_device", "lease_device", "state_device")]


@pytest.mark.parametrize("rule", CPU_RULES)
def test_plain_eager_call_after_a_cached_verdict_raises_the_contract_error(monkeypatch, rule):
    """Real CPU tensors, the contract without its CUDA rule standing in for it: a valid call
    passes and launches, the next is served by the cached verdict, and then the near miss of
    ``rule`` raises the contract's error through the public call's plain eager path, launching
    nothing."""
    from strictops.meta._contract import CachedValidation, Contract
    from strictops.ops._runtime.host_path import HostPath
    stand_in = Contract(contract.CONTRACT.op, "stand_in",
                        tuple(c for c in contract.CHECKS if c.rule != "src_cuda"))
    validation = CachedValidation(stand_in, op._VALIDATION.names)
    host = HostPath(validation, writes=("pool", "state"), names=op._HOST.names)
    launcher = _StandInLauncher()
    for name, value in (("_VALIDATION", validation), ("_HOST", host), ("_HOST_CALL", host.call),
                        ("_LAUNCHER", launcher)):
        monkeypatch.setattr(op, name, value)
    spec = contract.valid_spec(dataclasses.replace(DIMS, device="cpu"))
    valid = build(spec)
    for _ in range(2):
        copy_and_publish(**valid)
    assert len(launcher.launches) == 2 and len(validation.passed) == 1
    args = build(contract.NEAR_MISSES[rule](spec))
    assert stand_in.broken_rule(**args) == rule
    err = raised(copy_and_publish, **args)
    assert (type(err), str(err)) == contract.CONTRACT.expected_error(rule, **args)
    assert len(launcher.launches) == 2


# --------------------------------------------------------------------------------------------
# The kernel, interpreted


def _fill(dims: contract.Dims, gen: torch.Generator) -> dict:
    """Real CPU tensors for ``dims``: random pool bytes, random source, zero state."""
    pool = torch.randint(0, 256, (dims.memory_size,), generator=gen, dtype=torch.uint8)
    src = torch.randint(0, 256, (*dims.src_shape, dims.src_dtype.itemsize), generator=gen,
                        dtype=torch.uint8)
    src = src.view(dims.src_dtype).view(dims.src_shape)
    if dims.src_dtype == torch.bool:
        src = src & True  # only 0/1 are valid bools; the kernel moves bytes either way
    return {"pool": pool, "src": src, "state": op.new_state("cpu"),
            "max_inflight_slices": dims.max_inflight_slices,
            "consumer_count": dims.consumer_count}


@settings(SETTINGS, max_examples=examples(200))
@given(data=st.data())
def test_interpreted_kernel_equals_reference_for_any_lease(data):
    """Any lease values, from a tensor or as arguments: the kernel writes exactly what the
    reference writes (a fitting lease: its bytes and its ready word; any other: nothing, and
    the error word counts it), and leaves the arrival counter at 0."""
    dims = data.draw(calls_of.dims(device="cpu"))
    args = _fill(dims, torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    lease = data.draw(calls_of.lease(dims))
    as_tensor = data.draw(st.booleans())
    args["lease"] = torch.tensor(lease, dtype=torch.int64) if as_tensor else lease
    tuning = {"block_bytes": data.draw(st.sampled_from([16, 64, 256])),
              "two_launches": data.draw(st.booleans())}
    reverse = data.draw(st.booleans())
    pool, state = op.reference(**args)
    src_before = args["src"].reshape(-1).view(torch.uint8).clone()  # bytes: NaN != NaN
    op.launch_interpreted(**args, reverse_programs=reverse, **tuning)
    assert torch.equal(args["pool"], pool)
    assert torch.equal(args["state"], state)
    assert args["state"][contract.ARRIVALS] == 0
    assert torch.equal(args["src"].reshape(-1).view(torch.uint8), src_before)


def test_interpreted_publish_writes_the_range_and_then_the_flag_of_its_slot():
    """A worked case: the bytes land in the lease's range, the generation in the slot's
    ready word, and nothing else changes; a second publish reuses the state."""
    dims = contract.Dims(memory_size=2048, max_inflight_slices=3, consumer_count=2,
                         src_shape=(100,))
    args = _fill(dims, torch.Generator().manual_seed(0))
    before = args["pool"].clone()
    lease = contract.Lease(512, 1024, 397, 2, 77, 24, 28)
    args["lease"] = torch.tensor(lease)
    op.launch_interpreted(**args, block_bytes=64)
    pool = args["pool"]
    assert torch.equal(pool[512:909], args["src"].view(torch.uint8)[:397])
    assert pool[24:28].view(torch.int32).item() == 77
    changed = (pool != before).nonzero().flatten()
    assert changed.min() >= 24 and not ((changed >= 28) & (changed < 512)).any()
    assert changed.max() < 909
    args["lease"] = torch.tensor(lease._replace(generation=78))
    op.launch_interpreted(**args, block_bytes=64)
    assert pool[24:28].view(torch.int32).item() == 78
    assert args["state"].tolist() == [0, 0]


@pytest.mark.parametrize("two_launches", [False, True])
@pytest.mark.parametrize("reverse_programs", [False, True])
def test_interpreted_flag_is_written_only_after_every_byte(monkeypatch, reverse_programs,
                                                           two_launches):
    """The interpreter runs programs one at a time; at the start of each, and at the end, the
    ready word may hold the generation only if every byte of the lease is already there. With
    two launches the copy kernel writes the whole blocks only, the flag's program the partial
    last one (then the flag)."""
    from triton.runtime.interpreter import interpreter_builder

    dims = contract.Dims(memory_size=2048, max_inflight_slices=3, consumer_count=2,
                         src_shape=(400,), src_dtype=torch.uint8)
    args = _fill(dims, torch.Generator().manual_seed(2))
    args["pool"][:256] = 0
    lease = contract.Lease(512, 1024, 397, 1, 5, 12, 16)
    args["lease"] = torch.tensor(lease)
    seen = []

    def snapshot():
        flag = args["pool"][12:16].view(torch.int32).item()
        whole = torch.equal(args["pool"][512:896], args["src"][:384])  # 6 blocks of 64
        seen.append((flag, whole, torch.equal(args["pool"][512:909], args["src"][:397])))

    set_grid_idx = interpreter_builder.set_grid_idx
    atomic_rmw = interpreter_builder.create_atomic_rmw
    around_atomics = []  # also within a program: before and after each atomic (the flag's)

    def recording_set_grid_idx(x, y, z):
        snapshot()
        set_grid_idx(x, y, z)

    def recording_atomic_rmw(*a, **k):
        snapshot()
        result = atomic_rmw(*a, **k)
        snapshot()
        around_atomics.extend([seen.pop(), seen.pop()])
        return result

    monkeypatch.setattr(interpreter_builder, "set_grid_idx", recording_set_grid_idx)
    monkeypatch.setattr(interpreter_builder, "create_atomic_rmw", recording_atomic_rmw)
    op.launch_interpreted(**args, reverse_programs=reverse_programs, block_bytes=64,
                          two_launches=two_launches)
    snapshot()
    # One launch: 7 copying programs (cdiv(400, 64)); two: 6 (the whole source blocks,
    # 400 // 64) and the flag's own. A snapshot before each, and one at the end.
    assert len(seen) == 8 and seen[-1] == (5, True, True)
    assert any(flag == 5 for flag, _, _ in around_atomics)  # the flag is an atomic
    assert all(complete for flag, _, complete in seen + around_atomics if flag == 5), (
        seen, around_atomics)
    assert seen[-2 - two_launches][::2] == (0, False)  # before the last copying program
    if two_launches:
        assert seen[-2] == (0, True, False), seen  # whole blocks in place; tail, flag not yet


@pytest.mark.parametrize("as_tensor", [True, False], ids=["lease_tensor", "lease_args"])
@pytest.mark.parametrize("block_bytes", [16, 256])
@pytest.mark.parametrize("nbytes,extra", [
    (1, 0), (15, 0), (16, 0), (17, 3), (255, 0), (256, 0), (257, 0), (3 * 256 + 1, 0),
    (3 * 256 + 16 * 5, 0), (3 * 256 + 200, 0), (3 * 256 + 200, 56), (3 * 256 + 200, 600),
    (4 * 256 - 1, 1), (4 * 256 - 1, 257), (5 * 256, 13)])
def test_interpreted_two_launches_copy_the_partial_last_block(nbytes, extra, block_bytes,
                                                             as_tensor):
    """Two launches, lease ``nbytes`` short of the source by ``extra``: every whole block
    from the copy kernel, the partial last one (its 16-byte vectors, then its last bytes) from
    the flag's program, which also counts a lease that does not fit (once)."""
    dims = contract.Dims(memory_size=4096, max_inflight_slices=3, consumer_count=2,
                         src_shape=(nbytes + extra,), src_dtype=torch.uint8)
    args = _fill(dims, torch.Generator().manual_seed(nbytes + extra))
    lease = contract.Lease(512, 512 + -(-nbytes // ALIGN) * ALIGN, nbytes, 2, 77, 24, 28)
    for case in (lease, lease._replace(generation=0)):
        args["lease"] = torch.tensor(case) if as_tensor else case
        pool, state = op.reference(**args)
        op.launch_interpreted(**args, block_bytes=block_bytes, two_launches=True)
        assert torch.equal(args["pool"], pool), (args["pool"] != pool).nonzero().flatten()
        assert torch.equal(args["state"], state)
    assert args["state"].tolist() == [0, 1]


class _RecordingKernel:
    """Stands in for the JIT kernel: records each launch's grid, arguments and options."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, args, kwargs))


@pytest.mark.parametrize("capability", [(8, 0), (9, 0), (10, 0)])
@pytest.mark.parametrize("real", [True, False], ids=["jit_kernel", "wrapped_kernel"])
@pytest.mark.parametrize("two_launches", [False, True], ids=["one_launch", "two_launches"])
def test_launch_passes_every_kernel_parameter_and_pdl_only_when_real(monkeypatch, two_launches,
                                                                     real, capability):
    """Every launch names each of the kernel's parameters (Inductor's mutation analysis of a
    wrapped kernel takes no default, and failed on the GPU when the new ones were left to
    their defaults), and the flag launch is a programmatic dependent launch only for the JIT
    kernel launched for real, two launches, on sm_90 or later: ``wrap_triton`` takes no
    ``launch_pdl``. ``PTX`` (the flag as an inline-PTX release store) likewise only for the JIT
    kernel: Inductor's mutation analysis takes non-pure inline asm to write every argument
    (and would copy ``src`` and ``lease`` on each call), and the interpreter runs no PTX."""
    recorder = _RecordingKernel()
    if real:
        monkeypatch.setattr(op, "_publish_kernel", recorder)
    monkeypatch.setattr(op, "_has_pdl", lambda index: capability >= (9, 0))
    args = _fill(contract.Dims(memory_size=4096, max_inflight_slices=3, consumer_count=2,
                               src_shape=(1000,), src_dtype=torch.uint8),
                 torch.Generator().manual_seed(0))
    lease = torch.tensor(contract.Lease(512, 1536, 1000, 2, 77, 24, 28))
    op._launch(recorder, args["pool"], args["src"], lease, args["state"], 3, 2, block_bytes=256,
               two_launches=two_launches)
    pdl = real and two_launches and capability >= (9, 0)
    options = {"num_warps", "launch_pdl"}
    assert [grid for grid, _, _ in recorder.launches] == ([(3,), (1,)] if two_launches
                                                          else [(4,)])
    for i, (_, positional, kwargs) in enumerate(recorder.launches):
        names = _KERNEL_PARAMS[:len(positional)] + [k for k in kwargs if k not in options]
        assert sorted(names) == sorted(_KERNEL_PARAMS)
        assert kwargs["PDL"] is pdl
        assert kwargs["PTX"] is real
        assert kwargs["SYSTEM"] is True  # the default placement: peers
        assert kwargs.get("launch_pdl", False) is (pdl and i == 1)  # the flag launch only


@pytest.mark.parametrize("nbytes, launches", [
    (1024, [((8,), 128, 1)]),                      # at two_launches_above: one launch
    (1040, [((4,), 256, 2), ((1,), 256, 1)]),      # above: two, the "two_launches" shape
    (2048, [((8,), 256, 2), ((1,), 256, 1)]),      # at large_above: still that shape
    (2064, [((32,), 64, 4), ((1,), 64, 1)]),       # above: the "large" shape
])
def test_launch_shape_follows_the_source_size(monkeypatch, nbytes, launches):
    """``TUNING`` picks one launch or two, and the copy's shape, from the source's size, with
    both thresholds inclusive (here scaled down, so the shapes are told apart: block bytes
    and warps per launch)."""
    monkeypatch.setattr(op, "TUNING", {
        "one_launch": {"block_bytes": 128, "num_warps": 1},
        "two_launches": {"block_bytes": 256, "num_warps": 2, "flag_num_warps": 1, "pdl": False},
        "two_launches_above": 1024,
        "large": {"block_bytes": 64, "num_warps": 4},
        "large_above": 2048})
    recorder = _RecordingKernel()
    pool = torch.zeros(4096, dtype=torch.uint8)
    src = torch.zeros(nbytes, dtype=torch.uint8)
    lease = torch.tensor(contract.Lease(512, 512 + nbytes, nbytes, 0, 1, 0, 4))
    op._launch(recorder, pool, src, lease, op.new_state("cpu"), 1, 1)
    assert [(grid, kwargs["BLOCK"], kwargs["num_warps"])
            for grid, _, kwargs in recorder.launches] == launches


def test_kernel_constants_are_local_and_match_the_layout():
    """The kernel defines its constants in its body, with the values of KERNEL_CONSTANTS (the
    layout of strictops.meta), and reads no global constant: Triton compares every global
    constant a kernel reads with its compile-time value on each launch, on the host."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(op._publish_kernel.fn)))
    local = {node.target.id: ast.literal_eval(node.value) for node in ast.walk(tree)
             if isinstance(node, ast.AnnAssign) and ast.unparse(node.annotation) == "tl.constexpr"}
    assert local == publish_kernel.KERNEL_CONSTANTS
    op._publish_kernel.cache_key  # noqa: B018 (computes the kernel's dependencies)
    assert not op._publish_kernel.used_global_vals


@pytest.mark.parametrize("consumers", contract.CONSUMER_PLACES)
@pytest.mark.parametrize("nbytes", [1000, (16 << 20) + 1], ids=["one_launch", "two_launches"])
def test_eager_launcher_passes_the_flag_scope(monkeypatch, consumers, nbytes):
    """The pool's eager publish (the cached launcher) launches with the placement's scope: the
    kernel's last parameter, ``SYSTEM``, in every launch."""
    launches = []
    monkeypatch.setattr(op, "_LAUNCHER", lambda grid, args, options, device: launches.append(args))
    monkeypatch.setattr(op, "_has_pdl", lambda index: True)
    pool = torch.zeros(4096, dtype=torch.uint8)
    src = torch.zeros(nbytes, dtype=torch.uint8)
    lease = contract.Lease(512, 1536, 1000, 2, 77, 24, 28)
    state = op.new_state("cpu")
    op.launch_eager(pool, src, state, state, 3, 2, lease, consumers)
    assert len(launches) == (1 if nbytes == 1000 else 2)
    assert _KERNEL_PARAMS[-1] == "SYSTEM"
    assert all(args[-1] is contract.system_scope(consumers) for args in launches)


def _sm90_ptx(**constexprs) -> str:
    """The publish kernel's PTX for sm_90, compiled without a GPU."""
    import triton
    from triton.backends.compiler import GPUTarget

    ints = {"memory_size": "i64", "src_nbytes": "i64", "data_start": "i64", "slot_bytes": "i64",
            "n_slots": "i64", **{f"{f}_arg": "i64" for f in ("start", "end", "nbytes", "slot",
                                                              "generation", "ready", "ack")}}
    signature = {"pool_ptr": "*u8", "src_ptr": "*u8", "lease_ptr": "*i64", "state_ptr": "*i32",
                 **ints, **dict.fromkeys(constexprs, "constexpr")}
    assert list(signature) == _KERNEL_PARAMS
    source = triton.compiler.ASTSource(fn=op._publish_kernel, signature=signature,
                                       constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


@pytest.mark.parametrize("phase", [op.PHASE_BOTH, op.PHASE_FLAG], ids=["one_launch", "flag_launch"])
@pytest.mark.parametrize("ptx", [True, False], ids=["inline_ptx", "exchange"])
@pytest.mark.parametrize("consumers", contract.CONSUMER_PLACES)
def test_flag_release_scope_in_sm90_ptx(consumers, ptx, phase):
    """The flag's release has the consumers' scope in the PTX: system scope for ``"peers"``
    (a consumer on another GPU waits for the word and then reads the bytes over its peer
    mapping), GPU scope for ``"same_device"``, whether it is the real launch's inline release
    store or the release exchange of Inductor's wrapped kernel; no flag write of the other
    scope. The arrivals of the one-launch path stay at GPU scope (every program is on the
    pool's GPU); the copy phase writes no flag."""
    scope, other = ("sys", "gpu") if consumers == "peers" else ("gpu", "sys")
    meta = dict(LEASE_FROM_PTR=True, BLOCK=4096, PHASE=phase, PDL=phase == op.PHASE_FLAG,
                PTX=ptx, SYSTEM=contract.system_scope(consumers))
    text = _sm90_ptx(**meta)
    flag = (f"st.release.{scope}.global.b32" if ptx
            else f"atom.global.{scope}.release.exch.b32")
    assert text.count(flag) == 1, text
    for wrong in (f"st.release.{other}.", f"atom.global.{other}.release.exch",
                  "st.release.cta.", "st.relaxed."):
        assert wrong not in text
    # The arrival: Triton's atomic, or the inline PTX of a real launch (operand order differs).
    arrival = re.search(r"atom\.(global\.gpu\.acq_rel|acq_rel\.gpu\.global)\.add", text)
    assert (arrival is not None) == (phase == op.PHASE_BOTH)
    copy_only = _sm90_ptx(**{**meta, "PHASE": op.PHASE_COPY})
    assert "release" not in copy_only and "atom." not in copy_only


def test_launch_refuses_an_unknown_tuning_key():
    args = _fill(contract.Dims(memory_size=4096, max_inflight_slices=3, consumer_count=2,
                               src_shape=(1000,), src_dtype=torch.uint8),
                 torch.Generator().manual_seed(0))
    lease = torch.tensor(contract.Lease(512, 1536, 1000, 2, 77, 24, 28))
    with pytest.raises(TypeError, match=r"unknown tuning keys \['num_warp'\]"):
        op.launch_interpreted(**args, lease=lease, num_warp=8)


_KERNEL_PARAMS = list(op._publish_kernel.arg_names)  # before any test patches the kernel


# Each breaks one term of lease_fits for Lease(512, 1024, 397, 2, 77, 24, 28) in a 2048-byte
# pool with 3 slots of 2 consumers (data from 256) and a 400-byte source.
REFUSED = [
    {"start": 528},  # misaligned
    {"start": 0, "end": 512},  # in the control words
    {"end": 511},  # before start
    {"end": 2304},  # past the pool
    {"end": 768},  # shorter than nbytes
    {"nbytes": 0},
    {"nbytes": 401, "end": 1024},  # more than the source holds
    {"slot": 3},  # past the last slot
    {"slot": -1, "ready_byte_offset": -12, "ack_byte_offset": -8},
    {"ready_byte_offset": 28, "ack_byte_offset": 32},  # an ack word, not the slot's ready word
    {"ack_byte_offset": 32},
    {"generation": 0},
    {"generation": 2**31},
]


@pytest.mark.parametrize("change", REFUSED,
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_interpreted_refused_lease_touches_nothing_and_is_counted(change):
    dims = contract.Dims(memory_size=2048, max_inflight_slices=3, consumer_count=2,
                         src_shape=(100,))
    args = _fill(dims, torch.Generator().manual_seed(1))
    before = args["pool"].clone()
    lease = contract.Lease(512, 1024, 397, 2, 77, 24, 28)
    assert contract.lease_fits(lease, 2048, 3, 2, 400)
    assert not contract.lease_fits(lease._replace(**change), 2048, 3, 2, 400)
    args["lease"] = torch.tensor(lease._replace(**change))
    for count in (1, 2):
        op.launch_interpreted(**args, block_bytes=64)
        assert torch.equal(args["pool"], before)
        assert args["state"].tolist() == [0, count]


# --------------------------------------------------------------------------------------------
# GPU

IPC_DRIVER = Path(__file__).with_name("gpu_transport_ipc.py")


def _pool(memory_size=1 << 20, **kwargs) -> TransportPool:
    kwargs.setdefault("recycle_interval", None)
    return TransportPool(memory_size, device="cuda:0", max_inflight_slices=16, **kwargs)


@gpu
def test_gpu_copy_tensor_messages_carry_the_pool_name():
    pool = _pool()
    try:
        for tensor, message in [(torch.ones(3), "CUDA IPC requires a CUDA tensor"),
                                (torch.ones(0, device="cuda"),
                                 "CUDA IPC cannot transport an empty tensor")]:
            with pytest.raises(ValueError) as info:
                pool.copy_tensor(tensor)
            assert str(info.value) == message
        assert pool.active_lease_count == 0
    finally:
        pool.shutdown()


@gpu
@settings(SETTINGS, max_examples=examples(40))
@given(data=st.data())
def test_gpu_op_equals_reference_for_any_lease(data):
    dims = data.draw(calls_of.dims(device="cuda:0", max_data=1 << 16))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    args = {k: (v.to("cuda:0") if isinstance(v, torch.Tensor) else v)
            for k, v in _fill(dims, gen).items()}
    args["lease"] = torch.tensor(data.draw(calls_of.lease(dims)), device="cuda:0")
    pool, state = op.reference(**args)
    copy_and_publish(**args)
    assert torch.equal(args["pool"], pool) and torch.equal(args["state"], state)


@gpu
@pytest.mark.parametrize("nbytes", [1000, 64 << 10, (3 << 20) + 16])
def test_gpu_publish_eager_plan_then_graph_replays(monkeypatch, nbytes):
    """``pool.publish`` eagerly into a new lease tensor each call: the Python path serves the
    first call and plans its signature, the C++ path every later one; each publish writes
    what the reference writes. Then a CUDA graph captured from the same call (at 3 MiB two
    launches, one eagerly; the eager call loaded them) replays into new leases correctly,
    and a bad lease on the planned signature still raises the contract's error."""
    eager, python_calls = op._eager, []
    monkeypatch.setattr(op, "_eager", lambda *a: python_calls.append(a[-1]) or eager(*a))
    pool = _pool(memory_size=contract.data_start(16, 1) + 4 * nbytes + (1 << 16),
                 consumer_count=1)
    try:
        gen = torch.Generator(device="cuda").manual_seed(nbytes)
        src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda", generator=gen)
        state = op.new_state("cuda")

        def publish_checked(publish, lease_t, lease):
            src.random_(0, 256, generator=gen)
            pool_after, state_after = op.reference(pool.tensor, src, lease_t, state, 16, 1)
            publish()
            torch.cuda.synchronize()
            assert torch.equal(pool.tensor, pool_after) and torch.equal(state, state_after)
            ready = pool.tensor[lease.ready_byte_offset:lease.ready_byte_offset + 4]
            assert int(ready.view(torch.int32)) == lease.generation
            pool.release(lease)

        for _ in range(4):
            lease = pool.lease(nbytes)
            lease_t = torch.tensor(lease, device="cuda")
            publish_checked(lambda: pool.publish(src, lease_t, state), lease_t, lease)
        if host_path.available():  # the first call; the C++ path served the others
            assert python_calls == [False]
            assert op._HOST.known(pool.tensor, src, lease_t, state, 16, 1, True) is True
        del python_calls[:]
        graph_lease = torch.zeros_like(lease_t)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            pool.publish(src, graph_lease, state)
        assert python_calls == [True]  # captured through the Python path
        for _ in range(3):
            lease = pool.lease(nbytes)
            graph_lease.copy_(torch.tensor(lease))
            publish_checked(graph.replay, graph_lease, lease)
        assert int(state[contract.ERRORS]) == 0
        with pytest.raises(ValueError, match="lease must be int64 with shape"):
            pool.publish(src, graph_lease.int(), state)
    finally:
        pool.shutdown()


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8, torch.int64])
def test_gpu_publish_wait_receive_acknowledge_recycle(dtype):
    pool = _pool(consumer_count=2)
    consumers = [TransportConsumer.local(pool, rank) for rank in range(2)]
    try:
        src = (torch.randn(1000, 37, device="cuda") * 100).to(dtype)
        lease, view = pool.copy_tensor(src)
        assert lease.nbytes == src.numel() * src.element_size() and lease.start % 256 == 0
        assert torch.equal(view, src.view(-1).view(torch.uint8))
        assert torch.equal(consumers[0].receive(lease, dtype, src.shape), src)
        torch.cuda.synchronize()
        assert pool.recycle() == [] and pool.active_lease_count == 1  # one ack of two
        # The lease as it crosses a process boundary: a plain tuple of its seven ints.
        assert torch.equal(consumers[1].receive(tuple(lease), dtype, src.shape), src)
        torch.cuda.synchronize()
        assert pool.recycle() == [lease] and pool.active_lease_count == 0
        assert pool.error_count() == 0
    finally:
        pool.shutdown()


@gpu
def test_gpu_full_pool_returns_none_and_recovers_after_acknowledgements():
    pool = _pool(memory_size=contract.data_start(16, 1) + 8 * 4096)
    consumer = TransportConsumer.local(pool, 0)
    try:
        leases = []
        while True:
            lease, view = pool.copy_tensor(torch.full((4096,), len(leases), dtype=torch.uint8,
                                                      device="cuda"))
            if lease is None:
                assert view is None
                break
            leases.append(lease)
        assert len(leases) == 8
        assert pool.copy_tensor(torch.ones(1, device="cuda")) == (None, None)  # no range left
        for lease in leases[:3]:
            consumer.receive(lease, torch.uint8, (4096,))
        torch.cuda.synchronize()
        assert sorted(pool.recycle()) == sorted(leases[:3])
        lease, view = pool.copy_tensor(torch.full((3 * 4096,), 200, dtype=torch.uint8,
                                                  device="cuda"))  # the merged range
        assert lease is not None and lease.start == leases[0].start
        assert torch.equal(consumer.receive(lease, torch.uint8, (3 * 4096,)),
                           torch.full((3 * 4096,), 200, dtype=torch.uint8, device="cuda"))
    finally:
        pool.shutdown()


@gpu
def test_gpu_cancel_lease_and_background_recycler():
    pool = _pool(consumer_count=2, recycle_interval=0.001)
    try:
        lease, _ = pool.copy_tensor(torch.ones(100, device="cuda"))
        pool.cancel_lease(lease)
        torch.cuda.synchronize()
        deadline = time.monotonic() + 10
        while pool.active_lease_count and time.monotonic() < deadline:
            time.sleep(0.001)
        assert pool.active_lease_count == 0
        with pytest.raises(RuntimeError, match="Cannot cancel inactive CUDA IPC pool lease"):
            pool.cancel_lease(lease)
    finally:
        pool.shutdown()
    assert not pool._recycler.is_alive()


def _run_ipc_driver(mode: str, transfers: str, devices: tuple[int, ...]) -> None:
    result = run_script([sys.executable, str(IPC_DRIVER), "--mode", mode, "--transfers",
                         transfers, "--consumer-devices", *map(str, devices)], timeout=3000)
    printed = f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert result.returncode == 0, printed
    assert f"{transfers} transfers" in result.stdout and " 0 corrupted, 0 leaked, 0 refused" in (
        result.stdout)


# Transfers per mode (one GPU, two GPUs) and the environment variable that overrides them.
IPC_TRANSFERS = {"transfers": (300, 10_000, "STRICTOPS_IPC_TRANSFERS"),
                 "graph": (300, 2_000, "STRICTOPS_IPC_GRAPH_TRANSFERS"),
                 "stress": (3_000, 20_000, "STRICTOPS_IPC_STRESS_TRANSFERS")}


@gpu
@pytest.mark.parametrize("mode", sorted(IPC_TRANSFERS))
def test_gpu_one_producer_two_consumer_processes_over_ipc(mode):
    """Both consumers on the pool's GPU (``tests/gpu_transport_ipc.py``): random sizes and
    dtypes through a pool too small to hold them all, published eagerly (``transfers``), from
    one replayed CUDA graph (``graph``), or many small ones whose last bytes each consumer
    checks as soon as its wait returns (``stress``): no byte wrong, every lease recycled.
    ``STRICTOPS_IPC_TRANSFERS=10000`` runs 10,000 eager transfers."""
    one_gpu, _, variable = IPC_TRANSFERS[mode]
    _run_ipc_driver(mode, os.environ.get(variable, str(one_gpu)), (0, 0))


@multi_gpu
@pytest.mark.parametrize("mode", sorted(IPC_TRANSFERS))
def test_gpu_consumers_on_the_pool_gpu_and_a_peer_gpu(mode):
    """The pool on ``cuda:0``, one consumer process on ``cuda:0`` and one on ``cuda:1``, which
    maps the pool over NVLink, waits and acknowledges on its own stream and reads over the
    mapping: as above, 10,000 eager transfers by default (the variables scale every mode)."""
    _, two_gpus, variable = IPC_TRANSFERS[mode]
    _run_ipc_driver(mode, os.environ.get(variable, str(two_gpus)), (0, 1))
