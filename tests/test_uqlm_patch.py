"""``fastnli.patch_uqlm()``: unchanged uqlm code on fastnli's engine.

The first part runs in fastnli's own environment (no uqlm there): what the patch does to uqlm's modules, its errors,
restoring and repeating it, on a stand-in package laid out as uqlm 0.6.7 lays out its NLI seam (the module names,
the ``from uqlm.nli.nli import NLI`` bindings and ``NLI``'s signature), written per test into ``tmp_path``.

The ``uqlm``-marked part runs the real uqlm 0.6.7 in its own venv (``$FASTNLI_UQLM_VENV`` or
``<checkout>/.venv-uqlm``; skipped when there is none: these tests never install it) for each entry point, twice
with the same code: on uqlm's own PyTorch NLI, and after ``fastnli.patch_uqlm()`` (fastnli imported from this
source tree), on the same seeded checkpoint, which fastnli finds exported in its cache.
"""

from __future__ import annotations

import importlib
import logging
import math
import re
import shutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import uqlm_qa_workload

import fastnli
from fastnli.engine import NLIEngine
from fastnli.engine.engine import cached_artifact_dir
from fastnli.scorers import uqlm_patch
from fastnli.scorers.uqlm_adapter import FastNLI

TOL = 1e-4
REPO = Path(__file__).resolve().parents[1]

# --- a stand-in for uqlm's seam ---------------------------------------------------------------------------------------

NLI_CLASS = '''
class NLI:
    def __init__(self, device=None, verbose=False, nli_model_name="microsoft/deberta-large-mnli", max_length=2000,
                 batch_size=32, use_fp16=False, device_map=None):
        raise AssertionError("uqlm's own NLI must not be built while patched")
'''
BUILDER = '''
from uqlm.nli.nli import NLI

def build(**kwargs):
    return NLI(**kwargs)
'''
SEAM_FILES = {
    "uqlm/__init__.py": '__version__ = "0.6.7"\n',
    "uqlm/nli/__init__.py": "from uqlm.nli.nli import NLI\n",
    "uqlm/nli/nli.py": NLI_CLASS,
    "uqlm/scorers/__init__.py": "",
    "uqlm/scorers/shortform/__init__.py": "",
    "uqlm/scorers/shortform/black_box.py": BUILDER,
    "uqlm/scorers/baseclass/__init__.py": "",
    "uqlm/scorers/baseclass/uncertainty.py": BUILDER,
    "uqlm/black_box/__init__.py": "",
    "uqlm/black_box/consistency.py": BUILDER,
    "uqlm/white_box/__init__.py": "",
    "uqlm/white_box/sampled_logprobs.py": BUILDER,
    "uqlm/utils/__init__.py": "",
    "uqlm/utils/notes.py": '"""Mentions uqlm.nli.NLI in prose only."""\n',
}
SEAMS = ("uqlm.black_box.consistency", "uqlm.scorers.baseclass.uncertainty", "uqlm.scorers.shortform.black_box",
         "uqlm.white_box.sampled_logprobs")
WHERE = ("uqlm 0.6.7 (fastnli.patch_uqlm() is tested against uqlm 0.6.7; pip install 'uqlm==0.6.7')")


def _forget_uqlm() -> None:
    for name in [m for m in sys.modules if m == "uqlm" or m.startswith("uqlm.")]:
        del sys.modules[name]


@pytest.fixture
def fake_uqlm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Writes the stand-in package (tests may edit ``files`` first: it is written on the first ``_write``)."""
    files = dict(SEAM_FILES)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    _forget_uqlm()
    yield files
    uqlm_patch.unpatch_uqlm()
    _forget_uqlm()


def _write(files: dict[str, str], root: Path) -> None:
    for rel, text in files.items():
        path = root / "site" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    importlib.invalidate_caches()


def _bindings() -> dict[str, Any]:
    return {m: importlib.import_module(m).NLI for m in SEAMS}


def test_uqlm_missing_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uqlm_patch.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=re.escape(
            "fastnli.patch_uqlm() needs uqlm, which is not installed: pip install 'uqlm==0.6.7' (fastnli is tested "
            "against uqlm 0.6.7)")):
        fastnli.patch_uqlm()
    assert not uqlm_patch.uqlm_patched()


def test_patch_rebinds_every_builder_and_unpatch_restores(fake_uqlm: dict[str, str], tmp_path: Path,
                                                          art_v1_fp32: Path, caplog: pytest.LogCaptureFixture) -> None:
    _write(fake_uqlm, tmp_path)
    from uqlm.nli.nli import NLI

    patch = fastnli.patch_uqlm()
    assert patch.modules == SEAMS and patch.uqlm_version == "0.6.7"
    assert (patch.precision, patch.device) == ("fp32", None)
    assert all(b is uqlm_patch._build_nli for b in _bindings().values())
    assert importlib.import_module("uqlm.nli").NLI is NLI, "uqlm's class itself stays as it is"

    # uqlm's arguments decide the model and max_length; uqlm's own defaults fill the rest (device=None -> auto)
    bb = importlib.import_module("uqlm.scorers.shortform.black_box")
    nli = bb.build(nli_model_name=str(art_v1_fp32), max_length=12, batch_size=7, verbose=True)
    assert isinstance(nli, FastNLI) and nli.max_length == 12
    assert (nli.engine.artifact_dir, nli.engine.precision, nli.engine.device) == (art_v1_fp32, "fp32", "cpu")
    again = importlib.import_module("uqlm.black_box.consistency").build(nli_model_name=str(art_v1_fp32))
    assert again.engine is nli.engine and again.max_length == 2000 and again is not nli
    assert f"uqlm NLI(nli_model_name={str(art_v1_fp32)!r}, device=None) -> fastnli" in caplog.text

    assert fastnli.unpatch_uqlm() is True
    assert all(b is NLI for b in _bindings().values())
    assert fastnli.unpatch_uqlm() is False
    with pytest.raises(RuntimeError, match=re.escape(
            "fastnli.unpatch_uqlm() already restored uqlm's NLI; call fastnli.patch_uqlm() again")):
        uqlm_patch._build_nli(nli_model_name=str(art_v1_fp32))


def test_patch_twice_keeps_uqlms_class_and_the_with_block_restores(fake_uqlm: dict[str, str], tmp_path: Path,
                                                                   art_v1_fp32: Path) -> None:
    _write(fake_uqlm, tmp_path)
    from uqlm.nli.nli import NLI

    bb = importlib.import_module("uqlm.scorers.shortform.black_box")
    with fastnli.patch_uqlm(art_v1_fp32, device="cpu") as outer:
        first = bb.build(nli_model_name="never/read").engine
        assert first.artifact_dir == art_v1_fp32
        with fastnli.patch_uqlm(precision="auto", batch_policy=first.batch_policy) as inner:
            assert (inner.modules, inner.precision, inner.device) == (outer.modules, "auto", None)
            nli = bb.build(nli_model_name=str(art_v1_fp32), device="cpu")
            assert nli.engine is not first and nli.engine.artifact_dir == art_v1_fp32
        # back to the outer settings, still patched, the saved originals still uqlm's class
        assert uqlm_patch.uqlm_patched()
        assert bb.build(nli_model_name="never/read").engine.artifact_dir == art_v1_fp32
        assert uqlm_patch._STATE is not None and set(uqlm_patch._STATE.originals.values()) == {NLI}
    assert not uqlm_patch.uqlm_patched() and all(b is NLI for b in _bindings().values())


def test_patch_with_an_engine(fake_uqlm: dict[str, str], tmp_path: Path, art_v1_fp32: Path) -> None:
    _write(fake_uqlm, tmp_path)
    engine = NLIEngine.from_pretrained(art_v1_fp32, device="cpu", precision="fp32")
    with fastnli.patch_uqlm(engine):
        nli = importlib.import_module("uqlm.black_box.consistency").build(max_length=50)
        assert nli.engine is engine and nli.max_length == 50
    with pytest.raises(ValueError, match=re.escape(
            "patch_uqlm(model=<NLIEngine>) runs that engine as it is; pass device=/engine arguments with a model "
            "name or path instead")):
        fastnli.patch_uqlm(engine, device="cpu")


SEAM_CHANGES = {
    "an entry point's module no longer builds NLI": (
        "uqlm/black_box/consistency.py", "from uqlm.nli.nli import NLI\n\ndef build(nli):\n    return nli\n",
        "['uqlm.black_box.consistency'] no longer build uqlm's NLI, so the patch would not reach BlackBoxUQ / "
        "ConsistencyScorer / SemanticEntropy; pass nli=FastNLI(...) instead"),
    "NLI built through a module attribute": (
        "uqlm/white_box/sampled_logprobs.py", "import uqlm.nli.nli as n\n\ndef build():\n    return n.NLI()\n",
        "uqlm.white_box.sampled_logprobs builds NLI through a module attribute, out of the patch's reach; pass "
        "nli=FastNLI(...) to uqlm's scorers instead"),
    "NLI takes other arguments": (
        "uqlm/nli/nli.py", "class NLI:\n    def __init__(self, model_name='m', device=None):\n        pass\n",
        "uqlm.nli.nli.NLI takes no ['nli_model_name', 'max_length'], which the patch reads; pass nli=FastNLI(...) to "
        "uqlm's scorers instead"),
}


@pytest.mark.parametrize("change", list(SEAM_CHANGES))
def test_a_seam_that_differs_is_refused(change: str, fake_uqlm: dict[str, str], tmp_path: Path) -> None:
    path, text, message = SEAM_CHANGES[change]
    fake_uqlm[path] = text
    _write(fake_uqlm, tmp_path)
    with pytest.raises(RuntimeError, match=re.escape(f"{WHERE}: {message}")):
        fastnli.patch_uqlm()
    assert not uqlm_patch.uqlm_patched()
    assert importlib.import_module("uqlm.scorers.shortform.black_box").NLI is importlib.import_module(
        "uqlm.nli.nli").NLI, "a refused patch leaves uqlm as it was"


def test_a_name_replaced_by_someone_else_is_left_alone(fake_uqlm: dict[str, str], tmp_path: Path) -> None:
    _write(fake_uqlm, tmp_path)
    bb = importlib.import_module("uqlm.scorers.shortform.black_box")

    def by_hand(**kwargs: Any) -> None:
        return None

    bb.NLI = by_hand
    with pytest.raises(RuntimeError, match=re.escape(
            f"{WHERE}: uqlm.scorers.shortform.black_box.NLI is {by_hand!r}, not uqlm.nli.nli.NLI; something else "
            "replaced it, and the patch leaves it alone")):
        fastnli.patch_uqlm()
    assert bb.NLI is by_hand and not uqlm_patch.uqlm_patched()


@pytest.mark.parametrize(("device", "expected"), [
    (None, ("auto", None)), ("cpu", ("cpu", None)), ("cuda", ("cuda", None)), ("cuda:1", ("cuda", 1)),
    ("mps", ("auto", None)),
])
def test_uqlm_devices_map_to_fastnli_devices(device: str | None, expected: tuple[str, int | None],
                                              caplog: pytest.LogCaptureFixture) -> None:
    assert uqlm_patch._fastnli_device(device) == expected
    if device == "mps":
        assert "uqlm asked for device 'mps'; fastnli runs ONNX Runtime on CUDA or CPU: device='auto'" in caplog.text


# --- the real uqlm, in its venv: each entry point on its own NLI and patched -----------------------------------------


def _uqlm_python() -> Path:
    from bench.uqlm_peer import default_uqlm_venv, ready_uqlm_python

    python = ready_uqlm_python()
    if python is None:
        pytest.skip(f"no uqlm venv at {default_uqlm_venv()} (set FASTNLI_UQLM_VENV to one, or build it with "
                    "bench.uqlm_peer.ensure_uqlm_env(); these tests install nothing)")
    return python


def _workload() -> tuple[list[str], list[list[str]], list[str]]:
    """The shared 12 x 5 QA workload, one prompt whose texts pass uqlm's max_length (2000 characters), and a
    question per prompt."""
    responses, sampled = uqlm_qa_workload()
    head = ("The river bank floods in spring and the town moves its market uphill. " * 30)[:2000]
    responses.append(head + " It returns in May.")
    sampled.append([head + " It returns in June.", "The market stays.", head + " It returns in May.", "", "May"])
    prompts = [f"Question {i}: what is the answer?" for i in range(len(responses))]
    return responses, sampled, prompts


RESPONSES, SAMPLED, PROMPTS = _workload()
SCORERS = ("noncontradiction", "entailment", "semantic_negentropy", "semantic_sets_confidence")
# entry point -> run_uqlm arguments: each uqlm class with its own use_best default
ENTRY_POINTS: dict[str, dict[str, Any]] = {
    "BlackBoxUQ.score": {"api": "blackbox", "scorers": SCORERS, "use_best": True},
    "BlackBoxUQ.generate_and_score": {"api": "generate_and_score", "scorers": SCORERS, "use_best": True,
                                      "prompts": PROMPTS,
                                      "llm_answers": [[r, *s] for r, s in zip(RESPONSES, SAMPLED)]},
    "ConsistencyScorer.evaluate": {"api": "consistency", "scorers": ("noncontradiction", "entailment"),
                                   "use_best": False},
    "SemanticEntropy.score": {"api": "semantic_entropy", "use_best": True, "prompts": PROMPTS},
}


@pytest.fixture(scope="module")
def uqlm_env(ckpt_v1: Path, art_v1_fp32: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The venv's python and the runner's environment: fastnli from this tree, the checkpoint's export in a cache."""
    python = _uqlm_python()
    cache = tmp_path_factory.mktemp("fastnli-cache")
    shutil.copytree(art_v1_fp32, cached_artifact_dir(ckpt_v1, cache))
    return {"python": python, "env": {"PYTHONPATH": str(REPO), "FASTNLI_CACHE": str(cache)}}


def _max_delta(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) == len(RESPONSES)
    return max(abs(x - y) if math.isfinite(x) and math.isfinite(y) else (0.0 if x == y else math.inf)
               for x, y in zip(a, b))


@pytest.mark.uqlm
@pytest.mark.parametrize("entry_point", list(ENTRY_POINTS))
def test_uqlm_entry_point_patched_matches_uqlm(request: pytest.FixtureRequest, entry_point: str, ckpt_v1: Path,
                                               uqlm_env: dict[str, Any]) -> None:
    from bench.uqlm_peer import run_uqlm

    kwargs = ENTRY_POINTS[entry_point]
    runs = {nli: run_uqlm(ckpt_v1, RESPONSES, SAMPLED, nli=nli, python=uqlm_env["python"], env=uqlm_env["env"],
                          torch_threads=1, return_probabilities=True, **kwargs) for nli in ("uqlm", "patch")}
    native, patched = runs["uqlm"], runs["patch"]
    # the same uqlm code: uqlm's torch NLI once, then fastnli's (from this source tree) and no torch NLI at all
    assert (native.nli_class, native.uqlm_nli_built) == ("uqlm.nli.nli.NLI", 1)
    assert (patched.nli_class, patched.uqlm_nli_built) == ("fastnli.scorers.uqlm_adapter.FastNLI", 0)
    assert Path(patched.fastnli_path).resolve() == REPO / "fastnli" / "__init__.py"
    # the same pairs reach the model, the same responses come back (use_best swaps included)
    assert patched.num_nli_pairs == native.num_nli_pairs > 0
    assert (patched.responses, patched.sampled_responses) == (native.responses, native.sampled_responses)
    if kwargs["use_best"]:
        assert native.responses != RESPONSES, "no response swapped: the workload does not exercise use_best"
    if kwargs["api"] == "generate_and_score":
        assert patched.llm_calls == native.llm_calls == PROMPTS + [p for p in PROMPTS for _ in range(5)]
        for i, (r, s) in enumerate(zip(native.responses, native.sampled_responses)):
            assert sorted([r, *s]) == sorted([RESPONSES[i], *SAMPLED[i]]), "the scripted answers were not used"

    deltas = {s: _max_delta(native.scores[s], patched.scores[s]) for s in native.scores}
    assert set(native.nli_probabilities) == set(patched.nli_probabilities)
    deltas["NLI probabilities"] = float(max(
        np.max(np.abs(np.subtract(native.nli_probabilities[k], patched.nli_probabilities[k])))
        for k in native.nli_probabilities))
    request.node.user_properties += [(f"max_abs_delta[{k}]", v) for k, v in deltas.items()]
    logging.getLogger("fastnli").info("%s: max |Δ| vs real uqlm %s", entry_point, deltas)
    assert max(deltas.values()) <= TOL, deltas


def test_run_uqlm_refuses_entry_points_without_their_inputs(ckpt_v1: Path, art_v1_fp32: Path) -> None:
    from bench.uqlm_peer import run_uqlm

    nowhere = Path("/nonexistent/python")
    with pytest.raises(ValueError, match=re.escape(
            "api='generate_and_score' needs prompts and llm_answers, one list of answers per prompt")):
        run_uqlm(ckpt_v1, ["a"], [["b"]], api="generate_and_score", prompts=["q"], python=nowhere)
    with pytest.raises(ValueError, match=re.escape("api='semantic_entropy' runs on fastnli through nli='patch'")):
        run_uqlm(art_v1_fp32, ["a"], [["b"]], nli="fastnli", api="semantic_entropy", python=nowhere)
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        run_uqlm(art_v1_fp32, ["a"], [["b"]], nli="patch", python=nowhere)
