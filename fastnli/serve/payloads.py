"""Request validation of the service, every endpoint's: each error names the field, the value's problem and the
limit.

Shape and type errors raise :class:`ApiError` with status 422; size limits (pairs per request, characters per text,
tokens of an untruncated TEI input) with 413. Messages are stable: tests compare them exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from fastnli.calm.checks import AnswerInput, CheckConfig
from fastnli.calm.documents import Document, as_document
from fastnli.calm.grounding import GRANULARITIES, Granularity
from fastnli.calm.statements import split_statements
from fastnli.scorers.api import SCORERS, ScorePlan, plan_scores
from fastnli.scorers.questions import QUESTION_FORMAT, resolve_question_format
from fastnli.serve.config import ENV_VARS, ServeConfig

__all__ = ["ApiError", "CHECK_FIELDS", "NCP_FIELDS", "calm_item", "check_pair_count", "check_text", "grounding_item", "item_where", "ncp_item", "parse_documents",
           "parse_pairs", "parse_predict", "parse_tei_inputs", "require_bool", "require_list", "require_object", "require_str"]

#: The :class:`~fastnli.calm.checks.CheckConfig` fields a ``/v1/calm/check`` item may set.
CHECK_FIELDS = {f.name for f in fields(CheckConfig)}


class ApiError(Exception):
    """An HTTP error answer: ``{"error": message, "error_type": error_type}`` with ``status`` (TEI's error form).

    ``error_type`` is one of ``"Validation"`` (413/422), ``"Overloaded"`` (429), ``"Unhealthy"`` (503),
    ``"Timeout"`` (504), ``"Backend"`` (500).
    """

    def __init__(self, status: int, message: str, error_type: str = "Validation",
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.headers = dict(headers or {})


def _type(value: Any) -> str:
    """A JSON name for the type of a decoded JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def require_object(body: Any, where: str = "request body") -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(422, f"{where} must be a JSON object; got {_type(body)}")
    return body


def require_list(value: Any, where: str, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ApiError(422, f"{where} must be an array of {what}; got {_type(value)}")
    return value


def require_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ApiError(422, f"{where} must be a string; got {_type(value)}")
    return value


def require_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ApiError(422, f"{where} must be true or false; got {_type(value)}")
    return value


def check_text(text: str, where: str, config: ServeConfig) -> str:
    """413 when ``text`` is longer than ``config.max_text_chars`` characters."""
    if len(text) > config.max_text_chars:
        raise ApiError(413, f"{where} has {len(text)} characters; the limit is {config.max_text_chars} per text "
                            f"({ENV_VARS['max_text_chars']})")
    return text


def check_pair_count(n: int, where: str, config: ServeConfig) -> None:
    """413 when a request needs more than ``config.max_pairs_per_request`` NLI pairs."""
    if n > config.max_pairs_per_request:
        raise ApiError(413, f"{where} {n} NLI pairs; the limit is {config.max_pairs_per_request} per request "
                            f"({ENV_VARS['max_pairs_per_request']}); split the request")


def _pair(item: Any, where: str, config: ServeConfig) -> tuple[str, str]:
    if not isinstance(item, list):
        raise ApiError(422, f"{where} must be a [premise, hypothesis] array of two strings; got {_type(item)}")
    if len(item) != 2:
        raise ApiError(422, f"{where} must be a [premise, hypothesis] array of two strings; got {len(item)} items")
    premise = check_text(require_str(item[0], f"{where}[0] (premise)"), f"{where}[0] (premise)", config)
    hypothesis = check_text(require_str(item[1], f"{where}[1] (hypothesis)"), f"{where}[1] (hypothesis)", config)
    return premise, hypothesis


def parse_pairs(body: Any, config: ServeConfig) -> list[tuple[str, str]]:
    """The ``pairs`` of a ``/v1/nli`` body: ``{"pairs": [[premise, hypothesis], ...]}``."""
    obj = require_object(body)
    if "pairs" not in obj:
        raise ApiError(422, "field 'pairs' is missing; send {\"pairs\": [[premise, hypothesis], ...]}")
    raw = require_list(obj["pairs"], "field 'pairs'", "[premise, hypothesis] pairs")
    check_pair_count(len(raw), "field 'pairs' has", config)
    return [_pair(item, f"pairs[{i}]", config) for i, item in enumerate(raw)]


def parse_tei_inputs(value: Any, config: ServeConfig) -> tuple[list[tuple[str, str]], bool]:
    """TEI ``/predict`` ``inputs``: one pair ``[a, b]`` or a batch ``[[a, b], ...]``; returns ``(pairs, batched)``.

    A single text (``"a"`` or a batch item ``"a"`` / ``["a"]``) is refused: an NLI model classifies pairs.
    """
    if isinstance(value, str):
        raise ApiError(422, "field 'inputs' is a single text; an NLI model classifies (premise, hypothesis) pairs: "
                            "send [premise, hypothesis] or [[premise, hypothesis], ...]")
    raw = require_list(value, "field 'inputs'", "texts")
    if not raw:
        raise ApiError(422, "field 'inputs' cannot be empty")
    if all(isinstance(x, str) for x in raw):
        if len(raw) != 2:
            raise ApiError(422, f"field 'inputs' must be one [premise, hypothesis] pair or an array of pairs; got "
                                f"{len(raw)} strings")
        return [_pair(raw, "inputs", config)], False
    check_pair_count(len(raw), "field 'inputs' has", config)
    return [_pair(item, f"inputs[{i}]", config) for i, item in enumerate(raw)], True


NCP_FIELDS = ("response", "sampled_responses", "prompt", "scorers", "use_best", "question_aware")


def item_where(prefix: str) -> str:
    """``"request body"`` or ``"request body[i]"`` for the item of a batched body whose field prefix is ``"[i]."``."""
    return f"request body{prefix[:-1]}" if prefix else "request body"


def ncp_item(item: Any, prefix: str, config: ServeConfig, model_question_format: str | None = None) -> ScorePlan:
    """One ``/v1/ncp`` item (``prefix`` ``"[i]."`` in a batched body) validated and planned: its :class:`ScorePlan`.

    ``model_question_format``: the served model's ``manifest.question_format``, which decides whether an item's
    ``prompt`` is used by default (``question_aware`` absent or null), as in :func:`fastnli.scorers.score`."""
    where = item_where(prefix)
    obj = require_object(item, where)
    for key in ("response", "sampled_responses"):
        if key not in obj:
            raise ApiError(422, f"field '{prefix}{key}' is missing; send {{\"response\": str, "
                                "\"sampled_responses\": [str, ...]}")
    response = check_text(require_str(obj["response"], f"field '{prefix}response'"), f"field '{prefix}response'",
                          config)
    samples = require_list(obj["sampled_responses"], f"field '{prefix}sampled_responses'", "strings")
    if not samples:
        raise ApiError(422, f"field '{prefix}sampled_responses' is empty; give at least one sampled response")
    for j, s in enumerate(samples):
        check_text(require_str(s, f"{prefix}sampled_responses[{j}]"), f"{prefix}sampled_responses[{j}]", config)
    scorers: Any = obj.get("scorers", ["noncontradiction"])
    if isinstance(scorers, str):
        scorers = [scorers]
    scorers = require_list(scorers, f"field '{prefix}scorers'", "scorer names")
    bad = [s for s in scorers if s not in SCORERS]
    if bad or not scorers:
        raise ApiError(422, f"field '{prefix}scorers' has unknown scorers {bad}; choose from {list(SCORERS)}")
    use_best = require_bool(obj.get("use_best", False), f"field '{prefix}use_best'")
    prompt = obj.get("prompt")
    if prompt is not None:
        prompt = check_text(require_str(prompt, f"field '{prefix}prompt'"), f"field '{prefix}prompt'", config)
    question_aware = obj.get("question_aware")
    if question_aware is not None:
        question_aware = require_bool(question_aware, f"field '{prefix}question_aware'")
    unknown = sorted(set(obj) - set(NCP_FIELDS))
    if unknown:
        raise ApiError(422, f"{where} has unknown fields {unknown}; allowed: {', '.join(NCP_FIELDS)}")
    try:
        fmt = resolve_question_format(question_aware, None if prompt is None else [prompt], model_question_format)
        return plan_scores([response], [samples], scorers=scorers, use_best=use_best,
                           questions=[prompt] if fmt and prompt is not None else None,
                           question_format=fmt or QUESTION_FORMAT)
    except (TypeError, ValueError) as exc:
        raise ApiError(422, f"{where}: {exc}") from None


def parse_documents(value: Any, prefix: str, config: ServeConfig) -> list[Document]:
    """A ``documents`` field validated: strings or ``{"title", "text"}`` objects, each text within the limit."""
    docs_raw = require_list(value, f"field '{prefix}documents'", "documents (strings or {\"title\", \"text\"} objects)")
    docs: list[Document] = []
    for j, d in enumerate(docs_raw):
        try:
            doc = as_document(d, f"{prefix}documents[{j}]")
        except (TypeError, ValueError) as exc:
            raise ApiError(422, str(exc)) from None
        check_text(doc.text, f"{prefix}documents[{j}].text", config)
        check_text(doc.title, f"{prefix}documents[{j}].title", config)
        docs.append(doc)
    return docs


def calm_item(item: Any, prefix: str, config: ServeConfig) -> tuple[AnswerInput, CheckConfig]:
    """One ``/v1/calm/check`` item validated: the answer to check and its decision rules."""
    where = item_where(prefix)
    obj = require_object(item, where)
    allowed = {"answer", "documents", "verifier_answer", "config"}
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ApiError(422, f"{where} has unknown fields {unknown}; allowed: {sorted(allowed)}")
    if "answer" not in obj:
        raise ApiError(422, f"field '{prefix}answer' is missing; send {{\"answer\": str, \"documents\": [...], "
                            "\"verifier_answer\": str}")
    answer = check_text(require_str(obj["answer"], f"field '{prefix}answer'"), f"field '{prefix}answer'", config)
    docs = parse_documents(obj.get("documents", []), prefix, config)
    verifier = obj.get("verifier_answer")
    if verifier is not None:
        verifier = check_text(require_str(verifier, f"field '{prefix}verifier_answer'"),
                              f"field '{prefix}verifier_answer'", config)
    cfg_raw = require_object(obj.get("config", {}), f"field '{prefix}config'")
    bad = sorted(set(cfg_raw) - CHECK_FIELDS)
    if bad:
        raise ApiError(422, f"field '{prefix}config' has unknown keys {bad}; allowed: {sorted(CHECK_FIELDS)}")
    try:
        check_config = CheckConfig(**cfg_raw)
    except (TypeError, ValueError) as exc:
        raise ApiError(422, f"field '{prefix}config': {exc}") from None
    return AnswerInput(answer=answer, documents=docs, verifier_answer=verifier), check_config


def grounding_item(body: Any, config: ServeConfig) -> tuple[list[str], list[Document], Granularity, float, bool]:
    """A ``/v1/grounding`` body validated: ``(statements, documents, granularity, threshold, matrix)``.

    ``statements`` is a list of strings, or ``answer`` a text split into statements; ``documents`` strings or
    ``{"title", "text"}`` objects; ``granularity`` ``"window"`` (default) or ``"sentence"``; ``threshold`` in [0, 1]
    (default 0.5); ``matrix`` (default true) returns the probability tensor.
    """
    obj = require_object(body)
    allowed = {"statements", "answer", "documents", "granularity", "threshold", "matrix"}
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ApiError(422, f"request body has unknown fields {unknown}; allowed: {sorted(allowed)}")
    if ("statements" in obj) == ("answer" in obj):
        raise ApiError(422, "send exactly one of field 'statements' (a list of strings) and field 'answer' (a text "
                            "split into statements)")
    if "answer" in obj:
        answer = check_text(require_str(obj["answer"], "field 'answer'"), "field 'answer'", config)
        statements = [st.text for st in split_statements(answer)]
    else:
        raw = require_list(obj["statements"], "field 'statements'", "strings")
        statements = [check_text(require_str(x, f"field 'statements[{i}]'"), f"field 'statements[{i}]'", config)
                      for i, x in enumerate(raw)]
    docs = parse_documents(obj.get("documents"), "", config)
    if not docs:
        raise ApiError(422, "field 'documents' is empty; send at least one document")
    granularity = obj.get("granularity", "window")
    if granularity not in GRANULARITIES:
        raise ApiError(422, f"field 'granularity' is {granularity!r}; use \"window\" or \"sentence\"")
    threshold = obj.get("threshold", 0.5)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ApiError(422, f"field 'threshold' is {threshold!r}; send a number within [0, 1]")
    matrix = require_bool(obj.get("matrix", True), "field 'matrix'")
    return statements, docs, granularity, float(threshold), matrix


def parse_predict(body: Any, config: ServeConfig) -> tuple[list[tuple[str, str]], bool, bool, bool]:
    """A ``/predict`` body (text-embeddings-inference's form) validated: ``(pairs, batched, raw_scores, truncate)``."""
    obj = require_object(body)
    if "inputs" not in obj:
        raise ApiError(422, "field 'inputs' is missing; send {\"inputs\": [premise, hypothesis]} or "
                            "{\"inputs\": [[premise, hypothesis], ...]}")
    pairs, batched = parse_tei_inputs(obj["inputs"], config)
    raw_scores = require_bool(obj.get("raw_scores", False), "field 'raw_scores'")
    truncate = obj.get("truncate", False)
    truncate = False if truncate is None else require_bool(truncate, "field 'truncate'")
    direction = obj.get("truncation_direction", "Right")
    if direction not in (None, "Right", "right"):
        raise ApiError(422, f"field 'truncation_direction' is {direction!r}; only \"Right\" is supported (the engine "
                            "truncates longest_first, the longer text losing its end)")
    return pairs, batched, raw_scores, truncate
