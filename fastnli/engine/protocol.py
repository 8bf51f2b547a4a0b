"""What the rest of the package needs of an engine, as one protocol: :class:`~fastnli.engine.NLIEngine` or a stub."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["EngineLike"]


class EngineLike(Protocol):
    """An NLI engine as the scorers, CaLM checks and the service's batcher use it: :class:`fastnli.NLIEngine` or a
    stub with the same call. ``predict_with_stats`` returns probabilities ``(len(pairs), 3)`` in the order
    contradiction, neutral, entailment (a 2-way head: ``(len(pairs), 2)``, not_entailment, entailment; an engine
    says which in ``labels``), and the call's statistics (a ``CallStats`` or None)."""

    @property
    def device(self) -> str: ...

    @property
    def precision(self) -> str: ...

    def predict_with_stats(self, pairs: Sequence[tuple[str, str]]) -> tuple[np.ndarray, Any]: ...
