"""Sentence boundaries of a text as character spans: the one sentence splitter of the package.

Rules: every line is split on its own; inside a line, a sentence ends after ``.``, ``!``, ``?`` (and ``。！？``)
followed by white space, except after common abbreviations (``e.g.``, ``Dr.``, ``U.S.``, ...) and single-letter
initials (``J. K.``), and except before a lowercase letter. Spans exclude the white space around a sentence.

The engine cuts long premises into sentence-aligned windows with it (:mod:`fastnli.engine.windows`); CaLM splits
answers into statements with it (:mod:`fastnli.calm.statements`).
"""

from __future__ import annotations

import re

__all__ = ["sentence_spans"]

_BOUNDARY = re.compile(r"[.!?]+[\"'”’)\]]*\s+|[。！？]+\s*")
_LINE = re.compile(r"[^\n]+")
_ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "e.g", "i.e", "inc", "ltd", "co", "corp", "no",
    "fig", "approx", "dept", "est", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    "u.s", "u.k", "a.m", "p.m", "ca", "cf", "al", "gen", "gov", "sen", "rep", "rev", "ph.d", "b.c", "a.d",
})


def _is_abbreviation(chunk: str) -> bool:
    words = chunk.split()
    if not words:
        return False
    word = words[-1].lstrip("(\"'“‘").rstrip(".!?").lower()
    return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def _stripped(text: str, start: int, end: int) -> tuple[int, int] | None:
    """``(start, end)`` narrowed to exclude surrounding white space; None when nothing else is left."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else None


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the sentences of ``text``, in order (see the module docstring).

    ``text[start:end]`` is one sentence without surrounding white space; blank lines give no span.
    """
    spans: list[tuple[int, int]] = []
    for line in _LINE.finditer(text):
        block, base = line.group(), line.start()
        start = 0
        for m in _BOUNDARY.finditer(block):
            end = m.end()
            if end >= len(block):
                break
            punct_at = m.start()
            if block[punct_at] == "." and _is_abbreviation(block[start:punct_at + 1]):
                continue
            if block[end:end + 1].islower():
                continue
            span = _stripped(text, base + start, base + end)
            if span:
                spans.append(span)
            start = end
        span = _stripped(text, base + start, base + len(block))
        if span:
            spans.append(span)
    return spans
