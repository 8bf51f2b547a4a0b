"""Statement checks and ALCE metrics on a stub engine whose probabilities the test sets, against hand computations."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import numpy as np
import pytest

from fastnli.calm import AnswerInput, CheckConfig, Document, alce_citations, check_answers
from fastnli.engine import CallStats

NEUTRAL = (0.1, 0.8, 0.1)


class StubEngine:
    """``predict_with_stats`` from a dict of (premise, hypothesis) -> (contradiction, neutral, entailment)."""

    device = "cpu"
    precision = "stub"

    def __init__(self, table: dict[tuple[str, str], tuple[float, float, float]] | None = None) -> None:
        self.table = table or {}
        self.calls: list[list[tuple[str, str]]] = []

    def predict_with_stats(self, pairs: Sequence[tuple[str, str]]) -> tuple[np.ndarray, CallStats]:
        pairs = list(pairs)
        self.calls.append(pairs)
        probs = np.array([self.table.get(p, NEUTRAL) for p in pairs], dtype=np.float32).reshape(-1, 3)
        return probs, CallStats(pairs_in=len(pairs), unique_pairs=len(set(pairs)))


D0, D1, D2 = "Paris is the capital of France.", "Paris has 2 million inhabitants.", "Lyon is in France."
DOCS = [Document(D0), Document(D1), Document(D2)]
ANSWER = "Paris is the capital of France [1][2]. It has 2 million people [2]. Lyon is big [3][5]. No citation here."
VERIFIER = "Paris is France's capital. It has two million people."
S0, S1, S2, S3 = "Paris is the capital of France.", "It has 2 million people.", "Lyon is big.", "No citation here."
V0, V1 = "Paris is France's capital.", "It has two million people."

TABLE = {
    (V0, S0): (0.05, 0.05, 0.90),
    (V1, S1): (0.02, 0.18, 0.80),
    (V0, S2): (0.70, 0.20, 0.10),
    (f"{D0}\n{D1}", S0): (0.0, 0.05, 0.95),  # joint citation: supported
    (D0, S0): (0.0, 0.1, 0.9),  # [1] alone entails
    (D1, S0): (0.1, 0.8, 0.1),  # [2] alone does not, and [1] alone (the rest) does: [2] is irrelevant
    (D1, S1): (0.1, 0.6, 0.3),  # not supported
}


def test_hand_computed_checks() -> None:
    engine = StubEngine(TABLE)
    (check,), stats = check_answers([AnswerInput(ANSWER, DOCS, VERIFIER)], engine)
    assert len(engine.calls) == 1
    # 4 statements x 2 verifier sentences + joint/single/leave-one-out of S0 (5) + joint of S1 (1); S2 has an
    # out-of-range citation, S3 none. Leave-one-out pairs of a two-citation statement equal its single pairs.
    assert stats.pairs_in == 14 and stats.unique_pairs == 12
    assert check.nli_pairs == {"corroboration": 8, "citation": 6}
    assert check.verifier_sentences == [V0, V1]
    s = check.statements
    assert [x.text for x in s] == [S0, S1, S2, S3]
    assert [x.corroboration for x in s] == pytest.approx([0.9, 0.8, 0.1, 0.1])
    assert [x.contradiction for x in s] == pytest.approx([0.1, 0.1, 0.7, 0.1])
    assert [x.corroborated for x in s] == [True, True, False, False]
    assert [x.contradicted for x in s] == [False, False, True, False]
    assert [x.best_sentence for x in s] == [0, 1, 0, 0]
    assert [x.supported for x in s] == [True, False, False, False]
    assert [x.relevant_citations for x in s] == [[True, False], [False], [False], []]
    assert s[0].citation_entailment == pytest.approx(0.95) and s[2].citation_entailment is None
    assert s[2].citations == [2] and s[2].invalid_citations == [5]
    assert check.consistency == pytest.approx((0.9 + 0.8 + 0.1 + 0.1) / 4)
    assert check.corroborated_share == 0.5
    assert check.contradicted is True and check.accepted is False
    assert check.citation_recall == 0.25  # 1 supported of 4
    assert check.citation_precision == pytest.approx(1 / 5)  # 1 relevant of 2 + 1 + 2 + 0 citations written
    assert check.num_citations == 5 and check.invalid_citations == [5] and check.cited_documents == [0, 1, 2]
    assert any("citations out of range: [5]" in n for n in check.notes)
    assert check.rouge_l is not None and 0 < check.rouge_l < 1


def test_acceptance_rule_and_config() -> None:
    answer = "Paris is the capital of France [1]. It has 2 million people [2]."
    engine = StubEngine(TABLE)
    (check,), _ = check_answers([AnswerInput(answer, DOCS, VERIFIER)], engine)
    assert check.corroborated_share == 1.0 and check.contradicted is False and check.accepted is True
    # A stricter threshold: 0.8 is not > 0.85, so S1 is no longer corroborated (1 of 2 < 0.8).
    (strict,), _ = check_answers([AnswerInput(answer, DOCS, VERIFIER)], engine,
                                 CheckConfig(entailment_threshold=0.85))
    assert strict.corroborated_share == 0.5 and strict.accepted is False
    # Citation recall as an extra condition: S1 is not supported by [2] (0.3), recall 0.5.
    (rec,), _ = check_answers([AnswerInput(answer, DOCS, VERIFIER)], engine, CheckConfig(min_citation_recall=0.9))
    assert rec.citation_recall == 0.5 and rec.accepted is False
    # argmax rule: (0.1, 0.6, 0.3) is neutral; (0.02, 0.18, 0.8) is entailment.
    (am,), _ = check_answers([AnswerInput(answer, DOCS, VERIFIER)], engine, CheckConfig(entailment_rule="argmax"))
    assert [x.corroborated for x in am.statements] == [True, True]
    with pytest.raises(ValueError, match=re.escape("entailment_rule='max' is not supported; use 'threshold' or "
                                                   "'argmax'")):
        CheckConfig(entailment_rule="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("accept_share=1.5 must be within [0, 1]")):
        CheckConfig(accept_share=1.5)


def test_one_engine_pass_for_many_answers_and_empty_cases() -> None:
    engine = StubEngine(TABLE)
    items = [AnswerInput(ANSWER, DOCS, VERIFIER) for _ in range(7)] + [AnswerInput("", DOCS, VERIFIER),
                                                                       AnswerInput(ANSWER, DOCS, "")]
    checks, stats = check_answers(items, engine)
    assert len(engine.calls) == 1 and stats.pairs_in == 7 * 14 + 0 + 6 and stats.unique_pairs == 12
    assert checks[7].statements == [] and checks[7].accepted is False and checks[7].consistency == 0.0
    assert "the answer has no statements" in checks[7].notes
    assert checks[8].verifier_sentences == [] and checks[8].corroborated_share == 0.0
    assert "the verifier answer has no sentences" in checks[8].notes
    # Nothing to check: the engine is not called at all.
    engine2 = StubEngine()
    checks, stats = check_answers([AnswerInput("No citation.", DOCS)], engine2, CheckConfig(check_citations=False))
    assert engine2.calls == [] and stats is None and checks[0].citation_recall is None


def test_huge_documents_are_flagged_never_silently_truncated(caplog: pytest.LogCaptureFixture) -> None:
    huge = Document("Paris " * 3000, "Big")
    engine = StubEngine()
    with caplog.at_level(logging.WARNING, logger="fastnli"):
        (check,), _ = check_answers([AnswerInput("Paris is big [1]. Lyon is small [2].", [huge, DOCS[2]], "x")],
                                    engine)
    assert check.truncated_documents == [0]
    assert [s.truncated for s in check.statements] == [True, False]
    assert check.truncated_pairs == 1
    assert any("truncated by the engine (longest_first)" in n for n in check.notes)
    assert "1 of 4 NLI pairs are estimated to exceed the model limit of 512 tokens" in caplog.text


def test_a_text_entails_itself_whatever_the_model_says() -> None:
    """Identical premise and hypothesis (also once units are aligned) read as entailment, one-hot; the others keep
    the model's row."""
    from fastnli.calm.checks import PairPlan

    engine = StubEngine({("212 °F", "212 °F"): (0.96, 0.02, 0.02), ("100 °C", "212 °F"): (0.9, 0.05, 0.05),
                         (D0, S2): (0.7, 0.2, 0.1)})
    plan = PairPlan()
    for premise, hypothesis in (("212 °F", "212 °F"), (D0, S2), ("100 °C", "212 °F"), (" 212 °F", "212 °F\n")):
        plan.add(premise, hypothesis)
    rows, best, _ = plan.run(engine)
    np.testing.assert_allclose(rows, [[0, 0, 1], [0.7, 0.2, 0.1], [0.9, 0.05, 0.05], [0, 0, 1]], atol=1e-7)
    assert best.tolist() == [-1] * 4
    plan = PairPlan()
    plan.add("100 °C", "212 °F")
    rows, _, _ = plan.run(engine, align=True)  # 212 °F in the premise's unit is "100 °C": the premise itself
    np.testing.assert_allclose(rows, [[0, 0, 1]], atol=1e-7)


def test_alce_citations_hand_computed_one_pass() -> None:
    engine = StubEngine(TABLE)
    answers = [ANSWER, "Paris is the capital of France [1].", "Nothing cited."]
    result = alce_citations(answers, [DOCS, [D0, D1], [{"title": "", "text": D2}]], engine)
    assert len(engine.calls) == 1
    assert [a.citation_recall for a in result] == [0.25, 1.0, 0.0]
    assert [a.citation_precision for a in result] == pytest.approx([0.2, 1.0, 0.0])
    assert result.citation_recall == pytest.approx((0.25 + 1.0) / 3)
    assert result.citation_precision == pytest.approx(1.2 / 3)
    assert result[0].accepted is None and result[0].consistency is None  # no verifier: citation checks only
    assert result.stats["pairs_in"] == 6 + 1 and result.device == "cpu" and result.precision == "stub"
    assert '"citation_recall"' in result.to_json()


def test_alce_bad_input_messages() -> None:
    engine = StubEngine()
    with pytest.raises(ValueError, match=re.escape(
            "answers has 2 items but documents has 1 lists; give one list of documents per answer")):
        alce_citations(["a", "b"], [["d"]], engine)
    with pytest.raises(TypeError, match=re.escape("answers[1] must be str; got NoneType")):
        alce_citations(["a", None], [["d"], ["d"]], engine)  # type: ignore[list-item]
    with pytest.raises(ValueError, match=re.escape("documents[0] is empty; give at least one document")):
        alce_citations(["a"], [[]], engine)
