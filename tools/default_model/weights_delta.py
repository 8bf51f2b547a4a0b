"""Carry a fine-tuned checkpoint between machines as fp16 differences from a base both machines hold.

A machine that trains (a lent GPU) often returns files under a size limit below a fp32 checkpoint (all-MiniLM-L6-v2:
91 MB). Both machines can rebuild the same base byte for byte (``recover`` from the shipped INT8 graph), so the
trained weights travel as ``candidate - base`` in float16, cut into parts; ``apply`` adds them back in float32. A
weight comes back within ``|difference| x 2^-11`` (float16 rounding) plus 6e-8 (its smallest step), far below what
training moves it.

Run from the repository root::

    python -m tools.default_model.weights_delta pack --base /tmp/recovered --checkpoint /tmp/run --out /tmp/parts
    python -m tools.default_model.weights_delta apply --base /tmp/recovered --parts /tmp/parts --out /tmp/run

``pack`` writes ``delta.partN`` (at most ``--part-mib`` MiB each), ``delta.json`` (the sha256 of the base's and the
candidate's weights and of the difference file, the largest round-trip error) and copies the candidate's small files
(``config.json``, tokenizer files, ``training_log.json``); ``apply`` refuses another base or incomplete parts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastnli.engine.manifest import sha256_file
from tools.default_model.train import TRAINING_LOG

WEIGHTS = "model.safetensors"
RECORD = "delta.json"
#: the checkpoint's files besides its weights that travel with the difference (those that exist)
SMALL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
               TRAINING_LOG)


def require_same_tensors(base_w: Mapping[str, Any], other_w: Mapping[str, Any], base: Path, other: Path,
                         why: str) -> None:
    """Refuse two weight sets that do not hold the same tensor names and shapes (``why``: what needs them equal)."""
    if base_w.keys() != other_w.keys() or any(base_w[k].shape != other_w[k].shape for k in base_w):
        raise ValueError(f"{other} and {base} hold different tensors: {why}")


def pack(base: Path, checkpoint: Path, out: Path, part_mib: float = 15.0) -> dict[str, Any]:
    """Write the float16 difference ``checkpoint - base`` in parts of at most ``part_mib`` MiB to ``out``, with its
    record and the checkpoint's small files; returns the record."""
    import torch
    from safetensors.torch import load_file, save

    base_w, cand_w = load_file(base / WEIGHTS), load_file(checkpoint / WEIGHTS)
    require_same_tensors(base_w, cand_w, base, checkpoint, "a difference needs the same architecture")
    delta = {k: (cand_w[k].float() - base_w[k].float()).half().contiguous() for k in cand_w}
    error = max((float((base_w[k].float() + delta[k].float() - cand_w[k].float()).abs().max()) for k in cand_w),
                default=0.0)
    out.mkdir(parents=True, exist_ok=True)
    blob = save(delta)
    size = int(part_mib * (1 << 20))
    parts = max(1, math.ceil(len(blob) / size))
    for i in range(parts):
        (out / f"delta.part{i}").write_bytes(blob[i * size:(i + 1) * size])
    for name in SMALL_FILES:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, out / name)
    record = {"parts": parts, "delta_sha256": hashlib.sha256(blob).hexdigest(),
              "base_sha256": sha256_file(base / WEIGHTS), "checkpoint_sha256": sha256_file(checkpoint / WEIGHTS),
              "max_abs_error": error, "dtype": str(torch.float16)}
    (out / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def apply(base: Path, parts: Path, out: Path) -> dict[str, Any]:
    """Rebuild the checkpoint ``pack`` wrote to ``parts`` onto ``base`` (float32) in ``out``; returns the record."""
    from safetensors.torch import load, load_file, save_file

    record = json.loads((parts / RECORD).read_text(encoding="utf-8"))
    if (here := sha256_file(base / WEIGHTS)) != record["base_sha256"]:
        raise ValueError(f"{base / WEIGHTS} has sha256 {here[:12]}, but the difference was taken from "
                         f"{record['base_sha256'][:12]}: rebuild that base first (tools/default_model/recover.py)")
    missing = [i for i in range(record["parts"]) if not (parts / f"delta.part{i}").is_file()]
    if missing:
        raise ValueError(f"{parts} lacks delta.part{missing[0]} of {record['parts']} parts")
    blob = b"".join((parts / f"delta.part{i}").read_bytes() for i in range(record["parts"]))
    if hashlib.sha256(blob).hexdigest() != record["delta_sha256"]:
        raise ValueError(f"the parts in {parts} do not add up to the difference that was packed (sha256 differs)")
    base_w, delta = load_file(base / WEIGHTS), load(blob)
    weights = {k: (base_w[k].float() + delta[k].float()).contiguous() for k in base_w}
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, out / WEIGHTS, metadata={"format": "pt"})
    for name in SMALL_FILES:
        if (parts / name).is_file():
            shutil.copy2(parts / name, out / name)
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("pack", help="write the float16 difference of --checkpoint from --base to --out")
    a.add_argument("--base", type=Path, required=True)
    a.add_argument("--checkpoint", type=Path, required=True)
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--part-mib", type=float, default=15.0, help="largest part, MiB (default 15)")
    b = sub.add_parser("apply", help="rebuild the checkpoint of --parts onto --base in --out")
    b.add_argument("--base", type=Path, required=True)
    b.add_argument("--parts", type=Path, required=True)
    b.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.command == "pack":
        record = pack(args.base, args.checkpoint, args.out, args.part_mib)
    else:
        record = apply(args.base, args.parts, args.out)
    sys.stdout.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
