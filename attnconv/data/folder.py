"""Any folder of images as a dataset: ``folder:PATH`` (the layout is in ``folder_layout``).

The first load decodes every image once (``decode``: RGB, or L when every image is
grey; shorter side resized to ``image_size``, center-cropped) into the cache
(``folder_cache``), computing the per-channel mean/std of the training split on the
way; later loads map the cache and decode nothing. The result is the usual pair of
``ImageSet`` (uint8 (N, C, S, S) + int64 labels), so the batched augmentation and
``iterate_batches`` apply unchanged.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from attnconv.data import decode
from attnconv.data.folder_cache import (
    build_cache,
    closed_entry,
    discard,
    open_cache,
    prune,
    remove_dead_temporaries,
)
from attnconv.data.folder_layout import FolderLayout, scan_folder
from attnconv.data.imageset import ImageSet
from attnconv.data.info import DatasetInfo
from attnconv.data.sources import cache_dir
from attnconv.errors import AttnconvError
from attnconv.limits import shown_value

log = logging.getLogger(__name__)

FOLDER_PREFIX = "folder:"
DEFAULT_IMAGE_SIZE = 32
MAX_IMAGE_SIZE = 4096
_CHUNK = 256  # images decoded per round of the thread pool


def folder_path(name: str) -> Path | None:
    """The folder of a ``folder:PATH`` dataset name (absolute, ``~`` expanded), or None for other names."""
    if not isinstance(name, str):  # every dataset name passes here first: one line, not str's missing .strip
        hint = f" (a folder: 'folder:{os.fspath(name)}')" if isinstance(name, os.PathLike) else ""
        raise AttnconvError(f"dataset {shown_value(name)} is invalid: give a dataset's name (fashion-mnist, cifar10) "
                            f"or 'folder:PATH', a str{hint}")
    if not name.strip().lower().startswith(FOLDER_PREFIX):
        return None
    raw = name.strip()[len(FOLDER_PREFIX):]
    if "\0" in raw:
        raise AttnconvError(f"dataset {name!r} is invalid: a path holds no NUL character; write {FOLDER_PREFIX}PATH")
    if not raw:
        raise AttnconvError(f"dataset {name!r} names no folder; write {FOLDER_PREFIX}PATH, e.g. folder:~/my-images")
    return Path(os.path.abspath(os.path.expanduser(raw)))


def check_image_size(image_size: object) -> int:
    """``image_size`` as an int in 1..MAX_IMAGE_SIZE, or one error saying what is allowed."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or not 1 <= image_size <= MAX_IMAGE_SIZE:
        raise AttnconvError(f"image size must be an integer from 1 to {MAX_IMAGE_SIZE}, got {image_size!r}")
    return image_size


def available_memory() -> int:
    """Bytes of memory this process can still get: MemAvailable, capped by a cgroup (v2) limit if any."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            available = min(available, max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return available


def decode_budget() -> decode.DecodeBudget:
    """The memory that decoding images may take at once: ``decode.MAX_DECODE_BYTES``, or half of what
    is free if that is less, but never under ``decode.MIN_DECODE_BYTES`` (an ordinary photo always
    decodes); `decode.decode_image` refuses an image that alone needs more."""
    half = max(decode.MIN_DECODE_BYTES, available_memory() // 2)
    return decode.DecodeBudget(min(decode.MAX_DECODE_BYTES, half))


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _check_fits(layout: FolderLayout, channels: int, size: int) -> None:
    need = len(layout.files) * channels * size * size
    have = available_memory()
    if need > have:
        raise AttnconvError(
            f"{layout.root}: {len(layout.files)} images of {channels}x{size}x{size} need {_gib(need)} of memory, "
            f"only {_gib(have)} is available; use a smaller --image-size or fewer images"
        )


def _stats(hist: np.ndarray, count: int) -> tuple[list[float], list[float]]:
    """Per-channel mean and population std in [0, 1] units from per-channel histograms (C, 256)."""
    values = np.arange(256, dtype=np.float64) / 255.0
    mean = hist @ values / count  # (C,)
    var = (hist * (values[None, :] - mean[:, None]) ** 2).sum(axis=1) / count
    return mean.tolist(), np.sqrt(var).tolist()


def _decode_all(layout: FolderLayout, grey: bool, size: int, images: np.ndarray) -> np.ndarray:
    """Decode every image into ``images`` (in order); return the train split's histograms (C, 256)."""
    channels = images.shape[1]
    hist = np.zeros((channels, 256), dtype=np.int64)
    paths = [layout.root / rel for rel, _ in layout.files]
    n_train = len(layout.train)
    budget = decode_budget()  # what the decoding threads may hold at once; each image reserves its share

    def one(path: Path) -> np.ndarray:
        return decode.decode_image(path, grey, size, budget=budget)

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:  # Pillow decodes without the GIL
        for start in range(0, len(paths), _CHUNK):
            chunk = paths[start : start + _CHUNK]
            for i, pixels in enumerate(pool.map(one, chunk)):
                images[start + i] = pixels
            train_part = images[start : min(start + _CHUNK, n_train)]  # (b, C, S, S)
            for c in range(channels):
                hist[c] += np.bincount(train_part[:, c].ravel(), minlength=256)
    return hist


def _build(layout: FolderLayout, size: int, target: Path) -> None:
    """Decode the folder into the cache ``target``; remove the older caches of the same folder and size."""
    greys = [decode.probe_grey(layout.root / rel) for rel, _ in layout.files]  # every header, no short cut
    grey = all(greys)
    channels = 1 if grey else 3
    _check_fits(layout, channels, size)
    log.info("decoding %d images of %s into %s", len(layout.files), layout.root, target)

    def fill(images: np.ndarray) -> dict:
        hist = _decode_all(layout, grey, size, images)
        mean, std = _stats(hist, len(layout.train) * size * size)
        return {
            "folder": str(layout.root), "image_size": size, "channels": channels, "size": size,
            "mode": "L" if grey else "RGB", "classes": list(layout.classes), "test_split": layout.test_split,
            "train_size": len(layout.train), "test_size": len(layout.test), "mean": mean, "std": std,
        }

    labels = np.array([label for _, label in layout.files], dtype=np.int64)
    build_cache(target, labels, (channels, size, size), fill)
    prune(target, lambda index: index.get("folder") == str(layout.root) and index.get("image_size") == size)


def _prepare(root: Path, image_size: int) -> tuple[DatasetInfo, np.ndarray, np.ndarray, int]:
    """Scan ``root``, build its cache if needed; (info, images memmap, labels, train size)."""
    size = check_image_size(image_size)
    layout = scan_folder(root)
    target = cache_dir() / "folders" / layout.cache_key(size)
    remove_dead_temporaries(target.parent)
    cached = open_cache(target)
    if cached is not None and not _index_fits(cached[0], layout):  # edited: rebuilt, never trusted
        cached = None
        discard(target)
    if cached is None:
        closed = closed_entry(target)  # another user's entry (or a cache folder this user may not enter): said first,
        if closed is not None:  # not after decoding the whole folder
            raise AttnconvError(closed)
        _check_fits(layout, 1, size)  # fail fast, before opening every file, if even grey cannot fit
        with decode.quiet():  # once for all the threads: their own catch_warnings race each other
            _build(layout, size, target)
        cached = open_cache(target)
        if cached is None:
            raise AttnconvError(f"{target}: the cache just written cannot be read back; delete it and try again")
    index, images, labels = cached
    std = [float(v) for v in index["std"]]
    if any(v > 0 for v in std):  # a channel of one value while others vary (two-band data as RGB): left at 0 by
        std = [v if v > 0 else 1.0 for v in std]  # its mean alone; images all of one value are refused by training
    info = DatasetInfo(
        name=f"{FOLDER_PREFIX}{layout.root}",
        channels=int(index["channels"]),
        size=int(index["size"]),
        num_classes=len(index["classes"]),
        mean=tuple(float(m) for m in index["mean"]),
        std=tuple(std),
        classes=tuple(index["classes"]),
        train_size=int(index["train_size"]),
        test_size=int(index["test_size"]),
        stats_source=f"channel_stats() over the {index['train_size']} training images of {layout.root} at {size}x{size}",
    )
    return info, images, labels, info.train_size


def _index_fits(index: dict, layout: FolderLayout) -> bool:
    """Whether a cache entry's index says what its folder holds (classes, split sizes), with statistics a folder of
    images can have (in [0, 1], a spread of 0 or one that uint8 pixels can make): an edited one is rebuilt."""
    stats_ok = all(0 <= m <= 1 for m in index["mean"]) and all(s == 0 or 1e-9 <= s <= 0.5 for s in index["std"])
    return stats_ok and index["classes"] == list(layout.classes) and index["train_size"] == len(layout.train) \
        and index["test_size"] == len(layout.test)


def folder_info(root: Path, image_size: int = DEFAULT_IMAGE_SIZE) -> DatasetInfo:
    """The ``DatasetInfo`` of the image folder ``root`` at ``image_size`` (decodes it once, see the module doc)."""
    return _prepare(root, image_size)[0]


def load_folder(root: Path, image_size: int = DEFAULT_IMAGE_SIZE) -> tuple[ImageSet, ImageSet]:
    """``(train, test)`` of the image folder ``root``: uint8 (N, C, S, S) memory-mapped images, int64 labels."""
    _, images, labels, n_train = _prepare(root, image_size)
    labels_t = torch.from_numpy(labels)
    train = ImageSet(torch.from_numpy(images[:n_train]), labels_t[:n_train])
    test = ImageSet(torch.from_numpy(images[n_train:]), labels_t[n_train:])
    return train, test
