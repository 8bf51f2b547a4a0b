"""Numbers as written: digits ("168", "1,200", "2.5"), English words ("one hundred sixty-eight", "twelve hundred",
"two thousand and five") and either with a scale word ("2.5 million", "three billion").

A small NLI model reads "168" against "one hundred sixty-eight" as a contradiction, and "2,500,000" against "2.5
million" the same way: it compares how numbers look. :func:`align_numbers` writes
each number of a hypothesis that the premise states with the same value, in another form, as the premise writes it,
so the model sees one form. It never changes a value: numbers that differ stay as written.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

_ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
_TENS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = {"thousand": 10 ** 3, "million": 10 ** 6, "billion": 10 ** 9, "trillion": 10 ** 12}
_WORD_VALUES: dict[str, int] = {**{w: i for i, w in enumerate(_ONES)},
                                **{t: 20 + 10 * i for i, t in enumerate(_TENS)}}


def alternation(forms: Sequence[str]) -> str:
    """A regular-expression alternation of literal ``forms`` (no group), longest first so that the longest form
    wins; a space in a form matches any run of whitespace."""
    return "|".join(re.escape(f).replace(r"\ ", r"\s+") for f in sorted(forms, key=len, reverse=True))


def _words(words: Sequence[str]) -> str:
    return rf"(?:{alternation(words)})\b"


_BELOW_100 = rf"(?:{_words(_TENS)}(?:[-\s]{_words(_ONES[1:10])})?|{_words(_ONES)})"
_BELOW_1000 = rf"(?:(?:a|{_BELOW_100})\s+hundred\b(?:\s+(?:and\s+)?{_BELOW_100})?|{_BELOW_100})"
_SCALED = rf"(?:a|{_BELOW_1000})\s+{_words(list(_SCALES))}"
_JOIN = r"(?:\s+(?:and\s+)?)"
#: a number in English words (case-insensitive; no group): 0 to the trillions, "and" after "hundred" or a scale word
#: only ("two hundred and six", "two thousand and five"); "a hundred", "twelve hundred", "sixty eight" count
NUMBER_WORDS = rf"(?i:{_SCALED}(?:{_JOIN}{_SCALED})*(?:{_JOIN}{_BELOW_1000})?|{_BELOW_1000})"
#: a number in digits (no group): thousands separated by commas or not, a minus sign, decimals
NUMBER_DIGITS = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
# a number, not part of a longer one, an identifier or a version ("A4", "3.2.1"), optionally with a scale word after it
_NUMBER = re.compile(rf"(?<![\w.,])(?:({NUMBER_DIGITS})(?:\s+({_words(list(_SCALES))}))?|({NUMBER_WORDS}))"
                     r"(?![\w-]|[.,]\d)", re.I)
#: numbers never rewritten: "one" alone is as often a pronoun ("no one", "the one who") as a count
NOT_REWRITTEN = frozenset({"one"})


def word_value(text: str) -> int:
    """The value of a number written in words (:data:`NUMBER_WORDS`, any case and spacing): "one hundred and
    sixty-eight" is 168, "twelve hundred" 1,200, "a million" 1,000,000.

    Raises:
        ValueError: ``text`` is not a number in words.
    """
    total = current = 0
    for word in re.split(r"[\s,-]+", text.strip().lower()):
        if word in _WORD_VALUES:
            current += _WORD_VALUES[word]
        elif word == "hundred":
            current = (current or 1) * 100
        elif word in _SCALES:
            total += (current or 1) * _SCALES[word]
            current = 0
        elif word not in ("a", "and"):
            raise ValueError(f"not a number in words: {text!r}")
    return total + current


@dataclass(frozen=True)
class Number:
    """A number as written at ``span`` of a text: its ``value`` and ``text``; ``words`` when it is written in words."""

    value: float
    text: str
    span: tuple[int, int]
    words: bool


@functools.lru_cache(maxsize=4096)
def numbers(text: str) -> tuple[Number, ...]:
    """Every number of ``text`` in order: digits (with an optional scale word: "2.5 million") and words."""
    out = []
    for m in _NUMBER.finditer(text):
        digits, scale, words = m.group(1), m.group(2), m.group(3)
        if words is not None:
            value = float(word_value(words))
        else:
            value = float(digits.replace(",", "")) * (_SCALES[scale.lower()] if scale else 1)
        out.append(Number(value, m.group(0), m.span(), words is not None))
    return tuple(out)


def align_numbers(premise: str, hypothesis: str) -> str:
    """``hypothesis`` with each number that the premise states with the same value in another form written as the
    premise writes it ("There are one hundred sixty-eight hours in a week." against "168" reads "There are 168 hours
    in a week."; "Seven" against "There are 7 continents." reads "7"). A number written in words keeps the case of
    the hypothesis's first letter. Numbers of other values, a lone "one" (:data:`NOT_REWRITTEN`) and the rest of the
    text are kept byte for byte; a hypothesis without such numbers comes back as it is.
    """
    theirs = numbers(premise)
    if not theirs:
        return hypothesis
    out, last = [], 0
    for n in numbers(hypothesis):
        if n.text.lower() in NOT_REWRITTEN:
            continue
        same = [p for p in theirs if p.value == n.value]
        if not same or any(p.text.lower() == n.text.lower() for p in same):
            continue
        ref = same[0]
        text = ref.text
        if ref.words:
            text = (str.upper if n.text[:1].isupper() else str.lower)(text[:1]) + text[1:]
        out += [hypothesis[last:n.span[0]], text]
        last = n.span[1]
    return "".join(out) + hypothesis[last:] if out else hypothesis
