"""Two of a run's logs, each a part with one job: steps.csv (`StepsLog`) and heads.jsonl (`HeadsLog`).

Each appends one fsync'd record at a time and counts it in the run's `RunProgress` (`step_rows`,
`snapshots`), which the checkpoint saves, so a resumed run cuts the file back to what the checkpoint
knows of (`Checkpointer.replay_logs`) and logs the rest anew.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from attnconv import data as D
from attnconv.analysis import SNAPSHOT_IMAGES, head_snapshot
from attnconv.fileio import append_synced
from attnconv.models.sites import attention_sites, needs_inputs
from attnconv.runs import HEADS_FILE, STEPS_COLUMNS, STEPS_FILE, append_rows, heads_line
from attnconv.training.board import TensorBoardLog
from attnconv.training.distributed import Dist
from attnconv.training.progress import RunProgress


class StepsLog:
    """steps.csv: a row every `log_every` steps, the loss and accuracy since the previous row over every
    rank (a collective: every rank appends at the same steps; rank 0 writes), and TensorBoard's train
    scalars when the run has a board."""

    def __init__(self, out: Path, d: Dist, device: torch.device):
        self.path, self.d, self.device = out / STEPS_FILE, d, device

    def append(self, progress: RunProgress, lr: float, board: TensorBoardLog | None = None) -> None:
        """Append the row of `progress.step` (the means since the previous row) and start the next row's sums."""
        p = progress
        loss, correct, seen = self.d.sum([p.row_loss, p.row_correct, p.row_seen], self.device)
        if not seen:  # no step since the last row (never at a log step; a guard for the division)
            return
        p.step_rows += 1
        if self.d.main:
            row = {"step": p.step, "epoch": p.epoch + 1, "loss": loss / seen, "accuracy": correct / seen, "lr": lr,
                   "images_per_s": seen / p.row_seconds if p.row_seconds > 0 else 0.0,
                   "seconds": p.run_seconds + p.seconds}
            append_rows(self.path, [row], STEPS_COLUMNS)
            if board is not None:
                board.scalars({"train/loss": row["loss"], "train/accuracy": row["accuracy"], "lr": lr}, p.step)
        p.row_loss = p.row_correct = p.row_seen = p.row_seconds = 0.0


class HeadsLog:
    """heads.jsonl (rank 0): `analysis.head_snapshot` of `model`'s attention heads, a line per call, on
    the first `SNAPSHOT_IMAGES` test images where the heads depend on their input."""

    def __init__(self, out: Path, model: nn.Module, test_set: D.ImageSet, info: D.DatasetInfo):
        self.path, self.model, self.test_set, self.info = out / HEADS_FILE, model, test_set, info

    def append(self, epoch: int, progress: RunProgress) -> None:
        """Append the snapshot after `epoch` epochs (0: at initialization) at `progress.step`, and count it."""
        x = None
        if needs_inputs(attention_sites(self.model)):
            x = D.normalize(self.test_set.images[:SNAPSHOT_IMAGES], self.info)
        record = {"epoch": epoch, "step": progress.step, "layers": head_snapshot(self.model, x)}
        append_synced(self.path, heads_line(record))
        progress.snapshots += 1
