"""Backbone shapes for the default model: INT8 speed at SNLI lengths and graph size, against the shipped model.

Usage (from the repository root; ``../shared/nli-data`` or ``--data``)::

    python -m bench.backbones [--pairs 2000] [--out bench/results]

Each candidate shape is a BERT encoder with seeded random weights and the shipped model's tokenizer, exported by
``fastnli export --int8-recipe static`` (the shipped recipe's static INT8 with the FFN outlier split; the kernels'
time does not depend on the weights' values). The shipped model (``fastnli/models/default``, its fp16 embedding
tables included) is the reference. Every engine scores the same first ``--pairs`` snli/dev pairs, interleaved three
times; the best pass per engine counts (pairs per second, tokenization included). Compare the ratios of one run, on
one CPU: the CPU is named in the output. The candidates' graphs keep fp32 embeddings; with the shipped fp16 tables a
graph is ``vocab x hidden x 2`` bytes smaller (``int8_graph_mb_fp16_embeddings``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from fastnli.default_model import DEFAULT_MODEL_DIR
from fastnli.engine import NLIEngine
from fastnli.engine.session import cpu_model_name, int8_isa

#: name -> (layers, hidden, FFN width, heads)
SHAPES = {"L12-H384 (MiniLM-L12, bge-small class)": (12, 384, 1536, 12),
          "L12-H768 (mpnet-base, BERT-base class)": (12, 768, 3072, 12)}
SHIPPED = "L6-H384 (all-MiniLM-L6-v2, shipped)"
LABELS = {0: "contradiction", 1: "neutral", 2: "entailment"}


def export_shape(shape: tuple[int, int, int, int], where: Path) -> Path:
    """A seeded random BERT of ``shape`` with the shipped tokenizer, exported with the static INT8 recipe."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    layers, hidden, ffn, heads = shape
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=ffn, num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    torch.manual_seed(0)
    ckpt, art = where / "checkpoint", where / "artifact"
    BertForSequenceClassification(cfg).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    subprocess.run([sys.executable, "-m", "fastnli", "export", str(ckpt), "--out", str(art), "--precisions",
                    "fp32,int8", "--int8-recipe", "static", "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    return art


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "nli-data")
    ap.add_argument("--pairs", type=int, default=2000, help="snli/dev pairs per pass (default 2000)")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    rows = [json.loads(x) for x in (args.data / "dev.jsonl").read_text().splitlines()]
    pairs = [(r["premise"], r["hypothesis"]) for r in rows if r["source"] == "snli/dev"][:args.pairs]
    with tempfile.TemporaryDirectory() as tmp:
        arts = {SHIPPED: DEFAULT_MODEL_DIR}
        for name, shape in SHAPES.items():
            arts[name] = export_shape(shape, Path(tmp) / name.split()[0])
        engines = {n: NLIEngine.from_pretrained(a, device="cpu", precision="int8") for n, a in arts.items()}
        for engine in engines.values():
            engine.predict(pairs[:200])  # warm-up
        best = dict.fromkeys(engines, 0.0)
        for _ in range(3):  # interleaved: every engine meets the same machine state
            for n, engine in engines.items():
                t0 = time.perf_counter()
                engine.predict(pairs)
                best[n] = max(best[n], len(pairs) / (time.perf_counter() - t0))
        vocab = Tokenizer.from_file(str(DEFAULT_MODEL_DIR / "tokenizer.json")).get_vocab_size()
        result: dict[str, Any] = {"cpu": cpu_model_name(), "int8_isa": int8_isa(), "pairs": len(pairs), "shapes": {}}
        for n, a in arts.items():
            manifest = json.loads((Path(a) / "manifest.json").read_text())
            mb = manifest["precisions"]["int8"]["bytes"] / 1e6
            # the fp32 word-embedding table a candidate would store in fp16, as the shipped recipe does
            saved = vocab * SHAPES[n][1] * 2 / 1e6 if n in SHAPES else 0.0
            result["shapes"][n] = {
                "pairs_per_s": round(best[n], 1), "ratio_to_shipped": round(best[n] / best[SHIPPED], 3),
                "int8_graph_mb": round(mb, 1), "int8_graph_mb_fp16_embeddings": round(mb - saved, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "backbones.json").write_text(json.dumps(result, indent=1) + "\n")
    sys.stdout.write(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
