"""ALCE citation recall and precision (Gao et al., 2023) of any set of answers, through the engine in one pass.

``[n]`` in an answer cites ``documents[n - 1]`` of that answer. The rules are those of :mod:`fastnli.calm.checks`
(b): a statement is supported when its cited documents joined entail it; a citation is irrelevant when its document
alone does not entail the statement and the other cited documents still do. Per answer, recall = supported
statements / statements and precision = relevant citations / citations; the dataset figures are the means over
answers (as ALCE reports them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastnli.calm.checks import AnswerCheck, AnswerInput, CheckConfig, check_answers
from fastnli.calm.documents import as_documents
from fastnli.calm.result import stats_dict
from fastnli.engine.protocol import EngineLike

__all__ = ["AlceResult", "alce_citations"]


@dataclass
class AlceResult:
    """Per-answer checks (input order) and dataset means.

    Attributes:
        answers: one :class:`~fastnli.calm.checks.AnswerCheck` per answer (``citation_recall``,
            ``citation_precision``, per-statement ``supported`` and ``relevant_citations``, out-of-range citations).
        citation_recall: mean over answers (0.0 for no answers).
        citation_precision: mean over answers.
        stats: the engine pass (``pairs_in``, ``unique_pairs``, ``seconds``, ...).
        device, precision: what the engine ran on. seconds: wall time.
    """

    answers: list[AnswerCheck]
    citation_recall: float
    citation_precision: float
    stats: dict[str, Any] = field(default_factory=dict)
    device: str = ""
    precision: str = ""
    seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.answers)

    def __iter__(self) -> Iterator[AnswerCheck]:
        return iter(self.answers)

    def __getitem__(self, i: int) -> AnswerCheck:
        return self.answers[i]

    def to_dict(self) -> dict[str, Any]:
        return {"answers": [a.to_dict() for a in self.answers], "citation_recall": self.citation_recall,
                "citation_precision": self.citation_precision, "stats": self.stats, "device": self.device,
                "precision": self.precision, "seconds": self.seconds}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)


def alce_citations(answers: Sequence[str], documents: Sequence[Sequence[Any]], engine: EngineLike | None = None,
                   config: CheckConfig | None = None) -> AlceResult:
    """ALCE citation recall and precision of ``answers`` against their ``documents``.

    Args:
        answers: answers with ALCE citation markers (``[1][2]``).
        documents: per answer, the documents its citations number from 1 (strings or ``{"title", "text"}`` dicts).
        engine: the NLI engine (default None: :func:`~fastnli.engine.default_engine`, the embedded default model).
        config: the entailment rule (default :class:`CheckConfig()`: ``P(entailment) > 0.5``, and above the engine's
            window threshold for cited documents read in windows, :meth:`CheckConfig.for_engine`).

    Raises:
        TypeError / ValueError: naming the index of a bad answer or document.
    """
    t0 = time.perf_counter()
    if isinstance(answers, (str, bytes)) or not isinstance(answers, Sequence):
        raise TypeError(f"answers must be a list of strings; got {type(answers).__name__}")
    if isinstance(documents, (str, bytes)) or not isinstance(documents, Sequence):
        raise TypeError(f"documents must be a list of document lists (one per answer); got {type(documents).__name__}")
    if len(answers) != len(documents):
        raise ValueError(f"answers has {len(answers)} items but documents has {len(documents)} lists; give one list "
                         "of documents per answer")
    inputs = []
    for i, (a, docs) in enumerate(zip(answers, documents)):
        if not isinstance(a, str):
            raise TypeError(f"answers[{i}] must be str; got {type(a).__name__}")
        inputs.append(AnswerInput(answer=a, documents=as_documents(docs, f"documents[{i}]")))
    if engine is None:
        from fastnli.engine import default_engine

        engine = default_engine()
    cfg = config or CheckConfig()
    if not cfg.check_citations:
        raise ValueError("config.check_citations is False; ALCE needs citation checks")
    checks, stats = check_answers(inputs, engine, cfg)
    n = len(checks)
    return AlceResult(
        answers=checks,
        citation_recall=sum(c.citation_recall or 0.0 for c in checks) / n if n else 0.0,
        citation_precision=sum(c.citation_precision or 0.0 for c in checks) / n if n else 0.0,
        stats=stats_dict(stats), device=str(getattr(engine, "device", "")),
        precision=str(getattr(engine, "precision", "")), seconds=time.perf_counter() - t0)
