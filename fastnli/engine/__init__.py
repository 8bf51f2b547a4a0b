"""Run time: load an exported ONNX artifact (fp32/FP16/INT8) and run it on ONNX Runtime, GPU first with a CPU fallback.

Exporting a checkpoint is build time and lives in :mod:`fastnli.exporter`."""

from fastnli.engine.batches import CPU_POLICY, CUDA_POLICY, BatchPolicy
from fastnli.engine.engine import (
    INT8_MIN_AGREEMENT,
    CallStats,
    NLIEngine,
    Predictions,
    cache_root,
    cpu_auto_precision,
    default_engine,
    resolve_artifact,
)
from fastnli.engine.labels import CANONICAL_LABELS, TWO_WAY_LABELS, canonical_columns
from fastnli.engine.manifest import Manifest, read_manifest
from fastnli.engine.protocol import EngineLike
from fastnli.engine.result_cache import ResultCache
from fastnli.engine.session import SessionConfig
from fastnli.engine.windows import WindowPolicy

__all__ = [
    "BatchPolicy", "CANONICAL_LABELS", "TWO_WAY_LABELS", "CPU_POLICY", "CUDA_POLICY", "CallStats", "EngineLike", "INT8_MIN_AGREEMENT", "Manifest",
    "NLIEngine", "Predictions", "ResultCache", "SessionConfig", "WindowPolicy", "cache_root", "canonical_columns", "cpu_auto_precision", "default_engine", "read_manifest",
    "resolve_artifact",
]
