"""Prometheus metrics of the service, hand-written (text exposition format 0.0.4, no client library).

Three kinds, all thread-safe (the batcher thread and the event loop both update them): :class:`Counter`,
:class:`Gauge` (set, or read from a callback at scrape time) and :class:`Histogram` (cumulative ``le`` buckets, plus
``_sum`` and ``_count``). :class:`ServeMetrics` holds the service's own set; ``render()`` gives the ``/metrics`` body.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

__all__ = ["CONTENT_TYPE", "Counter", "Gauge", "Histogram", "Registry", "ServeMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LabelValues = tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _num(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(float(x))


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: Sequence[str]) -> LabelValues:
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}; got {tuple(labels)}")
        return tuple(str(v) for v in labels)

    def _samples(self) -> Iterable[str]:
        raise NotImplementedError

    def render(self) -> str:
        head = f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.kind}\n"
        return head + "".join(line + "\n" for line in self._samples())


class Counter(_Metric):
    """A monotonically increasing count per label set."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = (),
                 initial: Iterable[Sequence[str]] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self._values: dict[LabelValues, float] = {self._key(v): 0.0 for v in initial}
        if not self.labelnames:
            self._values[()] = 0.0

    def inc(self, *labels: str, value: float = 1.0) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + value

    def get(self, *labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def _samples(self) -> Iterable[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.labelnames, k)} {_num(v)}" for k, v in items]


class Gauge(_Metric):
    """A value that goes up and down; ``callback`` (if given) is read at each scrape instead of stored values."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = (),
                 callback: Callable[[], float] | None = None) -> None:
        super().__init__(name, help_text, labelnames)
        self._values: dict[LabelValues, float] = {}
        self._callback = callback

    def set(self, *labels: str, value: float) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def _samples(self) -> Iterable[str]:
        if self._callback is not None:
            return [f"{self.name} {_num(float(self._callback()))}"]
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.labelnames, k)} {_num(v)}" for k, v in items]


class Histogram(_Metric):
    """Observations in cumulative buckets (upper bounds ``buckets``, ``+Inf`` added)."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float], labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self.buckets = tuple(sorted(float(b) for b in buckets)) + (math.inf,)
        self._data: dict[LabelValues, list[float]] = {}  # per label set: bucket counts..., sum, count

    def observe(self, value: float, *labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            row = self._data.setdefault(key, [0.0] * (len(self.buckets) + 2))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    row[i] += 1
                    break
            row[-2] += value
            row[-1] += 1

    def count(self, *labels: str) -> int:
        with self._lock:
            row = self._data.get(self._key(labels))
            return int(row[-1]) if row else 0

    def _samples(self) -> Iterable[str]:
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._data.items())
        lines = []
        for key, row in items:
            cumulative = 0.0
            for bound, n in zip(self.buckets, row):
                cumulative += n
                le = 'le="' + _num(bound) + '"'
                lines.append(f"{self.name}_bucket{_labels(self.labelnames, key, le)} {_num(cumulative)}")
            lines.append(f"{self.name}_sum{_labels(self.labelnames, key)} {_num(row[-2])}")
            lines.append(f"{self.name}_count{_labels(self.labelnames, key)} {_num(row[-1])}")
        return lines


_M = TypeVar("_M", bound=_Metric)


class Registry:
    """An ordered set of metrics rendered together."""

    def __init__(self) -> None:
        self._metrics: list[_Metric] = []

    def add(self, metric: _M) -> _M:
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        return "".join(m.render() for m in self._metrics)


#: Latency buckets in seconds (1 ms .. 60 s).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Engine-pass size buckets (pairs or requests per pass).
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)

#: The status codes whose counters are exported from the start (so a scrape shows them at 0).
ERROR_KINDS = ("401", "413", "415", "422", "429", "5xx")


class ServeMetrics:
    """The service's metrics (names prefixed ``fastnli_``); see ``render()`` for the exposition text."""

    def __init__(self) -> None:
        self.registry = Registry()
        r = self.registry
        self.requests = r.add(Counter("fastnli_http_requests_total", "HTTP requests answered, by endpoint and status "
                                      "code.", ("endpoint", "code")))
        self.errors = r.add(Counter("fastnli_http_errors_total", "Error responses by kind: 401 (no or wrong API "
                                    "key), 413 (too large), 415 (not JSON), 422 (invalid), 429 (overloaded), 5xx "
                                    "(server side, timeouts and shutdown included).", ("kind",),
                                    initial=[(k,) for k in ERROR_KINDS]))
        self.latency = r.add(Histogram("fastnli_request_duration_seconds", "Request latency from the body read to the "
                                       "response, in seconds.", LATENCY_BUCKETS, ("endpoint",)))
        self.queue_wait = r.add(Histogram("fastnli_queue_wait_seconds", "Time requests waited in the queue before "
                                          "their engine pass started, in seconds.", LATENCY_BUCKETS))
        self.batch_pairs = r.add(Histogram("fastnli_batch_pairs", "Pairs per engine pass (before dedup).",
                                           SIZE_BUCKETS))
        self.batch_requests = r.add(Histogram("fastnli_batch_requests", "Requests per engine pass.", SIZE_BUCKETS))
        self.engine_seconds = r.add(Histogram("fastnli_engine_pass_seconds", "Duration of one engine pass, in "
                                              "seconds.", LATENCY_BUCKETS))
        self.pairs = r.add(Counter("fastnli_pairs_total", "Pairs sent to the engine (before dedup)."))
        self.unique_pairs = r.add(Counter("fastnli_unique_pairs_total", "Distinct pairs after the engine's dedup."))
        self.real_tokens = r.add(Counter("fastnli_real_tokens_total", "Tokens of the pairs the engine ran."))
        self.padded_tokens = r.add(Counter("fastnli_padded_tokens_total", "Tokens the engine ran, padding included."))
        self.padding_efficiency = r.add(Gauge(
            "fastnli_padding_efficiency", "real_tokens_total / padded_tokens_total (1 before any pass).",
            callback=self._padding_efficiency))
        self.dropped = r.add(Counter("fastnli_dropped_requests_total", "Requests whose work was dropped before an "
                                     "engine pass, by reason (client gone or timed out).", ("reason",),
                                     initial=[("disconnect",), ("timeout",), ("shutdown",)]))
        self.wasted = r.add(Counter("fastnli_wasted_requests_total", "Requests whose engine pass had started when "
                                    "their caller stopped waiting (the work is computed and thrown away), by reason.",
                                    ("reason",), initial=[("disconnect",), ("timeout",), ("shutdown",)]))
        self.engine_rate = r.add(Gauge("fastnli_engine_tokens_per_second", "The batcher's measured engine speed, in "
                                       "estimated tokens per second (admission divides the queued work by it)."))
        self.engine_failures = r.add(Counter("fastnli_engine_failures_total", "Engine passes that raised."))
        self.queue_depth = r.add(Gauge("fastnli_queue_depth", "Requests waiting for an engine pass."))
        self.queue_pairs = r.add(Gauge("fastnli_queue_pairs", "Pairs waiting for an engine pass."))
        self.info = r.add(Gauge("fastnli_engine_info", "The loaded engine (value 1).",
                                ("model", "device", "precision", "providers")))
        self.fallbacks = r.add(Gauge("fastnli_engine_fallbacks_total", "CUDA→CPU fallbacks of the engine so far "
                                     "(a counter read from the engine at scrape time)."))
        self.fallbacks.kind = "counter"
        self.ready = r.add(Gauge("fastnli_ready", "1 when the model is loaded and requests are served."))
        self.queue_depth.set(value=0)
        self.queue_pairs.set(value=0)
        self.fallbacks.set(value=0)
        self.ready.set(value=0)

    def _padding_efficiency(self) -> float:
        padded = self.padded_tokens.get()
        return self.real_tokens.get() / padded if padded else 1.0

    def count_response(self, endpoint: str, code: int) -> None:
        """Count one response; error codes also go to ``fastnli_http_errors_total``."""
        self.requests.inc(endpoint, str(code))
        if code >= 500:
            self.errors.inc("5xx")
        elif str(code) in ERROR_KINDS:
            self.errors.inc(str(code))

    def render(self) -> str:
        return self.registry.render()
