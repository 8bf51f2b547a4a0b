"""Side-by-side NCP benchmark in one run: uqlm, plain PyTorch, fastnli fp32 and fastnli INT8 (FP16 on a GPU).

Every backend scores the same workload with the same checkpoint. Times are wall-clock seconds of the scoring call
after a warm-up (model loading excluded for every backend). Ratios are against uqlm measured in the same run.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.roofline import deberta_flops
from bench.workloads import Workload
from fastnli.engine import NLIEngine, ResultCache
from fastnli.engine.session import SessionConfig
from fastnli.scorers import formulas, score

logger = logging.getLogger("fastnli")


@dataclass
class BenchRow:
    """One backend on one workload."""

    workload: str
    backend: str
    seconds: float
    pairs: int  # directed pairs the backend sent to its model
    real_tokens: int
    padded_tokens: int
    pairs_per_s: float
    tokens_per_s: float  # real (unpadded) tokens per second
    ratio_vs_uqlm: float | None  # uqlm seconds / this backend's seconds
    padding_efficiency: float
    dedup_ratio: float
    ncp_mean_abs_delta: float | None  # vs uqlm's NCP
    ncp_max_abs_delta: float | None
    argmax_agreement: float | None  # per pair, vs PyTorch fp32
    effective_gflops: float  # model FLOPs of the real tokens / seconds
    roofline_share: float | None  # effective_gflops / measured GEMM peak of the backend's precision
    peak_precision: str | None = None  # the peak roofline_share is a share of ("fp32", "int8"); None: none measured


@dataclass
class BenchReport:
    rows: list[BenchRow]
    peaks_gflops: dict[str, float]
    machine: dict[str, Any]
    checkpoint: str
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def to_markdown(self) -> str:
        cols = ["workload", "backend", "seconds", "pairs", "pairs_per_s", "tokens_per_s", "ratio_vs_uqlm",
                "padding_efficiency", "dedup_ratio", "ncp_max_abs_delta", "argmax_agreement", "roofline_share"]
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in self.rows:
            vals = []
            for c in cols:
                v = getattr(r, c)
                vals.append("-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v))
            lines.append("| " + " | ".join(vals) + " |")
        peaks = ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in self.peaks_gflops.items())
        return "\n".join([f"Checkpoint: `{self.checkpoint}`; GEMM peaks on this machine (ORT): {peaks}.", "",
                          *lines, "", *[f"- {n}" for n in self.notes]]) + "\n"


def uqlm_pairs(w: Workload) -> list[tuple[str, str]]:
    """The directed pairs uqlm's NCP sends to its model, in uqlm's order (prefill dedup, both directions)."""
    seen: set[tuple[str, str]] = set()
    pairs = []
    for r, samples in zip(w.responses, w.sampled_responses):
        for c in samples:
            if c != r and (r, c) not in seen:
                seen.add((r, c))
                pairs += [(r, c), (c, r)]
    return pairs


def ncp_from_pairs(w: Workload, pairs: Sequence[tuple[str, str]], probs: np.ndarray) -> list[float]:
    """NCP of each response from per-pair probabilities (for the PyTorch peer)."""
    table = {p: probs[i] for i, p in enumerate(pairs)}
    out = []
    for r, samples in zip(w.responses, w.sampled_responses):
        uniq = list(dict.fromkeys([r, *samples]))
        k = len(uniq)
        P = np.zeros((k, k, 3), np.float32)
        for a in range(k):
            for b in range(k):
                if a != b and (uniq[a], uniq[b]) in table:
                    P[a, b] = table[(uniq[a], uniq[b])]
        pos = [uniq.index(t) for t in [r, *samples]]
        out.append(formulas.noncontradiction_and_entailment(P, pos)[0])
    return out


def _flops(config: dict[str, Any], lengths: Sequence[int]) -> float:
    return float(sum(deberta_flops(config, n) for n in lengths))


def _row(workload: Workload, backend: str, seconds: float, pairs: int, real: int, padded: int, unique: int,
         ncp: Sequence[float] | None, ref_ncp: Sequence[float] | None, uqlm_s: float | None,
         agreement: float | None, flops: float, peaks: dict[str, float], peak_precision: str | None) -> BenchRow:
    peak = peaks.get(peak_precision) if peak_precision else None
    d = np.abs(np.asarray(ncp) - np.asarray(ref_ncp)) if ncp is not None and ref_ncp is not None else None
    gf = flops / seconds / 1e9
    return BenchRow(
        workload=workload.name, backend=backend, seconds=round(seconds, 4), pairs=pairs, real_tokens=real,
        padded_tokens=padded, pairs_per_s=pairs / seconds, tokens_per_s=real / seconds,
        ratio_vs_uqlm=(uqlm_s / seconds) if uqlm_s else None,
        padding_efficiency=real / padded if padded else 1.0, dedup_ratio=pairs / unique if unique else 1.0,
        ncp_mean_abs_delta=float(d.mean()) if d is not None else None,
        ncp_max_abs_delta=float(d.max()) if d is not None else None,
        argmax_agreement=agreement, effective_gflops=gf, roofline_share=gf / peak if peak else None,
        peak_precision=peak_precision if peak else None,
    )


#: Every backend of the bench, in the table's order ("fastnli-int8-plain": INT8 without the fused attention).
BACKENDS: tuple[str, ...] = ("uqlm", "torch", "fastnli-fp32", "fastnli-int8", "fastnli-int8-plain")


def run_workload(
    w: Workload,
    checkpoint: Path,
    artifact: Path,
    config: dict[str, Any],
    peaks: dict[str, float],
    backends: Sequence[str] = BACKENDS,
    status: Callable[[str], None] = lambda _m: None,
    uqlm_python: Path | None = None,
) -> list[BenchRow]:
    """Run every backend on one workload; returns one row per backend.

    ``uqlm_python`` is the uqlm venv's python for the ``"uqlm"`` backend (required with it: the bench never builds
    the venv by itself, see ``python -m bench --install-uqlm``)."""
    rows: list[BenchRow] = []
    upairs = uqlm_pairs(w)
    uqlm_s: float | None = None
    uqlm_ncp: list[float] | None = None
    torch_probs: np.ndarray | None = None
    if "uqlm" in backends:
        from bench.uqlm_peer import run_uqlm

        if uqlm_python is None:
            raise ValueError("the uqlm backend needs uqlm_python (python -m bench finds or, with --install-uqlm, "
                             "builds the venv)")
        status(f"{w.name}: uqlm BlackBoxUQ(noncontradiction), its own venv")
        res = run_uqlm(checkpoint, w.responses, w.sampled_responses, scorers=("noncontradiction",),
                       python=uqlm_python)
        uqlm_s = res.seconds
        uqlm_ncp = [float(x) for x in res.scores["noncontradiction"]]
    if "torch" in backends:
        from bench.peers import TorchPeer

        status(f"{w.name}: PyTorch fp32, batches of 32 in input order")
        peer = TorchPeer(checkpoint)
        peer.predict(upairs[:4])  # warm-up
        torch_probs, secs = peer.timed(upairs)
        lengths = [len(x) for x in peer.tokenizer([p for p, _ in upairs], [h for _, h in upairs], truncation=True,
                                                  max_length=512)["input_ids"]]
        rows.append(_row(w, "pytorch-fp32-b32", secs, len(upairs), peer.real_tokens, peer.padded_tokens,
                         len(upairs), ncp_from_pairs(w, upairs, torch_probs), uqlm_ncp, uqlm_s, 1.0,
                         _flops(config, lengths), peaks, "fp32"))
        if uqlm_s is not None:
            rows.insert(0, _row(w, "uqlm", uqlm_s, res.num_nli_pairs, peer.real_tokens, peer.padded_tokens,
                                len(upairs), uqlm_ncp, uqlm_ncp, uqlm_s, None, _flops(config, lengths), peaks,
                                "fp32"))
    for backend in backends:
        if not backend.startswith("fastnli-"):
            continue
        precision, _, variant = backend.split("-", 1)[1].partition("-")  # "fastnli-int8-plain": no fused attention
        status(f"{w.name}: fastnli {precision}{' ' + variant if variant else ''}")
        engine = NLIEngine.from_pretrained(artifact, device="cuda" if precision == "fp16" else "cpu",
                                           precision=precision,  # type: ignore[arg-type]
                                           session_config=SessionConfig(fused_attention=variant != "plain"))
        engine.predict(upairs[:4])  # warm-up (sessions allocate on first run)
        engine.result_cache = ResultCache()  # empty for the timed call; serves the agreement check below
        result = score(w.responses, w.sampled_responses, scorers=("noncontradiction",), engine=engine)
        st = result.stats
        agreement = None
        if torch_probs is not None:
            mine = engine.predict(upairs)  # served from the result cache: no extra model time
            agreement = float(np.mean(mine.argmax(1) == torch_probs.argmax(1)))
        lengths = engine.token_lengths(list(dict.fromkeys(upairs))).tolist()
        name = f"fastnli-{precision}-{variant}" if variant else f"fastnli-{precision}"
        rows.append(_row(w, f"{name}-{engine.device}", result.seconds, st.pairs_in, st.real_tokens,
                         st.padded_tokens, st.unique_pairs, result.column("noncontradiction"),  # type: ignore[arg-type]
                         uqlm_ncp, uqlm_s, agreement, _flops(config, lengths),
                         peaks, {"int8": "int8", "fp32": "fp32"}.get(precision)))  # no GPU peak is measured
    return rows


def machine_info() -> dict[str, Any]:
    import os

    import onnxruntime as ort

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "onnxruntime": ort.__version__,
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}
