"""Unit alignment: the quantities of a hypothesis rewritten into the premise's units before NLI (and its numbers into
the premise's form).

A small NLI model compares "569 kilometres" with "354 miles" by their digits, not by converting them: it cannot tell
the right conversion from a wrong one. :func:`align_units` does the conversion, so that the model compares numbers in
one unit, which it does well:

- "The river is 354 miles long." against the premise "The river is 569 kilometres long." becomes "The river is 569
  kilometres long." (354 miles, as stated to the unit, is 569 km as stated to the kilometre: the same quantity);
- "... 182 miles long." becomes "... 293 kilometres long." (a different quantity, written in the premise's unit).

Numbers are read as digits ("1,140", "2.5") or as words (:mod:`fastnli.scorers.numbers`: "five miles", "a hundred
metres", "three hundred fifty-four miles"). Only quantities with a unit of the table below are converted, only when the
premise states a quantity of the same dimension in another unit and none in the hypothesis's own unit; then a number
the premise writes with the same value in another form takes the premise's form
(:func:`~fastnli.scorers.numbers.align_numbers`); everything else in the text is kept byte for byte.
Two quantities are the same when their intervals as stated (half a unit of the last written digit either side;
round numbers: see :func:`_half`) overlap, widened by :data:`RELATIVE_SLACK` for rounded conversion factors
("5 miles" is "8 km").
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from fastnli.scorers.numbers import NUMBER_DIGITS, NUMBER_WORDS, align_numbers, alternation, word_value

#: the relative tolerance of "the same quantity" on top of the stated precision (1 mile = 1.6 km, 1 inch = 2.5 cm)
RELATIVE_SLACK = 0.01
#: the most a round whole number ("300 m", "1,000 feet") may stand for either side, relative to its value
ROUND_NUMBER_PRECISION = 0.025


@dataclass(frozen=True)
class Unit:
    """One unit: its dimension and the conversion of a value to and from the dimension's base unit."""

    name: str
    dimension: str
    to_base: Callable[[float], float]
    from_base: Callable[[float], float]


def _linear(name: str, dimension: str, factor: float) -> Unit:
    return Unit(name, dimension, lambda v: v * factor, lambda v: v / factor)


def _affine(name: str, factor: float, offset: float) -> Unit:
    """A temperature scale: kelvin = value * factor + offset."""
    return Unit(name, "temperature", lambda v: v * factor + offset, lambda k: (k - offset) / factor)


_MILE = 1609.344
_FOOT = 0.3048
_GALLON = 3.785411784e-3
_YEAR = 365.2425 * 86400
#: written forms of each unit (matched case-insensitively, longest first; symbols are matched case-sensitively)
_UNIT_FORMS: tuple[tuple[Unit, tuple[str, ...], tuple[str, ...]], ...] = (
    # length (base: metre)
    (_linear("millimetre", "length", 1e-3), ("millimetres", "millimeters", "millimetre", "millimeter"), ("mm",)),
    (_linear("centimetre", "length", 1e-2), ("centimetres", "centimeters", "centimetre", "centimeter"), ("cm",)),
    (_linear("metre", "length", 1.0), ("metres", "meters", "metre", "meter"), ("m",)),
    (_linear("kilometre", "length", 1e3), ("kilometres", "kilometers", "kilometre", "kilometer"), ("km",)),
    (_linear("inch", "length", 0.0254), ("inches", "inch"), ()),
    (_linear("foot", "length", _FOOT), ("feet", "foot"), ("ft",)),
    (_linear("yard", "length", 0.9144), ("yards", "yard"), ("yd",)),
    (_linear("mile", "length", _MILE), ("miles", "mile"), ("mi",)),
    (_linear("nautical mile", "length", 1852.0), ("nautical miles", "nautical mile"), ("nmi",)),
    # mass (base: kilogram)
    (_linear("milligram", "mass", 1e-6), ("milligrams", "milligram"), ("mg",)),
    (_linear("gram", "mass", 1e-3), ("grams", "gram", "grammes", "gramme"), ("g",)),
    (_linear("kilogram", "mass", 1.0), ("kilograms", "kilogram", "kilos", "kilo"), ("kg",)),
    (_linear("tonne", "mass", 1e3), ("tonnes", "tonne", "metric tons", "metric ton"), ()),
    (_linear("ounce", "mass", 0.028349523125), ("ounces", "ounce"), ("oz",)),
    (_linear("pound", "mass", 0.45359237), ("pounds", "pound"), ("lbs", "lb")),
    # time (base: second)
    (_linear("second", "time", 1.0), ("seconds", "second", "secs", "sec"), ()),
    (_linear("minute", "time", 60.0), ("minutes", "minute", "mins", "min"), ()),
    (_linear("hour", "time", 3600.0), ("hours", "hour", "hrs", "hr"), ("h",)),
    (_linear("day", "time", 86400.0), ("days", "day"), ()),
    (_linear("week", "time", 7 * 86400.0), ("weeks", "week"), ()),
    (_linear("month", "time", _YEAR / 12), ("months", "month"), ()),
    (_linear("year", "time", _YEAR), ("years", "year"), ()),
    # temperature (base: kelvin)
    (_affine("degree Celsius", 1.0, 273.15),
     ("degrees celsius", "degree celsius", "degrees centigrade", "degrees c", "celsius", "centigrade"), ("°C", "ºC")),
    (_affine("degree Fahrenheit", 5 / 9, 273.15 - 32 * 5 / 9),
     ("degrees fahrenheit", "degree fahrenheit", "degrees f", "fahrenheit"), ("°F", "ºF")),
    (_affine("kelvin", 1.0, 0.0), ("kelvins", "kelvin"), ()),
    # volume (base: cubic metre)
    (_linear("millilitre", "volume", 1e-6), ("millilitres", "milliliters", "millilitre", "milliliter"), ("ml", "mL")),
    (_linear("litre", "volume", 1e-3), ("litres", "liters", "litre", "liter"), ("l", "L")),
    (_linear("cubic metre", "volume", 1.0), ("cubic metres", "cubic meters", "cubic metre", "cubic meter"),
     ("m³", "m3")),
    (_linear("US gallon", "volume", _GALLON), ("us gallons", "us gallon", "gallons", "gallon"), ("gal",)),
    (_linear("imperial gallon", "volume", 4.54609e-3), ("imperial gallons", "imperial gallon"), ()),
    # speed (base: metre per second)
    (_linear("kilometre per hour", "speed", 1e3 / 3600),
     ("kilometres per hour", "kilometers per hour", "kilometre per hour", "kilometer per hour", "kilometres an hour",
      "kilometers an hour"), ("km/h", "kph", "km/hr")),
    (_linear("mile per hour", "speed", _MILE / 3600), ("miles per hour", "mile per hour", "miles an hour"), ("mph",)),
    (_linear("metre per second", "speed", 1.0),
     ("metres per second", "meters per second", "metre per second", "meter per second"), ("m/s",)),
    (_linear("knot", "speed", 1852 / 3600), ("knots", "knot"), ("kn",)),
    # area (base: square metre)
    (_linear("square metre", "area", 1.0), ("square metres", "square meters", "square metre", "square meter"),
     ("m²", "m2", "sq m")),
    (_linear("square kilometre", "area", 1e6),
     ("square kilometres", "square kilometers", "square kilometre", "square kilometer"), ("km²", "km2", "sq km")),
    (_linear("square mile", "area", _MILE ** 2), ("square miles", "square mile"), ("sq mi", "mi²")),
    (_linear("square foot", "area", _FOOT ** 2), ("square feet", "square foot"), ("sq ft", "ft²")),
    (_linear("hectare", "area", 1e4), ("hectares", "hectare"), ("ha",)),
    (_linear("acre", "area", 4046.8564224), ("acres", "acre"), ()),
)
_WORDS = {form: unit for unit, words, _ in _UNIT_FORMS for form in words}
_SYMBOLS = {form: unit for unit, _, symbols in _UNIT_FORMS for form in symbols}
# not a digit of a longer number, an identifier or an amount of money ("$5m" is five million); or a number in words
_NUMBER = rf"(?<![\w.,$£€])({NUMBER_DIGITS}|{NUMBER_WORDS}\b)"


# a number, optional space (or "-" as in "5-kilometre"), a unit form that ends at a word boundary; a one-letter
# symbol only after a space ("5g" is rather a network, "4h" a club)
_QUANTITY = re.compile(_NUMBER + r"(?:\s*|-)(?:(?i:(" + alternation(list(_WORDS)) + r"))|("
                       + alternation([f for f in _SYMBOLS if len(f) > 1]) + r")|(?<=\s)("
                       + alternation([f for f in _SYMBOLS if len(f) == 1]) + r"))(?![\w²³])")
# what may join the parts of one compound quantity ("5 feet 11 inches", "2 hours and 30 minutes")
_JOINER = re.compile(r"\s*(?:,|and|,\s*and)?\s*", re.I)
# the start of a range that ends at a quantity, its number without a unit: "5-", "5 to ", "between 5 and ", "5–"
_RANGE_START = re.compile(r"(?:\b(between|from)\s+)?" + _NUMBER + r"(\s*(?:-|–|—|to|and)\s*)\Z", re.I)


@dataclass(frozen=True)
class Quantity:
    """A quantity as written at ``span`` of a text (``text``): ``base`` in its dimension's base unit, with the
    interval ``[lo, hi]`` it stands for as stated (half a unit of the last written digit either side). ``unit``,
    ``decimals`` and ``unit_text`` are those of its last part (a compound such as "5 feet 11 inches" has several)."""

    base: float
    lo: float
    hi: float
    unit: Unit
    decimals: int
    number: str
    unit_text: str
    text: str
    span: tuple[int, int]
    parts: int = 1
    #: a range ("5 to 10 miles", ``base`` its last number): its first number in base units, and the text between its
    #: two numbers (" to "); ``lo`` and ``hi`` span both
    low: float | None = None
    joiner: str = ""

    def _number(self, base: float, unlike_mine: bool) -> str:
        value = self.unit.from_base(base)
        for decimals in range(self.decimals, self.decimals + 4):
            number = f"{value:,.{decimals}f}" if "," in self.number else f"{value:.{decimals}f}"
            if not unlike_mine or number != self.number:
                break
        return number

    def written_in_my_unit(self, other: Quantity) -> str:
        """``other`` written in this quantity's (last part's) unit, with as many decimals, thousands separated as this
        one is: a value with more decimals when it would otherwise read as this quantity itself, a range ("8 to 16
        km") number by number, with its own words between them."""
        if other.low is None:
            return f"{self._number(other.base, True)} {self.unit_text}"
        return f"{self._number(other.low, False)}{other.joiner}{self._number(other.base, False)} {self.unit_text}"


def _half(number: str, value: float) -> float:
    """Half the precision ``number`` is stated to: half a unit of its last decimal; for a whole number ending in
    zeros ("1,000 feet" converted from 300 m), half a unit of its last non-zero digit, but at most
    :data:`ROUND_NUMBER_PRECISION` of the value."""
    if "." in number:
        return 0.5 * 10.0 ** -len(number.split(".")[1])
    digits = number.replace(",", "").lstrip("-")
    zeros = len(digits) - len(digits.rstrip("0")) if digits.strip("0") else 0
    return max(0.5, min(0.5 * 10.0 ** zeros, ROUND_NUMBER_PRECISION * abs(value)))


def _value(number: str) -> tuple[float, float]:
    """(value, half its stated precision) of a number as written, in digits or in words."""
    spoken = word_value(number) if number[:1].isalpha() else None
    value = float(number.replace(",", "")) if spoken is None else float(spoken)
    return value, _half(number if spoken is None else str(spoken), value)


def _part(m: re.Match[str]) -> Quantity:
    number, word, symbol = m.group(1), m.group(2), m.group(3) or m.group(4)
    unit = _WORDS[" ".join(word.lower().split())] if word else _SYMBOLS[" ".join(symbol.split())]
    decimals = len(number.split(".")[1]) if "." in number else 0
    value, half = _value(number)
    lo, hi = sorted((unit.to_base(value - half), unit.to_base(value + half)))
    return Quantity(unit.to_base(value), lo, hi, unit, decimals, number, word or symbol, m.group(0), m.span())


def _ranged(q: Quantity, text: str, start: int) -> Quantity:
    """``q`` as the end of a range when a number without a unit and a range word come right before it (from
    ``start``, where the text's previous quantity ends): "5 to 10 miles", "5-10 miles", "between 5 and 10 miles";
    else ``q`` itself. Each number of a range keeps its own value; "and" makes a range only after "between"."""
    m = _RANGE_START.search(text, max(start, q.span[0] - 80), q.span[0])
    if m is None or (m.group(3).strip().lower() == "and" and m.group(1) is None):
        return q
    value, half = _value(m.group(2))
    low = q.unit.to_base(value)
    ends = (q.lo, q.hi, q.unit.to_base(value - half), q.unit.to_base(value + half))
    return replace(q, lo=min(ends), hi=max(ends), text=text[m.start(2):q.span[1]], span=(m.start(2), q.span[1]),
                   low=low, joiner=m.group(3))


def quantities(text: str) -> list[Quantity]:
    """Every quantity with a known unit in ``text``, in order of appearance; the parts of a compound quantity
    ("5 feet 11 inches": same dimension, each unit smaller than the one before, joined by space, comma or "and")
    make one quantity."""
    return list(_quantities(text))


@functools.lru_cache(maxsize=4096)
def _quantities(text: str) -> tuple[Quantity, ...]:
    """:func:`quantities`, remembered: an answer meets every other answer of its prompt, both ways."""
    out: list[Quantity] = []
    for m in _QUANTITY.finditer(text):
        q = _part(m)
        prev = out[-1] if out else None
        if (prev is not None and prev.unit.dimension == q.unit.dimension and prev.unit.dimension != "temperature"
                and prev.unit.to_base(1.0) > q.unit.to_base(1.0)
                and _JOINER.fullmatch(text, prev.span[1], q.span[0])):
            zero = q.unit.to_base(0.0)
            lo = prev.base + q.lo - zero  # a range ("5 and 6 feet 11 inches") keeps its first number
            q = Quantity(prev.base + q.base - zero, lo if prev.low is None else min(prev.lo, lo),
                         prev.base + q.hi - zero, q.unit, q.decimals, q.number, q.unit_text,
                         text[prev.span[0]:q.span[1]], (prev.span[0], q.span[1]), prev.parts + 1, prev.low, prev.joiner)
            out[-1] = q
        else:
            out.append(_ranged(q, text, prev.span[1] if prev is not None else 0))
    return tuple(out)


def _same(a: Quantity, b: Quantity) -> bool:
    """Whether ``a`` and ``b`` can be one quantity: their stated intervals overlap, widened by RELATIVE_SLACK of
    ``a`` (its distance from its unit's zero, in base units)."""
    slack = RELATIVE_SLACK * abs(a.base - a.unit.to_base(0.0))
    return a.lo - slack <= b.hi and b.lo <= a.hi + slack


def align_units(premise: str, hypothesis: str) -> str:
    """``hypothesis`` with each quantity that the premise states in another unit of its dimension rewritten in the
    premise's unit: as the premise writes it when they are the same quantity, converted otherwise; then each number
    that the premise writes with the same value in another form (digits, words, a scale word) written as the premise
    writes it (:func:`~fastnli.scorers.numbers.align_numbers`: "one hundred sixty-eight" against "168" reads "168").

    A hypothesis quantity in a unit the premise also uses (both of one part) keeps its number: it only takes the
    premise's words when the numbers are equal ("100 degrees Celsius" against "100 °C" reads "100 °C"; "90 degrees
    Celsius" stays), so the model still compares the numbers. A quantity whose dimension the premise lacks is left
    as it is. When the premise has several of the dimension, the one nearest in value is the reference. A range
    ("5 to 10 miles", "between 5 and 10 miles", "5-10 miles") is one quantity: converted number by number, and never
    replaced by the premise's words, nor a value by a range's. The text outside the rewritten quantities is
    unchanged; a text without quantities or numbers comes back as it is.
    """
    return align_numbers(premise, _align_quantities(premise, hypothesis))


def _align_quantities(premise: str, hypothesis: str) -> str:
    """:func:`align_units`' first pass: the hypothesis's quantities in the premise's units."""
    theirs = _quantities(premise)
    if not theirs:
        return hypothesis
    out, last = [], 0
    for q in _quantities(hypothesis):
        same_dim = [p for p in theirs if p.unit.dimension == q.unit.dimension]
        same_unit = [p for p in same_dim if p.unit is q.unit and p.parts == q.parts == 1]
        if same_unit:
            text = next((p.text for p in same_unit if p.base == q.base and p.low is None and q.low is None), q.text)
        elif same_dim:
            ref = min(same_dim, key=lambda p: _distance(p.base, q.base))
            one = ref.low is None and q.low is None and _same(ref, q)
            text = ref.text if one else ref.written_in_my_unit(q)
        else:
            continue
        out += [hypothesis[last:q.span[0]], text]
        last = q.span[1]
    return "".join(out) + hypothesis[last:] if out else hypothesis


def _distance(a: float, b: float) -> float:
    """How far apart two base values are: the log of their ratio when both are positive."""
    return abs(math.log(a / b)) if a > 0 and b > 0 else abs(a - b)


def model_aligns_units(engine: Any) -> bool:
    """Whether an engine's model reads pairs with aligned units by default (its manifest's ``align_units``; False
    for engines without a manifest, such as test doubles)."""
    return bool(getattr(getattr(engine, "manifest", None), "align_units", False))


def resolve_align_units(align_units: bool | None, model_default: bool) -> bool:
    """Whether to align units: ``align_units`` when given, else the model's default (:func:`model_aligns_units`).

    Raises:
        TypeError: ``align_units`` neither a bool nor None.
    """
    if align_units is None:
        return model_default
    if not isinstance(align_units, bool):
        raise TypeError(f"align_units must be True, False or None (the model's default); got {align_units!r}")
    return align_units
