"""A run's dataset: where its data is, its DatasetInfo and test set, and what it recorded of it."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from attnconv import data as D
from attnconv.config import TrainConfig
from attnconv.errors import AttnconvError


def run_data_dir(config: TrainConfig, data_dir: str | os.PathLike | None = None) -> str | None:
    """Where to look for a run's data: `data_dir` if given, else the run's own data_dir if that
    folder still exists, else None (`load_dataset` then searches the usual places). A given
    `data_dir` that is not a folder is an AttnconvError (a typo must not fall back silently)."""
    if data_dir is not None:
        if not Path(data_dir).expanduser().is_dir():
            why = "it is a file" if Path(data_dir).expanduser().exists() else "no such directory"
            raise AttnconvError(f"--data-dir {data_dir}: {why}; give the folder holding the dataset's files")
        return str(data_dir)
    if config.data_dir is not None and Path(config.data_dir).expanduser().is_dir():
        return config.data_dir
    return None  # the run's data folder is gone (or it had none): search the usual places

def run_image_size(config: TrainConfig) -> int | None:
    """The image size a run's data is read at (what a folder dataset is decoded to; None: its default)."""
    size = config.model_overrides.get("image_size")
    return size if D.folder_path(config.dataset) is not None else None

def run_info(config: TrainConfig) -> D.DatasetInfo:
    """The DatasetInfo of a run's dataset, at the run's image size (folder datasets)."""
    return D.dataset_info(config.dataset, image_size=run_image_size(config))

def run_test_set(config: TrainConfig, data_dir: str | os.PathLike | None = None) -> D.ImageSet:
    """The test split of a run's dataset, found as `run_data_dir` says, at the run's image size.

    A dataset whose classes or channels no longer fit the run's model (a folder that gained a
    class) is one AttnconvError saying so, not a crash in the model.
    """
    found = run_data_dir(config, data_dir)
    test = D.load_dataset(config.dataset, found, download=True, image_size=run_image_size(config))[1]
    info = run_info(config)
    for key, now, what in (("num_classes", info.num_classes, "classes"), ("in_channels", info.channels, "channels")):
        trained = config.model_overrides.get(key)
        if trained is not None and trained != now:
            raise AttnconvError(
                f"{config.dataset}: the dataset changed since the run was trained: it has {now} {what}, the run's "
                f"model {trained}; give the data it was trained on (--data-dir), or train a new run on this data")
    return test

def data_fingerprint(info: D.DatasetInfo) -> dict[str, Any]:
    """What a run records of its dataset (config.json "data"): classes, sizes, shape, normalization."""
    return {"classes": list(info.classes), "train_size": info.train_size, "test_size": info.test_size,
            "channels": info.channels, "size": info.size, "mean": list(info.mean), "std": list(info.std)}

def data_changes(saved: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """What differs between a run's recorded dataset and `now` (`data_fingerprint`), in words; [] if
    nothing does, or if the run recorded none (written before runs recorded their data)."""
    if not isinstance(saved, dict):
        return []
    changes = []
    if saved.get("classes") != now["classes"]:
        old, new = list(saved.get("classes") or []), now["classes"]
        gained, lost = [c for c in new if c not in old], [c for c in old if c not in new]
        detail = "; ".join(part for part in (f"new: {', '.join(gained[:3])}" if gained else "",
                                             f"gone: {', '.join(lost[:3])}" if lost else "") if part)
        changes.append(f"classes {len(old)} -> {len(new)}" + (f" ({detail})" if detail else " (renamed or reordered)"))
    for key, what in (("train_size", "training images"), ("test_size", "test images"), ("channels", "channels"),
                      ("size", "image size")):
        if saved.get(key) != now[key]:
            changes.append(f"{what} {saved.get(key)} -> {now[key]}")
    if not all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for key in ("mean", "std")
               for a, b in zip(saved.get(key) or [], now[key])):
        changes.append("normalization (per-channel mean/std of the training images)")
    return changes
