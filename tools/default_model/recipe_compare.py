"""Compare INT8 recipes on one checkpoint: how closely each INT8 graph follows the fp32 graph.

Each ``--variant NAME=JSON`` exports the checkpoint with the ship tool's recipe ``--recipe`` updated by JSON (e.g.
``gptq='{"weight_rounding": {"method": "gptq", "inputs": "quantized"}}'``; ``{}`` is the recipe itself) and
``--calibration-pairs`` pairs of :func:`~tools.default_model.ship.calibration_pairs`, then scores snli/dev,
mnli/dev_matched and lingnli/val with it. Reported per split: argmax agreement with the fp32 graph, mean |Δp| against
it, accuracy, and pairs/s of the INT8 engine (one pass, tokenization included). Choose on snli/dev and
mnli/dev_matched; lingnli/val is the held-out check.

    python -m tools.default_model.recipe_compare --checkpoint DIR --out DIR \\
        --variant nearest='{}' --variant gptq='{"weight_rounding": {"method": "gptq", "inputs": "quantized"}}'
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.engine.engine import NLIEngine
from fastnli.engine.session import cpu_model_name, int8_isa
from fastnli.exporter.export import export
from tools.default_model import ship

logger = logging.getLogger("fastnli")
SPLITS = ("snli/dev", "mnli/dev_matched", "lingnli/val")


def score(engine: NLIEngine, rows: list[dict[str, str]]) -> tuple[np.ndarray, float]:
    """Probabilities of ``rows`` and the pairs/s of that one pass."""
    t0 = time.perf_counter()
    probs = engine.predict([(r["premise"], r["hypothesis"]) for r in rows])
    return probs, len(rows) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="a directory for the artifacts and results.json")
    ap.add_argument("--data", type=Path, default=ship.REPO.parent / "shared" / "nli-data")
    ap.add_argument("--recipe", choices=sorted(ship.RECIPES), default="static-fp16-embeddings")
    ap.add_argument("--variant", action="append", required=True, metavar="NAME=JSON")
    ap.add_argument("--calibration-pairs", type=int, default=ship.CALIBRATION_PAIRS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    pairs = ship.calibration_pairs(args.data, args.calibration_pairs)
    splits = ship.load_splits(args.data, SPLITS)
    gold = {s: np.array([ship.LABELS.index(r["label"]) for r in rows]) for s, rows in splits.items()}
    results: dict[str, Any] = {"checkpoint": str(args.checkpoint), "recipe": args.recipe,
                               "calibration_pairs": len(pairs), "cpu": cpu_model_name(),
                               "int8_isa": int8_isa(), "variants": {}}
    fp32: dict[str, np.ndarray] = {}
    for spec in args.variant:
        name, _, text = spec.partition("=")
        update = json.loads(text or "{}")
        art = args.out / name
        t0 = time.perf_counter()
        manifest = export(args.checkpoint, art, precisions=("fp32", "int8"),
                          int8_recipe={**ship.RECIPES[args.recipe], **update}, calibration_pairs=pairs)
        export_s = time.perf_counter() - t0
        if not fp32:
            ref = NLIEngine(art, device="cpu", precision="fp32")
            fp32 = {s: score(ref, rows)[0] for s, rows in splits.items()}
            results["fp32_accuracy"] = {s: round(float(np.mean(fp32[s].argmax(1) == gold[s])), 4) for s in splits}
        int8 = NLIEngine(art, device="cpu", precision="int8")
        row: dict[str, Any] = {"recipe_update": update, "export_s": round(export_s, 1),
                               "weight_rounding": manifest.precisions["int8"].recipe["static"].get("weight_rounding")
                               if "static" in manifest.precisions["int8"].recipe else None}
        for s, rows in splits.items():
            probs, pps = score(int8, rows)
            row[s] = {"agreement": round(float(np.mean(probs.argmax(1) == fp32[s].argmax(1))), 4),
                      "mean_abs_dprob": round(float(np.abs(probs - fp32[s]).mean()), 5),
                      "accuracy": round(float(np.mean(probs.argmax(1) == gold[s])), 4), "pairs_per_s": round(pps, 1)}
        results["variants"][name] = row
        logger.info("%s: %s", name, json.dumps(row))
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
