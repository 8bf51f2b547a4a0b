"""Write the QDQ MatMuls of a static INT8 graph as ONNX Runtime's ``MatMulIntegerToFloat``, bias included.

ORT turns ``DequantizeLinear(x_q), DequantizeLinear(W_q) -> MatMul`` into ``MatMulIntegerToFloat`` when it loads a
QDQ graph, but leaves the bias ``Add`` that follows as a separate pass over the output (and the FFN's bias then
goes into ``BiasGelu`` instead of the cheaper ``Gelu``). ``MatMulIntegerToFloat`` takes the bias as an input and
adds it in the GEMM's output loop. Written that way in the saved graph, the same int8 kernels run with one memory
pass less per projection; the sums are the same, so the outputs are too.

The QDQ quantizer also routes every other reader of a quantized tensor through its ``DequantizeLinear``: in a BERT
graph the residual stream itself is rounded to 8 bits at each layer's input, which costs accuracy and a pass.
:func:`unround_float_readers` gives those readers the fp32 tensor back.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

MS_DOMAIN = "com.microsoft"


def fuse_qdq_matmuls(model: Any) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto`` in QDQ form, in place); returns the MatMuls rewritten.

    A ``MatMul`` is rewritten when both inputs come from ``DequantizeLinear`` nodes, the activation's with one
    (per-tensor) scale and the weight's from an initializer; a following ``Add`` of a constant vector of the output
    width becomes its bias. Dequantize nodes left without consumers are removed.
    """
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list[Any]] = defaultdict(list)
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
    outputs = {o.name for o in g.output}

    def const(name: str) -> np.ndarray | None:
        return numpy_helper.to_array(inits[name]) if name in inits else None

    replaced: dict[int, Any] = {}
    dropped: set[int] = set()
    for n in g.node:
        if n.op_type != "MatMul" or n.domain not in ("", "ai.onnx"):
            continue
        a, b = producer.get(n.input[0]), producer.get(n.input[1])
        if a is None or b is None or a.op_type != "DequantizeLinear" or b.op_type != "DequantizeLinear":
            continue
        a_scale, w = const(a.input[1]), const(b.input[0])
        if a_scale is None or a_scale.size != 1 or w is None or w.ndim != 2:
            continue
        inputs = [a.input[0], b.input[0], a.input[1], b.input[1],
                  a.input[2] if len(a.input) > 2 else "", b.input[2] if len(b.input) > 2 else ""]
        out = n.output[0]
        users = consumers[out]
        if out not in outputs and len(users) == 1 and users[0].op_type == "Add":
            add = users[0]
            other = add.input[1] if add.input[0] == out else add.input[0]
            bias = const(other)
            if bias is not None and bias.shape == (w.shape[1],):
                inputs.append(other)
                out = add.output[0]
                dropped.add(id(add))
        replaced[id(n)] = helper.make_node("MatMulIntegerToFloat", inputs, [out], name=n.name, domain=MS_DOMAIN)
    if not replaced:
        return 0
    nodes = [replaced.get(id(n), n) for n in g.node if id(n) not in dropped]
    read = {i for n in nodes for i in n.input} | outputs  # one pass: a Dequantize never feeds another
    nodes = [n for n in nodes if n.op_type != "DequantizeLinear" or any(o in read for o in n.output)]
    del g.node[:]
    g.node.extend(nodes)
    if not any(op.domain == MS_DOMAIN for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return len(replaced)


def unround_float_readers(model: Any) -> int:
    """Let the fp32 readers of a ``QuantizeLinear -> DequantizeLinear`` pair read the tensor before quantization
    (``model`` in place); returns the Dequantize nodes removed. Run after :func:`fuse_qdq_matmuls`, which leaves only
    such readers on them."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    outputs = {o.name for o in g.output}
    source: dict[str, str] = {}
    for n in g.node:
        q = producer.get(n.input[0]) if n.op_type == "DequantizeLinear" else None
        if q is not None and q.op_type == "QuantizeLinear" and list(q.input[1:]) == list(n.input[1:]) \
                and n.output[0] not in outputs:
            source[n.output[0]] = q.input[0]
    if not source:
        return 0
    for n in g.node:
        for j, name in enumerate(n.input):
            if name in source:
                n.input[j] = source[name]
    kept = [n for n in g.node if not (n.op_type == "DequantizeLinear" and n.output[0] in source)]
    del g.node[:]
    g.node.extend(kept)
    return len(source)
