"""Benchmark harness shared by every strictops benchmark.

Every number is a median from ``triton.testing.do_bench`` (CUDA events), and every op is
reported against ceilings measured in the same run:

* copy bandwidth: a large device-to-device ``copy_``, counting bytes read plus bytes written;
* dense FP8 GEMM rate (for compute-bound ops): ``torch._scaled_mm`` at 8192³.

Results go to ``<out>/<stem>.json`` (every number), ``<out>/<stem>.md`` (a table) and
``<out>/<stem>.png`` (a plot), ``<stem>`` being the op's file stem. ``<out>`` defaults to
``benchmarks/results/<gpu>/`` (``h200`` for an NVIDIA H200): one current result set per GPU
model, overwritten by every run; the history of the numbers is the repository's history.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import triton
from triton.testing import do_bench

WARMUP_MS = 50
REP_MS = 400
RESULTS = Path(__file__).resolve().parent / "results"


def results_dir() -> Path:
    """``benchmarks/results/<gpu>/`` for GPU 0: the first word of its name after the vendor,
    lower case (``NVIDIA H200`` -> ``h200``, ``NVIDIA H100 80GB HBM3`` -> ``h100``)."""
    name = torch.cuda.get_device_name(0).lower().removeprefix("nvidia").split()
    return RESULTS / (name[0] if name else "gpu")


def arg_parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's command line: ``--out`` (default :func:`results_dir`)."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for <stem>.json/.md/.png (default: benchmarks/results/<gpu>/)")
    return ap


def parse_args(ap: argparse.ArgumentParser) -> argparse.Namespace:
    args = ap.parse_args()
    if args.out is None:
        args.out = results_dir()
    return args


def begin(name: str, ap: argparse.ArgumentParser, seed: int | None = None
          ) -> tuple[argparse.Namespace, Report, torch.Generator | None]:
    """A benchmark's start: its command line parsed (:func:`parse_args`; ``--help`` exits
    before any GPU is asked for), its :class:`Report` ``name``, and a CUDA generator seeded
    with ``seed`` for its inputs (None without a seed)."""
    args = parse_args(ap)
    report = Report(name)
    return args, report, None if seed is None else torch.Generator(device="cuda").manual_seed(seed)


def median_us(fn: Callable[[], object], warmup: int = WARMUP_MS, rep: int = REP_MS,
              flush_l2: bool = True) -> float:
    """Median device time of ``fn`` in microseconds (CUDA events).

    ``flush_l2``: do_bench's default, a 256 MB fill before every timed call, so each call
    starts with cold inputs (and an L2 full of dirty lines). Without it, calls run back to
    back; the caller then rotates inputs itself when they would fit in L2.
    """
    if flush_l2:
        return do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(max(20, rep // 4)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def graph_replay_us(fn: Callable[[], object], warmup: int = WARMUP_MS, rep: int = REP_MS,
                    flush_l2: bool = True, calls: int = 1) -> float:
    """Median device time of one replay of ``fn`` captured in a CUDA graph, per call of ``fn``.

    ``calls``: how many calls of ``fn`` the graph holds, back to back; the result is the
    replay's time over ``calls``. One call per graph times the graph launch and the kernel's
    ramp-up with it (a trivial kernel takes ~4.5 us so on an H200), which hides differences of
    a few microseconds between launch-bound kernels; with 20 calls per graph each kernel starts
    as the one before it ends, as in a serving step's graph, and the graph's own launch is
    spread over them. ``flush_l2``: a 256 MB fill before every replay, so the graph's first
    call starts cold and the others see what the calls before them left in L2 (steady state
    for them); without it, every call is steady state.
    """
    return median_us(captured(fn, calls).replay, warmup, rep, flush_l2) / calls


def captured(fn: Callable[[], object], calls: int = 1,
             on_side_stream: bool = False) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` back-to-back calls of ``fn``, captured after one call on a
    side stream that compiles and loads its kernels. ``on_side_stream``: captured on that
    stream too, instead of the graph's own capture stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile and load before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream if on_side_stream else None):
        for _ in range(calls):
            fn()
    return graph


def trivial_kernel_us(calls: int = 1, flush_l2: bool = True) -> float:
    """:func:`graph_replay_us` of a one-element add: the floor of a launch-bound kernel
    measured the same way."""
    one = torch.zeros(1, device="cuda")
    return graph_replay_us(lambda: one.add_(1), flush_l2=flush_l2, calls=calls)


def wall_us(fn: Callable[[], object], calls: int = 1000, windows: int = 11) -> tuple[float, float]:
    """Host wall time per call of ``fn`` over back-to-back calls, synchronised per window:
    ``(median, min)`` over ``windows`` windows of ``calls`` calls.

    For a call whose kernel is shorter than its launch path this is the launch path's cost:
    what a serving loop pays per call in eager mode. Host timings on a shared machine are
    noisy, so the minimum (the quiet-host cost) is reported beside the median.
    """
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    samples.sort()
    return samples[len(samples) // 2], samples[0]


def anchor_module(name: str):
    """The original kernels' module ``name`` from the repository root's ``.anchor`` folder
    (built only where ours are compared with them), or None when it is absent."""
    from strictops.meta import _anchor

    return _anchor.load(name)


def copy_bandwidth_bytes_per_us(nbytes: int = 4 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read + written per microsecond)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    us = median_us(lambda: dst.copy_(src))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / us


def fp8_gemm_tflops(n: int = 8192) -> float:
    """Dense FP8 e4m3 GEMM rate through ``torch._scaled_mm`` (n³, bf16 output)."""
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    us = median_us(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))
    return 2 * n**3 / us / 1e6


@dataclass
class Report:
    """Rows of one benchmark plus the environment and ceilings they were measured with, and
    the goals it checks (:meth:`check_bar`)."""

    name: str
    ceilings: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    env: dict = field(default_factory=dict)
    bars: list = field(default_factory=list)

    def __post_init__(self) -> None:
        props = torch.cuda.get_device_properties(0)
        self.env = {
            "device": props.name,
            "sms": props.multi_processor_count,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"),
        }

    def copy_ceiling(self) -> float:
        """Measure the copy bandwidth (:func:`copy_bandwidth_bytes_per_us`), record it as the
        ceiling ``copy_bandwidth_TBps`` and return it in bytes per microsecond."""
        bw = copy_bandwidth_bytes_per_us()
        self.ceilings["copy_bandwidth_TBps"] = bw / 1e6
        return bw

    def add(self, **row) -> dict:
        self.rows.append(row)
        return row

    def check_bar(self, row: dict, key: str, op: str, goal: float) -> dict:
        """Record whether ``row[key] op goal`` (``op``: ``"<="`` or ``">="``) holds; a dotted
        ``key`` names a value in a nested dict of the row (:func:`cell`)."""
        value = cell(row, key)
        bar = {"row": {k: v for k, v in row.items() if isinstance(v, str)}, "metric": key,
               "goal": f"{op} {goal}", "value": value,
               "met": value <= goal if op == "<=" else value >= goal}
        self.bars.append(bar)
        return bar

    def write(self, out: Path, columns: list[str], plot: Callable | None = None) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{self.name}.json").write_text(json.dumps(asdict(self), indent=2, default=str))
        lines = [f"# {self.name}", "",
                 "env: " + ", ".join(f"{k}={v}" for k, v in self.env.items()), "",
                 "ceilings: " + ", ".join(f"{k}={_fmt(v)}" for k, v in self.ceilings.items()), "",
                 "| " + " | ".join(columns) + " |",
                 "|" + "---|" * len(columns)]
        for r in self.rows:
            lines.append("| " + " | ".join(_fmt(cell(r, c)) for c in columns) + " |")
        if self.bars:
            lines += ["", "| bar | metric | goal | value | met |", "|---|---|---|---|---|"]
            lines += [f"| {', '.join(b['row'].values())} | {b['metric']} | {b['goal']} | "
                      f"{_fmt(b['value'])} | {b['met']} |" for b in self.bars]
        (out / f"{self.name}.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        if plot is not None:
            try:
                import matplotlib
            except ImportError:
                print("matplotlib not installed: no plot")
                return
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig = plot(plt, self)
            fig.savefig(out / f"{self.name}.png", dpi=120, bbox_inches="tight")


def grouped_bars(plt, report: Report, label_key: str | Callable[[dict], str],
                 series: list[tuple[str, str]], title: str, ylabel: str, log: bool = True):
    """``(fig, ax)``: one group of bars per row of ``report`` (labelled by ``row[label_key]``,
    or ``label_key(row)`` for a function), one bar per ``(legend label, row key)`` of
    ``series``; a missing value draws no bar."""
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [label_key(r) if callable(label_key) else str(r[label_key]) for r in report.rows]
    width = 0.8 / len(series)
    for i, (label, key) in enumerate(series):
        ax.bar([x + i * width for x in range(len(labels))],
               [cell(r, key) or 0 for r in report.rows], width, label=label)
    ax.set_xticks([x + (len(series) - 1) * width / 2 for x in range(len(labels))], labels,
                  fontsize=7)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} on {report.env['device']}")
    return fig, ax


def bar_plot(label_key: str, series: list[tuple[str, str]], title: str,
             ylabel: str = "µs (median, log scale)", legend_fontsize: int = 7) -> Callable:
    """A :meth:`Report.write` plot: :func:`grouped_bars` of ``series`` on a log scale, with
    its legend."""
    def plot(plt, report: Report):
        fig, ax = grouped_bars(plt, report, label_key, series, title, ylabel)
        ax.legend(fontsize=legend_fontsize)
        return fig

    return plot


def print_variants(report: Report, key: str, what: str, digits: int = 2) -> None:
    """One line per row that has variants under ``key`` (a dict of name: number): the row's
    shape, ``what`` and every variant's number."""
    for r in report.rows:
        if r.get(key):
            print(r["shape"], f"{what}:",
                  ", ".join(f"{k}={v:.{digits}f}" for k, v in r[key].items()))


def cell(row: dict, column: str):
    """``row[column]``, where a dotted column (``"publish.graph_us"``) names a value in a
    nested dict of the row; ``""`` where the row has none."""
    value = row
    for part in column.split("."):
        if not isinstance(value, dict) or part not in value:
            return ""
        value = value[part]
    return value


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)
