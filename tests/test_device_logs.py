"""Quiet truth about devices: ``device="auto"`` on a machine without a GPU picks the CPU with an INFO line; a
WARNING only when the user asked for CUDA or a GPU exists and fails. ORT's provider lists and the GPU probe are
monkeypatched, so these run the same on any machine (the model is the embedded default model)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from fastnli.engine import NLIEngine
from fastnli.engine import engine as engine_mod
from fastnli.engine.session import create_session

NO_CUDA_PROVIDER = ("this onnxruntime build has no CUDA execution provider (install onnxruntime-gpu instead of "
                    "onnxruntime: docs/engine.md)")
CUDA_DID_NOT_LOAD = ("the CUDA execution provider could not be loaded (onnxruntime-gpu needs the CUDA and cuDNN "
                     "libraries of its build, and a GPU)")


def _cuda_never_loads(graph: Any, device: str, config: Any, intra_op_threads: int | None = None) -> tuple[Any, str]:
    """create_session as on a machine where onnxruntime-gpu lists CUDA but cannot load it: a CPU session."""
    session, _ = create_session(graph, "cpu", config, intra_op_threads)
    return session, "cpu"


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name == "fastnli"]


@pytest.fixture
def plain_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_mod, "cuda_listed", lambda: False)


@pytest.fixture
def gpu_build_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_mod, "cuda_listed", lambda: True)
    monkeypatch.setattr(engine_mod, "create_session", _cuda_never_loads)
    monkeypatch.setattr(engine_mod, "gpu_present", lambda: False)


def test_auto_with_plain_onnxruntime_is_info(plain_onnxruntime: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.clear()
    engine = NLIEngine.from_pretrained(device="auto")
    assert engine.device == "cpu" and engine.fallbacks == 0
    assert _records(caplog, logging.WARNING) == []
    assert _records(caplog, logging.INFO) == [
        "device='auto': this onnxruntime build has no CUDA execution provider, running on CPU with precision int8"]


def test_auto_with_gpu_build_and_no_gpu_is_info(gpu_build_without_gpu: None,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.clear()
    engine = NLIEngine.from_pretrained(device="auto")
    assert engine.device == "cpu" and engine.precision == "int8" and engine.fallbacks == 0
    assert _records(caplog, logging.WARNING) == []
    assert _records(caplog, logging.INFO) == ["device='auto': no GPU found, running on CPU with precision int8"]


def test_auto_with_a_gpu_that_fails_warns(gpu_build_without_gpu: None, monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(engine_mod, "gpu_present", lambda: True)
    caplog.clear()
    engine = NLIEngine.from_pretrained(device="auto")
    assert engine.device == "cpu" and engine.fallbacks == 1
    assert _records(caplog, logging.WARNING) == [
        f"device='auto': {CUDA_DID_NOT_LOAD}; falling back to CPU with precision int8"]


@pytest.mark.parametrize("gpu", [False, True])
def test_cuda_asked_for_always_warns(gpu_build_without_gpu: None, monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture, gpu: bool) -> None:
    monkeypatch.setattr(engine_mod, "gpu_present", lambda: gpu)
    caplog.clear()
    engine = NLIEngine.from_pretrained(device="cuda")
    assert engine.device == "cpu" and engine.fallbacks == 1
    assert _records(caplog, logging.WARNING) == [
        f"device='cuda': {CUDA_DID_NOT_LOAD}; falling back to CPU with precision int8"]


def test_cuda_asked_for_with_plain_onnxruntime_names_the_fix(plain_onnxruntime: None,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.clear()
    engine = NLIEngine.from_pretrained(device="cuda")
    assert engine.device == "cpu" and engine.fallbacks == 1
    assert _records(caplog, logging.WARNING) == [
        f"device='cuda': {NO_CUDA_PROVIDER}; falling back to CPU with precision int8"]


def test_cpu_asked_for_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    caplog.clear()
    NLIEngine.from_pretrained(device="cpu")
    assert _records(caplog, logging.WARNING) == [] and not any(
        m.startswith("device=") for m in _records(caplog, logging.INFO))


def test_gpu_present_reads_the_device_nodes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import glob
    import sys

    from fastnli.engine import session

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(glob, "glob", lambda pattern: ["/dev/nvidia0"] if pattern == "/dev/nvidia[0-9]*" else [])
    assert session.gpu_present() is True
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    monkeypatch.setattr(session.os.path, "exists", lambda p: False)
    assert session.gpu_present() is False
    monkeypatch.setattr(sys, "platform", "darwin")
    assert session.gpu_present() is False
