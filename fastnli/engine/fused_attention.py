"""DeBERTa v1's self-attention in one compiled pass on CPU (the ``ai.fastnli::DisentangledAttention`` custom
operator).

With the relative shift (:mod:`fastnli.exporter.attention`, the default export of v1 checkpoints such as
``microsoft/deberta-large-mnli``), each layer splits its ``in_proj`` output into heads (``Reshape``, ``Transpose``,
three ``Slice`` copies, bias ``Add``s), computes the scores ``q·kᵀ + band(q·pkᵀ) + band(k·pqᵀ)ᵀ`` with three fp32
MatMuls (the two position products ``(B, H, L, 2L)``, of which only an ``L``-wide band is read, by ``Reshape → Slice
→ Reshape → Slice`` and a ``Transpose``), masks them (``Where``), normalises them (``Softmax``), multiplies by the
values and merges the heads (``Transpose``, ``Reshape``). Every step writes a tensor the next one reads back: on
short pairs the copies, on long ones the position products, are a third of an INT8 graph's time.
:func:`fuse_attention` replaces all of it, per layer, by one ``DisentangledAttention`` node
(``csrc/ortops/disentangled_attention.cpp``: per (pair, head), each score's three dot products along the band in
registers, ``3·L²·d`` multiply-adds instead of ``5·L²·d``, each row's masked softmax while the row is in cache, and
the context written straight into its heads' columns), in the graph an INT8 CPU session loads; the artifact on disk
stays a plain ONNX graph. The operator sums in another order than ORT's GEMMs, so its results differ from the plain
graph's by float rounding (relative 1e-6).

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

from fastnli._env import env_choice

logger = logging.getLogger("fastnli")

__all__ = ["DOMAIN", "INPUTS", "OP_TYPE", "attention_probabilities", "disentangled_attention", "fuse_attention",
           "library", "operator_model", "operator_session", "random_inputs", "register", "vector_width",
           "within_tolerance"]

DOMAIN = "ai.fastnli"
OP_TYPE = "DisentangledAttention"
#: The operator's inputs, in order (csrc/ortops/disentangled_attention.cpp says what each holds).
INPUTS = ("qkv", "q_bias", "v_bias", "scale", "pkT", "pqT", "masked", "fill")
#: Caps the kernel the operator library picks as it loads (``avx2`` or ``generic``: for tests, and for CPUs that
#: slow their clock under AVX-512); ``auto`` (the default) or ``avx512`` picks the widest this CPU runs.
ISA_VARIABLE = "FASTNLI_OPERATOR_ISA"
ISA_CHOICES = ("auto", "avx512", "avx2", "generic")
#: The fewest float lanes of the operator's kernel on this CPU for which the fusion pays (AVX2: 8, AVX-512: 16).
MIN_VECTOR_WIDTH = 8
_MODULE = "fastnli.kernels._ortops"


@functools.cache
def library() -> str | None:
    """The path of the compiled operator library when it loads into this ONNX Runtime, computes the probe right and
    has a vector kernel for this CPU (:func:`vector_width` at least :data:`MIN_VECTOR_WIDTH`); else None (logged
    once at INFO with the reason)."""
    env_choice(ISA_VARIABLE, "auto", ISA_CHOICES)  # the library reads it as it loads: a bad value is an error here
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


def operator_model() -> bytes:
    """A serialized graph of one ``DisentangledAttention`` node: inputs named as :data:`INPUTS`, output ``y``."""
    from onnx import TensorProto, helper

    node = helper.make_node(OP_TYPE, list(INPUTS), ["y"], domain=DOMAIN)
    graph = helper.make_graph([node], OP_TYPE, [helper.make_tensor_value_info(
        n, TensorProto.BOOL if n == "masked" else TensorProto.FLOAT, None) for n in INPUTS],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)],
                              ir_version=8)
    return bytes(model.SerializeToString())


def random_inputs(batch: int, heads: int, length: int, width: int, seed: int,
                  mask_shape: tuple[int, ...] | None = None) -> dict[str, np.ndarray]:
    """Seeded operator inputs for ``batch`` pairs of ``length`` tokens, ``heads`` heads of ``width``: standard-normal
    ``qkv`` ``(batch, length, 3 * heads * width)``, biases ``(1, heads, 1, width)`` and position terms ``(1, heads,
    width, 2 * length)``, ``scale`` ``sqrt(width)``; ``masked`` of ``mask_shape`` (default ``(batch, 1, length,
    length)``, the exported graph's: a third of the positions left out, and the whole last row where there are
    several) and ``fill`` float32's lowest, as the exported graph fills."""
    rng = np.random.default_rng(seed)
    shapes = {"qkv": (batch, length, 3 * heads * width), "q_bias": (1, heads, 1, width),
              "v_bias": (1, heads, 1, width), "pkT": (1, heads, width, 2 * length),
              "pqT": (1, heads, width, 2 * length)}
    feeds: dict[str, np.ndarray] = {n: rng.standard_normal(shape, dtype=np.float32) for n, shape in shapes.items()}
    feeds["scale"] = np.array(np.sqrt(width), dtype=np.float32)
    masked = rng.random((batch, 1, length, length) if mask_shape is None else mask_shape) < 1 / 3
    if masked.shape[-2] > 1:
        masked[..., -1, :] = True  # a padding row: every position left out
    feeds["masked"] = masked
    feeds["fill"] = np.array(np.finfo(np.float32).min, dtype=np.float32)
    return {name: feeds[name] for name in INPUTS}


#: How far the operator's context may be from :func:`disentangled_attention` (float32 sums in another order),
#: relative to its largest value's magnitude (at least 1).
TOLERANCE = 1e-5


def operator_session(path: str, threads: int) -> Any:
    """An ONNX Runtime CPU session of :func:`operator_model` with the operator library at ``path`` and ``threads``
    intra-op threads (0: ORT's default); ORT logs only its errors."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.register_custom_ops_library(path)
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    return ort.InferenceSession(operator_model(), options, providers=["CPUExecutionProvider"])


def _probe(path: str) -> None:
    session = operator_session(path, threads=2)
    feeds = random_inputs(2, 3, 37, 24, seed=0)
    if not within_tolerance(session.run(None, feeds)[0], disentangled_attention(**feeds)):
        raise RuntimeError("the probe's attention differs from NumPy's")


def within_tolerance(got: np.ndarray, want: np.ndarray) -> bool:
    """Whether the operator's ``got`` is :func:`disentangled_attention`'s ``want`` to :data:`TOLERANCE`."""
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    return got.shape == want.shape and bool(np.abs(got - want).max(initial=0.0) <= TOLERANCE * scale)


def attention_probabilities(q: np.ndarray, k: np.ndarray, pkT: np.ndarray, pqT: np.ndarray,  # noqa: N803
                            masked: np.ndarray, fill: float) -> np.ndarray:
    """NumPy's attention probabilities (float64): the softmax over ``j`` of ``where(masked, fill, scores)`` with
    ``scores[..., i, j] = qk[..., i, j] + c2p[..., i, L - 1 - i + j] + p2c[..., j, L - j + i]``, ``qk = q kᵀ``,
    ``c2p = q pkT``, ``p2c = k pqT`` (``q`` and ``k`` ``(..., L, d)``, ``pkT`` and ``pqT`` ``(..., d, 2L)``,
    broadcast), as the exported graph defines the two bands."""
    qk = q @ np.swapaxes(k, -1, -2)
    c2p = q @ pkT
    p2c = k @ pqT
    length = qk.shape[-1]
    i = np.arange(length)[:, None]
    j = np.arange(length)[None, :]
    scores = np.where(masked, fill, qk + c2p[..., i, length - 1 - i + j] + p2c[..., j, length - j + i])
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return np.asarray(scores / scores.sum(axis=-1, keepdims=True))


def disentangled_attention(qkv: np.ndarray, q_bias: np.ndarray, v_bias: np.ndarray, scale: np.ndarray,
                           pkT: np.ndarray, pqT: np.ndarray, masked: np.ndarray,  # noqa: N803
                           fill: np.ndarray) -> np.ndarray:
    """NumPy's ``DisentangledAttention`` (float64 sums, float32 result), as DeBERTa v1 computes it: ``qkv``
    ``(B, L, 3·H·d)`` split per head into ``q = (qkv_q + q_bias) / scale``, ``k`` and ``v = qkv_v + v_bias``;
    the context ``attention_probabilities(q, k, pkT, pqT, masked, fill) @ v``, heads side by side, ``(B, L, H·d)``
    (``H`` and ``d`` from ``pkT`` ``(..., H, d, 2L)``)."""
    heads, width = pkT.shape[-3], pkT.shape[-2]
    batch, length = qkv.shape[:2]
    split = qkv.astype(np.float64).reshape(batch, length, heads, 3 * width).transpose(0, 2, 1, 3)
    q = (split[..., :width] + q_bias.astype(np.float64).reshape(1, heads, 1, width)) / float(scale)
    k = split[..., width:2 * width]
    v = split[..., 2 * width:] + v_bias.astype(np.float64).reshape(1, heads, 1, width)
    probabilities = attention_probabilities(q, k, pkT.astype(np.float64), pqT.astype(np.float64), masked,
                                            float(np.asarray(fill).reshape(())))
    context = (probabilities @ v).transpose(0, 2, 1, 3).reshape(batch, length, heads * width)
    return np.asarray(context, dtype=np.float32)


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


def _perm(node: Any) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _swaps_last_axes(node: Any) -> bool:
    perm = _perm(node)
    return perm is not None and len(perm) >= 2 and perm[-2:] == [len(perm) - 1, len(perm) - 2] \
        and perm[:-2] == list(range(len(perm) - 2))


def _scores_operands(producer: dict[str, Any], qk: str, c2p: Any, p2c: Any) -> tuple[str, str, str, str] | None:
    """``(q, kT, pkT, pqT)`` when ``qk`` is ``MatMul(q, kT)`` with ``kT = Transpose(k)``, the c2p band's MatMul is
    ``MatMul(q, pkT)`` and the p2c band's ``MatMul(k, pqT)``; else None."""
    content = producer.get(qk)
    if content is None or content.op_type != "MatMul" or c2p.op_type != "MatMul" or p2c.op_type != "MatMul":
        return None
    q, kt = content.input
    transpose = producer.get(kt)
    if transpose is None or transpose.op_type != "Transpose" or not _swaps_last_axes(transpose):
        return None
    if c2p.input[0] != q or p2c.input[0] != transpose.input[0]:
        return None
    return q, kt, c2p.input[1], p2c.input[1]


def _only_reader(readers: dict[str, list[Any]], name: str, op: str, besides: str = "") -> Any | None:
    """The node that reads ``name`` when it is the only one (but for nodes of type ``besides``) and of type ``op``;
    else None."""
    nodes = [n for n in readers.get(name, []) if n.op_type != besides]
    return nodes[0] if len(nodes) == 1 and nodes[0].op_type == op else None


class _Graph:
    """What the pattern match reads of a graph: producers, readers and constant values by tensor name."""

    def __init__(self, graph: Any) -> None:
        self.producer = {out: node for node in graph.node for out in node.output}
        self.readers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        self._tensors = {i.name: i for i in graph.initializer}  # read as arrays only when asked: the weights stay put
        for node in graph.node:  # in graph order: an Identity of a constant follows it
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self._tensors[node.output[0]] = node.attribute[0].t
            elif node.op_type == "Identity" and node.input[0] in self._tensors:
                self._tensors[node.output[0]] = self._tensors[node.input[0]]

    def constant(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it is an initializer, a Constant or an Identity of one; else None."""
        from onnx import numpy_helper

        tensor = self._tensors.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)

    def op(self, name: str, op_type: str) -> Any | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def last_axis_slice(self, name: str) -> Any | None:
        """The Slice producing ``name`` when it slices the last axis of a rank-4 tensor; else None."""
        node = self.op(name, "Slice")
        if node is None or len(node.input) < 4:
            return None
        axes = self.constant(node.input[3])
        return node if axes is not None and axes.size == 1 and int(axes.reshape(())) in (-1, 3) else None

    def biased_slice(self, name: str) -> tuple[Any, str] | None:
        """``(Slice, bias)`` when ``name`` is ``Add`` of a last-axis Slice and another tensor; else None."""
        add = self.op(name, "Add")
        if add is None:
            return None
        for s in (0, 1):
            sliced = self.last_axis_slice(add.input[s])
            if sliced is not None:
                return sliced, add.input[1 - s]
        return None


def _masked_softmax(readers: dict[str, list[Any]], scores: str) -> tuple[Any, list[str]] | None:
    """``(Softmax node, [masked, fill])`` when ``scores`` is read only by ``Where(masked, fill, scores)`` and that
    only by a Softmax over the last axis (the exported graph's masked softmax); else None."""
    where = _only_reader(readers, scores, "Where")
    if where is None or list(where.input).index(scores) != 2:
        return None
    softmax = _only_reader(readers, where.output[0], "Softmax")
    if softmax is None or next((a.i for a in softmax.attribute if a.name == "axis"), None) != -1:
        return None
    return softmax, list(where.input[:2])


def _attention_operands(g: _Graph, q: str, kt: str, softmax: Any) -> tuple[list[str], Any, list[str]] | None:
    """``([qkv, q_bias, v_bias, scale], the heads' merging Reshape, the query's tensors from its Slice to q)`` when
    the layer around scores ``q·kT`` and
    probabilities ``softmax`` is DeBERTa v1's: ``q = (Slice_q(T) + q_bias) / scale``, ``kT = Transpose(Slice_k(T))``,
    context ``Reshape(Transpose(MatMul(softmax, Slice_v(T) + v_bias)))`` with ``T = Transpose(Reshape(qkv))`` the heads
    split; else None."""
    heads_first = [0, 2, 1, 3]
    divide = g.op(q, "Div")
    if divide is None:
        return None
    query = g.biased_slice(divide.input[0])
    key = g.last_axis_slice(g.producer[kt].input[0])
    values = _only_reader(g.readers, softmax.output[0], "MatMul")
    if query is None or key is None or values is None or values.input[0] != softmax.output[0]:
        return None
    value = g.biased_slice(values.input[1])
    merge_heads = _only_reader(g.readers, values.output[0], "Transpose")
    if value is None or merge_heads is None or _perm(merge_heads) != heads_first:
        return None
    merged = _only_reader(g.readers, merge_heads.output[0], "Reshape", besides="Shape")  # Shape: for the Reshape
    split = g.op(query[0].input[0], "Transpose")
    if merged is None or split is None or _perm(split) != heads_first \
            or not query[0].input[0] == key.input[0] == value[0].input[0]:
        return None
    reshape = g.op(split.input[0], "Reshape")
    if reshape is None:
        return None
    return [reshape.input[0], query[1], value[1], divide.input[1]], merged, [query[0].output[0], divide.input[0], q]


#: Where a layer's query shape is read (the scale's sqrt(d), the position span's L), a tensor that stays computed
#: and has that dimension at that index, by the index counted from the end: d from the query bias ``(1, H, 1, d)``,
#: L from ``qkv`` ``(B, L, 3·H·d)``.
_SHAPE_STAND_INS = {-1: 1, -2: 0}  # index -> position in the operands [qkv, q_bias]


def _picked_dim(g: _Graph, node: Any) -> int | None:
    """The one dimension (counted from the end of a rank-4 shape) that ``node``, a Gather or Slice on axis 0 of a
    shape with constant indices, takes; else None."""
    axes = [a.i for a in node.attribute if a.name == "axis"]
    values = [g.constant(name) for name in node.input[1:]]
    if any(v is None or v.size != 1 for v in values):
        return None
    ints = [int(v.reshape(())) for v in values if v is not None]
    if node.op_type == "Gather" and axes in ([], [0]) and len(ints) == 1:
        return ints[0] % 4 - 4
    if node.op_type == "Slice" and len(ints) in (2, 3, 4) and ints[2:3] in ([], [0]) and ints[3:4] in ([], [1]):
        start, end = (i + 4 if i < 0 else min(i, 4) for i in ints[:2])
        if end - start == 1:
            return start - 4
    return None


def _shape_rewires(g: _Graph, query: list[str], qkv: str, q_bias: str) -> list[tuple[Any, str]]:
    """``(Shape node, new input)`` for each Shape node that reads one of the ``query`` tensors (rank 4, ``(B, H, L,
    d)``) only for its d or its L: fed from a tensor the fused graph still computes (:data:`_SHAPE_STAND_INS`), the
    query's Slice and Transpose need not run for it."""
    bias = g.constant(q_bias)
    stand_ins = [qkv, q_bias if bias is not None and bias.ndim == 4 else None]
    rewires = []
    for name in query:
        for node in g.readers.get(name, []):
            if node.op_type != "Shape" or node.attribute:
                continue
            picked = {_picked_dim(g, reader) for reader in g.readers.get(node.output[0], [])}
            if len(picked) == 1 and (index := picked.pop()) in _SHAPE_STAND_INS \
                    and (stand_in := stand_ins[_SHAPE_STAND_INS[index]]) is not None:
                rewires.append((node, stand_in))
    return rewires


def fuse_attention(model: Any) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto`` exported with the relative shift) in place: each layer's
    self-attention, from the heads' split of the ``in_proj`` output ``qkv`` to their merge, with the scores
    ``Add(MatMul(q, kT), Add(band(MatMul(q, pkT)), Transpose(band(MatMul(k, pqT)))))`` and
    ``Softmax(Where(masked, fill, scores))``, becomes ``DisentangledAttention(qkv, q_bias, v_bias, scale, pkT, pqT,
    masked, fill)`` (run on the session's intra-op threads); the Shape nodes that read the query for its d or L read
    a tensor still computed instead, and the nodes only the old ones read are removed. Returns the number of layers
    fused (0 leaves the model unchanged: a graph without the shift's bands or without DeBERTa v1's attention around
    them)."""
    from onnx import helper

    graph = model.graph
    g = _Graph(graph)
    fused: list[tuple[Any, Any]] = []  # (the heads' merging Reshape, the new node)
    rewires: list[tuple[Any, str]] = []  # (a Shape node, its new input)
    for node in graph.node:
        if node.op_type != "Add":
            continue
        for k in (0, 1):
            inner = g.op(node.input[1 - k], "Add")
            if inner is None:
                continue
            scores = None
            for c in (0, 1):
                c2p = _chain(g.producer, inner.input[c], _BAND)
                transpose = g.op(inner.input[1 - c], "Transpose")
                if c2p is None or transpose is None or not _swaps_last_axes(transpose):
                    continue
                p2c = _chain(g.producer, transpose.input[0], _BAND)
                if p2c is not None:
                    scores = _scores_operands(g.producer, node.input[k], c2p[-1], p2c[-1])
                    break
            masking = _masked_softmax(g.readers, node.output[0]) if scores is not None else None
            attention = _attention_operands(g, scores[0], scores[1], masking[0]) \
                if scores is not None and masking is not None else None
            if scores is None or masking is None or attention is None:
                continue
            operands, merged, query = attention
            rewires += _shape_rewires(g, query, operands[0], operands[1])
            operands += [scores[2], scores[3], *masking[1]]
            fused.append((merged, helper.make_node(OP_TYPE, operands, [merged.output[0]],
                                                   name=f"{node.name}/{OP_TYPE}", domain=DOMAIN)))
            break
    if not fused:
        return 0
    for shape, stand_in in rewires:  # its output's length changes with the rank: drop what the export recorded of it
        shape.input[0] = stand_in
    recorded = {shape.output[0] for shape, _ in rewires}
    kept_info = [v for v in graph.value_info if v.name not in recorded]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    replace = {id(old): new for old, new in fused}
    nodes = [replace.get(id(n), n) for n in graph.node]
    outputs = {o.name for o in graph.output}
    while True:  # drop what nothing reads any more: the old head split, products, chains, masking and merge
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
