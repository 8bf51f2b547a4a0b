"""pytest-benchmark: the engine at small sizes (tiny seeded checkpoint), fastnli fp32/INT8 vs plain PyTorch.

Run with ``pytest bench/test_bench_engine.py``; the numbers are for comparison inside one run, never asserted.
The full side-by-side table (uqlm, deberta-large-shaped) is ``python -m bench``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.run import uqlm_pairs
from bench.workloads import short_workload
from fastnli.engine import NLIEngine
from fastnli.exporter import export
from fastnli.exporter.checkpoint import build_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("bench_engine")
    ck = build_checkpoint(d / "ck", arch="deberta", size="tiny")
    export(ck, d / "art", precisions=("fp32", "int8"), validate=False)
    return ck, d / "art"


PAIRS = uqlm_pairs(short_workload(100, 5))


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_engine_predict(benchmark, tiny: tuple[Path, Path], precision: str) -> None:  # type: ignore[no-untyped-def]
    engine = NLIEngine.from_pretrained(tiny[1], device="cpu", precision=precision)  # type: ignore[arg-type]
    probs = benchmark(engine.predict, PAIRS)
    assert probs.shape == (len(PAIRS), 3)


def test_pytorch_peer(benchmark, tiny: tuple[Path, Path]) -> None:  # type: ignore[no-untyped-def]
    from bench.peers import TorchPeer

    peer = TorchPeer(tiny[0])
    probs = benchmark(peer.predict, PAIRS)
    assert probs.shape == (len(PAIRS), 3)
