"""Shared fixtures: seeded tiny checkpoints with the real DeBERTa architectures, and their exports (no hub)."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from fastnli.exporter import export
from fastnli.exporter.checkpoint import build_checkpoint

# Property tests check behaviour, never speed: no per-example deadline (the machines are shared and timings noisy).
settings.register_profile("fastnli", deadline=None)
settings.load_profile("fastnli")


def _need_export_extra() -> None:
    """Skip a test that builds or exports checkpoints when the export extra (torch, optimum-onnx) is missing."""
    pytest.importorskip("torch")
    pytest.importorskip("optimum.exporters.onnx")


def _shared_data() -> Path:
    """``../shared/nli-data`` beside the repository: ``$FASTNLI_NLI_DATA``, else beside this checkout, else beside
    the repository it was cloned from (CI runs on a clone made elsewhere)."""
    if os.environ.get("FASTNLI_NLI_DATA"):
        return Path(os.environ["FASTNLI_NLI_DATA"])
    repo = Path(__file__).resolve().parents[1]
    here = repo.parent / "shared" / "nli-data"
    if here.is_dir():
        return here
    try:
        origin = subprocess.run(["git", "-C", str(repo), "config", "--get", "remote.origin.url"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        origin = ""
    if origin and Path(origin).is_dir():
        return Path(origin).resolve().parent / "shared" / "nli-data"
    return here


SHARED_DATA = _shared_data()

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
    _need_export_extra()
    return build_checkpoint(workdir / "ck_v1", arch="deberta", size="tiny", seed=0)


@pytest.fixture(scope="session")
def ckpt_v2(workdir: Path) -> Path:
    _need_export_extra()
    return build_checkpoint(workdir / "ck_v2", arch="deberta-v2", size="tiny", seed=1, label_order="cen")


@pytest.fixture(scope="session")
def ckpt_bert(workdir: Path) -> Path:
    """A tiny BERT, the embedded default model's architecture."""
    _need_export_extra()
    return build_checkpoint(workdir / "ck_bert", arch="bert", size="tiny", seed=3)


@pytest.fixture(scope="session")
def art_bert(ckpt_bert: Path, workdir: Path) -> Path:
    export(ckpt_bert, workdir / "art_bert", precisions=("fp32", "int8"))
    return workdir / "art_bert"


@pytest.fixture(scope="session")
def art_v1(ckpt_v1: Path, workdir: Path) -> Path:
    export(ckpt_v1, workdir / "art_v1", precisions=("fp32", "fp16", "int8"))
    return workdir / "art_v1"


@pytest.fixture(scope="session")
def art_v2(ckpt_v2: Path, workdir: Path) -> Path:
    export(ckpt_v2, workdir / "art_v2", precisions=("fp32", "fp16", "int8"))
    return workdir / "art_v2"


def torch_probs(ckpt: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    """PyTorch fp32, one pair at a time (no padding), canonical order (contradiction, neutral, entailment)."""
    import torch
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


# --- uqlm parity / adapter (tests/test_uqlm_parity.py, tests/test_uqlm_adapter.py): fp32-only exports, and a
# DeBERTa-v2 checkpoint in uqlm's label order (uqlm reads probabilities as C/N/E whatever the config says).


@pytest.fixture(scope="session")
def art_v1_fp32(ckpt_v1: Path, workdir: Path) -> Path:
    export(ckpt_v1, workdir / "art_v1_fp32", precisions=("fp32",))
    return workdir / "art_v1_fp32"


@pytest.fixture(scope="session")
def art_v2_fp32(ckpt_v2: Path, workdir: Path) -> Path:
    export(ckpt_v2, workdir / "art_v2_fp32", precisions=("fp32",))
    return workdir / "art_v2_fp32"


@pytest.fixture(scope="session")
def ckpt_v2_cne(workdir: Path) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("optimum.exporters.onnx")
    return build_checkpoint(workdir / "ck_v2_cne", arch="deberta-v2", size="tiny", seed=2, label_order="cne")


@pytest.fixture(scope="session")
def art_v2_cne(ckpt_v2_cne: Path, workdir: Path) -> Path:
    export(ckpt_v2_cne, workdir / "art_v2_cne", precisions=("fp32",))
    return workdir / "art_v2_cne"


def uqlm_qa_workload(seed: int = 20240611) -> tuple[list[str], list[list[str]]]:
    """12 prompts x 5 sampled short QA answers (1-8 words), seeded: heavy duplication, samples identical to the
    response (one prompt: all five), case variants, two long sentences and one empty sample. Every prompt has the
    same number of samples (uqlm normalises entropies with the first prompt's count)."""
    import random

    rng = random.Random(seed)
    pools = [
        ["Paris", "Paris, France", "Lyon", "The capital is Paris"],
        ["1848", "In 1848", "1849", "It was 1848"],
        ["Blue", "blue", "The sky is blue", "Grey"],
        ["Water", "H2O", "It is water", "Ice"],
        ["George Washington", "Washington", "John Adams", "The first president was Washington"],
        ["Yes", "No", "yes", "Maybe"],
        ["Berlin", "Berlin, Germany", "Bonn", "The capital of Germany is Berlin"],
        ["Seven", "7", "Seven continents", "Six"],
        ["The moon", "Moon", "The Sun", "It is the moon"],
        ["Mount Everest", "Everest", "K2", "The tallest mountain is Everest"],
        ["Shakespeare", "William Shakespeare", "Marlowe", "It was written by Shakespeare"],
        ["Oxygen", "O2", "Nitrogen", "The gas is oxygen"],
    ]
    responses = [pool[0] for pool in pools]
    sampled = [[rng.choice(pool if i % 3 == 0 else pool[:2]) for _ in range(5)] for i, pool in enumerate(pools)]
    sampled[0] = ["Paris"] * 5
    sampled[3][2] = ""
    sampled[5] = ["No", "No", "No", "Yes", "no"]
    sampled[7][1] = "There are seven continents on Earth, and Asia is the largest of them by area."
    responses[9] = "Mount Everest, on the border of Nepal and China, is the tallest mountain above sea level."
    return responses, sampled
