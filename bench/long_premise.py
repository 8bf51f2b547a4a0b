"""Long documents: a labelled premise placed at depths of 0-4,000 tokens among unrelated sentences, read truncated
vs in windows, and the cost of chunking on a CaLM workload.

Usage (from the repository root; ``../shared/nli-data`` or ``--data``)::

    python -m bench.long_premise [--model DIR] [--pairs 60] [--depths 0,500,1000,2000,4000] [--queries 30]

**Needle at depth.** ``--pairs`` snli/dev pairs (CC BY-SA 4.0), balanced over the three labels, drawn from the
premises of the ``test`` part of ``tools/default_model/answer_data.part_of`` (never trained on). Per pair, one seeded
stream of unrelated mnli/dev_matched premises from the evaluation filler pool (``filler_pools``; sentences sharing two
content words with the pair are skipped, ``long_document``) supplies the document: filler sentences until at least
``depth`` tokens (the model's tokenizer), then the snli premise, then about 200 tokens of filler. The gold label stays
the pair's. Modes: ``alone`` (the snli pair as it is), ``truncate`` (the document cut ``longest_first`` at 512
tokens), ``chunk/full`` (windows as large as the model allows, ``WindowPolicy()``) and ``chunk`` (the model's own
window policy from its manifest: the embedded default model's 128-token windows and support threshold). Accuracy
is argmax = gold; each cell's cost is the model pairs (after dedup), their real tokens and the engine seconds of
that one call. *Support* is the checks' decision (:meth:`fastnli.calm.CheckConfig.entails` with the mode's
engine: P(entailment) > 0.5 for a document read whole, above the policy's threshold for one read in windows):
*found* over the entailed hypotheses with the premise in the document, *false* over every hypothesis against the
same document with the premise left out (reading more windows gives an unrelated document more chances to look
supporting).

**CaLM workload.** ``bench.calm_pairs.make_workload`` (``--queries`` queries, 5 documents each, scripted answers
citing them) with every document lengthened by 150-1,500 tokens of filler (its own sentences at a random depth), one
``calm_batch`` iteration in each mode: the planned (logical) pairs, the model
pairs the windows ask for (duplicates included), the unique ones the engine ran, their ratio, tokens, seconds and
the citation recall (statements are copied from their cited documents, so 1.0 means every one was found).

Seconds are one run each on a shared machine; compare the modes within one run, not across machines.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.calm import CheckConfig, calm_batch
from fastnli.engine import NLIEngine
from fastnli.engine.labels import CANONICAL_LABELS
from fastnli.engine.sentences import sentence_spans
from fastnli.engine.windows import LongPremise, WindowPolicy

AFTER_TOKENS = 200


def _data_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    return Path(__file__).resolve().parents[1].parent / "shared" / "nli-data"


def load(data: Path, n_pairs: int, seed: int, part: str = "test") -> tuple[list[dict[str, Any]], list[str]]:
    """(``n_pairs`` balanced snli/dev pairs of ``part`` (``"test"`` or ``"dev"`` of ``answer_data.part_of``), the
    evaluation filler pool)."""
    from tools.default_model.answer_data import clean, filler_pools, part_of, read_jsonl

    dev = read_jsonl(data / "dev.jsonl")
    pool = filler_pools(dev)["eval"]
    rng = random.Random(seed)
    pairs: list[dict[str, Any]] = []
    for label in CANONICAL_LABELS:
        cands = [r for r in dev if r["source"] == "snli/dev" and r["label"] == label
                 and part_of(r["premise"]) == part]
        pairs += [{**r, "premise": clean(r["premise"])} for r in rng.sample(cands, n_pairs // 3)]
    return pairs, pool


def _counter(engine: NLIEngine) -> Any:
    tok = engine.window_planner.tokenizer

    def tokens(texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in tok.encode_texts(list(texts))]

    return tokens


def documents(pairs: list[dict[str, Any]], pool: list[str], depths: Sequence[int], engine: NLIEngine, seed: int
              ) -> dict[int, list[tuple[str, int, str]]]:
    """Per depth, per pair: (document, the premise's real depth in tokens, the same document without the premise)."""
    from tools.default_model.answer_data import long_document

    tokens = _counter(engine)
    need = max(depths) + AFTER_TOKENS
    out: dict[int, list[tuple[str, int, str]]] = {d: [] for d in depths}
    for i, r in enumerate(pairs):
        rng = random.Random(seed * 7919 + i)
        stream = long_document(None, f"{r['hypothesis']} {r['premise']}", pool, need, rng)  # words: more tokens than needed
        sents = [stream[a:b] for a, b in sentence_spans(stream)]
        lengths = np.cumsum(tokens(sents))
        for d in depths:
            cut = int(np.searchsorted(lengths, d)) + 1 if d else 0  # first sentences reaching d tokens
            before = sents[:cut]
            after_end = int(np.searchsorted(lengths, (lengths[cut - 1] if cut else 0) + AFTER_TOKENS)) + 1
            doc = " ".join([*before, r["premise"], *sents[cut:after_end]])
            out[d].append((doc, int(lengths[cut - 1]) if cut else 0, " ".join([*before, *sents[cut:after_end]])))
    return out


def supported(config: CheckConfig, got: Any) -> np.ndarray:
    """Per pair of a ``predict_detailed`` result, the checks' support decision (:meth:`CheckConfig.entails`: above
    ``entailment_threshold`` read whole, above ``window_entailment_threshold`` read in windows)."""
    return np.array([config.entails(row, n > 1) for row, n in zip(got.probs, got.num_windows)], dtype=bool)


def needle_table(engines: dict[str, NLIEngine], pairs: list[dict[str, Any]],
                 docs: dict[int, list[tuple[str, int, str]]]) -> list[dict[str, Any]]:
    """Per mode and depth: accuracy with the premise in the document, the entailed hypotheses found supported
    (:func:`supported`), and every hypothesis found supported by the document without the premise (false support)."""
    gold = np.array([CANONICAL_LABELS.index(r["label"]) for r in pairs])
    entailed = gold == CANONICAL_LABELS.index("entailment")
    hyps = [r["hypothesis"] for r in pairs]
    base = engines["chunk"]
    alone = base.predict_detailed([(r["premise"], r["hypothesis"]) for r in pairs], "truncate")
    rows = [{"mode": "alone", "depth": 0, "real_depth": 0, "accuracy": float((alone.probs.argmax(1) == gold).mean()),
             "support_found": float((alone.probs[entailed, -1] > 0.5).mean()), "false_support": None,
             "model_pairs": alone.stats.model_pairs, "tokens": alone.stats.real_tokens,
             "seconds": alone.stats.seconds, "truncated": 0, "doc_tokens": float(alone.tokens.mean())}]
    for depth, items in docs.items():
        pairs_d = [(doc, h) for (doc, _, _), h in zip(items, hyps)]
        empty_d = [(doc, h) for (_, _, doc), h in zip(items, hyps)]
        for mode, engine in engines.items():
            long_premise: LongPremise = "truncate" if mode == "truncate" else "chunk"
            config = CheckConfig().for_engine(engine)  # the engine's window policy decides support
            got = engine.predict_detailed(pairs_d, long_premise)
            empty = engine.predict_detailed(empty_d, long_premise)
            rows.append({"mode": mode, "depth": depth, "real_depth": float(np.mean([d for _, d, _ in items])),
                         "accuracy": float((got.probs.argmax(1) == gold).mean()),
                         "support_found": float(supported(config, got)[entailed].mean()),
                         "false_support": float(supported(config, empty).mean()),
                         "model_pairs": got.stats.model_pairs, "tokens": got.stats.real_tokens,
                         "seconds": got.stats.seconds, "truncated": got.stats.truncated_pairs,
                         "doc_tokens": float(got.tokens.mean())})
    return rows


def lengthen(documents: list[list[dict[str, str]]], pool: list[str], seed: int) -> list[list[dict[str, str]]]:
    """Each document's sentences at a random depth among 150-1,500 tokens (~1.3 per word) of filler."""
    rng = random.Random(seed)
    out = []
    for docs in documents:
        longer = []
        for d in docs:
            words = int(rng.randint(150, 1500) / 1.3)
            filler: list[str] = []
            n = 0
            while n < words:
                s = rng.choice(pool)
                filler.append(s)
                n += len(s.split())
            at = rng.randint(0, len(filler))
            longer.append({"title": d["title"], "text": " ".join(filler[:at] + [d["text"]] + filler[at:])})
        out.append(longer)
    return out


def calm_table(engines: dict[str, NLIEngine], pool: list[str], n_queries: int, seed: int) -> list[dict[str, Any]]:
    from bench.calm_pairs import _by_question, make_workload

    queries, docs, main, verifier = make_workload(n_queries, 5, 5, seed)
    docs = lengthen(docs, pool, seed)
    rows = []
    for mode, engine in engines.items():
        t0 = time.perf_counter()
        config = CheckConfig(long_premise="truncate" if mode == "truncate" else "chunk")
        batch = calm_batch(queries, docs, _by_question(main), _by_question(verifier), engine, k=5, max_iterations=1,
                           check_config=config)
        wall = time.perf_counter() - t0
        checks = [r.trace[0].check for r in batch if r.trace[0].check]
        p = batch.passes[0]
        recall = float(np.mean([c.citation_recall or 0.0 for c in checks]))
        rows.append({"mode": mode, "logical_pairs": sum(sum(c.nli_pairs.values()) for c in checks),
                     "requested_pairs": p["pairs_in"], "unique_pairs": p["unique_pairs"],
                     "unique_over_requested": p["unique_pairs"] / p["pairs_in"], "tokens": p["real_tokens"],
                     "engine_seconds": p["seconds"], "wall_seconds": wall,
                     "chunked_pairs": sum(c.chunked_pairs for c in checks),
                     "truncated_pairs": sum(c.truncated_pairs for c in checks), "citation_recall": recall})
    return rows


def markdown(needle: list[dict[str, Any]], calm: list[dict[str, Any]], depths: Sequence[int], meta: dict[str, Any]
             ) -> str:
    modes = ["truncate", "chunk/full", "chunk"]
    acc = {(r["mode"], r["depth"]): r for r in needle}
    alone = acc[("alone", 0)]
    lines = [f"Needle at depth: {meta['pairs']} snli/dev pairs, model {meta['model']} ({meta['device']}/"
             f"{meta['precision']}); needle-alone accuracy {alone['accuracy']:.3f}.", "",
             "| depth (tokens) | real depth | document tokens | " + " | ".join(f"{m} acc" for m in modes)
             + " | " + " | ".join(f"{m} pairs / tokens / s" for m in modes) + " |",
             "|---|---|---|" + "---|" * (2 * len(modes))]
    for d in depths:
        cells = [acc[(m, d)] for m in modes]
        lines.append(f"| {d} | {cells[0]['real_depth']:.0f} | {cells[0]['doc_tokens']:.0f} | "
                     + " | ".join(f"{c['accuracy']:.3f}" for c in cells) + " | "
                     + " | ".join(f"{c['model_pairs']} / {c['tokens']} / {c['seconds']:.2f}" for c in cells) + " |")
    lines += ["", f"Support (the checks' rule: P(entailment) > 0.5 read whole, > {meta['window_threshold']} read in "
              f"windows with the model's policy; > 0.5 with chunk/full): of the {meta['entailed']} "
              f"entailed hypotheses with the premise in the document (alone: {alone['support_found']:.3f}), and of all "
              f"{meta['pairs']} hypotheses against the same document without the premise (false support).", "",
              "| depth (tokens) | " + " | ".join(f"{m} found | {m} false" for m in modes) + " |",
              "|---|" + "---|" * (2 * len(modes))]
    for d in depths:
        cells = [acc[(m, d)] for m in modes]
        lines.append(f"| {d} | " + " | ".join(f"{c['support_found']:.3f} | {c['false_support']:.3f}" for c in cells)
                     + " |")
    lines += ["", f"CaLM workload: {meta['queries']} queries x 5 documents of 150-1,500 extra tokens, one iteration.",
              "", "| mode | logical pairs | requested model pairs | unique | unique/requested | tokens | engine s | "
              "chunked | truncated | citation recall |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in calm:
        lines.append(f"| {r['mode']} | {r['logical_pairs']} | {r['requested_pairs']} | {r['unique_pairs']} | "
                     f"{r['unique_over_requested']:.3f} | {r['tokens']} | {r['engine_seconds']:.2f} | "
                     f"{r['chunked_pairs']} | {r['truncated_pairs']} | {r['citation_recall']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model", default=None, help="artifact or checkpoint (default: the embedded default model)")
    p.add_argument("--data", default=None, help="the nli-data directory (default: ../shared/nli-data)")
    p.add_argument("--pairs", type=int, default=60, help="snli/dev pairs, a third per label (default 60)")
    p.add_argument("--depths", default="0,500,1000,2000,4000", help="needle depths in tokens")
    p.add_argument("--queries", type=int, default=30, help="CaLM workload queries (default 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the rows as JSON and the tables as Markdown here (a directory)")
    args = p.parse_args(argv)
    depths = [int(x) for x in args.depths.split(",")]

    chunk = NLIEngine.from_pretrained(args.model)  # the model's window policy (its manifest), else WindowPolicy()
    full = NLIEngine.from_pretrained(args.model, window_policy=WindowPolicy())
    engines = {"truncate": full, "chunk/full": full, "chunk": chunk}
    pairs, pool = load(_data_dir(args.data), args.pairs, args.seed)
    docs = documents(pairs, pool, depths, chunk, args.seed)
    needle = needle_table(engines, pairs, docs)
    calm = calm_table(engines, pool, args.queries, args.seed)
    policy = chunk.window_planner.policy
    meta = {"pairs": len(pairs), "entailed": sum(r["label"] == "entailment" for r in pairs),
            "model": str(chunk.manifest.source), "device": chunk.device,
            "precision": chunk.precision, "queries": args.queries, "depths": depths,
            "window_policy": {"max_window_tokens": policy.max_window_tokens,
                              "entailment_threshold": policy.entailment_threshold,
                              "contradiction_threshold": policy.contradiction_threshold,
                              "fallback": policy.fallback},
            "window_threshold": policy.entailment_threshold or 0.5}
    text = markdown(needle, calm, depths, meta)
    sys.stdout.write(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "long_premise.json").write_text(json.dumps({"meta": meta, "needle": needle, "calm": calm}, indent=2))
        (out / "long_premise.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
