"""CaLM end to end on the tiny seeded DeBERTa artifact (real compute, meaningless probabilities), Python and CLI."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastnli.calm import calm_batch
from fastnli.cli import main
from fastnli.engine import NLIEngine

DOCS = [{"title": "Paris", "text": "Paris is the capital of France."},
        {"title": "Museums", "text": "Paris has many museums, among them the Louvre."},
        {"title": "Lyon", "text": "Lyon is a city in France."},
        "The Seine flows through Paris."]
MAIN = "Paris is the capital of France [1]. It has many museums [2][3]. It lies on the Seine [9]."
VERIFIER = "Paris is the capital of France. The Louvre is in Paris."


@pytest.fixture(scope="module")
def engine(art_v1: Path) -> NLIEngine:
    return NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")


class CountingEngine:
    def __init__(self, inner: NLIEngine) -> None:
        self.inner, self.calls = inner, 0
        self.device, self.precision, self.manifest = inner.device, inner.precision, inner.manifest

    def predict_with_stats(self, pairs: Any) -> Any:
        self.calls += 1
        return self.inner.predict_with_stats(pairs)


def test_calm_batch_on_the_tiny_checkpoint(engine: NLIEngine) -> None:
    counting = CountingEngine(engine)
    queries = ["What is Paris?", "Tell me about Paris.", "Where is the Louvre?"]
    batch = calm_batch(queries, [DOCS] * 3, lambda p: MAIN, lambda p: VERIFIER, counting, k=2, max_iterations=2)
    assert counting.calls == len(batch.passes) and 1 <= len(batch.passes) <= 2
    assert batch.device == "cpu" and batch.precision == "fp32"
    for p in batch.passes:
        assert 0 < p["unique_pairs"] <= p["pairs_in"]
    first = batch.passes[0]
    assert first["pairs_in"] == sum(sum(r.trace[0].check.nli_pairs.values()) for r in batch if r.trace[0].check)
    # The three queries send identical pairs in iteration 1: the engine computes them once.
    assert first["unique_pairs"] == first["pairs_in"] // 3
    for r in batch:
        assert r.answer == MAIN and r.best_iteration is not None and r.stop_reason in ("accepted", "max_iterations")
        check = r.trace[0].check
        assert check is not None and len(check.statements) == 3 and check.verifier_sentences is not None
        assert check.invalid_citations == [3, 9]  # the first prompt showed documents [1]..[2] (k=2)
        for s in check.statements:
            assert s.corroboration is not None and 0.0 <= s.corroboration <= 1.0
        assert check.consistency == pytest.approx(np.mean([s.corroboration for s in check.statements]))
        assert check.citation_recall is not None and 0.0 <= check.citation_recall <= 1.0
    # Deterministic: the same run gives the same scores.
    again = calm_batch(queries, [DOCS] * 3, lambda p: MAIN, lambda p: VERIFIER, engine, k=2, max_iterations=2)
    assert [r.metrics for r in again] == [r.metrics for r in batch]
    json.loads(batch.to_json())


class _Server:
    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if body["model"] == "broken":
                    status, payload = 400, {"error": {"message": "unknown model 'broken'"}}
                else:
                    text = MAIN if body["model"] == "big" else VERIFIER
                    status, payload = 200, {"choices": [{"message": {"role": "assistant", "content": text}}]}
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()


@pytest.fixture()
def lm_url() -> Iterator[str]:
    s = _Server()
    yield s.url
    s.httpd.shutdown()
    s.httpd.server_close()


def test_cli_calm_and_alce(art_v1: Path, tmp_path: Path, lm_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "q.jsonl"
    src.write_text(json.dumps({"query": "What is Paris?", "documents": DOCS, "id": 7}) + "\n"
                   + json.dumps({"question": "Where is the Louvre?", "documents": DOCS[:2]}) + "\n")
    out = tmp_path / "out.jsonl"
    engine_args = ["--model", str(art_v1), "--device", "cpu", "--precision", "fp32"]
    args = ["calm", str(src), "-o", str(out), "--main-base-url", lm_url, "--main-model", "big",
            "--verifier-base-url", lm_url, "--verifier-model", "small", "--k", "2", "--max-iterations", "2",
            "--no-progress", "--no-prompts", *engine_args]
    assert main(args) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["id"] == 7 and lines[0]["answer"] == MAIN
    assert lines[0]["device"] == "cpu" and lines[0]["precision"] == "fp32"
    assert "main_prompt" not in lines[0]["trace"][0] and lines[0]["trace"][0]["engine_pass"]["pairs_in"] > 0

    # A failing verifier is recorded in the line of each query and the exit status is 1.
    args[args.index("small")] = "broken"
    assert main(args) == 1
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[1]["stop_reason"] == "error"
    assert lines[1]["error"] == (f"verifier LM failed on query 1: LM 'broken' at {lm_url}/chat/completions: HTTP 400: "
                                 "unknown model 'broken'")

    # Bad input names the line and the field.
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "q"}) + "\n")
    assert main(["calm", str(bad), *args[2:]]) == 2
    assert re.search(r"bad\.jsonl:1: missing field 'documents'", " ".join(capsys.readouterr().err.split()))

    alce_in = tmp_path / "a.jsonl"
    alce_in.write_text(json.dumps({"answer": MAIN, "documents": DOCS}) + "\n")
    alce_out = tmp_path / "a_out.jsonl"
    assert main(["alce", str(alce_in), "-o", str(alce_out), *engine_args]) == 0
    (row,) = [json.loads(x) for x in alce_out.read_text().splitlines()]
    assert row["num_citations"] == 4 and row["invalid_citations"] == [9] and len(row["statements"]) == 3
    assert 0.0 <= row["citation_recall"] <= 1.0 and 0.0 <= row["citation_precision"] <= 0.75


def test_cli_calm_and_alce_keep_invalid_records_in_place(art_v1: Path, tmp_path: Path, lm_url: str) -> None:
    engine_args = ["--model", str(art_v1), "--device", "cpu", "--precision", "fp32"]
    src = tmp_path / "q.jsonl"
    src.write_text(json.dumps({"query": "", "documents": DOCS}) + "\nnot json\n"
                   + json.dumps({"query": "What is Paris?", "documents": DOCS, "id": 7}) + "\n"
                   + json.dumps({"query": "Where?", "documents": []}) + "\n")
    out = tmp_path / "out.jsonl"
    args = ["calm", str(src), "-o", str(out), "--main-base-url", lm_url, "--main-model", "big",
            "--verifier-base-url", lm_url, "--verifier-model", "small", "--k", "2", "--max-iterations", "2",
            "--no-progress", "--no-prompts", *engine_args]
    assert main(args) == 2 and not out.exists()  # the default stops at the first bad line
    assert main([*args, "--on-invalid", "keep"]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r.get("error") for r in lines] == [
        f"{src}:1: field 'query' must be a non-empty string",
        f"{src}:2: not valid JSON (Expecting value); each line must be one JSON object", None,
        f"{src}:4: field 'documents' must be a non-empty list of strings or {{\"title\", \"text\"}} objects"]
    assert lines[2]["id"] == 7 and lines[2]["answer"] == MAIN and "answer" not in lines[0]
    assert lines[3] == {"query": "Where?", "documents": [], "error": lines[3]["error"]}  # its fields, no result

    alce_in = tmp_path / "a.jsonl"
    alce_in.write_text(json.dumps({"answer": 3, "documents": DOCS}) + "\n"
                       + json.dumps({"answer": MAIN, "documents": DOCS}) + "\n")
    alce_out = tmp_path / "a_out.jsonl"
    assert main(["alce", str(alce_in), "-o", str(alce_out), "--on-invalid", "keep", *engine_args]) == 0
    rows = [json.loads(x) for x in alce_out.read_text().splitlines()]
    assert rows[0] == {"answer": 3, "documents": DOCS, "error": f"{alce_in}:1: field 'answer' must be a string"}
    assert rows[1]["num_citations"] == 4 and "error" not in rows[1]
    missing_model = str(tmp_path / "no-such-model")  # nothing valid: the model is not loaded
    alce_in.write_text(json.dumps({"answer": 3, "documents": DOCS}) + "\n")
    assert main(["alce", str(alce_in), "-o", str(alce_out), "--on-invalid", "keep", "--model", missing_model]) == 0
    assert [json.loads(x)["error"] for x in alce_out.read_text().splitlines()] == [
        f"{alce_in}:1: field 'answer' must be a string"]
