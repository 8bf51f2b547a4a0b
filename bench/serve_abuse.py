"""Load and abuse bench of ``fastnli serve``: the goals of the service-hardening issue, measured on 127.0.0.1.

Usage::

    python -m bench.serve_abuse [--model DIR] [--duration 60] [--max-requests 20000] [--json out.json]

The server is the real command (``python -m fastnli serve``, default settings, the embedded default model unless
``--model``) in its own process on a free loopback port; clients are threads in this process, one HTTP connection per
request. Every phase is bounded in time and in requests. Phases, each a row of the goals table:

1. ``poison``: 8 closed-loop clients send 4-pair ``/v1/nli`` requests while one client sends a lone surrogate
   (``"\\ud800"``) 4 times a second; the other clients' non-200 answers are counted (a 429 is not a failure).
2. ``overload 16`` / ``overload 64``: the capacity (requests/s) of 16- and 64-pair requests is measured with 8
   closed-loop clients, then an open loop offers 4x that for ``--duration`` seconds. Counted: 5xx, lost (connection
   errors, client timeouts), computed-then-timed-out (504 plus the server's ``fastnli_wasted_requests_total``), p99
   of the accepted (200) requests, useful throughput (200 answers/s) over capacity, and the seconds until a single
   request is again as fast as unloaded (within 1.5x the unloaded median + 20 ms).
3. ``hostile``: bodies up to 2 MB (quadratic ``/v1/ncp`` and ``/v1/calm/check``, a statement citing 100 documents
   (201 pairs whose premises repeat them), deep nesting, surrogates, many
   pairs, wrong types, malformed JSON, ``text/plain``, a 3 MB body, a slow client), and one valid 0.4 MB request
   (48 pairs of 9,000-character premises, scored). For each: its status, the longest
   ``/health`` answer while it runs (a probe thread asks every 10 ms: the event loop's stall), the RSS growth of the
   server and its child processes (the body decoder; ``/proc/PID/status``), and ``/health`` after it.
4. ``integrity``: copies of the artifact with a tampered, a truncated and an out-of-directory graph are loaded in this
   process: each must be refused.
5. ``sigterm``: 8 closed-loop clients; SIGTERM after 2 s. Counted: requests begun before the signal that got no
   answer or a 5xx other than the drain's 503, requests after it answered other than 503 (or refused once the socket
   closed), the exit code and the seconds to exit against the grace (20 s).

Absolute figures depend on the machine; the table states the CPU. Latency is client wall time (send to last byte).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"  # loopback only
JSON = {"Content-Type": "application/json"}
Result = tuple[int, float]  # (HTTP status or 0 for a connection error, seconds)


def request(port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
            timeout: float = 40.0) -> tuple[int, float, bytes]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, time.perf_counter() - t0, data
    except OSError:
        return 0, time.perf_counter() - t0, b""
    finally:
        conn.close()


def nli(port: int, pairs: list[list[str]]) -> Result:
    status, seconds, _ = request(port, "POST", "/v1/nli", json.dumps({"pairs": pairs}).encode(), JSON)
    return status, seconds


# -- the server process -------------------------------------------------------------------------------------------
class Server:
    """``python -m fastnli serve`` on a free loopback port, its output in a log file."""

    def __init__(self, model: str | None, log: Path) -> None:
        with socket.socket() as probe:
            probe.bind((HOST, 0))
            self.port = probe.getsockname()[1]
        cmd = [sys.executable, "-m", "fastnli", "serve", "--host", HOST, "--port", str(self.port), "--device", "cpu"]
        if model:
            cmd += ["--model", model]
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while request(self.port, "GET", "/ready", timeout=2)[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not get ready; see {log}")
            time.sleep(0.2)

    def rss_mb(self) -> float:
        """Resident memory of the server and of its child processes (the body decoder), in MB."""
        return sum(_rss_kb(pid) for pid in _process_tree(self.proc.pid)) / 1024

    def metric(self, name: str, labels: str = "") -> float:
        text = request(self.port, "GET", "/metrics")[2].decode()
        return sum(float(m.group(2)) for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M)
                   if labels in (m.group(1) or ""))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# -- workload -----------------------------------------------------------------------------------------------------
WORDS = ["a", "man", "woman", "child", "dog", "cat", "plays", "reads", "runs", "sleeps", "guitar", "book", "park",
         "city", "river", "red", "small", "old", "new", "quickly", "music", "house", "street", "the", "in", "on", "with",
         "near"]


def pairs_of(n: int, rng: random.Random) -> list[list[str]]:
    """``n`` short distinct pairs (8-14 words premise, 4-7 words hypothesis)."""
    return [[" ".join(rng.choices(WORDS, k=rng.randint(8, 14))), " ".join(rng.choices(WORDS, k=rng.randint(4, 7)))]
            for _ in range(n)]


def _process_tree(root: int) -> list[int]:
    """``root`` and every process below it (from ``/proc/*/stat``'s parent ids)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree = [root]
    for pid in tree:
        tree += [child for child, parent in parents.items() if parent == pid]
    return tree


def _rss_kb(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    found = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(found.group(1)) if found else 0


def closed_loop(port: int, clients: int, seconds: float, max_requests: int, make: Callable[[], list[list[str]]]
                ) -> list[Result]:
    out: list[Result] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < deadline:
            r = nli(port, make())
            with lock:
                if len(out) >= max_requests:
                    return
                out.append(r)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def open_loop(port: int, rate: float, seconds: float, max_requests: int, make: Callable[[], list[list[str]]]
              ) -> list[Result]:
    """Send at ``rate`` requests/s for ``seconds`` from a pool of threads (never waiting for answers)."""
    n = min(max_requests, int(rate * seconds))
    bodies = [make() for _ in range(n)]
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=64) as pool:
        futures = []
        for i, body in enumerate(bodies):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(nli, port, body))
        return [f.result() for f in futures]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(q * len(s) + 0.999999) - 1))]


# -- phases -------------------------------------------------------------------------------------------------------
def phase_poison(server: Server, seconds: float, max_requests: int) -> dict[str, Any]:
    rng = random.Random(1)
    stop = threading.Event()
    poison: list[int] = []

    def poisoner() -> None:
        while not stop.wait(0.25):
            poison.append(request(server.port, "POST", "/v1/nli", b'{"pairs": [["\\ud800", "x"]]}', JSON)[0])

    t = threading.Thread(target=poisoner, daemon=True)
    t.start()
    normal = closed_loop(server.port, 8, seconds, max_requests, lambda: pairs_of(4, rng))
    stop.set()
    t.join()
    affected = sum(1 for s, _ in normal if s not in (200, 429))
    return {"goal": "a poison request fails only itself: 0 other requests affected", "normal_requests": len(normal),
            "affected": affected, "poison_statuses": dict(Counter(poison)),
            "pass": affected == 0 and set(poison) == {422}}


def phase_overload(server: Server, size: int, seconds: float, max_requests: int) -> dict[str, Any]:
    rng = random.Random(size)
    idle = [nli(server.port, pairs_of(size, rng))[1] for _ in range(5)]
    unloaded = pct(idle, 0.5)
    cap_run = closed_loop(server.port, 8, min(10.0, seconds / 3), max_requests, lambda: pairs_of(size, rng))
    cap_ok = [r for r in cap_run if r[0] == 200]
    capacity = len(cap_ok) / min(10.0, seconds / 3)
    wasted0 = server.metric("fastnli_wasted_requests_total")
    t0 = time.monotonic()
    results = open_loop(server.port, 4 * capacity, seconds, max_requests, lambda: pairs_of(size, rng))
    elapsed = time.monotonic() - t0
    ok = [s for st, s in results if st == 200]
    recovery = float("nan")
    t_end = time.monotonic()
    while time.monotonic() - t_end < 15:
        status, s = nli(server.port, pairs_of(size, rng))
        if status == 200 and s <= 1.5 * unloaded + 0.02:
            recovery = time.monotonic() - t_end
            break
        time.sleep(0.1)
    wasted = server.metric("fastnli_wasted_requests_total") - wasted0 + sum(1 for st, _ in results if st == 504)
    row: dict[str, Any]
    row = {"goal": f"4x capacity, {size}-pair requests", "capacity_rps": round(capacity, 2),
           "offered_rps": round(4 * capacity, 2), "sent": len(results), "ok": len(ok),
           "status_429": sum(1 for st, _ in results if st == 429), "status_5xx": sum(1 for st, _ in results if st >= 500),
           "lost": sum(1 for st, _ in results if st == 0), "computed_then_timed_out": int(wasted),
           "p50_s": round(pct(ok, 0.5), 3), "p99_s": round(pct(ok, 0.99), 3), "unloaded_p50_s": round(unloaded, 3),
           "useful_rps": round(len(ok) / elapsed, 2), "useful_share": round(len(ok) / elapsed / capacity, 3)
           if capacity else 0.0, "recovery_s": round(recovery, 2)}
    row["pass"] = (row["status_5xx"] == 0 and row["lost"] == 0 and row["computed_then_timed_out"] == 0
                   and row["p99_s"] <= 2.0 and row["useful_share"] >= 0.9 and recovery <= 5.0)
    return row


def _hostile_cases() -> list[tuple[str, bytes, dict[str, str], str]]:
    """(name, body, headers, path) of each hostile request (each body at most 2 MB, but the 3 MB one)."""
    ncp_k = json.dumps({"response": "r", "sampled_responses": [f"sample {i}" for i in range(3000)],
                        "scorers": ["semantic_negentropy"]}).encode()
    docs = [f"Document {d} says many things." for d in range(20)]
    answer = " ".join(f"Statement {i} is true [{i % 20 + 1}][{(i + 7) % 20 + 1}]." for i in range(400))
    calm = json.dumps([{"answer": answer[:9900], "documents": docs, "verifier_answer": answer[:9900]}] * 4).encode()
    cites = "".join(f"[{d + 1}]" for d in range(100))
    calm_cites = json.dumps({"answer": f"One claim {cites}.", "documents": ["word " * 1900] * 100}).encode()
    deep = b'{"pairs": ' + b"[" * 999_990 + b"]" * 999_990 + b"}"
    many = json.dumps({"pairs": [["premise text here", "hypothesis"]] * 50_000}).encode()
    surrogates = b'{"pairs": [' + b",".join([b'["\\ud800 text", "x"]'] * 90_000) + b"]}"
    ncp_big = json.dumps({"response": "r", "sampled_responses": [f"s{i}" for i in range(180_000)]}).encode()
    minutes = "The committee met again on Tuesday and approved the budget for the coming year. " * 120
    valid = json.dumps({"pairs": [[f"Meeting {i}. {minutes}"[:9000], f"The budget was approved {i}."]
                                  for i in range(48)]}).encode()
    return [
        ("ncp k=3000 (26 KB)", ncp_k, JSON, "/v1/ncp"),
        ("valid: 48 pairs, 9,000-char premises (0.4 MB)", valid, JSON, "/v1/nli"),
        ("ncp 180k samples (2 MB)", ncp_big, JSON, "/v1/ncp"),
        ("calm 4 items (80 KB)", calm, JSON, "/v1/calm/check"),
        ("calm citing 100 documents (1 MB)", calm_cites, JSON, "/v1/calm/check"),
        ("deep nesting (2 MB)", deep, JSON, "/v1/nli"),
        ("50k pairs (2 MB)", many, JSON, "/v1/nli"),
        ("90k surrogates (2 MB)", surrogates, JSON, "/v1/nli"),
        ("wrong types", b'{"pairs": [[1, {"a": null}]], "x": "y"}', JSON, "/v1/nli"),
        ("malformed JSON", b'{"pairs": [["a", "b"]', JSON, "/v1/nli"),
        ("text/plain", b'{"pairs": [["a", "b"]]}', {"Content-Type": "text/plain"}, "/v1/nli"),
        ("calm config \"false\"", b'{"answer": "a", "config": {"check_citations": "false"}}', JSON, "/v1/calm/check"),
        ("3 MB body", b'{"pairs": "' + b"x" * 3_000_000 + b'"}', JSON, "/v1/nli"),
    ]


def _slow_client(port: int) -> int:
    """A client that sends its body one byte per 50 ms (about 2 s), then reads the answer."""
    body = b'{"pairs": [["slow", "client"]]}'
    with socket.create_connection((HOST, port), timeout=40) as s:
        s.sendall(b"POST /v1/nli HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
        for b in body:
            s.sendall(bytes([b]))
            time.sleep(0.05)
        reply = s.recv(65536).decode(errors="replace")
    return int(reply.split()[1]) if reply.startswith("HTTP/1.1 ") else 0


def phase_hostile(server: Server) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for name, body, headers, path in [*_hostile_cases(), ("slow client (2 s)", b"", {}, "")]:
        stalls: list[float] = []
        done = threading.Event()

        def probe(done: threading.Event = done, stalls: list[float] = stalls) -> None:
            while not done.is_set():
                stalls.append(request(server.port, "GET", "/health", timeout=30)[1])
                time.sleep(0.01)

        rss0 = server.rss_mb()
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        time.sleep(0.05)
        status = _slow_client(server.port) if not path else request(server.port, "POST", path, body, headers)[0]
        time.sleep(0.05)
        done.set()
        prober.join()
        healthy = request(server.port, "GET", "/health", timeout=5)[0] == 200
        rows.append({"case": name, "bytes": len(body), "status": status, "max_health_ms": round(max(stalls) * 1000, 1),
                     "rss_growth_mb": round(server.rss_mb() - rss0, 1), "healthy_after": healthy})
    return {"goal": "hostile inputs: 0 5xx, healthy after each; no request <= 2 MB holds the loop > 50 ms or grows "
                    "RSS > 100 MB", "cases": rows,
            "pass": all(r["status"] and r["status"] < 500 and r["healthy_after"] for r in rows)
            and all(r["max_health_ms"] <= 50 and r["rss_growth_mb"] <= 100 for r in rows if r["bytes"] <= 2_000_000)}


def phase_integrity(model: str | None) -> dict[str, Any]:
    from fastnli.default_model import default_model_dir
    from fastnli.engine import NLIEngine, read_manifest

    src = Path(model) if model else default_model_dir()
    outcomes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in ("tampered", "truncated", "outside"):
            art = Path(tmp) / case
            shutil.copytree(src, art)
            m = read_manifest(art)
            prec = next(iter(m.precisions))
            graph = art / m.precisions[prec].file
            if case == "tampered":
                data = bytearray(graph.read_bytes())
                data[len(data) // 2] ^= 0xFF
                graph.write_bytes(bytes(data))
            elif case == "truncated":
                with open(graph, "r+b") as f:
                    f.truncate(graph.stat().st_size // 2)
            else:
                shutil.copy(graph, Path(tmp) / "outside.onnx")
                raw = json.loads((art / "manifest.json").read_text())
                raw["precisions"][prec]["file"] = "../outside.onnx"
                (art / "manifest.json").write_text(json.dumps(raw))
            try:
                NLIEngine.from_pretrained(art, device="cpu", precision=prec)  # type: ignore[arg-type]
                outcomes[case] = "LOADED"
            except ValueError as exc:
                why = re.search(r"changed after export|truncated or replaced|outside the artifact directory", str(exc))
                outcomes[case] = f"refused ({why.group(0) if why else exc})"
            except Exception as exc:  # not verified: the runtime itself failed on the damaged file
                outcomes[case] = f"failed to load ({type(exc).__name__})"
    return {"goal": "tampered, truncated or out-of-directory graphs: refused or rebuilt, never used",
            "outcomes": outcomes, "pass": all(v.startswith("refused") for v in outcomes.values())}


def phase_sigterm(server: Server) -> dict[str, Any]:
    rng = random.Random(7)
    results: list[tuple[float, float, int]] = []  # (start, end, status)
    lock = threading.Lock()
    stop_at = time.monotonic() + 6.0

    def client() -> None:
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            status, _ = nli(server.port, pairs_of(16, rng))
            with lock:
                results.append((t0, time.monotonic(), status))
            if status == 0:
                time.sleep(0.05)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    signalled = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        code: int | None = server.proc.wait(40)
    except subprocess.TimeoutExpired:  # still running after 40 s: killed, and the row fails
        server.proc.kill()
        code = None
    exit_s = time.monotonic() - signalled
    for t in threads:
        t.join()
    before = [s for t0, _, s in results if t0 < signalled]
    after = [s for t0, _, s in results if t0 >= signalled]
    unanswered = sum(1 for s in before if s == 0 or (s >= 500 and s != 503))
    return {"goal": "SIGTERM under load: every accepted request answered, new ones get 503, exit 0 within the grace",
            "begun_before": len(before), "before_statuses": dict(Counter(before)), "unanswered_before": unanswered,
            "after_statuses": dict(Counter(after)), "exit_code": code, "exit_s": round(exit_s, 2),
            "pass": unanswered == 0 and set(after) <= {503, 0} and code == 0 and exit_s < 20.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="artifact directory (default: the embedded default model)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of each overload phase (default 60)")
    p.add_argument("--max-requests", type=int, default=20000, help="most requests of any phase (default 20000)")
    p.add_argument("--json", default=None, help="write the rows to this file")
    p.add_argument("--only", default="poison,overload,hostile,sigterm,integrity",
                   help="the phases to run, comma-separated (default all)")
    args = p.parse_args(argv)
    only = set(args.only.split(","))
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    print(f"fastnli serve abuse bench on {cpu}, {os.cpu_count()} logical CPUs; server: default settings", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        server = Server(args.model, log)
        phases: list[Callable[[], dict[str, Any]]] = []
        if "poison" in only:
            phases.append(lambda: phase_poison(server, min(15.0, args.duration), args.max_requests))
        if "overload" in only:
            def overload_at(size: int) -> Callable[[], dict[str, Any]]:
                return lambda: phase_overload(server, size, args.duration, args.max_requests)

            phases += [overload_at(size) for size in (16, 64)]
        if "hostile" in only:
            phases.append(lambda: phase_hostile(server))
        if "sigterm" in only:
            phases.append(lambda: phase_sigterm(server))  # last: it stops the server
        try:
            for phase in phases:
                rows.append(phase())
                print(json.dumps(rows[-1]), flush=True)
        finally:
            server.stop()
            tail = log.read_text(errors="replace")[-3000:]
        if "integrity" in only:
            rows.append(phase_integrity(args.model))
            print(json.dumps(rows[-1]), flush=True)
    print("\n| goal | measured | met |\n|---|---|---|")
    for r in rows:
        measured = {k: v for k, v in r.items() if k not in ("goal", "pass", "cases")}
        print(f"| {r['goal']} | {json.dumps(measured)[1:-1] or 'below'} | {'yes' if r['pass'] else 'NO'} |")
    for r in rows:
        if "cases" in r:
            print("\n| hostile request | bytes | status | longest /health ms | RSS growth MB | healthy after |\n"
                  "|---|---|---|---|---|---|")
            for c in r["cases"]:
                print(f"| {c['case']} | {c['bytes']} | {c['status']} | {c['max_health_ms']} | {c['rss_growth_mb']} | "
                      f"{c['healthy_after']} |")
    if "Traceback" in tail:
        print("\nthe server logged a traceback:\n" + tail)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if all(r["pass"] for r in rows) and "Traceback" not in tail else 1


if __name__ == "__main__":
    raise SystemExit(main())
