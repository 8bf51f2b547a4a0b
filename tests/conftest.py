"""Shared fixtures: seeded tiny checkpoints with the real DeBERTa architectures, and their exports (no hub)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("optimum.exporters.onnx")

from fastnli.engine import export  # noqa: E402
from fastnli.synthetic import build_checkpoint  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "nli-data"

RAGGED_PAIRS = [
    ("A man is playing a guitar on stage.", "A man is performing music."),
    ("Paris", "Lyon"),
    ("", "The dog runs."),
    ("The team won the final match and the city celebrated all night long.", "The team lost."),
    ("Café crème à Genève — naïve façade.", "東京は日本の首都です。"),
    ("yes", "no"),
    ("Two children visits the museum during the summer and paints a large house.", ""),
]


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fastnli")


@pytest.fixture(scope="session")
def ckpt_v1(workdir: Path) -> Path:
    return build_checkpoint(workdir / "ck_v1", arch="deberta", size="tiny", seed=0)


@pytest.fixture(scope="session")
def ckpt_v2(workdir: Path) -> Path:
    return build_checkpoint(workdir / "ck_v2", arch="deberta-v2", size="tiny", seed=1, label_order="cen")


@pytest.fixture(scope="session")
def art_v1(ckpt_v1: Path, workdir: Path) -> Path:
    export(ckpt_v1, workdir / "art_v1")
    return workdir / "art_v1"


@pytest.fixture(scope="session")
def art_v2(ckpt_v2: Path, workdir: Path) -> Path:
    export(ckpt_v2, workdir / "art_v2")
    return workdir / "art_v2"


def torch_probs(ckpt: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    """PyTorch fp32, one pair at a time (no padding), canonical order (contradiction, neutral, entailment)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from fastnli.engine.labels import canonical_columns

    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForSequenceClassification.from_pretrained(ckpt).eval()
    cols = canonical_columns(model.config.id2label)
    rows = []
    with torch.inference_mode():
        for p, h in pairs:
            # Batched form, as uqlm calls it: transformers' single-pair form drops an empty hypothesis.
            enc = tok([p], [h], truncation="longest_first", max_length=512, return_tensors="pt")
            rows.append(torch.softmax(model(**enc).logits, -1)[0].numpy()[cols])
    return np.stack(rows)


@pytest.fixture(autouse=True)
def _fastnli_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fastnli")
