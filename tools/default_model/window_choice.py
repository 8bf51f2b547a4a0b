"""Choose how the default model reads long documents (its manifest's ``window_policy``) by measurement.

    python -m tools.default_model.window_choice [--model fastnli/models/default] [--pairs 300] [--write]

CaLM, ALCE and :func:`fastnli.grounding` read a document longer than the model in windows and take the best window's
P(entailment). A small model trained on short premises grows less sure as unrelated text surrounds the evidence,
and the max over many windows runs high on text that says nothing about the statement. So the window size and the
support threshold for a premise read in windows are the model's to choose, on its own evaluation.

**Documents** (``bench.long_premise.documents``): ``--pairs`` snli/dev pairs balanced over the labels, drawn from the
premises of the ``dev`` part of ``tools/default_model/answer_data.part_of`` (never trained on); the premise among
unrelated mnli/dev_matched sentences of the evaluation filler pool at depths of 0-4,000 tokens, and the same document
without it. **Found**: entailed hypotheses whose document counts as support; **false**: every hypothesis whose
document without the premise counts as support. A document read whole counts above 0.5, one read in windows above
the candidate's threshold (the library's rule, :meth:`fastnli.calm.CheckConfig.entails`).

**Rule**: among window caps (none: as large as the model allows; 256; 128 tokens) x thresholds (0.5-0.8), the
highest mean *found* over depths among the candidates whose *false* is at most ``MAX_FALSE`` at every depth; ties go
to larger windows (fewer pairs), then the lower threshold. The ``test`` part is measured for the chosen policy and
the plain one (no cap, 0.5) and reported only. ``--write`` records both tables in ``quality.json``
(``window_policy``), sets the manifest's ``window_policy`` (without a contradiction bar, which was chosen for the
policy it replaces: ``contradiction_choice`` chooses it next) and re-renders the model card.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.long_premise import documents, load, supported
from fastnli.calm import CheckConfig
from fastnli.engine import NLIEngine
from fastnli.engine.windows import WindowPolicy
from tools.default_model.ship import choice_parser, log_progress, logger, record_shipped

CAPS: tuple[int | None, ...] = (None, 256, 128)
THRESHOLDS: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8)
DEPTHS: tuple[int, ...] = (0, 1000, 2500, 4000)
#: the most false support a chosen policy may give at any depth
MAX_FALSE = 0.10
#: the bar of a document read whole
WHOLE_THRESHOLD = 0.5
RULE = (f"highest mean support found over depths {list(DEPTHS)} among window caps {list(CAPS)} x thresholds "
        f"{list(THRESHOLDS)} whose false support is at most {MAX_FALSE} at every depth (ties: larger windows, then "
        "the lower threshold); dev part")


def candidate(threshold: float) -> CheckConfig:
    """The checks' rule of a candidate: above 0.5 read whole, above ``threshold`` read in windows."""
    return CheckConfig(entailment_threshold=WHOLE_THRESHOLD, window_entailment_threshold=threshold)


def measure(model: Path, part: str, n_pairs: int, caps: Sequence[int | None], depths: Sequence[int], seed: int,
            data: Path) -> dict[str, Any]:
    """Per cap, per depth: found and false support at every threshold, and the windows read."""
    pairs, pool = load(data, n_pairs, seed, part)
    entailed = np.array([r["label"] == "entailment" for r in pairs])
    hyps = [r["hypothesis"] for r in pairs]
    out: dict[str, Any] = {"part": part, "pairs": len(pairs), "entailed": int(entailed.sum()), "caps": {}}
    docs = None
    for cap in caps:
        engine = NLIEngine(model, device="cpu", window_policy=WindowPolicy(max_window_tokens=cap))
        docs = docs or documents(pairs, pool, depths, engine, seed)
        rows: dict[str, Any] = {}
        t0 = time.perf_counter()
        for depth, items in docs.items():
            got = engine.predict_detailed([(doc, h) for (doc, _, _), h in zip(items, hyps)], "chunk")
            empty = engine.predict_detailed([(doc, h) for (_, _, doc), h in zip(items, hyps)], "chunk")
            rows[str(depth)] = {
                "windows": float(np.mean(empty.num_windows)),
                "found": {str(t): float(supported(candidate(t), got)[entailed].mean()) for t in THRESHOLDS},
                "false": {str(t): float(supported(candidate(t), empty).mean()) for t in THRESHOLDS}}
        out["caps"][str(cap)] = {"depths": rows, "seconds": time.perf_counter() - t0}
        logger.info("%s part, cap %s: %s", part, cap, json.dumps(rows))
    return out


def choose(table: dict[str, Any]) -> dict[str, Any]:
    """The policy :data:`RULE` picks from a :func:`measure` table (``max_window_tokens``, ``entailment_threshold``);
    the plain policy (no cap, 0.5) when no candidate keeps false support within :data:`MAX_FALSE`."""
    best: tuple[float, int, float] | None = None
    choice: dict[str, Any] = {"max_window_tokens": None, "entailment_threshold": WHOLE_THRESHOLD}
    for cap_key, entry in table["caps"].items():
        cap = None if cap_key == "None" else int(cap_key)
        for t in THRESHOLDS:
            cells = entry["depths"].values()
            if max(c["false"][str(t)] for c in cells) > MAX_FALSE:
                continue
            key = (float(np.mean([c["found"][str(t)] for c in cells])), cap or 1 << 30, -t)
            if best is None or key > best:
                best, choice = key, {"max_window_tokens": cap, "entailment_threshold": t}
    return choice


def main(argv: list[str] | None = None) -> int:
    args = choice_parser(__doc__, pairs=300, test_pairs=150, seed=11).parse_args(argv)
    log_progress()

    dev = measure(args.model, "dev", args.pairs, CAPS, DEPTHS, args.seed, args.data)
    choice = choose(dev)
    logger.info("chosen on the dev part: %s", choice)
    plain: dict[str, Any] = {"max_window_tokens": None, "entailment_threshold": WHOLE_THRESHOLD}
    caps = list(dict.fromkeys([None, choice["max_window_tokens"]]))
    test = measure(args.model, "test", args.test_pairs, caps, DEPTHS, args.seed, args.data)
    record = {"choice": choice, "plain": plain, "rule": RULE, "dev": dev, "test": test}
    sys.stdout.write(json.dumps({"choice": choice, "test": {k: test["caps"][str(p["max_window_tokens"])]["depths"]
                                                 for k, p in (("choice", choice), ("plain", plain))}}, indent=1) + "\n")
    if args.write:
        quality = json.loads(args.quality.read_text())
        quality["window_policy"] = record
        path = record_shipped(args.model, args.quality, quality, {"window_policy": choice})
        logger.info("recorded %s in %s, %s and the model card", choice, args.quality, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
