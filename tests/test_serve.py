"""fastnli serve over real HTTP on loopback: endpoints equal the library, exact errors, batching, 429, timeouts,
client disconnects, graceful shutdown, TEI /predict, metrics, config.

Servers run in a thread on 127.0.0.1 with an ephemeral port. Overload and shutdown are made deterministic with a gated
engine (the real tiny engine behind an Event): the first engine pass blocks until the test opens the gate, so the
test knows exactly what is in the pass and what waits in the queue.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from conftest import RAGGED_PAIRS  # noqa: E402

from fastnli.calm.checks import AnswerInput, CheckConfig, check_answers  # noqa: E402
from fastnli.calm.documents import Document  # noqa: E402
from fastnli.engine import NLIEngine  # noqa: E402
from fastnli.scorers.api import score  # noqa: E402
from fastnli.serve import BackgroundServer, ServeConfig  # noqa: E402

LIMITS = {"max_pairs_per_request": 64, "max_text_chars": 4000, "max_body_bytes": 50_000, "log_interval_s": 0.0}


# -- helpers ----------------------------------------------------------------------------------------------------
def call(server: BackgroundServer, path: str, body: Any = None, raw: bytes | None = None, method: str | None = None,
         timeout: float = 20.0) -> tuple[int, dict[str, str], Any]:
    """One HTTP request on a fresh loopback connection; returns (status, headers, decoded JSON or text)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method or ("POST" if data is not None else "GET"), path, body=data,
                     headers={"Content-Type": "application/json"} if data is not None else {})
        resp = conn.getresponse()
        payload = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()
    if "json" in headers.get("content-type", ""):
        return resp.status, headers, json.loads(payload)
    return resp.status, headers, payload.decode()


def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def nli_probs(body: dict[str, Any]) -> np.ndarray:
    return np.array([[r["probabilities"][k] for k in ("contradiction", "neutral", "entailment")]
                     for r in body["results"]], dtype=np.float32)


class GatedEngine:
    """The real engine behind a gate: each pass records its pairs, then waits for ``gate`` (max 30 s)."""

    def __init__(self, inner: NLIEngine) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls: list[list[tuple[str, str]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def predict_with_stats(self, pairs: Any) -> Any:
        self.calls.append(list(pairs))
        self.entered.set()
        assert self.gate.wait(30)
        return self.inner.predict_with_stats(pairs)


@contextlib.contextmanager
def serving(engine: Any, **overrides: Any) -> Iterator[BackgroundServer]:
    cfg = ServeConfig(**{"host": "127.0.0.1", "port": 0, **LIMITS, **overrides})
    server = BackgroundServer(engine, cfg).start()
    try:
        yield server
    finally:
        gate = getattr(engine, "__dict__", {}).get("gate")
        if gate is not None:
            gate.set()
        assert server.stop(timeout=30)


def in_threads(fns: list[Callable[[], Any]]) -> tuple[list[threading.Thread], list[Any]]:
    results: list[Any] = [None] * len(fns)

    def run(i: int) -> None:
        try:
            results[i] = fns[i]()
        except Exception as exc:  # surfaced by the assertions on results
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    return threads, results


def join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(30)
        assert not t.is_alive()


# -- fixtures ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(art_v1: Path) -> NLIEngine:
    return NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")


@pytest.fixture(scope="module")
def server(engine: NLIEngine) -> Iterator[BackgroundServer]:
    with serving(engine) as s:
        yield s


# -- endpoints equal the library ----------------------------------------------------------------------------------
def test_nli_equals_engine(server: BackgroundServer, engine: NLIEngine) -> None:
    status, _, body = call(server, "/v1/nli", {"pairs": [list(p) for p in RAGGED_PAIRS]})
    assert status == 200
    np.testing.assert_array_equal(nli_probs(body), engine.predict(RAGGED_PAIRS))
    assert body["labels"] == ["contradiction", "neutral", "entailment"]
    assert [r["label"] for r in body["results"]] == [body["labels"][i] for i in engine.predict(RAGGED_PAIRS).argmax(1)]
    assert body["device"] == "cpu" and body["precision"] == "fp32"
    status, _, body = call(server, "/v1/nli", {"pairs": []})
    assert status == 200 and body["results"] == []


def test_ncp_equals_score(server: BackgroundServer, engine: NLIEngine) -> None:
    responses = ["Paris", "The capital is Paris.", "Lyon"]
    samples = [["Paris", "Lyon", "Paris, France"], ["Paris", "Paris"], ["Lyon is a city in France.", "Marseille"]]
    scorers = ["noncontradiction", "entailment", "semantic_negentropy", "semantic_sets_confidence"]
    expected = score(responses, samples, scorers=scorers, engine=engine)
    body = [{"response": r, "sampled_responses": s, "scorers": scorers} for r, s in zip(responses, samples)]
    status, _, got = call(server, "/v1/ncp", body)
    assert status == 200 and len(got) == 3
    for row, out in zip(expected, got):  # the same pairs in the same order as score(): identical numbers
        for key in ("num_samples", "num_semantic_sets", *scorers):
            assert out[key] == getattr(row, key), key
        assert out["scorers"] == scorers
    # One object in, one object out; NCP only by default.
    status, _, one = call(server, "/v1/ncp", {"response": responses[0], "sampled_responses": samples[0]})
    alone = score(responses[:1], samples[:1], engine=engine)[0]
    assert status == 200 and one["noncontradiction"] == alone.noncontradiction and one["entailment"] is None
    status, _, best = call(server, "/v1/ncp", {"response": "Lyon", "sampled_responses": ["Paris", "Paris", "Lyon"],
                                               "scorers": ["noncontradiction", "semantic_negentropy"],
                                               "use_best": True})
    lib = score(["Lyon"], [["Paris", "Paris", "Lyon"]], scorers=("noncontradiction", "semantic_negentropy"),
                engine=engine, use_best=True)[0]
    assert status == 200 and best["best_response"] == lib.best_response
    assert best["noncontradiction"] == pytest.approx(lib.noncontradiction, abs=1e-6)
    # a question: used when asked (this seeded model is not question-aware, so not by default), as score() does
    q = {"response": "1989", "sampled_responses": ["1991", "In 1989."], "prompt": "When did the Wall fall?"}
    for flag in (None, True):
        status, _, got_q = call(server, "/v1/ncp", {**q, **({} if flag is None else {"question_aware": flag})})
        lib = score(["1989"], [q["sampled_responses"]], engine=engine, prompts=[q["prompt"]], question_aware=flag)[0]
        assert status == 200 and got_q["noncontradiction"] == lib.noncontradiction
    plain = score(["1989"], [q["sampled_responses"]], engine=engine)[0]
    aware = score(["1989"], [q["sampled_responses"]], engine=engine, prompts=[q["prompt"]], question_aware=True)[0]
    assert plain.noncontradiction != aware.noncontradiction  # the question really reaches the model


def test_calm_check_equals_library(server: BackgroundServer, engine: NLIEngine) -> None:
    docs = ["Paris is the capital of France.", {"title": "Louvre", "text": "The Louvre is a museum in Paris."}]
    answer = "Paris is the capital of France [1]. The Louvre is in Paris [1][2]. It has a tower [3]."
    verifier = "Paris is France's capital. The Louvre is a Paris museum."
    cfg = {"entailment_rule": "argmax", "accept_share": 0.5}
    status, _, got = call(server, "/v1/calm/check", {"answer": answer, "documents": docs,
                                                     "verifier_answer": verifier, "config": cfg})
    assert status == 200
    item = AnswerInput(answer=answer, documents=[Document(docs[0]), Document("The Louvre is a museum in Paris.",
                                                                             "Louvre")], verifier_answer=verifier)
    expected = check_answers([item], engine, CheckConfig(**cfg))[0][0].to_dict()
    assert got == json.loads(json.dumps(expected))
    assert got["invalid_citations"] == [3]
    status, _, many = call(server, "/v1/calm/check", [{"answer": answer, "documents": docs}, {"answer": "No docs."}])
    assert status == 200 and len(many) == 2 and many[1]["citation_recall"] == 0.0 and many[0]["consistency"] is None


def test_grounding_and_long_documents_equal_library(server: BackgroundServer, engine: NLIEngine) -> None:
    import fastnli

    statements = ["Paris is the capital of France.", "The Louvre is in Lyon."]
    docs = [{"title": "Paris", "text": "Paris is the capital of France. The Louvre is a museum in Paris."},
            "Lyon is a city in France."]
    for granularity in ("window", "sentence"):
        status, _, got = call(server, "/v1/grounding", {"statements": statements, "documents": docs,
                                                        "granularity": granularity})
        assert status == 200
        ref = fastnli.grounding(statements, docs, engine, granularity=granularity).to_dict()
        for key in ("stats", "device", "precision", "seconds", "truncated_pairs"):
            ref.pop(key)
            got.pop(key)
        assert got == json.loads(json.dumps(ref))
    status, _, small = call(server, "/v1/grounding", {"answer": "Paris is in France [1].", "documents": docs,
                                                      "matrix": False})
    assert status == 200 and "probs" not in small and small["statements"] == ["Paris is in France."]
    # a cited document over the model limit: read in windows, exactly as the library does
    long_doc = {"title": "Long", "text": " ".join(f"Record {i} says the town library opened on a Monday." for i in
                                                  range(60)) + " The Louvre is a museum in Paris."}
    answer = "The Louvre is a museum in Paris [1]."
    status, _, got = call(server, "/v1/calm/check", {"answer": answer, "documents": [long_doc]})
    expected = check_answers([AnswerInput(answer, [Document(long_doc["text"], "Long")])], engine)[0][0].to_dict()
    assert status == 200 and got == json.loads(json.dumps(expected))
    assert got["chunked_pairs"] == 1 and got["statements"][0]["citation_window"] is not None


def test_predict_is_tei_compatible(server: BackgroundServer, engine: NLIEngine) -> None:
    pairs = RAGGED_PAIRS[:3]
    probs = engine.predict(pairs)
    names = [engine.manifest.id2label[str(c)] for c in engine.manifest.columns]
    status, _, one = call(server, "/predict", {"inputs": list(pairs[0])})
    assert status == 200 and isinstance(one, list) and len(one) == 3
    assert [p["score"] for p in one] == sorted((float(x) for x in probs[0]), reverse=True)
    assert {p["label"]: p["score"] for p in one} == {n: float(x) for n, x in zip(names, probs[0])}
    status, _, batch = call(server, "/predict", {"inputs": [list(p) for p in pairs], "truncate": True})
    assert status == 200 and len(batch) == 3 and all(len(b) == 3 for b in batch)
    for b, row in zip(batch, probs):
        assert {p["label"]: p["score"] for p in b} == {n: float(x) for n, x in zip(names, row)}
    status, _, raw = call(server, "/predict", {"inputs": list(pairs[0]), "raw_scores": True})
    logp = np.array([{p["label"]: p["score"] for p in raw}[n] for n in names])
    assert status == 200 and [p["label"] for p in raw] == [p["label"] for p in one]
    np.testing.assert_allclose(np.exp(logp), probs[0], rtol=1e-6)  # log-probabilities: softmax gives probs back
    long = ["word " * 700, "short"]
    status, _, err = call(server, "/predict", {"inputs": long})
    assert status == 413 and re.fullmatch(r"inputs has \d+ tokens; the model reads at most 512 \(send \"truncate\": "
                                          r"true to truncate it longest_first\)", err["error"])
    status, _, ok = call(server, "/predict", {"inputs": long, "truncate": True})
    assert status == 200 and {p["label"]: p["score"] for p in ok} == {
        n: float(x) for n, x in zip(names, engine.predict([tuple(long)])[0])}


# -- validation ---------------------------------------------------------------------------------------------------
BAD_REQUESTS = [
    ("/v1/nli", {}, 422, 'field \'pairs\' is missing; send {"pairs": [[premise, hypothesis], ...]}'),
    ("/v1/nli", [], 422, "request body must be a JSON object; got array"),
    ("/v1/nli", {"pairs": "a"}, 422, "field 'pairs' must be an array of [premise, hypothesis] pairs; got string"),
    ("/v1/nli", {"pairs": [["a"]]}, 422, "pairs[0] must be a [premise, hypothesis] array of two strings; got 1 items"),
    ("/v1/nli", {"pairs": [["a", "b"], "ab"]}, 422,
     "pairs[1] must be a [premise, hypothesis] array of two strings; got string"),
    ("/v1/nli", {"pairs": [["a", None]]}, 422, "pairs[0][1] (hypothesis) must be a string; got null"),
    ("/v1/nli", {"pairs": [["a", "b"]] * 65}, 413,
     "field 'pairs' has 65 NLI pairs; the limit is 64 per request (FASTNLI_MAX_PAIRS_PER_REQUEST); split the request"),
    ("/v1/nli", {"pairs": [["a", "b"], ["x" * 4001, "b"]]}, 413,
     "pairs[1][0] (premise) has 4001 characters; the limit is 4000 per text (FASTNLI_MAX_TEXT_CHARS)"),
    ("/v1/ncp", {"response": "a"}, 422,
     'field \'sampled_responses\' is missing; send {"response": str, "sampled_responses": [str, ...]}'),
    ("/v1/ncp", {"response": "a", "sampled_responses": []}, 422,
     "field 'sampled_responses' is empty; give at least one sampled response"),
    ("/v1/ncp", [{"response": "a", "sampled_responses": ["b", 3]}], 422,
     "[0].sampled_responses[1] must be a string; got number"),
    ("/v1/ncp", {"response": "a", "sampled_responses": ["b"], "scorers": ["ncp"]}, 422,
     "field 'scorers' has unknown scorers ['ncp']; choose from ['noncontradiction', 'entailment', "
     "'semantic_negentropy', 'semantic_sets_confidence']"),
    ("/v1/ncp", {"response": "a", "sampled_responses": ["b"], "temperature": 1}, 422,
     "request body has unknown fields ['temperature']; allowed: response, sampled_responses, prompt, scorers, "
     "use_best, question_aware, align_units"),
    ("/v1/ncp", {"response": "a", "sampled_responses": ["b"], "align_units": "yes"}, 422,
     "field 'align_units' must be true or false; got string"),
    ("/v1/ncp", {"response": "a", "sampled_responses": ["b"], "prompt": 7}, 422,
     "field 'prompt' must be a string; got number"),
    ("/v1/ncp", {"response": "a", "sampled_responses": ["b"], "question_aware": True}, 422,
     "request body: question_aware=True needs prompts: pass prompts=[question per response]"),
    ("/v1/ncp", {"response": "a", "sampled_responses": [f"s{i}" for i in range(40)]}, 413,
     "the request needs 80 NLI pairs; the limit is 64 per request (FASTNLI_MAX_PAIRS_PER_REQUEST); split the request"),
    ("/v1/calm/check", {"documents": []}, 422,
     'field \'answer\' is missing; send {"answer": str, "documents": [...], "verifier_answer": str}'),
    ("/v1/calm/check", {"answer": "a", "documents": [{"title": "t"}]}, 422,
     "documents[0] is a mapping without a 'text' field (keys: ['title']); give a string or {'title': ..., "
     "'text': ...}"),
    ("/v1/calm/check", {"answer": "a", "config": {"threshold": 0.5}}, 422,
     "field 'config' has unknown fields ['threshold']; allowed: accept_share, align_units, check_citations, "
     "contradiction_threshold, entailment_rule, entailment_threshold, long_premise, min_citation_recall, "
     "window_entailment_threshold"),
    ("/v1/calm/check", {"answer": "a", "config": {"long_premise": "cut"}}, 422,
     "field 'config': long_premise='cut' is not supported; use 'chunk' (read a long premise in windows) or "
     "'truncate' (cut the pair to the model limit)"),
    ("/v1/grounding", {"documents": ["d"]}, 422,
     "send exactly one of field 'statements' (a list of strings) and field 'answer' (a text split into statements)"),
    ("/v1/grounding", {"statements": ["s", 1], "documents": ["d"]}, 422,
     "field 'statements[1]' must be a string; got number"),
    ("/v1/grounding", {"statements": ["s"], "documents": []}, 422,
     "field 'documents' is empty; send at least one document"),
    ("/v1/grounding", {"statements": ["s"], "documents": ["d"], "granularity": "page"}, 422,
     "field 'granularity' is 'page'; use \"window\" or \"sentence\""),
    ("/v1/grounding", {"statements": ["s"], "documents": ["d"], "threshold": True}, 422,
     "field 'threshold' is True; send a number within [0, 1] (or null: the model's default)"),
    ("/v1/grounding", {"statements": ["s"] * 70, "documents": ["d"]}, 413,
     "the request needs at least 70 NLI pairs; the limit is 64 per request (FASTNLI_MAX_PAIRS_PER_REQUEST); split the request"),
    ("/v1/calm/check", {"answer": "a", "config": {"accept_share": 2}}, 422,
     "field 'config': accept_share=2 must be within [0, 1]"),
    ("/predict", {"inputs": "one text"}, 422, "field 'inputs' is a single text; an NLI model classifies (premise, "
     "hypothesis) pairs: send [premise, hypothesis] or [[premise, hypothesis], ...]"),
    ("/predict", {"inputs": []}, 422, "field 'inputs' cannot be empty"),
    ("/predict", {"inputs": [["a", "b"], ["c"]]}, 422,
     "inputs[1] must be a [premise, hypothesis] array of two strings; got 1 items"),
    ("/predict", {"inputs": ["a", "b"], "raw_scores": "yes"}, 422, "field 'raw_scores' must be true or false; got string"),
]


@pytest.mark.parametrize(("path", "body", "status", "message"), BAD_REQUESTS)
def test_validation_errors(server: BackgroundServer, path: str, body: Any, status: int, message: str) -> None:
    got, _, err = call(server, path, body)
    assert (got, err) == (status, {"error": message, "error_type": "Validation"})


def test_body_errors_and_routing(server: BackgroundServer) -> None:
    status, _, err = call(server, "/v1/nli", raw=b"{not json")
    assert (status, err["error"]) == (422, "request body is not valid JSON: Expecting property name enclosed in "
                                           "double quotes at line 1 column 2")
    status, _, err = call(server, "/v1/nli", raw=b"")
    assert (status, err["error"]) == (422, "request body is empty; send a JSON object")
    big = json.dumps({"pairs": [["a" * 1000, "b"]] * 60}).encode()
    status, _, err = call(server, "/v1/nli", raw=big)
    assert (status, err["error"]) == (413, f"request body is {len(big)} bytes; the limit is 50000 "
                                           "(FASTNLI_MAX_BODY_BYTES); split the request")
    assert call(server, "/v2/nope")[0] == 404
    assert call(server, "/v1/nli", method="GET")[0] == 405


def test_health_ready_info_metrics_openapi(server: BackgroundServer) -> None:
    # A listening socket created with proto 0 makes asyncio skip TCP_NODELAY on accepted sockets: Nagle then holds
    # each response body ~40 ms on keep-alive connections.
    assert server._sock.proto == socket.IPPROTO_TCP
    assert call(server, "/health")[2] == {"status": "ok"}
    status, _, ready = call(server, "/ready")
    assert status == 200 and ready["ready"] is True and ready["device"] == "cpu"
    assert ready["id2label"] == ["CONTRADICTION", "NEUTRAL", "ENTAILMENT"]
    status, _, info = call(server, "/info")
    assert status == 200 and info["limits"]["max_pairs_per_request"] == 64 and info["max_input_length"] == 512
    call(server, "/v1/nli", {"pairs": [["a", "b"]]})
    call(server, "/v1/nli", {"pairs": 1})
    status, headers, text = call(server, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    for line in ('fastnli_http_errors_total{kind="429"} ', 'fastnli_http_errors_total{kind="413"} ',
                 'fastnli_http_errors_total{kind="5xx"} 0', "fastnli_queue_depth 0", "fastnli_padding_efficiency ",
                 'fastnli_batch_pairs_bucket{le="+Inf"} ', "fastnli_batch_requests_count ",
                 'fastnli_request_duration_seconds_bucket{endpoint="nli",le="0.005"} ',
                 'fastnli_engine_info{model="', 'device="cpu",precision="fp32"', "fastnli_engine_fallbacks_total 0",
                 'fastnli_dropped_requests_total{reason="disconnect"} ', 'fastnli_http_requests_total{endpoint="nli",'
                 'code="422"} '):
        assert line in text, line
    assert re.search(r'^fastnli_http_errors_total\{kind="422"\} [1-9]', text, re.M)
    eff = float(re.search(r"^fastnli_padding_efficiency (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert 0 < eff <= 1
    status, _, doc = call(server, "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.") and {"/v1/nli", "/v1/ncp", "/v1/calm/check",
                                                                  "/predict", "/metrics"} <= set(doc["paths"])


# -- batching, backpressure, timeouts, disconnects, shutdown --------------------------------------------------------
def _nli_call(server: BackgroundServer, pairs: list[tuple[str, str]]) -> Callable[[], tuple[int, Any]]:
    def fn() -> tuple[int, Any]:
        status, _, body = call(server, "/v1/nli", {"pairs": [list(p) for p in pairs]})
        return status, body

    return fn


def test_concurrent_requests_share_one_pass(engine: NLIEngine) -> None:
    gated = GatedEngine(engine)
    requests = [[RAGGED_PAIRS[i], RAGGED_PAIRS[(i + 1) % 7]] for i in range(6)]
    with serving(gated, max_wait_ms=0) as s:
        first, r0 = in_threads([_nli_call(s, requests[0])])
        assert gated.entered.wait(10)  # request 0 is in the engine; the others queue behind it
        rest, results = in_threads([_nli_call(s, r) for r in requests[1:]])
        until(lambda: s.state.batcher.depth == 5)
        gated.gate.set()
        join(first + rest)
    assert len(gated.calls) == 2 and sorted(gated.calls[1]) == sorted(p for r in requests[1:] for p in r)  # shared
    for req, (status, body) in zip(requests, r0 + results):
        assert status == 200
        np.testing.assert_allclose(nli_probs(body), engine.predict(req), atol=1e-6)


def test_full_queue_answers_429(engine: NLIEngine) -> None:
    gated = GatedEngine(engine)
    with serving(gated, queue_size=2, retry_after_s=3) as s:
        threads, results = in_threads([_nli_call(s, [RAGGED_PAIRS[0]])])
        assert gated.entered.wait(10)
        more, queued = in_threads([_nli_call(s, [RAGGED_PAIRS[1]]), _nli_call(s, [RAGGED_PAIRS[2]])])
        until(lambda: s.state.batcher.depth == 2)
        status, headers, err = call(s, "/v1/nli", {"pairs": [list(RAGGED_PAIRS[3])]})
        assert status == 429 and headers["retry-after"] == "3"
        assert err == {"error": "overloaded: 2 requests (2 pairs) are waiting (limits: 2 requests, 8192 pairs); retry "
                                "after 3 s", "error_type": "Overloaded"}
        gated.gate.set()
        join(threads + more)
        _, _, metrics = call(s, "/metrics")
    for (status, body), pair in zip(results + queued, RAGGED_PAIRS[:3]):
        assert status == 200
        np.testing.assert_allclose(nli_probs(body), engine.predict([pair]), atol=1e-6)
    assert 'fastnli_http_errors_total{kind="429"} 1' in metrics


def test_timeout_answers_504_and_drops_queued_work(engine: NLIEngine) -> None:
    gated = GatedEngine(engine)
    with serving(gated, request_timeout_s=0.5) as s:
        threads, running = in_threads([_nli_call(s, [("in", "pass")])])
        assert gated.entered.wait(10)
        status, _, err = call(s, "/v1/nli", {"pairs": [["never", "run"]]})
        assert status == 504 and err == {"error": "no result within 0.5 s (FASTNLI_REQUEST_TIMEOUT_S); the request was "
                                                  "dropped before its engine pass", "error_type": "Timeout"}
        join(threads)
        assert running[0][0] == 504 and running[0][1]["error"].endswith("its engine pass was still running")
        gated.gate.set()
        assert call(s, "/v1/nli", {"pairs": [["after", "wards"]]})[0] == 200
        _, _, metrics = call(s, "/metrics")
    assert [("never", "run")] not in gated.calls and len(gated.calls) == 2
    assert 'fastnli_dropped_requests_total{reason="timeout"} 1' in metrics


def test_client_disconnect_drops_queued_work(engine: NLIEngine) -> None:
    gated = GatedEngine(engine)
    with serving(gated) as s:
        threads, results = in_threads([_nli_call(s, [("in", "pass")])])
        assert gated.entered.wait(10)
        body = json.dumps({"pairs": [["client", "gone"]]}).encode()
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
            sock.sendall(b"POST /v1/nli HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            until(lambda: s.state.batcher.depth == 1)
        until(lambda: s.state.metrics.dropped.get("disconnect") == 1)
        gated.gate.set()
        join(threads)
    assert results[0][0] == 200 and gated.calls == [[("in", "pass")]]


def test_graceful_shutdown_answers_every_accepted_request(engine: NLIEngine) -> None:
    gated = GatedEngine(engine)
    requests = [[RAGGED_PAIRS[i]] for i in range(6)]
    server = BackgroundServer(gated, ServeConfig(host="127.0.0.1", port=0, **LIMITS)).start()
    try:
        first, r0 = in_threads([_nli_call(server, requests[0])])
        assert gated.entered.wait(10)
        rest, results = in_threads([_nli_call(server, r) for r in requests[1:]])
        until(lambda: server.state.batcher.depth == 5)
        server.request_stop()  # what SIGTERM does
        until(lambda: server.state.closing)
        # while draining: new requests get 503 at once, /ready says so, /health still answers
        status, headers, err = call(server, "/v1/nli", {"pairs": [["new", "request"]]})
        assert (status, headers["retry-after"], err) == (503, "1", {
            "error": "the service is shutting down and accepts no new work; retry on another instance",
            "error_type": "Unhealthy"})
        assert call(server, "/ready")[:3:2] == (503, {"ready": False, "reason": "shutting down"})
        assert call(server, "/health")[0] == 200
        gated.gate.set()
        join(first + rest)
        assert server.stop(timeout=30)
    finally:
        gated.gate.set()
        server.stop(timeout=30)
    assert server.state.batcher.closing and server.state.batcher.depth == 0
    for req, (status, body) in zip(requests, r0 + results):
        assert status == 200
        np.testing.assert_allclose(nli_probs(body), engine.predict(req), atol=1e-6)


def test_model_loads_in_background(engine: NLIEngine) -> None:
    loaded = threading.Event()

    def factory() -> NLIEngine:
        assert loaded.wait(30)
        return engine

    with serving(factory) as s:
        assert call(s, "/health")[0] == 200
        status, _, ready = call(s, "/ready")
        assert (status, ready) == (503, {"ready": False, "reason": "the model is loading"})
        status, headers, err = call(s, "/v1/nli", {"pairs": [["a", "b"]]})
        assert (status, err["error"], headers["retry-after"]) == (503, "the model is still loading; GET /ready says "
                                                                       "when it is", "1")
        loaded.set()
        until(lambda: call(s, "/ready")[0] == 200)
        assert call(s, "/v1/nli", {"pairs": [["a", "b"]]})[0] == 200


def test_engine_failure_answers_500(engine: NLIEngine) -> None:
    class Broken(GatedEngine):
        def predict_with_stats(self, pairs: Any) -> Any:
            raise RuntimeError("device lost")

    with serving(Broken(engine)) as s:
        status, _, err = call(s, "/v1/nli", {"pairs": [["a", "b"]]})
        assert (status, err) == (500, {"error": "engine failure: RuntimeError: device lost", "error_type": "Backend"})
        assert 'fastnli_http_errors_total{kind="5xx"} 1' in call(s, "/metrics")[2]


# -- config -------------------------------------------------------------------------------------------------------
def test_config_env_flags_and_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastnli.cli import build_parser
    from fastnli.cli.serve import config_from_args

    monkeypatch.setenv("FASTNLI_MAX_WAIT_MS", "7.5")
    monkeypatch.setenv("FASTNLI_QUEUE_SIZE", "9")
    cfg = ServeConfig()
    assert (cfg.max_wait_ms, cfg.queue_size, cfg.host, cfg.graceful_timeout_s) == (7.5, 9, "127.0.0.1", 20.0)
    with pytest.raises(AttributeError):
        cfg.port = 1  # type: ignore[misc]
    args = build_parser().parse_args(["serve", "--model", "m", "--max-wait-ms", "0", "--max-pass-pairs", "1",
                                      "--max-batch-tokens", "512"])
    cfg = config_from_args(args)
    assert (cfg.max_wait_ms, cfg.max_pass_pairs, cfg.queue_size) == (0.0, 1, 9)
    assert args.max_batch_tokens == 512  # the engine's own flag is untouched
    monkeypatch.setenv("FASTNLI_PORT", "http")
    with pytest.raises(ValueError, match=re.escape("FASTNLI_PORT='http' is not an integer (it sets ServeConfig.port); "
                                                   "set it to a whole number such as 8080, or unset it")):
        ServeConfig()
    monkeypatch.delenv("FASTNLI_PORT")
    with pytest.raises(ValueError, match=re.escape("queue_size=0 must be > 0 (set by --queue-size or "
                                                   "FASTNLI_QUEUE_SIZE)")):
        ServeConfig(queue_size=0)
    assert math.isclose(ServeConfig(shutdown_timeout_s=2).graceful_timeout_s, 2.0)


# -- the batcher alone ----------------------------------------------------------------------------------------------
class RowEngine:
    """Answers each pair with a row derived from its text; records its passes; the first pass waits for ``gate``."""

    def __init__(self, gated: bool = True) -> None:
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.entered = threading.Event()
        self.calls: list[list[tuple[str, str]]] = []

    @staticmethod
    def row(pair: tuple[str, str]) -> list[float]:
        x = (len(pair[0]) + 2 * len(pair[1])) % 7 / 10
        return [x, 0.5 - x / 2, 0.5 - x / 2]

    def predict_with_stats(self, pairs: Any) -> Any:
        self.calls.append(list(pairs))
        self.entered.set()
        assert self.gate.wait(30)
        return np.array([self.row(p) for p in pairs], dtype=np.float32), None


def test_batcher_budgets_order_and_wait() -> None:
    from fastnli.serve.batcher import DynamicBatcher

    eng = RowEngine()
    b = DynamicBatcher(eng, max_pass_pairs=4, log_interval_s=0).start()
    try:
        jobs = [[("a", "b")] * 2, [("c", "dd")] * 3, [("e", "f"), ("g", "h")], [("i", "j")]]
        futures = [b.submit(jobs[0])]
        assert eng.entered.wait(10)
        futures += [b.submit(j) for j in jobs[1:]]
        assert b.submit([]).result(0).shape == (0, 3)  # nothing to run: resolved at once, never queued
        eng.gate.set()
        for job, fut in zip(jobs, futures):
            np.testing.assert_array_equal(fut.result(10), np.array([eng.row(p) for p in job], dtype=np.float32))
        # FIFO under the 4-pair budget: [2] | [3] (3 + 2 > 4) | [2, 1]; a request is never split.
        assert [len(c) for c in eng.calls] == [2, 3, 3]
    finally:
        assert b.close(10)
    slow = RowEngine(gated=False)
    b = DynamicBatcher(slow, max_wait_ms=300, log_interval_s=0).start()
    try:  # an idle engine holds the first request up to max_wait_ms: three quick submits share one pass
        futures = [b.submit([("x", str(i))]) for i in range(3)]
        for f in futures:
            f.result(10)
        assert [len(c) for c in slow.calls] == [3]
    finally:
        assert b.close(10)
    full = RowEngine(gated=False)
    b = DynamicBatcher(full, max_wait_ms=60_000, max_pass_pairs=2, log_interval_s=0).start()
    try:  # ... unless the waiting requests already fill a pass
        futures = [b.submit([("x", "y")]), b.submit([("x", "z")])]
        assert [f.result(10).shape for f in futures] == [(1, 3), (1, 3)]
    finally:
        assert b.close(10)
