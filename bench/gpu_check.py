"""``python -m bench.gpu_check`` (or ``bash bench/gpu_check.sh``): the FP16 GPU path, end to end, on one NVIDIA GPU.

What it does, in order, within about 10 minutes on one GPU:

1. builds the seeded deberta-large-mnli-shaped checkpoint (:func:`fastnli.exporter.checkpoint.build_checkpoint`);
2. exports it for CUDA (fp32 + FP16 graphs, ``fastnli.exporter.export(device="cuda")``);
3. checks fidelity: fastnli FP16 and fp32 (ONNX Runtime, CUDA) and PyTorch fp16 against PyTorch fp32 on the same
   pairs (max |Δp|, argmax agreement);
4. measures pairs/s on the short and the long NCP workloads (:mod:`bench.workloads`) of
   ``fastnli-fp16`` (the engine as shipped: length-sorted batches padded to multiples of 8, NumPy feeds),
   ``fastnli-fp16-iobinding`` (the same batches through ORT's IO binding: inputs copied to the GPU once, logits
   read back once), ``fastnli-fp16-cudagraph`` (batches padded to fixed length buckets, one captured CUDA graph per
   bucket), ``pytorch-fp16-b32`` (batches of 32 in input order, as uqlm 0.6.5's batched path) and
   ``pytorch-fp32-b32``;
5. measures the batch-1 latency of one 512-token pair (median of repeats);
6. prints one table and writes ``gpu_check.json``.

Without a GPU (no CUDA device visible to PyTorch, or no CUDA provider in ONNX Runtime, or no GPU device node) it says
so and does a dry run of the same steps on the CPU with the tiny checkpoint and small workloads (the CUDA-graph row
is skipped: it needs the CUDA provider); ``--require-gpu`` makes a missing GPU an error instead. It needs the wheel
with its export extra and, on the GPU, ``onnxruntime-gpu`` in place of ``onnxruntime``:
``pip install 'fastnli[export]' && pip uninstall -y onnxruntime && pip install onnxruntime-gpu``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("fastnli")

#: Length buckets of the CUDA-graph runner: a batch is padded to the first bucket at least its length.
BUCKETS = (32, 64, 128, 256, 512)
#: Padded tokens per captured batch (rows = this // bucket length, at most MAX_ROWS).
GRAPH_TOKENS = 32768
MAX_ROWS = 256


@dataclass
class Row:
    """One backend on one workload (or the batch-1 latency)."""

    workload: str
    backend: str
    seconds: float
    pairs: int
    pairs_per_s: float
    vs_torch_fp16: float | None  # this backend's pairs/s over pytorch-fp16-b32's on the same workload
    max_abs_dprob: float | None  # vs PyTorch fp32 on the same pairs
    argmax_agreement: float | None
    note: str = ""


@dataclass
class Report:
    gpu: bool
    device: str
    dry_run: bool
    reason: str  # the GPU used, or why there is none
    machine: dict[str, Any]
    checkpoint: str
    export_stages: list[dict[str, Any]]
    rows: list[Row] = field(default_factory=list)
    latency_512_ms: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def gpu_status() -> tuple[bool, str]:
    """``(usable, reason)``: whether a CUDA GPU is usable by both PyTorch and ONNX Runtime here, and why not."""
    import onnxruntime as ort

    from fastnli.engine.session import gpu_present

    try:
        import torch
    except ImportError:
        return False, "PyTorch is not installed (pip install 'fastnli[export]')"
    if not gpu_present():
        return False, "no NVIDIA GPU device is present on this machine"
    if not torch.cuda.is_available():
        return False, "PyTorch sees no CUDA device (a CPU-only torch build, or no driver)"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False, "this onnxruntime build has no CUDA provider (pip uninstall onnxruntime; pip install " \
            "onnxruntime-gpu)"
    return True, f"GPU: {torch.cuda.get_device_name(0)}"


def _preload_cuda_libraries() -> None:
    """Let ORT find the CUDA/cuDNN libraries that the torch wheel installed (ORT >= 1.21), before any session."""
    import onnxruntime as ort
    import torch  # noqa: F401  (loads its CUDA libraries into the process)

    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        preload()


def _compare(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    d = np.abs(ref.astype(np.float64) - got.astype(np.float64))
    return float(d.max()), float(np.mean(ref.argmax(1) == got.argmax(1)))


class BoundRunner:
    """Runs an ORT session through IO binding: the feed goes to ``device`` in one copy per input, the logits come
    back in one copy; with ``cuda_graph`` each length bucket gets its own session, captured as a CUDA graph on its
    first run and replayed after (inputs padded to the bucket's fixed shape, copied into the captured buffers)."""

    def __init__(self, graph: Path, device: str, cuda_graph: bool = False, max_rows: int = MAX_ROWS) -> None:
        import onnxruntime as ort

        self.device = device
        self.max_rows = max_rows
        self.cuda_graph = cuda_graph
        self._graph = graph
        self._ort = ort
        self._sessions: dict[int, Any] = {}
        self._bound: dict[int, tuple[Any, dict[str, Any], Any]] = {}
        self.session = self._new_session(False)
        self.input_names = [i.name for i in self.session.get_inputs()]

    def _new_session(self, graph_capture: bool) -> Any:
        ort = self._ort
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if self.device == "cuda":
            cuda: dict[str, Any] = {"device_id": 0}
            if graph_capture:
                cuda["enable_cuda_graph"] = "1"
            providers: list[Any] = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        return ort.InferenceSession(str(self._graph), opts, providers=providers)

    def __call__(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        if self.cuda_graph:
            return self._run_graph(feed)
        binding = self.session.io_binding()
        for name, arr in feed.items():
            binding.bind_ortvalue_input(name, self._ort.OrtValue.ortvalue_from_numpy(arr, self.device, 0))
        binding.bind_output(self.session.get_outputs()[0].name, self.device)
        self.session.run_with_iobinding(binding)
        return np.asarray(binding.copy_outputs_to_cpu()[0])

    @staticmethod
    def bucket(length: int) -> int:
        """The first of :data:`BUCKETS` at least ``length`` (the longest when none is)."""
        return next((b for b in BUCKETS if b >= length), BUCKETS[-1])

    def _run_graph(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        rows, length = feed["input_ids"].shape
        b = self.bucket(length)
        cap = min(self.max_rows, GRAPH_TOKENS // b)
        if rows > cap:
            return np.concatenate([self._run_graph({k: v[i:i + cap] for k, v in feed.items()})
                                   for i in range(0, rows, cap)])
        if b not in self._bound:  # one session per bucket: a captured graph replays one shape at fixed addresses
            sess = self._new_session(True)
            inputs = {n: self._ort.OrtValue.ortvalue_from_shape_and_type((cap, b), np.int64, self.device, 0)
                      for n in self.input_names}
            out = self._ort.OrtValue.ortvalue_from_shape_and_type(
                (cap, int(sess.get_outputs()[0].shape[-1])), np.float32, self.device, 0)
            binding = sess.io_binding()
            for n, v in inputs.items():
                binding.bind_ortvalue_input(n, v)
            binding.bind_ortvalue_output(sess.get_outputs()[0].name, out)
            self._bound[b] = (sess, inputs, (binding, out))
        sess, inputs, (binding, out) = self._bound[b]
        for name, v in inputs.items():
            padded = np.zeros((cap, b), np.int64)  # pad id 0 rows/columns, attention mask 0: results discarded
            padded[:rows, :length] = feed[name]
            if name == "attention_mask":
                padded[rows:, 0] = 1  # keep the padding rows' softmax finite
            v.update_inplace(padded)
        sess.run_with_iobinding(binding)
        return np.asarray(out.numpy()[:rows])


def _timed(fn: Callable[[], np.ndarray], sync: Callable[[], None]) -> tuple[np.ndarray, float]:
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def run_check(out_dir: Path, dry_run: bool, reason: str, size: str | None = None, cache: Path | None = None
              ) -> Report:
    """Run the check (on the GPU, or the CPU dry run when ``dry_run``; ``reason`` says why, or names the GPU) and
    write ``gpu_check.json`` in ``out_dir``."""
    from bench.peers import TorchPeer
    from bench.run import machine_info, uqlm_pairs
    from bench.workloads import long_workload, short_workload
    from fastnli.engine import NLIEngine, cache_root, read_manifest
    from fastnli.engine.batches import score_unique
    from fastnli.engine.tokenize import PairTokenizer
    from fastnli.exporter import export
    from fastnli.exporter.checkpoint import build_checkpoint

    t_start = time.perf_counter()
    device = "cpu" if dry_run else "cuda"
    size = size or ("tiny" if dry_run else "large")
    if not dry_run:
        _preload_cuda_libraries()
    import torch

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    root = Path(cache or cache_root()) / "gpu_check"
    ck = root / f"deberta-{size}"
    if not (ck / "config.json").is_file():
        logger.info("gpu_check: building the seeded deberta/%s checkpoint in %s", size, ck)
        build_checkpoint(ck, arch="deberta", size=size, seed=0)  # type: ignore[arg-type]
    art = root / f"deberta-{size}-cuda"
    try:
        manifest = read_manifest(art)
        if "fp16" not in manifest.precisions:
            raise ValueError("no fp16 graph")
    except (FileNotFoundError, ValueError):
        manifest = export(ck, art, device="cuda", validate=False)  # fp32 + FP16: the graphs a GPU runs
    report = Report(gpu=not dry_run, device=device, dry_run=dry_run, reason=reason, machine=machine_info(),
                    checkpoint=str(ck), export_stages=manifest.export_stages)
    if not dry_run:
        report.machine["gpu"] = torch.cuda.get_device_name(0)
    workloads = [short_workload(40, 5), long_workload(2, 2)] if dry_run else [short_workload(200, 5),
                                                                               long_workload(6, 3)]
    engine16 = NLIEngine(art, device=device, precision="fp16")  # type: ignore[arg-type]
    engine32 = NLIEngine(art, device=device, precision="fp32")  # type: ignore[arg-type]
    if engine16.device != device:
        raise RuntimeError(f"the FP16 engine runs on {engine16.device}, not {device}: the CUDA provider did not load "
                           "(see the log above)")
    m = engine16.manifest
    runners: dict[str, Callable[[dict[str, np.ndarray]], np.ndarray]] = {
        "fastnli-fp16-iobinding": BoundRunner(art / m.precisions["fp16"].file, device)}
    if device == "cuda":
        runners["fastnli-fp16-cudagraph"] = BoundRunner(art / m.precisions["fp16"].file, device, cuda_graph=True)
    torch32 = TorchPeer(ck, device=device, dtype="fp32")
    torch16 = TorchPeer(ck, device=device, dtype="fp16")

    tokenizer = PairTokenizer(art / "tokenizer.json", m.max_length)

    def through(run: Callable[[dict[str, np.ndarray]], np.ndarray], pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        return score_unique(run, tokenizer, [p for p, _ in pairs], [h for _, h in pairs], m.inputs,
                            m.columns, m.pad_token_id, engine16.batch_policy)

    for w in workloads:
        pairs = uqlm_pairs(w)
        logger.info("gpu_check: %s workload, %d pairs", w.name, len(pairs))
        timings: dict[str, tuple[np.ndarray, float, str]] = {}
        for name, peer in (("pytorch-fp32-b32", torch32), ("pytorch-fp16-b32", torch16)):
            peer.predict(pairs[:32])  # warm-up
            probs, secs = _timed(lambda peer=peer, pairs=pairs: peer.predict(pairs), sync)  # type: ignore[misc]
            timings[name] = (probs, secs, "")
        for name, eng in (("fastnli-fp32", engine32), ("fastnli-fp16", engine16)):
            eng.predict(pairs[:8])
            eng.result_cache = None
            probs, secs = _timed(lambda eng=eng, pairs=pairs: eng.predict(pairs), sync)  # type: ignore[misc]
            timings[name] = (probs, secs, f"engine on {eng.device}, {eng.precision}")
        for name, run in runners.items():
            try:
                through(run, pairs)  # warm-up: allocations, and the capture of each bucket's graph
                probs, secs = _timed(lambda run=run, pairs=pairs: through(run, pairs), sync)  # type: ignore[misc]
                timings[name] = (probs, secs, "")
            except Exception as exc:  # a runner ORT refuses here is reported, not fatal
                logger.warning("gpu_check: %s failed: %s: %s", name, type(exc).__name__, exc)
                report.rows.append(Row(w.name, name, 0.0, len(pairs), 0.0, None, None, None,
                                       f"failed: {type(exc).__name__}: {str(exc)[:200]}"))
        ref = timings["pytorch-fp32-b32"][0]
        base = len(pairs) / timings["pytorch-fp16-b32"][1]
        for name, (probs, secs, note) in timings.items():
            dmax, agree = _compare(ref, probs)
            report.rows.append(Row(w.name, name, round(secs, 4), len(pairs), len(pairs) / secs,
                                   len(pairs) / secs / base, dmax, agree, note))
        if device == "cpu" and "fastnli-fp16-cudagraph" not in runners:
            report.rows.append(Row(w.name, "fastnli-fp16-cudagraph", 0.0, len(pairs), 0.0, None, None, None,
                                   "skipped: needs the CUDA provider"))

    half = " ".join(["river"] * 254)
    pair = [(half, half + " bridge")]
    long_len = int(engine16.token_lengths(pair)[0])
    repeats = 3 if dry_run else 50
    single = {"fastnli-fp16-iobinding": runners["fastnli-fp16-iobinding"]}
    if device == "cuda":  # a graph captured for one row: the bucket runner's would pad the pair to a full batch
        single["fastnli-fp16-cudagraph"] = BoundRunner(art / m.precisions["fp16"].file, device, cuda_graph=True,
                                                       max_rows=1)
    for name, fn in (("fastnli-fp16", lambda: engine16.predict(pair)),
                     *((n, (lambda r=r: through(r, pair))) for n, r in single.items()),
                     ("pytorch-fp16", lambda: torch16.predict(pair))):
        try:
            fn()
            fn()
            times = [_timed(fn, sync)[1] for _ in range(repeats)]  # type: ignore[arg-type]
            report.latency_512_ms[name] = round(1e3 * statistics.median(times), 3)
        except Exception as exc:
            logger.warning("gpu_check: batch-1 latency of %s failed: %s: %s", name, type(exc).__name__, exc)
    report.machine["latency_pair_tokens"] = long_len
    report.seconds = round(time.perf_counter() - t_start, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_check.json").write_text(report.to_json())
    return report


def _print(report: Report, console: Any) -> None:
    from rich.table import Table

    where = report.machine.get("gpu") or f"CPU dry run: {report.machine.get('cpu')}"
    table = Table(title=f"gpu_check — {where} — {Path(report.checkpoint).name} ({report.seconds:.0f} s)")
    for c in ("workload", "backend", "seconds", "pairs/s", "× pytorch fp16", "max|Δp| vs torch fp32", "argmax agr",
              "note"):
        table.add_column(c, justify="right")

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in report.rows:
        table.add_row(r.workload, r.backend, f(r.seconds, ".3f"), f(r.pairs_per_s, ".1f"), f(r.vs_torch_fp16, ".2f"),
                      f(r.max_abs_dprob, ".1e"), f(r.argmax_agreement, ".4f"), r.note)
    tokens = report.machine.get("latency_pair_tokens")
    for name, ms in report.latency_512_ms.items():
        table.add_row(f"batch 1, {tokens} tokens", name, f"{ms / 1e3:.4f}", f"{1e3 / ms:.1f}", "-", "-", "-",
                      f"{ms:.2f} ms (median)")
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.gpu_check [options]``; returns the exit status (2: ``--require-gpu`` and no GPU)."""
    from rich.console import Console
    from rich.logging import RichHandler

    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", default="bench/results", help="where gpu_check.json goes (default: bench/results)")
    parser.add_argument("--size", default=None, choices=["tiny", "base", "large"],
                        help="seeded checkpoint shape (default: large on a GPU, tiny in the CPU dry run)")
    parser.add_argument("--cache", default=None, help="checkpoint/export cache (default: $FASTNLI_CACHE/gpu_check)")
    parser.add_argument("--dry-run", action="store_true", help="run on the CPU with the tiny checkpoint even with a GPU")
    parser.add_argument("--require-gpu", action="store_true", help="exit with status 2 when no GPU is usable")
    args = parser.parse_args(argv)
    err = Console(stderr=True)
    logging.basicConfig(level=logging.WARNING, format="%(message)s",
                        handlers=[RichHandler(show_path=False, console=err)])
    logger.setLevel(logging.INFO)
    for noisy in ("transformers", "optimum", "torch", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    usable, reason = gpu_status()
    console = Console()
    console.width = max(console.width, 160)
    if not usable:
        if args.require_gpu:
            console.print(f"NO GPU: {reason}; --require-gpu was given, so nothing ran.")
            return 2
        console.print(f"NO GPU PRESENT ({reason}): this is a DRY RUN on the CPU with the {args.size or 'tiny'} "
                      "checkpoint and small workloads. On one NVIDIA GPU this check builds the deberta-large-mnli-"
                      "shaped checkpoint, exports fp32 + FP16, checks FP16 against fp32, measures pairs/s of fastnli "
                      "FP16 (engine, IO binding, CUDA graphs per length bucket) against PyTorch fp16 and fp32 batch "
                      "32 on the short and long workloads, and the batch-1 latency of one 512-token pair. The figures "
                      "below are CPU figures and say nothing about a GPU.")
    else:
        console.print(reason)
    if usable and args.dry_run:
        reason = "--dry-run given"
    report = run_check(Path(args.out), dry_run=args.dry_run or not usable,
                       reason=reason if usable and not args.dry_run else f"dry run on the CPU: {reason}",
                       size=args.size, cache=Path(args.cache) if args.cache else None)
    _print(report, console)
    console.print(f"results: {Path(args.out) / 'gpu_check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
