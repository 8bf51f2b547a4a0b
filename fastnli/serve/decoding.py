"""Request bodies decoded from JSON and validated: small ones on the event loop, large ones in a worker process.

Decoding a 2 MB body holds the interpreter for tens of milliseconds (``json.loads`` of 90,000 escaped surrogates
takes ~70 ms on a 2-core EPYC), and a worker thread does not help: the decoder holds the GIL while it runs, so the
event loop and every other request wait. A body larger than ``inline_bytes`` is therefore decoded *and* validated in
a worker process; what comes back is either the small :class:`~fastnli.serve.payloads.ApiError` of a refused body or
the validated request, whose size the request limits bound (pairs per request, characters per text), so bringing it
back costs little. A body that kills its worker (out of memory) is refused with 413 and the worker is replaced.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from fastnli.serve.payloads import ApiError

__all__ = ["INLINE_BYTES", "BodyDecoder", "decode_json"]

logger = logging.getLogger("fastnli")

T = TypeVar("T")

#: Bodies up to this many bytes are decoded on the event loop (a 64 KiB body decodes in well under a millisecond).
INLINE_BYTES = 64 * 1024


def decode_json(body: bytes) -> Any:
    """``body`` decoded as JSON; :class:`ApiError` 422 for an empty, non-UTF-8, invalid or too deeply nested one."""
    if not body.strip():
        raise ApiError(422, "request body is empty; send a JSON object")
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise ApiError(422, "request body is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ApiError(422, f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") \
            from None
    except RecursionError:
        raise ApiError(422, "request body is nested too deeply to decode; send a flat JSON object") from None


def _decode_and_parse(parse: Callable[[Any], T], body: bytes) -> T:
    return parse(decode_json(body))


def _ready() -> bool:
    return True


class BodyDecoder:
    """Decodes and validates request bodies (``parse(decoded JSON)``), off the event loop when they are large.

    Args:
        processes: worker processes for bodies over ``inline_bytes`` (default 1; 0 decodes them on a worker thread,
            which keeps the event loop free of the validation but not of ``json.loads``).
        inline_bytes: the largest body decoded on the event loop (default :data:`INLINE_BYTES`).

    ``parse`` must be picklable when a process decodes: a module-level function or a :func:`functools.partial` of
    one. The pool starts on the first large body (or :meth:`start`) with the ``spawn`` method, so it holds no copy of
    the server's model or threads.
    """

    def __init__(self, processes: int = 1, inline_bytes: int = INLINE_BYTES) -> None:
        if processes < 0:
            raise ValueError(f"processes={processes} must be >= 0")
        self.processes = processes
        self.inline_bytes = inline_bytes
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self) -> BodyDecoder:
        """Start the worker processes now (they import the validation code once, about half a second)."""
        if self.processes:
            self._executor().submit(_ready)
        return self

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"))
            return self._pool

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is broken:
                self._pool = None
        broken.shutdown(wait=False, cancel_futures=True)

    async def parse(self, body: bytes, parse: Callable[[Any], T]) -> T:
        """``parse(json.loads(body))``: on the event loop up to ``inline_bytes``, else in a worker process (or
        thread). :class:`ApiError` from decoding or from ``parse`` propagates unchanged."""
        if len(body) <= self.inline_bytes:
            return _decode_and_parse(parse, body)
        if not self.processes:
            return await asyncio.to_thread(_decode_and_parse, parse, body)
        pool = self._executor()
        try:
            return await asyncio.wrap_future(pool.submit(_decode_and_parse, parse, body))
        except BrokenProcessPool:
            self._replace(pool)
            logger.warning("a %d-byte request body killed its decoder process; the process is replaced", len(body))
            raise ApiError(413, f"the request body ({len(body)} bytes) could not be decoded: its decoder process "
                                "ran out of memory; send a smaller request") from None

    def close(self) -> None:
        """Stop the worker processes once they finish the bodies they are decoding (queued ones are cancelled)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
