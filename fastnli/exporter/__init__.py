"""Build time: export a HF NLI checkpoint to an ONNX artifact (fp32 / FP16 / INT8) and validate it.

The run time (:mod:`fastnli.engine`) only loads what this package writes and never imports it at module level; an
engine asked for a HF checkpoint imports :func:`export` on first use. The heavy dependencies (torch, transformers,
optimum) are imported inside the functions that need them: ``pip install 'fastnli[export]'``.

Modules: :mod:`~fastnli.exporter.export` (checkpoint -> artifact + manifest), :mod:`~fastnli.exporter.probe` (the
built-in validation pairs), :mod:`~fastnli.exporter.precision` (FP16 and the INT8 recipes),
:mod:`~fastnli.exporter.calibration` (activations and ranges on calibration batches),
:mod:`~fastnli.exporter.outliers` (outlier branches and channel splits), :mod:`~fastnli.exporter.static_int8`,
:mod:`~fastnli.exporter.qdq_fusion`, :mod:`~fastnli.exporter.attention` (DeBERTa's position terms: the
position window, v1's relative shift), :mod:`~fastnli.exporter.stages` (the export's stages: logged, timed, opt-in
progress bar), :mod:`~fastnli.exporter.checkpoint` (seeded random checkpoints for tests and benchmarks).
"""

from fastnli.exporter.export import export

__all__ = ["export"]
