"""``python -m bench``: the side-by-side table (uqlm, PyTorch, fastnli fp32/INT8) and PNG plots in one run.

Builds the seeded deberta-large-mnli-shaped checkpoint (or ``--size base/tiny``) and its export into the cache on
first use, measures this machine's GEMM peaks, runs the short and long NCP workloads on every backend, sweeps the
batch budget and the sequence length, and writes ``bench.json``, ``bench.md`` and four PNGs to ``--out``. It never
installs anything unless asked: the uqlm backend needs uqlm's own venv, built only with ``--install-uqlm``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("fastnli")


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=None, help="HF checkpoint dir (default: a seeded one of --size)")
    p.add_argument("--artifact", default=None, help="export artifact of that checkpoint (default: exported once)")
    p.add_argument("--size", default="large", choices=["tiny", "base", "large"], help="seeded checkpoint shape")
    p.add_argument("--out", default="bench/results", help="output directory (default: bench/results)")
    p.add_argument("--workloads", default="short,long", help="comma-separated: short, long, mixed")
    p.add_argument("--skip", default="", help="backends to skip: uqlm, torch, fastnli-fp32, fastnli-int8, "
                   "fastnli-int8-plain (INT8 without the fused attention)")
    p.add_argument("--quick", action="store_true", help="tiny checkpoint, small workloads, no sweeps' long tail")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--install-uqlm", action="store_true",
                   help="build uqlm's venv ($FASTNLI_UQLM_VENV, else .venv-uqlm in the checkout) when it is missing: "
                        "pip installs torch and uqlm there (about a minute, needs the package registry). Without "
                        "it the bench installs nothing and stops when the uqlm backend has no venv")


def uqlm_python(backends: Sequence[str], install: bool) -> Path | None:
    """The uqlm venv's python for the uqlm backend: an existing venv, or (``install``) one built now; ``None``
    when uqlm is skipped. Without ``install`` a missing venv raises ``SystemExit`` naming the flag."""
    from bench.uqlm_peer import default_uqlm_venv, ensure_uqlm_env, ready_uqlm_python

    if "uqlm" not in backends:
        return None
    python = ready_uqlm_python()
    if python is not None:
        return python
    if install:
        return ensure_uqlm_env()
    raise SystemExit(
        f"python -m bench: the uqlm backend runs uqlm in its own venv, and {default_uqlm_venv()} holds no complete "
        "one. The bench installs nothing by itself: pass --install-uqlm to build it there (pip installs torch and "
        "uqlm, about a minute, needs the package registry), set FASTNLI_UQLM_VENV to an existing one, or leave "
        "uqlm out with --skip uqlm")


def _checkpoint(args: argparse.Namespace) -> Path:
    from fastnli.engine import cache_root
    from fastnli.exporter.checkpoint import build_checkpoint

    if args.checkpoint:
        return Path(args.checkpoint)
    size = "tiny" if args.quick else args.size
    ck = cache_root() / "bench" / f"deberta-{size}"
    if not (ck / "config.json").is_file():
        logger.info("building the seeded deberta/%s checkpoint in %s", size, ck)
        build_checkpoint(ck, arch="deberta", size=size, seed=0)  # type: ignore[arg-type]
    return ck


def budget_sweep(artifact: Path, pairs: list[tuple[str, str]], budgets: list[int]) -> list[tuple[int, float]]:
    from fastnli.engine import NLIEngine

    engine = NLIEngine.from_pretrained(artifact, device="cpu", precision="int8")
    engine.predict(pairs[:8])
    out = []
    for b in budgets:
        engine.with_policy(max_batch_tokens=b, max_batch_size=max(1, b // 4))
        t0 = time.perf_counter()
        engine.predict(pairs)
        out.append((b, len(pairs) / (time.perf_counter() - t0)))
    return out


def latency_sweep(artifact: Path, precision: str, lengths: list[int]) -> list[tuple[int, float]]:
    from fastnli.engine import NLIEngine

    engine = NLIEngine.from_pretrained(artifact, device="cpu", precision=precision)  # type: ignore[arg-type]
    out = []
    for n in lengths:
        half = " ".join(["river"] * max(1, (n - 3) // 2))
        pair = [(half, half + " bridge")]
        actual = int(engine.token_lengths(pair)[0])
        engine.predict(pair)
        best = float("inf")
        for _ in range(3 if n <= 128 else 1):
            t0 = time.perf_counter()
            engine.predict(pair)
            best = min(best, time.perf_counter() - t0)
        out.append((actual, best))
    return out


def _run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from bench import plots
    from bench.roofline import gemm_peaks
    from bench.run import BACKENDS, BenchReport, machine_info, run_workload, uqlm_pairs
    from bench.workloads import long_workload, mixed_workload, short_workload
    from fastnli.engine import resolve_artifact

    t_start = time.perf_counter()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    backends = [b for b in BACKENDS if b not in skip]
    uqlm_py = uqlm_python(backends, args.install_uqlm)  # before any work: a missing venv stops the run here
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ck = _checkpoint(args)
    artifact = Path(args.artifact) if args.artifact else resolve_artifact(ck)
    config = json.loads((ck / "config.json").read_text())
    console = _console(stderr=True)
    peaks = gemm_peaks()
    logger.info("GEMM peaks (ORT, this machine): %s", {k: round(v) for k, v in peaks.items()})
    makers = {
        "short": lambda: short_workload(40 if args.quick else 200, 5),
        "long": lambda: long_workload(4 if args.quick else 6, 3),
        "mixed": lambda: mixed_workload(30 if args.quick else 100, 5),
    }
    rows = []
    with console.status("benchmark") as status:
        for name in [w.strip() for w in args.workloads.split(",") if w.strip()]:
            if name not in makers:
                raise ValueError(f"--workloads: unknown {name!r}; choose from {sorted(makers)}")
            def stage(msg: str) -> None:
                status.update(msg)
                logger.info("bench: %s", msg)

            rows += run_workload(makers[name](), ck, artifact, config, peaks, backends, status=stage,
                                 uqlm_python=uqlm_py)
        notes = ["Times: wall-clock seconds of the scoring call after a warm-up; model loading excluded for all.",
                 "uqlm: BlackBoxUQ(scorers=['noncontradiction']) in its own venv (uqlm 0.6.7, PyTorch fp32, batch 32).",
                 "Seeded random weights: fidelity figures (|Δ NCP|, argmax agreement) of INT8/FP16 are weak "
                 "evidence; see the embedded default model's card for trained-model figures."]
        report = BenchReport(rows=rows, peaks_gflops=peaks, machine=machine_info(), checkpoint=str(ck), notes=notes)
        if not args.no_plots:
            status.update("sweeps: batch budget, sequence length")
            short_pairs = uqlm_pairs(makers["short"]())
            budgets = [256, 512, 1024, 2048, 4096, 8192] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
            plots.plot_budget({"fastnli-int8": budget_sweep(artifact, short_pairs, budgets)}, out / "throughput_vs_budget.png")
            lengths = [16, 32, 64, 128, 256, 512]
            plots.plot_latency({p: latency_sweep(artifact, p, lengths) for p in ("int8", "fp32")},
                               out / "latency_vs_length.png")
            stored = json.loads(report.to_json())
            plots.plot_speedup(stored, out / "speedup.png")
            plots.plot_roofline(stored, out / "roofline.png")
    (out / "bench.json").write_text(report.to_json())
    (out / "bench.md").write_text(report.to_markdown())
    table = Table(title=f"python -m bench — {ck.name} ({time.perf_counter() - t_start:.0f} s)")
    cols = ["workload", "backend", "seconds", "pairs", "pairs/s", "tokens/s", "× uqlm", "pad eff", "dedup",
            "max|ΔNCP|", "argmax agr", "roofline"]
    for c in cols:
        table.add_column(c, justify="right")
    for r in rows:
        def f(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        table.add_row(r.workload, r.backend, f(r.seconds, ".2f"), str(r.pairs), f(r.pairs_per_s, ".1f"),
                      f(r.tokens_per_s, ".0f"), f(r.ratio_vs_uqlm, ".2f"), f(r.padding_efficiency, ".3f"),
                      f(r.dedup_ratio, ".2f"), f(r.ncp_max_abs_delta, ".1e"), f(r.argmax_agreement, ".4f"),
                      f(r.roofline_share, ".1%"))
    wide = _console()
    wide.width = max(wide.width, 160)
    wide.print(table)
    wide.print(f"results: {out / 'bench.md'}, {out / 'bench.json'} and PNG plots in {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench [options]``; returns the exit status."""
    from rich.logging import RichHandler

    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    _add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s",
                        handlers=[RichHandler(show_path=False, console=_console(stderr=True))])
    logger.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    for noisy in ("transformers", "optimum", "torch", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
