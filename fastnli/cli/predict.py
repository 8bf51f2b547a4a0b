"""``fastnli predict`` (NLI probabilities of a JSONL file of pairs) and ``fastnli info`` (an artifact and its engine)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from rich.markup import escape

from fastnli.cli.common import (
    add_engine_arguments,
    add_on_invalid_argument,
    console,
    engine_from_args,
    output_records,
    read_checked,
    write_jsonl,
    write_unscored,
)
from fastnli.cli.export import print_manifest

logger = logging.getLogger("fastnli")


def _check_pair(record: dict[str, Any], where: str) -> None:
    """Raise ValueError naming ``where`` and the field when ``record`` is not a (premise, hypothesis) pair."""
    for key in ("premise", "hypothesis"):
        if key not in record:
            raise ValueError(f"{where}: missing field {key!r} (a string)")
        if not isinstance(record[key], str):
            raise ValueError(f"{where}: field {key!r} must be a string, got {type(record[key]).__name__}")


def _cmd_predict(args: argparse.Namespace) -> int:
    keep_invalid = args.on_invalid == "keep"
    rows, valid = read_checked(args.input, _check_pair, keep_invalid)
    if not valid:
        return write_unscored(args.output, rows, args.input)
    engine = engine_from_args(args)
    result = engine.predict_detailed([(r["premise"], r["hypothesis"]) for r in valid], long_premise=args.long_premise)
    stats = result.stats
    write_jsonl(args.output, output_records(rows, (
        {**{k: v for k, v in r.items() if k != "_line"}, **{lab: float(x) for lab, x in zip(engine.labels, p)},
         "label": engine.labels[int(p.argmax())], "truncated": bool(cut), **({"window": int(w)} if w >= 0 else {})}
        for r, p, cut, w in zip(valid, result.probs, result.truncated, result.best_window))))
    logger.info("%d pairs (%d unique, %d read in windows, %d truncated) in %.2f s on %s/%s, padding efficiency %.3f",
                stats.pairs_in, stats.unique_pairs, stats.chunked_pairs, stats.truncated_pairs, stats.seconds,
                engine.device, engine.precision, stats.padding_efficiency)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    engine = engine_from_args(args)
    print_manifest(engine.manifest)
    out = console()
    out.print(escape(repr(engine)))
    out.print(escape(f"precision {engine.precision}: {engine.precision_reason}"), soft_wrap=True)
    policy = engine.window_planner.policy
    size = "as large as the model allows" if policy.max_window_tokens is None else \
        f"of at most {policy.max_window_tokens} tokens"
    bar = "the plain threshold" if policy.entailment_threshold is None else f"P(entailment) > {policy.entailment_threshold}"
    source = "the manifest's" if engine.manifest.window_policy is not None else "the default"
    rows = "the best-entailment window's" if policy.contradiction_threshold is None else \
        "the best-entailment window's, or when none supports the most contradicting one's" \
        f" with P(contradiction) > {policy.contradiction_threshold}"
    if policy.fallback == "neutral":
        rows += ", or when none supports or contradicts the most neutral one's"
    out.print(escape(f"long documents (CaLM, ALCE, grounding, long_premise='chunk'): windows {size}, "
                     f"{policy.overlap_tokens} tokens of overlap; support when read in windows: {bar}; three-way "
                     f"row: {rows} ({source} window policy)"), soft_wrap=True)
    m = engine.manifest
    out.print(escape(f"scorer inputs by default: question-aware {'yes' if m.question_format else 'no'}, units "
                     f"aligned {'yes' if m.align_units else 'no'} (the manifest's question_format and align_units)"),
              soft_wrap=True)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``fastnli predict`` and ``fastnli info`` to the subcommands."""
    p = sub.add_parser("predict", help="NLI probabilities for a JSONL file of {premise, hypothesis} lines; each "
                       "output line adds contradiction, neutral, entailment, label (the most probable), truncated, "
                       "and window (the deciding window's index) for a premise read in windows")
    p.add_argument("input")
    p.add_argument("--long-premise", default="truncate", choices=["truncate", "chunk"],
                   help="a pair longer than the model: truncate (default, reported) or chunk (premise in windows)")
    p.add_argument("-o", "--output", default=None, help="output JSONL (default: stdout)")
    add_on_invalid_argument(p)
    add_engine_arguments(p)
    p.set_defaults(func=_cmd_predict)

    p = sub.add_parser("info", help="show an artifact's manifest and the device/precision the engine picks, and why")
    add_engine_arguments(p)
    p.set_defaults(func=_cmd_info)
