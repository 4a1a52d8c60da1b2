"""The one exception type for mistakes a user can make (bad path, bad config, bad shape).

The CLI prints its message on one line and exits with status 2, without a traceback.
It subclasses ValueError so library callers can catch it as the usual type. A `ParameterError`
names the bad argument by its parameter, which the CLI shows as its flag.
"""

from collections.abc import Callable


class AttnconvError(ValueError):
    """A user-facing error: the message names the bad input and how to fix it."""


class ParameterError(AttnconvError):
    """A bad argument, named as the caller gave it: from Python its parameter (`out /x is a file; give a
    directory`), from the command line its flag (`as_flag`: `--out /x is a file; give a directory`).

    The message is `name`, the value as `shown` (default str(value); "" leaves it out), then `rest`.
    `rest` may name the parameters in `mentions` as `{name}` (`pass {resume} to continue it`), said
    the same way; `flags` maps a parameter to its flag where that is not the name with dashes
    ({"out": "export"}).
    """

    def __init__(self, name: str, value: object, rest: str, *, shown: str | None = None,
                 mentions: tuple[str, ...] = (), flags: dict[str, str] | None = None):
        self.name, self.value, self.rest, self.mentions = name, value, rest, tuple(mentions)
        self.shown = str(value) if shown is None else shown
        self.flags = dict(flags or {})
        super().__init__(self._render(lambda n: n))

    @property
    def flag(self) -> str:
        """The command line's flag for `name`, without the dashes."""
        return self.flags.get(self.name, self.name.replace("_", "-"))

    def as_flag(self) -> str:
        """The message as the command line says it, every parameter as its flag."""
        return self._render(lambda n: "--" + self.flags.get(n, n.replace("_", "-")))

    def _render(self, word: Callable[[str], str]) -> str:
        rest = self.rest
        for other in self.mentions:
            rest = rest.replace(f"{{{other}}}", word(other))
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


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a command, with a message saying what was kept and how to go on (the CLI prints it)."""
