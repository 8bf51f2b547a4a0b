"""The model's window policy: how long documents are read (window cap) and what a premise read in windows needs to
count as support (its threshold), from the manifest; CaLM/ALCE checks and grounding apply it, and a caller's own
settings win."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_grounding import DOCS, STATEMENTS
from test_windows import HYPOTHESIS, long_premise

import fastnli
from fastnli.calm import AnswerInput, CheckConfig, Document, check_answers
from fastnli.calm.checks import plan_checks
from fastnli.calm.documents import premise_text
from fastnli.default_model import DEFAULT_MODEL_DIR
from fastnli.engine import NLIEngine, WindowPolicy, read_manifest
from fastnli.serve.config import ServeConfig
from fastnli.serve.payloads import ApiError, calm_item, grounding_item
from tools.default_model.window_choice import choose


def _with_policy(art: Path, tmp_path: Path, policy: object) -> Path:
    out = tmp_path / "art"
    shutil.copytree(art, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["window_policy"] = policy
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def engine(art_v1: Path) -> NLIEngine:
    return NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")


def test_the_manifest_policy_is_the_engines_default_and_a_given_policy_wins(art_v1: Path, tmp_path: Path) -> None:
    art = _with_policy(art_v1, tmp_path, {"max_window_tokens": 64, "entailment_threshold": 0.7})
    assert read_manifest(art).window_policy == {"max_window_tokens": 64, "entailment_threshold": 0.7}
    engine = NLIEngine.from_pretrained(art, device="cpu", precision="fp32")
    assert engine.window_planner.policy == WindowPolicy(max_window_tokens=64, entailment_threshold=0.7)
    given = WindowPolicy(overlap_tokens=0)
    assert NLIEngine.from_pretrained(art, device="cpu", precision="fp32",
                                     window_policy=given).window_planner.policy is given
    assert NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32").window_planner.policy == WindowPolicy()
    # every window of a capped policy fits the cap, measured with the model's tokenizer
    premise = long_premise(40)
    windows = engine.windows(premise, HYPOTHESIS)
    assert len(windows) > 1
    tok = engine.window_planner.tokenizer
    assert max(len(e.ids) for e in tok.encode_texts(windows)) <= 64


def test_info_says_how_long_documents_are_read(art_v1: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from fastnli.cli import main

    art = _with_policy(art_v1, tmp_path, {"max_window_tokens": 64, "entailment_threshold": 0.7,
                                          "contradiction_threshold": 0.9})
    assert main(["info", "--model", str(art), "--device", "cpu"]) == 0
    assert ("long documents (CaLM, ALCE, grounding, long_premise='chunk'): windows of at most 64 tokens, 64 tokens "
            "of overlap; support when read in windows: P(entailment) > 0.7; three-way row: the best-entailment "
            "window's, or when none supports the most contradicting one's with P(contradiction) > 0.9 (the "
            "manifest's window policy)" in " ".join(capsys.readouterr().out.split()))
    assert main(["info", "--model", str(art_v1), "--device", "cpu"]) == 0
    assert ("windows as large as the model allows, 64 tokens of overlap; support when read in windows: the plain "
            "threshold; three-way row: the best-entailment window's (the default window policy)"
            in " ".join(capsys.readouterr().out.split()))


@pytest.mark.parametrize("policy, message", [
    ([128], "window_policy must be an object of WindowPolicy fields; got list"),
    ({"max_window_tokens": 128, "threshold": 0.7},
     "window_policy is not a valid WindowPolicy (WindowPolicy.__init__() got an unexpected keyword argument "
     "'threshold'); re-export the model"),
    ({"entailment_threshold": 1.5},
     "window_policy is not a valid WindowPolicy (entailment_threshold=1.5 must be within [0, 1] (or None)); "
     "re-export the model"),
])
def test_a_bad_manifest_policy_is_refused_naming_the_file(art_v1: Path, tmp_path: Path, policy: object,
                                                          message: str) -> None:
    art = _with_policy(art_v1, tmp_path, policy)
    with pytest.raises(ValueError, match=re.escape(f"{art / 'manifest.json'}: {message}")):
        NLIEngine.from_pretrained(art, device="cpu", precision="fp32")


def test_bad_thresholds_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=re.escape("entailment_threshold=-0.1 must be within [0, 1] (or None)")):
        WindowPolicy(entailment_threshold=-0.1)
    with pytest.raises(ValueError, match=re.escape("window_entailment_threshold=1.5 must be within [0, 1] (or None)")):
        CheckConfig(window_entailment_threshold=1.5)


def test_the_window_threshold_decides_premises_read_in_windows_only() -> None:
    row = np.array([0.1, 0.25, 0.65], dtype=np.float32)
    config = CheckConfig(window_entailment_threshold=0.7)
    assert config.entails(row) and not config.entails(row, windowed=True)
    assert CheckConfig().entails(row, windowed=True)  # no window threshold: the plain one
    assert CheckConfig(entailment_rule="argmax", window_entailment_threshold=0.9).entails(row, windowed=True)


def test_checks_take_the_engines_window_threshold_unless_given_one(engine: NLIEngine) -> None:
    doc = Document(long_premise(150), "Bridges")
    short = Document("The old bridge was painted blue during the summer.", "Bridge")
    answers = [AnswerInput(f"{HYPOTHESIS} [1]", [doc]), AnswerInput(f"{HYPOTHESIS} [1]", [short])]
    (long_check, short_check), _ = check_answers(answers, engine)
    e_long = long_check.statements[0].citation_entailment
    e_short = short_check.statements[0].citation_entailment
    assert long_check.chunked_pairs == 1 and short_check.chunked_pairs == 0
    assert e_long is not None and e_short is not None
    original = engine.window_planner.policy
    try:
        for bar in (e_long - 1e-4, e_long + 1e-4):
            engine.window_planner.policy = WindowPolicy(entailment_threshold=bar)
            plan = plan_checks(answers).expand(engine)
            assert plan.config.window_entailment_threshold == bar
            (got_long, got_short), _ = check_answers(answers, engine)
            assert got_long.statements[0].supported == (e_long > bar)
            assert got_short.statements[0].supported == (e_short > 0.5)  # a document read whole: the plain rule
            assert got_long.citation_recall == float(e_long > bar)
        # a caller's own window threshold wins over the engine's
        (mine, _), _ = check_answers(answers, engine, CheckConfig(window_entailment_threshold=0.0))
        assert mine.statements[0].supported is True
        assert CheckConfig(window_entailment_threshold=0.3).for_engine(engine).window_entailment_threshold == 0.3
    finally:
        engine.window_planner.policy = original
    # an engine without windows or a manifest keeps the window threshold, and reads pairs as given
    assert CheckConfig().for_engine(object()) == CheckConfig(align_units=False)


def test_grounding_threshold_is_plain_for_one_source_and_the_window_threshold_for_several(engine: NLIEngine) -> None:
    original = engine.window_planner.policy
    try:
        engine.window_planner.policy = WindowPolicy(entailment_threshold=0.8)
        one = fastnli.grounding(STATEMENTS, [DOCS[1]], engine)
        many = fastnli.grounding(STATEMENTS, DOCS, engine)
        given = fastnli.grounding(STATEMENTS, DOCS, engine, threshold=0.2)
    finally:
        engine.window_planner.policy = original
    assert len(one.sources) == 1 and one.threshold == 0.5
    assert len(many.sources) == 2 and many.threshold == 0.8 and given.threshold == 0.2
    for r in (one, many, given):
        assert r.supported.tolist() == (r.entailment > r.threshold).tolist()
    assert fastnli.grounding(STATEMENTS, DOCS, engine).threshold == 0.5  # a policy without a threshold


def test_grounding_windows_keep_the_policy_cap(engine: NLIEngine) -> None:
    original = engine.window_planner.policy
    try:
        engine.window_planner.policy = WindowPolicy(max_window_tokens=48)
        r = fastnli.grounding(STATEMENTS, [{"title": "Long", "text": long_premise(30)}], engine)
    finally:
        engine.window_planner.policy = original
    tok = engine.window_planner.tokenizer
    assert len(r.sources) > 1 and max(len(e.ids) for e in tok.encode_texts(r.sources)) <= 48
    assert premise_text([Document(long_premise(30), "Long")]).startswith(r.sources[0])


def test_the_service_takes_null_for_the_models_default_and_refuses_bad_types() -> None:
    config = ServeConfig()
    body = {"statements": ["a"], "documents": ["b"]}
    assert grounding_item(body, config)[3] is None
    assert grounding_item({**body, "threshold": None}, config)[3] is None
    assert grounding_item({**body, "threshold": 0.6}, config)[3] == 0.6
    with pytest.raises(ApiError, match=re.escape("field 'threshold' is 'high'; send a number within [0, 1] (or null: "
                                                 "the model's default)")):
        grounding_item({**body, "threshold": "high"}, config)
    _, cfg = calm_item({"answer": "a [1]", "documents": ["b"], "config": {"window_entailment_threshold": 0.9}}, "",
                       config)
    assert cfg.window_entailment_threshold == 0.9
    with pytest.raises(ApiError, match=re.escape("field 'config.window_entailment_threshold' must be a number")):
        calm_item({"answer": "a", "config": {"window_entailment_threshold": "0.9"}}, "", config)


def test_the_embedded_model_reads_documents_as_its_manifest_says() -> None:
    manifest = read_manifest(DEFAULT_MODEL_DIR)
    assert manifest.window_policy is not None
    engine = fastnli.default_engine()
    assert engine.window_planner.policy == WindowPolicy.from_manifest(manifest.window_policy)
    quality = json.loads((Path(__file__).resolve().parents[1] / "tools" / "default_model" / "quality.json")
                         .read_text())
    # the shipped policy is the measured one: window_choice's cap and support bar, contradiction_choice's bar and
    # fallback
    assert manifest.window_policy == {**quality["window_policy"]["choice"],
                                      "contradiction_threshold": quality["window_contradiction"]["choice"],
                                      "fallback": quality["window_contradiction"]["fallback"]}


def _table(cells: dict[str, dict[str, tuple[float, float]]]) -> dict[str, object]:
    """A window_choice table: per cap, one depth, per threshold (found, false)."""
    return {"caps": {cap: {"depths": {"0": {"found": {t: v[0] for t, v in row.items()},
                                            "false": {t: v[1] for t, v in row.items()}}}}
                     for cap, row in cells.items()}}


def test_window_choice_takes_the_most_found_within_the_false_support_bound() -> None:
    full = {"0.5": (0.80, 0.12), "0.6": (0.75, 0.09), "0.7": (0.60, 0.05), "0.8": (0.50, 0.02)}
    small = {"0.5": (0.90, 0.15), "0.6": (0.85, 0.11), "0.7": (0.78, 0.08), "0.8": (0.70, 0.04)}
    assert choose(_table({"None": full, "128": small})) == {"max_window_tokens": 128, "entailment_threshold": 0.7}
    # ties go to larger windows, then the lower threshold
    same = {"0.5": (0.8, 0.2), "0.6": (0.7, 0.05), "0.7": (0.7, 0.01), "0.8": (0.1, 0.0)}
    assert choose(_table({"None": same, "128": same})) == {"max_window_tokens": None, "entailment_threshold": 0.6}
    loose = {t: (0.9, 0.2) for t in ("0.5", "0.6", "0.7", "0.8")}  # nothing within the bound: the plain policy
    assert choose(_table({"None": loose, "128": loose})) == {"max_window_tokens": None, "entailment_threshold": 0.5}
