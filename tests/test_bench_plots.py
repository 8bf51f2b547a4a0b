"""The bench's plot data (speed-up over uqlm, roofline shares per precision) and its no-install rule.

The plot data functions are checked on reports built here and on the stored ``bench/results/bench.json``; the
drawings only for being written (PNG signature), not for their pixels.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import plots
from bench.__main__ import main
from bench.plots import RooflineBar, roofline_data, speedup_data

STORED = Path(__file__).resolve().parents[1] / "bench" / "results" / "bench.json"
PNG = b"\x89PNG\r\n\x1a\n"


def _row(workload: str, backend: str, seconds: float, uqlm_seconds: float | None, gflops: float,
         peak: str | None, peaks: dict[str, float]) -> dict[str, Any]:
    return {"workload": workload, "backend": backend, "seconds": seconds,
            "ratio_vs_uqlm": uqlm_seconds / seconds if uqlm_seconds else None, "effective_gflops": gflops,
            "roofline_share": gflops / peaks[peak] if peak else None, "peak_precision": peak}


PEAKS = {"fp32": 200.0, "int8": 800.0}
REPORT = {
    "peaks_gflops": PEAKS,
    "machine": {"cpu": "AMD EPYC", "cores": 2, "onnxruntime": "1.31.1"},
    "rows": [
        _row("short", "uqlm", 80.0, 80.0, 80.0, "fp32", PEAKS),
        _row("short", "fastnli-fp32-cpu", 40.0, 80.0, 160.0, "fp32", PEAKS),
        _row("short", "fastnli-int8-cpu", 16.0, 80.0, 400.0, "int8", PEAKS),
        _row("long", "uqlm", 90.0, 90.0, 50.0, "fp32", PEAKS),
        _row("long", "fastnli-int8-cpu", 18.0, 90.0, 250.0, "int8", PEAKS),
        _row("long", "fastnli-fp16-cuda", 3.0, 90.0, 1500.0, None, PEAKS),  # no GPU peak measured
    ],
}


def test_speedup_data_per_workload_and_backend() -> None:
    assert speedup_data(REPORT) == {
        "short": {"fastnli-fp32-cpu": 2.0, "fastnli-int8-cpu": 5.0},
        "long": {"fastnli-int8-cpu": 5.0, "fastnli-fp16-cuda": 30.0},
    }


def test_roofline_data_groups_each_precision_against_its_own_peak() -> None:
    groups = roofline_data(REPORT)
    assert list(groups) == ["fp32", "int8"]
    assert groups["fp32"] == [RooflineBar("short / uqlm", 0.4, 80.0), RooflineBar("short / fastnli-fp32-cpu", 0.8, 160.0),
                              RooflineBar("long / uqlm", 0.25, 50.0)]
    assert groups["int8"] == [RooflineBar("short / fastnli-int8-cpu", 0.5, 400.0),
                              RooflineBar("long / fastnli-int8-cpu", 0.3125, 250.0)]
    # INT8 is faster though its share is lower: the two shares are of different peaks, never on one axis
    assert groups["int8"][0].share < groups["fp32"][1].share and groups["int8"][0].gflops > groups["fp32"][1].gflops


def test_the_stored_run_has_both_plots_data() -> None:
    report = json.loads(STORED.read_text())
    speedups = speedup_data(report)
    assert set(speedups) == {"short", "long"}
    for per_backend in speedups.values():
        assert set(per_backend) == {"pytorch-fp32-b32", "fastnli-fp32-cpu", "fastnli-int8-cpu"}
        assert per_backend["fastnli-int8-cpu"] > per_backend["fastnli-fp32-cpu"] > 1.0
    groups = roofline_data(report)  # written before rows named their peak: read from the backend
    assert set(groups) == {"fp32", "int8"}
    assert all("int8" in b.label for b in groups["int8"]) and not any("int8" in b.label for b in groups["fp32"])
    for precision, bars in groups.items():
        for bar in bars:
            assert bar.share == pytest.approx(bar.gflops / report["peaks_gflops"][precision])


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    assert plots.plot_speedup(REPORT, tmp_path / "speedup.png") == tmp_path / "speedup.png"
    assert plots.plot_roofline(REPORT, tmp_path / "roofline.png") == tmp_path / "roofline.png"
    assert (tmp_path / "speedup.png").read_bytes()[:8] == PNG == (tmp_path / "roofline.png").read_bytes()[:8]

    stored = tmp_path / "stored"
    stored.mkdir()
    (stored / "bench.json").write_text(STORED.read_text())
    assert plots.main([str(stored / "bench.json")]) == 0
    assert sorted(p.name for p in stored.glob("*.png")) == ["roofline.png", "speedup.png"]


def test_missing_data_draws_nothing_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    without_uqlm = {"peaks_gflops": PEAKS, "rows": [
        _row("short", "fastnli-int8-cpu", 16.0, None, 400.0, "int8", PEAKS)]}
    with caplog.at_level(logging.WARNING, logger="fastnli"):
        assert plots.plot_speedup(without_uqlm, tmp_path / "speedup.png") is None
        assert plots.plot_roofline({"rows": [REPORT["rows"][-1]]}, tmp_path / "roofline.png") is None
    assert speedup_data(without_uqlm) == {} and not list(tmp_path.iterdir())
    assert "no speed-up plot: the report has no rows measured against uqlm (was uqlm skipped?)" in caplog.text
    assert "no roofline plot: no row of the report has a share of a measured peak" in caplog.text


def test_bench_installs_nothing_without_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "no-venv"
    monkeypatch.setenv("FASTNLI_UQLM_VENV", str(venv))

    def no_subprocess(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"the bench started a process without --install-uqlm: {args}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["--quick", "--out", str(out)])
    assert str(exc.value) == (
        f"python -m bench: the uqlm backend runs uqlm in its own venv, and {venv} holds no complete one. The bench "
        "installs nothing by itself: pass --install-uqlm to build it there (pip installs torch and uqlm, about a "
        "minute, needs the package registry), set FASTNLI_UQLM_VENV to an existing one, or leave uqlm out with "
        "--skip uqlm")
    assert not venv.exists() and not out.exists(), "nothing may be created before the check"


def test_the_flag_builds_and_a_skipped_uqlm_needs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import __main__ as bench_main
    from bench import uqlm_peer

    monkeypatch.setenv("FASTNLI_UQLM_VENV", str(tmp_path / "no-venv"))
    built: list[Path | None] = []

    def fake_ensure(path: Path | None = None, **kwargs: Any) -> Path:
        built.append(path)
        return tmp_path / "built" / "bin" / "python"

    monkeypatch.setattr(uqlm_peer, "ensure_uqlm_env", fake_ensure)
    assert bench_main.uqlm_python(["torch", "fastnli-int8"], install=False) is None
    assert bench_main.uqlm_python(["uqlm", "torch"], install=True) == tmp_path / "built" / "bin" / "python"
    assert built == [None]
    with pytest.raises(SystemExit, match=re.escape("pass --install-uqlm to build it there")):
        bench_main.uqlm_python(["uqlm"], install=False)
