"""GPTQ weight rounding of the static INT8 recipe: the rounding itself, its error measure, and the exported graph."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fastnli.engine.session import SessionConfig, create_session, session_model
from fastnli.exporter import weight_rounding as wr


def _layer(k: int = 96, n: int = 40, tokens: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Correlated inputs ``x`` (tokens, k) with a few large channels, weights ``w`` (k, n) and their scales."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((k, k)) * np.geomspace(1.0, 0.01, k)[:, None]  # a decaying spectrum: correlated
    x = rng.standard_normal((tokens, k)) @ mix
    x[:, :3] *= 6.0
    w = rng.standard_normal((k, n)) * 0.05
    return x, w, np.abs(w).max(0) / 127.0


def test_gptq_rounding_cuts_the_output_error_of_rounding_to_nearest() -> None:
    x, w, scale = _layer()
    h = x.T @ x
    q = wr.gptq_round(w, scale, h)
    nearest = np.clip(np.round(w / scale), -127, 127)
    assert q.dtype == np.int8 and q.shape == w.shape and np.abs(q.astype(int)).max() <= 127
    err = lambda v: float(np.sum((x @ w - x @ (v * scale)) ** 2))  # noqa: E731
    assert err(q) < 0.5 * err(nearest)
    assert wr.output_error(w, q * scale, {"xx": h}) == pytest.approx(err(q), rel=1e-6)
    assert np.abs(q.astype(int) - nearest).max() >= 1  # it moved weights off the nearest point


def test_gptq_with_uncorrelated_inputs_is_rounding_to_nearest() -> None:
    """Nothing to compensate through: H diagonal means every row's error stays its own."""
    _, w, scale = _layer()
    h = np.diag(np.linspace(1.0, 5.0, w.shape[0]))
    np.testing.assert_array_equal(wr.gptq_round(w, scale, h), np.clip(np.round(w / scale), -127, 127))


def test_gptq_keeps_zero_rows_and_rounds_unreached_rows_to_nearest() -> None:
    x, w, scale = _layer()
    w[5] = 0.0  # a channel-split row: its input is clipped by the fixed range and must stay unread
    x[:, 7] = 0.0  # an input no calibration token reached
    q = wr.gptq_round(w, scale, x.T @ x)
    assert not q[5].any()
    np.testing.assert_array_equal(q[7], np.clip(np.round(w[7] / scale), -127, 127))


def test_blocked_updates_give_the_row_by_row_result(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, scale = _layer(k=300, seed=1)
    blocked = wr.gptq_round(w, scale, x.T @ x)
    monkeypatch.setattr(wr, "BLOCK", 1)
    one_by_one = wr.gptq_round(w, scale, x.T @ x)
    assert np.mean(blocked == one_by_one) >= 0.999  # float ties aside


def test_output_error_against_rounded_inputs_is_written_out() -> None:
    x, w, scale = _layer()
    lo, hi = float(np.percentile(x, 0.1)), float(np.percentile(x, 99.9))
    xq = wr.fake_quant_u8(x, lo, hi)
    assert len(np.unique(np.round((xq - lo) / ((hi - lo) / 255)))) <= 256
    m = {"xx": x.T @ x, "qq": xq.T @ xq, "qx": xq.T @ x}
    v = np.round(w / scale) * scale
    assert wr.output_error(w, v, m) == pytest.approx(float(np.sum((x @ w - xq @ v) ** 2)), rel=1e-6)


@pytest.mark.parametrize(("art", "inputs"), [("art_bert", "float"), ("art_bert", "quantized"), ("art_bert", "graph"),
                                           ("art_v1", "quantized"), ("art_v2", "quantized")])
def test_static_recipe_with_weight_rounding(art: str, inputs: str, request: pytest.FixtureRequest,
                                            tmp_path: Path) -> None:
    """The recipe rounds every quantized MatMul's weights on the quantizer's own grid, cuts each one's output error
    on the calibration set and records it; the graph still follows fp32 (on the seeded random weights, whose
    probabilities are near-uniform, within 10% of round-to-nearest's mean |Δp|: the end-to-end gain is measured on
    the trained default model, docs/export.md)."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from fastnli.engine.manifest import read_manifest
    from fastnli.engine.tokenize import PairTokenizer
    from fastnli.exporter.export import calibration_feeds
    from fastnli.exporter.precision import INT8_RECIPES, to_int8
    from fastnli.exporter.probe import probe_pairs

    path = request.getfixturevalue(art)
    m = read_manifest(path)
    feeds = calibration_feeds(PairTokenizer(path / "tokenizer.json"), probe_pairs(), m.inputs, m.pad_token_id)
    src = path / "model_fp32.onnx"
    graphs = {}
    recipes = {"static": INT8_RECIPES["static"],
               "static-gptq": {**INT8_RECIPES["static-gptq"], "weight_rounding": {"method": "gptq", "inputs": inputs}}}
    for name, recipe in recipes.items():
        graphs[name] = tmp_path / f"{name}.onnx"
        got = to_int8(src, graphs[name], recipe, feeds)
    rounding = got["static"]["weight_rounding"]
    assert rounding["matmuls"] + rounding["shared_left_nearest"] == got["static"]["quantized_matmuls"]
    assert rounding["matmuls"] > 0 and rounding["inputs"] == inputs
    assert 0 < rounding["output_error_vs_nearest"]["median"] < 1
    inits = {k: {i.name: numpy_helper.to_array(i) for i in onnx.load(str(g)).graph.initializer}
             for k, g in graphs.items()}
    moved = [n for n, a in inits["static"].items() if a.dtype == np.int8 and a.ndim == 2
             and not np.array_equal(a, inits["static-gptq"][n])]
    assert len(moved) == rounding["matmuls"]  # same grid (scales), other integers
    readers = Counter(n.input[1] for n in onnx.load(str(graphs["static-gptq"])).graph.node
                      if n.op_type == "MatMulIntegerToFloat")
    assert rounding["shared_left_nearest"] == sum(c for c in readers.values() if c > 1)
    assert all(np.array_equal(inits["static"][n], inits["static-gptq"][n])
               for n, a in inits["static"].items() if a.dtype != np.int8)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    config = SessionConfig()  # the INT8 graphs run as the engine runs them on this CPU (exact without VNNI)
    sessions = {k: create_session(session_model(g, config, int8=True), "cpu", config)[0] for k, g in graphs.items()}
    dp = {k: np.mean([np.abs(s.run(None, f)[0] - ref.run(None, f)[0]).mean() for f in feeds])
          for k, s in sessions.items()}
    assert dp["static-gptq"] <= 1.1 * dp["static"]
    agree = np.mean([np.mean(sessions["static-gptq"].run(None, f)[0].argmax(-1) == ref.run(None, f)[0].argmax(-1))
                     for f in feeds])
    assert agree >= 0.9  # the INT8 probe gate of the tiny models (tests/test_engine.py)


def test_weight_rounding_refuses_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match=re.escape("INT8 weight_rounding {'method': 'gptq', 'damp': 0.01, 'inputs': "
                                                   "'exact'}: the method is 'gptq', inputs 'float', 'quantized' "
                                                   "or 'graph'")):
        wr.round_weights(None, None, [], {"inputs": "exact"}, {})


def test_a_weight_two_matmuls_share_keeps_rounding_to_nearest() -> None:
    """Two MatMuls reading one weight have two inputs to fit: that weight stays rounded to nearest, the other is
    rounded by GPTQ, and the record says which."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    k, n = 32, 8
    w_shared, w_own = (rng.standard_normal((k, n)).astype(np.float32) for _ in range(2))
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, k]),
           helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [None, None])]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None, None, n]) for o in ("ya", "yb", "yc")]
    src_nodes = [helper.make_node("Tanh", ["x"], ["t"]),
                 helper.make_node("MatMul", ["x", "ws"], ["ya"], name="a"),
                 helper.make_node("MatMul", ["t", "ws"], ["yb"], name="b"),
                 helper.make_node("MatMul", ["t", "wo"], ["yc"], name="c")]
    source = helper.make_model(helper.make_graph(src_nodes, "src", ins, outs, [
        numpy_helper.from_array(w_shared, "ws"), numpy_helper.from_array(w_own, "wo")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    scales = {name: np.abs(w).max(0) / 127 for name, w in (("ws", w_shared), ("wo", w_own))}
    nearest = {name: np.round(w / scales[name]).astype(np.int8) for name, w in (("ws", w_shared), ("wo", w_own))}
    inits = [numpy_helper.from_array(nearest[name], f"{name}_q") for name in nearest]
    inits += [numpy_helper.from_array(scales[name].astype(np.float32), f"{name}_s") for name in scales]
    inits += [numpy_helper.from_array(np.array(0.05, np.float32), "xs"), numpy_helper.from_array(np.array(128, np.uint8), "xz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("QuantizeLinear", ["t", "xs", "xz"], ["tq"])]
    for name, a, w in (("a", "xq", "ws"), ("b", "tq", "ws"), ("c", "tq", "wo")):
        nodes.append(helper.make_node("MatMulIntegerToFloat", [a, f"{w}_q", "xs", f"{w}_s", "xz"], [f"y{name}"],
                                      name=name, domain="com.microsoft"))
    written = helper.make_model(helper.make_graph(nodes, "int8", ins, outs, inits),
                                opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                                ir_version=8)
    mix = rng.standard_normal((k, k)) * np.geomspace(1.0, 0.02, k)[:, None]
    feeds = [{"x": (rng.standard_normal((4, 50, k)) @ mix).astype(np.float32),
              "attention_mask": np.ones((4, 50), np.int64)} for _ in range(3)]
    got = wr.round_weights(written, source, feeds, {"inputs": "float"}, {})
    assert got["matmuls"] == 1 and got["shared_left_nearest"] == 2
    after = {i.name: numpy_helper.to_array(i) for i in written.graph.initializer}
    np.testing.assert_array_equal(after["ws_q"], nearest["ws"])
    assert not np.array_equal(after["wo_q"], nearest["wo"])
    assert onnx.checker.check_model(written) is None
