"""The Starlette application of ``fastnli serve``: endpoints, limits, errors, metrics, lifespan.

Every scoring endpoint does the same four steps: read the body under ``max_body_bytes`` → validate (errors name the
field; 422 for shape, 413 for size) → plan its NLI pairs and submit them, as one job, to the shared
:class:`~fastnli.serve.batcher.DynamicBatcher` → await the job's rows (bounded by ``request_timeout_s``; a client that
disconnects first has its job dropped if it is not in an engine pass yet) and compute the answer from them with the
library's own code (:func:`fastnli.scorers.api.plan_scores` / :func:`~fastnli.scorers.api.score_rows`,
:func:`fastnli.calm.checks.plan_checks` / :func:`~fastnli.calm.checks.finish_checks`), so the service answers exactly
what the library computes. Request validation lives in :mod:`fastnli.serve.payloads`.

Before any work a request must pass, in this order: the API key (``Authorization: Bearer``, when
``config.api_key`` is set; every route but ``/health`` and ``/ready``), the service state (503 while draining),
``Content-Type: application/json`` (415; a cross-site form or ``text/plain`` POST is refused), the body size (413)
and its arrival within ``request_timeout_s`` (408). A body over 64 KiB is decoded and validated in a worker process
(:mod:`fastnli.serve.decoding`), never on the event loop, and each request's pair count is computed from its shape
before any pair is built (413 in time linear in the body).

Errors use TEI's body form ``{"error": str, "error_type": str}``: 413/415/422 ``Validation``, 401 ``Unauthorized``,
429 ``Overloaded`` (with ``Retry-After``), 503 ``Unhealthy`` (model loading or shutting down, with ``Retry-After``),
408/504 ``Timeout``, 500 ``Backend`` (the engine raised).

``POST /v1/grounding`` is :func:`fastnli.grounding` (:func:`~fastnli.calm.grounding.plan_grounding` /
:func:`~fastnli.calm.grounding.finish_grounding` around the shared batcher).

``POST /predict`` follows text-embeddings-inference's sequence-classification route. TEI's ``raw_scores: true``
returns logits; the engine returns probabilities only, so the service returns **natural-log probabilities** as raw
scores: ``log softmax(logits) = logits - logsumexp(logits)``, i.e. the logits shifted by one constant per input, so
their order and their softmax (the probabilities) are those of the logits (a probability that underflows float32 to 0
is clamped to ``log(1.18e-38) ≈ -87.3``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fastnli.calm.checks import CheckPlan, finish_checks, plan_checks
from fastnli.calm.grounding import finish_grounding, plan_grounding
from fastnli.engine.labels import CANONICAL_LABELS, require_three_way
from fastnli.engine.protocol import EngineLike
from fastnli.scorers.api import score_rows
from fastnli.scorers.questions import model_question_format
from fastnli.scorers.units import model_aligns_units
from fastnli.serve.batcher import DynamicBatcher, Overloaded, ShuttingDown, TooLarge, WorkRate
from fastnli.serve.config import ENV_VARS, ServeConfig
from fastnli.serve.decoding import BodyDecoder
from fastnli.serve.metrics import CONTENT_TYPE, ServeMetrics
from fastnli.serve.openapi import openapi_document
from fastnli.serve.payloads import (
    ApiError,
    calm_request,
    check_pair_count,
    grounding_item,
    ncp_request,
    parse_pairs,
    parse_predict,
)

__all__ = ["ServeState", "create_app"]

logger = logging.getLogger("fastnli")

EngineFactory = Callable[[], EngineLike]
T = TypeVar("T")

#: Routes that answer without an API key (health probes).
OPEN_ROUTES = ("health", "ready")


class _ClientGone(Exception):
    """The client disconnected before its answer was ready."""


@dataclass
class ServeState:
    """What the running app holds: config, metrics, and (once loaded) the engine and its batcher."""

    config: ServeConfig
    metrics: ServeMetrics = field(default_factory=ServeMetrics)
    engine: Any = None
    batcher: DynamicBatcher | None = None
    load_error: str | None = None
    closing: bool = False
    started: float = field(default_factory=time.time)
    #: scoring requests being answered (from their first byte to their response)
    inflight: int = 0
    #: set when the shutdown grace runs out: requests still waiting answer 503 at once
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    #: decodes and validates request bodies (large ones in ``config.decode_processes`` worker processes)
    decoder: BodyDecoder = field(init=False)
    _tokenizer: Any = None
    _tokenizer_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.decoder = BodyDecoder(self.config.decode_processes)

    # -- engine facts -------------------------------------------------------------------------------------------
    @property
    def manifest(self) -> Any:
        return getattr(self.engine, "manifest", None)

    @property
    def model_id(self) -> str:
        return str(getattr(self.manifest, "source", None) or type(self.engine).__name__)

    @property
    def max_length(self) -> int:
        value = getattr(self.manifest, "max_length", None)
        return int(value) if isinstance(value, int) and value > 0 else 512

    @property
    def labels(self) -> tuple[str, ...]:
        """The engine's output columns (:attr:`fastnli.NLIEngine.labels`; the 3-way order for engines without it)."""
        return tuple(getattr(self.engine, "labels", CANONICAL_LABELS))

    def label_names(self) -> list[str]:
        """The checkpoint's own label name of each canonical column (contradiction, neutral, entailment)."""
        m = self.manifest
        id2label, columns = getattr(m, "id2label", None), getattr(m, "columns", None)
        if not id2label or not columns:
            return list(CANONICAL_LABELS)
        return [str(id2label.get(str(c), id2label.get(c, CANONICAL_LABELS[i]))) for i, c in enumerate(columns)]

    def untruncated_lengths(self, pairs: Sequence[tuple[str, str]]) -> list[int] | None:
        """Tokens of each pair without truncation (special tokens included); None when the engine has no
        ``tokenizer.json`` (a stub engine)."""
        artifact = getattr(self.engine, "artifact_dir", None)
        if artifact is None or not (artifact / "tokenizer.json").is_file():
            return None
        with self._tokenizer_lock:
            if self._tokenizer is None:
                from tokenizers import Tokenizer

                tok = Tokenizer.from_file(str(artifact / "tokenizer.json"))
                tok.no_truncation()
                tok.no_padding()
                self._tokenizer = tok
        return [len(e.ids) for e in self._tokenizer.encode_batch(list(pairs), add_special_tokens=True)]

    def begin_drain(self) -> None:
        """Refuse new requests (503) from now on; those already begun go on, their engine work included."""
        self.closing = True
        self.metrics.ready.set(value=0)

    async def drain(self, seconds: float) -> bool:
        """:meth:`begin_drain`, wait up to ``seconds`` for the accepted requests to be answered, then make those still
        waiting answer 503 (:attr:`abort`); True when all were answered in time."""
        self.begin_drain()
        deadline = time.monotonic() + max(0.0, seconds)
        while self.inflight or (self.batcher is not None and not self.batcher.idle):
            if time.monotonic() >= deadline:
                logger.warning("shutdown grace over: %d requests still in flight get 503", self.inflight)
                self.abort.set()
                return False
            await asyncio.sleep(0.02)
        return True

    def info(self) -> dict[str, Any]:
        e = self.engine
        return {"model_id": self.model_id, "device": getattr(e, "device", None),
                "precision": getattr(e, "precision", None), "providers": list(getattr(e, "providers", []) or []),
                "labels": list(self.labels), "id2label": self.label_names(), "max_input_length": self.max_length}


# -- helpers ----------------------------------------------------------------------------------------------------
def _error_response(exc: ApiError) -> JSONResponse:
    # a message may quote a client's text; a lone surrogate in it must not make the error itself fail to encode
    message = exc.message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": message, "error_type": exc.error_type}, status_code=exc.status,
                        headers=exc.headers)


def _shutting_down(config: ServeConfig) -> ApiError:
    return ApiError(503, "the service is shutting down and accepts no new work; retry on another instance",
                    "Unhealthy", {"Retry-After": str(max(1, config.retry_after_s))})


async def _or_abort(state: ServeState, work: Awaitable[T], timeout: float | None) -> tuple[str, T | None]:
    """Await ``work`` unless ``timeout`` seconds pass or the shutdown grace runs out first: ``("done", result)``,
    ``("timeout", None)`` or ``("abort", None)`` (``work`` is then cancelled)."""
    task = asyncio.ensure_future(work)
    aborted = asyncio.ensure_future(state.abort.wait())
    try:
        done, _ = await asyncio.wait({task, aborted}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return "done", task.result()
        return ("abort" if aborted in done else "timeout"), None
    finally:
        aborted.cancel()
        if not task.done():
            task.cancel()


def _check_content_type(request: Request) -> None:
    raw = request.headers.get("content-type")
    media = (raw or "").split(";")[0].strip().lower()
    if media != "application/json":
        got = f"{raw!r}" if raw else "none"
        raise ApiError(415, f"Content-Type must be application/json; got {got}", "Validation")


async def _read_body(request: Request, config: ServeConfig) -> bytes:
    limit = config.max_body_bytes
    too_big = (f"request body is larger than {limit} bytes, the limit ({ENV_VARS['max_body_bytes']}); split the "
               "request")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body is {int(declared)} bytes; the limit is {limit} "
                            f"({ENV_VARS['max_body_bytes']}); split the request")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, too_big)
        chunks.append(chunk)
    return b"".join(chunks)


async def _parsed(state: ServeState, request: Request, parse: Callable[[Any], T]) -> T:
    """The request's JSON body decoded and passed through ``parse`` (validation and counting) by the state's
    :class:`~fastnli.serve.decoding.BodyDecoder`: in a worker process when the body is larger than 64 KiB.
    ``parse`` must be picklable (a module-level function, or a :func:`functools.partial` of one)."""
    cfg = state.config
    _check_content_type(request)
    outcome, body = await _or_abort(state, _read_body(request, cfg), cfg.request_timeout_s)
    if outcome == "abort":
        raise _shutting_down(cfg)
    if body is None:
        raise ApiError(408, f"the request body did not arrive within {cfg.request_timeout_s:g} s "
                            f"({ENV_VARS['request_timeout_s']})", "Timeout")
    return await state.decoder.parse(body, parse)


async def _wait_disconnect(request: Request) -> None:
    """Return when the client disconnects (the body has been read, so ``receive`` only reports a disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _ready(state: ServeState) -> DynamicBatcher:
    if state.batcher is None:
        if state.load_error:
            raise ApiError(503, f"the model failed to load: {state.load_error}", "Unhealthy")
        raise ApiError(503, "the model is still loading; GET /ready says when it is", "Unhealthy",
                       {"Retry-After": str(max(1, state.config.retry_after_s))})
    return state.batcher


async def _run_pairs(state: ServeState, request: Request, pairs: list[tuple[str, str]]) -> np.ndarray:
    """Submit one request's pairs to the shared batcher and await its rows (timeout, disconnect, overload)."""
    batcher = _ready(state)
    cfg = state.config
    try:
        fut = batcher.submit(pairs)
    except Overloaded as exc:
        raise ApiError(429, str(exc), "Overloaded", {"Retry-After": str(exc.retry_after_s)}) from None
    except TooLarge as exc:
        raise ApiError(413, str(exc)) from None
    except ShuttingDown:
        raise _shutting_down(cfg) from None
    finally:
        state.metrics.engine_rate.set(value=batcher.rate.tokens_per_s)
    if fut.done():
        return fut.result()
    result = asyncio.wrap_future(fut)
    gone = asyncio.ensure_future(_wait_disconnect(request))
    aborted = asyncio.ensure_future(state.abort.wait())
    try:
        waiters: set[asyncio.Future[Any]] = {result, gone, aborted}
        done, _ = await asyncio.wait(waiters, timeout=cfg.request_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if result in done:
            return result.result()
        reason = "disconnect" if gone in done else "shutdown" if aborted in done else "timeout"
        dropped = fut.cancel()  # True: not in an engine pass yet, so its work is dropped
        (state.metrics.dropped if dropped else state.metrics.wasted).inc(reason)
        if reason == "disconnect":
            raise _ClientGone()
        if reason == "shutdown":
            raise _shutting_down(cfg)
        raise ApiError(504, f"no result within {cfg.request_timeout_s:g} s ({ENV_VARS['request_timeout_s']}); "
                            + ("the request was dropped before its engine pass" if dropped
                               else "its engine pass was still running"), "Timeout")
    finally:
        gone.cancel()
        aborted.cancel()
        if not result.done():
            result.cancel()


def _labelled(names: Sequence[str], scores: np.ndarray) -> list[dict[str, Any]]:
    order = np.argsort(-scores, kind="stable")
    return [{"label": names[j], "score": float(scores[j])} for j in order]


# -- endpoints --------------------------------------------------------------------------------------------------
async def _nli(state: ServeState, request: Request) -> Response:
    pairs = await _parsed(state, request, partial(parse_pairs, config=state.config))
    probs = await _run_pairs(state, request, pairs)
    labels = state.labels
    results = []
    for row in probs:
        results.append({"label": labels[int(np.argmax(row))],
                        "probabilities": {lab: float(x) for lab, x in zip(labels, row)}})
    return JSONResponse({"results": results, "labels": labels, "model": state.model_id,
                         "device": getattr(state.engine, "device", None),
                         "precision": getattr(state.engine, "precision", None)})


async def _ncp(state: ServeState, request: Request) -> Response:
    try:
        require_three_way(state.labels, "/v1/ncp")
    except ValueError as exc:
        raise ApiError(422, str(exc)) from None
    parse = partial(ncp_request, config=state.config, model_question_format=model_question_format(state.engine),
                    model_align_units=model_aligns_units(state.engine))
    batched, items = await _parsed(state, request, parse)
    plans = [it.plan() for it in items]
    probs = await _run_pairs(state, request, [pair for p in plans for pair in p.pairs])
    out, offset = [], 0
    for plan in plans:
        row = score_rows(plan, probs[offset:offset + len(plan.pairs)])[0]
        offset += len(plan.pairs)
        d = row.to_dict()
        for key in ("index", "response"):
            d.pop(key, None)
        d["scorers"] = list(plan.scorers)
        out.append(d)
    return JSONResponse(out if batched else out[0])


async def _calm_check(state: ServeState, request: Request) -> Response:
    batched, items = await _parsed(state, request, partial(calm_request, config=state.config))
    _ready(state)
    max_length = state.max_length

    def plan() -> list[CheckPlan]:
        plans = [plan_checks([answer], cfg, max_length).expand(state.engine) for answer, cfg in items]
        for p in plans:
            p.pair_plan.warn_truncation()
        return plans

    plans = await asyncio.to_thread(plan)
    check_pair_count(sum(len(p.model_pairs) for p in plans), "the request needs", state.config)
    probs = await _run_pairs(state, request, [pair for p in plans for pair in p.model_pairs])

    def finish() -> list[dict[str, Any]]:
        out, offset = [], 0
        for p in plans:
            out.append(finish_checks(p, probs[offset:offset + len(p.model_pairs)])[0].to_dict())
            offset += len(p.model_pairs)
        return out

    results = await asyncio.to_thread(finish)
    return JSONResponse(results if batched else results[0])


async def _grounding(state: ServeState, request: Request) -> Response:
    statements, docs, granularity, threshold, matrix, align_units = await _parsed(
        state, request, partial(grounding_item, config=state.config))
    _ready(state)
    try:
        plan = await asyncio.to_thread(plan_grounding, statements, docs, state.engine, granularity, threshold,
                                       align_units)
    except (TypeError, ValueError) as exc:
        raise ApiError(422, str(exc)) from None
    pairs = plan.pairs
    check_pair_count(len(pairs), "the request needs", state.config)
    probs = await _run_pairs(state, request, pairs)
    result = finish_grounding(plan, probs, state.labels)
    return JSONResponse(result.to_dict(matrix=matrix))


async def _predict(state: ServeState, request: Request) -> Response:
    pairs, batched, raw_scores, truncate = await _parsed(state, request, partial(parse_predict, config=state.config))
    if not truncate:
        _ready(state)
        lengths = await asyncio.to_thread(state.untruncated_lengths, pairs)
        for i, n in enumerate(lengths or []):
            if n > state.max_length:
                where = f"inputs[{i}]" if batched else "inputs"
                raise ApiError(413, f"{where} has {n} tokens; the model reads at most {state.max_length} (send "
                                    "\"truncate\": true to truncate it longest_first)")
    probs = await _run_pairs(state, request, pairs)
    names = state.label_names()
    scores = np.log(np.maximum(probs, np.finfo(np.float32).tiny)) if raw_scores else probs
    out = [_labelled(names, row) for row in scores]
    return JSONResponse(out if batched else out[0])


async def _health(state: ServeState, request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def _ready_endpoint(state: ServeState, request: Request) -> Response:
    if state.closing:
        return JSONResponse({"ready": False, "reason": "shutting down"}, status_code=503)
    if state.batcher is None:
        reason = f"the model failed to load: {state.load_error}" if state.load_error else "the model is loading"
        return JSONResponse({"ready": False, "reason": reason}, status_code=503)
    return JSONResponse({"ready": True, **state.info()})


async def _info(state: ServeState, request: Request) -> Response:
    _ready(state)
    limits = {k: v for k, v in state.config.as_dict().items() if k not in ("host", "port", "api_key")}
    limits["auth"] = state.config.api_key is not None
    b = state.batcher
    if b is not None:
        limits["max_pass_tokens"] = b.max_pass_tokens
    return JSONResponse({**state.info(), "version": _version(), "limits": limits})


async def _metrics(state: ServeState, request: Request) -> Response:
    m = state.metrics
    e = state.engine
    if e is not None:
        m.info.set(state.model_id, str(getattr(e, "device", "")), str(getattr(e, "precision", "")),
                   ",".join(getattr(e, "providers", []) or []), value=1)
        m.fallbacks.set(value=float(getattr(e, "fallbacks", 0)))
    return Response(m.render(), media_type=CONTENT_TYPE)


async def _openapi(state: ServeState, request: Request) -> Response:
    return JSONResponse(openapi_document(state.config))


def _version() -> str:
    from fastnli import __version__

    return __version__


# -- wiring -----------------------------------------------------------------------------------------------------
Handler = Callable[[ServeState, Request], Awaitable[Response]]


#: The POST routes: they need a JSON body, are refused while draining and are waited for at shutdown.
SCORING_ROUTES = ("nli", "ncp", "calm_check", "predict")


def _authorize(config: ServeConfig, request: Request) -> None:
    """401 unless ``config.api_key`` is unset or the request carries ``Authorization: Bearer <api_key>``."""
    if config.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8", "replace"),
                                                             config.api_key.encode("utf-8")):
        raise ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the key "
                            f"the service was started with (--api-key or {ENV_VARS['api_key']})", "Unauthorized",
                       {"WWW-Authenticate": "Bearer"})


def _endpoint(state: ServeState, name: str, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a handler: error mapping, latency and status metrics, one DEBUG line per request."""

    scoring = name in SCORING_ROUTES

    async def endpoint(request: Request) -> Response:
        t0 = time.perf_counter()
        if scoring:
            state.inflight += 1
        try:
            if name not in OPEN_ROUTES:
                _authorize(state.config, request)
            if scoring and state.closing:  # requests begun before the drain go on
                raise _shutting_down(state.config)
            response = await handler(state, request)
        except ApiError as exc:
            response = _error_response(exc)
        except _ClientGone:
            response = Response(status_code=499)
        except Exception as exc:
            logger.exception("%s %s failed", request.method, request.url.path)
            response = _error_response(ApiError(500, f"engine failure: {type(exc).__name__}: {exc}", "Backend"))
        finally:
            if scoring:
                state.inflight -= 1
        seconds = time.perf_counter() - t0
        state.metrics.count_response(name, response.status_code)
        state.metrics.latency.observe(seconds, name)
        logger.debug("%s %s -> %d in %.1f ms", request.method, request.url.path, response.status_code,
                     seconds * 1000)
        return response

    return endpoint


async def _http_exception(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", str(exc))
    return JSONResponse({"error": f"{request.method} {request.url.path}: {detail}", "error_type": "NotFound"
                         if status == 404 else "Validation"}, status_code=status,
                        headers=getattr(exc, "headers", None))


def _load(state: ServeState, factory: EngineFactory) -> None:
    t0 = time.perf_counter()
    try:
        engine = factory()
    except Exception as exc:
        state.load_error = f"{type(exc).__name__}: {exc}"
        logger.exception("the model failed to load")
        return
    _attach(state, engine)
    logger.info("model loaded in %.1f s: %s", time.perf_counter() - t0, state.model_id)


def _attach(state: ServeState, engine: EngineLike) -> None:
    cfg = state.config
    warm_up = getattr(engine, "warm_up", None)
    if callable(warm_up):  # the engine's working memory is claimed now, not by the first long request
        logger.info("engine warmed up with a full-length batch per stream in %.2f s", warm_up())
    state.engine = engine
    model_max = getattr(getattr(engine, "manifest", None), "max_length", 512)
    batcher = DynamicBatcher(engine, max_wait_ms=cfg.max_wait_ms, max_pass_pairs=cfg.max_pass_pairs,
                             max_pass_tokens=cfg.max_pass_tokens, queue_size=cfg.queue_size,
                             max_queued_pairs=cfg.max_queued_pairs,
                             model_max_length=model_max if isinstance(model_max, int) else 512,
                             metrics=state.metrics, log_interval_s=cfg.log_interval_s,
                             retry_after_s=cfg.retry_after_s,
                             max_queue_s=min(cfg.max_queue_seconds, cfg.request_timeout_s),
                             deadline_s=cfg.request_timeout_s, rate=WorkRate(cfg.initial_tokens_per_s))
    state.batcher = batcher.start()
    state.metrics.ready.set(value=1)
    info = state.info()
    logger.info("serving %s on %s/%s", info["model_id"], info["device"], info["precision"])


def create_app(engine: EngineLike | EngineFactory, config: ServeConfig | None = None) -> Starlette:
    """The ASGI app of the service.

    Args:
        engine: a loaded engine (:class:`fastnli.NLIEngine` or anything with ``predict_with_stats``), or a
            zero-argument factory that loads one — then the model loads in a background thread at startup and
            ``/ready`` answers 503 until it is loaded (``/health`` answers 200 throughout).
        config: the settings (default ``ServeConfig()``, i.e. the ``FASTNLI_*`` environment or the defaults).

    The app's ``state.serve`` is the :class:`ServeState`. At shutdown (after the server has finished the requests in
    flight) the batcher stops admission and drains its queue.
    """
    cfg = config or ServeConfig()
    state = ServeState(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loader = None
        if hasattr(engine, "predict_with_stats"):
            _attach(state, engine)  # type: ignore[arg-type]
        else:
            loader = threading.Thread(target=_load, args=(state, engine), name="fastnli-model-loader", daemon=True)
            loader.start()
        try:
            yield
        finally:
            # after a drain every request has been answered: a model still loading or a pass still running after
            # its grace helps no one, so the wait is short (the loader and batcher threads are daemons)
            wait = 1.0 if state.closing else cfg.graceful_timeout_s
            state.begin_drain()
            if loader is not None and loader.is_alive():
                await asyncio.to_thread(loader.join, wait)
            if state.batcher is not None:
                await asyncio.to_thread(state.batcher.close, wait)
            state.decoder.close()

    def route(path: str, name: str, handler: Handler, method: str) -> Route:
        return Route(path, _endpoint(state, name, handler), methods=[method], name=name)

    routes = [
        route("/v1/nli", "nli", _nli, "POST"),
        route("/v1/ncp", "ncp", _ncp, "POST"),
        route("/v1/calm/check", "calm_check", _calm_check, "POST"),
        route("/v1/grounding", "grounding", _grounding, "POST"),
        route("/predict", "predict", _predict, "POST"),
        route("/health", "health", _health, "GET"),
        route("/ready", "ready", _ready_endpoint, "GET"),
        route("/info", "info", _info, "GET"),
        route("/metrics", "metrics", _metrics, "GET"),
        route("/openapi.json", "openapi", _openapi, "GET"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_exception})
    app.state.serve = state
    return app
