"""The candidate comparison tool (tools/default_model/candidates.py): the reading settings it gives each graph, its
table, and its refusals; the measurements themselves are the tested tools it calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fastnli.engine.manifest import MANIFEST_NAME, checkpoint_hash
from tools.default_model import candidates
from tools.default_model.weights_delta import WEIGHTS

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "fastnli" / "models" / "default"


def test_read_like_copies_the_reading_settings_and_keeps_the_rest(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"artifact_hash": "a" * 64, "align_units": False}))
    settings = candidates.read_like(tmp_path, DEFAULT_MODEL)
    shipped = json.loads((DEFAULT_MODEL / MANIFEST_NAME).read_text())
    assert settings == {k: shipped[k] for k in candidates.READING}
    assert json.loads((tmp_path / MANIFEST_NAME).read_text()) == {"artifact_hash": "a" * 64, **settings}


def test_table_gives_each_candidate_its_difference_from_the_base() -> None:
    results = {"base": {"nli: snli/dev": 0.8472, "long: neutral_kept 40": 0.688},
               "mix": {"nli: snli/dev": 0.8481, "long: neutral_kept 40": 0.688},
               "tuned": {"nli: snli/dev": 0.8470}}
    assert candidates.render(results, "base").splitlines() == [
        "| figure | base | mix | tuned |", "|---|---|---|---|",
        "| nli: snli/dev | 0.8472 | 0.8481 (+0.0009) | 0.8470 (-0.0002) |",
        "| long: neutral_kept 40 | 0.6880 | 0.6880 (+0.0000) | n/a |"]


def test_main_measures_each_checkpoint_once_and_writes_the_table(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    exported: list[str] = []

    def export(checkpoint: Path, artifact: Path, precisions: tuple[str, ...]) -> None:
        assert precisions == ("fp32",)
        exported.append(checkpoint.name)
        artifact.mkdir(parents=True)
        (artifact / MANIFEST_NAME).write_text(json.dumps({"artifact_hash": checkpoint.name,
                                                          "source_hash": checkpoint_hash(checkpoint)}))

    def figures(artifact: Path, rows: list[dict[str, Any]], data: Path, documents: bool) -> dict[str, float]:
        manifest = json.loads((artifact / MANIFEST_NAME).read_text())
        assert set(candidates.READING) <= set(manifest) and rows == [{"row": 1}] and not documents
        return {"nli: snli/dev": {"ck-base": 0.5, "ck-mix": 0.75}[manifest["artifact_hash"]]}

    monkeypatch.setattr("fastnli.exporter.export", export)
    monkeypatch.setattr(candidates, "figures", figures)
    rows = tmp_path / "dev.jsonl"
    rows.write_text('{"row": 1}\n')
    for name in ("ck-base", "ck-mix"):
        (tmp_path / name).mkdir()
        (tmp_path / name / WEIGHTS).write_bytes(name.encode())
    out = tmp_path / "out"
    (out / "mix").mkdir(parents=True)  # a graph already there, from the same checkpoint, is reused, not exported again
    (out / "mix" / MANIFEST_NAME).write_text(json.dumps({"artifact_hash": "ck-mix",
                                                         "source_hash": checkpoint_hash(tmp_path / "ck-mix")}))
    argv = ["--rows", str(rows), "--out", str(out), f"base={tmp_path / 'ck-base'}", f"mix={tmp_path / 'ck-mix'}"]
    assert candidates.main(argv) == 0
    assert exported == ["ck-base"]
    record = json.loads((out / "candidates.json").read_text())
    assert record["base"] == "base" and record["figures"] == {"base": {"nli: snli/dev": 0.5},
                                                              "mix": {"nli: snli/dev": 0.75}}
    assert "| nli: snli/dev | 0.5000 | 0.7500 (+0.2500) |" in (out / "candidates.md").read_text()


def test_main_reuses_figures_of_the_same_weights_and_measures_changed_ones(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """A second run over the same --out measures only what changed: the base's graph and figures are reused while its
    checkpoint's hash and the run's rows, data and --documents match; new weights under a known name are exported
    again and measured on their own graph."""
    measured: list[str] = []

    def export(checkpoint: Path, artifact: Path, precisions: tuple[str, ...]) -> None:
        artifact.mkdir(parents=True, exist_ok=True)
        (artifact / MANIFEST_NAME).write_text(json.dumps({"source_hash": checkpoint_hash(checkpoint),
                                                          "weights": (checkpoint / WEIGHTS).read_text()}))

    def figures(artifact: Path, rows: list[dict[str, Any]], data: Path, documents: bool) -> dict[str, float]:
        weights = json.loads((artifact / MANIFEST_NAME).read_text())["weights"]  # what the graph was exported from
        measured.append(weights)
        return {"nli: snli/dev": len(weights) / 10}

    monkeypatch.setattr("fastnli.exporter.export", export)
    monkeypatch.setattr(candidates, "figures", figures)
    rows = tmp_path / "dev.jsonl"
    rows.write_text('{"row": 1}\n')
    for name, weights in (("base", "base"), ("tuned", "tuned")):
        (tmp_path / name).mkdir()
        (tmp_path / name / WEIGHTS).write_text(weights)
    out = tmp_path / "out"
    argv = ["--rows", str(rows), "--out", str(out), f"base={tmp_path / 'base'}", f"tuned={tmp_path / 'tuned'}"]
    assert candidates.main(argv) == 0 and measured == ["base", "tuned"]
    (tmp_path / "tuned" / WEIGHTS).write_text("tuned again")  # trained anew under the same name
    assert candidates.main(argv) == 0 and measured == ["base", "tuned", "tuned again"]
    assert json.loads((out / "candidates.json").read_text())["figures"] == {"base": {"nli: snli/dev": 0.4},
                                                                            "tuned": {"nli: snli/dev": 1.1}}
    assert candidates.main([*argv, "--documents"]) == 0  # other figures asked for: everything is measured
    assert measured[3:] == ["base", "tuned again"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--rows", "a/test.jsonl", "--out", "o", "b=x"],
     "--rows a/test.jsonl: candidates are compared on the dev part; the test part is never used to choose"),
    (["--rows", "a/dev.jsonl", "--out", "o", "b=x", "x"], "give each checkpoint as NAME=CHECKPOINT"),
    (["--rows", "a/dev.jsonl", "--out", "o", "b=x", "b=y"], "give each checkpoint as NAME=CHECKPOINT"),
])
def test_main_refuses_the_test_part_and_unnamed_checkpoints(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                            message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        candidates.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err
