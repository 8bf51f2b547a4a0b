"""Messages that tell the truth: install hints keep the extra's name, missing paths say so, the INT8 gate explains
itself, the CLI refuses bad options before any model loads, and the basics (--version, help, LICENSE, examples).

Each test asserts the exact text a user sees (``re.escape``); models are the embedded default model (no torch).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastnli
from fastnli.cli import DESCRIPTION, build_parser, main
from fastnli.default_model import DEFAULT_MODEL_DIR
from fastnli.engine import NLIEngine
from fastnli.engine.engine import EMBEDDED_INT8_REASON, cpu_precision_choice
from fastnli.engine.manifest import looks_like_local_path, read_manifest

REPO = Path(__file__).resolve().parents[1]


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# -- install hints keep the extra's name under rich ------------------------------------------------------------------

def test_checkpoint_without_torch_names_the_export_extra(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError, as without the export extra
    code, out, err = _run_cli(["checkpoint", str(tmp_path / "ck")], capsys)
    assert code == 2 and out == ""
    assert err == ("error: building a checkpoint needs torch and transformers (torch is not installed); install the "
                   "export extra: pip install 'fastnli[export]'\n")


def test_serve_without_uvicorn_names_the_serve_extra(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    code, _, err = _run_cli(["serve", "--port", "0"], capsys)
    assert code == 2
    assert err == "error: fastnli serve needs uvicorn and starlette: pip install 'fastnli[serve]'\n"


def test_ray_without_ray_names_the_ray_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    code, _, err = _run_cli(["score", str(REPO / "examples" / "ncp.jsonl"), "--ray", "local", "-o",
                             str(tmp_path / "out.jsonl")], capsys)
    assert code == 2
    assert re.match(re.escape("error: fastnli.distributed needs Ray Data: pip install 'fastnli[ray]' ("), err), err


# -- a missing local path is not a hub id ----------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "is_path"), [
    ("./artifacts/dlm", True), ("/abs/model", True), ("~/models/x", True), ("../x", True), ("a/b/c", True),
    ("artifacts\\dlm", True), ("C:\\models\\x", True), ("dir/", True),
    ("microsoft/deberta-large-mnli", False), ("roberta-large-mnli", False),
])
def test_looks_like_local_path(name: str, is_path: bool) -> None:
    assert looks_like_local_path(name) is is_path


def test_missing_local_path_says_it_does_not_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    expected = (f"model './no/such/model' does not exist: {tmp_path}/no/such/model is not a file or directory (a "
                "name that starts with '.', '/' or '~' is a local path; a HF hub id reads 'org/name'); check the "
                "path, or export a model with `fastnli export MODEL --out DIR`")
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(expected)}$"):
        NLIEngine.from_pretrained("./no/such/model")


def test_cli_missing_local_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    code, _, err = _run_cli(["info", "--model", str(missing)], capsys)
    assert code == 2
    assert err.startswith(f"error: model '{missing}' does not exist: {missing} is not a file or directory (")


# -- the INT8 gate explains itself -----------------------------------------------------------------------------------

@pytest.fixture
def art_int8_below_gate(tmp_path: Path) -> Path:
    """The default model's artifact with an fp32 entry (the same graph) and INT8 agreement 0.944 < the 98% gate."""
    art = tmp_path / "art"
    art.mkdir()
    for f in DEFAULT_MODEL_DIR.iterdir():
        if f.name != "manifest.json":
            (art / f.name).symlink_to(f)
    (art / "model_fp32.onnx").symlink_to(DEFAULT_MODEL_DIR / "model_int8.onnx")
    m = json.loads((DEFAULT_MODEL_DIR / "manifest.json").read_text())
    m["precisions"]["int8"]["validation"]["argmax_agreement"] = 0.944
    m["precisions"]["fp32"] = {**m["precisions"]["int8"], "file": "model_fp32.onnx", "recipe": {},
                               "validation": None}
    (art / "manifest.json").write_text(json.dumps(m))
    return art


BELOW_GATE = ("picked over int8: the INT8 graph's argmax agreement with fp32 on the probe set is 0.9440 (94.4%), "
              "below the 98% gate (fastnli.engine.INT8_MIN_AGREEMENT); precision int8 runs it anyway")


def test_cpu_precision_choice_reasons(art_int8_below_gate: Path) -> None:
    manifest = read_manifest(art_int8_below_gate)
    assert cpu_precision_choice(manifest) == ("fp32", BELOW_GATE)
    manifest.precisions["int8"].validation.argmax_agreement = 0.99  # type: ignore[union-attr]
    assert cpu_precision_choice(manifest) == ("int8", "the INT8 graph's argmax agreement with fp32 on the probe set "
                                              "is 0.9900 (99.0%), at least the 98% gate "
                                              "(fastnli.engine.INT8_MIN_AGREEMENT)")
    assert cpu_precision_choice(read_manifest(DEFAULT_MODEL_DIR), embedded=True) == ("int8", EMBEDDED_INT8_REASON)
    assert EMBEDDED_INT8_REASON == ("the embedded model's shipped precision (quality gate: "
                                    "tools/default_model/quality.json / MODEL_CARD.md)")


def test_info_says_why_fp32_over_int8(art_int8_below_gate: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run_cli(["info", "--model", str(art_int8_below_gate), "--device", "cpu"], capsys)
    assert code == 0
    assert f"precision fp32: {BELOW_GATE}\n" in out


def test_info_names_the_embedded_models_gate(capsys: pytest.CaptureFixture[str]) -> None:
    """The embedded model's precision, window policy (its manifest's: ``window_choice`` and ``contradiction_choice``
    may move the thresholds) and scorer inputs, each with where it comes from."""
    policy = read_manifest(DEFAULT_MODEL_DIR).window_policy
    assert policy is not None and policy["max_window_tokens"] == 128
    bar = policy.get("contradiction_threshold")
    rows = "the best-entailment window's" + ("" if bar is None else ", or when none supports the most contradicting "
                                            f"one's with P(contradiction) > {bar}")
    if policy.get("fallback") == "neutral":
        rows += ", or when none supports or contradicts the most neutral one's"
    code, out, _ = _run_cli(["info", "--device", "cpu"], capsys)
    assert code == 0
    assert out.endswith("precision int8: the embedded model's shipped precision (quality gate: "
                        "tools/default_model/quality.json / MODEL_CARD.md)\nlong documents (CaLM, ALCE, grounding, "
                        "long_premise='chunk'): windows of at most 128 tokens, 64 tokens of overlap; support when read "
                        f"in windows: P(entailment) > {policy['entailment_threshold']:g}; three-way row: {rows} (the "
                        "manifest's window policy)\nscorer inputs by default: question-aware yes, units aligned yes "
                        "(the manifest's question_format and align_units)\n")


def test_int8_below_the_gate_warns(art_int8_below_gate: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.clear()
    engine = NLIEngine.from_pretrained(art_int8_below_gate, device="cpu", precision="int8")
    assert engine.precision == "int8" and engine.precision_reason == "asked for (precision='int8')"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"precision='int8': the INT8 graph of {art_int8_below_gate} agreed with fp32 on 0.9440 (94.4%) of the probe "
        "set's argmax labels, below the 98% gate (fastnli.engine.INT8_MIN_AGREEMENT) that precision='auto' applies; "
        "its scores may differ from fp32 (precision='fp32' or 'auto' runs the fp32 graph)"]


def test_int8_on_the_embedded_model_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.clear()
    NLIEngine.from_pretrained(device="cpu", precision="int8")
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


# -- the basics of the CLI -------------------------------------------------------------------------------------------

def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"fastnli {fastnli.__version__}\n"


def test_top_level_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":mod:" not in out
    assert DESCRIPTION == ("fastnli: fast NLI consistency checks of LLM output. Commands: export, checkpoint, "
                           "predict, info, score, calm, alce, grounding, serve; `fastnli COMMAND --help` for each.")


def test_checkpoint_help_covers_every_option() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    checkpoint = sub.choices["checkpoint"]
    undocumented = [a.dest for a in checkpoint._actions if not a.help]
    assert undocumented == []


def test_bad_scorers_are_refused_before_the_input_or_model(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    def no_model(_args: object) -> None:
        raise AssertionError("the model must not load")

    monkeypatch.setattr("fastnli.cli.score.engine_from_args", no_model)
    code, _, err = _run_cli(["score", "no-such-input.jsonl", "--scorers", "ncp,entailment"], capsys)
    assert code == 2
    assert err == ("error: --scorers 'ncp,entailment': unknown ncp; choose from noncontradiction,entailment,"
                   "semantic_negentropy,semantic_sets_confidence\n")


def test_use_best_without_semantic_scorer_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("fastnli.cli.score.engine_from_args", lambda _args: None)
    code, _, err = _run_cli(["score", "no-such-input.jsonl", "--use-best", "--scorers", "noncontradiction"], capsys)
    assert code == 2
    assert err == ("error: --use-best needs a semantic scorer (semantic_negentropy or semantic_sets_confidence) in "
                   "--scorers: the best response is picked from the semantic clusters; add one (e.g. --scorers "
                   "noncontradiction,semantic_negentropy) or drop --use-best\n")


def test_score_use_best_without_semantic_scorer_warns(caplog: pytest.LogCaptureFixture) -> None:
    caplog.clear()
    best = fastnli.score(["Lyon"], [["Paris", "Paris", "Paris, France"]], use_best=True)
    plain = fastnli.score(["Lyon"], [["Paris", "Paris", "Paris, France"]])
    assert best[0].noncontradiction == plain[0].noncontradiction and best[0].best_response is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "use_best" in r.getMessage()]
    assert warnings == ["use_best=True has no effect without a semantic scorer (semantic_negentropy or "
                        "semantic_sets_confidence in scorers): the best response comes from the semantic clusters, "
                        "so each response is scored as given (uqlm's BlackBoxUQ ignores it the same way)"]


def test_use_best_example_of_the_docs() -> None:
    """docs/scorers.md: with a semantic scorer, use_best=True scores the cluster lead ("Paris") against the other
    texts, as uqlm's BlackBoxUQ (default use_best=True); the default scores "Lyon" as given."""
    args = {"responses": ["Lyon"], "sampled_responses": [["Paris", "Paris", "Paris, France"]],
            "scorers": ("noncontradiction", "semantic_negentropy")}
    plain, best = fastnli.score(**args)[0], fastnli.score(**args, use_best=True)[0]  # type: ignore[arg-type]
    swapped = fastnli.score(["Paris"], [["Lyon", "Paris", "Paris, France"]])[0]
    assert plain.best_response is None and best.best_response == "Paris"
    assert best.noncontradiction == pytest.approx(swapped.noncontradiction, abs=1e-6)
    assert best.noncontradiction > plain.noncontradiction  # type: ignore[operator]


def test_predict_lines_carry_the_label(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.jsonl"
    assert main(["predict", str(REPO / "examples" / "pairs.jsonl"), "-o", str(out), "--device", "cpu"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines
    for rec in lines:
        probs = [rec["contradiction"], rec["neutral"], rec["entailment"]]
        assert rec["label"] == ("contradiction", "neutral", "entailment")[int(np.argmax(probs))]


# -- input text ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("pairs", "expected"), [
    ([("\ud800", "x")], "pairs[0][0] (premise) is not valid UTF-8 text (lone surrogate at position 0)"),
    ([("ok", "ok"), ("Café", "a\udfffb")], "pairs[1][1] (hypothesis) is not valid UTF-8 text (lone surrogate at "
                                          "position 1)"),
    (("é\ud800", "x"), "pairs[0] (premise) is not valid UTF-8 text (lone surrogate at position 1)"),
])
def test_lone_surrogate_names_index_and_field(pairs: object, expected: str) -> None:
    engine = NLIEngine.from_pretrained(device="cpu")
    message = f"{expected}; decode the source bytes with errors='replace' (or remove the character) before scoring"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        engine.predict(pairs)  # type: ignore[arg-type]


# -- the repository's basics -----------------------------------------------------------------------------------------

def test_license_is_the_apache_text() -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert 'license-files = ["LICENSE"]' in (REPO / "pyproject.toml").read_text()


@pytest.mark.slow
def test_ncp_example_runs(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(REPO / "examples" / "ncp_example.py")], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    rows = [json.loads(line) for line in (REPO / "examples" / "ncp.jsonl").read_text().splitlines() if line.strip()]
    assert len(lines) == len(rows) + 1
    for line, row in zip(lines, rows):
        assert re.match(rf"{re.escape(row['case'])} +NCP [01]\.\d{{3}}  entailment [01]\.\d{{3}}  ", line), line
    assert re.match(rf"{len(rows)} responses, \d+ unique pairs on (cpu|cuda)/\w+ in ", lines[-1]), lines[-1]
