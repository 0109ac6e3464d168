"""The C++ eager path: a plain eager call whose signature the op's Python path has served
before runs in C++, from a plan made once per signature.

A call in plain eager mode costs its host time, and in Python that is tens of microseconds: the
contract's cached verdict (its signature alone is a tuple of every tensor's metadata), the
allocations, the cached launcher's key, the launch. :class:`HostPath` keeps, per op, a
``PlanCache`` of the compiled extension ``strictops.ops._runtime._host_plans``
(``ops/_runtime/host_plans/``) that does the same in one C++ call, in this order:

1. the call's key: per argument ``None``; a plain ``torch.Tensor``'s dtype, device, layout,
   sizes, strides, storage offset, whether its address is a multiple of 16 and which earlier
   tensor, if any, is the same object; a ``bool``'s, ``int``'s or ``float``'s type and value; a
   list's or tuple's type, length and items (two levels: a list of tensor pairs). It is at
   least as fine as the contract's cached signature
   (:class:`strictops.meta._contract.CachedValidation`) and the cached launcher's key
   (:class:`strictops.ops._runtime.launcher.Launcher`) together, so a plan never serves a call that
   the
   contract or Triton's specialisation could treat otherwise. A :class:`HostPath` with
   ``per_call`` names keys only the arguments before them: those are integers (a lease's
   fields, an address) that parameters declared ``do_not_specialize`` and result slices take,
   checked per call against the parameter's type and the address's alignment;
2. the gate of :func:`strictops.ops._runtime.dispatch.can_skip_dispatcher` (no dispatch or
   torch-function mode, no functorch transform, no tensor subclass, no input that requires grad
   while grad mode is on) and Triton's launch state (no launch hook, the kernel's globals and
   pre-run hooks, ``debug`` and the instrumentation mode as when planned);
3. the per-call rows of the contract that the signature runs, all of them ``disjoint`` rows
   (:func:`strictops.meta._contract.disjoint_check`, from their declared pairs) or ``inside``
   rows (:func:`strictops.meta._contract.inside_check`, on the tensors they name);
4. the allocations of the outputs not given, one launch on the current stream of the plan's
   device (``cuLaunchKernelEx``, the parameters packed as Triton's launcher packs them), the
   version-counter bump of the arguments the op writes, the result. A kernel gets plans only
   where the cached launcher verified its launch against Triton's own and the running
   Triton's launcher is read to pack its parameters the same way
   (:func:`strictops.ops._runtime.triton_abi.c_parameters_known`).

Anything else returns :data:`MISS`, and the caller runs its Python path, which raises the
contract's errors. The Python path registers a plan after it served a call (:meth:`register`):
only signatures whose per-call rows are all ``disjoint`` or ``inside`` rows get one, and only
where every kernel argument is a tensor of the call, a per-call integer or a function of its
signature. A call whose signature has a plan and whose per-call rows hold is therefore one the
contract passes, launched as the Python path would launch it: the tests compare the two launch
by launch (a recording stand-in for the driver) and verdict by verdict.

Without the extension (a build without torch in the build environment, or
``STRICTOPS_NO_HOST_EXTENSION=1`` at install) every call takes the Python path.
"""

from __future__ import annotations

import copy
import struct
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import torch
from triton import knobs

from strictops.meta._contract import EAGER_GATE, CachedValidation

try:
    from strictops.ops._runtime import _host_plans
except ImportError:  # built without the extension
    _host_plans = None

__all__ = ["HostPath", "MISS", "Slice", "available"]

MISS = _host_plans.MISS if _host_plans is not None else object()


def available() -> bool:
    """Whether this installation has the C++ eager path."""
    return _host_plans is not None


def _no_cuda_device(*args: Any) -> int:
    return -1


def configure(recorder=None, get_device=None, get_stream=None) -> None:
    """Set what every plan cache consults: the gate, the current device and stream, the global
    launch-state guards; ``recorder`` (tests): a callable that receives each launch instead of
    the driver (``function, grid, threads, shared, num_ctas, pdl, cooperative, stream, params,
    offsets``)."""
    if _host_plans is None:
        return
    runtime, compilation = knobs.runtime, knobs.compilation
    empty = _host_plans.EMPTY
    _host_plans.configure(
        tensor_type=torch.Tensor,
        gate=EAGER_GATE,
        get_device=get_device or getattr(torch._C, "_cuda_getDevice", _no_cuda_device),
        get_stream=get_stream or getattr(torch._C, "_cuda_getCurrentRawStream", None)
        or _no_cuda_device,
        guards=((runtime, ("debug",), runtime.debug),
                (compilation, ("instrumentation_mode",), compilation.instrumentation_mode),
                (runtime, ("launch_enter_hook", "calls"), empty),
                (runtime, ("launch_exit_hook", "calls"), empty)),
        recorder=recorder)


configure()


# A result item that is None (the extension's kNoneRef).
_NONE_REF = -(1 << 30)


def _always_miss(*args: Any) -> Any:
    return MISS


def _never_known(*args: Any) -> None:
    return None


# How Triton's launcher passes a scalar parameter of each signature type (little-endian).
_SCALAR_FORMATS = {"i1": "b", "i8": "b", "u1": "B", "u8": "B", "i16": "h", "u16": "H",
                   "i32": "i", "u32": "I", "i64": "q", "u64": "Q", "fp16": "e", "fp32": "f",
                   "f32": "f", "fp64": "d"}


def _packed(kind: str, value: Any) -> bytes | None:
    """A scalar parameter's bytes as Triton's C launcher packs them, or None for a kind or
    value it does not take here."""
    if kind == "bf16":
        if value.__class__ is not float:
            return None
        return struct.pack("<I", struct.unpack("<I", struct.pack("<f", value))[0] >> 16)[:2]
    fmt = _SCALAR_FORMATS.get(kind)
    if fmt is None or value.__class__ not in (int, float, bool):
        return None
    try:
        return struct.pack("<" + fmt, value)
    except (struct.error, OverflowError):
        return None


class Slice(NamedTuple):
    """A result item of a plan: ``argument[start:start + length]`` (dim 0), each a name of
    :attr:`HostPath.names`, ``start`` and ``length`` per-call integers."""

    argument: str
    start: str
    length: str


class HostPath:
    """The C++ eager path of one op whose positional arguments are named ``names`` (the order
    the public function passes them to :attr:`call`; by default the validation's), then
    ``per_call``: integers that are not part of the key (a lease's offsets, an address), which
    kernel parameters and result slices may take per call. ``writes``: the names of the
    arguments the op writes (their version counters are bumped, as the dispatcher does)."""

    def __init__(self, validation: CachedValidation,
                 writes: Sequence[str] | Callable[[tuple], Iterable[torch.Tensor]] = (),
                 names: Sequence[str] | None = None, per_call: Sequence[str] = ()) -> None:
        self.validation = validation
        keyed = tuple(validation.names if names is None else names)
        self.names = keyed + tuple(per_call)
        self.keyed = len(keyed)
        # The tensors whose version counters a call bumps: of the arguments named, or those
        # ``writes(args)`` gives (tensors inside list arguments).
        self.writes = writes if callable(writes) else _named_tensors(
            tuple(self.names.index(n) for n in writes))
        self.cache = (_host_plans.PlanCache(keyed=len(keyed) if per_call else -1)
                      if _host_plans is not None else None)
        # ``call(*args)``: the plan's result, or MISS. ``known(*args)``: whether the signature
        # of ``args`` (the per-call integers may be left out) has an entry: a call of it has
        # passed the contract before (None where it has no key).
        self.call = self.cache if self.cache is not None else _always_miss
        self.known = self.cache.known if self.cache is not None else _never_known

    def register(self, args: tuple, launcher, grid: Sequence[int], kernel_args: Sequence[Any],
                 options: tuple, device: int, allocations: Sequence[tuple] = (),
                 fresh: Sequence[torch.Tensor] = (), result: Any = None,
                 settings: Sequence[tuple] = (), named: Mapping[int, str] | None = None,
                 validated: tuple | None = None) -> None:
        """After the Python path served ``args`` (the op's arguments, as :attr:`call` takes
        them): make the plan of their signature, unless it has an entry already.

        ``launcher``, ``grid``, ``kernel_args`` (every kernel parameter in signature order),
        ``options`` and ``device``: the launch the Python path made through the cached
        launcher. ``allocations``: per allocation the Python path made, ``(sizes, dtype,
        split)`` (``split``: unbound along dim 0), in order, and ``fresh`` the tensors they gave
        (flattened). ``result``: what the op returned: None, a tensor or a :class:`Slice`, or a
        tuple of tensors (each an argument or a fresh tensor) and Nones. ``settings``:
        ``(namespace, name)`` of each module setting the Python path read to choose its launch
        (a kernel choice, a tuning dict): the plan serves calls only while each equals its
        value now. ``named``: kernel parameters given by name, by index in ``kernel_args``: a
        tensor argument's address (for a :class:`~strictops.ops._runtime.launcher.Pointer` standing
        for it) or a per-call integer. ``validated``: the arguments as the validation takes
        them, where they differ from ``args``.

        Every non-tensor kernel argument must be a function of the signature (sizes, strides,
        dtypes, scalar arguments), never of a tensor's address or values; the signature gets
        no plan (an entry of None) where a per-call row is neither a ``disjoint`` nor an
        ``inside`` row, or where a kernel argument or the result is something a plan cannot
        name.
        """
        cache = self.cache
        if cache is None or cache.known(*args) is not False:
            return
        validated = args if validated is None else validated
        rows = self.validation.rows_for(validated)
        if rows is None:
            return  # not a passed signature (cannot happen after a served call; no entry)
        spec = self._spec(args, validated, rows, launcher, grid, kernel_args, options, device,
                          allocations, fresh, result, named or {})
        if spec is not None and settings:
            spec = (*spec[:7], (*spec[7], *((namespace, (name,), _copy(namespace[name]), True)
                                            for namespace, name in settings)), spec[8])
        cache.add(args, spec)

    def _spec(self, args, validated, rows, launcher, grid, kernel_args, options, device,
              allocations, fresh, result, named):
        if any(not (c.disjoint or c.inside) for c in rows):
            return None
        # The call's leaves (see make_key in _runtime/host_plans/keys.cpp): each argument, a
        # list's or tuple's items in its place, then the per-call integers; ``position[i]``:
        # argument ``i``'s leaf (None for a list). A tensor found several times is named by its
        # first leaf (the key holds which leaves are one object).
        leaves, position = _leaves(args, self.keyed)
        refs: dict[int, int] = {}
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                refs.setdefault(id(leaf), i)
        tensor_refs = dict(refs)
        for k, t in enumerate(fresh):
            refs[id(t)] = -k - 1
        index = {n: i for i, n in enumerate(self.names)}
        pairs = [position[index[n]] for c in rows for x, y in c.disjoint
                 if args[index[x]] is not None and args[index[y]] is not None for n in (x, y)]
        namespace = self.validation.namespace(*validated) if any(c.inside for c in rows) else None
        inside = [tensor_refs.get(id(t)) for c in rows if c.inside for t in c.inside(namespace)]
        bump = [tensor_refs.get(id(t)) for t in self.writes(args)]
        if None in pairs or None in inside or None in bump:
            return None
        by_name = {k: position[index[name]] for k, name in named.items()}
        if None in by_name.values() or any(
                index[named[k]] < self.keyed and kernel_args[k].data_ptr() != leaves[i].data_ptr()
                for k, i in by_name.items()):
            return None  # a pointer given for a tensor argument that is not its address
        prepared = launcher.prepared_for(kernel_args, options, device)
        launch = None if prepared is None else _launch(
            prepared, grid, kernel_args, refs, by_name, len(leaves) - (len(args) - self.keyed),
            launcher.fn.params)
        if launch is None:
            return None
        if result is None:
            kind, returned = 0, ()
        elif isinstance(result, (torch.Tensor, Slice)):
            kind, returned = 1, (result,)
        else:
            kind, returned = 2, tuple(result)
        result_refs = tuple(_NONE_REF if t is None else
                            tuple(position[index[n]] for n in t) if isinstance(t, Slice) else
                            refs.get(id(t)) for t in returned)
        if None in result_refs or any(isinstance(r, tuple) and None in r for r in result_refs):
            return None
        return (device, tuple(pairs), tuple(allocations), launch, tuple(bump), kind,
                result_refs, _launch_guards(launcher.fn, prepared), tuple(inside))


def _named_tensors(indices: tuple[int, ...]) -> Callable[[tuple], list]:
    """The tensors among arguments ``indices`` of a call (those given)."""
    return lambda args: [args[i] for i in indices if args[i] is not None]


def _leaves(args: tuple, keyed: int) -> tuple[list, list]:
    """The leaves of a call as ``make_key`` in ``_runtime/host_plans/keys.cpp`` orders them,
    and each argument's leaf index (None for a list or tuple)."""
    leaves, position = [], []
    for i, a in enumerate(args):
        if i < keyed and type(a) in (list, tuple):  # exactly: make_key has no key for others
            position.append(None)
            for item in a:
                if type(item) in (list, tuple):
                    leaves.extend(item)
                else:
                    leaves.append(item)
        else:
            position.append(len(leaves))
            leaves.append(a)
    return leaves, position


def _copy(value):
    """A setting's value as a plan keeps it: a copy (a dict of tuning may change in place,
    nested dicts too)."""
    return copy.deepcopy(value)


# How a per-call integer is passed, by the parameter's signature type (see ``Scalar`` in
# ``_runtime/host_plans/host_plans.h``); pointers: by whether the address is a multiple of 16.
_PER_CALL_KINDS = {"i32": "i", "i64": "q"}


def _launch(prepared, grid, kernel_args, refs, named, keyed, params_of):
    """A plan's launch: the compiled kernel of ``prepared`` on ``grid``, each pointer
    parameter a reference of ``refs`` (by the tensor's identity), each scalar packed; the
    parameters ``named`` (index -> leaf index) are the leaf's address where it is below
    ``keyed`` (a tensor argument), else the per-call integer (``params_of``: the JIT function's
    parameters). None where a parameter is none of these."""
    kernel = prepared.kernel
    num_warps, num_ctas, shared = kernel.packed_metadata
    if num_ctas != 1:
        return None
    params = []
    for i, (value, kind) in enumerate(zip(kernel_args, kernel.src.signature.values())):
        if kind == "constexpr":
            if i in named:
                return None  # specialised to its value: it cannot change per call
            continue
        if i in named:
            index = named[i]
            if index < keyed:
                if not kind.startswith("*"):
                    return None
                params.append(index)
                continue
            # An integer Triton specialises by value (1, multiples of 16) cannot change per
            # call; a pointer's alignment is checked per call.
            code = ("a" if value.data_ptr() & 15 else "A") if kind.startswith("*") else (
                _PER_CALL_KINDS.get(kind) if params_of[i].do_not_specialize else None)
            if code is None:
                return None
            params.append((index, code))
        elif kind.startswith("*"):
            ref = refs.get(id(value)) if isinstance(value, torch.Tensor) else None
            if ref is None:
                return None
            params.append(ref)
        else:
            packed = _packed(kind, value)
            if packed is None:
                return None
            params.append(packed)
    params += [bytes(8), bytes(8)]  # Triton's global and profile scratch: none
    grid = (*grid, 1, 1)[:3]
    run = kernel.run
    return (kernel.function, grid, 32 * num_warps, shared, num_ctas,
            bool(run.launch_pdl), bool(run.launch_cooperative_grid), tuple(params))


def _launch_guards(fn, prepared) -> tuple:
    """What a plan's launch checks on each call, where the cached launcher checks that each
    global its compiled kernel read still equals its value then: the kernel ``fn`` has no
    pre-run hook, and each such global is the object it is now, right after a launch that
    passed the launcher's check (a rebound global takes the Python path, which raises if its
    value changed)."""
    return ((fn, ("pre_run_hooks",), _host_plans.EMPTY),
            *((namespace, (name,), namespace.get(name)) for name, _, _, namespace
              in prepared.globals))
