"""What a `train` stopped early says and does on its way out: the run `--overwrite` set aside put back, the one line
saying where the run stands (`stopped_line`), and a second Ctrl-C kept from cutting that line short
(`CleanupInterrupts`). `trainer` is the loop's `_Trainer`, or None when it stopped before one was built."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

from attnconv.errors import Interrupted, ParameterError
from attnconv.fileio import describe_os_error, permission_fix
from attnconv.limits import out_of_memory
from attnconv.models.capture_numbers import NonFiniteAttention
from attnconv.training.checks import where_the_run_stands
from attnconv.training.step import StepOverflow

# The test images a checkpoint within an epoch is evaluated on before it is written (the epoch's own checkpoint has
# the whole test set's loss): finite weights whose outputs are NaN (a batch norm's running statistics past the float
# range) are no good checkpoint.
PROBE_IMAGES = 64
# What a failure says when --overwrite's old run was put back (the new run had no checkpoint yet).
RESTORED = "the run that {overwrite} was replacing is restored as it was (the new run had no checkpoint yet)"


def stopped_line(err: BaseException, out: Path, trainer, fresh: bool, overwrite: bool, allow_data_change: bool
                 ) -> Exception | None:
    """After any failure, the run --overwrite set aside is put back if the new run has no checkpoint yet.
    Then the one-line error for a run stopped by Ctrl-C, a failed write or running out of memory, saying what
    the run directory holds now; None to let `err` itself through (an AttnconvError says it already). The
    `--resume` it names carries `--allow-data-change` when this one did (without it the data at hand is refused)."""
    if isinstance(err, (StepOverflow, NonFiniteAttention)) and trainer is not None:  # a diverged run
        if isinstance(err, StepOverflow):  # in the step being taken
            diverged = trainer._nan_error("the optimizer's step overflowed the weights' number range",
                                          trainer.progress.step + 1)
        else:  # found by the heads' snapshot after the step
            diverged = trainer._nan_error("the attention probabilities became non-finite (NaN or inf)",
                                          max(trainer.progress.step, 1))
        _restore_set_aside(out, trainer)  # said before it is back: the line names the run that was set aside
        return diverged
    restored = _restore_set_aside(out, trainer)
    if not isinstance(err, (KeyboardInterrupt, OSError)) and not out_of_memory(err):
        return None
    untouched = overwrite and (trainer is None or not trainer.set_aside.moved)  # --overwrite stopped in its checks
    stands = RESTORED if restored else where_the_run_stands(out, fresh, untouched, data_change=allow_data_change)
    where = f" at step {trainer.progress.step} of {trainer.total_steps}" if trainer is not None else ""
    if isinstance(err, KeyboardInterrupt):  # Ctrl-C: say where the run stands and how to go on
        return Interrupted(f"interrupted{where}; {stands}", mentions=("overwrite",))
    if isinstance(err, OSError):  # disk full or the folder gone while writing: one line, the last checkpoint kept
        what = f" {err.filename}" if err.filename else ""
        why = f"permission denied; {permission_fix(err.filename)}" if isinstance(err, PermissionError) else describe_os_error(err)
        return ParameterError("out", out, f": could not write{what} ({why}); {stands}", mentions=("overwrite",))
    return ParameterError(None, None, f"out of memory{where}; give smaller sizes ({{batch_size}}, the model's); "
                          f"{stands}", mentions=("batch_size", "overwrite"))


def rate_fix(config) -> str:
    """What keeps a run that diverged (a non-finite loss or weight, a step past the weights' range) from diverging
    again: a lower rate, a lower `attention_lr_scale` where it raises the attention's, a longer warm-up where the
    schedule has one; in a new run folder (as {name}s for `ParameterError`'s mentions)."""
    knobs = " or ".join(["{lr}"] + (["{attention_lr_scale}"] if config.attention_lr_scale > 1 else []))
    warmup = " or raise {warmup}" if config.schedule == "warmup-cosine" else ""
    return f"lower {knobs}{warmup} and train into a new {{out}}"


def _restore_set_aside(out: Path, trainer) -> bool:
    """Put back the run --overwrite set aside, if the new run has no checkpoint yet; whether it did."""
    if trainer is None or not trainer.set_aside.pending:
        return False
    try:
        trainer.set_aside.restore()
    except OSError as err:
        raise ParameterError("out", out, f": the new run failed before its first checkpoint, and the run it was "
                             f"replacing could not be put back ({describe_os_error(err)}); its files are in "
                             f"{trainer.set_aside.folder}: move them back into {out}") from None
    return True


class CleanupInterrupts:
    """While a run stopped by Ctrl-C cleans up (the set-aside run put back, the lock released, the line saying
    where it stopped): a second SIGINT is let pass, so that it cannot cut that short; a third ends the process
    at once (`interrupted`, exit 130), for a cleanup that hangs. Only in the main thread of a process whose
    SIGINT raises KeyboardInterrupt (Python's default); `restore` puts that handler back."""

    def __init__(self):
        self.previous, self.count = None, 0
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.previous = signal.signal(signal.SIGINT, self._interrupt)

    def _interrupt(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.count >= 2:
            with contextlib.suppress(OSError):  # stderr full or gone: the exit status says it
                os.write(2, b"interrupted\n")
            os._exit(130)

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None
