"""Run uqlm itself, in its own virtual environment, as the reference for fastnli's parity checks.

uqlm 0.6.7 pins ``numpy<2`` on Python < 3.13 while ``datasets`` (one of its dependencies) pulls the newest
``pyarrow``, which since 26.0 refuses to import with NumPy 1.x. Such pins clash with fastnli's own environment,
so uqlm is installed into a separate venv (:func:`ensure_uqlm_env`) and driven through a subprocess that reads and
writes JSON (:func:`run_uqlm`, which executes ``_uqlm_runner.py`` next to this module).

The working set, found by installing it (Python 3.11, Linux, CPU):

1. ``pip install torch==2.13.0`` (first, so that uqlm's ``torch>=2.6`` is already met by the CPU build);
2. ``pip install torch==2.13.0 uqlm==0.6.7 "numpy<2; python_version < '3.13'" "pyarrow<26"``.

That resolves to numpy 1.26.4, pyarrow 25.0.1, transformers 4.57.x, datasets 4.x, scipy 1.17.x.

``ensure_uqlm_env(with_fastnli=True)`` also installs fastnli itself there (from this source tree, with its compiled
scheduler built against the venv's NumPy 1.26), so that uqlm's own scorers can run on fastnli's engine through
:class:`fastnli.scorers.uqlm_adapter.FastNLI` (``run_uqlm(..., nli="fastnli")``):

3. ``pip install onnxruntime>=1.18 tokenizers>=0.19 rich>=13 Cython>=3.0 setuptools>=69`` (with the pins of step 2
   restated; the CPU ``onnxruntime`` unless ``onnxruntime-gpu`` is already there: never both);
4. ``pip install --no-deps --no-build-isolation <staged copy of the source tree>`` (a plain, non-editable install).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "APIS",
    "CONSISTENCY_SCORERS",
    "FASTNLI_BUILD_REQUIREMENTS",
    "FASTNLI_RUNTIME_REQUIREMENTS",
    "ONNXRUNTIME_PACKAGES",
    "SUPPORTED_SCORERS",
    "TORCH_REQUIREMENT",
    "UQLM_REQUIREMENTS",
    "UQLM_VERSION",
    "UqlmResult",
    "default_uqlm_venv",
    "ensure_uqlm_env",
    "ready_uqlm_python",
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

#: The uqlm entry points :func:`run_uqlm` drives (its ``api``).
APIS: tuple[str, ...] = ("blackbox", "consistency", "semantic_entropy", "generate_and_score")

#: The scorers of uqlm's ``ConsistencyScorer`` (``run_uqlm(..., api="consistency")``).
CONSISTENCY_SCORERS: tuple[str, ...] = ("noncontradiction", "entailment")

#: The ONNX Runtime distributions fastnli runs on; ``with_fastnli=True`` installs exactly one of them.
ONNXRUNTIME_PACKAGES: tuple[str, ...] = ("onnxruntime", "onnxruntime-gpu")
#: Lower bound for whichever ONNX Runtime distribution is installed (as in fastnli's own dependencies).
ONNXRUNTIME_MIN = "1.18"
#: fastnli's other runtime dependencies (``numpy`` is already there, pinned below 2 by uqlm).
FASTNLI_RUNTIME_REQUIREMENTS: tuple[str, ...] = ("tokenizers>=0.19", "rich>=13")
#: What building fastnli's Cython extension needs in the venv (it is built with ``--no-build-isolation``, against
#: the venv's own NumPy).
FASTNLI_BUILD_REQUIREMENTS: tuple[str, ...] = ("Cython>=3.0", "setuptools>=69")

#: Environment variable naming the uqlm venv directory.
VENV_ENV_VAR = "FASTNLI_UQLM_VENV"

_MARKER_NAME = "fastnli-uqlm.json"
_FASTNLI_MARKER_NAME = "fastnli-uqlm-fastnli.json"
_FASTNLI_STAGE = "fastnli-src"
#: Top-level files of the source tree that the fastnli build needs (``fastnli/`` itself is staged too).
_FASTNLI_TOP_FILES = ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in")
_GENERATED_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".o", ".html")
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
_FASTNLI_CHECK_SCRIPT = (
    "import importlib.metadata as m, json, sys\n"
    "import numpy, onnxruntime, tokenizers, fastnli, fastnli.kernels as k\n"
    "from fastnli.scorers.uqlm_adapter import FastNLI\n"
    "v = {n: m.version(n) for n in ['fastnli', 'numpy', 'tokenizers', 'rich', 'Cython', 'torch', 'uqlm']}\n"
    "v['onnxruntime'] = onnxruntime.__version__\n"
    "v['kernels'] = k.IMPLEMENTATION\n"
    "v['fastnli_path'] = fastnli.__file__\n"
    "print(json.dumps(v))\n"
)


@dataclass
class UqlmResult:
    """What one uqlm ``BlackBoxUQ.score`` (or ``ConsistencyScorer.evaluate``) run returned and cost.

    Attributes:
        scores: per scorer, one confidence per prompt; uqlm's NaN (and inf) come back as ``float("nan")``.
        seconds: wall seconds of the ``score()`` (``evaluate()``) call alone, measured inside the runner (no model
            load, no warm-up, no interpreter start-up). Includes uqlm's own fixed ``time.sleep(0.1)`` per scorer
            family.
        load_seconds: wall seconds to construct ``BlackBoxUQ`` / the NLI object (tokenizer and model load).
        uqlm_version: ``uqlm.__version__`` in the venv.
        torch_version: ``torch.__version__`` in the venv.
        num_nli_pairs: premise/hypothesis pairs passed to the NLI object's ``predict_batch`` (uqlm's ``NLI`` or
            fastnli's ``FastNLI``) during ``score()`` (each direction counts; uqlm's caches and its identical-string
            shortcut are already applied).
        warmup_seconds: wall seconds of the untimed warm-up ``predict_batch`` call (0.0 without one).
        nli_calls: number of ``NLI.predict_batch`` calls during ``score()``.
        nli_seconds: wall seconds spent inside ``NLI.predict_batch`` (tokenization + forward + softmax).
        responses: the responses as uqlm returned them (replaced by the best response when ``use_best`` applied).
        sampled_responses: the sampled responses as uqlm returned them (the original response swapped in when
            ``use_best`` applied).
        transformers_version: ``transformers.__version__`` in the venv.
        numpy_version: ``numpy.__version__`` in the venv.
        torch_threads: ``torch.get_num_threads()`` in the runner.
        nli: ``"uqlm"`` (uqlm's own ``NLI`` on PyTorch), ``"fastnli"`` (``FastNLI`` on fastnli's engine) or
            ``"patch"`` (unchanged uqlm code after ``fastnli.patch_uqlm()``).
        api: the uqlm entry point (see :func:`run_uqlm`).
        fastnli_kernels: with ``nli="fastnli"``: ``fastnli.kernels.IMPLEMENTATION`` in the runner (``"compiled"``
            or ``"reference"``); else ``""``.
        fastnli_path: with ``nli="fastnli"``: the ``fastnli/__init__.py`` the runner imported; else ``""``.
        nli_class: module and name of the class of the NLI object uqlm's scorers held.
        uqlm_nli_built: how many of uqlm's own (PyTorch) ``NLI`` objects were built in the run.
        llm_calls: with ``api="generate_and_score"``: the prompt of each call to the scripted chat model, in order.
        nli_probabilities: with ``return_probabilities=True``: the NLI object's cache after scoring, (premise,
            hypothesis) -> [contradiction, neutral, entailment].
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
    nli: str = "uqlm"
    api: str = "blackbox"
    fastnli_kernels: str = ""
    fastnli_path: str = ""
    nli_class: str = ""
    uqlm_nli_built: int = 0
    llm_calls: list[str] = field(default_factory=list)
    nli_probabilities: dict[tuple[str, str], list[float]] = field(default_factory=dict)


def default_uqlm_venv() -> Path:
    """Return the uqlm venv directory used when none is given.

    ``$FASTNLI_UQLM_VENV`` if set, else ``<repository root>/.venv-uqlm`` when this module lives in a fastnli
    source checkout, else ``<current directory>/.venv-uqlm``.
    """
    env = os.environ.get(VENV_ENV_VAR)
    if env:
        return Path(env).expanduser()
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "fastnli" / "__init__.py").is_file():
        return root / ".venv-uqlm"
    return Path.cwd() / ".venv-uqlm"


def ready_uqlm_python(path: str | Path | None = None) -> Path | None:
    """The python of a complete uqlm venv at ``path`` (default :func:`default_uqlm_venv`), or ``None``; installs
    nothing (:func:`ensure_uqlm_env` builds one)."""
    venv = (Path(path).expanduser() if path is not None else default_uqlm_venv()).absolute()
    return _venv_python(venv) if _read_marker(venv) is not None else None


def _venv_python(venv: Path) -> Path:
    """Path of the python executable inside ``venv``."""
    if os.name == "nt":
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


class _ForkServer:
    """One ``_uqlm_runner.py --serve`` process: a venv python and an environment, uqlm's stack imported once, one
    forked child per job (see the runner's docstring)."""

    def __init__(self, python: Path, env: dict[str, str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="fastnli-uqlm-server-"))
        self.log = self.dir / "server.log"
        try:
            with open(self.log, "wb") as log:
                self.proc = subprocess.Popen([str(python), str(_RUNNER), "--serve"], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=log, env=env, cwd=self.dir, text=True,
                                             start_new_session=True)
        except BaseException:  # no process to own the directory: it goes now
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.lock = threading.Lock()

    def run(self, request: Path, response: Path, stderr: Path, env: dict[str, str], timeout_s: float) -> int | None:
        """Run one job; its exit code, or ``None`` when the server is gone (its log says why).

        Raises:
            TimeoutError: no exit code within ``timeout_s`` (the caller then kills the server and its child:
                :func:`_drop_server`).
        """
        assert self.proc.stdin is not None and self.proc.stdout is not None
        job = {"request": str(request), "response": str(response), "stderr": str(stderr), "cwd": str(request.parent),
               "env": env}
        with self.lock:
            try:
                self.proc.stdin.write(json.dumps(job) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                return None
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
            if not ready:
                raise TimeoutError
            line = self.proc.stdout.readline()
        return int(line) if line.strip() else None

    def close(self, kill: bool = False) -> None:
        """Stop the server (closing its stdin ends it; ``kill`` ends it and a running child at once)."""
        if self.proc.poll() is None:
            if not kill and self.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=10)
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        shutil.rmtree(self.dir, ignore_errors=True)


#: Variables that change from run to run without changing what an import does: a job sets them in its child.
_PER_JOB_ENV = ("PYTEST_CURRENT_TEST",)
_SERVERS: dict[tuple[Any, ...], _ForkServer] = {}
_SERVERS_LOCK = threading.Lock()


def _server(python: Path, env: dict[str, str]) -> _ForkServer:
    """The live fork server of ``python`` and ``env``, started on first use. A venv reinstalled since (its markers
    changed) gets a new one."""
    venv = python.parent.parent
    markers = tuple((venv / m).stat().st_mtime_ns if (venv / m).is_file() else 0
                    for m in (_MARKER_NAME, _FASTNLI_MARKER_NAME))
    key = (str(python), markers, tuple(sorted((k, v) for k, v in env.items() if k not in _PER_JOB_ENV)))
    with _SERVERS_LOCK:
        server = _SERVERS.get(key)
        if server is None or server.proc.poll() is not None:
            server = _SERVERS[key] = _ForkServer(python, env)
        return server


def _drop_server(server: _ForkServer) -> None:
    with _SERVERS_LOCK:
        for key in [k for k, s in _SERVERS.items() if s is server]:
            del _SERVERS[key]
    server.close(kill=True)


@atexit.register
def _close_servers() -> None:
    with _SERVERS_LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.close()


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


def _run_step(
    cmd: list[str], what: str, timeout_s: float, *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one install step; raise RuntimeError with the output tail if it fails."""
    logger.info("uqlm venv: %s", what)
    logger.debug("uqlm venv: running %s", " ".join(cmd))
    t = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env or _clean_env(), cwd=cwd, timeout=timeout_s, check=False
        )
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
    with_fastnli: bool = False,
    fastnli_source: str | Path | None = None,
    onnxruntime: str | None = None,
) -> Path:
    """Create (once) the virtual environment that uqlm runs in, and return its python.

    An existing venv is reused without any subprocess when its marker file (``fastnli-uqlm.json``: the requirement
    list and the installed versions) matches :data:`TORCH_REQUIREMENT` + :data:`UQLM_REQUIREMENTS`. Otherwise
    the venv is created (or repaired in place: nothing is deleted), ``torch==2.13.0`` is installed, then uqlm with
    its pins, ``import uqlm; from uqlm import BlackBoxUQ`` is checked, and the marker is written. An exclusive lock
    file inside the venv directory serialises concurrent callers (POSIX only). Takes about a minute on a fresh
    machine with a warm pip cache; needs the package registry.

    With ``with_fastnli=True`` fastnli is installed there as well, so that uqlm's scorers can run on
    :class:`fastnli.scorers.uqlm_adapter.FastNLI`: ONNX Runtime (one distribution, see ``onnxruntime``),
    :data:`FASTNLI_RUNTIME_REQUIREMENTS` and :data:`FASTNLI_BUILD_REQUIREMENTS` (uqlm's pins restated), then a
    plain ``pip install --no-deps --no-build-isolation`` of a staged copy of the source tree (``fastnli/`` plus
    ``setup.py``, ``pyproject.toml``, ``README.md``) kept in ``<venv>/fastnli-src``, so the compiled scheduler is
    built against the venv's NumPy 1.26 and the source checkout is never written to. The install is checked in a
    fresh interpreter (``FASTNLI_KERNELS=compiled``: the compiled extension must import) and recorded in a second
    marker (``fastnli-uqlm-fastnli.json``) with a fingerprint of the staged sources: an unchanged tree is reused
    without any subprocess; a changed one is re-staged (changed files only) and reinstalled, which recompiles the
    extension only when its own sources changed (a few seconds; 15–30 s with a recompile; 25–35 s the first time).

    Args:
        path: venv directory; default ``$FASTNLI_UQLM_VENV``, else ``<repo root or cwd>/.venv-uqlm``
            (see :func:`default_uqlm_venv`).
        base_python: interpreter that creates the venv; default ``sys.executable``. The pinned CPU torch wheel
            must exist for its Python version.
        force: reinstall even if the marker says the venv is complete. Default False.
        timeout_s: limit for each install step, in seconds. Default 1800.
        with_fastnli: also install fastnli (see above). Default False.
        fastnli_source: the fastnli source tree to install (holds ``setup.py`` and ``fastnli/``); default the
            checkout this module lives in.
        onnxruntime: ``"onnxruntime"`` (CPU) or ``"onnxruntime-gpu"``; default: the one already in the venv, else
            ``"onnxruntime"``. Never installs the second one next to the first (they share the ``onnxruntime``
            module).

    Returns:
        Path of the venv's python executable.

    Raises:
        RuntimeError: venv creation, a pip install or an import check failed (the message carries the output
            tail), or ``onnxruntime`` names a different distribution than the one already installed.
        ValueError: ``onnxruntime`` is not one of :data:`ONNXRUNTIME_PACKAGES`.
        FileNotFoundError: ``with_fastnli`` without a fastnli source tree.
    """
    venv = Path(path).expanduser() if path is not None else default_uqlm_venv()
    venv = venv.absolute()
    python = _venv_python(venv)
    if onnxruntime is not None and onnxruntime not in ONNXRUNTIME_PACKAGES:
        raise ValueError(f"onnxruntime={onnxruntime!r}: choose one of {list(ONNXRUNTIME_PACKAGES)}")
    source = _fastnli_source_root(fastnli_source) if with_fastnli else None
    if not force:
        marker = _read_marker(venv)
        if marker is not None and (source is None or _fastnli_current(venv, source, onnxruntime)):
            logger.debug("uqlm venv: reusing %s (%s)", venv, marker.get("versions"))
            return python

    venv.mkdir(parents=True, exist_ok=True)
    with _file_lock(venv / _LOCK_NAME):
        _ensure_base(venv, python, base_python, force, timeout_s)
        if source is not None:
            _ensure_fastnli(venv, python, source, onnxruntime, force, timeout_s)
    return python


def _ensure_base(venv: Path, python: Path, base_python: str | Path | None, force: bool, timeout_s: float) -> None:
    """The uqlm install itself (steps 1 and 2 of the module docstring); the caller holds the lock."""
    if not force:  # another process may have finished the install while we waited for the lock
        marker = _read_marker(venv)
        if marker is not None:
            logger.debug("uqlm venv: reusing %s (%s)", venv, marker.get("versions"))
            return
    t0 = time.perf_counter()
    base = str(base_python) if base_python is not None else sys.executable
    logger.info("uqlm venv: building %s with %s (uqlm %s)", venv, base, UQLM_VERSION)
    (venv / _MARKER_NAME).unlink(missing_ok=True)
    (venv / _FASTNLI_MARKER_NAME).unlink(missing_ok=True)
    _run_step([base, "-m", "venv", str(venv)], f"create venv at {venv}", timeout_s)
    pip = [str(python), "-m", "pip", "install", "--no-input"]
    _run_step([*pip, TORCH_REQUIREMENT], f"pip install {TORCH_REQUIREMENT}", timeout_s)
    _run_step([*pip, TORCH_REQUIREMENT, *UQLM_REQUIREMENTS], "pip install " + " ".join(UQLM_REQUIREMENTS), timeout_s)
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
    _write_json(venv / _MARKER_NAME, marker_data)
    logger.info("uqlm venv: ready in %.1f s: %s", seconds, versions)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(path)


def _fastnli_source_root(source: str | Path | None) -> Path:
    """The fastnli source tree to install: ``source``, else the checkout this module lives in."""
    root = Path(source).expanduser().absolute() if source is not None else Path(__file__).resolve().parents[1]
    if not ((root / "setup.py").is_file() and (root / "pyproject.toml").is_file() and (root / "fastnli").is_dir()):
        raise FileNotFoundError(
            f"with_fastnli=True needs a fastnli source tree (setup.py, pyproject.toml, fastnli/); {root} is not one; "
            "pass fastnli_source=<path of a fastnli checkout>"
        )
    return root


def _is_source_file(rel: Path) -> bool:
    """Whether ``rel`` (relative to ``fastnli/``'s parent) is a source file, not a build product."""
    if "__pycache__" in rel.parts or any(part.endswith(".egg-info") for part in rel.parts):
        return False
    return rel.suffix not in _GENERATED_SUFFIXES and not rel.name.endswith(".tmp")


def _source_files(root: Path) -> dict[str, bytes]:
    """The files of ``root`` that the fastnli build reads, relative path (POSIX) -> content."""
    files: dict[str, bytes] = {}
    for name in _FASTNLI_TOP_FILES:
        if (root / name).is_file():
            files[name] = (root / name).read_bytes()
    for f in sorted((root / "fastnli").rglob("*")):
        rel = f.relative_to(root)
        if not f.is_file() or not _is_source_file(rel):
            continue
        if rel.suffix in (".c", ".cpp") and f.with_suffix(".pyx").is_file():
            continue  # Cython output: generated again in the staged tree
        files[rel.as_posix()] = f.read_bytes()
    return files


def _fingerprint(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode())
        h.update(b"\0")
        h.update(hashlib.sha256(files[rel]).digest())
    return h.hexdigest()


def _installed_onnxruntime(venv: Path) -> list[str]:
    """The ONNX Runtime distributions installed in ``venv`` (from their ``.dist-info`` folders)."""
    found = set()
    infos = [*venv.glob("lib*/python*/site-packages/*.dist-info"), *venv.glob("Lib/site-packages/*.dist-info")]
    for info in infos:
        # <name>-<version>.dist-info, the name with "-" written as "_"
        name = info.name[: -len(".dist-info")].split("-")[0].lower().replace("_", "-")
        if name in ONNXRUNTIME_PACKAGES:
            found.add(name)
    return sorted(found)


def _fastnli_requirements(ort: str) -> list[str]:
    return [f"{ort}>={ONNXRUNTIME_MIN}", *FASTNLI_RUNTIME_REQUIREMENTS, *FASTNLI_BUILD_REQUIREMENTS]


def _choose_onnxruntime(venv: Path, wanted: str | None) -> str:
    installed = _installed_onnxruntime(venv)
    if len(installed) > 1:
        raise RuntimeError(
            f"uqlm venv {venv} has both {installed[0]} and {installed[1]} installed; they share the onnxruntime "
            f"module and break each other: `{_venv_python(venv)} -m pip uninstall -y {' '.join(installed)}`, then "
            "call ensure_uqlm_env again"
        )
    if wanted is None:
        return installed[0] if installed else ONNXRUNTIME_PACKAGES[0]
    if installed and installed[0] != wanted:
        raise RuntimeError(
            f"onnxruntime={wanted!r} but uqlm venv {venv} already has {installed[0]}; never install both (they "
            f"share the onnxruntime module): `{_venv_python(venv)} -m pip uninstall -y {installed[0]}` first, or "
            f"pass onnxruntime={installed[0]!r}"
        )
    return wanted


def _read_fastnli_marker(venv: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((venv / _FASTNLI_MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _fastnli_current(venv: Path, source: Path, wanted_ort: str | None) -> bool:
    """Whether the venv's fastnli install matches ``source`` and the requested ONNX Runtime (no subprocess)."""
    marker = _read_fastnli_marker(venv)
    if marker is None:
        return False
    ort = marker.get("onnxruntime")
    if wanted_ort is not None and ort != wanted_ort:
        return False
    if not isinstance(ort, str) or marker.get("requirements") != _fastnli_requirements(ort):
        return False
    if _installed_onnxruntime(venv) != [ort]:
        return False
    return marker.get("fingerprint") == _fingerprint(_source_files(source))


def _stage(files: dict[str, bytes], stage: Path) -> int:
    """Mirror ``files`` into ``stage``: write changed files, delete staged sources that are gone; keep build
    products (``build/``, generated C, the compiled extension), so an unchanged extension is not recompiled.
    Returns the number of files written or deleted."""
    changed = 0
    for rel, data in files.items():
        dst = stage / rel
        if dst.is_file() and dst.read_bytes() == data:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".tmp")
        tmp.write_bytes(data)  # a fresh mtime: newer than any build product, so setuptools rebuilds what depends on it
        tmp.replace(dst)
        changed += 1
    if (stage / "fastnli").is_dir():
        for f in sorted((stage / "fastnli").rglob("*")):
            staged = f.relative_to(stage)
            if not f.is_file() or not _is_source_file(staged) or staged.as_posix() in files:
                continue
            if staged.suffix in (".c", ".cpp") and f.with_suffix(".pyx").is_file():
                continue
            f.unlink()
            changed += 1
    return changed


def _ensure_fastnli(
    venv: Path, python: Path, source: Path, wanted_ort: str | None, force: bool, timeout_s: float
) -> None:
    """Install fastnli from ``source`` into the uqlm venv (steps 3 and 4 of the module docstring); the caller holds
    the lock."""
    ort = _choose_onnxruntime(venv, wanted_ort)
    requirements = _fastnli_requirements(ort)
    files = _source_files(source)
    fingerprint = _fingerprint(files)
    marker = _read_fastnli_marker(venv) or {}
    deps_ok = (
        not force
        and marker.get("onnxruntime") == ort
        and marker.get("requirements") == requirements
        and _installed_onnxruntime(venv) == [ort]
    )
    if deps_ok and marker.get("fingerprint") == fingerprint:
        return
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    pip = [str(python), "-m", "pip", "install", "--no-input"]
    if not deps_ok:
        t = time.perf_counter()
        _run_step(
            [*pip, TORCH_REQUIREMENT, *UQLM_REQUIREMENTS, *requirements],
            "pip install " + " ".join(requirements),
            timeout_s,
            cwd=venv,
        )
        timings["deps_seconds"] = round(time.perf_counter() - t, 1)
    stage = venv / _FASTNLI_STAGE
    t = time.perf_counter()
    changed = _stage(files, stage)
    _run_step(
        [*pip, "--no-deps", "--no-build-isolation", "--force-reinstall", str(stage)],
        f"pip install fastnli from {source} ({changed} staged files changed)",
        timeout_s,
        cwd=venv,
    )
    timings["build_seconds"] = round(time.perf_counter() - t, 1)
    # A fresh interpreter outside the source tree: the installed package, with its compiled scheduler.
    proc = _run_step(
        [str(python), "-c", _FASTNLI_CHECK_SCRIPT],
        "check `import fastnli` (with its compiled kernels) in the venv",
        timeout_s,
        cwd=venv,
        env=_clean_env({"FASTNLI_KERNELS": "compiled"}),
    )
    try:
        versions = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise RuntimeError(f"uqlm venv: unexpected output of the fastnli check:\n{_tail(proc.stdout)}") from exc
    installed_at = Path(str(versions.get("fastnli_path", ""))).resolve()
    if venv.resolve() not in installed_at.parents or stage.resolve() in installed_at.parents:
        raise RuntimeError(f"uqlm venv: fastnli imports from {installed_at}, not from the venv's site-packages")
    timings["total_seconds"] = round(time.perf_counter() - t0, 1)
    _write_json(
        venv / _FASTNLI_MARKER_NAME,
        {
            "source": str(source),
            "fingerprint": fingerprint,
            "onnxruntime": ort,
            "requirements": requirements,
            "versions": versions,
            "install": timings,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    )
    logger.info("uqlm venv: fastnli installed in %.1f s: %s", timings["total_seconds"], versions)


def _fresh_run(cmd: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> tuple[int, str]:
    """Run the runner in a fresh interpreter: its exit code and stderr."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"uqlm runner timed out after {timeout_s:.0f} s; stderr tail:\n{_tail(exc.stderr)}") from exc
    except OSError as exc:
        raise RuntimeError(f"cannot start the uqlm runner with {cmd[0]}: {exc}") from exc
    return proc.returncode, proc.stderr


def _served_run(python: Path, env: dict[str, str], request: Path, response: Path,
                timeout_s: float) -> tuple[int, str]:
    """Run the job in a child of the fork server of ``python`` and ``env``: its exit code and output."""
    out = request.with_name("runner.log")
    try:
        server = _server(python, env)
    except OSError as exc:
        raise RuntimeError(f"cannot start the uqlm runner with {python}: {exc}") from exc
    try:
        code = server.run(request, response, out, env, timeout_s)
    except TimeoutError:
        _drop_server(server)
        raise RuntimeError(f"uqlm runner timed out after {timeout_s:.0f} s; stderr tail:\n"
                           f"{_tail(out.read_text(errors='replace') if out.is_file() else '')}") from None
    if code is None:  # the server itself failed (uqlm's imports, or it was killed)
        log = server.log.read_text(errors="replace") if server.log.is_file() else ""
        _drop_server(server)
        return -1, log
    return code, out.read_text(errors="replace") if out.is_file() else ""


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
    nli: str = "uqlm",
    api: str = "blackbox",
    fastnli_precision: str = "fp32",
    prompts: Sequence[str] | None = None,
    llm_answers: Sequence[Sequence[str]] | None = None,
    env: dict[str, str] | None = None,
    return_probabilities: bool = False,
    reuse_imports: bool = True,
) -> UqlmResult:
    """Score ``responses`` against ``sampled_responses`` with uqlm's ``BlackBoxUQ`` on CPU, in uqlm's own venv.

    Runs ``BlackBoxUQ(scorers=..., nli_model_name=checkpoint_dir, device="cpu", use_best=..., nli_batch_size=...,
    max_length=...).score(responses, sampled_responses, show_progress_bars=False)`` in a subprocess with
    ``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1`` and ``CUDA_VISIBLE_DEVICES=""``. The caller's lists are never
    mutated (uqlm itself rewrites its inputs in place when ``use_best`` applies).

    With ``api="consistency"`` it runs uqlm's ``ConsistencyScorer(nli=<NLI object>, scorers=...,
    use_best=...).evaluate(responses, sampled_responses)`` instead (scorers: :data:`CONSISTENCY_SCORERS`; with
    ``use_best`` the scorer clusters by itself). With ``nli="fastnli"`` the NLI object is fastnli's
    ``FastNLI(checkpoint_dir, device="cpu", precision=fastnli_precision, max_length=max_length)``, the one-line
    switch, so the venv must hold fastnli (:func:`ensure_uqlm_env` with ``with_fastnli=True``, which is what
    happens when ``python`` is not given); for ``BlackBoxUQ`` it goes in through ``fastnli.patch_uqlm(model=...)``.
    With ``nli="patch"`` the uqlm code is the same as with ``nli="uqlm"`` (``checkpoint_dir`` as
    ``nli_model_name``) after ``fastnli.patch_uqlm(precision=fastnli_precision)``: fastnli resolves the checkpoint
    to its export in fastnli's cache (the uqlm venv cannot export: pass ``env={"FASTNLI_CACHE": ...}`` with the
    export already there).

    ``api="semantic_entropy"`` runs ``SemanticEntropy(...).score(prompts, responses, sampled_responses)`` (scores
    ``discrete_confidence_scores``, ``discrete_entropy_values``, ``num_semantic_sets``); ``api="generate_and_score"``
    runs ``BlackBoxUQ(llm=<scripted chat model>, ...).generate_and_score(prompts, num_responses)`` with the chat
    model answering each prompt's k-th call with ``llm_answers[i][k]`` (``responses`` and ``sampled_responses`` are
    then only used for the warm-up call).

    Args:
        checkpoint_dir: with ``nli="uqlm"``: local Hugging Face sequence-classification checkpoint (needs
            ``config.json``); with ``nli="fastnli"``: a fastnli export artifact (needs ``manifest.json``, see
            :func:`fastnli.exporter.export`; the uqlm venv has no export dependencies).
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
        nli: ``"uqlm"`` (default: uqlm's own ``NLI``), ``"fastnli"`` (fastnli's ``FastNLI`` on an artifact) or
            ``"patch"`` (``fastnli.patch_uqlm()`` before the same uqlm code).
        api: ``"blackbox"`` (default: ``BlackBoxUQ.score``), ``"consistency"`` (``ConsistencyScorer.evaluate``),
            ``"semantic_entropy"`` (``SemanticEntropy.score``) or ``"generate_and_score"``
            (``BlackBoxUQ.generate_and_score``).
        fastnli_precision: the engine precision with ``nli="fastnli"`` or ``"patch"`` (``"fp32"``, ``"int8"``,
            ...). Default ``"fp32"``.
        prompts: the prompts (``semantic_entropy``: optional, read by uqlm's ``prompts_in_nli``;
            ``generate_and_score``: required, one per ``llm_answers`` list).
        llm_answers: ``generate_and_score`` only: per prompt, the original response then the samples.
        env: extra environment variables of the runner (``PYTHONPATH`` to import fastnli from a source tree,
            ``FASTNLI_CACHE``); they override the defaults below.
        return_probabilities: return the NLI object's probability cache (``UqlmResult.nli_probabilities``).
        reuse_imports: on POSIX, run in a child forked from a server process of the same venv python and
            environment that has imported uqlm's stack once (kept until this interpreter exits): the run starts from
            the state a fresh interpreter has after those imports, without paying them again (about 16 s each on a
            2-core AMD EPYC Zen 1). False, or another OS: a fresh interpreter per run. Default True.

    Returns:
        The scores, timings (``seconds`` excludes model load) and the NLI pair count.

    Raises:
        FileNotFoundError: ``checkpoint_dir`` is not a directory with a ``config.json`` (``manifest.json`` with
            ``nli="fastnli"``).
        ValueError: unknown scorer, ``nli`` or ``api``, empty input, or ``responses`` and ``sampled_responses`` of
            different lengths.
        RuntimeError: the runner failed or timed out (message carries its stderr tail), or the venv build failed.
    """
    if nli not in ("uqlm", "fastnli", "patch"):
        raise ValueError(f"nli={nli!r}: choose 'uqlm' (uqlm's own NLI), 'fastnli' (fastnli's FastNLI) or 'patch' "
                         "(fastnli.patch_uqlm())")
    if api not in APIS:
        raise ValueError(f"api={api!r}: choose one of {list(APIS)}")
    if nli == "fastnli" and api in ("semantic_entropy", "generate_and_score"):
        raise ValueError(f"api={api!r} runs on fastnli through nli='patch'")
    if api == "generate_and_score" and (not prompts or llm_answers is None or len(prompts) != len(llm_answers)):
        raise ValueError("api='generate_and_score' needs prompts and llm_answers, one list of answers per prompt")
    checkpoint = Path(checkpoint_dir).expanduser()
    if not checkpoint.is_dir():
        raise FileNotFoundError(f"NLI checkpoint directory does not exist: {checkpoint}")
    if nli in ("uqlm", "patch") and not (checkpoint / "config.json").is_file():
        raise FileNotFoundError(f"NLI checkpoint directory has no config.json: {checkpoint}")
    if nli == "fastnli" and not (checkpoint / "manifest.json").is_file():
        raise FileNotFoundError(
            f"nli='fastnli' needs a fastnli export artifact (manifest.json), which {checkpoint} is not; export the "
            "checkpoint first with fastnli.exporter.export (the uqlm venv cannot export)"
        )
    scorer_list = list(scorers)
    if not scorer_list:
        raise ValueError("at least one scorer is required")
    supported = CONSISTENCY_SCORERS if api == "consistency" else SUPPORTED_SCORERS
    unknown = [s for s in scorer_list if s not in supported]
    if unknown:
        raise ValueError(f"unsupported uqlm scorer(s) {unknown} for api={api!r}; supported: {list(supported)}")
    if not responses:
        raise ValueError("responses must not be empty")
    if len(responses) != len(sampled_responses):
        raise ValueError(f"{len(responses)} responses but {len(sampled_responses)} lists of sampled responses")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")

    py = Path(python) if python is not None else ensure_uqlm_env(with_fastnli=nli != "uqlm")
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
        "nli": nli,
        "api": api,
        "fastnli_precision": fastnli_precision,
        "prompts": list(prompts) if prompts is not None else None,
        "llm_answers": [list(a) for a in llm_answers] if llm_answers is not None else None,
        "return_probabilities": bool(return_probabilities),
    }
    env = _clean_env(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "TOKENIZERS_PARALLELISM": "false",
            **(env or {}),
        }
    )
    with tempfile.TemporaryDirectory(prefix="fastnli-uqlm-") as tmp:
        req_path = Path(tmp) / "request.json"
        resp_path = Path(tmp) / "response.json"
        req_path.write_text(json.dumps(request), encoding="utf-8")
        cmd = [str(py), str(_RUNNER), str(req_path), str(resp_path)]
        logger.info(
            "uqlm: scoring %d prompts with %s (use_best=%s, batch_size=%d, nli=%s, api=%s)",
            len(responses),
            scorer_list,
            use_best,
            batch_size,
            nli,
            api,
        )
        t = time.perf_counter()
        if reuse_imports and os.name == "posix":
            code, stderr = _served_run(py, env, req_path, resp_path, timeout_s)
        else:
            code, stderr = _fresh_run(cmd, env, Path(tmp), timeout_s)
        if code != 0 or not resp_path.is_file():
            raise RuntimeError(
                f"uqlm runner failed (exit {code}) on checkpoint {checkpoint}; stderr tail:\n{_tail(stderr)}"
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
        nli=str(out.get("nli", nli)),
        api=str(out.get("api", api)),
        fastnli_kernels=str(out.get("fastnli_kernels", "")),
        fastnli_path=str(out.get("fastnli_path", "")),
        nli_class=str(out.get("nli_class", "")),
        uqlm_nli_built=int(out.get("uqlm_nli_built", 0)),
        llm_calls=[str(p) for p in out.get("llm_calls", [])],
        nli_probabilities={(str(a), str(b)): [float(x) for x in p] for a, b, p in out.get("nli_probabilities", [])},
    )
