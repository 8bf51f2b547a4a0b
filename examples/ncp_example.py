"""Score examples/ncp.jsonl with the embedded default model through the Python API; one line per row.

Run from anywhere: ``python examples/ncp_example.py`` (offline, CPU, no torch). Each line of ncp.jsonl holds a
``response``, its ``sampled_responses`` and the ``prompt`` (the question), which the default model reads with each
answer (question-aware scoring, see docs/scorers.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import fastnli

SCORERS = ("noncontradiction", "entailment", "semantic_negentropy", "semantic_sets_confidence")


def main() -> None:
    path = Path(__file__).with_name("ncp.jsonl")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    result = fastnli.score(
        responses=[r["response"] for r in rows],
        sampled_responses=[r["sampled_responses"] for r in rows],
        prompts=[r["prompt"] for r in rows],
        scorers=SCORERS,
    )
    for r, s in zip(rows, result):
        print(f"{r.get('case', s.index):<32} NCP {s.noncontradiction:.3f}  entailment {s.entailment:.3f}  "
              f"semantic negentropy {s.semantic_negentropy:.3f}  semantic sets {s.num_semantic_sets}")
    print(f"{len(result)} responses, {result.stats.unique_pairs} unique pairs on {result.device}/{result.precision} "
          f"in {result.seconds:.2f} s")


if __name__ == "__main__":
    main()
