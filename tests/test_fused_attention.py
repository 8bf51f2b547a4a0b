"""The compiled RelativeScores operator (fastnli/kernels/ortops) and the fused attention scores of DeBERTa v1 INT8
graphs on CPU (fastnli.engine.fused_attention): the same bits as the plain graph, and the plain graph wherever the
operator is off or missing."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastnli.engine import NLIEngine
from fastnli.engine import fused_attention as fa
from fastnli.engine.manifest import read_manifest
from fastnli.engine.session import SessionConfig, SessionGraph, session_model
from fastnli.exporter.attention import SHIFT_RECIPE

PAIRS = [("A man is playing a guitar on stage.", "A man plays music."), ("Paris", "Lyon"),
         ("The Berlin Wall fell in 1989, and Germany was reunified the year after. " * 6, "The wall fell in 1991."),
         ("Two dogs run through a field.", "Animals are outside.")]


def _op_session(threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    fa.register(options)
    return ort.InferenceSession(fa.operator_model(threads), options, providers=["CPUExecutionProvider"])


def test_the_operator_library_is_built_and_loads_here() -> None:
    path = fa.library()
    assert path is not None and Path(path).name.startswith("_ortops")


def test_numpy_reference_reads_the_two_bands_as_the_exported_graph_defines_them() -> None:
    rng = np.random.default_rng(1)
    length = 5
    qk = rng.standard_normal((2, length, length)).astype(np.float32)
    c2p = rng.standard_normal((2, length, 2 * length)).astype(np.float32)
    p2c = rng.standard_normal((2, length, 2 * length)).astype(np.float32)
    want = np.empty_like(qk)
    for n in range(2):
        for i in range(length):
            for j in range(length):  # c2p[i, j] = q_i . pos_key[i - j + L]; p2c[i, j] = k_j . pos_query[i - j + L]
                want[n, i, j] = qk[n, i, j] + (c2p[n, i, length - 1 - i + j] + p2c[n, j, length - j + i])
    assert np.array_equal(fa.relative_scores(qk, c2p, p2c), want)


@given(lead=st.lists(st.integers(1, 3), min_size=0, max_size=2), length=st.integers(1, 70),
       threads=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_operator_equals_numpy_bit_for_bit_at_any_shape_and_thread_count(lead: list[int], length: int, threads: int,
                                                                         seed: int) -> None:
    rng = np.random.default_rng(seed)
    qk = rng.standard_normal((*lead, length, length)).astype(np.float32)
    c2p = rng.standard_normal((*lead, length, 2 * length)).astype(np.float32)
    p2c = rng.standard_normal((*lead, length, 2 * length)).astype(np.float32)
    got = _op_session(threads).run(None, {"qk": qk, "c2p": c2p, "p2c": p2c})[0]
    assert got.shape == qk.shape and np.array_equal(got, fa.relative_scores(qk, c2p, p2c))


def test_operator_names_the_shapes_it_needs() -> None:
    qk = np.zeros((1, 2, 4, 4), np.float32)
    wide = np.zeros((1, 2, 4, 8), np.float32)
    session = _op_session(1)
    with pytest.raises(Exception, match=r"RelativeScores: c2p and p2c must be \(\.\.\., L, 2L\) with qk's leading "
                                        r"dimensions"):
        session.run(None, {"qk": qk, "c2p": wide[..., :-1], "p2c": wide})
    with pytest.raises(Exception, match=r"RelativeScores: qk must be \(\.\.\., L, L\)"):
        session.run(None, {"qk": wide, "c2p": wide, "p2c": wide})


def _feeds(names: list[str], rows: int, length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(5, 100, (rows, length)).astype(np.int64),
             "attention_mask": np.ones((rows, length), np.int64), "token_type_ids": np.zeros((rows, length), np.int64)}
    feeds["attention_mask"][0, length // 2:] = 0  # padding, as in a length-packed batch
    return {k: v for k, v in feeds.items() if k in names}


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_fusing_a_shift_graph_replaces_every_layer_and_keeps_its_bits(art_v1: Path, precision: str) -> None:
    manifest = read_manifest(art_v1)
    assert manifest.precisions["fp32"].recipe["attention"] == SHIFT_RECIPE  # the INT8 graph is made from it
    path = str(art_v1 / manifest.precisions[precision].file)
    model = onnx.load(path)
    layers = sum(1 for n in model.graph.node if n.op_type == "Softmax")
    assert fa.fuse_relative_scores(model, threads=2) == layers > 0
    ops = [n.op_type for n in model.graph.node]
    assert ops.count(fa.OP_TYPE) == layers and "Transpose" in ops  # the heads' transposes stay
    assert not any(n.op_type == "Slice" and "attention/self/Slice_7" in n.name for n in model.graph.node)
    options = ort.SessionOptions()
    fa.register(options)
    fused = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    plain = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in plain.get_inputs()]
    for rows, length, seed in ((3, 7, 0), (2, 41, 1), (1, 130, 2)):
        feeds = _feeds(names, rows, length, seed)
        assert np.array_equal(fused.run(None, feeds)[0], plain.run(None, feeds)[0])


def test_a_graph_without_the_shift_is_left_as_it_is(art_v2: Path) -> None:
    manifest = read_manifest(art_v2)
    model = onnx.load(str(art_v2 / manifest.precisions["int8"].file))
    before = model.SerializeToString()
    assert fa.fuse_relative_scores(model) == 0 and model.SerializeToString() == before
    engine = NLIEngine(art_v2, device="cpu", precision="int8")
    assert engine.fused_layers == 0


def test_engine_runs_v1_int8_fused_with_the_plain_graphs_probabilities(art_v1: Path) -> None:
    fused = NLIEngine(art_v1, device="cpu", precision="int8")
    plain = NLIEngine(art_v1, device="cpu", precision="int8", session_config=SessionConfig(fused_attention=False))
    layers = sum(1 for n in onnx.load(str(art_v1 / "model_int8.onnx")).graph.node if n.op_type == "Softmax")
    assert (fused.fused_layers, plain.fused_layers) == (layers, 0)
    assert np.array_equal(fused.predict(PAIRS, "truncate"), plain.predict(PAIRS, "truncate"))
    assert NLIEngine(art_v1, device="cpu", precision="fp32").fused_layers == 0  # INT8 graphs only


def test_fused_attention_switch_and_a_missing_library_fall_back_to_the_plain_graph(
        art_v1: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    graph = art_v1 / "model_int8.onnx"
    config = SessionConfig(exact_int8=False)
    got = session_model(graph, config, int8=True, relative_shift=True, threads=2)
    assert isinstance(got, SessionGraph) and got.fused_layers > 0 and not got.exact_int8
    assert session_model(graph, config, int8=True, relative_shift=False) == str(graph)
    monkeypatch.setenv("FASTNLI_FUSED_ATTENTION", "0")
    assert SessionConfig().fused_attention is False
    assert session_model(graph, SessionConfig(exact_int8=False), int8=True, relative_shift=True) == str(graph)
    monkeypatch.setenv("FASTNLI_FUSED_ATTENTION", "maybe")
    with pytest.raises(ValueError, match=r"^FASTNLI_FUSED_ATTENTION='maybe' is not a switch; set it to 1 \(on\) or 0 "):
        SessionConfig()
    monkeypatch.delenv("FASTNLI_FUSED_ATTENTION")
    assert SessionConfig().fused_attention is True

    fa.library.cache_clear()
    monkeypatch.setattr(fa.importlib.util, "find_spec", lambda name: None)
    try:
        with caplog.at_level(logging.INFO, logger="fastnli"):
            assert session_model(graph, config, int8=True, relative_shift=True) == str(graph)
            engine = NLIEngine(art_v1, device="cpu", precision="int8")
        assert engine.fused_layers == 0 and engine.predict(PAIRS[:2]).shape == (2, 3)
        assert "fused attention off: the operator library fastnli.kernels._ortops is not built" in caplog.text
    finally:
        fa.library.cache_clear()


def test_exact_int8_and_fused_attention_rewrite_one_graph_together(art_v1: Path) -> None:
    from fastnli.engine.session import create_session

    graph = art_v1 / "model_int8.onnx"
    both = session_model(graph, SessionConfig(exact_int8=True), int8=True, relative_shift=True, threads=1)
    exact = session_model(graph, SessionConfig(exact_int8=True, fused_attention=False), int8=True, relative_shift=True)
    assert isinstance(both, SessionGraph) and both.exact_int8 and both.fused_layers > 0
    assert isinstance(exact, SessionGraph) and exact.exact_int8 and exact.fused_layers == 0
    sessions = [create_session(g, "cpu", SessionConfig())[0] for g in (both, exact)]
    feeds = _feeds([i.name for i in sessions[0].get_inputs()], 2, 33, 3)
    assert np.array_equal(sessions[0].run(None, feeds)[0], sessions[1].run(None, feeds)[0])
