"""Artifacts are verified, never trusted blindly: a tampered, truncated or out-of-directory graph is refused, a damaged
export-cache entry is rebuilt, and folders left by interrupted exports are removed."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fastnli.engine.manifest as manifest_mod
from fastnli.engine import NLIEngine, read_manifest
from fastnli.engine.engine import resolve_artifact
from fastnli.engine.manifest import verify_graph


@pytest.fixture
def art(art_v1: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny artifact, fp32 only (cheap to damage)."""
    out = tmp_path / "art"
    shutil.copytree(art_v1, out)
    return out


def _graph(art: Path) -> Path:
    return art / read_manifest(art).precisions["fp32"].file


def test_a_tampered_graph_is_refused(art: Path) -> None:
    graph = _graph(art)
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other content
    graph.write_bytes(bytes(data))
    want = read_manifest(art).precisions["fp32"].sha256
    with pytest.raises(ValueError, match=re.escape(f"but the manifest records {want[:16]}…: the graph was changed "
                                                   "after export, so its results would not be the artifact's; "
                                                   "re-export the model (`fastnli export`)")):
        NLIEngine.from_pretrained(art, device="cpu", precision="fp32")


def test_a_truncated_graph_is_refused(art: Path) -> None:
    graph = _graph(art)
    size = graph.stat().st_size
    with open(graph, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(ValueError, match=re.escape(f"{graph} is {size // 2} bytes but the manifest records "
                                                   f"{size}: the graph was truncated or replaced after export")):
        NLIEngine.from_pretrained(art, device="cpu", precision="fp32")


@pytest.mark.parametrize("name", ["/etc/hostname", "../outside.onnx", "sub/../../outside.onnx"])
def test_manifest_paths_outside_the_artifact_are_refused(art: Path, name: str) -> None:
    outside = art.parent / "outside.onnx"
    shutil.copy(_graph(art), outside)
    data = json.loads((art / "manifest.json").read_text())
    data["precisions"]["fp32"]["file"] = name
    (art / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=re.escape(f"precision 'fp32' names {name!r}, which is outside the artifact "
                                                   "directory")):
        read_manifest(art)


def test_a_verified_graph_is_hashed_once_per_version(art: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    real = manifest_mod.sha256_file

    def counting(path: Path) -> str:
        calls.append(Path(path))
        return real(path)

    monkeypatch.setattr(manifest_mod, "sha256_file", counting)
    entry = read_manifest(art).precisions["fp32"]
    for _ in range(3):
        verify_graph(art, entry)
    assert len(calls) == 1
    os.utime(_graph(art), ns=(time.time_ns(), time.time_ns() + 10**9))  # a new modification time: hashed again
    verify_graph(art, entry)
    assert len(calls) == 2


def test_a_damaged_cache_entry_is_rebuilt(ckpt_v1: Path, art_v1: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    export_mod = importlib.import_module("fastnli.exporter.export")  # the package re-exports a function of that name
    exports: list[Path] = []

    def fake_export(ckpt: Path, target: Path, **_: object) -> None:  # the real export of ckpt_v1 is art_v1
        exports.append(Path(target))
        shutil.copytree(art_v1, target)

    monkeypatch.setattr(export_mod, "export", fake_export)
    target = resolve_artifact(ckpt_v1, tmp_path)
    assert exports == [target] and resolve_artifact(ckpt_v1, tmp_path) == target and len(exports) == 1
    graph = _graph(target)
    with open(graph, "r+b") as f:
        f.truncate(100)
    assert resolve_artifact(ckpt_v1, tmp_path) == target and len(exports) == 2  # rebuilt, not failing forever
    verify_graph(target, read_manifest(target).precisions["fp32"])
    (target / "manifest.json").write_text("{not json")
    assert resolve_artifact(ckpt_v1, tmp_path) == target and len(exports) == 3
    NLIEngine(target, device="cpu", precision="fp32")


def test_leftovers_of_interrupted_exports_are_removed(tmp_path: Path) -> None:
    from fastnli.exporter.export import clean_leftovers

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)
    names = {"dead": f".m.partial-{dead}-0123abcd", "live": f".m.partial-{os.getpid()}-0123abcd",
             "old_unnamed": ".m.partial-89abcdef", "new_unnamed": ".m.old-89abcdef", "dead_old": f".m.old-{dead}-aa11bb22",
             "artifact": "m", "other": ".m.partial-notours"}
    for name in names.values():
        (tmp_path / name).mkdir()
    day_ago = time.time() - 2 * 24 * 3600
    os.utime(tmp_path / names["old_unnamed"], (day_ago, day_ago))
    removed = {p.name for p in clean_leftovers(tmp_path)}
    assert removed == {names["dead"], names["old_unnamed"], names["dead_old"]}
    assert {p.name for p in tmp_path.iterdir()} == {names["live"], names["new_unnamed"], names["artifact"],
                                                    names["other"]}
