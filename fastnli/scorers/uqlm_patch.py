"""Run unchanged uqlm code on fastnli: ``fastnli.patch_uqlm()`` swaps the NLI model that uqlm builds.

uqlm's scorers build their NLI object (``uqlm.nli.nli.NLI``: a PyTorch DeBERTa) from a module-level name, e.g.
``BlackBoxUQ._validate_scorers`` calls ``NLI(nli_model_name=..., device=..., max_length=..., ...)`` in
``uqlm.scorers.shortform.black_box``. :func:`patch_uqlm` rebinds that name, in every uqlm module that builds one, to a
factory that returns a :class:`~fastnli.scorers.uqlm_adapter.FastNLI` on the same model, so that
``BlackBoxUQ(...).score(...)``, ``generate_and_score(...)``, ``ConsistencyScorer(...)`` and ``SemanticEntropy(...)`` run
on fastnli's engine with every uqlm default (``use_best=True``, ``max_length=2000``, the model name) untouched::

    import fastnli; fastnli.patch_uqlm()          # the one line; existing uqlm code below it is unchanged

    from uqlm import BlackBoxUQ
    result = BlackBoxUQ(scorers=["semantic_negentropy", "noncontradiction"]).score(responses, sampled_responses)

The seam is found in uqlm's own source: every module of the installed uqlm that calls ``NLI(`` is patched, and the
patch refuses (naming the module) when one of them builds it in a way the patch cannot reach, or when the modules of
the entry points above no longer build it. :func:`unpatch_uqlm` (or leaving ``with fastnli.patch_uqlm():``) puts
uqlm's class back. Objects built before the patch keep their PyTorch NLI; uqlm's ``NLI`` class itself is untouched
(build ``FastNLI(...)`` directly where code constructs ``NLI`` by hand).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from fastnli.engine import NLIEngine, SessionConfig
from fastnli.engine.engine import PrecisionArg
from fastnli.scorers.uqlm_adapter import FastNLI

logger = logging.getLogger("fastnli")

#: The uqlm release the patch is tested against (it checks the seam itself, not the version).
UQLM_TESTED_VERSION = "0.6.7"
#: Modules that must build uqlm's NLI for the promised entry points: BlackBoxUQ (its shared NLI),
#: ConsistencyScorer (``nli=None``), SemanticEntropy and the other short-form classes (``_setup_nli``).
ENTRY_POINT_MODULES: tuple[str, ...] = (
    "uqlm.scorers.shortform.black_box",
    "uqlm.black_box.consistency",
    "uqlm.scorers.baseclass.uncertainty",
)
#: The arguments of uqlm's ``NLI(...)`` that the factory reads (their defaults come from uqlm's own signature).
NLI_ARGUMENTS: tuple[str, ...] = ("nli_model_name", "device", "max_length")
_NLI_CLASS_MODULE = "uqlm.nli.nli"
_BUILDS_BY_NAME = re.compile(r"(?<![\w.])NLI\(")
_BUILDS_BY_ATTRIBUTE = re.compile(r"\.NLI\(")
_PIP = f"pip install 'uqlm=={UQLM_TESTED_VERSION}'"


@dataclass
class _Settings:
    model: NLIEngine | str | Path | None
    device: str | None
    precision: PrecisionArg
    engine_kwargs: dict[str, Any]


@dataclass
class _State:
    uqlm_version: str
    nli_class: type
    originals: dict[str, Any]  # module name -> the name's value before the patch (uqlm's NLI class)
    settings: _Settings
    engines: dict[tuple[str, str, str], NLIEngine] = field(default_factory=dict)


_LOCK = threading.RLock()
_STATE: _State | None = None


@dataclass(frozen=True)
class UqlmPatch:
    """What :func:`patch_uqlm` did: the patched uqlm modules and the settings; a context manager that undoes it.

    Attributes:
        uqlm_version: ``uqlm.__version__`` of the patched uqlm.
        modules: the uqlm modules whose ``NLI`` now builds a :class:`FastNLI`, sorted.
        precision: the engine precision of every NLI built while patched.
        device: the device given to :func:`patch_uqlm` (``None``: each uqlm object's own ``device`` argument).
    """

    uqlm_version: str
    modules: tuple[str, ...]
    precision: str
    device: str | None
    _previous: _Settings | None = field(default=None, repr=False, compare=False)

    def __enter__(self) -> UqlmPatch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Restore what was there before this patch: the settings of an enclosing patch, else uqlm's NLI."""
        with _LOCK:
            if self._previous is None:
                unpatch_uqlm()
            elif _STATE is not None:
                _STATE.settings = self._previous
                _STATE.engines.clear()


def patch_uqlm(model: NLIEngine | str | Path | None = None, *, device: str | None = None,
               precision: PrecisionArg = "fp32", **engine_kwargs: Any) -> UqlmPatch:
    """Make every NLI model that uqlm builds from now on a :class:`FastNLI` on fastnli's engine.

    uqlm's own arguments still decide everything uqlm decides (which scorers, ``use_best``, ``max_length``,
    ``nli_model_name``); each ``NLI(nli_model_name=..., device=..., max_length=...)`` uqlm builds becomes
    ``FastNLI(<that model>, max_length=<that max_length>)`` on an engine loaded once per (model, device, precision)
    and shared by the NLI objects of the same settings. uqlm's ``batch_size`` and ``verbose`` are not used (fastnli
    batches by token budget).

    Calling it again changes the settings (the originals stay saved); :func:`unpatch_uqlm`, or the end of a ``with``
    block on the returned object, restores uqlm's NLI (or the enclosing patch's settings).

    Args:
        model: the model of every NLI built while patched: an :class:`NLIEngine`, an export artifact, a HF
            checkpoint directory or hub id (exported once into fastnli's cache). Default ``None``: uqlm's
            ``nli_model_name`` of each object (uqlm's default ``"microsoft/deberta-large-mnli"``), so a checkpoint
            gives uqlm's numbers on the same weights.
        device: ``"cpu"``, ``"cuda"`` or ``"auto"`` for every NLI. Default ``None``: each uqlm object's ``device``
            argument (uqlm's ``None`` -> ``"auto"``; ``"cuda:1"`` -> CUDA ordinal 1; ``"mps"`` or another device
            ONNX Runtime does not run -> ``"auto"``).
        precision: the engine precision. Default ``"fp32"``: uqlm's numbers within 1e-4 (uqlm runs fp32).
            ``"auto"`` runs INT8 on CPU (when the artifact passes its gate) and FP16 on CUDA: faster, with scores
            further from uqlm's (INT8: max |ΔNCP| 5.3e-3 on the bench's seeded checkpoint, docs/benchmarks.md).
        **engine_kwargs: passed to :meth:`NLIEngine.from_pretrained` (``batch_policy``, ``session_config``,
            ``result_cache``, ``cache_dir``).

    Returns:
        A :class:`UqlmPatch` naming the patched modules; usable as a context manager.

    Raises:
        ImportError: uqlm is not installed (the message has the ``pip install`` command).
        RuntimeError: the installed uqlm builds its NLI somewhere the patch cannot reach, its ``NLI`` no longer
            takes the arguments the factory reads, an entry point's module no longer builds it, or something else
            already replaced ``NLI`` in a uqlm module.
        ValueError: ``model`` is an :class:`NLIEngine` together with ``device`` or engine arguments.
    """
    if isinstance(model, NLIEngine) and (device is not None or engine_kwargs):
        raise ValueError("patch_uqlm(model=<NLIEngine>) runs that engine as it is; pass device=/engine arguments "
                         "with a model name or path instead")
    settings = _Settings(model, device, precision, dict(engine_kwargs))
    global _STATE
    with _LOCK:
        previous = _STATE.settings if _STATE is not None else None
        if _STATE is None:
            version, nli_class, modules = _find_seams()
            originals = {}
            for module in modules:
                originals[module.__name__] = getattr(module, "NLI")  # noqa: B009 (a module attribute)
                setattr(module, "NLI", _build_nli)  # noqa: B010
            _STATE = _State(version, nli_class, originals, settings)
            logger.info("uqlm %s: the NLI models built in %s now run on fastnli (precision=%r)", version,
                        ", ".join(sorted(originals)), precision)
        else:
            _STATE.settings = settings
            _STATE.engines.clear()
        return UqlmPatch(_STATE.uqlm_version, tuple(sorted(_STATE.originals)), precision, device, previous)


def unpatch_uqlm() -> bool:
    """Put uqlm's ``NLI`` class back in the modules :func:`patch_uqlm` patched; returns whether it was patched."""
    global _STATE
    with _LOCK:
        if _STATE is None:
            return False
        for name, original in _STATE.originals.items():
            module = importlib.import_module(name)
            if getattr(module, "NLI", None) is _build_nli:
                setattr(module, "NLI", original)  # noqa: B010
        _STATE = None
        logger.info("uqlm: NLI models are uqlm's own again")
        return True


def uqlm_patched() -> bool:
    """Whether :func:`patch_uqlm` is in effect."""
    return _STATE is not None


def _find_seams() -> tuple[str, type, list[ModuleType]]:
    """uqlm's version, its NLI class and the modules that build it by name, checked (see :func:`patch_uqlm`)."""
    spec = importlib.util.find_spec("uqlm")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"fastnli.patch_uqlm() needs uqlm, which is not installed: {_PIP} (fastnli is tested "
                          f"against uqlm {UQLM_TESTED_VERSION})")
    import uqlm

    version = str(getattr(uqlm, "__version__", "unknown"))
    where = f"uqlm {version} (fastnli.patch_uqlm() is tested against uqlm {UQLM_TESTED_VERSION}; {_PIP})"
    try:
        nli_class = importlib.import_module(_NLI_CLASS_MODULE).NLI
    except (ImportError, AttributeError) as exc:
        raise RuntimeError(f"{where} has no {_NLI_CLASS_MODULE}.NLI to replace") from exc
    params = inspect.signature(nli_class).parameters
    missing = [a for a in NLI_ARGUMENTS if a not in params]
    if missing:
        raise RuntimeError(f"{where}: {_NLI_CLASS_MODULE}.NLI takes no {missing}, which the patch reads; pass "
                           "nli=FastNLI(...) to uqlm's scorers instead")
    root = Path(next(iter(spec.submodule_search_locations)))
    names = []
    for path in sorted(root.rglob("*.py")):
        name = ".".join(("uqlm", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        if name == _NLI_CLASS_MODULE:
            continue
        text = path.read_text(encoding="utf-8")
        if _BUILDS_BY_ATTRIBUTE.search(text):
            raise RuntimeError(f"{where}: {name} builds NLI through a module attribute, out of the patch's reach; "
                               "pass nli=FastNLI(...) to uqlm's scorers instead")
        if _BUILDS_BY_NAME.search(text):
            names.append(name)
    absent = [m for m in ENTRY_POINT_MODULES if m not in names]
    if absent:
        raise RuntimeError(f"{where}: {absent} no longer build uqlm's NLI, so the patch would not reach "
                           "BlackBoxUQ / ConsistencyScorer / SemanticEntropy; pass nli=FastNLI(...) instead")
    modules = [importlib.import_module(n) for n in names]
    for module in modules:
        bound = getattr(module, "NLI", None)
        if bound is not nli_class:
            raise RuntimeError(f"{where}: {module.__name__}.NLI is {bound!r}, not {_NLI_CLASS_MODULE}.NLI; "
                               "something else replaced it, and the patch leaves it alone")
    return version, nli_class, modules


def _fastnli_device(device: Any) -> tuple[str, int | None]:
    """fastnli's device (and CUDA ordinal) for uqlm's ``device`` argument (None, a string or a torch.device)."""
    if device is None:
        return "auto", None
    text = str(device)
    kind, _, ordinal = text.partition(":")
    if kind in ("cpu", "auto"):
        return kind, None
    if kind == "cuda":
        return "cuda", int(ordinal) if ordinal.isdigit() else None
    logger.info("uqlm asked for device %r; fastnli runs ONNX Runtime on CUDA or CPU: device='auto'", text)
    return "auto", None


def _build_nli(*args: Any, **kwargs: Any) -> FastNLI:
    """What uqlm's ``NLI(...)`` returns while patched: a :class:`FastNLI` with uqlm's model and ``max_length``."""
    state = _STATE
    if state is None:  # a module object held on to the factory after unpatch_uqlm()
        raise RuntimeError("fastnli.unpatch_uqlm() already restored uqlm's NLI; call fastnli.patch_uqlm() again")
    bound = inspect.signature(state.nli_class).bind(*args, **kwargs)
    bound.apply_defaults()
    uqlm_args = bound.arguments
    s = state.settings
    max_length = int(uqlm_args["max_length"])
    if isinstance(s.model, NLIEngine):
        return FastNLI(s.model, max_length=max_length)
    model = s.model if s.model is not None else uqlm_args["nli_model_name"]
    device, ordinal = _fastnli_device(s.device if s.device is not None else uqlm_args["device"])
    kwargs = dict(s.engine_kwargs)
    if ordinal is not None and "session_config" not in kwargs:
        kwargs["session_config"] = SessionConfig(cuda_device_id=ordinal)
    key = (str(model), f"{device}:{ordinal}", s.precision)
    with _LOCK:
        engine = state.engines.get(key)
        if engine is None:
            engine = NLIEngine.from_pretrained(model, device=device, precision=s.precision,  # type: ignore[arg-type]
                                               **kwargs)
            state.engines[key] = engine
    logger.info("uqlm NLI(nli_model_name=%r, device=%r) -> fastnli %s on %s, %s", uqlm_args["nli_model_name"],
                uqlm_args["device"], engine.artifact_dir, engine.device, engine.precision)
    return FastNLI(engine, max_length=max_length)
