"""Parity: fastnli's ``score`` against uqlm 0.6.7 itself, on the same seeded checkpoint, every NLI scorer.

uqlm runs in its own venv (:func:`bench.uqlm_peer.run_uqlm`: ``BlackBoxUQ`` on PyTorch, CPU);
fastnli scores the same workload with its fp32 ONNX export of the same checkpoint. Scores must agree within 1e-4
(the two runtimes differ by float rounding only), and with ``use_best=True`` fastnli must pick the response uqlm
swaps in. The first run builds ``.venv-uqlm`` (about a minute, needs the package registry).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
from conftest import uqlm_qa_workload

from bench.uqlm_peer import SUPPORTED_SCORERS, UqlmResult, ensure_uqlm_env, run_uqlm
from fastnli.engine import NLIEngine
from fastnli.scorers import ScoreResult, score

pytestmark = pytest.mark.uqlm

TOL = 1e-4


def _workload() -> tuple[list[str], list[list[str]]]:
    """The shared 12 x 5 QA workload plus two prompts with texts over uqlm's max_length=2000 characters.

    uqlm cuts every text to 2000 characters before tokenising. The long texts here stay under the 512-token limit,
    so only that character cut decides what the model sees (without it fastnli's NCP differs by ~8e-4 on the
    DeBERTa v1 checkpoint). Two different texts share their first 2000 characters: they are still scored by the
    model, not as identical strings."""
    responses, sampled = uqlm_qa_workload()
    head = ("The capital of France visits the museum in 1848. " * 41)[:2000]
    long = head + " " + "Two children never was the river bank at night. " * 4
    long2 = head + " " + "A young girl sells an old car in Rome. " * 4
    responses += ["Paris", long]
    sampled += [["Paris is the capital of France.", "Lyon", "Paris", "The capital of France visits the museum.", "Paris"],
                ["Two children never was the river bank at night.", long2, head[:48], long, long2]]
    return responses, sampled


RESPONSES, SAMPLED = _workload()

# (checkpoint fixture, export fixture, use_best): both use_best settings on DeBERTa v1, one on DeBERTa-v2.
CONFIGS = {
    "deberta-use_best=False": ("ckpt_v1", "art_v1_fp32", False),
    "deberta-use_best=True": ("ckpt_v1", "art_v1_fp32", True),
    "deberta-v2-use_best=True": ("ckpt_v2_cne", "art_v2_cne", True),
}


@pytest.fixture(scope="module")
def uqlm_python() -> Path:
    pytest.importorskip("torch")
    return ensure_uqlm_env()


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[UqlmResult, ScoreResult]]:
    """Results per configuration, so that each configuration runs uqlm once per module."""
    return {}


def _run_both(request: pytest.FixtureRequest, config: str, uqlm_python: Path,
              runs: dict[str, tuple[UqlmResult, ScoreResult]]) -> tuple[UqlmResult, ScoreResult]:
    if config in runs:
        return runs[config]
    ckpt_name, art_name, use_best = CONFIGS[config]
    ckpt, art = request.getfixturevalue(ckpt_name), request.getfixturevalue(art_name)
    responses, sampled = copy.deepcopy(RESPONSES), copy.deepcopy(SAMPLED)
    ref = run_uqlm(ckpt, responses, sampled, scorers=SUPPORTED_SCORERS, use_best=use_best, python=uqlm_python,
                   torch_threads=1)
    engine = NLIEngine.from_pretrained(art, device="cpu", precision="fp32")
    engine.predict([("warm", "up")])  # ORT's first run, outside the timed call (as the runner's warm-up for uqlm)
    ours = score(responses, sampled, scorers=SUPPORTED_SCORERS, engine=engine, use_best=use_best)
    assert (responses, sampled) == (RESPONSES, SAMPLED), "inputs were mutated"
    request.node.user_properties += [("uqlm_seconds", ref.seconds), ("uqlm_nli_seconds", ref.nli_seconds),
                                     ("uqlm_nli_pairs", ref.num_nli_pairs), ("fastnli_seconds", ours.seconds),
                                     ("fastnli_pairs", ours.stats.pairs_in)]
    runs[config] = ref, ours
    return ref, ours


def _worst(ref: UqlmResult, ours: ScoreResult, scorer: str) -> tuple[float, int]:
    deltas = []
    for u, f in zip(ref.scores[scorer], ours.column(scorer)):
        assert f is not None and math.isfinite(u), (scorer, u, f)
        deltas.append(abs(u - f))
    i = max(range(len(deltas)), key=deltas.__getitem__)
    return deltas[i], i


def _describe(i: int, ref: UqlmResult, ours: ScoreResult, scorer: str) -> str:
    row = ours[i]

    def short(t: str | None) -> str:
        return repr(t) if t is None or len(t) <= 80 else f"{t[:60]!r}... ({len(t)} characters)"

    samples = ", ".join(short(t) for t in SAMPLED[i])
    return (f"prompt {i}: response={short(RESPONSES[i])} samples=[{samples}]; "
            f"{scorer}: uqlm={ref.scores[scorer][i]!r} "
            f"fastnli={getattr(row, scorer)!r}; uqlm response={short(ref.responses[i])}, fastnli "
            f"best_response={short(row.best_response)}, fastnli semantic sets={row.num_semantic_sets}")


@pytest.mark.parametrize("config", list(CONFIGS))
def test_scores_match_uqlm(request: pytest.FixtureRequest, config: str, uqlm_python: Path,
                           runs: dict[str, tuple[UqlmResult, ScoreResult]]) -> None:
    ref, ours = _run_both(request, config, uqlm_python, runs)
    use_best = CONFIGS[config][2]
    assert len(ours) == len(RESPONSES) and all(len(v) == len(RESPONSES) for v in ref.scores.values())

    # The response the consistency scores refer to: uqlm's swap (use_best) must be fastnli's best_response.
    if use_best:
        best = [r.best_response for r in ours]
        bad = [i for i, (u, f) in enumerate(zip(ref.responses, best)) if u != f]
        assert not bad, "use_best picks a different response; " + _describe(bad[0], ref, ours, "noncontradiction")
    else:
        assert ref.responses == RESPONSES and all(r.best_response is None for r in ours)

    worst = {s: _worst(ref, ours, s) for s in SUPPORTED_SCORERS}
    request.node.user_properties += [(f"max_abs_delta_{s}", d) for s, (d, _) in worst.items()]
    failures = [f"max |Δ| {s} = {d:.3g} > {TOL}; worst {_describe(i, ref, ours, s)}"
                for s, (d, i) in worst.items() if d > TOL]
    assert not failures, "\n".join(failures)


def test_workload_exercises_the_swap_and_the_shortcuts(request: pytest.FixtureRequest, uqlm_python: Path,
                                                       runs: dict[str, tuple[UqlmResult, ScoreResult]]) -> None:
    """Guards the workload itself: use_best swaps some responses, identical strings skip the model, the clusters
    vary, so the parity above covers those paths."""
    ref, ours = _run_both(request, "deberta-use_best=True", uqlm_python, runs)
    assert any(u != r for u, r in zip(ref.responses, RESPONSES)), "no response swapped: the workload is too easy"
    assert ref.scores["noncontradiction"][0] == 1.0 == ours[0].noncontradiction  # all samples equal the response
    assert len({r.num_semantic_sets for r in ours}) >= 3
    assert "" in SAMPLED[3] and max(map(len, RESPONSES)) > 2000  # an empty sample, a text over uqlm's max_length

