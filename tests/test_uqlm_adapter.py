"""``FastNLI``, fastnli's drop-in for uqlm's ``NLI`` object: its interface here, and uqlm's own scorers on it.

The unit tests need neither uqlm nor its venv. The ``uqlm``-marked tests install fastnli into uqlm's venv
(``ensure_uqlm_env(with_fastnli=True)``: about 30 s the first time, seconds after a source change, nothing after
that) and run uqlm's ``ConsistencyScorer(nli=FastNLI(...))`` and ``BlackBoxUQ`` there.
"""

from __future__ import annotations

import copy
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RAGGED_PAIRS, torch_probs, uqlm_qa_workload

from bench.uqlm_peer import (
    CONSISTENCY_SCORERS,
    SUPPORTED_SCORERS,
    UqlmResult,
    ensure_uqlm_env,
    run_uqlm,
)
from fastnli.engine import NLIEngine
from fastnli.engine.labels import CONTRADICTION, ENTAILMENT
from fastnli.scorers import score
from fastnli.scorers.uqlm_adapter import FastNLI

TOL = 1e-4


@pytest.fixture(scope="module")
def engine(art_v1_fp32: Path) -> NLIEngine:
    return NLIEngine.from_pretrained(art_v1_fp32, device="cpu", precision="fp32")


class EngineSpy:
    """Wraps ``engine.predict`` and records the pairs of every call."""

    def __init__(self, nli: FastNLI, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[tuple[str, str]]] = []
        original = nli.engine.predict

        def predict(pairs: Any) -> np.ndarray:
            self.calls.append(list(pairs))
            return original(pairs)

        monkeypatch.setattr(nli.engine, "predict", predict)


# --- the interface, in fastnli's own environment (no uqlm) ---------------------------------------------------------


def test_predict_batch_shape_dtype_and_canonical_order(art_v2_fp32: Path, ckpt_v2: Path) -> None:
    # ckpt_v2 stores its labels as C/E/N: FastNLI must still answer in uqlm's C/N/E order.
    nli = FastNLI(art_v2_fp32, device="cpu", precision="fp32")
    assert nli.label_mapping == ["contradiction", "neutral", "entailment"]
    assert nli.engine.device == "cpu" and nli.engine.precision == "fp32"
    probs = nli.predict_batch(RAGGED_PAIRS)
    assert probs.shape == (len(RAGGED_PAIRS), 3) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(probs, torch_probs(ckpt_v2, RAGGED_PAIRS), atol=TOL)
    # one row per input pair, in input order
    np.testing.assert_allclose(nli.predict_batch(RAGGED_PAIRS[::-1]), probs[::-1], atol=1e-6)
    one = nli.predict(*RAGGED_PAIRS[0])
    assert one.shape == (1, 3)
    np.testing.assert_allclose(one[0], probs[0], atol=1e-6)


def test_nli_results_follow_uqlm_formula(engine: NLIEngine) -> None:
    nli = FastNLI(engine)
    pairs = [("Paris", "Lyon"), ("A man plays the ball.", "A man is outside."), ("", "The dog runs.")]
    results = nli.get_nli_results_batch(pairs)
    for (a, b), res in zip(pairs, results):
        left, right = engine.predict([(a, b), (b, a)])
        assert set(res) == {"noncontradiction_score", "entailment", "entailment_score"}
        assert res["noncontradiction_score"] == pytest.approx(
            (1 - left[CONTRADICTION] + 1 - right[CONTRADICTION]) / 2, abs=1e-6
        )
        assert res["entailment_score"] == pytest.approx((left[ENTAILMENT] + right[ENTAILMENT]) / 2, abs=1e-6)
        assert res["entailment"] == (left.argmax() == ENTAILMENT or right.argmax() == ENTAILMENT)
    assert nli.get_nli_results(*pairs[0]) == results[0]


def test_identical_strings_score_one_without_the_model(engine: NLIEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    nli = FastNLI(engine)
    spy = EngineSpy(nli, monkeypatch)
    expected = {"noncontradiction_score": 1, "entailment": True, "entailment_score": 1}
    assert nli.get_nli_results("Paris", "Paris") == expected
    assert nli.get_nli_results_batch([("", ""), ("Paris", "Paris")]) == [expected, expected]
    assert spy.calls == [] and nli.probabilities == {}


def test_cache_is_reused(engine: NLIEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    nli = FastNLI(engine)
    spy = EngineSpy(nli, monkeypatch)
    first = nli.get_nli_results_batch([("Paris", "Lyon"), ("Blue", "Grey")])
    # one engine call, both directions of each pair, as uqlm's NLI sends them
    assert spy.calls == [[("Paris", "Lyon"), ("Lyon", "Paris"), ("Blue", "Grey"), ("Grey", "Blue")]]
    assert set(nli.probabilities) == {("Paris", "Lyon"), ("Lyon", "Paris"), ("Blue", "Grey"), ("Grey", "Blue")}
    assert all(v.shape == (1, 3) for v in nli.probabilities.values())

    again = nli.get_nli_results_batch([("Lyon", "Paris"), ("Paris", "Lyon"), ("Grey", "Blue")])
    assert len(spy.calls) == 1, "cached pairs must not reach the engine again"
    assert again[1] == first[0]
    assert again[0]["noncontradiction_score"] == pytest.approx(first[0]["noncontradiction_score"], abs=1e-7)
    assert again[2]["entailment_score"] == pytest.approx(first[1]["entailment_score"], abs=1e-7)

    nli.get_nli_results_batch([("Paris", "Lyon"), ("Paris", "Rome")])  # one cached, one new
    assert spy.calls[1:] == [[("Paris", "Rome"), ("Rome", "Paris")]]


def test_empty_input(engine: NLIEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    nli = FastNLI(engine)
    spy = EngineSpy(nli, monkeypatch)
    assert nli.predict_batch([]).shape == (0, 3)
    assert nli.get_nli_results_batch([]) == []
    assert spy.calls == []


def test_long_texts_are_cut_as_uqlm_cuts_them(engine: NLIEngine, caplog: pytest.LogCaptureFixture) -> None:
    nli = FastNLI(engine, max_length=12)
    long = "The tallest mountain above sea level is Mount Everest."
    with caplog.at_level(logging.WARNING, logger="fastnli"):
        probs = nli.predict_batch([(long, "Everest"), ("Everest", long)])
    assert "max_length=12" in caplog.text
    np.testing.assert_allclose(probs, engine.predict([(long[:12], "Everest"), ("Everest", long[:12])]), atol=1e-6)


# --- installing fastnli into uqlm's venv: staging and the one-ONNX-Runtime rule (no venv needed) -------------------


def test_staging_copies_sources_only_and_keeps_build_products(tmp_path: Path) -> None:
    from bench import uqlm_peer

    src = tmp_path / "src"
    (src / "fastnli" / "kernels" / "__pycache__").mkdir(parents=True)
    for rel, text in {"setup.py": "setup()", "pyproject.toml": "[project]", "README.md": "# x",
                      "fastnli/__init__.py": "", "fastnli/kernels/_k.pyx": "# cython", "fastnli/kernels/_k.c": "/**/",
                      "fastnli/kernels/_k.cpython-311-x86_64-linux-gnu.so": "elf", "fastnli/old.py": "",
                      "fastnli/kernels/__pycache__/x.cpython-311.pyc": "pyc"}.items():
        (src / rel).write_text(text)
    files = uqlm_peer._source_files(src)
    assert sorted(files) == ["README.md", "fastnli/__init__.py", "fastnli/kernels/_k.pyx", "fastnli/old.py",
                             "pyproject.toml", "setup.py"]
    stage = tmp_path / "stage"
    assert uqlm_peer._stage(files, stage) == 6
    (stage / "fastnli/kernels/_k.c").write_text("generated in the stage")  # build products of an earlier install
    (stage / "build").mkdir()
    assert uqlm_peer._stage(files, stage) == 0

    before = uqlm_peer._fingerprint(files)
    (src / "fastnli/__init__.py").write_text("X = 1\n")
    (src / "fastnli/old.py").unlink()
    files = uqlm_peer._source_files(src)
    assert uqlm_peer._fingerprint(files) != before
    assert uqlm_peer._stage(files, stage) == 2  # one rewritten, one deleted
    assert (stage / "fastnli/__init__.py").read_text() == "X = 1\n" and not (stage / "fastnli/old.py").exists()
    assert (stage / "fastnli/kernels/_k.c").read_text() == "generated in the stage" and (stage / "build").is_dir()


def test_never_two_onnxruntimes(tmp_path: Path) -> None:
    from bench import uqlm_peer

    site = tmp_path / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    assert uqlm_peer._choose_onnxruntime(tmp_path, None) == "onnxruntime"  # nothing there: the CPU package
    (site / "onnxruntime_gpu-1.31.1.dist-info").mkdir()
    assert uqlm_peer._installed_onnxruntime(tmp_path) == ["onnxruntime-gpu"]
    assert uqlm_peer._choose_onnxruntime(tmp_path, None) == "onnxruntime-gpu"  # keep what is there
    with pytest.raises(RuntimeError, match="never install both"):
        uqlm_peer._choose_onnxruntime(tmp_path, "onnxruntime")
    (site / "onnxruntime-1.32.0.dist-info").mkdir()
    with pytest.raises(RuntimeError, match="both onnxruntime and onnxruntime-gpu"):
        uqlm_peer._choose_onnxruntime(tmp_path, None)
    with pytest.raises(ValueError, match="onnxruntime="):
        ensure_uqlm_env(tmp_path, onnxruntime="onnxruntime-cpu")


# --- uqlm's own scorers on FastNLI, inside uqlm's venv --------------------------------------------------------------

RESPONSES, SAMPLED = uqlm_qa_workload()


@pytest.fixture(scope="module")
def fastnli_in_uqlm_venv() -> Path:
    pytest.importorskip("torch")
    return ensure_uqlm_env(with_fastnli=True)


def _run(model: Path, python: Path, **kwargs: Any) -> UqlmResult:
    responses, sampled = copy.deepcopy(RESPONSES), copy.deepcopy(SAMPLED)
    res = run_uqlm(model, responses, sampled, python=python, torch_threads=1, **kwargs)
    assert (responses, sampled) == (RESPONSES, SAMPLED)
    if kwargs.get("nli") == "fastnli":  # the installed package with its compiled scheduler, not the source tree
        assert res.fastnli_kernels == "compiled", res.fastnli_kernels
        assert Path(res.fastnli_path).resolve().is_relative_to(python.parent.parent.resolve()), res.fastnli_path
    return res


def _max_delta(scorer: str, a: list[float], b: list[float | None]) -> tuple[float, str]:
    assert len(a) == len(b) == len(RESPONSES)
    deltas = [abs(x - y) if y is not None and math.isfinite(x) else math.inf for x, y in zip(a, b)]
    i = int(np.argmax(deltas))
    return deltas[i], f"{scorer}: worst prompt {i} response={RESPONSES[i]!r} samples={SAMPLED[i]!r}: {a[i]} vs {b[i]}"


@pytest.mark.uqlm
@pytest.mark.parametrize("use_best", [False, True], ids=["use_best=False", "use_best=True"])
def test_consistency_scorer_on_fastnli_matches_native_nli(
    use_best: bool, ckpt_v1: Path, art_v1_fp32: Path, fastnli_in_uqlm_venv: Path
) -> None:
    """``ConsistencyScorer(nli=FastNLI(artifact, device="cpu", precision="fp32"))`` vs ``ConsistencyScorer()`` on
    uqlm's own NLI, same checkpoint. With use_best the scorer clusters through the NLI object's entailment flags."""
    common = {"api": "consistency", "scorers": CONSISTENCY_SCORERS, "use_best": use_best}
    native = _run(ckpt_v1, fastnli_in_uqlm_venv, nli="uqlm", **common)
    fast = _run(art_v1_fp32, fastnli_in_uqlm_venv, nli="fastnli", **common)
    assert (native.nli, fast.nli) == ("uqlm", "fastnli") and fast.api == "consistency"
    assert fast.responses == native.responses and fast.sampled_responses == native.sampled_responses
    # FastNLI keeps uqlm's cache and identical-string shortcut: the same pairs reach the model.
    assert (fast.num_nli_pairs, fast.nli_calls) == (native.num_nli_pairs, native.nli_calls)
    for s in CONSISTENCY_SCORERS:
        delta, where = _max_delta(s, native.scores[s], fast.scores[s])
        assert delta <= TOL, f"max |Δ| = {delta:.3g} > {TOL}; {where}"


@pytest.mark.uqlm
def test_blackbox_uq_on_fastnli_matches_fastnli_score(art_v1_fp32: Path, fastnli_in_uqlm_venv: Path) -> None:
    """uqlm's full BlackBoxUQ (all four NLI scorers, use_best) on FastNLI gives fastnli.score's numbers."""
    uq = _run(art_v1_fp32, fastnli_in_uqlm_venv, nli="fastnli", scorers=SUPPORTED_SCORERS, use_best=True)
    ours = score(RESPONSES, SAMPLED, scorers=SUPPORTED_SCORERS, use_best=True,
                 engine=NLIEngine.from_pretrained(art_v1_fp32, device="cpu", precision="fp32"))
    assert uq.responses == [r.best_response for r in ours]
    for s in SUPPORTED_SCORERS:
        delta, where = _max_delta(s, uq.scores[s], ours.column(s))
        assert delta <= TOL, f"max |Δ| = {delta:.3g} > {TOL}; {where}"


def test_run_uqlm_rejects_what_fastnli_cannot_run(ckpt_v1: Path, art_v1_fp32: Path) -> None:
    with pytest.raises(FileNotFoundError, match="export artifact"):
        run_uqlm(ckpt_v1, ["a"], [["b"]], nli="fastnli", python=Path("/nonexistent/python"))
    with pytest.raises(ValueError, match="api='consistency'"):
        run_uqlm(art_v1_fp32, ["a"], [["b"]], nli="fastnli", api="consistency", scorers=("semantic_negentropy",),
                 python=Path("/nonexistent/python"))
    with pytest.raises(ValueError, match="nli="):
        run_uqlm(ckpt_v1, ["a"], [["b"]], nli="onnx", python=Path("/nonexistent/python"))
