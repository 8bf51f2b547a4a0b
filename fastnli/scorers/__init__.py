"""NLI-based consistency scorers of LLM responses (uqlm-exact NCP and siblings), computed in one engine pass."""

from fastnli.scorers.api import SCORERS, ScoreResult, ScoreRow, score, validate_inputs

__all__ = ["SCORERS", "ScoreResult", "ScoreRow", "score", "validate_inputs"]
