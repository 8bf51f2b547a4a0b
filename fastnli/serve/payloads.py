"""Request validation of the service, every endpoint's: each error names the field, the value's problem and the
limit.

Shape and type errors raise :class:`ApiError` with status 422; size limits (pairs per request, characters per text,
tokens of an untruncated TEI input) with 413. Messages are stable: tests compare them exactly.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, TypeVar

from fastnli.calm.checks import AnswerInput, CheckConfig, check_cost
from fastnli.calm.documents import Document, as_document
from fastnli.calm.grounding import GRANULARITIES, Granularity
from fastnli.calm.statements import split_statements
from fastnli.engine.engine import check_utf8
from fastnli.scorers.api import SCORERS, ScorePlan, count_pairs, plan_scores
from fastnli.scorers.questions import QUESTION_FORMAT, resolve_question_format
from fastnli.serve.config import ENV_VARS, ServeConfig

__all__ = ["ApiError", "CALM_FIELDS", "CHECK_FIELDS", "GROUNDING_FIELDS", "NCP_FIELDS", "NcpItem", "PREDICT_FIELDS",
           "calm_item", "calm_request", "check_item_count", "check_pair_chars", "check_pair_count", "check_text", "grounding_item",
           "item_where", "ncp_item", "ncp_request", "parse_documents", "parse_pairs", "parse_predict", "parse_tei_inputs",
           "refuse_unknown", "require_bool", "require_list", "require_object", "require_str", "require_text"]

T = TypeVar("T")

#: The :class:`~fastnli.calm.checks.CheckConfig` fields a ``/v1/calm/check`` item may set.
CHECK_FIELDS = tuple(sorted(f.name for f in fields(CheckConfig)))
_CHECK_TYPES = typing.get_type_hints(CheckConfig)
#: The fields of a ``/v1/calm/check`` item, and of a ``/predict`` body (text-embeddings-inference's).
CALM_FIELDS = ("answer", "documents", "verifier_answer", "config")
PREDICT_FIELDS = ("inputs", "raw_scores", "truncate", "truncation_direction")
#: The fields of a ``/v1/grounding`` body.
GROUNDING_FIELDS = ("statements", "answer", "documents", "granularity", "threshold", "matrix", "align_units")


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

    def __reduce__(self) -> tuple[Any, ...]:  # a worker process's refusal travels back whole
        return (type(self), (self.status, self.message, self.error_type, self.headers))


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


def refuse_unknown(obj: Mapping[str, Any], allowed: Collection[str], where: str) -> None:
    """422 when ``obj`` has a key outside ``allowed`` (every route's one policy: unknown fields are refused, named)."""
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise ApiError(422, f"{where} has unknown fields {unknown}; allowed: {', '.join(allowed)}")


def _require_typed(value: Any, hint: Any, where: str) -> None:
    """422 unless the decoded JSON ``value`` has the type ``hint`` asks for (bool, float, str or a Literal of strings,
    optionally ``| None``): ``"false"`` is not a boolean and ``true`` is not a number."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        if value is None and type(None) in args:
            return
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        require_bool(value, where)
    elif hint is float or hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ApiError(422, f"{where} must be a number; got {_type(value)}")
    elif hint is str or typing.get_origin(hint) is Literal:
        require_str(value, where)


def require_text(value: Any, where: str, config: ServeConfig) -> str:
    """``value`` as a text field: a string (422 otherwise) that passes :func:`check_text`."""
    return check_text(require_str(value, where), where, config)


def check_text(text: str, where: str, config: ServeConfig) -> str:
    """413 when ``text`` is longer than ``config.max_text_chars`` characters; 422 when it cannot be encoded as UTF-8
    (a lone surrogate such as ``"\\ud800"``, which JSON escapes can carry), so it never reaches a shared engine
    pass."""
    if len(text) > config.max_text_chars:
        raise ApiError(413, f"{where} has {len(text)} characters; the limit is {config.max_text_chars} per text "
                            f"({ENV_VARS['max_text_chars']})")
    try:
        check_utf8(text, where)
    except ValueError as exc:
        raise ApiError(422, str(exc)) from None
    return text


def check_pair_count(n: int, where: str, config: ServeConfig) -> None:
    """413 when a request needs more than ``config.max_pairs_per_request`` NLI pairs."""
    if n > config.max_pairs_per_request:
        raise ApiError(413, f"{where} {n} NLI pairs; the limit is {config.max_pairs_per_request} per request "
                            f"({ENV_VARS['max_pairs_per_request']}); split the request")


def check_pair_chars(chars: int, config: ServeConfig) -> None:
    """413 when a request's planned pairs hold more text than ``max_pairs_per_request x max_text_chars`` characters
    (a ``/v1/calm/check`` statement's citation pairs repeat its cited documents)."""
    limit = config.max_pairs_per_request * config.max_text_chars
    if chars > limit:
        raise ApiError(413, f"the request's NLI pairs hold {chars} characters (each citation pair of a statement "
                            f"repeats its cited documents); the limit is {limit} ({ENV_VARS['max_pairs_per_request']} "
                            f"x {ENV_VARS['max_text_chars']}); cite fewer or shorter documents per statement, or "
                            "split the request")


def check_item_count(n: int, config: ServeConfig) -> None:
    """413 when a batched body has more than ``config.max_pairs_per_request`` items (each item is work, even one
    that needs no pair)."""
    if n > config.max_pairs_per_request:
        raise ApiError(413, f"request body has {n} items; the limit is {config.max_pairs_per_request} per request "
                            f"({ENV_VARS['max_pairs_per_request']}); split the request")


def _pair(item: Any, where: str, config: ServeConfig) -> tuple[str, str]:
    if not isinstance(item, list):
        raise ApiError(422, f"{where} must be a [premise, hypothesis] array of two strings; got {_type(item)}")
    if len(item) != 2:
        raise ApiError(422, f"{where} must be a [premise, hypothesis] array of two strings; got {len(item)} items")
    premise = require_text(item[0], f"{where}[0] (premise)", config)
    hypothesis = require_text(item[1], f"{where}[1] (hypothesis)", config)
    return premise, hypothesis


def parse_pairs(body: Any, config: ServeConfig) -> list[tuple[str, str]]:
    """The ``pairs`` of a ``/v1/nli`` body: ``{"pairs": [[premise, hypothesis], ...]}``."""
    obj = require_object(body)
    refuse_unknown(obj, ("pairs",), "request body")
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


NCP_FIELDS = ("response", "sampled_responses", "prompt", "scorers", "use_best", "question_aware", "align_units")


def item_where(prefix: str) -> str:
    """``"request body"`` or ``"request body[i]"`` for the item of a batched body whose field prefix is ``"[i]."``."""
    return f"request body{prefix[:-1]}" if prefix else "request body"


@dataclass(frozen=True)
class NcpItem:
    """One validated ``/v1/ncp`` item: its pair count is known before any pair is built (:meth:`plan` builds them)."""

    where: str
    response: str
    samples: list[str]
    scorers: list[str]
    use_best: bool
    prompt: str | None
    question_format: str | None  # None: the answers alone
    n_pairs: int
    align_units: bool = False

    def plan(self) -> ScorePlan:
        """The item's :class:`ScorePlan` (422 for what only the scorers' own checks find)."""
        try:
            return plan_scores([self.response], [self.samples], scorers=self.scorers, use_best=self.use_best,
                               questions=[self.prompt] if self.question_format and self.prompt is not None else None,
                               question_format=self.question_format or QUESTION_FORMAT, align_units=self.align_units)
        except (TypeError, ValueError) as exc:
            raise ApiError(422, f"{self.where}: {exc}") from None


def ncp_item(item: Any, prefix: str, config: ServeConfig, model_question_format: str | None = None,
             model_align_units: bool = False) -> NcpItem:
    """One ``/v1/ncp`` item (``prefix`` ``"[i]."`` in a batched body) validated, with its pair count.

    ``model_question_format``: the served model's ``manifest.question_format``, which decides whether an item's
    ``prompt`` is used by default (``question_aware`` absent or null); ``model_align_units``: its
    ``manifest.align_units``, the default of ``align_units``; both as in :func:`fastnli.scorers.score`."""
    where = item_where(prefix)
    obj = require_object(item, where)
    refuse_unknown(obj, NCP_FIELDS, where)
    for key in ("response", "sampled_responses"):
        if key not in obj:
            raise ApiError(422, f"field '{prefix}{key}' is missing; send {{\"response\": str, "
                                "\"sampled_responses\": [str, ...]}")
    response = require_text(obj["response"], f"field '{prefix}response'", config)
    samples = require_list(obj["sampled_responses"], f"field '{prefix}sampled_responses'", "strings")
    if not samples:
        raise ApiError(422, f"field '{prefix}sampled_responses' is empty; give at least one sampled response")
    for j, s in enumerate(samples):
        require_text(s, f"{prefix}sampled_responses[{j}]", config)
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
        prompt = require_text(prompt, f"field '{prefix}prompt'", config)
    question_aware = obj.get("question_aware")
    if question_aware is not None:
        question_aware = require_bool(question_aware, f"field '{prefix}question_aware'")
    try:
        fmt = resolve_question_format(question_aware, None if prompt is None else [prompt], model_question_format)
    except (TypeError, ValueError) as exc:
        raise ApiError(422, f"{where}: {exc}") from None
    align_units = obj.get("align_units")
    if align_units is not None:
        align_units = require_bool(align_units, f"field '{prefix}align_units'")
    return NcpItem(where, response, samples, scorers, use_best, prompt, fmt, count_pairs([response], [samples], scorers),
                   model_align_units if align_units is None else align_units)


def _items(body: Any, config: ServeConfig, parse_item: Callable[[Any, str], T]) -> tuple[bool, list[T]]:
    """``(batched, items)`` of a body that is one item or a list of them (at most ``max_pairs_per_request``), each
    parsed by ``parse_item(item, prefix)``, the prefix ``"[i]."`` naming its place in a list."""
    batched = isinstance(body, list)
    raw = body if batched else [body]
    check_item_count(len(raw), config)
    return batched, [parse_item(item, f"[{i}]." if batched else "") for i, item in enumerate(raw)]


def ncp_request(body: Any, config: ServeConfig, model_question_format: str | None = None,
                model_align_units: bool = False) -> tuple[bool, list[NcpItem]]:
    """A ``/v1/ncp`` body (one item or a list of them) validated: ``(batched, items)``; the pair count of all items is
    checked before any pair is built. The model defaults are :func:`ncp_item`'s."""
    batched, items = _items(body, config, lambda item, prefix: ncp_item(item, prefix, config, model_question_format,
                                                                        model_align_units))
    check_pair_count(sum(it.n_pairs for it in items), "the request needs", config)
    return batched, items


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
    refuse_unknown(obj, CALM_FIELDS, where)
    if "answer" not in obj:
        raise ApiError(422, f"field '{prefix}answer' is missing; send {{\"answer\": str, \"documents\": [...], "
                            "\"verifier_answer\": str}")
    answer = require_text(obj["answer"], f"field '{prefix}answer'", config)
    docs = parse_documents(obj.get("documents", []), prefix, config)
    verifier = obj.get("verifier_answer")
    if verifier is not None:
        verifier = require_text(verifier, f"field '{prefix}verifier_answer'", config)
    cfg_raw = require_object(obj.get("config", {}), f"field '{prefix}config'")
    refuse_unknown(cfg_raw, CHECK_FIELDS, f"field '{prefix}config'")
    for key, value in cfg_raw.items():
        _require_typed(value, _CHECK_TYPES[key], f"field '{prefix}config.{key}'")
    try:
        check_config = CheckConfig(**cfg_raw)
    except (TypeError, ValueError) as exc:
        raise ApiError(422, f"field '{prefix}config': {exc}") from None
    return AnswerInput(answer=answer, documents=docs, verifier_answer=verifier), check_config


def calm_request(body: Any, config: ServeConfig) -> tuple[bool, list[tuple[AnswerInput, CheckConfig]]]:
    """A ``/v1/calm/check`` body (one item or a list of them) validated: ``(batched, items)``. Statements x verifier
    sentences can be quadratic in the text, so the pairs and characters the checks need are counted from the texts
    before any pair is built."""
    batched, items = _items(body, config, lambda item, prefix: calm_item(item, prefix, config))
    costs = [check_cost([answer], c) for answer, c in items]
    check_pair_count(sum(c.pairs for c in costs), "the request needs", config)
    check_pair_chars(sum(c.chars for c in costs), config)
    return batched, items


def grounding_item(body: Any, config: ServeConfig
                   ) -> tuple[list[str], list[Document], Granularity, float | None, bool, bool | None]:
    """A ``/v1/grounding`` body validated: ``(statements, documents, granularity, threshold, matrix, align_units)``.

    ``statements`` is a list of strings, or ``answer`` a text split into statements; ``documents`` strings or
    ``{"title", "text"}`` objects; ``granularity`` ``"window"`` (default) or ``"sentence"``; ``threshold`` in [0, 1]
    (default None: :func:`fastnli.grounding`'s); ``matrix`` (default true) returns the probability tensor;
    ``align_units`` true/false (default null: the model's).
    """
    obj = require_object(body)
    refuse_unknown(obj, GROUNDING_FIELDS, "request body")
    if ("statements" in obj) == ("answer" in obj):
        raise ApiError(422, "send exactly one of field 'statements' (a list of strings) and field 'answer' (a text "
                            "split into statements)")
    if "answer" in obj:
        answer = require_text(obj["answer"], "field 'answer'", config)
        statements = [st.text for st in split_statements(answer)]
    else:
        raw = require_list(obj["statements"], "field 'statements'", "strings")
        statements = [require_text(x, f"field 'statements[{i}]'", config) for i, x in enumerate(raw)]
    docs = parse_documents(obj.get("documents"), "", config)
    if not docs:
        raise ApiError(422, "field 'documents' is empty; send at least one document")
    # every statement meets every document in at least one window: refused before any document is tokenized
    check_pair_count(len(statements) * len(docs), "the request needs at least", config)
    granularity = obj.get("granularity", "window")
    if granularity not in GRANULARITIES:
        raise ApiError(422, f"field 'granularity' is {granularity!r}; use \"window\" or \"sentence\"")
    threshold = obj.get("threshold")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not 0.0 <= threshold <= 1.0):
        raise ApiError(422, f"field 'threshold' is {threshold!r}; send a number within [0, 1] (or null: the "
                            "model's default)")
    matrix = require_bool(obj.get("matrix", True), "field 'matrix'")
    align_units = obj.get("align_units")
    if align_units is not None:
        align_units = require_bool(align_units, "field 'align_units'")
    return statements, docs, granularity, None if threshold is None else float(threshold), matrix, align_units


def parse_predict(body: Any, config: ServeConfig) -> tuple[list[tuple[str, str]], bool, bool, bool]:
    """A ``/predict`` body (text-embeddings-inference's form) validated: ``(pairs, batched, raw_scores, truncate)``."""
    obj = require_object(body)
    refuse_unknown(obj, PREDICT_FIELDS, "request body")
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
