"""Dynamic batching across concurrent requests: a bounded queue drained by one engine thread.

Each request submits its NLI pairs as one job and gets a :class:`concurrent.futures.Future` of its own probability
rows. One thread (``fastnli-batcher``) owns the engine and loops:

1. wait for the first job (shutdown-aware: wakes up on :meth:`DynamicBatcher.close`);
2. if the engine was idle, hold that job up to ``max_wait_ms`` for others to join (skipped as soon as the waiting
   jobs fill the pass, or when shutting down); under load jobs have accumulated while the previous pass ran, so no
   wait happens (continuous batching);
3. take jobs in arrival order while the pass stays within ``max_pass_pairs``, a padded-token budget
   (``pairs x longest pair``, the cost model of TEI's and infinity's queues, with tokens estimated from the texts) and
   half of ``max_queue_s`` of estimated engine time (every job of a pass gets its result at the pass's end);
   a job is never split, a job larger than the budget gets a pass of its own, and jobs whose caller has gone
   (future cancelled: client disconnect or timeout) are skipped and counted as dropped;
4. one ``engine.predict_with_stats`` over all their pairs — the engine dedups identical pairs across requests and
   packs by length — then resolve each future with its own rows (or the engine's exception).

If a shared pass raises, each of its jobs is run again alone, so only the job that fails alone gets the exception
(one client's bad input never fails another client's request).

Admission is bounded by time as well as by count. The batcher learns this engine's speed as it runs
(:class:`WorkRate`: estimated tokens per second of engine time, weighted towards recent passes, starting from
``initial_tokens_per_s``), and :meth:`DynamicBatcher.submit` refuses a job at once with :class:`Overloaded` (carrying
a ``Retry-After`` estimate) when the work already waiting plus its own would not finish within ``max_queue_s``
seconds, and with :class:`TooLarge` when its own work alone would outlast ``deadline_s``; a job never waits into a
timeout to be computed and thrown away. ``queue_size`` jobs or ``max_queued_pairs`` pairs waiting also refuse
(:class:`Overloaded`). The HTTP layer answers 429 and 413. :meth:`close` stops admission (:class:`ShuttingDown`,
503) and drains every job already accepted before the thread exits, so no accepted request is lost.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastnli.calm.documents import estimate_tokens
from fastnli.engine.protocol import EngineLike
from fastnli.engine.tokenize import PAIR_SPECIAL_TOKENS
from fastnli.serve.metrics import ServeMetrics

__all__ = ["DynamicBatcher", "Overloaded", "ShuttingDown", "TooLarge", "WorkRate"]

logger = logging.getLogger("fastnli")


class Overloaded(RuntimeError):
    """The queue is full (by count or by time); retry after :attr:`retry_after_s` seconds (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TooLarge(RuntimeError):
    """The job alone needs more engine time than its deadline (HTTP 413: split it)."""


class ShuttingDown(RuntimeError):
    """The batcher is closing and accepts no new work (the HTTP layer answers 503)."""


class WorkRate:
    """This engine's speed, learned from its passes: estimated tokens per second of engine time.

    Each pass adds its estimated tokens and its seconds to two sums that decay by ``decay`` per pass; the rate is
    their ratio, so long passes weigh more than short ones (whose fixed overhead would understate the speed) and
    the last ten or so passes dominate. Before any pass, ``initial`` (tokens/s) holds, with the weight of one second
    of engine time.

    Args:
        initial: the starting estimate in estimated tokens per second (default 2000, a 2-core CPU running a small
            model; the first passes correct it).
        decay: the weight a pass keeps after each later pass (default 0.9).
    """

    def __init__(self, initial: float = 2000.0, decay: float = 0.9) -> None:
        if initial <= 0 or not 0 < decay < 1:
            raise ValueError(f"WorkRate(initial={initial}, decay={decay}): initial must be > 0 and decay in (0, 1)")
        self.decay = float(decay)
        self._tokens = float(initial)
        self._seconds = 1.0

    @property
    def tokens_per_s(self) -> float:
        return self._tokens / self._seconds

    def observe(self, tokens: float, seconds: float) -> None:
        """Add one pass: ``tokens`` estimated tokens in ``seconds`` seconds of engine time."""
        if tokens <= 0 or seconds <= 0:
            return
        self._tokens = self.decay * self._tokens + tokens
        self._seconds = self.decay * self._seconds + seconds

    def seconds(self, tokens: float) -> float:
        """The estimated engine seconds of ``tokens`` estimated tokens."""
        return tokens / self.tokens_per_s


@dataclass
class _Job:
    pairs: list[tuple[str, str]]
    longest: int  # estimated tokens of the longest pair
    work: int  # estimated tokens of all its pairs
    future: Future[np.ndarray]
    enqueued: float  # time.monotonic()


@dataclass
class _Totals:
    """Traffic since the last INFO summary."""

    requests: int = 0
    pairs: int = 0
    unique: int = 0
    passes: int = 0
    dropped: int = 0
    rejected: int = 0
    engine_seconds: float = 0.0


class DynamicBatcher:
    """Batches the NLI pairs of concurrent requests into shared engine passes, on one dedicated thread.

    Args:
        engine: the engine; only the batcher thread calls it.
        max_wait_ms: milliseconds to hold the first job of an idle engine for company (default 0: never).
        max_pass_pairs: most pairs per engine pass (default 512); a larger job runs alone.
        max_pass_tokens: padded-token budget per pass, ``pairs x longest pair`` (estimated tokens; default None:
            twice ``engine.batch_policy.max_batch_tokens``, or 8192 when the engine has no policy).
        queue_size: most jobs waiting (default 256); then :meth:`submit` raises :class:`Overloaded`.
        max_queued_pairs: most pairs waiting (default 8192); then :meth:`submit` raises :class:`Overloaded`.
        model_max_length: the model's token limit (default 512): a pair's estimate is capped by it (the engine
            truncates longer pairs).
        metrics: where to count passes, sizes, waits and drops (default: a private :class:`ServeMetrics`).
        log_interval_s: seconds between INFO summaries of traffic (default 60; 0 = none).
        retry_after_s: the least retry hint carried by :class:`Overloaded` (default 1).
        max_queue_s: most estimated seconds from admission to result, the work already waiting and running
            included (default 0.75); a pass holds at most half of it; a job that would take longer is refused with :class:`Overloaded`, unless the
            engine is idle and nothing waits.
        deadline_s: seconds a caller waits for its result (default None: no limit); a job whose own estimated work
            is longer is refused with :class:`TooLarge`.
        rate: the speed estimate (default: a new :class:`WorkRate`).
    """

    def __init__(self, engine: EngineLike, max_wait_ms: float = 0.0, max_pass_pairs: int = 512,
                 max_pass_tokens: int | None = None, queue_size: int = 256, max_queued_pairs: int = 8192,
                 model_max_length: int = 512, metrics: ServeMetrics | None = None, log_interval_s: float = 60.0,
                 retry_after_s: int = 1, max_queue_s: float = 0.75, deadline_s: float | None = None,
                 rate: WorkRate | None = None) -> None:
        self.engine = engine
        self.max_wait_s = max(0.0, float(max_wait_ms)) / 1000.0
        self.max_pass_pairs = int(max_pass_pairs)
        if max_pass_tokens is None:
            policy = getattr(engine, "batch_policy", None)
            max_pass_tokens = 2 * int(policy.max_batch_tokens) if policy is not None else 8192
        self.max_pass_tokens = int(max_pass_tokens)
        self.queue_size = int(queue_size)
        self.max_queued_pairs = int(max_queued_pairs)
        self.model_max_length = int(model_max_length)
        self.metrics = metrics or ServeMetrics()
        self.log_interval_s = float(log_interval_s)
        self.retry_after_s = int(retry_after_s)
        self.max_queue_s = float(max_queue_s)
        self.deadline_s = None if deadline_s is None else float(deadline_s)
        self.rate = rate or WorkRate()
        self._queue: collections.deque[_Job] = collections.deque()
        self._queued_pairs = 0
        self._queued_work = 0
        self._running_work = 0
        self._running_since = 0.0
        self._cond = threading.Condition()
        self._closing = False
        self._busy = False
        self._totals = _Totals()
        self._thread = threading.Thread(target=self._loop, name="fastnli-batcher", daemon=True)
        self._started = False

    # -- public -------------------------------------------------------------------------------------------------
    def start(self) -> DynamicBatcher:
        """Start the batcher thread (idempotent); returns self."""
        with self._cond:
            if not self._started:
                self._started = True
                self._thread.start()
        logger.info("batcher started: max_wait_ms=%g, max_pass_pairs=%d, max_pass_tokens=%d, queue_size=%d, "
                    "max_queued_pairs=%d, max_queue_s=%g, initial rate %.0f tokens/s", self.max_wait_s * 1000,
                    self.max_pass_pairs, self.max_pass_tokens, self.queue_size, self.max_queued_pairs,
                    self.max_queue_s, self.rate.tokens_per_s)
        return self

    @property
    def depth(self) -> int:
        """Jobs waiting for an engine pass."""
        return len(self._queue)

    @property
    def queued_pairs(self) -> int:
        """Pairs waiting for an engine pass."""
        return self._queued_pairs

    @property
    def closing(self) -> bool:
        """Whether new work is refused (:meth:`close` was called)."""
        return self._closing

    @property
    def idle(self) -> bool:
        """Nothing waits and no engine pass runs."""
        with self._cond:
            return not self._queue and not self._busy

    def backlog_s(self) -> float:
        """Estimated engine seconds of the work waiting and the rest of the pass running."""
        with self._cond:
            return self.rate.seconds(self._backlog(time.monotonic()))

    def pair_tokens(self, premise: str, hypothesis: str) -> int:
        """The token estimate of one pair used by the padded-token budget (capped at the model limit)."""
        return min(estimate_tokens(premise) + estimate_tokens(hypothesis) + PAIR_SPECIAL_TOKENS,
                   self.model_max_length)

    def _backlog(self, now: float) -> float:
        """Estimated tokens waiting plus the estimated rest of the running pass (called with the lock held)."""
        running = self._running_work - (now - self._running_since) * self.rate.tokens_per_s if self._busy else 0.0
        return self._queued_work + max(0.0, running)

    def _refuse(self, message: str, retry_after_s: float) -> Overloaded:
        self._totals.rejected += 1
        return Overloaded(message, max(self.retry_after_s, math.ceil(retry_after_s)))

    def submit(self, pairs: Sequence[tuple[str, str]]) -> Future[np.ndarray]:
        """Queue one request's pairs; the future resolves to their probabilities ``(len(pairs), 3)`` in order.

        Cancelling the future before its engine pass starts drops the work. An empty list resolves at once.

        Raises:
            Overloaded: ``queue_size`` jobs or ``max_queued_pairs`` pairs already wait, or the work ahead plus
                this job's would not finish within ``max_queue_s`` (its ``retry_after_s`` says when it would).
            TooLarge: this job alone would take longer than ``deadline_s``.
            ShuttingDown: :meth:`close` was called.
        """
        fut: Future[np.ndarray] = Future()
        pairs = list(pairs)
        if not pairs:
            fut.set_running_or_notify_cancel()
            fut.set_result(np.zeros((0, 3), dtype=np.float32))
            return fut
        tokens = [self.pair_tokens(p, h) for p, h in pairs]
        longest, work = max(tokens), sum(tokens)
        with self._cond:
            if self._closing or not self._started:
                raise ShuttingDown("the batcher is not started" if not self._started
                                   else "the service is shutting down and accepts no new work")
            if len(self._queue) >= self.queue_size or self._queued_pairs + len(pairs) > self.max_queued_pairs:
                raise self._refuse(f"overloaded: {len(self._queue)} requests ({self._queued_pairs} pairs) are waiting "
                                   f"(limits: {self.queue_size} requests, {self.max_queued_pairs} pairs); retry after "
                                   f"{self.retry_after_s} s", self.retry_after_s)
            rate = self.rate
            own = rate.seconds(work)
            if self.deadline_s is not None and own > self.deadline_s:
                raise TooLarge(f"the request needs about {own:.1f} s of engine time ({len(pairs)} pairs, ~{work} "
                               f"tokens at the measured {rate.tokens_per_s:.0f} tokens/s), more than the "
                               f"{self.deadline_s:g} s request timeout; split the request")
            ahead = rate.seconds(self._backlog(time.monotonic()))
            if ahead > 0 and ahead + own > self.max_queue_s:
                retry = ahead + own - self.max_queue_s if own <= self.max_queue_s else ahead
                refused = self._refuse(f"overloaded: the work waiting needs about {ahead:.1f} s of engine time and "
                                       f"this request {own:.1f} s, more than the {self.max_queue_s:g} s a request may "
                                       f"queue (max_queue_seconds); retry after {math.ceil(retry)} s", retry)
                raise refused
            self._queue.append(_Job(pairs, longest, work, fut, time.monotonic()))
            self._queued_pairs += len(pairs)
            self._queued_work += work
            self._update_gauges()
            self._cond.notify()
        return fut

    def close(self, timeout: float | None = None) -> bool:
        """Stop admission, finish every accepted job, stop the thread; True when it stopped within ``timeout``."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._started and self._thread.is_alive():
            self._thread.join(timeout)
        stopped = not self._thread.is_alive()
        logger.info("batcher %s", "stopped after draining its queue" if stopped
                    else f"still running after {timeout} s ({self.depth} requests waiting)")
        return stopped

    # -- the batcher thread -------------------------------------------------------------------------------------
    def _update_gauges(self) -> None:
        self.metrics.queue_depth.set(value=len(self._queue))
        self.metrics.queue_pairs.set(value=self._queued_pairs)

    def _pass_is_full(self) -> bool:
        """Whether the waiting jobs already fill one engine pass (then waiting longer gains nothing)."""
        rows, longest = 0, 0
        for job in self._queue:
            rows += len(job.pairs)
            longest = max(longest, job.longest)
            if rows >= self.max_pass_pairs or rows * longest >= self.max_pass_tokens:
                return True
        return False

    def _take(self) -> list[_Job]:
        """Pop the jobs of the next pass (called with the lock held)."""
        batch: list[_Job] = []
        rows, longest, work = 0, 0, 0
        # a pass's result comes at its end: a pass longer than half the queue bound would make the jobs at its front
        # wait for those behind them, beyond the time they were admitted for
        work_budget = self.rate.tokens_per_s * self.max_queue_s / 2
        now = time.monotonic()
        while self._queue:
            job = self._queue[0]
            if job.future.cancelled():
                self._queue.popleft()
                self._queued_pairs -= len(job.pairs)
                self._queued_work -= job.work
                self._totals.dropped += 1
                continue
            n, top = rows + len(job.pairs), max(longest, job.longest)
            if batch and (n > self.max_pass_pairs or n * top > self.max_pass_tokens or work + job.work > work_budget):
                break
            self._queue.popleft()
            self._queued_pairs -= len(job.pairs)
            self._queued_work -= job.work
            if not job.future.set_running_or_notify_cancel():  # cancelled since the check above
                self._totals.dropped += 1
                continue
            self.metrics.queue_wait.observe(now - job.enqueued)
            batch.append(job)
            rows, longest, work = n, top, work + job.work
        self._update_gauges()
        return batch

    def _loop(self) -> None:
        last_summary = time.monotonic()
        while True:
            with self._cond:
                self._busy = False
                while not self._queue and not self._closing:
                    wait = None
                    if self.log_interval_s > 0:
                        wait = max(0.05, last_summary + self.log_interval_s - time.monotonic())
                    self._cond.wait(wait)
                    if self.log_interval_s > 0 and time.monotonic() - last_summary >= self.log_interval_s:
                        self._log_summary()
                        last_summary = time.monotonic()
                if not self._queue and self._closing:
                    break
                deadline = self._queue[0].enqueued + self.max_wait_s
                while not self._closing and not self._pass_is_full():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                batch = self._take()
                self._busy = bool(batch)
                self._running_work = sum(job.work for job in batch)
                self._running_since = time.monotonic()
            if batch:
                self._run(batch)
            if self.log_interval_s > 0 and time.monotonic() - last_summary >= self.log_interval_s:
                with self._cond:
                    self._log_summary()
                last_summary = time.monotonic()
        with self._cond:
            self._log_summary()

    def _predict(self, pairs: list[tuple[str, str]]) -> tuple[np.ndarray, Any]:
        probs, stats = self.engine.predict_with_stats(pairs)
        probs = np.asarray(probs, dtype=np.float32)
        if probs.shape != (len(pairs), 3):
            raise RuntimeError(f"the engine returned shape {probs.shape} for {len(pairs)} pairs; expected (N, 3)")
        return probs, stats

    def _run(self, batch: list[_Job]) -> None:
        pairs = [p for job in batch for p in job.pairs]
        m = self.metrics
        t0 = time.perf_counter()
        try:
            probs, stats = self._predict(pairs)
        except Exception as exc:
            if len(batch) == 1:
                m.engine_failures.inc()
                logger.exception("engine pass over %d pairs of 1 request failed", len(pairs))
                batch[0].future.set_exception(exc)
                return
            logger.warning("engine pass over %d pairs of %d requests failed (%s: %s); running each request alone so "
                           "that only the failing one fails", len(pairs), len(batch), type(exc).__name__, exc)
            for job in batch:
                self._run([job])
            return
        seconds = time.perf_counter() - t0
        with self._cond:
            self.rate.observe(sum(job.work for job in batch), seconds)
        offset = 0
        for job in batch:
            n = len(job.pairs)
            job.future.set_result(probs[offset:offset + n].copy())
            offset += n
        m.engine_seconds.observe(seconds)
        m.batch_pairs.observe(len(pairs))
        m.batch_requests.observe(len(batch))
        m.pairs.inc(value=len(pairs))
        unique = int(getattr(stats, "unique_pairs", len(pairs)))
        m.unique_pairs.inc(value=unique)
        m.real_tokens.inc(value=int(getattr(stats, "real_tokens", 0)))
        m.padded_tokens.inc(value=int(getattr(stats, "padded_tokens", 0)))
        with self._cond:
            t = self._totals
            t.requests += len(batch)
            t.pairs += len(pairs)
            t.unique += unique
            t.passes += 1
            t.engine_seconds += seconds
        logger.debug("engine pass: %d requests, %d pairs (%d unique) in %.1f ms", len(batch), len(pairs), unique,
                     seconds * 1000)

    def _log_summary(self) -> None:
        """One INFO line about the traffic since the last one (called with the lock held; silent when idle)."""
        t = self._totals
        if t.requests or t.rejected or t.dropped:
            logger.info("served %d requests, %d pairs (%d unique) in %d engine passes (%.1f pairs/pass, %.2f s in the "
                        "engine); %d refused (429), %d dropped before their pass; %d requests waiting", t.requests,
                        t.pairs, t.unique, t.passes, t.pairs / t.passes if t.passes else 0.0, t.engine_seconds,
                        t.rejected, t.dropped, len(self._queue))
        self._totals = _Totals()
