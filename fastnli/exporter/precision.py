"""Turn the exported fp32 ONNX graph into the FP16 graph (GPU) and the INT8 graph (CPU).

FP16 (``to_fp16``):
    - Float constants and initializers beyond the half-precision range are clamped to ±65504 first. DeBERTa's
      attention masks use ``torch.finfo(float32).min`` (-3.4e38), which would become -inf in half precision and turn
      a fully masked softmax row into NaN.
    - Graph inputs and outputs stay fp32/int64 (``keep_io_types``), so callers feed and read the same arrays for
      every precision.
    - Ops that are unsafe in half precision stay in fp32 (:data:`FP16_OP_BLOCK_LIST`): the unfused LayerNorm of
      DeBERTa (``ReduceMean``/``Pow``/``Sqrt``: a variance overflows 65504 once activations pass 256), ``Softmax``
      and ``Erf`` (GELU), and the position-bucket arithmetic (``Log``/``Exp``/``Sign``/``Abs``/``Ceil``/``Floor``).

INT8 (``to_int8``):
    Dynamic quantization (weights int8 per output channel, activations quantized per batch at run time) of the
    ``MatMul``/``Gemm`` weights, the bulk of DeBERTa's compute; VNNI/AMX kernels run them on x86 CPUs. The
    embedding tables stay fp32: they are gathers, not GEMMs, and quantizing them costs accuracy for no speed.

    A recipe with a ``"blockwise"`` section first turns the MatMuls whose node names match its patterns into ORT's
    ``MatMulNBits`` (8-bit weights in blocks along the reduction axis, int8 compute that quantizes the activations
    per row and block at run time). Per-tensor activation scales are what costs agreement: the inputs of a BERT
    FFN carry a few channels ~20x larger than the rest, which take the whole 8-bit range. Blocks confine them.
    With ``op_types`` empty nothing else is quantized (``Gemm`` heads stay fp32). No scale then spans more than
    one row, so a pair's probabilities no longer depend on the other pairs of its batch (beyond the float rounding
    that padding to another length brings, < 1e-6). Dynamic INT8 takes one activation scale over the whole batch,
    padding included, so its probabilities move with batch composition.

    A recipe with an ``"outliers"`` section moves the FFN's outlier neurons and input channels to fp32 side
    branches first (:mod:`fastnli.exporter.outliers`); ``"method": "static"`` then fixes every activation range at
    export time (:mod:`fastnli.exporter.static_int8`): batch-invariant like ``blockwise``, on the fast int8 GEMMs of
    the dynamic recipe. Both calibrate on ``calibration`` batches (:func:`needs_calibration`). ``"channel_split"``
    (static only) turns the outlier channels into dithered copies inside the INT8 GEMM instead of an fp32 branch.
    :data:`INT8_RECIPES` names the recipes ``fastnli export --int8-recipe`` offers.

    A recipe's ``"fp32_matmuls"`` (regexes of node names; not with ``"blockwise"``) keeps the matching MatMuls in
    fp32; an outlier split leaves the outliers of a kept FFN projection in place. A static recipe's
    ``"weight_rounding"`` section chooses the int8 weights on the quantizer's grid by GPTQ instead of rounding each
    to nearest (:mod:`fastnli.exporter.weight_rounding`): the same graph and speed, closer to fp32.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("fastnli")

FP16_MAX = 65504.0
FP16_OP_BLOCK_LIST: tuple[str, ...] = (
    "ReduceMean", "Pow", "Sqrt", "Softmax", "Erf", "Log", "Exp", "Sign", "Abs", "Ceil", "Floor",
)

#: The INT8 recipe used by default (recorded in the manifest).
INT8_RECIPE: dict[str, Any] = {
    "method": "dynamic",
    "weight_type": "QInt8",
    "per_channel": True,
    "reduce_range": False,
    "op_types": ["MatMul", "Gemm"],
    "extra_options": {"MatMulConstBOnly": True},
}


#: MatMuls of the feed-forward block of every layer (BERT and DeBERTa export names), the inputs with the channel
#: outliers.
FFN_MATMULS = (r"/layer\.\d+/intermediate/dense/MatMul$", r"/layer\.\d+/output/dense/MatMul$")
_BLOCKS: dict[str, Any] = {"bits": 8, "block_size": 128, "accuracy_level": 4}
_OUTLIERS: dict[str, Any] = {"ffn_neurons": 8, "input_channels": 6}
#: The static recipe's split: besides the FFN's, the attention input's outlier channels, and 32 FFN neurons in fp32
#: (chosen on the stage-6 default model, docs/export.md: mean |Δp| against fp32 0.0037 → 0.0028 on snli/dev at the
#: same speed).
STATIC_OUTLIERS: dict[str, Any] = {"ffn_neurons": 32, "input_channels": 6, "attention_channels": 6,
                                   "channel_split": True}
_STATIC: dict[str, Any] = {**INT8_RECIPE, "method": "static", "op_types": ["MatMul"], "static": {"percentile": 99.999},
                           "outliers": STATIC_OUTLIERS}

#: Named INT8 recipes. Measured on a MiniLM NLI model of the embedded default model's shape, trained without R-Drop
#: (full snli/dev, 2 CPU streams; "order" scores the first 4,000 pairs forwards and reversed, which changes the
#: batches the scheduler forms of equal-length pairs), ``static`` with the FFN split alone (8 neurons, 6 channels;
#: the attention split is measured in docs/export.md). On the shipped weights (trained with R-Drop) ``static``
#: agrees on 99.28%, ``dynamic`` on 98.40%:
#:
#: ==============  =================  =======  ==========================================
#: recipe          agreement w/ fp32  pairs/s  order moves |Δp| by up to (labels flipped)
#: ==============  =================  =======  ==========================================
#: dynamic         97.80%             856      0.27 (76 of 4,000)
#: outlier-split   99.23%             755      0.18 (36 of 4,000)
#: static          99.36%             818-837  0 (bit-identical)
#: ffn-blockwise   99.34%             560      0.18 (29 of 4,000)
#: blockwise       99.49%             457      0 (bit-identical)
#: ==============  =================  =======  ==========================================
#:
#: ``dynamic`` (the export default: fastest, needs no calibration), ``outlier-split`` (dynamic, the FFN's outliers
#: in fp32 branches), ``static`` (outlier split of the FFN and the attention input with the channels as dithered
#: copies + fixed activation ranges: a pair scores the same in any batch),
#: ``static-gptq`` (``static`` with the int8 weights chosen by GPTQ against the rounded inputs; measured on the
#: stage-6 default model in docs/export.md), ``ffn-blockwise`` (the FFN MatMuls blockwise, the rest dynamic),
#: ``blockwise`` (every weight MatMul blockwise,
#: nothing per tensor: a pair scores the same in any batch). The calibrating recipes use the probe set unless
#: ``export(calibration_pairs=...)`` gives pairs of the user's own domain.
INT8_RECIPES: dict[str, dict[str, Any]] = {
    "dynamic": INT8_RECIPE,
    "ffn-blockwise": {**INT8_RECIPE, "blockwise": {**_BLOCKS, "match": list(FFN_MATMULS)}},
    "blockwise": {**INT8_RECIPE, "method": "blockwise", "op_types": [],
                  "blockwise": {**_BLOCKS, "match": [r"MatMul$"]}},
    "outlier-split": {**INT8_RECIPE, "outliers": {**_OUTLIERS}},
    "static": _STATIC,
    "static-gptq": {**_STATIC, "weight_rounding": {"method": "gptq", "inputs": "quantized"}},
}


def blockwise_matmuls(src: str | Path, dst: str | Path, spec: dict[str, Any]) -> int:
    """Write ``src`` to ``dst`` with the constant-weight MatMuls whose names match ``spec["match"]`` (regexes) as
    8-bit blockwise ``MatMulNBits``; returns how many were converted.

    Raises:
        ValueError: when no MatMul matches (a recipe that silently changed nothing would be mislabelled).
    """
    import re

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(src))
    consts = {i.name for i in model.graph.initializer}
    weight_matmuls = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in consts]
    patterns = [re.compile(p) for p in spec["match"]]
    chosen = {n for n in weight_matmuls if any(p.search(n) for p in patterns)}
    if not chosen:
        raise ValueError(f"blockwise INT8: no MatMul of {src} matches {spec['match']}")
    # The quantizer converts every MatMul of its op types that is not excluded: exclude all but the chosen.
    q = MatMulNBitsQuantizer(model, bits=int(spec["bits"]), block_size=int(spec["block_size"]), is_symmetric=True,
                             accuracy_level=int(spec["accuracy_level"]), op_types_to_quantize=("MatMul",),
                             nodes_to_exclude=[n for n in weight_matmuls if n not in chosen])
    q.process()
    q.model.save_model_to_file(str(dst), use_external_data_format=False)
    return len(chosen)


def clamp_fp16_range(model: Any) -> int:
    """Clamp float initializers and constants of ``model`` (an ``onnx.ModelProto``) to ±65504, in place.

    Returns:
        The number of tensors that held out-of-range values.
    """
    import onnx
    from onnx import numpy_helper

    def fix(tensor: Any) -> bool:
        if tensor.data_type != onnx.TensorProto.FLOAT:
            return False
        arr = numpy_helper.to_array(tensor)
        if arr.size == 0 or np.all(np.abs(arr[np.isfinite(arr)]) <= FP16_MAX):
            return False
        clamped = np.clip(arr, -FP16_MAX, FP16_MAX).astype(np.float32)
        tensor.CopyFrom(numpy_helper.from_array(clamped, tensor.name))
        return True

    count = 0

    def walk(graph: Any) -> None:
        nonlocal count
        for init in graph.initializer:
            count += fix(init)
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    count += fix(attr.t)
                elif attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        walk(g)

    walk(model.graph)
    return count


def to_fp16(src: str | Path, dst: str | Path) -> dict[str, Any]:
    """Write the FP16 graph of the fp32 graph ``src`` to ``dst``; returns the recipe recorded in the manifest."""
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = onnx.load(str(src))
    clamped = clamp_fp16_range(model)
    # Blocked by node name, top-level graph only: ORT's converter places the fp32 casts of a blocked node inside an
    # If-subgraph in the main graph, which yields an invalid model (seen on DeBERTa-v2's position buckets). Nodes in
    # subgraphs (a handful of shape/bucket scalars) therefore run in fp16.
    nodes = [n.name for n in model.graph.node if n.op_type in FP16_OP_BLOCK_LIST]
    model16 = convert_float_to_float16(model, keep_io_types=True, op_block_list=list(DEFAULT_OP_BLOCK_LIST),
                                       node_block_list=nodes)
    onnx.save(model16, str(dst))
    logger.info("fp16 graph written to %s (%d out-of-range constants clamped)", dst, clamped)
    return {"keep_io_types": True, "op_block_list": list(FP16_OP_BLOCK_LIST), "fp32_nodes": len(nodes),
            "clamped_constants": clamped}


def fp16_embeddings(path: str | Path, min_elements: int = 1 << 20) -> int:
    """Store the large embedding tables of the graph at ``path`` in fp16, in place, with a Cast back to fp32 after
    each lookup. Halves their size at a much smaller accuracy cost than 8-bit tables; returns the tables converted.
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    converted = 0
    new_nodes = []
    for node in model.graph.node:
        new_nodes.append(node)
        table = inits.get(node.input[0]) if node.op_type == "Gather" else None
        if table is None or table.data_type != onnx.TensorProto.FLOAT:
            continue
        arr = numpy_helper.to_array(table)
        if arr.size < min_elements:
            continue
        table.CopyFrom(numpy_helper.from_array(arr.astype(np.float16), table.name))
        out = node.output[0]
        node.output[0] = f"{out}_fp16"
        new_nodes.append(helper.make_node("Cast", [f"{out}_fp16"], [out], to=onnx.TensorProto.FLOAT,
                                          name=f"{node.name}_cast_fp32"))
        converted += 1
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    onnx.save(model, str(path))
    return converted


def fp32_matmuls(model: Any, patterns: list[str]) -> list[str]:
    """Names of the MatMuls of ``model`` (an ``onnx.ModelProto``) that match one of ``patterns`` (regexes): those a
    recipe's ``"fp32_matmuls"`` keeps in fp32.

    Raises:
        ValueError: when a pattern matches no MatMul (a recipe that silently kept nothing would be mislabelled).
    """
    import re

    names = [n.name for n in model.graph.node if n.op_type == "MatMul"]
    for p in patterns:
        if not any(re.search(p, n) for n in names):
            raise ValueError(f"INT8 recipe: fp32_matmuls pattern {p!r} matches no MatMul of the graph")
    return [n for n in names if any(re.search(p, n) for p in patterns)]


def needs_calibration(recipe: dict[str, Any] | None) -> bool:
    """True when ``to_int8`` needs calibration batches for ``recipe`` (static ranges or an outlier split)."""
    return recipe is not None and (recipe.get("method") == "static" or "outliers" in recipe)


def to_int8(src: str | Path, dst: str | Path, recipe: dict[str, Any] | None = None,
            calibration: list[dict[str, np.ndarray]] | None = None) -> dict[str, Any]:
    """Write the INT8 graph of ``src`` to ``dst``; returns the recipe used, with what it measured.

    A recipe with ``"embeddings": "fp16"`` also stores the embedding tables in fp16 (see :func:`fp16_embeddings`).
    A recipe with an ``"outliers"`` section first moves activation outliers to fp32 side branches
    (:mod:`fastnli.exporter.outliers`); ``"method": "static"`` fixes every activation range at export time
    (:mod:`fastnli.exporter.static_int8`). Both measure on ``calibration`` (the graph's input dicts; required then).
    ``"fp32_matmuls"`` keeps the MatMuls it names in fp32 (:func:`fp32_matmuls`; recorded as ``fp32_matmuls_kept``).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    r = dict(INT8_RECIPE if recipe is None else recipe)
    extra = dict(r.get("extra_options", {}))
    if not r["op_types"] and "blockwise" not in r:
        raise ValueError("an INT8 recipe with no op_types quantizes nothing; give op_types or a blockwise section")
    calibrated = needs_calibration(r)
    if calibrated and "blockwise" in r:
        raise ValueError("an INT8 recipe takes a 'blockwise' section or calibrated ranges ('outliers', "
                         "'method': 'static'), not both")
    if r.get("outliers", {}).get("channel_split") and r["method"] != "static":
        raise ValueError("the INT8 recipe splits outlier channels ('outliers': {'channel_split': True}), which needs "
                         "fixed activation ranges: add 'method': 'static' or drop 'channel_split'")
    if calibrated and not calibration:
        raise ValueError("the INT8 recipe calibrates ('outliers' section or 'method': 'static'): pass "
                         "calibration=[feed dicts]")
    if r.get("fp32_matmuls") and "blockwise" in r:
        raise ValueError("an INT8 recipe with a 'blockwise' section chooses its MatMuls by blockwise 'match'; drop "
                         "'fp32_matmuls'")
    kept_fp32 = r.get("fp32_matmuls", [])
    exclude: list[str] = []
    if kept_fp32 and not calibrated:  # the calibrated path reads the graph anyway: its names are taken there
        exclude = fp32_matmuls(onnx.load(str(src), load_external_data=False), kept_fp32)
        r["fp32_matmuls_kept"] = len(exclude)
    if calibrated:
        from fastnli.exporter.outliers import BRANCH_TAG, split_outliers
        from fastnli.exporter.static_int8 import quantize_static_int8

        assert calibration is not None
        model = onnx.load(str(src))
        if kept_fp32:
            exclude = fp32_matmuls(model, kept_fp32)
            r["fp32_matmuls_kept"] = len(exclude)
        if "outliers" in r:
            r["outliers"] = {**r["outliers"], **split_outliers(model, r["outliers"], calibration, frozenset(exclude))}
            exclude += [n.name for n in model.graph.node if BRANCH_TAG in n.name and n.op_type == "MatMul"]
        if r["method"] == "static":
            r["static"] = {**r["static"], **quantize_static_int8(model, dst, r, calibration, exclude)}
            return _finish_int8(dst, r)
        src = Path(dst).with_name(Path(dst).name + ".split")
        onnx.save(model, str(src))
        del model
        extra["DefaultTensorType"] = onnx.TensorProto.FLOAT
    if "blockwise" in r:
        r["blockwise"] = dict(r["blockwise"])
        staged = Path(dst).with_name(Path(dst).name + ".blockwise")
        r["blockwise"]["converted"] = blockwise_matmuls(src, staged, r["blockwise"])
        src = staged
        extra["DefaultTensorType"] = onnx.TensorProto.FLOAT  # shape inference cannot type MatMulNBits outputs
    try:
        if not r["op_types"]:  # blockwise only: nothing is quantized per tensor
            os.replace(src, dst)
        else:
            quantize_dynamic(
                str(src), str(dst),
                op_types_to_quantize=list(r["op_types"]),
                per_channel=bool(r["per_channel"]),
                reduce_range=bool(r["reduce_range"]),
                weight_type=getattr(QuantType, str(r["weight_type"])),
                nodes_to_exclude=exclude,
                extra_options=extra,
            )
    finally:
        if "blockwise" in r or "outliers" in r:
            Path(src).unlink(missing_ok=True)
    return _finish_int8(dst, r)


def _finish_int8(dst: str | Path, r: dict[str, Any]) -> dict[str, Any]:
    if r.get("embeddings") == "fp16":
        r["fp16_tables"] = fp16_embeddings(dst)
    logger.info("int8 graph written to %s", dst)
    return r
