"""Testing helpers built on the contracts: fake-tensor tracing, GPU markers, hypothesis strategies.

Importing this module needs pytest and hypothesis (the ``test`` extra); the ops never import it.
Everything a test draws comes from a contract module's ``Dims``/``valid_spec``/``NEAR_MISSES``,
so the tests exercise exactly the input space the contract declares.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)

from . import conv_window_scatter as cws
from . import conv_window_scatter_multi as cwm
from . import mamba_state_scatter as mss
from . import sparse_mla_prefill as smp
from . import transport_pool as tp
from ._specs import TensorSpec, build, build_value, buildable_here

HAS_CUDA = torch.cuda.is_available()
HAS_TWO_GPUS = HAS_CUDA and torch.cuda.device_count() >= 2


def gpu(fn):
    """Mark a test as needing a CUDA GPU (``-m gpu`` selects it; skipped without CUDA)."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")(fn))


def multi_gpu(fn):
    """Mark a test as needing two CUDA GPUs (``-m multi_gpu`` selects it; skipped with fewer).
    It is a GPU test too, so ``-m gpu`` selects it as well."""
    two = pytest.mark.skipif(not HAS_TWO_GPUS, reason="needs two CUDA GPUs")
    return pytest.mark.gpu(pytest.mark.multi_gpu(two(fn)))


@contextlib.contextmanager
def fake_mode():
    """Fake tensors with a shape environment: ``torch.empty(..., device="cuda:1")`` works
    without a GPU, and Dynamo can trace them with symbolic sizes."""
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        yield mode


def error_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from (a tracing error wraps the op's own error)."""
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def dynamo_error_text(exc: BaseException) -> str:
    """The text of a tracing error, including the chained original error."""
    return "\n".join(f"{type(e).__name__}: {e}" for e in error_chain(exc))


# --------------------------------------------------------------------------------------------
# fused_mamba_state_scatter_with_mask


@st.composite
def mamba_dims(draw, device: str = "cuda:0", max_state_elems: int = 96) -> mss.Dims:
    """Valid call dimensions: layer counts, state shapes, dtypes and index dtypes at random."""
    state_rank = draw(st.integers(0, 3))
    state = []
    for _ in range(state_rank):
        budget = max_state_elems // max(1, _prod(state))
        state.append(draw(st.integers(1, max(1, min(budget, 16)))))
    return mss.Dims(
        num_layers=draw(st.integers(1, 4)),
        cache_size=draw(st.integers(1, 9)),
        spec_size=draw(st.integers(1, 6)),
        draft_tokens=draw(st.integers(1, 4)),
        state_shape=tuple(state),
        total_requests=draw(st.integers(0, 8)),
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int8])),
        index_dtypes=tuple(draw(st.sampled_from(mss.INDEX_DTYPES)) for _ in range(3)),
        with_src_indices=draw(st.booleans()),
        device=device,
    )


def mamba_index_values(draw, d: mss.Dims) -> dict:
    """Index values mixing valid, negative, out-of-range (also near INT32_MAX) and duplicates."""
    n = d.total_requests

    def column(upper: int) -> list[int]:
        return draw(st.lists(
            st.one_of(st.integers(0, max(upper - 1, 0)), st.integers(-3, -1),
                      st.integers(upper, upper + 2), st.just(2**31 - 1), st.just(-(2**31))),
            min_size=n, max_size=n))

    return {
        "dst_indices_raw": column(d.cache_size),
        "step_indices_raw": column(d.draft_tokens),
        "src_indices_raw": column(d.spec_size) if d.with_src_indices else None,
    }


@st.composite
def mamba_near_miss(draw, device: str = "cuda:0"):
    """(rule, spec) where ``spec`` breaks exactly ``rule`` of the contract."""
    rule = draw(st.sampled_from(mss.CONTRACT.rules))
    spec = mss.NEAR_MISSES[rule](mss.valid_spec(draw(mamba_dims(device=device))))
    return rule, spec


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


__all__ = [
    "HAS_CUDA",
    "HAS_TWO_GPUS",
    "build",
    "dynamo_error_text",
    "error_chain",
    "fake_mode",
    "gpu",
    "mamba_dims",
    "mamba_index_values",
    "mamba_near_miss",
    "multi_gpu",
]


# --------------------------------------------------------------------------------------------
# sparse_mla_q8kv8_prefill_fwd

# Rules whose near miss puts a tensor on a second GPU: fake tensors may name one on a machine
# without CUDA, but not on a machine with exactly one GPU.
SPARSE_MLA_SECOND_GPU_RULES = frozenset(
    r for r in smp.CONTRACT.rules if r.endswith("_device"))
CAN_NAME_SECOND_GPU = not HAS_CUDA or HAS_TWO_GPUS


@st.composite
def sparse_mla_dims(draw, device: str = "cuda:0", small: bool = False) -> smp.Dims:
    """Valid call dimensions, optional arguments at random. ``small``: interpreter-sized
    (``s_q <= 4``, ``h_q = 64``, ``topk = 128``, ``s_kv <= 300``)."""
    with_attn_sink = draw(st.booleans())
    return smp.Dims(
        s_q=draw(st.integers(1, 4 if small else 9)),
        s_kv=draw(st.integers(1, 300)),
        h_q=64 if small else draw(st.sampled_from([64, 128, 192])),
        d_qk=draw(st.sampled_from(smp.D_QKS)),
        topk=128 if small else draw(st.sampled_from([128, 256])),
        with_topk_length=with_attn_sink or draw(st.booleans()),
        with_attn_sink=with_attn_sink,
        with_buffers=draw(st.booleans()),
        with_errors=draw(st.booleans()),
        device=device,
    )


@st.composite
def sparse_mla_near_miss(draw, device: str = "cuda:0"):
    """(rule, spec) where ``spec`` breaks exactly ``rule`` of the contract; rules that need a
    second GPU only where one can be named."""
    rules = [r for r in smp.CONTRACT.rules
             if CAN_NAME_SECOND_GPU or r not in SPARSE_MLA_SECOND_GPU_RULES]
    rule = draw(st.sampled_from(rules))
    return rule, smp.NEAR_MISSES[rule](smp.valid_spec(draw(sparse_mla_dims(device=device))))


def build_symbolic(spec: dict, mode: FakeTensorMode) -> dict:
    """Like :func:`build`, but every size and stride is a symbol of ``mode``'s shape env: the
    tensors a dynamic-shape trace sees. Entries that are not tensor specs pass unchanged, and
    a spec that is not ``symbolic`` (a view into shared or offset storage) is built as is."""
    def make(s: TensorSpec) -> torch.Tensor:
        if not s.symbolic:
            return s.empty()
        real = torch.empty_strided(s.shape, s.strides, dtype=s.dtype, device="meta")
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * len(s.shape))
        sym = mode.from_tensor(real, symbolic_context=ctx)  # symbolic sizes, device "meta"
        return torch.empty_strided(sym.shape, sym.stride(), dtype=s.dtype, device=s.device)

    return {name: build_value(s, make) for name, s in spec.items()}


__all__ += [
    "CAN_NAME_SECOND_GPU",
    "SPARSE_MLA_SECOND_GPU_RULES",
    "build_symbolic",
    "sparse_mla_dims",
    "sparse_mla_near_miss",
]


# --------------------------------------------------------------------------------------------
# copy_and_publish (the GPU transport pool)

TRANSPORT_SRC_DTYPES = (torch.uint8, torch.bool, torch.bfloat16, torch.float32, torch.int64)


@st.composite
def transport_dims(draw, device: str = "cuda:0", max_data: int = 2048) -> tp.Dims:
    """Valid call dimensions: pool layout, a data region of 1..``max_data`` bytes (not always a
    multiple of 256), and a source of any rank (0-2) and dtype that fits it."""
    slots, consumers = draw(st.integers(1, 9)), draw(st.integers(1, 4))
    data = draw(st.integers(1, max_data))
    dtype = draw(st.sampled_from(TRANSPORT_SRC_DTYPES))
    most = max(1, data // dtype.itemsize)
    if most * dtype.itemsize > data:  # not even one element fits: bytes do
        dtype = torch.uint8
    numel = draw(st.integers(1, most))
    rank = draw(st.integers(0 if numel == 1 else 1, 2))
    if rank == 0:
        shape = ()
    elif rank == 1:
        shape = (numel,)
    else:
        rows = draw(st.sampled_from([d for d in range(1, numel + 1) if numel % d == 0]))
        shape = (rows, numel // rows)
    return tp.Dims(memory_size=tp.data_start(slots, consumers) + data,
                   max_inflight_slices=slots, consumer_count=consumers, src_shape=shape,
                   src_dtype=dtype, device=device)


def transport_src_nbytes(d: tp.Dims) -> int:
    return _prod(d.src_shape) * d.src_dtype.itemsize


@st.composite
def transport_lease(draw, d: tp.Dims) -> tp.Lease:
    """Lease values for a call with dims ``d``: a fitting lease, or one broken in one or two
    ways, each just past one bound of :func:`~strictops.meta.transport_pool.lease_fits`
    (misaligned, in the control words, past the range or the pool, longer than the source,
    a slot that does not exist, an ack word for the ready word, generation 0 / 2**31) or one
    field set to any int64."""
    start0 = tp.data_start(d.max_inflight_slices, d.consumer_count)
    src_nbytes = transport_src_nbytes(d)
    start = draw(st.sampled_from(range(start0, d.memory_size, tp.DATA_ALIGNMENT)))
    nbytes = draw(st.integers(1, min(src_nbytes, d.memory_size - start)))
    end = draw(st.integers(start + nbytes, d.memory_size))
    slot = draw(st.integers(0, d.max_inflight_slices - 1))
    ready = slot * tp.slot_bytes(d.consumer_count)
    lease = tp.Lease(start, end, nbytes, slot, draw(st.integers(1, tp.MAX_GENERATION)), ready,
                     ready + tp.WORD_BYTES)
    if draw(st.booleans()):
        return lease
    stride = tp.slot_bytes(d.consumer_count)

    def in_slot(k: int) -> dict:  # a slot with its own ready and ack words
        return {"slot": k, "ready_byte_offset": k * stride,
                "ack_byte_offset": k * stride + tp.WORD_BYTES}

    # Each breaks one term of lease_fits and keeps the others where it can.
    breaks = [
        {"start": start + draw(st.integers(1, tp.DATA_ALIGNMENT - 1)), "end": d.memory_size},
        {"start": start0 - tp.DATA_ALIGNMENT},
        {"end": start - 1},
        {"end": start + nbytes - 1},
        {"end": d.memory_size + draw(st.integers(1, 2**40))},
        {"nbytes": draw(st.sampled_from([0, -1, -(2**63)]))},
        {"nbytes": src_nbytes + 1, "end": d.memory_size},
        in_slot(-draw(st.integers(1, 3))),
        in_slot(d.max_inflight_slices + draw(st.integers(0, 2))),
        {"ready_byte_offset": ready + tp.WORD_BYTES, "ack_byte_offset": ready + 2 * tp.WORD_BYTES},
        {"ack_byte_offset": ready + 2 * tp.WORD_BYTES},
        {"generation": draw(st.sampled_from([0, -1, tp.MAX_GENERATION + 1,
                                             2**32 + lease.generation]))},
        {draw(st.sampled_from(tp.Lease._fields)): draw(st.integers(-(2**63), 2**63 - 1))},
    ]
    # Mostly one break, so that each term of the rule is the only one to fail now and then.
    count = draw(st.sampled_from([1, 1, 1, 2]))
    for change in draw(st.lists(st.sampled_from(breaks), min_size=count, max_size=count)):
        lease = lease._replace(**change)
    return lease


@st.composite
def transport_near_miss(draw, device: str = "cuda:0"):
    """(rule, spec) where ``spec`` breaks exactly ``rule`` of the contract."""
    rule = draw(st.sampled_from(tp.CONTRACT.rules))
    return rule, tp.NEAR_MISSES[rule](tp.valid_spec(draw(transport_dims(device=device))))


# Helpers any op's tests can use (written with the transport pool's).


def raised(fn, **kwargs) -> BaseException:
    """The exception ``fn(**kwargs)`` raises; the calling test fails if it raises none."""
    with pytest.raises(Exception) as info:
        fn(**kwargs)
    return info.value


def near_miss_message(fn, contract_module, rule: str, dims) -> str:
    """The text of the ``ValueError`` that ``fn`` raises on fake tensors for the near miss of
    ``rule`` (``contract_module``: an op's ``strictops.meta`` module; ``dims``: its ``Dims``)."""
    spec = contract_module.NEAR_MISSES[rule](contract_module.valid_spec(dims))
    with fake_mode():
        err = raised(fn, **build(spec))
    assert type(err) is ValueError, err
    return str(err)


def assert_rule_fails_at_trace_time(fn, contract_module, rule: str, dims) -> None:
    """``torch.compile(fn, fullgraph=True, dynamic=True)`` on the fake near miss of ``rule``
    fails while tracing, and the error carries the rule's message with concrete numbers."""
    compiled = torch.compile(fn, backend="eager", fullgraph=True, dynamic=True)
    spec = contract_module.NEAR_MISSES[rule](contract_module.valid_spec(dims))
    if not buildable_here(spec):
        pytest.skip("the near miss names a GPU this machine lacks")
    with fake_mode():
        args = build(spec)
        _, message = contract_module.CONTRACT.expected_error(rule, **args)
        with pytest.raises(Exception) as info:
            compiled(**args)
    assert type(info.value).__name__ == "TorchRuntimeError"
    assert message in dynamo_error_text(info.value)  # with numbers, not symbols like s69


def assert_near_miss_parity(fn, contract_module, rule: str, spec: dict) -> None:
    """One rule broken at a time: the eager path (concrete sizes) and the fake path (symbolic
    sizes, as torch.compile/export trace) both raise exactly that rule's error."""
    with fake_mode():  # concrete sizes: what an eager call computes
        args = build(spec)
        want = contract_module.CONTRACT.expected_error(rule, **args)
        eager = raised(fn, **args)
    with fake_mode() as mode:  # symbolic sizes: what a dynamic-shape trace computes
        fake = raised(fn, **build_symbolic(spec, mode))
    assert (type(eager), str(eager)) == want
    assert (type(fake), str(fake)) == want


def assert_every_rule_pinned(testcase, contract_module) -> None:
    """Every rule of the contract has a ``test_<rule>`` on ``testcase`` (its pinned message)."""
    pinned = {name[len("test_"):] for name in dir(testcase) if name.startswith("test_")}
    testcase.assertEqual(set(contract_module.CONTRACT.rules) - pinned, set())


def kernel_launches(gm: torch.fx.GraphModule) -> list:
    """The kernel launches of a traced graph: Triton launches (``wrap_triton``) and the ops of
    the ``strictops_kernels`` namespace (launches Inductor cannot compile itself, such as a
    Gluon kernel's), directly or functionalised."""
    def launches(n) -> bool:
        if "triton_kernel_wrapper" in str(n.target):
            return True
        functionalized = (torch.ops.higher_order.auto_functionalized,
                          torch.ops.higher_order.auto_functionalized_v2)
        target = n.args[0] if n.target in functionalized else n.target
        return getattr(target, "namespace", None) == "strictops_kernels"
    return [n for n in gm.graph.nodes if n.op == "call_function" and launches(n)]


def capture_cuda_graph(fn, *args, **kwargs):
    """``(graph, result)``: ``fn(*args, **kwargs)`` run once on a side stream (compiling and
    loading its kernels), then captured in a CUDA graph; ``result`` is the captured call's."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(*args, **kwargs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn(*args, **kwargs)
    return graph, result


class _GraphCaptured(Exception):
    pass


def aot_forward_graph(fn, args: dict):
    """The forward graph AOTAutograd hands to Inductor for ``fn(**args)`` (fullgraph, dynamic).

    The graph is captured at compile time; running it may need a GPU, so the "compiled"
    function stops the call instead.
    """
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)

        def stop(*_):
            raise _GraphCaptured

        return stop

    compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=capture), fullgraph=True,
                             dynamic=True)
    with pytest.raises(_GraphCaptured):
        compiled(**args)
    return graphs[0]


def aot_op_graph(op, args: dict) -> torch.fx.GraphModule:
    """:func:`aot_forward_graph` of one call of ``op`` (an ``OpOverload``) on ``args``, returning
    its result and the arguments its schema writes."""
    written = [a.name for a in op._schema.arguments
               if a.alias_info is not None and a.alias_info.is_write]

    def call(**kwargs):
        return op(**kwargs), *(kwargs[name] for name in written)

    return aot_forward_graph(call, args)


__all__ += [
    "TRANSPORT_SRC_DTYPES",
    "aot_forward_graph",
    "aot_op_graph",
    "assert_every_rule_pinned",
    "assert_near_miss_parity",
    "assert_rule_fails_at_trace_time",
    "capture_cuda_graph",
    "kernel_launches",
    "near_miss_message",
    "raised",
    "transport_dims",
    "transport_lease",
    "transport_near_miss",
    "transport_src_nbytes",
]


# --------------------------------------------------------------------------------------------
# fused_conv_window_scatter_with_mask

CONV_WINDOW_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.int8)


@st.composite
def conv_window_dims(draw, device: str = "cuda:0") -> cws.Dims:
    """Valid call dimensions: every size >= 1 (window widths 1-6, so that a tile's column
    block is partial, whole or repeated), overlapping or contiguous windows, any dtypes."""
    return cws.Dims(
        num_layers=draw(st.integers(1, 3)),
        cache_size=draw(st.integers(1, 9)),
        spec_size=draw(st.integers(1, 6)),
        draft_tokens=draw(st.integers(1, 4)),
        dim=draw(st.integers(1, 40)),
        km1=draw(st.integers(1, 6)),
        total_requests=draw(st.integers(0, 8)),
        dtype=draw(st.sampled_from(CONV_WINDOW_DTYPES)),
        index_dtypes=tuple(draw(st.sampled_from(cws.INDEX_DTYPES)) for _ in range(3)),
        with_src_indices=draw(st.booleans()),
        overlapping=draw(st.booleans()),
        device=device,
    )


def conv_window_index_values(draw, d: cws.Dims) -> dict:
    """Index values of a call with dims ``d``: as :func:`mamba_index_values` draws them."""
    return mamba_index_values(draw, d)


def conv_window_tensors(dims: cws.Dims, values: dict, device: str, gen: torch.Generator) -> dict:
    """Real tensors for ``dims``: random conv states (never all zeros), ``src`` an overlapping
    window view of a random shared buffer when ``dims.overlapping``, and the index ``values``
    (``{name: list or None}``)."""
    def random(*shape):
        if dims.dtype.is_floating_point:
            return torch.randn(shape, generator=gen).to(dtype=dims.dtype, device=device)
        return torch.randint(-100, 100, shape, generator=gen).to(dtype=dims.dtype, device=device)

    L, spec, draft, dim, km1 = (dims.num_layers, dims.spec_size, dims.draft_tokens, dims.dim,
                                dims.km1)
    if dims.overlapping:
        width = draft + km1 - 1
        src = random(L, spec, dim, width).as_strided(
            (L, spec, draft, dim, km1), (spec * dim * width, dim * width, 1, width, 1))
    else:
        src = random(L, spec, draft, dim, km1)
    return {"dst": random(L, dims.cache_size, dim, km1), "src": src,
            **_index_tensors(cws.valid_spec(dims), values, device)}


def _index_tensors(specs: dict, values: dict, device: str) -> dict:
    return {name: None if vals is None else torch.tensor(vals, dtype=specs[name].dtype,
                                                         device=device)
            for name, vals in values.items()}


@st.composite
def conv_window_near_miss(draw, device: str = "cuda:0"):
    """(rule, spec) where ``spec`` breaks exactly ``rule`` of the contract."""
    rule = draw(st.sampled_from(cws.CONTRACT.rules))
    return rule, cws.NEAR_MISSES[rule](cws.valid_spec(draw(conv_window_dims(device=device))))


__all__ += [
    "CONV_WINDOW_DTYPES",
    "conv_window_dims",
    "conv_window_index_values",
    "conv_window_near_miss",
    "conv_window_tensors",
]


# --------------------------------------------------------------------------------------------
# fused_conv_window_scatter_multi

# Rules whose near miss puts a pair on a second GPU (a CPU tensor would break an earlier rule).
CONV_WINDOW_MULTI_SECOND_GPU_RULES = frozenset({"one_device"})


@st.composite
def conv_window_multi_dims(draw, device: str = "cuda:0",
                           max_pairs: int = cwm.MAX_PAIRS) -> cwm.Dims:
    """Valid call dimensions: 1 to ``max_pairs`` pairs of any dims, widths and dtypes, one or
    two request sets (either may be empty), overlapping or contiguous windows."""
    one = draw(conv_window_dims(device=device))
    windows = draw(st.lists(
        st.tuples(st.integers(1, 20), st.integers(1, 5), st.sampled_from(CONV_WINDOW_DTYPES)),
        min_size=1, max_size=max_pairs))
    return cwm.Dims(
        num_layers=one.num_layers, cache_size=one.cache_size, spec_size=one.spec_size,
        draft_tokens=one.draft_tokens, windows=tuple(windows), n1=one.total_requests,
        n2=draw(st.one_of(st.none(), st.integers(0, 8))),
        index_dtypes=tuple(draw(st.sampled_from(mss.INDEX_DTYPES))
                           for _ in range(4)),
        overlapping=one.overlapping, device=device,
    )


def conv_window_multi_index_values(draw, d: cwm.Dims) -> dict:
    """Index values of both request sets, as :func:`mamba_index_values` draws them (rows are
    the requests' positions, so a set longer than ``spec_size`` has out-of-range rows too)."""
    def one_set(n):
        return mamba_index_values(draw, mss.Dims(
            num_layers=d.num_layers, cache_size=d.cache_size, spec_size=d.spec_size,
            draft_tokens=d.draft_tokens, state_shape=(), total_requests=n))

    first = one_set(d.n1)
    second = one_set(d.n2) if d.n2 is not None else None
    return {
        "dst_indices_raw": first["dst_indices_raw"],
        "step_indices_raw": first["step_indices_raw"],
        "dst_indices2_raw": None if second is None else second["dst_indices_raw"],
        "step_indices2_raw": None if second is None else second["step_indices_raw"],
    }


def conv_window_multi_tensors(dims: cwm.Dims, values: dict, device: str,
                              gen: torch.Generator) -> dict:
    """Real tensors for ``dims`` (each pair as :func:`conv_window_tensors` makes it) and the
    index ``values``."""
    dsts, srcs = [], []
    for dim, km1, dtype in dims.windows:
        pair = conv_window_tensors(
            cws.Dims(dims.num_layers, dims.cache_size, dims.spec_size, dims.draft_tokens, dim,
                     km1, 0, dtype=dtype, overlapping=dims.overlapping), {}, device, gen)
        dsts.append(pair["dst"])
        srcs.append(pair["src"])
    return {"dsts": dsts, "srcs": srcs, **_index_tensors(cwm.valid_spec(dims), values, device)}


@st.composite
def conv_window_multi_near_miss(draw, device: str = "cuda:0"):
    """(rule, spec) where ``spec`` breaks exactly ``rule`` of the contract; rules that need a
    second GPU only where one can be named."""
    rules = [r for r in cwm.CONTRACT.rules
             if CAN_NAME_SECOND_GPU or r not in CONV_WINDOW_MULTI_SECOND_GPU_RULES]
    rule = draw(st.sampled_from(rules))
    return rule, cwm.NEAR_MISSES[rule](cwm.valid_spec(draw(conv_window_multi_dims(device=device))))


__all__ += [
    "CONV_WINDOW_MULTI_SECOND_GPU_RULES",
    "conv_window_multi_dims",
    "conv_window_multi_index_values",
    "conv_window_multi_near_miss",
    "conv_window_multi_tensors",
]
