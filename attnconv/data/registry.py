"""The entry points by dataset name: ``dataset_info``, ``load_dataset``, ``canonical_name``.

A name is a built-in dataset (``cifar10``, ``fashion-mnist``, aliases) or
``folder:PATH``, any folder of images in the ImageFolder layout (see ``folder``).
``image_size`` applies to folder datasets (default 32); a built-in dataset accepts
only its own size.
"""

from __future__ import annotations

import os

from attnconv.data.cifar import load_cifar
from attnconv.data.fashion import load_fashion
from attnconv.data.folder import (
    DEFAULT_IMAGE_SIZE,
    FOLDER_PREFIX,
    check_image_size,
    folder_info,
    folder_path,
    load_folder,
)
from attnconv.data.imageset import ImageSet
from attnconv.data.info import DatasetInfo, builtin_info
from attnconv.data.sources import search_dirs
from attnconv.errors import AttnconvError
from attnconv.limits import flag_argument, path_argument


def _builtin(name: str, image_size: int | None) -> DatasetInfo:
    try:
        info = builtin_info(name)
    except AttnconvError as e:
        raise AttnconvError(f"{e}, or {FOLDER_PREFIX}PATH for a folder of images (PATH/train/<class>/...)") from None
    if image_size is not None and check_image_size(image_size) != info.size:
        raise AttnconvError(
            f"image size {image_size} does not apply to {info.name}, whose images are {info.size}x{info.size}; "
            f"leave it out (image sizes are for {FOLDER_PREFIX}PATH datasets)"
        )
    return info


def canonical_name(name: str) -> str:
    """The dataset's canonical name without reading any file: ``cifar10``, ``fashion-mnist`` or
    ``folder:/absolute/path``. Raises for an unknown name (cheap enough for config validation)."""
    folder = folder_path(name)
    return f"{FOLDER_PREFIX}{folder}" if folder is not None else _builtin(name, None).name


def dataset_info(name: str, *, image_size: int | None = None) -> DatasetInfo:
    """The ``DatasetInfo`` for ``name`` (case-insensitive for built-ins; ``fashion_mnist`` works too).

    For ``folder:PATH`` this scans the folder and, the first time for its current
    contents and ``image_size`` (default 32), decodes it into the cache (the mean/std
    come from its training images).
    """
    folder = folder_path(name)
    if folder is not None:
        return folder_info(folder, DEFAULT_IMAGE_SIZE if image_size is None else image_size)
    return _builtin(name, image_size)


def load_dataset(
    name: str, data_dir: str | os.PathLike | None = None, download: bool = True, *, image_size: int | None = None
) -> tuple[ImageSet, ImageSet]:
    """Load ``(train, test)`` for ``"cifar10"``, ``"fashion-mnist"`` or ``"folder:PATH"``.

    Built-in datasets: searches ``search_dirs(name, data_dir)`` (see ``sources``); if the
    dataset is nowhere and ``download`` is true, downloads the official files into
    ``cache_dir()`` with MD5 verification. Any missing, truncated, corrupt or
    wrong-checksum file raises one ``AttnconvError`` naming the file and how to get it.

    ``folder:PATH``: the images of PATH at ``image_size`` (default 32), decoded once
    into the cache and memory-mapped; ``data_dir`` and ``download`` do not apply.
    """
    folder = folder_path(name)
    if folder is not None:
        return load_folder(folder, DEFAULT_IMAGE_SIZE if image_size is None else image_size)
    download = flag_argument(download, "download")
    info = _builtin(name, image_size)
    if data_dir is not None and not path_argument(data_dir, "data_dir", "the folder holding the dataset's files"
                                                  ).is_dir():
        raise AttnconvError(f"data directory {data_dir} does not exist (or is not a directory)")
    dirs = search_dirs(info.name, data_dir)
    if info.name == "fashion-mnist":
        return load_fashion(info, dirs, download)
    return load_cifar(info, dirs, download)
