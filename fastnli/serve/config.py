"""``ServeConfig``: every knob of ``fastnli serve``, frozen, with defaults from ``FASTNLI_*`` environment variables.

Precedence: CLI flag > environment variable > the default below. Defaults were measured on a 2-core CPU machine
with the tiny seeded DeBERTa (``bench/serve_load.py``) and reasoned for real checkpoints:

- ``max_wait_ms=0``: how long the batcher holds the first request of an *idle* engine for company. Measured
  (``bench/serve_load.py``, servers interleaved, tiny model, 2 shared cores): 0 ms beat 2 ms at 1 client (323 vs
  192 req/s) and 4 clients (516 vs 427 req/s) and tied at 16 (606 req/s, ~40 pairs per pass either way): under load
  requests pile up while the previous pass runs and share the next one anyway (continuous batching, as TEI), so a
  wait only adds latency. A GPU with a large model and bursty low-concurrency traffic may gain from 1-5 ms.
- ``queue_size=256`` requests and ``max_queued_pairs=8192`` pairs waiting (not yet in an engine pass): beyond that a
  request is refused at once with 429 + ``Retry-After`` rather than queued into a timeout. 8192 short pairs are a few
  seconds of GPU work, well inside ``request_timeout_s``.
- ``max_pairs_per_request=256``: one request is never split over engine passes; 256 pairs keeps one request's pass
  within one or two GPU batches (CUDA policy: 512 rows) and bounds how long it can hold the CPU engine.
- ``max_text_chars=10000``: the model reads at most 512 tokens (~2000-2500 characters of English) per pair, so
  longer texts are almost all truncated away; the cap exists to bound memory, not to police the model limit.
- ``max_body_bytes=2_000_000`` (TEI's payload limit) and ``request_timeout_s=30``.
- ``max_queue_seconds=0.75``: a request is admitted only when the work waiting ahead of it plus its own is estimated
  to finish within 0.75 s of engine time, at the speed the batcher measures on this engine (starting from
  ``initial_tokens_per_s=2000`` estimated tokens/s, a 2-core CPU running a small model). Under overload requests are
  refused at once (429 + ``Retry-After``) instead of waiting into the 30 s timeout. Measured with
  ``bench/serve_abuse.py`` (default model, 2 shared cores, 4x capacity, client on the same cores): p99 of accepted
  16-pair requests 1.77 s at 0.75 (2.00 s at 1.0), with 95% of capacity still served.
- ``shutdown_timeout_s=20``: below Kubernetes' default 30 s grace, so the process exits on its own (code 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from fastnli._env import env_float, env_int, env_str

__all__ = ["ENV_VARS", "ServeConfig"]

#: Field name -> environment variable that sets its default.
ENV_VARS: dict[str, str] = {
    "host": "FASTNLI_HOST",
    "port": "FASTNLI_PORT",
    "max_wait_ms": "FASTNLI_MAX_WAIT_MS",
    "max_pass_pairs": "FASTNLI_MAX_PASS_PAIRS",
    "max_pass_tokens": "FASTNLI_MAX_PASS_TOKENS",
    "queue_size": "FASTNLI_QUEUE_SIZE",
    "max_queued_pairs": "FASTNLI_MAX_QUEUED_PAIRS",
    "max_pairs_per_request": "FASTNLI_MAX_PAIRS_PER_REQUEST",
    "max_text_chars": "FASTNLI_MAX_TEXT_CHARS",
    "max_body_bytes": "FASTNLI_MAX_BODY_BYTES",
    "request_timeout_s": "FASTNLI_REQUEST_TIMEOUT_S",
    "retry_after_s": "FASTNLI_RETRY_AFTER_S",
    "shutdown_timeout_s": "FASTNLI_SHUTDOWN_TIMEOUT_S",
    "log_interval_s": "FASTNLI_LOG_INTERVAL_S",
    "max_queue_seconds": "FASTNLI_MAX_QUEUE_SECONDS",
    "initial_tokens_per_s": "FASTNLI_INITIAL_TOKENS_PER_S",
    "api_key": "FASTNLI_API_KEY",
    "decode_processes": "FASTNLI_DECODE_PROCESSES",
}


def _env(name: str, default: Any, kind: type) -> Any:
    """``default`` unless the environment variable of field ``name`` is set (then parsed as ``kind``)."""
    var, sets = ENV_VARS[name], f"ServeConfig.{name}"
    if kind is int:
        return env_int(var, default, sets=sets)
    if kind is float:
        return env_float(var, default, sets=sets)
    return env_str(var, default)


@dataclass(frozen=True)
class ServeConfig:
    """Settings of the HTTP service; each default can be set by the ``FASTNLI_*`` variable in :data:`ENV_VARS`.

    Attributes:
        host: bind address (default ``127.0.0.1``: loopback only; expose it deliberately).
        port: TCP port (default 8080; 0 picks a free one).
        max_wait_ms: milliseconds the batcher waits, after the first request arrives at an idle engine, for others
            to join its engine pass (default 0: never wait; requests that arrive while a pass runs share the next).
        max_pass_pairs: most pairs in one engine pass (default 512). 1 with ``max_wait_ms=0`` serves one request at
            a time (a request is never split, so a larger request still gets its own pass).
        max_pass_tokens: padded-token budget of one engine pass, estimated as ``pairs x longest pair`` from the
            texts (default None: twice the engine's own ``batch_policy.max_batch_tokens``).
        queue_size: most requests waiting for an engine pass; more → 429 (default 256).
        max_queued_pairs: most pairs waiting for an engine pass; more → 429 (default 8192).
        max_pairs_per_request: most NLI pairs one request may need (default 256; larger → 413).
        max_text_chars: most characters of any one text (default 10000; longer → 413).
        max_body_bytes: most bytes of a request body (default 2,000,000; larger → 413).
        request_timeout_s: seconds a request may wait for its result (default 30; then 504 and its work is dropped
            if not yet in an engine pass).
        retry_after_s: the least ``Retry-After`` of a 429, in seconds (default 1; a time-bounded refusal says
            when the queue is estimated to have room).
        shutdown_timeout_s: seconds a graceful shutdown (SIGTERM) may take (default 20, below Kubernetes' 30 s):
            new requests get 503 while the accepted ones finish; those still unanswered near the end get 503.
        log_interval_s: seconds between INFO summaries of traffic (default 60; 0 = none).
        max_queue_seconds: most estimated seconds of engine work a request may wait behind, its own included
            (default 0.75); more → 429 with ``Retry-After`` at once. A request is always admitted to an idle engine.
        initial_tokens_per_s: the engine speed assumed until its passes are measured, in estimated tokens per
            second (default 2000).
        api_key: when set, every route but ``/health`` and ``/ready`` needs ``Authorization: Bearer <api_key>``
            (default None: no authentication; the value is never logged or shown by ``/info``).
        decode_processes: worker processes that decode and validate request bodies over 64 KiB (default 1,
            started with ``fastnli serve``, or by the first such body of an app made with ``create_app``; 0 decodes
            them on a thread, where ``json.loads`` of a 2 MB body holds the event loop for tens of milliseconds).
    """

    host: str = field(default_factory=lambda: _env("host", "127.0.0.1", str))
    port: int = field(default_factory=lambda: _env("port", 8080, int))
    max_wait_ms: float = field(default_factory=lambda: _env("max_wait_ms", 0.0, float))
    max_pass_pairs: int = field(default_factory=lambda: _env("max_pass_pairs", 512, int))
    max_pass_tokens: int | None = field(default_factory=lambda: _env("max_pass_tokens", None, int))
    queue_size: int = field(default_factory=lambda: _env("queue_size", 256, int))
    max_queued_pairs: int = field(default_factory=lambda: _env("max_queued_pairs", 8192, int))
    max_pairs_per_request: int = field(default_factory=lambda: _env("max_pairs_per_request", 256, int))
    max_text_chars: int = field(default_factory=lambda: _env("max_text_chars", 10000, int))
    max_body_bytes: int = field(default_factory=lambda: _env("max_body_bytes", 2_000_000, int))
    request_timeout_s: float = field(default_factory=lambda: _env("request_timeout_s", 30.0, float))
    retry_after_s: int = field(default_factory=lambda: _env("retry_after_s", 1, int))
    shutdown_timeout_s: float = field(default_factory=lambda: _env("shutdown_timeout_s", 20.0, float))
    log_interval_s: float = field(default_factory=lambda: _env("log_interval_s", 60.0, float))
    max_queue_seconds: float = field(default_factory=lambda: _env("max_queue_seconds", 0.75, float))
    initial_tokens_per_s: float = field(default_factory=lambda: _env("initial_tokens_per_s", 2000.0, float))
    api_key: str | None = field(default_factory=lambda: _env("api_key", None, str), repr=False)
    decode_processes: int = field(default_factory=lambda: _env("decode_processes", 1, int))

    def __post_init__(self) -> None:
        positive = ("max_pass_pairs", "queue_size", "max_queued_pairs", "max_pairs_per_request", "max_text_chars",
                    "max_body_bytes", "request_timeout_s", "max_queue_seconds", "initial_tokens_per_s")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0 (set by --{name.replace('_', '-')} or "
                                 f"{ENV_VARS[name]})")
        for name in ("max_wait_ms", "retry_after_s", "log_interval_s", "shutdown_timeout_s", "decode_processes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0 (set by --{name.replace('_', '-')} or "
                                 f"{ENV_VARS[name]})")
        if self.max_pass_tokens is not None and self.max_pass_tokens <= 0:
            raise ValueError(f"max_pass_tokens={self.max_pass_tokens} must be > 0 or None (engine default)")
        if self.api_key is not None and (not self.api_key or self.api_key != self.api_key.strip()):
            raise ValueError(f"api_key must be a non-empty string without surrounding blanks (set by --api-key or "
                             f"{ENV_VARS['api_key']})")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port} must be within 0..65535")
        if self.max_pairs_per_request > self.max_queued_pairs:
            raise ValueError(f"max_pairs_per_request={self.max_pairs_per_request} exceeds max_queued_pairs="
                             f"{self.max_queued_pairs}: such a request could never be queued; raise "
                             f"{ENV_VARS['max_queued_pairs']} or lower {ENV_VARS['max_pairs_per_request']}")

    @property
    def graceful_timeout_s(self) -> float:
        """Seconds a graceful shutdown may take (``shutdown_timeout_s``)."""
        return self.shutdown_timeout_s

    def as_dict(self) -> dict[str, Any]:
        """Every field, the API key masked (``"***"`` when set): safe to log and to show."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if out["api_key"] is not None:
            out["api_key"] = "***"
        return out
