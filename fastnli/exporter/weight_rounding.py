"""Weight rounding of the static INT8 recipe (``"weight_rounding"``): each quantized weight rounded so that the
MatMul's *output* on calibration inputs moves least, not each weight to its nearest grid point.

Round-to-nearest makes every weight's error at most half a grid step, but the errors of one output channel add up
through the input: ``Σ_k x_k (w_k - q_k)``. GPTQ (Frantar et al., 2022, "GPTQ: Accurate Post-Training Quantization
for Generative Pre-trained Transformers") rounds the reduction rows one at a time and moves the rows not yet rounded
to cancel the error so far, weighted by the inputs' second moments ``H = Σ x xᵀ`` over the calibration tokens. The
grid (per-output-channel scales, the int8 range) stays the one the quantizer chose, so the graph, its kernels and
its speed do not change; only which integers it holds.

With ``"inputs": "quantized"`` the target is the fp32 product ``x W`` and the inputs are the activations as the
INT8 graph rounds them (``x̃``, the fixed ranges of static INT8): the weights first move to the least-squares
solution of ``x̃ W' ≈ x W``, which also absorbs part of the activation rounding, and are then rounded as above with
``H = Σ x̃ x̃ᵀ``. With ``"inputs": "graph"`` the rounded inputs are read from the INT8 graph itself, the MatMuls
rounded in graph order, so that each also absorbs what the layers before it changed (docs/export.md measures the
three).

Reduction rows whose weights are all zero (the outlier channels of a channel split, which the fixed range clips)
stay zero.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

#: The recipe section's defaults: ``damp`` is the share of the mean diagonal of ``H`` added to it (GPTQ's 1%);
#: ``inputs`` is ``"float"`` (plain GPTQ), ``"quantized"`` or ``"graph"`` (see the module docstring).
DEFAULTS: dict[str, Any] = {"method": "gptq", "damp": 0.01, "inputs": "float"}
#: Rows rounded between two updates of the rest (GPTQ's lazy batch updates: same result, fewer memory passes).
BLOCK = 128
#: Bytes of float64 moments measured in one calibration pass (larger models take several passes).
MOMENTS_BYTES = 1 << 30


def fake_quant_u8(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``x`` rounded as an asymmetric uint8 tensor of range ``[lo, hi]`` (the static INT8 activations), in floats."""
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    zero = np.round(-lo / scale)
    return ((np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale).astype(x.dtype)


def gptq_round(w: np.ndarray, scale: np.ndarray, h: np.ndarray, damp: float = 0.01, qmax: int = 127) -> np.ndarray:
    """The int8 weights of ``w`` (``(K, N)``, ONNX MatMul layout ``y = x @ w``) on the per-output-channel grid
    ``scale`` (``(N,)``) that GPTQ chooses for the input second moments ``h`` (``(K, K)``).

    Rows are rounded in order of decreasing ``h`` diagonal (GPTQ's act order); all-zero rows stay zero and rows that
    no calibration input reached (zero diagonal) round to nearest. Returns int8 ``(K, N)``.
    """
    k = w.shape[0]
    q = np.zeros(w.shape, np.int8)
    live = np.flatnonzero(np.any(w != 0, axis=1) & (np.diag(h) > 0))
    dead = np.setdiff1d(np.arange(k), live)
    q[dead] = np.clip(np.round(w[dead] / scale), -qmax, qmax).astype(np.int8)
    if live.size == 0:
        return q
    order = live[np.argsort(-np.diag(h)[live], kind="stable")]
    hs = h[np.ix_(order, order)].astype(np.float64)
    hs[np.diag_indices_from(hs)] += damp * float(np.mean(np.diag(hs)))
    u = np.linalg.cholesky(np.linalg.inv(hs)).T  # upper: H⁻¹ = uᵀu
    work = w[order].astype(np.float64)
    s = scale.astype(np.float64)
    for b0 in range(0, order.size, BLOCK):  # GPTQ's lazy batches: the rows after a block move once per block
        b1 = min(b0 + BLOCK, order.size)
        errs = np.empty((b1 - b0, w.shape[1]))
        for i in range(b0, b1):
            qi = np.clip(np.round(work[i] / s), -qmax, qmax)
            q[order[i]] = qi.astype(np.int8)
            errs[i - b0] = (work[i] - qi * s) / u[i, i]
            work[i + 1:b1] -= np.outer(u[i, i + 1:b1], errs[i - b0])
        work[b1:] -= u[b0:b1, b1:].T @ errs
    return q


def output_error(w: np.ndarray, v: np.ndarray, m: dict[str, np.ndarray]) -> float:
    """``Σ ‖x w - x̃ v‖²`` over the calibration tokens from their moments ``m`` (:func:`second_moments`): the summed
    squared output error of the weights ``v`` (dequantized) against the fp32 product."""
    w64, v64 = w.astype(np.float64), v.astype(np.float64)
    qq, qx = m.get("qq", m["xx"]), m.get("qx", m["xx"])
    return float(np.einsum("kn,kj,jn->", w64, m["xx"], w64) - 2 * np.einsum("kn,kj,jn->", v64, qx, w64)
                 + np.einsum("kn,kj,jn->", v64, qq, v64))


def _moments(x: np.ndarray, xq: np.ndarray | None) -> dict[str, np.ndarray]:
    """The moments of one batch: ``x`` the fp32 inputs, ``xq`` their rounded values or None (both float64)."""
    parts = {"xx": x.T @ x}
    if xq is not None:
        parts.update(qq=xq.T @ xq, qx=xq.T @ x)
    return parts


def _add(sums: dict[str, np.ndarray], parts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return parts if not sums else {k: sums[k] + v for k, v in parts.items()}


def second_moments(model: Any, tensors: list[str], feeds: list[dict[str, np.ndarray]],
                   ranges: dict[str, tuple[float, float]] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Per tensor of ``tensors``, ``{"xx": Σ x xᵀ}`` over the real tokens of ``feeds`` (float64); with ``ranges``
    (tensor -> fixed range) also ``"qq": Σ x̃ x̃ᵀ`` and ``"qx": Σ x̃ xᵀ`` of its rounded values ``x̃``."""
    from fastnli.exporter.calibration import activations

    sums: dict[str, dict[str, np.ndarray]] = {}
    for t, a, _ in activations(model, tensors, feeds):
        xq = None if ranges is None else fake_quant_u8(a, *ranges[t]).astype(np.float64)
        sums[t] = _add(sums.get(t, {}), _moments(a.astype(np.float64), xq))
    return sums


def graph_moments(source: Any, written: Any, x_name: str, node: Any, feeds: list[dict[str, np.ndarray]]
                  ) -> dict[str, np.ndarray]:
    """The moments of :func:`second_moments` for the input of one ``MatMulIntegerToFloat`` ``node`` of the INT8
    graph ``written``: ``x`` the tensor ``x_name`` of the fp32 graph ``source``, ``x̃`` the node's uint8 input
    dequantized, as ``written`` computes it now (its earlier layers already rounded), over the real tokens of
    ``feeds``."""
    import onnx
    from onnx import numpy_helper

    from fastnli.exporter.calibration import activations

    inits = {i.name: i for i in written.graph.initializer}
    scale = float(numpy_helper.to_array(inits[node.input[2]]))
    zero = float(numpy_helper.to_array(inits[node.input[4]])) if len(node.input) > 4 and node.input[4] else 0.0
    sums: dict[str, np.ndarray] = {}
    for (_, a, _), (_, aq, _) in zip(activations(source, [x_name], feeds),
                                      activations(written, [node.input[0]], feeds, onnx.TensorProto.UINT8)):
        sums = _add(sums, _moments(a.astype(np.float64), (aq.astype(np.float64) - zero) * scale))
    return sums


def round_weights(written: Any, source: Any, feeds: list[dict[str, np.ndarray]], spec: dict[str, Any],
                  ranges: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Replace the int8 weights of the INT8 graph ``written`` (in place; its quantized MatMuls written as
    ``MatMulIntegerToFloat``, :mod:`fastnli.exporter.qdq_fusion`) by GPTQ's rounding of the fp32 weights of
    ``source`` (the fp32 graph ``written`` was quantized from, same node names), measured on ``feeds``.

    ``spec["inputs"]``: ``"float"`` (plain GPTQ on the fp32 inputs), ``"quantized"`` (the fp32 inputs rounded with
    their fixed ``ranges``: least squares toward the fp32 product, then GPTQ) or ``"graph"`` (the same with the inputs
    as ``written`` computes them, earlier layers rounded first, so that each layer also absorbs what the layers
    before it changed).

    Returns what to record: the MatMuls rounded, those left rounded to nearest because they share their weights with
    another quantized MatMul, and, over the rounded ones, the median and largest ratio of the output error
    (:func:`output_error` on the calibration inputs) to round-to-nearest's.

    Raises:
        ValueError: for an unknown method or inputs, or a weight grid that is not symmetric int8 per output channel.
    """
    from onnx import numpy_helper

    spec = {**DEFAULTS, **spec}
    if spec["method"] != "gptq" or spec["inputs"] not in ("float", "quantized", "graph"):
        raise ValueError(f"INT8 weight_rounding {spec}: the method is 'gptq', inputs 'float', 'quantized' or 'graph'")
    inits = {i.name: i for i in written.graph.initializer}
    src_inits = {i.name: i for i in source.graph.initializer}
    src_nodes = {n.name: n for n in source.graph.node if n.op_type == "MatMul"}
    quantized = [n for n in written.graph.node  # in graph order: "graph" rounds the earlier layers first
                 if n.op_type == "MatMulIntegerToFloat" and n.name in src_nodes and n.input[1] in inits]
    readers = Counter(n.input[1] for n in quantized)
    # a weight that two MatMuls read (DeBERTa-v2's projections shared with the position terms) has two inputs to fit:
    # it keeps the nearest rounding
    targets = [n for n in quantized if readers[n.input[1]] == 1]
    inputs = {n.name: src_nodes[n.name].input[0] for n in targets}
    mode, damp = spec["inputs"], float(spec["damp"])
    moments: dict[str, dict[str, np.ndarray]] = {}
    chunks: list[list[str]] = [[]]  # the inputs, in graph order, in passes of at most MOMENTS_BYTES of moments
    chunk_of: dict[str, int] = {}
    size = 0
    for node in targets if mode != "graph" else []:  # "graph" measures one input at a time
        t = inputs[node.name]
        if t in chunk_of:
            continue
        need = (1 if mode == "float" else 3) * 8 * src_inits[src_nodes[node.name].input[1]].dims[0] ** 2
        if chunks[-1] and size + need > MOMENTS_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(t)
        chunk_of[t] = len(chunks) - 1
        size += need
    ratios = []
    for node in targets:
        name = node.name
        w = numpy_helper.to_array(src_inits[src_nodes[name].input[1]]).astype(np.float64)
        scale = numpy_helper.to_array(inits[node.input[3]]).astype(np.float64)
        old = numpy_helper.to_array(inits[node.input[1]])
        zero = numpy_helper.to_array(inits[node.input[5]]) if len(node.input) > 5 and node.input[5] else None
        if old.dtype != np.int8 or scale.shape != (w.shape[1],) or (zero is not None and np.any(zero != 0)):
            raise ValueError(f"INT8 weight_rounding: {name}'s weights are not symmetric int8 per output channel")
        if inputs[name] not in moments:
            moments.clear()
            if mode == "graph":  # measured once per input, after the layers before it
                moments[inputs[name]] = graph_moments(source, written, inputs[name], node, feeds)
            else:
                moments = second_moments(source, chunks[chunk_of[inputs[name]]], feeds,
                                         ranges if mode == "quantized" else None)
        m = moments[inputs[name]]
        target = w
        if mode != "float":  # least squares x̃ W' ≈ x W on the rows that stay free (zero rows stay zero)
            live = np.flatnonzero(np.any(w != 0, axis=1))
            qq = m["qq"][np.ix_(live, live)]
            ridge = damp * float(np.mean(np.diag(qq)))  # pulls toward W, not toward 0
            target = np.zeros_like(w)
            target[live] = np.linalg.solve(qq + np.eye(live.size) * ridge, m["qx"][live] @ w + ridge * w[live])
        q = gptq_round(target, scale, m.get("qq", m["xx"]), damp)
        before = output_error(w, np.clip(np.round(w / scale), -127, 127) * scale, m)
        after = output_error(w, q * scale, m)
        ratios.append(after / before if before > 0 else 1.0)
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(q, node.input[1]))
    return {**spec, "matmuls": len(targets), "shared_left_nearest": len(quantized) - len(targets),
            "output_error_vs_nearest": {"median": round(float(np.median(ratios)), 4) if ratios else None,
                                        "max": round(float(np.max(ratios)), 4) if ratios else None}}
