"""The transport pool's runtime: the allocator's rules, consumer liveness, wait timeouts, the
sglang-compatible pool API.

CPU (CI): the allocator as a hypothesis state machine (publishes, aborts, acknowledgements
right, stale and of another slot, cancels, dropped consumers, recycles in any order); the
consumer registry in real shared memory, with real processes that end and a zombie; the
watchdog's abort kernel under the Triton interpreter for any ready word and generation, and
the watchdog itself on CPU words; the consumer's host-side refusals (stale lease, dropped rank)
and the pool's argument checks, messages pinned. GPU (``-m gpu``): the same in stream order on
one device, and fault injection with processes (``tests/gpu_transport_faults.py``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
import unittest.mock
from pathlib import Path

import expecttest
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from strictops.meta.transport import pool as contract
from strictops.meta.testing import examples, fake_mode, gpu, multi_gpu, raised, run_script
from strictops.ops import TransportConsumer, TransportPool
from strictops.ops.transport import cuda_stream as _cuda_stream
from strictops.ops.transport import faults
from strictops.ops.transport import peers
from strictops.ops.transport import leases, producer
from strictops.ops._runtime.interpret import interpreted

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALIGN = contract.DATA_ALIGNMENT
FAULTS_DRIVER = Path(__file__).with_name("gpu_transport_faults.py")


# --------------------------------------------------------------------------------------------
# The allocator, against a simulated pool


class AllocatorMachine(RuleBasedStateMachine):
    """Leases, publishes, aborts, acknowledgements (right, stale, of another slot), cancels,
    dropped consumers and recycles in any order.

    ``words`` stands in for the pool's control words, written as the device would: a publish
    writes the ready word, a watchdog's abort writes ``ABORTED`` there before the publish
    lands, each consumer's acknowledgement its ack word, a cancel every ack word.
    """

    @initialize(slots=st.integers(1, 6), consumers=st.integers(1, 3),
                data=st.integers(1, 8 * ALIGN))
    def setup(self, slots, consumers, data):
        self.memory_size = contract.data_start(slots, consumers) + data
        self.alloc = leases.LeaseAllocator(self.memory_size, slots, consumers, "test")
        self.words = [[0] * (1 + consumers) for _ in range(slots)]
        self.consumers = consumers
        self.generations = [0] * slots
        self.dropped: set[int] = set()
        self.acked: dict[contract.Lease, set[int]] = {}  # ranks that acknowledged, per lease
        self.stale: list[contract.Lease] = []

    def _pick(self, data, leases):
        return data.draw(st.sampled_from(sorted(leases)))

    def _unpublished(self):
        return [l for l in self.alloc.active if self.words[l.slot][0] != l.generation]

    @rule(nbytes=st.integers(1, 3 * ALIGN))
    def allocate(self, nbytes):
        size = -(-nbytes // ALIGN) * ALIGN
        fitting = [(end - start, start) for start, end in self.alloc.free_ranges
                   if end - start >= size]
        slot_free = len(self.alloc.active) < len(self.words)
        lease = self.alloc.allocate(nbytes)
        if not (fitting and slot_free):
            assert lease is None
            return
        assert (lease.start, lease.end, lease.nbytes) == (min(fitting)[1], min(fitting)[1] + size,
                                                          nbytes)  # best fit
        assert lease.generation == self.generations[lease.slot] + 1
        self.generations[lease.slot] = lease.generation
        assert lease.ready_byte_offset == lease.slot * contract.slot_bytes(self.consumers)
        self.acked[lease] = set()

    @precondition(lambda self: self._unpublished())
    @rule(data=st.data())
    def publish(self, data):
        lease = self._pick(data, self._unpublished())
        self.words[lease.slot][0] = lease.generation

    @precondition(lambda self: self._unpublished())
    @rule(data=st.data())
    def abort(self, data):
        """A consumer's watchdog gives up on an unpublished lease (its compare-and-swap)."""
        lease = self._pick(data, self._unpublished())
        self.words[lease.slot][0] = faults.ABORTED

    @precondition(lambda self: self.alloc.active)
    @rule(data=st.data())
    def acknowledge(self, data):
        lease = self._pick(data, self.alloc.active)
        rank = data.draw(st.integers(0, self.consumers - 1))
        self.words[lease.slot][1 + rank] = lease.generation
        self.acked[lease].add(rank)

    @precondition(lambda self: self.alloc.active)
    @rule(data=st.data())
    def acknowledge_wrongly(self, data):
        """A consumer writes a stale generation of a live lease's slot, or the generation of a
        live lease into another slot's ack word: neither may free anything."""
        lease = self._pick(data, self.alloc.active)
        rank = data.draw(st.integers(0, self.consumers - 1))
        others = [l for l in self.alloc.active if l.slot != lease.slot]
        if others and data.draw(st.booleans()):
            self.words[data.draw(st.sampled_from(others)).slot][1 + rank] = lease.generation
        else:
            self.words[lease.slot][1 + rank] = lease.generation - data.draw(st.integers(1, 3))
        for l in self.alloc.active:
            # Generations are per slot: a word that happens to hold its own slot's live
            # generation is that lease's acknowledgement; any other value is none.
            if self.words[l.slot][1 + rank] == l.generation:
                self.acked[l].add(rank)
            else:
                self.acked[l].discard(rank)

    @precondition(lambda self: self.alloc.active)
    @rule(data=st.data())
    def cancel(self, data):
        lease = self._pick(data, self.alloc.active)
        self.alloc.require_active(lease, "cancel")
        self.words[lease.slot][1:] = [lease.generation] * self.consumers
        self.acked[lease] = set(range(self.consumers))

    @rule(rank=st.integers(0, 2))
    def drop(self, rank):
        if rank >= self.consumers:
            with pytest.raises(ValueError, match=f"consumer rank {rank} is outside"):
                self.alloc.drop(rank)
            return
        self.alloc.drop(rank)
        self.dropped.add(rank)
        assert self.alloc.dropped == self.dropped

    @rule()
    def recycle(self):
        live = set(range(self.consumers)) - self.dropped
        expected = {l for l in self.alloc.active
                    if self.words[l.slot][0] == l.generation and live <= self.acked[l]}
        done = self.alloc.recycle(self.words)
        assert set(done) == expected
        for lease in done:
            # Nothing freed early: published (not merely aborted), acknowledged by every live
            # consumer with its own generation in its own slot.
            assert self.words[lease.slot][0] == lease.generation
            assert all(self.words[lease.slot][1 + r] == lease.generation for r in live)
        self.stale += done

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def release_stale(self, data):
        lease = self._pick(data, self.stale)
        with pytest.raises(RuntimeError) as info:
            self.alloc.release(lease)
        assert str(info.value) == (f"Cannot release inactive test pool lease "
                                   f"(slot={lease.slot}, generation={lease.generation})")

    @invariant()
    def ranges_are_aligned_disjoint_merged_and_conserved(self):
        if not hasattr(self, "alloc"):
            return
        live = sorted((l.start, l.end) for l in self.alloc.active)
        free = list(self.alloc.free_ranges)
        assert free == sorted(free)
        assert all(a[1] < b[0] for a, b in zip(free, free[1:]))  # merged: never adjacent
        spans = sorted(live + free)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # nothing overlaps
        assert all(s % ALIGN == 0 and s < e for s, e in spans)
        assert all((e - s) % ALIGN == 0 for s, e in live)
        data_start = self.alloc.data_start
        assert sum(e - s for s, e in spans) == self.memory_size - data_start
        assert all(data_start <= s and e <= self.memory_size for s, e in spans)

    @invariant()
    def generations_only_grow_and_leases_are_their_slots(self):
        if not hasattr(self, "alloc"):
            return
        assert [self.alloc.generation(s) for s in range(len(self.words))] == self.generations
        assert all(self.alloc._active[l.slot] is l for l in self.alloc.active)
        assert all(self.alloc.active_lease(l.slot) is l for l in self.alloc.active)


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(SETTINGS, max_examples=examples(150), stateful_step_count=40)


def test_dropping_every_consumer_frees_published_leases_only():
    alloc = leases.LeaseAllocator(contract.data_start(3, 2) + 4 * ALIGN, 3, 2, "test")
    published, unpublished = alloc.allocate(10), alloc.allocate(10)
    words = [[0, 0, 0] for _ in range(3)]
    words[published.slot][0] = published.generation
    words[unpublished.slot][0] = faults.ABORTED
    assert alloc.recycle(words) == []
    alloc.drop(0)
    alloc.drop(1)
    alloc.drop(1)  # idempotent
    assert alloc.recycle(words) == [published] and alloc.active == (unpublished,)


# --------------------------------------------------------------------------------------------
# The consumer registry: real shared memory, real processes


def _attach_in_child(name: str, rank: int, then: str = "") -> str:
    return textwrap.dedent(f"""
        from strictops.ops.transport.faults import ConsumerRegistry
        r = ConsumerRegistry(2, 4, {name!r})
        r.attach({rank}, "CUDA IPC")
        print("attached", flush=True)
        {then}
    """)


class TestRegistry(expecttest.TestCase):

    def setUp(self):
        self.registry = faults.ConsumerRegistry(2, 4)

    def tearDown(self):
        self.registry.unlink()

    def test_a_consumer_that_ends_is_found_dead_and_the_segment_outlives_it(self):
        subprocess.run([sys.executable, "-c", _attach_in_child(self.registry.name, 1)],
                       check=True, timeout=60)
        self.assertNotEqual(self.registry.attached_pid(1), 0)
        self.assertEqual(self.registry.dead_ranks(), [1])
        # the child opened the segment by name: its exit must not have removed it
        again = faults.ConsumerRegistry(2, 4, self.registry.name)
        self.assertEqual(again.attached_pid(1), self.registry.attached_pid(1))

    def test_a_killed_consumer_is_dead_while_still_a_zombie(self):
        child = subprocess.Popen([sys.executable, "-c", _attach_in_child(
            self.registry.name, 0, "import time; time.sleep(600)")], stdout=subprocess.PIPE,
            text=True)
        try:
            self.assertEqual(child.stdout.readline().strip(), "attached")
            self.assertEqual(self.registry.dead_ranks(), [])
            with pytest.raises(RuntimeError, match=f"attached by process {child.pid}"):
                self.registry.attach(0, "CUDA IPC")
            os.kill(child.pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while not self.registry.dead_ranks() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(self.registry.dead_ranks(), [0])  # not reaped yet: a zombie
        finally:
            child.kill()
            child.wait()
        self.registry.attach(0, "CUDA IPC")  # a dead holder does not block a new process

    def test_a_dropped_rank_is_refused_and_not_reported_dead_again(self):
        self.registry.attach(1, "CUDA IPC")
        self.registry.drop(1)
        self.assertEqual(self.registry.dead_ranks(), [])
        self.assertExpectedInline(str(raised(self.registry.attach, rank=1, transport="CUDA IPC")), """CUDA IPC consumer rank 1 was dropped from the pool (its process died or the producer called drop_consumer): a dropped rank is never readmitted; the leases published since are not held for it""")
        result = subprocess.run([sys.executable, "-c", _attach_in_child(self.registry.name, 1)],
                                capture_output=True, text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("consumer rank 1 was dropped from the pool", result.stderr)

    def test_a_segment_of_another_layout_is_refused(self):
        self.assertExpectedInline(str(raised(faults.ConsumerRegistry, consumer_count=3,
                                             max_inflight_slices=4, name=self.registry.name)), f"""shared memory '{self.registry.name}' is not the consumer registry of a pool of 4 slots and 3 consumers""")

    def test_aborts_are_shared(self):
        other = faults.ConsumerRegistry(2, 4, self.registry.name)
        lease = contract.Lease(512, 768, 10, 3, 7, 36, 40)
        epoch = other.abort_epoch
        self.assertFalse(other.aborted(lease))
        self.registry.record_abort(lease)
        self.assertTrue(other.aborted(lease))
        self.assertFalse(other.aborted(lease._replace(generation=8)))
        self.assertNotEqual(other.abort_epoch, epoch)

    def test_process_start(self):
        self.assertIsInstance(faults.process_start(os.getpid()), int)
        self.assertTrue(self.registry.producer_alive())
        self.assertIsNone(faults.process_start(2**22 + 12345))  # past Linux's pid_max

    def test_a_process_that_has_begun_to_exit_is_dead(self):
        """A consumer killed with a CUDA context may take seconds to close its files (the
        driver tears the context down) before it becomes a zombie: the kernel's PF_EXITING
        flag (field 9) marks it as exiting from the start."""
        with open(f"/proc/{os.getpid()}/stat", "rb") as f:
            stat = f.read()
        head, tail = stat[:stat.rindex(b")") + 2], stat[stat.rindex(b")") + 2:].split()
        self.assertEqual(faults._stat_start(stat), int(tail[19]))
        self.assertFalse(int(tail[6]) & faults._PF_EXITING)
        for state, flags in [(b"D", int(tail[6]) | faults._PF_EXITING), (b"Z", 0), (b"X", 0),
                             (b"R", faults._PF_EXITING)]:
            line = head + b" ".join([state, *tail[1:6], str(flags).encode(), *tail[7:]])
            self.assertIsNone(faults._stat_start(line), (state, flags))
        odd = b"12 (a) b (c) " + b" ".join(tail)  # a name with spaces and parentheses
        self.assertEqual(faults._stat_start(odd), int(tail[19]))


# --------------------------------------------------------------------------------------------
# Timeouts: the abort kernel and the watchdog, on CPU words


class _Interpreted:
    """:func:`faults._abort_kernel` through the Triton interpreter, launched as the real one."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            kwargs.pop("num_warps")
            with interpreted(faults._abort_kernel) as kernel:
                kernel[grid](*args, **kwargs)
        return launch


INTERPRETED = _Interpreted()
WORD = st.one_of(st.just(faults.ABORTED), st.just(0), st.integers(-(2**31), 2**31 - 1))
GENERATION = st.integers(1, contract.MAX_GENERATION)


def _lease(slot: int, generation: int, consumers: int = 1) -> contract.Lease:
    ready = slot * contract.slot_bytes(consumers)
    return contract.Lease(4096, 4352, 10, slot, generation, ready, ready + 4)


@settings(SETTINGS, max_examples=examples(60))
@given(cases=st.lists(st.tuples(WORD, GENERATION), min_size=1, max_size=6), abort=st.booleans())
def test_interpreted_abort_kernel_follows_the_cyclic_rule(cases, abort):
    """Per wait: published when the ready word is cyclically at or past the generation (what
    ``cuStreamWaitValue32(GEQ)`` passes on) and not ``ABORTED``; already aborted when it is
    ``ABORTED``; otherwise, with ``abort``, the word becomes ``ABORTED``."""
    words = torch.zeros(len(cases), 2, dtype=torch.int32)  # slots x (ready, ack)
    words[:, 0] = torch.tensor([w for w, _ in cases], dtype=torch.int32)
    words[:, 1] = 77
    leases = [_lease(i, g) for i, (_, g) in enumerate(cases)]
    outcomes = faults.wait_outcomes(words.view(-1), leases, abort, INTERPRETED)
    assert words[:, 1].tolist() == [77] * len(cases)  # ack words untouched
    for (word, generation), outcome, after in zip(cases, outcomes, words[:, 0].tolist()):
        passes = ((word - generation) & 0xFFFFFFFF) < 2**31  # GEQ, cyclic
        if word == faults.ABORTED:
            assert (outcome, after) == (faults.ABORTED_BEFORE, word)
        elif passes:
            assert (outcome, after) == (faults.PUBLISHED, word)
        elif abort:
            assert (outcome, after) == (faults.ABORTED_NOW, faults.ABORTED)
        else:
            assert (outcome, after) == (0, word)


def test_every_generation_passes_the_abort_word():
    """``ABORTED`` releases a GEQ wait for any generation, and is no generation itself."""
    for generation in (1, 2, 12345, contract.MAX_GENERATION - 1, contract.MAX_GENERATION):
        assert ((faults.ABORTED - generation) & 0xFFFFFFFF) < 2**31
        assert not 0 < faults.ABORTED <= contract.MAX_GENERATION


def _wait_until(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.005)
    return predicate()


class TestWatchdog(expecttest.TestCase):

    def setUp(self):
        self.registry = faults.ConsumerRegistry(1, 4)
        self.words = torch.zeros(4 * 2, dtype=torch.int32)  # 4 slots x (ready, ack)
        self.dog = faults.WaitWatchdog(self.words, "CUDA IPC", self.registry, INTERPRETED)

    def tearDown(self):
        self.dog.close()
        self.registry.unlink()

    def test_a_wait_not_published_in_time_is_aborted_and_named(self):
        late, on_time = _lease(1, 3), _lease(2, 5)
        self.words[2 * 2] = 5  # slot 2 published before its deadline
        start = time.monotonic()
        self.dog.arm(late, 0.2)
        self.dog.arm(on_time, 0.1)
        self.dog.arm(_lease(3, 1), math.inf)  # never watched
        self.assertTrue(_wait_until(lambda: self.dog._timed_out))  # recorded after the swap
        self.assertGreaterEqual(time.monotonic() - start, 0.2)
        self.assertEqual(int(self.words[2]), faults.ABORTED)
        self.assertExpectedInline(str(raised(self.dog.raise_timeouts)), """CUDA IPC lease not published in time: (slot=1, generation=3) after 0.2 s; the wait was aborted and the bytes read after it are not the lease's""")
        self.dog.raise_timeouts()  # raised once
        self.assertTrue(self.registry.aborted(late))
        self.assertEqual(int(self.words[4]), 5)

    def test_a_publish_that_lands_first_is_kept(self):
        lease = _lease(0, 9)
        self.dog.arm(lease, 0.05)
        self.words[0] = 9
        time.sleep(0.3)
        self.dog.raise_timeouts()
        self.assertEqual(int(self.words[0]), 9)

    def test_another_consumers_abort_is_found_at_the_next_call(self):
        """Consumer B's wait was released by A's abort, and the late publish then overwrote
        the abort word: B still reports the lease, at its next call, before its deadline."""
        lease = _lease(1, 4)
        self.dog.arm(lease, 600)
        other = faults.ConsumerRegistry(1, 4, self.registry.name)
        other.record_abort(lease)  # A's compare-and-swap won ...
        self.words[2] = 4  # ... and then the publish landed
        with pytest.raises(TimeoutError, match=r"\(slot=1, generation=4\) after 600 s"):
            self.dog.raise_timeouts()

    def test_settle_keeps_pending_waits_and_reports_aborted_ones(self):
        pending, aborted = _lease(0, 2), _lease(1, 2)
        self.dog.arm(pending, 600)
        self.dog.arm(aborted, 600)
        self.words[2] = faults.ABORTED  # by another consumer's watchdog
        self.dog.settle()
        with pytest.raises(TimeoutError, match=r"\(slot=1, generation=2\)"):
            self.dog.raise_timeouts()
        self.assertEqual([e[2] for e in self.dog._pending], [pending])


def test_relax_capture_mode_asks_the_driver_for_the_relaxed_mode():
    calls = []
    modes = type("CUstreamCaptureMode", (), {"CU_STREAM_CAPTURE_MODE_RELAXED": "relaxed"})
    driver = type("driver", (), {
        "CUstreamCaptureMode": modes,
        "CUresult": type("CUresult", (), {"CUDA_SUCCESS": 0}),
        "cuThreadExchangeStreamCaptureMode": staticmethod(
            lambda mode: calls.append(mode) or (0, "global"))})
    with unittest.mock.patch.object(_cuda_stream, "_driver", lambda: driver):
        _cuda_stream.relax_capture_mode()
    assert calls == ["relaxed"]


def test_a_driver_that_hangs_with_children_holding_its_output_is_killed_with_them():
    """The GPU drivers' consumer processes inherit the driver's output pipes: on a hang the
    whole session is killed at the bound (waiting for the pipes would last as long as the
    children), and what the driver printed comes with the failure."""
    script = ("import subprocess, sys, time; print('started', flush=True); "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              "time.sleep(600)")
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"ran past 2 s and was killed; it printed:\nstarted"):
        run_script([sys.executable, "-c", script], timeout=2)
    assert time.monotonic() - start < 30


def _relaxed_first(monkeypatch) -> list:
    """Patches out the device and records ``("relax" | "pass", thread)`` in order."""
    events = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(_cuda_stream, "relax_capture_mode",
                        lambda: events.append(("relax", threading.get_ident())))
    return events


def test_the_recycler_thread_relaxes_its_capture_mode_before_its_first_pass(monkeypatch):
    """A producer captures its publishes in a CUDA graph while the recycler copies the control
    words to the host and waits: in the default global capture mode that call of another
    thread fails and invalidates the capture, unless the recycler's thread is relaxed."""
    events = _relaxed_first(monkeypatch)
    stop = threading.Event()

    def recycle():
        events.append(("pass", threading.get_ident()))
        stop.set()

    pool = types.SimpleNamespace(device=torch.device("cuda", 0), name="CUDA IPC", _stop=stop,
                                 recycle=recycle)
    thread = threading.Thread(target=TransportPool._recycle_loop, args=(pool, 0.001))
    thread.start()
    thread.join(10)
    assert [kind for kind, _ in events] == ["relax", "pass"]
    assert events[0][1] == events[1][1] == thread.ident


def test_a_recycler_whose_capture_mode_cannot_be_relaxed_still_recycles(monkeypatch, caplog):
    """A driver error (not only missing cuda-bindings) while relaxing the capture mode is
    logged, and the recycler's thread goes on to its passes."""
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)

    def refuse():
        raise RuntimeError("cuThreadExchangeStreamCaptureMode failed")

    monkeypatch.setattr(_cuda_stream, "relax_capture_mode", refuse)
    stop = threading.Event()
    pool = types.SimpleNamespace(device=torch.device("cuda", 0), name="CUDA IPC", _stop=stop,
                                 recycle=stop.set)
    thread = threading.Thread(target=TransportPool._recycle_loop, args=(pool, 0.001))
    with caplog.at_level(logging.WARNING):
        thread.start()
        thread.join(10)
    assert stop.is_set()
    assert "CUDA IPC pool recycler: capture mode not relaxed" in caplog.text


def test_the_watchdog_thread_relaxes_its_capture_mode(monkeypatch):
    """The watchdog's thread relaxes its capture mode; its stream is made by the thread that
    makes the watchdog (the one that arms its waits), not by the watchdog's thread: on the H200
    a stream made while a watched wait blocked the consumer's stream waited for that stream."""
    events = _relaxed_first(monkeypatch)
    monkeypatch.setattr(torch.cuda, "Stream",
                        lambda device: events.append(("stream", threading.get_ident())))
    words = types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
    dog = faults.WaitWatchdog(words, "CUDA IPC")
    thread = threading.Thread(target=dog._run)  # nothing armed: relaxes, then ends
    thread.start()
    thread.join(10)
    assert events == [("stream", threading.get_ident()), ("relax", thread.ident)]


def test_default_timeout(monkeypatch):
    monkeypatch.delenv(faults.TIMEOUT_ENV, raising=False)
    assert faults.default_timeout(None) == 60.0
    assert faults.default_timeout(2.5) == 2.5
    monkeypatch.setenv(faults.TIMEOUT_ENV, "7")
    assert faults.default_timeout(None) == 7.0 and faults.default_timeout(3) == 3.0
    monkeypatch.setenv(faults.TIMEOUT_ENV, "soon")
    assert str(raised(faults.default_timeout, configured=None)) == (
        "STRICTOPS_TRANSPORT_TIMEOUT must be a number of seconds, got 'soon'")


# --------------------------------------------------------------------------------------------
# The consumer's and the pool's host-side rules (CPU tensors, stream operations recorded)


@contextlib.contextmanager
def _recorded_stream_ops():
    """The stream operations recorded instead of issued (CPU pools have no stream)."""
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_cuda_stream, "wait_value32", lambda s, a, v, f=_cuda_stream.WAIT_VALUE_EQ:
                   calls.append(("wait", a, v, f)))
        mp.setattr(_cuda_stream, "write_value32", lambda s, a, v: calls.append(("write", a, v)))
        mp.setattr(torch.cuda, "current_stream", lambda device=None: None)
        yield calls


def _cpu_consumer(rank=1, registry=None):
    pool = torch.zeros(4096, dtype=torch.uint8)
    return TransportConsumer(pool, rank=rank, max_inflight_slices=4, consumer_count=2,
                             registry=registry, wait_timeout=math.inf)


class TestConsumerRules(expecttest.TestCase):

    def test_waits_are_cyclic_and_acks_go_to_the_rank_word(self):
        with _recorded_stream_ops() as calls:
            consumer = _cpu_consumer()
            lease = contract.Lease(256, 512, 200, 3, 9, 36, 40)
            consumer.wait(lease)
            consumer.acknowledge(lease)
        base = consumer.base_address
        self.assertEqual(calls, [("wait", base + 36, 9, _cuda_stream.WAIT_VALUE_GEQ),
                                 ("write", base + 44, 9)])

    def test_a_stale_lease_is_refused(self):
        with _recorded_stream_ops():
            consumer = _cpu_consumer()
            lease = contract.Lease(256, 512, 200, 3, 9, 36, 40)
            consumer.receive(lease, torch.uint8, (200,))
            self.assertExpectedInline(str(raised(consumer.wait, lease=lease)), """CUDA IPC lease (slot=3, generation=9) is stale: this consumer acknowledged generation 9 of that slot""")
            self.assertIs(type(raised(consumer.view, lease=lease._replace(generation=8),
                                      dtype=torch.uint8, shape=(200,))), RuntimeError)
            consumer.wait(lease._replace(generation=10))  # the slot's next lease

    def test_a_dropped_consumer_is_refused_and_cannot_attach_again(self):
        registry = faults.ConsumerRegistry(2, 4)
        try:
            pool = torch.zeros(4096, dtype=torch.uint8)
            handle = producer.PoolHandle(lambda: pool, (), 4, 2, "CUDA IPC", registry.name, None)
            consumer = TransportConsumer.attach(handle, 1)
            self.assertEqual(registry.attached_pid(1), os.getpid())
            self.assertEqual(consumer.wait_timeout, faults.default_timeout(None))
            registry.drop(1)
            lease = contract.Lease(256, 512, 200, 3, 9, 36, 40)
            err = raised(consumer.view, lease=lease, dtype=torch.uint8, shape=(200,))
            self.assertIs(type(err), RuntimeError)
            self.assertIn("consumer rank 1 was dropped from the pool", str(err))
            err = raised(TransportConsumer.attach, handle=handle, rank=1)
            self.assertIn("consumer rank 1 was dropped from the pool", str(err))
            TransportConsumer.attach(handle, 0)  # the other rank is unaffected
        finally:
            registry.unlink()


class TestPeerConsumers(expecttest.TestCase):
    """Where a consumer maps the pool: refusals before the rank is taken, and the IPC handle
    opened with the consumer's device as its storage device and current device."""

    def _handle(self, registry, consumers="peers", rebuild=None):
        def refuse(*args):
            raise AssertionError("the handle was opened")
        return producer.PoolHandle(rebuild or refuse, (), 4, 2, "CUDA IPC", registry.name, None,
                                  device=0, consumers=consumers)

    def test_refused_without_peer_access_before_the_rank_is_taken(self):
        registry = faults.ConsumerRegistry(2, 4)
        asked = []
        try:
            with unittest.mock.patch.object(torch.cuda, "can_device_access_peer",
                                            lambda a, b: asked.append((a, b)) or False):
                err = raised(TransportConsumer.attach, handle=self._handle(registry), rank=1,
                             device="cuda:1")
            self.assertIs(type(err), RuntimeError)
            self.assertExpectedInline(str(err), """CUDA IPC consumer on cuda:1 cannot map the pool on cuda:0: no peer access between the two devices (torch.cuda.can_device_access_peer(1, 0) is False)""")
            self.assertEqual(asked, [(1, 0)])
            self.assertEqual(registry.attached_pid(1), 0)
        finally:
            registry.unlink()

    def test_a_same_device_pool_refuses_a_consumer_on_another_device(self):
        registry = faults.ConsumerRegistry(2, 4)
        try:
            with unittest.mock.patch.object(torch.cuda, "can_device_access_peer",
                                            lambda a, b: True):
                err = raised(TransportConsumer.attach,
                             handle=self._handle(registry, consumers="same_device"), rank=0,
                             device=torch.device("cuda", 1))
            self.assertIs(type(err), RuntimeError)
            self.assertExpectedInline(str(err), """CUDA IPC pool on cuda:0 was made with consumers='same_device': its publish orders the bytes before the ready word for its own GPU only, not for a consumer on cuda:1""")
            self.assertEqual(registry.attached_pid(0), 0)
        finally:
            registry.unlink()

    def test_the_handle_is_opened_on_the_consumer_device(self):
        """``reduce_tensor``'s rebuild gets the consumer's device as ``storage_device``, with
        that device current (the IPC handle is opened in its context); a rebuild that returns
        a mapping on another device (torch's per-process cache) is refused."""
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        opened = []
        current = []

        @contextlib.contextmanager
        def device(index):
            current.append(index)
            yield

        @functools.wraps(rebuild_cuda_tensor)  # its signature
        def rebuild(*args):
            bound = inspect.signature(rebuild_cuda_tensor).bind(*args)
            opened.append((bound.arguments["storage_device"], current[-1]))
            return torch.empty(64, dtype=torch.uint8, device=f"cuda:{returned}")

        handle = producer.PoolHandle(rebuild, tuple(range(15)), 4, 2, "CUDA IPC", device=0)
        with fake_mode(), unittest.mock.patch.object(torch.cuda, "device", device):
            returned = 1
            self.assertEqual(peers.open_mapped(handle, 1).device, torch.device("cuda:1"))
            returned = 0
            err = raised(peers.open_mapped, handle=handle, device=1)
        self.assertEqual(opened, [(1, 1), (1, 1)])
        self.assertExpectedInline(str(err), """CUDA IPC pool is already mapped on cuda:0 in this process; a consumer on cuda:1 needs a process of its own""")

    def test_device_index(self):
        self.assertEqual([peers.device_index(d) for d in (1, "cuda:1", torch.device("cuda:2"))],
                         [1, 1, 2])
        self.assertExpectedInline(str(raised(peers.device_index, device="cpu")), """a consumer's device must be a CUDA device, got cpu""")


class TestPoolArguments(expecttest.TestCase):
    """Refused before any allocation, so on CPU."""

    def test_byte_tensor(self):
        cpu = torch.zeros(1 << 20, dtype=torch.uint8)
        self.assertExpectedInline(str(raised(TransportPool, memory_size=4096, byte_tensor=cpu)), """byte_tensor must be a sufficiently large contiguous uint8 tensor on cpu""")

    def test_sglang_keywords_must_agree_with_ours(self):
        self.assertExpectedInline(str(raised(TransportPool, memory_size=4096, name="A", transport_name="B")), """name='A' and transport_name='B' disagree""")
        self.assertExpectedInline(str(raised(TransportPool, memory_size=4096, device="cuda:1", device_id=0)), """device='cuda:1' and device_id=0 disagree""")

    def test_wait_timeout(self):
        self.assertExpectedInline(str(raised(TransportPool, memory_size=4096, wait_timeout=0)), """wait_timeout must be positive, got 0""")


# --------------------------------------------------------------------------------------------
# GPU


def _pool(**kwargs):
    defaults = dict(memory_size=contract.data_start(16, 2) + (1 << 20), device="cuda",
                    consumer_count=2, max_inflight_slices=16, recycle_interval=None)
    return TransportPool(**{**defaults, **kwargs})


@gpu
def test_gpu_pool_over_a_caller_byte_tensor_and_sglang_cancel():
    memory_size = contract.data_start(16, 2) + (1 << 20)
    byte_tensor = torch.empty(memory_size + 4096, dtype=torch.uint8, device="cuda")
    pool = TransportPool(memory_size, byte_tensor=byte_tensor,
                         base_address=byte_tensor.data_ptr(), device_id=0, consumer_count=2,
                         max_inflight_slices=16, recycle_interval=None, transport_name="FABRIC")
    try:
        assert pool.tensor.data_ptr() == byte_tensor.data_ptr()
        assert pool.usable_size == memory_size - contract.data_start(16, 2) == 1 << 20
        src = torch.arange(1000, device="cuda", dtype=torch.int32)
        lease, view = pool.copy_tensor(src)
        assert view.data_ptr() == byte_tensor.data_ptr() + lease.start
        with pytest.raises(RuntimeError, match="^Invalid FABRIC pool lease offsets$"):
            pool.cancel_lease(ready_byte_offset=lease.ready_byte_offset + 4,
                              ack_byte_offset=lease.ack_byte_offset + 4,
                              generation=lease.generation)
        with pytest.raises(RuntimeError, match=r"Cannot cancel inactive FABRIC pool lease "
                                               r"\(slot=0, generation=2\)"):
            pool.cancel_lease(ready_byte_offset=lease.ready_byte_offset,
                              ack_byte_offset=lease.ack_byte_offset, generation=2)
        pool.cancel_lease(ready_byte_offset=lease.ready_byte_offset,
                          ack_byte_offset=lease.ack_byte_offset, generation=lease.generation)
        torch.cuda.synchronize()
        assert pool.recycle() == [lease]
    finally:
        pool.shutdown()


@gpu
def test_gpu_drop_consumer_frees_what_waited_only_for_it():
    pool = _pool()
    readers = [TransportConsumer.local(pool, rank) for rank in range(2)]
    try:
        src = torch.randn(5000, device="cuda")
        first, _ = pool.copy_tensor(src)
        second, _ = pool.copy_tensor(src * 2)
        assert torch.equal(readers[0].receive(first, src.dtype, src.shape), src)
        torch.cuda.synchronize()
        assert pool.recycle() == []
        assert pool.drop_consumer(1) == [first]  # second still waits for rank 0
        assert pool.dropped_consumers == {1}
        with pytest.raises(RuntimeError, match="consumer rank 1 was dropped"):
            readers[1].receive(second, src.dtype, src.shape)
        with pytest.raises(RuntimeError, match="consumer rank 1 was dropped"):
            TransportConsumer.local(pool, 1)
        assert torch.equal(readers[0].receive(second, src.dtype, src.shape), src * 2)
        torch.cuda.synchronize()
        assert pool.recycle() == [second] and pool.active_lease_count == 0
    finally:
        pool.shutdown()


@gpu
def test_gpu_a_wait_never_published_times_out_and_the_stream_goes_on():
    pool = _pool(consumer_count=1)
    reader = TransportConsumer.local(pool, 0)
    try:
        lease = pool.lease(4000)  # handed out, not published (yet)
        start = time.monotonic()
        out = reader.receive(lease, torch.uint8, (4000,), timeout=0.5)
        with pytest.raises(TimeoutError, match=rf"\(slot={lease.slot}, generation="
                                               rf"{lease.generation}\) after 0.5 s"):
            reader.synchronize()
        assert 0.5 <= time.monotonic() - start < 1.5
        assert out.shape == (4000,)
        words = pool._control.view(-1)
        assert int(words[lease.ready_byte_offset // 4]) == faults.ABORTED
        assert pool.recycle() == []  # acknowledged, but never published: not freed
        src = torch.full((4000,), 7, dtype=torch.uint8, device="cuda")
        pool._publish_lease(src, lease)  # the late publish overwrites the abort word
        torch.cuda.synchronize()
        assert pool.recycle() == [lease]
        # the consumer goes on with the next lease
        lease, _ = pool.copy_tensor(src)
        assert torch.equal(reader.receive(lease, torch.uint8, (4000,), timeout=5), src)
        reader.synchronize()
    finally:
        reader.close()
        pool.shutdown()


def _run_faults_driver(scenario: str, *options: str) -> None:
    result = run_script([sys.executable, str(FAULTS_DRIVER), scenario, *options], timeout=300)
    printed = f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert result.returncode == 0, printed
    assert f"{scenario}: ok" in result.stdout


@gpu
@pytest.mark.parametrize("scenario", ["consumer-killed", "producer-killed", "never-published",
                                      "wrong-acks"])
def test_gpu_faults(scenario):
    """Processes that die or misbehave (``tests/gpu_transport_faults.py``), each bounded."""
    _run_faults_driver(scenario)


@multi_gpu
@pytest.mark.parametrize("scenario", ["consumer-killed", "producer-killed", "never-published"])
def test_gpu_faults_with_a_consumer_on_a_peer_gpu(scenario):
    """The same faults with consumer 0 on ``cuda:1`` (the pool on ``cuda:0``): the survivor of
    a killed consumer, the waits that time out and the watchdog's abort through the peer
    mapping behave as on one GPU."""
    _run_faults_driver(scenario, "--consumer-devices", "1", "0")


def test_abort_kernel_compiles_to_a_system_scope_compare_and_swap():
    """sm_90 PTX, compiled without a GPU: the ready word is read volatile (not from a stale
    cache line) and swapped at system scope, so a peer or host observer sees the abort."""
    import triton
    from triton.backends.compiler import GPUTarget

    signature = {"words_ptr": "*i32", "index_ptr": "*i64", "generation_ptr": "*i32",
                 "outcome_ptr": "*i32", "ABORT": "constexpr"}
    for abort in (True, False):
        source = triton.compiler.ASTSource(fn=faults._abort_kernel, signature=signature,
                                           constexprs={"ABORT": abort})
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        assert ("atom.global.acq_rel.sys.cas.b32" in ptx) == abort  # settle() writes nothing
        assert "ld.volatile.global.b32" in ptx


def test_cancel_lease_takes_a_lease_or_all_three_sglang_keywords():
    lease = contract.Lease(start=64, end=128, nbytes=64, slot=1, generation=7,
                           ready_byte_offset=16, ack_byte_offset=20)
    assert leases.lease_words(lease, None, None, None) == (16, 20, 7)
    assert leases.lease_words(None, 16, 20, 7) == (16, 20, 7)
    for mix in [(None, None, None, None), (None, 16, 20, None), (None, 16, None, None),
                (lease, 16, 20, 7), (lease, None, None, 7)]:
        with pytest.raises(TypeError, match="cancel_lease takes a lease, or ready_byte_offset"):
            leases.lease_words(*mix)
