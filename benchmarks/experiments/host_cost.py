"""Host cost of one eager call of every op, split into its parts, with a profile.

For each op (``strictops.ops.OP_MODULES``), on the op module's ``example_inputs`` at its GPU
size (``--small``: its interpreter size): the host time per call, back to back, of

* the public function (what a serving loop pays in eager mode),
* the same op through the dispatcher (``torch.ops.strictops.<op>``),
* the op's contract alone (``CONTRACT.validate``),

as the median and minimum over windows (``_harness.wall_us``; the host is shared, so the
minimum is the quiet-host cost), then the top of a ``cProfile`` of the public function.

    python benchmarks/experiments/host_cost.py [--op NAME] [--small] [--calls 300]

Each window ends with a synchronisation, so a call whose kernel takes longer than its launch
path shows the kernel's time instead (``--small`` keeps the kernels short); what the numbers
led to is in ``docs/design/<stem>.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

from strictops.meta import CONTRACTS
from strictops.ops import OP_MODULES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _harness import wall_us  # noqa: E402


def _short(op: str) -> str:
    return op.split("::", 1)[1]


def measure(op: str, module, small: bool, calls: int, profile_rows: int) -> dict:
    args = module.example_inputs("cuda:0", small, torch.Generator().manual_seed(0))
    public = getattr(module, _short(op))
    namespace, name = op.split("::")
    dispatcher = getattr(getattr(torch.ops, namespace), name)
    parts = {
        "public function": lambda: public(**args),
        "dispatcher": lambda: dispatcher(**args),
        "contract": lambda: CONTRACTS[op].validate(**args),
    }
    row = {}
    for part, fn in parts.items():
        median, least = wall_us(fn, calls=calls)
        row[part] = (round(median, 1), round(least, 1))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        public(**args)
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(profile_rows)
    row["profile"] = text.getvalue()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", choices=[_short(op) for op in OP_MODULES], action="append",
                    help="an op to measure (repeatable; default: every op)")
    ap.add_argument("--small", action="store_true", help="the interpreter-sized example call")
    ap.add_argument("--calls", type=int, default=300, help="calls per timing window")
    ap.add_argument("--profile-rows", type=int, default=20)
    args = ap.parse_args()
    for op, module in OP_MODULES.items():
        if args.op and _short(op) not in args.op:
            continue
        row = measure(op, module, args.small, args.calls, args.profile_rows)
        print(f"== {_short(op)}: host us per call (median, min)")
        for part in ("public function", "dispatcher", "contract"):
            print(f"  {part:16} {row[part]}")
        print(row["profile"], flush=True)


if __name__ == "__main__":
    main()
