"""Run uqlm itself, in its own virtual environment, as the reference for fastnli's parity checks.

uqlm 0.6.7 pins ``numpy<2`` on Python < 3.13 while ``datasets`` (one of its dependencies) pulls the newest
``pyarrow``, which since 26.0 refuses to import with NumPy 1.x. Such pins clash with fastnli's own environment,
so uqlm is installed into a separate venv (:func:`ensure_uqlm_env`) and driven through a subprocess that reads and
writes JSON (:func:`run_uqlm`, which executes ``_uqlm_runner.py`` next to this module).

The working set, found by installing it (Python 3.11, Linux, CPU):

1. ``pip install torch==2.13.0`` (first, so that uqlm's ``torch>=2.6`` is already met by the CPU build);
2. ``pip install torch==2.13.0 uqlm==0.6.7 "numpy<2; python_version < '3.13'" "pyarrow<26"``.

That resolves to numpy 1.26.4, pyarrow 25.0.1, transformers 4.57.x, datasets 4.x, scipy 1.17.x.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "SUPPORTED_SCORERS",
    "TORCH_REQUIREMENT",
    "UQLM_REQUIREMENTS",
    "UQLM_VERSION",
    "UqlmResult",
    "default_uqlm_venv",
    "ensure_uqlm_env",
    "run_uqlm",
]

logger = logging.getLogger("fastnli")

#: The uqlm release fastnli is checked against.
UQLM_VERSION = "0.6.7"
#: Installed first, on its own, so pip never resolves torch unpinned (which would pull a CUDA build).
TORCH_REQUIREMENT = "torch==2.13.0"
#: Installed second (together with :data:`TORCH_REQUIREMENT` again, so it cannot move).
UQLM_REQUIREMENTS: tuple[str, ...] = (
    f"uqlm=={UQLM_VERSION}",
    # uqlm's own pin, restated so that every package is resolved against it.
    "numpy<2; python_version < '3.13'",
    # pyarrow>=26 raises "pyarrow requires NumPy 2.0 or newer" at import (datasets needs pyarrow>=21).
    "pyarrow<26",
)
#: uqlm's NLI-based black-box scorers that :func:`run_uqlm` drives.
SUPPORTED_SCORERS: tuple[str, ...] = (
    "noncontradiction",
    "entailment",
    "semantic_negentropy",
    "semantic_sets_confidence",
)

#: Environment variable naming the uqlm venv directory.
VENV_ENV_VAR = "FASTNLI_UQLM_VENV"

_MARKER_NAME = "fastnli-uqlm.json"
_LOCK_NAME = ".fastnli-uqlm.lock"
_RUNNER = Path(__file__).with_name("_uqlm_runner.py")
_TAIL_CHARS = 4000
_CHECK_SCRIPT = (
    "import importlib.metadata as m, json, sys\n"
    "import numpy, torch, transformers, uqlm\n"
    "from uqlm import BlackBoxUQ\n"
    "from uqlm.nli.nli import NLI\n"
    "names = ['uqlm', 'torch', 'transformers', 'tokenizers', 'numpy', 'pyarrow', 'datasets', 'scipy']\n"
    "v = {n: m.version(n) for n in names}\n"
    "v['python'] = sys.version.split()[0]\n"
    "print(json.dumps(v))\n"
)


@dataclass
class UqlmResult:
    """What one uqlm ``BlackBoxUQ.score`` run returned and cost.

    Attributes:
        scores: per scorer, one confidence per prompt; uqlm's NaN (and inf) come back as ``float("nan")``.
        seconds: wall seconds of the ``score()`` call alone, measured inside the runner (no model load, no
            warm-up, no interpreter start-up). Includes uqlm's own fixed ``time.sleep(0.1)`` per scorer family.
        load_seconds: wall seconds to construct ``BlackBoxUQ`` (tokenizer and model load).
        uqlm_version: ``uqlm.__version__`` in the venv.
        torch_version: ``torch.__version__`` in the venv.
        num_nli_pairs: premise/hypothesis pairs uqlm's ``NLI.predict_batch`` sent to the model during ``score()``
            (each direction counts; uqlm's caches and its identical-string shortcut are already applied).
        warmup_seconds: wall seconds of the untimed warm-up ``predict_batch`` call (0.0 without one).
        nli_calls: number of ``NLI.predict_batch`` calls during ``score()``.
        nli_seconds: wall seconds spent inside ``NLI.predict_batch`` (tokenization + forward + softmax).
        responses: the responses as uqlm returned them (replaced by the best response when ``use_best`` applied).
        sampled_responses: the sampled responses as uqlm returned them (the original response swapped in when
            ``use_best`` applied).
        transformers_version: ``transformers.__version__`` in the venv.
        numpy_version: ``numpy.__version__`` in the venv.
        torch_threads: ``torch.get_num_threads()`` in the runner.
    """

    scores: dict[str, list[float]]
    seconds: float
    load_seconds: float
    uqlm_version: str
    torch_version: str
    num_nli_pairs: int
    warmup_seconds: float = 0.0
    nli_calls: int = 0
    nli_seconds: float = 0.0
    responses: list[str] = field(default_factory=list)
    sampled_responses: list[list[str]] = field(default_factory=list)
    transformers_version: str = ""
    numpy_version: str = ""
    torch_threads: int = 0


def default_uqlm_venv() -> Path:
    """Return the uqlm venv directory used when none is given.

    ``$FASTNLI_UQLM_VENV`` if set, else ``<repository root>/.venv-uqlm`` when this module lives in a fastnli
    source checkout, else ``<current directory>/.venv-uqlm``.
    """
    env = os.environ.get(VENV_ENV_VAR)
    if env:
        return Path(env).expanduser()
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "fastnli" / "__init__.py").is_file():
        return root / ".venv-uqlm"
    return Path.cwd() / ".venv-uqlm"


def _venv_python(venv: Path) -> Path:
    """Path of the python executable inside ``venv``."""
    if os.name == "nt":
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def _requirements() -> list[str]:
    """Everything the venv is built from, in install order; stored in the marker to detect a changed spec."""
    return [TORCH_REQUIREMENT, *UQLM_REQUIREMENTS]


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The current environment without variables that would leak fastnli's interpreter into the venv's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    if extra:
        env.update(extra)
    return env


def _tail(*outputs: str | bytes | None, n: int = _TAIL_CHARS) -> str:
    """The last ``n`` characters of the joined process outputs (``"(no output)"`` if all are empty)."""
    parts = [o.decode("utf-8", "replace") if isinstance(o, bytes) else (o or "") for o in outputs]
    text = "\n".join(p for p in parts if p.strip()).strip()
    return text[-n:] if text else "(no output)"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (no-op where ``fcntl`` is unavailable)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_marker(venv: Path) -> dict[str, Any] | None:
    """The marker of a completed install whose spec matches the current one, else ``None``."""
    marker = venv / _MARKER_NAME
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("requirements") != _requirements():
        return None
    versions = data.get("versions")
    if not isinstance(versions, dict) or versions.get("uqlm") != UQLM_VERSION:
        return None
    if not os.access(_venv_python(venv), os.X_OK):
        return None
    return data


def _run_step(cmd: list[str], what: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run one install step; raise RuntimeError with the output tail if it fails."""
    logger.info("uqlm venv: %s", what)
    logger.debug("uqlm venv: running %s", " ".join(cmd))
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        out = _tail(exc.stdout, exc.stderr)
        raise RuntimeError(f"uqlm venv: {what} timed out after {timeout_s:.0f} s; output tail:\n{out}") from exc
    if proc.returncode != 0:
        out = _tail(proc.stdout, proc.stderr)
        raise RuntimeError(f"uqlm venv: {what} failed (exit {proc.returncode}); output tail:\n{out}")
    logger.info("uqlm venv: %s done in %.1f s", what, time.perf_counter() - t)
    return proc


def ensure_uqlm_env(
    path: str | Path | None = None,
    *,
    base_python: str | Path | None = None,
    force: bool = False,
    timeout_s: float = 1800.0,
) -> Path:
    """Create (once) the virtual environment that uqlm runs in, and return its python.

    An existing venv is reused without any subprocess when its marker file (``fastnli-uqlm.json``: the requirement
    list and the installed versions) matches :data:`TORCH_REQUIREMENT` + :data:`UQLM_REQUIREMENTS`. Otherwise
    the venv is created (or repaired in place: nothing is deleted), ``torch==2.13.0`` is installed, then uqlm with
    its pins, ``import uqlm; from uqlm import BlackBoxUQ`` is checked, and the marker is written. An exclusive lock
    file inside the venv directory serialises concurrent callers (POSIX only). Takes about a minute on a fresh
    machine with a warm pip cache; needs the package registry.

    Args:
        path: venv directory; default ``$FASTNLI_UQLM_VENV``, else ``<repo root or cwd>/.venv-uqlm``
            (see :func:`default_uqlm_venv`).
        base_python: interpreter that creates the venv; default ``sys.executable``. The pinned CPU torch wheel
            must exist for its Python version.
        force: reinstall even if the marker says the venv is complete. Default False.
        timeout_s: limit for each install step, in seconds. Default 1800.

    Returns:
        Path of the venv's python executable.

    Raises:
        RuntimeError: venv creation, a pip install or the import check failed; the message carries the output tail.
    """
    venv = Path(path).expanduser() if path is not None else default_uqlm_venv()
    venv = venv.absolute()
    python = _venv_python(venv)
    if not force:
        marker = _read_marker(venv)
        if marker is not None:
            logger.debug("uqlm venv: reusing %s (%s)", venv, marker.get("versions"))
            return python

    venv.mkdir(parents=True, exist_ok=True)
    with _file_lock(venv / _LOCK_NAME):
        if not force:  # another process may have finished the install while we waited for the lock
            marker = _read_marker(venv)
            if marker is not None:
                logger.debug("uqlm venv: reusing %s (%s)", venv, marker.get("versions"))
                return python
        t0 = time.perf_counter()
        base = str(base_python) if base_python is not None else sys.executable
        logger.info("uqlm venv: building %s with %s (uqlm %s)", venv, base, UQLM_VERSION)
        (venv / _MARKER_NAME).unlink(missing_ok=True)
        _run_step([base, "-m", "venv", str(venv)], f"create venv at {venv}", timeout_s)
        pip = [str(python), "-m", "pip", "install", "--no-input"]
        _run_step([*pip, TORCH_REQUIREMENT], f"pip install {TORCH_REQUIREMENT}", timeout_s)
        _run_step(
            [*pip, TORCH_REQUIREMENT, *UQLM_REQUIREMENTS], "pip install " + " ".join(UQLM_REQUIREMENTS), timeout_s
        )
        proc = _run_step([str(python), "-c", _CHECK_SCRIPT], "check `from uqlm import BlackBoxUQ`", timeout_s)
        try:
            versions = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise RuntimeError(f"uqlm venv: unexpected output of the import check:\n{_tail(proc.stdout)}") from exc
        if versions.get("uqlm") != UQLM_VERSION:
            raise RuntimeError(f"uqlm venv: installed uqlm {versions.get('uqlm')}, expected {UQLM_VERSION}")
        freeze = subprocess.run(
            [str(python), "-m", "pip", "freeze"], capture_output=True, text=True, env=_clean_env(), check=False
        ).stdout.split()
        seconds = time.perf_counter() - t0
        marker_data = {
            "requirements": _requirements(),
            "versions": versions,
            "freeze": freeze,
            "base_python": base,
            "install_seconds": round(seconds, 1),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        tmp = venv / (_MARKER_NAME + ".tmp")
        tmp.write_text(json.dumps(marker_data, indent=1), encoding="utf-8")
        tmp.replace(venv / _MARKER_NAME)
        logger.info("uqlm venv: ready in %.1f s: %s", seconds, versions)
    return python


def run_uqlm(
    checkpoint_dir: str | Path,
    responses: list[str],
    sampled_responses: list[list[str]],
    scorers: Sequence[str] = ("noncontradiction",),
    use_best: bool = False,
    batch_size: int = 32,
    python: Path | None = None,
    timeout_s: float = 3600,
    *,
    max_length: int = 2000,
    torch_threads: int | None = None,
    warmup: bool = True,
) -> UqlmResult:
    """Score ``responses`` against ``sampled_responses`` with uqlm's ``BlackBoxUQ`` on CPU, in uqlm's own venv.

    Runs ``BlackBoxUQ(scorers=..., nli_model_name=checkpoint_dir, device="cpu", use_best=..., nli_batch_size=...,
    max_length=...).score(responses, sampled_responses, show_progress_bars=False)`` in a subprocess with
    ``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1`` and ``CUDA_VISIBLE_DEVICES=""``. The caller's lists are never
    mutated (uqlm itself rewrites its inputs in place when ``use_best`` applies).

    Args:
        checkpoint_dir: local Hugging Face sequence-classification checkpoint (needs ``config.json``).
        responses: one original response per prompt.
        sampled_responses: the sampled responses of each prompt (uqlm normalises entropies with the count of the
            first prompt's samples).
        scorers: any of :data:`SUPPORTED_SCORERS`. Default ``("noncontradiction",)``.
        use_best: uqlm's ``use_best`` (uqlm's own default is True; ours is False). It only has an effect when an
            entropy scorer (``semantic_negentropy`` / ``semantic_sets_confidence``) is requested.
        batch_size: uqlm's ``nli_batch_size``: pairs per forward pass. Default 32.
        python: the uqlm venv's python; default :func:`ensure_uqlm_env` (creates the venv if needed).
        timeout_s: limit for the whole subprocess, in seconds. Default 3600.
        max_length: uqlm's per-string character cap before tokenisation. Default 2000 (uqlm's default).
        torch_threads: ``torch.set_num_threads`` in the runner; default None keeps torch's default (all cores).
        warmup: run one uncounted, untimed ``NLI.predict_batch`` call (two pairs) before ``score()`` so that
            ``seconds`` excludes torch's one-off first-call initialisation. Default True. Scores are unaffected
            (``predict_batch`` does not fill uqlm's NLI cache).

    Returns:
        The scores, timings (``seconds`` excludes model load) and the NLI pair count.

    Raises:
        FileNotFoundError: ``checkpoint_dir`` is not a directory with a ``config.json``.
        ValueError: unknown scorer, empty input, or ``responses`` and ``sampled_responses`` of different lengths.
        RuntimeError: the runner failed or timed out (message carries its stderr tail), or the venv build failed.
    """
    checkpoint = Path(checkpoint_dir).expanduser()
    if not checkpoint.is_dir():
        raise FileNotFoundError(f"NLI checkpoint directory does not exist: {checkpoint}")
    if not (checkpoint / "config.json").is_file():
        raise FileNotFoundError(f"NLI checkpoint directory has no config.json: {checkpoint}")
    scorer_list = list(scorers)
    if not scorer_list:
        raise ValueError("at least one scorer is required")
    unknown = [s for s in scorer_list if s not in SUPPORTED_SCORERS]
    if unknown:
        raise ValueError(f"unsupported uqlm scorer(s) {unknown}; supported: {list(SUPPORTED_SCORERS)}")
    if not responses:
        raise ValueError("responses must not be empty")
    if len(responses) != len(sampled_responses):
        raise ValueError(f"{len(responses)} responses but {len(sampled_responses)} lists of sampled responses")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")

    py = Path(python) if python is not None else ensure_uqlm_env()
    request = {
        "checkpoint_dir": str(checkpoint.resolve()),
        "responses": [str(r) for r in responses],
        "sampled_responses": [[str(x) for x in s] for s in sampled_responses],
        "scorers": scorer_list,
        "use_best": bool(use_best),
        "batch_size": int(batch_size),
        "max_length": int(max_length),
        "torch_threads": torch_threads,
        "warmup": bool(warmup),
    }
    env = _clean_env(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    with tempfile.TemporaryDirectory(prefix="fastnli-uqlm-") as tmp:
        req_path = Path(tmp) / "request.json"
        resp_path = Path(tmp) / "response.json"
        req_path.write_text(json.dumps(request), encoding="utf-8")
        cmd = [str(py), str(_RUNNER), str(req_path), str(resp_path)]
        logger.info(
            "uqlm: scoring %d prompts with %s (use_best=%s, batch_size=%d)",
            len(responses),
            scorer_list,
            use_best,
            batch_size,
        )
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(
                f"uqlm runner timed out after {timeout_s:.0f} s; stderr tail:\n{_tail(exc.stderr)}"
            ) from exc
        except OSError as exc:
            raise RuntimeError(f"cannot start the uqlm runner with {py}: {exc}") from exc
        if proc.returncode != 0 or not resp_path.is_file():
            raise RuntimeError(
                f"uqlm runner failed (exit {proc.returncode}) on checkpoint {checkpoint}; stderr tail:\n"
                f"{_tail(proc.stderr)}"
            )
        out = json.loads(resp_path.read_text(encoding="utf-8"))
        logger.debug("uqlm: runner finished in %.1f s (score %.3f s)", time.perf_counter() - t, out["seconds"])

    scores = {name: [math.nan if v is None else float(v) for v in values] for name, values in out["scores"].items()}
    return UqlmResult(
        scores=scores,
        seconds=float(out["seconds"]),
        load_seconds=float(out["load_seconds"]),
        warmup_seconds=float(out.get("warmup_seconds", 0.0)),
        uqlm_version=str(out["uqlm_version"]),
        torch_version=str(out["torch_version"]),
        num_nli_pairs=int(out["num_nli_pairs"]),
        nli_calls=int(out.get("nli_calls", 0)),
        nli_seconds=float(out.get("nli_seconds", 0.0)),
        responses=list(out.get("responses", [])),
        sampled_responses=[list(s) for s in out.get("sampled_responses", [])],
        transformers_version=str(out.get("transformers_version", "")),
        numpy_version=str(out.get("numpy_version", "")),
        torch_threads=int(out.get("torch_threads", 0)),
    )
