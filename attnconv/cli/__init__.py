"""The `attnconv` command.

Each subcommand lives in its own module under `attnconv/cli/` and exposes
`register(subparsers)`, which adds its parser and sets `func` (a callable taking
the parsed args and returning an exit code). `main` dispatches and turns an
`AttnconvError` (or a bad flag) into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import re
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


# A comma-separated list that starts with a minus ("-1,0"): argparse would take it for an option.
_NEGATIVE_LIST = re.compile(r"^-[\d.]+(,-?[\d.]*)+$")


def join_negative_values(argv: list[str]) -> list[str]:
    """["--query", "-1,0"] -> ["--query=-1,0"]: the value reaches the option, whose check then
    says what is wrong with it (as for `--query=-1,0`), instead of argparse's "expected one argument"."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NEGATIVE_LIST.match(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the command in `argv` (default sys.argv[1:]); the exit status. Errors are one line on
    stderr: AttnconvError (a bad input, named with its fix) and, as a last resort, running out of
    memory or an operating-system error on a file, exit 2."""
    try:
        args = build_parser().parse_args(join_negative_values(sys.argv[1:] if argv is None else argv))
        return int(args.func(args) or 0)
    except AttnconvError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file the checks could not foresee (the disk filled up, a folder vanished)
        from attnconv.fileio import describe_os_error

        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{describe_os_error(err)}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as err:
        if not _out_of_memory(err):
            raise
        print("error: out of memory; give smaller sizes (see the command's --help for the options that set them)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _out_of_memory(err: BaseException) -> bool:
    """MemoryError, torch's OutOfMemoryError (CUDA), or the CPU allocator's failure (a RuntimeError)."""
    return (isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in str(err))
