"""Grounding of statements in source documents: the full (statement × source) NLI matrix, SummaC-ZS and the
max-over-sources aggregate, from one engine pass.

**Sources** (``granularity``):

- ``"window"`` (default): each document (``"Title: t\\ntext"``, as CaLM reads it) cut into overlapping
  sentence-aligned windows that fit the model with the longest statement (:mod:`fastnli.engine.windows`); a document
  that fits is one window. Windows read several sentences together, as MiniCheck's and AlignScore's chunks do.
- ``"sentence"``: each sentence of each document's text (:func:`fastnli.engine.sentences.sentence_spans`), SummaC's
  unit.

**Scores**, with ``P`` the ``(statements, sources, labels)`` probability tensor and ``e``, ``c`` its entailment and
contradiction planes:

- ``entailment[s] = max_u e[s, u]``; ``best_source[s]`` is the source that decides the statement, by the rule of
  ``long_premise="chunk"`` (:func:`fastnli.engine.windows.deciding_rows`): the argmax of ``e[s]`` (the first on ties)
  when that entailment is above ``threshold``, else, when the engine's window policy names a
  ``contradiction_threshold`` and some ``c[s, u]`` is above it, the argmax of ``c[s]``, else the argmax of ``e[s]``
  (of the neutral plane when the policy's ``fallback`` is ``"neutral"``);
  ``contradiction[s] = c[s, best_source[s]]``; ``supported[s] = entailment[s] > threshold``;
  ``score = mean_s entailment[s]`` (the aggregate). The default threshold is 0.5 for documents read as one source
  and the engine's window threshold (:attr:`~fastnli.engine.windows.WindowPolicy.entailment_threshold`, which the
  embedded default model's manifest names; else 0.5) for several, since the max over many sources runs high on unrelated text.
- SummaC-ZS (Laban et al., 2022): ``summac_zs[s] = max_u (e[s, u] - c[s, u])`` and ``summac = mean_s summac_zs[s]``.
  It needs P(contradiction): with a 2-way head (not_entailment, entailment) both are None and ``contradiction`` too.

Without statements every mean is 0.0. :func:`plan_grounding` and :func:`finish_grounding` split the call around
its engine pass (the service sends the pairs through its shared batcher).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from fastnli.calm.documents import Document, as_documents, premise_text
from fastnli.calm.result import stats_dict
from fastnli.calm.statements import split_statements
from fastnli.engine.labels import CANONICAL_LABELS, CONTRADICTION, ENTAILMENT_COLUMN
from fastnli.engine.protocol import EngineLike
from fastnli.engine.sentences import sentence_spans
from fastnli.engine.windows import WindowPolicy, deciding_rows, window_threshold
from fastnli.scorers.units import align_units, model_aligns_units, resolve_align_units

__all__ = ["GroundingPlan", "GroundingResult", "finish_grounding", "grounding", "plan_grounding"]

Granularity = Literal["window", "sentence"]
GRANULARITIES: tuple[str, ...] = ("window", "sentence")
#: ``supported``'s threshold for documents read as one source (and for several when the engine names none)
DEFAULT_THRESHOLD = 0.5


@dataclass
class GroundingResult:
    """The grounding of S statements in U sources (see the module docstring for every formula).

    Attributes:
        statements: the statements (hypotheses), citation markers stripped.
        sources: the source texts (premises): windows or sentences, document by document.
        source_documents: per source, the 0-based index of its document.
        granularity: ``"window"`` or ``"sentence"``.
        labels: the label of each column of ``probs`` (entailment last).
        probs: float32 ``(S, U, len(labels))``: ``probs[s, u]`` is ``engine.predict((sources[u], statements[s]))``.
        entailment: float32 ``(S,)``: max over sources of P(entailment).
        best_source: int64 ``(S,)``: the source that gives it (-1 without sources).
        contradiction: float32 ``(S,)``: P(contradiction) of the best source (None with a 2-way head).
        supported: bool ``(S,)``: ``entailment > threshold``.
        score: mean of ``entailment`` over statements.
        summac_zs: float32 ``(S,)``: max over sources of P(entailment) - P(contradiction) (None with a 2-way head).
        summac: mean of ``summac_zs`` over statements (None with a 2-way head).
        threshold: the entailment threshold of ``supported``.
        truncated_pairs: pairs the model read cut to its limit (a statement longer than the model leaves room for).
        stats: the engine pass (``pairs_in``, ``unique_pairs``, ``seconds``, ...). device, precision: what ran it.
        seconds: wall time of the call.
    """

    statements: list[str]
    sources: list[str]
    source_documents: list[int]
    granularity: str
    labels: tuple[str, ...]
    probs: np.ndarray
    entailment: np.ndarray
    best_source: np.ndarray
    contradiction: np.ndarray | None
    supported: np.ndarray
    score: float
    summac_zs: np.ndarray | None
    summac: float | None
    threshold: float
    truncated_pairs: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    device: str = ""
    precision: str = ""
    seconds: float = 0.0

    def to_dict(self, matrix: bool = True) -> dict[str, Any]:
        """Plain JSON-ready values; ``matrix=False`` leaves out ``probs`` (S × U × labels numbers)."""
        out: dict[str, Any] = {
            "statements": self.statements, "sources": self.sources, "source_documents": self.source_documents,
            "granularity": self.granularity, "labels": list(self.labels),
            "entailment": self.entailment.tolist(), "best_source": self.best_source.tolist(),
            "contradiction": None if self.contradiction is None else self.contradiction.tolist(),
            "supported": self.supported.tolist(), "score": self.score,
            "summac_zs": None if self.summac_zs is None else self.summac_zs.tolist(), "summac": self.summac,
            "threshold": self.threshold, "truncated_pairs": self.truncated_pairs, "stats": self.stats,
            "device": self.device, "precision": self.precision, "seconds": self.seconds,
        }
        if matrix:
            out["probs"] = self.probs.tolist()
        return out


@dataclass
class GroundingPlan:
    """The pairs of one grounding call: ``pairs[s * len(sources) + u] = (sources[u], statements[s])``, the statement
    in the source's units with ``align_units``."""

    statements: list[str]
    sources: list[str]
    source_documents: list[int]
    granularity: str
    threshold: float
    align_units: bool = False
    window_policy: WindowPolicy = WindowPolicy()  # the engine's: its contradiction bar and fallback decide a source

    @functools.cached_property
    def pairs(self) -> list[tuple[str, str]]:
        if self.align_units:
            return [(u, align_units(u, s)) for s in self.statements for u in self.sources]
        return [(u, s) for s in self.statements for u in self.sources]


def _statements(statements: str | Sequence[str]) -> list[str]:
    if isinstance(statements, str):
        return [st.text for st in split_statements(statements)]
    if isinstance(statements, bytes) or not isinstance(statements, Sequence):
        raise TypeError(f"statements must be a string (an answer, split into sentences) or a list of strings; got "
                        f"{type(statements).__name__}")
    for i, s in enumerate(statements):
        if not isinstance(s, str):
            raise TypeError(f"statements[{i}] must be str; got {type(s).__name__}")
    return list(statements)


def _window_budget(engine: Any, statements: list[str]) -> int:
    planner = engine.window_planner
    longest = max(len(e.ids) for e in planner.tokenizer.encode_texts(statements)) if statements else 0
    return max(planner.budget(longest), planner.policy.min_window_tokens)


def _default_threshold(engine: Any, n_sources: int) -> float:
    """0.5 for one source; for several, the engine's window policy threshold when it names one (else 0.5)."""
    bar = window_threshold(engine) if n_sources > 1 else None
    return DEFAULT_THRESHOLD if bar is None else float(bar)


def plan_grounding(statements: str | Sequence[str], documents: Sequence[Any], engine: Any,
                   granularity: Granularity = "window", threshold: float | None = None,
                   align_units: bool | None = None) -> GroundingPlan:
    """The sources and pairs of :func:`grounding` (arguments as there), without running the engine.

    Raises:
        TypeError / ValueError: bad statements, documents, granularity or threshold, naming the field; ValueError
            for ``granularity="window"`` with an engine that cannot tokenize (no ``window_planner``).
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is not supported; use 'window' (documents in windows that "
                         "fit the model) or 'sentence' (one source per document sentence)")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold={threshold} must be within [0, 1] (or None: the default)")
    texts = _statements(statements)
    docs: list[Document] = as_documents(documents, "documents")
    sources: list[str] = []
    owners: list[int] = []
    if granularity == "window":
        if getattr(engine, "window_planner", None) is None:
            raise ValueError(f"granularity='window' needs an engine with a tokenizer (fastnli.NLIEngine); "
                             f"{type(engine).__name__} has no window_planner: use granularity='sentence'")
        budget = _window_budget(engine, texts)
        for j, doc in enumerate(docs):
            windows, _ = engine.window_planner.premise_windows(premise_text([doc]), budget)
            sources.extend(windows)
            owners.extend([j] * len(windows))
    else:
        for j, doc in enumerate(docs):
            spans = sentence_spans(doc.text)
            sources.extend(doc.text[a:b] for a, b in spans)
            owners.extend([j] * len(spans))
    if not sources:
        raise ValueError("documents hold no text to ground statements in (every document is empty)")
    if threshold is None:
        threshold = _default_threshold(engine, len(sources))
    aligned = resolve_align_units(align_units, model_aligns_units(engine))
    policy = getattr(getattr(engine, "window_planner", None), "policy", None) or WindowPolicy()
    return GroundingPlan(texts, sources, owners, granularity, threshold, aligned, policy)


def finish_grounding(plan: GroundingPlan, probs: np.ndarray, labels: Sequence[str] = CANONICAL_LABELS
                     ) -> GroundingResult:
    """The :class:`GroundingResult` of ``plan`` from the probabilities of ``plan.pairs`` (rows in that order).

    Raises:
        ValueError: when ``probs`` does not have one row per pair and one column per label.
    """
    probs = np.asarray(probs, dtype=np.float32)
    n_s, n_u = len(plan.statements), len(plan.sources)
    if n_s == 0 and probs.shape[0] == 0:
        probs = np.zeros((0, len(labels)), dtype=np.float32)  # an empty pass may come back as (0, 3) from a batcher
    if probs.shape != (n_s * n_u, len(labels)):
        raise ValueError(f"probs has shape {probs.shape}; the plan needs ({n_s * n_u}, {len(labels)}), one row per "
                         "(source, statement) pair")
    P = probs.reshape(n_s, n_u, len(labels))
    e = P[:, :, ENTAILMENT_COLUMN]
    rows = np.arange(n_s)
    if n_u:
        policy = plan.window_policy
        best = deciding_rows(probs, np.arange(n_s + 1) * n_u, plan.threshold, policy.contradiction_threshold,
                             policy.fallback) - rows * n_u
    else:
        best = np.full(n_s, -1, dtype=np.int64)
    entailment = e.max(axis=1).astype(np.float32) if n_u else np.zeros(n_s, dtype=np.float32)
    three_way = tuple(labels) == CANONICAL_LABELS
    contradiction = summac_zs = None
    summac = None
    if three_way:
        c = P[:, :, CONTRADICTION]
        contradiction = c[rows, best].astype(np.float32)
        summac_zs = (e - c).max(axis=1).astype(np.float32)
        summac = float(summac_zs.mean()) if n_s else 0.0
    return GroundingResult(
        statements=plan.statements, sources=plan.sources, source_documents=plan.source_documents,
        granularity=plan.granularity, labels=tuple(labels), probs=P, entailment=entailment,
        best_source=best.astype(np.int64), contradiction=contradiction, supported=entailment > plan.threshold,
        score=float(entailment.mean()) if n_s else 0.0, summac_zs=summac_zs, summac=summac,
        threshold=plan.threshold)


def grounding(statements: str | Sequence[str], documents: Sequence[Any], engine: EngineLike | None = None,
              granularity: Granularity = "window", threshold: float | None = None,
              align_units: bool | None = None) -> GroundingResult:
    """How well ``statements`` are grounded in ``documents``: the (statement × source) NLI matrix, SummaC-ZS and
    the max-over-sources aggregate, from one engine pass (see the module docstring for the formulas).

    Args:
        statements: an answer (split into sentences, ALCE citation markers stripped) or a list of statements.
        documents: strings or ``{"title": ..., "text": ...}`` dicts.
        engine: the NLI engine (default None: :func:`~fastnli.engine.default_engine`, the embedded default model);
            a 3-way or a 2-way head.
        granularity: ``"window"`` (default) or ``"sentence"``.
        threshold: ``supported`` means ``entailment > threshold`` (default None: 0.5 when the documents are one
            source, the engine's window threshold when they are several; the result's ``threshold`` says which).
        align_units: write each statement's quantities in the units of the source it meets (and its numbers of equal
            value in the source's form; :func:`fastnli.scorers.units.align_units`; default None: where the model's
            manifest says so).

    Raises:
        TypeError / ValueError: naming the bad field.
    """
    t0 = time.perf_counter()
    if engine is None:
        from fastnli.engine import default_engine

        engine = default_engine()
    plan = plan_grounding(statements, documents, engine, granularity, threshold, align_units)
    pairs = plan.pairs
    probs, stats = engine.predict_with_stats(pairs) if pairs else (np.zeros((0, 0), dtype=np.float32), None)
    labels = tuple(getattr(engine, "labels", CANONICAL_LABELS))
    result = finish_grounding(plan, probs, labels)
    result.stats = stats_dict(stats)
    result.truncated_pairs = int(getattr(stats, "truncated_pairs", 0) or 0)
    result.device, result.precision = str(getattr(engine, "device", "")), str(getattr(engine, "precision", ""))
    result.seconds = time.perf_counter() - t0
    return result
