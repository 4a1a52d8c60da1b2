"""The two entry points by dataset name: ``dataset_info`` and ``load_dataset``."""

from __future__ import annotations

import os
from pathlib import Path

from attnconv.data.cifar import load_cifar
from attnconv.data.fashion import load_fashion
from attnconv.data.imageset import ImageSet
from attnconv.data.info import DatasetInfo, builtin_info
from attnconv.data.sources import search_dirs
from attnconv.errors import AttnconvError


def dataset_info(name: str) -> DatasetInfo:
    """Return the ``DatasetInfo`` for ``name`` (case-insensitive; ``fashion_mnist`` works too)."""
    return builtin_info(name)


def load_dataset(
    name: str, data_dir: str | os.PathLike | None = None, download: bool = True
) -> tuple[ImageSet, ImageSet]:
    """Load ``(train, test)`` for ``"cifar10"`` or ``"fashion-mnist"``.

    Searches ``search_dirs(name, data_dir)`` (see ``sources``); if the dataset is
    nowhere and ``download`` is true, downloads the official files into ``cache_dir()``
    with MD5 verification. Any missing, truncated, corrupt or wrong-checksum file
    raises one ``AttnconvError`` naming the file and how to get it.
    """
    info = builtin_info(name)
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        raise AttnconvError(f"data directory {data_dir} does not exist (or is not a directory)")
    dirs = search_dirs(info.name, data_dir)
    if info.name == "fashion-mnist":
        return load_fashion(info, dirs, download)
    return load_cifar(info, dirs, download)
