"""Seeded checkpoints: the same seed gives the same files in every process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BUILD = """
import sys
from fastnli.exporter.checkpoint import build_checkpoint
for arch in ("bert", "deberta", "deberta-v2"):
    build_checkpoint(f"{sys.argv[1]}/{arch}", arch=arch, size="tiny", seed=4)
"""


def test_the_same_seed_gives_the_same_bytes_in_another_process(tmp_path: Path) -> None:
    """Two interpreters (other hash seeds: Python's and the tokenizer trainers' hash maps differ) write the same
    tokenizer, weights and config for each architecture: the tests' inputs are the same on every run."""
    pytest.importorskip("torch")
    for run, hash_seed in (("a", "1"), ("b", "2")):
        subprocess.run([sys.executable, "-c", BUILD, str(tmp_path / run)], check=True,
                       env={**os.environ, "PYTHONHASHSEED": hash_seed})
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert {f.parts[0] for f in files} == {"bert", "deberta", "deberta-v2"}
    assert any(f.name == "tokenizer.json" for f in files) and any(f.suffix == ".safetensors" for f in files)
    differ = [str(f) for f in files if (tmp_path / "a" / f).read_bytes() != (tmp_path / "b" / f).read_bytes()]
    assert differ == []
