"""``python -m bench.needle_windows``: which windows and rule read a document three ways closest to the needle alone.

``--pairs`` balanced snli/dev pairs of ``--part`` (the ``dev`` part of ``answer_data.part_of``: never trained on),
each premise among unrelated mnli/dev_matched sentences at depths of 0-4,000 tokens, and the same document without it
(:func:`bench.long_premise.documents`, as ``tools/default_model/contradiction_choice.py`` builds them). Every document
is read three ways: in the model's windows (its manifest's window policy), every sentence alone
(:func:`fastnli.engine.sentences.sentence_spans`), and both sets together; each reading is aggregated with every
support bar x contradiction bar x fallback of :func:`fastnli.engine.windows.deciding_rows`. Printed per candidate:
accuracy with the premise per depth, neutral kept without it, and their mean over depths (``contradiction_choice``'s
score); then, for the model's policy, accuracy per gold label against the pair read alone. ``--json`` writes it all.

``--readings confirmed`` reads the windows and, instead of every sentence, a second pass: for a document that no window
supports and none contradicts above the bar, each of its ``k`` most contradicting windows (k = 1, 2) whose
P(contradiction) is above a *confirm bar* has its sentences read alone, and the document reads as contradiction when
one of them is above a *sentence bar* (the evidence sentence then gets its alone reading, which the window's unrelated
sentences dilute); the rest take the neutral fallback. It costs the windows plus a few sentences per document, where
``sentences`` reads every sentence. ``--readings windows`` reads the windows alone: the cheapest reading, to compare
models under the same rules.
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
CONFIRM_BARS = (0.5, 0.7, 0.8, 0.9)
SENTENCE_BARS = (0.5, 0.7, 0.8, 0.9, 0.95)
CONFIRM_WINDOWS = (1, 2)
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


Reading = dict[str, tuple[np.ndarray, np.ndarray]]


def readings(engine: NLIEngine, texts: Sequence[str], hyps: Sequence[str], sentences: bool = True
             ) -> tuple[Reading, list[tuple[str, str]]]:
    """Per reading of :data:`READINGS` (``windows`` only when not ``sentences``): (probabilities, group offsets) of
    ``texts`` against ``hyps``; and the (window, hypothesis) pairs of the ``windows`` reading."""
    plan = engine.window_planner.plan(list(texts), list(hyps), "chunk")
    if not sentences:
        return {"windows": (engine.predict(plan.pairs, "truncate"), plan.starts)}, plan.pairs
    sent_pairs, sent_starts = sentence_groups(texts, hyps)
    probs = engine.predict(plan.pairs + sent_pairs, "truncate")  # a sentence that is also a window: scored once
    win, sent = probs[:len(plan.pairs)], probs[len(plan.pairs):]
    return {"windows": (win, plan.starts), "sentences": (sent, sent_starts),
            "both": union(win, plan.starts, sent, sent_starts)}, plan.pairs


def confirming_sentences(engine: NLIEngine, probs: np.ndarray, starts: np.ndarray,
                         pairs: Sequence[tuple[str, str]], k: int) -> np.ndarray:
    """Per group, its ``k`` most contradicting windows (ties: the first) each read sentence by sentence alone:
    ``(groups, k, 2)``, the window's P(contradiction) and its sentences' highest (0 where the group has fewer)."""
    out = np.zeros((len(starts) - 1, k, 2))
    sent_pairs: list[tuple[str, str]] = []
    owner: list[tuple[int, int]] = []
    for g in range(len(starts) - 1):
        a = int(starts[g])
        for j, w in enumerate(np.argsort(-probs[a:starts[g + 1], 0], kind="stable")[:k]):
            out[g, j, 0] = probs[a + w, 0]
            text, hyp = pairs[a + w]
            sent_pairs += [(text[s:e], hyp) for s, e in sentence_spans(text)]
            owner += [(g, j)] * (len(sent_pairs) - len(owner))
    for (g, j), p in zip(owner, engine.predict(sent_pairs, "truncate")):
        out[g, j, 1] = max(out[g, j, 1], float(p[0]))
    return out


def confirmed_labels(probs: np.ndarray, starts: np.ndarray, confirm: np.ndarray, support: float,
                     bar: float | None, confirm_bar: float, sentence_bar: float, k: int) -> np.ndarray:
    """Labels of the ``confirmed`` reading: :func:`deciding_rows` (neutral fallback), then an undecided group whose
    first ``k`` confirming windows include one above ``confirm_bar`` with a sentence above ``sentence_bar`` reads
    contradiction."""
    rows = deciding_rows(probs, starts, support, bar, "neutral")
    labels = probs[rows].argmax(1)
    top_e = np.maximum.reduceat(probs[:, -1], starts[:-1])  # groups are non-empty
    undecided = (top_e <= support) & (True if bar is None else confirm[:, 0, 0] <= bar)  # [:, 0, 0]: the top P(c)
    hit = ((confirm[:, :k, 0] > confirm_bar) & (confirm[:, :k, 1] > sentence_bar)).any(1)
    return np.where(undecided & hit, CANONICAL_LABELS.index("contradiction"), labels)


def confirmed_candidates(engine: NLIEngine, per_depth: dict[int, Any], gold: np.ndarray, support: float
                         ) -> list[dict[str, Any]]:
    """The ``confirmed`` reading's candidates: contradiction bars x confirm bars x sentence bars x k."""
    k_max = max(CONFIRM_WINDOWS)
    confirms = {d: [confirming_sentences(engine, reading["windows"][0], reading["windows"][1], pairs, k_max)
                    for reading, pairs in docs] for d, docs in per_depth.items()}
    out = []
    for bar, a, b, k in itertools.product(CONTRADICTION_BARS, CONFIRM_BARS, SENTENCE_BARS, CONFIRM_WINDOWS):
        accuracy, kept = [], []
        for d, ((with_premise, _), (without, _)) in per_depth.items():
            c_with, c_without = confirms[d]
            probs, starts = with_premise["windows"]
            got = confirmed_labels(probs, starts, c_with, support, bar, a, b, k)
            accuracy.append(float((got == gold).mean()))
            probs, starts = without["windows"]
            kept.append(float((confirmed_labels(probs, starts, c_without, support, bar, a, b, k) == NEUTRAL).mean()))
        out.append({"reading": f"confirmed (k {k}, confirm bar {a}, sentence bar {b})", "support_bar": support,
                    "contradiction_bar": bar, "fallback": "neutral", "accuracy": accuracy, "neutral_kept": kept,
                    "score": float(np.mean([(x + y) / 2 for x, y in zip(accuracy, kept)]))})
    return out


def measure(model: Path, data: Path, part: str, n_pairs: int, seed: int, kind: str = "all") -> dict[str, Any]:
    """The candidates' accuracy and neutral kept per depth, and the model policy's accuracy per label. ``kind``:
    ``all`` (every reading of :data:`READINGS`), ``windows`` (the windows alone: the sentences are not read), or
    ``confirmed`` (the ``confirmed`` reading and ``windows``)."""
    if kind not in ("all", "windows", "confirmed"):
        raise ValueError(f"kind must be 'all', 'windows' or 'confirmed', not {kind!r}")
    confirmed, whole = kind == "confirmed", kind == "all"
    engine = NLIEngine(model, device="cpu")
    policy = engine.window_planner.policy
    pairs, pool = load(data, n_pairs, seed, part)
    gold = np.array([CANONICAL_LABELS.index(r["label"]) for r in pairs])
    hyps = [r["hypothesis"] for r in pairs]
    alone = engine.predict([(r["premise"], r["hypothesis"]) for r in pairs], "truncate").argmax(1)
    per_depth = {d: (readings(engine, [x[0] for x in items], hyps, whole),
                     readings(engine, [x[2] for x in items], hyps, whole))
                 for d, items in documents(pairs, pool, DEPTHS, engine, seed).items()}
    candidates = confirmed_candidates(engine, per_depth, gold, policy.support_threshold) if confirmed else []
    for reading, support, bar, fallback in itertools.product(READINGS, SUPPORT_BARS, CONTRADICTION_BARS, FALLBACKS):
        if not whole and reading != "windows":
            continue
        accuracy, kept = [], []
        for (with_premise, _), (without, _) in per_depth.values():
            p, starts = with_premise[reading]
            accuracy.append(float((p[deciding_rows(p, starts, support, bar, fallback)].argmax(1) == gold).mean()))
            p, starts = without[reading]
            kept.append(float((p[deciding_rows(p, starts, support, bar, fallback)].argmax(1) == NEUTRAL).mean()))
        candidates.append({"reading": reading, "support_bar": support, "contradiction_bar": bar,
                           "fallback": fallback, "accuracy": accuracy, "neutral_kept": kept,
                           "score": float(np.mean([(a + k) / 2 for a, k in zip(accuracy, kept)]))})
    by_label: dict[str, Any] = {"alone": [float((alone[gold == k] == k).mean()) for k in range(3)]}
    for depth, ((with_premise, _), _) in per_depth.items():
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
    p.add_argument("--readings", default="all", choices=["all", "windows", "confirmed"],
                   help="all: windows, sentences, both (default); windows: the windows alone (to compare models); "
                        "confirmed: windows, and windows confirmed by the sentences of the most contradicting ones")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    out = measure(args.model, args.data, args.part, args.pairs, args.seed, args.readings)
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
