"""``fastnli export`` (a HF checkpoint to an ONNX artifact) and ``fastnli checkpoint`` (a seeded random checkpoint).

Both are build time and need the export extra: ``pip install 'fastnli[export]'``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape

from fastnli.cli.common import console


def print_manifest(manifest: Any) -> None:
    """An artifact's precisions with their validation figures, as a table."""
    from rich.table import Table

    table = Table(title=f"export of {manifest.source}")
    for col in ("precision", "file", "MB", "max |Δprob| vs torch", "argmax agreement", "probe s"):
        table.add_column(col)
    for name, e in manifest.precisions.items():
        v = e.validation
        table.add_row(name, e.file, f"{e.bytes / 1e6:.1f}", f"{v.max_abs_dprob:.2e}" if v else "-",
                      f"{v.argmax_agreement:.4f}" if v else "-", f"{v.seconds:.2f}" if v else "-")
    console().print(table)


def print_stages(manifest: Any) -> None:
    """The export's stages with their wall-clock and CPU seconds and their shares of the whole, as a table."""
    from rich.table import Table

    total = sum(s["seconds"] for s in manifest.export_stages) or 1.0
    cpu = sum(s.get("cpu_seconds", 0.0) for s in manifest.export_stages) or 1.0
    table = Table(title=f"export stages ({total:.1f} s, {cpu:.1f} s of CPU)")
    for col in ("stage", "seconds", "share", "CPU seconds", "CPU share"):
        table.add_column(col, justify="right")
    for s in manifest.export_stages:
        c = s.get("cpu_seconds", 0.0)
        table.add_row(s["stage"], f"{s['seconds']:.1f}", f"{s['seconds'] / total:.0%}", f"{c:.1f}", f"{c / cpu:.0%}")
    console().print(table)


def _cmd_export(args: argparse.Namespace) -> int:
    from fastnli.exporter import export
    from fastnli.exporter.precision import INT8_RECIPES

    precisions = None if args.precisions == "auto" else [p.strip() for p in args.precisions.split(",") if p.strip()]
    progress = not args.no_progress and console(stderr=True).is_terminal
    manifest = export(args.model, args.out, precisions=precisions, opset=args.opset, validate=not args.no_validate,
                      int8_recipe=INT8_RECIPES[args.int8_recipe], device=args.device, progress=progress)
    print_stages(manifest)
    print_manifest(manifest)
    console().print(f"artifact: {escape(str(Path(args.out).resolve()))}")
    return 0


def _cmd_checkpoint(args: argparse.Namespace) -> int:
    from fastnli.exporter.checkpoint import build_checkpoint

    path = build_checkpoint(args.out, arch=args.arch, size=args.size, seed=args.seed, label_order=args.label_order)
    console().print(f"seeded {args.arch}/{args.size} checkpoint written to {escape(str(path))}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``fastnli export`` and ``fastnli checkpoint`` to the subcommands."""
    p = sub.add_parser("export", help="export a HF NLI checkpoint to an ONNX artifact (fp32/fp16/int8)")
    p.add_argument("model", help="HF hub id or local checkpoint directory")
    p.add_argument("--out", required=True, help="artifact directory (written atomically)")
    p.add_argument("--precisions", default="auto",
                   help="comma-separated, e.g. fp32,fp16,int8 (default auto: those --device runs; fp32 is always "
                   "exported)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="the device the artifact is for when --precisions is auto: cpu (fp32 + int8), cuda (fp32 + "
                   "fp16) or auto (default: cuda when onnxruntime-gpu and a GPU are here, else cpu)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar of the export stages (default: shown when stderr is a terminal)")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default: optimum's choice)")
    p.add_argument("--no-validate", action="store_true", help="skip validation against PyTorch on the probe set")
    p.add_argument("--int8-recipe", default="dynamic",
                   choices=["dynamic", "outlier-split", "static", "static-gptq", "ffn-blockwise", "blockwise"],
                   help="dynamic (default: fastest), outlier-split (dynamic, FFN activation outliers in fp32 "
                   "branches: closer to fp32), static (outlier split + activation ranges fixed at export: scores "
                   "independent of the batch, calibrated on the probe set), static-gptq (static with the int8 "
                   "weights chosen by GPTQ: closer to fp32 at the same speed, a slower export), "
                   "ffn-blockwise (FFN MatMuls as 8-bit "
                   "blockwise MatMulNBits) or blockwise (every MatMul: scores independent of the batch, slowest)")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("checkpoint", help="build a seeded random DeBERTa (or BERT) checkpoint locally (no hub)",
                       description="Build a HF checkpoint with a real architecture and seeded random weights (its "
                       "probabilities are meaningless; its compute is the real model's), for tests and benchmarks. "
                       "Needs the export extra: pip install 'fastnli[export]'.")
    p.add_argument("out", help="checkpoint directory to write (config.json, weights, tokenizer)")
    p.add_argument("--arch", default="deberta", choices=["deberta", "deberta-v2", "bert"],
                   help="deberta (default: DeBERTa v1 as microsoft/deberta-large-mnli), deberta-v2 (DeBERTa-v2/v3) "
                   "or bert (as the embedded default model)")
    p.add_argument("--size", default="tiny", choices=["tiny", "base", "large"],
                   help="tiny (default: 2 layers, hidden 32, seconds to build), base (12 layers, hidden 768) or "
                   "large (24 layers, hidden 1024: deberta-large-mnli shaped)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights (default 0): same seed, same checkpoint")
    p.add_argument("--label-order", default="cne", choices=["cne", "cen", "enc", "2way", "2way-supported"],
                   help="id2label order: cne (default: contradiction, neutral, entailment as deberta-large-mnli), "
                   "cen or enc (orders seen on the hub); 2way (entailment, not_entailment) or 2way-supported "
                   "(unsupported, supported) for a 2-way head")
    p.set_defaults(func=_cmd_checkpoint)
