"""DeBERTa v1's position terms exported as a relative shift (fastnli.exporter.attention): the same values as HF's
gathers, no GatherElements left in the graph, and only where the shift is exact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fastnli.engine import NLIEngine, read_manifest
from fastnli.exporter import export
from fastnli.exporter.attention import _band, applies, relative_shift_export

torch = pytest.importorskip("torch")


def _op_types(graph: Path) -> set[str]:
    import onnx

    return {n.op_type for n in onnx.load(str(graph), load_external_data=False).graph.node}


@pytest.mark.parametrize("length", [1, 2, 3, 8, 31])
def test_band_is_the_gather_of_hf_deberta(length: int) -> None:
    g = torch.Generator().manual_seed(length)
    att = torch.randn(2, 3, length, 2 * length, generator=g)
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    c2p_index = (i - j + length).clamp(0, 2 * length - 1).expand(2, 3, length, length)
    # c2p reads row i at column i - j + L; _band reads the reversed rows at L - 1 - i + j
    expected_c2p = torch.gather(att, -1, c2p_index)
    assert torch.equal(_band(torch.flip(att, dims=[-1]), length, length - 1), expected_c2p)
    p2c_index = (j - i + length).clamp(0, 2 * length - 1).expand(2, 3, length, length)
    assert torch.equal(_band(att, length, length), torch.gather(att, -1, p2c_index))


def test_applies_only_where_positions_never_clamp() -> None:
    v1 = {"model_type": "deberta", "relative_attention": True, "max_relative_positions": -1,
          "max_position_embeddings": 512, "pos_att_type": ["c2p", "p2c"]}
    assert applies(v1)
    assert applies({**v1, "pos_att_type": "c2p|p2c"})  # older configs
    assert not applies({**v1, "max_relative_positions": 128})  # clamps beyond 128 tokens
    assert not applies({**v1, "model_type": "deberta-v2"})  # log-bucketed positions
    assert not applies({**v1, "relative_attention": False})
    assert not applies({**v1, "pos_att_type": []})


def test_patch_gives_hf_outputs_and_is_undone(ckpt_v1: Path) -> None:
    from transformers import AutoModelForSequenceClassification
    from transformers.models.deberta import modeling_deberta

    config = json.loads((ckpt_v1 / "config.json").read_text())
    model = AutoModelForSequenceClassification.from_pretrained(ckpt_v1).eval()
    original = modeling_deberta.DisentangledSelfAttention.disentangled_att_bias
    ids = torch.randint(5, int(config["vocab_size"]), (3, 19), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        with relative_shift_export(config) as on:
            assert on
            shifted = model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(ref, shifted, atol=1e-6, rtol=0)
    assert modeling_deberta.DisentangledSelfAttention.disentangled_att_bias is original


def test_v1_export_has_no_gathers_and_keeps_fp32_parity(ckpt_v1: Path, art_v1: Path, tmp_path: Path) -> None:
    m = export(ckpt_v1, tmp_path / "shift", precisions=("fp32", "int8"), relative_shift=True)
    assert m.precisions["fp32"].recipe["attention"] == "relative shift (fastnli.exporter.attention)"
    assert "GatherElements" not in _op_types(tmp_path / "shift" / "model_fp32.onnx")
    assert m.precisions["fp32"].validation.max_abs_dprob <= 1e-4  # type: ignore[union-attr]
    assert "attention" not in read_manifest(art_v1).precisions["fp32"].recipe  # opt-in: the default keeps HF's
    assert "GatherElements" in _op_types(art_v1 / "model_fp32.onnx")
    pairs = [("A man plays guitar on a stage in front of a crowd.", "A man makes music."), ("Paris", "Lyon"),
             ("x " * 200, "y")]
    for precision, tol in (("fp32", 1e-5), ("int8", 1e-5)):  # INT8 quantizes the same weights the same way
        a = NLIEngine(tmp_path / "shift", device="cpu", precision=precision).predict(pairs)  # type: ignore[arg-type]
        b = NLIEngine(art_v1, device="cpu", precision=precision).predict(pairs)  # type: ignore[arg-type]
        assert np.abs(a - b).max() <= tol, precision


def test_v2_export_is_left_as_it_was(ckpt_v2: Path, tmp_path: Path) -> None:
    m = export(ckpt_v2, tmp_path / "v2", precisions=("fp32",), validate=False, relative_shift=True)
    assert "attention" not in m.precisions["fp32"].recipe
    assert "GatherElements" in _op_types(tmp_path / "v2" / "model_fp32.onnx")
