"""Export time: the precisions an export writes (the device's, or those asked for), and its stages (logged, timed
into the manifest, shown as rich progress only when asked, never printed)."""

from __future__ import annotations

import importlib
import io
import logging
import re
from pathlib import Path

import pytest

from fastnli.engine import NLIEngine, read_manifest, resolve_artifact
from fastnli.engine.engine import cached_artifact_dir
from fastnli.engine.manifest import DEVICE_PRECISIONS, precisions_for
from fastnli.exporter import export
from fastnli.exporter.attention import SHIFT_RECIPE
from fastnli.exporter.export import export_precisions, planned_stages
from fastnli.exporter.stages import Stages

export_module = importlib.import_module("fastnli.exporter.export")


@pytest.mark.parametrize("device, precision, expected", [
    ("cpu", "auto", ("fp32", "int8")),
    ("cuda", "auto", ("fp32", "fp16")),
    ("cpu", "fp16", ("fp32", "fp16")),
    ("cuda", "int8", ("fp32", "int8")),
    ("cpu", "fp32", ("fp32",)),
])
def test_precisions_for_device_and_precision(device: str, precision: str, expected: tuple[str, ...]) -> None:
    assert precisions_for(device, precision) == expected


def test_precisions_for_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match=re.escape("device='auto' has no precision set; use one of ['cpu', 'cuda'] "
                                                   "(resolve 'auto' first)")):
        precisions_for("auto")
    with pytest.raises(ValueError, match=re.escape("precision='bf16' is not supported; use 'auto' or one of "
                                                   "['fp32', 'fp16', 'int8']")):
        precisions_for("cpu", "bf16")


def test_export_precisions_default_to_the_device_and_honour_what_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export_module, "auto_device", lambda: "cuda")
    assert export_precisions(None) == ["fp32", "fp16"]
    monkeypatch.setattr(export_module, "auto_device", lambda: "cpu")
    assert export_precisions(None) == ["fp32", "int8"]
    assert export_precisions(None, device="cuda") == ["fp32", "fp16"]  # an artifact made here for a GPU
    assert export_precisions(["int8", "fp16"]) == ["fp32", "fp16", "int8"]  # fp32 always, canonical order
    assert export_precisions(["fp16"], device="cpu") == ["fp32", "fp16"]  # asked for beats the device's
    with pytest.raises(ValueError, match=re.escape("precisions=['fp32', 'bf16']: ['bf16'] unknown; choose from "
                                                   "['fp32', 'fp16', 'int8']")):
        export_precisions(["fp32", "bf16"])
    with pytest.raises(TypeError, match=re.escape("precisions='int8' must be a list of names, e.g. ['int8']")):
        export_precisions("int8")
    with pytest.raises(ValueError, match=re.escape("device='tpu' is not supported; use 'auto', 'cpu' or 'cuda'")):
        export_precisions(None, device="tpu")


def test_default_export_on_cpu_writes_fp32_and_int8_with_timed_stages(
        ckpt_v2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(export_module, "auto_device", lambda: "cpu")
    m = export(ckpt_v2, tmp_path / "art")
    assert list(m.precisions) == ["fp32", "int8"]
    assert sorted(p.name for p in (tmp_path / "art").glob("*.onnx")) == ["model_fp32.onnx", "model_int8.onnx"]
    planned = planned_stages(["fp32", "int8"], validate=True)
    assert [s["stage"] for s in m.export_stages] == planned
    assert planned == ["checkpoint hash", "fp32 graph (optimum)", "tokenizer", "int8 graph", "PyTorch fp32 reference",
                       "validate fp32", "validate int8", "hashes + manifest"]
    assert all(s["seconds"] >= 0 and s["cpu_seconds"] >= 0 for s in m.export_stages)
    assert read_manifest(tmp_path / "art").export_stages == m.export_stages  # written to manifest.json
    out, err = capsys.readouterr()
    assert out == "" and err == ""  # no print, no progress bar unless asked
    n = len(planned)
    lines = [r.getMessage() for r in caplog.records if r.name == "fastnli"]
    for k, name in enumerate(planned, 1):
        assert any(re.fullmatch(rf"export of {re.escape(ckpt_v2.name)}: stage {k}/{n} {re.escape(name)} done in "
                                r"\d+\.\d s \(\d+\.\d s of CPU\)", line) for line in lines)


def test_asked_for_precisions_are_exactly_what_is_written(ckpt_v1: Path, tmp_path: Path) -> None:
    m = export(ckpt_v1, tmp_path / "art", precisions=("fp16",), validate=False)
    assert list(m.precisions) == ["fp32", "fp16"]
    assert sorted(p.name for p in (tmp_path / "art").glob("*.onnx")) == ["model_fp16.onnx", "model_fp32.onnx"]
    assert [s["stage"] for s in m.export_stages] == ["checkpoint hash", "fp32 graph (optimum)", "tokenizer",
                                                     "fp16 graph", "hashes + manifest"]


def test_progress_draws_on_the_log_handlers_rich_console(ckpt_v1: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    buf = io.StringIO()
    handler = RichHandler(console=Console(file=buf, force_terminal=False, width=200), show_path=False)
    log = logging.getLogger("fastnli")
    log.addHandler(handler)
    try:
        export(ckpt_v1, tmp_path / "art", precisions=("fp32",), validate=False, progress=True)
    finally:
        log.removeHandler(handler)
    shown = buf.getvalue()
    assert "stage 2/4 fp32 graph (optimum) done in" in shown  # the log lines
    assert re.search(r"export of \S+: hashes \+ manifest.*4/4", shown)  # the bar, finished, on the same console
    assert capsys.readouterr().out == ""


def test_a_stage_not_planned_or_run_twice_is_refused() -> None:
    stages = Stages("t", ["a"])
    with stages.stage("a"):
        pass
    again = re.escape("stage 'a' is not planned or ran already (planned: ['a'])")
    with pytest.raises(ValueError, match=again), stages.stage("a"):
        pass
    with pytest.raises(ValueError, match=re.escape("stage 'b' is not planned")), stages.stage("b"):
        pass
    assert [s["stage"] for s in stages.record()] == ["a"]


def test_a_failing_stage_is_logged_and_raises(caplog: pytest.LogCaptureFixture) -> None:
    stages = Stages("t", ["a", "b"])
    with pytest.raises(RuntimeError, match="boom"), stages.stage("b"):
        raise RuntimeError("boom")
    assert any(re.fullmatch(r"t: stage 2/2 b failed after \d+\.\d s", r.getMessage()) for r in caplog.records)
    assert stages.record() == []


def test_the_cache_exports_what_the_device_needs_and_adds_what_is_missing(
        ckpt_v1: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    eng = NLIEngine.from_pretrained(ckpt_v1, device="cpu", precision="fp32", cache_dir=cache)
    assert set(eng.manifest.precisions) == {"fp32"}
    eng = NLIEngine.from_pretrained(ckpt_v1, device="cpu", cache_dir=cache)  # auto on CPU: int8 is added
    assert set(eng.manifest.precisions) == set(DEVICE_PRECISIONS["cpu"])
    target = resolve_artifact(ckpt_v1, cache, device="cuda")  # an engine for a GPU needs fp16 as well
    assert target == eng.artifact_dir
    assert set(read_manifest(target).precisions) == {"fp32", "fp16", "int8"}

    def no_export(*_a: object, **_k: object) -> None:
        raise AssertionError("exported although the cache had every graph")

    monkeypatch.setattr(export_module, "export", no_export)
    assert resolve_artifact(ckpt_v1, cache, device="cpu", precision="fp16") == target


def test_the_cache_exports_again_a_graph_with_older_attention(ckpt_v1: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "cache"
    target = cached_artifact_dir(ckpt_v1, cache)  # as an earlier fastnli left it: HF's attention graph
    export(ckpt_v1, target, precisions=("fp32",), validate=False, relative_shift=False, position_window=False)
    assert "attention" not in read_manifest(target).precisions["fp32"].recipe
    assert resolve_artifact(ckpt_v1, cache, device="cpu", precision="fp32") == target
    assert read_manifest(target).precisions["fp32"].recipe["attention"] == SHIFT_RECIPE
    assert set(read_manifest(target).precisions) == {"fp32"}  # the precisions it had
    assert any("has an older attention graph (as transformers writes it; this version writes relative shift "
               "(fastnli.exporter.attention)): exporting again" in r.getMessage() for r in caplog.records)

    def no_export(*_a: object, **_k: object) -> None:
        raise AssertionError("exported again although the cached graph is current")

    monkeypatch.setattr(export_module, "export", no_export)
    assert resolve_artifact(ckpt_v1, cache, device="cpu", precision="fp32") == target


def test_cli_export_for_a_gpu_writes_its_graphs_and_prints_the_stages(ckpt_v1: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from fastnli.cli import main

    out = tmp_path / "art"
    assert main(["export", str(ckpt_v1), "--out", str(out), "--device", "cuda", "--no-validate"]) == 0
    assert set(read_manifest(out).precisions) == {"fp32", "fp16"}
    shown = capsys.readouterr().out
    assert "export stages" in shown and "fp16 graph" in shown and "int8 graph" not in shown
    with pytest.raises(SystemExit):
        main(["export", str(ckpt_v1), "--out", str(out), "--device", "tpu"])
