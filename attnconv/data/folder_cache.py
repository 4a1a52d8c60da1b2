"""The decoded-images cache of a folder dataset: one directory per (folder contents, image size).

    $XDG_CACHE_HOME/attnconv/folders/<key>/
        images.npy    uint8 (N, C, S, S), train images then test images; memory-mapped on load
        labels.npy    int64 (N,)
        index.json    classes, split sizes, channels, size, mean/std, the folder it came from

The directory is built under a temporary name next to it and renamed into place
(a reader sees all of it or none of it); a cache that does not match its index is
treated as absent and rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attnconv.errors import AttnconvError
from attnconv.fileio import atomic_write, fsync_dir

INDEX, IMAGES, LABELS = "index.json", "images.npy", "labels.npy"
CACHE_FORMAT = 1


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_index(directory: Path) -> dict | None:
    """The cache's index, or None when it is missing, unreadable or of another format."""
    try:
        index = json.loads((directory / INDEX).read_text())
    except (OSError, ValueError):
        return None
    return index if isinstance(index, dict) and index.get("format") == CACHE_FORMAT else None


def open_cache(directory: Path) -> tuple[dict, np.ndarray, np.ndarray] | None:
    """``(index, images (N, C, S, S) memory-mapped, labels (N,))``, or None if absent or inconsistent.

    The images are mapped copy-on-write (``mmap_mode="c"``): pages are read from the
    file on demand and shared between processes, and the array is writable for torch
    (writes stay private to the process, the file never changes).
    """
    index = read_index(directory)
    if index is None:
        return None
    try:
        images = np.load(directory / IMAGES, mmap_mode="c", allow_pickle=False)
        labels = np.load(directory / LABELS, allow_pickle=False)
        n = int(index["train_size"]) + int(index["test_size"])
        shape = (n, int(index["channels"]), int(index["size"]), int(index["size"]))
        num_classes = len(index["classes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if images.dtype != np.uint8 or images.shape != shape or labels.dtype != np.int64 or labels.shape != (n,):
        return None
    if n and (labels.min() < 0 or labels.max() >= num_classes):
        return None
    return index, images, labels


def build_cache(
    target: Path, labels: np.ndarray, item_shape: tuple[int, int, int], fill: Callable[[np.ndarray], dict]
) -> None:
    """Create ``target``: ``fill(images)`` decodes into the (N, *item_shape) uint8 array and returns the index.

    Everything is written under a temporary directory next to ``target`` and renamed into
    place; on any failure the temporary directory is removed and ``target`` is untouched.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".attnconv-tmp"))
    try:
        try:
            images = np.lib.format.open_memmap(tmp / IMAGES, mode="w+", dtype=np.uint8, shape=(len(labels), *item_shape))
            index = fill(images)
            images.flush()
            del images
            _fsync(tmp / IMAGES)
            np.save(tmp / LABELS, labels.astype(np.int64), allow_pickle=False)
            _fsync(tmp / LABELS)
            atomic_write(tmp / INDEX, lambda p: p.write_text(json.dumps({"format": CACHE_FORMAT, **index}, indent=1)))
        except OSError as e:
            raise AttnconvError(
                f"cannot write the decoded images to {target.parent} ({e.strerror or e}); free space there, "
                "or set XDG_CACHE_HOME to a disk with room"
            ) from e
        if target.exists():
            if open_cache(target) is not None:  # another process (a second DDP rank) built it meanwhile
                return
            # an inconsistent cache: a directory cannot be renamed over a non-empty one, move it aside
            old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old.", suffix=".attnconv-tmp"))
            os.replace(target, old / "x")
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if open_cache(target) is None:  # not another process that won the race with the same folder
                raise
        fsync_dir(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prune(target: Path, same_source: Callable[[dict], bool]) -> None:
    """Delete the other caches next to ``target`` that ``same_source`` claims (older versions of one folder)."""
    for other in target.parent.iterdir():
        if other == target or other.name.startswith(".") or not other.is_dir():
            continue
        index = read_index(other)
        if index is not None and same_source(index):
            shutil.rmtree(other, ignore_errors=True)
