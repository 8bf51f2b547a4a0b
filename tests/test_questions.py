"""Question-aware scoring: prompts put in front of each answer where the model was trained so, uqlm's inputs else."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fastnli.cli import main
from fastnli.engine import CallStats
from fastnli.scorers import score
from fastnli.scorers.api import plan_scores
from fastnli.scorers.questions import QUESTION_FORMAT, resolve_question_format, with_question

Q = "When did the Berlin Wall fall"


class RecordingEngine:
    """Answers by a rule on the texts it is given, and records them: contradiction when the years differ."""

    device, precision = "cpu", "fp32"

    def __init__(self, question_format: str | None = None) -> None:
        self.manifest = SimpleNamespace(question_format=question_format)
        self.calls: list[list[tuple[str, str]]] = []

    def predict_with_stats(self, pairs: list[tuple[str, str]], progress: object = None
                           ) -> tuple[np.ndarray, CallStats]:
        self.calls.append(list(pairs))
        rows = []
        for a, b in pairs:
            same = re.findall(r"\d{4}", a) == re.findall(r"\d{4}", b)
            rows.append((0.05, 0.05, 0.9) if same else (0.9, 0.05, 0.05))
        return np.array(rows, dtype=np.float32).reshape(-1, 3), CallStats(pairs_in=len(pairs))


def test_with_question_form() -> None:
    assert with_question("when did the wall fall ", "1989") == "Question: when did the wall fall?\nAnswer: 1989"
    assert with_question("Who?", "Ann") == QUESTION_FORMAT.format(question="Who?", answer="Ann")


def test_resolution_rules() -> None:
    assert resolve_question_format(None, ["q"], None) is None  # a plain NLI model: uqlm's inputs
    assert resolve_question_format(None, ["q"], "Q: {question} A: {answer}") == "Q: {question} A: {answer}"
    assert resolve_question_format(None, None, QUESTION_FORMAT) is None
    assert resolve_question_format(True, ["q"], None) == QUESTION_FORMAT
    assert resolve_question_format(False, ["q"], QUESTION_FORMAT) is None
    with pytest.raises(ValueError, match=re.escape("question_aware=True needs prompts: pass prompts=[question per "
                                                   "response]")):
        resolve_question_format(True, None, None)


def test_a_question_aware_model_reads_answers_with_their_question() -> None:
    engine = RecordingEngine(QUESTION_FORMAT)
    res = score(["1989"], [["1989", "1991"]], engine=engine, prompts=[Q])
    assert res.question_format == QUESTION_FORMAT
    assert set(engine.calls[0]) == {(with_question(Q, "1989"), with_question(Q, "1991")),
                                     (with_question(Q, "1991"), with_question(Q, "1989"))}
    assert res.rows[0].noncontradiction == pytest.approx(1 - (0.0 + 0.9) / 2)  # identical sample: scored 1 - 0
    assert res.rows[0].response == "1989"  # results refer to the answers as given


def test_other_models_keep_uqlms_inputs_unless_asked() -> None:
    plain = RecordingEngine(None)
    res = score(["1989"], [["1991"]], engine=plain, prompts=[Q])
    assert res.question_format is None and set(plain.calls[0]) == {("1989", "1991"), ("1991", "1989")}
    asked = RecordingEngine(None)
    res = score(["1989"], [["1991"]], engine=asked, prompts=[Q], question_aware=True)
    assert res.question_format == QUESTION_FORMAT and asked.calls[0][0][0].startswith("Question: ")
    off = RecordingEngine(QUESTION_FORMAT)
    assert score(["1989"], [["1991"]], engine=off, prompts=[Q], question_aware=False).question_format is None


def test_prompt_errors_name_the_field_before_any_model_loads() -> None:
    with pytest.raises(ValueError, match=re.escape("prompts has 2 items but responses has 1; give one prompt per "
                                                   "response")):
        score(["a"], [["b"]], prompts=["q1", "q2"])
    with pytest.raises(TypeError, match=re.escape("prompts[0] must be str; got int")):
        score(["a"], [["b"]], prompts=[3])
    with pytest.raises(ValueError, match=re.escape("question_aware=True needs prompts")):
        score(["a"], [["b"]], question_aware=True)


def test_identity_is_decided_on_the_answers() -> None:
    plan = plan_scores(["Paris"], [["Paris", "Lyon"]], questions=["Capital of France?"])
    assert len(plan.pairs) == 2  # "Paris" twice is one text: only Paris<->Lyon goes to the model


def test_cli_reads_prompt_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    out = str(tmp_path / "out.jsonl")
    src.write_text(json.dumps({"prompt": Q, "response": "1989", "sampled_responses": ["1991"]}) + "\n"
                   + json.dumps({"response": "x", "sampled_responses": ["y"]}) + "\n")
    assert main(["score", str(src), "-o", out, "--no-progress"]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"{src}:2: missing field 'prompt'; other records have one: give every record its question or none" in err
    src.write_text(json.dumps({"prompt": 5, "response": "1989", "sampled_responses": ["1991"]}) + "\n")
    assert main(["score", str(src), "-o", out, "--no-progress"]) != 0
    assert "field 'prompt' must be a string (the question), got int" in " ".join(capsys.readouterr().err.split())
    src.write_text(json.dumps({"response": "1989", "sampled_responses": ["1991"]}) + "\n")
    assert main(["score", str(src), "-o", out, "--no-progress", "--question-aware", "on"]) != 0
    assert "--question-aware on needs a 'prompt' field (the question) in every record" in " ".join(
        capsys.readouterr().err.split())
