"""Static INT8 (recipe ``"method": "static"``): activation ranges fixed at export time, so a pair's scores do not
depend on the other pairs of its batch.

Dynamic INT8 measures each MatMul input's range on the whole batch at run time (padding included), so batch-mates
move a pair's probabilities. Here every quantized MatMul input gets one range, measured once on calibration
batches over the real tokens only and clipped at a percentile (default 99.999: the top and bottom 0.001% of the
values are clipped; the plain min/max lets a handful of extreme values set the scale). ORT's quantizer writes the
graph in QDQ form with fp32 MatMul outputs, weights int8 per output channel; :mod:`fastnli.exporter.qdq_fusion` then
writes each quantized MatMul as the ``QuantizeLinear`` + ``MatMulIntegerToFloat`` (int8 VNNI kernels) that ORT would
run, with the bias folded in, and lets the fp32 readers of a quantized tensor (the residual stream) read it unrounded.
A channel split (:mod:`fastnli.exporter.outliers`) gets its dither from the fixed scale.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.exporter.calibration import percentile_ranges


def quantize_static_int8(model: Any, dst: str | Path, recipe: dict[str, Any], feeds: list[dict[str, np.ndarray]],
                         exclude: list[str]) -> dict[str, Any]:
    """Write the static INT8 graph of ``model`` (an ``onnx.ModelProto``) to ``dst``; returns what to record.

    The constant-weight MatMuls of the graph are quantized but those named in ``exclude``; their inputs get the
    ranges of :func:`~fastnli.exporter.calibration.percentile_ranges` at ``recipe["static"]["percentile"]``.
    """
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from fastnli.exporter.outliers import clipped_channels, set_split_dither
    from fastnli.exporter.qdq_fusion import fuse_qdq_matmuls, unround_float_readers

    outliers = recipe.get("outliers", {})  # the spec and what split_outliers recorded
    pct = float(recipe["static"]["percentile"])
    consts = {i.name for i in model.graph.initializer}
    quantized = [n for n in model.graph.node
                 if n.op_type in recipe["op_types"] and len(n.input) > 1 and n.input[1] in consts
                 and n.name not in exclude]
    acts = sorted({n.input[0] for n in quantized})
    names = {n.name for n in quantized}
    ranges = percentile_ranges(model, acts, feeds, pct, clipped_channels(outliers))
    overrides = {t: [{"rmin": np.array(lo, np.float32), "rmax": np.array(hi, np.float32)}]
                 for t, (lo, hi) in ranges.items()}

    class _Feeds(CalibrationDataReader):  # older ORT calibrates too; the overrides set every range it would
        def __init__(self) -> None:
            self._it = iter(feeds[:1])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    staged = Path(dst).with_name(Path(dst).name + ".static-src")
    cache = Path(dst).with_name(Path(dst).name + ".ranges.json")
    calibration: dict[str, Any]
    if "calibration_cache_path" in inspect.signature(quantize_static).parameters:
        # ORT >= 1.31 takes the ranges as a calibration cache and skips its own calibration run, which held the
        # graph and a session of it with every MatMul input as an output (10+ GiB on a base-size DeBERTa)
        from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData, save_tensors_data

        save_tensors_data(TensorsData(CalibrationMethod.MinMax, {
            t: TensorData(lowest=np.array(lo, np.float32), highest=np.array(hi, np.float32))
            for t, (lo, hi) in ranges.items()}), cache)
        calibration = {"calibration_data_reader": None, "calibration_cache_path": str(cache)}
    else:
        calibration = {"calibration_data_reader": _Feeds()}
    onnx.save(model, str(staged))
    try:
        quantize_static(
            str(staged), str(dst), quant_format=QuantFormat.QDQ, **calibration,
            op_types_to_quantize=list(recipe["op_types"]), per_channel=bool(recipe["per_channel"]),
            reduce_range=bool(recipe["reduce_range"]), activation_type=QuantType.QUInt8,
            weight_type=getattr(QuantType, str(recipe["weight_type"])),
            nodes_to_exclude=[n.name for n in model.graph.node if n.op_type in recipe["op_types"]
                              and n.name not in names],
            extra_options={**recipe.get("extra_options", {}), "DefaultTensorType": onnx.TensorProto.FLOAT,
                           "OpTypesToExcludeOutputQuantization": list(recipe["op_types"]),
                           "TensorQuantOverrides": overrides},
        )
    finally:
        staged.unlink(missing_ok=True)
        cache.unlink(missing_ok=True)
    written = onnx.load(str(dst))
    dithered = set_split_dither(written, outliers)
    fused = fuse_qdq_matmuls(written)
    unrounded = unround_float_readers(written)
    rounded = None
    if "weight_rounding" in recipe:  # last: the "graph" rounding reads the inputs as the final graph computes them
        from fastnli.exporter.weight_rounding import round_weights

        rounded = round_weights(written, model, feeds, recipe["weight_rounding"], ranges)
        if rounded["matmuls"] + rounded["shared_left_nearest"] != len(quantized):
            found = rounded["matmuls"] + rounded["shared_left_nearest"]
            raise RuntimeError(f"INT8 weight_rounding found {found} of the {len(quantized)} quantized MatMuls in the "
                               "written graph")
    onnx.save(written, str(dst))
    widest = max(ranges.items(), key=lambda kv: kv[1][1] - kv[1][0])
    return {"quantized_matmuls": len(quantized), "fused_matmuls": fused, "dithered_splits": dithered,
            "float_readers_unrounded": unrounded,
            "calibration_batches": len(feeds), **({"weight_rounding": rounded} if rounded else {}),
            "widest_input_range": [widest[0], round(widest[1][0], 3), round(widest[1][1], 3)]}
