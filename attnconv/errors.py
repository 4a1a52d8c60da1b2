"""The one exception type for mistakes a user can make (bad path, bad config, bad shape).

The CLI prints its message on one line and exits with status 2, without a traceback.
It subclasses ValueError so library callers can catch it as the usual type. A `ParameterError`
names the bad argument by its parameter, which the CLI shows as its flag.
"""

import contextlib
import functools
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from types import FrameType


class AttnconvError(ValueError):
    """A user-facing error: the message names the bad input and how to fix it."""


class DamagedFile(AttnconvError):
    """A file a command reads that is unsound (corrupt, unreadable, not a regular file). The message is `head; fix`:
    `head` names the file and what is wrong with it, `fix` how to mend it. `reason` is what is wrong alone (the
    `X` of `corrupt run config (X)`; `head` where not given), for a caller that words its own line
    (`runs.directory.run_config`); `with_fix` is the same error with a fix the caller knows better (a resume's,
    `runs.directory.trim_logs`)."""

    def __init__(self, head: str, fix: str, *, reason: str | None = None):
        super().__init__(f"{head}; {fix}")
        self.head, self.fix = head, fix
        self.reason = head if reason is None else reason

    def with_fix(self, fix: str) -> "DamagedFile":
        return type(self)(self.head, fix, reason=self.reason)


class ParameterError(AttnconvError):
    """A bad argument, named as the caller gave it: from Python its parameter (`out /x is a file; give a
    directory`), from the command line its flag (`as_flag`: `--out /x is a file; give a directory`).

    The message is `name`, the value as `shown` (default str(value); "" leaves it out), then `rest`.
    `rest` may name the parameters in `mentions` as `{name}` (`pass {resume} to continue it`), said
    the same way; `flags` maps a parameter to its flag where that is not the name with dashes
    ({"out": "export"}). `name` None: the message is `rest` alone, about no one argument but naming
    the parameters that fix it (`loss became non-finite ...; lower {lr}`).
    """

    def __init__(self, name: str | None, value: object, rest: str, *, shown: str | None = None,
                 mentions: tuple[str, ...] = (), flags: dict[str, str] | None = None):
        self.name, self.value, self.rest, self.mentions = name, value, rest, tuple(mentions)
        self.shown = str(value) if shown is None else shown
        self.flags = dict(flags or {})
        super().__init__(self._render(lambda n: n))

    @property
    def flag(self) -> str | None:
        """The command line's flag for `name`, without the dashes (None without a `name`)."""
        return None if self.name is None else self.flags.get(self.name, self.name.replace("_", "-"))

    def as_flag(self) -> str:
        """The message as the command line says it, every parameter as its flag."""
        return self._render(lambda n: "--" + self.flags.get(n, n.replace("_", "-")))

    def _render(self, word: Callable[[str], str]) -> str:
        rest = _mention(self.rest, self.mentions, word)
        if self.name is None:
            return rest
        head = f"{word(self.name)} {self.shown}" if self.shown else word(self.name)
        return f"{head}{'' if rest[:1] in (':', ';', ',') else ' '}{rest}"

    def __reduce__(self):  # pickled whole (torch.distributed gathers errors): __init__ takes other arguments
        return _restore, (type(self), self.args, self.__dict__)


def _restore(cls: type, args: tuple, state: dict) -> BaseException:
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class AttnconvWarning(UserWarning):
    """Something a command worked around and says so (a damaged line skipped); the CLI prints it as one
    `warning:` line."""


# The modules the notes `warnings_ignored` quiets are said from (torch's and Pillow's, or attnconv's line calling them):
# filters are process-wide, and another thread's own warnings meanwhile must still be said.
_QUIETED = re.compile(r"(torch|PIL)(\.|$)|attnconv\.(runs\.files|data\.\w+)$")  # where torch.load, Pillow are called
_FILTERS_LOCK = threading.Lock()  # threads adding and taking out these filters at once


@contextlib.contextmanager
def warnings_ignored(*categories: type[Warning], modules: re.Pattern | None = None,
                     message: str | None = None) -> Iterator[None]:
    """Warnings of `categories` (default: all) said from torch, Pillow or attnconv ignored inside (from the modules
    matching `modules`, a compiled pattern, where given; only those whose text starts matching `message`, a pattern,
    where given), as `catch_warnings()` with `simplefilter("ignore")` would, but without resetting every module's
    once-per-line registry (which `catch_warnings` does on entry and exit: reading a run twice would have said the
    user's own warnings again), and without hiding other modules' warnings (another thread's). Threads may use it at
    once (`catch_warnings` swaps the process's one list, and threads leaving it put back each other's). The filters
    added are taken out however the block ends, from the list they went into and from the one in use then (a user's
    `catch_warnings` may have swapped it), a Ctrl-C during that included."""
    text = None if message is None else re.compile(message, re.I)
    added = [("ignore", text, category, modules or _QUIETED, 0) for category in categories or (Warning,)]
    with _FILTERS_LOCK:
        into = warnings.filters
        into[:0] = added  # in place: the warnings module reads this list at every warning
    try:
        yield
    finally:
        try:
            _take_out(added, into)
        except KeyboardInterrupt:
            _take_out(added, into)
            raise


_PYTHON_SHOWWARNING = warnings.showwarning  # as this module is first imported (Python's own, or the user's then)
_SHOWN = threading.local()  # .show: where this thread's warnings go inside `warnings_shown`
_SHOWN_LOCK = threading.Lock()
_shown_state: dict = {"users": 0, "before": None}


def _dispatch(message, category, filename, lineno, file=None, line=None) -> None:
    """The process's showwarning while any thread is inside `warnings_shown`: each warning to its thread's `show`, or
    to the showwarning in place before."""
    show = getattr(_SHOWN, "show", None)
    before = _shown_state["before"] or _PYTHON_SHOWWARNING
    (show or before)(message, category, filename, lineno, file, line)


def shown_before() -> Callable:
    """The showwarning in place before the first thread entered `warnings_shown` (Python's own, or the user's)."""
    return _shown_state["before"] or warnings.showwarning


@contextlib.contextmanager
def warnings_shown(show: Callable, *, every: bool | None = None) -> Iterator[None]:
    """Inside, the warnings said in this thread are shown by `show` (as `warnings.showwarning` is called), and every
    other thread's by the showwarning in place before, as if each had set `warnings.showwarning` for itself:
    `catch_warnings` with `warnings.showwarning = show` would swap the process's one showwarning and filter list, and
    threads leaving it at once put back each other's (the CLI's `main` called from several threads left its own
    showwarning installed and attnconv's quieting filter in the list for good). The showwarning in place before is put
    back when the last thread leaves (unless something else replaced it meanwhile). `every`: attnconv's warnings said
    each time inside (`attnconv_warning`; None: as outside)."""
    with _SHOWN_LOCK:
        if _shown_state["users"] == 0:
            current = warnings.showwarning
            _shown_state["before"] = current if current is not _dispatch else _shown_state["before"]
            warnings.showwarning = _dispatch
        _shown_state["users"] += 1
    outer, outer_every = getattr(_SHOWN, "show", None), getattr(_SHOWN, "every", False)
    _SHOWN.show, _SHOWN.every = show, outer_every if every is None else every
    try:
        yield
    finally:
        _SHOWN.show, _SHOWN.every = outer, outer_every
        with _SHOWN_LOCK:
            _shown_state["users"] -= 1
            if _shown_state["users"] == 0 and warnings.showwarning is _dispatch:
                warnings.showwarning = _shown_state["before"]


@contextlib.contextmanager
def warnings_held() -> Iterator[None]:
    """The warnings said in this thread inside (those no filter ignored) shown when the block ends, however it ends,
    through the showwarning this thread had: an export silences its thread's output meanwhile, and a user's model
    warning while it is traced must still be seen."""
    held: list[tuple] = []
    outer = getattr(_SHOWN, "show", None)
    try:
        with warnings_shown(lambda *shown: held.append(shown)):
            yield
    finally:
        for shown in held:
            (outer or warnings.showwarning)(*shown)


def _take_out(added: list, into: list) -> None:
    with _FILTERS_LOCK:  # each entry deleted where it is, by identity: no list rebuilt from a snapshot
        for filters in (into, warnings.filters):
            for entry in added:
                at = next((i for i, f in enumerate(filters) if f is entry), None)
                if at is not None:
                    del filters[at]


def user_frame() -> FrameType | None:
    """The innermost frame of the running call stack outside attnconv, torch and functools (a cached property's
    getter): the user's code that asked for the work (None where there is none: attnconv's CLI)."""
    frame = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] in ("attnconv", "torch",
                                                                                           "functools"):
        frame = frame.f_back
    return frame


def caller_warning(frame: FrameType | None, message: str) -> Callable[[], None]:
    """What issues AttnconvWarning(`message`) at `frame`'s line (the user's code that asked for the work, not a line of
    attnconv's or of a model's), with that frame's module and warning registry, as `warnings.warn` there would: filters
    by module and once-per-line apply as to the user's own warnings (None: the line that calls it)."""
    if frame is None:
        return functools.partial(attnconv_warning, message, 3)
    # Inside the CLI's main each command says its warnings as a process would: no registry shared with other threads'
    # commands (one's entry, made after another's command began, would drop that command's line).
    registry = {} if getattr(_SHOWN, "every", False) else frame.f_globals.setdefault("__warningregistry__", {})
    # No module_globals: the loader of a __main__ run by `python -c`, stdin, exec or `-m` fails to give its source.
    # Code exec'd with globals of no name: the module named from its file.
    name, file = frame.f_globals.get("__name__"), frame.f_code.co_filename
    module = name if isinstance(name, str) and name else os.path.splitext(os.path.basename(file))[0] or "<unknown>"
    return functools.partial(warnings.warn_explicit, AttnconvWarning(message), AttnconvWarning, file, frame.f_lineno,
                             module=module, registry=registry)


def attnconv_warning(message: str, stacklevel: int = 2) -> None:
    """AttnconvWarning(`message`), said as `warnings.warn(..., stacklevel)` says it; inside the CLI's `main` every
    time (`warnings_shown(every=True)`), not once per line: threads running commands at once share the modules'
    registries, and each command says its own warnings, as a process of its own would."""
    if not getattr(_SHOWN, "every", False):
        warnings.warn(AttnconvWarning(message), stacklevel=stacklevel + 1)
        return
    frame = sys._getframe(1)
    for _ in range(stacklevel - 1):  # as warnings.warn counts; the outermost frame where the stack is shorter
        frame = frame.f_back or frame
    warnings.warn_explicit(AttnconvWarning(message), AttnconvWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=str(frame.f_globals.get("__name__") or "attnconv"), registry={})


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a command, with a message saying what was kept and how to go on (the CLI prints
    `as_flag()`). The message may name the parameters in `mentions` as {name}, as ParameterError's."""

    def __init__(self, message: str = "", *, mentions: tuple[str, ...] = ()):
        self.message, self.mentions = message, tuple(mentions)
        super().__init__(_mention(message, self.mentions, lambda n: n))

    def as_flag(self) -> str:
        """The message as the command line says it, every parameter as its flag."""
        return _mention(self.message, self.mentions, lambda n: "--" + n.replace("_", "-"))


def _mention(text: str, mentions: tuple[str, ...], word: Callable[[str], str]) -> str:
    """`text` with every `{name}` of `mentions` said as `word(name)`."""
    for name in mentions:
        text = text.replace(f"{{{name}}}", word(name))
    return text
