"""``fastnli serve``: an HTTP service over one NLI engine with dynamic batching across concurrent requests.

Endpoints: ``POST /v1/nli``, ``POST /v1/ncp``, ``POST /v1/calm/check``, ``POST /predict`` (text-embeddings-inference
compatible), ``GET /health``, ``/ready``, ``/info``, ``/metrics`` (Prometheus), ``/openapi.json``. Needs the
``serve`` extra (``pip install 'fastnli[serve]'``: starlette, uvicorn); :class:`ServeConfig` imports without it.

Modules: :mod:`~fastnli.serve.config` (settings), :mod:`~fastnli.serve.batcher` (bounded queue + engine thread),
:mod:`~fastnli.serve.app` (Starlette endpoints), :mod:`~fastnli.serve.metrics` (Prometheus text),
:mod:`~fastnli.serve.server` (uvicorn, foreground or background thread); the command line is
:mod:`fastnli.cli.serve`.
"""

from __future__ import annotations

from typing import Any

from fastnli.serve.config import ServeConfig

__all__ = ["BackgroundServer", "DynamicBatcher", "Overloaded", "ServeConfig", "ShuttingDown", "create_app",
           "run_server"]

_LAZY = {"BackgroundServer": "server", "run_server": "server", "create_app": "app", "DynamicBatcher": "batcher",
         "Overloaded": "batcher", "ShuttingDown": "batcher"}


def __getattr__(name: str) -> Any:
    """Import the starlette/uvicorn-backed names on first use (so ``ServeConfig`` needs neither)."""
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module(f"fastnli.serve.{_LAZY[name]}")
        except ImportError as exc:
            missing = (exc.name or "").split(".")[0]
            if missing not in ("starlette", "uvicorn"):
                raise
            raise ImportError(f"fastnli.serve.{name} needs {missing}: pip install 'fastnli[serve]'") from exc
        return getattr(module, name)
    raise AttributeError(f"module 'fastnli.serve' has no attribute {name!r}")
