"""PNG plots of a benchmark run (matplotlib, Agg backend): speed-up over uqlm, share of roofline per precision,
throughput vs batch budget, latency vs sequence length.

The speed-up and roofline plots are drawn from the report itself (``bench.json``'s content, see
:class:`bench.run.BenchReport`) through two data functions, :func:`speedup_data` and :func:`roofline_data`, so a
stored run can be drawn again without measuring anything::

    python -m bench.plots bench/results/bench.json     # writes speedup.png and roofline.png beside it
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("fastnli")

#: Row backends that are the reference of the speed-up, not a bar of it.
REFERENCE_BACKEND = "uqlm"


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'fastnli[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_budget(points: dict[str, list[tuple[int, float]]], path: Path) -> Path:
    """``points[backend] = [(max_batch_tokens, pairs_per_s), ...]``."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in points.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("max_batch_tokens (padded tokens per batch)")
    ax.set_ylabel("pairs / s")
    ax.set_title("Throughput vs batch budget (short NCP workload)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_latency(points: dict[str, list[tuple[int, float]]], path: Path) -> Path:
    """``points[backend] = [(sequence_length, seconds), ...]`` for one pair per call."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in points.items():
        ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens, one pair per call)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("Single-pair latency vs sequence length")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@dataclass(frozen=True)
class RooflineBar:
    """One backend on one workload against the GEMM peak of its own precision."""

    label: str  # "workload / backend"
    share: float  # effective GFLOP/s / peak GFLOP/s of ``precision``
    gflops: float  # effective GFLOP/s: model FLOPs of the real tokens / seconds


def speedup_data(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{workload: {backend: uqlm seconds / backend seconds}}`` from a report, in the report's order.

    Only rows measured in a run that also ran uqlm carry a ratio; uqlm's own row (1 by definition) is left out. A
    report without uqlm rows gives ``{}``.
    """
    out: dict[str, dict[str, float]] = {}
    for row in report.get("rows", []):
        ratio = row.get("ratio_vs_uqlm")
        if ratio is None or row["backend"] == REFERENCE_BACKEND:
            continue
        out.setdefault(row["workload"], {})[row["backend"]] = float(ratio)
    return out


def _peak_precision(row: dict[str, Any]) -> str | None:
    """The peak a row's share refers to (reports written before ``peak_precision`` existed: from the backend)."""
    if row.get("roofline_share") is None:
        return None
    return row.get("peak_precision") or ("int8" if "int8" in row["backend"] else "fp32")


def roofline_data(report: dict[str, Any]) -> dict[str, list[RooflineBar]]:
    """``{precision: [bars]}``: each row's share of the measured GEMM peak of its own precision, grouped by that
    precision (in ``peaks_gflops`` order), so that no axis mixes shares of different peaks. Rows without a share
    (no peak measured for their precision, e.g. a GPU) are left out."""
    groups: dict[str, list[RooflineBar]] = {p: [] for p in report.get("peaks_gflops", {})}
    for row in report.get("rows", []):
        precision = _peak_precision(row)
        if precision is None:
            continue
        groups.setdefault(precision, []).append(RooflineBar(f"{row['workload']} / {row['backend']}",
                                                            float(row["roofline_share"]),
                                                            float(row["effective_gflops"])))
    return {p: bars for p, bars in groups.items() if bars}


def _machine(report: dict[str, Any]) -> str:
    m = report.get("machine", {})
    return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, ONNX Runtime {m.get('onnxruntime', '?')}"


def plot_speedup(report: dict[str, Any], path: Path) -> Path | None:
    """Grouped bars: how many times faster than uqlm each backend scores each workload (same run, same checkpoint).

    Returns ``path``, or ``None`` (with a logged warning, nothing written) when the report has no uqlm rows."""
    data = speedup_data(report)
    if not data:
        logger.warning("no speed-up plot: the report has no rows measured against uqlm (was uqlm skipped?)")
        return None
    plt = _plt()
    backends = list(dict.fromkeys(b for per in data.values() for b in per))
    width = 0.8 / len(backends)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for k, backend in enumerate(backends):
        xs = [i + (k - (len(backends) - 1) / 2) * width for i, w in enumerate(data) if backend in data[w]]
        ys = [data[w][backend] for w in data if backend in data[w]]
        bars = ax.bar(xs, ys, width, label=backend)
        ax.bar_label(bars, labels=[f"{y:.2f}×" for y in ys], fontsize=8)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="uqlm (= 1×)")
    ax.set_xticks(range(len(data)))
    ax.set_xticklabels([f"{w} workload" for w in data])
    ax.set_ylabel("speed-up over uqlm (× faster, same run)")
    ax.set_title(f"NCP scoring speed-up over uqlm per workload and backend\n({_machine(report)})", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_roofline(report: dict[str, Any], path: Path) -> Path | None:
    """One panel per precision: each backend's achieved GFLOP/s as a share of the measured GEMM peak of that
    precision (fp32 bars against the fp32 peak, INT8 bars against the INT8 peak, each panel labelled with its peak).

    Returns ``path``, or ``None`` (with a logged warning, nothing written) when no row has a share."""
    groups = roofline_data(report)
    if not groups:
        logger.warning("no roofline plot: no row of the report has a share of a measured peak")
        return None
    plt = _plt()
    peaks = report.get("peaks_gflops", {})
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4.4), squeeze=False)
    for ax, (precision, bars) in zip(axes[0], groups.items()):
        drawn = ax.bar(range(len(bars)), [b.share * 100 for b in bars],
                       color="tab:orange" if precision == "int8" else "tab:blue")
        ax.bar_label(drawn, labels=[f"{b.share:.0%}\n{b.gflops:.0f} GF/s" for b in bars], fontsize=7)
        ax.set_xticks(range(len(bars)))
        ax.set_xticklabels([b.label for b in bars], rotation=25, ha="right", fontsize=7)
        ax.set_ylim(0, 115)
        ax.set_ylabel(f"% of the {precision} GEMM peak ({peaks.get(precision, float('nan')):.0f} GFLOP/s)")
        ax.set_title(f"{precision} backends vs the {precision} peak", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Share of this machine's GEMM peak, each precision against its own peak\n"
                 "(a lower share of the higher INT8 peak can still be faster: see speedup.png)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.plots REPORT.json [--out DIR]``: draw speedup.png and roofline.png from a stored report."""
    parser = argparse.ArgumentParser(prog="python -m bench.plots", description=main.__doc__)
    parser.add_argument("report", type=Path, help="a bench.json written by python -m bench")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: the report's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    report = json.loads(args.report.read_text(encoding="utf-8"))
    out = args.out or args.report.parent
    out.mkdir(parents=True, exist_ok=True)
    for drawn in (plot_speedup(report, out / "speedup.png"), plot_roofline(report, out / "roofline.png")):
        if drawn is not None:
            logger.info("wrote %s", drawn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
