"""The ``fastnli`` command line: export, checkpoint, predict, info (and the scorer/bench commands of other modules).

The CLI is the only place that configures logging and prints; the library logs to ``logging.getLogger("fastnli")``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("fastnli")

#: Subcommands registered by other modules: name -> (add_arguments, run).
_EXTRA: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def register(name: str, help_text: str, add_arguments: Callable[[argparse.ArgumentParser], None],
             run: Callable[[argparse.Namespace], int]) -> None:
    """Register a subcommand (used by the scorers, bench and service modules)."""
    _EXTRA[name] = (help_text, add_arguments, run)


def _setup_logging(verbose: bool) -> None:
    from rich.logging import RichHandler

    handler = RichHandler(show_path=False, console=_console(stderr=True))
    # Other libraries (ORT's quantizer logs every skipped node on the root logger) stay at WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[handler])
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("transformers", "optimum", "torch", "httpx", "urllib3", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr)


def add_engine_arguments(p: argparse.ArgumentParser, model_required: bool = False) -> None:
    """The engine options shared by every subcommand that scores."""
    p.add_argument("--model", required=model_required, default=None,
                   help="export artifact dir, HF checkpoint dir or hub id (default: the embedded default model)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"], help="default: auto")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "int8"], help="default: auto")
    p.add_argument("--max-batch-tokens", type=int, default=None, help="padded-token budget per batch")
    p.add_argument("--max-batch-size", type=int, default=None, help="row cap per batch")


def engine_from_args(args: argparse.Namespace) -> Any:
    from fastnli.engine import NLIEngine

    engine = NLIEngine.from_pretrained(args.model, device=args.device, precision=args.precision)
    changes = {k: v for k, v in (("max_batch_tokens", args.max_batch_tokens),
                                 ("max_batch_size", args.max_batch_size)) if v is not None}
    if changes:
        engine.with_policy(**changes)
    return engine


def _cmd_checkpoint(args: argparse.Namespace) -> int:
    from fastnli.exporter.checkpoint import build_checkpoint

    path = build_checkpoint(args.out, arch=args.arch, size=args.size, seed=args.seed, label_order=args.label_order)
    _console().print(f"seeded {args.arch}/{args.size} checkpoint written to {path}")
    return 0


def _print_manifest(manifest: Any) -> None:
    from rich.table import Table

    table = Table(title=f"export of {manifest.source}")
    for col in ("precision", "file", "MB", "max |Δprob| vs torch", "argmax agreement", "probe s"):
        table.add_column(col)
    for name, e in manifest.precisions.items():
        v = e.validation
        table.add_row(name, e.file, f"{e.bytes / 1e6:.1f}", f"{v.max_abs_dprob:.2e}" if v else "-",
                      f"{v.argmax_agreement:.4f}" if v else "-", f"{v.seconds:.2f}" if v else "-")
    _console().print(table)


def _cmd_export(args: argparse.Namespace) -> int:
    from fastnli.exporter import export

    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    from fastnli.exporter.precision import INT8_RECIPES

    manifest = export(args.model, args.out, precisions=precisions, opset=args.opset, validate=not args.no_validate,
                      int8_recipe=INT8_RECIPES[args.int8_recipe])
    _print_manifest(manifest)
    _console().print(f"artifact: {Path(args.out).resolve()}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    engine = engine_from_args(args)
    _print_manifest(engine.manifest)
    _console().print(repr(engine))
    return 0


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file; raises ValueError naming the line of a malformed record."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object") \
                    from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            rows.append({"_line": lineno, **obj})
    return rows


def write_jsonl(path: str | Path | None, records: Iterable[dict[str, Any]]) -> None:
    """Write records as JSON lines to ``path``, or to stdout when ``path`` is None."""
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(path, "w", encoding="utf-8")) if path else sys.stdout
        for rec in records:
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")


def _cmd_predict(args: argparse.Namespace) -> int:
    rows = read_jsonl(args.input)
    pairs = []
    for r in rows:
        for key in ("premise", "hypothesis"):
            if not isinstance(r.get(key), str):
                raise ValueError(f"{args.input}:{r['_line']}: field {key!r} must be a string")
        pairs.append((r["premise"], r["hypothesis"]))
    engine = engine_from_args(args)
    probs, stats = engine.predict_with_stats(pairs)
    write_jsonl(args.output, ({**{k: v for k, v in r.items() if k != "_line"},
                              **{lab: float(x) for lab, x in zip(engine.labels, p)}} for r, p in zip(rows, probs)))
    logger.info("%d pairs (%d unique) in %.2f s on %s/%s, padding efficiency %.3f", stats.pairs_in,
                stats.unique_pairs, stats.seconds, engine.device, engine.precision, stats.padding_efficiency)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastnli", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("export", help="export a HF NLI checkpoint to an ONNX artifact (fp32/fp16/int8)")
    p.add_argument("model", help="HF hub id or local checkpoint directory")
    p.add_argument("--out", required=True, help="artifact directory (written atomically)")
    p.add_argument("--precisions", default="fp32,fp16,int8", help="comma-separated (default: fp32,fp16,int8)")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default: optimum's choice)")
    p.add_argument("--no-validate", action="store_true", help="skip validation against PyTorch on the probe set")
    p.add_argument("--int8-recipe", default="dynamic",
                   choices=["dynamic", "outlier-split", "static", "ffn-blockwise", "blockwise"],
                   help="dynamic (default: fastest), outlier-split (dynamic, FFN activation outliers in fp32 "
                   "branches: closer to fp32), static (outlier split + activation ranges fixed at export: scores "
                   "independent of the batch, calibrated on the probe set), ffn-blockwise (FFN MatMuls as 8-bit "
                   "blockwise MatMulNBits) or blockwise (every MatMul: scores independent of the batch, slowest)")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("checkpoint", help="build a seeded random DeBERTa (or BERT) checkpoint locally (no hub)")
    p.add_argument("out")
    p.add_argument("--arch", default="deberta", choices=["deberta", "deberta-v2", "bert"])
    p.add_argument("--size", default="tiny", choices=["tiny", "base", "large"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label-order", default="cne", choices=["cne", "cen", "enc"])
    p.set_defaults(func=_cmd_checkpoint)

    p = sub.add_parser("predict", help="NLI probabilities for a JSONL file of {premise, hypothesis} lines")
    p.add_argument("input")
    p.add_argument("-o", "--output", default=None, help="output JSONL (default: stdout)")
    add_engine_arguments(p)
    p.set_defaults(func=_cmd_predict)

    p = sub.add_parser("info", help="show an artifact's manifest and the device/precision the engine picks")
    add_engine_arguments(p)
    p.set_defaults(func=_cmd_info)

    _load_plugins()
    for name, (help_text, add_args, run) in _EXTRA.items():
        p = sub.add_parser(name, help=help_text)
        add_args(p)
        p.set_defaults(func=run)
    return parser


def _load_plugins() -> None:
    import importlib

    for mod in ("fastnli.scorers.cli", "fastnli.benchmark.cli", "fastnli.calm.cli", "fastnli.serve.cli"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if not (exc.name and mod.startswith(exc.name)):
                raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        return int(args.func(args))
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, ImportError) as exc:
        _console(stderr=True).print(f"[red]error:[/red] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
