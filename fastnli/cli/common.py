"""What the subcommands of the ``fastnli`` CLI share: the console, logging, engine options and JSON-lines files.

The CLI is the only place that configures logging and prints; the library logs to ``logging.getLogger("fastnli")``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Iterable
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
                   help=f"write the quantities of {what} in the other text's units before NLI (\"354 miles\" against "
                   "\"569 km\" reads as \"569 km\"): auto (default) where the model's manifest says so (the embedded "
                   "default model), on for any model, off: the texts as given")


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


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file; raises ValueError naming the line of a malformed record."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object") \
                    from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            rows.append({"_line": lineno, **obj})
    return rows


def write_jsonl(path: str | Path | None, records: Iterable[dict[str, Any]]) -> None:
    """Write records as JSON lines to ``path``, or to stdout when ``path`` is None."""
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(path, "w", encoding="utf-8")) if path else sys.stdout
        for rec in records:
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
