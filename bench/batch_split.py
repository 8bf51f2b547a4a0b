"""Where the scheduler cuts batches: pairs/s of full batches against splits at several per-batch overheads.

Usage (from the repository root; ``../shared/nli-data`` or ``--data``)::

    python -m bench.batch_split [--model DIR] [--overheads 0,16,32,64] [--repeats 3] [--snli 2000] [--mnli 1000]

Workloads: the directed pairs of the bench's short, mixed and long NCP workloads (``bench.workloads``: 200, 100 and
12 prompts, or ``--prompts`` each), the first ``--snli`` snli/dev pairs and the first ``--mnli`` mnli/dev_matched
pairs. Each workload runs through one warmed-up engine (the model's CPU defaults) once per overhead
(``BatchPolicy.batch_overhead_tokens``; 0 = full batches), the overheads alternating, ``--repeats`` rounds; a cell
is batches / padding efficiency / pairs/s of the best round, and its speed against the first overhead. Every overhead must give the first one's probabilities (max |Δp| is
reported). Seconds are one machine's: compare the columns of one run, not runs on different machines.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.workloads import Workload, long_workload, mixed_workload, ncp_pairs, short_workload
from fastnli.engine import NLIEngine
from fastnli.engine.session import cpu_model_name, int8_isa


def workloads(data: Path, n_snli: int, n_mnli: int, prompts: int | None = None) -> dict[str, list[tuple[str, str]]]:
    """The named pair lists of the benchmark (see the module docstring); ``prompts``: each NCP workload's number of
    prompts (default: the workloads' own, 200 / 100 / 12)."""
    rows = [json.loads(line) for line in (data / "dev.jsonl").read_text(encoding="utf-8").splitlines()]

    def split(source: str, n: int) -> list[tuple[str, str]]:
        return [(r["premise"], r["hypothesis"]) for r in rows if r["source"] == source][:n]

    def distinct(workload: Workload) -> list[tuple[str, str]]:
        return sorted(set(ncp_pairs(workload)))

    return {"bench short NCP": distinct(short_workload(prompts=prompts or 200)),
            "bench mixed NCP": distinct(mixed_workload(prompts=prompts or 100)),
            "bench long NCP": distinct(long_workload(prompts=prompts or 12)),
            "snli/dev": split("snli/dev", n_snli), "mnli/dev_matched": split("mnli/dev_matched", n_mnli)}


def measure(engine: NLIEngine, pairs: list[tuple[str, str]], overheads: list[int], repeats: int) -> dict[str, Any]:
    """Per overhead: batches, padding efficiency and the best round's pairs/s; and the largest |Δp| against the
    first overhead's probabilities."""
    best: dict[int, float] = {}
    cells: dict[int, dict[str, Any]] = {}
    reference: np.ndarray | None = None
    max_delta = 0.0
    for _ in range(repeats):
        for overhead in overheads:
            engine.with_policy(batch_overhead_tokens=overhead)
            t0 = time.perf_counter()
            probs = engine.predict(pairs)
            seconds = time.perf_counter() - t0
            best[overhead] = min(best.get(overhead, seconds), seconds)
            stats = engine.last_stats
            cells[overhead] = {"batches": stats.batches, "padding_efficiency": round(stats.padding_efficiency, 3)}
            if reference is None:
                reference = probs
            max_delta = max(max_delta, float(np.abs(probs - reference).max()) if len(pairs) else 0.0)
    for overhead, cell in cells.items():
        cell["pairs_per_s"] = round(len(pairs) / best[overhead], 1)
        cell["speedup"] = round(best[overheads[0]] / best[overhead], 2)
    return {"pairs": len(pairs), "cells": {str(k): v for k, v in cells.items()}, "max_abs_delta": max_delta}


def markdown(results: dict[str, dict[str, Any]], overheads: list[int]) -> str:
    lines = ["| workload (unique pairs) | " + " | ".join(f"overhead {o}" for o in overheads) + " | max \\|Δp\\| |",
             "|---|" + "---|" * (len(overheads) + 1)]
    for name, r in results.items():
        cells = [r["cells"][str(o)] for o in overheads]
        lines.append(f"| {name} ({r['pairs']}) | " + " | ".join(
            f"{c['batches']} / {c['padding_efficiency']:.3f} / {c['pairs_per_s']} ({c['speedup']:.2f}x)"
            for c in cells) + f" | {r['max_abs_delta']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a fastnli artifact (default: the embedded default model)")
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "nli-data")
    p.add_argument("--overheads", default="0,16,32,64", help="comma-separated tokens per batch; the first is the base")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--snli", type=int, default=2000, help="snli/dev pairs (default: %(default)s)")
    p.add_argument("--mnli", type=int, default=1000, help="mnli/dev_matched pairs (default: %(default)s)")
    p.add_argument("--prompts", type=int, default=None,
                   help="prompts of each NCP workload (default: 200 short, 100 mixed, 12 long)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    try:
        overheads = [int(v) for v in args.overheads.split(",")]
    except ValueError:
        p.error(f"--overheads {args.overheads!r}: give comma-separated whole numbers of tokens, e.g. 0,16,32,64")
    if any(o < 0 for o in overheads) or args.repeats < 1 or (args.prompts is not None and args.prompts < 1):
        p.error("--overheads must be >= 0, --repeats and --prompts >= 1")
    if not (args.data / "dev.jsonl").is_file():
        p.error(f"--data {args.data}: no dev.jsonl there (the shared NLI data, ../shared/nli-data)")
    engine = NLIEngine.from_pretrained(args.model, device="cpu")
    engine.warm_up()  # the first overhead measured gets no cold sessions
    results = {name: measure(engine, pairs, overheads, args.repeats)
               for name, pairs in workloads(args.data, args.snli, args.mnli, args.prompts).items()}
    meta = {"cpu": cpu_model_name(), "int8_isa": int8_isa(), "precision": engine.precision,
            "streams": engine.streams, "repeats": args.repeats}
    sys.stdout.write(f"{meta}\n{markdown(results, overheads)}\n")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "overheads": overheads, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
