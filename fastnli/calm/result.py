"""Results of the CaLM loop: one :class:`CalmResult` per query with its per-iteration trace, and the batch wrapper.

Everything converts to plain JSON types with ``to_dict()`` / ``to_json()``; document indices in results are 0-based
positions in the query's document pool (the prompts number them from 1).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from fastnli.calm.checks import AnswerCheck
from fastnli.calm.documents import Document

__all__ = ["CalmBatchResult", "CalmResult", "IterationTrace", "STOP_REASONS", "stats_dict"]

#: Why a query's loop ended: its answer was accepted; T iterations ran; the pool had no further documents to refine
#: with; an LM or retriever failed (with ``on_error="record"``).
STOP_REASONS = ("accepted", "max_iterations", "documents_exhausted", "error")


def stats_dict(stats: Any) -> dict[str, Any]:
    """An engine ``CallStats`` (or None: no engine call) as a dict of plain numbers."""
    if stats is None:
        return {"pairs_in": 0, "unique_pairs": 0, "cache_hits": 0, "computed_pairs": 0, "batches": 0,
                "seconds": 0.0}
    if hasattr(stats, "as_dict"):
        return dict(stats.as_dict())
    if is_dataclass(stats) and not isinstance(stats, type):
        return asdict(stats)
    return dict(vars(stats))


@dataclass
class IterationTrace:
    """One iteration of one query.

    Attributes:
        iteration: 1-based.
        main_prompt: the prompt sent to the main LM (answer prompt, or refine prompt after the first iteration).
        answer: the main LM's answer ("" when it failed).
        documents_shown: pool indices (0-based) of the documents in ``main_prompt``.
        citable_documents: how many pool documents the answer could cite (``[1]..[n]``: all shown so far).
        verifier_prompt: the prompt sent to the verifier (None when it was not called).
        verifier_answer: the verifier's answer (None when it was not called).
        verifier_documents: pool indices of the documents given to the verifier (those the answer cites).
        check: the NLI checks of the answer (None when an LM failed).
        kept_statements: the corroborated statements (with their citations) fed to the next refinement.
        engine_pass: the counters of this iteration's engine pass, shared by all queries of the batch
            (``pairs_in``: pairs sent, ``unique_pairs``: after the engine's dedup, ``seconds``, ...).
        error: the LM error of this iteration, if any.
        notes: remarks (e.g. "the answer cites no valid document; the verifier was not called").
    """

    iteration: int
    main_prompt: str
    answer: str = ""
    documents_shown: list[int] = field(default_factory=list)
    citable_documents: int = 0
    verifier_prompt: str | None = None
    verifier_answer: str | None = None
    verifier_documents: list[int] = field(default_factory=list)
    check: AnswerCheck | None = None
    kept_statements: list[str] = field(default_factory=list)
    engine_pass: dict[str, Any] | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def consistency(self) -> float | None:
        return self.check.consistency if self.check else None

    @property
    def accepted(self) -> bool:
        return bool(self.check and self.check.accepted)

    def to_dict(self, include_prompts: bool = True) -> dict[str, Any]:
        d = asdict(self)
        if not include_prompts:
            d.pop("main_prompt")
            d.pop("verifier_prompt")
        return d


@dataclass
class CalmResult:
    """The CaLM outcome of one query.

    Attributes:
        index: the query's position in the batch.
        query: the query.
        answer: the final answer: the accepted one, else the one with the highest consistency (earliest on ties);
            None when no answer was produced (an error in the first iteration).
        accepted: whether ``answer`` passed the acceptance rule.
        iterations: iterations run.
        best_iteration: the 1-based iteration ``answer`` comes from.
        stop_reason: one of :data:`STOP_REASONS`.
        trace: one :class:`IterationTrace` per iteration run.
        documents: the pool documents shown to the main LM (``[n]`` in answers cites ``documents[n - 1]``).
        error: the error that stopped this query (``on_error="record"``), else None.
        device: the engine's device; precision: its precision.
    """

    index: int
    query: str
    answer: str | None = None
    accepted: bool = False
    iterations: int = 0
    best_iteration: int | None = None
    stop_reason: str = "max_iterations"
    trace: list[IterationTrace] = field(default_factory=list)
    documents: list[Document] = field(default_factory=list)
    error: str | None = None
    device: str = ""
    precision: str = ""

    @property
    def best(self) -> IterationTrace | None:
        """The iteration ``answer`` comes from."""
        return self.trace[self.best_iteration - 1] if self.best_iteration else None

    @property
    def metrics(self) -> dict[str, Any]:
        """Metrics of the final answer: consistency, corroborated share, contradicted, ALCE citation recall and
        precision, ROUGE-L; plus NLI pairs sent by this query over all iterations."""
        best = self.best
        check = best.check if best else None
        keys = ("consistency", "corroborated_share", "contradicted", "citation_recall", "citation_precision",
                "rouge_l")
        out: dict[str, Any] = {k: getattr(check, k) if check else None for k in keys}
        out["nli_pairs"] = sum(sum(t.check.nli_pairs.values()) for t in self.trace if t.check)
        return out

    def to_dict(self, include_prompts: bool = True) -> dict[str, Any]:
        """Plain JSON types; ``include_prompts=False`` drops the (long) prompts from the trace."""
        return {
            "index": self.index, "query": self.query, "answer": self.answer, "accepted": self.accepted,
            "iterations": self.iterations, "best_iteration": self.best_iteration, "stop_reason": self.stop_reason,
            "metrics": self.metrics, "error": self.error, "device": self.device, "precision": self.precision,
            "documents": [d.to_dict() for d in self.documents],
            "trace": [t.to_dict(include_prompts) for t in self.trace],
        }

    def to_json(self, include_prompts: bool = True) -> str:
        return json.dumps(self.to_dict(include_prompts), ensure_ascii=False)


@dataclass
class CalmBatchResult:
    """The CaLM outcome of a batch: one :class:`CalmResult` per query (input order) and one engine pass per
    iteration.

    Attributes:
        results: per query.
        passes: per iteration, ``{"iteration", "active_queries", "pairs_in", "unique_pairs", "seconds", ...}`` —
            the NLI pairs of all active queries sent in that iteration's single engine call, and how many were left
            after the engine's dedup.
        device, precision: what the engine ran on.
        seconds: wall time of the whole batch.
        settings: ``k``, ``max_iterations``, ``max_concurrency`` and the check rules used.
    """

    results: list[CalmResult]
    passes: list[dict[str, Any]]
    device: str
    precision: str
    seconds: float
    settings: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self) -> Iterator[CalmResult]:
        return iter(self.results)

    def __getitem__(self, i: int) -> CalmResult:
        return self.results[i]

    @property
    def accepted_share(self) -> float:
        return sum(r.accepted for r in self.results) / len(self.results) if self.results else 0.0

    def to_dict(self, include_prompts: bool = True) -> dict[str, Any]:
        return {"results": [r.to_dict(include_prompts) for r in self.results], "passes": self.passes,
                "device": self.device, "precision": self.precision, "seconds": self.seconds,
                "settings": self.settings}

    def to_json(self, include_prompts: bool = True) -> str:
        return json.dumps(self.to_dict(include_prompts), ensure_ascii=False)
