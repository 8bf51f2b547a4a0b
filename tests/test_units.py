"""Unit alignment: a hypothesis's quantities written in the premise's units before NLI, where asked or where the
model's manifest says so; uqlm's exact inputs otherwise."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastnli.cli import main
from fastnli.default_model import DEFAULT_MODEL_DIR
from fastnli.engine import CallStats
from fastnli.engine.manifest import MANIFEST_NAME, read_manifest
from fastnli.scorers import score
from fastnli.scorers.api import plan_scores
from fastnli.scorers.questions import with_question
from fastnli.scorers.units import align_units, quantities, resolve_align_units


@pytest.mark.parametrize("premise, hypothesis, aligned", [
    # the same quantity in another unit: written as the premise writes it
    ("The river is 569 kilometres long.", "The river is 354 miles long.", "The river is 569 kilometres long."),
    ("Water boils at 100 degrees Celsius.", "Water boils at 212 degrees Fahrenheit.",
     "Water boils at 100 degrees Celsius."),
    ("100 °C", "212°F", "100 °C"),
    ("37 °C", "98.6 °F", "37 °C"),
    ("The battery lasts 19 hours.", "The battery lasts 1,140 minutes.", "The battery lasts 19 hours."),
    ("It weighs 3.5 kg", "It weighs 7.7 pounds", "It weighs 3.5 kg"),
    ("It reaches 100 km/h", "It reaches 62 mph", "It reaches 100 km/h"),
    ("The tower is 300 m tall", "It is 1,000 feet tall", "It is 300 m tall"),  # round numbers: ±2.5%
    ("He is 180 cm tall.", "He is 5 feet 11 inches tall.", "He is 180 cm tall."),  # a compound quantity
    ("The film runs 150 minutes.", "It runs 2 hours and 30 minutes.", "It runs 150 minutes."),
    # numbers written as words
    ("The race is 8 km.", "The race is five miles.", "The race is 8 km."),
    ("It took two hours and thirty minutes.", "It took 150 minutes.", "It took two hours and thirty minutes."),
    ("The wall is a hundred metres long.", "The wall is 328 feet long.", "The wall is a hundred metres long."),
    ("He ran twenty-six miles.", "He ran 50 km.", "He ran 31 miles."),
    ("It took Twenty Five minutes.", "It took one hour.", "It took 60 minutes."),
    ("Someone ran 5 km.", "Someone ran 5 km.", "Someone ran 5 km."),  # "one" inside a word is no number
    # another quantity: converted, in the premise's unit and precision
    ("The river is 569 kilometres long.", "The river is 182 miles long.", "The river is 293 kilometres long."),
    ("100 km", "65 miles", "105 km"),
    ("Water boils at 100 °C.", "Water boils at 90 °F.", "Water boils at 32 °C."),
    ("The film runs 150 minutes.", "It runs 2 hours, 20 minutes.", "It runs 140 minutes."),
    ("It holds 2.5 litres", "It holds 2 gallons", "It holds 7.6 litres"),
    # one unit already: the premise's words for an equal number, else left to the model
    ("Water boils at 100 °C.", "Water boils at 100 degrees Celsius.", "Water boils at 100 °C."),
    ("It is 1,000 km away.", "It is 1000 kilometres away.", "It is 1,000 km away."),
    ("Water boils at 100 degrees Celsius.", "Water boils at 90 degrees Celsius.",
     "Water boils at 90 degrees Celsius."),
    ("The race is 10 km.", "The race is 10.4 km.", "The race is 10.4 km."),
    # ranges: one quantity, converted number by number, never replaced by the premise's words
    ("It is about 13 km.", "It is between 5 and 10 miles.", "It is between 8 and 16 km."),
    ("8 km", "5-10 miles", "8-16 km"),
    ("8 km", "five to ten miles", "8 to 16 km"),
    ("Water boils at 100 °C.", "It boils between 200 and 220 °F.", "It boils between 93 and 104 °C."),
    ("The film runs 150 minutes.", "It runs 2 to 3 hours.", "It runs 120 to 180 minutes."),
    ("He is 180 cm tall.", "He is between 5 and 6 feet 11 inches tall.", "He is between 152 and 211 cm tall."),
    ("The trail is between 5 and 10 miles long.", "It is 12 km.", "It is 7 miles."),
    ("It is 5 to 10 miles.", "It is 8 to 16 km.", "It is 5 to 10 miles."),  # the same range: converted to it
    ("8 km", "I ran 3 and 10 miles", "I ran 3 and 16 km"),  # "and" without "between": a list, not a range
    ("The trail is 3 km.", "It is from 2 to 3 km.", "It is from 2 to 3 km."),  # one unit: left to the model
    # left as written: no quantity of the dimension, or no unit the table knows
    ("The river is 569 km long.", "It took 3 hours.", "It took 3 hours."),
    ("The Berlin Wall fell in 1989.", "The Berlin Wall fell in 1991.", "The Berlin Wall fell in 1991."),
    ("It was built in the 1990s.", "It took 3 years.", "It took 3 years."),  # a decade is not 1990 seconds
    ("The company raised $5m.", "The company raised 5 metres.", "The company raised 5 metres."),  # money
    ("5G networks came in 2019.", "They reach 3 km.", "They reach 3 km."),
])
def test_align_units(premise: str, hypothesis: str, aligned: str) -> None:
    assert align_units(premise, hypothesis) == aligned


def test_quantities_read_numbers_units_and_compounds() -> None:
    (q,) = quantities("He is 5 feet 11 inches tall")
    assert (q.text, q.unit.name, q.parts) == ("5 feet 11 inches", "inch", 2)
    assert q.base == pytest.approx(71 * 0.0254)
    assert [x.text for x in quantities("1,140 minutes, -40 °F and 5-kilometre runs; 5g and 4h")] == [
        "1,140 minutes", "-40 °F", "5-kilometre"]
    assert quantities("The Berlin Wall fell in 1989.") == []
    assert [(q.text, q.low, q.base, q.joiner) for q in quantities("5-10 miles, between 2 and 3 kg, 5 miles to 6 km")] == [
        ("5-10 miles", pytest.approx(5 * 1609.344), pytest.approx(10 * 1609.344), "-"),
        ("2 and 3 kg", 2.0, 3.0, " and "), ("5 miles", None, pytest.approx(5 * 1609.344), ""),
        ("6 km", None, 6000.0, "")]
    assert [(q.text, q.base) for q in quantities("nine thousand feet, ninety nine kg; a hundred m; One man")] == [
        ("nine thousand feet", pytest.approx(9000 * 0.3048)), ("ninety nine kg", 99.0),
        ("a hundred m", 100.0)]


UNIT_PAIRS = [("kilometres", "miles", 1.609344), ("kilograms", "pounds", 0.45359237), ("hours", "minutes", 1 / 60),
              ("metres", "feet", 0.3048), ("litres", "US gallons", 3.785411784)]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(UNIT_PAIRS), st.integers(1, 5000), st.sampled_from(["It is {}.", "{}", "About {} in all."]))
def test_a_conversion_to_the_stated_digit_reads_as_the_premise(pair: tuple[str, str, float], value: int,
                                                               frame: str) -> None:
    """Any quantity converted and rounded to one decimal is the premise's quantity; aligning twice changes nothing."""
    ua, ub, b_to_a = pair
    premise = frame.format(f"{value} {ua}")
    hypothesis = frame.format(f"{value / b_to_a:.1f} {ub}")
    assert align_units(premise, hypothesis) == premise
    twice = align_units(premise, align_units(premise, frame.format(f"{value * 3 / b_to_a:.1f} {ub}")))
    assert twice == align_units(premise, frame.format(f"{value * 3 / b_to_a:.1f} {ub}"))


class RecordingEngine:
    """Contradiction when the numbers of a pair differ, entailment else; records the pairs it is given."""

    device, precision = "cpu", "fp32"

    def __init__(self, align: bool = False) -> None:
        self.manifest = SimpleNamespace(question_format=None, align_units=align)
        self.calls: list[list[tuple[str, str]]] = []

    def predict_with_stats(self, pairs: list[tuple[str, str]], progress: object = None
                           ) -> tuple[np.ndarray, CallStats]:
        self.calls.append(list(pairs))
        rows = [(0.05, 0.05, 0.9) if re.findall(r"[\d.]+", a) == re.findall(r"[\d.]+", b) else (0.9, 0.05, 0.05)
                for a, b in pairs]
        return np.array(rows, dtype=np.float32).reshape(-1, 3), CallStats(pairs_in=len(pairs))


KM = "The river is 569 kilometres long."


def test_score_aligns_where_the_model_says_so() -> None:
    engine = RecordingEngine(align=True)
    res = score([KM], [["The river is 354 miles long.", "The river is 182 miles long."]], engine=engine)
    assert res.align_units is True
    # 354 miles is the premise once aligned: scored as identical strings, without the model, both ways
    assert set(engine.calls[0]) == {(KM, "The river is 293 kilometres long."),
                                    ("The river is 182 miles long.", "The river is 354 miles long.")}
    assert res.rows[0].noncontradiction == pytest.approx(1 - (0.0 + 0.0 + 0.9 + 0.9) / 4)


def test_other_models_keep_uqlms_inputs_unless_asked() -> None:
    plain = RecordingEngine(align=False)
    res = score([KM], [["The river is 354 miles long."]], engine=plain)
    assert res.align_units is False and set(plain.calls[0]) == {(KM, "The river is 354 miles long."),
                                                                ("The river is 354 miles long.", KM)}
    assert score([KM], [["The river is 354 miles long."]], engine=RecordingEngine(), align_units=True).rows[
        0].noncontradiction == 1.0
    off = RecordingEngine(align=True)
    assert score([KM], [["The river is 354 miles long."]], engine=off, align_units=False).align_units is False
    with pytest.raises(TypeError, match=re.escape("align_units must be True, False or None (the model's default); "
                                                  "got 'yes'")):
        resolve_align_units("yes", False)  # type: ignore[arg-type]


def test_alignment_comes_before_the_question_form() -> None:
    plan = plan_scores(["569 km"], [["354 miles", "182 miles"]], questions=["How long is the river"],
                       align_units=True)
    q = "How long is the river"
    assert plan.pairs == [(with_question(q, "569 km"), with_question(q, "293 km")),
                          (with_question(q, "182 miles"), with_question(q, "354 miles"))]


def test_the_evaluation_aligns_question_aware_rows_as_the_scorers_do() -> None:
    """mission_eval reads a question-aware row as plan_scores does: the answers aligned, then the question put in
    front (a number in the question is no form for the answer to take)."""
    from tools.default_model.mission_eval import aligned_hypothesis

    q = "what is the movie about six degrees of separation"
    row = {"premise": with_question(q, "7 Degrees"), "hypothesis": with_question(q, "6 Degrees"), "question": q}
    plan = plan_scores(["7 Degrees"], [["6 Degrees"]], questions=[q], align_units=True)
    assert aligned_hypothesis(row) == plan.pairs[0][1] == with_question(q, "6 Degrees")
    row = {"premise": "569 km", "hypothesis": "It is three hundred fifty-four miles.", "question": q}
    assert aligned_hypothesis(row) == "It is 569 km."  # not question-aware: the hypothesis aligned to the premise


def test_the_embedded_model_aligns_units_by_default() -> None:
    """The shipped manifest's choice (made on the dev part by tools/default_model/ship.py) and what it does."""
    assert read_manifest(DEFAULT_MODEL_DIR).align_units is True
    res = score(["Water boils at 100 degrees Celsius."], [["Water boils at 212 degrees Fahrenheit.",
                                                           "Water boils at 90 degrees Celsius."]],
                return_matrix=True)
    assert res.align_units is True
    assert res.rows[0].matrix[0, 1].tolist() == [0.0, 0.0, 1.0]  # the same temperature, in other units


def test_a_manifest_with_a_bad_align_units_is_refused(tmp_path: Path) -> None:
    art = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, art)
    data = json.loads((art / MANIFEST_NAME).read_text())
    data["align_units"] = "yes"
    (art / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ValueError, match=re.escape(f"{art / MANIFEST_NAME}: field 'align_units' must be true or "
                                                   "false; got 'yes'")):
        read_manifest(art)


def test_cli_align_units_switch(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"response": "Water boils at 100 °C.", "sampled_responses": ["Water boils at 212 °F."]})
                   + "\n")
    out = {}
    for mode in ("auto", "off"):
        path = tmp_path / f"{mode}.jsonl"
        assert main(["score", str(src), "-o", str(path), "--no-progress", "--align-units", mode]) == 0
        out[mode] = json.loads(path.read_text())["noncontradiction"]
    assert out["auto"] == 1.0 and out["off"] < 1.0


def test_calm_checks_align_statements_to_their_documents() -> None:
    from fastnli.calm.checks import AnswerInput, CheckConfig, check_answers
    from fastnli.calm.documents import Document

    answer = AnswerInput("The river is 354 miles long [1].", [Document("The river is 569 kilometres long.")])
    engine = RecordingEngine(align=True)
    (check,), _ = check_answers([answer], engine)
    assert engine.calls[0] == [(KM, KM)]  # the document cited, and the statement in its units
    assert check.citation_recall == 1.0
    plain = RecordingEngine(align=True)
    (check,), _ = check_answers([answer], plain, CheckConfig(align_units=False))
    assert plain.calls[0][0][1] == "The river is 354 miles long." and check.citation_recall == 0.0
    with pytest.raises(TypeError, match=re.escape("align_units must be True, False or None (the model's default); "
                                                  "got 1")):
        CheckConfig(align_units=1)  # type: ignore[arg-type]


def test_grounding_aligns_each_statement_to_each_source() -> None:
    from fastnli.calm.grounding import grounding
    from fastnli.serve.config import ServeConfig
    from fastnli.serve.payloads import ApiError, grounding_item

    docs = ["The river is 569 kilometres long. It is 300 m wide."]
    engine = RecordingEngine(align=True)
    res = grounding(["The river is 354 miles long."], docs, engine, granularity="sentence")
    assert engine.calls[0] == [(KM, KM), ("It is 300 m wide.", "The river is 569708 m long.")]
    assert res.supported == [True]
    plain = RecordingEngine(align=True)
    assert grounding(["The river is 354 miles long."], docs, plain, granularity="sentence",
                     align_units=False).supported == [False]
    body = {"statements": ["a"], "documents": ["b"]}
    assert grounding_item(body, ServeConfig())[5] is None
    assert grounding_item({**body, "align_units": False}, ServeConfig())[5] is False
    with pytest.raises(ApiError, match=re.escape("field 'align_units' must be true or false; got number")):
        grounding_item({**body, "align_units": 1}, ServeConfig())


def _evaluation(units: tuple[float, float], groups: dict[str, float]) -> dict[str, Any]:
    """A mission_eval result with the two unit categories and one form's group figures."""
    cats = {"unit_equivalent": {"value": units[0]}, "unit_swap": {"value": units[1]}}
    return {"categories": cats, "groups": {"bare": groups}}


def test_align_choice_rule() -> None:
    """Aligned by default only when the unit categories gain and no form's figure drops on the dev part; the CI gate
    checks the aligned figures only then."""
    from tools.default_model.align_choice import decide, record

    base = {"value_swaps": 0.95, "meaning_kept": 0.93, "agreement_auroc": 0.99}
    plain = _evaluation((0.45, 0.7), base)
    better = _evaluation((1.0, 1.0), base)
    got = decide(plain, better, better)
    assert got["default"] is True and got["dev"] == {"plain": 0.575, "aligned": 1.0, "lower": []}
    worse_swaps = _evaluation((1.0, 1.0), {**base, "value_swaps": 0.94})
    assert decide(plain, worse_swaps, better)["dev"]["lower"] == ["bare value_swaps"]
    assert decide(plain, worse_swaps, better)["default"] is False
    assert decide(plain, plain, plain)["default"] is False  # no gain: uqlm's inputs stay
    quality: dict[str, Any] = {"mission_gate": {"int8": {}, "int8_aligned": {"old": 1}}}
    record(quality, decide(plain, plain, plain), {"bare": base})
    assert "int8_aligned" not in quality["mission_gate"] and quality["align_units"]["default"] is False
    record(quality, got, {"bare": base})
    assert quality["mission_gate"]["int8_aligned"] == {"bare": base}
