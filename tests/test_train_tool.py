"""The training tool's loss terms (tools/train_default_model.py), checked against their formulas written out."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

TOOL = Path(__file__).resolve().parents[1] / "tools" / "train_default_model.py"


@pytest.fixture(scope="module")
def tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("train_default_model", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def _softmax(z: list[float]) -> list[float]:
    e = [math.exp(v - max(z)) for v in z]
    return [v / sum(e) for v in e]


def test_rdrop_loss_is_cross_entropy_plus_half_the_symmetric_kl(tool) -> None:  # type: ignore[no-untyped-def]
    first = [[2.0, -1.0, 0.5], [0.1, 0.2, 0.3]]
    second = [[1.0, 0.0, 0.0], [-0.5, 1.5, 0.3]]
    labels = [0, 2]
    logits = torch.tensor(first + second, dtype=torch.float64)
    got = float(tool.rdrop_loss(logits, torch.tensor(labels), alpha=0.7, label_smoothing=0.0))
    ce = [-math.log(_softmax(row)[y]) for row, y in zip(first + second, labels + labels)]
    kl = [_kl(_softmax(a), _softmax(b)) + _kl(_softmax(b), _softmax(a)) for a, b in zip(first, second)]
    want = sum(ce) / len(ce) + 0.7 * (sum(kl) / len(kl)) / 2
    assert got == pytest.approx(want, rel=1e-12)


def test_rdrop_loss_of_identical_passes_is_the_plain_loss(tool) -> None:  # type: ignore[no-untyped-def]
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.1, 0.2, 0.3]], dtype=torch.float64)
    labels = torch.tensor([1, 0])
    plain = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.05)
    got = tool.rdrop_loss(torch.cat([logits, logits]), labels, alpha=5.0, label_smoothing=0.05)
    assert float(got) == pytest.approx(float(plain), rel=1e-12)


def test_distillation_loss_is_t_squared_kl_teacher_to_student(tool) -> None:  # type: ignore[no-untyped-def]
    student, teacher, t = [[0.3, -0.2, 1.0]], [[1.2, 0.1, -0.4]], 2.0
    got = float(tool.distillation_loss(torch.tensor(student, dtype=torch.float64),
                                       torch.tensor(teacher, dtype=torch.float64), t))
    want = t * t * _kl(_softmax([v / t for v in teacher[0]]), _softmax([v / t for v in student[0]]))
    assert got == pytest.approx(want, rel=1e-12)
