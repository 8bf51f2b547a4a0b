"""The mission evaluation's long premises read as the grounding checks read documents, recorded in the model card.

    python -m tools.default_model.windowed_long [--model fastnli/models/default] [--every N] [--precision P] [--write]

``mission_eval`` reads each long-premise row (the evidence sentence among 40-330 words of unrelated licensed text,
and the same text without it; the ``test`` part of ``answer_data --seed 0``) whole, as one pair: the model's own
reading of a long window. The CaLM checks, ALCE and :func:`fastnli.grounding` read a document in the windows of the
model's ``window_policy`` instead (``window_choice`` and ``contradiction_choice`` chose it on other documents), and
``predict(..., long_premise="chunk")`` reads premises that way on request. This tool scores the same rows both ways
in one run, through the INT8 graph (``--precision``), and with ``--write`` records both tables as ``quality.json``'s
``mission_windows`` and re-renders the model card. ``tools/default_model/ship.py`` runs it after the window choices.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from fastnli.engine import NLIEngine
from fastnli.engine.manifest import MANIFEST_NAME
from tools.default_model import answer_data, mission_eval
from tools.default_model.ship import choice_parser, log_progress, logger, record_shipped

#: the rows' categories start with this (``long_kept@<words>`` and ``long_removed@<words>``)
LONG_PREFIX = "long_"


def long_rows(data: Any, every: int = 1) -> list[dict[str, Any]]:
    """The test part's long-premise rows, in file order; with ``every``, every ``every``-th row of each category."""
    rows = [r for r in answer_data.build(data, long_train=0)["test"] if r["category"].startswith(LONG_PREFIX)]
    seen: dict[str, int] = {}
    kept = []
    for r in rows:
        n = seen[r["category"]] = seen.get(r["category"], -1) + 1
        if n % every == 0:
            kept.append(r)
    return kept


def measure(engine: NLIEngine, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The long-premise figures of ``rows`` read whole (``long_premise="truncate"``, ``predict``'s default: a pair
    over the model's limit is cut) and in the engine's windows (``"chunk"``), and how many windows the premises were
    read in."""
    whole = mission_eval.row_probs(engine.predict, rows)
    detailed = engine.predict_detailed([(r["premise"], r["hypothesis"]) for r in rows], long_premise="chunk")
    windows: dict[str, list[int]] = {}
    for r, count in zip(rows, detailed.num_windows.tolist()):
        windows.setdefault(r["category"].split("@")[1], []).append(count)
    read = mission_eval.evaluate(rows, detailed.probs)["long"]
    for words, entry in read.items():
        entry["windows_per_premise"] = round(sum(windows[words]) / len(windows[words]), 2)
    return {"rows": len(rows), "whole": mission_eval.evaluate(rows, whole)["long"], "windows": read}


def main(argv: list[str] | None = None) -> int:
    ap = choice_parser(__doc__)
    ap.add_argument("--every", type=int, default=1, help="score every N-th row of each category (the rows with and "
                    "without the evidence at each length) only (default 1: all)")
    ap.add_argument("--precision", default="int8", help="the graph to run (default int8, the shipped one; a "
                    "candidate exported with --precisions fp32: fp32)")
    args = ap.parse_args(argv)
    if args.every < 1:
        ap.error(f"--every {args.every}: give a positive step (1 scores every row)")
    log_progress()
    engine = NLIEngine(args.model, device="cpu", precision=args.precision)
    rows = long_rows(args.data, args.every)
    logger.info("%d long-premise rows of the test part, read whole and in the windows of %s", len(rows),
                engine.window_planner.policy)
    record = {"part": "test", "every_nth": args.every, "precision": args.precision, **measure(engine, rows),
              "window_policy": json.loads((args.model / MANIFEST_NAME).read_text()).get("window_policy")}
    sys.stdout.write(json.dumps({k: record[k] for k in ("whole", "windows")}, indent=1) + "\n")
    if args.write:
        quality = json.loads(args.quality.read_text())
        quality["mission_windows"] = record
        record_shipped(args.model, args.quality, quality)
        logger.info("recorded the long premises read in windows in %s and the model card", args.quality)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
