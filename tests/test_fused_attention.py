"""The compiled DisentangledAttention operator (csrc/ortops) and the fused self-attention of DeBERTa v1 INT8 graphs
on CPU (fastnli.engine.fused_attention): NumPy's attention to float rounding, the plain graph's probabilities, and the
plain graph wherever the operator is off, missing or without a vector kernel."""

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
    path = fa.library()
    assert path is not None
    return fa.operator_session(path, threads)


def test_the_operator_library_is_built_and_loads_here() -> None:
    path = fa.library()
    assert path is not None and Path(path).name.startswith("_ortops")


def test_numpy_reference_is_debertas_attention_with_the_bands_the_exported_graph_defines() -> None:
    batch, heads, length, width = 2, 2, 5, 3
    feeds = fa.random_inputs(batch, heads, length, width, seed=1)
    qkv = feeds["qkv"].astype(np.float64).reshape(batch, length, heads, 3 * width)
    qb, vb = (feeds[n].astype(np.float64).reshape(heads, width) for n in ("q_bias", "v_bias"))
    pkt, pqt = (feeds[n].astype(np.float64)[0] for n in ("pkT", "pqT"))  # (heads, width, 2L)
    masked, scale = feeds["masked"][:, 0], float(feeds["scale"])
    want = np.empty((batch, length, heads * width))
    for b in range(batch):
        for h in range(heads):
            q = (qkv[b, :, h, :width] + qb[h]) / scale
            k, v = qkv[b, :, h, width:2 * width], qkv[b, :, h, 2 * width:] + vb[h]
            qk, c2p, p2c = q @ k.T, q @ pkt[h], k @ pqt[h]  # the graph's three products, (L, L), (L, 2L), (L, 2L)
            for i in range(length):
                row = np.array([qk[i, j] + c2p[i, length - 1 - i + j] + p2c[j, length - j + i]
                                for j in range(length)])  # c2p: q_i . pos_key[i - j + L]; p2c: k_j . pos_query[...]
                row = np.where(masked[b, i], -3.4028234663852886e38, row)
                p = np.exp(row - row.max())
                want[b, i, h * width:(h + 1) * width] = (p / p.sum()) @ v
    assert np.allclose(fa.disentangled_attention(**feeds), want, rtol=1e-6, atol=1e-6)


@given(batch=st.integers(1, 3), heads=st.integers(1, 3), length=st.integers(1, 70),
       width=st.sampled_from([1, 3, 16, 64]), threads=st.integers(1, 4),
       mask=st.sampled_from(["pairs", "keys", "per head", "shared"]), seed=st.integers(0, 2**16))
def test_operator_equals_numpy_at_any_shape_thread_count_and_mask(batch: int, heads: int, length: int, width: int,
                                                                  threads: int, mask: str, seed: int) -> None:
    mask_shape = {"pairs": (batch, 1, length, length), "keys": (batch, 1, 1, length),  # the graph's is "pairs"
                  "per head": (batch, heads, length, length), "shared": (length, length)}[mask]
    feeds = fa.random_inputs(batch, heads, length, width, seed, mask_shape)
    assert fa.within_tolerance(_op_session(threads).run(None, feeds)[0], fa.disentangled_attention(**feeds))


def test_every_session_options_registered_after_the_first_shares_one_working_operator() -> None:
    """The library makes its operator domain once per process and adds it to each session options it registers with
    (sessions created and dropped one after another, as a service reloading models does)."""
    feeds = fa.random_inputs(2, 2, 40, 16, seed=3)
    want = fa.disentangled_attention(**feeds)
    for _ in range(20):
        assert fa.within_tolerance(_op_session(1).run(None, feeds)[0], want)


@pytest.mark.parametrize("length", [32, 33, 150, 257])
def test_short_rows_and_long_rows_take_their_own_paths_to_the_same_attention(length: int) -> None:
    """Rows up to 32 positions read all three score terms in one tile; longer ones read the queries' position band
    as a product of their own (csrc/ortops/attention_kernel.inc): each side of that line, and several column chunks."""
    feeds = fa.random_inputs(2, 2, length, 64, seed=length)
    assert fa.within_tolerance(_op_session(2).run(None, feeds)[0], fa.disentangled_attention(**feeds))


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_the_narrower_kernels_compute_the_same(isa: str) -> None:
    """The kernel is picked once per process, at load: each narrower one runs in a process of its own (this CPU has
    AVX2 at least, CI's too), on the shapes that reach every tile and tail of its width."""
    import os
    import subprocess
    import sys

    script = f"""
from fastnli.engine import fused_attention as fa
path = fa.library() if "{isa}" == "avx2" else __import__("importlib.util").util.find_spec(fa._MODULE).origin
assert fa.vector_width(path) == {{"avx2": 8, "generic": 4}}["{isa}"], fa.vector_width(path)
session = fa.operator_session(path, 2)
for length in (1, 3, 7, 8, 9, 16, 17, 31, 32, 33, 70, 129):
    for width in (3, 16, 24):
        feeds = fa.random_inputs(2, 3, length, width, seed=length)
        assert fa.within_tolerance(session.run(None, feeds)[0], fa.disentangled_attention(**feeds)), (length, width)
"""
    env = {**os.environ, "FASTNLI_OPERATOR_ISA": isa}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_bad_kernel_cap_is_an_error_that_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    fa.library.cache_clear()
    monkeypatch.setenv("FASTNLI_OPERATOR_ISA", "avx9")
    try:
        with pytest.raises(ValueError, match=r"^FASTNLI_OPERATOR_ISA='avx9' is not one of 'auto', 'avx512', 'avx2', "
                                             r"'generic'; set it to one of them, or unset it \(default 'auto'\)$"):
            fa.library()
    finally:
        fa.library.cache_clear()


def test_a_row_with_every_position_left_out_is_uniform_as_in_the_graph() -> None:
    feeds = fa.random_inputs(1, 2, 5, 4, seed=3)  # the last row of each pair is all masked: exp(fill - fill) = 1 each
    feeds["v_bias"][:] = 0
    got = _op_session(1).run(None, feeds)[0]
    values = feeds["qkv"].reshape(1, 5, 2, 12)[..., 8:]  # (1, L, heads, width)
    assert np.allclose(got[0, -1].reshape(2, 4), values[0].mean(axis=0), atol=1e-6)


def test_operator_names_the_shapes_it_needs() -> None:
    feeds = fa.random_inputs(2, 3, 4, 8, seed=0)
    session = _op_session(1)
    positions = (r"DisentangledAttention: pkT and pqT must be \(\.\.\., H, d, 2L\) alike, their leading "
                 r"dimensions broadcast to \(B, H\)")
    bad = {"qkv": (feeds["qkv"][..., :-1], r"DisentangledAttention: qkv must be \(B, L, 3 H d\) with pkT's H and d"),
           "pkT": (feeds["pkT"][..., :-1], positions),
           "pqT": (np.ascontiguousarray(np.concatenate([feeds["pqT"]] * 2)), positions),
           "q_bias": (feeds["q_bias"][..., :-1], r"DisentangledAttention: q_bias and v_bias must hold H d values"),
           "masked": (feeds["masked"][..., :3], r"DisentangledAttention: masked must be \(\.\.\., L or 1, L\), its "
                                                r"leading dimensions broadcast to \(B, H\)"),
           "scale": (np.ones(2, np.float32), r"DisentangledAttention: scale must be one value"),
           "fill": (np.zeros(2, np.float32), r"DisentangledAttention: fill must be one value")}
    for name, (value, message) in bad.items():
        with pytest.raises(Exception, match=message):
            session.run(None, {**feeds, name: value})


def test_the_cpu_has_a_vector_kernel_and_a_generic_one_turns_the_fusion_off(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    path = fa.library()
    assert path is not None and fa.vector_width(path) >= fa.MIN_VECTOR_WIDTH  # every CI CPU has AVX2 at least
    fa.library.cache_clear()
    monkeypatch.setattr(fa, "vector_width", lambda path: 4)
    try:
        with caplog.at_level(logging.INFO, logger="fastnli"):
            assert fa.library() is None
        assert "fused attention off: this CPU has neither AVX2 nor AVX-512, and the operator's generic kernel " \
               "(4 float lanes) is slower than ORT's GEMMs" in caplog.text
    finally:
        fa.library.cache_clear()


def _feeds(names: list[str], rows: int, length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(5, 100, (rows, length)).astype(np.int64),
             "attention_mask": np.ones((rows, length), np.int64), "token_type_ids": np.zeros((rows, length), np.int64)}
    feeds["attention_mask"][0, length // 2:] = 0  # padding, as in a length-packed batch
    return {k: v for k, v in feeds.items() if k in names}


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_fusing_a_shift_graph_replaces_every_layer_and_keeps_its_probabilities(art_v1: Path, precision: str) -> None:
    manifest = read_manifest(art_v1)
    assert manifest.precisions["fp32"].recipe["attention"] == SHIFT_RECIPE  # the INT8 graph is made from it
    path = str(art_v1 / manifest.precisions[precision].file)
    model = onnx.load(path)
    layers = sum(1 for n in model.graph.node if n.op_type == "Softmax")
    products = sum(1 for n in model.graph.node if n.op_type == "MatMul")
    transposes = sum(1 for n in model.graph.node if n.op_type == "Transpose")
    assert fa.fuse_attention(model) == layers > 0
    ops = [n.op_type for n in model.graph.node]
    assert ops.count(fa.OP_TYPE) == layers and "Softmax" not in ops and "Where" not in ops
    assert ops.count("MatMul") == products - 4 * layers  # QK^T, the two position products, attention x values
    # the heads' split and merge, the keys' and the p2c band's: the position terms' transposes feed the operator
    assert ops.count("Transpose") == transposes - 4 * layers
    assert not any(n.op_type == "Slice" and "attention/self/Slice_7" in n.name for n in model.graph.node)
    options = ort.SessionOptions()
    fa.register(options)
    fused = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    plain = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in plain.get_inputs()]
    for rows, length, seed in ((3, 7, 0), (2, 41, 1), (1, 130, 2)):
        feeds = _feeds(names, rows, length, seed)
        assert np.allclose(fused.run(None, feeds)[0], plain.run(None, feeds)[0], rtol=0, atol=1e-4)


def test_a_graph_without_the_shift_is_left_as_it_is(art_v2: Path) -> None:
    manifest = read_manifest(art_v2)
    model = onnx.load(str(art_v2 / manifest.precisions["int8"].file))
    before = model.SerializeToString()
    assert fa.fuse_attention(model) == 0 and model.SerializeToString() == before
    engine = NLIEngine(art_v2, device="cpu", precision="int8")
    assert engine.fused_layers == 0


def test_engine_runs_v1_int8_fused_with_the_plain_graphs_probabilities(art_v1: Path) -> None:
    fused = NLIEngine(art_v1, device="cpu", precision="int8")
    plain = NLIEngine(art_v1, device="cpu", precision="int8", session_config=SessionConfig(fused_attention=False))
    layers = sum(1 for n in onnx.load(str(art_v1 / "model_int8.onnx")).graph.node if n.op_type == "Softmax")
    assert (fused.fused_layers, plain.fused_layers) == (layers, 0)
    assert np.allclose(fused.predict(PAIRS, "truncate"), plain.predict(PAIRS, "truncate"), rtol=0, atol=1e-4)
    assert NLIEngine(art_v1, device="cpu", precision="fp32").fused_layers == 0  # INT8 graphs only


def test_fused_attention_switch_and_a_missing_library_fall_back_to_the_plain_graph(
        art_v1: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    graph = art_v1 / "model_int8.onnx"
    config = SessionConfig(exact_int8=False)
    got = session_model(graph, config, int8=True, relative_shift=True)
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
    both = session_model(graph, SessionConfig(exact_int8=True), int8=True, relative_shift=True)
    exact = session_model(graph, SessionConfig(exact_int8=True, fused_attention=False), int8=True, relative_shift=True)
    assert isinstance(both, SessionGraph) and both.exact_int8 and both.fused_layers > 0
    assert isinstance(exact, SessionGraph) and exact.exact_int8 and exact.fused_layers == 0
    sessions = [create_session(g, "cpu", SessionConfig())[0] for g in (both, exact)]
    feeds = _feeds([i.name for i in sessions[0].get_inputs()], 2, 33, 3)
    assert np.allclose(sessions[0].run(None, feeds)[0], sessions[1].run(None, feeds)[0], rtol=0, atol=1e-4)
