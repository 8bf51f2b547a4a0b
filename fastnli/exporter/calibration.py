"""Calibration of the INT8 recipes: run an fp32 graph on calibration batches and read its intermediate tensors.

:func:`activations` yields the values of chosen tensors over the real tokens of each batch; :func:`percentile_ranges`
turns them into the fixed ranges of static INT8; the outlier split (:mod:`fastnli.exporter.outliers`) reads its
per-channel magnitudes from the same activations.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np


def session_with_outputs(model: Any, tensors: list[str], elem_type: int | None = None) -> tuple[Any, list[int]]:
    """A CPU session of ``model`` that also returns ``tensors`` (of ONNX element type ``elem_type``, default
    float), and their output positions.

    The session runs without ORT's memory arena: calibration batches have ragged shapes, and with dozens of
    requested intermediate outputs the arena grew by every new shape and never shrank (a base-size DeBERTa passed
    10 GiB within 16 calibration batches). An INT8 graph runs as the engine runs it
    (:func:`fastnli.engine.session.exact_int8_wanted`: uint8 weights on CPUs without VNNI), so what is measured
    from it does not depend on the CPU.
    """
    import onnx
    import onnxruntime as ort

    from fastnli.engine.session import SessionConfig, exact_int8_wanted
    from fastnli.engine.u8_weights import INTEGER_MATMULS, exact_int8_model

    kept = len(model.graph.output)
    for name in tensors:  # added in place and removed again: a copy of a large graph costs its size
        model.graph.output.append(onnx.helper.make_tensor_value_info(
            name, onnx.TensorProto.FLOAT if elem_type is None else elem_type, None))
    try:
        serialized = model.SerializeToString()
    finally:
        del model.graph.output[kept:]
    if any(n.op_type in INTEGER_MATMULS for n in model.graph.node) and exact_int8_wanted(SessionConfig()):
        serialized = exact_int8_model(serialized) or serialized  # the caller's graph keeps its int8 weights
    opts = ort.SessionOptions()
    opts.enable_cpu_mem_arena = False
    sess = ort.InferenceSession(serialized, opts, providers=["CPUExecutionProvider"])
    del serialized
    names = [o.name for o in sess.get_outputs()]
    return sess, [names.index(t) for t in tensors]


def activations(model: Any, tensors: list[str], feeds: list[dict[str, np.ndarray]], elem_type: int | None = None
                ) -> Iterator[tuple[str, np.ndarray, bool]]:
    """``(tensor, values, per_token)`` for each of ``tensors`` (of ``elem_type``, default float) and each batch of
    ``feeds``, run on CPU: per-token tensors give their real tokens' rows ``(tokens, channels)``; the others
    (DeBERTa's position projections) all their rows."""
    sess, where = session_with_outputs(model, tensors, elem_type)
    for feed in feeds:
        real = feed["attention_mask"].astype(bool)
        out = sess.run(None, feed)
        for t, i in zip(tensors, where):
            a = out[i]
            per_token = a.shape[:2] == real.shape
            yield t, (a[real] if per_token else a.reshape(-1, a.shape[-1])), per_token


def percentile_ranges(model: Any, tensors: list[str], feeds: list[dict[str, np.ndarray]],
                      percentile: float, skip: dict[str, list[int]] | None = None) -> dict[str, tuple[float, float]]:
    """``(low, high)`` of each tensor over the real tokens of ``feeds``: the ``100 - percentile`` and
    ``percentile`` percentiles of its values (from the tails kept batch by batch: exact for per-token tensors), widened
    to include 0. ``skip`` leaves out channels (last axis) of some tensors: those of a channel split.
    """
    skip = skip or {}
    real_tokens = sum(int(f["attention_mask"].sum()) for f in feeds)
    tails: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    keep: dict[str, int] = {}
    for t, a, per_token in activations(model, tensors, feeds):
        if t in skip:
            a = np.delete(a, skip[t], axis=-1)
        v = a.ravel()
        if t not in keep:  # values beyond the percentile, +1: the rank that gives the percentile itself
            count = real_tokens * a.shape[-1] if per_token else a.size * len(feeds)
            keep[t] = math.ceil(count * (100.0 - percentile) / 100.0) + 1
            tails[t] = (np.empty(0, np.float32), np.empty(0, np.float32))
        lo, hi = np.concatenate([tails[t][0], v]), np.concatenate([tails[t][1], v])
        n = keep[t]
        if lo.size > n:  # copies: a slice would keep the whole partitioned batch alive
            lo = np.partition(lo, n - 1)[:n].copy()
            hi = np.partition(hi, hi.size - n)[-n:].copy()
        tails[t] = (lo, hi)
    return {t: (min(float(tails[t][0].max()), 0.0), max(float(tails[t][1].min()), 0.0)) for t in tensors}
