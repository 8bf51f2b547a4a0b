"""``fastnli.score``: NCP and its sibling scorers for many prompts from one scheduled engine pass.

All directed pairs that the requested scorers need, for all prompts, are collected first and sent to the engine in
one :meth:`~fastnli.engine.NLIEngine.predict` call (the engine dedups across prompts and packs by length); the
scorers then read the probabilities back (:mod:`fastnli.scorers.formulas`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from fastnli.engine import CallStats, NLIEngine, default_engine
from fastnli.engine.labels import CANONICAL_LABELS, require_three_way
from fastnli.scorers import formulas
from fastnli.scorers.questions import (
    QUESTION_FORMAT,
    check_question_aware,
    model_question_format,
    resolve_question_format,
    validate_prompts,
    with_question,
)
from fastnli.scorers.units import align_units as align_pair
from fastnli.scorers.units import model_aligns_units, resolve_align_units

SCORERS: tuple[str, ...] = ("noncontradiction", "entailment", "semantic_negentropy", "semantic_sets_confidence")
_SEMANTIC = {"semantic_negentropy", "semantic_sets_confidence"}
#: uqlm's ``max_length``: NLI sees at most this many characters of each text (uqlm 0.6.7 cuts before tokenising).
UQLM_MAX_LENGTH = 2000

logger = logging.getLogger("fastnli")
#: ``_Prompt.index`` of a pair whose hypothesis, once its units are aligned, is the premise: scored as identical
#: strings are, without the model
SAME_TEXT = -2


@dataclass
class ScoreRow:
    """Scores of one response (``None`` for scorers not requested). All scores are in [0, 1], 1 = consistent."""

    index: int
    response: str
    num_samples: int
    noncontradiction: float | None = None
    entailment: float | None = None
    semantic_negentropy: float | None = None
    semantic_sets_confidence: float | None = None
    num_semantic_sets: int | None = None
    best_response: str | None = None  # set with use_best=True: the response the consistency scores refer to
    matrix: np.ndarray | None = field(default=None, repr=False)  # (k, k, 3) over matrix_texts, with return_matrix
    matrix_texts: list[str] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.matrix is None:
            d.pop("matrix")
            d.pop("matrix_texts")
        else:
            d["matrix"] = self.matrix.tolist()
        return d


@dataclass
class ScoreResult:
    """One row per response, in input order, plus what the engine did (``stats``, ``device``, ``precision``)."""

    rows: list[ScoreRow]
    scorers: tuple[str, ...]
    stats: CallStats
    device: str
    precision: str
    seconds: float
    question_format: str | None = None  # the question-aware input form used, or None: the answers alone
    align_units: bool = False  # whether hypotheses' quantities were rewritten in the premise's units

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[ScoreRow]:
        return iter(self.rows)

    def __getitem__(self, i: int) -> ScoreRow:
        return self.rows[i]

    def column(self, scorer: str) -> list[float | None]:
        """The values of one scorer, in input order."""
        return [getattr(r, scorer) for r in self.rows]

    def to_records(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.rows]

    def to_json(self) -> str:
        return json.dumps({"rows": self.to_records(), "scorers": list(self.scorers), "device": self.device,
                           "precision": self.precision, "seconds": self.seconds, "stats": self.stats.as_dict()})

    def to_df(self) -> Any:
        """A pandas DataFrame of the rows (needs pandas)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_df() needs pandas: pip install pandas") from None
        return pd.DataFrame(self.to_records())


def validate_inputs(responses: Any, sampled_responses: Any) -> None:
    """Raise TypeError/ValueError naming the index and field of the first bad input."""
    for name, value in (("responses", responses), ("sampled_responses", sampled_responses)):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise TypeError(f"{name} must be a list; got {type(value).__name__}")
    if len(responses) != len(sampled_responses):
        raise ValueError(f"responses has {len(responses)} items but sampled_responses has {len(sampled_responses)}; "
                         "give one list of sampled responses per response")
    for i, (r, samples) in enumerate(zip(responses, sampled_responses)):
        if not isinstance(r, str):
            raise TypeError(f"responses[{i}] must be str; got {type(r).__name__}")
        if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence):
            raise TypeError(f"sampled_responses[{i}] must be a list of strings; got {type(samples).__name__}")
        if len(samples) == 0:
            raise ValueError(f"sampled_responses[{i}] is empty; each response needs at least one sampled response")
        for j, s in enumerate(samples):
            if not isinstance(s, str):
                raise TypeError(f"sampled_responses[{i}][{j}] must be str; got {type(s).__name__}")


def check_scorers(scorers: Sequence[str]) -> tuple[str, ...]:
    """``scorers`` (one name or several) as a tuple of known scorer names; ValueError names the unknown ones."""
    if isinstance(scorers, str):
        scorers = (scorers,)
    bad = [s for s in scorers if s not in SCORERS]
    if bad or not scorers:
        raise ValueError(f"scorers={list(scorers)!r}: unknown {bad}; choose from {list(SCORERS)}")
    return tuple(dict.fromkeys(scorers))


@dataclass
class _Prompt:
    texts: list[str]  # [response] + samples
    uniq: list[str]
    pos: list[int]  # text position -> row in uniq
    index: np.ndarray  # (k, k) global pair index, -1 where not needed, SAME_TEXT where the pair is one text


def _plan(responses: Sequence[str], samples: Sequence[Sequence[str]], full: bool, max_length: int | None = None,
          questions: Sequence[str] | None = None, question_format: str = QUESTION_FORMAT, align_units: bool = False
          ) -> tuple[list[tuple[str, str]], list[_Prompt]]:
    """All directed pairs the scorers need, and each prompt's map into them.

    Identity (which texts are "the same string", scored 1 without the model) is decided on the full texts; the
    pairs sent to the engine carry the texts cut to ``max_length`` characters, as uqlm's NLI cuts them, the
    hypothesis's quantities in the premise's units with ``align_units``
    (:func:`~fastnli.scorers.units.align_units`), each text put after its prompt's question when ``questions`` are
    given.
    """
    pairs: list[tuple[str, str]] = []
    prompts = []
    for i, (r, s) in enumerate(zip(responses, samples)):
        texts = [r, *s]
        uniq = list(dict.fromkeys(texts))
        row = {t: u for u, t in enumerate(uniq)}
        cut = uniq if max_length is None else [t[:max_length] for t in uniq]
        question = None if questions is None else questions[i]
        shown = cut if question is None else [with_question(question, t, question_format) for t in cut]
        k = len(uniq)
        index = np.full((k, k), -1, dtype=np.int64)
        for a in range(k) if full else (0,):
            for b in range(k) if full else range(1, k):
                if a != b:
                    index[a, b] = _add_pair(pairs, cut, shown, a, b, question, question_format, align_units)
                    if not full:
                        index[b, a] = _add_pair(pairs, cut, shown, b, a, question, question_format, align_units)
        prompts.append(_Prompt(texts, uniq, [row[t] for t in texts], index))
    return pairs, prompts


def _add_pair(pairs: list[tuple[str, str]], cut: list[str], shown: list[str], a: int, b: int, question: str | None,
              question_format: str, align_units: bool) -> int:
    """Append the NLI pair of answers ``a`` -> ``b`` to ``pairs``: ``shown`` (each of the ``cut`` texts in the plan's
    input form) unless alignment rewrote the hypothesis. Returns its index, or :data:`SAME_TEXT` (nothing appended)
    when the aligned hypothesis is the premise itself."""
    if align_units:
        aligned = align_pair(cut[a], cut[b])
        if aligned == cut[a]:  # the same text once aligned: identical strings, as on the diagonal
            return SAME_TEXT
        if aligned != cut[b]:
            pairs.append((shown[a], aligned if question is None else with_question(question, aligned, question_format)))
            return len(pairs) - 1
    pairs.append((shown[a], shown[b]))
    return len(pairs) - 1


def _pairs_for(k: int, full: bool) -> int:
    """Directed pairs :func:`_plan` makes for ``k`` unique texts: all ordered pairs when ``full``, else the
    response against each other text, both ways."""
    return k * (k - 1) if full else 2 * max(k - 1, 0)


def count_pairs(responses: Sequence[str], sampled_responses: Sequence[Sequence[str]],
                scorers: Sequence[str] = ("noncontradiction",), return_matrix: bool = False) -> int:
    """How many NLI pairs :func:`plan_scores` plans (at most: with ``align_units`` a pair that becomes one text needs
    no model), computed in time linear in the texts without building a pair.

    ``k`` unique texts (a response and its samples) need ``k(k - 1)`` pairs with a semantic scorer (or
    ``return_matrix``), else ``2(k - 1)``; a service refuses an over-limit request with it before any pair exists.
    Inputs are not validated here (:func:`plan_scores` does that).
    """
    full = bool(_SEMANTIC & set(scorers)) or return_matrix
    return sum(_pairs_for(len(dict.fromkeys([r, *s])), full) for r, s in zip(responses, sampled_responses))


def _matrix(p: _Prompt, probs: np.ndarray) -> np.ndarray:
    k = len(p.uniq)
    P = np.zeros((k, k, 3), dtype=np.float32)
    have = p.index >= 0
    P[have] = probs[p.index[have]]
    P[np.arange(k), np.arange(k)] = (0.0, 0.0, 1.0)  # identical strings: entailment by definition (as uqlm)
    P[p.index == SAME_TEXT] = (0.0, 0.0, 1.0)
    return P


@dataclass
class ScorePlan:
    """The directed pairs a set of responses needs, and how to read the scorers back from their probabilities.

    Made by :func:`plan_scores`; ``pairs`` go to any engine (or a service's shared batcher) and
    :func:`score_rows` turns the probabilities, row ``i`` for ``pairs[i]``, into :class:`ScoreRow` s.
    """

    pairs: list[tuple[str, str]]
    prompts: list[_Prompt] = field(repr=False)
    scorers: tuple[str, ...]
    use_best: bool = False
    return_matrix: bool = False
    align_units: bool = False


def check_max_length(max_length: int | None) -> None:
    """Raise ValueError unless ``max_length`` is a positive number of characters or None."""
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise ValueError(f"max_length must be a positive number of characters or None; got {max_length!r}")


def _build_plan(responses: Sequence[str], sampled_responses: Sequence[Sequence[str]], scorer_set: tuple[str, ...],
                use_best: bool, return_matrix: bool, max_length: int | None,
                questions: Sequence[str] | None = None, question_format: str = QUESTION_FORMAT,
                align_units: bool = False) -> ScorePlan:
    full = bool(_SEMANTIC & set(scorer_set)) or return_matrix
    pairs, prompts = _plan(responses, sampled_responses, full, max_length, questions, question_format, align_units)
    if max_length is not None and any(len(t) > max_length for p in prompts for t in p.uniq):
        logger.info("texts longer than max_length=%d characters are cut before NLI (as uqlm does)", max_length)
    return ScorePlan(pairs, prompts, scorer_set, use_best, return_matrix, align_units)


def _checked(responses: Sequence[str], sampled_responses: Sequence[Sequence[str]], scorers: Sequence[str],
             max_length: int | None, questions: Sequence[str] | None) -> tuple[tuple[str, ...], list[str] | None]:
    """Every input check of :func:`plan_scores` and :func:`score`: the scorer names and the questions, validated."""
    scorer_set = check_scorers(scorers)
    validate_inputs(responses, sampled_responses)
    check_max_length(max_length)
    return scorer_set, None if questions is None else validate_prompts(questions, len(responses))


def plan_scores(
    responses: Sequence[str],
    sampled_responses: Sequence[Sequence[str]],
    scorers: Sequence[str] = ("noncontradiction",),
    use_best: bool = False,
    return_matrix: bool = False,
    max_length: int | None = UQLM_MAX_LENGTH,
    questions: Sequence[str] | None = None,
    question_format: str = QUESTION_FORMAT,
    align_units: bool = False,
) -> ScorePlan:
    """Validate the inputs and plan the NLI pairs of :func:`score` without running an engine.

    Arguments and defaults are :func:`score`'s, except that the input forms are decided by the caller:
    ``questions`` (one per response, or None: the answers alone) are used as given, in ``question_format``
    (:func:`~fastnli.scorers.questions.resolve_question_format` decides it from ``score``'s arguments), and
    ``align_units`` as given (:func:`~fastnli.scorers.units.resolve_align_units` decides it).
    ``score_rows(plan, engine.predict(plan.pairs))`` gives the same rows as ``score(...)``; a service uses it to
    send the pairs of many requests through one shared batcher.

    Raises:
        TypeError / ValueError: as :func:`score`, naming the offending index and field.
    """
    scorer_set, questions = _checked(responses, sampled_responses, scorers, max_length, questions)
    return _build_plan(responses, sampled_responses, scorer_set, use_best, return_matrix, max_length, questions,
                       question_format, align_units)


def score_rows(plan: ScorePlan, probs: np.ndarray) -> list[ScoreRow]:
    """The scorers of ``plan`` from the probabilities ``(len(plan.pairs), 3)`` (contradiction, neutral, entailment).

    Raises:
        ValueError: when ``probs`` does not have one row per planned pair.
    """
    probs = np.asarray(probs)
    if probs.shape != (len(plan.pairs), 3):
        raise ValueError(f"probs has shape {probs.shape}; the plan needs ({len(plan.pairs)}, 3), one row per pair")
    scorer_set = plan.scorers
    semantic = bool(_SEMANTIC & set(scorer_set))
    rows = []
    for i, p in enumerate(plan.prompts):
        P = _matrix(p, probs)
        m = len(p.texts) - 1
        row = ScoreRow(index=i, response=p.texts[0], num_samples=m)
        anchor = 0
        if semantic:
            clusters = formulas.cluster(P, p.pos)
            neg, sets_conf, n_sets = formulas.semantic_scores(clusters, m)
            if "semantic_negentropy" in scorer_set:
                row.semantic_negentropy = neg
            if "semantic_sets_confidence" in scorer_set:
                row.semantic_sets_confidence = sets_conf
            row.num_semantic_sets = n_sets
            if plan.use_best:
                row.best_response = formulas.best_response(p.texts, clusters)
                anchor = p.texts.index(row.best_response)
        if {"noncontradiction", "entailment"} & set(scorer_set):
            nc, en = formulas.noncontradiction_and_entailment(P, p.pos, anchor)
            if "noncontradiction" in scorer_set:
                row.noncontradiction = nc
            if "entailment" in scorer_set:
                row.entailment = en
        if plan.return_matrix:
            row.matrix, row.matrix_texts = P, p.uniq
        rows.append(row)
    return rows


def score(
    responses: Sequence[str],
    sampled_responses: Sequence[Sequence[str]],
    scorers: Sequence[str] = ("noncontradiction",),
    engine: NLIEngine | None = None,
    use_best: bool = False,
    return_matrix: bool = False,
    progress: Callable[[int, int], None] | None = None,
    max_length: int | None = UQLM_MAX_LENGTH,
    prompts: Sequence[str] | None = None,
    question_aware: bool | None = None,
    align_units: bool | None = None,
) -> ScoreResult:
    """Score each response against its sampled responses with NLI-based consistency scorers.

    Args:
        responses: the LLM's responses, one per prompt.
        sampled_responses: for each response, the m ≥ 1 sampled responses of the same prompt (m may differ between
            prompts; each prompt uses its own m).
        scorers: any of ``"noncontradiction"`` (NCP), ``"entailment"``, ``"semantic_negentropy"``,
            ``"semantic_sets_confidence"`` (default: NCP only). Formulas are uqlm's
            (:mod:`fastnli.scorers.formulas`).
        engine: the NLI engine (default: :func:`~fastnli.engine.default_engine`, the embedded default model,
            loaded once per process).
        use_best: as uqlm's ``use_best``: when a semantic scorer is requested, swap each response for the lead
            member of its most probable semantic cluster before computing NCP/entailment (default False: score the
            response given; uqlm's ``BlackBoxUQ`` defaults to True, so pass ``use_best=True`` with a semantic scorer
            for its numbers: docs/scorers.md). Without a semantic scorer it has no effect and a warning is logged.
        return_matrix: attach each prompt's pairwise probability matrix (distinct texts × distinct texts × 3, in
            the order contradiction, neutral, entailment; identical texts get (0, 0, 1)). Computes all pairs.
        progress: called after each engine batch with ``(pairs in that batch, pairs to score in all)``.
        max_length: as uqlm's ``max_length``: the model sees at most this many characters of each text (default
            2000, uqlm's default; uqlm cuts before tokenising, which changes what a long text keeps under the
            model's token limit). Identical texts are still recognised on the full strings. ``None``: no cut.
        prompts: the question of each response (optional). With a question-aware model each text goes to NLI as
            an answer to its question (:data:`~fastnli.scorers.questions.QUESTION_FORMAT`), so "1989" and "1991"
            are read as answers to "When did the Berlin Wall fall?".
        question_aware: None (default): use ``prompts`` only when the model was trained question-aware (its
            manifest's ``question_format``: the embedded default model); any other model gets uqlm's exact inputs.
            True: use them with any model; False: never. ``ScoreResult.question_format`` says what was used.
        align_units: rewrite the quantities of each pair's hypothesis in its premise's units, and its numbers of equal
            value in its premise's form, before NLI (:func:`~fastnli.scorers.units.align_units`: "354 miles" against
            "569 kilometres" is read as "569 kilometres", "182 miles" as "293 kilometres", "one hundred sixty-eight"
            against "168" as "168"). None (default): where the model's manifest says so
            (``align_units``: the embedded default model); any other model gets uqlm's exact inputs. True/False:
            always/never. ``ScoreResult.align_units`` says what was used.

    Returns:
        A :class:`ScoreResult` with one :class:`ScoreRow` per response, in input order.

    Raises:
        TypeError / ValueError: naming the offending index and field, before any model is loaded.
    """
    t0 = time.perf_counter()
    scorer_set, prompts = _checked(responses, sampled_responses, scorers, max_length, prompts)
    check_question_aware(question_aware, prompts)
    if use_best and not _SEMANTIC & set(scorer_set):
        logger.warning("use_best=True has no effect without a semantic scorer (semantic_negentropy or "
                       "semantic_sets_confidence in scorers): the best response comes from the semantic clusters, so "
                       "each response is scored as given (uqlm's BlackBoxUQ ignores it the same way)")
    if engine is None:
        engine = default_engine()
    require_three_way(getattr(engine, "labels", CANONICAL_LABELS), f"fastnli.score (scorers {list(scorer_set)})")
    fmt = resolve_question_format(question_aware, prompts, model_question_format(engine))
    aligned = resolve_align_units(align_units, model_aligns_units(engine))
    plan = _build_plan(responses, sampled_responses, scorer_set, use_best, return_matrix, max_length,
                       prompts if fmt else None, fmt or QUESTION_FORMAT, aligned)
    probs, stats = engine.predict_with_stats(plan.pairs, progress)  # the one scheduled engine pass
    rows = score_rows(plan, probs)
    return ScoreResult(rows=rows, scorers=plan.scorers, stats=stats, device=engine.device,
                       precision=engine.precision, seconds=time.perf_counter() - t0, question_format=fmt,
                       align_units=aligned)
