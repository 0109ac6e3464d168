"""A two-rank tensor-parallel model step using all three ops, under torch.distributed (NCCL).

    python tests/distributed_tp_step.py                 # h_q = 128: 64 heads per rank
    python tests/distributed_tp_step.py --gather eager  # the all_gather outside the compiled step
    python tests/distributed_tp_step.py --unpadded      # h_q = 96: 48 per rank, must fail to trace

Run by ``tests/test_distributed.py`` on a machine with two GPUs; needs cuda-bindings (the
transport consumer). The script spawns one process per rank (rank ``r`` on ``cuda:r``, NCCL
through ``MASTER_ADDR``/``MASTER_PORT`` on a free local port). Every rank builds the same
inputs (CPU generators, seeded per step), keeps its shard of the heads, and compiles
``torch.compile(step, fullgraph=True, mode="reduce-overhead")``, where ``step``:

1. scatters accepted draft states into a Mamba state cache (its shard of the state heads);
2. runs sparse MLA on its 64 query heads (and their ``attn_sink``; ``topk_length`` given);
3. publishes its ``out`` shard into its own transport pool (``copy_and_publish``, the lease
   read from a device tensor, so the captured CUDA graph publishes into a new lease per call);
4. gathers ``out``, ``max_logits`` and ``lse`` over the heads of both ranks.

Where the all_gather runs (``--gather``): ``graph`` (default) puts it inside the compiled step
as a functional collective (``torch.distributed._functional_collectives.all_gather_tensor``),
which Dynamo traces into the one graph and Inductor lowers to NCCL calls that the CUDA graph of
``reduce-overhead`` captures. That is how a TP model step is compiled in serving (gpt-fast
compiles its funcol all_reduce the same way), so it is what this run tests. ``eager`` gathers
with ``dist.all_gather`` after the compiled step: no NCCL inside a captured graph, the
fallback if capture of the collective trips.

Each rank's pool has one consumer: a process spawned on the rank's GPU that attaches through
``TransportPool.export_handle()``, waits for each lease in stream order, copies it out,
acknowledges it and sends the copy's bytes back.

Checks, per rank and step: the Mamba cache equals the plain-PyTorch reference; the gathered
outputs equal a single-GPU run of the op on the rank's GPU with all 128 heads, with
``torch.equal`` (each head's attention reads only its own query row and ``attn_sink`` entry,
``h_q`` is a runtime argument of the one kernel, and Inductor launches that same kernel, which
the compile tests check against eager bit for bit: so a shard computes its heads exactly as the
full run does; a difference is printed with its size); the consumer's copy equals the
published shard; the lease is recycled; no publish was refused; one compile (no recompile) and
no CUDA-graph skip.

``--unpadded``: 48 heads per rank; ``torch.compile`` must fail while tracing on both ranks
with the contract's message (``... requires h_q padded to a positive multiple of 64, got 48``),
nothing may run (cache and pool untouched), no rank enters a collective afterwards, and the
consumers exit.

NVLink multicast is switched off for the ranks (``NCCL_NVLS_ENABLE=0`` and the like).

Hangs: every rank and consumer dies with its parent (``PR_SET_PDEATHSIG``); the parent stops
waiting after ``--timeout`` seconds and kills the ranks it started. Prints one line per check,
then ``rank <r>: PASS`` or ``FAIL`` for each rank and a last summary line; exits 0 only if
every check of both ranks held and both ranks exited by themselves.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import queue
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp

from strictops.meta.sparse_mla import prefill as sparse_contract
from strictops.meta.testing import error_chain
from strictops.meta.transport.pool import DATA_ALIGNMENT, align_up, data_start
from strictops.ops import (
    Lease,
    TransportConsumer,
    TransportPool,
    copy_and_publish,
    fused_mamba_state_scatter_with_mask,
    sparse_mla_q8kv8_prefill_fwd,
)
from strictops.ops.mamba import state_scatter as mamba_op
from strictops.ops.sparse_mla import prefill as sparse_op

WORLD = 2
STEPS = 4  # cudagraph trees: warm-up, record (+ one replay), then plain replays
# Sparse MLA heads in all; each rank takes 1/WORLD of them (and of the Mamba state heads).
H_Q, H_Q_UNPADDED = 128, 96
S_Q, S_KV, D_QK, TOPK = 64, 2048, 576, 256
D_V = sparse_contract.D_V
SM_SCALE = D_QK ** -0.5
# Mamba state cache [layers, cache, state heads, 16, 16].
LAYERS, CACHE, DRAFT, REQUESTS, STATE_HEADS = 2, 32, 3, 16, 8
# Transport: one consumer; enough slots and bytes for every step's lease.
CONSUMERS, SLOTS = 1, 8
TIMEOUT_S = 300  # the whole run
NCCL_TIMEOUT_S = 120  # a collective that waits this long fails instead of hanging
REPLY_TIMEOUT_S = 120  # a consumer's answer to one lease (the first waits for its start-up)
TEARDOWN_S = 30  # a rank's exit after it reported
# NVLink multicast stays off in every rank (NCCL, PyTorch symmetric memory, NVSHMEM): the run
# needs none, and on a shared host a program using it can put the host's GPUs out of service.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


class Check(NamedTuple):
    name: str
    ok: bool
    detail: str


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux ``PR_SET_PDEATHSIG``), so a killed run
    leaves no rank or consumer behind; exit now if the parent is already gone."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(1)


# --------------------------------------------------------------------------------------------
# Inputs: identical on every rank (CPU generators), each rank keeps its shard of the heads.


def heads_of(rank: int, total: int) -> slice:
    per_rank = total // WORLD
    return slice(rank * per_rank, (rank + 1) * per_rank)


def sparse_inputs(step: int, h_q: int, device: str) -> dict:
    """Keyword arguments of the full-head sparse MLA call of ``step`` (attn_sink and
    topk_length given; invalid and duplicate indices, an empty token, partial lengths)."""
    dims = sparse_contract.Dims(s_q=S_Q, s_kv=S_KV, h_q=h_q, d_qk=D_QK, topk=TOPK,
                                with_attn_sink=True, device=device)
    args = sparse_op.random_inputs(dims, torch.Generator().manual_seed(step))
    return {k: args[k] for k in sparse_op.INPUTS}


def shard_sparse(args: dict, rank: int) -> dict:
    heads = heads_of(rank, args["q"].shape[1])
    return {**args, "q": args["q"][:, heads].contiguous(),
            "attn_sink": args["attn_sink"][heads].contiguous()}


def initial_cache(rank: int, device: str) -> torch.Tensor:
    cache = torch.randn(LAYERS, CACHE, STATE_HEADS, 16, 16,
                        generator=torch.Generator().manual_seed(12345))
    return cache[:, :, heads_of(rank, STATE_HEADS)].contiguous().to(device)


def mamba_inputs(step: int, rank: int, device: str) -> dict:
    """This rank's draft states and the step's indices: negative and past-the-end slots and
    steps, duplicate slots, int32 and int64."""
    gen = torch.Generator().manual_seed(1000 + step)
    draft = torch.randn(LAYERS, REQUESTS, DRAFT, STATE_HEADS, 16, 16, generator=gen)
    slots = torch.randint(-2, CACHE + 2, (REQUESTS,), generator=gen, dtype=torch.int32)
    steps = torch.randint(-1, DRAFT + 1, (REQUESTS,), generator=gen)
    return {"draft": draft[:, :, :, heads_of(rank, STATE_HEADS)].contiguous().to(device),
            "slots": slots.to(device), "steps": steps.to(device)}


# The step's sparse MLA arguments (sm_scale and d_v are constants of the step).
STEP_SPARSE = ("q", "kv", "indices", "q_scale", "kv_scale", "attn_sink", "topk_length")


def step_kwargs(cache, mamba: dict, shard: dict, pool: torch.Tensor, lease: torch.Tensor,
                state: torch.Tensor) -> dict:
    return {"cache": cache, **mamba, **{k: shard[k] for k in STEP_SPARSE}, "pool": pool,
            "lease": lease, "state": state}


def make_step(gather_in_graph: bool, group=None):
    """The model step: Mamba scatter, sparse MLA on this rank's heads, publish of its ``out``
    shard, and (``gather_in_graph``) the all_gather of the three outputs over ``group``."""

    def step(cache, draft, slots, steps, q, kv, indices, q_scale, kv_scale, attn_sink,
             topk_length, pool, lease, state):
        fused_mamba_state_scatter_with_mask(cache, draft, slots, steps)
        outputs = sparse_mla_q8kv8_prefill_fwd(q, kv, indices, SM_SCALE, q_scale, kv_scale, D_V,
                                               attn_sink, topk_length)
        copy_and_publish(pool, outputs[0], lease, state, SLOTS, CONSUMERS)
        if gather_in_graph:
            outputs = [_gather_heads_in_graph(t, group) for t in outputs]
        return tuple(outputs)

    return step


def _gather_heads_in_graph(t: torch.Tensor, group) -> torch.Tensor:
    """All ranks' head shards of ``t`` (heads on dim 1), side by side. The gather runs on dim
    0 and the heads are moved after it: a gather on dim 1 calls a helper that Dynamo refuses
    to trace on torch 2.11 (``_maybe_view_chunk_cat``), a graph break under fullgraph."""
    gathered = funcol.all_gather_tensor(t.contiguous(), 0, group)  # [WORLD * s_q, heads, ...]
    ranks = gathered.view(-1, *t.shape)  # [WORLD, s_q, heads, ...]
    return ranks.movedim(0, 1).flatten(1, 2)  # [s_q, WORLD * heads, ...]


def gather_heads(t: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=1)


def pool_bytes() -> int:
    shard = S_Q * (H_Q // WORLD) * D_V * torch.bfloat16.itemsize
    return data_start(SLOTS, CONSUMERS) + SLOTS * align_up(shard, DATA_ALIGNMENT)


# --------------------------------------------------------------------------------------------
# Processes


def consumer_main(gpu: int, handle, inbox, outbox, parent_pid: int) -> None:
    """The pool's consumer: for each ``(step, lease, dtype, shape)``, wait in stream order,
    copy out, acknowledge, and send the copy's bytes back (plain bytes: a CPU tensor would go
    through a file descriptor that its sender must keep open until it is received); ``None``
    ends it."""
    die_with_parent(parent_pid)
    try:
        torch.cuda.set_device(gpu)
        consumer = TransportConsumer.attach(handle, rank=0)
        while (msg := inbox.get(timeout=TIMEOUT_S)) is not None:
            step, lease, dtype, shape = msg
            got = consumer.receive(Lease(*lease), dtype, shape)
            outbox.put((step, got.view(torch.uint8).cpu().numpy().tobytes()))
        outbox.put(("done", None))
    except BaseException:
        outbox.put(("error", traceback.format_exc()))


class Consumer:
    """A consumer process on ``gpu`` attached to ``pool``."""

    def __init__(self, gpu: int, pool: TransportPool) -> None:
        ctx = mp.get_context("spawn")
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(target=consumer_main, daemon=True,
                                   args=(gpu, pool.export_handle(), self.inbox, self.outbox,
                                         os.getpid()))
        self.process.start()

    def receive(self, step: int, lease: Lease, shape: tuple) -> torch.Tensor:
        """What the consumer read from ``lease``: a bf16 CPU tensor of ``shape``."""
        self.inbox.put((step, tuple(lease), torch.bfloat16, shape))
        tag, got = self.outbox.get(timeout=REPLY_TIMEOUT_S)
        if tag != step:
            raise RuntimeError(f"consumer answered {tag!r} for step {step}: {got}")
        return torch.frombuffer(bytearray(got), dtype=torch.uint8).view(torch.bfloat16).view(shape)

    def close(self) -> Check:
        self.inbox.put(None)
        try:  # a consumer that already ended has said so already, or never will
            tag, detail = self.outbox.get(timeout=REPLY_TIMEOUT_S if self.process.is_alive() else 1)
        except queue.Empty:
            tag, detail = "silent", f"no answer in {REPLY_TIMEOUT_S} s"
        self.process.join(timeout=TEARDOWN_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
            tag, detail = "hung", "killed after the end message"
        code = self.process.exitcode
        return Check("consumer process ended cleanly", tag == "done" and code == 0,
                     f"{tag}, exit code {code}" + (f": {detail}" if detail else ""))


def differs(names, got, want) -> str | None:
    """None if every ``got`` equals its ``want`` bit for bit, else which differ and by how much
    (largest absolute difference over the elements that are finite in both)."""
    out = []
    for name, a, b in zip(names, got, want, strict=True):
        if not torch.equal(a, b):
            a, b = a.double(), b.to(a.device).double()
            finite = a.isfinite() & b.isfinite()
            delta = (a - b)[finite].abs().max().item() if finite.any() else float("nan")
            out.append(f"{name} max |diff| {delta:.3g}, {int((a != b).sum())} elements differ")
    return "; ".join(out) or None


# What run_padded compares after every step.
PER_STEP = {
    "cache": "Mamba cache shard equals the plain-PyTorch reference",
    "outputs": f"gathered out/max_logits/lse equal the one-GPU {H_Q}-head run (torch.equal)",
    "transport": "consumer received the published out shard bit for bit",
    "recycled": "lease recycled once the consumer acknowledged it",
}


def run_padded(rank: int, gather: str) -> list[Check]:
    device, heads = f"cuda:{rank}", heads_of(rank, H_Q)
    compiled = torch.compile(make_step(gather == "graph", dist.group.WORLD), fullgraph=True,
                             mode="reduce-overhead")
    cache, expected_cache = initial_cache(rank, device), initial_cache(rank, device)
    pool = TransportPool(pool_bytes(), device=device, consumer_count=CONSUMERS,
                         max_inflight_slices=SLOTS, recycle_interval=None, name=f"rank{rank}")
    state = torch.zeros(2, dtype=torch.int32, device=device)
    # Long-lived buffers the step writes: static addresses, so the CUDA graph may mutate them.
    for t in (cache, pool.tensor, state):
        torch._dynamo.mark_static_address(t)
    consumer = Consumer(rank, pool)
    failed = {name: [] for name in PER_STEP}
    try:
        for step in range(STEPS):
            full = sparse_inputs(step, H_Q, device)
            shard, mamba = shard_sparse(full, rank), mamba_inputs(step, rank, device)
            shape = (S_Q, heads.stop - heads.start, D_V)
            lease = pool.lease(shape[0] * shape[1] * shape[2] * torch.bfloat16.itemsize)
            lease_t = torch.tensor(lease, dtype=torch.int64, device=device)
            outputs = compiled(**step_kwargs(cache, mamba, shard, pool.tensor, lease_t, state))
            outputs = [t.clone() for t in outputs]  # CUDA-graph outputs live until the next call
            if gather == "eager":
                outputs = [gather_heads(t) for t in outputs]
            received = consumer.receive(step, lease, shape)
            torch.cuda.synchronize(device)
            expected_cache = mamba_op.reference(expected_cache, mamba["draft"], mamba["slots"],
                                                mamba["steps"])
            reference = sparse_mla_q8kv8_prefill_fwd(**full)  # one GPU, all heads, eager
            problems = {  # name: None if it held, else what differed
                "cache": differs(("cache",), (cache,), (expected_cache,)),
                "outputs": differs(("out", "max_logits", "lse"), outputs, reference),
                "transport": differs(("received",), (received,), (outputs[0][:, heads].cpu(),)),
                "recycled": None if pool.recycle() == [lease] else "not recycled",
            }
            for name, problem in problems.items():
                if problem is not None:
                    failed[name].append(f"step {step}: {problem}")
    finally:
        closed = consumer.close()
        pool.shutdown()
    counters = torch._dynamo.utils.counters
    graphs, skips = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
    return [
        *(Check(text, not failed[name], f"{STEPS} steps" + "".join(f"; {f}" for f in failed[name]))
          for name, text in PER_STEP.items()),
        Check("no lease left, no publish refused",
              pool.active_lease_count == 0 and int(state[1]) == 0,
              f"{pool.active_lease_count} leased, {int(state[1])} refused"),
        Check("one compiled graph (no recompile)", graphs == 1, f"{graphs} graphs"),
        Check("CUDA graphs recorded (mode=reduce-overhead)", skips == 0,
              f"{skips} cudagraph skips (reasons in the log above)"),
        closed,
    ]


def run_unpadded(rank: int) -> list[Check]:
    device = f"cuda:{rank}"
    compiled = torch.compile(make_step(True, dist.group.WORLD), fullgraph=True,
                             mode="reduce-overhead")
    shard = shard_sparse(sparse_inputs(0, H_Q_UNPADDED, device), rank)
    cache = initial_cache(rank, device)
    pool = TransportPool(pool_bytes(), device=device, consumer_count=CONSUMERS,
                         max_inflight_slices=SLOTS, recycle_interval=None, name=f"rank{rank}")
    consumer = Consumer(rank, pool)
    before = (cache.clone(), pool.tensor.clone())
    _, message = sparse_contract.CONTRACT.expected_error("h_q", **shard)
    try:
        lease = torch.tensor(pool.lease(4096), dtype=torch.int64, device=device)
        state = torch.zeros(2, dtype=torch.int32, device=device)
        compiled(**step_kwargs(cache, mamba_inputs(0, rank, device), shard, pool.tensor, lease,
                               state))
        refused = Check("trace-time ValueError", False, "the step compiled and ran")
    except Exception as exc:  # noqa: BLE001  (any other error is a failure, reported)
        at_trace_time = type(exc).__name__ == "TorchRuntimeError"
        chained = any(type(e) is ValueError and str(e) == message for e in error_chain(exc))
        refused = Check("trace-time ValueError", at_trace_time and chained,
                        message if chained else f"{type(exc).__name__}: {exc}")
    finally:
        closed = consumer.close()
        pool.shutdown()
    torch.cuda.synchronize(device)
    untouched = torch.equal(cache, before[0]) and torch.equal(pool.tensor, before[1])
    return [refused, Check("nothing ran: cache and pool untouched", untouched, ""), closed]


def rank_main(rank: int, opts: argparse.Namespace, parent_pid: int, results) -> None:
    die_with_parent(parent_pid)
    initialised = False
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=WORLD,
                                timeout=timedelta(seconds=NCCL_TIMEOUT_S),
                                device_id=torch.device("cuda", rank))
        initialised = True
        checks = run_unpadded(rank) if opts.unpadded else run_padded(rank, opts.gather)
    except BaseException:
        checks = [Check("rank ran to the end", False, traceback.format_exc())]
    # Plain tuples (a class of this script pickles by a module name the parent lacks), sent
    # before teardown, so that a hang in teardown is still seen with the results.
    results.put((rank, [tuple(c) for c in checks]))
    if initialised:
        # Free the compiled step's CUDA graphs (which hold captured NCCL work) before the
        # communicator goes: with them alive, destroy_process_group() hung on the two H200s.
        torch.cuda.synchronize()
        torch._dynamo.reset()
        from torch._inductor import cudagraph_trees
        cudagraph_trees.reset_cudagraph_trees()
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unpadded", action="store_true",
                    help=f"h_q = {H_Q_UNPADDED} ({H_Q_UNPADDED // WORLD} per rank): must fail "
                         "at trace time on both ranks")
    ap.add_argument("--gather", choices=("graph", "eager"), default="graph",
                    help="all_gather inside the compiled step (functional collective) or after it")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds for the whole run")
    opts = ap.parse_args(argv)
    if torch.cuda.device_count() < WORLD:
        print(f"distributed_tp_step: FAIL, needs {WORLD} GPUs, found {torch.cuda.device_count()}")
        return 1

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                      # Inductor's compile workers in a spawned rank have hung at exit with
                      # process groups alive (PyTorch's own collective tests use one thread).
                      TORCHINDUCTOR_COMPILE_THREADS="1", **NO_MULTICAST)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    ranks = [ctx.Process(target=rank_main, args=(r, opts, os.getpid(), results))
             for r in range(WORLD)]
    for p in ranks:
        p.start()
    reports: dict[int, list[Check]] = {}
    deadline = time.monotonic() + opts.timeout
    while len(reports) < WORLD and time.monotonic() < deadline:
        try:
            rank, checks = results.get(timeout=1.0)
            reports[rank] = [Check(*c) for c in checks]
        except queue.Empty:
            if all(p.exitcode is not None for r, p in enumerate(ranks) if r not in reports):
                break  # the ranks still to report are gone: collect what they sent, then stop
    while True:
        try:
            rank, checks = results.get(timeout=1.0)
            reports[rank] = [Check(*c) for c in checks]
        except queue.Empty:
            break
    for r, p in enumerate(ranks):
        p.join(timeout=max(1.0, min(TEARDOWN_S, deadline - time.monotonic())))
        if p.is_alive():
            p.kill()  # our own child, by its handle
            p.join()
        checks = reports.setdefault(r, [Check("rank reported its checks", False,
                                              "no report (see its output above)")])
        checks.append(Check("rank exited by itself", p.exitcode == 0, f"exit code {p.exitcode}"))

    heads = H_Q_UNPADDED if opts.unpadded else H_Q
    run = (f"h_q={heads}, {heads // WORLD} per rank, "
           + ("expecting a trace-time error" if opts.unpadded else f"gather in {opts.gather}"))
    passed = True
    for r in range(WORLD):
        for c in reports[r]:
            print(f"rank {r}:   {'ok ' if c.ok else 'BAD'} {c.name}"
                  + (f": {c.detail}" if c.detail else ""))
    for r in range(WORLD):
        ok = all(c.ok for c in reports[r])
        passed &= ok
        print(f"rank {r}: {'PASS' if ok else 'FAIL'}")
    print(f"distributed_tp_step ({run}): {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
