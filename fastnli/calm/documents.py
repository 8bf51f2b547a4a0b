"""Documents of a CaLM run: validation, the NLI premise form, and the token estimate behind ``truncated`` flags.

A document is a string or a ``{"title": ..., "text": ...}`` mapping (``title`` optional); both become a frozen
:class:`Document`. As a premise, a document reads ``"Title: <title>\\n<text>"`` (ALCE's form) or just its text; several
documents are joined with a newline, in the order the answer cites them.

The NLI model reads at most ``max_length`` tokens (512 for DeBERTa) per (premise, hypothesis) pair and the engine
truncates longer pairs ``longest_first``. Checks never tokenize; they flag a pair as truncated when the estimate of
:func:`estimate_tokens` says it will not fit, and say so in the results and in one log warning per engine pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastnli.engine.tokenize import PAIR_SPECIAL_TOKENS

__all__ = ["Document", "DocumentLike", "as_document", "as_documents", "estimate_tokens", "premise_text",
           "pair_overflows"]

@dataclass(frozen=True)
class Document:
    """One retrieved document. ``title`` may be empty."""

    text: str
    title: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"title": self.title, "text": self.text}


DocumentLike = str | Document | Mapping[str, Any]


def as_document(doc: Any, where: str) -> Document:
    """Normalise one document; ``where`` names it in errors (e.g. ``"documents[0][2]"``).

    Raises:
        TypeError: not a str, :class:`Document` or mapping, or a title/text that is not a str.
        ValueError: a mapping without a ``"text"`` field.
    """
    if isinstance(doc, Document):
        return doc
    if isinstance(doc, str):
        return Document(text=doc)
    if isinstance(doc, Mapping):
        if "text" not in doc:
            raise ValueError(f"{where} is a mapping without a 'text' field (keys: {sorted(map(str, doc))}); give a "
                             "string or {'title': ..., 'text': ...}")
        text, title = doc["text"], doc.get("title") or ""
        if not isinstance(text, str):
            raise TypeError(f"{where}['text'] must be str; got {type(text).__name__}")
        if not isinstance(title, str):
            raise TypeError(f"{where}['title'] must be str; got {type(title).__name__}")
        return Document(text=text, title=title)
    raise TypeError(f"{where} must be a string or a {{'title': ..., 'text': ...}} dict; got {type(doc).__name__}")


def as_documents(docs: Any, where: str) -> list[Document]:
    """Normalise a list of documents; ``where`` names the list in errors (e.g. ``"documents[3]"``).

    Raises:
        TypeError: ``docs`` is not a list (a bare string is refused), or an item is not a document.
        ValueError: ``docs`` is empty, or an item is a mapping without ``"text"``.
    """
    if isinstance(docs, (str, bytes, Mapping)) or not isinstance(docs, Sequence):
        raise TypeError(f"{where} must be a list of documents (strings or {{'title': ..., 'text': ...}} dicts); got "
                        f"{type(docs).__name__}")
    if len(docs) == 0:
        raise ValueError(f"{where} is empty; give at least one document (or a retriever)")
    return [as_document(d, f"{where}[{j}]") for j, d in enumerate(docs)]


def premise_text(docs: Sequence[Document]) -> str:
    """The NLI premise of one or more documents: ``"Title: t\\ntext"`` (or the text) per document, joined by newlines."""
    return "\n".join(f"Title: {d.title}\n{d.text}" if d.title else d.text for d in docs)


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate of the subword tokens of ``text``: ``ceil(max(1.3 × words, characters / 4))``.

    Deliberately on the high side for English BPE/Unigram vocabularies (about 1.3 tokens per word, 4 characters per
    token), so that a ``truncated`` flag errs towards warning.
    """
    return math.ceil(max(1.3 * len(text.split()), len(text) / 4))


def pair_overflows(premise: str, hypothesis: str, max_length: int = 512) -> bool:
    """Whether the pair probably exceeds ``max_length`` tokens (special tokens included) and will be truncated."""
    return estimate_tokens(premise) + estimate_tokens(hypothesis) + PAIR_SPECIAL_TOKENS > max_length
