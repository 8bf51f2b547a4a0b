"""The ``fastnli`` command line: export, checkpoint, predict, info, score, calm, alce, grounding, serve.

One module per subcommand (:mod:`~fastnli.cli.export`, :mod:`~fastnli.cli.predict`, :mod:`~fastnli.cli.score`,
:mod:`~fastnli.cli.calm`, :mod:`~fastnli.cli.serve`), each with ``add_parser``; what they share is in
:mod:`~fastnli.cli.common`. The CLI sits on top of the library: it imports the library, the library never imports it.
The benchmarks are not part of the installed CLI: run ``python -m bench`` in a source checkout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fastnli._version import __version__
from fastnli.cli import calm, export, predict, score, serve
from fastnli.cli.common import console, setup_logging

__all__ = ["build_parser", "main"]

#: ``fastnli --help``'s description: plain text (the module docstring is reStructuredText).
DESCRIPTION = ("fastnli: fast NLI consistency checks of LLM output. Commands: export, checkpoint, predict, info, "
               "score, calm, alce, grounding, serve; `fastnli COMMAND --help` for each.")


def build_parser() -> argparse.ArgumentParser:
    """The ``fastnli`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="fastnli", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"fastnli {__version__}")
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
        from rich.markup import escape

        # escape: rich would read "[serve]" in "pip install 'fastnli[serve]'" as markup and drop it
        console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
