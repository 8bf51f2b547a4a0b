"""Number forms: numbers read in digits, words and scale words, and a hypothesis's numbers written in the premise's
form when the values are equal (part of unit alignment)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastnli.scorers.numbers import align_numbers, numbers, word_value
from fastnli.scorers.units import align_units
from tools.default_model.answer_data import number_in_words


@given(st.integers(0, 999_999), st.booleans())
def test_words_read_back_as_their_value(n: int, british: bool) -> None:
    words = number_in_words(n, british)
    assert word_value(words) == n
    assert [(x.value, x.text, x.words) for x in numbers(f"There are {words} of them.")] == [(n, words, True)]


@pytest.mark.parametrize("text, read", [
    ("206 bones", [(206, "206")]),
    ("1,200 rooms, or twelve hundred", [(1200, "1,200"), (1200, "twelve hundred")]),
    ("2.5 million people, 3 billion years", [(2_500_000, "2.5 million"), (3e9, "3 billion")]),
    ("a million, two thousand and five", [(1e6, "a million"), (2005, "two thousand and five")]),
    ("Sixty eight, Twenty-Five", [(68, "Sixty eight"), (25, "Twenty-Five")]),
    ("two and three", [(2, "two"), (3, "three")]),  # "and" joins after "hundred" or a scale word only
    ("one thousand, two thousand", [(1000, "one thousand"), (2000, "two thousand")]),
    ("-40 degrees", [(-40, "-40")]),
    # not numbers: inside identifiers, versions and words, or before a hyphen ("three-year-old")
    ("A4 paper, version 3.2.1, someone, a three-year-old", []),
])
def test_numbers_as_written(text: str, read: list[tuple[float, str]]) -> None:
    assert [(n.value, n.text) for n in numbers(text)] == read


def test_word_value_refuses_other_words() -> None:
    with pytest.raises(ValueError, match="not a number in words: 'two apples'"):
        word_value("two apples")


@pytest.mark.parametrize("premise, hypothesis, aligned", [
    # equal values in another form: the premise's form
    ("168", "There are one hundred sixty-eight hours in a week.", "There are 168 hours in a week."),
    ("There are one hundred sixty-eight hours in a week.", "168", "one hundred sixty-eight"),
    ("There are 7 continents.", "Seven", "7"),
    ("Seven", "There are 7 continents.", "There are seven continents."),  # the hypothesis's case
    ("206", "There are two hundred and six bones.", "There are 206 bones."),
    ("The population is 2,500,000.", "It is 2.5 million.", "It is 2,500,000."),
    ("It costs $5 million.", "It costs $5,000,000.", "It costs $5 million."),
    ("He scored 20 points and 3 assists.", "Twenty points, three assists.", "20 points, 3 assists."),
    # kept: other values, the same form, a lone "one", no numbers
    ("There are 7 continents.", "There are eight continents.", "There are eight continents."),
    ("It fell in 1989.", "It fell in nineteen eighty-nine.", "It fell in nineteen eighty-nine."),
    ("Mars has two moons.", "Two", "Two"),
    ("It has 1 moon.", "No one knows.", "No one knows."),
    ("It has 2 moons and two rings.", "It has two moons.", "It has two moons."),  # the premise has this form too
    ("No numbers here.", "It has 2 moons.", "It has 2 moons."),
])
def test_align_numbers(premise: str, hypothesis: str, aligned: str) -> None:
    assert align_numbers(premise, hypothesis) == aligned
    assert align_units(premise, hypothesis) == aligned


@pytest.mark.parametrize("premise, hypothesis, aligned", [
    # a quantity in words, whatever its size, converted as one number ("three hundred fifty-four", not "fifty-four")
    ("The river is 569 km long.", "It is three hundred fifty-four miles long.", "It is 569 km long."),
    ("The river is 569 km long.", "It is five hundred sixty-nine kilometres long.", "It is 569 km long."),
    ("The river is 569 km long.", "It is one hundred eighty-two miles long.", "It is 293 km long."),
    # the units first, then the numbers: "8" in miles is no "eight" of the premise
    ("He ran eight km and 3 laps.", "He ran 5 miles and three laps.", "He ran eight km and 3 laps."),
])
def test_quantities_in_words_of_any_size(premise: str, hypothesis: str, aligned: str) -> None:
    assert align_units(premise, hypothesis) == aligned
