"""``fastnli serve``: the HTTP service (needs ``pip install 'fastnli[serve]'``).

Every :class:`~fastnli.serve.config.ServeConfig` field has a flag (``--max-wait-ms`` for ``max_wait_ms``); a flag left
out keeps the ``FASTNLI_*`` environment value or the default. Importing this module needs neither starlette nor
uvicorn (the ``fastnli`` CLI imports it to add the subcommand).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Any

from fastnli.cli.common import add_engine_arguments, engine_from_args
from fastnli.serve.config import ENV_VARS, ServeConfig

logger = logging.getLogger("fastnli")

_HELP = {
    "host": "bind address (default 127.0.0.1: loopback only)",
    "port": "TCP port (default 8080; 0 = a free one)",
    "max_wait_ms": "ms the first request of an idle engine waits for others to share its pass (default 0)",
    "max_pass_pairs": "most pairs per engine pass (default 512; 1 with --max-wait-ms 0 = one request at a time)",
    "max_pass_tokens": "padded-token budget per engine pass, pairs x longest (default: 2x the engine's batch budget)",
    "queue_size": "most requests waiting for an engine pass; more get 429 (default 256)",
    "max_queued_pairs": "most pairs waiting for an engine pass; more get 429 (default 8192)",
    "max_pairs_per_request": "most NLI pairs one request may need; more get 413 (default 256)",
    "max_text_chars": "most characters per text; more get 413 (default 10000)",
    "max_body_bytes": "most bytes per request body; more get 413 (default 2000000)",
    "request_timeout_s": "seconds a request waits for its result before 504 (default 30)",
    "retry_after_s": "Retry-After seconds of a 429 (default 1)",
    "shutdown_timeout_s": "seconds a graceful shutdown (SIGTERM) may take; 503 to new requests meanwhile (default 20)",
    "log_interval_s": "seconds between INFO traffic summaries (default 60; 0 = none)",
    "max_queue_seconds": "most estimated seconds of engine work a request may queue behind, its own included; more "
                         "get 429 + Retry-After at once (default 0.75)",
    "initial_tokens_per_s": "engine speed assumed until measured, estimated tokens/s (default 2000)",
    "api_key": "require 'Authorization: Bearer KEY' on every route but /health and /ready (default: none)",
    "decode_processes": "worker processes that decode request bodies over 64 KiB (default 1; 0 = a thread)",
}


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_engine_arguments(p)
    kinds: dict[str, Any] = {"host": str, "port": int, "max_wait_ms": float, "max_pass_pairs": int,
                             "max_pass_tokens": int, "queue_size": int, "max_queued_pairs": int,
                             "max_pairs_per_request": int, "max_text_chars": int, "max_body_bytes": int,
                             "request_timeout_s": float, "retry_after_s": int, "shutdown_timeout_s": float,
                             "log_interval_s": float, "max_queue_seconds": float, "initial_tokens_per_s": float,
                             "api_key": str, "decode_processes": int}
    for f in dataclasses.fields(ServeConfig):
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f"serve_{f.name}", type=kinds[f.name], default=None,
                       metavar={"initial_tokens_per_s": "RATE"}.get(f.name, f.name.split("_")[-1].upper()),
                       help=f"{_HELP[f.name]}; env {ENV_VARS[f.name]}")


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """``ServeConfig()`` (environment and defaults) with the flags given on the command line applied."""
    given = {f.name: getattr(args, f"serve_{f.name}") for f in dataclasses.fields(ServeConfig)
             if getattr(args, f"serve_{f.name}", None) is not None}
    return dataclasses.replace(ServeConfig(), **given)


def _run(args: argparse.Namespace) -> int:
    from fastnli.serve import run_server

    config = config_from_args(args)
    if config.host not in ("127.0.0.1", "localhost", "::1") and config.api_key is None:
        logger.warning("binding to %s without an API key (--api-key or %s): anyone who reaches the port can use the "
                       "service; set one, or expose it only behind a proxy you control", config.host,
                       ENV_VARS["api_key"])
    run_server(lambda: engine_from_args(args), config)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``fastnli serve`` to the subcommands."""
    p = sub.add_parser("serve", help="HTTP service: /v1/nli, /v1/ncp, /v1/calm/check, TEI /predict, with dynamic "
                       "batching")
    _add_arguments(p)
    p.set_defaults(func=_run)
