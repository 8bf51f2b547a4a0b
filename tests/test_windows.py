"""Long premises: windows measured in real tokens, chunk-and-aggregate through one scheduler pass, truncation
reported (fastnli.engine.windows, NLIEngine.predict_detailed)."""

from __future__ import annotations

import logging
import random
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastnli.engine import BatchPolicy, NLIEngine
from fastnli.engine.sentences import sentence_spans
from fastnli.engine.windows import WindowPolicy, deciding_rows, window_ranges
from fastnli.exporter.checkpoint import corpus

NEEDLE = "The old bridge was painted blue during the summer."
HYPOTHESIS = "The bridge is blue."


def long_premise(n_before: int, n_after: int = 10, seed: int = 7) -> str:
    """Seeded filler sentences with :data:`NEEDLE` after ``n_before`` of them."""
    rng = random.Random(seed)
    filler = [s for s in corpus(600, seed=11) if s.endswith((".", "!", "?")) and NEEDLE not in s]
    before = [rng.choice(filler) for _ in range(n_before)]
    after = [rng.choice(filler) for _ in range(n_after)]
    return " ".join([*before, NEEDLE, *after])


def deciding_row(rows: np.ndarray, support: float = 0.5, contradiction: float | None = None,
                 fallback: str = "entailment") -> int:
    """The aggregation rule written out: the best-entailment row when it is support, else the most contradicting
    row when it contradicts (three-way rows), else the best-entailment row, or the most neutral one with the neutral
    fallback (three-way rows); the first row on ties."""
    ent = [float(r[-1]) for r in rows]
    best = ent.index(max(ent))
    if ent[best] > support or len(rows[0]) != 3:
        return best
    con = [float(r[0]) for r in rows]
    worst = con.index(max(con))
    if contradiction is not None and con[worst] > contradiction:
        return worst
    neu = [float(r[1]) for r in rows]
    return neu.index(max(neu)) if fallback == "neutral" else best


@pytest.fixture(scope="module")
def engine(art_v1: Path) -> NLIEngine:
    return NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")


@pytest.fixture(scope="module")
def engine_one_row(art_v1: Path) -> NLIEngine:
    """One pair per batch: no padding, so a pair's probabilities do not depend on what else is in the call."""
    return NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32",
                                     batch_policy=BatchPolicy(max_batch_size=1))


def _tokens(engine: NLIEngine, text: str) -> int:
    return len(engine.window_planner.tokenizer.encode_texts([text])[0].ids)


@pytest.mark.parametrize("contradiction", [None, 0.0])
def test_needle_past_the_cut_is_read_with_chunking(engine_one_row: NLIEngine, contradiction: float | None) -> None:
    engine = engine_one_row
    engine.window_planner.policy = WindowPolicy(contradiction_threshold=contradiction)
    premise = long_premise(120)
    assert premise.index(NEEDLE) > 0 and _tokens(engine, premise[:premise.index(NEEDLE)]) > 600  # past the cut
    cut = engine.predict_detailed([(premise, HYPOTHESIS)], long_premise="truncate")
    assert cut.truncated.tolist() == [True] and cut.best_window.tolist() == [-1]
    assert cut.stats.truncated_pairs == 1 and cut.stats.chunked_pairs == 0

    got = engine.predict_detailed([(premise, HYPOTHESIS)], long_premise="chunk")
    windows = engine.windows(premise, HYPOTHESIS)
    assert not got.truncated[0] and got.num_windows[0] == len(windows) > 1
    assert any(NEEDLE in w for w in windows)
    per_window = engine.predict([(w, HYPOTHESIS) for w in windows])
    best = deciding_row(per_window, 0.5, contradiction)
    # the aggregate is exactly the deciding window's row, and that row is exactly predict on the window alone
    assert got.best_window[0] == best
    assert np.array_equal(got.probs[0], per_window[best])
    assert np.array_equal(got.probs[0], engine.predict((windows[best], HYPOTHESIS)))
    for w, row in zip(windows, per_window):
        assert np.array_equal(row, engine.predict((w, HYPOTHESIS)))
    assert got.stats.truncated_pairs == 0 and got.stats.chunked_pairs == 1
    assert got.stats.requested_pairs == len(windows) == got.stats.model_pairs


def test_needle_window_equals_the_needle_alone(art_v1: Path) -> None:
    """Windows as small as the needle sentence: the needle's window is the needle itself, so the chunked result's
    entailment is at least the needle-alone pair's (the best-entailment window decides, with the contradiction rule
    off), with the needle-alone probabilities among the windows' rows."""
    engine = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32",
                                       batch_policy=BatchPolicy(max_batch_size=1))
    size = _tokens(engine, NEEDLE)
    engine.window_planner.policy = WindowPolicy(overlap_tokens=0, min_window_tokens=size, max_window_tokens=size,
                                                contradiction_threshold=None)
    premise = long_premise(150)
    windows = engine.windows(premise, HYPOTHESIS)
    assert NEEDLE in windows
    alone = engine.predict((NEEDLE, HYPOTHESIS))
    got = engine.predict_detailed([(premise, HYPOTHESIS)])
    assert got.probs[0, -1] >= alone[-1]
    rows = engine.predict([(w, HYPOTHESIS) for w in windows])
    assert np.array_equal(rows[windows.index(NEEDLE)], alone)


@pytest.mark.parametrize("art", ["art_v1", "art_v2"])
def test_windows_respect_the_token_budget_and_cover_the_premise(art: str, request: pytest.FixtureRequest) -> None:
    engine = NLIEngine.from_pretrained(request.getfixturevalue(art), device="cpu", precision="fp32")
    premise = long_premise(200, 200) + "\n" + " ".join(f"w{i}" for i in range(900))  # a line longer than a window
    for hypothesis in (HYPOTHESIS, "A man " * 100):
        hyp_tokens = _tokens(engine, hypothesis)
        budget = engine.max_length - engine.window_planner.special - hyp_tokens
        windows = engine.windows(premise, hypothesis)
        assert len(windows) > 2
        for w in windows:
            assert _tokens(engine, w) <= budget
            assert int(engine.token_lengths([(w, hypothesis)])[0]) <= engine.max_length
        # in order, overlapping or touching, together covering every sentence of the premise
        starts = [premise.index(windows[0])]
        for w in windows[1:]:
            starts.append(premise.index(w, starts[-1] + 1))
        assert starts[0] == 0
        ends = [s + len(w) for s, w in zip(starts, windows)]
        assert all(b <= e + 1 for b, e in zip(starts[1:], ends[:-1]))
        assert ends[-1] == len(premise.rstrip())
        # sentence-aligned: every window but those cut inside the overlong line starts where a sentence starts, after
        # the space a "▁word" or "Ġword" token carries
        sentence_starts = {s for s, _ in sentence_spans(premise)}
        line = premise.index("w0 ")
        text_starts = [s + len(w) - len(w.lstrip()) for s, w in zip(starts, windows)]
        assert all(s in sentence_starts for s in text_starts if s < line)


def test_chunking_is_invariant_to_order_duplicates_and_batching(art_v1: Path) -> None:
    pairs = [(long_premise(100, seed=s), h) for s in range(3) for h in (HYPOTHESIS, "Paris is in France.")]
    pairs += [("A short premise.", HYPOTHESIS), ("", "")]
    big = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")
    small = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32",
                                      batch_policy=BatchPolicy(max_batch_tokens=600, max_batch_size=2))
    ref = big.predict_detailed(pairs)
    order = np.random.default_rng(0).permutation(len(pairs))
    shuffled = [pairs[i] for i in order] + [pairs[0], pairs[3]]  # duplicates too
    for engine in (big, small):
        got = engine.predict_detailed(shuffled)
        assert np.allclose(got.probs[:len(pairs)], ref.probs[order], atol=1e-6, rtol=0)
        assert got.best_window[:len(pairs)].tolist() == ref.best_window[order].tolist()
        assert np.allclose(got.probs[len(pairs):], ref.probs[[0, 3]], atol=1e-6, rtol=0)
    # one scheduler pass: windows shared by the two hypotheses of a premise are distinct pairs, repeats are not
    assert ref.stats.chunked_pairs == 6 and ref.stats.requested_pairs == ref.stats.model_pairs
    dup = big.predict_detailed(pairs + pairs)
    assert dup.stats.requested_pairs == 2 * ref.stats.requested_pairs
    assert dup.stats.model_pairs == ref.stats.model_pairs


def test_short_pairs_are_unchanged_by_chunk_mode(engine: NLIEngine) -> None:
    pairs = [("A man plays guitar.", "A man makes music."), ("Paris", "Lyon"), ("", "x")]
    assert np.array_equal(engine.predict(pairs), engine.predict(pairs, long_premise="chunk"))
    assert engine.predict_detailed(pairs).best_window.tolist() == [-1, -1, -1]


def test_truncation_is_reported(engine: NLIEngine, caplog: pytest.LogCaptureFixture) -> None:
    premise = long_premise(150)
    with caplog.at_level(logging.WARNING, logger="fastnli"):
        probs, stats = engine.predict_with_stats([(premise, HYPOTHESIS), ("a", "b")])
    assert probs.shape == (2, 3) and stats.truncated_pairs == 1 and stats.long_premise == "truncate"
    assert re.search(r"1 of 2 distinct pairs exceed the model limit of 512 tokens \(longest: \d+\) and are read "
                     r"truncated longest_first; long_premise='chunk' reads their premises in windows instead",
                     caplog.text)
    caplog.clear()
    # a hypothesis that leaves no room for windows: read truncated in chunk mode too, and said so
    huge_hypothesis = "A man plays " * 200
    got = engine.predict_detailed([(premise, huge_hypothesis)])
    assert got.truncated.tolist() == [True] and got.num_windows.tolist() == [1]
    assert "their hypothesis leaves fewer than 32 tokens for premise windows" in caplog.text


def test_bad_long_premise_is_refused(engine: NLIEngine) -> None:
    with pytest.raises(ValueError, match=re.escape("long_premise='window' is not supported; use 'chunk'")):
        engine.predict([("a", "b")], long_premise="window")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("max_window_tokens=8 must be >= min_window_tokens=32")):
        WindowPolicy(max_window_tokens=8)
    with pytest.raises(ValueError, match=re.escape("contradiction_threshold=1.5 must be within [0, 1] (or None)")):
        WindowPolicy(contradiction_threshold=1.5)
    with pytest.raises(ValueError, match=re.escape("fallback='contradiction' must be one of 'entailment', 'neutral'")):
        WindowPolicy(fallback="contradiction")
    with pytest.raises(ValueError, match=re.escape("fallback='max' must be one of 'entailment', 'neutral'")):
        deciding_rows(np.array([UNRELATED]), np.array([0, 1]), fallback="max")


UNRELATED = [0.10, 0.80, 0.10]
CONTRADICTS = [0.90, 0.08, 0.02]
SUPPORTS = [0.05, 0.15, 0.80]
WEAK = [0.30, 0.30, 0.40]


def test_the_neutral_fallback_reads_an_unrelated_document_as_neutral() -> None:
    """Nothing supports, nothing contradicts above the bar: the best-entailment window's own argmax is contradiction,
    the most neutral window's is neutral."""
    probs = np.array([UNRELATED, [0.60, 0.05, 0.35], WEAK], dtype=np.float32)
    starts = np.array([0, 3])
    assert deciding_rows(probs, starts, 0.5, 0.95).tolist() == [2]
    assert deciding_rows(probs, starts, 0.5, 0.95, "neutral").tolist() == [0]
    assert deciding_rows(probs, starts, 0.5, 0.5, "neutral").tolist() == [1]  # above the bar: the contradiction
    assert deciding_rows(probs, starts, 0.3, 0.5, "neutral").tolist() == [2]  # 0.40 is support at 0.3


@pytest.mark.parametrize("windows, contradiction, expected", [
    ([UNRELATED, CONTRADICTS], 0.5, 1),   # nothing supports: the contradicting window decides
    ([UNRELATED, CONTRADICTS], None, 0),  # the rule off: the best-entailment window, whatever else is read
    ([CONTRADICTS, SUPPORTS], 0.5, 1),    # support wins over a contradiction elsewhere
    ([WEAK, CONTRADICTS], 0.5, 1),        # 0.40 is not support
    ([WEAK, CONTRADICTS], 0.95, 0),       # 0.90 is not above the contradiction bar
    ([UNRELATED, UNRELATED], 0.5, 0),     # ties: the first
])
def test_the_deciding_window(windows: list[list[float]], contradiction: float | None, expected: int) -> None:
    probs = np.array(windows, dtype=np.float32)
    assert deciding_rows(probs, np.array([0, len(windows)]), 0.5, contradiction).tolist() == [expected]
    # the neutral fallback changes only a pair that nothing supports and nothing contradicts above the bar
    decided = probs[expected, -1] > 0.5 or (contradiction is not None and probs[expected, 0] > contradiction)
    neutral = expected if decided else int(np.argmax(probs[:, 1]))
    assert deciding_rows(probs, np.array([0, len(windows)]), 0.5, contradiction, "neutral").tolist() == [neutral]
    # a 2-way head has no contradiction column: the best-entailment window always
    two_way = np.stack([1 - probs[:, -1], probs[:, -1]], axis=1)
    assert deciding_rows(two_way, np.array([0, len(windows)]), 0.5, contradiction).tolist() == [
        int(np.argmax(probs[:, -1]))]


@pytest.mark.parametrize("fallback", ["entailment", "neutral"])
def test_the_plan_aggregates_with_its_policy(engine: NLIEngine, fallback: str) -> None:
    """The engine's planner hands its policy to the plan, whose rows follow the policy's bars and fallback."""
    pairs = [(long_premise(120), HYPOTHESIS), ("A short premise.", HYPOTHESIS)]
    for bar in (None, 0.5):
        engine.window_planner.policy = WindowPolicy(contradiction_threshold=bar, fallback=fallback)
        try:
            plan = engine.window_planner.plan([p for p, _ in pairs], [h for _, h in pairs])
        finally:
            engine.window_planner.policy = WindowPolicy()
        assert plan.policy.contradiction_threshold == bar and plan.num_windows.tolist()[1] == 1
        n = int(plan.num_windows[0])
        probs = np.array([WEAK] * n + [SUPPORTS], dtype=np.float32)
        probs[1] = UNRELATED
        probs[n - 1] = CONTRADICTS  # the last window contradicts, the second says nothing, the others are unsure
        rows, best = plan.aggregate(probs)
        undecided = 1 if fallback == "neutral" else 0
        assert best.tolist() == [n - 1 if bar is not None else undecided, -1]
        assert rows[0].tolist() == probs[best[0]].tolist() and rows[1].tolist() == probs[n].tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8), st.integers(0, 8)), min_size=1, max_size=6),
                min_size=1, max_size=8),
       st.sampled_from([0.0, 0.3, 0.5, 0.7, 1.0]), st.sampled_from([None, 0.0, 0.4, 0.5, 0.8]),
       st.sampled_from(["entailment", "neutral"]))
def test_deciding_rows_is_the_rule_written_out(groups: list[list[tuple[int, int, int]]], support: float,
                                               contradiction: float | None, fallback: str) -> None:
    rows = [np.array(g, dtype=np.float64) + 1e-9 for g in groups]  # coarse values: ties are common
    rows = [g / g.sum(axis=1, keepdims=True) for g in rows]
    starts = np.concatenate([[0], np.cumsum([len(g) for g in rows])])
    got = deciding_rows(np.concatenate(rows), starts, support, contradiction, fallback)
    assert (got - starts[:-1]).tolist() == [deciding_row(g, support, contradiction, fallback) for g in rows]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=60), st.integers(40, 120), st.integers(0, 60))
def test_window_ranges_properties(sizes: list[int], budget: int, overlap: int) -> None:
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    units = list(zip(bounds[:-1], bounds[1:]))
    windows = window_ranges(units, budget, overlap)
    unit_bounds = set(bounds)
    assert windows[0][0] == 0 and windows[-1][1] == bounds[-1]
    for (a, b), (c, d) in zip(windows, windows[1:]):
        assert a < c and b < d  # progress: every window reads new text
        assert c <= b  # no gap
        assert b - c <= overlap  # overlap within its allowance
    for a, b in windows:
        assert b - a <= budget and a in unit_bounds and b in unit_bounds  # whole units within the budget
