"""Engine core: export parity with PyTorch, precisions, label orders, CPU fallback, atomic export, bad input."""

from __future__ import annotations

import importlib
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RAGGED_PAIRS, torch_probs

from fastnli.engine import NLIEngine, SessionConfig, read_manifest
from fastnli.engine.labels import canonical_columns
from fastnli.engine.session import create_session, session_model
from fastnli.exporter import export
from fastnli.exporter.checkpoint import build_checkpoint
from fastnli.exporter.probe import probe_pairs

export_module = importlib.import_module("fastnli.exporter.export")


@pytest.mark.parametrize("art, ck", [("art_v1", "ckpt_v1"), ("art_v2", "ckpt_v2"), ("art_bert", "ckpt_bert")])
def test_fp32_matches_pytorch_on_ragged_batches(art: str, ck: str, request: pytest.FixtureRequest) -> None:
    engine = NLIEngine.from_pretrained(request.getfixturevalue(art), device="cpu", precision="fp32")
    ref = torch_probs(request.getfixturevalue(ck), RAGGED_PAIRS)
    got = engine.predict(RAGGED_PAIRS)
    assert got.shape == (len(RAGGED_PAIRS), 3) and got.dtype == np.float32
    assert np.abs(got - ref).max() <= 1e-4
    assert engine.last_stats.batches >= 1 and engine.last_stats.padded_tokens > engine.last_stats.real_tokens


def test_pair_alone_equals_pair_in_padded_batch(art_v1: Path) -> None:
    engine = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")
    batched = engine.predict(RAGGED_PAIRS)
    for i, pair in enumerate(RAGGED_PAIRS):
        alone = engine.predict([pair])
        assert np.abs(alone[0] - batched[i]).max() <= 1e-5
    assert np.array_equal(engine.predict(RAGGED_PAIRS[1]), engine.predict([RAGGED_PAIRS[1]])[0])


def test_cpu_batches_split_off_short_pairs_and_keep_the_probabilities(art_v1: Path) -> None:
    long_pair = (" ".join(["The quick brown fox jumps over the lazy dog."] * 3), "A fox jumps.")
    pairs = [long_pair] + [(f"Short premise {i}.", "A hypothesis.") for i in range(6)]
    engine = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")
    assert engine.batch_policy.batch_overhead_tokens == 32  # the CPU policy's
    split = engine.predict(pairs)
    split_stats = engine.last_stats
    greedy = engine.with_policy(batch_overhead_tokens=0).predict(pairs)
    greedy_stats = engine.last_stats
    assert (split_stats.batches, greedy_stats.batches) == (2, 1)  # the long pair alone, then the short ones
    assert split_stats.padded_tokens < greedy_stats.padded_tokens and split_stats.real_tokens == greedy_stats.real_tokens
    assert np.abs(split - greedy).max() <= 1e-5


def test_manifest_records_sources_versions_and_validation(art_v1: Path, ckpt_v1: Path) -> None:
    m = read_manifest(art_v1)
    assert m.source == str(ckpt_v1.resolve())
    assert len(m.source_hash) == 64 and len(m.artifact_hash) == 64
    assert m.columns == [0, 1, 2] and m.max_length == 512 and m.opset >= 14
    assert m.inputs == ["input_ids", "attention_mask"]  # v1: no token types
    assert set(m.precisions) == {"fp32", "fp16", "int8"}
    for key in ("transformers", "optimum-onnx", "onnxruntime", "torch"):
        assert m.versions[key] != "not installed"
    assert "tokenizer.json" in m.tokenizer_files
    fp32 = m.precisions["fp32"].validation
    assert fp32 is not None and fp32.n_pairs == len(probe_pairs()) and fp32.max_abs_dprob <= 1e-4
    assert fp32.argmax_agreement == 1.0


def test_fp16_graph_loads_and_stays_close(art_v1: Path, art_v2: Path) -> None:
    for art in (art_v1, art_v2):
        fp32 = NLIEngine.from_pretrained(art, device="cpu", precision="fp32").predict(RAGGED_PAIRS)
        eng16 = NLIEngine.from_pretrained(art, device="cpu", precision="fp16")
        assert eng16.precision == "fp16"
        fp16 = eng16.predict(RAGGED_PAIRS)
        assert np.isfinite(fp16).all()
        assert np.abs(fp16 - fp32).max() <= 2e-2
        assert read_manifest(art).precisions["fp16"].validation.max_abs_dprob <= 2e-2  # type: ignore[union-attr]


def test_fp16_clamps_mask_constants(art_v1: Path) -> None:
    recipe = read_manifest(art_v1).precisions["fp16"].recipe
    assert recipe["keep_io_types"] is True and recipe["clamped_constants"] >= 1  # finfo(float32).min masks


INT8_MIN_PROBE_AGREEMENT = 0.9  # stated share on the seeded tiny models (random weights: near-uniform probabilities)


def test_int8_agrees_with_fp32_on_argmax(art_v1: Path) -> None:
    val = read_manifest(art_v1).precisions["int8"].validation
    assert val is not None and val.argmax_agreement >= INT8_MIN_PROBE_AGREEMENT
    pairs = probe_pairs()
    fp32 = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32").predict(pairs)
    int8 = NLIEngine.from_pretrained(art_v1, device="cpu", precision="int8").predict(pairs)
    assert np.mean(fp32.argmax(1) == int8.argmax(1)) >= INT8_MIN_PROBE_AGREEMENT


def _export_int8_recipe(ckpt: Path, out: Path, name: str,
                        update: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str], int]:
    """Export ``ckpt`` (fp32 + INT8 with the named recipe, ``update`` applied) to ``out``; returns the INT8 recipe as
    recorded in the manifest, the INT8 graph's op types and the checkpoint's layer count."""
    import onnx

    from fastnli.exporter.precision import INT8_RECIPES

    m = export(ckpt, out, precisions=("fp32", "int8"), int8_recipe={**INT8_RECIPES[name], **(update or {})})
    ops = [n.op_type for n in onnx.load(str(out / "model_int8.onnx")).graph.node]
    layers = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]
    return m.precisions["int8"].recipe, ops, layers


def _assert_int8_agrees_on_probe_set(out: Path) -> None:
    pairs = probe_pairs()
    fp32 = NLIEngine(out, device="cpu", precision="fp32").predict(pairs)
    int8 = NLIEngine(out, device="cpu", precision="int8").predict(pairs)
    assert np.mean(fp32.argmax(1) == int8.argmax(1)) >= INT8_MIN_PROBE_AGREEMENT


def _assert_batch_invariant_int8(out: Path) -> None:
    """Other batch-mates and padded lengths change only float rounding (dynamic INT8 moves these by ~5e-3); with
    this CPU's kernels and with the exact ones of CPUs without VNNI (uint8 weights), wherever this runs."""
    pairs = _many_pairs(120)
    fp32 = NLIEngine(out, device="cpu", precision="fp32").predict(pairs)
    for exact in (None, True):
        engine = NLIEngine(out, device="cpu", precision="int8",
                           session_config=SessionConfig(streams=1, exact_int8=exact))
        together = engine.predict(pairs)
        np.testing.assert_allclose(engine.predict(pairs[::-1])[::-1], together, rtol=0, atol=1e-6)
        alone = np.concatenate([engine.predict(pairs[i:i + 1]) for i in range(0, 120, 7)])
        np.testing.assert_allclose(together[::7], alone, rtol=0, atol=1e-6)
        assert np.mean(fp32.argmax(1) == together.argmax(1)) >= INT8_MIN_PROBE_AGREEMENT


@pytest.mark.parametrize("ck", ["ckpt_v1", "ckpt_v2"])
def test_ffn_blockwise_int8_recipe(ck: str, request: pytest.FixtureRequest, workdir: Path) -> None:
    """The FFN MatMuls become 8-bit blockwise MatMulNBits, the rest dynamic INT8; closer to fp32 than dynamic."""
    out = workdir / f"art_{ck}_blockwise"
    recipe, ops, layers = _export_int8_recipe(request.getfixturevalue(ck), out, "ffn-blockwise")
    assert recipe["blockwise"]["converted"] == 2 * layers and recipe["blockwise"]["block_size"] == 128
    assert ops.count("MatMulNBits") == 2 * layers and "DynamicQuantizeLinear" in ops  # attention stays dynamic
    assert not list(out.glob("*.blockwise"))  # the staged graph is gone
    _assert_int8_agrees_on_probe_set(out)


@pytest.mark.parametrize("ck", ["ckpt_v1", "ckpt_v2"])
def test_blockwise_int8_recipe_is_batch_invariant(ck: str, request: pytest.FixtureRequest, workdir: Path) -> None:
    """Every weight MatMul blockwise, nothing per tensor: a pair's probabilities do not depend on its batch."""
    out = workdir / f"art_{ck}_allblock"
    recipe, ops, layers = _export_int8_recipe(request.getfixturevalue(ck), out, "blockwise")
    assert ops.count("MatMulNBits") == recipe["blockwise"]["converted"] >= 4 * layers
    assert "DynamicQuantizeLinear" not in ops and "MatMulInteger" not in ops
    _assert_batch_invariant_int8(out)


@pytest.mark.parametrize("art, split", [("art_v1", False), ("art_v2", False), ("art_v1", True), ("art_v2", True),
                                        ("art_bert", True)])
def test_outlier_split_keeps_the_fp32_function(art: str, split: bool, request: pytest.FixtureRequest) -> None:
    """The side branches (or the channel copies) only regroup the sums of the FFN and of the attention's input
    projections: the rewritten fp32 graph computes the same logits."""
    import onnx
    import onnxruntime as ort

    from fastnli.engine.tokenize import PairTokenizer
    from fastnli.exporter.export import calibration_feeds
    from fastnli.exporter.outliers import ATTENTION_IN, BRANCH_TAG, SPLIT_CONCAT, split_outliers

    path = request.getfixturevalue(art)
    m = read_manifest(path)
    feeds = calibration_feeds(PairTokenizer(path / "tokenizer.json"), probe_pairs(), m.inputs, m.pad_token_id)
    model = onnx.load(str(path / "model_fp32.onnx"))
    layers = sum(1 for n in model.graph.node if n.op_type == "MatMul" and "intermediate/dense" in n.name)
    projections = sum(1 for n in model.graph.node if n.op_type == "MatMul" and ATTENTION_IN.search(n.name))
    record = split_outliers(model, {"ffn_neurons": 3, "input_channels": 2, "channel_split": split,
                                    "attention_channels": 2}, feeds)
    onnx.checker.check_model(model)
    assert len(record["layers"]) == layers >= 2
    assert all(len(e["neurons"]) == 3 and len(e["channels"]) == 2 == len(e["attention_channels"])
               for e in record["layers"].values())
    assert all(("channel_copies" in e) == ("attention_channel_copies" in e) == split for e in record["layers"].values())
    widened = {n.input[0] for n in model.graph.node if ATTENTION_IN.search(n.name)}
    assert widened == {f"/layer.{i}{BRANCH_TAG}attention/{SPLIT_CONCAT if split else 'Mul_mask'}"
                       for i in range(layers)}
    if split:  # more channels than the hidden size: nothing is left to size the copies by
        with pytest.raises(ValueError, match=re.escape(f"outlier split: input_channels={10_000} leaves layer 0 no "
                                                       "other channel with a range to fit the copies into; give "
                                                       "fewer input_channels")):
            split_outliers(onnx.load(str(path / "model_fp32.onnx")),
                           {"ffn_neurons": 0, "input_channels": 10_000, "channel_split": True}, feeds)
    # per layer: the neurons' two projections, and the channels' spread (split) or one branch per reader
    branches = 3 * layers + (layers if split else projections)
    assert sum(BRANCH_TAG in n.name and n.op_type == "MatMul" for n in model.graph.node) == branches
    before = ort.InferenceSession(str(path / "model_fp32.onnx"), providers=["CPUExecutionProvider"])
    after = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        np.testing.assert_allclose(after.run(None, feed)[0], before.run(None, feed)[0], rtol=0, atol=2e-5)


def test_outlier_split_recipe_keeps_its_branches_fp32(ckpt_v2: Path, workdir: Path) -> None:
    import onnx

    from fastnli.exporter.outliers import BRANCH_TAG

    out = workdir / "art_v2_outliers"
    recipe, _, layers = _export_int8_recipe(ckpt_v2, out, "outlier-split")
    assert recipe["calibration_pairs"] == len(probe_pairs()) and len(recipe["outliers"]["layers"]) == layers
    nodes = onnx.load(str(out / "model_int8.onnx")).graph.node
    branch = [n for n in nodes if BRANCH_TAG in n.name and "MatMul" in n.op_type]
    assert len(branch) == 3 * layers and {n.op_type for n in branch} == {"MatMul"}  # not quantized
    assert sum(n.op_type in ("DynamicQuantizeMatMul", "MatMulInteger") for n in nodes) >= 4 * layers
    assert not list(out.glob("*.split"))  # the staged graph is gone
    _assert_int8_agrees_on_probe_set(out)


@pytest.mark.parametrize("ck, ffn_split_only", [("ckpt_v1", False), ("ckpt_v2", False), ("ckpt_bert", False),
                                                ("ckpt_bert", True)])
def test_static_int8_recipe_is_batch_invariant(ck: str, ffn_split_only: bool, request: pytest.FixtureRequest,
                                               workdir: Path) -> None:
    """Activation ranges fixed at export: a pair scores the same whatever its batch-mates and padded length."""
    from fastnli.exporter.precision import STATIC_OUTLIERS

    out = workdir / f"art_{ck}_static{'_ffn_split' if ffn_split_only else ''}"
    update = {"outliers": {**STATIC_OUTLIERS, "attention_channels": 0}} if ffn_split_only else None
    recipe, ops, layers = _export_int8_recipe(request.getfixturevalue(ck), out, "static", update)
    static = recipe["static"]
    assert static["quantized_matmuls"] >= 4 * layers and static["percentile"] == 99.999
    assert "DynamicQuantizeLinear" not in ops and "QuantizeLinear" in ops  # no range measured at run time
    # every quantized MatMul runs as one MatMulIntegerToFloat; no activation is dequantized (fp32 readers of a
    # quantized tensor read it unrounded): only weights shared with an fp32 reader (DeBERTa-v2's position
    # projections) still are; the channel splits got their dither
    import onnx

    assert ops.count("MatMulIntegerToFloat") == static["fused_matmuls"] == static["quantized_matmuls"]
    graph = onnx.load(str(out / "model_int8.onnx")).graph
    weights = {i.name for i in graph.initializer}
    assert all(n.input[0] in weights for n in graph.node if n.op_type == "DequantizeLinear")
    if ffn_split_only:  # the LayerNorm outputs the attention reads are quantized; the residual stream reads them too
        assert static["float_readers_unrounded"] >= layers - 1 and static["dithered_splits"] == layers
    else:  # both splits: every quantized input is a widened copy, read by its projections alone
        assert static["float_readers_unrounded"] == 0 and static["dithered_splits"] == 2 * layers
    assert not list(out.glob("*.static-src")) and not list(out.glob("*.ranges.json"))  # staged files are gone
    _assert_batch_invariant_int8(out)


def test_static_split_copies_round_to_the_channel(ckpt_v1: Path, workdir: Path) -> None:
    """The dithered copies of a split channel, each rounded to the int8 scale of the FFN's (or the attention's)
    input, sum to the channel rounded once (so the split loses nothing to rounding; plain copies would add up m
    rounding errors)."""
    import onnx
    from onnx import numpy_helper

    from fastnli.exporter.outliers import BRANCH_TAG, SPLIT_CONCAT, SPLIT_DITHER, SPLITS

    out = workdir / "art_ckpt_v1_static"
    if not (out / "manifest.json").is_file():  # else written by test_static_int8_recipe_is_batch_invariant
        _export_int8_recipe(ckpt_v1, out, "static")
    record = read_manifest(out).precisions["int8"].recipe["outliers"]
    model = onnx.load(str(out / "model_int8.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    scale_of = {n.input[0]: inits[n.input[1]] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    x = np.random.default_rng(0).uniform(-40.0, 40.0, 20_000)
    checked = 0
    for i, entry in record["layers"].items():
        for sub, prefix in SPLITS:
            tag = f"/layer.{i}{BRANCH_TAG}{sub}"
            s, dither = float(scale_of[tag + SPLIT_CONCAT]), inits[tag + SPLIT_DITHER]
            start = 0
            for m in entry[prefix + "channel_copies"]:
                d = dither[start:start + m].astype(np.float64)
                start += m
                assert abs(d.sum()) <= 1e-6 * s and np.all(np.abs(d) < s / 2)
                copies = np.rint((x[:, None] / m + d[None, :]) / s).sum(1)
                assert np.mean(copies == np.rint(x / s)) >= 0.999  # ties and float rounding aside
                checked += 1
            assert start == dither.size
    assert checked >= 4


def test_static_recipe_keeps_the_named_matmuls_fp32(art_bert: Path, tmp_path: Path) -> None:
    """``fp32_matmuls``: the named projections stay fp32 MatMuls, every other one is quantized, the kept FFN
    projections keep their outliers (no split of that layer), and the graph still agrees with fp32."""
    import onnx
    import onnxruntime as ort

    from fastnli.engine.tokenize import PairTokenizer
    from fastnli.exporter.export import calibration_feeds
    from fastnli.exporter.precision import INT8_RECIPES, to_int8

    m = read_manifest(art_bert)
    feeds = calibration_feeds(PairTokenizer(art_bert / "tokenizer.json"), probe_pairs(), m.inputs, m.pad_token_id)
    src, dst = art_bert / "model_fp32.onnx", tmp_path / "int8.onnx"
    recipe = {**INT8_RECIPES["static"], "fp32_matmuls": [r"layer\.0/", r"attention/output/dense"]}
    got = to_int8(src, dst, recipe, feeds)
    names = [n.name for n in onnx.load(str(src)).graph.node if n.op_type == "MatMul"]
    layer0 = [n for n in names if "/layer.0/" in n]
    kept = set(layer0) | {n for n in names if "attention/output/dense" in n}
    assert got["fp32_matmuls_kept"] == len(kept) and len(layer0) >= 6
    assert "0" not in {i for i, e in got["outliers"]["layers"].items() if e["channels"] or e["neurons"]}
    nodes = {n.name: n.op_type for n in onnx.load(str(dst)).graph.node}
    assert all(nodes[n] == "MatMul" for n in kept)
    assert got["static"]["quantized_matmuls"] == got["static"]["fused_matmuls"] > 0
    config = SessionConfig()  # the INT8 graph runs as the engine runs it on this CPU (exact kernels without VNNI)
    sess = create_session(session_model(dst, config, int8=True), "cpu", config)[0]
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    same = [np.mean(sess.run(None, f)[0].argmax(-1) == ref.run(None, f)[0].argmax(-1)) for f in feeds]
    assert np.mean(same) >= INT8_MIN_PROBE_AGREEMENT
    with pytest.raises(ValueError, match=re.escape("INT8 recipe: fp32_matmuls pattern 'nowhere' matches no MatMul "
                                                   "of the graph")):
        to_int8(src, dst, {**INT8_RECIPES["dynamic"], "fp32_matmuls": ["nowhere"]})
    with pytest.raises(ValueError, match=re.escape("an INT8 recipe with a 'blockwise' section chooses its MatMuls by "
                                                   "blockwise 'match'; drop 'fp32_matmuls'")):
        to_int8(src, dst, {**INT8_RECIPES["blockwise"], "fp32_matmuls": ["layer"]})


def test_outlier_split_recipe_errors(art_v1: Path, tmp_path: Path) -> None:
    from fastnli.exporter.precision import INT8_RECIPES, to_int8

    src, dst = art_v1 / "model_fp32.onnx", tmp_path / "x.onnx"
    for name in ("outlier-split", "static"):
        with pytest.raises(ValueError, match=re.escape("the INT8 recipe calibrates ('outliers' section or 'method': "
                                                       "'static'): pass calibration=[feed dicts]")):
            to_int8(src, dst, INT8_RECIPES[name])
    dynamic_split = {**INT8_RECIPES["outlier-split"], "outliers": {**INT8_RECIPES["static"]["outliers"]}}
    with pytest.raises(ValueError, match=re.escape("the INT8 recipe splits outlier channels ('outliers': "
                                                   "{'channel_split': True}), which needs fixed activation ranges: "
                                                   "add 'method': 'static' or drop 'channel_split'")):
        to_int8(src, dst, dynamic_split, [{}])
    both = {**INT8_RECIPES["outlier-split"], "blockwise": INT8_RECIPES["blockwise"]["blockwise"]}
    with pytest.raises(ValueError, match=re.escape("an INT8 recipe takes a 'blockwise' section or calibrated ranges "
                                                   "('outliers', 'method': 'static'), not both")):
        to_int8(src, dst, both, [{}])


def test_int8_recipe_that_quantizes_nothing_is_refused(art_v1: Path, tmp_path: Path) -> None:
    from fastnli.exporter.precision import INT8_RECIPE, to_int8

    with pytest.raises(ValueError, match="an INT8 recipe with no op_types quantizes nothing; give op_types or a "
                                         "blockwise section"):
        to_int8(art_v1 / "model_fp32.onnx", tmp_path / "x.onnx", {**INT8_RECIPE, "op_types": []})


def test_blockwise_recipe_that_matches_nothing_is_refused(art_v1: Path, tmp_path: Path) -> None:
    from fastnli.exporter.precision import blockwise_matmuls

    with pytest.raises(ValueError, match=re.escape("blockwise INT8: no MatMul of")):
        blockwise_matmuls(art_v1 / "model_fp32.onnx", tmp_path / "x.onnx",
                          {"bits": 8, "block_size": 32, "accuracy_level": 4, "match": ["/no_such_layer/"]})


@pytest.mark.parametrize("order", ["cne", "cen", "enc"])
def test_label_orders_map_to_canonical(order: str, workdir: Path) -> None:
    ck = build_checkpoint(workdir / f"ck_order_{order}", arch="deberta", size="tiny", seed=0, label_order=order)
    art = workdir / f"art_order_{order}"
    export(ck, art, precisions=("fp32",), validate=False)
    got = NLIEngine.from_pretrained(art, device="cpu").predict(RAGGED_PAIRS[:3])
    # Same weights, different id2label: the canonical column of a label is the logit column the config names.
    from transformers import AutoModelForSequenceClassification

    id2label = AutoModelForSequenceClassification.from_pretrained(ck).config.id2label
    names = [id2label[i].lower() for i in range(3)]
    ref = torch_probs(ck, RAGGED_PAIRS[:3])
    assert np.abs(got - ref).max() <= 1e-4
    raw = ref[:, np.argsort(canonical_columns(id2label))]  # back to the checkpoint's own column order
    for canon, label in enumerate(("contradiction", "neutral", "entailment")):
        assert np.allclose(got[:, canon], raw[:, names.index(label)], atol=1e-6)


def test_checkpoint_without_contradiction_label_is_refused(workdir: Path) -> None:
    ck = build_checkpoint(workdir / "ck_badlabels", arch="deberta", size="tiny")
    cfg = json.loads((ck / "config.json").read_text())
    cfg["id2label"] = {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}
    cfg["label2id"] = {v: int(k) for k, v in cfg["id2label"].items()}
    (ck / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=re.escape("the checkpoint's id2label has no 'contradiction' label")):
        export(ck, workdir / "art_badlabels")
    assert not (workdir / "art_badlabels").exists()


def test_cuda_requested_falls_back_to_cpu(art_v1: Path, caplog: pytest.LogCaptureFixture) -> None:
    cpu = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastnli"):
        gpu = NLIEngine.from_pretrained(art_v1, device="cuda", precision="fp32")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "falling back to CPU" in warnings[0].getMessage()
    assert gpu.device == "cpu" and gpu.providers == ["CPUExecutionProvider"] and gpu.fallbacks == 1
    assert np.array_equal(gpu.predict(RAGGED_PAIRS), cpu.predict(RAGGED_PAIRS))


def test_cuda_auto_precision_falls_back_to_cpu_graph(art_v1: Path) -> None:
    eng = NLIEngine.from_pretrained(art_v1, device="cuda")  # auto: fp16 on GPU; on CPU the CPU policy applies
    assert eng.device == "cpu" and eng.precision in ("int8", "fp32")


def test_run_time_device_error_switches_to_cpu(art_v1: Path, caplog: pytest.LogCaptureFixture) -> None:
    eng = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")
    expected = eng.predict(RAGGED_PAIRS)

    class FailingCudaSession:
        def run(self, *_args: object) -> None:
            raise RuntimeError("CUDA failure 700: an illegal memory access was encountered")

        def get_providers(self) -> list[str]:
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    eng._sessions, eng.device = [FailingCudaSession()], "cuda"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastnli"):
        got = eng.predict(RAGGED_PAIRS)
    assert eng.device == "cpu" and eng.fallbacks == 1
    assert [r for r in caplog.records if r.levelno == logging.WARNING][0].getMessage().startswith(
        "a run on CUDA failed (RuntimeError: CUDA failure 700")
    assert np.array_equal(got, expected)


def test_non_device_errors_are_not_swallowed(art_v1: Path) -> None:
    eng = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")

    class Broken:
        def run(self, *_args: object) -> None:
            raise RuntimeError("INVALID_ARGUMENT: bad shape")

    eng._sessions = [Broken()]
    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT"):
        eng.predict(RAGGED_PAIRS)


def test_interrupted_export_leaves_nothing_loadable(ckpt_v1: Path, workdir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    out = workdir / "art_interrupted"

    def crash(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt("simulated interruption during INT8 quantization")

    monkeypatch.setattr(export_module, "to_int8", crash)
    with pytest.raises(KeyboardInterrupt):
        export(ckpt_v1, out)
    assert not out.exists()
    assert not [p for p in workdir.iterdir() if p.name.startswith(".art_interrupted")]
    with pytest.raises(FileNotFoundError):
        NLIEngine(out)


def test_partial_directory_without_manifest_does_not_load(art_v1: Path, workdir: Path) -> None:
    partial = workdir / "partial"
    shutil.copytree(art_v1, partial)
    (partial / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape("is not a fastnli export artifact")):
        NLIEngine(partial)


def test_reexport_replaces_existing_artifact_atomically(ckpt_v1: Path, workdir: Path) -> None:
    out = workdir / "art_twice"
    export(ckpt_v1, out, precisions=("fp32",), validate=False)
    export(ckpt_v1, out, precisions=("fp32", "int8"), validate=False)
    assert set(read_manifest(out).precisions) == {"fp32", "int8"}
    (workdir / "not_artifact").mkdir(exist_ok=True)
    (workdir / "not_artifact" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="is not a fastnli artifact"):
        export(ckpt_v1, workdir / "not_artifact", precisions=("fp32",), validate=False)
    assert (workdir / "not_artifact" / "notes.txt").read_text() == "mine"


def test_checkpoint_is_exported_once_into_cache(ckpt_v1: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    monkeypatch.setenv("FASTNLI_CACHE", str(tmp_path / "cache"))
    eng = NLIEngine.from_pretrained(ckpt_v1, device="cpu", precision="fp32")
    assert eng.artifact_dir.parent == tmp_path / "cache" / "artifacts"

    def no_export(*_a: object, **_k: object) -> None:
        raise AssertionError("exported twice")

    monkeypatch.setattr(export_module, "export", no_export)
    again = NLIEngine.from_pretrained(ckpt_v1, device="cpu", precision="fp32")
    assert again.artifact_dir == eng.artifact_dir
    assert np.array_equal(again.predict(RAGGED_PAIRS), eng.predict(RAGGED_PAIRS))


@pytest.mark.parametrize(
    "pairs, exc, message",
    [
        (None, TypeError, "pairs must be a list of (premise, hypothesis) string pairs; got NoneType"),
        ("premise", TypeError, "pairs must be a list of (premise, hypothesis) string pairs; got str"),
        ([("a", "b"), ("a", 3)], TypeError, "pairs[1][1] (hypothesis) must be str; got int"),
        ([("a", "b"), (None, "b")], TypeError, "pairs[1][0] (premise) must be str; got NoneType"),
        ([("a", "b"), ("a", "b", "c")], ValueError,
         "pairs[1] must be a (premise, hypothesis) pair of two strings; got a tuple of length 3"),
        ([("a", "b"), []], ValueError,
         "pairs[1] must be a (premise, hypothesis) pair of two strings; got a list of length 0"),
        ([("a", "b"), "ab"], TypeError, "pairs[1] must be a (premise, hypothesis) pair of two strings; got str"),
    ],
)
def test_bad_input_names_the_index(art_v1: Path, pairs: object, exc: type[Exception], message: str) -> None:
    eng = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")
    with pytest.raises(exc, match=re.escape(message)):
        eng.predict(pairs)  # type: ignore[arg-type]


def test_empty_input_and_edge_texts(art_v1: Path, ckpt_v1: Path) -> None:
    eng = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")
    assert eng.predict([]).shape == (0, 3)
    long_text = "The committee met on Tuesday to review the budget and the costs. " * 80  # > 512 tokens
    pairs = [("", ""), ("", "x"), (long_text, "The committee met."), ("Short.", long_text), (long_text, long_text)]
    got = eng.predict(pairs)
    assert got.shape == (5, 3) and np.isfinite(got).all()
    assert np.allclose(got.sum(1), 1.0, atol=1e-5)
    assert np.abs(got - torch_probs(ckpt_v1, pairs)).max() <= 1e-4


def test_unknown_device_and_precision(art_v1: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("device='tpu' is not supported; use 'auto', 'cuda' or 'cpu'")):
        NLIEngine(art_v1, device="tpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("precision='bf16' is not supported")):
        NLIEngine(art_v1, precision="bf16")  # type: ignore[arg-type]


def test_cli_export_matches_python(ckpt_v2: Path, art_v2: Path, workdir: Path) -> None:
    from fastnli.cli import main

    out = workdir / "art_v2_cli"
    assert main(["export", str(ckpt_v2), "--out", str(out), "--precisions", "fp32,int8"]) == 0
    m_cli, m_py = read_manifest(out), read_manifest(art_v2)
    assert m_cli.source_hash == m_py.source_hash and m_cli.columns == m_py.columns == [0, 2, 1]
    assert "token_type_ids" in m_cli.inputs or m_cli.inputs == ["input_ids", "attention_mask"]
    a = NLIEngine.from_pretrained(out, device="cpu", precision="fp32").predict(RAGGED_PAIRS)
    b = NLIEngine.from_pretrained(art_v2, device="cpu", precision="fp32").predict(RAGGED_PAIRS)
    assert np.array_equal(a, b)


def _many_pairs(n: int = 300) -> list[tuple[str, str]]:
    base = [p for p in RAGGED_PAIRS if p[0] and p[1]]
    return [(f"{p} ({i})", h) for i in range(n // len(base) + 1) for p, h in base][:n]


def test_cpu_streams_rule(art_v1: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastnli.engine.session import MAX_AUTO_STREAMS, SessionConfig, cpu_streams

    graph = art_v1 / "model_fp32.onnx"  # a tiny graph: small, so auto gives one stream per core
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert cpu_streams(SessionConfig(streams=0), graph) == (MAX_AUTO_STREAMS, 2)
    assert cpu_streams(SessionConfig(streams=3, intra_op_threads=1), graph) == (3, 1)
    assert cpu_streams(SessionConfig(streams=1), graph) == (1, 0)  # one stream: ORT's own default threads
    # auto with a thread budget (a Ray actor's CPUs): the budget is divided, never exceeded
    assert cpu_streams(SessionConfig(streams=0, intra_op_threads=1), graph) == (1, 1)
    assert cpu_streams(SessionConfig(streams=0, intra_op_threads=2), graph) == (2, 1)
    assert cpu_streams(SessionConfig(streams=0, intra_op_threads=6), graph) == (MAX_AUTO_STREAMS, 1)
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert cpu_streams(SessionConfig(streams=0), graph) == (1, 0)  # one core: one session
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.setattr("fastnli.engine.session.SMALL_GRAPH_BYTES", 1)
    assert cpu_streams(SessionConfig(streams=0), graph) == (1, 0)  # a large graph stays one session
    assert cpu_streams(SessionConfig(streams=0, intra_op_threads=3), graph) == (1, 3)


def test_streams_give_the_same_probabilities_in_input_order(art_v1: Path) -> None:
    from fastnli.engine import BatchPolicy, SessionConfig

    pairs = _many_pairs()
    policy = BatchPolicy(max_batch_tokens=256, max_batch_size=8)  # many batches, so every stream gets work
    one = NLIEngine(art_v1, device="cpu", precision="fp32", batch_policy=policy,
                    session_config=SessionConfig(streams=1))
    three = NLIEngine(art_v1, device="cpu", precision="fp32", batch_policy=policy,
                      session_config=SessionConfig(streams=3, intra_op_threads=1))
    assert one.streams == 1 and three.streams == 3 and "streams=3" in repr(three)
    seen: list[int] = []
    got, stats = three.predict_with_stats(pairs, progress=lambda k, total: seen.append(k))
    np.testing.assert_allclose(got, one.predict(pairs), rtol=0, atol=1e-6)
    assert sum(seen) == stats.unique_pairs == len(set(pairs)) and stats.batches == len(seen) > 3


def test_an_error_in_one_stream_is_raised(art_v1: Path) -> None:
    from fastnli.engine import BatchPolicy, SessionConfig

    eng = NLIEngine(art_v1, device="cpu", precision="fp32", batch_policy=BatchPolicy(256, 8),
                    session_config=SessionConfig(streams=2, intra_op_threads=1))

    class Broken:
        def run(self, *_args: object) -> None:
            raise RuntimeError("INVALID_ARGUMENT: stream two is broken")

    eng._sessions[1] = Broken()
    with pytest.raises(RuntimeError, match="stream two is broken"):
        eng.predict(_many_pairs())


def test_warm_up_runs_the_largest_full_length_batch_on_every_stream(art_v1: Path) -> None:
    """``warm_up`` feeds each stream once with the largest batch the policy forms at the model maximum (the attention
    cap of the CPU policy makes that one row); the results of later calls do not change."""
    from fastnli.engine import BatchPolicy, SessionConfig

    pairs = _many_pairs()
    cold = NLIEngine(art_v1, device="cpu", precision="fp32", session_config=SessionConfig(streams=1))
    expected = cold.predict(pairs)
    for policy, rows in ((None, 1), (BatchPolicy(4 * 512, 8), 4), (BatchPolicy(4 * 512, 8, 1, 2 * 512 * 512), 2)):
        eng = NLIEngine(art_v1, device="cpu", precision="fp32", batch_policy=policy,
                        session_config=SessionConfig(streams=2, intra_op_threads=1))
        shapes: list[tuple[str, tuple[int, ...]]] = []
        for k, session in enumerate(eng._sessions):
            def spy(names: Any, feed: dict[str, np.ndarray], real: Any = session.run, k: int = k,
                    shapes: list[tuple[str, tuple[int, ...]]] = shapes) -> Any:
                shapes.extend((f"{k}:{name}", v.shape) for name, v in feed.items())
                return real(names, feed)

            session.run = spy
        assert eng.warm_up() > 0
        n = eng.max_length
        assert sorted(shapes) == sorted((f"{k}:{name}", (rows, n)) for k in range(2) for name in eng._input_names)
        np.testing.assert_allclose(eng.predict(pairs), expected, rtol=0, atol=1e-6)


def test_cpu_sessions_leave_out_the_slow_rewrites(art_v1: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU sessions are built without ``SkipLayerNormFusion`` (slower on CPU in ORT 1.31); CUDA keeps every rewrite;
    a config can give its own list."""
    import onnxruntime as ort

    from fastnli.engine.session import CPU_DISABLED_OPTIMIZERS, create_session

    seen: list[list[str]] = []
    real = ort.InferenceSession

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(list(kwargs.get("disabled_optimizers", [])))
        return real(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", spy)
    graph = art_v1 / "model_int8.onnx"
    assert create_session(graph, "cpu", SessionConfig())[1] == "cpu"
    create_session(graph, "cuda", SessionConfig())  # falls back to CPU here: a CUDA session's options either way
    create_session(graph, "cpu", SessionConfig(cpu_disabled_optimizers=()))
    assert seen == [list(CPU_DISABLED_OPTIMIZERS), [], []] and "SkipLayerNormFusion" in CPU_DISABLED_OPTIMIZERS
