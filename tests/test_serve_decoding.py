"""Request bodies decoded off the event loop: large ones in a worker process, with the same answers and refusals as
on the loop, and a worker killed by a body replaced."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
from functools import partial
from typing import Any

import pytest

from fastnli.serve.config import ServeConfig
from fastnli.serve.decoding import INLINE_BYTES, BodyDecoder
from fastnli.serve.payloads import ApiError, ncp_request, parse_pairs

CONFIG = ServeConfig(max_pairs_per_request=64, max_text_chars=4000, log_interval_s=0.0)


def pid_of(body: Any) -> tuple[int, int]:
    """The decoding process's id, and the number of pairs decoded."""
    return os.getpid(), len(body["pairs"])


def die(body: Any) -> None:
    os._exit(3)  # a worker killed while decoding (as by the out-of-memory killer)


def big(pairs: list[list[str]]) -> bytes:
    body = json.dumps({"pairs": pairs}).encode()
    assert len(body) > INLINE_BYTES
    return body


@pytest.fixture
def decoder() -> Any:
    d = BodyDecoder(processes=1)
    yield d
    d.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_api_error_pickles_whole() -> None:
    exc = ApiError(429, "busy", "Overloaded", {"Retry-After": "2"})
    back = pickle.loads(pickle.dumps(exc))
    assert (back.status, back.message, back.error_type, back.headers, str(back)) == \
        (429, "busy", "Overloaded", {"Retry-After": "2"}, "busy")


def test_large_body_is_decoded_in_another_process(decoder: BodyDecoder) -> None:
    pid, n = run(decoder.parse(big([["p" * 40, "h"]] * 2000), pid_of))
    assert n == 2000 and pid != os.getpid()
    assert run(decoder.parse(b'{"pairs": [["a", "b"]]}', pid_of)) == (os.getpid(), 1)  # small: on the loop


def test_worker_answers_equal_the_loop(decoder: BodyDecoder) -> None:
    pairs = [[f"premise {i} " + "x" * 1200, f"hypothesis {i}"] for i in range(60)]
    parse = partial(parse_pairs, config=CONFIG)
    inline = BodyDecoder(processes=1, inline_bytes=10**9)
    assert run(decoder.parse(big(pairs), parse)) == run(inline.parse(big(pairs), parse))
    ncp = partial(ncp_request, config=CONFIG)
    body = json.dumps({"response": "r", "sampled_responses": ["s" * 3000] * 30}).encode()
    assert len(body) > INLINE_BYTES
    batched, items = run(decoder.parse(body, ncp))
    assert not batched and items == run(inline.parse(body, ncp))[1]


@pytest.mark.parametrize(("body", "status", "message"), [
    (b'{"pairs": [' + b",".join([b'["\\ud800' + b"x" * 1200 + b'", "x"]'] * 60) + b"]}", 422,
     "pairs[0][0] (premise) is not valid UTF-8 text (lone surrogate at position 0); decode the source bytes with "
     "errors='replace' (or remove the character) before scoring"),
    (json.dumps({"pairs": [["premise", "hypothesis"]] * 5000}).encode(), 413, None),
    (b'{"pairs": [' + b'["a", "b"],' * 10000, 422, None),
])
def test_worker_refusals_equal_the_loop(decoder: BodyDecoder, body: bytes, status: int, message: str | None) -> None:
    parse = partial(parse_pairs, config=CONFIG)
    with pytest.raises(ApiError) as on_loop:
        run(BodyDecoder(processes=1, inline_bytes=10**9).parse(body, parse))
    with pytest.raises(ApiError) as in_worker:
        run(decoder.parse(body, parse))
    assert (in_worker.value.status, in_worker.value.message) == (on_loop.value.status, on_loop.value.message)
    assert in_worker.value.status == status
    if message is not None:
        assert in_worker.value.message == message


def test_a_body_that_kills_its_worker_is_refused_and_the_worker_replaced(decoder: BodyDecoder) -> None:
    body = big([["p" * 40, "h"]] * 2000)
    with pytest.raises(ApiError) as exc:
        run(decoder.parse(body, die))
    assert exc.value.status == 413
    assert exc.value.message == (f"the request body ({len(body)} bytes) could not be decoded: its decoder process "
                                 "ran out of memory; send a smaller request")
    assert run(decoder.parse(body, pid_of))[1] == 2000


def test_zero_processes_decodes_on_a_thread() -> None:
    pid, n = run(BodyDecoder(processes=0).parse(big([["p" * 40, "h"]] * 2000), pid_of))
    assert (pid, n) == (os.getpid(), 2000)
    with pytest.raises(ValueError, match=r"processes=-1 must be >= 0"):
        BodyDecoder(processes=-1)
    with pytest.raises(ValueError, match=r"decode_processes=-1 must be >= 0 \(set by --decode-processes or "
                                         r"FASTNLI_DECODE_PROCESSES\)"):
        ServeConfig(decode_processes=-1)
