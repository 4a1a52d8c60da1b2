"""The `attnconv` command.

Each subcommand lives in its own module under `attnconv/cli/` and exposes
`register(subparsers)`, which adds its parser and sets `func` (a callable taking
the parsed args and returning an exit code). `main` dispatches and turns an
`AttnconvError` (or a bad flag) into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from attnconv.errors import AttnconvError

# Subcommand modules, in the order `attnconv --help` lists them.
_COMMANDS = [
    "attnconv.cli.express",
    "attnconv.cli.train",
    "attnconv.cli.evaluate",
    "attnconv.cli.convert",
    "attnconv.cli.bench",
    "attnconv.cli.analyze",
    "attnconv.cli.report",
]


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad flags in one line (exit 2), like our other errors."""

    def error(self, message: str):  # noqa: D401
        raise AttnconvError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnconv", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in _COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except AttnconvError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
