"""Exact INT8 products on every CPU: ORT's U8S8 kernels on x86-64 without VNNI saturate, the engine's sessions ask
for its exact U8U8 kernels there (SessionConfig.exact_int8)."""

from __future__ import annotations

import numpy as np
import pytest

from fastnli.engine import session as session_mod
from fastnli.engine.session import SessionConfig, exact_int8_wanted, session_options, u8s8_saturates

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


def _matmul_integer(w: np.ndarray) -> bytes:
    """uint8 activations x int8 weights (an initializer, as in every INT8 graph) -> int32."""
    from onnx import TensorProto, helper, numpy_helper

    k, n = w.shape
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "mmi",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["m", n])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _large_products(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    # pairs of neighbouring products reach 2 x 255 x 127 = 64,770: past int16, where U8S8 AVX2 kernels clamp
    rng = np.random.default_rng(seed)
    a = rng.integers(200, 256, size=(8, 256)).astype(np.uint8)
    w = (rng.integers(90, 128, size=(256, 16)) * rng.choice([-1, 1], size=(256, 16))).astype(np.int8)
    return a, w


def _run(config: SessionConfig, a: np.ndarray, w: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(_matmul_integer(w), session_options(config), providers=["CPUExecutionProvider"])
    return sess.run(None, {"a": a})[0]


def test_exact_int8_gives_the_integer_products() -> None:
    a, w = _large_products()
    want = a.astype(np.int64) @ w.astype(np.int64)
    np.testing.assert_array_equal(_run(SessionConfig(exact_int8=True), a, w), want)
    np.testing.assert_array_equal(_run(SessionConfig(), a, w), want)  # auto: exact on every CPU


@pytest.mark.skipif(not u8s8_saturates(), reason="this CPU's U8S8 kernels are exact (VNNI, or not x86-64)")
def test_without_exact_int8_this_cpu_saturates() -> None:
    """Why the option exists: on this CPU the fast kernels really get the products wrong."""
    a, w = _large_products()
    want = a.astype(np.int64) @ w.astype(np.int64)
    got = _run(SessionConfig(exact_int8=False), a, w)
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


def test_exact_int8_setting_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FASTNLI_EXACT_INT8", raising=False)
    assert exact_int8_wanted(SessionConfig()) is u8s8_saturates()
    assert exact_int8_wanted(SessionConfig(exact_int8=True)) is True
    monkeypatch.setenv("FASTNLI_EXACT_INT8", "0")
    assert exact_int8_wanted(SessionConfig()) is False
    assert exact_int8_wanted(SessionConfig(exact_int8=True)) is True  # the explicit setting wins
    monkeypatch.setenv("FASTNLI_EXACT_INT8", "sometimes")
    with pytest.raises(ValueError, match=r"^FASTNLI_EXACT_INT8='sometimes': use 1 \(on\), 0 \(off\) or leave it "
                                         r"unset \(auto\)$"):
        exact_int8_wanted(SessionConfig())
