"""The ``fastnli`` command line: export, checkpoint, predict, info, score, calm, alce, serve.

One module per subcommand (:mod:`~fastnli.cli.export`, :mod:`~fastnli.cli.predict`, :mod:`~fastnli.cli.score`,
:mod:`~fastnli.cli.calm`, :mod:`~fastnli.cli.serve`), each with ``add_parser``; what they share is in
:mod:`~fastnli.cli.common`. The CLI sits on top of the library: it imports the library, the library never imports it.
The benchmarks are not part of the installed CLI: run ``python -m bench`` in a source checkout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fastnli.cli import calm, export, predict, score, serve
from fastnli.cli.common import console, setup_logging

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``fastnli`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="fastnli", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (export, predict, score, calm, serve):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``fastnli`` with ``argv`` (default: the process arguments); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    try:
        return int(args.func(args))
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, ImportError) as exc:
        console(stderr=True).print(f"[red]error:[/red] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
