"""Smoke test: uqlm itself runs in its own venv on a tiny seeded checkpoint (bench.uqlm_peer).

The first run builds ``.venv-uqlm`` (about a minute, needs the package registry); later runs reuse it.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from bench.uqlm_peer import SUPPORTED_SCORERS, UqlmResult, ensure_uqlm_env, run_uqlm  # noqa: E402

pytestmark = pytest.mark.uqlm

RESPONSES = [
    "A man plays the ball.",
    "Paris is the capital of France.",
    "The dog runs to the park.",
]
SAMPLED = [
    # a duplicated sample and a sample identical to the response
    ["Two children eat a red apple.", "Two children eat a red apple.", "A man plays the ball."],
    # every sample equals the response: uqlm's identical-string shortcut gives exactly 1.0
    ["Paris is the capital of France."] * 3,
    ["The moon is blue.", "Berlin visits the museum.", "A small bird sees the river bank."],
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fastnli.exporter.checkpoint import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("uqlm") / "ck", arch="deberta", size="tiny")


@pytest.fixture(scope="module")
def uqlm_python() -> Path:
    return ensure_uqlm_env()


@pytest.fixture(scope="module")
def result(checkpoint: Path, uqlm_python: Path) -> UqlmResult:
    responses, sampled = copy.deepcopy(RESPONSES), copy.deepcopy(SAMPLED)
    res = run_uqlm(checkpoint, responses, sampled, scorers=SUPPORTED_SCORERS, python=uqlm_python, torch_threads=1)
    assert responses == RESPONSES and sampled == SAMPLED, "run_uqlm must not mutate its inputs"
    return res


def test_scores_are_finite_confidences(result: UqlmResult) -> None:
    assert set(result.scores) == set(SUPPORTED_SCORERS)
    for name, values in result.scores.items():
        assert len(values) == len(RESPONSES), name
        for v in values:
            assert math.isfinite(v) and 0.0 <= v <= 1.0, (name, values)


def test_identical_samples_score_exactly_one(result: UqlmResult) -> None:
    assert result.scores["noncontradiction"][1] == 1.0
    assert result.scores["entailment"][1] == 1.0
    assert result.scores["semantic_negentropy"][1] == 1.0
    assert result.scores["semantic_sets_confidence"][1] == 1.0


def test_metadata(result: UqlmResult) -> None:
    assert result.uqlm_version == "0.6.7"
    assert result.torch_version.startswith("2.13.0")
    assert result.numpy_version.startswith("1.")
    assert result.torch_threads == 1
    assert result.seconds > 0.0 and result.load_seconds > 0.0
    # uqlm sends both directions of every uncached, non-identical pair; prompt 1 needs none.
    assert result.num_nli_pairs > 0 and result.num_nli_pairs % 2 == 0
    # Upper bound: every (response, sample) pair and every pair among the 4 texts of each prompt, both ways.
    assert result.num_nli_pairs <= 2 * 3 * 6
    assert result.responses == RESPONSES and result.sampled_responses == SAMPLED  # use_best=False: unchanged


def test_use_best_swaps_in_the_majority_response(checkpoint: Path, uqlm_python: Path) -> None:
    # The samples' mode wins whatever the (random) model says: either it forms a 3/4 cluster or it is the mode
    # of the single cluster. uqlm then scores against it and returns the original response among the samples.
    responses = ["A man plays the ball."]
    sampled = [["The river is blue.", "The river is blue.", "The river is blue."]]
    res = run_uqlm(
        checkpoint,
        responses,
        sampled,
        scorers=("noncontradiction", "semantic_negentropy"),
        use_best=True,
        python=uqlm_python,
        torch_threads=1,
    )
    assert res.responses == ["The river is blue."]
    assert res.sampled_responses == [["A man plays the ball.", "The river is blue.", "The river is blue."]]
    nc = res.scores["noncontradiction"][0]
    assert 2 / 3 <= nc <= 1.0  # two of the three comparisons are identical strings (1.0 each)


def test_missing_checkpoint_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where a fork server would put its directory
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_uqlm(tmp_path / "no-such-checkpoint", ["a"], [["b"]], python=Path("/nonexistent/python"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        run_uqlm(tmp_path, ["a"], [["b"]], python=Path("/nonexistent/python"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="unsupported uqlm scorer"):
        run_uqlm(tmp_path, ["a"], [["b"]], scorers=("cosine_sim",), python=Path("/nonexistent/python"))
    with pytest.raises(RuntimeError, match="cannot start the uqlm runner"):
        run_uqlm(tmp_path, ["a"], [["b"]], python=Path("/nonexistent/python"))
    assert list(temp.iterdir()) == []  # a server that cannot start leaves no directory behind


def test_a_forked_run_is_a_fresh_interpreters_run(checkpoint: Path, uqlm_python: Path, result: UqlmResult) -> None:
    """``result`` ran in a child of the fork server; a fresh interpreter gives the same scores, pairs and responses."""
    fresh = run_uqlm(checkpoint, RESPONSES, SAMPLED, scorers=SUPPORTED_SCORERS, python=uqlm_python, torch_threads=1,
                     reuse_imports=False)
    assert fresh.scores == result.scores
    assert (fresh.num_nli_pairs, fresh.nli_calls) == (result.num_nli_pairs, result.nli_calls)
    assert (fresh.responses, fresh.sampled_responses, fresh.torch_threads) == (
        result.responses, result.sampled_responses, result.torch_threads)


def test_a_failed_run_reports_its_traceback_and_the_server_serves_on(
        checkpoint: Path, uqlm_python: Path, result: UqlmResult, tmp_path: Path) -> None:
    from bench import uqlm_peer

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(RuntimeError, match=r"(?s)uqlm runner failed \(exit 1\) on checkpoint .*broken; stderr tail:"
                                           r".*Traceback.*no-such-architecture"):
        run_uqlm(broken, RESPONSES, SAMPLED, python=uqlm_python, torch_threads=1)
    servers = list(uqlm_peer._SERVERS.values())
    again = run_uqlm(checkpoint, RESPONSES, SAMPLED, scorers=SUPPORTED_SCORERS, python=uqlm_python, torch_threads=1)
    assert again.scores == result.scores
    assert list(uqlm_peer._SERVERS.values()) == servers and all(s.proc.poll() is None for s in servers)


def test_a_run_past_its_time_limit_kills_the_server_and_its_child(checkpoint: Path, uqlm_python: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import uqlm_peer

    started: list[uqlm_peer._ForkServer] = []

    class Recorded(uqlm_peer._ForkServer):
        def __init__(self, *args: object) -> None:
            super().__init__(*args)  # type: ignore[arg-type]
            started.append(self)

    monkeypatch.setattr(uqlm_peer, "_ForkServer", Recorded)
    env = {"FASTNLI_TEST_SERVER": "time-limit"}  # a server of its own (still importing uqlm when the limit falls)
    with pytest.raises(RuntimeError, match=r"uqlm runner timed out after 1 s; stderr tail:"):
        run_uqlm(checkpoint, RESPONSES, SAMPLED, python=uqlm_python, env=env, timeout_s=1)
    assert len(started) == 1 and started[0].proc.poll() is not None
    assert started[0] not in uqlm_peer._SERVERS.values() and not started[0].dir.exists()
