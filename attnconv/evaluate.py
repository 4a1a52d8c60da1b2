"""Evaluation: test accuracy, parameters, FLOPs, and the Table-1-style summary.

FLOPs are counted two ways, per image, at batch size 1:

- ``total``: every op that ``torch.utils.flop_counter.FlopCounterMode`` counts,
  i.e. the matrix products and convolutions (mm, addmm, bmm, baddbmm, einsum and
  matmul through them, conv, scaled_dot_product_attention, whose CPU kernel we add
  the formula for), attention's score and probability-times-value products
  included, at 2 FLOPs per multiply-add.
  FlopCounterMode does not count elementwise and reduction ops: softmax, exp,
  GELU/ReLU, LayerNorm/BatchNorm, residual adds, pooling, and scores built
  elementwise (the quadratic encoding's -alpha ||delta - Delta||^2). They are
  O(elements), small next to the products for these models, and left out.
- ``linear_only``: the paper's convention, 2 x in_features x out_features per token
  for every nn.Linear call (counted with forward hooks), nothing else. It reproduces
  the paper's 6.2B for the quadratic attention model. For ResNet-18 it is almost
  nothing (one 512 x 10 layer): the paper's 0.56B for ResNet-18 counts the
  convolutions' multiply-adds (0.56 G MACs = ``total`` / 2).

Position-only attention probabilities are computed once per forward and shared by
the batch, so at batch size 1 their cost is charged fully to the one image (the
conservative choice; larger batches amortize it).
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
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from attnconv import data as D
from attnconv.errors import AttnconvError


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


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """q @ k^T (B, h, Tq, Tk) and probs @ v (B, h, Tq, D_v), 2 FLOPs per multiply-add."""
    b, h, tq, dk = query_shape
    tk, dv = key_shape[-2], value_shape[-1]
    return 2 * b * h * tq * tk * (dk + dv)


def _cpu_attention_formulas() -> dict[Any, Any]:
    # torch 2.13's FlopCounterMode has formulas for the CUDA SDPA kernels but not for the
    # CPU one that F.scaled_dot_product_attention dispatches to here, which would silently
    # count content attention as 0.
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is None or op in flop_counter.flop_registry:
        return {}
    return {op: _sdpa_flops}


@torch.no_grad()
def count_flops(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, Any]:
    """FLOPs of one forward pass, per image (see the module docstring for what is counted).

    input_shape: (C, H, W), or (B, C, H, W) to count at batch B and divide by B.
    Returns {"total": int, "linear_only": int, "by_op": {op name: FLOPs}, "batch": B}.
    """
    if len(input_shape) == 3:
        input_shape = (1, *input_shape)
    if len(input_shape) != 4 or min(input_shape) < 1:
        raise AttnconvError(f"input_shape must be (C, H, W) or (B, C, H, W), got {tuple(input_shape)}")
    batch = input_shape[0]
    param = next(model.parameters(), None)
    x = torch.zeros(input_shape, device=param.device if param is not None else "cpu",
                    dtype=param.dtype if param is not None else torch.float32)
    linear = 0

    def count_linear(module: nn.Linear, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        nonlocal linear
        tokens = inputs[0].numel() // module.in_features
        linear += 2 * tokens * module.in_features * module.out_features

    hooks = [m.register_forward_hook(count_linear) for m in model.modules() if isinstance(m, nn.Linear)]
    was_training = model.training
    model.eval()
    try:
        with FlopCounterMode(display=False, custom_mapping=_cpu_attention_formulas()) as counter:
            model(x)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    by_op = {str(op): int(v) // batch for op, v in counter.get_flop_counts().get("Global", {}).items()}
    return {"total": counter.get_total_flops() // batch, "linear_only": linear // batch, "by_op": by_op,
            "batch": batch}


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


def format_table(runs: Iterable[dict[str, Any]]) -> str:
    """Table 1 of the paper as Markdown, one row per `describe_run` summary."""
    header = ("model", "dataset", "test acc", "params", "FLOPs (all ops)", "FLOPs (Linear only)", "s/epoch")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for r in runs:
        acc = "-" if r.get("test_acc") is None else f"{r['test_acc']:.4f}"
        secs = r.get("seconds_per_epoch")
        cells = (r["model"], r["dataset"], acc, _human(r["params"]), _human(r["flops_total"]),
                 _human(r["flops_linear"]), "-" if secs is None or math.isnan(secs) else f"{secs:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
