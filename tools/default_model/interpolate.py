"""Mix two checkpoints of one architecture weight by weight: ``(1 - alpha) x base + alpha x tuned``.

A model fine-tuned further from a base gains on what the new rows teach and loses some of what the base knew. The
straight line between the two weight sets (weight-space ensembling, Wortsman et al. 2022, "Robust fine-tuning of
zero-shot models") keeps most of both at a middle ``alpha``: the default model's candidates are measured at a few
points of that line, chosen on the dev part only. Both checkpoints must hold the same tensors in the same order of
neurons (``tuned`` trained from ``base``, or from the same recovered weights).

Run from the repository root::

    python -m tools.default_model.interpolate --base /tmp/recovered --tuned /tmp/run --alpha 0.5 --out /tmp/mix

``out`` gets the mixed ``model.safetensors`` (float32), the tuned checkpoint's small files (config, tokenizer) and
``interpolate.json``: alpha and the sha256 of both inputs' weights. The tuned checkpoint's ``training_log.json`` comes
along with that record as its ``interpolated`` entry, so ``ship`` renders the mix in the model card and its rebuild.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from fastnli.engine.manifest import sha256_file
from tools.default_model.train import TRAINING_LOG
from tools.default_model.weights_delta import SMALL_FILES, WEIGHTS, require_same_tensors

RECORD = "interpolate.json"


def interpolate(base: Path, tuned: Path, alpha: float, out: Path) -> dict[str, Any]:
    """Write ``(1 - alpha) x base + alpha x tuned`` (every tensor, float32; integer tensors such as position ids
    must be equal and are copied) to ``out`` with ``tuned``'s small files; returns the record. ``alpha`` 0 is the
    base, 1 the tuned checkpoint; values outside [0, 1] extrapolate and are refused."""
    import torch
    from safetensors.torch import load_file, save_file

    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha}: use a value in [0, 1] (0: the base, 1: the tuned checkpoint)")
    base_w, tuned_w = load_file(base / WEIGHTS), load_file(tuned / WEIGHTS)
    require_same_tensors(base_w, tuned_w, base, tuned, "mixing needs one architecture")
    mixed: dict[str, torch.Tensor] = {}
    for name, b in base_w.items():
        t = tuned_w[name]
        if b.is_floating_point():
            mixed[name] = ((1.0 - alpha) * b.float() + alpha * t.float()).contiguous()
        elif torch.equal(b, t):
            mixed[name] = b.contiguous()
        else:
            raise ValueError(f"{name} is an integer tensor that differs between {base} and {tuned}")
    out.mkdir(parents=True, exist_ok=True)
    save_file(mixed, out / WEIGHTS, metadata={"format": "pt"})
    for name in SMALL_FILES:
        if (tuned / name).is_file() and name != TRAINING_LOG:
            shutil.copy2(tuned / name, out / name)
    record = {"alpha": alpha, "base": str(base), "base_sha256": sha256_file(base / WEIGHTS), "tuned": str(tuned),
              "tuned_sha256": sha256_file(tuned / WEIGHTS)}
    (out / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if (tuned / TRAINING_LOG).is_file():
        log = json.loads((tuned / TRAINING_LOG).read_text(encoding="utf-8"))
        log["interpolated"] = record
        (out / TRAINING_LOG).write_text(json.dumps(log, indent=2) + "\n", encoding="utf-8")
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, required=True, help="the checkpoint at alpha 0")
    p.add_argument("--tuned", type=Path, required=True, help="the checkpoint at alpha 1 (its config and tokenizer "
                   "are copied)")
    p.add_argument("--alpha", type=float, required=True, help="weight of --tuned, in [0, 1]")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    sys.stdout.write(json.dumps(interpolate(args.base, args.tuned, args.alpha, args.out)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
