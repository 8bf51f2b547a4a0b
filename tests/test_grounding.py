"""Grounding: the (statement x source) matrix equals per-pair predict, SummaC-ZS equals its formula written out,
CaLM/ALCE read long documents in windows, and 2-way heads of both DeBERTa versions."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import torch_probs
from test_windows import HYPOTHESIS, NEEDLE, deciding_row, long_premise

import fastnli
from fastnli.calm import AnswerInput, CheckConfig, Document, alce_citations, check_answers
from fastnli.calm.documents import premise_text
from fastnli.calm.grounding import finish_grounding, plan_grounding
from fastnli.cli import main
from fastnli.engine import NLIEngine
from fastnli.engine.windows import WindowPolicy
from fastnli.exporter import export
from fastnli.exporter.checkpoint import build_checkpoint

DOCS: list[Any] = [
    {"title": "Paris", "text": "Paris is the capital of France. The Louvre is a museum in Paris. It opened in 1793."},
    "Lyon is a city in France. It lies on the Rhone.",
]
STATEMENTS = ["Paris is the capital of France.", "The Louvre is in Lyon.", "The museum opened in 1793."]


class CountingEngine:
    """The real engine, counting its passes."""

    def __init__(self, inner: NLIEngine) -> None:
        self.inner = inner
        self.calls: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def predict_with_stats(self, pairs: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(len(pairs))
        return self.inner.predict_with_stats(pairs, *args, **kwargs)


@pytest.fixture(scope="module")
def engine(art_v1: Path) -> NLIEngine:
    return NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")


@pytest.mark.parametrize(("contradiction", "fallback"), [(None, "entailment"), (0.0, "entailment"), (0.9, "neutral")])
@pytest.mark.parametrize("granularity", ["window", "sentence"])
def test_matrix_equals_per_pair_predict_and_summac_zs_its_formula(art_v1: Path, granularity: str,
                                                                  contradiction: float | None, fallback: str) -> None:
    engine = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32",
                                       window_policy=WindowPolicy(contradiction_threshold=contradiction,
                                                                  fallback=fallback))
    counting = CountingEngine(engine)
    docs = [*DOCS, {"title": "Long", "text": long_premise(120)}]
    r = fastnli.grounding(STATEMENTS, docs, counting, granularity=granularity)  # type: ignore[arg-type]
    S, U = len(STATEMENTS), len(r.sources)
    assert counting.calls == [S * U] and r.probs.shape == (S, U, 3) and r.labels == engine.labels
    if granularity == "window":
        assert r.sources[:2] == [premise_text([Document(DOCS[0]["text"], "Paris")]), DOCS[1]]
        assert r.source_documents.count(2) > 1  # the long document is read in windows
    else:
        assert r.sources[:3] == ["Paris is the capital of France.", "The Louvre is a museum in Paris.",
                                 "It opened in 1793."]
    for s, statement in enumerate(STATEMENTS):
        for u, source in enumerate(r.sources):
            alone = engine.predict((source, statement))
            assert np.abs(r.probs[s, u] - alone).max() <= 1e-6
    # the formulas, written out
    summac = []
    for s in range(S):
        scores = [float(r.probs[s, u, 2] - r.probs[s, u, 0]) for u in range(U)]
        summac.append(max(scores))
        ent = [float(r.probs[s, u, 2]) for u in range(U)]
        best = deciding_row(r.probs[s], r.threshold, contradiction, fallback)
        assert r.best_source[s] == best and r.entailment[s] == pytest.approx(max(ent), abs=0)
        assert r.contradiction is not None and r.contradiction[s] == pytest.approx(float(r.probs[s, best, 0]), abs=0)
        assert bool(r.supported[s]) == (max(ent) > 0.5)
    assert r.summac_zs is not None and np.allclose(r.summac_zs, summac, atol=1e-7, rtol=0)
    assert r.summac == pytest.approx(sum(summac) / S, abs=1e-6)
    assert r.score == pytest.approx(float(np.mean(r.entailment)), abs=1e-7)
    d = r.to_dict()
    assert np.array(d["probs"]).shape == (S, U, 3) and "probs" not in r.to_dict(matrix=False)
    json.dumps(d)


def test_an_answer_is_split_and_errors_name_the_field(engine: NLIEngine) -> None:
    r = fastnli.grounding("Paris is the capital of France [1]. The Louvre is in Lyon [2].", DOCS, engine)
    assert r.statements == ["Paris is the capital of France.", "The Louvre is in Lyon."]
    empty = fastnli.grounding([], DOCS, engine)
    assert empty.probs.shape == (0, 2, 3) and empty.score == 0.0 and empty.summac == 0.0
    with pytest.raises(ValueError, match=re.escape("granularity='page' is not supported; use 'window'")):
        fastnli.grounding(STATEMENTS, DOCS, engine, granularity="page")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("threshold=2 must be within [0, 1]")):
        fastnli.grounding(STATEMENTS, DOCS, engine, threshold=2)
    with pytest.raises(TypeError, match=re.escape("statements[1] must be str; got int")):
        fastnli.grounding(["a", 1], DOCS, engine)  # type: ignore[list-item]
    with pytest.raises(ValueError, match=re.escape("documents hold no text to ground statements in")):
        fastnli.grounding(STATEMENTS, [""], engine, granularity="sentence")
    with pytest.raises(ValueError, match=re.escape("granularity='window' needs an engine with a tokenizer")):
        plan_grounding(STATEMENTS, DOCS, object())
    plan = plan_grounding(STATEMENTS, DOCS, engine)
    with pytest.raises(ValueError, match=re.escape("probs has shape (2, 3); the plan needs (6, 3)")):
        finish_grounding(plan, np.zeros((2, 3)))


def test_calm_checks_read_long_cited_documents_in_windows(engine: NLIEngine) -> None:
    doc = Document(long_premise(150), "Bridges")
    answer = f"{HYPOTHESIS} [1]"
    (check,), stats = check_answers([AnswerInput(answer, [doc])], engine)
    st = check.statements[0]
    premise = premise_text([doc])
    ref = engine.predict_detailed([(premise, HYPOTHESIS)])
    assert ref.num_windows[0] > 1 and st.citation_window == int(ref.best_window[0])
    assert st.citation_entailment == pytest.approx(float(ref.probs[0, 2]), abs=1e-6)
    assert not st.truncated and check.truncated_pairs == 0 and check.chunked_pairs == 1
    assert stats.pairs_in == ref.num_windows[0]  # the windows went through the engine pass
    assert any(NEEDLE in w for w in engine.windows(premise, HYPOTHESIS))
    (cut,), _ = check_answers([AnswerInput(answer, [doc])], engine, CheckConfig(long_premise="truncate"))
    assert cut.statements[0].truncated and cut.truncated_pairs == 1 and cut.statements[0].citation_window is None
    assert any("measured over the model limit of 512 tokens were truncated" in n for n in cut.notes)
    result = alce_citations([answer], [[doc]], engine)
    assert result.answers[0].statements[0].citation_window == st.citation_window
    with pytest.raises(ValueError, match=re.escape("long_premise='all' is not supported")):
        CheckConfig(long_premise="all")  # type: ignore[arg-type]


def test_cli_grounding(art_v1: Path, engine: NLIEngine, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": 1, "statements": STATEMENTS, "documents": DOCS}) + "\n"
                   + json.dumps({"answer": "Lyon is in France.", "documents": ["Lyon is a city in France."]}) + "\n")
    out = tmp_path / "out.jsonl"
    args = ["--model", str(art_v1), "--device", "cpu", "--precision", "fp32"]
    assert main(["grounding", str(src), "-o", str(out), "--matrix", *args]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ref = fastnli.grounding(STATEMENTS, DOCS, engine)
    assert rows[0]["id"] == 1 and np.allclose(rows[0]["probs"], ref.probs, atol=1e-6, rtol=0)
    assert rows[0]["summac"] == pytest.approx(ref.summac, abs=1e-6) and rows[1]["statements"] == ["Lyon is in France."]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"statements": ["x"], "answer": "y", "documents": ["z"]}) + "\n")
    assert main(["grounding", str(bad), *args]) == 2
    bad.write_text(json.dumps({"statements": ["x"], "answer": "y", "documents": ["z"]}) + "\n"
                   + src.read_text().splitlines()[1] + "\n"
                   + json.dumps({"statements": [5], "documents": ["z"]}) + "\n")
    assert main(["grounding", str(bad), "-o", str(out), "--on-invalid", "keep", *args]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["error"] == f"{bad}:1: give exactly one of 'statements' (a list of strings) and 'answer' (a text)"
    assert rows[1]["statements"] == ["Lyon is in France."] and "error" not in rows[1]
    assert rows[2]["error"].startswith(f"{bad}:3: ") and "summac" not in rows[2]  # refused by the planner


# -- 2-way heads ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[("deberta", "2way"), ("deberta-v2", "2way-supported")],
                ids=["v1-entailment", "v2-supported"])
def two_way(request: pytest.FixtureRequest, workdir: Path) -> tuple[Path, NLIEngine]:
    pytest.importorskip("torch")
    arch, order = request.param
    ck = build_checkpoint(workdir / f"ck_{order}", arch=arch, size="tiny", seed=5, label_order=order)
    export(ck, workdir / f"art_{order}", precisions=("fp32",), validate=False)  # parity: the test below
    return ck, NLIEngine.from_pretrained(workdir / f"art_{order}", device="cpu", precision="fp32")


def test_two_way_heads_load_with_their_labels(two_way: tuple[Path, NLIEngine]) -> None:
    ck, engine = two_way
    pairs = [("A man plays guitar.", "A man makes music."), ("Paris", "Lyon"), ("", "x")]
    got = engine.predict(pairs)
    assert engine.labels == ("not_entailment", "entailment") and got.shape == (3, 2)
    assert np.abs(got - torch_probs(ck, pairs)).max() <= 1e-4  # columns mapped from the config's id2label
    id2label = json.loads((ck / "config.json").read_text())["id2label"]
    positive = next(int(k) for k, v in id2label.items() if v in ("entailment", "supported"))
    assert engine.manifest.columns[1] == positive
    assert engine.predict(pairs[0]).shape == (2,)


def test_two_way_heads_in_grounding_calm_and_scorers(two_way: tuple[Path, NLIEngine]) -> None:
    _, engine = two_way
    r = fastnli.grounding(STATEMENTS, DOCS, engine)
    assert r.probs.shape == (3, 2, 2) and r.summac is None and r.summac_zs is None and r.contradiction is None
    assert np.array_equal(r.entailment, r.probs[:, :, 1].max(axis=1))
    docs = [Document(DOCS[0]["text"], DOCS[0]["title"]), Document(DOCS[1])]
    (check,), _ = check_answers([AnswerInput("Paris is the capital of France [1].", docs,
                                             "Paris is France's capital.")], engine)
    st = check.statements[0]
    assert st.contradiction is None and st.contradicted is None and check.contradicted is False
    assert st.corroboration == pytest.approx(float(engine.predict(("Paris is France's capital.",
                                                                   "Paris is the capital of France."))[1]), abs=1e-6)
    assert "the NLI model has a 2-way head: contradiction is not checked" in check.notes
    with pytest.raises(ValueError, match=re.escape(
            "fastnli.score (scorers ['noncontradiction']) needs P(contradiction), but the engine's model has a 2-way "
            "head ('not_entailment', 'entailment'); use a 3-way NLI model")):
        fastnli.score(["a"], [["b", "c"]], engine=engine)
