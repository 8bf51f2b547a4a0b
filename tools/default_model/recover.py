"""Recover a fine-tunable PyTorch checkpoint from the shipped INT8 graph of the default model.

    python -m tools.default_model.recover [--model fastnli/models/default] --out DIR [--check 2000]

Only the INT8 graph ships, so a later training stage needs fp32 weights that no longer exist once a session's
checkpoints are gone. The graph holds every weight: the products are int8 per output channel (dequantized here:
``(q - zero_point) * scale``), everything else is stored as it was (the embedding tables in fp16). The static INT8
recipe's outlier rewrites (:mod:`fastnli.exporter.outliers`) are undone exactly: the feed-forward neurons moved to a
fp32 branch come back as the last columns of the input projection and the last rows of the output projection (the
neurons' order inside a layer does not change the function), and the input channels of the FFN and of the attention's
query, key and value split into dithered copies are folded back (``W[c] += spread[c] @ W_copies``, the dither into the
bias).

The result is a ``BertForSequenceClassification`` directory (``config.json``, ``model.safetensors``, tokenizer files)
for ``tools/default_model/train.py --base``. It differs from the fp32 weights the graph was made from by the
rounding of the int8 products (about 0.4% of each output channel's largest weight); ``--check N`` scores the first N
snli/dev pairs with both and logs their argmax agreement and largest probability difference.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.engine.manifest import read_manifest
from fastnli.exporter.outliers import ATTENTION_TAG, BRANCH_TAG, SPLIT_DITHER
from tools.default_model.train import TRAINING_LOG

logger = logging.getLogger("fastnli")
REPO = Path(__file__).resolve().parents[2]
PARTS = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
         "attention/output/dense": "attention.output.dense"}


class Graph:
    """The initializers, constants and nodes of an ONNX graph, by name."""

    def __init__(self, path: Path) -> None:
        import onnx
        from onnx import numpy_helper

        model = onnx.load(str(path))
        self.arrays = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].HasField("t"):
                self.arrays[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
            elif node.op_type == "Identity" and node.input[0] in self.arrays:  # the export shares equal tensors
                self.arrays[node.output[0]] = self.arrays[node.input[0]]
        self.nodes = {node.name: node for node in model.graph.node}

    def array(self, name: str) -> np.ndarray:
        return np.asarray(self.arrays[name], dtype=np.float32)

    def has(self, name: str) -> bool:
        return name in self.arrays

    def inputs(self, node_name: str, *index: int) -> list[np.ndarray]:
        """The constant inputs ``index`` of a node (weights read where the node reads them, whatever their name)."""
        return [self.array(self.node(node_name).input[i]) for i in index]

    def node(self, name: str) -> Any:
        if name not in self.nodes:
            raise ValueError(f"the graph has no node {name}: it is not a BERT export of fastnli's static INT8 recipe")
        return self.nodes[name]

    def dequantized(self, node_name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(W (in, out), bias (out,))`` of a ``MatMulIntegerToFloat`` node with per-channel int8 weights; its bias
        is its 7th input, or the constant of the ``Add`` named after it (a bias the INT8 fusion left apart)."""
        node = self.node(node_name)
        if node.op_type != "MatMulIntegerToFloat":
            raise ValueError(f"{node_name} is a {node.op_type}; expected a MatMulIntegerToFloat (the static INT8 "
                             "recipe of the shipped default model)")
        q = self.arrays[node.input[1]].astype(np.float32)
        w = (q - self.array(node.input[5])) * self.array(node.input[3])
        if len(node.input) > 6 and node.input[6]:
            return w, self.array(node.input[6])
        return w, self.constant_input(node_name.removesuffix("MatMul") + "Add")  # the export names the bias Add so

    def constant_input(self, node_name: str) -> np.ndarray:
        """The one constant input of a node (a bias ``Add``)."""
        node = self.nodes.get(node_name)
        found = [name for name in (node.input if node is not None else []) if name in self.arrays]
        if len(found) != 1:
            raise ValueError(f"{node_name}: expected a node with one constant input (a bias Add); the graph is not "
                             "the static INT8 recipe's")
        return self.array(found[0])


def unsplit(g: Graph, w: np.ndarray, b: np.ndarray, hidden: int, pre: str) -> tuple[np.ndarray, np.ndarray]:
    """``(W, bias)`` of a projection whose input channels were split into dithered copies (rows after the ``hidden``
    ones, of the channels ``pre + "channel_idx"``), the copies folded back; unchanged without a split."""
    if w.shape[0] <= hidden:
        return w, b
    copies = w[hidden:]
    main = w[:hidden].copy()
    idx = g.arrays[pre + "channel_idx"].astype(np.int64)
    main[idx] += g.array(pre + "channel_spread") @ copies
    return main, b + g.array(pre + SPLIT_DITHER) @ copies


def ffn_input(g: Graph, layer: int, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """The feed-forward input projection ``(W (hidden, intermediate), bias)`` of one layer, outliers folded back."""
    w, b = g.dequantized(f"/bert/encoder/layer.{layer}/intermediate/dense/MatMul")
    pre = f"/layer.{layer}{BRANCH_TAG}"
    if not g.has(pre + "w_in"):
        return w, b
    w, b = unsplit(g, w, b, hidden, pre)
    bias_out = g.constant_input(f"{pre}bert_encoder_layer.{layer}_intermediate_dense_Add")
    return np.concatenate([w, g.array(pre + "w_in")], axis=1), np.concatenate([b, bias_out])


def ffn_output(g: Graph, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """The feed-forward output projection ``(W (intermediate, hidden), bias)``, the fp32 branch's rows last."""
    w, b = g.dequantized(f"/bert/encoder/layer.{layer}/output/dense/MatMul")
    pre = f"/layer.{layer}{BRANCH_TAG}"
    if g.has(pre + "w_out"):
        w = np.concatenate([w, g.array(pre + "w_out")], axis=0)
    return w, b


def state_dict(g: Graph, layers: int, hidden: int) -> dict[str, np.ndarray]:
    """The ``BertForSequenceClassification`` weights (HF orientation: Linear weights are (out, in))."""
    sd: dict[str, np.ndarray] = {}
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        sd[f"bert.embeddings.{name}.weight"], = g.inputs(f"/bert/embeddings/{name}/Gather", 0)
    for module, node in (("bert.embeddings.LayerNorm", "/bert/embeddings/LayerNorm/LayerNormalization"),
                         ("bert.pooler.dense", "/bert/pooler/dense/Gemm"), ("classifier", "/classifier/Gemm")):
        # LayerNormalization(x, scale, bias); the Gemms use transB=1, so their weights are already (out, in)
        sd[module + ".weight"], sd[module + ".bias"] = g.inputs(node, 1, 2)
    for i in range(layers):
        pre = f"bert.encoder.layer.{i}."
        for part, module in PARTS.items():
            node = f"/bert/encoder/layer.{i}/attention/self/{part}/MatMul" if "/" not in part \
                else f"/bert/encoder/layer.{i}/{part}/MatMul"
            w, b = unsplit(g, *g.dequantized(node), hidden, f"/layer.{i}{BRANCH_TAG}{ATTENTION_TAG}")
            sd[pre + module + ".weight"], sd[pre + module + ".bias"] = w.T, b
        w, b = ffn_input(g, i, hidden)
        sd[pre + "intermediate.dense.weight"], sd[pre + "intermediate.dense.bias"] = w.T, b
        w, b = ffn_output(g, i)
        sd[pre + "output.dense.weight"], sd[pre + "output.dense.bias"] = w.T, b
        for ln in ("attention/output/LayerNorm", "output/LayerNorm"):
            module = pre + ln.replace("/", ".")
            sd[module + ".weight"], sd[module + ".bias"] = g.inputs(
                f"/bert/encoder/layer.{i}/{ln}/LayerNormalization", 1, 2)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def recover(model_dir: Path, out: Path, quality: Path | None = None) -> dict[str, Any]:
    """Write the recovered checkpoint of ``model_dir`` (a shipped default model) to ``out``, with the training record
    of its ``quality`` file as ``training_log.json`` when given; returns its config."""
    import torch
    from safetensors.torch import save_file

    manifest = read_manifest(model_dir)
    if manifest.model_type != "bert" or "int8" not in manifest.precisions:
        raise ValueError(f"{model_dir} holds a {manifest.model_type} model with {sorted(manifest.precisions)}; "
                         "recover reads the INT8 graph of a BERT default model")
    g = Graph(model_dir / manifest.precisions["int8"].file)
    g.dequantized("/bert/encoder/layer.0/attention/self/query/MatMul")  # refuses other INT8 recipes first
    vocab, hidden = g.inputs("/bert/embeddings/word_embeddings/Gather", 0)[0].shape
    layers = sum(1 for n in g.nodes if n.endswith("/attention/self/query/MatMul"))
    heads = int(g.arrays["/bert/encoder/layer.0/attention/self/Constant_3_output_0"].reshape(-1)[0])
    sd = state_dict(g, layers, hidden)
    id2label = {int(k): v for k, v in manifest.id2label.items()}
    config = {
        "architectures": ["BertForSequenceClassification"], "model_type": "bert", "vocab_size": int(vocab),
        "hidden_size": int(hidden), "num_hidden_layers": layers, "num_attention_heads": heads,
        "intermediate_size": int(sd["bert.encoder.layer.0.intermediate.dense.weight"].shape[0]),
        "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": int(sd["bert.embeddings.position_embeddings.weight"].shape[0]),
        "type_vocab_size": int(sd["bert.embeddings.token_type_embeddings.weight"].shape[0]),
        "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": manifest.pad_token_id,
        "position_embedding_type": "absolute", "id2label": id2label,
        "label2id": {v: k for k, v in id2label.items()},
        "fastnli_recovered_from": {"artifact_hash": manifest.artifact_hash,
                                   "graph_sha256": manifest.precisions["int8"].sha256},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: torch.tensor(v) for k, v in sd.items()}, str(out / "model.safetensors"))
    for name in manifest.tokenizer_files:
        shutil.copy2(model_dir / name, out / name)
    if quality is not None:  # the shipped model's training record: a stage trained from here keeps its lineage
        record = json.loads(quality.read_text())
        (out / TRAINING_LOG).write_text(json.dumps(record["training"], indent=2) + "\n")
    return config


def check(model_dir: Path, out: Path, pairs: list[tuple[str, str]]) -> dict[str, float]:
    """Argmax agreement and largest probability difference of the recovered checkpoint (PyTorch fp32) against the
    shipped INT8 graph (the engine) on ``pairs``."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from fastnli.engine import NLIEngine

    engine = NLIEngine(model_dir, device="cpu", precision="int8")
    shipped = engine.predict(pairs)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    got = []
    with torch.no_grad():
        for i in range(0, len(pairs), 64):
            chunk = pairs[i:i + 64]
            enc = tok([p for p, _ in chunk], [h for _, h in chunk], padding=True, truncation=True,
                      max_length=engine.max_length, return_tensors="pt")
            got.append(torch.softmax(model(**enc).logits, -1).numpy())
    probs = np.concatenate(got)[:, engine.manifest.columns]
    return {"pairs": len(pairs), "argmax_agreement": float((probs.argmax(1) == shipped.argmax(1)).mean()),
            "max_abs_dprob": float(np.abs(probs - shipped).max())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--model", type=Path, default=REPO / "fastnli" / "models" / "default")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quality", type=Path, default=Path(__file__).resolve().with_name("quality.json"),
                    help="the model's quality records, whose training record goes with the weights (default: "
                    "%(default)s)")
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "nli-data")
    ap.add_argument("--check", type=int, default=2000, help="snli/dev pairs to compare with the graph (0: none)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logger.setLevel(logging.INFO)
    config = recover(args.model, args.out, args.quality)
    logger.info("recovered %d layers x %d hidden into %s", config["num_hidden_layers"], config["hidden_size"],
                args.out)
    if args.check:
        rows = [json.loads(line) for line in (args.data / "dev.jsonl").open()]
        pairs = [(r["premise"], r["hypothesis"]) for r in rows if r["source"] == "snli/dev"][: args.check]
        logger.info("recovered fp32 vs shipped INT8: %s", check(args.model, args.out, pairs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
