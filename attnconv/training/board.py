"""`train --tensorboard`: the run's scalars as TensorBoard event files in RUN_DIR/tensorboard/.

torch's SummaryWriter writes from a background thread: a failed write (a full disk, a folder
that cannot be written) ends that thread, which Python would report as an "Exception in thread"
traceback, and the writer raises the error again in the training thread on its next call.
`TensorBoardLog` keeps the thread quiet and turns the error into one OSError naming the folder,
which `train` reports on one line with the last good checkpoint.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnconv.errors import ParameterError
from attnconv.fileio import permission_fix
from attnconv.runs import TENSORBOARD_DIR
from attnconv.runs.values import path_kind


def summary_writer_class() -> Callable[..., Any]:
    """torch's TensorBoard SummaryWriter, or one ParameterError (`tensorboard`) if the `tensorboard` package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ParameterError("tensorboard", True, ": the tensorboard package is not installed; pip install "
                             "tensorboard, or drop {tensorboard}", shown="", mentions=("tensorboard",)) from None
    return SummaryWriter


def check_board_folder(out: Path) -> None:
    """Before any work: out/tensorboard/ is a folder of the run's own, or does not exist yet (a file there is a user's;
    a link, to a folder too, leads out of the run, where its event files are not the run's to remove)."""
    board = out / TENSORBOARD_DIR
    if board.is_symlink() and board.is_dir():  # a run's event files are removed when it fails: never through a link
        raise ParameterError("tensorboard", True, f": {board} is a link to {os.path.realpath(board)}, and a run's "
                             "event files go in a folder of its own (a run that fails removes them, which it does not "
                             "do through a link); replace the link by a folder, or drop {tensorboard}", shown="",
                             mentions=("tensorboard",))
    if (board.exists() or board.is_symlink()) and not board.is_dir():
        kind = "a file" if board.is_file() else path_kind(board)  # a broken link, a FIFO, a device
        raise ParameterError("tensorboard", True, f": {board} is {kind}, not a folder, so the event files "
                             "cannot go there; move it away, or drop {tensorboard}", shown="", mentions=("tensorboard",))
    if board.is_dir() and not os.access(board, os.R_OK | os.W_OK | os.X_OK):  # its event files are listed, written
        denied = [what for flag, what in ((os.R_OK, "list"), (os.W_OK, "write"), (os.X_OK, "enter"))
                  if not os.access(board, flag)]
        raise ParameterError("tensorboard", True, f": {board}: this user may not {' or '.join(denied)} it, as the "
                             f"event files need; {permission_fix(board)}", shown="", mentions=("tensorboard",))


class TensorBoardLog:
    """The event files of one `train` (rank 0): `scalars(values, step)`, `flush()`, `close()`.

    `writer_class`: `summary_writer_class()` (a test may give another). `purge_step`: on resume, the
    first step logged anew (TensorBoard's readers drop the older file's events from there on). Any
    OSError of the writer, raised in this thread or ended its own, is re-raised as an OSError whose
    filename is the folder; the writer's thread prints nothing while the log is open.
    """

    def __init__(self, writer_class: Callable[..., Any], out: Path, purge_step: int | None = None):
        self.folder = out / TENSORBOARD_DIR
        self.failed = False
        self._previous_hook = threading.excepthook
        threading.excepthook = self._quiet_writer_threads
        try:
            self.writer = self._call(writer_class, str(self.folder), purge_step=purge_step)
        except BaseException:
            threading.excepthook = self._previous_hook
            raise

    def _quiet_writer_threads(self, args: threading.ExceptHookArgs) -> None:
        """The writer's thread ended with an error: say nothing, the writer raises it on its next call."""
        if type(args.thread).__module__.startswith("tensorboard."):
            return
        self._previous_hook(args)

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except OSError as err:
            self.failed = True
            raise OSError(err.errno, err.strerror or str(err), str(self.folder)) from None

    def scalars(self, values: dict[str, float], step: int) -> None:
        """Add `values` (tag -> number) at `step`."""
        for tag, value in values.items():
            self._call(self.writer.add_scalar, tag, value, step)

    def flush(self) -> None:
        """Everything added so far is on disk (a failed background write is raised here)."""
        self._call(self.writer.flush)

    def close(self, *, quiet: bool = False) -> None:
        """Flush and close the writer, raising a failed write unless one was raised already or `quiet` (the run
        is stopping for another reason, which is the one to report)."""
        self.failed = self.failed or quiet
        try:
            if not self.failed:
                self.flush()
                self._call(self.writer.close)
        finally:
            if self.failed:
                try:
                    self.writer.close()
                except Exception:  # noqa: BLE001  the failure was raised once; closing adds nothing to it
                    pass
            threading.excepthook = self._previous_hook
