"""``fastnli score INPUT -o OUT``: NCP and siblings for a JSONL or CSV file of responses and their samples.

Input lines: ``{"response": str, "sampled_responses": [str, ...]}`` (other fields are carried to the output). CSV:
a ``response`` column and either a ``sampled_responses`` column holding a JSON list or ``sample_1``, ``sample_2``, ...
columns (empty cells are not samples).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastnli.cli import add_engine_arguments, engine_from_args, read_jsonl, register, write_jsonl
from fastnli.scorers.api import SCORERS, score

logger = logging.getLogger("fastnli")


def _read_csv(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames or []
        if "response" not in fields:
            raise ValueError(f"{path}: no 'response' column (columns: {fields})")
        sample_cols = sorted((c for c in fields if c.startswith("sample_")), key=lambda c: int(c.split("_")[1])
                             if c.split("_")[1].isdigit() else 0)
        for lineno, rec in enumerate(reader, start=2):
            row: dict[str, Any] = {"_line": lineno, **rec}
            if "sampled_responses" in fields:
                try:
                    row["sampled_responses"] = json.loads(rec["sampled_responses"] or "null")
                except json.JSONDecodeError:
                    raise ValueError(f"{path}:{lineno}: field 'sampled_responses' must hold a JSON list of strings")\
                        from None
            elif sample_cols:
                row["sampled_responses"] = [rec[c] for c in sample_cols if rec.get(c)]
                for c in sample_cols:
                    row.pop(c, None)
            else:
                raise ValueError(f"{path}: needs a 'sampled_responses' column (JSON list) or sample_1.. columns")
            rows.append(row)
    return rows


def read_score_input(path: str | Path) -> list[dict[str, Any]]:
    """Read and check a score input file; errors name the line and the field."""
    rows = _read_csv(path) if str(path).lower().endswith(".csv") else read_jsonl(path)
    for r in rows:
        where = f"{path}:{r['_line']}"
        if "response" not in r:
            raise ValueError(f"{where}: missing field 'response'")
        if not isinstance(r["response"], str):
            raise ValueError(f"{where}: field 'response' must be a string, got {type(r['response']).__name__}")
        s = r.get("sampled_responses")
        if s is None:
            raise ValueError(f"{where}: missing field 'sampled_responses' (a list of at least one string)")
        if not isinstance(s, list) or not s:
            raise ValueError(f"{where}: field 'sampled_responses' must be a non-empty list of strings")
        for j, x in enumerate(s):
            if not isinstance(x, str):
                raise ValueError(f"{where}: field 'sampled_responses'[{j}] must be a string, got {type(x).__name__}")
    return rows


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="JSONL (or .csv) with response and sampled_responses per line")
    p.add_argument("-o", "--output", default=None, help="output JSONL (default: stdout)")
    p.add_argument("--scorers", default="noncontradiction",
                   help=f"comma-separated, from {','.join(SCORERS)} (default: noncontradiction)")
    p.add_argument("--use-best", action="store_true", help="uqlm's use_best (with a semantic scorer)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_arguments(p)


def _run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    rows = read_score_input(args.input)
    engine = engine_from_args(args)
    scorers = tuple(s.strip() for s in args.scorers.split(",") if s.strip())
    with Progress(TextColumn("scoring pairs"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  disable=args.no_progress, transient=True) as bar:
        task = bar.add_task("pairs", total=None)

        def advance(n: int, total: int) -> None:
            bar.update(task, advance=n, total=total)

        result = score([r["response"] for r in rows], [r["sampled_responses"] for r in rows], scorers=scorers,
                       engine=engine, use_best=args.use_best, progress=advance)

    def records() -> Iterator[dict[str, Any]]:
        for r, sr in zip(rows, result):
            rec = {k: v for k, v in r.items() if k != "_line"}
            rec.update({s: getattr(sr, s) for s in scorers})
            if sr.best_response is not None:
                rec["best_response"] = sr.best_response
            yield rec

    write_jsonl(args.output, records())
    st = result.stats
    logger.info("%d responses, %d pairs (%d unique, dedup %.2fx) in %d batches, padding efficiency %.3f, "
                "device %s, precision %s, %.2f s", len(rows), st.pairs_in, st.unique_pairs, st.dedup_ratio,
                st.batches, st.padding_efficiency, result.device, result.precision, result.seconds)
    return 0


register("score", "NCP and sibling scorers for a JSONL/CSV file of responses and sampled responses",
         _add_arguments, _run)
