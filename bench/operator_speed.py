"""``python -m bench.operator_speed``: the fused-attention operator alone, milliseconds and GFLOP/s per call.

Runs fastnli's compiled ``DisentangledAttention`` operator (:mod:`fastnli.engine.fused_attention`) as a one-node ONNX
Runtime graph on seeded inputs of the large width (16 heads of 64) with padding masks (each pair's length drawn
between half and all of the positions, as batches of real pairs have), one thread by default, at each
``--shapes`` entry (pairs x positions). Each call is checked against the NumPy reference first; its time is the
best of ``--repeats`` timings of at least ``--seconds`` each. GFLOP/s counts ``8·L²·d`` per (pair, head): the
content score, the two position terms and probabilities x values, two FLOPs per multiply-add. ``--isa`` caps the
kernel as ``FASTNLI_OPERATOR_ISA`` does (set before the library loads: it picks its kernel once per process; the
generic kernel is not offered, as sessions never fuse with it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

HEADS, WIDTH = 16, 64
DEFAULT_SHAPES = "64x24,32x48,8x128,8x256,2x512"


def padded_inputs(pairs: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Operator inputs for ``pairs`` pairs of ``length`` positions whose real lengths lie in ``[length / 2,
    length]``: the positions past a pair's length are left out as keys and as queries, as the exported graph's
    mask does."""
    from fastnli.engine import fused_attention as fa

    feeds = fa.random_inputs(pairs, HEADS, length, WIDTH, seed)
    lengths = np.random.default_rng(seed + 1).integers(max(1, length // 2), length + 1, pairs)
    keep = np.arange(length)[None, :] < lengths[:, None]
    feeds["masked"] = ~(keep[:, None, :, None] & keep[:, None, None, :])
    return feeds


def measure(shapes: Sequence[tuple[int, int]], threads: int = 1, repeats: int = 5,
            seconds: float = 0.5) -> list[dict[str, Any]]:
    """One row per (pairs, positions) shape: ``ms`` per call (the best timing) and ``gflops``."""
    from fastnli.engine import fused_attention as fa

    path = fa.library()
    if path is None:
        raise SystemExit("the fused-attention operator library is not available here (see docs/engine.md)")
    session = fa.operator_session(path, threads)
    rows = []
    for pairs, length in shapes:
        feeds = padded_inputs(pairs, length)
        if not fa.within_tolerance(session.run(None, feeds)[0], fa.disentangled_attention(**feeds)):
            raise SystemExit(f"the operator disagrees with the NumPy reference at {pairs} x {length}")
        best = float("inf")
        for _ in range(repeats):
            start, calls = time.perf_counter(), 0
            while time.perf_counter() - start < seconds:
                session.run(None, feeds)
                calls += 1
            best = min(best, (time.perf_counter() - start) / calls)
        flops = 8.0 * length * length * WIDTH * pairs * HEADS
        rows.append({"pairs": pairs, "positions": length, "ms": best * 1e3, "gflops": flops / best / 1e9})
    return rows


def _shapes(text: str) -> list[tuple[int, int]]:
    try:
        out = [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",") if item.strip()]
    except ValueError:
        out = []
    if not out or any(len(s) != 2 or min(s) < 1 for s in out):
        raise argparse.ArgumentTypeError(f"--shapes takes PAIRSxPOSITIONS,... (e.g. {DEFAULT_SHAPES}), not {text!r}")
    return [(s[0], s[1]) for s in out]


def main(argv: Sequence[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    p = argparse.ArgumentParser(prog="python -m bench.operator_speed", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--shapes", type=_shapes, default=_shapes(DEFAULT_SHAPES),
                   help=f"comma-separated PAIRSxPOSITIONS (default {DEFAULT_SHAPES})")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    p.add_argument("--repeats", type=int, default=5, help="timings per shape, the best kept (default 5)")
    p.add_argument("--seconds", type=float, default=0.5, help="seconds of calls per timing (default 0.5)")
    p.add_argument("--isa", choices=["auto", "avx512", "avx2"], default=None, help="cap the kernel (FASTNLI_OPERATOR_ISA)")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    if args.isa is not None:
        from fastnli.engine.fused_attention import ISA_VARIABLE

        os.environ[ISA_VARIABLE] = args.isa
    rows = measure(args.shapes, args.threads, args.repeats, args.seconds)
    table = Table(title=f"DisentangledAttention, {HEADS} heads of {WIDTH}, {args.threads} thread(s)")
    for name in ("pairs x positions", "ms per call", "GFLOP/s"):
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(f"{r['pairs']} x {r['positions']}", f"{r['ms']:.2f}", f"{r['gflops']:.1f}")
    Console(stderr=True).print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
