"""ONNX Runtime sessions: explicit options, explicit providers, and an honest report of what actually loaded.

``onnxruntime-gpu`` lists ``CUDAExecutionProvider`` as available even where its CUDA libraries cannot load; ORT
then silently builds a CPU-only session. :func:`create_session` therefore always checks ``session.get_providers()``
and reports the device it really got, so the engine can switch to the CPU graph and say so.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastnli._env import env_flag, env_int

logger = logging.getLogger("fastnli")

Device = Literal["cuda", "cpu"]


#: ORT rewrites that make CPU sessions slower. ``SkipLayerNormFusion`` merges residual Add + LayerNorm into one
#: ``SkipLayerNormalization`` kernel, which in ORT 1.31 runs slower on CPU than the two ops it replaces: the MiniLM
#: dynamic INT8 graph ran 1.10-1.13x faster without it (64 pairs x 27-120 tokens, 1 thread), DeBERTa-large INT8
#: 1.02x; fp32 and blockwise INT8 graphs were unchanged.
CPU_DISABLED_OPTIMIZERS: tuple[str, ...] = ("SkipLayerNormFusion",)


@dataclass(frozen=True)
class SessionConfig:
    """ONNX Runtime settings.

    Attributes:
        intra_op_threads: the CPU threads to use (default 0, or ``FASTNLI_THREADS`` when the config is made). 0: all cores (ORT's one per
            physical core; with several streams, the cores divided among them). With auto ``streams`` a positive
            value is the engine's core budget, divided among the streams; with explicit ``streams`` it is the
            threads of each stream.
        inter_op_threads: threads across independent operators (default 1: DeBERTa's graph is a chain).
        cuda_device_id: GPU ordinal for the CUDA provider (default 0).
        optimization: ORT graph optimisation level: ``"all"`` (default), ``"extended"``, ``"basic"``, ``"none"``.
        streams: CPU sessions of the same graph that run batches concurrently, each with its own threads (default
            0, or ``FASTNLI_STREAMS`` when the config is made: auto, see :func:`cpu_streams`). CUDA always runs one session.
        cpu_disabled_optimizers: ORT graph rewrites left out of CPU sessions (default
            :data:`CPU_DISABLED_OPTIMIZERS`); CUDA sessions keep them all.
        exact_int8: run INT8 matrix products exactly on x86-64 CPUs without VNNI (default ``None``, or
            ``FASTNLI_EXACT_INT8`` = ``1``/``0``: auto, on where :func:`u8s8_saturates`). ORT's fast U8S8 kernels
            there add pairs of products in 16 bits, which saturate: the shipped MiniLM INT8 graph agreed with fp32
            on 95.6% of its snli/dev gate slice instead of 98.8%. On, the INT8 graph's weights are moved to uint8
            before it loads (``w + 128``, zero point with them: the same products, see
            :mod:`fastnli.engine.u8_weights`) and ORT runs its exact U8U8 kernels, up to 1.2x slower there (the
            shipped model on snli/dev, 2 cores: 233 vs 284 pairs/s on an AVX2 EPYC, 95 vs 94 on a Zen 1 EPYC, whose
            two kernels run at one speed). Only INT8 CPU sessions are affected; ``True``
            on a VNNI CPU would give up its (already exact) VNNI kernels.
        fused_attention: run DeBERTa v1's self-attention (relative shift graphs) in fastnli's compiled
            ``DisentangledAttention`` operator in INT8 CPU sessions (default True, or ``FASTNLI_FUSED_ATTENTION`` =
            ``0`` to turn it off): the plain graph's attention to float rounding, 1.35x (short pairs) to 1.90x
            (long) faster end to end on a deberta-large-shaped checkpoint (docs/benchmarks.md;
            :mod:`fastnli.engine.fused_attention`). Where the operator library is not built, does not load, or has
            no AVX2/AVX-512 kernel for this CPU, sessions run the plain graph.
    """

    intra_op_threads: int = field(default_factory=lambda: env_int("FASTNLI_THREADS", 0, minimum=0))
    inter_op_threads: int = 1
    cuda_device_id: int = 0
    optimization: str = "all"
    streams: int = field(default_factory=lambda: env_int("FASTNLI_STREAMS", 0, minimum=0))
    cpu_disabled_optimizers: tuple[str, ...] = CPU_DISABLED_OPTIMIZERS
    exact_int8: bool | None = None
    fused_attention: bool = field(default_factory=lambda: env_flag("FASTNLI_FUSED_ATTENTION") is not False)


def _cpuinfo(field: str, path: str = "/proc/cpuinfo") -> str | None:
    """The first ``field`` value of ``/proc/cpuinfo`` (Linux), or None where it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == field:
                    return value.strip()
    except OSError:
        pass
    return None


def _cpu_flags() -> set[str] | None:
    """The CPU feature flags of ``/proc/cpuinfo`` (Linux), or None where they cannot be read."""
    flags = _cpuinfo("flags")
    return None if flags is None else set(flags.split())


def cpu_model_name() -> str:
    """This CPU's model name, with its family and model numbers (``/proc/cpuinfo``: a virtual machine's name, such as
    ``AMD EPYC``, can stand for CPUs of several generations); ``platform.processor()`` or the machine name
    elsewhere."""
    name = _cpuinfo("model name")
    if not name:
        return platform.processor() or platform.machine()
    family, model = _cpuinfo("cpu family"), _cpuinfo("model")
    return f"{name}, family {family} model {model}" if family and model else name


@functools.cache
def u8s8_saturates() -> bool:
    """True on x86-64 CPUs without VNNI (``avx512_vnni`` / ``avx_vnni``), where ORT's U8S8 INT8 kernels sum pairs
    of uint8 x int8 products in 16 bits and saturate. Where the flags cannot be read (not Linux) an x86-64 CPU
    counts as saturating unless numpy reports AVX512-VNNI: exact but possibly slower. False on other CPUs."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return False
    flags = _cpu_flags()
    if flags is not None:
        return not ({"avx512_vnni", "avx_vnni"} & flags)
    import numpy as np

    umath = getattr(getattr(np, "_core", None), "_multiarray_umath", None)  # numpy >= 2; private, so optional
    features = getattr(umath, "__cpu_features__", None)
    return not (isinstance(features, dict) and features.get("AVX512VNNI", False))


#: CPU flags that select ORT's x86-64 INT8 GEMM kernels, fastest first, with the name :func:`int8_isa` gives them.
INT8_ISAS: tuple[tuple[str, str], ...] = (
    ("amx_int8", "AMX-INT8"), ("avx512_vnni", "AVX-512 VNNI"), ("avx_vnni", "AVX-VNNI"), ("avx2", "AVX2"))


def int8_isa() -> str:
    """The fastest INT8 instruction set this CPU reports, which selects ORT's INT8 matrix kernels: ``"AMX-INT8"``,
    ``"AVX-512 VNNI"``, ``"AVX-VNNI"`` or ``"AVX2"`` on x86-64 (from ``/proc/cpuinfo``; ``"x86-64"`` where the
    flags cannot be read), else the machine name (e.g. ``"aarch64"``). INT8 speeds differ several-fold between these
    (the default model on 2 cores: 241 pairs/s with AVX2, about 1,300 with AMX-INT8)."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return machine or "unknown"
    flags = _cpu_flags()
    if flags is None:
        return "x86-64"
    return next((name for flag, name in INT8_ISAS if flag in flags), "x86-64")


def exact_int8_wanted(config: SessionConfig) -> bool:
    """Whether sessions under ``config`` ask ORT for exact INT8 products (see :attr:`SessionConfig.exact_int8`)."""
    wanted = config.exact_int8 if config.exact_int8 is not None else env_flag("FASTNLI_EXACT_INT8")
    return u8s8_saturates() if wanted is None else wanted


def session_options(config: SessionConfig, intra_op_threads: int | None = None) -> Any:
    """``onnxruntime.SessionOptions`` for ``config``: threads, sequential execution and optimisation level."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = config.intra_op_threads if intra_op_threads is None else intra_op_threads
    opts.inter_op_num_threads = config.inter_op_threads
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }[config.optimization]
    opts.log_severity_level = 3
    return opts


class SessionGraph(bytes):
    """A graph :func:`session_model` rewrote, serialized, with what it did.

    Attributes:
        exact_int8: its INT8 weights were moved to uint8 (:attr:`SessionConfig.exact_int8`).
        fused_layers: the layers whose self-attention runs fused; above 0, :func:`create_session` registers the
            operator library (:mod:`fastnli.engine.fused_attention`).
    """

    exact_int8: bool = False
    fused_layers: int = 0


def register_operators(options: Any, graph: str | Path | bytes) -> None:
    """Register fastnli's operator library with ``onnxruntime.SessionOptions`` ``options`` when ``graph`` is a
    :class:`SessionGraph` with fused layers (a session of it needs the library); else leave ``options`` as it is."""
    if isinstance(graph, SessionGraph) and graph.fused_layers:
        from fastnli.engine import fused_attention

        fused_attention.register(options)


def session_model(graph: str | Path, config: SessionConfig, int8: bool, relative_shift: bool = False) -> str | bytes:
    """What a CPU session of ``graph`` loads: its path, or the graph rewritten and serialized. An INT8 graph gets
    uint8 weights where :func:`exact_int8_wanted` (:func:`fastnli.engine.u8_weights.weights_to_u8`), and an INT8
    graph exported with the relative shift (``relative_shift``) gets the fused attention where
    :attr:`SessionConfig.fused_attention` and the operator library loads
    (:func:`fastnli.engine.fused_attention.fuse_attention`); a rewritten graph comes back as a
    :class:`SessionGraph`. Build it once and hand it to every stream's :func:`create_session`."""
    from fastnli.engine import fused_attention

    exact = int8 and exact_int8_wanted(config)
    fuse = int8 and relative_shift and config.fused_attention and fused_attention.library() is not None
    if not (exact or fuse):
        return str(graph)
    try:
        import onnx
    except ImportError:  # a runtime dependency, absent only after pip install --no-deps; then library() is None too
        logger.warning("INT8 products on this CPU saturate (x86-64 without VNNI) and onnx, which makes them "
                       "exact, is not installed: pip install onnx")
        return str(graph)
    from fastnli.engine.u8_weights import weights_to_u8

    model = onnx.load(str(graph))
    exact = exact and weights_to_u8(model) > 0
    if exact:
        _log_exact_int8_once()
    fused = fused_attention.fuse_attention(model) if fuse else 0
    if fused:
        logger.debug("%s: the self-attention of %d layers runs fused", graph, fused)
    if not (exact or fused):
        return str(graph)
    data = SessionGraph(model.SerializeToString())
    data.exact_int8, data.fused_layers = exact, fused
    return data


@functools.cache
def _log_exact_int8_once() -> None:
    logger.info("INT8 graphs run with uint8 weights on ORT's exact U8U8 kernels: %s",
                "this x86-64 CPU has no VNNI, its U8S8 kernels saturate" if u8s8_saturates() else "asked for")


#: Graphs below this size (bytes) get one CPU stream per core when ``streams`` is auto: a small model's operators
#: are too small to spread over threads well. Measured on 2 cores: the 36 MB MiniLM dynamic INT8 graph scored
#: snli/dev 1.3x faster as 2 sessions x 1 thread than as 1 session x 2 threads, its blockwise INT8 graph 1.05x; the
#: 567 MB DeBERTa-large INT8 graph ran no faster.
SMALL_GRAPH_BYTES = 100 * 10**6
MAX_AUTO_STREAMS = 4


def cpu_streams(config: SessionConfig, graph: str | Path) -> tuple[int, int]:
    """``(streams, intra_op_threads per stream)`` for a CPU graph under ``config``.

    Auto (``streams=0``): for graphs under :data:`SMALL_GRAPH_BYTES` one single-threaded stream per core of the
    budget (``intra_op_threads`` when positive, else all cores; at most :data:`MAX_AUTO_STREAMS` streams, the cores
    divided among them), else one session with ``intra_op_threads``. Explicit ``streams`` with
    ``intra_op_threads=0`` divides all cores among them.
    """
    streams, threads = config.streams, config.intra_op_threads
    if streams <= 0:
        cores = threads if threads > 0 else os.cpu_count() or 1
        if Path(graph).stat().st_size >= SMALL_GRAPH_BYTES or cores == 1:
            return 1, threads
        streams = min(cores, MAX_AUTO_STREAMS)
        return streams, max(1, cores // streams)
    if threads <= 0 and streams > 1:
        threads = max(1, (os.cpu_count() or 1) // streams)
    return streams, threads


def cuda_listed() -> bool:
    """True when the installed ONNX Runtime build lists the CUDA provider (it may still fail to load)."""
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def gpu_present() -> bool:
    """True when this machine shows an NVIDIA GPU with its driver loaded: a ``/dev/nvidia<N>`` device (Linux),
    ``/dev/dxg`` (WSL 2), or a loadable ``nvcuda`` driver library (Windows). Decides only how loudly a CPU fallback
    under ``device="auto"`` is logged: INFO without a GPU (the normal path of a CPU machine), WARNING with one."""
    import glob
    import sys

    if sys.platform.startswith("linux"):
        return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/dxg")
    if sys.platform == "win32":
        import ctypes.util

        return ctypes.util.find_library("nvcuda") is not None
    return False


def auto_device() -> Device:
    """The device ``device="auto"`` means on this machine: ``"cuda"`` when the ONNX Runtime build lists the CUDA
    provider and a GPU is present (:func:`cuda_listed`, :func:`gpu_present`), else ``"cpu"``."""
    return "cuda" if cuda_listed() and gpu_present() else "cpu"


def create_session(graph: str | Path | bytes, device: Device, config: SessionConfig,
                   intra_op_threads: int | None = None) -> tuple[Any, Device]:
    """Create an inference session for ``graph`` on ``device``.

    ``intra_op_threads`` overrides ``config.intra_op_threads`` (the engine passes a stream's share of the cores).

    Returns:
        ``(session, device_used)``: ``device_used`` is ``"cpu"`` when CUDA was asked for but its provider did not
        load (the session is then a working CPU session).
    """
    import onnxruntime as ort

    opts = session_options(config, intra_op_threads)
    providers: list[Any] = ["CPUExecutionProvider"]
    if device == "cuda":
        providers = [("CUDAExecutionProvider", {"device_id": config.cuda_device_id}), "CPUExecutionProvider"]
        # ORT prints its own provider-load error through its default logger; we report the outcome ourselves.
        ort.set_default_logger_severity(4)
    disabled = [] if device == "cuda" else list(config.cpu_disabled_optimizers)
    register_operators(opts, graph)
    try:
        session = ort.InferenceSession(graph if isinstance(graph, bytes) else str(graph), sess_options=opts,
                                       providers=providers,
                                       disabled_optimizers=disabled)
    finally:
        if device == "cuda":
            ort.set_default_logger_severity(2)
    used: Device = "cuda" if "CUDAExecutionProvider" in session.get_providers() else "cpu"
    return session, used


def is_device_error(exc: BaseException) -> bool:
    """True when an ORT run failure looks like a GPU/device failure (worth retrying on CPU)."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(k in text for k in ("cuda", "cudnn", "cublas", "out of memory", "device", "gpu"))
