"""Language models of the CaLM loop: plain callables, batched callables, an OpenAI-compatible client, LangChain.

What the loop accepts as an LM (:func:`resolve_lm` decides, in this order):

1. an object with ``generate_batch(prompts: list[str]) -> list[str]`` — e.g. :class:`BatchedLM` around a function
   that takes a list of prompts (a local vLLM/transformers pipeline); called once per phase per chunk;
2. an object with ``.invoke(messages)`` returning an object with ``.content`` — a LangChain chat model, wrapped in
   :class:`LangChainLM` (LangChain itself is not imported);
3. any callable ``prompt -> str`` — :class:`OpenAIChatLM` is one; called once per prompt.

Calls run on a thread pool shared by all queries of a batch (``max_concurrency`` threads, default 8), so LM
objects must be safe to call from several threads (:class:`OpenAIChatLM` is). Every failure reaches the caller as an
:class:`LMError` that names the LM (model and URL for the HTTP client), the HTTP status and the server's own message.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from typing import Any, Protocol, runtime_checkable

__all__ = ["BatchedLM", "ChatModel", "LMError", "LangChainLM", "OpenAIChatLM", "batched", "resolve_lm"]

logger = logging.getLogger("fastnli")

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class LMError(RuntimeError):
    """A language-model call failed (after any retries).

    Attributes:
        lm: the LM's name (the model name for :class:`OpenAIChatLM`).
        url: the endpoint, for HTTP clients.
        status: the HTTP status, when the server answered.
        server_message: the server's own error message, when it sent one.
        role: ``"main"`` or ``"verifier"`` when raised by the CaLM loop.
        query_index: the index of the query in the batch, when raised by the CaLM loop.
        attempts: how many attempts were made.
    """

    def __init__(self, message: str, *, lm: str | None = None, url: str | None = None, status: int | None = None,
                 server_message: str | None = None, role: str | None = None, query_index: int | None = None,
                 attempts: int | None = None) -> None:
        super().__init__(message)
        self.lm, self.url, self.status, self.server_message = lm, url, status, server_message
        self.role, self.query_index, self.attempts = role, query_index, attempts


@runtime_checkable
class ChatModel(Protocol):
    """What :class:`LangChainLM` needs: ``invoke(messages)`` returning an object with a ``content`` attribute."""

    def invoke(self, input: Any, /) -> Any: ...


def _server_message(raw: bytes) -> str:
    """The error text of an error body: OpenAI ``{"error": {"message"}}``, Ollama ``{"error": str}``, vLLM
    ``{"message"}``, else the body itself (first 500 characters)."""
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return text[:500] or "(empty body)"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
        if isinstance(body.get("message"), str):
            return str(body["message"])
        if isinstance(body.get("detail"), str):
            return str(body["detail"])
    return text[:500]


def _content_text(content: Any) -> str | None:
    """A message's content as text: a str, or the text parts of a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [c if isinstance(c, str) else c.get("text", "") for c in content
                 if isinstance(c, str) or (isinstance(c, dict) and c.get("type", "text") == "text")]
        return "".join(p for p in parts if isinstance(p, str))
    return None


class OpenAIChatLM:
    """A chat-completions client for OpenAI-compatible servers (OpenAI, vLLM, llama.cpp server, Ollama, ...).

    Stdlib only (``urllib.request``). Sends ``POST {base_url}/chat/completions`` with ``{"model", "messages", ...}`` and
    returns ``choices[0].message.content``. Thread-safe: one HTTP request per call, no shared state.

    Args:
        model: the model name the server expects (e.g. ``"gpt-4o-mini"``, ``"meta-llama/Llama-3.1-8B-Instruct"``).
        base_url: the API root including the version, as for the OpenAI SDK (default
            ``"https://api.openai.com/v1"``; vLLM ``"http://localhost:8000/v1"``, llama.cpp ``"http://localhost:8080/v1"``,
            Ollama ``"http://localhost:11434/v1"``).
        api_key: the bearer token (default None: read from the environment variable ``api_key_env``; when neither
            is set no ``Authorization`` header is sent, which local servers accept).
        api_key_env: the environment variable holding the key (default ``"OPENAI_API_KEY"``).
        system_prompt: an optional system message sent before each prompt (default None).
        temperature: sampling temperature (default 0.0; None leaves it to the server).
        max_tokens: cap on generated tokens (default None: the server's default).
        timeout: seconds per attempt, for connecting and for each read of the response (urllib semantics; default 60).
        max_retries: further attempts after a failure that may pass: HTTP 429 and 5xx, connection errors and
            timeouts (default 3). Other 4xx statuses are raised at once.
        backoff: seconds before the first retry, doubled each retry, ±20 % jitter (default 1.0); a ``Retry-After``
            header of a 429/503 is honoured up to ``max_backoff``.
        max_backoff: the longest wait between attempts in seconds (default 30).
        extra_body: more JSON fields for the request body (e.g. ``{"top_p": 0.9}``).
        headers: more HTTP headers.

    Raises:
        ValueError: at construction, for the OpenAI endpoint without an API key, or a bad setting.
        LMError: from a call, naming the model, the URL, the status and the server's message.
    """

    def __init__(self, model: str, base_url: str = DEFAULT_BASE_URL, *, api_key: str | None = None,
                 api_key_env: str = "OPENAI_API_KEY", system_prompt: str | None = None,
                 temperature: float | None = 0.0, max_tokens: int | None = None, timeout: float = 60.0,
                 max_retries: int = 3, backoff: float = 1.0, max_backoff: float = 30.0,
                 extra_body: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None) -> None:
        if not isinstance(model, str) or not model.strip():
            raise ValueError("model must be a non-empty string naming the model the server serves")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url={base_url!r} must start with http:// or https:// (e.g. "
                             "'http://localhost:8000/v1')")
        if timeout <= 0:
            raise ValueError(f"timeout={timeout} must be > 0 seconds")
        if max_retries < 0:
            raise ValueError(f"max_retries={max_retries} must be >= 0")
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        if not self.api_key and self.base_url.startswith("https://api.openai.com"):
            raise ValueError(f"no API key for {self.url}: set the environment variable {api_key_env} or pass api_key")
        self.system_prompt = system_prompt
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})

    @property
    def name(self) -> str:
        return self.model

    def __repr__(self) -> str:
        return f"OpenAIChatLM(model={self.model!r}, base_url={self.base_url!r})"

    def __call__(self, prompt: str) -> str:
        """Send ``prompt`` as one user message (after the system prompt, if any); return the reply text."""
        messages: list[dict[str, str]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": prompt})
        return self.chat(messages)

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Send chat ``messages`` (``[{"role": ..., "content": ...}, ...]``); return ``choices[0].message.content``."""
        body: dict[str, Any] = {"model": self.model, "messages": list(messages)}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(self.extra_body)
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json", **self.headers}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        where = f"LM {self.model!r} at {self.url}"
        attempts = self.max_retries + 1
        last: LMError | None = None
        for attempt in range(1, attempts + 1):
            wait: float | None = None
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                return self._parse(raw, where, attempt)
            except urllib.error.HTTPError as exc:
                message = _server_message(exc.read() or b"")
                last = LMError(f"{where}: HTTP {exc.code}: {message}", lm=self.model, url=self.url, status=exc.code,
                               server_message=message, attempts=attempt)
                if exc.code != 429 and exc.code < 500:
                    raise last from None
                wait = _retry_after(exc.headers.get("Retry-After") if exc.headers else None)
            except (TimeoutError, urllib.error.URLError, ConnectionError, http.client.HTTPException, OSError) as exc:
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                if isinstance(reason, TimeoutError):
                    what = f"timed out after {self.timeout:g} s"
                else:
                    what = f"connection failed ({type(reason).__name__}: {reason})"
                last = LMError(f"{where}: {what}", lm=self.model, url=self.url, attempts=attempt)
            if attempt < attempts:
                delay = self.backoff * 2 ** (attempt - 1) * random.uniform(0.8, 1.2)
                delay = min(self.max_backoff, wait if wait is not None else delay)
                logger.debug("%s (attempt %d of %d); retrying in %.2f s", last, attempt, attempts, delay)
                time.sleep(delay)
        assert last is not None
        raise LMError(f"{last} (gave up after {attempts} attempts)", lm=self.model, url=self.url, status=last.status,
                      server_message=last.server_message, attempts=attempts)

    def _parse(self, raw: bytes, where: str, attempt: int) -> str:
        snippet = raw[:300].decode("utf-8", errors="replace")
        try:
            body = json.loads(raw)
            content = body["choices"][0]["message"].get("content")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, TypeError, AttributeError):
            raise LMError(f"{where}: the response is not a chat completion (no choices[0].message.content): "
                          f"{snippet!r}", lm=self.model, url=self.url, status=200, attempts=attempt) from None
        text = _content_text(content)
        if text is None:
            raise LMError(f"{where}: choices[0].message.content is {type(content).__name__}, not text: {snippet!r}",
                          lm=self.model, url=self.url, status=200, attempts=attempt)
        return text


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


class LangChainLM:
    """Adapter for a LangChain chat model (duck-typed: ``model.invoke(messages).content``; no LangChain import).

    Args:
        chat_model: e.g. ``langchain_openai.ChatOpenAI(model="gpt-4o-mini")``.
        system_prompt: an optional system message (default None).
        name: how errors name this LM (default: the model's ``model_name``/``model`` attribute or its class name).
    """

    def __init__(self, chat_model: Any, system_prompt: str | None = None, name: str | None = None) -> None:
        if not callable(getattr(chat_model, "invoke", None)):
            raise TypeError(f"chat_model must have an invoke(messages) method (a LangChain chat model); got "
                            f"{type(chat_model).__name__}")
        self.chat_model = chat_model
        self.system_prompt = system_prompt
        self.name = name or str(getattr(chat_model, "model_name", None) or getattr(chat_model, "model", None)
                                or type(chat_model).__name__)

    def __call__(self, prompt: str) -> str:
        messages: list[tuple[str, str]] = [("system", self.system_prompt)] if self.system_prompt else []
        messages.append(("human", prompt))
        out = self.chat_model.invoke(messages)
        text = _content_text(getattr(out, "content", None))
        if text is None:
            raise LMError(f"LangChain model {self.name!r} returned {type(out).__name__} without a text .content",
                          lm=self.name)
        return text


class BatchedLM:
    """Marks a function that takes a list of prompts and returns one answer per prompt, in order.

    Args:
        fn: ``list[str] -> list[str]``.
        name: how errors name this LM (default: the function's name).
        max_batch_size: at most this many prompts per call (default None: all prompts of a phase in one call);
            chunks run concurrently on the loop's thread pool.
    """

    def __init__(self, fn: Callable[[list[str]], Sequence[str]], name: str | None = None,
                 max_batch_size: int | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable (list[str] -> list[str]); got {type(fn).__name__}")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1 (or None)")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.max_batch_size = max_batch_size

    def generate_batch(self, prompts: list[str]) -> list[str]:
        out = list(self.fn(list(prompts)))
        if len(out) != len(prompts):
            raise LMError(f"batched LM {self.name!r} returned {len(out)} answers for {len(prompts)} prompts",
                          lm=self.name)
        return out

    def __call__(self, prompt: str) -> str:
        return self.generate_batch([prompt])[0]


def batched(fn: Callable[[list[str]], Sequence[str]], name: str | None = None,
            max_batch_size: int | None = None) -> BatchedLM:
    """Shorthand for :class:`BatchedLM` (``batched(my_pipeline)``)."""
    return BatchedLM(fn, name=name, max_batch_size=max_batch_size)


class LMCaller:
    """Runs prompts of many queries through one LM on a shared executor; failures become :class:`LMError` values.

    Built by :func:`resolve_lm`; used by the CaLM loop.
    """

    def __init__(self, fn: Callable[[str], str] | None, batch: BatchedLM | Any | None, name: str, role: str) -> None:
        self._fn, self._batch, self.name, self.role = fn, batch, name, role

    def _wrap(self, exc: BaseException, query_index: int) -> LMError:
        if isinstance(exc, LMError):
            head = f"{self.role} LM failed on query {query_index}: {exc}"
            return LMError(head, lm=exc.lm or self.name, url=exc.url, status=exc.status,
                           server_message=exc.server_message, role=self.role, query_index=query_index,
                           attempts=exc.attempts)
        return LMError(f"{self.role} LM {self.name!r} failed on query {query_index}: {type(exc).__name__}: {exc}",
                       lm=self.name, role=self.role, query_index=query_index)

    def _check(self, out: Any, query_index: int) -> str | LMError:
        if isinstance(out, str):
            return out
        return LMError(f"{self.role} LM {self.name!r} returned {type(out).__name__} for query {query_index}; an LM "
                       "must return str", lm=self.name, role=self.role, query_index=query_index)

    def run(self, prompts: Sequence[str], query_indices: Sequence[int], pool: Executor) -> list[str | LMError]:
        """Answer ``prompts`` (of the queries ``query_indices``) concurrently; a failed prompt gives an LMError."""
        results: list[str | LMError] = []
        if self._batch is not None:
            size = getattr(self._batch, "max_batch_size", None) or max(1, len(prompts))
            chunks = [list(range(s, min(s + size, len(prompts)))) for s in range(0, len(prompts), size)]
            futures = [pool.submit(self._batch.generate_batch, [prompts[i] for i in c]) for c in chunks]
            results = [LMError("not run")] * len(prompts)
            for chunk, fut in zip(chunks, futures):
                try:
                    outs = fut.result()
                    if len(outs) != len(chunk):
                        raise LMError(f"batched LM {self.name!r} returned {len(outs)} answers for {len(chunk)} "
                                      "prompts", lm=self.name)
                    for i, out in zip(chunk, outs):
                        results[i] = self._check(out, query_indices[i])
                except Exception as exc:
                    for i in chunk:
                        results[i] = self._wrap(exc, query_indices[i])
            return results
        assert self._fn is not None
        singles: list[Future[str]] = [pool.submit(self._fn, p) for p in prompts]
        for qi, fut in zip(query_indices, singles):
            try:
                results.append(self._check(fut.result(), qi))
            except Exception as exc:
                results.append(self._wrap(exc, qi))
        return results


def resolve_lm(lm: Any, role: str) -> LMCaller:
    """Classify an LM object (see the module docstring) for the loop; ``role`` names it in errors.

    Raises:
        TypeError: ``lm`` is none of the accepted kinds.
    """
    if callable(getattr(lm, "generate_batch", None)):
        return LMCaller(None, lm, str(getattr(lm, "name", type(lm).__name__)), role)
    if isinstance(lm, ChatModel) and not isinstance(lm, (OpenAIChatLM, LangChainLM)):
        wrapped = LangChainLM(lm)
        return LMCaller(wrapped, None, wrapped.name, role)
    if callable(lm):
        name = getattr(lm, "name", None) or getattr(lm, "__name__", None) or type(lm).__name__
        return LMCaller(lm, None, str(name), role)
    raise TypeError(f"{role}_lm must be a callable prompt -> str, a BatchedLM (list[str] -> list[str]) or a LangChain "
                    f"chat model (an object with .invoke(messages)); got {type(lm).__name__}")
