"""``NLIEngine``: NLI probabilities for (premise, hypothesis) pairs on ONNX Runtime, GPU first, CPU fallback.

Data flow of :meth:`NLIEngine.predict`: validate → dedup directed pairs (kernels) → result cache → tokenize the
unique pairs once → pack by length under a padded-token budget (kernels) → ORT → softmax → canonical label order →
scatter back to input order. Probabilities are always ``(contradiction, neutral, entailment)``.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fastnli._env import env_str
from fastnli.engine.batches import CPU_POLICY, CUDA_POLICY, BatchPolicy, RunStats, score_unique
from fastnli.engine.labels import labels_of
from fastnli.engine.manifest import (
    PRECISIONS,
    Manifest,
    check_local_path,
    checkpoint_hash,
    precisions_for,
    read_manifest,
    verify_graph,
)
from fastnli.engine.result_cache import ResultCache
from fastnli.engine.session import (
    Device,
    SessionConfig,
    auto_device,
    cpu_streams,
    create_session,
    cuda_listed,
    gpu_present,
    is_device_error,
    session_model,
)
from fastnli.engine.tokenize import PairTokenizer
from fastnli.engine.windows import LongPremise, WindowPlanner, WindowPolicy, check_long_premise
from fastnli.kernels import dedup_pairs, plan_batches, scatter_rows

logger = logging.getLogger("fastnli")

DeviceArg = Literal["auto", "cuda", "cpu"]
PrecisionArg = Literal["auto", "fp32", "fp16", "int8"]

#: CPU ``precision="auto"`` picks INT8 only when the manifest's INT8 graph agreed with PyTorch fp32 on at least this
#: share of the probe set's argmax labels; otherwise fp32.
INT8_MIN_AGREEMENT = 0.98


@dataclass
class CallStats:
    """Counters of one :meth:`NLIEngine.predict` call.

    ``pairs_in`` pairs came in, ``unique_pairs`` of them distinct. With ``long_premise="chunk"``,
    ``chunked_pairs`` distinct pairs were read in windows: ``requested_pairs`` counts the model pairs the input asks
    for (a chunked pair counts once per window, duplicates included) and ``model_pairs`` the distinct ones the
    scheduler ran or found in the cache (windows deduplicated across pairs, documents and statements).
    ``truncated_pairs`` distinct pairs were read cut to the model limit. ``dedup_ratio`` is ``pairs_in /
    unique_pairs`` (1.0 = no duplicates); ``padding_efficiency`` is ``real_tokens / padded_tokens`` over the batches
    actually run (1.0 when nothing ran).
    """

    pairs_in: int = 0
    unique_pairs: int = 0
    cache_hits: int = 0
    computed_pairs: int = 0
    batches: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    seconds: float = 0.0
    long_premise: str = "truncate"
    truncated_pairs: int = 0
    chunked_pairs: int = 0
    requested_pairs: int = 0
    model_pairs: int = 0

    @property
    def dedup_ratio(self) -> float:
        return self.pairs_in / self.unique_pairs if self.unique_pairs else 1.0

    @property
    def padding_efficiency(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["dedup_ratio"] = self.dedup_ratio
        d["padding_efficiency"] = self.padding_efficiency
        return d


@dataclass
class Predictions:
    """What :meth:`NLIEngine.predict_detailed` returns, one entry per input pair in input order.

    Attributes:
        probs: float32 ``(N, k)`` probabilities in the order of :attr:`NLIEngine.labels` (entailment last); a
            chunked pair's row is its deciding window's (:func:`fastnli.engine.windows.deciding_rows`).
        best_window: int64 ``(N,)``: index of the deciding window (:meth:`NLIEngine.windows` lists them), -1 for a
            pair read whole.
        num_windows: int64 ``(N,)``: windows read (1 for a pair read whole).
        truncated: bool ``(N,)``: the model read the pair cut to ``max_length`` tokens.
        tokens: int64 ``(N,)``: the whole pair's tokens, special tokens included.
        stats: the call's counters.
    """

    probs: np.ndarray
    best_window: np.ndarray
    num_windows: np.ndarray
    truncated: np.ndarray
    tokens: np.ndarray
    stats: CallStats


def cache_root() -> Path:
    """Where exported artifacts of HF checkpoints are cached: ``$FASTNLI_CACHE`` or ``~/.cache/fastnli``."""
    return Path(env_str("FASTNLI_CACHE") or Path.home() / ".cache" / "fastnli").expanduser()


def cached_artifact_dir(checkpoint_dir: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Where :func:`resolve_artifact` keeps the export of a local HF checkpoint directory:
    ``<cache>/artifacts/<hash of its config+weights+tokenizer>`` (``cache_dir`` overrides :func:`cache_root`)."""
    return Path(cache_dir or cache_root()) / "artifacts" / checkpoint_hash(checkpoint_dir)[:24]


def resolve_artifact(name_or_dir: str | Path, cache_dir: str | Path | None = None, device: DeviceArg = "auto",
                     precision: PrecisionArg = "auto", progress: bool = False) -> Path:
    """Return an export artifact directory for ``name_or_dir``, exporting a HF checkpoint once if needed.

    Accepts an artifact directory (holds ``manifest.json``), a local HF checkpoint directory, or a HF hub id. A
    checkpoint is exported into ``<cache>/artifacts/<hash of its config+weights+tokenizer>`` and reused afterwards,
    with the graphs an engine on ``device`` running ``precision`` needs
    (:func:`~fastnli.engine.manifest.precisions_for`: CPU fp32 + int8, CUDA fp32 + fp16; ``device="auto"`` is this
    machine's, :func:`~fastnli.engine.session.auto_device`). A cached artifact that lacks one of them is exported
    again with its own precisions and the missing ones, and so is one whose DeBERTa attention graph is older than
    what this version writes (:func:`~fastnli.exporter.attention.attention_recipe`); one whose manifest or graph
    fails verification (:func:`~fastnli.engine.manifest.verify_graph`) is removed and exported again. ``progress``
    shows the export's stages as a rich progress bar on stderr (default False: the stages are logged at INFO).

    Raises:
        FileNotFoundError: when ``name_or_dir`` reads as a local path (``./dir``, ``/abs/dir``, ``~/dir``) that does
            not exist (:func:`~fastnli.engine.manifest.check_local_path`), or is a directory that is neither an
            artifact nor a checkpoint.
    """
    check_local_path(name_or_dir)
    path = Path(name_or_dir).expanduser()
    if path.is_dir() and (path / "manifest.json").is_file():
        return path
    from fastnli.exporter.export import export, resolve_checkpoint

    if path.is_dir() and not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} holds neither manifest.json (a fastnli artifact) nor config.json (a HF "
                                "checkpoint)")
    ckpt, _ = resolve_checkpoint(name_or_dir)
    target = cached_artifact_dir(ckpt, cache_dir)
    needed = precisions_for(auto_device() if device == "auto" else device, precision)
    try:
        manifest = read_manifest(target)
        for entry in manifest.precisions.values():
            verify_graph(target, entry)
    except (OSError, ValueError) as exc:
        if target.exists():
            logger.warning("the cached export %s of %s is damaged (%s); exporting it again", target, name_or_dir, exc)
            shutil.rmtree(target, ignore_errors=True)
        logger.info("exporting %s once into the cache %s (%s)", name_or_dir, target, "+".join(needed))
        export(ckpt, target, precisions=needed, progress=progress)
        return target
    cached = tuple(manifest.precisions)
    missing = [p for p in needed if p not in cached]
    from fastnli.exporter.attention import attention_recipe

    attention = attention_recipe(json.loads((ckpt / "config.json").read_text()))
    if missing:
        logger.info("the cached export %s of %s lacks %s: exporting again with it", target, name_or_dir,
                    "+".join(missing))
        export(ckpt, target, precisions=(*cached, *missing), progress=progress)
    elif manifest.precisions["fp32"].recipe.get("attention") != attention:
        logger.info("the cached export %s of %s has an older attention graph (%s; this version writes %s): "
                    "exporting again", target, name_or_dir,
                    manifest.precisions["fp32"].recipe.get("attention", "as transformers writes it"),
                    attention or "the graph as transformers writes it")
        export(ckpt, target, precisions=cached, progress=progress)
    else:
        logger.info("using cached export %s of %s", target, name_or_dir)
    return target


#: Why the embedded default model runs INT8 although its probe row may read below :data:`INT8_MIN_AGREEMENT`: its
#: gate is its quality records (measured on held-out NLI and answer data), not the 24-pair probe set.
EMBEDDED_INT8_REASON = ("the embedded model's shipped precision (quality gate: tools/default_model/quality.json / "
                        "MODEL_CARD.md)")


def _int8_agreement(manifest: Manifest) -> float | None:
    entry = manifest.precisions.get("int8")
    return entry.validation.argmax_agreement if entry is not None and entry.validation is not None else None


def cpu_precision_choice(manifest: Manifest, embedded: bool = False) -> tuple[str, str]:
    """``(precision, reason)``: the graph ``precision="auto"`` runs on CPU and why, in words.

    INT8 when its measured argmax agreement with fp32 on the probe set passes :data:`INT8_MIN_AGREEMENT`, or when
    the artifact ships no fp32 graph (``embedded``: the embedded default model, whose gate is its quality records,
    :data:`EMBEDDED_INT8_REASON`); else fp32.
    """
    names = manifest.precisions
    agreement = _int8_agreement(manifest)
    gate = f"{INT8_MIN_AGREEMENT:.0%} gate (fastnli.engine.INT8_MIN_AGREEMENT)"
    if "int8" in names:
        if embedded:
            return "int8", EMBEDDED_INT8_REASON
        if "fp32" not in names:
            return "int8", "the artifact's only CPU graph (it has no fp32 graph)"
        if agreement is not None and agreement >= INT8_MIN_AGREEMENT:
            return "int8", f"the INT8 graph's argmax agreement with fp32 on the probe set is {agreement:.4f} " \
                f"({agreement:.1%}), at least the {gate}"
        if agreement is None:
            return "fp32", f"picked over int8: the INT8 graph has no validation figures (exported with " \
                f"--no-validate), so it cannot pass the {gate}; precision int8 runs it anyway"
        return "fp32", f"picked over int8: the INT8 graph's argmax agreement with fp32 on the probe set is " \
            f"{agreement:.4f} ({agreement:.1%}), below the {gate}; precision int8 runs it anyway"
    if "fp32" in names:
        return "fp32", "the artifact has no INT8 graph"
    first = next(iter(names))
    return first, "the artifact's only graph"


def cpu_auto_precision(manifest: Manifest) -> str:
    """The graph ``precision="auto"`` runs on CPU: INT8 when its measured agreement passes
    :data:`INT8_MIN_AGREEMENT` (or the artifact ships no fp32 graph, as the embedded default model), else fp32
    (see :func:`cpu_precision_choice` for the reason in words)."""
    return cpu_precision_choice(manifest)[0]


def _is_embedded(artifact_dir: Path) -> bool:
    """True when ``artifact_dir`` is the embedded default model's directory."""
    from fastnli.default_model import DEFAULT_MODEL_DIR

    try:
        return artifact_dir.resolve() == DEFAULT_MODEL_DIR.resolve()
    except OSError:
        return False


def check_utf8(text: str, where: str) -> None:
    """Raise ValueError naming ``where`` when ``text`` holds a lone surrogate (not encodable as UTF-8)."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{where} is not valid UTF-8 text (lone surrogate at position {exc.start}); decode the "
                         "source bytes with errors='replace' (or remove the character) before scoring") from None


def _validate_pairs(pairs: Any) -> tuple[list[str], list[str], bool]:
    """Check ``pairs`` and split it; returns ``(premises, hypotheses, was_single_pair)``."""
    if isinstance(pairs, tuple) and len(pairs) == 2 and all(isinstance(x, str) for x in pairs):
        check_utf8(pairs[0], "pairs[0] (premise)")
        check_utf8(pairs[1], "pairs[1] (hypothesis)")
        return [pairs[0]], [pairs[1]], True
    if pairs is None or isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
        raise TypeError(f"pairs must be a list of (premise, hypothesis) string pairs; got {type(pairs).__name__}")
    premises, hypotheses = [], []
    for i, pair in enumerate(pairs):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence):
            raise TypeError(f"pairs[{i}] must be a (premise, hypothesis) pair of two strings; got "
                            f"{type(pair).__name__}")
        if len(pair) != 2:
            raise ValueError(f"pairs[{i}] must be a (premise, hypothesis) pair of two strings; got a "
                             f"{type(pair).__name__} of length {len(pair)}")
        for j, field in enumerate(("premise", "hypothesis")):
            if not isinstance(pair[j], str):
                raise TypeError(f"pairs[{i}][{j}] ({field}) must be str; got {type(pair[j]).__name__}")
            check_utf8(pair[j], f"pairs[{i}][{j}] ({field})")
        premises.append(pair[0])
        hypotheses.append(pair[1])
    return premises, hypotheses, False


class NLIEngine:
    """An NLI cross-encoder on ONNX Runtime. Create it with :meth:`from_pretrained`.

    Attributes:
        device: the device actually used, ``"cuda"`` or ``"cpu"`` (after any fallback).
        precision: the graph actually used, ``"fp32"``, ``"fp16"`` or ``"int8"``.
        providers: ORT's execution providers of the live session.
        streams: sessions running batches concurrently (CPU: see :func:`fastnli.engine.session.cpu_streams`).
        exact_int8: whether the INT8 graph runs on ORT's exact U8U8 kernels (uint8 weights, see
            :attr:`fastnli.engine.session.SessionConfig.exact_int8`); False for other graphs and devices.
        fused_layers: the layers whose self-attention runs in fastnli's compiled operator (DeBERTa v1 INT8 graphs
            on CPU, :mod:`fastnli.engine.fused_attention`); 0 for other graphs and devices.
        manifest: the artifact's manifest (source, versions, validation figures).
        precision_reason: why :attr:`precision` was picked, in words (``fastnli info`` prints it), e.g. ``"picked
            over int8: the INT8 graph's argmax agreement with fp32 on the probe set is 0.9440 (94.4%), below the 98%
            gate ..."``.
        last_stats: counters of the latest :meth:`predict` call.
    """

    def __init__(self, artifact_dir: str | Path, device: DeviceArg = "auto", precision: PrecisionArg = "auto",
                 batch_policy: BatchPolicy | None = None, session_config: SessionConfig | None = None,
                 result_cache: ResultCache | None = None, window_policy: WindowPolicy | None = None) -> None:
        if device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"device={device!r} is not supported; use 'auto', 'cuda' or 'cpu'")
        if precision not in ("auto", *PRECISIONS):
            raise ValueError(f"precision={precision!r} is not supported; use 'auto', 'fp32', 'fp16' or 'int8'")
        self.artifact_dir = Path(artifact_dir)
        self.manifest: Manifest = read_manifest(self.artifact_dir)
        self._requested = (device, precision)
        self._policy_override = batch_policy
        self._session_config = session_config or SessionConfig()
        self.result_cache = result_cache
        self._tokenizer = PairTokenizer(self.artifact_dir / "tokenizer.json", self.manifest.max_length)
        if window_policy is None and self.manifest.window_policy is not None:
            window_policy = WindowPolicy.from_manifest(self.manifest.window_policy,
                                                       f"{self.artifact_dir / 'manifest.json'}: window_policy")
        #: cuts long premises into windows (``long_premise="chunk"``); its ``policy`` is a :class:`WindowPolicy`
        self.window_planner = WindowPlanner(self._tokenizer, window_policy)
        self._lock = threading.Lock()
        self.fallbacks = 0
        self.last_stats = CallStats()
        self.embedded = _is_embedded(self.artifact_dir)
        if precision == "int8":
            self._warn_int8_below_gate()
        self._open(device, precision)

    # -- construction -------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        name_or_dir: str | Path | None = None,
        device: DeviceArg = "auto",
        precision: PrecisionArg = "auto",
        batch_policy: BatchPolicy | None = None,
        session_config: SessionConfig | None = None,
        result_cache: ResultCache | None = None,
        cache_dir: str | Path | None = None,
        window_policy: WindowPolicy | None = None,
        progress: bool = False,
    ) -> NLIEngine:
        """Load an engine.

        Args:
            name_or_dir: an export artifact directory, a local HF checkpoint directory or a HF hub id (a checkpoint
                is exported once into the cache, see :func:`cache_root`).
            device: ``"auto"`` (CUDA when its provider loads, else CPU — default), ``"cuda"`` or ``"cpu"``. When
                CUDA cannot load or a GPU run fails, the engine logs one warning and continues on CPU; ``"auto"``
                on a machine without a GPU (:func:`~fastnli.engine.session.gpu_present`) picks the CPU with an INFO
                line instead.
            precision: ``"auto"`` (default: FP16 on CUDA; on CPU INT8 when the manifest's INT8 argmax agreement is
                at least :data:`INT8_MIN_AGREEMENT`, else fp32), or ``"fp32"``, ``"fp16"``, ``"int8"``.
            batch_policy: token budget and row cap per batch (default :data:`CPU_POLICY` or :data:`CUDA_POLICY`).
            session_config: ORT threads and optimisation level.
            result_cache: an optional :class:`fastnli.engine.ResultCache` shared across calls (or engines): keys
                carry the artifact hash, the precision in use and the INT8 kernel mode, so engines never see each
                other's results unless they come from the same graph run the same way.
            cache_dir: overrides ``$FASTNLI_CACHE`` for exports of HF checkpoints.
            window_policy: how ``long_premise="chunk"`` cuts long premises (default: the manifest's
                ``window_policy`` when it names one — the embedded default model's: windows of at most 128 tokens —
                else :class:`~fastnli.engine.windows.WindowPolicy()`: windows as large as the model allows, 64
                tokens of overlap).
            progress: when a checkpoint is exported, show its stages as a rich progress bar on stderr (default
                False: they are logged at INFO). The export holds the graphs ``device`` and ``precision`` need
                (:func:`resolve_artifact`).
        """
        if name_or_dir is None:
            from fastnli.default_model import default_model_dir

            name_or_dir = default_model_dir()
        artifact = resolve_artifact(name_or_dir, cache_dir, device, precision, progress)
        return cls(artifact, device=device, precision=precision, batch_policy=batch_policy,
                   session_config=session_config, result_cache=result_cache, window_policy=window_policy)

    def _graph(self, precision: str) -> Path:
        """The verified graph file of ``precision`` (:func:`~fastnli.engine.manifest.verify_graph`)."""
        if precision not in self.manifest.precisions:
            raise ValueError(f"precision={precision!r} is not in the artifact {self.artifact_dir} (it has "
                             f"{sorted(self.manifest.precisions)}); re-export with that precision")
        return verify_graph(self.artifact_dir, self.manifest.precisions[precision])

    def _warn_int8_below_gate(self) -> None:
        """precision='int8' asked for an INT8 graph that ``"auto"`` would not pick: say so, with the figures."""
        agreement = _int8_agreement(self.manifest)
        if self.embedded or "int8" not in self.manifest.precisions or (
                agreement is not None and agreement >= INT8_MIN_AGREEMENT):
            return
        figure = "has no validation figures (exported with --no-validate)" if agreement is None else \
            f"agreed with fp32 on {agreement:.4f} ({agreement:.1%}) of the probe set's argmax labels"
        logger.warning("precision='int8': the INT8 graph of %s %s, below the %.0f%% gate "
                       "(fastnli.engine.INT8_MIN_AGREEMENT) that precision='auto' applies; its scores may differ from "
                       "fp32 (precision='fp32' or 'auto' runs the fp32 graph)", self.artifact_dir, figure,
                       100 * INT8_MIN_AGREEMENT)

    def _cpu_precision(self, precision: str) -> tuple[str, str]:
        if precision != "auto":
            return precision, f"asked for (precision={precision!r})"
        return cpu_precision_choice(self.manifest, self.embedded)

    def _open(self, device: str, precision: str) -> None:
        listed = cuda_listed()
        if device == "cuda" or (device == "auto" and listed):
            cpu_prec, cpu_reason = self._cpu_precision(precision)
            if not listed:  # plain onnxruntime: no CUDA provider to try
                reason = "this onnxruntime build has no CUDA execution provider (install onnxruntime-gpu instead of " \
                    "onnxruntime: docs/engine.md)"
            else:
                prec = precision if precision != "auto" else next(
                    p for p in ("fp16", "fp32", "int8") if p in self.manifest.precisions)
                session, used = create_session(self._graph(prec), "cuda", self._session_config)
                if used == "cuda":
                    why = "auto on CUDA: the first of fp16, fp32, int8 in the artifact" if precision == "auto" \
                        else f"asked for (precision={precision!r})"
                    self._set_sessions([session], "cuda", prec, reason=why)
                    return
                reason = "the CUDA execution provider could not be loaded (onnxruntime-gpu needs the CUDA and cuDNN " \
                    "libraries of its build, and a GPU)"
            if device == "auto" and not gpu_present():
                # the normal path of a CPU-only machine with onnxruntime-gpu installed: not worth a warning
                logger.info("device='auto': no GPU found, running on CPU with precision %s", cpu_prec)
            else:
                logger.warning("device=%r: %s; falling back to CPU with precision %s", device, reason, cpu_prec)
                self.fallbacks += 1
            self._open_cpu(cpu_prec, cpu_reason)
            return
        prec, why = self._cpu_precision(precision)
        if device == "auto":
            logger.info("device='auto': this onnxruntime build has no CUDA execution provider, running on CPU with "
                        "precision %s", prec)
        self._open_cpu(prec, why)

    def _open_cpu(self, precision: str, reason: str) -> None:
        graph = self._graph(precision)
        streams, threads = cpu_streams(self._session_config, graph)
        from fastnli.exporter.attention import SHIFT_RECIPE  # a constant: nothing of the export runs

        # the other graphs are made from the fp32 graph, whose recipe names the attention it was exported with
        exported = self.manifest.precisions.get("fp32", self.manifest.precisions[precision])
        shift = exported.recipe.get("attention") == SHIFT_RECIPE
        model = session_model(graph, self._session_config, int8=precision == "int8",
                              relative_shift=shift)  # once for all streams
        sessions = [create_session(model, "cpu", self._session_config, threads)[0] for _ in range(streams)]
        self._set_sessions(sessions, "cpu", precision, exact_int8=getattr(model, "exact_int8", False), reason=reason,
                           fused_layers=getattr(model, "fused_layers", 0))

    def _set_sessions(self, sessions: list[Any], device: Device, precision: str, exact_int8: bool = False,
                      reason: str = "", fused_layers: int = 0) -> None:
        self._sessions = sessions
        self.device: Device = device
        self.precision: str = precision
        self.precision_reason: str = reason
        self.streams = len(sessions)
        self.exact_int8 = exact_int8
        self.fused_layers = fused_layers
        self.providers: list[str] = list(sessions[0].get_providers())
        self._input_names = [i.name for i in sessions[0].get_inputs()]
        self.batch_policy = self._policy_override or (CUDA_POLICY if device == "cuda" else CPU_POLICY)
        # result-cache keys name what produced a result: one artifact's graphs (and INT8 kernel modes) differ
        self._cache_tag = f"{self.manifest.artifact_hash}/{precision}{'/exact-int8' if exact_int8 else ''}"

    def _fallback_to_cpu(self, exc: BaseException) -> None:
        prec, reason = self._cpu_precision(self._requested[1])
        logger.warning("a run on CUDA failed (%s: %s); switching this engine to CPU with precision %s",
                       type(exc).__name__, str(exc).splitlines()[0][:200], prec)
        self.fallbacks += 1
        self._open_cpu(prec, reason)

    def _run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        try:
            return self._sessions[0].run(None, feed)[0]
        except Exception as exc:
            if self.device == "cuda" and is_device_error(exc):
                with self._lock:
                    if self.device == "cuda":
                        self._fallback_to_cpu(exc)
                return self._sessions[0].run(None, feed)[0]
            raise

    def _runs(self) -> list[Callable[[dict[str, np.ndarray]], np.ndarray]]:
        """One run callable per stream: the first keeps the CUDA fallback, the others are plain CPU sessions."""
        if len(self._sessions) == 1:
            return [self._run]
        return [self._run, *(lambda feed, s=s: s.run(None, feed)[0] for s in self._sessions[1:])]

    # -- inference ----------------------------------------------------------------------------------------------
    @property
    def labels(self) -> tuple[str, ...]:
        """Column names of :meth:`predict`'s output: ``("contradiction", "neutral", "entailment")`` for a 3-way
        head, ``("not_entailment", "entailment")`` for a 2-way head (the manifest's ``columns``)."""
        return labels_of(self.manifest.columns)

    def predict(self, pairs: Sequence[tuple[str, str]] | tuple[str, str],
                long_premise: LongPremise = "truncate") -> np.ndarray:
        """NLI probabilities of (premise, hypothesis) pairs.

        Args:
            pairs: a list of ``(premise, hypothesis)`` string pairs, or one pair. Empty strings are legal text.
            long_premise: what happens to a pair longer than the model maximum (``manifest.max_length``, 512):
                ``"truncate"`` (default) cuts it ``longest_first``, reported in :attr:`last_stats` and one log
                warning; ``"chunk"`` reads the premise in overlapping sentence-aligned windows and returns the row of
                the window that decides it (the highest P(entailment), or by the window policy's contradiction
                bar the most contradicting: :mod:`fastnli.engine.windows`).

        Returns:
            float32 array ``(N, 3)`` (``(3,)`` for a single pair) of probabilities in the order
            ``(contradiction, neutral, entailment)`` (a 2-way head: ``(N, 2)``, ``(not_entailment, entailment)``,
            see :attr:`labels`), rows in input order. An empty list gives ``(0, k)``.

        Raises:
            TypeError / ValueError: naming the offending index, for anything that is not a pair of strings, or a
                text that is not valid UTF-8 (a lone surrogate such as ``"\\ud800"``), checked before tokenizing;
                ValueError for an unknown ``long_premise``.
        """
        probs, _ = self.predict_with_stats(pairs, long_premise=long_premise)
        return probs

    def predict_with_stats(
        self, pairs: Sequence[tuple[str, str]] | tuple[str, str], progress: Callable[[int, int], None] | None = None,
        long_premise: LongPremise = "truncate",
    ) -> tuple[np.ndarray, CallStats]:
        """Like :meth:`predict`, also returning this call's :class:`CallStats`.

        ``progress``, if given, is called after each batch with ``(pairs in that batch, pairs to score in all)``
        (for progress bars; cache hits are not counted).
        """
        single = isinstance(pairs, tuple) and len(pairs) == 2 and all(isinstance(x, str) for x in pairs)
        result = self.predict_detailed(pairs, long_premise, progress)
        return (result.probs[0] if single else result.probs), result.stats

    def predict_detailed(self, pairs: Sequence[tuple[str, str]] | tuple[str, str],
                         long_premise: LongPremise = "chunk",
                         progress: Callable[[int, int], None] | None = None) -> Predictions:
        """:meth:`predict` with the long-premise report of every pair (:class:`Predictions`); ``long_premise``
        defaults to ``"chunk"`` here. One pair gives one row (``probs`` of shape ``(1, k)``).

        Flow: validate → dedup → measure and expand long premises (:class:`~fastnli.engine.windows.WindowPlanner`)
        → dedup the (window, hypothesis) pairs → result cache → one scheduler pass (tokenize, pack by length, run)
        → best window per pair → scatter to input order.
        """
        t0 = time.perf_counter()
        premises, hypotheses, _ = _validate_pairs(pairs)
        mode = check_long_premise(long_premise)
        stats = CallStats(pairs_in=len(premises), long_premise=mode)
        first, inverse = dedup_pairs(premises, hypotheses)
        up = [premises[i] for i in first]
        uh = [hypotheses[i] for i in first]
        stats.unique_pairs = len(up)
        plan = self.window_planner.plan(up, uh, mode)
        stats.truncated_pairs = int(plan.truncated.sum())
        stats.chunked_pairs = int(plan.chunked.sum())
        stats.requested_pairs = int(plan.num_windows[inverse].sum())
        expanded = len(plan.pairs) != len(up)
        if expanded:
            mfirst, minverse = dedup_pairs([p for p, _ in plan.pairs], [h for _, h in plan.pairs])
            mp = [plan.pairs[i][0] for i in mfirst]
            mh = [plan.pairs[i][1] for i in mfirst]
        else:
            mp, mh = up, uh
        stats.model_pairs = len(mp)
        scored = self._score_unique_pairs(mp, mh, stats, progress)
        rows, best = plan.aggregate(scatter_rows(scored, minverse) if expanded else scored)
        if stats.truncated_pairs:
            self._warn_truncated(plan.truncated, plan.tokens, mode)
        out = scatter_rows(rows, inverse)
        stats.seconds = time.perf_counter() - t0
        self.last_stats = stats
        return Predictions(out, best[inverse], plan.num_windows[inverse], plan.truncated[inverse],
                           plan.tokens[inverse], stats)

    def _warn_truncated(self, truncated: np.ndarray, tokens: np.ndarray, mode: str) -> None:
        n, longest = int(truncated.sum()), int(tokens[truncated].max())
        if mode == "truncate":
            logger.warning("%d of %d distinct pairs exceed the model limit of %d tokens (longest: %d) and are read "
                           "truncated longest_first; long_premise='chunk' reads their premises in windows instead",
                           n, len(truncated), self.max_length, longest)
        else:
            logger.warning("%d of %d distinct pairs are read truncated to %d tokens (longest: %d): their hypothesis "
                           "leaves fewer than %d tokens for premise windows", n, len(truncated), self.max_length,
                           longest, self.window_planner.policy.min_window_tokens)

    def _score_unique_pairs(self, up: list[str], uh: list[str], stats: CallStats,
                            progress: Callable[[int, int], None] | None) -> np.ndarray:
        """Probabilities of distinct pairs: result cache, then one scheduler pass over the rest."""
        unique = np.empty((len(up), len(self.labels)), dtype=np.float32)
        todo = list(range(len(up)))
        cache = self.result_cache
        keys: list[tuple[str, str, str]] = []
        if cache is not None and up:
            keys = [(self._cache_tag, p, h) for p, h in zip(up, uh)]
            todo = []
            for u, hit in enumerate(cache.get_many(keys)):
                if hit is None:
                    todo.append(u)
                else:
                    unique[u] = hit
            stats.cache_hits = len(up) - len(todo)
        if todo:
            run_stats = RunStats()
            computed = score_unique(self._runs(), self._tokenizer, [up[u] for u in todo], [uh[u] for u in todo],
                                    self._input_names, self.manifest.columns, self.manifest.pad_token_id,
                                    self.batch_policy, run_stats, progress)
            unique[todo] = computed
            if cache is not None:
                cache.put_many([keys[u] for u in todo], computed)
            stats.computed_pairs = len(todo)
            stats.batches, stats.real_tokens, stats.padded_tokens = (
                run_stats.batches, run_stats.real_tokens, run_stats.padded_tokens)
        return unique

    @property
    def max_length(self) -> int:
        """The pair limit in tokens, special tokens included (``manifest.max_length``)."""
        return self._tokenizer.max_length

    def windows(self, premise: str, hypothesis: str) -> list[str]:
        """The premise texts ``long_premise="chunk"`` reads for this pair: its windows, in order, or ``[premise]``
        when the pair fits (or its hypothesis leaves too little room, and it is read truncated)."""
        _validate_pairs((premise, hypothesis))
        plan = self.window_planner.plan([premise], [hypothesis], "chunk")
        return plan.windows(0)

    def warm_up(self) -> float:
        """Run the largest batch the batch policy forms at the model's maximum length (CPU: one 512-token row;
        CUDA: 64) through every stream, so each ORT session holds its working memory before the first call: a long
        request then adds no memory, and a machine short of it fails here rather than under traffic. The rows are
        padding tokens under a full attention mask; nothing is returned or cached. Returns the seconds it took."""
        t0 = time.perf_counter()
        policy = self.batch_policy
        plan = plan_batches(np.full(policy.max_batch_size, self.max_length), policy.max_batch_tokens,
                            policy.max_batch_size, policy.pad_multiple, policy.max_batch_attention)
        rows, n = int(plan.bounds[1]), int(plan.seq_lens[0])  # the scheduler's first (largest) batch
        feed = {"input_ids": np.full((rows, n), self.manifest.pad_token_id, dtype=np.int64),
                "attention_mask": np.ones((rows, n), dtype=np.int64),
                "token_type_ids": np.zeros((rows, n), dtype=np.int64)}
        feed = {k: v for k, v in feed.items() if k in self._input_names}
        for run in self._runs():
            run(feed)
        return time.perf_counter() - t0

    def token_lengths(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Token count of each pair as the engine encodes it (special tokens included, after truncation)."""
        premises, hypotheses, _ = _validate_pairs(list(pairs))
        return np.diff(self._tokenizer.encode(premises, hypotheses)[1])

    def with_policy(self, **changes: Any) -> NLIEngine:
        """Set batch-policy fields (``max_batch_tokens``, ``max_batch_size``, ``pad_multiple``, ``max_batch_attention``,
        ``batch_overhead_tokens``: :class:`~fastnli.engine.batches.BatchPolicy`) and return self."""
        self._policy_override = replace(self.batch_policy, **changes)
        self.batch_policy = self._policy_override
        return self

    def __repr__(self) -> str:
        return (f"NLIEngine(source={self.manifest.source!r}, device={self.device!r}, precision={self.precision!r}, "
                f"providers={self.providers}, streams={self.streams})")


_DEFAULT_ENGINES: dict[tuple[Any, ...], NLIEngine] = {}
_DEFAULT_ENGINES_LOCK = threading.Lock()


def default_engine(
    model: str | Path | None = None,
    device: DeviceArg = "auto",
    precision: PrecisionArg = "auto",
    batch_policy: BatchPolicy | None = None,
    session_config: SessionConfig | None = None,
) -> NLIEngine:
    """The engine this process shares for these settings: loaded on first use, the same object afterwards.

    ``fastnli.score``, ``fastnli.calm.calm`` / ``calm_batch`` and ``alce_citations`` called without an engine use
    ``default_engine()`` (the embedded default model), so repeated calls reuse one ONNX Runtime session. The key is
    ``(model, device, precision, batch_policy, session_config)``, with ``session_config`` made (and the ``FASTNLI_*``
    environment read) at the call; arguments as :meth:`NLIEngine.from_pretrained`. Changing the returned engine's
    policy (:meth:`NLIEngine.with_policy`) changes it for every user of the key: build your own engine for that.
    """
    config = session_config or SessionConfig()
    key = (None if model is None else str(model), device, precision, batch_policy, config)
    with _DEFAULT_ENGINES_LOCK:
        engine = _DEFAULT_ENGINES.get(key)
        if engine is None:
            engine = NLIEngine.from_pretrained(model, device=device, precision=precision, batch_policy=batch_policy,
                                               session_config=config)
            _DEFAULT_ENGINES[key] = engine
        return engine
