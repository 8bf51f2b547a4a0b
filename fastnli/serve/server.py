"""Running the app under uvicorn: in the foreground (``fastnli serve``) or in a background thread (tests, load runs).

Graceful shutdown (SIGTERM / Ctrl-C in the foreground, :meth:`BackgroundServer.stop` in a thread): uvicorn stops
accepting connections, lets every request in flight finish (up to ``config.graceful_timeout_s``, longer than the
request timeout, so every accepted request is answered), then the app's lifespan drains and stops the batcher.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from types import TracebackType
from typing import Any

from fastnli.engine.protocol import EngineLike
from fastnli.serve.app import EngineFactory, create_app
from fastnli.serve.config import ServeConfig

__all__ = ["BackgroundServer", "run_server"]

logger = logging.getLogger("fastnli")


def _uvicorn_config(app: Any, config: ServeConfig) -> Any:
    try:
        import uvicorn
    except ImportError:
        raise ImportError("fastnli serve needs uvicorn and starlette: pip install 'fastnli[serve]'") from None
    return uvicorn.Config(app, host=config.host, port=config.port, log_level="warning", access_log=False,
                          lifespan="on", timeout_graceful_shutdown=math.ceil(config.graceful_timeout_s), server_header=False)


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
    uv_config = _uvicorn_config(create_app(engine, cfg), cfg)
    import uvicorn

    sock = _bind(cfg.host, cfg.port)
    logger.info("fastnli serve listening on http://%s:%d (config: %s)", cfg.host, sock.getsockname()[1],
                cfg.as_dict())
    uvicorn.Server(uv_config).run(sockets=[sock])
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
        uv_config = _uvicorn_config(self.app, self.config)
        import uvicorn

        self._server = uvicorn.Server(uv_config)
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
        self._server.should_exit = True

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
