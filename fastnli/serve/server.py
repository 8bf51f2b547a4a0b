"""Running the app under uvicorn: in the foreground (``fastnli serve``) or in a background thread (tests, load runs).

Graceful shutdown (SIGTERM / Ctrl-C in the foreground, :meth:`BackgroundServer.stop` in a thread), within
``config.graceful_timeout_s`` (default 20 s, below Kubernetes' 30 s): the service keeps listening but answers 503
(``Retry-After``) to every new request and ``/ready`` turns 503, while the requests already begun are answered; when
they are all answered (or 2 s before the grace ends, when those still waiting — a slow client's body, a queued job —
get 503) uvicorn closes the socket and the connections, the app's lifespan stops the batcher, and the process exits
with code 0. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from types import FrameType, TracebackType
from typing import Any

from fastnli.engine.protocol import EngineLike
from fastnli.serve.app import EngineFactory, create_app
from fastnli.serve.config import ServeConfig

__all__ = ["BackgroundServer", "run_server"]

logger = logging.getLogger("fastnli")


#: Seconds of the grace kept for uvicorn to close connections and for the lifespan to stop the batcher.
_CLOSE_S = 2


def _uvicorn_server(app: Any, config: ServeConfig) -> Any:
    """A uvicorn server whose first SIGTERM/SIGINT drains the app (see the module docstring)."""
    try:
        import uvicorn
    except ImportError:
        raise ImportError("fastnli serve needs uvicorn and starlette: pip install 'fastnli[serve]'") from None

    class _DrainingServer(uvicorn.Server):  # type: ignore[misc]
        _loop: asyncio.AbstractEventLoop | None = None
        _draining = False

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            self._loop = asyncio.get_running_loop()
            await super().startup(sockets)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # the signal is not re-raised after the shutdown (uvicorn's default): a drained exit is a clean exit (0)
            if self._draining:
                self.should_exit = self.force_exit = True
            else:
                self.drain()

        def drain(self) -> None:
            """Begin the graceful shutdown (thread-safe; idempotent)."""
            if self._draining:
                return
            self._draining = True
            if self._loop is None or self._loop.is_closed():
                self.should_exit = True
                return
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

        async def _drain(self) -> None:
            await app.state.serve.drain(config.graceful_timeout_s - _CLOSE_S)
            self.should_exit = True

    return _DrainingServer(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                          access_log=False, lifespan="on", timeout_graceful_shutdown=_CLOSE_S,
                                          server_header=False))


def _bind(host: str, port: int) -> socket.socket:
    """A bound TCP listening socket. ``proto=IPPROTO_TCP`` matters: asyncio sets ``TCP_NODELAY`` only on accepted
    sockets whose ``proto`` says TCP, and without it Nagle's algorithm holds the response body (written after the
    headers) until the client's delayed ACK — about 40 ms per request on a reused keep-alive connection."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def run_server(engine: EngineLike | EngineFactory, config: ServeConfig | None = None) -> None:
    """Serve in the foreground until SIGTERM/SIGINT, then shut down gracefully (see the module docstring)."""
    cfg = config or ServeConfig()
    app = create_app(engine, cfg)
    app.state.serve.decoder.start()  # the body decoder's process starts with the server, not with the first 2 MB body
    server = _uvicorn_server(app, cfg)
    sock = _bind(cfg.host, cfg.port)
    logger.info("fastnli serve listening on http://%s:%d (config: %s)", cfg.host, sock.getsockname()[1],
                cfg.as_dict())
    server.run(sockets=[sock])
    logger.info("fastnli serve stopped")


class BackgroundServer:
    """The service on a loopback socket in a daemon thread: ``with BackgroundServer(engine, cfg) as s: s.url``.

    Args:
        engine: an engine or a factory, as :func:`fastnli.serve.create_app`.
        config: settings; ``config.host`` and ``config.port`` are used for the socket (port 0 picks a free one,
            read back from :attr:`port`).
    """

    def __init__(self, engine: EngineLike | EngineFactory, config: ServeConfig | None = None) -> None:
        self.config = config or ServeConfig(host="127.0.0.1", port=0)
        self.app = create_app(engine, self.config)
        self._server = _uvicorn_server(self.app, self.config)
        self._sock = _bind(self.config.host, self.config.port)
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="fastnli-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def state(self) -> Any:
        """The app's :class:`~fastnli.serve.app.ServeState`."""
        return self.app.state.serve

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        """Start serving; returns once uvicorn listens (raises RuntimeError after ``timeout`` seconds)."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start within {timeout} s")
            time.sleep(0.01)
        return self

    def request_stop(self) -> None:
        """Begin a graceful shutdown (what SIGTERM does) without waiting."""
        self._server.drain()

    def stop(self, timeout: float | None = None) -> bool:
        """Shut down gracefully; True when the server thread ended within ``timeout`` (default: the config's
        graceful timeout + 10 s)."""
        self.request_stop()
        self._thread.join(self.config.graceful_timeout_s + 10.0 if timeout is None else timeout)
        return not self._thread.is_alive()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
