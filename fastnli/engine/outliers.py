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

#: Names of the side-branch MatMuls, which must stay fp32 (``to_int8`` excludes them from quantization).
BRANCH_TAG = "/fastnli_outliers/"


def _max_abs(model: Any, tensors: list[str], feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-channel (last axis) max |value| of ``tensors`` over the real tokens of ``feeds`` (fp32, on CPU)."""
    from fastnli.engine.static_int8 import activations

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


def split_outliers(model: Any, spec: dict[str, Any], feeds: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """Rewrite ``model`` (an ``onnx.ModelProto``, in place) as described in the module docstring.

    Args:
        model: the fp32 graph.
        spec: ``{"ffn_neurons": k, "input_channels": c}`` (either may be 0).
        feeds: calibration batches (the graph's input dicts) the outliers are measured on.

    Returns:
        A record for the manifest: per layer the neurons and channels moved and the input range ratios (largest
        channel / median channel) of the INT8 MatMuls before and after.

    Raises:
        ValueError: when the graph has no feed-forward blocks by the BERT/DeBERTa export names, or ``feeds`` is
        empty.
    """
    k, c = int(spec.get("ffn_neurons", 0)), int(spec.get("input_channels", 0))
    g = _Graph(model)
    layers: dict[int, dict[str, Any]] = {}
    for n in g.g.node:
        for key, pattern in (("in", FFN_IN), ("out", FFN_OUT)):
            m = pattern.search(n.name)
            if n.op_type == "MatMul" and m and n.input[1] in g.inits:
                layers.setdefault(int(m.group(1)), {})[key] = n
    layers = {i: L for i, L in layers.items() if len(L) == 2}
    if not layers:
        raise ValueError("outlier split: no feed-forward MatMuls named like BERT/DeBERTa exports "
                         f"({FFN_IN.pattern}, {FFN_OUT.pattern})")
    tensors = sorted({L["out"].input[0] for L in layers.values()} | {L["in"].input[0] for L in layers.values()})
    ranges = _max_abs(model, tensors, feeds)
    record: dict[str, Any] = {"ffn_neurons": k, "input_channels": c, "calibration_batches": len(feeds), "layers": {}}
    for i, L in sorted(layers.items()):
        ffn_in, ffn_out = L["in"], L["out"]
        chain = _activation_nodes(g, ffn_in, ffn_out)
        w1, w2 = g.array(ffn_in.input[1]), g.array(ffn_out.input[1])
        assert w1 is not None and w2 is not None
        width = w1.shape[1]
        act, x = ranges[ffn_out.input[0]], ranges[ffn_in.input[0]]
        neurons = np.sort(np.argsort(-act, kind="stable")[:k])
        keep = np.setdiff1d(np.arange(width), neurons)
        channels = np.sort(np.argsort(-x, kind="stable")[:c])
        entry: dict[str, Any] = {
            "neurons": neurons.tolist(), "channels": channels.tolist(),
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
            main = ffn_out.output[0] + "/main"
            total = ffn_out.output[0]
            ffn_out.output[0] = main
            g.node("Add", [main, side], tag + "Add_out")
            g.new[-1].output[0] = total
            w1 = w1[:, keep]
        if c:
            mask = np.ones(x.shape, dtype=np.float32)
            mask[channels] = 0.0
            src = ffn_in.input[0]
            masked = g.node("Mul", [src, g.put(tag + "channel_mask", mask)], tag + "Mul_mask")
            picked = g.node("Gather", [src, g.put(tag + "channel_idx", channels.astype(np.int64))],
                            tag + "Gather_channels", axis=-1)
            side = g.node("MatMul", [picked, g.put(tag + "w_channels", w1[channels])], tag + "MatMul_channels")
            ffn_in.input[1] = g.put(tag + "w_in/masked", w1 * mask[:, None])
            ffn_in.input[0] = masked
            main = ffn_in.output[0] + "/main"
            total = ffn_in.output[0]
            ffn_in.output[0] = main
            g.node("Add", [main, side], tag + "Add_channels")
            g.new[-1].output[0] = total
            entry["ffn_in_input_range_ratio"] = [round(float(x.max() / np.median(x)), 2),
                                                 round(float((x * mask).max() / np.median(x)), 2)]
        record["layers"][str(i)] = entry
    g.finish()
    return record
