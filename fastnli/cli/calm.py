"""``fastnli calm`` (the CaLM loop over a JSONL file of queries) and ``fastnli alce`` (ALCE citation metrics).

``fastnli calm`` input lines: ``{"query": str, "documents": [str | {"title", "text"}, ...]}`` (``"question"`` is read
when ``"query"`` is absent; other fields are carried to the output). Output lines: the input fields plus the
result's ``answer``, ``accepted``, ``iterations``, ``best_iteration``, ``stop_reason``, ``metrics``, ``error``,
``device``, ``precision`` and ``trace``. Exit status 1 when some query stopped on an LM error (its line says which).
A record that cannot be read or checked stops every subcommand here before the model loads; ``--on-invalid keep``
writes it in its place with an ``error`` field and runs the others.

``fastnli alce`` input lines: ``{"answer": str, "documents": [...]}``; output lines add ``citation_recall``,
``citation_precision``, ``num_citations``, ``invalid_citations`` and per-statement ``statements``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from typing import Any

from fastnli.cli.common import (
    SWITCH,
    add_align_units_argument,
    add_engine_arguments,
    add_on_invalid_argument,
    engine_from_args,
    log_invalid,
    mark_invalid,
    output_records,
    read_checked,
    read_jsonl,
    write_jsonl,
    write_unscored,
)

logger = logging.getLogger("fastnli")


def _documents(row: dict[str, Any], where: str) -> list[Any]:
    docs = row.get("documents")
    if docs is None:
        raise ValueError(f"{where}: missing field 'documents' (a list of strings or {{\"title\", \"text\"}} objects); "
                         "the CLI needs each query's documents (use fastnli.calm.calm_batch with a retriever from "
                         "Python)")
    if not isinstance(docs, list) or not docs:
        raise ValueError(f"{where}: field 'documents' must be a non-empty list of strings or {{\"title\", \"text\"}} "
                         "objects")
    from fastnli.calm.documents import as_documents

    try:
        return list(as_documents(docs, "field 'documents'"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _check_query(row: dict[str, Any], where: str) -> None:
    """Check a ``fastnli calm`` input record (ValueError naming ``where`` and the field); keep its query and documents
    as ``_query`` and ``_documents``."""
    key = "query" if "query" in row else "question"
    q = row.get(key)
    if q is None:
        raise ValueError(f"{where}: missing field 'query' (the question to answer)")
    if not isinstance(q, str) or not q.strip():
        raise ValueError(f"{where}: field {key!r} must be a non-empty string")
    row["_documents"] = _documents(row, where)
    row["_query"] = q


def _check_answer(row: dict[str, Any], where: str) -> None:
    """Check a ``fastnli alce`` input record; keep its documents as ``_documents``."""
    if not isinstance(row.get("answer"), str):
        raise ValueError(f"{where}: field 'answer' must be a string")
    row["_documents"] = _documents(row, where)


def _check_grounding(row: dict[str, Any], where: str) -> None:
    """Check the fields of a ``fastnli grounding`` input record (its statements are checked as they are planned)."""
    if ("statements" in row) == ("answer" in row):
        raise ValueError(f"{where}: give exactly one of 'statements' (a list of strings) and 'answer' (a text)")
    _documents(row, where)


def _fields(row: dict[str, Any]) -> dict[str, Any]:
    """A record's own fields, without the ones the CLI adds (``_line``, ``_documents``, ...)."""
    return {key: v for key, v in row.items() if not key.startswith("_")}


def _add_calm_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="JSONL with {query, documents} per line")
    p.add_argument("-o", "--output", default=None, help="output JSONL (default: stdout)")
    for role, what in (("main", "the large LM that answers with citations"),
                       ("verifier", "the small LM that answers from the cited documents")):
        p.add_argument(f"--{role}-base-url", required=True,
                       help=f"OpenAI-compatible API root of {what}, e.g. http://localhost:8000/v1")
        p.add_argument(f"--{role}-model", required=True, help=f"model name of {what}")
        p.add_argument(f"--{role}-api-key-env", default="OPENAI_API_KEY",
                       help="environment variable holding its API key (default: OPENAI_API_KEY; unset = no key)")
    p.add_argument("--k", type=int, default=3, help="documents per batch (default 3)")
    p.add_argument("--max-iterations", type=int, default=3, help="T, the most answers per query (default 3)")
    p.add_argument("--max-concurrency", type=int, default=8, help="LM calls in flight (default 8)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of both LMs (default 0)")
    p.add_argument("--max-tokens", type=int, default=None, help="cap on generated tokens (default: server's)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per LM request attempt (default 60)")
    p.add_argument("--max-retries", type=int, default=3, help="retries on 429/5xx/connection errors (default 3)")
    p.add_argument("--accept-share", type=float, default=0.8,
                   help="least share of corroborated statements to accept (default 0.8)")
    p.add_argument("--entailment-threshold", type=float, default=0.5, help="P(entailment) > this entails (default 0.5)")
    _add_engine_defaults(p)
    p.add_argument("--on-error", default="record", choices=["record", "raise"],
                   help="record: a failing query gets an error in its line, the others go on (default); raise: stop")
    add_on_invalid_argument(p)
    p.add_argument("--no-prompts", action="store_true", help="leave the prompts out of the trace")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_arguments(p)


def _run_calm(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fastnli.calm.checks import CheckConfig
    from fastnli.calm.lm import LMError, OpenAIChatLM
    from fastnli.calm.loop import calm_batch

    rows, valid = read_checked(args.input, _check_query, args.on_invalid == "keep")
    if not valid:
        return write_unscored(args.output, rows, args.input)
    lms = [OpenAIChatLM(getattr(args, f"{role}_model"), getattr(args, f"{role}_base_url"),
                        api_key_env=getattr(args, f"{role}_api_key_env"), temperature=args.temperature,
                        max_tokens=args.max_tokens, timeout=args.timeout, max_retries=args.max_retries)
           for role in ("main", "verifier")]
    config = CheckConfig(accept_share=args.accept_share, entailment_threshold=args.entailment_threshold,
                         window_entailment_threshold=args.window_entailment_threshold,
                         align_units=SWITCH[args.align_units])
    engine = engine_from_args(args)
    with Progress(TextColumn("CaLM queries"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=args.no_progress, transient=True) as bar:
        task = bar.add_task("queries", total=len(valid))

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        try:
            batch = calm_batch([r["_query"] for r in valid], [r["_documents"] for r in valid], lms[0], lms[1], engine,
                               k=args.k, max_iterations=args.max_iterations, check_config=config,
                               max_concurrency=args.max_concurrency, on_error=args.on_error, progress=advance)
        except LMError as exc:
            logger.error("%s", exc)
            return 1

    def records() -> Iterator[dict[str, Any]]:
        for r, res in zip(valid, batch):
            out = res.to_dict(include_prompts=not args.no_prompts)
            for key in ("index", "query", "documents"):
                out.pop(key)
            yield {**_fields(r), **out}

    write_jsonl(args.output, output_records(rows, records()))
    errors = sum(r.error is not None for r in batch)
    logger.info("%d queries: %d accepted, %d errors; %d NLI passes, %d pairs (%d unique); device %s, precision %s, "
                "%.2f s", len(batch), sum(r.accepted for r in batch), errors, len(batch.passes),
                sum(p["pairs_in"] for p in batch.passes), sum(p["unique_pairs"] for p in batch.passes), batch.device,
                batch.precision, batch.seconds)
    return 1 if errors else 0


def _add_engine_defaults(p: argparse.ArgumentParser) -> None:
    """The engine-default arguments of the checks: the window threshold and unit alignment."""
    p.add_argument("--window-entailment-threshold", type=float, default=None,
                   help="P(entailment) > this entails a premise read in windows (default: the model's window "
                   "threshold, named by the embedded default model's manifest; else --entailment-threshold)")
    add_align_units_argument(p, "each statement")


def _add_alce_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="JSONL with {answer, documents} per line")
    p.add_argument("-o", "--output", default=None, help="output JSONL (default: stdout)")
    p.add_argument("--entailment-rule", default="threshold", choices=["threshold", "argmax"],
                   help="threshold: P(entailment) > --entailment-threshold (default); argmax: entailment most probable")
    p.add_argument("--entailment-threshold", type=float, default=0.5, help="default 0.5")
    _add_engine_defaults(p)
    p.add_argument("--long-premise", default="chunk", choices=["chunk", "truncate"],
                   help="cited documents longer than the model: chunk (default) reads them in windows, truncate cuts")
    add_on_invalid_argument(p)
    add_engine_arguments(p)


def _run_alce(args: argparse.Namespace) -> int:
    from fastnli.calm.alce import alce_citations
    from fastnli.calm.checks import CheckConfig

    rows, valid = read_checked(args.input, _check_answer, args.on_invalid == "keep")
    if not valid:
        return write_unscored(args.output, rows, args.input)
    engine = engine_from_args(args)
    config = CheckConfig(entailment_rule=args.entailment_rule, entailment_threshold=args.entailment_threshold,
                         window_entailment_threshold=args.window_entailment_threshold, long_premise=args.long_premise,
                         align_units=SWITCH[args.align_units])
    result = alce_citations([r["answer"] for r in valid], [r["_documents"] for r in valid], engine, config)

    def records() -> Iterator[dict[str, Any]]:
        for r, check in zip(valid, result):
            rec = _fields(r)
            rec.update(citation_recall=check.citation_recall, citation_precision=check.citation_precision,
                       num_citations=check.num_citations, invalid_citations=check.invalid_citations,
                       truncated_documents=check.truncated_documents,
                       statements=[{"text": s.text, "citations": s.citations, "invalid_citations": s.invalid_citations,
                                    "supported": s.supported, "relevant_citations": s.relevant_citations,
                                    "citation_entailment": s.citation_entailment,
                                    "citation_window": s.citation_window, "truncated": s.truncated}
                                   for s in check.statements])
            yield rec

    write_jsonl(args.output, output_records(rows, records()))
    logger.info("%d answers: citation recall %.4f, citation precision %.4f; %d pairs (%d unique), device %s, "
                "precision %s, %.2f s", len(result), result.citation_recall, result.citation_precision,
                result.stats.get("pairs_in", 0), result.stats.get("unique_pairs", 0), result.device, result.precision,
                result.seconds)
    return 0


def _run_grounding(args: argparse.Namespace) -> int:
    from fastnli.calm.grounding import finish_grounding, plan_grounding

    keep_invalid = args.on_invalid == "keep"
    rows = read_jsonl(args.input, keep_invalid)
    valid = mark_invalid(rows, _check_grounding, args.input, keep_invalid)
    if not valid:
        log_invalid(rows, args.input)
        return write_unscored(args.output, rows, args.input)
    engine = engine_from_args(args)

    def make_plan(r: dict[str, Any], where: str) -> None:  # a statement or document the planner refuses
        try:
            r["_plan"] = plan_grounding(r["statements"] if "statements" in r else r["answer"], _documents(r, where),
                                        engine, args.granularity, args.threshold, SWITCH[args.align_units])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None

    valid = mark_invalid(valid, make_plan, args.input, keep_invalid)
    log_invalid(rows, args.input)
    plans = [r["_plan"] for r in valid]
    pairs = [pair for plan in plans for pair in plan.pairs]
    probs, stats = engine.predict_with_stats(pairs)  # one engine pass for the whole file

    def records() -> Iterator[dict[str, Any]]:
        offset = 0
        for r, plan in zip(valid, plans):
            n = len(plan.pairs)
            result = finish_grounding(plan, probs[offset:offset + n], engine.labels)
            offset += n
            out = result.to_dict(matrix=args.matrix)
            for key in ("stats", "device", "precision", "seconds"):
                out.pop(key)
            yield {**_fields(r), **out}

    write_jsonl(args.output, output_records(rows, records()))
    logger.info("%d lines: %d pairs (%d unique, %d truncated) on %s/%s in %.2f s", len(valid), stats.pairs_in,
                stats.unique_pairs, stats.truncated_pairs, engine.device, engine.precision, stats.seconds)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``fastnli calm``, ``fastnli alce`` and ``fastnli grounding`` to the subcommands."""
    p = sub.add_parser("calm", help="CaLM: verify grounded answers of a large LM with a small LM and NLI (JSONL of "
                       "queries + documents)")
    _add_calm_arguments(p)
    p.set_defaults(func=_run_calm)
    p = sub.add_parser("alce", help="ALCE citation recall and precision of a JSONL file of {answer, documents}")
    _add_alce_arguments(p)
    p.set_defaults(func=_run_alce)
    p = sub.add_parser("grounding", help="statement x source NLI matrix, SummaC-ZS and max-over-sources score of a "
                       "JSONL file of {statements or answer, documents}")
    p.add_argument("input", help="JSONL with {statements: [str] or answer: str, documents: [...]} per line")
    p.add_argument("-o", "--output", default=None, help="output JSONL (default: stdout)")
    p.add_argument("--granularity", default="window", choices=["window", "sentence"],
                   help="sources: document windows that fit the model (default) or document sentences")
    p.add_argument("--threshold", type=float, default=None,
                   help="supported: max entailment > this (default: 0.5 for one source, the model's window threshold "
                   "for several, named by the embedded default model's manifest)")
    p.add_argument("--matrix", action="store_true", help="write the probability tensor (probs) too")
    add_align_units_argument(p, "each statement")
    add_on_invalid_argument(p)
    add_engine_arguments(p)
    p.set_defaults(func=_run_grounding)
