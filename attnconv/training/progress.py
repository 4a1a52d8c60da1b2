"""What training prints: a progress bar on a terminal, plain lines everywhere else.

On a terminal (stderr is a tty) a tqdm bar shows the epoch's steps; in a log file (`nohup`,
CI) carriage-return updates would pile up into one enormous line, so instead one line is
printed every `log_every` steps, each flushed:

    step 200/1404  epoch 1/3  loss 0.5123  acc 0.8123  412 img/s  lr 1.90e-03  ETA 3m12s

Epoch summaries are printed in both cases (`ProgressLog.write`). The ETA is the time left for the
whole run (`eta`), and the counts are those that will run: with --max-steps, its steps and the
epochs they reach. `RunProgress` holds the counters where a run stands, which checkpoints save.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from tqdm import tqdm


def write_line(line: str) -> None:
    """One line to stderr, at once (announcements between a command's progress bars)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def eta(total_steps: int, step: int, seconds_per_step: float) -> str:
    """The time left for the run's remaining steps at the measured pace, as `format_duration` writes it."""
    return format_duration(max(0, total_steps - step) * seconds_per_step)


def format_duration(seconds: float) -> str:
    """3725 -> '1h02m', 192 -> '3m12s', 9.4 -> '9s'."""
    s = max(0, int(round(seconds)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class ProgressLog:
    """One epoch's progress: `update(step, ...)` at the loop's sync points, `close()` at the end.

    `mode`: "bar" (tqdm), "lines" (a line every `log_every` steps) or "off". `auto_mode`
    picks "bar" on a terminal and "lines" otherwise. `total_steps`: the steps the run will take;
    `epoch_steps`: those this epoch will take (fewer in the last epoch of a --max-steps run).
    """

    def __init__(self, mode: str, *, total_steps: int, epoch_steps: int, initial: int, desc: str,
                 log_every: int, stream: TextIO | None = None):
        self.mode, self.total_steps, self.log_every, self.desc = mode, total_steps, log_every, desc
        self.stream = stream if stream is not None else sys.stderr
        self._last_logged = None
        self._bar = None
        if mode == "bar":
            self._bar = tqdm(total=epoch_steps, initial=initial, desc=desc, leave=False, unit="step",
                             dynamic_ncols=True, mininterval=0.5, file=self.stream)

    @staticmethod
    def auto_mode(show: bool, stream: TextIO | None = None) -> str:
        if not show:
            return "off"
        stream = stream if stream is not None else sys.stderr
        return "bar" if getattr(stream, "isatty", lambda: False)() else "lines"

    def update(self, step: int, steps: int, *, loss: float, acc: float, rate: float, lr: float,
               seconds_per_step: float) -> None:
        """`step`: optimizer steps done in the run; `steps`: steps since the last update."""
        if self._bar is not None:
            self._bar.update(steps)
            self._bar.set_postfix(loss=f"{loss:.4f}", acc=f"{acc:.4f}", img_s=f"{rate:.0f}",
                                  ETA=eta(self.total_steps, step, seconds_per_step), refresh=False)
            return
        if self.mode != "lines" or self.log_every <= 0:
            return
        if step // self.log_every == (step - steps) // self.log_every:
            return  # no multiple of log_every was passed since the last update
        self.stream.write(f"step {step}/{self.total_steps}  {self.desc}  loss {loss:.4f}  acc {acc:.4f}  "
                          f"{rate:.0f} img/s  lr {lr:.2e}  ETA {eta(self.total_steps, step, seconds_per_step)}\n")
        self.stream.flush()

    def write(self, line: str) -> None:
        """A line that survives the bar (the epoch summaries)."""
        if self._bar is not None:
            tqdm.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


@dataclass
class RunProgress:
    """Counters that a checkpoint saves; sums are global (all ranks) when saved."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # epoch in progress (0-based)
    batch: int = 0  # batches of `epoch` done
    rows: int = 0  # rows in metrics.csv
    snapshots: int = 0  # lines in heads.jsonl
    step_rows: int = 0  # rows in steps.csv
    finished: bool = False
    loss_sum: float = 0.0  # this epoch's training loss, summed over samples
    correct: float = 0.0
    seen: float = 0.0
    seconds: float = 0.0  # training time of this epoch so far (no eval, no checkpoint writes)
    run_seconds: float = 0.0  # training time of the finished epochs
    row_loss: float = 0.0  # the same sums since the last steps.csv row (they may span an epoch's end)
    row_correct: float = 0.0
    row_seen: float = 0.0
    row_seconds: float = 0.0
