"""Re-measure the shipped default model on this CPU and record the run in its quality.json and model card.

    python -m tools.default_model.measure [--model fastnli/models/default] [--data ../shared/nli-data]

The shipped INT8 graph's speed (and, on CPUs without VNNI, what ORT's saturating U8S8 kernels do to its labels)
depends on the CPU; ``tools/default_model/ship.py`` measures the CPU it ships on. This tool adds a run for the CPU
it runs on (replacing an earlier run of the same CPU and kernels): INT8 accuracy on the full snli/dev and
lingnli/val, agreement with the shipped fp32 argmax on the CI gate slices, and snli/dev pairs/s, tokenization
included. It re-renders ``MODEL_CARD.md`` from ``quality.json``; the graph and the other figures are unchanged.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from fastnli.engine import NLIEngine
from tools.default_model.ship import (
    QUALITY,
    REPO,
    cpu_run,
    load_splits,
    logger,
    merge_cpu_run,
    record_shipped,
)

SPLITS = ("snli/dev", "lingnli/val")
#: An INT8 accuracy this far from the shipped figure means other INT8 arithmetic than at ship time.
ACCURACY_WARNING = 0.002


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=REPO / "fastnli" / "models" / "default",
                    help="the shipped model directory (default: the package's)")
    ap.add_argument("--quality", type=Path, default=QUALITY, help="the model's quality records (default: %(default)s)")
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "nli-data")
    ap.add_argument("--limit", type=int, default=None,
                    help="score only the first N rows of each split (a quick check; recorded in the run)")
    ap.add_argument("--dry-run", action="store_true", help="measure and log, but write nothing")
    args = ap.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        ap.error(f"--limit {args.limit}: give a positive number of rows, or leave it out for the full splits")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logger.setLevel(logging.INFO)

    quality_path: Path = args.quality
    quality = json.loads(quality_path.read_text())
    splits = {split: rows[: args.limit] for split, rows in load_splits(args.data, SPLITS).items()}
    engine = NLIEngine(args.model, device="cpu", precision="int8")
    run = cpu_run(engine, splits, quality["gate"], "tools/default_model/measure.py")
    if args.limit is None:
        for split in SPLITS:
            shipped, now = quality["accuracy"][split]["int8"], run["accuracy_int8"][split]
            if abs(now - shipped) > ACCURACY_WARNING:
                logger.warning("%s INT8 accuracy %.4f here vs %.4f shipped: this CPU's INT8 arithmetic differs",
                               split, now, shipped)
    if args.dry_run:
        return 0
    quality["cpu_runs"] = merge_cpu_run(quality.get("cpu_runs", []), run)
    record_shipped(args.model, quality_path, quality)
    logger.info("recorded the run in %s and its model card", quality_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
