"""Long premises: read a premise that does not fit the model in overlapping, sentence-aligned windows.

A (premise, hypothesis) pair fits when ``premise tokens + hypothesis tokens + special tokens <= max_length`` (512
for DeBERTa), counted by the model's own tokenizer. What happens to a pair that does not fit is ``long_premise``:

- ``"truncate"``: the pair goes to the model whole and the tokenizer cuts it ``longest_first`` (the premise, usually
  the longer text, loses its end). The pair is reported as truncated (:attr:`PairWindows.truncated`, the call's
  ``CallStats.truncated_pairs`` and one log warning per call), never silently.
- ``"chunk"``: the premise is cut into windows of at most ``budget = max_length - special tokens - hypothesis
  tokens`` tokens. Windows are whole sentences (:func:`fastnli.engine.sentences.sentence_spans`) packed greedily in
  order; each window after the first starts with the last sentences of the one before, as many as fit in
  :attr:`WindowPolicy.overlap_tokens` while leaving room for the next new sentence; a single sentence longer than
  the budget is cut at token boundaries. Every window is checked with a real encode and the plan is redone with a
  smaller budget if a cut text tokenizes longer than its share. Each (window, hypothesis) is one model pair.

**Aggregation** (:meth:`PairWindows.aggregate`, :func:`deciding_rows`): a chunked pair's probabilities are those
of one of its windows, so the row still sums to 1, and that window's index is reported. A premise supports the
hypothesis when some window does; with a contradiction bar, it contradicts the hypothesis when no window supports it
and some window contradicts it:

- the *best window* is the one with the highest P(entailment) (the first on ties); when its P(entailment) is above
  the support threshold (:attr:`WindowPolicy.entailment_threshold`, else 0.5), its row is the pair's: entailment is
  the max over windows;
- else, with a three-way head, the window with the highest P(contradiction) (the first on ties) gives the row when
  that P(contradiction) is above :attr:`WindowPolicy.contradiction_threshold` (default None: this step is off; a
  model's manifest may name the bar it reads documents better with);
- else the best window's row, or with :attr:`WindowPolicy.fallback` ``"neutral"`` and a three-way head the row of
  the window with the highest P(neutral) (the first on ties): a document that neither supports nor contradicts the
  hypothesis reads neutral rather than as its most entailing window, whose own argmax may be contradiction.

A contradicting sentence in one window is thus not hidden behind an unrelated window that happens to read a little
more entailing. The max of several windows' scores runs higher than one reading's on text that says nothing about the
hypothesis, so a policy may name the P(entailment) a premise read in windows needs to count as support
(:attr:`WindowPolicy.entailment_threshold`; the CaLM checks and :func:`fastnli.grounding` apply it).

**The model's policy**: an artifact whose manifest names a ``window_policy`` (the embedded default model's is chosen
by measurement, ``tools/default_model/window_choice.py``; its model card gives the figures) gets that policy when
the engine is given none.

A hypothesis that leaves fewer than :attr:`WindowPolicy.min_window_tokens` tokens for the premise cannot be chunked
usefully; such a pair is read truncated and reported as truncated in both modes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fastnli.engine.sentences import sentence_spans
from fastnli.engine.tokenize import PairTokenizer

__all__ = ["DEFAULT_SUPPORT_THRESHOLD", "FALLBACKS", "LONG_PREMISE_MODES", "LongPremise", "PairWindows",
           "WindowPlanner", "WindowPolicy", "check_long_premise", "deciding_rows", "window_threshold"]

LongPremise = Literal["chunk", "truncate"]
LONG_PREMISE_MODES: tuple[str, ...] = ("chunk", "truncate")

#: :attr:`WindowPolicy.fallback`'s values: the window whose row a premise takes when none decides it.
FALLBACKS: tuple[str, ...] = ("entailment", "neutral")

#: The P(entailment) above which a window counts as support when a policy names no ``entailment_threshold``.
DEFAULT_SUPPORT_THRESHOLD = 0.5

#: Re-plans of one premise with a smaller budget when a window's text tokenizes longer than planned.
_MAX_REPLANS = 4

_VISIBLE = re.compile(r"\S")


def _check_fallback(value: str) -> None:
    if value not in FALLBACKS:
        raise ValueError(f"fallback={value!r} must be one of {', '.join(map(repr, FALLBACKS))}")


def check_long_premise(value: object, where: str = "long_premise") -> LongPremise:
    """Return ``value`` when it is ``"chunk"`` or ``"truncate"``; else raise ValueError naming ``where``."""
    if value not in LONG_PREMISE_MODES:
        raise ValueError(f"{where}={value!r} is not supported; use 'chunk' (read a long premise in windows) or "
                         "'truncate' (cut the pair to the model limit)")
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class WindowPolicy:
    """How long premises are cut.

    Attributes:
        overlap_tokens: a window after the first repeats the last sentences of the one before, as many as fit in
            this many tokens (default 64; 0 gives windows that do not overlap).
        min_window_tokens: the least room for the premise, in tokens, that makes chunking worthwhile (default 32);
            a pair whose hypothesis leaves less is read truncated, and reported so.
        max_window_tokens: a cap on the window size, in tokens (default None: as large as the pair limit allows);
            with a cap, ``"chunk"`` also cuts premises that would fit the model but exceed the cap.
        entailment_threshold: the P(entailment) above which a premise read in several windows (or a statement read
            against several sources) counts as support, in [0, 1] (default None: the caller's own threshold, as for
            a premise read whole); the aggregation's support bar is this, else 0.5.
        contradiction_threshold: with a three-way head, when no window of a premise is above the support bar, the
            window with the highest P(contradiction) gives the pair's row if that P(contradiction) is above this, in
            [0, 1] (default None: the best-entailment window's row always; a model's manifest names the bar it was
            measured to read better with).
        fallback: which window gives the row of a premise that no window supports and none contradicts above
            :attr:`contradiction_threshold`: ``"entailment"`` (default: the highest P(entailment), so entailment is
            the max over windows) or ``"neutral"`` (with a three-way head, the highest P(neutral)).
    """

    overlap_tokens: int = 64
    min_window_tokens: int = 32
    max_window_tokens: int | None = None
    entailment_threshold: float | None = None
    contradiction_threshold: float | None = None
    fallback: str = "entailment"

    def __post_init__(self) -> None:
        if self.overlap_tokens < 0:
            raise ValueError(f"overlap_tokens={self.overlap_tokens} must be >= 0")
        if self.min_window_tokens < 1:
            raise ValueError(f"min_window_tokens={self.min_window_tokens} must be >= 1")
        if self.max_window_tokens is not None and self.max_window_tokens < self.min_window_tokens:
            raise ValueError(f"max_window_tokens={self.max_window_tokens} must be >= min_window_tokens="
                             f"{self.min_window_tokens} (or None)")
        for name in ("entailment_threshold", "contradiction_threshold"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value} must be within [0, 1] (or None)")
        _check_fallback(self.fallback)

    @property
    def support_threshold(self) -> float:
        """The aggregation's support bar: :attr:`entailment_threshold`, else :data:`DEFAULT_SUPPORT_THRESHOLD`."""
        return DEFAULT_SUPPORT_THRESHOLD if self.entailment_threshold is None else self.entailment_threshold

    @classmethod
    def from_manifest(cls, value: object, where: str = "manifest window_policy") -> WindowPolicy:
        """The policy of a manifest's ``window_policy`` object (its keys are this class's fields).

        Raises:
            ValueError: naming ``where``, when ``value`` is not an object of known fields with valid values.
        """
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be an object of WindowPolicy fields; got {type(value).__name__}")
        try:
            return cls(**value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where} is not a valid WindowPolicy ({exc}); re-export the model") from None


def window_threshold(engine: object) -> float | None:
    """The support threshold of ``engine``'s window policy (:attr:`WindowPolicy.entailment_threshold`); None when it
    names none or the engine cannot read windows (no ``window_planner``)."""
    policy = getattr(getattr(engine, "window_planner", None), "policy", None)
    return getattr(policy, "entailment_threshold", None)


def _first_visible(text: str, offsets: np.ndarray) -> np.ndarray:
    """Each token's first character that is not whitespace (its own start when it is all whitespace): SentencePiece's
    ``▁word`` and byte-level BPE's ``Ġword`` spans begin at the space before the word, which belongs to the sentence
    before, as a token of spaces alone does."""
    starts = offsets[:, 0].copy()
    for t, (a, b) in enumerate(offsets.tolist()):
        if a < b and text[a].isspace():
            visible = _VISIBLE.search(text, a, b)
            starts[t] = visible.start() if visible else a
    return starts


def _units(starts: np.ndarray, sentences: Sequence[tuple[int, int]], n_tokens: int, budget: int
           ) -> list[tuple[int, int]]:
    """Token ranges ``[a, b)`` of the sentences (each token belongs to the sentence its first character is in),
    sentences longer than ``budget`` cut into pieces of ``budget`` tokens."""
    cuts = np.searchsorted(starts, [s for s, _ in sentences], side="left").tolist()
    bounds = sorted({0, n_tokens, *cuts})
    units: list[tuple[int, int]] = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        units.extend((x, min(x + budget, b)) for x in range(a, b, budget))
    return units


def window_ranges(units: Sequence[tuple[int, int]], budget: int, overlap_tokens: int) -> list[tuple[int, int]]:
    """Token ranges ``[a, b)`` of the windows over consecutive ``units`` (each at most ``budget`` tokens): greedy
    packing in order; the next window starts with the last units of the one before that fit in ``overlap_tokens``
    and still leave room for the first new unit (so every window adds new text)."""
    windows: list[tuple[int, int]] = []
    i, n = 0, len(units)
    while i < n:
        j, total = i, 0
        while j < n and total + units[j][1] - units[j][0] <= budget:
            total += units[j][1] - units[j][0]
            j += 1
        windows.append((units[i][0], units[j - 1][1]))
        if j == n:
            break
        k, overlap = j, 0
        room = min(overlap_tokens, budget - (units[j][1] - units[j][0]))  # the next window must reach unit j
        while k - 1 > i and overlap + units[k - 1][1] - units[k - 1][0] <= room:
            k -= 1
            overlap += units[k][1] - units[k][0]
        i = k
    return windows


def deciding_rows(probs: np.ndarray, starts: np.ndarray, support_threshold: float = DEFAULT_SUPPORT_THRESHOLD,
                  contradiction_threshold: float | None = None, fallback: str = "entailment") -> np.ndarray:
    """Per group of rows ``probs[starts[i]:starts[i + 1]]`` (each group non-empty), the index into ``probs`` of the
    row that speaks for the group: the highest P(entailment) (last column) when it is above ``support_threshold``;
    else, with three columns (contradiction first) and ``contradiction_threshold`` not None, the highest
    P(contradiction) when it is above ``contradiction_threshold``; else the highest P(entailment), or with three
    columns and ``fallback="neutral"`` the highest P(neutral). Ties go to the first row.

    Args:
        probs: ``(rows, k)`` probabilities, entailment in the last column.
        starts: int ``(groups + 1,)`` row offsets, increasing, ``starts[-1] == rows``.
        support_threshold, contradiction_threshold: the bars above (P, in [0, 1]).
        fallback: ``"entailment"`` or ``"neutral"`` (:attr:`WindowPolicy.fallback`).

    Returns:
        int64 ``(groups,)``.
    """
    _check_fallback(fallback)
    probs = np.asarray(probs)
    starts = np.asarray(starts, dtype=np.int64)
    counts = np.diff(starts)
    if (counts < 1).any():
        raise ValueError("every group needs at least one row")
    owner = np.repeat(np.arange(len(counts)), counts)
    first = starts[:-1]
    best = np.lexsort((-probs[:, -1], owner))[first]  # per group, highest entailment first (stable: first row)
    if probs.shape[1] != 3 or (contradiction_threshold is None and fallback == "entailment"):
        return best
    undecided = probs[best, -1] <= support_threshold
    rows = best
    if contradiction_threshold is not None:
        worst = np.lexsort((-probs[:, 0], owner))[first]
        contradicts = undecided & (probs[worst, 0] > contradiction_threshold)
        rows = np.where(contradicts, worst, best)
        undecided &= ~contradicts
    if fallback == "neutral":
        rows = np.where(undecided, np.lexsort((-probs[:, 1], owner))[first], rows)
    return rows


@dataclass
class PairWindows:
    """The model pairs of N (premise, hypothesis) pairs, long premises expanded into windows.

    Attributes:
        pairs: the model pairs: input pair ``i`` owns ``pairs[starts[i]:starts[i + 1]]`` (its windows in order, or
            the pair itself when it is read whole).
        starts: int64 ``(N + 1,)`` row offsets into ``pairs``.
        chunked: bool ``(N,)``: the pair is read in windows.
        truncated: bool ``(N,)``: the model reads the pair cut ``longest_first`` (``long_premise="truncate"``, or
            a hypothesis that leaves too little room for windows).
        tokens: int64 ``(N,)``: the whole pair's tokens, special tokens included.
        long_premise: the mode that made the plan.
        policy: the window policy that made it (its thresholds decide :meth:`aggregate`).
    """

    pairs: list[tuple[str, str]]
    starts: np.ndarray
    chunked: np.ndarray
    truncated: np.ndarray
    tokens: np.ndarray
    long_premise: str
    policy: WindowPolicy = WindowPolicy()

    def __len__(self) -> int:
        return len(self.chunked)

    @property
    def num_windows(self) -> np.ndarray:
        """int64 ``(N,)``: model pairs per input pair (1 for a pair read whole)."""
        return np.diff(self.starts)

    def windows(self, i: int) -> list[str]:
        """The premise texts the model reads for input pair ``i`` (one text when it is read whole)."""
        return [p for p, _ in self.pairs[int(self.starts[i]):int(self.starts[i + 1])]]

    def aggregate(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per input pair, the row of the window that decides it (:func:`deciding_rows` with :attr:`policy`'s
        thresholds; the module docstring states the rule).

        Args:
            probs: ``(len(pairs), k)`` probabilities of the model pairs, entailment in the last column.

        Returns:
            ``(rows (N, k), best_window (N,) int64)``; ``best_window`` is -1 for a pair read whole.
        """
        probs = np.asarray(probs)
        if probs.ndim != 2 or probs.shape[0] != len(self.pairs):
            raise ValueError(f"probs has shape {probs.shape}; the plan has {len(self.pairs)} model pairs")
        n = len(self.chunked)
        best = np.full(n, -1, dtype=np.int64)
        if len(self.pairs) == n:  # nothing expanded
            return probs, best
        policy = self.policy
        top = deciding_rows(probs, self.starts, policy.support_threshold, policy.contradiction_threshold,
                            policy.fallback)
        best[self.chunked] = (top - self.starts[:-1])[self.chunked]
        return probs[top], best


class WindowPlanner:
    """Plans :class:`PairWindows` with the model's tokenizer (the engine's :attr:`NLIEngine.window_planner`).

    Args:
        tokenizer: the model's pair tokenizer (its ``max_length`` is the pair limit).
        policy: overlap and least window size (default :class:`WindowPolicy()`).
    """

    def __init__(self, tokenizer: PairTokenizer, policy: WindowPolicy | None = None) -> None:
        self.tokenizer = tokenizer
        self.policy = policy or WindowPolicy()
        self.max_length = tokenizer.max_length
        self.special = tokenizer.pair_special_tokens

    def _counts(self, texts: Sequence[str]) -> dict[str, int]:
        unique = list(dict.fromkeys(texts))
        return {t: len(e.ids) for t, e in zip(unique, self.tokenizer.encode_texts(unique))}

    def budget(self, hypothesis_tokens: int) -> int:
        """The premise budget of a window, in tokens, beside a hypothesis of ``hypothesis_tokens`` tokens: what the
        pair limit leaves after the special tokens, capped by :attr:`WindowPolicy.max_window_tokens` (may be below
        :attr:`WindowPolicy.min_window_tokens`: such a pair is not chunked)."""
        room = self.max_length - self.special - hypothesis_tokens
        cap = self.policy.max_window_tokens
        return room if cap is None else min(room, cap)

    def premise_windows(self, premise: str, budget: int) -> tuple[list[str], bool]:
        """The windows of ``premise`` for a premise budget of ``budget`` tokens (the whole premise when it fits),
        and whether every window fits the budget (False only when re-planning could not make a cut text fit).

        Raises:
            ValueError: when ``budget`` is below 1.
        """
        if budget < 1:
            raise ValueError(f"budget={budget} must be >= 1 token")
        enc = self.tokenizer.encode_texts([premise])[0]
        n = len(enc.ids)
        if n <= budget:
            return [premise], True
        offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(n, 2)
        units_at = _first_visible(premise, offsets)  # the sentence a token belongs to
        sentences = sentence_spans(premise)
        target = budget
        texts: list[str] = []
        for _ in range(_MAX_REPLANS + 1):
            units = _units(units_at, sentences, n, target)
            ranges = window_ranges(units, target, min(self.policy.overlap_tokens, target // 2))
            # from the first token's own start: the window's text tokenizes as it did inside the premise
            texts = [premise[offsets[a, 0]:offsets[b - 1, 1]] for a, b in ranges]
            excess = max(self._counts(texts).values()) - budget
            if excess <= 0:
                return texts, True
            target = max(1, target - excess)
        return texts, False  # still over: the engine truncates the window, and the plan reports the pair

    def plan(self, premises: Sequence[str], hypotheses: Sequence[str], long_premise: LongPremise = "chunk"
             ) -> PairWindows:
        """Measure every pair with the tokenizer and expand the long ones (``long_premise="chunk"``).

        Args:
            premises, hypotheses: the pairs, as two equally long lists of strings.
            long_premise: ``"chunk"`` or ``"truncate"`` (see the module docstring).
        """
        long_premise = check_long_premise(long_premise)
        premise_tokens = self._counts(premises)
        hypothesis_tokens = self._counts(hypotheses)
        n = len(premises)
        tokens = np.fromiter((premise_tokens[p] + hypothesis_tokens[h] + self.special
                              for p, h in zip(premises, hypotheses)), dtype=np.int64, count=n)
        over = tokens > self.max_length
        chunked = np.zeros(n, dtype=bool)
        if long_premise == "chunk":
            budgets = np.fromiter((self.budget(hypothesis_tokens[h]) for h in hypotheses), dtype=np.int64, count=n)
            need = np.fromiter((premise_tokens[p] for p in premises), dtype=np.int64, count=n) > budgets
            chunked = need & (budgets >= self.policy.min_window_tokens)
        if not chunked.any():
            return PairWindows(list(zip(premises, hypotheses)), np.arange(n + 1, dtype=np.int64), chunked, over,
                               tokens, long_premise, self.policy)
        pairs: list[tuple[str, str]] = []
        starts = np.zeros(n + 1, dtype=np.int64)
        truncated = over & ~chunked
        memo: dict[tuple[str, int], tuple[list[str], bool]] = {}
        for i, (p, h) in enumerate(zip(premises, hypotheses)):
            if chunked[i]:
                key = (p, int(budgets[i]))
                if key not in memo:
                    memo[key] = self.premise_windows(p, key[1])
                texts, fits = memo[key]
                pairs.extend((w, h) for w in texts)
                truncated[i] = not fits
            else:
                pairs.append((p, h))
            starts[i + 1] = len(pairs)
        return PairWindows(pairs, starts, chunked, truncated, tokens, long_premise, self.policy)
