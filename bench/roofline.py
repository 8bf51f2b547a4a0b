"""This machine's GEMM peaks on ONNX Runtime (fp32 and INT8), and DeBERTa's FLOP count per sequence.

The peaks are measured in the same run as the benchmark: one MatMul of DeBERTa-large's FFN shape
(``[rows, 1024] × [1024, 4096]``), fp32 and dynamically quantized INT8 (ORT's ``DynamicQuantizeMatMul``, the kernel
the INT8 graph uses, loaded as the engine loads it: on x86-64 CPUs without VNNI with uint8 weights, on ORT's exact
U8U8 kernels), the best of its repeats over at least a second. The best because the minimum is the least disturbed
by other load; a second of repeats because a few (five are 30 ms of INT8 products with AMX) can all fall in one
disturbance.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _matmul_model(path: Path, k: int, n: int, seed: int = 0) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32) * 0.02
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by every ORT release we support
    onnx.save(model, str(path))


def gemm_peaks(rows: int = 2048, k: int = 1024, n: int = 4096, repeats: int = 5, seconds: float = 1.0,
               threads: int = 0) -> dict[str, float]:
    """Measured GEMM throughput in GFLOP/s (2·m·k·n per product) for ``fp32`` and ``int8`` on ORT's CPU provider:
    the best of at least ``repeats`` products and at least ``seconds`` of them per precision."""
    import onnxruntime as ort

    from fastnli.engine.session import SessionConfig, session_model, session_options
    from fastnli.exporter.precision import to_int8

    out = {}
    with tempfile.TemporaryDirectory() as d:
        fp32 = Path(d) / "fp32.onnx"
        _matmul_model(fp32, k, n)
        int8 = Path(d) / "int8.onnx"
        to_int8(fp32, int8)
        x = np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)
        config = SessionConfig(intra_op_threads=threads)
        for name, path in (("fp32", fp32), ("int8", int8)):  # the INT8 kernels the engine runs
            sess = ort.InferenceSession(session_model(path, config, int8=name == "int8"), session_options(config),
                                        providers=["CPUExecutionProvider"])
            sess.run(None, {"x": x})
            best, done, start = float("inf"), 0, time.perf_counter()
            while done < repeats or time.perf_counter() - start < seconds:
                t0 = time.perf_counter()
                sess.run(None, {"x": x})
                best = min(best, time.perf_counter() - t0)
                done += 1
            out[name] = 2.0 * rows * k * n / best / 1e9
    return out


def deberta_flops(config: dict[str, Any], seq_len: int) -> float:
    """Estimated FLOPs of one forward pass of a DeBERTa sequence classifier on one sequence of ``seq_len`` tokens.

    Counted (2 FLOPs per multiply-add): the linear layers (Q/K/V/output projections and the FFN) per token, and the
    attention products per token (content QKᵀ and AV, plus the c2p and p2c disentangled terms over ``2·seq_len``
    relative positions). Not counted: the relative-position key/query projections, which run once per *batch* on
    ``2·seq_len`` relative embeddings and are shared by all its rows (amortised over 32-64 rows they are < 1% of a
    short pair's work; counting them per sequence overstated short-pair FLOPs by a third), and embeddings, norms,
    softmax and the classifier head (< 1%).
    """
    d = int(config["hidden_size"])
    ff = int(config["intermediate_size"])
    layers = int(config["num_hidden_layers"])
    s = int(seq_len)
    linear = 2 * (4 * d * d + 2 * d * ff) * s
    attention = (2 * s * d + 2 * s * d + 2 * 2 * s * d * 2) * s
    return float(layers * (linear + attention))
