"""The NLI engine: export to ONNX (fp32/FP16/INT8) and run on ONNX Runtime, GPU first with a CPU fallback."""

from fastnli.engine.engine import (
    INT8_MIN_AGREEMENT,
    CallStats,
    NLIEngine,
    cache_root,
    cpu_auto_precision,
    resolve_artifact,
)
from fastnli.engine.export import export
from fastnli.engine.labels import CANONICAL_LABELS, canonical_columns
from fastnli.engine.manifest import Manifest, read_manifest
from fastnli.engine.runner import CPU_POLICY, CUDA_POLICY, BatchPolicy
from fastnli.engine.session import SessionConfig

__all__ = [
    "BatchPolicy", "CANONICAL_LABELS", "CPU_POLICY", "CUDA_POLICY", "CallStats", "INT8_MIN_AGREEMENT", "Manifest",
    "NLIEngine", "SessionConfig", "cache_root", "canonical_columns", "cpu_auto_precision", "export", "read_manifest",
    "resolve_artifact",
]
