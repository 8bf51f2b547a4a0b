"""NLI pairs of one CaLM iteration over many queries: how many go to the engine, how many remain after dedup, and
the time of that single engine pass.

Usage::

    python -m bench.calm_pairs [--model ARTIFACT_OR_CHECKPOINT] [--device cpu] [--precision fp32] \\
        [--queries 100] [--docs 5] [--k 5] [--repeats 3] [--seed 0]

Without ``--model`` a tiny seeded DeBERTa checkpoint (``fastnli.exporter.checkpoint.build_checkpoint``, the tests' ``art_v1``
shape) is built and exported (fp32 + int8) once into ``--work``.

Workload (synthetic, seeded; scripted LMs, no network): ``--queries`` queries with ``--docs`` documents each (3-6
sentences of ``fastnli.exporter.checkpoint.corpus`` per document, titled). The main answer has 3-5 sentences, each copied from
one of the documents it cites, with 1 (60 %), 2 (30 %) or 3 (10 %) citations. The verifier answer has 2-4
sentences: some copied from the main answer, the rest from the cited documents. One iteration (``max_iterations=1``)
of ``calm_batch`` runs; its engine pass holds every pair of every query: statements × verifier sentences
(corroboration), and per statement the joint cited documents plus, for multi-citation statements, each document
alone and each leave-one-out set (ALCE citation precision).

Timing: the engine pass (``CallStats.seconds``) and the whole ``calm_batch`` call, minimum over ``--repeats`` runs —
the minimum is the least disturbed by other work on a shared machine; nothing is cached between runs (no result
cache), so every run computes all unique pairs.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fastnli.calm import calm_batch
from fastnli.calm.statements import format_citations


def _sentences(seed: int) -> list[str]:
    from fastnli.exporter.checkpoint import corpus

    seen = dict.fromkeys(s.strip() for s in corpus(n=4000, seed=seed))
    return [s for s in seen if len(s.split()) >= 4 and s[-1] in ".!?"]


def make_workload(n_queries: int, n_docs: int, k: int, seed: int = 0
                  ) -> tuple[list[str], list[list[dict[str, str]]], dict[str, str], dict[str, str]]:
    """Queries, their documents, and the scripted main/verifier answers keyed by query."""
    rng = random.Random(seed)
    pool = _sentences(seed)
    queries, documents, main, verifier = [], [], {}, {}
    for i in range(n_queries):
        q = f"Question {i}: what does the record say about {rng.choice(pool).split()[1].lower()}?"
        docs_sents = [rng.sample(pool, rng.randint(3, 6)) for _ in range(n_docs)]
        documents.append([{"title": f"Record {i}-{j}", "text": " ".join(s)} for j, s in enumerate(docs_sents)])
        citable = min(k, n_docs)
        answer_sents = []
        for _ in range(rng.randint(3, 5)):
            n_cite = min(citable, rng.choices([1, 2, 3], weights=[6, 3, 1])[0])
            cites = sorted(rng.sample(range(citable), n_cite))
            text = rng.choice(docs_sents[cites[0]]).rstrip(".!?")
            answer_sents.append(f"{text} {format_citations(cites)}.")
        main[q] = " ".join(answer_sents)
        plain = [re.sub(r"\s*(\[\d+\])+", "", s) for s in answer_sents]
        n_v = rng.randint(2, 4)
        n_copy = rng.randint(1, min(n_v, len(plain)))
        cited_docs = sorted({int(c) - 1 for c in re.findall(r"\[(\d+)\]", main[q])})
        extra = [rng.choice(docs_sents[rng.choice(cited_docs)]) for _ in range(n_v - n_copy)]
        verifier[q] = " ".join(rng.sample(plain, n_copy) + extra)
        queries.append(q)
    return queries, documents, main, verifier


def _by_question(answers: dict[str, str]) -> Any:
    def lm(prompt: str) -> str:
        m = re.search(r"^Question: (.*)$", prompt, flags=re.M)
        assert m, "prompt without a Question: line"
        return answers[m.group(1)]

    return lm


def _tiny_artifact(work: Path) -> Path:
    from fastnli.exporter import export
    from fastnli.exporter.checkpoint import build_checkpoint

    art = work / "art_tiny"
    if not (art / "manifest.json").is_file():
        ck = build_checkpoint(work / "ck_tiny", arch="deberta", size="tiny", seed=0)
        export(ck, art, precisions=("fp32", "int8"))
    return art


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model", default=None, help="artifact or HF checkpoint dir (default: a tiny seeded checkpoint)")
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "fastnli-bench-calm"),
                   help="where the default tiny artifact is built once")
    p.add_argument("--device", default="cpu", choices=["auto", "cuda", "cpu"], help="default: cpu")
    p.add_argument("--precision", default="fp32", choices=["auto", "fp32", "fp16", "int8"], help="default: fp32")
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--docs", type=int, default=5, help="documents per query (default 5)")
    p.add_argument("--k", type=int, default=5, help="documents in the first prompt (default 5: all of them)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from fastnli.engine import NLIEngine

    model = Path(args.model) if args.model else _tiny_artifact(Path(args.work))
    engine = NLIEngine.from_pretrained(model, device=args.device, precision=args.precision)
    queries, documents, main_answers, verifier_answers = make_workload(args.queries, args.docs, args.k, args.seed)
    runs = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        batch = calm_batch(queries, documents, _by_question(main_answers), _by_question(verifier_answers), engine,
                           k=args.k, max_iterations=1)
        runs.append((time.perf_counter() - t0, batch))
    wall, batch = min(runs, key=lambda r: r[1].passes[0]["seconds"])
    pass0 = batch.passes[0]
    checks = [r.trace[0].check for r in batch if r.trace[0].check]
    corro = sum(c.nli_pairs["corroboration"] for c in checks)
    cite = sum(c.nli_pairs["citation"] for c in checks)
    statements = sum(len(c.statements) for c in checks)
    verifier_sents = sum(len(c.verifier_sentences or []) for c in checks)

    table = Table(title=f"one CaLM iteration: {len(queries)} queries, {args.docs} documents each, k={args.k}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("model", str(engine.manifest.source)), ("device / precision", f"{engine.device} / {engine.precision}"),
        ("statements (main answers)", f"{statements}"), ("verifier sentences", f"{verifier_sents}"),
        ("pairs: corroboration (statement × verifier sentence)", f"{corro}"),
        ("pairs: citation support (joint, single, leave-one-out)", f"{cite}"),
        ("pairs sent to the engine (one call)", f"{pass0['pairs_in']}"),
        ("unique pairs after dedup", f"{pass0['unique_pairs']}"),
        ("dedup ratio", f"{pass0['dedup_ratio']:.3f}"),
        ("batches", f"{pass0['batches']}"), ("padding efficiency", f"{pass0['padding_efficiency']:.3f}"),
        (f"engine pass, s (min of {args.repeats})", f"{pass0['seconds']:.3f}"),
        ("unique pairs / s", f"{pass0['unique_pairs'] / pass0['seconds']:.0f}"),
        ("whole calm_batch call, s (same run)", f"{wall:.3f}"),
        ("truncated pairs (estimate)", f"{sum(c.truncated_pairs for c in checks)}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
