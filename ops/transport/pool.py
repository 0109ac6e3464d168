"""``strictops::copy_and_publish``: the transport pool's copy-and-publish op.

A producer copies a tensor into a leased range of one preallocated CUDA byte pool and then
publishes it by writing the lease's generation into the lease's ready word; consumers wait for
that word in stream order (:mod:`strictops.ops.transport.producer`). The layout and the lease
format are in :mod:`strictops.meta.transport.pool`.

The kernel, its launches and what orders the bytes before the flag for every observer are in
:mod:`strictops.ops.transport.publish_kernel`. Up to 1 MiB (16 MiB in a plain eager call) one
launch copies and writes the flag; above, a copy launch and a one-program flag launch.

The lease is read from an int64 CUDA tensor, so one captured CUDA graph publishes into a new
lease on every replay (write the tensor, replay). Its values are checked on the device against
the pool's layout, which is a trace-time constant: a lease that is not a 256-byte-aligned part
of the data region of at most ``src``'s size, with its slot's own ready word and a positive int32
generation (:func:`strictops.meta.transport.pool.lease_fits`), is skipped without touching the
pool, and ``state[ERRORS]`` is incremented for the host to read when it likes.

Registration: ``torch.library.triton_op``, whose body runs the contract and launches through
``wrap_triton``: the same body is the fake, so ``torch.compile``/``torch.export`` fail at trace
time with the eager message, and Inductor sees the Triton launch. A plain eager call skips the
dispatcher, its contract's verdict cached, and a signature served before runs in C++.

Why each tuning and code-shape choice, with the measurements: ``docs/design/transport_pool.md``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.library import triton_op, wrap_triton

from strictops.meta.transport import pool as contract
from strictops.meta._contract import CachedValidation, hint
from strictops.meta.transport.pool import (
    DATA_ALIGNMENT,
    ERRORS,
    LEASE_WORDS,
    STATE_WORDS,
    WORD_BYTES,
    Lease,
    align_up,
    lease_fits,
)

from strictops.ops._runtime.dispatch import (can_skip_dispatcher, device_capability,
                                             on_device_of, stream_capturing)
from strictops.ops._runtime.host_path import MISS, HostPath
from strictops.ops._runtime.interpret import interpreted
from strictops.ops._runtime.launcher import Launcher, Pointer, keyword_constexprs
from strictops.ops.transport.publish_kernel import (
    PHASE_BOTH,
    PHASE_COPY,
    PHASE_FLAG,
    _publish_kernel,
)

# Test helpers (reference, launch_interpreted, example_inputs, selfcheck_result) are importable
# by name but not part of the public API.
__all__ = ["Lease", "copy_and_publish", "new_state"]

# Bytes and warps per program, one launch (up to ``two_launches_above`` bytes) or two (the copy
# of whole blocks, then a one-program launch that copies the partial last block and writes the
# flag, with ``flag_num_warps`` warps, a programmatic dependent launch when ``pdl`` on sm_90+);
# above ``large_above`` bytes the copy takes the shape of ``large``. Speed choices only: under
# tracing they are taken from the size's hint without a guard, so no size recompiles.
# Measurements behind each value: docs/design/transport_pool.md.
TUNING = {"one_launch": {"block_bytes": 8192, "num_warps": 8},
          "two_launches": {"block_bytes": 16384, "num_warps": 4, "flag_num_warps": 4,
                           "pdl": True},
          "two_launches_above": 1 << 20,
          "large": {"block_bytes": 4096, "num_warps": 8},
          "large_above": 16 << 20}


def _launch(kernel, pool, src, lease, state, max_inflight_slices, consumer_count,
            values: Optional[Sequence[int]] = None, two_launches=None,
            consumers: str = contract.PEERS, **tuning):
    """Launch ``kernel`` (JIT, wrapped or interpreted) on validated inputs; ``values``: the
    lease's fields on the host (``lease`` is then not read); ``consumers``: the flag's scope
    (:func:`strictops.meta.transport.pool.system_scope`). ``two_launches`` and ``tuning``
    (``block_bytes``: a power of two, at least 16; ``num_warps``; with two launches
    ``flag_num_warps`` and ``pdl``) override ``TUNING``; ``pdl`` only ever applies to a real
    launch on an sm_90+ device (:func:`_pdl_launch`). Returns what the launches return
    (compiled kernels, for a probe's ``n_regs``)."""
    src_bytes = src.view(-1).view(torch.uint8)  # a view: the kernel reads any dtype as bytes
    launched = []
    for grid, args, options in _launches(kernel, pool, src_bytes, src_bytes.shape[0], lease,
                                         state, max_inflight_slices, consumer_count, values,
                                         two_launches, consumers, **tuning):
        runtime, constexprs = keyword_constexprs(_LAUNCHER.fn, args)
        launched.append(kernel[grid](*runtime, **constexprs, **dict(options)))
    return launched


def _launches(kernel, pool, src_bytes, src_nbytes, lease, state, max_inflight_slices,
              consumer_count, values, two_launches=None, consumers=contract.PEERS,
              **tuning) -> list:
    """The launches of one publish (see :func:`_launch`) as ``(grid, every kernel parameter
    in signature order, launch options)``; ``src_bytes``: the source as uint8 (a view, or a
    :class:`~strictops.ops._runtime.launcher.Pointer`), ``src_nbytes`` bytes."""
    size = hint(src_nbytes)
    if two_launches is None:
        two_launches = size > TUNING["two_launches_above"]
    if not two_launches:
        defaults = TUNING["one_launch"]
    elif size > TUNING["large_above"]:
        defaults = {**TUNING["two_launches"], **TUNING["large"]}
    else:
        defaults = TUNING["two_launches"]
    if tuning:  # the eager path gives none: no sets, no merged dict per call
        unknown = set(tuning) - set(TUNING["two_launches"])
        if unknown:
            raise TypeError(f"unknown tuning keys {sorted(unknown)}")
        tuning = {**defaults, **tuning}
    else:
        tuning = defaults
    block = tuning["block_bytes"]
    assert block >= 16 and block & (block - 1) == 0, block  # whole 16-byte vectors per block
    pdl = two_launches and _pdl_launch(kernel, pool, tuning.get("pdl", False))
    lease_args = (0,) * LEASE_WORDS if values is None else values
    # Every constexpr, PDL=False included: Inductor's analysis of a wrapped kernel's mutations
    # takes no default. PTX: the inline-PTX flag store, for the JIT kernel only. SYSTEM: the
    # flag's release at system scope.
    head = (pool, src_bytes, lease, state, pool.shape[0], src_nbytes,
            contract.data_start(max_inflight_slices, consumer_count),
            contract.slot_bytes(consumer_count), max_inflight_slices, *lease_args,
            values is None, block)
    tail = (pdl, kernel is _publish_kernel, contract.system_scope(consumers))
    if not two_launches:
        grid = ((src_nbytes + block - 1) // block,)
        return [(grid, (*head, PHASE_BOTH, *tail), (("num_warps", tuning["num_warps"]),))]
    # Two launches: the copy's grid covers the whole source blocks only (possibly none), so
    # its programs load unmasked; the flag program copies the rest of the lease.
    flag_options = (("num_warps", tuning["flag_num_warps"]),) + (
        (("launch_pdl", True),) if pdl else ())
    return [((src_nbytes // block,), (*head, PHASE_COPY, *tail),
             (("num_warps", tuning["num_warps"]),)),
            ((1,), (*head, PHASE_FLAG, *tail), flag_options)]


# The eager path (the dispatcher skipped; also the pool's copy_tensor, its lease on the host):
# the verdict cached per signature, launches prepared once per specialisation by the cached
# launcher, and a C++ plan per signature (docs/design/eager_host_cost.md).
_LAUNCHER = Launcher(_publish_kernel)
# Eagerly the host, not the GPU, bounds a publish up to here, and each launch costs it about
# 13 us on the H200 machine (two launches: 39 us at 2 MiB): one launch up to 16 MiB, where
# the copy itself takes about 8 us; two above, as graphs.
EAGER_TWO_LAUNCHES_ABOVE = 16 << 20
_VALIDATION = CachedValidation(contract.CONTRACT, contract.ARGUMENTS[:-1])  # name: the default
_HOST = HostPath(_VALIDATION, writes=("pool", "state"),
                 names=(*_VALIDATION.names[:-1], "system"))  # consumers: _plan_scope's key
_HOST_CALL = _HOST.call
_SETTINGS = ((globals(), "TUNING"), (globals(), "EAGER_TWO_LAUNCHES_ABOVE"))
_SOURCE_PARAMETER = {_publish_kernel.arg_names.index("src_ptr"): "src"}  # a Pointer, no view


def _plan_scope(consumers) -> Optional[bool]:
    """``consumers`` as a plan's key (a str has none): its scope if the contract knows it."""
    known = consumers.__class__ is str and contract.known_placement(consumers)
    return contract.system_scope(consumers) if known else None


def launch_eager(pool, src, lease, state, max_inflight_slices, consumer_count, values=None,
                 consumers=contract.PEERS, graph=False) -> list:
    """``_launch(_publish_kernel, ...)`` through the cached launcher on ``pool``'s device, in
    one launch up to ``EAGER_TWO_LAUNCHES_ABOVE`` bytes, or as ``TUNING`` chooses for a call
    captured in a CUDA graph (``graph``); ``values``: the lease's fields on the host, as kernel
    arguments (``lease`` unread), else the kernel reads ``lease``. The source goes as a uint8
    pointer. Validated CUDA tensors only. Returns ``(grid, parameters, options)`` per launch."""
    nbytes, device = src.nbytes, pool.get_device()
    launches = _launches(_publish_kernel, pool, Pointer(src.data_ptr(), torch.uint8), nbytes,
                         lease, state, max_inflight_slices, consumer_count, values,
                         None if graph else nbytes > EAGER_TWO_LAUNCHES_ABOVE, consumers)
    for grid, args, options in launches:
        _LAUNCHER(grid, args, options, device)
    return launches


def _eager(pool, src, lease, state, max_inflight_slices, consumer_count, consumers,
           capturing=False) -> None:
    """A plain eager call (``capturing``: into a CUDA graph): the cached verdict, then
    :func:`launch_eager`; outside capture, one launch leaves the plan of its signature, and
    the launches a CUDA graph captured from the call would make are loaded."""
    args = (pool, src, lease, state, max_inflight_slices, consumer_count, consumers)
    _VALIDATION(*args)
    launches = launch_eager(pool, src, lease, state, max_inflight_slices, consumer_count,
                            consumers=consumers, graph=capturing)
    if capturing or len(launches) != 1:
        return
    (grid, kernel_args, options), = launches
    device = pool.get_device()
    _HOST.register((*args[:-1], _plan_scope(consumers)), _LAUNCHER, grid, kernel_args, options,
                   device, settings=_SETTINGS, named=_SOURCE_PARAMETER, validated=args)
    if src.nbytes > TUNING["two_launches_above"]:
        # A graph captured from this call makes two launches: compiled and loaded now, since
        # a capture refuses a module load.
        for launch in _launches(_publish_kernel, pool, kernel_args[1], src.nbytes, lease, state,
                                max_inflight_slices, consumer_count, None, None, consumers):
            _LAUNCHER.load(*launch, device)


def _pdl_launch(kernel, pool: torch.Tensor, wanted: bool) -> bool:
    """Whether the flag launch is a programmatic dependent launch: when ``wanted``, for the
    JIT kernel launched for real (not recorded under tracing, where ``wrap_triton`` takes no
    ``launch_pdl``, nor interpreted, which has no ``griddepcontrol``) on an sm_90+ device."""
    return wanted and kernel is _publish_kernel and _has_pdl(pool.get_device())


def _has_pdl(device_index: int) -> bool:
    """Whether CUDA device ``device_index`` has programmatic dependent launch (sm_90+)."""
    return device_capability(device_index) >= (9, 0)


def _validate_and_launch(kernel, pool, src, lease, state, max_inflight_slices, consumer_count,
                         consumers):
    contract.validate(pool, src, lease, state, max_inflight_slices, consumer_count, consumers)
    # A real launch goes to the pool's device; a wrapped kernel (tracing) is only recorded.
    real = kernel is _publish_kernel
    with on_device_of(pool, real):
        _launch(kernel, pool, src, lease, state, max_inflight_slices, consumer_count,
                consumers=consumers)


@triton_op(contract.CONTRACT.op, mutates_args=contract.CONTRACT.mutates)
def _copy_and_publish(
    pool: torch.Tensor,
    src: torch.Tensor,
    lease: torch.Tensor,
    state: torch.Tensor,
    max_inflight_slices: int,
    consumer_count: int,
    consumers: str = contract.PEERS,
) -> None:
    # The body is also the fake: under fake tensors the launch is recorded, not run
    # (wrap_triton returns the kernel itself outside tracing).
    _validate_and_launch(wrap_triton(_publish_kernel), pool, src, lease, state,
                         max_inflight_slices, consumer_count, consumers)


def copy_and_publish(
    pool: torch.Tensor,
    src: torch.Tensor,
    lease: torch.Tensor,
    state: torch.Tensor,
    max_inflight_slices: int,
    consumer_count: int,
    consumers: str = contract.PEERS,
) -> None:
    """Copy ``src``'s first ``nbytes`` bytes into the lease's range of ``pool``, then write
    the lease's generation into its ready word; no host sync, capturable. One launch, two
    above 1 MiB in a CUDA graph or a trace; a plain eager call outside capture makes one up to
    ``EAGER_TWO_LAUNCHES_ABOVE`` (16 MiB), where the host's time is the publish's.

    Parameters
    ----------
    pool : torch.Tensor
        ``[memory_size]`` uint8 CUDA tensor laid out as in
        :mod:`strictops.meta.transport.pool`, written in place.
    src : torch.Tensor
        Any shape and dtype, contiguous, non-empty, on ``pool``'s device.
    lease : torch.Tensor
        ``[7]`` int64 on ``pool``'s device: ``torch.tensor(lease)`` of a :class:`Lease`.
    state : torch.Tensor
        ``[2]`` int32 on ``pool``'s device, zero when first used (:func:`new_state`); written:
        ``state[1]`` counts refused leases. Publishes that may overlap need separate states.
    max_inflight_slices, consumer_count : int
        The pool's layout.
    consumers : str
        ``"peers"`` (default): consumers may wait and read on other GPUs (or the host), and
        the flag is released at system scope; ``"same_device"``: every consumer is on
        ``pool``'s GPU, a GPU-scope release. A trace-time constant.

    Notes
    -----
    With ``start, end, nbytes, slot, generation, ready, _ = lease``::

        pool[start:start + nbytes] = src.view(-1).view(uint8)[:nbytes]
        pool[ready:ready + 4].view(int32) = generation    # after every byte above is visible

    if the lease fits (``lease_fits``); otherwise nothing is written to ``pool`` and
    ``state[1] += 1``. Bad metadata raises ``ValueError`` before launch in eager mode and at
    trace time under ``torch.compile``/``torch.export``. In plain eager mode the call skips
    the dispatcher (``strictops.ops._runtime.dispatch``), and a signature served before runs
    from its C++ plan; ``torch.ops.strictops.copy_and_publish`` is the same op through it.
    """
    if not torch.compiler.is_compiling():
        capturing = stream_capturing()
        # The C++ path, for a signature served before (while capturing, the Python path makes
        # TUNING's launches, which the eager plan may not).
        if not capturing and _HOST_CALL(pool, src, lease, state, max_inflight_slices,
                                        consumer_count, _plan_scope(consumers)) is not MISS:
            return
        if can_skip_dispatcher(pool, src, lease, state):
            _eager(pool, src, lease, state, max_inflight_slices, consumer_count, consumers,
                   capturing)
            torch.autograd.graph.increment_version((pool, state))  # as the dispatcher does
            return
    torch.ops.strictops.copy_and_publish(pool, src, lease, state, max_inflight_slices,
                                         consumer_count, consumers)


def new_state(device) -> torch.Tensor:
    """A fresh ``state`` argument: ``[2]`` int32 zeros on ``device``."""
    return torch.zeros(STATE_WORDS, dtype=torch.int32, device=device)


def launch_interpreted(pool, src, lease, state, max_inflight_slices, consumer_count,
                       consumers=contract.PEERS, reverse_programs=False, **tuning):
    """Run the kernel through the Triton interpreter on CPU tensors (tests, self-check).

    ``lease`` may be a tensor (read by the kernel) or a :class:`Lease` / sequence of ints
    (passed as kernel arguments, the pool's eager path). ``reverse_programs`` runs programs in
    reverse grid order, so that the last program to arrive is not the last one in the grid.
    """
    values = None if isinstance(lease, torch.Tensor) else lease
    lease_t = state if values is not None else lease
    with interpreted(_publish_kernel, reverse_programs) as kernel:
        _launch(kernel, pool, src, lease_t, state, max_inflight_slices, consumer_count,
                values=values, consumers=consumers, **tuning)


def reference(pool, src, lease, state, max_inflight_slices, consumer_count,
              consumers=contract.PEERS):
    """Plain-PyTorch reference: new ``(pool, state)`` equal to the op's result.

    ``lease`` may be a tensor or a sequence of ints (as :func:`launch_interpreted`). A copy is
    exact, so no upcast is needed; ``consumers`` changes only the flag's ordering, not what
    is written.
    """
    pool_out, state_out = pool.clone(), state.clone()
    values = lease.tolist() if isinstance(lease, torch.Tensor) else list(lease)
    src_bytes = src.reshape(-1).view(torch.uint8)
    if lease_fits(values, pool.numel(), max_inflight_slices, consumer_count, src_bytes.numel()):
        start, _, nbytes, _, generation, ready, _ = values
        pool_out[start:start + nbytes] = src_bytes[:nbytes]
        word = torch.tensor([generation], dtype=torch.int32, device=pool.device)
        pool_out[ready:ready + WORD_BYTES] = word.view(torch.uint8)
    else:
        state_out[ERRORS] += 1
    return pool_out, state_out


def example_inputs(device: str, small: bool, generator: torch.Generator) -> dict:
    """Keyword arguments of a valid call that publishes into a lease in the middle of the pool.

    Parameters
    ----------
    device : str
        ``"cpu"`` for :func:`launch_interpreted`, ``"cuda:N"`` for the op.
    small : bool
        Interpreter-sized shapes (pairwise-distinct sizes >= 3, apart from the fixed-size lease
        and state, so a dynamic trace keeps each a separate symbol) instead of a moderate GPU
        shape.
    generator : torch.Generator
        CPU generator behind every random value.

    Returns
    -------
    dict
        ``pool`` ``[memory_size]`` uint8, random bytes everywhere (the op must change exactly
        one range and one word); ``src`` ``[rows, cols]`` float32, random; ``lease`` int64
        ``[7]``: a fitting lease whose ``nbytes`` is 3 bytes short of ``src``'s, so the copy
        ends mid-element and mid-block; ``state`` int32 ``[2]`` zeros; the layout ints.
    """
    if small:
        dims = contract.Dims(memory_size=6400, max_inflight_slices=5, consumer_count=3,
                             src_shape=(37, 9))
    else:
        dims = contract.Dims(memory_size=64 << 20, max_inflight_slices=64, consumer_count=2,
                             src_shape=(1024, 1021))
    spec = contract.valid_spec(dims)
    src_nbytes = dims.src_shape[0] * dims.src_shape[1] * 4
    slot = dims.max_inflight_slices - 2
    ready = slot * contract.slot_bytes(dims.consumer_count)
    start = contract.data_start(dims.max_inflight_slices, dims.consumer_count) + 2 * DATA_ALIGNMENT
    lease = Lease(start=start, end=start + align_up(src_nbytes, DATA_ALIGNMENT),
                  nbytes=src_nbytes - 3, slot=slot, generation=12345,
                  ready_byte_offset=ready, ack_byte_offset=ready + WORD_BYTES)
    return {
        "pool": torch.randint(0, 256, spec["pool"].shape, generator=generator,
                              dtype=torch.uint8).to(device),
        "src": torch.randn(dims.src_shape, generator=generator).to(device),
        "lease": torch.tensor(lease, dtype=torch.int64, device=device),
        "state": new_state(device),
        "max_inflight_slices": dims.max_inflight_slices,
        "consumer_count": dims.consumer_count,
        "consumers": contract.PEERS,
    }


def selfcheck_result(on_gpu: bool) -> tuple[bool, str]:
    """The self-check's result row: the example call's pool and state, bit for bit against
    the reference (the op writes two tensors, so the default one-tensor check does not fit).
    Without a GPU the kernel runs interpreted, in small blocks so that several programs loop
    and the last to arrive is not the last in the grid."""
    args = example_inputs("cuda:0" if on_gpu else "cpu", small=not on_gpu,
                          generator=torch.Generator().manual_seed(0))
    before = args["pool"].clone()
    pool, state = reference(**args)
    if on_gpu:
        copy_and_publish(**args)
        where = "GPU cuda:0"
    else:
        launch_interpreted(**args, reverse_programs=True, block_bytes=64)
        where = "Triton interpreter"
    detail = f"{where}, pool {before.numel()} B, lease {args['lease'].tolist()}"
    if torch.equal(pool, before):
        return False, f"{detail}: the example call writes nothing"
    return torch.equal(args["pool"], pool) and torch.equal(args["state"], state), detail
