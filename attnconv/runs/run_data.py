"""A run's dataset: where its data is, its DatasetInfo and test set, and what it recorded of it.

    run_info(config, recorded=meta.get("data"))     the run's DatasetInfo (a moved folder: what it recorded)
    run_test_set(config, data_dir, dataset=...)     its test split, or another dataset's with the same classes
    check_other_dataset(config, dataset, recorded)   refuse a `--dataset` that cannot stand for it, before any work
    sample_across_classes(labels, count)            the test images commands show: a few of every class

When the data a run was trained on is gone (a `folder:PATH` dataset whose folder was moved
or deleted, or a built-in dataset's `--data-dir` that no longer exists and is nowhere else),
reading its test set is one error naming the stored path and the flag that points at the
data: `--dataset folder:PATH` for folders, `--data-dir DIR` for the built-in datasets. That
error is a `DataNotFound`, so a command that can do without the test images (a report's
per-class section) can tell "the data is not here" from "the data does not fit the run".
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnconv import data as D
from attnconv.config import TrainConfig
from attnconv.data.folder_layout import scan_folder
from attnconv.errors import AttnconvError, ParameterError
from attnconv.fileio import dangling_link, not_a_folder
from attnconv.limits import path_argument
from attnconv.pathwords import expanded
from attnconv.runs.values import shortened

# The seed of `sample_across_classes`: the explorer, the report, `plot` and `analyze` show the same images.
SAMPLE_SEED = 0
_RECORDED = ("classes", "train_size", "test_size", "channels", "size", "mean", "std")


class DataNotFound(AttnconvError):
    """The data a run was trained on is not where it was, nor anywhere else attnconv looks."""


def run_data_dir(config: TrainConfig, data_dir: str | os.PathLike | None = None) -> str | None:
    """Where to look for a run's data: `data_dir` if given, else the run's own data_dir if that
    folder still exists, else None (`load_dataset` then searches the usual places). A given
    `data_dir` that is not a folder is an AttnconvError (a typo must not fall back silently)."""
    if data_dir is not None:
        why = not_a_folder(path_argument(data_dir, "data_dir", "the folder holding the dataset's files"))
        if why:
            raise ParameterError("data_dir", data_dir, f": {why}; give the folder holding the dataset's files")
        return str(data_dir)
    if config.data_dir is not None and expanded(config.data_dir).is_dir():
        return config.data_dir
    return None  # the run's data folder is gone (or it had none): search the usual places

def run_image_size(config: TrainConfig) -> int | None:
    """The image size a run's data is read at (what a folder dataset is decoded to; None: its default)."""
    size = config.model_overrides.get("image_size")
    return size if D.folder_path(config.dataset) is not None else None


def recorded_info(config: TrainConfig, recorded: dict[str, Any] | None) -> D.DatasetInfo | None:
    """The DatasetInfo a run recorded of its dataset (config.json "data", `data_fingerprint`), or None
    when it recorded none (runs written before runs recorded their data) or an incomplete one."""
    if not isinstance(recorded, dict) or any(key not in recorded for key in _RECORDED):
        return None
    try:
        classes = tuple(str(c) for c in recorded["classes"])
        return D.DatasetInfo(
            name=D.canonical_name(config.dataset), channels=int(recorded["channels"]), size=int(recorded["size"]),
            num_classes=len(classes), mean=tuple(float(m) for m in recorded["mean"]),
            std=tuple(float(s) for s in recorded["std"]), classes=classes,
            train_size=int(recorded["train_size"]), test_size=int(recorded["test_size"]),
            stats_source='recorded by the run (config.json "data")')
    except (TypeError, ValueError):
        return None


def _folder_gone(config: TrainConfig) -> Path | None:
    """The image folder of a `folder:PATH` run when it no longer exists; else None."""
    folder = D.folder_path(config.dataset)
    return folder if folder is not None and not folder.is_dir() else None


def _gone_message(config: TrainConfig, folder: Path) -> str:
    link = dangling_link(folder)
    what = "is no longer a folder" if folder.exists() else f"is {link}" if link else "no longer exists (moved or deleted)"
    return (f"{shortened(config.dataset)}: the run's image folder {shortened(str(folder))} {what}; point at the "
            "images with --dataset folder:PATH (where the folder is now, or another folder with the same classes)")



def run_info(config: TrainConfig, *, recorded: dict[str, Any] | None = None) -> D.DatasetInfo:
    """The DatasetInfo of a run's dataset, at the run's image size (folder datasets).

    A folder dataset whose folder is gone is described by what the run recorded (`recorded`,
    config.json "data": classes, shape, normalization), so what needs no images (parameters,
    FLOPs, position-only attention) still works; without a record it is the one error naming
    the stored path and `--dataset folder:PATH`."""
    gone = _folder_gone(config)
    if gone is not None:
        known = recorded_info(config, recorded)
        if known is None:
            raise DataNotFound(_gone_message(config, gone))
        return known
    return D.dataset_info(config.dataset, image_size=run_image_size(config))


def run_test_set(config: TrainConfig, data_dir: str | os.PathLike | None = None, *, dataset: str | None = None,
                 info: D.DatasetInfo | None = None) -> D.ImageSet:
    """The test split of a run's dataset, found as `run_data_dir` says, at the run's image size.

    A dataset whose classes or channels no longer fit the run's model (a folder that gained a
    class) is one AttnconvError saying so, not a crash in the model. A run whose data is gone
    is one AttnconvError naming the stored path and the flag to give (see the module docstring).

    dataset: evaluate on another dataset's test split instead (`--dataset folder:PATH`), one with
    the run's classes, by name and in order (`other_test_set`); `info` is the run's DatasetInfo.
    """
    if dataset is not None:
        return other_test_set(config, dataset, info if info is not None else run_info(config), data_dir)
    gone = _folder_gone(config)
    if gone is not None:
        raise DataNotFound(_gone_message(config, gone))
    found = run_data_dir(config, data_dir)
    try:
        test = D.load_dataset(config.dataset, found, download=True, image_size=run_image_size(config))[1]
    except AttnconvError as err:
        stored = config.data_dir
        if data_dir is None and stored is not None and not expanded(stored).is_dir():
            raise DataNotFound(
                f"{config.dataset}: the run's data folder {stored} no longer exists and the dataset is not in "
                f"the usual places either; point at it with --data-dir DIR ({err})") from None
        raise
    info = run_info(config)
    where = "--dataset folder:PATH" if D.folder_path(config.dataset) is not None else "--data-dir"
    for key, now, what in (("num_classes", info.num_classes, "classes"), ("in_channels", info.channels, "channels")):
        trained = config.model_overrides.get(key)
        if trained is not None and trained != now:
            raise AttnconvError(
                f"{config.dataset}: the dataset changed since the run was trained: it has {now} {what}, the run's "
                f"model {trained}; give the data it was trained on ({where}), or train a new run on this data")
    return test


def _names(classes: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(str(c) for c in classes[:limit])
    return shown + (f", ... ({len(classes)} in all)" if len(classes) > limit else "")


def check_other_dataset(config: TrainConfig, dataset: str, recorded: dict[str, Any] | None = None) -> None:
    """Refuse `dataset` (`--dataset`) at once when it cannot stand for the run's test data: a folder that
    does not exist or is no image folder, an unknown name, or classes other than the run's (the same
    names in the same order). Reads no image: a folder's layout is listed, nothing decoded (its
    channels are checked when its images are read, `other_test_set`). Every command taking `--dataset`
    checks it this way (`Run`), also those that end up not needing test images, so a wrong `--dataset`
    is never silently ignored. `recorded`: config.json "data" (the run's classes without reading its data).
    """
    folder = D.folder_path(dataset)
    if folder is not None:
        if not folder.is_dir():
            link = dangling_link(folder)
            what = "is not a folder" if folder.exists() else f"is {link}" if link else "does not exist"
            raise ParameterError("dataset", dataset, f": {folder} {what}; give the image folder holding test "
                                 "images of the run's classes (PATH/train/CLASS/... and PATH/test/CLASS/...)")
        try:
            classes: Sequence[str] = scan_folder(folder).classes
        except AttnconvError as err:
            raise ParameterError("dataset", dataset, f": {err}") from None
    else:
        try:
            classes = D.dataset_info(dataset).classes
        except AttnconvError as err:
            raise ParameterError("dataset", dataset, f": {err}") from None
    known = recorded_info(config, recorded)
    ours = (known if known is not None else run_info(config, recorded=recorded)).classes
    if tuple(classes) != tuple(ours):
        raise ParameterError(
            "dataset", dataset, f": its classes ({_names(classes)}) are not the run's ({_names(ours)}); "
            "give a dataset with the same classes (folder:PATH: the same sub-folder names under train/)")


def other_test_set(config: TrainConfig, dataset: str, info: D.DatasetInfo,
                   data_dir: str | os.PathLike | None = None) -> D.ImageSet:
    """The test split of `dataset` (`--dataset`, usually folder:PATH), read at the run's image size, for a
    run whose DatasetInfo is `info`: its classes must be the run's, the same names in the same order
    (labels are indices), else one AttnconvError naming both lists. Grey images are given three equal
    channels for a colour run (as the folder decoder does for a mixed folder); colour images for a grey
    run are refused. Normalization stays the run's (`info`): the model was trained with it."""
    folder = D.folder_path(dataset) is not None
    size = info.size if folder else None
    other = D.dataset_info(dataset, image_size=size)
    if tuple(other.classes) != tuple(info.classes):
        raise ParameterError(
            "dataset", dataset, f": its classes ({_names(other.classes)}) are not the run's ({_names(info.classes)}); "
            "give a dataset with the same classes (folder:PATH: the same sub-folder names under train/)")
    if other.size != info.size:
        raise ParameterError("dataset", dataset, f": its images are {other.size}x{other.size}, the run's "
                             f"{info.size}x{info.size}; give a folder:PATH dataset (decoded at the run's size)")
    why = None if data_dir is None or folder else not_a_folder(
        path_argument(data_dir, "data_dir", "the folder holding the dataset's files"))
    if why:
        raise ParameterError("data_dir", data_dir, f": {why}; give the folder holding {dataset}'s files")
    test = D.load_dataset(dataset, None if folder else data_dir, download=True, image_size=size)[1]
    if other.channels != info.channels:
        if (other.channels, info.channels) != (1, 3):
            raise ParameterError("dataset", dataset, f": its images have {other.channels} channels, the run's "
                                 f"{info.channels}; give images of the run's kind (colour or grey)")
        test = D.ImageSet(test.images.expand(-1, 3, -1, -1).contiguous(), test.labels)
    return test


def sample_across_classes(labels: torch.Tensor | Sequence[int], count: int, seed: int = SAMPLE_SEED) -> list[int]:
    """Up to `count` indices into `labels`, spread over the classes, in the order they are picked.

    The set is shuffled with a fixed seed, then the classes (by label) give one image each in
    turn, round robin, until `count` are picked: the first picks show as many different classes
    as there are, and no class has two more than another while it still has images. An image
    folder lists its test images class by class, so its first N would all be one class.
    Deterministic: the same labels, count and seed give the same indices.
    """
    labels = torch.as_tensor(labels).reshape(-1).tolist()
    count = max(0, min(int(count), len(labels)))
    queues: dict[int, list[int]] = {}
    for i in np.random.default_rng(seed).permutation(len(labels)).tolist():
        queues.setdefault(int(labels[i]), []).append(i)
    ordered = [queues[c] for c in sorted(queues)]
    picked: list[int] = []
    depth = 0
    while len(picked) < count:
        picked.extend(q[depth] for q in ordered if depth < len(q))
        depth += 1
    return picked[:count]


def data_fingerprint(info: D.DatasetInfo) -> dict[str, Any]:
    """What a run records of its dataset (config.json "data"): classes, sizes, shape, normalization.
    `train` adds the content of both splits ("digest": `data_digest`)."""
    return {"classes": list(info.classes), "train_size": info.train_size, "test_size": info.test_size,
            "channels": info.channels, "size": info.size, "mean": list(info.mean), "std": list(info.std)}


_DIGEST_CHUNK = 1 << 26  # bytes of images hashed at a time: a memory-mapped set is never copied whole


def _split_digests(images: D.ImageSet) -> tuple[str, str]:
    """`split_digest` of one split both ways, (ordered, unordered), in one chunked read of its images."""
    ordered, unordered, _ = _split_hashes(images)
    return ordered, unordered


def _split_hashes(images: D.ImageSet) -> tuple[str, str, list[bytes]]:
    """(ordered digest, unordered digest, each image's hash with its label, sorted)."""
    ordered, unordered = hashlib.blake2b(digest_size=16), hashlib.blake2b(digest_size=16)
    pixels, labels = images.images.cpu(), images.labels.cpu()
    shape = repr(tuple(pixels.shape)).encode()
    ordered.update(shape)
    unordered.update(shape)
    step = max(1, _DIGEST_CHUNK // max(1, pixels[0].numel() * pixels.element_size() if len(pixels) else 1))
    label_bytes = labels.contiguous().numpy().astype("<i8")
    each: list[bytes] = []  # one hash per image: its pixels, then its label (little-endian int64)
    for start in range(0, len(pixels), step):
        chunk = pixels[start:start + step].contiguous().numpy()
        ordered.update(chunk)
        rows = chunk.reshape(len(chunk), -1).view(np.uint8)
        joined = np.concatenate([rows, label_bytes[start:start + len(chunk)].reshape(-1, 1).view(np.uint8)], axis=1)
        width, flat = joined.shape[1], memoryview(joined.reshape(-1))
        each.extend(hashlib.blake2b(flat[i:i + width], digest_size=16).digest()
                    for i in range(0, len(flat), width))
    ordered.update(label_bytes)
    each.sort()
    unordered.update(b"".join(each))
    return ordered.hexdigest(), unordered.hexdigest(), each


def split_digest(images: D.ImageSet, *, ordered: bool = True) -> str:
    """The content of one split as 32 hex digits: a blake2b hash of its shape, every image's pixels and every
    label, in order. Another image, a changed pixel, labels swapped between two images or a new order all
    change it; the file names and times do not (a copy of the data has the same digest).

    ordered=False: the same content in any order: a blake2b hash of the shape and the sorted hashes of each
    image's pixels with its label (as little-endian int64). A new order (a file renamed within its class)
    leaves it as it was; another image or label changes it."""
    return _split_digests(images)[0 if ordered else 1]


def data_digest(train_set: D.ImageSet, test_set: D.ImageSet) -> dict[str, str]:
    """What a run records of its data's content (config.json "data" "digest"): `split_digest` of each split,
    in order ("train", "test") and in any order ("train_unordered", "test_unordered"), compared on
    `train --resume` (both splits) and by `eval` (the test split)."""
    return data_digest_and_overlap(train_set, test_set)[0]


def data_digest_and_overlap(train_set: D.ImageSet, test_set: D.ImageSet) -> tuple[dict[str, str], int]:
    """`data_digest`, and how many test images (with their labels) are training images too, from the same read."""
    train, train_unordered, train_each = _split_hashes(train_set)
    test, test_unordered, test_each = _split_hashes(test_set)
    known = set(train_each)
    overlap = sum(h in known for h in test_each)
    return {"train": train, "test": test, "train_unordered": train_unordered, "test_unordered": test_unordered}, overlap


def data_changes(saved: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """What differs between a run's recorded dataset and `now` (`data_fingerprint`, with the "digest" of the
    splits at hand, if any), in words; [] if nothing does, or if the run recorded none (written before runs
    recorded their data). Content is compared where both recorded a split's digest and its count is the same:
    a new order alone (the order-free digests, where both have them, equal) is a change of the training split
    (it changes the shuffle), none of the test split."""
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
    before, after = saved.get("digest"), now.get("digest")
    if isinstance(before, dict) and isinstance(after, dict):
        for split, count, what in (("train", "train_size", "training"), ("test", "test_size", "test")):
            if split in after and split in before and before[split] != after[split] \
                    and saved.get(count) == now[count]:
                change = _content_change(split, what, before, after)
                if change:
                    changes.append(change)
    return changes


def _content_change(split: str, what: str, before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """How a split whose ordered digests differ changed, in words; None when only its order did and the split
    is the test split (measuring a test set does not depend on its order). Without an order-free digest on
    both sides (a run written before runs recorded one), a new order cannot be told from new content."""
    unordered = f"{split}_unordered"
    if unordered not in before or unordered not in after:
        return f"the {what} images' content: an image, a label or their order differs"
    if before[unordered] != after[unordered]:
        return f"the {what} images' content: an image or a label differs"
    if split == "test":
        return None
    return f"the {what} images' order (the same images and labels, in another order: a file renamed?)"
