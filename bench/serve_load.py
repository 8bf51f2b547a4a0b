"""Load test of ``fastnli serve`` on loopback: dynamic batching vs one request at a time, then 4x overload + SIGTERM.

Usage::

    python -m bench.serve_load [--model ARTIFACT] [--device auto] [--precision auto] [--clients 4,16,48] \\
        [--duration 5] [--max-requests 40000] [--overload 4] [--overload-queue-size 32] [--json out.json]

Without ``--model`` the tiny seeded DeBERTa (``fastnli.exporter.checkpoint.build_checkpoint``, the tests' ``art_v1`` shape) is
built and exported (fp32) once into ``--work``. Default run: about 40 s, plus about 20 s the first time (export).

Servers run in their own processes (``multiprocessing`` spawn, 127.0.0.1, ephemeral port) so the client threads do
not share their interpreter lock. Requests are ``POST /v1/nli`` with 1-8 short pairs drawn (seeded) from a pool of 256
requests whose probabilities were computed beforehand with the engine in this process; every 200 answer is checked
against them (``--atol``: pairs share passes with other requests' pairs, so the padding differs). Each client thread
keeps one HTTP/1.1 keep-alive connection.

Phases (each bounded by ``--duration`` seconds per mode and ``--max-requests`` requests):

1. closed loop, for each ``--clients`` count: that many threads, each sending its next request when the previous one
   is answered, against two servers started together — ``one-at-a-time`` (``max_pass_pairs=1, max_wait_ms=0``: each
   request its own engine pass) and ``dynamic`` (the :class:`fastnli.serve.ServeConfig` defaults). The two take turns
   in six slices (A B B A A B, ``--duration / 3`` seconds each), so that load from other work on a shared machine
   drifts over both alike;
2. ``overload``: open loop at ``--overload`` times the best ``dynamic`` throughput of phase 1 (a late client thread
   sends at once; the rate it achieved is reported), from more client threads than the queue holds
   (``--overload-queue-size``), so the bounded queue must refuse work with 429. At 80 % of the phase the server gets
   SIGTERM with requests in flight: it stops accepting connections, answers what it accepted, and writes its final
   metrics; requests sent after it are reported in their own row (``after SIGTERM``).

Checks (exit status 1 when one fails): no 5xx, every answer correct, no connection errors before SIGTERM, some 429 under
overload, and no accepted request lost — the server's count of answered ``/v1/nli`` requests equals the answers the
clients received. Latency is client-side wall time per request (send to last byte) of 200 answers; percentiles by
nearest rank.
"""

from __future__ import annotations

import argparse
import faulthandler
import http.client
import json
import multiprocessing as mp
import os
import queue
import random
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HOST = "127.0.0.1"  # loopback only
STOP_AFTER_S = 120.0  # hard bound on any server process


# -- the server process -------------------------------------------------------------------------------------------
def _server_main(artifact: str, device: str, precision: str, config: dict[str, Any], port_q: Any,
                 metrics_path: str) -> None:
    """Child process: serve until SIGTERM (or STOP_AFTER_S), then stop gracefully and dump the metrics text."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    from fastnli.engine import NLIEngine
    from fastnli.serve import BackgroundServer, ServeConfig

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine = NLIEngine.from_pretrained(artifact, device=device, precision=precision)  # type: ignore[arg-type]
    server = BackgroundServer(engine, ServeConfig(host=HOST, port=0, **config)).start()
    port_q.put(server.port)
    deadline = time.monotonic() + STOP_AFTER_S
    while not stop.wait(0.05) and time.monotonic() < deadline:
        pass
    faulthandler.dump_traceback_later(20, exit=False)  # diagnostics, should a graceful stop ever take this long
    stopped = server.stop(timeout=60)
    faulthandler.cancel_dump_traceback_later()
    if not stopped:
        logging.getLogger("fastnli").error("the server thread did not stop within 60 s of SIGTERM")
    Path(metrics_path).write_text(server.state.metrics.render())


class ServerProcess:
    """A server in a spawned process; :meth:`terminate` sends SIGTERM and returns its final metrics text."""

    def __init__(self, artifact: Path, device: str, precision: str, config: dict[str, Any], work: Path) -> None:
        ctx = mp.get_context("spawn")
        self.metrics_path = work / f"metrics-{os.getpid()}-{time.monotonic_ns()}.txt"
        q = ctx.Queue()
        self.proc = ctx.Process(target=_server_main, args=(str(artifact), device, precision, config, q,
                                                           str(self.metrics_path)), daemon=True)
        self.proc.start()
        deadline = time.monotonic() + 120
        while True:
            try:
                self.port: int = q.get(timeout=0.5)
                break
            except queue.Empty:
                if not self.proc.is_alive() or time.monotonic() > deadline:
                    self.proc.kill()
                    raise RuntimeError(f"the server process did not start (exit code {self.proc.exitcode})") from None

    def metrics(self) -> str:
        """The live server's /metrics text."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def sigterm(self) -> None:
        if self.proc.pid is not None and self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGTERM)

    def terminate(self) -> str:
        self.sigterm()
        self.proc.join(90)
        if self.proc.is_alive():
            self.proc.kill()
            raise RuntimeError("the server process did not stop within 90 s of SIGTERM")
        text = self.metrics_path.read_text() if self.metrics_path.is_file() else ""
        self.metrics_path.unlink(missing_ok=True)
        return text


def metric(text: str, name: str, labels: str = "") -> float:
    """Sum of the samples of ``name`` whose label set contains ``labels`` (e.g. ``'code="200"'``)."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total


def _diff(after: str, before: str) -> str:
    """The counter/histogram samples of ``after`` minus those of ``before`` (metrics text of one server)."""
    old = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+) (\S+)$", before, re.M)}
    lines = []
    for m in re.finditer(r"^(\S+) (\S+)$", after, re.M):
        lines.append(f"{m.group(1)} {float(m.group(2)) - old.get(m.group(1), 0.0)}")
    return "\n".join(lines)


# -- workload -----------------------------------------------------------------------------------------------------
def make_pool(n: int, seed: int) -> list[list[tuple[str, str]]]:
    """``n`` requests of 1-8 short (premise, hypothesis) pairs from the seeded synthetic corpus."""
    from fastnli.exporter.checkpoint import corpus

    sentences = corpus(600, seed=seed)
    rng = random.Random(seed)
    return [[(rng.choice(sentences), rng.choice(sentences)) for _ in range(rng.randint(1, 8))] for _ in range(n)]


def _bodies(pool: list[list[tuple[str, str]]]) -> list[bytes]:
    """The JSON bodies of the pool's requests, encoded once (the client's CPU is what limits the offered rate)."""
    return [json.dumps({"pairs": [list(p) for p in r]}).encode() for r in pool]


@dataclass
class Outcome:
    status: int  # HTTP status, or 0 for a connection error
    seconds: float
    correct: bool = True
    error: str = ""
    start: float = 0.0  # time.perf_counter() when the request was sent


class Client:
    """One client thread's keep-alive HTTP/1.1 connection (reopened after an error; errors are not retried)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def send(self, body: bytes, expected: np.ndarray, atol: float) -> Outcome:
        """One POST /v1/nli of the JSON ``body``; a 200 answer is checked against ``expected`` within ``atol``."""
        t0 = time.perf_counter()
        out = self._send(body, t0, expected, atol)
        out.start = t0
        return out

    def _send(self, body: bytes, t0: float, expected: np.ndarray, atol: float) -> Outcome:
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(HOST, self.port, timeout=60)
            self.conn.request("POST", "/v1/nli", body=body, headers={"Content-Type": "application/json"})
            resp = self.conn.getresponse()
            payload = resp.read()
            if resp.will_close:
                self.close()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return Outcome(0, time.perf_counter() - t0, False, type(exc).__name__)
        seconds = time.perf_counter() - t0
        if resp.status != 200:
            return Outcome(resp.status, seconds)
        results = json.loads(payload)["results"]
        got = np.array([[r["probabilities"][k] for k in ("contradiction", "neutral", "entailment")] for r in results])
        return Outcome(200, seconds, got.shape == expected.shape and bool(np.allclose(got, expected, atol=atol,
                                                                                      rtol=0)))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@dataclass
class PhaseResult:
    phase: str
    clients: int
    seconds: float
    sent: int
    ok: int
    wrong: int
    status_429: int
    status_5xx: int
    other: int
    connection_errors: int
    req_per_s: float
    pairs_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    pairs_per_pass: float
    server_answered: int = -1
    lost: int = 0
    offered_req_per_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _pct(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, max(0, int(np.ceil(q * len(sorted_ms))) - 1))]


def summarize(phase: str, clients: int, seconds: float, outcomes: list[tuple[int, Outcome]],
              pool: list[list[tuple[str, str]]], metrics_text: str, all_outcomes: list[tuple[int, Outcome]] | None = None
              ) -> PhaseResult:
    """One table row. ``lost`` compares the server's count of answered requests with the answers the clients
    received over ``all_outcomes`` (default ``outcomes``): the server's count covers its whole life."""
    ok = [(i, o) for i, o in outcomes if o.status == 200]
    lat = sorted(o.seconds * 1000 for _, o in ok)
    passes = metric(metrics_text, "fastnli_batch_pairs_count")
    answered = int(metric(metrics_text, "fastnli_http_requests_total", 'endpoint="nli"'))
    received = sum(1 for _, o in (outcomes if all_outcomes is None else all_outcomes) if o.status != 0)
    return PhaseResult(
        phase=phase, clients=clients, seconds=round(seconds, 2), sent=len(outcomes), ok=len(ok),
        wrong=sum(1 for _, o in ok if not o.correct), status_429=sum(1 for _, o in outcomes if o.status == 429),
        status_5xx=sum(1 for _, o in outcomes if o.status >= 500),
        other=sum(1 for _, o in outcomes if o.status not in (0, 200, 429) and o.status < 500),
        connection_errors=sum(1 for _, o in outcomes if o.status == 0),
        req_per_s=round(len(ok) / seconds, 1), pairs_per_s=round(sum(len(pool[i]) for i, _ in ok) / seconds, 1),
        p50_ms=round(_pct(lat, 0.50), 2), p95_ms=round(_pct(lat, 0.95), 2), p99_ms=round(_pct(lat, 0.99), 2),
        max_ms=round(lat[-1], 2) if lat else float("nan"),
        pairs_per_pass=round(metric(metrics_text, "fastnli_batch_pairs_sum") / passes, 2) if passes else 0.0,
        server_answered=answered, lost=answered - received,
        errors=dict(Counter(o.error for _, o in outcomes if o.error)))


def closed_loop(port: int, clients: int, duration: float, max_requests: int, pool: list[list[tuple[str, str]]],
                expected: list[np.ndarray], atol: float, seed: int) -> tuple[float, list[tuple[int, Outcome]]]:
    """``clients`` threads, each sending its next request as soon as the previous one is answered."""
    bodies = _bodies(pool)
    outcomes: list[tuple[int, Outcome]] = []
    lock = threading.Lock()
    end = time.perf_counter() + duration

    def client(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        c = Client(port)
        while time.perf_counter() < end:
            with lock:
                if len(outcomes) >= max_requests:
                    break
            i = rng.randrange(len(pool))
            out = c.send(bodies[i], expected[i], atol)
            with lock:
                outcomes.append((i, out))
        c.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration + 90)
    return time.perf_counter() - t0, outcomes


def open_loop(port: int, rate: float, workers: int, duration: float, max_requests: int,
              pool: list[list[tuple[str, str]]], expected: list[np.ndarray], atol: float, seed: int,
              on_time: tuple[float, Any] | None = None) -> tuple[float, list[tuple[int, Outcome]]]:
    """Arrivals at ``rate``/s for ``duration`` s, served by ``workers`` threads (a late worker sends at once);
    ``on_time=(t, fn)`` calls ``fn`` at ``t`` seconds. Returns (start time, outcomes)."""
    n = min(max_requests, int(rate * duration))
    rng = random.Random(seed)
    picks = [rng.randrange(len(pool)) for _ in range(n)]
    bodies = _bodies(pool)
    outcomes: list[tuple[int, Outcome]] = []
    lock = threading.Lock()
    next_i = [0]
    t0 = time.perf_counter() + 0.05

    def worker() -> None:
        c = Client(port)
        while True:
            with lock:
                i = next_i[0]
                if i >= n:
                    c.close()
                    return
                next_i[0] += 1
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            out = c.send(bodies[picks[i]], expected[picks[i]], atol)
            with lock:
                outcomes.append((picks[i], out))

    timer = threading.Timer(max(0.0, t0 + on_time[0] - time.perf_counter()), on_time[1]) if on_time else None
    if timer:
        timer.start()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration + 120)
    if timer:
        timer.join(5)
    return t0, outcomes


# -- main -----------------------------------------------------------------------------------------------------------
def _tiny_artifact(work: Path) -> Path:
    from fastnli.exporter import export
    from fastnli.exporter.checkpoint import build_checkpoint

    art = work / "art_tiny_fp32"
    if not (art / "manifest.json").is_file():
        ck = build_checkpoint(work / "ck_tiny", arch="deberta", size="tiny", seed=0)
        export(ck, art, precisions=("fp32",))
    return art


def _table(rows: list[PhaseResult]) -> str:
    cols = ["phase", "clients", "sent", "ok", "wrong", "status_429", "status_5xx", "connection_errors", "lost",
            "req_per_s", "pairs_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms", "pairs_per_pass"]
    head = ["phase", "clients", "sent", "200", "wrong", "429", "5xx", "conn err", "lost", "req/s", "pairs/s",
            "p50 ms", "p95 ms", "p99 ms", "max ms", "pairs/pass"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        d = asdict(r)
        lines.append("| " + " | ".join(str(d[c]) for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model", default=None, help="artifact directory (default: the tiny seeded checkpoint)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "int8"])
    p.add_argument("--clients", default="4,16,48", help="closed-loop client threads, comma-separated counts "
                   "(default 4,16,48)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per mode and client count (default 5)")
    p.add_argument("--max-requests", type=int, default=40000, help="request cap per phase (default 40000)")
    p.add_argument("--overload", type=float, default=4.0, help="overload factor over the dynamic rate (default 4)")
    p.add_argument("--overload-queue-size", type=int, default=32, help="queue_size in the overload phase (default 32)")
    p.add_argument("--overload-workers", type=int, default=96, help="client threads in the overload phase (default 96)")
    p.add_argument("--atol", type=float, default=None, help="tolerance of answers (default 1e-5 fp32, 5e-3 otherwise)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "fastnli-bench-serve"))
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    client_counts = [int(c) for c in str(args.clients).split(",") if c.strip()]
    if args.duration > 60 or args.max_requests > 200_000 or not client_counts or max(client_counts) > 256:
        p.error("--duration is capped at 60 s, --max-requests at 200000 per phase and --clients at 256")

    from fastnli.engine import NLIEngine

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t_setup = time.perf_counter()
    artifact = Path(args.model) if args.model else _tiny_artifact(work)
    engine = NLIEngine.from_pretrained(artifact, device=args.device, precision=args.precision)
    atol = args.atol if args.atol is not None else (1e-5 if engine.precision == "fp32" else 5e-3)
    pool = make_pool(256, args.seed)
    expected = [engine.predict(r) for r in pool]
    print(f"model {engine.manifest.source} on {engine.device}/{engine.precision}; setup {time.perf_counter() - t_setup:.1f} s;"
          f" {os.cpu_count()} CPUs; clients {client_counts}, {args.duration:g} s per mode and client count")

    # Both closed-loop servers run at once and take turns in six slices (A B B A A B) per client count: load from
    # other work on a shared machine drifts, and interleaving exposes both modes to the same drift.
    modes = {"one-at-a-time": {"max_pass_pairs": 1, "max_wait_ms": 0.0}, "dynamic": {}}
    servers = {m: ServerProcess(artifact, engine.device, engine.precision, {"log_interval_s": 0.0, **c}, work)
               for m, c in modes.items()}
    rows: list[PhaseResult] = []
    try:
        for clients in client_counts:
            elapsed = dict.fromkeys(modes, 0.0)
            outcomes: dict[str, list[tuple[int, Outcome]]] = {m: [] for m in modes}
            texts = {m: servers[m].metrics() for m in modes}
            for k, mode in enumerate(["one-at-a-time", "dynamic", "dynamic", "one-at-a-time", "one-at-a-time",
                                      "dynamic"]):
                dt, out = closed_loop(servers[mode].port, clients, args.duration / 3,
                                      args.max_requests // 3, pool, expected, atol, args.seed + k)
                elapsed[mode] += dt
                outcomes[mode] += out
            after = {m: servers[m].metrics() for m in modes}
            rows += [summarize(m, clients, elapsed[m], outcomes[m], pool, _diff(after[m], texts[m])) for m in modes]
    finally:
        for srv in servers.values():
            srv.terminate()
    rate = args.overload * max(r.req_per_s for r in rows if r.phase == "dynamic")
    server = ServerProcess(artifact, engine.device, engine.precision,
                           {"log_interval_s": 0.0, "queue_size": args.overload_queue_size}, work)
    sigterm_at: list[float] = []

    def sigterm() -> None:
        sigterm_at.append(time.perf_counter())
        server.sigterm()

    try:
        t0, open_outcomes = open_loop(server.port, rate, args.overload_workers, args.duration, args.max_requests,
                                      pool, expected, atol, args.seed, on_time=(0.8 * args.duration, sigterm))
    finally:
        text = server.terminate()
    cut = sigterm_at[0] if sigterm_at else float("inf")
    before = [(i, o) for i, o in open_outcomes if o.start < cut]
    after_cut = [(i, o) for i, o in open_outcomes if o.start >= cut]
    span = (cut if sigterm_at else max(o.start for _, o in open_outcomes)) - t0
    over = summarize(f"overload {args.overload:g}x", args.overload_workers, span, before, pool, text, open_outcomes)
    over.offered_req_per_s = round(len(before) / span, 1) if span > 0 else 0.0
    over.notes.append(f"target {rate:.0f} req/s, offered {over.offered_req_per_s:.0f} req/s before SIGTERM; "
                      f"queue_size {args.overload_queue_size}")
    drain = summarize("after SIGTERM", args.overload_workers,
                      max(1e-9, max((o.start for _, o in after_cut), default=cut) - cut), after_cut, pool, text,
                      open_outcomes)
    drain.req_per_s = drain.pairs_per_s = 0.0
    drain.notes.append("requests sent after SIGTERM at 80 % of the phase: refused connections, or answered when the "
                       "server had read them before closing; 'lost' (both rows) = requests the server answered minus "
                       "answers the clients received, over the whole phase")
    rows += [over, drain]

    print(_table(rows))
    for r in rows:
        for note in r.notes + ([f"connection errors: {r.errors}"] if r.errors else []):
            print(f"{r.phase}: {note}")
    speedup = {r.clients: r.req_per_s / o.req_per_s for o, r in zip(rows[0:-2:2], rows[1:-2:2]) if o.req_per_s}
    print("dynamic batching / one-at-a-time throughput: " + ", ".join(f"{x:.2f}x at {c} clients"
                                                                      for c, x in speedup.items()))
    failures = [f"{r.phase}: {what}" for r in rows for what, bad in (
        ("5xx answers", r.status_5xx), ("wrong answers", r.wrong), ("lost accepted requests", r.lost)) if bad]
    failures += [f"{r.phase}: connection errors before shutdown" for r in rows[:-1] if r.connection_errors]
    if not over.status_429:
        failures.append("overload: no 429 (raise --overload or --overload-workers, or lower --overload-queue-size)")
    for f in failures:
        print(f"CHECK FAILED: {f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": [asdict(r) for r in rows], "speedup": speedup,
                                               "failures": failures}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
