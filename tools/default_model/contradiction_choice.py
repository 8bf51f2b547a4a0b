"""Choose which window decides a document the default model reads in windows when none supports the statement (its
manifest's ``window_policy.contradiction_threshold`` and ``window_policy.fallback``) by measurement.

    python -m tools.default_model.contradiction_choice [--model fastnli/models/default] [--pairs 90] [--write]

Run after ``window_choice`` (``ship`` runs both): the window size and support bar are the manifest's, and this
tool adds the contradiction bar to them.

A premise read in windows takes the row of its best-entailment window (:func:`fastnli.engine.windows.deciding_rows`).
When no window supports the hypothesis, that row comes from whichever unrelated window reads a little more entailing,
so a window that contradicts the hypothesis is hidden and the pair reads neutral. With a contradiction bar, the most
contradicting window decides such a pair when its P(contradiction) is above the bar. A small model trained on SNLI,
whose annotators read a different scene as a contradiction, also finds contradictions in unrelated text, and the
more windows a document has the more chances it gets, so the bar is the model's to choose. Below the bar, the
best-entailment window's own argmax may still be contradiction; with the ``"neutral"`` fallback the most neutral
window decides instead, so a document that neither supports nor contradicts the statement reads neutral.

**Documents** (``bench.long_premise.documents``): ``--pairs`` snli/dev pairs balanced over the labels, drawn from the
premises of the ``dev`` part of ``tools/default_model/answer_data.part_of`` (never trained on), each premise among
unrelated mnli/dev_matched sentences of the evaluation filler pool at depths of 0-4,000 tokens, and the same document
without the premise. **Accuracy**: argmax = the pair's gold label with the premise in the document; **neutral
kept**: argmax = neutral for the document without it.

**Rule**: among the fallbacks of :data:`~fastnli.engine.windows.FALLBACKS` x the bars of :data:`BARS` (None: no
contradicting window decides), the highest mean over depths of (accuracy + neutral kept) / 2; ties go to the
best-entailment fallback, then no bar, then the higher bar. The ``test`` part is measured and reported only.
``--write`` records both tables in ``quality.json`` (``window_contradiction``), sets the manifest's
``window_policy.contradiction_threshold`` and ``window_policy.fallback`` and re-renders the model card.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.long_premise import documents, load
from fastnli.engine import NLIEngine
from fastnli.engine.labels import CANONICAL_LABELS
from fastnli.engine.windows import FALLBACKS, WindowPolicy, deciding_rows
from tools.default_model.ship import (
    MANIFEST_NAME,
    choice_parser,
    contradiction_key,
    log_progress,
    logger,
    record_shipped,
)

BARS: tuple[float | None, ...] = (None, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995)
DEPTHS: tuple[int, ...] = (0, 500, 1000, 2000, 4000)
NEUTRAL = CANONICAL_LABELS.index("neutral")
RULE = (f"highest mean over depths {list(DEPTHS)} of (accuracy with the premise + neutral kept without it) / 2 "
        f"among fallbacks {list(FALLBACKS)} x contradiction bars {list(BARS)} (ties: the entailment fallback, then "
        "no bar, then the higher bar); dev part")
#: Every (fallback, bar) the rule weighs.
CANDIDATES: tuple[tuple[str, float | None], ...] = tuple((f, b) for f in FALLBACKS for b in BARS)


def measure(model: Path, part: str, n_pairs: int, depths: Sequence[int], seed: int, data: Path) -> dict[str, Any]:
    """Per depth, per bar of :data:`BARS`: accuracy with the premise, neutral kept without it, and the share of
    documents without it read as contradiction; every window scored once, through the manifest's window policy."""
    engine = NLIEngine(model, device="cpu")
    base = engine.window_planner.policy
    pairs, pool = load(data, n_pairs, seed, part)
    gold = np.array([CANONICAL_LABELS.index(r["label"]) for r in pairs])
    hyps = [r["hypothesis"] for r in pairs]
    docs = documents(pairs, pool, depths, engine, seed)
    alone = engine.predict([(r["premise"], r["hypothesis"]) for r in pairs], "truncate")
    out: dict[str, Any] = {"part": part, "pairs": len(pairs), "policy": dataclasses.asdict(base),
                           "alone_accuracy": float((alone.argmax(1) == gold).mean()), "depths": {}}
    t0 = time.perf_counter()
    for depth, items in docs.items():
        planner = engine.window_planner
        with_plan = planner.plan([doc for doc, _, _ in items], hyps, "chunk")
        without_plan = planner.plan([doc for _, _, doc in items], hyps, "chunk")
        probs = engine.predict(with_plan.pairs + without_plan.pairs, "truncate")  # windows shared by both: once
        with_probs, without_probs = probs[:len(with_plan.pairs)], probs[len(with_plan.pairs):]
        cells: dict[str, Any] = {}
        for fallback, bar in CANDIDATES:
            with_rows = with_probs[deciding_rows(with_probs, with_plan.starts, base.support_threshold, bar, fallback)]
            without_rows = without_probs[deciding_rows(without_probs, without_plan.starts, base.support_threshold, bar,
                                                       fallback)]
            guess = with_rows.argmax(1)
            cells[contradiction_key(bar, fallback)] = {
                "accuracy": float((guess == gold).mean()),
                "kept": {label: float((guess[gold == k] == k).mean()) for k, label in enumerate(CANONICAL_LABELS)},
                "neutral_kept": float((without_rows.argmax(1) == NEUTRAL).mean()),
                "read_as_contradiction": float((without_rows.argmax(1) == 0).mean())}
        out["depths"][str(depth)] = {"windows": float(np.mean(with_plan.num_windows)), "bars": cells}
        logger.info("%s part, depth %d: %s", part, depth, json.dumps(cells))
    out["seconds"] = time.perf_counter() - t0
    return out


def score(table: dict[str, Any], bar: float | None, fallback: str = "entailment") -> float:
    """:data:`RULE`'s score of (``fallback``, ``bar``) in a :func:`measure` table."""
    cells = [d["bars"][contradiction_key(bar, fallback)] for d in table["depths"].values()]
    return float(np.mean([(c["accuracy"] + c["neutral_kept"]) / 2 for c in cells]))


def choose(table: dict[str, Any]) -> tuple[str, float | None]:
    """The (fallback, bar) :data:`RULE` picks from a :func:`measure` table."""
    return max(CANDIDATES, key=lambda c: (round(score(table, c[1], c[0]), 9), c[0] == "entailment", c[1] is None,
                                          c[1] or 0.0))


def main(argv: list[str] | None = None) -> int:
    args = choice_parser(__doc__, pairs=90, test_pairs=90, seed=7).parse_args(argv)
    log_progress()

    dev = measure(args.model, "dev", args.pairs, DEPTHS, args.seed, args.data)
    fallback, choice = choose(dev)
    logger.info("chosen on the dev part: fallback=%s, contradiction_threshold=%s (score %.4f; the best-entailment "
                "window alone: %.4f)", fallback, choice, score(dev, choice, fallback), score(dev, None))
    test = measure(args.model, "test", args.test_pairs, DEPTHS, args.seed, args.data)
    record = {"choice": choice, "fallback": fallback, "rule": RULE, "dev": dev, "test": test}
    sys.stdout.write(json.dumps({"choice": choice, "fallback": fallback,
                                 "test": {contradiction_key(b, f): score(test, b, f) for f, b in CANDIDATES}}) + "\n")
    if args.write:
        quality = json.loads(args.quality.read_text())
        quality["window_contradiction"] = record
        manifest = json.loads((args.model / MANIFEST_NAME).read_text())
        policy = {**manifest.get("window_policy", {}), "contradiction_threshold": choice, "fallback": fallback}
        WindowPolicy.from_manifest(policy)
        path = record_shipped(args.model, args.quality, quality, {"window_policy": policy})
        logger.info("recorded contradiction_threshold=%s, fallback=%s in %s, %s and the model card", choice, fallback,
                    args.quality, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
