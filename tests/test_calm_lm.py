"""The OpenAI-compatible client against a local chat-completions server on 127.0.0.1 (an ephemeral port)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fastnli.calm import LMError, OpenAIChatLM, calm
from fastnli.calm.lm import LangChainLM


class ChatServer:
    """Answers POST /v1/chat/completions from a script of (status, body, delay_s); afterwards repeats the last."""

    def __init__(self) -> None:
        self.script: list[tuple[int, Any, float]] = [(200, "ok", 0.0)]
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                server.headers.append(dict(self.headers))
                if self.path != "/v1/chat/completions":
                    status, payload, delay = 404, {"error": {"message": f"no route {self.path}"}}, 0.0
                else:
                    status, payload, delay = server.script.pop(0) if len(server.script) > 1 else server.script[0]
                time.sleep(delay)
                if status == 200 and isinstance(payload, str):
                    payload = {"id": "x", "object": "chat.completion", "model": body["model"],
                               "choices": [{"index": 0, "message": {"role": "assistant", "content": payload},
                                            "finish_reason": "stop"}]}
                raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    if status == 429:
                        self.send_header("Retry-After", "0")
                    self.end_headers()
                    self.wfile.write(raw)
                except OSError:  # the client timed out and went away
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def server() -> Iterator[ChatServer]:
    s = ChatServer()
    yield s
    s.close()


def test_chat_completions_wire_format(server: ChatServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_LM_KEY", "sekrit")
    server.script = [(200, "Paris.", 0.0)]
    lm = OpenAIChatLM("tiny", server.url, api_key_env="MY_LM_KEY", system_prompt="Be brief.", max_tokens=32)
    assert lm("Where?") == "Paris."
    body = server.requests[0]
    assert body == {"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Where?"}],
                    "temperature": 0.0, "max_tokens": 32}
    assert server.headers[0]["Authorization"] == "Bearer sekrit"


def test_no_key_sends_no_authorization_and_openai_needs_one(server: ChatServer,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert OpenAIChatLM("tiny", server.url + "/")("hi") == "ok"
    assert "Authorization" not in server.headers[0]
    with pytest.raises(ValueError, match=re.escape("no API key for https://api.openai.com/v1/chat/completions: set "
                                                   "the environment variable OPENAI_API_KEY or pass api_key")):
        OpenAIChatLM("gpt-4o-mini")


def test_retries_500_and_429_then_succeeds(server: ChatServer) -> None:
    server.script = [(500, {"error": {"message": "overloaded"}}, 0.0), (429, {"error": "slow down"}, 0.0),
                     (200, "fine", 0.0)]
    lm = OpenAIChatLM("tiny", server.url, max_retries=3, backoff=0.01)
    assert lm("q") == "fine"
    assert len(server.requests) == 3


def test_no_retry_on_400_and_the_server_message_is_in_the_error(server: ChatServer) -> None:
    server.script = [(400, {"error": {"message": "model 'tiny' does not exist", "type": "invalid_request"}}, 0.0)]
    lm = OpenAIChatLM("tiny", server.url, max_retries=3, backoff=0.01)
    with pytest.raises(LMError, match=re.escape(f"LM 'tiny' at {server.url}/chat/completions: HTTP 400: model "
                                                "'tiny' does not exist")) as info:
        lm("q")
    assert len(server.requests) == 1
    assert info.value.status == 400 and info.value.server_message == "model 'tiny' does not exist"
    assert info.value.url == f"{server.url}/chat/completions" and info.value.attempts == 1


def test_gives_up_after_retries(server: ChatServer) -> None:
    server.script = [(503, {"object": "error", "message": "engine dead"}, 0.0)]
    lm = OpenAIChatLM("tiny", server.url, max_retries=2, backoff=0.01)
    with pytest.raises(LMError, match=re.escape("HTTP 503: engine dead (gave up after 3 attempts)")):
        lm("q")
    assert len(server.requests) == 3


def test_timeout_is_retried_then_reported(server: ChatServer) -> None:
    server.script = [(200, "late", 1.0)]
    lm = OpenAIChatLM("tiny", server.url, timeout=0.2, max_retries=1, backoff=0.01)
    with pytest.raises(LMError, match=re.escape(f"LM 'tiny' at {server.url}/chat/completions: timed out after 0.2 s "
                                                "(gave up after 2 attempts)")):
        lm("q")
    assert len(server.requests) == 2


def test_connection_refused_and_bad_response() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    lm = OpenAIChatLM("tiny", f"http://127.0.0.1:{port}/v1", max_retries=0)
    with pytest.raises(LMError, match=re.escape(f"LM 'tiny' at http://127.0.0.1:{port}/v1/chat/completions: "
                                                "connection failed (ConnectionRefusedError")):
        lm("q")


def test_not_a_chat_completion(server: ChatServer) -> None:
    server.script = [(200, {"result": "text"}, 0.0)]
    with pytest.raises(LMError, match=re.escape("the response is not a chat completion (no "
                                                "choices[0].message.content)")):
        OpenAIChatLM("tiny", server.url)("q")


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match=re.escape("base_url='localhost:8000' must start with http:// or https://")):
        OpenAIChatLM("m", "localhost:8000")
    with pytest.raises(ValueError, match=re.escape("timeout=0 must be > 0 seconds")):
        OpenAIChatLM("m", "http://x/v1", timeout=0)
    with pytest.raises(TypeError, match=re.escape("chat_model must have an invoke(messages) method")):
        LangChainLM(object())


def test_verifier_http_error_names_role_lm_and_query(server: ChatServer) -> None:
    server.script = [(400, {"error": {"message": "context length exceeded"}}, 0.0)]

    def main(prompt: str) -> str:
        return "Paris is the capital of France [1]."

    verifier = OpenAIChatLM("small", server.url, max_retries=0)
    with pytest.raises(LMError, match=re.escape(f"verifier LM failed on query 0: LM 'small' at {server.url}/chat/"
                                                "completions: HTTP 400: context length exceeded")) as info:
        calm("Paris?", ["Paris is the capital of France."], main, verifier, engine=_NoEngine())
    assert info.value.role == "verifier" and info.value.query_index == 0 and info.value.status == 400


class _NoEngine:
    device, precision = "cpu", "none"

    def predict_with_stats(self, pairs: Any) -> Any:
        raise AssertionError("the engine must not run after an LM error")
