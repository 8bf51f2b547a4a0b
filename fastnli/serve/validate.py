"""Request validation of the service: each error names the field, the value's problem and the limit.

Shape and type errors raise :class:`ApiError` with status 422; size limits (pairs per request, characters per text,
tokens of an untruncated TEI input) with 413. Messages are stable: tests compare them exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastnli.serve.config import ENV_VARS, ServeConfig

__all__ = ["ApiError", "check_pair_count", "check_text", "parse_pairs", "parse_tei_inputs", "require_bool",
           "require_list", "require_object", "require_str"]


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
