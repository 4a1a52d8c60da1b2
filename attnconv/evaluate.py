"""Evaluation: test accuracy, parameters, FLOPs, and the Table-1-style summary.

FLOPs come from `attnconv.flops.count_flops` (re-exported here): every matrix product
and convolution, and the paper's Linear-only convention, per image.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from attnconv import data as D
from attnconv.errors import AttnconvError
from attnconv.flops import count_flops
from attnconv.tables import format_table as _format_rows

__all__ = ["TABLE_HEADERS", "count_flops", "count_params", "describe_run", "evaluate", "format_table", "table_row"]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    imageset: D.ImageSet,
    info: D.DatasetInfo,
    batch_size: int = 500,
    device: str | torch.device = "cpu",
    *,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of `model` on `imageset` (no augmentation).

    With world_size > 1 (inside an initialized process group) each rank evaluates a
    contiguous slice of the set and the sums are all-reduced, so every rank returns
    the result for the whole set. The model's train/eval mode is restored afterwards.
    """
    n = len(imageset)
    if n == 0:
        raise AttnconvError("cannot evaluate on an empty image set")
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    part = imageset if world_size == 1 else D.ImageSet(imageset.images[lo:hi], imageset.labels[lo:hi])
    was_training = model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss_sum, correct
    try:
        if len(part):
            for x, y in D.iterate_batches(part, info, batch_size, seed=0, epoch=0, train=False, augment=False,
                                          drop_last=False, device=device):
                logits = model(x).float()
                sums[0] += F.cross_entropy(logits, y, reduction="sum").double()
                sums[1] += (logits.argmax(1) == y).sum().double()
    finally:
        model.train(was_training)
    if world_size > 1:
        dist.all_reduce(sums)
    loss_sum, correct = sums.tolist()
    return loss_sum / n, correct / n


def count_params(model: nn.Module) -> int:
    """Number of parameters (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters())


def describe_run(
    run_dir: str | os.PathLike,
    *,
    recompute: bool = False,
    device: str = "cpu",
    data_dir: str | None = None,
    batch_size: int = 500,
) -> dict[str, Any]:
    """Summary of a run directory: model, dataset, accuracy, parameters, FLOPs, time.

    The accuracy is the last metrics.csv row's, or, with `recompute`, measured anew on
    the test set from model.safetensors (the data is looked up in `data_dir`, else in
    the run's own data_dir, else where `load_dataset` searches).
    """
    from attnconv.train import load_run, read_config, read_metrics

    meta = read_config(run_dir)
    model, config = load_run(run_dir, device)
    info = D.dataset_info(config.dataset)
    rows = read_metrics(run_dir)
    flops = count_flops(model, (info.channels, info.size, info.size))
    summary: dict[str, Any] = {
        "run": str(run_dir),
        "model": config.model + (" (as attention)" if "converted" in meta else
                                 " (attention + content, from CNN)" if (config.init_from or {}).get("content") else
                                 " (attention, from CNN)" if config.init_from else ""),
        "dataset": info.name,
        "epochs": int(rows[-1]["epoch"]) if rows else 0,
        "step": int(rows[-1]["step"]) if rows else 0,
        "test_loss": rows[-1]["test_loss"] if rows else None,
        "test_acc": rows[-1]["test_acc"] if rows else None,
        "params": count_params(model),
        "flops_total": flops["total"],
        "flops_linear": flops["linear_only"],
        "flops_by_op": flops["by_op"],
        "seconds_per_epoch": _mean_epoch_seconds(rows, meta.get("steps_per_epoch")),
    }
    if recompute:
        data_dir = data_dir or config.data_dir
        if data_dir is not None and not Path(data_dir).is_dir():
            data_dir = None  # the run's data folder is gone; search the usual places
        _, test = D.load_dataset(config.dataset, data_dir, download=True)
        summary["test_loss"], summary["test_acc"] = evaluate(model, test, info, batch_size, device)
    return summary


def _mean_epoch_seconds(rows: list[dict[str, float]], steps_per_epoch: int | None) -> float | None:
    # Only whole epochs: a last epoch cut short by --max-steps would drag the mean down.
    full = [r["seconds"] for r in rows if steps_per_epoch and r["step"] == r["epoch"] * steps_per_epoch]
    full = full or [r["seconds"] for r in rows]
    return sum(full) / len(full) if full else None


def _human(n: float | None) -> str:
    """11173962 -> 11.2M, 556651520 -> 0.557B: the paper's style."""
    if n is None:
        return "-"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        # As in the paper, down to a tenth of a unit (0.56B, not 557M); plain k below 1k.
        if abs(n) >= (scale if scale == 1e3 else scale / 10):
            return f"{n / scale:.3g}{suffix}"
    return f"{n:g}"


TABLE_HEADERS = ("model", "dataset", "test acc", "params", "FLOPs (all ops)", "FLOPs (Linear only)", "s/epoch")


def table_row(run: dict[str, Any]) -> list[str]:
    """One `describe_run` summary as Table 1's cells (see TABLE_HEADERS), rounded like the paper."""
    acc = "-" if run.get("test_acc") is None else f"{run['test_acc']:.4f}"
    secs = run.get("seconds_per_epoch")
    return [run["model"], run["dataset"], acc, _human(run["params"]), _human(run["flops_total"]),
            _human(run["flops_linear"]), "-" if secs is None or math.isnan(secs) else f"{secs:.1f}"]


def format_table(runs: Iterable[dict[str, Any]]) -> str:
    """Table 1 of the paper as Markdown, one row per `describe_run` summary (columns after the first right-aligned)."""
    rows = [table_row(r) for r in runs]
    return _format_rows(TABLE_HEADERS, rows, markdown=True, align="l" + "r" * (len(TABLE_HEADERS) - 1)) + "\n"
