"""fastnli: fast, trustworthy NLI consistency checks of LLM output.

DeBERTa-MNLI cross-encoders exported to ONNX (FP16 for GPU, INT8 for CPU) and run on ONNX Runtime, a compiled
pair scheduler (dedup, length packing under a token budget), and uqlm-exact NCP scorers.
"""

from fastnli.engine import BatchPolicy, CallStats, NLIEngine, SessionConfig, export

__version__ = "0.1.0"
__all__ = ["BatchPolicy", "CallStats", "NLIEngine", "SessionConfig", "export", "__version__"]
