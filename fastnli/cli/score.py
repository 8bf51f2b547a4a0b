"""``fastnli score INPUT -o OUT``: NCP and siblings for a JSONL or CSV file of responses and their samples.

Input lines: ``{"response": str, "sampled_responses": [str, ...], "prompt": str (optional)}`` (other fields are
carried to the output; ``prompt``, the question, makes the scoring question-aware where the model is). CSV:
a ``response`` column and either a ``sampled_responses`` column holding a JSON list or ``sample_1``, ``sample_2``, ...
columns (empty cells are not samples).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastnli.cli.common import (
    ERROR_KEY,
    SWITCH,
    add_align_units_argument,
    add_engine_arguments,
    add_on_invalid_argument,
    engine_from_args,
    log_invalid,
    mark_invalid,
    output_records,
    read_jsonl,
    write_jsonl,
    write_unscored,
)
from fastnli.engine import CPU_POLICY, CUDA_POLICY
from fastnli.scorers.api import SCORERS, score
from fastnli.scorers.records import check_record, missing_prompt_message, record_prompts

logger = logging.getLogger("fastnli")


def _read_csv(path: str | Path, keep_invalid: bool = False) -> list[dict[str, Any]]:
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
                    message = f"{path}:{lineno}: field 'sampled_responses' must hold a JSON list of strings"
                    if not keep_invalid:
                        raise ValueError(message) from None
                    row[ERROR_KEY] = message
            elif sample_cols:
                row["sampled_responses"] = [rec[c] for c in sample_cols if rec.get(c)]
                for c in sample_cols:
                    row.pop(c, None)
            else:
                raise ValueError(f"{path}: needs a 'sampled_responses' column (JSON list) or sample_1.. columns")
            rows.append(row)
    return rows


def read_score_input(path: str | Path, keep_invalid: bool = False) -> list[dict[str, Any]]:
    """Read and check a score input file; errors name the line and the field.

    Every record gets ``_line``. Without ``keep_invalid`` the first bad record raises ValueError; with it, bad records
    stay in place marked with their message (``fastnli.cli.common.ERROR_KEY``), including, when some records have a
    ``prompt``, the ones without.
    """
    rows = _read_csv(path, keep_invalid) if str(path).lower().endswith(".csv") else read_jsonl(path, keep_invalid)
    valid = mark_invalid(rows, check_record, path, keep_invalid)
    if keep_invalid and any(r.get("prompt") is not None for r in valid):
        for r in valid:
            if r.get("prompt") is None:
                r[ERROR_KEY] = missing_prompt_message(f"{path}:{r['_line']}")
    return rows


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="JSONL (or .csv) with response and sampled_responses per line; with --ray also "
                   "Parquet, or a directory of JSONL/Parquet files")
    p.add_argument("output_file", nargs="?", default=None, metavar="OUTPUT",
                   help="output file (same as -o); with --ray .jsonl or .parquet")
    p.add_argument("-o", "--output", default=None, help="output JSONL (default: stdout)")
    p.add_argument("--scorers", default="noncontradiction",
                   help=f"comma-separated, from {','.join(SCORERS)} (default: noncontradiction)")
    p.add_argument("--use-best", action="store_true",
                   help="uqlm's use_best: score the lead response of the most probable semantic cluster instead of "
                   "the response given (needs a semantic scorer; default off, as fastnli.score; uqlm's BlackBoxUQ "
                   "defaults to on)")
    p.add_argument("--question-aware", choices=list(SWITCH), default="auto",
                   help="read each answer as an answer to its record's 'prompt': auto (default) where the model was "
                   "trained so (the embedded default model), on for any model, off for uqlm's exact inputs")
    add_align_units_argument(p, "each compared answer")
    add_on_invalid_argument(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_arguments(p)
    ray = p.add_argument_group("Ray (pip install 'fastnli[ray]')")
    ray.add_argument("--ray", default=None, metavar="ADDRESS",
                     help="score on a Ray cluster: 'auto' (the running cluster, or RAY_ADDRESS), 'local' (start one "
                     "on this machine), or an address such as ray://head:10001")
    ray.add_argument("--actors", default="1", help="actor pool size N, or MIN-MAX for an autoscaling pool (default 1)")
    ray.add_argument("--cpus-per-actor", type=float, default=1.0, help="CPUs (and ORT threads) per actor (default 1)")
    ray.add_argument("--gpus-per-actor", type=float, default=0.0,
                     help="GPUs per actor (default 0: CPU actors; > 0: CUDA with the FP16 graph)")
    ray.add_argument("--batch-rows", type=int, default=256, help="rows per engine pass (default 256)")
    ray.add_argument("--id-column", default=None, metavar="NAME",
                     help="a column that names each row in error messages, e.g. id (default none: a bad row is named "
                     "by its place in its batch and its response)")


def _parse_actors(text: str) -> int | tuple[int, int]:
    lo, sep, hi = text.partition("-")
    try:
        return (int(lo), int(hi)) if sep else int(lo)
    except ValueError:
        raise ValueError(f"--actors {text!r}: give a pool size N or MIN-MAX, e.g. --actors 4 or --actors 2-8") from None


def _run_ray(args: argparse.Namespace, output: str, scorers: tuple[str, ...]) -> int:
    from fastnli.distributed.dataset import import_ray, infer_format, score_dataset, write_scores

    ray = import_ray()
    infer_format(output)  # refuse an output name of unknown format before any work
    if not ray.is_initialized():
        ray.init(address=None if args.ray == "local" else args.ray)
    changes = {k: v for k, v in (("max_batch_tokens", args.max_batch_tokens),
                                 ("max_batch_size", args.max_batch_size)) if v is not None}
    policy = replace(CUDA_POLICY if args.gpus_per_actor > 0 else CPU_POLICY, **changes) if changes else None
    ds = score_dataset(args.input, args.model, scorers=scorers, use_best=args.use_best,
                       num_actors=_parse_actors(args.actors), num_cpus_per_actor=args.cpus_per_actor,
                       num_gpus_per_actor=args.gpus_per_actor, precision=args.precision, batch_rows=args.batch_rows,
                       batch_policy=policy, question_aware=SWITCH[args.question_aware],
                       align_units=SWITCH[args.align_units],
                       on_invalid="keep" if args.on_invalid == "keep" else "raise", id_column=args.id_column)
    try:
        n = write_scores(ds, output)
    except Exception as exc:
        bad_row = _user_error(exc)
        if bad_row is None:
            raise
        raise ValueError(f"{bad_row} (a bad row stops a Ray run; --on-invalid keep writes it with an 'error' field "
                         "instead)") from None
    logger.info("%d rows scored on Ray (%s actors) -> %s", n, args.actors, output)
    return 0


def _user_error(exc: BaseException) -> str | None:
    """The message of the ValueError a Ray task raised on a bad row, as the text of Ray's error quotes it (Ray passes
    the task's traceback as text, not the exception itself); None when there is none."""
    seen, todo, found = set(), [exc], []
    while todo:  # Ray's error and the errors it chains (its UserCodeException may hold the task's text)
        e = todo.pop()
        if id(e) not in seen:
            seen.add(id(e))
            found += re.findall(r"^ValueError: (.+)$", str(e), re.M)
            todo += [c for c in (getattr(e, "cause", None), e.__cause__, e.__context__) if isinstance(c, BaseException)]
    return found[-1] if found else None


def _parse_scorers(text: str, use_best: bool) -> tuple[str, ...]:
    """``--scorers`` as names; ValueError for an unknown name, or for ``--use-best`` without a semantic scorer."""
    scorers = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [s for s in scorers if s not in SCORERS]
    if bad or not scorers:
        raise ValueError(f"--scorers {text!r}: unknown {', '.join(bad) or '(none given)'}; choose from "
                         f"{','.join(SCORERS)}")
    semantic = [s for s in SCORERS if s.startswith("semantic_")]
    if use_best and not set(semantic) & set(scorers):
        raise ValueError(f"--use-best needs a semantic scorer ({' or '.join(semantic)}) in --scorers: the best "
                         "response is picked from the semantic clusters; add one (e.g. --scorers "
                         f"{scorers[0]},semantic_negentropy) or drop --use-best")
    return scorers


def _run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    if args.output_file is not None and args.output is not None:
        raise ValueError("give the output once: as OUTPUT or as -o, not both")
    args.output = args.output or args.output_file
    scorers = _parse_scorers(args.scorers, args.use_best)  # before any file is read or model loaded
    keep_invalid = args.on_invalid == "keep"
    if args.ray is not None:
        if args.output is None:
            raise ValueError("--ray needs an output file (OUTPUT or -o), .jsonl or .parquet")
        return _run_ray(args, args.output, scorers)
    rows = read_score_input(args.input, keep_invalid)
    log_invalid(rows, args.input)
    valid = [r for r in rows if ERROR_KEY not in r]
    prompts = record_prompts(valid, [f"{args.input}:{r['_line']}" for r in valid])
    question_aware = SWITCH[args.question_aware]
    if question_aware is True and prompts is None:
        raise ValueError(f"--question-aware on needs a 'prompt' field (the question) in every record of {args.input}")
    if not valid:
        return write_unscored(args.output, rows, args.input)
    engine = engine_from_args(args)
    with Progress(TextColumn("scoring pairs"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  disable=args.no_progress, transient=True) as bar:
        task = bar.add_task("pairs", total=None)

        def advance(n: int, total: int) -> None:
            bar.update(task, advance=n, total=total)

        result = score([r["response"] for r in valid], [r["sampled_responses"] for r in valid], scorers=scorers,
                       engine=engine, use_best=args.use_best, progress=advance, prompts=prompts,
                       question_aware=question_aware, align_units=SWITCH[args.align_units])

    def records() -> Iterator[dict[str, Any]]:
        for r, sr in zip(valid, result):
            rec = {k: v for k, v in r.items() if k != "_line"}
            rec.update({s: getattr(sr, s) for s in scorers})
            if sr.best_response is not None:
                rec["best_response"] = sr.best_response
            yield rec

    write_jsonl(args.output, output_records(rows, records()))
    st = result.stats
    logger.info("%d responses, %d pairs (%d unique, dedup %.2fx) in %d batches, padding efficiency %.3f, "
                "device %s, precision %s, question-aware %s, units aligned %s, %.2f s", len(valid), st.pairs_in,
                st.unique_pairs, st.dedup_ratio, st.batches, st.padding_efficiency, result.device, result.precision,
                "yes" if result.question_format else "no", "yes" if result.align_units else "no", result.seconds)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``fastnli score`` to the subcommands."""
    p = sub.add_parser("score", help="NCP and sibling scorers for a JSONL/CSV file of responses and sampled responses")
    _add_arguments(p)
    p.set_defaults(func=_run)
