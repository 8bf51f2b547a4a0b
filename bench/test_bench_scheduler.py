"""pytest-benchmark timings of the pair scheduler, compiled vs reference (not part of the default test run).

Run::

    pytest bench/test_bench_scheduler.py --benchmark-columns=min,mean,rounds
    FASTNLI_BENCH_PAIRS=200000 pytest bench/test_bench_scheduler.py   # a smaller workload

Workload and goals: see ``bench/scheduler_report.py`` (1,000,000 directed pairs, 50% duplicates, 8-40 token
answers with 10% long rows up to 512 tokens; budget 8192 tokens / 64 rows). The reference runs one round only.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from bench.scheduler_report import (
    BUDGET_ROWS,
    BUDGET_TOKENS,
    FIFO_CHUNK,
    PAD_ID,
    PAD_MULTIPLE,
    fifo_efficiency,
    make_lengths,
    make_pairs,
    make_tokens,
)
from fastnli.kernels import reference

_schedule = pytest.importorskip("fastnli.kernels._schedule", reason="build it: python setup.py build_ext --inplace")

N_PAIRS = int(os.environ.get("FASTNLI_BENCH_PAIRS", "1000000"))
IMPLS = [pytest.param(_schedule, id="compiled"), pytest.param(reference, id="reference")]


@pytest.fixture(scope="module")
def workload() -> dict[str, Any]:
    premises, hypotheses, n_unique = make_pairs(N_PAIRS)
    lengths = make_lengths(n_unique)
    flat, offsets = make_tokens(lengths)
    plan = _schedule.plan_batches(lengths, BUDGET_TOKENS, BUDGET_ROWS, PAD_MULTIPLE)
    return {"premises": premises, "hypotheses": hypotheses, "lengths": lengths, "flat": flat, "offsets": offsets,
            "plan": plan}


def _rounds(impl: ModuleType) -> int:
    return 3 if impl is _schedule else 1


def _fill_all(impl: ModuleType, w: dict[str, Any]) -> None:
    plan = w["plan"]
    for b in range(plan.num_batches):
        impl.fill_batch(w["flat"], w["offsets"], plan.batch_rows(b), int(plan.seq_lens[b]), PAD_ID)


@pytest.mark.parametrize("impl", IMPLS)
def test_bench_dedup(benchmark: Any, impl: ModuleType, workload: dict[str, Any]) -> None:
    first, inverse = benchmark.pedantic(
        impl.dedup_pairs, args=(workload["premises"], workload["hypotheses"]), rounds=_rounds(impl), iterations=1
    )
    assert first.shape[0] == workload["lengths"].shape[0] and inverse.shape[0] == N_PAIRS


@pytest.mark.parametrize("impl", IMPLS)
def test_bench_plan(benchmark: Any, impl: ModuleType, workload: dict[str, Any]) -> None:
    plan = benchmark.pedantic(
        impl.plan_batches, args=(workload["lengths"], BUDGET_TOKENS, BUDGET_ROWS, PAD_MULTIPLE),
        rounds=_rounds(impl), iterations=1,
    )
    assert plan.num_batches == workload["plan"].num_batches


@pytest.mark.parametrize("impl", IMPLS)
def test_bench_fill_all_batches(benchmark: Any, impl: ModuleType, workload: dict[str, Any]) -> None:
    benchmark.extra_info["batches"] = workload["plan"].num_batches
    benchmark.pedantic(_fill_all, args=(impl, workload), rounds=_rounds(impl), iterations=1)


@pytest.mark.parametrize("impl", IMPLS)
def test_bench_dedup_plan_fill(benchmark: Any, impl: ModuleType, workload: dict[str, Any]) -> None:
    """The whole scheduling path the goals refer to (compiled: >= 10x the reference, < 2 s)."""

    def run() -> None:
        first, _ = impl.dedup_pairs(workload["premises"], workload["hypotheses"])
        plan = impl.plan_batches(workload["lengths"][: first.shape[0]], BUDGET_TOKENS, BUDGET_ROWS, PAD_MULTIPLE)
        for b in range(plan.num_batches):
            impl.fill_batch(workload["flat"], workload["offsets"], plan.batch_rows(b), int(plan.seq_lens[b]), PAD_ID)

    benchmark.pedantic(run, rounds=_rounds(impl), iterations=1)


def test_padding_efficiency() -> None:
    """Length-sorted planning at 8192 tokens / 64 rows keeps >= 95% real tokens; FIFO chunks of 32 do not."""
    lengths = make_lengths(100_000, seed=3)
    plan = _schedule.plan_batches(lengths, BUDGET_TOKENS, BUDGET_ROWS, 1)
    fifo = fifo_efficiency(lengths, BUDGET_TOKENS, FIFO_CHUNK)
    assert plan.padding_efficiency >= 0.95
    assert plan.padding_efficiency > fifo
    assert np.all(np.diff(plan.bounds) <= BUDGET_ROWS)
