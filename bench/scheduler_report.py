"""Pair-scheduler figures: compiled vs reference speed on 1M directed pairs, and padding efficiency vs FIFO batching.

Usage::

    python -m bench.scheduler_report [--pairs 1000000] [--repeat 3] [--skip-reference]

Workload (synthetic, seeded, no tokenizer: tokenization is excluded from the timings): ``--pairs`` directed pairs,
50% of them duplicates of another pair, built from a pool of ~1,000 response texts (each present as two equal but
distinct str objects, so deduplication really compares strings). Each unique pair gets a token length: 90% short
answers (8-40 tokens), 10% long (41-512 tokens).

Timed path: ``dedup_pairs`` on all pairs, ``plan_batches`` on the unique lengths (budget 8192 tokens, 64 rows,
pad_multiple 8), then ``fill_batch`` for every batch. Compiled: best of ``--repeat`` runs; reference: one run.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from fastnli.engine.batches import CPU_POLICY
from fastnli.kernels import reference

try:
    from fastnli.kernels import _schedule as compiled
except ImportError:  # pragma: no cover - reported in the output
    compiled = None  # type: ignore[assignment]

BUDGET_TOKENS = 8192
BUDGET_ROWS = 64
PAD_MULTIPLE = 8
FIFO_CHUNK = 32
PAD_ID = 0


def make_lengths(n: int, seed: int = 1, long_fraction: float = 0.1) -> np.ndarray:
    """Token lengths: short answers 8-40 tokens, ``long_fraction`` of long ones 41-512 tokens."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, 41, size=n)
    is_long = rng.random(n) < long_fraction
    lengths[is_long] = rng.integers(41, 513, size=int(is_long.sum()))
    return lengths.astype(np.int64)


def make_pairs(n_pairs: int, dup_fraction: float = 0.5, seed: int = 0) -> tuple[list[str], list[str], int]:
    """``n_pairs`` directed pairs, ``dup_fraction`` of them repeats; returns (premises, hypotheses, unique count)."""
    rng = np.random.default_rng(seed)
    n_unique = max(1, round(n_pairs * (1.0 - dup_fraction)))
    n_texts = int(math.isqrt(n_unique)) + 2
    while n_texts * (n_texts - 1) < n_unique:
        n_texts += 1
    words = ["the", "model", "answer", "is", "paris", "because", "capital", "france", "not", "likely", "city"]
    texts = [f"Response {t}: " + " ".join(rng.choice(words, size=int(rng.integers(5, 60)))) for t in range(n_texts)]
    twins = ["".join(list(t)) for t in texts]  # equal content, distinct objects
    codes = rng.choice(n_texts * (n_texts - 1), size=n_unique, replace=False)
    first = codes // (n_texts - 1)
    second = codes % (n_texts - 1)
    second = second + (second >= first)  # directed pairs (i, j), i != j
    picks = np.concatenate([np.arange(n_unique), rng.integers(0, n_unique, size=n_pairs - n_unique)])
    rng.shuffle(picks)
    use_twin = rng.random(n_pairs) < 0.5
    premises = [(twins if tw else texts)[i] for i, tw in zip(first[picks].tolist(), use_twin.tolist(), strict=True)]
    hypotheses = [texts[j] for j in second[picks].tolist()]
    return premises, hypotheses, n_unique


def make_tokens(lengths: np.ndarray, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Flat token ids and offsets for rows of the given lengths (what flatten_token_lists would return)."""
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.random.default_rng(seed).integers(5, 128_000, size=int(offsets[-1]), dtype=np.int64)
    return flat, offsets


def schedule_all(impl: ModuleType, premises: list[str], hypotheses: list[str], lengths_of: np.ndarray,
                 flat: np.ndarray, offsets: np.ndarray) -> dict[str, float]:
    """Run dedup -> plan -> fill every batch with ``impl``; returns stage timings in seconds."""
    t0 = time.perf_counter()
    first, _inverse = impl.dedup_pairs(premises, hypotheses)
    t1 = time.perf_counter()
    plan = impl.plan_batches(lengths_of[: first.shape[0]], BUDGET_TOKENS, BUDGET_ROWS, PAD_MULTIPLE)
    t2 = time.perf_counter()
    for b in range(plan.num_batches):
        impl.fill_batch(flat, offsets, plan.batch_rows(b), int(plan.seq_lens[b]), PAD_ID)
    t3 = time.perf_counter()
    return {"dedup": t1 - t0, "plan": t2 - t1, "fill": t3 - t2, "total": t3 - t0, "batches": plan.num_batches}


def best_of(repeat: int, fn: Callable[[], dict[str, float]]) -> dict[str, float]:
    runs = [fn() for _ in range(repeat)]
    return min(runs, key=lambda r: r["total"])


def fifo_efficiency(lengths: np.ndarray, budget: int, chunk: int) -> float:
    """Arrival order, chunks of up to ``chunk`` rows each padded to its longest row; a chunk also closes early when
    the next row would push ``rows * longest`` over ``budget`` (the same token budget as the planner)."""
    real = int(lengths.sum())
    padded = 0
    rows = 0
    longest = 0
    for length in lengths.tolist():
        new_longest = max(longest, length)
        if rows and (rows == chunk or (rows + 1) * new_longest > budget):
            padded += rows * longest
            rows, new_longest = 0, length
        rows += 1
        longest = new_longest
    padded += rows * longest
    return real / padded if padded else 1.0


def time_flatten(impl: ModuleType, token_lists: list[list[int]], repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        impl.flatten_token_lists(token_lists)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=1_000_000, help="directed pairs (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=3, help="compiled runs, best kept (default 3)")
    parser.add_argument("--skip-reference", action="store_true", help="do not time the (slow) reference")
    args = parser.parse_args(argv)
    if compiled is None:
        print("fastnli.kernels._schedule is not built: run `python setup.py build_ext --inplace` first")
        return 1

    premises, hypotheses, n_unique = make_pairs(args.pairs)
    lengths = make_lengths(n_unique)
    flat, offsets = make_tokens(lengths)
    print(f"workload: {args.pairs:,} directed pairs, {n_unique:,} unique, {int(lengths.sum()):,} real tokens; "
          f"budget {BUDGET_TOKENS} tokens / {BUDGET_ROWS} rows, pad_multiple {PAD_MULTIPLE}")

    # Speed: fresh string copies per run would re-hash; the engine sees strings whose hash is computed once, too.
    comp = best_of(args.repeat, lambda: schedule_all(compiled, premises, hypotheses, lengths, flat, offsets))
    ref: dict[str, Any] | None = None
    if not args.skip_reference:
        ref = schedule_all(reference, premises, hypotheses, lengths, flat, offsets)

    print()
    print(f"{'stage':<34}{'compiled (s)':>14}{'reference (s)':>15}{'speed-up':>10}")
    for stage in ("dedup", "plan", "fill", "total"):
        label = {"dedup": "dedup_pairs (1M pairs)", "plan": "plan_batches (unique lengths)",
                 "fill": f"fill_batch x {int(comp['batches']):,} batches",
                 "total": "dedup + plan + fill"}[stage]
        r = f"{ref[stage]:>15.3f}{ref[stage] / comp[stage]:>9.1f}x" if ref else f"{'-':>15}{'-':>10}"
        print(f"{label:<34}{comp[stage]:>14.3f}{r}")

    n_flat = min(100_000, n_unique)
    token_lists = [flat[offsets[u] : offsets[u + 1]].tolist() for u in range(n_flat)]
    tc = time_flatten(compiled, token_lists, args.repeat)
    tr = time_flatten(reference, token_lists, 1) if not args.skip_reference else math.nan
    print(f"{f'flatten_token_lists ({n_flat // 1000}k lists)':<34}{tc:>14.3f}{tr:>15.3f}{tr / tc:>9.1f}x")

    print()
    print(f"{'padding efficiency (100k rows)':<56}{'planner':>10}{'FIFO':>10}")
    mixed = make_lengths(100_000, seed=3)
    for multiple, overhead in ((1, 0), (8, 0), (1, CPU_POLICY.batch_overhead_tokens)):
        plan = compiled.plan_batches(mixed, BUDGET_TOKENS, BUDGET_ROWS, multiple, 0, overhead)
        label = f"budget {BUDGET_TOKENS}/{BUDGET_ROWS} rows, pad_multiple {multiple}" + (
            f", batch overhead {overhead}" if overhead else "")
        print(f"{label:<56}{plan.padding_efficiency:>10.3f}{fifo_efficiency(mixed, BUDGET_TOKENS, FIFO_CHUNK):>10.3f}")
    print(f"(FIFO: arrival order, chunks of <= {FIFO_CHUNK} rows padded to their longest, closed early at the "
          f"{BUDGET_TOKENS}-token budget)")

    print()
    goal_speed = ref is not None and ref["total"] / comp["total"] >= 10
    goal_abs = comp["total"] < 2.0
    eff = compiled.plan_batches(mixed, BUDGET_TOKENS, BUDGET_ROWS, 1).padding_efficiency
    print(f"goals: >=10x vs reference: {'met' if goal_speed else 'NOT met' if ref else 'not measured'}; "
          f"compiled < 2 s: {'met' if goal_abs else 'NOT met'}; "
          f"padding efficiency >= 0.95 (pad_multiple 1): {'met' if eff >= 0.95 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
