"""fastnli: fast, trustworthy NLI consistency checks of LLM output.

DeBERTa-MNLI cross-encoders exported to ONNX (FP16 for GPU, INT8 for CPU) and run on ONNX Runtime, a compiled
pair scheduler (dedup, length packing under a token budget), uqlm-exact NCP scorers, CaLM, and an embedded default
model so that everything works offline.
"""

from fastnli._version import __version__
from fastnli.calm.grounding import GroundingResult, grounding
from fastnli.engine import BatchPolicy, CallStats, NLIEngine, SessionConfig, default_engine
from fastnli.exporter import export
from fastnli.scorers import ScoreResult, ScoreRow, score
from fastnli.scorers.uqlm_patch import patch_uqlm, unpatch_uqlm

__all__ = ["BatchPolicy", "CallStats", "GroundingResult", "NLIEngine", "ScoreResult", "ScoreRow", "SessionConfig",
           "default_engine", "export", "grounding", "patch_uqlm", "score", "unpatch_uqlm", "__version__"]
