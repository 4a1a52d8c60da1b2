"""The `attnconv` command.

Each subcommand lives in its own module under `attnconv/cli/` and exposes
`register(subparsers)`, which adds its parser and sets `func` (a callable taking
the parsed args and returning an exit code). `main` dispatches and turns an
`AttnconvError` (or a bad flag) into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import functools
import importlib
import math
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from attnconv.cli.placement import (
    chosen_parsers,
    misplaced,
    unknown_options,
    valued_option_before_its_command,
)
from attnconv.errors import AttnconvError, AttnconvWarning, Interrupted, ParameterError, shown_before, warnings_shown
from attnconv.streams import unwrap
from attnconv.tables import one_line

# Subcommand modules, in the order `attnconv --help` lists them.
_COMMANDS = [
    "attnconv.cli.express",
    "attnconv.cli.train",
    "attnconv.cli.evaluate",
    "attnconv.cli.convert",
    "attnconv.cli.bench",
    "attnconv.cli.plot",
    "attnconv.cli.analyze",
    "attnconv.cli.learnconv",
    "attnconv.cli.report",
    "attnconv.cli.predict",
    "attnconv.cli.export",
]


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad flags in one line (exit 2), like our other errors."""

    def error(self, message: str):  # noqa: D401
        raise AttnconvError(f"{self.prog}: {message} (see `{self.prog} --help`)")

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """argparse's, with arguments no command takes said by the command given (`attnconv table: unrecognized
        arguments: --json`), whose --help lists what it takes, not by the top level."""
        argv = list(sys.argv[1:] if args is None else args)
        try:
            parsed, extras = self.parse_known_args(argv, namespace)
        except AttnconvError as err:  # `attnconv --device cpu eval RUN`: argparse read `cpu` as the command's name
            said = valued_option_before_its_command(self, argv)
            if said is None and "arguments are required" in str(err):  # `attnconv eval -x`: the -x, not RUN_DIR
                said = unknown_options(self, argv)
            if said is None:
                raise
            raise AttnconvError(said) from None
        if extras:
            chosen = chosen_parsers(self, parsed)
            for extra in extras:  # an option of a command given before its name (`attnconv --json eval RUN`)
                taker = misplaced(argv, chosen, parsed, extra)
                if taker is not None:
                    raise AttnconvError(f"{self.prog}: {extra} is an option of `{taker.prog}`, given before its name: "
                                        f"put it after `{taker.prog}` (see `{taker.prog} --help`)")
            chosen[-1].error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _print_message(self, message: str, file: Any = None) -> None:
        """argparse's, without its silence on a failed write: `--help > /dev/full` is said, as for commands."""
        if message:
            (file or sys.stderr).write(message)


# The range of every numeric flag that is not a config field (inclusive, by argparse dest); the
# config fields' flags take theirs from the fields (`attnconv.options`). `ranges()` merges both and
# `check_ranges` checks them before a command does any work; tests/test_bad_inputs.py checks that no
# int or float flag is missing. Commands check finer rules (e.g. an odd kernel) themselves.
_CLI_RANGES: dict[str, tuple[float, float]] = {  # alpha's top: construct.bound.MAX_ALPHA, a converted layer's
    "dim": (1, 3), "log_every": (1, 10**12), "alpha": (1e-9, 1e4), "memory_budget_gb": (1e-6, 1e6),
    "images": (1, 2**20), "eval_images": (1, 10**9), "image": (0, 10**9), "layer": (1, 10**4),
    "zoom": (1, 10**4), "kernel": (1, 99), "steps": (0, 10**9), "top": (1, 10**6),
    "channels": (1, 65536), "size": (1, 8192), "port": (0, 65535), "epoch": (0, 10**6),
}


@functools.cache
def ranges() -> dict[str, tuple[float, float]]:
    """{argparse dest: (low, high)} of every numeric flag: the config fields' and the others'."""
    from attnconv.config import InitFrom, TrainConfig
    from attnconv.models import MODEL_CONFIGS
    from attnconv.options import field_ranges

    fields = field_ranges(TrainConfig, InitFrom, *MODEL_CONFIGS)
    both = sorted(set(fields) & set(_CLI_RANGES))
    if both:
        raise RuntimeError(f"ranges written twice: {both}")
    return {**_CLI_RANGES, **fields}


def numeric_flags(parser: argparse.ArgumentParser, command: tuple[str, ...] = ()):
    """(command, action) for every flag of `parser` and its subcommands whose type is int or float."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from numeric_flags(sub, (*command, name))
        elif action.type in (int, float):
            yield command, action


def check_ranges(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Every numeric flag given is within its RANGES entry; --device names a device that exists here."""
    for _, action in numeric_flags(parser):
        value = getattr(args, action.dest, None)
        # One dest may be a list in another command (express --size 12,12): only numbers are checked.
        if not isinstance(value, (int, float)) or isinstance(value, bool) or action.dest not in ranges():
            continue
        lo, hi = ranges()[action.dest]
        below = type(hi).__name__ == "Below"  # the field's range excludes its upper end
        if not (math.isfinite(value) and lo <= value and (value < hi if below else value <= hi)):
            flag = action.option_strings[-1] if action.option_strings else action.dest
            kind = "a whole number" if action.type is int else "a number"
            low, high = (str(int(n)) if action.type is int and float(n).is_integer() else f"{n:g}" for n in (lo, hi))
            span = f">= {low} and below {high}" if below else f"from {low} to {high}"
            raise AttnconvError(f"{flag} {value} is out of range: give {kind} {span}")
    if getattr(args, "device", None) is not None:
        from attnconv.precision import check_device

        check_device(args.device)
    chosen = [a for p in chosen_parsers(parser, args) for a in p._actions]
    for action in chosen:  # "" is no path or name: "$RUN" of an unset variable
        value = getattr(args, action.dest, None)
        if value == "" or (isinstance(value, list) and "" in value):
            name = action.option_strings[-1] if action.option_strings else action.metavar or action.dest.upper()
            raise AttnconvError(f"{name} '' is empty (an unset variable?); give a value (an empty path is not read "
                                "as the current folder)")


def build_parser() -> argparse.ArgumentParser:
    import attnconv

    parser = _Parser(prog="attnconv", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"attnconv {attnconv.__version__}")
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
    memory or an operating-system error on a file, exit 2. Ctrl-C at any moment is one line and exit
    130: the commands' modules (and torch) are imported in here, and when `main` is the process's
    command (no `argv`, as `attnconv` and `python -m attnconv` call it), a Ctrl-C after it returns,
    while the interpreter shuts down, exits at once with the same line."""
    process = argv is None
    try:
        with _wrapped_streams():
            try:
                return _run(argv, process)
            except KeyboardInterrupt as err:  # train's says the step and how to resume (errors.Interrupted)
                if process and threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second SIGINT while this is said (`timeout -s
                    # INT` sends the group one too) raised out of this handler, a traceback: the exit is 130 already
                print(one_line(err.as_flag() if isinstance(err, Interrupted) else str(err)) or "interrupted",
                      file=sys.stderr)
                _said.append(True)  # a second SIGINT after it (`timeout -s INT` sends one to the group too): nothing
                return 130
    finally:
        if process:
            _exit_on_interrupt()


_STREAMS_LOCK = threading.Lock()
_streams: dict = {"users": 0, "saved": None}


@contextlib.contextmanager
def _wrapped_streams() -> Iterator[None]:
    """sys.stdout named in errors (`_NamedStdout`) and sys.stderr forgiving (`_ForgivingStderr`) while any thread is
    inside `main`: the first to enter wraps them, the last to leave puts back what was there (unless something else
    replaced them meanwhile), so that threads calling `main` at once never put back each other's wrappers."""
    with _STREAMS_LOCK:
        if _streams["users"] == 0:
            if sys.stderr is None:  # started with stderr closed (`2>&-`): print(file=None) would write to stdout
                sys.stderr = open(os.devnull, "w")  # noqa: SIM115  (the process's stderr from now on)
            wrappers = (None if sys.stdout is None else _NamedStdout(sys.stdout), _ForgivingStderr(sys.stderr))
            _streams["saved"] = wrappers
            if wrappers[0] is not None:
                sys.stdout = wrappers[0]
            sys.stderr = wrappers[1]
        _streams["users"] += 1
    try:
        yield
    finally:
        with _STREAMS_LOCK:
            _streams["users"] -= 1
            if _streams["users"] == 0:  # taken out wherever they sit (an export's may have wrapped them meanwhile)
                for name, wrapper in zip(("stdout", "stderr"), _streams["saved"]):
                    if wrapper is not None:
                        unwrap(name, wrapper)


def command() -> None:
    """The process's command (`attnconv`, `python -m attnconv`): `main`, then the end the interpreter would give it
    (non-daemon threads joined, atexit functions run, the streams flushed), then exit with its status at once. The
    interpreter's own teardown after that (a second or so of unloading torch) is skipped: there Python gives SIGINT
    back its default action, so a Ctrl-C killed the process with status 130 and no line, after a whole answer.
    Where a stream cannot be flushed, the interpreter ends as it would (and says so)."""
    status = main()
    try:
        threading._shutdown()  # what Python does first at exit; Ctrl-C meanwhile is `_interrupted_exit`'s
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:  # noqa: BLE001  (a stream closed or full: the interpreter's own exit reports it)
        raise SystemExit(status) from None
    os._exit(status)


def _exit_on_interrupt() -> Callable | None:
    """From now on SIGINT ends the process at once with `interrupted`, exit 130, and no Python code of
    the process runs again; the handler it replaces, or None where it left SIGINT alone: ignored (a
    background job), handled by someone else, or this is not the main thread.

    Used where a KeyboardInterrupt cannot be relied on: while torch and numpy import (torch's
    extension imports numpy from C and discards an exception raised meanwhile, leaving numpy half
    imported and the command going on to fail later with an AttributeError), and after the command,
    while the interpreter shuts down (threads joined, atexit functions). Neither writes a file."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        return None
    signal.signal(signal.SIGINT, _interrupted_exit)
    return previous


@contextlib.contextmanager
def _interrupts_not_lost() -> Iterator[None]:
    """A Ctrl-C whose KeyboardInterrupt lands where Python cannot raise it (a weakref callback or a `__del__`, as
    the garbage collector runs) was printed as "Exception ignored in ..." with its traceback, and the command went
    on to exit 0. Here it is raised again at the command's next call or return (a profile function set for that
    one event; a profiler in place before is put back), and nothing is printed for it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not (isinstance(unraisable.exc_type, type) and issubclass(unraisable.exc_type, KeyboardInterrupt)
                and threading.current_thread() is threading.main_thread()):
            previous(unraisable)
            return
        profiler = sys.getprofile()

        def deliver(frame: Any, event: str, arg: Any) -> None:
            if frame.f_code is not hook.__code__:  # the hook's own return: not yet
                sys.setprofile(profiler)
                raise KeyboardInterrupt

        sys.setprofile(deliver)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


# Whether this process has said `interrupted` already (`main`): one Ctrl-C, one line.
_said: list[bool] = []


def _interrupted_exit(signum: int, frame: object) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or the reader left
            pass
    if not _said:
        with contextlib.suppress(OSError):  # stderr full or gone: the exit status says it
            os.write(2, b"interrupted\n")
    os._exit(130)


class _Stream:
    """A stream standing in for sys.stdout or sys.stderr during a command: everything but what the subclass
    changes is the wrapped stream's own."""

    def __init__(self, stream: Any):
        self._stream, self._done = stream, False  # done: taken out (`streams.unwrap`), or put back by a user's capture

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _NamedStdout(_Stream):
    """sys.stdout during a command: an OSError writing it (`attnconv export RUN > /dev/full`) names "standard
    output" as its file, so the error line says where the disk is full."""

    def write(self, text: str) -> int:
        if self._done:
            return self._stream.write(text)
        try:
            return self._stream.write(text)
        except OSError as err:
            raise _named_stdout(err) from None
        except UnicodeEncodeError:  # a character its encoding lacks (PYTHONIOENCODING=ascii): said as an escape
            encoding = getattr(self._stream, "encoding", None) or "ascii"
            return self._stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
        except ValueError:  # "I/O operation on closed file": a caller's sys.stdout closed before `main`
            if not getattr(self._stream, "closed", False):
                raise
            raise AttnconvError(_STDOUT_CLOSED) from None

    def flush(self) -> None:
        if self._done:
            return self._stream.flush()
        try:
            self._stream.flush()
        except OSError as err:
            raise _named_stdout(err) from None
        except ValueError:
            if not getattr(self._stream, "closed", False):
                raise
            raise AttnconvError(_STDOUT_CLOSED) from None


_STDOUT_CLOSED = "standard output is closed; give the command an open one (a file, a pipe)"


class _ForgivingStderr(_Stream):
    """sys.stderr during a command: a write or flush that fails (`2>/dev/full`, a pipe whose reader left) is
    dropped, so that a progress line, a warning or the `preset:` line cannot stop the work (train stopped at its
    first line, taking the failed write for a full disk of the run's); what cannot be said is lost either way."""

    def write(self, text: str) -> int:
        if self._done:
            return self._stream.write(text)
        try:
            return self._stream.write(text)
        except (OSError, ValueError):  # ValueError: the stream was closed
            return len(text)

    def flush(self) -> None:
        if self._done:
            return self._stream.flush()
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()


def _named_stdout(err: OSError) -> OSError:
    return err if err.filename else OSError(err.errno, err.strerror, "standard output")  # EPIPE: BrokenPipeError


# The commands whose answer is what they print (the others write files, and print where they did).
_ANSWERS = frozenset({"eval", "table", "compare", "analyze", "predict", "express"})


def _run(argv: list[str] | None, process: bool) -> int:
    try:
        previous = _exit_on_interrupt() if process else None
        import numpy  # noqa: F401  (see _exit_on_interrupt: the imports that must not be interrupted)
        import torch  # noqa: F401

        parser = build_parser()
        if previous is not None:  # the command's own code: Ctrl-C is a KeyboardInterrupt it may clean up after
            signal.signal(signal.SIGINT, previous)
        try:
            args = parser.parse_args(join_negative_values(sys.argv[1:] if argv is None else argv))
        except SystemExit as done:  # --help: what it printed must reach stdout (a full one is said, as for commands)
            if done.code in (0, None) and sys.stdout is not None:
                sys.stdout.flush()
            raise
        check_ranges(args, parser)
        answers = args.command in _ANSWERS or (args.command == "bench" and not (getattr(args, "json", None)
                                                                               or getattr(args, "markdown", None)))
        if sys.stdout is None and answers:  # `>&-`: the answer would go nowhere, with exit 0
            raise AttnconvError(f"standard output is closed, and `attnconv {args.command}` answers there; give it "
                                "somewhere to go (`> FILE`, or a pipe)")
        # Each command says its warnings, as a new process would: Python's once-per-line registries are made stale (what
        # `catch_warnings` did on entry), without swapping the process's filter list or showwarning, which threads
        # calling main at once put back in each other's places; each thread's warnings go to its own showwarning.
        getattr(warnings, "_filters_mutated", lambda: None)()  # CPython's; where it is missing, registries stay
        with warnings_shown(_show_warning, every=True), _interrupts_not_lost():
            code = int(args.func(args) or 0)
            if sys.stdout is not None:  # the answer out before the status says it was given (a full disk: 2)
                sys.stdout.flush()
            return code
    except ParameterError as err:  # the library names the parameter (epochs); the command line, its flag (--epochs)
        print(f"error: {one_line(err.as_flag())}", file=sys.stderr)
        return 2
    except AttnconvError as err:
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `attnconv eval RUN | head`: the reader left; stop quietly, as `cat` does
        devnull = os.open(os.devnull, os.O_WRONLY)
        with contextlib.suppress(AttributeError, OSError, ValueError):  # a stream without a descriptor: nothing to do
            os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush of stdout must not fail again
        os.close(devnull)
        return 141  # 128 + SIGPIPE
    except OSError as err:  # a file the checks could not foresee (the disk filled up, a folder vanished)
        from attnconv.fileio import describe_os_error

        name = str(err.filename or "")  # a path from a file may be long: its ends say which it is
        where = f"{name if len(name) <= 200 else name[:120] + '...' + name[-77:]}: " if name else ""
        if err.errno == errno.EACCES:  # what blocks: a folder on the way, the file, or its folder's writing
            from attnconv.fileio import permission_fix, permission_words

            why = f"{permission_words(name) if name else 'permission denied'}; {permission_fix(name or None)}"
        else:
            why = describe_os_error(err)
        print(f"error: {one_line(where + why)}", file=sys.stderr)
        return 2
    except ValueError as err:  # a closed sys.stdout put in while the command ran (its own is wrapped: `_NamedStdout`)
        if not getattr(sys.stdout, "closed", False) or "closed file" not in str(err):
            raise
        print(f"error: {_STDOUT_CLOSED}", file=sys.stderr)
        return 2
    except Warning as err:  # a warning the filters given (-W error, PYTHONWARNINGS) made an error: one line too
        print(f"error: {one_line(f'{type(err).__name__}: {err}')} (a warning, made an error by the warning filters "
              "given)", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001  (re-raised unless it is one of the two below)
        if _interrupt_inside(err):  # Python 3.11 wraps one landing in a __set_name__ (an import) in a RuntimeError
            raise KeyboardInterrupt from None
        if not isinstance(err, (MemoryError, RuntimeError)) or not _out_of_memory(err):
            raise
        print("error: out of memory; give smaller sizes (see the command's --help for the options that set them)",
              file=sys.stderr)
        return 2


def _interrupt_inside(err: BaseException) -> bool:
    """Whether a Ctrl-C's KeyboardInterrupt is among the causes of `err` (code it landed in wrapped it)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


# Characters that are not printable as escapes: control characters (C0, DEL, C1), and Unicode's invisible and
# layout ones (zero-width spaces, direction overrides, line and paragraph separators, lone surrogates). A file
# name or a class name holding one must not split the one line a message is, act on the terminal, read as
# another name, or fail to print.
def escaped(value: Any) -> Any:
    """`value` with every string in it (dicts, lists, tuples, at any depth) as `one_line` shows it: what a command
    formats into a table from a run's files (a run folder, a dataset), escaped before the table is made, so a newline
    in a name cannot split a row. The table is then printed as it is (escaping it again would double backslashes)."""
    if isinstance(value, str):
        return one_line(value)
    if isinstance(value, dict):
        return {k: escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(escaped(v) for v in value)
    return value


def plain(text: str) -> str:
    """`text` as lines of plain text: each line's control characters shown as escapes (`one_line`), the
    newlines between lines kept. What a command prints to stdout from a run's files (class names, the
    dataset) goes through it, so that a terminal escape in a file never acts on the terminal."""
    return "\n".join(one_line(line) for line in text.split("\n"))


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """AttnconvWarnings as one `warning:` line on stderr; any other warning as Python shows it."""
    if issubclass(category, AttnconvWarning):
        print(f"warning: {one_line(str(message))}", file=sys.stderr)
    else:
        shown_before()(message, category, filename, lineno, file, line)


def _out_of_memory(err: BaseException) -> bool:
    """MemoryError, torch's OutOfMemoryError (CUDA), or the CPU allocator's failure (`limits.out_of_memory`)."""
    from attnconv.limits import out_of_memory

    return out_of_memory(err)
