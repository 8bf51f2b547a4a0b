"""Exact INT8 products on every CPU: ORT's U8S8 kernels on x86-64 without VNNI saturate; there the engine's INT8
sessions load the graph with uint8 weights, which runs ORT's exact U8U8 kernels (SessionConfig.exact_int8)."""

from __future__ import annotations

import numpy as np
import pytest

from fastnli.engine import session as session_mod
from fastnli.engine.session import (
    SessionConfig,
    create_session,
    exact_int8_wanted,
    session_model,
    u8s8_saturates,
)
from fastnli.engine.u8_weights import weights_to_u8

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


def _matmul_integer(w: np.ndarray, dequantized_too: bool = False) -> onnx.ModelProto:
    """uint8 activations x int8 weights (an initializer, as in every INT8 graph) -> int32; with ``dequantized_too``
    the same weight also feeds an fp32 reader (as DeBERTa-v2's shared position projections do)."""
    from onnx import TensorProto, helper, numpy_helper

    k, n = w.shape
    nodes = [helper.make_node("MatMulInteger", ["a", "w"], ["y"], name="mm")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.INT32, ["m", n])]
    inits = [numpy_helper.from_array(w, "w")]
    if dequantized_too:
        nodes.append(helper.make_node("DequantizeLinear", ["w", "s"], ["wf"]))
        outputs.append(helper.make_tensor_value_info("wf", TensorProto.FLOAT, [k, n]))
        inits.append(numpy_helper.from_array(np.array(0.5, dtype=np.float32), "s"))
    graph = helper.make_graph(nodes, "mmi", [helper.make_tensor_value_info("a", TensorProto.UINT8, ["m", k])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _large_products(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    # pairs of neighbouring products reach 2 x 255 x 127 = 64,770: past int16, where U8S8 AVX2 kernels clamp
    rng = np.random.default_rng(seed)
    a = rng.integers(200, 256, size=(8, 256)).astype(np.uint8)
    w = (rng.integers(90, 128, size=(256, 16)) * rng.choice([-1, 1], size=(256, 16))).astype(np.int8)
    return a, w


def _run(config: SessionConfig, a: np.ndarray, w: np.ndarray, tmp_path, dequantized_too: bool = False):  # type: ignore[no-untyped-def]
    """Load the graph as the engine loads an INT8 graph under ``config``."""
    path = tmp_path / "mmi.onnx"
    onnx.save(_matmul_integer(w, dequantized_too), str(path))
    sess, _ = create_session(session_model(path, config, int8=True), "cpu", config)
    return sess.run(None, {"a": a})


def test_exact_int8_gives_the_integer_products(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a, w = _large_products()
    want = a.astype(np.int64) @ w.astype(np.int64)
    np.testing.assert_array_equal(_run(SessionConfig(exact_int8=True), a, w, tmp_path)[0], want)
    np.testing.assert_array_equal(_run(SessionConfig(), a, w, tmp_path)[0], want)  # auto: exact on every CPU


def test_a_weight_shared_with_an_fp32_reader_keeps_its_int8_original_there(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a, w = _large_products(1)
    y, wf = _run(SessionConfig(exact_int8=True), a, w, tmp_path, dequantized_too=True)
    np.testing.assert_array_equal(y, a.astype(np.int64) @ w.astype(np.int64))
    np.testing.assert_array_equal(wf, w.astype(np.float32) * 0.5)
    model = _matmul_integer(w, dequantized_too=True)
    assert weights_to_u8(model) == 1
    inits = {t.name: t for t in model.graph.initializer}
    mm, dq = model.graph.node
    assert inits[mm.input[1]].data_type == onnx.TensorProto.UINT8 and inits[mm.input[3]].data_type == onnx.TensorProto.UINT8
    assert dq.input[0] == "w" and inits["w"].data_type == onnx.TensorProto.INT8


def test_a_weight_read_by_two_matmuls_gets_one_uint8_copy_and_zero_point(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from onnx import TensorProto, helper

    a, w = _large_products(2)
    model = _matmul_integer(w)
    model.graph.node[0].name = ""  # unnamed nodes, no zero point: the names of the new tensors come from the weight
    model.graph.node.append(helper.make_node("MatMulInteger", ["a", "w"], ["y2"]))
    model.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.INT32, ["m", w.shape[1]]))
    assert weights_to_u8(model) == 2
    onnx.checker.check_model(model)
    assert sorted(t.name for t in model.graph.initializer) == ["w_u8", "w_zero_point_u8"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = a.astype(np.int64) @ w.astype(np.int64)
    for got in sess.run(None, {"a": a}):
        np.testing.assert_array_equal(got, want)


def test_fp32_graphs_and_exact_off_load_from_their_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "g.onnx"
    assert session_model(path, SessionConfig(exact_int8=True), int8=False) == str(path)
    assert session_model(path, SessionConfig(exact_int8=False), int8=True) == str(path)


@pytest.mark.skipif(not u8s8_saturates(), reason="this CPU's U8S8 kernels are exact (VNNI, or not x86-64)")
def test_without_exact_int8_this_cpu_saturates(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Why the option exists: on this CPU the fast kernels really get the products wrong."""
    a, w = _large_products()
    want = a.astype(np.int64) @ w.astype(np.int64)
    got = _run(SessionConfig(exact_int8=False), a, w, tmp_path)[0]
    assert np.abs(got - want).max() > 1000


@pytest.mark.parametrize(
    ("machine", "flags", "saturates"),
    [
        ("x86_64", {"avx2", "fma"}, True),  # AVX2 only (e.g. AMD Zen 3): saturates
        ("x86_64", {"avx2", "avx512f", "avx512_vnni"}, False),
        ("x86_64", {"avx2", "avx_vnni"}, False),  # AVX-VNNI without AVX-512 (e.g. Alder Lake)
        ("aarch64", None, False),
        ("arm64", {"asimd"}, False),
    ],
)
def test_u8s8_saturates_reads_the_cpu_flags(monkeypatch: pytest.MonkeyPatch, machine: str, flags: set[str] | None,
                                            saturates: bool) -> None:
    monkeypatch.setattr(session_mod.platform, "machine", lambda: machine)
    monkeypatch.setattr(session_mod, "_cpu_flags", lambda: flags)
    u8s8_saturates.cache_clear()
    try:
        assert u8s8_saturates() is saturates
    finally:
        u8s8_saturates.cache_clear()


@pytest.mark.parametrize(
    ("machine", "flags", "isa"),
    [
        ("x86_64", {"avx2", "avx512_vnni", "amx_tile", "amx_int8"}, "AMX-INT8"),  # e.g. Sapphire Rapids
        ("x86_64", {"avx2", "avx512f", "avx512_vnni", "amx_bf16"}, "AVX-512 VNNI"),  # AMX without its INT8 part
        ("x86_64", {"avx2", "avx_vnni"}, "AVX-VNNI"),
        ("x86_64", {"avx2", "fma"}, "AVX2"),
        ("x86_64", {"sse4_2"}, "x86-64"),
        ("x86_64", None, "x86-64"),
        ("aarch64", None, "aarch64"),
    ],
)
def test_int8_isa_names_the_kernels_this_cpu_runs(monkeypatch: pytest.MonkeyPatch, machine: str,
                                                   flags: set[str] | None, isa: str) -> None:
    monkeypatch.setattr(session_mod.platform, "machine", lambda: machine)
    monkeypatch.setattr(session_mod, "_cpu_flags", lambda: flags)
    assert session_mod.int8_isa() == isa


def test_cpu_model_name_adds_family_and_model_read_by_exact_field(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 1\n"
                       "model name\t: AMD EPYC\nflags\t\t: fpu avx2\n")
    read = session_mod._cpuinfo
    assert read("model", str(cpuinfo)) == "1" and read("model name", str(cpuinfo)) == "AMD EPYC"
    assert read("stepping", str(cpuinfo)) is None and read("model", str(tmp_path / "missing")) is None
    monkeypatch.setattr(session_mod, "_cpuinfo", lambda field: read(field, str(cpuinfo)))
    assert session_mod.cpu_model_name() == "AMD EPYC, family 23 model 1"
    monkeypatch.setattr(session_mod, "_cpuinfo", lambda field: {"model name": "Some CPU"}.get(field))
    assert session_mod.cpu_model_name() == "Some CPU"


def test_exact_int8_setting_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FASTNLI_EXACT_INT8", raising=False)
    assert exact_int8_wanted(SessionConfig()) is u8s8_saturates()
    assert exact_int8_wanted(SessionConfig(exact_int8=True)) is True
    monkeypatch.setenv("FASTNLI_EXACT_INT8", "0")
    assert exact_int8_wanted(SessionConfig()) is False
    assert exact_int8_wanted(SessionConfig(exact_int8=True)) is True  # the explicit setting wins
    monkeypatch.setenv("FASTNLI_EXACT_INT8", "sometimes")
    with pytest.raises(ValueError, match=r"^FASTNLI_EXACT_INT8='sometimes' is not a switch; set it to 1 \(on\) or 0 "
                                         r"\(off\), or unset it \(auto\)$"):
        exact_int8_wanted(SessionConfig())


def test_a_product_with_an_int8_left_operand_keeps_its_int8_weight(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """ORT has no int8 x uint8 kernel: a product whose left operand is int8 (DeBERTa's folded position table in the
    static recipe) keeps its int8 weight, loads on the exact path and gives the integer products."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    a = rng.integers(-128, 128, size=(8, 64)).astype(np.int8)
    w = rng.integers(-128, 128, size=(64, 16)).astype(np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w", "a_zp"], ["y"], name="mm")], "s8s8",
        [helper.make_tensor_value_info("a", TensorProto.INT8, ["m", 64])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["m", 16])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0, dtype=np.int8), "a_zp")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert weights_to_u8(model) == 0
    path = tmp_path / "s8s8.onnx"
    onnx.save(model, str(path))
    sess, _ = create_session(session_model(path, SessionConfig(exact_int8=True), int8=True), "cpu",
                             SessionConfig(exact_int8=True))
    np.testing.assert_array_equal(sess.run(None, {"a": a})[0], a.astype(np.int64) @ w.astype(np.int64))
