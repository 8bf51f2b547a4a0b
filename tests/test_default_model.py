"""The embedded default model: offline default everywhere, no torch at run time, and the CI quality gate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_DATA

from fastnli.default_model import DEFAULT_MODEL_DIR, default_model_dir
from fastnli.engine import NLIEngine, read_manifest

LABELS = ["contradiction", "neutral", "entailment"]
#: The shipped model's quality records live beside its tools, out of the wheel.
QUALITY = json.loads((Path(__file__).resolve().parents[1] / "tools" / "default_model" / "quality.json").read_text())
ACCURACY_MARGIN = 0.01  # ORT releases may differ in the last bits of INT8 kernels; labels flip on a few pairs at most
AGREEMENT_MARGIN = 0.01


@pytest.fixture(scope="module")
def engine() -> NLIEngine:
    return NLIEngine.from_pretrained(device="cpu")


def test_default_model_ships_int8_within_budget(engine: NLIEngine) -> None:
    assert default_model_dir() == DEFAULT_MODEL_DIR
    m = read_manifest(DEFAULT_MODEL_DIR)
    assert list(m.precisions) == ["int8"] and engine.precision == "int8" and engine.device == "cpu"
    assert m.columns == [0, 1, 2] and "token_type_ids" in m.inputs  # BERT: segment ids are fed
    size = sum(f.stat().st_size for f in DEFAULT_MODEL_DIR.iterdir())
    assert size <= 50 * 10**6, f"the embedded model adds {size / 1e6:.1f} MB; the budget is 50 MB"
    assert (DEFAULT_MODEL_DIR / "MODEL_CARD.md").is_file()
    assert not (DEFAULT_MODEL_DIR / "quality.json").exists()  # training records stay out of the wheel


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
@pytest.mark.parametrize("split", ["snli/dev", "lingnli/val"])
def test_quality_gate(engine: NLIEngine, split: str) -> None:
    gate = QUALITY["gate"][split]
    rows = [json.loads(x) for x in (SHARED_DATA / "dev.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["source"] == split][:: gate["every_nth_row"]]
    assert len(rows) == gate["rows"]
    pred = engine.predict([(r["premise"], r["hypothesis"]) for r in rows]).argmax(1)
    gold = np.array([LABELS.index(r["label"]) for r in rows])
    acc = float(np.mean(pred == gold))
    assert abs(acc - gate["accuracy"]["int8"]) <= ACCURACY_MARGIN, (split, acc, gate["accuracy"])
    agreement = float(np.mean(pred == np.array(gate["fp32_argmax"])))
    assert abs(agreement - gate["int8_fp32_agreement"]) <= AGREEMENT_MARGIN, (split, agreement, gate)


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def test_scores_do_not_depend_on_the_batch(engine: NLIEngine) -> None:
    """The shipped static INT8 graph: a pair scores the same whatever else is in the call and in what order."""
    rows = [json.loads(x) for x in (SHARED_DATA / "dev.jsonl").read_text().splitlines()]
    pairs = [(r["premise"], r["hypothesis"]) for r in rows if r["source"] == "snli/dev"][:600]
    together = engine.predict(pairs)
    np.testing.assert_allclose(engine.predict(pairs[::-1])[::-1], together, rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([engine.predict(pairs[i:i + 3]) for i in range(0, 600, 50)]),
                               np.concatenate([together[i:i + 3] for i in range(0, 600, 50)]), rtol=0, atol=1e-6)


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def test_mission_gate(engine: NLIEngine) -> None:
    """Answers to one question and long premises: the shipped figures of the gate's slice of the test part."""
    from tools.default_model import answer_data, mission_eval

    gate = QUALITY["mission_gate"]
    test = answer_data.build(SHARED_DATA, long_train=0)["test"]
    rows = [test[i] for i in mission_eval.gate_indices(test, gate["every_nth"])]
    assert len(rows) == gate["rows"]
    # as written; as the scorers read them (the pairs that alignment leaves as written keep their scores: the engine
    # is batch-invariant, test_scores_do_not_depend_on_the_batch)
    probs = {"int8": mission_eval.row_probs(engine.predict, rows)}
    probs["int8_aligned"] = mission_eval.row_probs(engine.predict, rows, aligned=True, plain=probs["int8"])
    for key, p in probs.items():
        if key not in gate:
            continue
        groups = mission_eval.evaluate(rows, p)["groups"]
        for form, figures in gate[key].items():
            for name, value in figures.items():
                assert abs(groups[form][name] - value) <= ACCURACY_MARGIN, (key, form, name, groups[form][name], value)


@pytest.mark.parametrize("part", ["main", "heldout"])
def test_written_answers_gate(engine: NLIEngine, part: str) -> None:
    """Answers people wrote (tools/default_model/written_answers.py), the main and the held-out questions: the shipped
    figures, per input form."""
    from tools.default_model import written_answers

    record = QUALITY["written_answers"]
    recorded = record["now"] if part == "main" else record["heldout"]["now"]
    path = written_answers.DATA if part == "main" else written_answers.HELDOUT
    result = written_answers.evaluate(written_answers.read_questions(path), engine)
    for form, figures in recorded.items():
        for name in written_answers.FIGURES:
            assert abs(result[form][name] - figures[name]) <= ACCURACY_MARGIN, (form, name, result[form][name])


def test_wrong_samples_lower_ncp_in_the_main_jobs_examples() -> None:
    """examples/ncp.jsonl pairs each question's correct-only samples with samples holding a wrong answer: the
    embedded model must give the second a lower NCP (the main job, bash scripts/main.sh, shows these rows)."""
    from fastnli.scorers import score

    rows = [json.loads(x) for x in (Path(__file__).resolve().parents[1] / "examples" / "ncp.jsonl").read_text()
            .splitlines()]
    cases: dict[str, dict[str, float]] = {}
    result = score([r["response"] for r in rows], [r["sampled_responses"] for r in rows],
                   prompts=[r["prompt"] for r in rows])
    for r, s in zip(rows, result):
        case, kind = r["case"].rsplit("/", 1)
        cases.setdefault(case, {})[kind] = s.noncontradiction
    assert len(cases) >= 4
    for case, ncp in cases.items():
        assert ncp["with-wrong"] < ncp["correct"], (case, ncp)


def test_default_is_used_everywhere_without_torch(tmp_path: Path) -> None:
    """Engine, scorers and CLI with no model: the embedded one, and neither torch nor transformers is imported."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"response": "Paris", "sampled_responses": ["Paris", "Lyon"]}\n')
    code = f"""
import sys
from fastnli import NLIEngine
from fastnli.scorers import score
from fastnli.cli import main
engine = NLIEngine.from_pretrained()
assert engine.predict([("A man plays guitar.", "A man makes music.")]).shape == (1, 3)
assert score(["Paris"], [["Lyon", "Paris"]]).rows[0].noncontradiction is not None
assert main(["score", {str(src)!r}, "-o", {str(tmp_path / 'out.jsonl')!r}, "--no-progress"]) == 0
bad = [m for m in ("torch", "transformers", "optimum") if m in sys.modules]
assert not bad, bad
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "out.jsonl").read_text())
    assert 0.0 <= out["noncontradiction"] <= 1.0


def test_nli_sanity_on_clear_pairs(engine: NLIEngine) -> None:
    probs = engine.predict([
        ("A man is playing a guitar on stage.", "A man is playing an instrument."),
        ("A man is playing a guitar on stage.", "Nobody is playing music."),
    ])
    assert probs[0].argmax() == 2 and probs[1].argmax() == 0


def test_calls_without_an_engine_share_one_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastnli.calm import alce_citations
    from fastnli.engine import default_engine
    from fastnli.engine import engine as engine_module
    from fastnli.scorers import score

    monkeypatch.setattr(engine_module, "_DEFAULT_ENGINES", {})
    loads = []
    real = NLIEngine.from_pretrained.__func__  # type: ignore[attr-defined]

    def counting(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
        loads.append(args)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(NLIEngine, "from_pretrained", classmethod(counting))
    first = default_engine()
    assert default_engine() is first and default_engine(None, "auto", "auto") is first
    score(["Paris is in France."], [["Paris is in France.", "Paris is in Spain."]])
    score(["A dog runs."], [["A cat sleeps."]])
    alce_citations(["Paris is in France [1]."], [["Paris is the capital of France."]])
    assert len(loads) == 1
    assert default_engine(precision="int8") is not first and len(loads) == 2  # other settings, another engine
