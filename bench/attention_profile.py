"""``python -m bench.attention_profile``: where an INT8 DeBERTa graph spends its time on the CPU, per op type.

Builds a seeded deberta (v1) or deberta-v2 checkpoint at the large width (hidden 1024, 16 heads; ``--layers``
of them, default 4: the shares per op type do not depend on the depth) and exports it (fp32 + dynamic INT8) once per
attention graph of ``--graphs``: ``hf`` (as ``transformers`` writes it), ``window`` (the position window, the v2/v3
default) and ``shift`` (the relative shift, the v1 default; ``fused``: the shift graph with its attention in fastnli's
compiled ``DisentangledAttention`` operator, as INT8 CPU sessions run it, :mod:`fastnli.engine.fused_attention`). It runs
ONNX Runtime's profiler on each INT8 graph, one thread, on a short batch (64 pairs x 24 tokens) and a long one (8 x 256), and prints the time share of each op type
and of four groups: the INT8 GEMMs, the fp32 MatMuls (the attention products: QK^T, attention x V and the
relative-position terms), the position plumbing (Slice, Transpose, GatherElements, Gather, Expand, Reshape, Concat,
...) and the rest. With several graphs of an architecture it then times the engine end to end on each (the directed
NCP pairs of the bench's short and long workloads, the graphs alternating, best of ``--runs``) and reports the time
ratio to the first graph and the largest probability difference. ``--int8-attention`` adds, for each graph, a
variant whose INT8 graph quantizes the attention products too (ORT's dynamic recipe with ``MatMulConstBOnly`` off:
both inputs of QK^T, attention x V and the position terms quantized per tensor at run time) and reports its argmax
agreement with the fp32 graph beside the default INT8 graph's. ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.exporter.precision import INT8_RECIPE

logger = logging.getLogger("fastnli")

INT8_OPS = {"MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLinear",
            "QuantizeLinear", "DequantizeLinear", "QGemm", "QLinearMatMul"}
FP32_GEMM_OPS = {"MatMul", "FusedMatMul", "Gemm"}
PLUMBING_OPS = {"Slice", "Transpose", "GatherElements", "Gather", "Expand", "Reshape", "Concat", "Unsqueeze",
                "Squeeze", "Shape", "Where", "Cast", "Range", "Clip", "Equal", "ConstantOfShape", "Neg", "Sub",
                "Tile", "ScatterND", "GatherND", "Min", "Max"}
SHAPES = {"short": (64, 24), "long": (8, 256)}


def group(op: str) -> str:
    """The group of an op type: ``int8 GEMM``, ``fp32 MatMul``, ``plumbing`` or ``other``."""
    if op in INT8_OPS:
        return "int8 GEMM"
    if op in FP32_GEMM_OPS:
        return "fp32 MatMul"
    if op in PLUMBING_OPS:
        return "plumbing"
    return "other"


def profile_graph(graph: Path, rows: int, length: int, vocab: int, inputs: Sequence[str], runs: int = 3,
                  threads: int = 1, fused: bool = False) -> dict[str, float]:
    """Microseconds per op type of one run of ``graph`` on a ``rows x length`` batch (mean of ``runs`` after a
    warm-up), in a CPU session set up as the engine sets its sessions up (``fused``: with the self-attention in the
    compiled operator; else the plain graph)."""
    import onnxruntime as ort

    from fastnli.engine.session import SessionConfig, register_operators, session_model, session_options

    config = SessionConfig(fused_attention=fused)
    opts = session_options(config, threads)
    model = session_model(graph, config, int8="int8" in graph.name, relative_shift=fused)
    if fused and not getattr(model, "fused_layers", 0):
        raise RuntimeError(f"{graph}: no layer's self-attention could be fused")
    register_operators(opts, model)
    with tempfile.TemporaryDirectory() as tmp:
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "ort")
        sess = ort.InferenceSession(model, opts,
                                    providers=["CPUExecutionProvider"],
                                    disabled_optimizers=list(config.cpu_disabled_optimizers))
        rng = np.random.default_rng(0)
        feed = {"input_ids": rng.integers(5, vocab, (rows, length), dtype=np.int64),
                "attention_mask": np.ones((rows, length), np.int64),
                "token_type_ids": np.zeros((rows, length), np.int64)}
        feed = {k: v for k, v in feed.items() if k in inputs}
        sess.run(None, feed)
        for _ in range(runs):
            sess.run(None, feed)
        events = json.loads(Path(sess.end_profiling()).read_text())
    model_runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                        if e.get("cat") == "Session" and e.get("name") == "model_run")
    warm_up_end = model_runs[0][1]  # the warm-up run is in the trace too: left out
    per_op: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] > warm_up_end:
            per_op[e["args"]["op_name"]] += float(e["dur"])
    return {op: us / (len(model_runs) - 1) for op, us in sorted(per_op.items(), key=lambda kv: -kv[1])}


def shares(per_op: dict[str, float]) -> dict[str, Any]:
    """Per op type and per group: microseconds and share of the total."""
    total = sum(per_op.values()) or 1.0
    groups: dict[str, float] = defaultdict(float)
    for op, us in per_op.items():
        groups[group(op)] += us
    return {"total_ms": total / 1e3,
            "groups": {g: round(us / total, 4) for g, us in sorted(groups.items(), key=lambda kv: -kv[1])},
            "ops": {op: round(us / total, 4) for op, us in per_op.items()}}


GRAPHS = {"hf": (False, False), "window": (False, True), "shift": (True, True)}  # (relative_shift, position_window)
FUSED = "fused"  # the shift graph's export, its self-attention fused at load


#: The dynamic INT8 recipe with the attention products quantized too (``--int8-attention``).
INT8_ATTENTION_RECIPE: dict[str, Any] = {**INT8_RECIPE, "extra_options": {"MatMulConstBOnly": False}}


def build_and_export(arch: str, layers: int, root: Path, graph: str = "window",
                     int8_attention: bool = False) -> tuple[Path, Path]:
    """The seeded large-width checkpoint of ``arch`` with ``layers`` layers and its fp32 + INT8 export (cached):
    ``graph`` ``"hf"`` as ``transformers`` writes the attention, ``"window"`` with the position window of
    :mod:`fastnli.exporter.attention` (the default for v2/v3), ``"shift"`` with DeBERTa v1's relative shift (the
    default for v1 where it applies; elsewhere the window). ``int8_attention``: the INT8 graph quantizes the
    attention products too (:data:`INT8_ATTENTION_RECIPE`)."""
    from fastnli.engine import read_manifest
    from fastnli.exporter import export
    from fastnli.exporter.checkpoint import build_checkpoint

    ck = root / f"{arch}-large-{layers}l"
    if not (ck / "config.json").is_file():
        build_checkpoint(ck, arch=arch, size="large", seed=0, num_layers=layers)  # type: ignore[arg-type]
    art = root / f"{arch}-large-{layers}l-{graph}{'-int8attention' if int8_attention else ''}"
    try:
        read_manifest(art)
    except (FileNotFoundError, ValueError):
        shift, window = GRAPHS[graph]
        export(ck, art, precisions=("fp32", "int8"), validate=False, relative_shift=shift, position_window=window,
               int8_recipe=INT8_ATTENTION_RECIPE if int8_attention else None)
    return ck, art


def end_to_end(graphs: dict[str, Path], precision: str, runs: int, fused: Sequence[str] = ()) -> dict[str, Any]:
    """Seconds of ``NLIEngine.predict`` per graph (the artifact directories of ``graphs``, by label) on the short and
    long NCP workloads, the graphs alternating within each run; best of ``runs``. The first graph is the reference of
    the ratios and of the largest probability difference; ``fp32_agreement`` is each graph's share of pairs with the
    first graph's fp32 argmax (1.0 for fp32 graphs of the same function). The graphs labelled in ``fused`` run with
    the fused attention, the others plain."""
    from bench.workloads import long_workload, ncp_pairs, short_workload
    from fastnli.engine import NLIEngine
    from fastnli.engine.session import SessionConfig

    engines = {label: NLIEngine(art, device="cpu", precision=precision,  # type: ignore[arg-type]
                                session_config=SessionConfig(fused_attention=label in fused))
               for label, art in graphs.items()}
    first = next(iter(engines))
    reference = NLIEngine(graphs[first], device="cpu", precision="fp32")
    out: dict[str, Any] = {}
    for workload in (short_workload(), long_workload()):
        pairs = ncp_pairs(workload)
        labels = reference.predict(pairs).argmax(axis=1)
        best = {label: float("inf") for label in engines}
        probs: dict[str, np.ndarray] = {}
        for _ in range(runs):
            for label, engine in engines.items():
                t0 = time.perf_counter()
                probs[label] = engine.predict(pairs)
                best[label] = min(best[label], time.perf_counter() - t0)
        out[workload.name] = {label: {"seconds": round(best[label], 3), "ratio": round(best[label] / best[first], 3),
                                      "max_abs_dprob": float(np.abs(probs[label] - probs[first]).max()),
                                      "fp32_agreement": round(float((probs[label].argmax(axis=1) == labels).mean()),
                                                              4)}
                              for label in engines}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.attention_profile [options]``; returns the exit status."""
    from rich.console import Console
    from rich.table import Table

    from fastnli.engine import cache_root, read_manifest

    p = argparse.ArgumentParser(prog="python -m bench.attention_profile", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--arch", default="deberta,deberta-v2", help="comma-separated: deberta, deberta-v2")
    p.add_argument("--layers", type=int, default=4, help="layers of the large-width checkpoint (default 4)")
    p.add_argument("--artifact", default=None, help="profile this artifact's INT8 graph instead (one arch)")
    p.add_argument("--precision", default="int8", choices=["int8", "fp32"], help="the graph to profile")
    p.add_argument("--runs", type=int, default=3, help="profiled runs per shape after one warm-up (default 3)")
    p.add_argument("--graphs", default="hf,window,shift,fused",
                   help="comma-separated graphs to profile alternately in one run: hf (the attention as transformers "
                   "writes it), window (the position window: the v2/v3 default), shift (v1's relative shift: the v1 "
                   "export), fused (the shift graph with its attention in the compiled operator: how INT8 CPU sessions "
                   "run v1); default all four (shift and fused: v1 only)")
    p.add_argument("--int8-attention", action="store_true",
                   help="also export each graph with the attention products quantized (INT8 only) and compare")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    console = Console(width=100)
    results: dict[str, Any] = {}
    variants = [g.strip() for g in args.graphs.split(",") if g.strip()]
    unknown = sorted(set(variants) - {*GRAPHS, FUSED})
    if unknown:
        p.error(f"--graphs: unknown {', '.join(unknown)}; choose from {', '.join([*GRAPHS, FUSED])}")
    for arch in [a.strip() for a in args.arch.split(",") if a.strip()]:
        graphs: dict[str, tuple[Path, Any, bool]] = {}  # label: (graph, manifest, fused)
        quantized = [False, True] if args.int8_attention and args.precision == "int8" and not args.artifact \
            else [False]
        for variant in variants if not args.artifact else ["window"]:
            if variant in ("shift", FUSED) and (arch != "deberta" or variant == FUSED and args.precision != "int8"):
                continue
            for int8_attention in quantized:
                if args.artifact:
                    art = Path(args.artifact)
                else:
                    _, art = build_and_export(arch, args.layers, cache_root() / "bench" / "attention_profile",
                                              "shift" if variant == FUSED else variant, int8_attention)
                m = read_manifest(art)
                recipe = str(m.precisions["fp32"].recipe.get("attention", "as HF writes it"))
                label = f"{arch} ({recipe.removesuffix(' (fastnli.exporter.attention)')})"
                label += ", fused attention" if variant == FUSED else ""
                label += ", int8 attention" if int8_attention else ""
                graphs[label] = (art / m.precisions[args.precision].file, m, variant == FUSED)
        vocab = 2000  # the seeded tokenizers' ids stay below this; the shares do not depend on the ids
        for shape, (rows, length) in SHAPES.items():
            for label, (graph, m, fused) in graphs.items():  # variants alternate within a shape: the same load
                figures = shares(profile_graph(graph, rows, length, vocab, m.inputs, args.runs, fused=fused))
                results[f"{label}/{shape}"] = figures
                table = Table(title=f"{label} {args.precision} {shape} ({rows} x {length}): "
                                    f"{figures['total_ms']:.1f} ms per run, 1 thread")
                table.add_column("group / op type")
                table.add_column("share", justify="right")
                for g, s in figures["groups"].items():
                    table.add_row(f"[bold]{g}[/bold]", f"{s:.1%}")
                for op, s in list(figures["ops"].items())[:14]:
                    table.add_row(f"  {op} ({group(op)})", f"{s:.1%}")
                console.print(table)
        if len(graphs) > 1:
            artifacts = {label: graph.parent for label, (graph, _, _) in graphs.items()}
            figures = end_to_end(artifacts, args.precision, args.runs,
                                 fused=[label for label, (_, _, fused) in graphs.items() if fused])
            results[f"{arch}/end to end"] = figures
            table = Table(title=f"{arch} {args.precision}, the engine end to end (NCP pairs, best of {args.runs})")
            for column in ("workload", "graph", "seconds", "time ratio", "max |Δp|", "argmax = fp32"):
                table.add_column(column, justify="left" if column in ("workload", "graph") else "right")
            for workload, rows in figures.items():
                for label, row in rows.items():
                    table.add_row(workload, label, f"{row['seconds']:.2f}", f"{row['ratio']:.3f}",
                                  f"{row['max_abs_dprob']:.1e}", f"{row['fp32_agreement']:.1%}")
            console.print(table)
        if args.artifact:
            break
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
