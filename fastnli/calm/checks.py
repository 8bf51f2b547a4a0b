"""Statement checks of answers on the NLI engine, for many answers in ONE engine pass.

:func:`check_answers` plans every (premise, hypothesis) pair that the answers need, sends them all through one
``engine.predict_with_stats`` call (the engine dedups identical pairs and packs by length), then reads the
probabilities back by index. Probabilities are ``(contradiction, neutral, entailment)``. The two halves are public:
:func:`plan_checks` gives a :class:`CheckPlan` whose ``pairs`` go to any engine (or a service's shared batcher) and
:func:`finish_checks` reads the checks back from their probabilities.

**Entailment decision** (:class:`CheckConfig`): with ``entailment_rule="threshold"`` (default) a premise entails a
hypothesis when ``P(entailment) > entailment_threshold`` (default 0.5), and a premise read in windows when its best
window's ``P(entailment) > window_entailment_threshold`` (default: the engine's
:attr:`~fastnli.engine.windows.WindowPolicy.entailment_threshold`, which the embedded default model's manifest names,
else ``entailment_threshold``: the max over many windows runs high on unrelated text); with ``"argmax"`` when entailment
is the most probable label.

**(a) Corroboration** (SummaC-style statement × sentence matrix, only when a verifier answer is given): every
statement of the main answer (hypothesis) against every sentence of the verifier answer (premise).
``corroboration`` = max over verifier sentences of P(entailment); ``contradiction`` = max of P(contradiction). A
statement is *corroborated* when some verifier sentence entails it, *contradicted* when ``contradiction >
contradiction_threshold`` (default 0.5).

**(b) Citation support** (ALCE citation recall and precision, Gao et al. 2023): a statement is *supported* when it
cites at least one document, every citation points to a document that exists, and its cited documents joined
(premise, ``"Title: t\\ntext"`` per document) entail it. A citation is *irrelevant* when its document alone does not
entail the statement and the other cited documents still do; when a statement is not supported none of its
citations count as relevant, and a supported statement with one citation has a relevant citation (as ALCE's code).
Recall = supported statements / statements; precision = relevant citations / citations written (out-of-range ones
included). Both are 0.0 for an answer without statements or citations. To keep one engine pass, the single-document
and leave-one-out pairs of multi-citation statements are planned up front.

**(c) Consistency and acceptance** (when a verifier answer is given): ``consistency`` = mean over statements of
``corroboration`` (0.0 without statements or verifier sentences) — the score by which the CaLM loop ranks answers.
An answer is *accepted* when it has at least one statement, the share of corroborated statements is at least
``accept_share`` (default 0.8), no statement is contradicted, and — only when ``min_citation_recall`` is set
(default None) — its citation recall reaches it. ``rouge_l`` (LCS F1 over lower-cased words, citations stripped)
is reported beside it and decides nothing.

**Long premises** (``CheckConfig.long_premise``, default ``"chunk"``): with an engine that has a tokenizer
(:class:`~fastnli.NLIEngine`), a pair longer than the model limit (512 tokens) is read in overlapping
sentence-aligned windows and takes the row of the window that decides it (the highest P(entailment); with a window
policy that names a contradiction bar, the most contradicting window when none supports: :mod:`fastnli.engine.windows`);
``citation_window`` names it. All windows of all documents and statements go through
the same engine pass. ``"truncate"`` cuts such pairs ``longest_first`` instead. Either way, a pair the model reads cut
is flagged (the statement's ``truncated``, the answer's ``truncated_pairs`` and ``truncated_documents``) and logged
once per pass; with an engine that cannot tokenize (a stub), the flags come from the token estimate of
:func:`fastnli.calm.documents.estimate_tokens`.

**2-way heads** (``engine.labels == ("not_entailment", "entailment")``): every check reads P(entailment) only;
``contradiction`` and ``contradicted`` stay None and an answer is accepted on corroboration alone.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np

from fastnli.calm.documents import Document, pair_overflows, premise_text
from fastnli.calm.statements import Statement, split_sentences, split_statements, strip_citations
from fastnli.engine.labels import CANONICAL_LABELS, CONTRADICTION, ENTAILMENT_COLUMN
from fastnli.engine.protocol import EngineLike
from fastnli.engine.windows import LongPremise, PairWindows, check_long_premise, window_threshold
from fastnli.scorers.units import align_units, model_aligns_units, resolve_align_units

__all__ = ["AnswerCheck", "AnswerInput", "CheckConfig", "CheckPlan", "EngineLike", "PairPlan", "StatementCheck",
           "CheckCost", "check_answers", "check_cost", "finish_checks", "plan_checks", "rouge_l"]

logger = logging.getLogger("fastnli")

DEFAULT_MAX_LENGTH = 512


@dataclass(frozen=True)
class CheckConfig:
    """Decision rules of the checks (see the module docstring).

    Attributes:
        entailment_rule: ``"threshold"`` (default: ``P(entailment) > entailment_threshold``) or ``"argmax"``.
        entailment_threshold: default 0.5; used by the threshold rule.
        window_entailment_threshold: the threshold rule's bar for a premise read in windows (default None: the
            engine's window policy's :attr:`~fastnli.engine.windows.WindowPolicy.entailment_threshold` once the
            plan is expanded with the engine, else ``entailment_threshold``).
        contradiction_threshold: a statement is contradicted when some verifier sentence gives
            ``P(contradiction) >`` this (default 0.5).
        accept_share: least share of corroborated statements for acceptance (default 0.8).
        min_citation_recall: when set, acceptance also needs this citation recall (default None: not used).
        check_citations: compute ALCE citation support (default True); False plans no citation pairs.
        long_premise: ``"chunk"`` (default: read long premises in windows) or ``"truncate"``.
        align_units: write each statement's quantities in its premise's units (and its numbers of equal value in the
            premise's form) before NLI (:func:`fastnli.scorers.units.align_units`: a document's "569 km" supports
            "354 miles"); default None:
            where the engine's model says so (its manifest's ``align_units``), once the config meets the engine.
    """

    entailment_rule: Literal["threshold", "argmax"] = "threshold"
    entailment_threshold: float = 0.5
    window_entailment_threshold: float | None = None
    contradiction_threshold: float = 0.5
    accept_share: float = 0.8
    min_citation_recall: float | None = None
    check_citations: bool = True
    long_premise: LongPremise = "chunk"
    align_units: bool | None = None

    def __post_init__(self) -> None:
        check_long_premise(self.long_premise)
        resolve_align_units(self.align_units, False)  # a bool or None
        if self.entailment_rule not in ("threshold", "argmax"):
            raise ValueError(f"entailment_rule={self.entailment_rule!r} is not supported; use 'threshold' or 'argmax'")
        for name in ("entailment_threshold", "contradiction_threshold", "accept_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value} must be within [0, 1]")
        for name in ("min_citation_recall", "window_entailment_threshold"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value} must be within [0, 1] (or None)")

    def for_engine(self, engine: Any) -> CheckConfig:
        """This config with the engine's defaults where it has None: ``window_entailment_threshold`` from
        ``engine``'s window policy when the policy names one (an engine without a ``window_planner`` changes
        nothing), ``align_units`` from its model's manifest (False without one)."""
        bar = window_threshold(engine)
        changes: dict[str, Any] = {}
        if self.window_entailment_threshold is None and bar is not None:
            changes["window_entailment_threshold"] = bar
        if self.align_units is None:
            changes["align_units"] = model_aligns_units(engine)
        return replace(self, **changes) if changes else self

    def entails(self, probs: np.ndarray, windowed: bool = False) -> bool:
        """The entailment decision for one probability row, entailment last (3-way or 2-way head); ``windowed``:
        the row is the deciding window's of a premise read in windows."""
        if self.entailment_rule == "argmax":
            return int(np.argmax(probs)) == len(probs) - 1
        bar = self.window_entailment_threshold if windowed else None
        return float(probs[ENTAILMENT_COLUMN]) > (self.entailment_threshold if bar is None else bar)


@dataclass
class StatementCheck:
    """The checks of one statement (fields are None where the check did not apply).

    Attributes:
        text: the statement, citations stripped (the hypothesis of every pair).
        citations: 0-based indices of the cited documents that exist.
        invalid_citations: out-of-range citation numbers as written (1-based).
        corroboration: max P(entailment) over the verifier's sentences (None without a verifier answer).
        contradiction: max P(contradiction) over the verifier's sentences (None with a 2-way head).
        corroborated: some verifier sentence entails the statement.
        contradicted: ``contradiction > contradiction_threshold`` (None with a 2-way head).
        best_sentence: index of the verifier sentence with the highest P(entailment).
        citation_entailment: P(entailment) of the cited documents joined → statement (None when the statement cites
            nothing valid or cites an out-of-range number); for cited documents read in windows, the best
            window's.
        citation_window: the window of the cited documents that gave ``citation_entailment`` (0-based, in the order
            of :meth:`fastnli.NLIEngine.windows`); None when they were read whole.
        supported: ALCE citation recall of the statement.
        relevant_citations: per valid citation (same order as ``citations``), whether it is relevant.
        truncated: some premise checked against this statement was read cut to the model limit.
    """

    text: str
    citations: list[int] = field(default_factory=list)
    invalid_citations: list[int] = field(default_factory=list)
    corroboration: float | None = None
    contradiction: float | None = None
    corroborated: bool | None = None
    contradicted: bool | None = None
    best_sentence: int | None = None
    citation_entailment: float | None = None
    citation_window: int | None = None
    supported: bool = False
    relevant_citations: list[bool] = field(default_factory=list)
    truncated: bool = False


@dataclass
class AnswerCheck:
    """The checks of one answer.

    Attributes:
        answer: the answer as given.
        statements: one :class:`StatementCheck` per statement.
        verifier_sentences: the verifier answer's sentences (premises), None without a verifier answer.
        consistency: mean corroboration (None without a verifier answer).
        corroborated_share: corroborated statements / statements.
        contradicted: some statement is contradicted.
        accepted: the acceptance rule of :class:`CheckConfig` holds (None without a verifier answer).
        citation_recall: ALCE citation recall (None with ``check_citations=False``).
        citation_precision: ALCE citation precision.
        num_citations: citations written, out-of-range ones included.
        invalid_citations: out-of-range citation numbers of the whole answer, as written.
        cited_documents: 0-based indices of the documents cited, sorted.
        truncated_documents: cited documents (0-based) whose text alone is estimated to exceed the model limit (with
            ``long_premise="chunk"`` they are read in windows, not truncated).
        truncated_pairs: planned pairs the model read cut to its limit.
        chunked_pairs: planned pairs whose premise was read in windows.
        rouge_l: ROUGE-L F1 between answer and verifier answer (lexical, reported only).
        nli_pairs: pairs this answer sent to the engine, per check (before the engine's dedup).
        notes: human-readable remarks (no statements, empty verifier answer, truncation, ...).
    """

    answer: str
    statements: list[StatementCheck]
    verifier_sentences: list[str] | None = None
    consistency: float | None = None
    corroborated_share: float | None = None
    contradicted: bool | None = None
    accepted: bool | None = None
    citation_recall: float | None = None
    citation_precision: float | None = None
    num_citations: int = 0
    invalid_citations: list[int] = field(default_factory=list)
    cited_documents: list[int] = field(default_factory=list)
    truncated_documents: list[int] = field(default_factory=list)
    truncated_pairs: int = 0
    chunked_pairs: int = 0
    rouge_l: float | None = None
    nli_pairs: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AnswerInput:
    """One answer to check.

    Attributes:
        answer: the answer with ALCE citations; ``[n]`` cites ``documents[n - 1]``.
        documents: the documents the citation numbers refer to (numbers above ``len(documents)`` are out of range).
        verifier_answer: the verifier's answer to corroborate against (default None: citation checks only).
        statements: pre-split statements (default None: :func:`~fastnli.calm.statements.split_statements`).
    """

    answer: str
    documents: Sequence[Document]
    verifier_answer: str | None = None
    statements: list[Statement] | None = None


class PairPlan:
    """Collects (premise, hypothesis) pairs for one engine pass, expands long premises into windows and reads the
    windows' probabilities back per pair.

    Args:
        max_length: the model limit in tokens (default 512), for the ``truncated`` estimate of engines that cannot
            tokenize.
    """

    def __init__(self, max_length: int = DEFAULT_MAX_LENGTH) -> None:
        self.max_length = max_length
        self.pairs: list[tuple[str, str]] = []
        #: per pair, the model reads it cut (an estimate until :meth:`expand` measured the pairs)
        self.overflow: list[bool] = []
        #: the pairs measured and long premises expanded (None: not expanded, the model reads ``pairs``)
        self.windows: PairWindows | None = None

    def __len__(self) -> int:
        return len(self.pairs)

    def align(self) -> None:
        """Write every hypothesis's quantities in its premise's units (:func:`fastnli.scorers.units.align_units`);
        the planned rows stay as they are."""
        self.pairs = [(p, align_units(p, h)) for p, h in self.pairs]

    def add(self, premise: str, hypothesis: str) -> int:
        """Plan one pair; returns its row in :meth:`read`'s output."""
        self.pairs.append((premise, hypothesis))
        self.overflow.append(pair_overflows(premise, hypothesis, self.max_length))
        return len(self.pairs) - 1

    def expand(self, engine: Any, long_premise: LongPremise = "chunk", align: bool = False) -> None:
        """Measure the pairs with the engine's tokenizer and cut long premises into windows (``"chunk"``); an
        engine without a ``window_planner`` (a stub) keeps the pairs whole and the token estimate's flags.
        ``align``: first write the hypotheses' quantities in their premises' units (:meth:`align`)."""
        if align:
            self.align()
        planner = getattr(engine, "window_planner", None)
        if planner is None or not self.pairs:
            return
        self.windows = planner.plan([p for p, _ in self.pairs], [h for _, h in self.pairs], long_premise)
        self.overflow = self.windows.truncated.tolist()

    @property
    def model_pairs(self) -> list[tuple[str, str]]:
        """The pairs the model reads: windows expanded (after :meth:`expand`), else :attr:`pairs`."""
        return self.windows.pairs if self.windows is not None else self.pairs

    @property
    def chunked(self) -> list[bool]:
        """Per pair, whether its premise is read in windows."""
        return self.windows.chunked.tolist() if self.windows is not None else [False] * len(self.pairs)

    def read(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rows (len(pairs), k), best_window (len(pairs),))`` from the probabilities of :attr:`model_pairs`; a pair
        whose hypothesis is its premise (surrounding whitespace aside) reads as entailment, one-hot.

        Raises:
            ValueError: when ``probs`` does not have one row per model pair.
        """
        probs = np.asarray(probs, dtype=np.float32)
        if probs.ndim != 2 or probs.shape[0] != len(self.model_pairs):
            raise ValueError(f"probs has shape {probs.shape}; the plan needs one row per model pair "
                             f"({len(self.model_pairs)} rows)")
        if self.windows is None:
            rows, best = probs, np.full(len(self.pairs), -1, dtype=np.int64)
        else:
            rows, best = self.windows.aggregate(probs)
        same = [i for i, (p, h) in enumerate(self.pairs) if p.strip() == h.strip()]
        if same:  # a text entails itself, whatever a small model reads into a short one ("212 °F" against "212 °F")
            rows = rows.copy()  # the caller's array stays as it was
            rows[same] = 0.0
            rows[same, -1] = 1.0
            best[same] = -1
        return rows, best

    def warn_truncation(self) -> None:
        """Log one warning when some planned pairs are read cut to the model limit."""
        n_over = sum(self.overflow)
        if n_over:
            measured = "exceed" if self.windows is not None else "are estimated to exceed"
            logger.warning("%d of %d NLI pairs %s the model limit of %d tokens and are read truncated "
                           "longest_first (the premise, usually the documents, loses its end); the results flag them "
                           "as truncated", n_over, len(self.pairs), measured, self.max_length)

    def run(self, engine: EngineLike, long_premise: LongPremise = "chunk", align: bool = False
            ) -> tuple[np.ndarray, np.ndarray, Any]:
        """The one engine call: ``(rows (N, k), best_window (N,), the engine's CallStats or None when nothing was
        planned)``; units aligned (``align``) and long premises expanded first (:meth:`expand`); rows as
        :meth:`read` gives them."""
        if not self.pairs:
            return np.zeros((0, 3), dtype=np.float32), np.zeros(0, dtype=np.int64), None
        self.expand(engine, long_premise, align)
        self.warn_truncation()
        probs, stats = engine.predict_with_stats(self.model_pairs)
        probs = np.asarray(probs, dtype=np.float32)
        if probs.ndim != 2 or probs.shape[0] != len(self.model_pairs):
            raise ValueError(f"the engine returned probabilities of shape {probs.shape} for "
                             f"{len(self.model_pairs)} pairs; expected (N, k)")
        rows, best = self.read(probs)
        return rows, best, stats


def engine_max_length(engine: Any) -> int:
    """The engine's pair limit in tokens (``engine.manifest.max_length``), 512 when it does not say."""
    value = getattr(getattr(engine, "manifest", None), "max_length", None)
    return int(value) if isinstance(value, int) and value > 0 else DEFAULT_MAX_LENGTH


_WORD = re.compile(r"\w+", re.UNICODE)


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 (β = 1) of two texts over lower-cased ``\\w+`` tokens; 0.0 when either is empty."""
    a = _WORD.findall(candidate.lower())
    b = _WORD.findall(reference.lower())
    if not a or not b:
        return 0.0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, start=1):
            cur[j] = prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1])
        prev = cur
    lcs = prev[-1]
    if lcs == 0:
        return 0.0
    p, r = lcs / len(a), lcs / len(b)
    return 2 * p * r / (p + r)


@dataclass
class _StatementPlan:
    statement: Statement
    corroboration: list[int] = field(default_factory=list)  # one pair per verifier sentence
    joint: int | None = None
    single: list[int] = field(default_factory=list)  # per valid citation (multi-citation statements)
    rest: list[int] = field(default_factory=list)  # leave-one-out, per valid citation


@dataclass
class _AnswerPlan:
    item: AnswerInput
    statements: list[_StatementPlan]
    verifier_sentences: list[str] | None
    nli_pairs: dict[str, int]


def _split(item: AnswerInput) -> tuple[list[Statement], list[str] | None]:
    """The statements of ``item``'s answer and its verifier's sentences (None without a verifier answer)."""
    statements = item.statements if item.statements is not None else split_statements(item.answer,
                                                                                     len(item.documents))
    verifier = None
    if item.verifier_answer is not None:
        verifier = [t for t in (strip_citations(s) for s in split_sentences(item.verifier_answer)) if t]
    return list(statements), verifier


def _citation_pairs(statement: Statement, config: CheckConfig) -> int:
    """How many citation pairs one statement needs: joint, and one single + one rest per citation when it has more
    than one; none when citations are not checked, absent or out of range."""
    n = len(statement.citations)
    if not (config.check_citations and n and not statement.invalid_citations):
        return 0
    return 1 + (2 * n if n > 1 else 0)


@dataclass(frozen=True)
class CheckCost:
    """What :func:`plan_checks` would plan, counted without building it: ``pairs`` NLI pairs holding ``chars``
    characters of premise and hypothesis text (cited documents repeat in every citation pair of a statement)."""

    pairs: int
    chars: int


def _document_chars(doc: Document) -> int:
    """Characters of one document in :func:`~fastnli.calm.documents.premise_text` (``"Title: t\\n"`` + text)."""
    return len(doc.text) + (len(doc.title) + 8 if doc.title else 0)


def check_cost(answers: Sequence[AnswerInput], config: CheckConfig | None = None) -> CheckCost:
    """The pairs and text :func:`plan_checks` would plan for ``answers``, in time linear in their text.

    A service refuses an over-limit request with it before any pair exists: the pairs grow with statements x
    verifier sentences, and the premises of a statement's citation pairs repeat its cited documents."""
    config = config or CheckConfig()
    pairs = chars = 0
    for item in answers:
        docs = list(item.documents)
        statements, verifier = _split(item)
        sentences = verifier or []
        verifier_chars = sum(len(v) for v in sentences)
        for st in statements:
            h = len(st.text)
            pairs += len(sentences)
            chars += verifier_chars + h * len(sentences)
            n_pairs = _citation_pairs(st, config)
            if not n_pairs:
                continue
            pairs += n_pairs
            cites = list(st.citations)
            sizes = [_document_chars(docs[c]) for c in cites]
            total, n = sum(sizes), len(cites)
            chars += total + n - 1 + h  # joint: every cited document, newline-separated
            if n > 1:
                times = Counter(cites)
                chars += total + n * h  # one pair per cited document alone
                for c, size in zip(cites, sizes):  # the rest: every cited document but this one
                    m = n - times[c]
                    chars += total - times[c] * size + max(m - 1, 0) + h
    return CheckCost(pairs, chars)


def _plan_answer(plan: PairPlan, item: AnswerInput, config: CheckConfig) -> _AnswerPlan:
    docs = list(item.documents)
    statements, verifier = _split(item)
    counts = {"corroboration": 0, "citation": 0}
    plans = []
    for st in statements:
        sp = _StatementPlan(st)
        for v in verifier or ():
            sp.corroboration.append(plan.add(v, st.text))
        counts["corroboration"] += len(sp.corroboration)
        cites = list(st.citations)
        if _citation_pairs(st, config):
            before = len(plan)
            sp.joint = plan.add(premise_text([docs[c] for c in cites]), st.text)
            if len(cites) > 1:
                sp.single = [plan.add(premise_text([docs[c]]), st.text) for c in cites]
                sp.rest = [plan.add(premise_text([docs[o] for o in cites if o != c]), st.text) for c in cites]
            counts["citation"] += len(plan) - before
        plans.append(sp)
    return _AnswerPlan(item, plans, verifier, counts)


def _finish_answer(ap: _AnswerPlan, probs: np.ndarray, best_window: np.ndarray, pair_plan: PairPlan,
                   config: CheckConfig) -> AnswerCheck:
    item, docs = ap.item, list(ap.item.documents)
    overflow, chunked, max_length = pair_plan.overflow, pair_plan.chunked, pair_plan.max_length
    three_way = probs.shape[1] == len(CANONICAL_LABELS)
    checks: list[StatementCheck] = []
    notes: list[str] = []
    n_citations, n_relevant = 0, 0
    invalid: dict[int, None] = {}
    cited: set[int] = set()
    truncated_pairs = chunked_pairs = 0
    for sp in ap.statements:
        st = sp.statement
        sc = StatementCheck(text=st.text, citations=list(st.citations), invalid_citations=list(st.invalid_citations))
        rows = sp.corroboration + ([sp.joint] if sp.joint is not None else []) + sp.single + sp.rest
        sc.truncated = any(overflow[r] for r in rows)
        truncated_pairs += sum(overflow[r] for r in rows)
        chunked_pairs += sum(chunked[r] for r in rows)
        if ap.verifier_sentences is not None:
            if sp.corroboration:
                P = probs[sp.corroboration]
                best = int(np.argmax(P[:, ENTAILMENT_COLUMN]))
                sc.corroboration = float(P[best, ENTAILMENT_COLUMN])
                sc.contradiction = float(P[:, CONTRADICTION].max()) if three_way else None
                sc.corroborated = any(config.entails(probs[r], chunked[r]) for r in sp.corroboration)
                sc.best_sentence = best
            else:
                sc.corroboration, sc.corroborated = 0.0, False
                sc.contradiction = 0.0 if three_way else None
            sc.contradicted = sc.contradiction > config.contradiction_threshold if sc.contradiction is not None \
                else None
        if sp.joint is not None:
            sc.citation_entailment = float(probs[sp.joint, ENTAILMENT_COLUMN])
            sc.citation_window = int(best_window[sp.joint]) if best_window[sp.joint] >= 0 else None
            sc.supported = config.entails(probs[sp.joint], chunked[sp.joint])
            if not sc.supported:
                sc.relevant_citations = [False] * len(st.citations)
            elif len(st.citations) == 1:
                sc.relevant_citations = [True]
            else:
                sc.relevant_citations = [config.entails(probs[s], chunked[s]) or not config.entails(probs[r], chunked[r])
                                         for s, r in zip(sp.single, sp.rest)]
        else:
            sc.relevant_citations = [False] * len(st.citations)
        n_citations += st.num_citations
        n_relevant += sum(sc.relevant_citations)
        invalid.update(dict.fromkeys(st.invalid_citations))
        cited.update(st.citations)
        checks.append(sc)
    n = len(checks)
    out = AnswerCheck(answer=item.answer, statements=checks, verifier_sentences=ap.verifier_sentences,
                      num_citations=n_citations, invalid_citations=list(invalid), cited_documents=sorted(cited),
                      truncated_pairs=truncated_pairs, chunked_pairs=chunked_pairs, nli_pairs=ap.nli_pairs,
                      notes=notes)
    out.truncated_documents = [c for c in out.cited_documents if pair_overflows(premise_text([docs[c]]), "",
                                                                                max_length)]
    if n == 0:
        notes.append("the answer has no statements")
    if invalid:
        notes.append(f"citations out of range: {sorted(invalid)} (the prompt numbered documents 1..{len(docs)})")
    if truncated_pairs:
        how = "measured" if pair_plan.windows is not None else "estimated"
        notes.append(f"{truncated_pairs} NLI pair(s) {how} over the model limit of {max_length} tokens were "
                     "truncated by the engine (longest_first)")
    if chunked_pairs:
        notes.append(f"{chunked_pairs} NLI pair(s) over the model limit of {max_length} tokens were read in windows "
                     "(the deciding window's probabilities count)")
    if not three_way and ap.verifier_sentences is not None:
        notes.append("the NLI model has a 2-way head: contradiction is not checked")
    if config.check_citations:
        out.citation_recall = sum(c.supported for c in checks) / n if n else 0.0
        out.citation_precision = n_relevant / n_citations if n_citations else 0.0
    if ap.verifier_sentences is not None:
        if not ap.verifier_sentences:
            notes.append("the verifier answer has no sentences")
        out.consistency = sum(c.corroboration or 0.0 for c in checks) / n if n else 0.0
        out.corroborated_share = sum(bool(c.corroborated) for c in checks) / n if n else 0.0
        out.contradicted = any(bool(c.contradicted) for c in checks)
        out.accepted = (n > 0 and out.corroborated_share >= config.accept_share and not out.contradicted
                        and (config.min_citation_recall is None
                             or (out.citation_recall or 0.0) >= config.min_citation_recall))
        out.rouge_l = rouge_l(strip_citations(item.answer), item.verifier_answer or "")
    return out


@dataclass
class CheckPlan:
    """The NLI pairs a set of answers needs, and how to read their checks back from the probabilities.

    Made by :func:`plan_checks`. :meth:`expand` measures the pairs with an engine's tokenizer and cuts long
    premises into windows (``config.long_premise``); :attr:`model_pairs` then go to any engine (or a service's shared
    batcher) and :func:`finish_checks` turns their probabilities into :class:`AnswerCheck` s.
    """

    pair_plan: PairPlan = field(repr=False)
    answers: list[_AnswerPlan] = field(repr=False)
    config: CheckConfig

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """The planned (premise, hypothesis) pairs, long premises whole."""
        return self.pair_plan.pairs

    @property
    def model_pairs(self) -> list[tuple[str, str]]:
        """The pairs the model reads: :attr:`pairs` with long premises expanded into windows after :meth:`expand`."""
        return self.pair_plan.model_pairs

    @property
    def max_length(self) -> int:
        return self.pair_plan.max_length

    def expand(self, engine: Any) -> CheckPlan:
        """Measure the pairs with ``engine``'s tokenizer and cut long premises (``config.long_premise``), and take
        the engine's defaults into the config (:meth:`CheckConfig.for_engine`; with ``align_units`` the statements'
        quantities are written in their premises' units first); returns self. An engine without a tokenizer (a stub)
        leaves the pairs whole."""
        self.config = self.config.for_engine(engine)
        self.pair_plan.expand(engine, self.config.long_premise, bool(self.config.align_units))
        return self


def plan_checks(answers: Sequence[AnswerInput], config: CheckConfig | None = None,
                max_length: int = DEFAULT_MAX_LENGTH) -> CheckPlan:
    """Plan the NLI pairs of :func:`check_answers` without running an engine.

    ``finish_checks(plan, engine.predict(plan.expand(engine).model_pairs))`` gives the checks of
    ``check_answers(answers, engine, config)``; ``max_length`` is the engine's pair limit in tokens
    (:func:`engine_max_length`), for the truncation estimate of engines that cannot tokenize.
    """
    config = config or CheckConfig()
    pair_plan = PairPlan(max_length)
    return CheckPlan(pair_plan, [_plan_answer(pair_plan, a, config) for a in answers], config)


def _finish(plan: CheckPlan, rows: np.ndarray, best_window: np.ndarray) -> list[AnswerCheck]:
    return [_finish_answer(ap, rows, best_window, plan.pair_plan, plan.config) for ap in plan.answers]


def finish_checks(plan: CheckPlan, probs: np.ndarray) -> list[AnswerCheck]:
    """The checks of ``plan`` from the probabilities of its :attr:`~CheckPlan.model_pairs` ``(len(model_pairs),
    k)``, entailment last (``(contradiction, neutral, entailment)`` or a 2-way head's ``(not_entailment,
    entailment)``).

    Raises:
        ValueError: when ``probs`` does not have one row per model pair.
    """
    rows, best = plan.pair_plan.read(probs)
    return _finish(plan, rows, best)


def check_answers(answers: Sequence[AnswerInput], engine: EngineLike, config: CheckConfig | None = None
                  ) -> tuple[list[AnswerCheck], Any]:
    """Check many answers with ONE engine pass (see the module docstring for every rule).

    Args:
        answers: the answers, each with its documents and optionally a verifier answer.
        engine: an :class:`~fastnli.NLIEngine` (or anything with ``predict_with_stats(pairs)``).
        config: decision rules (default :class:`CheckConfig()`; a ``window_entailment_threshold`` of None takes the
            engine's, :meth:`CheckConfig.for_engine`).

    Returns:
        ``(checks, stats)``: one :class:`AnswerCheck` per answer in input order, and the engine's ``CallStats`` of
        the pass (None when no pair was needed and the engine was not called).
    """
    plan = plan_checks(answers, (config or CheckConfig()).for_engine(engine), engine_max_length(engine))
    rows, best, stats = plan.pair_plan.run(engine, plan.config.long_premise, bool(plan.config.align_units))
    return _finish(plan, rows, best), stats
