"""Evaluation: test accuracy, parameters, FLOPs, and Table 1 over runs and seeds.

FLOPs come from `attnconv.flops.count_flops` (re-exported here): every matrix product
and convolution, and the paper's Linear-only convention, per image.

Per class: `predict_all` gives every test image's predicted class (one forward pass, which
also yields the loss and accuracy), `confusion_matrix` counts (true, predicted) pairs and
`per_class_accuracy` reads each class's accuracy off its row.

Table 1: `describe_run` summarizes one run directory from its config.json and
metrics.csv alone (no weights needed), `group_runs` puts the runs of one configuration
(everything but the seed and where the run ran) into one row, and `runs_table`
prints the rows, in the paper's order, as text or Markdown:

    summaries = [describe_run(d) for d in glob.glob("benchmarks/table1/*/*")]
    print(runs_table(summaries))
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from attnconv import data as D
from attnconv.config import RESUMABLE_CHANGES
from attnconv.errors import AttnconvError, ParameterError
from attnconv.flops import count_flops
from attnconv.limits import flag_argument
from attnconv.modes import eval_mode
from attnconv.runs import WEIGHTS_FILE, Run, as_run, nonfinite_tensor, recorded_metadata
from attnconv.runs.logs_record import TRAINED_COLUMNS, content_digest, logs_digest  # noqa: F401  (their names here too)
from attnconv.runs.record import recorded_step
from attnconv.tables import format_table

__all__ = [
    "PAPER_ORDER",
    "TABLE_HEADERS",
    "confusion_matrix",
    "count_flops",
    "count_params",
    "describe_run",
    "evaluate",
    "runs_table",
    "group_runs",
    "per_class_accuracy",
    "predict_all",
    "run_setup",
    "table_row",
]


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
    the result for the whole set. Every module's train/eval mode is restored afterwards.
    """
    n = len(imageset)
    if n == 0:
        raise AttnconvError("cannot evaluate on an empty image set")
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    part = imageset if world_size == 1 else D.ImageSet(imageset.images[lo:hi], imageset.labels[lo:hi])
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss_sum, correct
    with eval_mode(model):
        if len(part):
            for logits, y in _logits(model, part, info, batch_size, device):
                sums[0] += F.cross_entropy(logits, y, reduction="sum").double()
                sums[1] += (logits.argmax(1) == y).sum().double()
    if world_size > 1:
        dist.all_reduce(sums)
    loss_sum, correct = sums.tolist()
    return loss_sum / n, correct / n


def _logits(model: nn.Module, imageset: D.ImageSet, info: D.DatasetInfo, batch_size: int,
            device: str | torch.device) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """(float32 logits, labels) per batch of `imageset` in order, unaugmented: the one loop behind
    `evaluate` and `predict_all`, so both see the same numbers."""
    for x, y in D.iterate_batches(imageset, info, batch_size, seed=0, epoch=0, train=False, augment=False,
                                  drop_last=False, device=device):
        yield model(x).float(), y


@torch.no_grad()
def predict_all(
    model: nn.Module,
    imageset: D.ImageSet,
    info: D.DatasetInfo,
    batch_size: int = 500,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Every image's prediction, in `imageset` order, from one forward pass over the set.

    Returns "predictions" (N,) int64 and "probabilities" (N,) float32 (the softmax
    probability of the predicted class), on the CPU, and "loss" and "accuracy" summed
    exactly as `evaluate` sums them, so a caller that needs both gets them from this one
    pass. Every module's train/eval mode is restored afterwards.
    """
    if len(imageset) == 0:
        raise AttnconvError("cannot evaluate on an empty image set")
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    predictions, probabilities = [], []
    with eval_mode(model):
        for logits, y in _logits(model, imageset, info, batch_size, device):
            loss_sum += F.cross_entropy(logits, y, reduction="sum").double()
            p, k = logits.softmax(1).max(1)
            predictions.append(k.cpu())
            probabilities.append(p.cpu())
    predictions = torch.cat(predictions).to(torch.int64)
    correct = int((predictions == imageset.labels.cpu().to(torch.int64)).sum())
    return {"predictions": predictions, "probabilities": torch.cat(probabilities),
            "loss": float(loss_sum) / len(imageset), "accuracy": correct / len(imageset)}


def confusion_matrix(labels: torch.Tensor | Iterable[int], predictions: torch.Tensor | Iterable[int],
                     num_classes: int) -> torch.Tensor:
    """(C, C) int64 counts: row = true class, column = predicted class (row sums: images per class)."""
    labels = torch.as_tensor(labels, dtype=torch.int64).cpu().reshape(-1)
    predictions = torch.as_tensor(predictions, dtype=torch.int64).cpu().reshape(-1)
    if labels.shape != predictions.shape:
        raise AttnconvError(f"{len(labels)} labels for {len(predictions)} predictions")
    for name, t in (("label", labels), ("prediction", predictions)):
        if len(t) and (int(t.min()) < 0 or int(t.max()) >= num_classes):
            raise AttnconvError(f"a {name} is outside 0..{num_classes - 1}")
    flat = torch.bincount(labels * num_classes + predictions, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes)


def per_class_accuracy(confusion: torch.Tensor | Iterable[Iterable[int]]) -> list[float | None]:
    """Each class's accuracy from a `confusion_matrix`: diagonal over row sum; None for a class with no images."""
    confusion = torch.as_tensor(confusion, dtype=torch.int64)
    totals, right = confusion.sum(1).tolist(), confusion.diagonal().tolist()
    return [r / t if t else None for r, t in zip(right, totals)]


def count_params(model: nn.Module) -> int:
    """Number of parameters (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters())


def describe_run(
    run: Run | str | os.PathLike,
    *,
    recompute: bool = False,
    device: str | None = None,
    data_dir: str | None = None,
    dataset: str | None = None,
    batch_size: int = 500,
    allow_data_change: bool = False,
) -> dict[str, Any]:
    """Summary of a run directory: model, dataset, accuracy, parameters, FLOPs, time.

    Only config.json and metrics.csv are read, so a run directory without its weights
    (the copies under benchmarks/table1/) is described too: the accuracy is the last
    metrics.csv row's, and the parameters and FLOPs are counted on the network the config
    describes, built with fresh weights (neither depends on them). The "parameters" count
    config.json states is not used: counting the architecture gives the true number, and
    an edited count (0, say) would otherwise be shown as the run's. With `recompute` the
    weights are loaded (model.safetensors) and the accuracy is measured anew on the test
    set (the data is looked up in `data_dir`, else
    in the run's own data_dir, else where `load_dataset` searches), in one pass that also
    gives the per-class results: "classes" (names, in label order), "per_class" (class name ->
    accuracy, None for a class with no test images) and "confusion" (`confusion_matrix` as
    lists: rows true, columns predicted).

    `dataset` (with `recompute`): measure on that dataset's test split instead, one with the
    run's classes (`--dataset folder:PATH`, `runs.run_data.other_test_set`); the summary then says
    so in "test_dataset" and "test_images". A run whose data is gone is one AttnconvError
    naming the stored path and the flag that points at the data.

    The run's own test data (no `dataset`) must be what the run recorded (config.json "data": classes,
    counts, normalization, and the test split's content, `runs.split_digest`): data that changed is one
    AttnconvError saying what changed, unless `allow_data_change`, which measures it anyway and says
    what changed in "warning".

    Besides the numbers: `seed`, and `setup`, what `group_runs` compares (`run_setup`); "converted_from", the source
    run's folder, for a run `attnconv convert` wrote that has no steps of its own.
    """
    recompute, allow_data_change = flag_argument(recompute, "recompute"), flag_argument(allow_data_change,
                                                                                        "allow_data_change")
    if not isinstance(run, Run):
        run = Run(run, "cpu" if device is None else device, data_dir=data_dir, dataset=dataset,
                  allow_nonfinite=True,  # NaN weights: a warning
                  warn_data_change=False)  # changed data: refused below, or measured with its own warning
    as_run(run, device, data_dir=data_dir, dataset=dataset)  # a Run given: none of its own settings given otherwise
    device = run.device
    run_dir, meta, config, info, rows = run.path, run.meta, run.config, run.info, run.metrics
    model = run.model if recompute else run.architecture
    flops = count_flops(model, run.input_shape)  # the shape it was trained on, whatever its folder holds now
    summary: dict[str, Any] = {
        "run": str(run_dir),
        "logs": logs_digest(rows),
        "model": config.model + (" (as attention)" if "converted" in meta else
                                 " (attention + content, from CNN)" if config.init_from and config.init_from.content else
                                 " (attention, from CNN)" if config.init_from else ""),
        "dataset": info.name,
        "epochs": int(rows[-1]["epoch"]) if rows else 0,
        "step": int(rows[-1]["step"]) if rows else 0,
        "test_loss": rows[-1]["test_loss"] if rows else None,
        "test_acc": rows[-1]["test_acc"] if rows else None,
        "seed": config.seed,
        "setup": run_setup(meta),
        "params": count_params(model),
        "flops_total": flops["total"],
        "flops_linear": flops["linear_only"],
        "flops_by_op": flops["by_op"],
        "seconds_per_epoch": _mean_epoch_seconds(rows, meta.get("steps_per_epoch")),
    }
    source = meta["converted"].get("from") if isinstance(meta.get("converted"), dict) else None
    if isinstance(source, str) and not rows:  # `attnconv convert`'s run: its weights are the source's, not trained
        summary["converted_from"] = source
    if recompute:
        bad = nonfinite_tensor(model.state_dict())
        if bad is not None:  # only present when there is something to say
            summary["warning"] = (f"{run_dir}: the run's weights hold NaN/inf (parameter {bad}); the run diverged, "
                                  "so its accuracy means nothing: retrain it with a lower --lr")
        test = run.test_set
        changes = run.test_data_changes
        if run.dataset is not None:
            summary["test_dataset"] = D.canonical_name(run.dataset)
            if D.dataset_info(run.dataset, image_size=run.info.size).channels != run.info.channels:
                summary["test_widened"] = True  # grey images given a colour run's three channels (`other_test_set`)
        summary["test_images"] = len(test)
        if changes and not allow_data_change:
            raise ParameterError(None, None, f"{run_dir}: the dataset changed since training ({'; '.join(changes)}), "
                                 "so the accuracy would not be the run's; restore the data it was trained on, or pass "
                                 "{allow_data_change} to measure the data as it is now", mentions=("allow_data_change",))
        if changes:
            note = (f"{run_dir}: the dataset changed since training ({'; '.join(changes)}); the accuracy below is "
                    "on the data as it is now")
            summary["warning"] = f"{summary['warning']}; {note}" if "warning" in summary else note
        step = recorded_step(recorded_metadata(run_dir / WEIGHTS_FILE))  # a checkpoint past metrics.csv's last row
        if step is not None and step != summary["step"]:
            summary["weights_step"] = step
        result = predict_all(model, test, info, batch_size, device)
        summary["test_loss"], summary["test_acc"] = result["loss"], result["accuracy"]
        if not math.isfinite(result["loss"]) and bad is None:  # finite weights whose outputs are not
            note = (f"{run_dir}: the run's weights give a non-finite test loss; the run diverged before this "
                    "checkpoint, so its accuracy means nothing: retrain it with a lower --lr")
            summary["warning"] = f"{summary['warning']}; {note}" if "warning" in summary else note
        confusion = confusion_matrix(test.labels, result["predictions"], info.num_classes)
        summary["classes"] = list(info.classes)
        summary["per_class"] = dict(zip(info.classes, per_class_accuracy(confusion)))
        summary["confusion"] = confusion.tolist()
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


# Table 1's rows, first to last; other models follow, by name.
PAPER_ORDER = ("resnet18", "sa-quadratic", "sa-quadratic-aniso", "sa-learned", "sa-learned-content")
# What does not change what a run computes: where and how fast it ran, plus the seed (averaged over).
_NOT_SETUP = RESUMABLE_CHANGES | {"seed"}

TABLE_HEADERS = ("model", "dataset", "seeds", "epochs", "test acc", "params", "FLOPs (all ops)",
                 "FLOPs (Linear only)", "s/epoch")


def run_setup(meta: dict[str, Any]) -> dict[str, Any]:
    """What a run computes, from its config.json (`read_config`): the training config without
    the seed and the fields a resumed run may change (device, workers, data_dir,
    checkpoint_every, compile, preset), plus `attnconv convert`'s fold_bn and alpha; the crop and
    flip options count only with augment on. An image folder counts by the content the run recorded
    (its splits' digests: a copy of the folder, or a link to it, is the same data; other images at the
    same path are not), and `--init-from` by its options, not by which CNN run (each seed its own CNN
    seed is the usual experiment). Runs with equal setups differ only by their seed."""
    setup = {k: v for k, v in meta["config"].items() if k not in _NOT_SETUP}
    if setup.get("augment") is False:  # crops and flips are options of the augmentation: off, they do nothing
        setup.pop("crop_pad", None), setup.pop("flip", None)
    digest = meta["data"].get("digest") if isinstance(meta.get("data"), dict) else None
    keys = ("train_unordered", "test_unordered") if isinstance(digest, dict) and "test_unordered" in digest \
        else ("train", "test")  # in any order where recorded: the test accuracy does not depend on it
    if str(setup.get("dataset", "")).startswith("folder:") and isinstance(digest, dict) \
            and all(isinstance(digest.get(k), str) for k in keys):
        setup["dataset"] = "folder"
        setup["data"] = {k.split("_")[0]: digest[k] for k in keys}
    if isinstance(setup.get("init_from"), dict):
        setup["init_from"] = {k: v for k, v in setup["init_from"].items() if k != "run"}
    if "converted" in meta:
        setup["converted"] = {k: meta["converted"].get(k) for k in ("fold_bn", "alpha")}
    return setup


def group_runs(runs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """`describe_run` summaries of the same setup (`run_setup`) as one Table-1 row each, in the paper's order.

    Every row: model (with the setup fields that tell it from another row of the same
    model and dataset, e.g. "sa-quadratic (amp=False)"), dataset, runs (their
    directories), seeds, n (runs), epochs (fewest and most finished by a run),
    test_acc (mean over the runs that finished an epoch, test_acc_runs of them) and test_acc_std (their
    sample standard deviation, None for fewer than two), params, flops_total and flops_linear
    (the setup's: equal for every run), seconds_per_epoch (mean over the runs).
    Rows go as PAPER_ORDER lists the models, then the other models by name. Two runs of
    one setup with the same seed (a run given twice, or a run and its copy) are an
    AttnconvError: they would count as two seeds.
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(json.dumps(run["setup"], sort_keys=True), []).append(run)
    rows = []
    for members in groups.values():
        first = members[0]
        seen: dict[Any, str] = {}
        logs: dict[str, str] = {}
        for r in members:  # one run's metrics.csv under two seeds' config.json: one run twice, not two seeds
            if r.get("logs") is not None and r["logs"] in logs:
                raise AttnconvError(f"{logs[r['logs']]} and {r['run']} hold the same metrics.csv: one run's logs "
                                    "twice; give each run once")
            if r.get("logs") is not None:
                logs[r["logs"]] = r["run"]
        for r in members:
            if r.get("seed") in seen:
                raise AttnconvError(f"{seen[r['seed']]} and {r['run']} are runs of the same configuration with the "
                                    f"same seed {r['seed']}: give each run once (a copy counts as a second seed)")
            seen[r.get("seed")] = r["run"]
        accs = [r["test_acc"] for r in members if r.get("test_acc") is not None]  # runs with a finished epoch
        secs = [r["seconds_per_epoch"] for r in members if r.get("seconds_per_epoch") is not None]
        epochs = [int(r.get("epochs") or 0) for r in members]
        rows.append({
            "model": first["model"],
            "dataset": first["dataset"],
            "runs": [r["run"] for r in members],
            "seeds": [r.get("seed") for r in members],
            "n": len(members),
            "epochs": (min(epochs), max(epochs)),
            "test_acc": statistics.fmean(accs) if accs else None,
            "test_acc_std": statistics.stdev(accs) if len(accs) > 1 else None,
            "test_acc_runs": len(accs),
            "params": first["params"],
            "flops_total": first["flops_total"],
            "flops_linear": first["flops_linear"],
            "seconds_per_epoch": statistics.fmean(secs) if secs else None,
            "setup": first["setup"],
        })
    for row, differs in zip(rows, _differences(rows)):
        if differs:
            row["model"] += " (" + ", ".join(differs) + ")"
    return sorted(rows, key=_paper_position)


def _paper_position(row: dict[str, Any]) -> tuple:
    setup = row["setup"]
    plain = "converted" not in setup and not setup.get("init_from")  # not a CNN turned into attention
    position = PAPER_ORDER.index(setup["model"]) if plain and setup["model"] in PAPER_ORDER else len(PAPER_ORDER)
    return position, row["model"], row["dataset"]


def _flat_setup(setup: dict[str, Any]) -> dict[str, str]:
    """A setup as {field: value text}, the model overrides and conversion options as fields of their own."""
    flat = {}
    for key, value in setup.items():
        if key in ("model_overrides", "converted") and isinstance(value, dict):
            for k, v in value.items():
                flat[k if k not in setup else f"{key}.{k}"] = v
        else:
            flat[key] = value
    return {k: v if isinstance(v, str) else json.dumps(v) if isinstance(v, (dict, list)) else repr(v)
            for k, v in flat.items()}


def setup_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The fields in which two `run_setup`s differ, as "field a -> b" (model overrides and conversion options as
    fields of their own)."""
    fa, fb = _flat_setup(a), _flat_setup(b)
    return [f"{k} {fa.get(k, '-')} -> {fb.get(k, '-')}" for k in sorted({*fa, *fb}) if fa.get(k) != fb.get(k)]


def _differences(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Per row, "field=value" for the setup fields in which it differs from other rows of its model and dataset."""
    flat = [_flat_setup(r["setup"]) for r in rows]
    out = []
    for i, row in enumerate(rows):
        peers = [j for j, r in enumerate(rows) if (r["model"], r["dataset"]) == (row["model"], row["dataset"])]
        keys = sorted({k for j in peers for k in flat[j]})
        varying = [k for k in keys if len({flat[j].get(k) for j in peers}) > 1]
        out.append([f"{k}={flat[i].get(k, '-')}" for k in varying])
    return out


def table_row(row: dict[str, Any]) -> list[str]:
    """One `group_runs` row as Table 1's cells (see TABLE_HEADERS), rounded like the paper.

    Accuracy: "mean ± sample std" over the seeds, the mean alone for one seed, and "(2 of 3 runs)" when some
    runs have finished no epoch yet (the mean is over the others). Epochs: "3", or "2-3" when the runs have
    not all finished as many.
    """
    acc, std = row["test_acc"], row["test_acc_std"]
    acc = "-" if acc is None or math.isnan(acc) else f"{acc:.4f}" + ("" if std is None else f" ± {std:.4f}")
    counted = row.get("test_acc_runs", row["n"])
    if acc != "-" and counted < row["n"]:
        acc += f" ({counted} of {row['n']} runs)"
    lo, hi = row["epochs"]
    epochs = str(lo) if lo == hi else f"{lo}-{hi}"
    secs = row["seconds_per_epoch"]
    secs = "-" if secs is None or math.isnan(secs) else f"{secs:.1f}"
    return [row["model"], row["dataset"], str(row["n"]), epochs, acc, _human(row["params"]),
            _human(row["flops_total"]), _human(row["flops_linear"]), secs]


def runs_table(runs: Iterable[dict[str, Any]], *, markdown: bool = False) -> str:
    """Table 1 of the paper from `describe_run` summaries: runs of one setup averaged into one
    row (`group_runs`), as aligned text (the default, like `tables.format_table`) or Markdown;
    columns after the second right-aligned. Ends with a newline."""
    rows = [table_row(r) for r in group_runs(runs)]
    align = "ll" + "r" * (len(TABLE_HEADERS) - 2)
    return format_table(TABLE_HEADERS, rows, markdown=markdown, align=align) + "\n"
