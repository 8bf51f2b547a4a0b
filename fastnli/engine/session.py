"""ONNX Runtime sessions: explicit options, explicit providers, and an honest report of what actually loaded.

``onnxruntime-gpu`` lists ``CUDAExecutionProvider`` as available even where its CUDA libraries cannot load; ORT
then silently builds a CPU-only session. :func:`create_session` therefore always checks ``session.get_providers()``
and reports the device it really got, so the engine can switch to the CPU graph and say so.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger("fastnli")

Device = Literal["cuda", "cpu"]


@dataclass(frozen=True)
class SessionConfig:
    """ONNX Runtime settings.

    Attributes:
        intra_op_threads: threads for one operator; 0 lets ORT use one per physical core (default 0, or
            ``FASTNLI_THREADS``).
        inter_op_threads: threads across independent operators (default 1: DeBERTa's graph is a chain).
        cuda_device_id: GPU ordinal for the CUDA provider (default 0).
        optimization: ORT graph optimisation level: ``"all"`` (default), ``"extended"``, ``"basic"``, ``"none"``.
    """

    intra_op_threads: int = int(os.environ.get("FASTNLI_THREADS", "0"))
    inter_op_threads: int = 1
    cuda_device_id: int = 0
    optimization: str = "all"


def cuda_listed() -> bool:
    """True when the installed ONNX Runtime build lists the CUDA provider (it may still fail to load)."""
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def create_session(graph: str | Path, device: Device, config: SessionConfig) -> tuple[Any, Device]:
    """Create an inference session for ``graph`` on ``device``.

    Returns:
        ``(session, device_used)``: ``device_used`` is ``"cpu"`` when CUDA was asked for but its provider did not
        load (the session is then a working CPU session).
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = config.intra_op_threads
    opts.inter_op_num_threads = config.inter_op_threads
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }[config.optimization]
    opts.log_severity_level = 3
    providers: list[Any] = ["CPUExecutionProvider"]
    if device == "cuda":
        providers = [("CUDAExecutionProvider", {"device_id": config.cuda_device_id}), "CPUExecutionProvider"]
        # ORT prints its own provider-load error through its default logger; we report the outcome ourselves.
        ort.set_default_logger_severity(4)
    try:
        session = ort.InferenceSession(str(graph), sess_options=opts, providers=providers)
    finally:
        if device == "cuda":
            ort.set_default_logger_severity(2)
    used: Device = "cuda" if "CUDAExecutionProvider" in session.get_providers() else "cpu"
    return session, used


def is_device_error(exc: BaseException) -> bool:
    """True when an ORT run failure looks like a GPU/device failure (worth retrying on CPU)."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(k in text for k in ("cuda", "cudnn", "cublas", "out of memory", "device", "gpu"))
