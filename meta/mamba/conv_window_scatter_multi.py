"""Contract of ``strictops::fused_conv_window_scatter_multi``.

Arguments (the public function's; the op's schema takes the pairs as two ``Tensor[]``, ``dsts``
and ``srcs`` of one length, and its body zips them back into ``pairs`` before validating)
---------
pairs : list of 1 to 8 ``(dst, src)`` pairs of tensors (the public function unpacks each
    item as a pair: anything else fails there, with Python's unpacking error). ``dst``
    ``[num_layers, cache_size, dim_i, K_i-1]``, mutated in place, and ``src``
    ``[num_layers, spec_size, draft_tokens, dim_i, K_i-1]`` each obey
    ``fused_conv_window_scatter_with_mask``'s rules. Every pair shares ``num_layers``,
    ``cache_size``, ``spec_size``, ``draft_tokens`` and one CUDA device (one launch serves
    them all); dims, window widths and dtypes may differ.
dst_indices_raw, step_indices_raw : Tensor ``[n1]``, int32 or int64, on the pairs' device:
    the first request set (request ``i`` reads row ``i``).
dst_indices2_raw, step_indices2_raw : Tensor ``[n2]`` or None (both or neither): the second
    request set (its request ``j`` reads row ``j``).

The original has no checks of its own: sglang calls it only for pairs it has checked
(``_conv_multi_eligible``: at most 8 bf16 pairs sharing those sizes) and reads pointers from a
table cached by ``data_ptr()``. Here every such condition is a rule with a message, the pair
rules are the one-pair op's (``PAIR_RULES``), and any dtype is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import torch

from strictops.meta.mamba import conv_window_scatter as one
from strictops.meta.mamba import state_scatter as mamba_state_scatter
from strictops.meta._contract import Check, Contract, sym_all
from strictops.meta._specs import TensorSpec, other_device as _other_device

OP_NAME = "fused_conv_window_scatter_multi"
MAX_PAIRS = 8


def _pairs(a):
    return a.pairs


def _rule(name: str) -> Check:
    return one.pair_check(name, OP_NAME, _pairs, lambda i: f"pairs[{i}]: ")


def _pool_sizes(d, s):
    return (tuple(d.shape[:2]), tuple(s.shape[1:3]))


def _shared_sizes(a):
    d0, s0 = a.pairs[0]
    return sym_all(x == y for d, s in a.pairs
                   for x, y in zip((*d.shape[:2], *s.shape[1:3]), (*d0.shape[:2], *s0.shape[1:3])))


def _shared_sizes_message(pairs, **_):
    (d0, s0), i = pairs[0], next(i for i, (d, s) in enumerate(pairs)
                                 if _pool_sizes(d, s) != _pool_sizes(*pairs[0]))
    return (f"Expected every pair to share pairs[0]'s dst.shape[:2]={tuple(d0.shape[:2])} "
            f"(layers, cache) and src.shape[1:3]={tuple(s0.shape[1:3])} (spec, draft_tokens), "
            f"but pairs[{i}] has dst.shape[:2]={tuple(pairs[i][0].shape[:2])} and "
            f"src.shape[1:3]={tuple(pairs[i][1].shape[1:3])}")


def _device_message(pairs, **_):
    first = pairs[0][0].device
    i = next(i for i, (d, _) in enumerate(pairs) if d.device != first)
    return f"Expected every pair on pairs[0]'s device ({first}), but pairs[{i}] is on {pairs[i][0].device}"


def _index_rule(rule: str, dst_name: str, step_name: str) -> Check:
    """The state scatter's index rule ``rule`` on the request set ``(dst_name, step_name)``
    (skipped for an absent set: ``indices2_together`` has checked that both or neither are
    given), its message naming that set's tensors and ``pairs[0]``'s dst."""
    c = mamba_state_scatter.CONTRACT.check(rule)

    def holds(a):
        steps = getattr(a, step_name)
        if steps is None:
            return True
        return c.ok(SimpleNamespace(dst=a.pairs[0][0], dst_indices_raw=getattr(a, dst_name),
                                    step_indices_raw=steps))

    def text(**kw):
        msg = c.message(dst=kw["pairs"][0][0], dst_indices_raw=kw[dst_name],
                        step_indices_raw=kw[step_name])
        return msg.replace("dst_indices_raw", dst_name).replace("step_indices_raw", step_name)

    suffix = dst_name[len("dst_indices"):-len("_raw")]  # "" or "2"
    return Check(rule.replace("indices", "indices" + suffix), holds, text, c.error)


def _set1(rule: str) -> Check:
    return _index_rule(rule, "dst_indices_raw", "step_indices_raw")


def _set2(rule: str) -> Check:
    return _index_rule(rule, "dst_indices2_raw", "step_indices2_raw")


CHECKS = (
    Check(
        "pair_count",
        lambda a: 1 <= len(a.pairs) <= MAX_PAIRS,
        lambda pairs, **_: (f"Expected 1 to {MAX_PAIRS} (conv_states, conv_window) pairs, but "
                            f"got {len(pairs)}"),
    ),
    _rule("cuda_same_device"),
    Check(
        "one_device",
        lambda a: all(d.device == a.pairs[0][0].device for d, _ in a.pairs),
        _device_message,
    ),
    _rule("ranks"),
    _rule("layer_dim"),
    _rule("window_dims"),
    _rule("same_dtype"),
    Check("shared_sizes", _shared_sizes, _shared_sizes_message),
    _set1("indices_1d"),
    _set1("indices_length"),
    _set1("indices_dtype"),
    _set1("indices_device"),
    Check(
        "indices2_together",
        lambda a: (a.dst_indices2_raw is None) == (a.step_indices2_raw is None),
        lambda dst_indices2_raw, step_indices2_raw, **_: (
            "Expected dst_indices2_raw and step_indices2_raw both given or both None, but got "
            f"dst_indices2_raw {'None' if dst_indices2_raw is None else 'given'} and "
            f"step_indices2_raw {'None' if step_indices2_raw is None else 'given'}"),
    ),
    _set2("indices_1d"),
    _set2("indices_length"),
    _set2("indices_dtype"),
    _set2("indices_device"),
    _rule("dst_entry_contiguous"),
    _rule("src_inside_storage"),
    _rule("dst_inside_storage"),
)

# ``mutates`` names the schema's argument: the pairs' ``dst`` tensors, as ``dsts``.
CONTRACT = Contract(op=f"strictops::{OP_NAME}", stem="conv_window_scatter_multi",
                    module="mamba.conv_window_scatter_multi",
                    checks=CHECKS,
                    mutates=("dsts",))


# The validation's arguments, in order (the eager path's cached verdict,
# strictops.meta._contract.CachedValidation).
ARGUMENTS = ("pairs", "dst_indices_raw", "step_indices_raw", "dst_indices2_raw",
             "step_indices2_raw")


def validate(pairs, dst_indices_raw, step_indices_raw, dst_indices2_raw=None,
             step_indices2_raw=None) -> None:
    """Run the contract on real, fake or symbolic tensors; raise the first broken rule."""
    CONTRACT.validate(pairs=pairs, dst_indices_raw=dst_indices_raw,
                      step_indices_raw=step_indices_raw, dst_indices2_raw=dst_indices2_raw,
                      step_indices2_raw=step_indices2_raw)


# --------------------------------------------------------------------------------------------
# The input space, as data: valid calls and one near miss per rule.


@dataclass(frozen=True)
class Dims:
    """Free parameters of a valid call: ``windows`` holds ``(dim, km1, dtype)`` per pair;
    ``n2=None`` leaves out the second request set."""

    num_layers: int
    cache_size: int
    spec_size: int
    draft_tokens: int
    windows: tuple[tuple[int, int, torch.dtype], ...]
    n1: int
    n2: Optional[int] = None
    index_dtypes: tuple[torch.dtype, ...] = (torch.int64,) * 4
    overlapping: bool = True
    device: str = "cuda:0"


def valid_spec(d: Dims) -> dict:
    def index(n, dtype):
        return None if n is None else TensorSpec((n,), dtype, d.device)

    return {
        "pairs": [(TensorSpec((d.num_layers, d.cache_size, dim, km1), dtype, d.device),
                   one.window_view_spec(d.num_layers, d.spec_size, d.draft_tokens, dim, km1,
                                        dtype, d.device, d.overlapping))
                  for dim, km1, dtype in d.windows],
        "dst_indices_raw": index(d.n1, d.index_dtypes[0]),
        "step_indices_raw": index(d.n1, d.index_dtypes[1]),
        "dst_indices2_raw": index(d.n2, d.index_dtypes[2]),
        "step_indices2_raw": index(d.n2, d.index_dtypes[3]),
    }


def _break_last_pair(rule: str):
    """Near miss of a pair rule: the one-pair op's near miss, applied to the last pair."""
    def mutate(spec: dict) -> dict:
        dst, src = spec["pairs"][-1]
        single = {"dst": dst, "src": src, "dst_indices_raw": spec["dst_indices_raw"],
                  "step_indices_raw": spec["step_indices_raw"], "src_indices_raw": None}
        broken = one.NEAR_MISSES[rule](single)
        return {**spec, "pairs": [*spec["pairs"][:-1], (broken["dst"], broken["src"])]}

    return mutate


def _break_set(rule: str, dst_name: str, step_name: str):
    """Near miss of an index rule: the state scatter's near miss on that request set (the
    second set is given first if absent)."""
    def mutate(spec: dict) -> dict:
        spec = _with_set2(spec)
        single = {"dst": spec["pairs"][0][0], "src": spec["pairs"][0][1],
                  "dst_indices_raw": spec[dst_name], "step_indices_raw": spec[step_name],
                  "src_indices_raw": None}
        broken = mamba_state_scatter.NEAR_MISSES[rule](single)
        return {**spec, dst_name: broken["dst_indices_raw"], step_name: broken["step_indices_raw"]}

    return mutate


def _with_set2(spec: dict) -> dict:
    if spec["step_indices2_raw"] is not None:
        return spec
    return {**spec, "dst_indices2_raw": spec["dst_indices_raw"],
            "step_indices2_raw": spec["step_indices_raw"]}


def _grow_to(spec: dict, count: int) -> dict:
    pairs = spec["pairs"]
    return {**spec, "pairs": [pairs[i % len(pairs)] for i in range(count)]}


def _second_pair(spec: dict) -> dict:
    """At least two pairs (the last a copy of the first), for rules across pairs."""
    return spec if len(spec["pairs"]) > 1 else _grow_to(spec, 2)


def _other_pool(spec: dict) -> dict:
    spec = _second_pair(spec)
    d, s = spec["pairs"][-1]
    d = d.replace(shape=(d.shape[0], d.shape[1] + 1, *d.shape[2:]))
    return {**spec, "pairs": [*spec["pairs"][:-1], (d, s)]}


def _last_on_other_device(spec: dict) -> dict:
    spec = _second_pair(spec)
    device = _other_device(spec["pairs"][0][0].device, gpu=True)
    d, s = spec["pairs"][-1]
    return {**spec, "pairs": [*spec["pairs"][:-1],
                              (d.replace(device=device), s.replace(device=device))]}


NEAR_MISSES = {
    "pair_count": lambda s: _grow_to(s, MAX_PAIRS + 1),
    "one_device": _last_on_other_device,
    "shared_sizes": _other_pool,
    "indices2_together": lambda s: {**_with_set2(s), "dst_indices2_raw": None},
    **{r: _break_last_pair(r) for r in one.PAIR_RULES},
    **{r: _break_set(r, "dst_indices_raw", "step_indices_raw")
       for r in ("indices_1d", "indices_length", "indices_dtype", "indices_device")},
    **{r.replace("indices", "indices2"): _break_set(r, "dst_indices2_raw", "step_indices2_raw")
       for r in ("indices_1d", "indices_length", "indices_dtype", "indices_device")},
}
