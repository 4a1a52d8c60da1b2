"""The one exception type for mistakes a user can make (bad path, bad config, bad shape).

The CLI prints its message on one line and exits with status 2, without a traceback.
It subclasses ValueError so library callers can catch it as the usual type.
"""


class AttnconvError(ValueError):
    """A user-facing error: the message names the bad input and how to fix it."""


class AttnconvWarning(UserWarning):
    """Something a command worked around and says so (a damaged line skipped); the CLI prints it as one
    `warning:` line."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a command, with a message saying what was kept and how to go on (the CLI prints it)."""
