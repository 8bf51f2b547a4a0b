"""The mission-shaped evaluation of an NLI model: answers to one question, and statements against long documents.

Reads the ``dev.jsonl`` / ``test.jsonl`` written by ``answer_data.py`` and reports, per category:

- value swaps (years, dates, numbers, quantities, units, entities, numbers in sentences, negation): the share of
  pairs flagged as contradiction (P(contradiction) > 0.5 in either direction), and flagged both ways (NCP averages
  the two directions, so a swap flagged one way only counts half a contradiction there);
- meaning-keeping variants (formats, aliases, equivalent units, digits vs words): the share scored entailment
  (argmax) in both directions;
- more/less specific answers: directed-label accuracy (specific -> general: entailment; back: not entailment);
- answer agreement AUROC: agreeing (meaning kept, more specific) vs disagreeing (value swaps) pairs ranked by NCP's
  pair score ``1 - (p_c(a, b) + p_c(b, a)) / 2``, for bare answers, one-sentence answers and question-aware inputs;
- long premises by filler length: accuracy, entailment / contradiction / neutral kept (the rows of that gold label
  predicted so) and false entailment of documents without the evidence.

Run from the repository root::

    python -m tools.default_model.mission_eval --rows /tmp/ans/test.jsonl --model default
    python -m tools.default_model.mission_eval --rows /tmp/ans/dev.jsonl --hf /tmp/exp/m1   # a torch checkpoint

``--align-units`` reads every pair as the scorers do with ``align_units`` (:mod:`fastnli.scorers.units`): the
hypothesis's quantities in the premise's units and its numbers in the premise's form (a question-aware row's answers
aligned before the question goes in front), and a pair that becomes one text scored as identical strings are.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.scorers.questions import with_question
from fastnli.scorers.units import align_units
from tools.default_model.answer_data import (
    MEANING_KEPT,
    ONE_WAY,
    PLACE_KEPT,
    PLACE_ONE_WAY,
    PLACE_SWAPS,
    VALUE_SWAPS,
    read_jsonl,
)

LABELS = ("contradiction", "neutral", "entailment")
#: the long-premise figures per filler length, in the rendered table's order
LONG_FIGURES = ("accuracy", "entailment_kept", "contradiction_kept", "neutral_kept", "false_entailment")
#: the figures per input form and their names in tables, in the tables' order
GROUP_FIGURES = {"value_swaps": "value swaps flagged", "value_swaps_both_ways": "value swaps flagged both ways",
                 "meaning_kept": "meaning kept both ways", "agreement_auroc": "agreement AUROC",
                 "place_swaps": "another city flagged", "place_swaps_both_ways": "another city flagged both ways",
                 "place_kept": "the city in other words kept both ways",
                 "place_one_way": "the city stated -> the city bare, and not back"}
#: the groups of categories per input form: (name, categories, whether they are swaps flagged as contradiction)
GROUPS = (("value_swaps", VALUE_SWAPS, True), ("meaning_kept", MEANING_KEPT, False), ("place_swaps", PLACE_SWAPS, True),
          ("place_kept", PLACE_KEPT, False), ("place_one_way", PLACE_ONE_WAY, False))
#: the categories of the agreement AUROC; the place groups stay out, so that it compares across stages
AUROC_CATEGORIES = VALUE_SWAPS + MEANING_KEPT + ONE_WAY
C, N, E = 0, 1, 2
FORMS = ("", "+sentence", "+question", "+bare")  # bare, one-sentence, question-aware, one bare and one sentence


def auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score of a random positive > score of a random negative), ties counting one half."""
    if not len(pos) or not len(neg):
        return float("nan")
    scores = np.concatenate([pos, neg])
    order = scores.argsort(kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    for value in np.unique(scores):  # average ranks of ties
        tie = scores == value
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def evaluate(rows: Sequence[dict[str, Any]], probs: np.ndarray) -> dict[str, Any]:
    """Every figure of the evaluation from the rows and their probabilities ``[N, 3]`` (label order :data:`LABELS`)."""
    pairs: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        if r["pair_id"]:
            pairs[r["pair_id"]].append(i)
    gold = np.array([LABELS.index(r["label"]) for r in rows])
    pred = probs.argmax(1)
    categories: dict[str, dict[str, Any]] = {}
    agree_scores: dict[str, tuple[list[float], list[float]]] = {f: ([], []) for f in FORMS}
    by_cat: dict[str, list[list[int]]] = defaultdict(list)
    for members in pairs.values():
        by_cat[rows[members[0]]["category"]].append(members)
    for cat, pair_list in sorted(by_cat.items()):
        base, form = (cat.split("+", 1)[0], "+" + cat.split("+", 1)[1]) if "+" in cat else (cat, "")
        ij = np.array(pair_list)
        pc = probs[ij, C]
        score = 1 - pc.mean(1)
        extra: dict[str, float] = {}
        if base in VALUE_SWAPS or base in PLACE_SWAPS:
            metric, value = "flagged_contradiction", float((pc.max(1) > 0.5).mean())
            extra["both_ways"] = round(float((pc.min(1) > 0.5).mean()), 4)
        elif base in MEANING_KEPT or base in PLACE_KEPT:
            metric, value = "entailment_both_ways", float((pred[ij] == E).all(1).mean())
        elif base in ONE_WAY or base in PLACE_ONE_WAY:
            metric, value = "directed_accuracy", float(((pred[ij] == E) == (gold[ij] == E)).mean())
        else:
            continue
        if base in AUROC_CATEGORIES:  # agreeing pairs against disagreeing ones (the value swaps)
            agreeing, disagreeing = agree_scores.setdefault(form, ([], []))
            (disagreeing if base in VALUE_SWAPS else agreeing).extend(score.tolist())
        categories[cat] = {"pairs": len(pair_list), "metric": metric, "value": round(value, 4),
                           "mean_pair_score": round(float(score.mean()), 4), **extra}
    groups: dict[str, dict[str, float]] = {}
    for form in FORMS:
        for kind, names, swaps in GROUPS:
            cats = [c for c in categories if c.split("+", 1)[0] in names and (("+" + c.split("+", 1)[1]) if "+" in c
                                                                               else "") == form]
            n = sum(categories[c]["pairs"] for c in cats)
            if n:
                group = groups.setdefault(form or "bare", {})
                group[kind] = round(sum(categories[c]["value"] * categories[c]["pairs"] for c in cats) / n, 4)
                if swaps:
                    group[kind + "_both_ways"] = round(
                        sum(categories[c]["both_ways"] * categories[c]["pairs"] for c in cats) / n, 4)
        pos, neg = agree_scores.get(form, ([], []))
        if pos and neg:
            groups.setdefault(form or "bare", {})["agreement_auroc"] = round(auroc(np.array(pos), np.array(neg)), 4)
    long: dict[str, dict[str, float]] = {}
    for cat in sorted({r["category"] for r in rows if r["category"].startswith("long_")}):
        idx = np.array([i for i, r in enumerate(rows) if r["category"] == cat])
        kind, words = cat.split("@")
        entry = long.setdefault(words, {})
        if kind == "long_kept":
            entry["accuracy"] = round(float((pred[idx] == gold[idx]).mean()), 4)
            for label in (E, C, N):  # each gold label's share predicted so, where the length has such rows
                of_label = idx[gold[idx] == label]
                if len(of_label):
                    entry[LABELS[label] + "_kept"] = round(float((pred[of_label] == label).mean()), 4)
        else:
            entry["false_entailment"] = round(float((pred[idx] == E).mean()), 4)
        entry["premise_words"] = round(float(np.mean([len(rows[i]["premise"].split()) for i in idx])), 1)
    return {"categories": categories, "groups": groups, "long": dict(sorted(long.items(), key=lambda kv: int(kv[0])))}


def gate_indices(rows: Sequence[dict[str, Any]], every: int = 10) -> list[int]:
    """A fixed slice for the CI quality gate, as row indices in file order: every ``every``-th pair (both
    directions) and every ``every``-th long-premise row."""
    pair_ids = list(dict.fromkeys(r["pair_id"] for r in rows if r["pair_id"]))
    keep = set(pair_ids[::every])
    singles = set([i for i, r in enumerate(rows) if not r["pair_id"]][::every])
    return [i for i, r in enumerate(rows) if r["pair_id"] in keep or i in singles]


def aligned_hypothesis(row: dict[str, Any]) -> str:
    """A row's hypothesis as the scorers read it with ``align_units``: its answer aligned to the premise's answer,
    then put after the question, when the row is question-aware (the scorers align before the question form); else
    the hypothesis aligned to the premise."""
    prefix = with_question(row.get("question") or "", "")
    if row.get("question") and row["premise"].startswith(prefix) and row["hypothesis"].startswith(prefix):
        return prefix + align_units(row["premise"][len(prefix):], row["hypothesis"][len(prefix):])
    return align_units(row["premise"], row["hypothesis"])


def row_probs(predict: Callable[[list[tuple[str, str]]], np.ndarray], rows: Sequence[dict[str, Any]],
              aligned: bool = False, plain: np.ndarray | None = None) -> np.ndarray:
    """``predict``'s probabilities ``[N, 3]`` of the rows' pairs; with ``aligned``, of the pairs as the scorers read
    them with ``align_units`` (a pair that becomes one text gets (0, 0, 1), as identical strings, without the model).
    ``plain``: the rows' probabilities as written, kept for the pairs that alignment leaves as they are (a
    batch-invariant engine gives them the same scores again)."""
    pairs = [(r["premise"], aligned_hypothesis(r) if aligned else r["hypothesis"]) for r in rows]
    out = np.tile(np.array([0.0, 0.0, 1.0], dtype=np.float32), (len(rows), 1))
    todo = [i for i, (p, h) in enumerate(pairs) if not aligned or p != h]
    if plain is not None:
        same = [i for i in todo if pairs[i][1] == rows[i]["hypothesis"]]
        out[same] = plain[same]
        todo = [i for i in todo if pairs[i][1] != rows[i]["hypothesis"]]
    if todo:
        out[todo] = predict([pairs[i] for i in todo])
    return out


def engine_probs(model: str | None, rows: Sequence[dict[str, Any]], aligned: bool = False) -> np.ndarray:
    from fastnli.engine import NLIEngine

    engine = NLIEngine.from_pretrained(model, device="cpu")
    return row_probs(engine.predict, rows, aligned)


def hf_probs(path: Path, rows: Sequence[dict[str, Any]], aligned: bool = False, batch_size: int = 64,
             max_length: int = 512, device: str = "cpu") -> np.ndarray:
    """Probabilities of a HF checkpoint with the label order of :data:`LABELS` (torch, fp32, length-sorted), run on
    ``device`` (a torch device name)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval().to(device)
    cols = [model.config.label2id[name] for name in LABELS]

    def predict(pairs: list[tuple[str, str]]) -> np.ndarray:
        order = np.argsort([len(p) + len(h) for p, h in pairs], kind="stable")
        out = np.zeros((len(pairs), 3), dtype=np.float32)
        with torch.inference_mode():
            for s in range(0, len(pairs), batch_size):
                idx = order[s : s + batch_size]
                enc = tok([pairs[i][0] for i in idx], [pairs[i][1] for i in idx], truncation=True,
                          max_length=max_length, padding=True, return_tensors="pt")
                out[idx] = torch.softmax(model(**enc.to(device)).logits.float(), -1)[:, cols].cpu().numpy()
        return out

    return row_probs(predict, rows, aligned)


def render(result: dict[str, Any]) -> str:
    lines = ["| category | pairs | metric | value | mean pair score |", "|---|---|---|---|---|"]
    for cat, c in result["categories"].items():
        lines.append(f"| {cat} | {c['pairs']} | {c['metric']} | {c['value']:.3f} | {c['mean_pair_score']:.3f} |")
    lines += ["", "| form | " + " | ".join(GROUP_FIGURES.values()) + " |", "|---|" + "---|" * len(GROUP_FIGURES)]
    for form, g in result["groups"].items():
        lines.append(f"| {form} | " + " | ".join(f"{g.get(k, float('nan')):.3f}" for k in GROUP_FIGURES) + " |")
    lines += ["", "| filler words | premise words | accuracy | entailment kept | contradiction kept | neutral kept | "
              "false entailment without evidence |", "|---|---|---|---|---|---|---|"]
    for words, e in result["long"].items():
        lines.append(f"| {words} | {e['premise_words']:.0f} | " + " | ".join(
            f"{e.get(k, float('nan')):.3f}" for k in LONG_FIGURES) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=Path, required=True, help="dev.jsonl or test.jsonl of answer_data.py")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a fastnli model: 'default' (the embedded one) or an artifact directory")
    src.add_argument("--hf", type=Path, help="a HF checkpoint directory, run with torch fp32")
    p.add_argument("--json", type=Path, help="also write the result as JSON here")
    p.add_argument("--align-units", action="store_true", help="read the pairs as the scorers do with align_units")
    p.add_argument("--device", default="cpu", help="torch device of an --hf checkpoint (e.g. cuda)")
    args = p.parse_args(argv)
    if args.device != "cpu" and args.hf is None:
        p.error("--device applies to --hf checkpoints; fastnli models (--model) run on the CPU here")
    rows = read_jsonl(args.rows)
    probs = (hf_probs(args.hf, rows, args.align_units, device=args.device) if args.hf is not None
             else engine_probs(None if args.model == "default" else args.model, rows, args.align_units))
    result = evaluate(rows, probs)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    sys.stdout.write(render(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
