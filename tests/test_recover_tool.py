"""tools/default_model/recover.py: a fine-tunable PyTorch checkpoint from a static INT8 graph (the shipped recipe),
its outlier rewrites undone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import torch_probs

from fastnli.engine import read_manifest
from fastnli.exporter import export
from fastnli.exporter.probe import probe_pairs
from tools.default_model import recover
from tools.default_model.ship import RECIPES


@pytest.fixture(scope="module")
def shipped_like(ckpt_bert: Path, workdir: Path) -> Path:
    """The tiny BERT exported with the shipped INT8 recipe (static, outliers split, fp16 embeddings), INT8 only."""
    out = workdir / "art_bert_shipped_recipe"
    if not (out / "manifest.json").is_file():
        export(ckpt_bert, out, precisions=("fp32", "int8"), int8_recipe=RECIPES["static-fp16-embeddings"])
    return out


def _weights(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path / "model.safetensors"))


def test_recovered_weights_are_the_checkpoints_up_to_int8_rounding(shipped_like: Path, ckpt_bert: Path,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "recovered"
    config = recover.recover(shipped_like, out)
    original, got = _weights(ckpt_bert), _weights(out)
    assert set(got) <= set(original) and {k for k in original if "position_ids" not in k} <= set(got)
    recipe = read_manifest(shipped_like).precisions["int8"].recipe
    layers = recipe["outliers"]["layers"]
    assert len(layers) == config["num_hidden_layers"] and recipe["outliers"]["channel_split"]
    for name, want in original.items():
        if "position_ids" in name:
            continue
        have = got[name]
        layer = name.split(".")[3] if name.startswith("bert.encoder.layer.") else None
        if layer is not None and ("intermediate.dense" in name or "output.dense.weight" in name
                                  and "attention" not in name):
            moved = layers[layer]["neurons"]  # the fp32 branch's neurons come back last
            order = [j for j in range(want.shape[0 if "intermediate" in name else 1]) if j not in moved] + moved
            want = want[order] if "intermediate" in name else want[:, order]
        assert have.shape == want.shape, name
        if name.endswith(".weight") and have.ndim == 2 and "embeddings" not in name and "LayerNorm" not in name \
                and not name.startswith(("bert.pooler", "classifier")):
            # int8 per output channel: each weight within a few rounding steps of its channel's scale
            step = np.abs(want).max(axis=1, keepdims=True) / 127
            assert np.all(np.abs(have - want) <= 2.5 * step + 1e-7), name
            assert np.abs(have - want).max() > 0, name  # really dequantized, not copied
        elif "word_embeddings" in name:  # fp16 in the graph when the recipe stores it so: within fp16 rounding
            assert np.allclose(have, want, atol=1e-7, rtol=2 ** -11), name
        else:
            assert np.allclose(have, want, atol=1e-5, rtol=1e-5), name  # stored as they were (the dither folded)


def test_recovered_checkpoint_scores_as_the_checkpoint_and_keeps_the_training_record(
        shipped_like: Path, ckpt_bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "recovered"
    quality = tmp_path / "quality.json"
    quality.write_text(json.dumps({"training": {"command": ["train.py"], "base_model": {"path": "x"}}}))
    recover.recover(shipped_like, out, quality)
    assert json.loads((out / "training_log.json").read_text())["command"] == ["train.py"]
    assert json.loads((out / "config.json").read_text())["fastnli_recovered_from"]["artifact_hash"] == \
        read_manifest(shipped_like).artifact_hash
    pairs = probe_pairs()[:64]
    want, have = torch_probs(ckpt_bert, pairs), torch_probs(out, pairs)
    assert np.abs(have - want).max() < 0.02
    assert (have.argmax(1) == want.argmax(1)).mean() >= 0.95


def test_recover_refuses_a_graph_without_the_static_recipe(art_bert: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("the graph has no node /bert/encoder/layer.0/attention/self/query/"
                                                   "MatMul: it is not a BERT export of fastnli's static INT8 recipe")):
        recover.recover(art_bert, tmp_path / "out")
