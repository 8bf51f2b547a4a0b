"""``python -m bench.needle_windows``: which windows and rule read a document three ways closest to the needle alone.

``--pairs`` balanced snli/dev pairs of ``--part`` (the ``dev`` part of ``answer_data.part_of``: never trained on),
each premise among unrelated mnli/dev_matched sentences at depths of 0-4,000 tokens, and the same document without it
(:func:`bench.long_premise.documents`, as ``tools/default_model/contradiction_choice.py`` builds them). Every document
is read three ways: in the model's windows (its manifest's window policy), every sentence alone
(:func:`fastnli.engine.sentences.sentence_spans`), and both sets together; each reading is aggregated with every
support bar x contradiction bar x fallback of :func:`fastnli.engine.windows.deciding_rows`. Printed per candidate:
accuracy with the premise per depth, neutral kept without it, and their mean over depths (``contradiction_choice``'s
score); then, for the model's policy, accuracy per gold label against the pair read alone. ``--json`` writes it all.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.long_premise import documents, load
from fastnli.engine import NLIEngine
from fastnli.engine.labels import CANONICAL_LABELS
from fastnli.engine.sentences import sentence_spans
from fastnli.engine.windows import FALLBACKS, deciding_rows

DEPTHS = (0, 500, 1000, 2000, 4000)
READINGS = ("windows", "sentences", "both")
SUPPORT_BARS = (0.5, 0.6, 0.7)
CONTRADICTION_BARS: tuple[float | None, ...] = (None, 0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99)
NEUTRAL = CANONICAL_LABELS.index("neutral")


def sentence_groups(texts: Sequence[str], hyps: Sequence[str]) -> tuple[list[tuple[str, str]], np.ndarray]:
    """Every sentence of each text beside its hypothesis, and the groups' row offsets."""
    pairs: list[tuple[str, str]] = []
    starts = [0]
    for text, hyp in zip(texts, hyps):
        pairs.extend((text[a:b], hyp) for a, b in sentence_spans(text))
        starts.append(len(pairs))
    return pairs, np.asarray(starts, dtype=np.int64)


def union(a: np.ndarray, a_starts: np.ndarray, b: np.ndarray, b_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two groupings of rows merged group by group (group i: a's rows, then b's)."""
    rows, starts = [], [0]
    for i in range(len(a_starts) - 1):
        rows += [a[a_starts[i]:a_starts[i + 1]], b[b_starts[i]:b_starts[i + 1]]]
        starts.append(starts[-1] + int(a_starts[i + 1] - a_starts[i] + b_starts[i + 1] - b_starts[i]))
    return np.concatenate(rows), np.asarray(starts, dtype=np.int64)


def readings(engine: NLIEngine, texts: Sequence[str], hyps: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per reading of :data:`READINGS`: (probabilities, group offsets) of ``texts`` against ``hyps``."""
    plan = engine.window_planner.plan(list(texts), list(hyps), "chunk")
    sent_pairs, sent_starts = sentence_groups(texts, hyps)
    probs = engine.predict(plan.pairs + sent_pairs, "truncate")  # a sentence that is also a window: scored once
    win, sent = probs[:len(plan.pairs)], probs[len(plan.pairs):]
    return {"windows": (win, plan.starts), "sentences": (sent, sent_starts),
            "both": union(win, plan.starts, sent, sent_starts)}


def measure(model: Path, data: Path, part: str, n_pairs: int, seed: int) -> dict[str, Any]:
    """The candidates' accuracy and neutral kept per depth, and the model policy's accuracy per label."""
    engine = NLIEngine(model, device="cpu")
    policy = engine.window_planner.policy
    pairs, pool = load(data, n_pairs, seed, part)
    gold = np.array([CANONICAL_LABELS.index(r["label"]) for r in pairs])
    hyps = [r["hypothesis"] for r in pairs]
    alone = engine.predict([(r["premise"], r["hypothesis"]) for r in pairs], "truncate").argmax(1)
    per_depth = {d: (readings(engine, [x[0] for x in items], hyps), readings(engine, [x[2] for x in items], hyps))
                 for d, items in documents(pairs, pool, DEPTHS, engine, seed).items()}
    candidates = []
    for reading, support, bar, fallback in itertools.product(READINGS, SUPPORT_BARS, CONTRADICTION_BARS, FALLBACKS):
        accuracy, kept = [], []
        for with_premise, without in per_depth.values():
            p, starts = with_premise[reading]
            accuracy.append(float((p[deciding_rows(p, starts, support, bar, fallback)].argmax(1) == gold).mean()))
            p, starts = without[reading]
            kept.append(float((p[deciding_rows(p, starts, support, bar, fallback)].argmax(1) == NEUTRAL).mean()))
        candidates.append({"reading": reading, "support_bar": support, "contradiction_bar": bar,
                           "fallback": fallback, "accuracy": accuracy, "neutral_kept": kept,
                           "score": float(np.mean([(a + k) / 2 for a, k in zip(accuracy, kept)]))})
    by_label: dict[str, Any] = {"alone": [float((alone[gold == k] == k).mean()) for k in range(3)]}
    for depth, (with_premise, _) in per_depth.items():
        p, starts = with_premise["windows"]
        got = p[deciding_rows(p, starts, policy.support_threshold, policy.contradiction_threshold,
                              policy.fallback)].argmax(1)
        by_label[str(depth)] = [float((got[gold == k] == k).mean()) for k in range(3)]
    return {"part": part, "pairs": len(pairs), "depths": list(DEPTHS), "alone_accuracy": float((alone == gold).mean()),
            "policy": {"max_window_tokens": policy.max_window_tokens, "support_bar": policy.support_threshold,
                       "contradiction_bar": policy.contradiction_threshold, "fallback": policy.fallback},
            "labels": list(CANONICAL_LABELS), "policy_accuracy_by_label": by_label,
            "candidates": sorted(candidates, key=lambda c: -c["score"])}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.needle_windows [options]``; returns the exit status."""
    from fastnli.default_model import DEFAULT_MODEL_DIR

    p = argparse.ArgumentParser(prog="python -m bench.needle_windows", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="artifact (default: the embedded model)")
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "nli-data")
    p.add_argument("--part", default="dev", choices=["dev", "test"])
    p.add_argument("--pairs", type=int, default=300, help="pairs, a third per label (default 300)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--top", type=int, default=12, help="candidates printed, best score first (default 12)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    out = measure(args.model, args.data, args.part, args.pairs, args.seed)
    lines = [f"{args.part} part, {out['pairs']} pairs; alone {out['alone_accuracy']:.3f}; depths {out['depths']}",
             "| reading | support bar | contradiction bar | fallback | accuracy per depth | neutral kept | score |",
             "|---|---|---|---|---|---|---|"]
    for c in out["candidates"][:args.top]:
        lines.append(f"| {c['reading']} | {c['support_bar']} | {c['contradiction_bar']} | {c['fallback']} | "
                     + " / ".join(f"{a:.3f}" for a in c["accuracy"]) + " | "
                     + " / ".join(f"{k:.3f}" for k in c["neutral_kept"]) + f" | {c['score']:.4f} |")
    lines.append(f"model policy {out['policy']}, accuracy per label ({' / '.join(out['labels'])}):")
    lines += [f"  {key}: " + " / ".join(f"{a:.3f}" for a in v) for key, v in out["policy_accuracy_by_label"].items()]
    sys.stdout.write("\n".join(lines) + "\n")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
