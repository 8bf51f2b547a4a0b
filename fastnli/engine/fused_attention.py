"""DeBERTa v1's attention probabilities in one compiled pass on CPU (the ``ai.fastnli::DisentangledScores`` custom
operator).

With the relative shift (:mod:`fastnli.exporter.attention`, the default export of v1 checkpoints such as
``microsoft/deberta-large-mnli``), every layer's scores are ``q·kᵀ + band(q·pkᵀ) + band(k·pqᵀ)ᵀ``: the two position
products are ``(B, H, L, 2L)`` fp32 MatMuls of which only an ``L``-wide band is read, by ``Reshape → Slice → Reshape
→ Slice`` (and a ``Transpose`` for p2c), then added twice, masked by a ``Where`` and normalised by a ``Softmax``. On
long pairs these products, copies and passes are the largest share of an INT8 graph's time.
:func:`fuse_attention` replaces all of it, per layer, by one ``DisentangledScores`` node
(``csrc/ortops/disentangled_scores.cpp``: each score's three dot products along the band in registers, ``3·L²·d``
multiply-adds per head instead of ``5·L²·d``, nothing ``2L`` wide written, each row's masked softmax while the row is
in cache), in the graph an INT8 CPU session loads; the artifact on disk stays a plain ONNX graph. The operator sums
in another order than ORT's GEMMs, so its results differ from the plain graph's by float rounding (relative 1e-6).

The operator library is built with the package (``fastnli.kernels._ortops``). Where it is missing (a build without a
C++ compiler), does not load or compute right on this ONNX Runtime (:func:`library`: a one-node probe is run and
checked against NumPy once per process), or has only its generic kernel on this CPU (no AVX2: slower than ORT's
GEMMs), sessions load the plain graph: the fusion is an optimisation, never a requirement.
``FASTNLI_FUSED_ATTENTION=0`` (or :attr:`~fastnli.engine.session.SessionConfig.fused_attention`) turns it off.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Iterable
from typing import Any

import numpy as np

logger = logging.getLogger("fastnli")

__all__ = ["DOMAIN", "OP_TYPE", "disentangled_scores", "fuse_attention", "library", "operator_model",
           "random_inputs", "register", "vector_width", "within_tolerance"]

DOMAIN = "ai.fastnli"
OP_TYPE = "DisentangledScores"
INPUTS = ("q", "kT", "pkT", "pqT", "masked", "fill")
#: The fewest float lanes of the operator's kernel on this CPU for which the fusion pays (AVX2: 8, AVX-512: 16).
MIN_VECTOR_WIDTH = 8
_MODULE = "fastnli.kernels._ortops"


@functools.cache
def library() -> str | None:
    """The path of the compiled operator library when it loads into this ONNX Runtime, computes the probe right and
    has a vector kernel for this CPU (:func:`vector_width` at least :data:`MIN_VECTOR_WIDTH`); else None (logged
    once at INFO with the reason)."""
    spec = importlib.util.find_spec(_MODULE)
    if spec is None or not spec.origin:
        logger.info("fused attention off: the operator library %s is not built (no C++ compiler at install)", _MODULE)
        return None
    try:
        width = vector_width(spec.origin)
        _probe(spec.origin)
    except Exception as exc:  # any failure to load or run leaves the plain graph
        logger.info("fused attention off: the operator library %s does not run on this ONNX Runtime (%s)",
                    spec.origin, exc)
        return None
    if width < MIN_VECTOR_WIDTH:
        logger.info("fused attention off: this CPU has neither AVX2 nor AVX-512, and the operator's generic kernel "
                    "(%d float lanes) is slower than ORT's GEMMs", width)
        return None
    return spec.origin


def vector_width(path: str) -> int:
    """The float lanes of the kernel the operator library at ``path`` runs on this CPU: 16 (AVX-512F), 8 (AVX2 and
    FMA) or 4 (generic)."""
    import ctypes

    return int(ctypes.CDLL(path).FastnliVectorWidth())


def register(options: Any) -> None:
    """Register the operator library with ``onnxruntime.SessionOptions`` ``options`` (call only when
    :func:`library` returned a path)."""
    path = library()
    if path is None:
        raise RuntimeError("the fused-attention operator library is not available")
    options.register_custom_ops_library(path)


def operator_model(masked: bool = True) -> bytes:
    """A serialized graph of one ``DisentangledScores`` node: inputs ``q``, ``kT``, ``pkT``, ``pqT`` and (``masked``,
    the attention probabilities) ``masked`` and ``fill``; output ``y``."""
    from onnx import TensorProto, helper

    names = list(INPUTS if masked else INPUTS[:4])
    node = helper.make_node(OP_TYPE, names, ["y"], domain=DOMAIN)
    graph = helper.make_graph([node], OP_TYPE, [helper.make_tensor_value_info(
        n, TensorProto.BOOL if n == "masked" else TensorProto.FLOAT, None) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)],
                              ir_version=8)
    return bytes(model.SerializeToString())


def random_inputs(lead: tuple[int, ...], length: int, width: int, seed: int,
                  position_lead: tuple[int, ...] | None = None,
                  mask_shape: tuple[int, ...] | None = None) -> dict[str, np.ndarray]:
    """Seeded operator inputs: standard-normal ``q`` ``(*lead, length, width)``, ``kT`` ``(*lead, width, length)``,
    ``pkT`` and ``pqT`` ``(*position_lead, width, 2 * length)`` (default ``lead``); with ``mask_shape``, ``masked``
    of that shape (a third of the positions left out, and the whole last row where there are several) and ``fill`` (float32's lowest, as the
    exported graph fills)."""
    rng = np.random.default_rng(seed)
    position_lead = lead if position_lead is None else position_lead
    shapes = {"q": (*lead, length, width), "kT": (*lead, width, length),
              "pkT": (*position_lead, width, 2 * length), "pqT": (*position_lead, width, 2 * length)}
    feeds: dict[str, np.ndarray] = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}
    if mask_shape is not None:
        masked = rng.random(mask_shape) < 1 / 3
        if mask_shape[-2] > 1:
            masked[..., -1, :] = True  # a padding row: every position left out
        feeds["masked"] = masked
        feeds["fill"] = np.array(np.finfo(np.float32).min, dtype=np.float32)
    return feeds


#: How far the operator's results may be from :func:`disentangled_scores` (float32 sums in another order), relative
#: to the largest one's magnitude (at least 1).
TOLERANCE = 1e-5


def _probe(path: str) -> None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.register_custom_ops_library(path)
    options.log_severity_level = 3
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(operator_model(), options, providers=["CPUExecutionProvider"])
    feeds = random_inputs((2, 3), 37, 24, seed=0, position_lead=(1, 3), mask_shape=(2, 1, 37, 37))
    got = session.run(None, feeds)[0]
    want = disentangled_scores(**feeds)
    if not within_tolerance(got, want):
        raise RuntimeError("the probe's attention probabilities differ from NumPy's")


def within_tolerance(got: np.ndarray, want: np.ndarray) -> bool:
    """Whether the operator's ``got`` is :func:`disentangled_scores`' ``want`` to :data:`TOLERANCE`."""
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    return got.shape == want.shape and bool(np.abs(got - want).max(initial=0.0) <= TOLERANCE * scale)


def disentangled_scores(q: np.ndarray, kT: np.ndarray, pkT: np.ndarray, pqT: np.ndarray,  # noqa: N803
                        masked: np.ndarray | None = None, fill: np.ndarray | None = None) -> np.ndarray:
    """NumPy's ``DisentangledScores`` (float64 sums, float32 result): ``scores[..., i, j] = qk[..., i, j] +
    c2p[..., i, L - 1 - i + j] + p2c[..., j, L - j + i]`` with ``qk = q @ kT``, ``c2p = q @ pkT`` and ``p2c =
    kTᵀ @ pqT`` (``q`` ``(..., L, d)``, ``kT`` ``(..., d, L)``, ``pkT`` and ``pqT`` ``(..., d, 2L)``, broadcast), as
    the exported graph defines the two bands; with ``masked`` (bool, broadcast to ``(..., L, L)``) and ``fill``, the
    softmax over ``j`` of ``where(masked, fill, scores)``."""
    q64, kt64 = q.astype(np.float64), kT.astype(np.float64)
    qk = q64 @ kt64
    c2p = q64 @ pkT.astype(np.float64)
    p2c = np.swapaxes(kt64, -1, -2) @ pqT.astype(np.float64)
    length = qk.shape[-1]
    i = np.arange(length)[:, None]
    j = np.arange(length)[None, :]
    scores = qk + c2p[..., i, length - 1 - i + j] + p2c[..., j, length - j + i]
    if masked is not None:
        scores = np.where(masked, np.float64(np.asarray(fill).reshape(())), scores)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
    return np.asarray(scores, dtype=np.float32)


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


def _operands(producer: dict[str, Any], qk: str, c2p: Any, p2c: Any) -> list[str] | None:
    """The operator's inputs ``[q, kT, pkT, pqT]`` when ``qk`` is ``MatMul(q, kT)`` with ``kT = Transpose(k)``, the
    c2p band's MatMul is ``MatMul(q, pkT)`` and the p2c band's ``MatMul(k, pqT)``; else None."""
    content = producer.get(qk)
    if content is None or content.op_type != "MatMul" or c2p.op_type != "MatMul" or p2c.op_type != "MatMul":
        return None
    q, kt = content.input
    transpose = producer.get(kt)
    if transpose is None or transpose.op_type != "Transpose" or not _swaps_last_axes(transpose):
        return None
    if c2p.input[0] != q or p2c.input[0] != transpose.input[0]:
        return None
    return [q, kt, c2p.input[1], p2c.input[1]]


def _masked_softmax(readers: dict[str, list[Any]], scores: str) -> tuple[Any, list[str]] | None:
    """``(Softmax node, [masked, fill])`` when ``scores`` is read only by ``Where(masked, fill, scores)`` and that
    only by a Softmax over the last axis (the exported graph's masked softmax); else None."""
    where = readers.get(scores, [])
    if len(where) != 1 or where[0].op_type != "Where" or list(where[0].input).index(scores) != 2:
        return None
    softmax = readers.get(where[0].output[0], [])
    if len(softmax) != 1 or softmax[0].op_type != "Softmax":
        return None
    axis = next((a.i for a in softmax[0].attribute if a.name == "axis"), None)
    if axis != -1:
        return None
    return softmax[0], list(where[0].input[:2])


def fuse_attention(model: Any) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto`` exported with the relative shift) in place: each layer's
    ``Add(MatMul(q, kT), Add(band(MatMul(q, pkT)), Transpose(band(MatMul(k, pqT)))))`` becomes
    ``DisentangledScores(q, kT, pkT, pqT)``, and with the masked softmax that follows it in the exported graph,
    ``Softmax(Where(masked, fill, scores))``, ``DisentangledScores(q, kT, pkT, pqT, masked, fill)`` (run on the
    session's intra-op threads); the nodes only the old products, chains and masking read are removed. Returns the
    number of layers fused (0 leaves the model unchanged: a graph without the shift's bands)."""
    from onnx import helper

    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    fused: list[tuple[Any, Any]] = []  # (the node replaced: the outer Add or the Softmax, the new node)
    for node in graph.node:
        if node.op_type != "Add":
            continue
        for k in (0, 1):
            inner = producer.get(node.input[1 - k])
            if inner is None or inner.op_type != "Add":
                continue
            operands = None
            for c in (0, 1):
                c2p = _chain(producer, inner.input[c], _BAND)
                transpose = producer.get(inner.input[1 - c])
                if c2p is None or transpose is None or transpose.op_type != "Transpose" \
                        or not _swaps_last_axes(transpose):
                    continue
                p2c = _chain(producer, transpose.input[0], _BAND)
                if p2c is not None:
                    operands = _operands(producer, node.input[k], c2p[-1], p2c[-1])
                    break
            if operands is None:
                continue
            replaced, softmax = node, _masked_softmax(readers, node.output[0])
            if softmax is not None:
                replaced, mask = softmax
                operands += mask
            new = helper.make_node(OP_TYPE, operands, [replaced.output[0]], name=f"{node.name}/{OP_TYPE}",
                                   domain=DOMAIN)
            fused.append((replaced, new))
            break
    if not fused:
        return 0
    replace = {id(old): new for old, new in fused}
    nodes = [replace.get(id(n), n) for n in graph.node]
    outputs = {o.name for o in graph.output}
    while True:  # drop what nothing reads any more: the old products, chains, adds and masking
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
