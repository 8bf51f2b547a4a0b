"""The attention rewrites of fastnli.exporter.attention: DeBERTa v1's relative shift (the same values as HF's
gathers, no GatherElements left, only where the shift is exact) and DeBERTa v2's position window (the same values as
HF's for every configuration and length, no Tile left); both on by default where they apply."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fastnli.engine import NLIEngine, read_manifest
from fastnli.exporter import export
from fastnli.exporter.attention import (
    SHIFT_RECIPE,
    WINDOW_RECIPE,
    _band,
    applies,
    position_window_export,
    relative_shift_export,
    window_applies,
)

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


def test_v1_export_has_no_gathers_by_default_and_keeps_fp32_parity(ckpt_v1: Path, art_v1: Path,
                                                                    tmp_path: Path) -> None:
    m = read_manifest(art_v1)
    assert m.precisions["fp32"].recipe["attention"] == SHIFT_RECIPE
    assert "GatherElements" not in _op_types(art_v1 / "model_fp32.onnx")
    assert m.precisions["fp32"].validation.max_abs_dprob <= 1e-4  # type: ignore[union-attr]
    window = export(ckpt_v1, tmp_path / "window", precisions=("fp32", "int8"), relative_shift=False)
    assert window.precisions["fp32"].recipe["attention"] == WINDOW_RECIPE
    assert "GatherElements" in _op_types(tmp_path / "window" / "model_fp32.onnx")
    pairs = [("A man plays guitar on a stage in front of a crowd.", "A man makes music."), ("Paris", "Lyon"),
             ("x " * 200, "y")]
    for precision, tol in (("fp32", 1e-5), ("int8", 1e-5)):  # both fold the same projections of the whole table
        a = NLIEngine(tmp_path / "window", device="cpu", precision=precision).predict(pairs)  # type: ignore[arg-type]
        b = NLIEngine(art_v1, device="cpu", precision=precision).predict(pairs)  # type: ignore[arg-type]
        assert np.abs(a - b).max() <= tol, precision


def test_v2_export_without_the_window_is_hf_s_graph(ckpt_v2: Path, tmp_path: Path) -> None:
    m = export(ckpt_v2, tmp_path / "v2", precisions=("fp32",), validate=False, position_window=False)
    assert "attention" not in m.precisions["fp32"].recipe  # the shift (on by default) is v1's only
    assert {"GatherElements", "Tile"} <= _op_types(tmp_path / "v2" / "model_fp32.onnx")


def test_window_applies_to_deberta_position_terms_only() -> None:
    v2 = {"model_type": "deberta-v2", "relative_attention": True, "pos_att_type": ["p2c", "c2p"]}
    assert window_applies(v2)
    assert window_applies({**v2, "pos_att_type": "c2p"})
    assert window_applies({**v2, "model_type": "deberta"})
    assert not window_applies({**v2, "model_type": "bert"})
    assert not window_applies({**v2, "relative_attention": False})
    assert not window_applies({**v2, "pos_att_type": []})


V2_VARIANTS = {
    "shared key, 256 buckets (v3)": {},
    "own position projections": {"share_att_key": False},
    "c2p only": {"pos_att_type": ["c2p"]},
    "p2c only": {"pos_att_type": ["p2c"]},
    "16 buckets (log positions from 8 tokens)": {"position_buckets": 16, "max_relative_positions": 64},
    "no buckets, span 24 (clamped)": {"position_buckets": -1, "max_relative_positions": 24},
}


V1_VARIANTS = {
    "as deberta-large-mnli": {},
    "span 16 (clamped)": {"max_relative_positions": 16},
    "c2p only": {"pos_att_type": ["c2p"]},
}


def _window_gives_hf_outputs(ckpt: Path, overrides: dict[str, object]) -> None:
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.models.deberta import modeling_deberta
    from transformers.models.deberta_v2 import modeling_deberta_v2

    config = AutoConfig.from_pretrained(ckpt)
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    originals = (modeling_deberta.DisentangledSelfAttention.disentangled_att_bias,
                 modeling_deberta_v2.DisentangledSelfAttention.disentangled_attention_bias)
    for length in (1, 2, 9, 40, 300):
        ids = torch.randint(5, config.vocab_size, (3, length), generator=torch.Generator().manual_seed(length))
        mask = torch.ones_like(ids)
        mask[1, length // 2 + 1:] = 0
        with torch.no_grad():
            ref = model(input_ids=ids, attention_mask=mask).logits
            with position_window_export(config.to_dict()) as on:
                assert on
                windowed = model(input_ids=ids, attention_mask=mask).logits
        assert torch.allclose(ref, windowed, atol=1e-5, rtol=0), length
    assert (modeling_deberta.DisentangledSelfAttention.disentangled_att_bias,
            modeling_deberta_v2.DisentangledSelfAttention.disentangled_attention_bias) == originals


@pytest.mark.parametrize("variant", list(V2_VARIANTS))
def test_window_gives_hf_outputs_for_every_v2_configuration(ckpt_v2: Path, variant: str) -> None:
    _window_gives_hf_outputs(ckpt_v2, V2_VARIANTS[variant])


@pytest.mark.parametrize("variant", list(V1_VARIANTS))
def test_v1_window_gives_hf_outputs(ckpt_v1: Path, variant: str) -> None:
    _window_gives_hf_outputs(ckpt_v1, V1_VARIANTS[variant])


def _runtime_int8_products(graph: Path, tmp_path: Path) -> int:
    """The integer products left in the graph ORT runs (after its constant folding)."""
    import onnx
    import onnxruntime as ort

    from fastnli.engine.session import SessionConfig, session_model, session_options

    config = SessionConfig()
    opts = session_options(config, 1)
    opts.optimized_model_filepath = str(tmp_path / f"{graph.parent.name}-optimized.onnx")
    ort.InferenceSession(session_model(graph, config, int8=True), opts, providers=["CPUExecutionProvider"])
    nodes = onnx.load(opts.optimized_model_filepath, load_external_data=False).graph.node
    return sum(n.op_type in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger") for n in nodes)


def test_v1_default_leaves_no_position_projection_to_run(ckpt_v1: Path, art_v1: Path, tmp_path: Path) -> None:
    export(ckpt_v1, tmp_path / "hf", precisions=("fp32", "int8"), validate=False, relative_shift=False,
           position_window=False)
    layers = int(json.loads((ckpt_v1 / "config.json").read_text())["num_hidden_layers"])
    hf = _runtime_int8_products(tmp_path / "hf" / "model_int8.onnx", tmp_path)
    assert _runtime_int8_products(art_v1 / "model_int8.onnx", tmp_path) == hf - 2 * layers  # pos_proj, pos_q_proj
    pairs = [("A man plays guitar on a stage in front of a crowd.", "A man makes music."), ("x " * 300, "y")]
    a = NLIEngine(art_v1, device="cpu", precision="fp32").predict(pairs)
    b = NLIEngine(tmp_path / "hf", device="cpu", precision="fp32").predict(pairs)
    assert np.abs(a - b).max() <= 1e-5


def test_v2_export_has_the_window_by_default(ckpt_v2: Path, art_v2: Path, tmp_path: Path) -> None:
    m = read_manifest(art_v2)
    assert m.precisions["fp32"].recipe["attention"] == WINDOW_RECIPE
    assert m.precisions["fp32"].validation.max_abs_dprob <= 1e-4  # type: ignore[union-attr]
    assert "Tile" not in _op_types(art_v2 / "model_fp32.onnx")
    export(ckpt_v2, tmp_path / "hf", precisions=("fp32", "int8"), validate=False, position_window=False)
    pairs = [("A man plays guitar on a stage in front of a crowd.", "A man makes music."), ("Paris", "Lyon"),
             ("x " * 300, "y")]
    for precision in ("fp32", "int8"):  # ORT folds both graphs' position projections to the same constants
        a = NLIEngine(art_v2, device="cpu", precision=precision).predict(pairs)  # type: ignore[arg-type]
        b = NLIEngine(tmp_path / "hf", device="cpu", precision=precision).predict(pairs)  # type: ignore[arg-type]
        assert np.abs(a - b).max() <= 1e-5, precision
