"""A drop-in for uqlm's ``NLI`` object, so uqlm's own scorers run on fastnli's engine.

uqlm's scorers take an ``nli=`` object with ``predict_batch(pairs) -> (N, 3)`` in contradiction/neutral/entailment
order, ``get_nli_results_batch`` and a ``probabilities`` cache. :class:`FastNLI` implements that interface on an
:class:`~fastnli.engine.NLIEngine` (dedup + length packing + ONNX Runtime)::

    from uqlm.black_box import ConsistencyScorer
    from fastnli.scorers.uqlm_adapter import FastNLI

    scorer = ConsistencyScorer(nli=FastNLI("microsoft/deberta-large-mnli"))   # the one-line switch

uqlm itself is not a dependency of fastnli.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.engine import NLIEngine
from fastnli.engine.labels import CANONICAL_LABELS, CONTRADICTION, ENTAILMENT, require_three_way

logger = logging.getLogger("fastnli")


class FastNLI:
    """uqlm's ``NLI`` interface backed by a fastnli engine.

    Args:
        model: an :class:`NLIEngine`, or anything :meth:`NLIEngine.from_pretrained` accepts (default: the embedded
            default model).
        max_length: as uqlm's ``max_length``: texts longer than this many characters are cut before NLI (with a
            logged warning), so scores match uqlm's on long texts (default 2000).
        **engine_kwargs: passed to :meth:`NLIEngine.from_pretrained` (``device``, ``precision``, ...).
    """

    def __init__(self, model: NLIEngine | str | Path | None = None, max_length: int = 2000,
                 **engine_kwargs: Any) -> None:
        self.engine = model if isinstance(model, NLIEngine) else NLIEngine.from_pretrained(model, **engine_kwargs)
        require_three_way(self.engine.labels, "uqlm's NLI scorers")
        self.max_length = max_length
        self.label_mapping = list(CANONICAL_LABELS)
        self.probabilities: dict[tuple[str, str], np.ndarray] = {}
        self.num_responses: int | None = None  # uqlm's SemanticEntropy sets this attribute
        self.verbose = False
        self.batch_size = self.engine.batch_policy.max_batch_size
        self.device = self.engine.device

    def predict(self, premise: str, hypothesis: str) -> np.ndarray:
        """Probabilities ``(1, 3)`` of one pair."""
        return self.predict_batch([(premise, hypothesis)])

    def predict_batch(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Probabilities ``(N, 3)`` (contradiction, neutral, entailment), float32, one row per pair."""
        if len(pairs) == 0:
            return np.empty((0, 3))
        n = self.max_length
        if any(len(p) > n or len(h) > n for p, h in pairs):
            logger.warning("texts longer than max_length=%d characters are truncated before NLI (as uqlm does)", n)
        return self.engine.predict([(p[:n], h[:n]) for p, h in pairs])

    def get_nli_results(self, response1: str, response2: str) -> dict[str, Any]:
        return self.get_nli_results_batch([(response1, response2)])[0]

    def get_nli_results_batch(self, response_pairs: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
        """uqlm's per-pair results (both directions averaged; identical strings score 1 without the model)."""
        results: list[dict[str, Any] | None] = [None] * len(response_pairs)
        pending, pairs = [], []
        for i, (a, b) in enumerate(response_pairs):
            if a == b:
                results[i] = {"noncontradiction_score": 1, "entailment": True, "entailment_score": 1}
            elif (a, b) in self.probabilities and (b, a) in self.probabilities:
                results[i] = self._result(self.probabilities[(a, b)], self.probabilities[(b, a)])
            else:
                pending.append(i)
                pairs += [(a, b), (b, a)]
        if pending:
            probs = self.predict_batch(pairs)
            for k, i in enumerate(pending):
                a, b = response_pairs[i]
                left, right = probs[2 * k:2 * k + 1], probs[2 * k + 1:2 * k + 2]
                self.probabilities[(a, b)], self.probabilities[(b, a)] = left, right
                results[i] = self._result(left, right)
        return results  # type: ignore[return-value]

    @staticmethod
    def _result(left: np.ndarray, right: np.ndarray) -> dict[str, Any]:
        entail = int(left.argmax(axis=1)[0]) == ENTAILMENT or int(right.argmax(axis=1)[0]) == ENTAILMENT
        return {
            "noncontradiction_score": ((1 - left[:, CONTRADICTION] + 1 - right[:, CONTRADICTION]) / 2)[0],
            "entailment": entail,
            "entailment_score": ((left[:, ENTAILMENT] + right[:, ENTAILMENT]) / 2)[0],
        }
