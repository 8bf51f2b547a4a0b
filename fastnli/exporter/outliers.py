"""Take activation outliers out of the dynamically quantized MatMuls of a BERT/DeBERTa graph (INT8 recipes with an
``"outliers"`` section).

Dynamic INT8 quantizes a MatMul's input with one scale for the whole tensor. In a BERT feed-forward block a few
inputs are far larger than the rest (measured on the embedded default model: the largest channel of the FFN input
14x the median channel's range, the largest GELU output 14x), so they take the 8-bit range and every other value
gets a handful of levels. Both outlier kinds are moved to small fp32 side branches, exact in fp32:

- ``ffn_neurons`` (k): the k feed-forward neurons with the largest GELU outputs on the calibration set get their own
  branch (input projection, activation, output projection, fp32); the main block keeps the other neurons, so the
  input of its INT8 output projection no longer contains them.
- ``input_channels`` (c): the c channels of the FFN input (a LayerNorm output, also the residual stream, so it
  cannot be rescaled in place) with the largest magnitude are zeroed before the INT8 input projection and added
  back by a c-row fp32 MatMul.
- ``attention_channels`` (a, default 0): the same for the input of a layer's query, key and value projections (the
  previous layer's output LayerNorm: the residual stream, with the same outlier channels), taken out once for the
  three projections that read it.
- ``channel_split`` (static ranges only): instead of that fp32 branch, each of the c (or a) channels is split into
  ``m`` copies of ``x / m`` appended to the input (``m`` chosen so that a copy fits the range of the other channels),
  and the weight row is repeated ``m`` times; the INT8 projections then see no outlier. With the dither of
  :func:`set_split_dither` the copies lose nothing to rounding. This runs in the INT8 GEMM (a few more rows of the
  reduction) and saves the fp32 branch's full-width add, which cost about 8% of the static graph's time.

The fp32 graph with the branches computes the same function as the original (to float rounding); only its INT8
version differs. The branches cost k/width and c/hidden of the FFN's FLOPs, in fp32.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

#: Name patterns of the two projections of a feed-forward block (BERT and DeBERTa export names); group 1 is the
#: layer index.
FFN_IN = re.compile(r"/layer\.(\d+)/intermediate/dense/MatMul$")
FFN_OUT = re.compile(r"/layer\.(\d+)/output/dense/MatMul$")

#: Name pattern of the query, key and value projections of a layer's attention (BERT; DeBERTa v1's ``in_proj``,
#: v2/v3's ``*_proj``); group 1 is the layer index. They read one input: the previous layer's output LayerNorm.
ATTENTION_IN = re.compile(r"/layer\.(\d+)/attention/self/(?:query|key|value|in_proj|query_proj|key_proj|value_proj)"
                          r"/MatMul$")

#: Names of the side-branch MatMuls, which must stay fp32 (``to_int8`` excludes them from quantization).
BRANCH_TAG = "/fastnli_outliers/"

#: Channel split: a copy may use this fraction of the other channels' largest magnitude (the rest is headroom for
#: the dither and for calibration text that was not seen).
SPLIT_MARGIN = 0.9
#: Names (after a split's tag) of the split's widened input and of its dither constant.
SPLIT_CONCAT = "Concat_split"
SPLIT_DITHER = "split_dither"
#: The tag of a layer's attention-input split, after the layer's own (``/layer.N`` + ``BRANCH_TAG``).
ATTENTION_TAG = "attention/"
#: The splits of a layer: (part of the tag after ``BRANCH_TAG``, prefix of the record's keys).
SPLITS = (("", ""), (ATTENTION_TAG, "attention_"))


def _max_abs(model: Any, tensors: list[str], feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-channel (last axis) max |value| of ``tensors`` over the real tokens of ``feeds`` (fp32, on CPU)."""
    from fastnli.exporter.calibration import activations

    if not feeds:
        raise ValueError("outlier split: the calibration set is empty")
    seen: dict[str, np.ndarray] = {}
    for t, a, _ in activations(model, tensors, feeds):
        m = np.abs(a).max(0)
        seen[t] = np.maximum(seen[t], m) if t in seen else m
    return seen


class _Graph:
    """The few graph edits the split needs: constants, producers, new nodes and a topological sort."""

    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        self.g = model.graph
        self.inits = {i.name: i for i in self.g.initializer}
        self.consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t)
                       for n in self.g.node if n.op_type == "Constant" and n.attribute[0].name == "value"}
        self.producer = {o: n for n in self.g.node for o in n.output}
        self.new: list[Any] = []

    def array(self, name: str) -> np.ndarray | None:
        from onnx import numpy_helper

        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        return self.consts.get(name)

    def put(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        tensor = numpy_helper.from_array(np.ascontiguousarray(value), name)
        if name in self.inits:
            self.inits[name].CopyFrom(tensor)
        else:
            self.g.initializer.append(tensor)
            self.inits[name] = tensor
        return name

    def node(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        from onnx import helper

        self.new.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def add_after_bias(self, matmul: Any, side: str, name: str) -> None:
        """Add ``side`` to the result of ``matmul``, after its bias ``Add`` when one follows, so that the bias can
        still fold into the quantized MatMul (:mod:`fastnli.exporter.qdq_fusion`)."""
        users = [n for n in self.g.node if matmul.output[0] in n.input]
        target = matmul
        if len(users) == 1 and users[0].op_type == "Add" and any(self.array(i) is not None for i in users[0].input):
            target = users[0]
        total = target.output[0]
        target.output[0] = total + "/main"
        self.node("Add", [total + "/main", side], name)
        self.new[-1].output[0] = total

    def finish(self) -> None:
        """Append the new nodes and sort the graph topologically (ONNX requires producers first)."""
        self.g.node.extend(self.new)
        ready = {i.name for i in self.g.input} | set(self.inits) | {""}
        pending, ordered = list(self.g.node), []
        while pending:
            rest = []
            for n in pending:
                if all(i in ready for i in n.input):
                    ordered.append(n)
                    ready.update(n.output)
                else:
                    rest.append(n)
            if len(rest) == len(pending):
                raise RuntimeError(f"outlier split left a cycle or a missing input at {rest[0].name}")
            pending = rest
        del self.g.node[:]
        self.g.node.extend(ordered)
        used = {i for n in ordered for i in n.input} | {o.name for o in self.g.output}
        kept = [t for t in self.g.initializer if t.name in used]  # the replaced originals go
        del self.g.initializer[:]
        self.g.initializer.extend(kept)


def _activation_nodes(g: _Graph, ffn_in: Any, ffn_out: Any) -> list[Any]:
    """The nodes between the FFN input projection's output and the output projection's input (bias add, GELU), in
    graph order. Their inputs must come from that projection, from each other or from constants."""
    seen: set[str] = set()
    todo = [ffn_out.input[0]]
    while todo:
        tensor = todo.pop()
        if tensor == ffn_in.output[0] or g.array(tensor) is not None:
            continue
        node = g.producer.get(tensor)
        if node is None or node.op_type in ("MatMul", "Gemm") or len(seen) > 64:
            raise ValueError(f"outlier split: the activation between {ffn_in.name} and {ffn_out.name} reads "
                             f"{tensor!r}, which is neither that projection's output nor a constant")
        if node.name not in seen:
            seen.add(node.name)
            todo.extend(node.input)
    return [n for n in g.g.node if n.name in seen]


def _move_channels(g: _Graph, readers: list[Any], x: np.ndarray, c: int, split: bool, tag: str, layer: int,
                   option: str) -> dict[str, Any]:
    """Take the ``c`` channels of largest magnitude out of the input that the MatMuls ``readers`` share (its
    per-channel ranges ``x``): as ``m`` split copies each (``split``) or into one fp32 side branch per reader.
    Returns the record's ``channels``, ``channel_copies`` (split) and ``input_range_ratio``."""
    channels = np.sort(np.argsort(-x, kind="stable")[:c])
    mask = np.ones(x.shape, dtype=np.float32)
    mask[channels] = 0.0
    src = readers[0].input[0]
    picked = g.node("Gather", [src, g.put(tag + "channel_idx", channels.astype(np.int64))], tag + "Gather_channels",
                    axis=-1)
    moved: dict[str, Any] = {"channels": channels.tolist()}
    if split:
        # every outlier channel becomes m copies of x/m, so that each fits the range of the other channels
        rest = float((x * mask).max())
        if rest <= 0.0:
            raise ValueError(f"outlier split: {option}={c} leaves layer {layer} no other channel with a range to "
                             f"fit the copies into; give fewer {option}")
        copies = np.maximum(np.ceil(x[channels] / (SPLIT_MARGIN * rest)), 1).astype(np.int64)
        reps = np.repeat(channels, copies)
        # gather the c channels, then a (c, copies) matrix of 1/m entries makes the scaled copies
        spread = np.zeros((c, reps.size), np.float32)
        spread[np.repeat(np.arange(c), copies), np.arange(reps.size)] = np.repeat(1.0 / copies, copies)
        spread_out = g.node("MatMul", [picked, g.put(tag + "channel_spread", spread)], tag + "MatMul_spread")
        dithered = g.node("Add", [spread_out, g.put(tag + SPLIT_DITHER, np.zeros(reps.size, np.float32))],
                          tag + "Add_dither")
        # the channels stay in place, unmasked: their weight rows are zero, so the clipping of the fixed range (set
        # without them, see clipped_channels) costs nothing
        widened = g.node("Concat", [src, dithered], tag + SPLIT_CONCAT, axis=-1)
        for j, reader in enumerate(readers):
            w = g.array(reader.input[1])
            assert w is not None
            reader.input[0] = widened
            reader.input[1] = g.put(f"{tag}w_{j}/split", np.concatenate([w * mask[:, None], w[reps]]))
        moved["channel_copies"] = copies.tolist()
    else:
        masked = g.node("Mul", [src, g.put(tag + "channel_mask", mask)], tag + "Mul_mask")
        for j, reader in enumerate(readers):
            w = g.array(reader.input[1])
            assert w is not None
            reader.input[0] = masked
            side = g.node("MatMul", [picked, g.put(f"{tag}w_{j}/channels", w[channels])], f"{tag}MatMul_channels_{j}")
            reader.input[1] = g.put(f"{tag}w_{j}/masked", w * mask[:, None])
            g.add_after_bias(reader, side, f"{tag}Add_channels_{j}")
    moved["input_range_ratio"] = [round(float(x.max() / np.median(x)), 2),
                                  round(float((x * mask).max() / np.median(x)), 2)]
    return moved


def split_outliers(model: Any, spec: dict[str, Any], feeds: list[dict[str, np.ndarray]],
                   fp32: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Rewrite ``model`` (an ``onnx.ModelProto``, in place) as described in the module docstring.

    Args:
        model: the fp32 graph.
        spec: ``{"ffn_neurons": k, "input_channels": c}`` (either may be 0), optionally ``"attention_channels": a``
            (default 0) and ``"channel_split": True``.
        feeds: calibration batches (the graph's input dicts) the outliers are measured on.
        fp32: names of MatMuls that stay fp32: an FFN projection named here keeps its outliers (neurons for the
            output projection, channels for the input projection), and a layer with an attention input projection
            named here keeps its attention input's channels.

    Returns:
        A record for the manifest: per layer the neurons and channels moved (with a split, the copies of each
        channel; ``attention_``-prefixed keys for the attention input) and the input range ratios (largest channel /
        median channel) of the INT8 MatMuls before and after.

    Raises:
        ValueError: when the graph has no feed-forward blocks by the BERT/DeBERTa export names, or ``feeds`` is
        empty.
    """
    k, c = int(spec.get("ffn_neurons", 0)), int(spec.get("input_channels", 0))
    split = bool(spec.get("channel_split", False))
    g = _Graph(model)
    layers: dict[int, dict[str, Any]] = {}
    attention: dict[int, list[Any]] = {}
    for n in g.g.node:
        if n.op_type != "MatMul" or n.input[1] not in g.inits:
            continue
        for key, pattern in (("in", FFN_IN), ("out", FFN_OUT)):
            m = pattern.search(n.name)
            if m:
                layers.setdefault(int(m.group(1)), {})[key] = n
        m = ATTENTION_IN.search(n.name)
        if m:
            attention.setdefault(int(m.group(1)), []).append(n)
    layers = {i: L for i, L in layers.items() if len(L) == 2}
    if not layers:
        raise ValueError("outlier split: no feed-forward MatMuls named like BERT/DeBERTa exports "
                         f"({FFN_IN.pattern}, {FFN_OUT.pattern})")
    a = int(spec.get("attention_channels", 0))
    # a layer's projections are split together when they share one input and none stays fp32
    attention = {i: r for i, r in attention.items()
                 if a and len({n.input[0] for n in r}) == 1 and not any(n.name in fp32 for n in r)}
    tensors = sorted({L["out"].input[0] for L in layers.values()} | {L["in"].input[0] for L in layers.values()}
                     | {r[0].input[0] for r in attention.values()})
    ranges = _max_abs(model, tensors, feeds)
    record: dict[str, Any] = {"ffn_neurons": k, "input_channels": c, "channel_split": split,
                              "calibration_batches": len(feeds), "layers": {}}
    if a:
        record["attention_channels"] = a
    for i, L in sorted(layers.items()):
        ffn_in, ffn_out = L["in"], L["out"]
        k = 0 if ffn_out.name in fp32 else int(spec.get("ffn_neurons", 0))
        c = 0 if ffn_in.name in fp32 else int(spec.get("input_channels", 0))
        chain = _activation_nodes(g, ffn_in, ffn_out)
        w1, w2 = g.array(ffn_in.input[1]), g.array(ffn_out.input[1])
        assert w1 is not None and w2 is not None
        width = w1.shape[1]
        act, x = ranges[ffn_out.input[0]], ranges[ffn_in.input[0]]
        neurons = np.sort(np.argsort(-act, kind="stable")[:k])
        keep = np.setdiff1d(np.arange(width), neurons)
        entry: dict[str, Any] = {
            "neurons": neurons.tolist(), "channels": [],
            "ffn_out_input_range_ratio": [round(float(act.max() / np.median(act)), 2),
                                          round(float(act[keep].max() / np.median(act)), 2)],
        }
        tag = f"/layer.{i}{BRANCH_TAG}"
        if k:
            # the side branch: the chosen neurons' input projection, a copy of the activation, output projection
            renamed = {ffn_in.output[0]: g.node("MatMul", [ffn_in.input[0], g.put(tag + "w_in", w1[:, neurons])],
                                                tag + "MatMul_in")}
            for node in chain:
                args = []
                for name in node.input:
                    v = g.array(name)
                    if v is None:
                        args.append(renamed[name])
                    elif v.ndim and v.shape[-1] == width:  # a per-neuron constant (the bias): split it
                        if name not in g.inits:
                            raise ValueError(f"outlier split: per-neuron constant {name!r} is not an initializer")
                        local = tag + name.strip("/").replace("/", "_")
                        args.append(g.put(local, v[..., neurons]))
                        # the main block's copy under a name of its own: exporters share equal constants
                        node.input[list(node.input).index(name)] = g.put(local + "/main", v[..., keep])
                    else:
                        args.append(name)
                out = g.node(node.op_type, args, tag + node.name.strip("/").replace("/", "_"), domain=node.domain)
                g.new[-1].attribute.extend(node.attribute)
                renamed[node.output[0]] = out
            h = renamed[ffn_out.input[0]]
            side = g.node("MatMul", [h, g.put(tag + "w_out", w2[neurons])], tag + "MatMul_out")
            ffn_in.input[1] = g.put(tag + "w_in/main", w1[:, keep])
            ffn_out.input[1] = g.put(tag + "w_out/main", w2[keep])
            g.add_after_bias(ffn_out, side, tag + "Add_out")
            w1 = w1[:, keep]
        if c:
            entry.update(_move_channels(g, [ffn_in], x, c, split, tag, i, "input_channels"))
            entry["ffn_in_input_range_ratio"] = entry.pop("input_range_ratio")
        readers = attention.get(i, [])
        if readers:
            moved = _move_channels(g, readers, ranges[readers[0].input[0]], a, split, tag + ATTENTION_TAG, i,
                                   "attention_channels")
            entry.update({f"attention_{key}": value for key, value in moved.items()})
        record["layers"][str(i)] = entry
    g.finish()
    return record


def clipped_channels(record: dict[str, Any]) -> dict[str, list[int]]:
    """Per widened input of a channel split (FFN or attention; ``record``: what :func:`split_outliers` returned),
    the channels whose weight rows are zero: a fixed activation range must be measured without them."""
    return {f"/layer.{i}{BRANCH_TAG}{sub}{SPLIT_CONCAT}": e[prefix + "channels"]
            for i, e in record.get("layers", {}).items() for sub, prefix in SPLITS if prefix + "channel_copies" in e}


def set_split_dither(model: Any, record: dict[str, Any]) -> int:
    """Give the copies of each split channel their dither, in place, once ``model`` (QDQ, static ranges) fixes the
    scale ``s`` of the widened FFN input; returns the layers set.

    The ``m`` copies of ``x / m`` get the offsets ``(2j + 1 - m) / (2m) * s``, ``j = 0 .. m-1``, which sum to 0, so the
    fp32 function does not change. Rounded to the scale, the copies then sum to ``round(x / s)`` (Hermite's identity
    ``sum_j floor(t + j/m) = floor(m t)``): the channel keeps the precision of the other channels' scale instead of
    ``m`` times its rounding error.

    Raises:
        ValueError: when a split layer's widened input has no ``QuantizeLinear`` with a constant scale.
    """
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    quantizer = {n.input[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear"}
    done = 0
    for i, e in record.get("layers", {}).items():
        for sub, prefix in SPLITS:
            if prefix + "channel_copies" not in e:
                continue
            tag = f"/layer.{i}{BRANCH_TAG}{sub}"
            q = quantizer.get(tag + SPLIT_CONCAT)
            if q is None or q.input[1] not in inits or tag + SPLIT_DITHER not in inits:
                raise ValueError(f"channel split of layer {i}: {tag + SPLIT_CONCAT!r} is not quantized with a fixed "
                                 "scale")
            scale = float(numpy_helper.to_array(inits[q.input[1]]))
            copies = e[prefix + "channel_copies"]
            offsets = np.concatenate([(2 * np.arange(m) + 1 - m) / (2 * m) for m in copies]) * scale
            inits[tag + SPLIT_DITHER].CopyFrom(numpy_helper.from_array(offsets.astype(np.float32), tag + SPLIT_DITHER))
            done += 1
    return done
