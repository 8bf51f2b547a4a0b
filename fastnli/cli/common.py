"""What the subcommands of the ``fastnli`` CLI share: the console, logging, engine options and JSON-lines files.

The CLI is the only place that configures logging and prints; the library logs to ``logging.getLogger("fastnli")``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger("fastnli")


def setup_logging(verbose: bool) -> None:
    """Log ``fastnli`` at INFO (DEBUG with ``verbose``) through rich on stderr; other libraries at WARNING."""
    from rich.logging import RichHandler

    handler = RichHandler(show_path=False, console=console(stderr=True))
    # Other libraries (ORT's quantizer logs every skipped node on the root logger) stay at WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[handler])
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("transformers", "optimum", "torch", "httpx", "urllib3", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def console(stderr: bool = False) -> Any:
    """A rich console on stdout (or stderr)."""
    from rich.console import Console

    return Console(stderr=stderr)


def add_engine_arguments(p: argparse.ArgumentParser, model_required: bool = False) -> None:
    """The engine options shared by every subcommand that scores."""
    p.add_argument("--model", required=model_required, default=None,
                   help="export artifact dir, HF checkpoint dir or hub id (default: the embedded default model)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"], help="default: auto")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "int8"], help="default: auto")
    p.add_argument("--max-batch-tokens", type=int, default=None, help="padded-token budget per batch")
    p.add_argument("--max-batch-size", type=int, default=None, help="row cap per batch")


#: an auto/on/off switch's value as the library's ``None``/``True``/``False`` (the model's default, always, never)
SWITCH = {"auto": None, "on": True, "off": False}


def add_align_units_argument(p: argparse.ArgumentParser, what: str) -> None:
    """``--align-units auto|on|off``: ``align_units`` of the scorers or checks (``SWITCH[args.align_units]``)."""
    p.add_argument("--align-units", choices=list(SWITCH), default="auto",
                   help=f"write the quantities of {what} in the other text's units, and its numbers of equal value in "
                   "the other text's form, before NLI (\"354 miles\" against \"569 km\" reads as \"569 km\", \"one "
                   "hundred sixty-eight\" against \"168\" as \"168\"): auto (default) where the model's manifest says "
                   "so (the embedded default model), on for any model, off: the texts as given")


def engine_from_args(args: argparse.Namespace) -> Any:
    """The engine the options of :func:`add_engine_arguments` ask for."""
    from fastnli.engine import NLIEngine

    engine = NLIEngine.from_pretrained(args.model, device=args.device, precision=args.precision,
                                       progress=console(stderr=True).is_terminal)
    changes = {k: v for k, v in (("max_batch_tokens", args.max_batch_tokens),
                                 ("max_batch_size", args.max_batch_size)) if v is not None}
    if changes:
        engine.with_policy(**changes)
    return engine


def read_jsonl(path: str | Path, keep_invalid: bool = False) -> list[dict[str, Any]]:
    """Read a JSON-lines file; each record gets its line number as ``_line``.

    A line that is not a JSON object raises ValueError naming the line, or, with ``keep_invalid``, becomes a record
    holding only ``_line`` and that message as ``_error`` (see :func:`mark_invalid`).
    """
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                message = f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object"
            else:
                if isinstance(obj, dict):
                    rows.append({"_line": lineno, **obj})
                    continue
                message = f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}"
            if not keep_invalid:
                raise ValueError(message)
            rows.append({"_line": lineno, ERROR_KEY: message})
    return rows


#: ``--on-invalid``: what a subcommand does with an input record it cannot score (``stop``: fail the run on the
#: first, naming its line and field; ``keep``: write it in its place with an ``error`` field and score the rest)
ON_INVALID = ("stop", "keep")
#: where :func:`mark_invalid` keeps a record's error until the output names it ``error``
ERROR_KEY = "_error"


def add_on_invalid_argument(p: argparse.ArgumentParser) -> None:
    """``--on-invalid stop|keep`` (:data:`ON_INVALID`)."""
    p.add_argument("--on-invalid", choices=ON_INVALID, default="stop",
                   help="an input record that cannot be scored (not JSON, a field missing or of the wrong type): stop "
                   "(default) fails the run on the first, naming its line and field; keep writes it in its place with "
                   "an 'error' field (and no scores), scores the others and logs how many were kept")


def mark_invalid(rows: list[dict[str, Any]], check: Callable[[dict[str, Any], str], None], path: str | Path,
                 keep_invalid: bool) -> list[dict[str, Any]]:
    """Run ``check(row, "path:line")`` on every readable row and return the rows that pass.

    A row that fails raises the check's ValueError, or, with ``keep_invalid``, keeps the message as ``_error`` (and
    stays in ``rows``, in its place, without the fields the check added). With ``keep_invalid``, a record that already
    has an ``error`` field is refused (ValueError), since the output writes the errors there.
    """
    valid = []
    for r in rows:
        if ERROR_KEY in r:
            continue
        if keep_invalid and "error" in r:
            raise ValueError(f"{path}:{r['_line']}: the record has a field 'error', where --on-invalid keep writes "
                             "the errors; rename that field, or use --on-invalid stop")
        before = set(r)
        try:
            check(r, f"{path}:{r['_line']}")
        except ValueError as exc:
            if not keep_invalid:
                raise
            for key in set(r) - before:  # what the check added before it failed
                del r[key]
            r[ERROR_KEY] = str(exc)
            continue
        valid.append(r)
    return valid


def output_records(rows: list[dict[str, Any]], outputs: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every input row in its place: the invalid ones as their fields plus ``error``, the others as the next of
    ``outputs`` (one per valid row, in order)."""
    it = iter(outputs)
    for r in rows:
        if ERROR_KEY in r:
            yield {**{k: v for k, v in r.items() if k not in ("_line", ERROR_KEY)}, "error": r[ERROR_KEY]}
        else:
            yield next(it)


def read_checked(path: str | Path, check: Callable[[dict[str, Any], str], None],
                 keep_invalid: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Read a JSON-lines file (:func:`read_jsonl`), check its records (:func:`mark_invalid`) and log how many were
    kept with an error (:func:`log_invalid`). Returns (every record, in order; the valid ones)."""
    rows = read_jsonl(path, keep_invalid)
    valid = mark_invalid(rows, check, path, keep_invalid)
    log_invalid(rows, path)
    return rows, valid


def write_unscored(output: str | Path | None, rows: list[dict[str, Any]], path: str | Path) -> int:
    """Write the records of ``path`` when none of them could be scored (each with its ``error``), without loading a
    model. Returns the exit status, 0."""
    write_jsonl(output, output_records(rows, []))
    logger.info("no record of %s could be scored; the model was not loaded", path)
    return 0


def log_invalid(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Warn how many records of ``path`` were kept with an error, quoting the first."""
    bad = [r[ERROR_KEY] for r in rows if ERROR_KEY in r]
    if bad:
        logger.warning("%d of %d records of %s could not be scored and are kept with an 'error' field; the first: %s",
                       len(bad), len(rows), path, bad[0])


def write_jsonl(path: str | Path | None, records: Iterable[dict[str, Any]]) -> None:
    """Write records as JSON lines to ``path``, or to stdout when ``path`` is None."""
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(path, "w", encoding="utf-8")) if path else sys.stdout
        for rec in records:
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
