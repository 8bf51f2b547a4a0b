"""Exact INT8 products on x86-64 CPUs without VNNI: INT8 weights moved to uint8 before a session loads the graph.

ONNX Runtime's U8S8 kernels there (uint8 activations x int8 weights) add pairs of products in 16 bits and saturate.
Its U8U8 kernels do not. ``w + 128`` with the weight zero point moved by the same 128 gives the same products
``(a - za)(w - zw)``, so the rewrite is exact. ORT's own switch for this (``session.x64quantprecision``) fails to load
graphs where an INT8 weight also feeds an fp32 reader (DeBERTa-v2's shared position projections: "Attempt to replace
the existing tensor", ORT 1.31); this rewrite gives such readers their original tensor.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

logger = logging.getLogger("fastnli")

#: op type -> (weight input, weight zero-point input, weight scale input or None): the integer MatMuls whose
#: weight may be uint8 as well as int8.
INTEGER_MATMULS: dict[str, tuple[int, int, int | None]] = {
    "MatMulInteger": (1, 3, None),
    "MatMulIntegerToFloat": (1, 5, 3),
    "DynamicQuantizeMatMul": (1, 3, 2),
    "QLinearMatMul": (3, 5, 4),
}

#: op type -> the zero-point input of its left operand (None: the op quantizes a float input to uint8 itself). ORT
#: has no kernel for int8 x uint8, so a product whose left operand is int8 (a constant quantized symmetrically, as
#: DeBERTa's folded position table in the static recipe) keeps its int8 weight: S8S8 kernels do not saturate.
LEFT_ZERO_POINT: dict[str, int | None] = {
    "MatMulInteger": 2,
    "MatMulIntegerToFloat": 4,
    "DynamicQuantizeMatMul": None,
    "QLinearMatMul": 2,
}


def weights_to_u8(model: Any) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto``, in place) so that every integer MatMul of :data:`INTEGER_MATMULS`
    reads a uint8 copy of its int8 weight initializer and zero point (+128; a missing zero point becomes 128).

    Returns the number of MatMuls rewritten. Weights that are not initializers are left as they are, and so are the
    products whose left operand is int8 (:data:`LEFT_ZERO_POINT`); an initializer that other nodes read too keeps its
    int8 original for them.
    """
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    converted: dict[str, str] = {}  # int8 initializer (or weight, for a missing zero point) -> its uint8 version
    int8 = onnx.TensorProto.INT8

    def add_u8(key: str, name: str, values: Any) -> str:
        if key not in converted:
            graph.initializer.append(numpy_helper.from_array(np.asarray(values, dtype=np.uint8), name))
            converted[key] = name
        return converted[key]

    def u8_copy(name: str) -> str:
        return add_u8(name, f"{name}_u8", numpy_helper.to_array(inits[name]).astype(np.int16) + 128)

    rewritten = 0
    for node in graph.node:
        slots = INTEGER_MATMULS.get(node.op_type)
        if slots is None:
            continue
        w_slot, zp_slot, scale_slot = slots
        w = node.input[w_slot]
        zp = node.input[zp_slot] if len(node.input) > zp_slot else ""
        if w not in inits or inits[w].data_type != int8 or (zp and (zp not in inits or inits[zp].data_type != int8)):
            continue
        left_zp = LEFT_ZERO_POINT[node.op_type]
        if left_zp is not None and any(name in inits and inits[name].data_type == int8 for name in
                                       (node.input[0], node.input[left_zp] if len(node.input) > left_zp else "")):
            continue
        if zp:
            u8_zp = u8_copy(zp)
        else:  # symmetric int8 weights: zero point 0 -> 128, per channel where the scale is
            scale = node.input[scale_slot] if scale_slot is not None else ""
            shape = list(inits[scale].dims) if scale in inits else []
            u8_zp = add_u8(f"{w}\0zero point", f"{w}_zero_point_u8", np.full(shape, 128))
        inputs = list(node.input) + [""] * (zp_slot + 1 - len(node.input))  # optional inputs before it stay empty
        inputs[w_slot], inputs[zp_slot] = u8_copy(w), u8_zp
        del node.input[:]
        node.input.extend(inputs)
        rewritten += 1
    still_read = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in still_read or t.name not in converted]
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)
    return rewritten


def exact_int8_model(graph: str | bytes) -> bytes | None:
    """The INT8 graph at path ``graph`` (or serialized in it) with :func:`weights_to_u8` applied, serialized for
    ``InferenceSession``; None when it has no int8 weight to move (load ``graph`` itself then)."""
    import onnx

    model = onnx.load_from_string(graph) if isinstance(graph, bytes) else onnx.load(graph)
    n = weights_to_u8(model)
    if n == 0:
        return None
    logger.debug("%s: %d integer MatMuls read uint8 weights (exact on CPUs without VNNI)",
                 "graph" if isinstance(graph, bytes) else graph, n)
    return model.SerializeToString()
