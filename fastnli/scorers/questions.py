"""Question-aware NLI inputs: each answer is read as an answer to its question.

Two short answers such as "1989" and "1991" carry no claim of their own; as answers to "When did the Berlin Wall
fall?" they contradict each other. With a question, every text of a prompt goes to the NLI model as
``QUESTION_FORMAT.format(question=..., answer=...)``. A model trained with that form records it in its manifest
(``question_format``), and :func:`resolve_question_format` uses it by default for that model only; for any other
model the default stays uqlm's exact inputs (the answers alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: The question-aware form of an answer (the embedded default model is trained on it).
QUESTION_FORMAT = "Question: {question}\nAnswer: {answer}"


def with_question(question: str, answer: str, fmt: str = QUESTION_FORMAT) -> str:
    """``answer`` as an answer to ``question`` (whitespace collapsed, one trailing question mark)."""
    q = " ".join(question.split()).rstrip("?").rstrip()
    return fmt.format(question=q + "?" if q else "", answer=answer)


def validate_prompts(prompts: Any, n: int) -> list[str]:
    """``prompts`` as a list of ``n`` strings; TypeError/ValueError names the field and index."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of strings (one question per response); got {type(prompts).__name__}")
    if len(prompts) != n:
        raise ValueError(f"prompts has {len(prompts)} items but responses has {n}; give one prompt per response")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise TypeError(f"prompts[{i}] must be str; got {type(p).__name__}")
    return list(prompts)


def model_question_format(engine: Any) -> str | None:
    """The question-aware input form an engine's model was trained on (its manifest's ``question_format``), or None
    (also for engines without a manifest, such as test doubles)."""
    return getattr(getattr(engine, "manifest", None), "question_format", None)


def check_question_aware(question_aware: bool | None, prompts: Sequence[str] | None) -> None:
    """Raise ValueError when ``question_aware=True`` comes without prompts (before any model is loaded)."""
    if question_aware is True and prompts is None:
        raise ValueError("question_aware=True needs prompts: pass prompts=[question per response]")


def resolve_question_format(question_aware: bool | None, prompts: Sequence[str] | None,
                            model_format: str | None) -> str | None:
    """The input form to use, or None for the answers alone (uqlm's inputs).

    Args:
        question_aware: True: put each prompt's question in front of its answers (needs ``prompts``); False: never;
            None (default): only when ``prompts`` are given and the model was trained question-aware
            (``model_format``, from its manifest).
        prompts: the questions, one per response, or None.
        model_format: the model's ``manifest.question_format`` (None for models trained on plain NLI pairs).

    Raises:
        ValueError: ``question_aware=True`` without prompts.
    """
    check_question_aware(question_aware, prompts)
    if question_aware is False or prompts is None:
        return None
    if question_aware is None and model_format is None:
        return None
    return model_format or QUESTION_FORMAT
