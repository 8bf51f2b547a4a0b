"""PNG plots of a benchmark run (matplotlib, Agg backend): throughput vs batch budget, latency vs sequence length,
share of roofline."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


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


def plot_roofline(labels: Sequence[str], shares: Sequence[float], gflops: Sequence[float], path: Path) -> Path:
    """Bars: achieved effective GFLOP/s as a share of the measured GEMM peak of each backend's precision."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(range(len(labels)), [s * 100 for s in shares], color="tab:blue")
    for b, g in zip(bars, gflops):
        ax.annotate(f"{g:.0f} GF/s", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                    fontsize=8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("% of measured GEMM peak")
    ax.set_title("Share of roofline (model FLOPs of real tokens / time)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
