"""DeBERTa v1's attention scores in one compiled pass on CPU (the ``ai.fastnli::RelativeScores`` custom operator).

With the relative shift (:mod:`fastnli.exporter.attention`, the default export of v1 checkpoints such as
``microsoft/deberta-large-mnli``), every layer's scores are ``qk + band(c2p) + band(p2c)ᵀ``: the two position
products are ``(B, H, L, 2L)`` fp32 tensors and each band is read out by ``Reshape → Slice → Reshape → Slice`` (and a
``Transpose`` for p2c), then added twice. ORT copies the tensors at each step; on long pairs these copies and adds
are the largest share of an INT8 graph's time. :func:`fuse_relative_scores` replaces each layer's chains and adds by
one ``RelativeScores`` node (``csrc/ortops/relative_scores.cpp``: the same sums, each product read once
in cache-sized tiles), in the graph an INT8 CPU session loads; the artifact on disk stays a plain ONNX graph.

The operator library is built with the package (``fastnli.kernels._ortops``). Where it is missing (a build without a
C++ compiler) or does not load or compute right on this ONNX Runtime (:func:`library`: a one-node probe is run and
checked against NumPy once per process), sessions load the plain graph: the fusion is an optimisation, never a
requirement. ``FASTNLI_FUSED_ATTENTION=0`` (or :attr:`~fastnli.engine.session.SessionConfig.fused_attention`)
turns it off.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Iterable
from typing import Any

import numpy as np

logger = logging.getLogger("fastnli")

__all__ = ["DOMAIN", "OP_TYPE", "fuse_relative_scores", "library", "operator_model", "register",
           "relative_scores"]

DOMAIN = "ai.fastnli"
OP_TYPE = "RelativeScores"
_MODULE = "fastnli.kernels._ortops"


@functools.cache
def library() -> str | None:
    """The path of the compiled operator library when it loads into this ONNX Runtime and computes the probe right;
    else None (logged once at INFO with the reason)."""
    spec = importlib.util.find_spec(_MODULE)
    if spec is None or not spec.origin:
        logger.info("fused attention off: the operator library %s is not built (no C++ compiler at install)", _MODULE)
        return None
    try:
        _probe(spec.origin)
    except Exception as exc:  # any failure to load or run leaves the plain graph
        logger.info("fused attention off: the operator library %s does not run on this ONNX Runtime (%s)",
                    spec.origin, exc)
        return None
    return spec.origin


def register(options: Any) -> None:
    """Register the operator library with ``onnxruntime.SessionOptions`` ``options`` (call only when
    :func:`library` returned a path)."""
    path = library()
    if path is None:
        raise RuntimeError("the fused-attention operator library is not available")
    options.register_custom_ops_library(path)


def operator_model(threads: int = 1) -> bytes:
    """A serialized graph of one ``RelativeScores`` node with ``threads`` threads: inputs ``qk``, ``c2p``, ``p2c``,
    output ``y``."""
    from onnx import TensorProto, helper

    names = ("qk", "c2p", "p2c")
    node = helper.make_node(OP_TYPE, list(names), ["y"], domain=DOMAIN, threads=threads)
    graph = helper.make_graph([node], OP_TYPE, [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                                for n in names],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)],
                              ir_version=8)
    return bytes(model.SerializeToString())


def _probe(path: str) -> None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.register_custom_ops_library(path)
    options.log_severity_level = 3
    session = ort.InferenceSession(operator_model(threads=2), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    length = 37
    qk = rng.standard_normal((2, 3, length, length), dtype=np.float32)
    c2p = rng.standard_normal((2, 3, length, 2 * length), dtype=np.float32)
    p2c = rng.standard_normal((2, 3, length, 2 * length), dtype=np.float32)
    got = session.run(None, {"qk": qk, "c2p": c2p, "p2c": p2c})[0]
    if not np.array_equal(got, relative_scores(qk, c2p, p2c)):
        raise RuntimeError("the probe's scores differ from NumPy's")


def relative_scores(qk: np.ndarray, c2p: np.ndarray, p2c: np.ndarray) -> np.ndarray:
    """NumPy's ``RelativeScores``: ``out[..., i, j] = qk[..., i, j] + (c2p[..., i, L - 1 - i + j] +
    p2c[..., j, L - j + i])`` (``qk`` ``(..., L, L)``, ``c2p`` and ``p2c`` ``(..., L, 2L)``), summed in the exported
    graph's order (the two bands first), so the operator's output equals the plain graph's bit for bit."""
    length = qk.shape[-1]
    i = np.arange(length)[:, None]
    j = np.arange(length)[None, :]
    return qk + (c2p[..., i, length - 1 - i + j] + p2c[..., j, length - j + i])


def _chain(producer: dict[str, Any], name: str, ops: Iterable[str]) -> list[Any] | None:
    """The nodes that produce ``name`` walking back through first inputs, when their op types are ``ops`` in that
    order (nearest first); else None."""
    nodes = []
    for op in ops:
        node = producer.get(name)
        if node is None or node.op_type != op:
            return None
        nodes.append(node)
        name = node.input[0]
    return nodes


_BAND = ("Slice", "Reshape", "Slice", "Reshape", "MatMul")  # the band's chain read back from its last Slice


def _swaps_last_axes(node: Any) -> bool:
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    return perm is not None and len(perm) >= 2 and perm[-2:] == [len(perm) - 1, len(perm) - 2] \
        and perm[:-2] == list(range(len(perm) - 2))


def fuse_relative_scores(model: Any, threads: int = 1) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto`` exported with the relative shift) in place: each layer's
    ``Add(qk, Add(band(c2p), Transpose(band(p2c))))`` becomes ``RelativeScores(qk, c2p, p2c)`` with ``threads``
    threads, and the nodes only the old chains read are removed. Returns the number of layers fused (0 leaves the
    model unchanged: a graph without the shift's bands)."""
    from onnx import helper

    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    fused: list[tuple[Any, Any]] = []  # (the outer Add, the new node)
    for node in graph.node:
        if node.op_type != "Add":
            continue
        for k in (0, 1):
            inner = producer.get(node.input[1 - k])
            if inner is None or inner.op_type != "Add":
                continue
            qk = node.input[k]
            match = None
            for c in (0, 1):
                c2p = _chain(producer, inner.input[c], _BAND)
                transpose = producer.get(inner.input[1 - c])
                if c2p is None or transpose is None or transpose.op_type != "Transpose" \
                        or not _swaps_last_axes(transpose):
                    continue
                p2c = _chain(producer, transpose.input[0], _BAND)
                if p2c is not None:
                    match = (c2p[-1].output[0], p2c[-1].output[0])
                    break
            if match is None:
                continue
            new = helper.make_node(OP_TYPE, [qk, *match], [node.output[0]], name=f"{node.name}/{OP_TYPE}",
                                   domain=DOMAIN, threads=max(1, int(threads)))
            fused.append((node, new))
            break
    if not fused:
        return 0
    replace = {id(old): new for old, new in fused}
    nodes = [replace.get(id(n), n) for n in graph.node]
    outputs = {o.name for o in graph.output}
    while True:  # drop what nothing reads any more: the old chains, their shape arithmetic
        read = {i for n in nodes for i in n.input} | outputs
        kept = [n for n in nodes if any(o in read for o in n.output if o)]
        if len(kept) == len(nodes):
            break
        nodes = kept
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(op.domain == DOMAIN for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return len(fused)
