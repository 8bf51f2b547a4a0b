"""Checks of one input record of the scorers (a JSONL line, a CSV row, a row of a Ray dataset)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def check_record(record: Mapping[str, Any], where: str, response_field: str = "response",
                 samples_field: str = "sampled_responses") -> None:
    """Raise ValueError naming ``where`` (a file line, a row id) and the field when ``record`` cannot be scored.

    A record needs ``response_field`` (a string) and ``samples_field`` (a non-empty list of strings); an optional
    ``prompt`` (the question) must be a string.
    """
    if response_field not in record:
        raise ValueError(f"{where}: missing field {response_field!r}")
    response = record[response_field]
    if not isinstance(response, str):
        raise ValueError(f"{where}: field {response_field!r} must be a string, got {type(response).__name__}")
    samples = record.get(samples_field)
    if samples is None:
        raise ValueError(f"{where}: missing field {samples_field!r} (a list of at least one string)")
    if not isinstance(samples, list) or not samples:
        raise ValueError(f"{where}: field {samples_field!r} must be a non-empty list of strings")
    for j, x in enumerate(samples):
        if not isinstance(x, str):
            raise ValueError(f"{where}: field {samples_field!r}[{j}] must be a string, got {type(x).__name__}")
    prompt = record.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"{where}: field 'prompt' must be a string (the question), got {type(prompt).__name__}")


def record_prompts(records: Sequence[Mapping[str, Any]], where: Sequence[str]) -> list[str] | None:
    """The ``prompt`` field of every record (the question of its response), or None when no record has one.

    Raises:
        ValueError: naming the first record without a prompt when others have one.
    """
    have = [r.get("prompt") is not None for r in records]
    if not any(have):
        return None
    if not all(have):
        raise ValueError(missing_prompt_message(where[have.index(False)]))
    return [str(r["prompt"]) for r in records]


def missing_prompt_message(where: str) -> str:
    """The error of a record without ``prompt`` among records that have one (``where``: its file line or row id)."""
    return f"{where}: missing field 'prompt'; other records have one: give every record its question or none"
