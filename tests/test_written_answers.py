"""The written-answers check (tools/default_model/written_answers.py): its data, its pairs, its figures and its card
section, on an engine whose verdicts the test sets."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from fastnli.engine import CallStats
from tools.default_model import ship, written_answers

QUESTIONS = written_answers.read_questions()
HELDOUT = written_answers.read_questions(written_answers.HELDOUT)


class KnowingEngine:
    """Contradiction 0.9 between a correct and an incorrect answer (0.05 otherwise), or the reverse with ``wrong``."""

    device, precision = "cpu", "fp32"

    def __init__(self, wrong: bool = False, questions: list[dict[str, Any]] = QUESTIONS) -> None:
        self.incorrect = {a for q in questions for a in q["incorrect"]}
        self.wrong = wrong

    def predict_with_stats(self, pairs: list[tuple[str, str]], progress: object = None
                           ) -> tuple[np.ndarray, CallStats]:
        out = []
        for a, b in pairs:
            a, b = (t.split("Answer: ", 1)[-1] for t in (a, b))  # the question-aware form ends with the answer
            disagree = (a in self.incorrect) != (b in self.incorrect)
            pc = 0.9 if disagree != self.wrong else 0.05
            out.append((pc, 0.05, 0.95 - pc))
        return np.array(out, dtype=np.float32), CallStats(pairs_in=len(pairs), unique_pairs=len(set(pairs)))


@pytest.mark.parametrize(("questions", "count"), [(QUESTIONS, 59), (HELDOUT, 45)], ids=["main", "heldout"])
def test_the_questions_are_well_formed(questions: list[dict[str, Any]], count: int) -> None:
    assert len(questions) == count
    assert len({q["question"] for q in questions}) == len(questions)
    for q in questions:
        assert set(q) == {"question", "correct", "incorrect"}
        assert len(q["correct"]) == len(q["incorrect"]) == 3
        answers = q["correct"] + q["incorrect"]
        assert all(isinstance(a, str) and a.strip() == a and a for a in answers)
        assert len(set(answers)) == 6  # no answer is both correct and incorrect, none repeats


def test_the_held_out_questions_and_answers_are_not_in_the_main_set() -> None:
    assert not {q["question"] for q in QUESTIONS} & {q["question"] for q in HELDOUT}
    main = {(q["question"], a) for q in QUESTIONS for a in q["correct"] + q["incorrect"]}
    assert not main & {(q["question"], a) for q in HELDOUT for a in q["correct"] + q["incorrect"]}


def test_pairs_are_every_two_correct_and_every_correct_incorrect() -> None:
    pairs = written_answers.answer_pairs(QUESTIONS[:2])
    assert len(pairs) == 2 * (3 + 9)
    q = QUESTIONS[0]
    assert (q["question"], q["correct"][0], q["correct"][1], True) in pairs
    assert (q["question"], q["correct"][2], q["incorrect"][2], False) in pairs
    assert not any(a in q["incorrect"] and b in q["incorrect"] for _, a, b, _ in pairs)


@pytest.mark.parametrize("wrong", [False, True])
def test_figures_follow_the_verdicts(wrong: bool) -> None:
    result = written_answers.evaluate(QUESTIONS[:6], KnowingEngine(wrong))  # type: ignore[arg-type]
    assert set(result) == {"bare", "question"}
    for r in result.values():
        assert (r["questions"], r["agreeing_pairs"], r["disagreeing_pairs"]) == (6, 18, 54)
        expected = 0.0 if wrong else 1.0
        for key in written_answers.FIGURES:
            assert r[key] == expected, key
        assert len(r["lowest_agreeing"]) == len(r["highest_disagreeing"]) == 3
        assert r["lowest_agreeing"][0][2] == pytest.approx(0.1 if wrong else 0.95)
        assert r["highest_disagreeing"][0][2] == pytest.approx(0.95 if wrong else 0.1)


def test_card_section_renders_the_record_before_and_now() -> None:
    now = written_answers.evaluate(QUESTIONS[:4], KnowingEngine())  # type: ignore[arg-type]
    before = written_answers.evaluate(QUESTIONS[:4], KnowingEngine(wrong=True))  # type: ignore[arg-type]
    quality: dict[str, Any] = {}
    assert ship.written_text(quality) == ""
    written_answers.record(quality, now, before)
    text = ship.written_text(quality)
    assert "| question | 12 / 36 | 0.000 / 1.000 | 0.000 / 1.000 | 0.000 / 1.000 | 0.000 / 1.000 |" in text
    a, b, score = now["question"]["lowest_agreeing"][0]
    assert f'"{a}" / "{b}" {score:.2f}' in text
    assert "Held out" not in text
    written_answers.record(quality, now)  # no model before: its cells say so
    assert "| bare | 12 / 36 | n/a / 1.000 |" in ship.written_text(quality)
    json.dumps(quality)  # the record is plain JSON


def test_card_section_renders_the_held_out_questions_apart() -> None:
    now = written_answers.evaluate(QUESTIONS[:4], KnowingEngine())  # type: ignore[arg-type]
    heldout = written_answers.heldout_figures(KnowingEngine(questions=HELDOUT),  # type: ignore[arg-type]
                                              KnowingEngine(wrong=True, questions=HELDOUT))  # type: ignore[arg-type]
    assert {r["questions"] for r in heldout["now"].values()} == {len(HELDOUT)}
    quality: dict[str, Any] = {}
    written_answers.record(quality, now, heldout=heldout)
    text = ship.written_text(quality)
    main, held = text.split("Held out: ")
    assert "| question | 12 / 36 | n/a / 1.000 |" in main
    assert held.startswith(f"{len(HELDOUT)} more questions")
    before, now_q = heldout["before"]["question"], heldout["now"]["question"]  # "12" is right for one question,
    assert "| question | 135 / 405 | " + " | ".join(  # wrong for another: the test engine's verdicts are not all right
        f"{before[k]:.3f} / {now_q[k]:.3f}" for k in written_answers.FIGURES) + " |" in held
    assert now_q["agreement_auroc"] > 0.95 > 0.05 > before["agreement_auroc"]
    a, b, score = heldout["now"]["question"]["highest_disagreeing"][0]
    assert f'"{a}" / "{b}" {score:.2f}' in held


def test_int8_losses_name_the_forms_an_int8_graph_reads_worse() -> None:
    right = written_answers.evaluate(QUESTIONS[:4], KnowingEngine())  # type: ignore[arg-type]
    wrong = written_answers.evaluate(QUESTIONS[:4], KnowingEngine(wrong=True))  # type: ignore[arg-type]
    assert written_answers.int8_losses(right, right) == []
    assert written_answers.int8_losses(wrong, right) == ["bare: 1.000 → 0.000", "question: 1.000 → 0.000"]
    mixed = {"bare": right["bare"], "question": wrong["question"]}
    assert written_answers.int8_losses(mixed, right) == ["question: 1.000 → 0.000"]
    assert written_answers.int8_losses(right, wrong) == []  # INT8 better than fp32 is no loss
    quality: dict[str, Any] = {}
    written_answers.record(quality, mixed, fp32=right)
    assert set(quality["written_answers"]) == {"now", "fp32"}


@pytest.mark.parametrize("align", [None, True, False])
def test_evaluate_reads_units_as_told(monkeypatch: pytest.MonkeyPatch, align: bool | None) -> None:
    """A model not yet shipped has no manifest decision: the ship tool passes its align_units decision, and every
    score call of the evaluation (both forms, the pair scores and the NCP rows) must read the answers that way."""
    seen: list[bool | None] = []
    real = written_answers.score

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["align_units"])
        return real(*args, **kwargs)

    monkeypatch.setattr(written_answers, "score", spy)
    written_answers.evaluate(QUESTIONS[:3], KnowingEngine(), align_units=align)  # type: ignore[arg-type]
    assert seen == [align] * 4


def test_the_cli_records_what_it_measures_and_keeps_what_it_does_not(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``--write`` without ``--before``/``--fp32`` keeps those recorded figures; ``--fp32`` measures the fp32
    artifact with the shipped model's unit alignment and replaces them."""
    opened: list[tuple[str, str | None]] = []

    class Engine:
        def __init__(self, path: Path, precision: str | None) -> None:
            self.path, self.manifest = path, SimpleNamespace(align_units=True)

        @classmethod
        def from_pretrained(cls, path: Path, device: str, precision: str | None = None) -> Engine:
            opened.append((Path(path).name, precision))
            return cls(path, precision)

    def figures(model: str, align_units: bool | None) -> dict[str, Any]:
        return {form: {"agreement_auroc": 0.9, "model": model, "align_units": align_units}
                for form in written_answers.FORMS}

    def evaluate(questions: Any, engine: Engine, align_units: bool | None = None) -> dict[str, Any]:
        return figures(Path(engine.path).name, align_units)

    written: list[dict[str, Any]] = []
    monkeypatch.setattr(written_answers, "NLIEngine", Engine)
    monkeypatch.setattr(written_answers, "evaluate", evaluate)
    monkeypatch.setattr(written_answers, "render", lambda result: "")
    monkeypatch.setattr(ship, "record_shipped", lambda model, path, quality: written.append(quality))
    quality = tmp_path / "quality.json"
    quality.write_text(json.dumps({"written_answers": {"now": "old", "before": "replaced", "fp32": "weights"}}))
    args = ["--model", str(tmp_path / "shipped"), "--quality", str(quality), "--write"]

    heldout = {"now": figures("shipped", None)}
    assert written_answers.main(args) == 0
    assert written[-1]["written_answers"] == {"now": figures("shipped", None), "before": "replaced", "fp32": "weights",
                                              "heldout": heldout}
    assert written_answers.main([*args, "--fp32", str(tmp_path / "fp32")]) == 0
    assert written[-1]["written_answers"] == {"now": figures("shipped", None), "before": "replaced",
                                              "fp32": figures("fp32", True), "heldout": heldout}
    assert opened[-2:] == [("shipped", None), ("fp32", "fp32")]
    assert written_answers.main([*args, "--before", str(tmp_path / "older")]) == 0  # both sets measure the older
    assert written[-1]["written_answers"]["before"] == figures("older", None)
    assert written[-1]["written_answers"]["heldout"] == {**heldout, "before": figures("older", None)}
    quality.write_text(json.dumps({"written_answers": {"now": "old", "heldout": {"now": "old", "before": "kept"}}}))
    assert written_answers.main(args) == 0  # the held-out figures of the model replaced are kept too
    assert written[-1]["written_answers"]["heldout"] == {**heldout, "before": "kept"}


def test_int8_losses_warn_once_with_the_advice(caplog: pytest.LogCaptureFixture) -> None:
    right = written_answers.evaluate(QUESTIONS[:4], KnowingEngine())  # type: ignore[arg-type]
    wrong = written_answers.evaluate(QUESTIONS[:4], KnowingEngine(wrong=True))  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="fastnli"):
        written_answers.warn_int8_losses(right, right)
        written_answers.warn_int8_losses(wrong, right, "; try another --recipe")
    assert [r.getMessage() for r in caplog.records] == [
        "the INT8 graph reads the written answers worse than its fp32 weights (agreement AUROC, bare: 1.000 → 0.000; "
        "question: 1.000 → 0.000); try another --recipe"]
