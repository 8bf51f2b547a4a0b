"""Statements of an answer: sentence split, ALCE citation markers parsed into document indices and stripped.

Rules of :func:`split_statements`, in order:

1. The answer is read line by line. A line that starts a list item (``-``, ``*``, ``+``, ``•``, ``1.``, ``1)``) is one
   item; other non-empty lines are paragraphs. A line that ends with ``:`` and cites nothing (``Reasons:``) introduces
   a list and is not a statement.
2. Each item or paragraph is split into sentences after ``.``, ``!``, ``?`` (and ``。！？``) followed by white space,
   except after common abbreviations (``e.g.``, ``Dr.``, ``U.S.``, ...) and single-letter initials (``J. K.``), and
   except before a lowercase letter.
3. Citation markers are ``[1]``, ``[1][2]``, ``[1, 2]`` and ``[1-3]`` (1-based, as the documents are numbered in the
   prompt). Markers that open a sentence (``... capital. [1] It ...``) belong to the previous sentence. Markers are
   parsed into 0-based document indices and removed from the statement text.
4. A citation to a number outside ``1..num_documents`` is out of range: it is kept in
   :attr:`Statement.invalid_citations` (as written, 1-based) and never raises.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from fastnli.engine.sentences import sentence_spans

__all__ = ["Statement", "format_citations", "parse_citations", "split_sentences", "split_statements",
           "strip_citations"]

_MARKER = re.compile(r"\[\s*(\d+(?:\s*[-–,;]\s*\d+)*)\s*\]")
_MARKER_WITH_SPACE = re.compile(r"\s*\[\s*\d+(?:\s*[-–,;]\s*\d+)*\s*\]")
_LEADING_MARKERS = re.compile(r"^(?:\s*\[\s*\d+(?:\s*[-–,;]\s*\d+)*\s*\])+[.!?。！？]?")
_BULLET = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s+")
_MAX_RANGE = 100  # "[1-3]" expands; a wider range is read as its two endpoints


@dataclass(frozen=True)
class Statement:
    """One sentence or list item of an answer.

    Attributes:
        text: the statement with its citation markers removed (the NLI hypothesis).
        citations: 0-based indices of the cited documents that exist, in order of first mention, without repeats.
        invalid_citations: citation numbers as written (1-based) that point to no document, e.g. ``[7]`` when the
            prompt showed 5 documents, or ``[0]``.
        raw: the sentence as written, markers included.
    """

    text: str
    citations: tuple[int, ...] = ()
    invalid_citations: tuple[int, ...] = ()
    raw: str = ""

    @property
    def num_citations(self) -> int:
        """Citations written, valid or not (ALCE's denominator of citation precision)."""
        return len(self.citations) + len(self.invalid_citations)


def _marker_numbers(body: str) -> list[int]:
    numbers: list[int] = []
    for part in re.split(r"\s*[,;]\s*", body):
        bounds = [int(x) for x in re.split(r"\s*[-–]\s*", part) if x]
        if len(bounds) == 2 and 0 <= bounds[1] - bounds[0] <= _MAX_RANGE:
            numbers.extend(range(bounds[0], bounds[1] + 1))
        else:
            numbers.extend(bounds)
    return numbers


def parse_citations(text: str, num_documents: int | None = None) -> tuple[list[int], list[int]]:
    """Parse the citation markers of ``text``.

    Args:
        text: a sentence (or a whole answer) with ALCE markers such as ``[1][2]``.
        num_documents: how many documents the prompt numbered ``1..num_documents`` (default None: any number ≥ 1 is
            in range).

    Returns:
        ``(citations, invalid)``: 0-based indices of documents in range, in order of first mention without repeats;
        and the out-of-range numbers as written (1-based), without repeats.
    """
    valid: dict[int, None] = {}
    invalid: dict[int, None] = {}
    for m in _MARKER.finditer(text):
        for n in _marker_numbers(m.group(1)):
            if n >= 1 and (num_documents is None or n <= num_documents):
                valid[n - 1] = None
            else:
                invalid[n] = None
    return list(valid), list(invalid)


def strip_citations(text: str) -> str:
    """``text`` without citation markers, white space normalised (``"Paris [1][2]."`` → ``"Paris."``)."""
    out = _MARKER_WITH_SPACE.sub("", text)
    out = re.sub(r"\s+([.,;:!?])", r"\1", out)
    return " ".join(out.split())


def format_citations(indices: Iterable[int]) -> str:
    """ALCE markers for 0-based document indices: ``[0, 2]`` → ``"[1][3]"``."""
    return "".join(f"[{i + 1}]" for i in indices)


def _split_block(block: str) -> list[str]:
    sentences = [block[start:end] for start, end in sentence_spans(block)]
    # Markers that open a sentence belong to the one before it ("... capital. [1] It is ...").
    merged: list[str] = []
    for s in sentences:
        lead = _LEADING_MARKERS.match(s)
        if lead and merged:
            merged[-1] = f"{merged[-1]} {lead.group(0).strip()}"
            s = s[lead.end():].strip()
        if s:
            merged.append(s)
    return merged


def split_sentences(text: str) -> list[str]:
    """Sentences and list items of ``text``, markers kept (rules 1–2 of the module docstring, headers dropped)."""
    out: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        bullet = _BULLET.match(line)
        if bullet:
            line = line[bullet.end():].strip()
        elif line.endswith(":") and not _MARKER.search(line):
            continue
        out.extend(_split_block(line))
    return out


def split_statements(answer: str, num_documents: int | None = None) -> list[Statement]:
    """Split an answer into :class:`Statement` objects (see the module docstring for the rules).

    Args:
        answer: the LM's answer with ALCE citation markers.
        num_documents: how many documents the prompt numbered (default None: any citation number ≥ 1 is in range).

    Returns:
        The statements in order; sentences that hold nothing but markers are dropped (their markers are attached to
        the sentence before, when there is one).
    """
    statements = []
    for raw in split_sentences(answer):
        text = strip_citations(raw)
        if not text or not any(ch.isalnum() for ch in text):
            continue
        valid, invalid = parse_citations(raw, num_documents)
        statements.append(Statement(text=text, citations=tuple(valid), invalid_citations=tuple(invalid), raw=raw))
    return statements
