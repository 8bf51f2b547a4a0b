"""QDQ MatMuls written as MatMulIntegerToFloat (static INT8 graphs): same outputs, bias folded, nothing else moved."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fastnli.engine.session import SessionConfig, create_session, session_model
from fastnli.exporter.qdq_fusion import fuse_qdq_matmuls

K, N = 16, 24


def _qdq_model() -> onnx.ModelProto:
    """x -> Q -> DQ feeding three MatMuls on int8 weights: one with a bias Add (folds), one whose output is a graph
    output (no bias), one followed by an Add of another activation (not a bias: stays an Add)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
             numpy_helper.from_array(np.array(128, np.uint8), "xz"),
             numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"])]
    for j in range(3):
        w = rng.integers(-127, 128, (K, N)).astype(np.int8)
        inits += [numpy_helper.from_array(w, f"w{j}"),
                  numpy_helper.from_array((rng.random(N) * 0.01 + 1e-3).astype(np.float32), f"ws{j}"),
                  numpy_helper.from_array(np.zeros(N, np.int8), f"wz{j}")]
        nodes += [helper.make_node("DequantizeLinear", [f"w{j}", f"ws{j}", f"wz{j}"], [f"wd{j}"], axis=1),
                  helper.make_node("MatMul", ["xd", f"wd{j}"], [f"m{j}"], name=f"mm{j}")]
    nodes += [helper.make_node("Add", ["bias", "m0"], ["y0"]),
              helper.make_node("Add", ["m2", "m1"], ["y2"])]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, N]) for n in ("y0", "m1", "y2")]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, K])],
                              outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model: onnx.ModelProto, x: np.ndarray, tmp_path: Path, reference: bool = False) -> list[np.ndarray]:
    """Run as the engine runs an INT8 graph (on x86-64 CPUs without VNNI with uint8 weights: exact products), or
    with ``reference`` unoptimized: ORT then runs QDQ as written (float MatMuls of dequantized values), where its
    own QDQ fusion would pick its U8S8 kernels, which saturate on such CPUs."""
    path = tmp_path / "g.onnx"
    onnx.save(model, str(path))
    config = SessionConfig(optimization="none") if reference else SessionConfig()
    sess, _ = create_session(session_model(path, config, int8=not reference), "cpu", config)
    return sess.run(None, {"x": x})


def test_fusion_keeps_outputs_and_folds_only_bias_adds(tmp_path: Path) -> None:
    model = _qdq_model()
    x = np.random.default_rng(1).standard_normal((7, K)).astype(np.float32) * 3
    before = _run(model, x, tmp_path, reference=True)
    assert fuse_qdq_matmuls(model) == 3
    onnx.checker.check_model(model)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulIntegerToFloat") == 3 and "DequantizeLinear" not in ops and "MatMul" not in ops
    assert ops.count("Add") == 1  # the activation sum stays; the bias went into the MatMul
    fused = {n.name: n for n in model.graph.node if n.op_type == "MatMulIntegerToFloat"}
    assert list(fused["mm0"].input)[-1] == "bias" and list(fused["mm0"].output) == ["y0"]
    assert len(fused["mm1"].input) == len(fused["mm2"].input) == 6
    for got, ref in zip(_run(model, x, tmp_path), before):
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)


def test_fusion_leaves_float_matmuls_alone() -> None:
    w = numpy_helper.from_array(np.ones((K, N), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "f",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert fuse_qdq_matmuls(model) == 0
    assert [n.op_type for n in model.graph.node] == ["MatMul"]
