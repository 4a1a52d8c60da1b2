"""Fashion-MNIST: find the four IDX files (raw or .gz), check them, return two ``ImageSet``.

Each file's header is checked against what the file must hold (uint8, (N, 28, 28) or
(N,), N at most the official 60000/10000) before its payload is read, and then
exactly the promised bytes are read: a gzip bomb costs at most the official size.

A file that claims to be a full official split (60000/10000 items) must also match
the official data bit for bit (``FASHION_SHA256`` of the decompressed IDX bytes).
The check is on the decompressed bytes because the Debian package's .gz files do
not have the official MD5s (their gzip headers differ: no stored file name, a 2020
time stamp), so a check on the .gz would reject the copy every run on these
machines uses.
"""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path

import numpy as np
import torch

from attnconv.data.idx import IdxHeader, open_idx, read_header, read_payload
from attnconv.data.imageset import ImageSet
from attnconv.data.info import DatasetInfo, check_labels
from attnconv.data.sources import (
    DOWNLOAD_MD5,
    FASHION_URL,
    LAYOUTS,
    cache_dir,
    check_searchable,
    download_or_explain,
    file_md5,
    how_to_get,
    odd_file,
)
from attnconv.errors import AttnconvError
from attnconv.fileio import Unreadable

FASHION_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
# SHA-256 of the decompressed IDX files, measured on the Debian package
# dataset-fashion-mnist 0.0~git20200523.55506a9-1 (60000/10000 items, 6000/1000 per
# class). Its .gz files are each exactly len(name) + 1 bytes shorter than the official
# ones (the stored file name is gone), consistent with a re-written gzip header around
# the same data; not cross-checked against a fresh official download (offline here).
FASHION_SHA256 = {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}


def _find_fashion(dirs: list[Path], info: DatasetInfo, resumable: Path | None = None) -> dict[str, Path] | None:
    """First directory holding all four IDX files (raw or .gz).

    A folder with only some of them is an error, except ``resumable`` (our download
    folder), where a half-finished download counts as "not found" so it gets completed.
    """
    for base in dirs:
        for layout in LAYOUTS[info.name]:
            folder = base / layout
            if not folder.is_dir():
                continue
            check_searchable(folder)
            found: dict[str, Path] = {}
            for stem in FASHION_FILES:
                for candidate in (folder / stem, folder / f"{stem}.gz"):  # raw first: no gunzip
                    if candidate.is_file():
                        found[stem] = candidate
                        break
                else:  # there but no file (a folder, a device, a link to nowhere): named, not called missing
                    odd_file(info, [folder / stem, folder / f"{stem}.gz"], dirs)
            if len(found) == len(FASHION_FILES):
                return found
            if found and resumable is not None and folder.resolve() == resumable.resolve():
                continue  # keep searching; if nothing else turns up, the download completes it
            if found:
                missing = [s for s in FASHION_FILES if s not in found]
                raise AttnconvError(
                    f"{info.name}: {folder} has {', '.join(p.name for p in found.values())} but is missing "
                    f"{', '.join(m + '[.gz]' for m in missing)}; {how_to_get(info, dirs)}"
                )
    return None


def _is_official_fashion(path: Path, sha256: str, stem: str) -> bool:
    """The decompressed bytes are the known ones, or the file is the official .gz (its MD5)."""
    if sha256 == FASHION_SHA256[stem]:
        return True
    return path.suffix == ".gz" and file_md5(path) == DOWNLOAD_MD5[f"{stem}.gz"]


def _check_header(header: IdxHeader, path: Path, stem: str, info: DatasetInfo) -> None:
    """The header must describe what ``stem`` holds (uint8 labels (N,) or images (N, 28, 28)), N at most
    the official count: checked before any of the payload is read."""
    ndim = 3 if "images" in stem else 1
    if header.dtype != np.uint8 or len(header.dims) != ndim:
        raise AttnconvError(f"{path}: expected uint8 with {ndim} dims, got {header.dtype} {header.dims}")
    if ndim == 3 and header.dims[1:] != (info.size, info.size):
        raise AttnconvError(f"{path}: images are {header.dims[1:]}, expected ({info.size}, {info.size})")
    official = info.train_size if stem.startswith("train") else info.test_size
    if header.dims[0] > official:
        raise AttnconvError(
            f"{path}: header says {header.dims[0]} items, more than the {official} of the official {stem}; "
            "the file is corrupt or not Fashion-MNIST"
        )


def _read_idx_file(path: Path, stem: str, info: DatasetInfo, dirs: list[Path]) -> np.ndarray:
    """One IDX file -> uint8 (N,) labels or (N, 28, 28) images, reading at most what its checked header says."""
    try:
        try:
            with open_idx(path) as f:
                header = read_header(f, path)
                _check_header(header, path, stem, info)
                array = read_payload(f, header, path)
        except (OSError, EOFError, zlib.error) as e:
            raise AttnconvError(f"{path}: cannot read ({type(e).__name__}: {e}); the file is corrupt") from e
        official = info.train_size if stem.startswith("train") else info.test_size
        if len(array) == official:
            digest = hashlib.sha256(header.raw)
            digest.update(array.data)
            if not _is_official_fashion(path, digest.hexdigest(), stem):
                raise AttnconvError(
                    f"{path}: has the size of the official {stem} but not its content (SHA-256 mismatch); "
                    "the file is corrupt"
                )
        if array.ndim == 1:
            check_labels(array, path, info.num_classes)
    except Unreadable:  # there and sound: the permission is the fix, not getting the dataset
        raise
    except AttnconvError as e:
        raise AttnconvError(f"{e}; {how_to_get(info, dirs)}") from None
    return array


def load_fashion(info: DatasetInfo, dirs: list[Path], allow_download: bool) -> tuple[ImageSet, ImageSet]:
    """Find (or download into the cache) and read Fashion-MNIST: (train, test)."""
    target = cache_dir() / "fashion-mnist"
    files = _find_fashion(dirs, info, resumable=target if allow_download else None)
    if files is None:
        if not allow_download:
            raise AttnconvError(f"{info.name} not found and download=False; {how_to_get(info, dirs)}")
        for stem in FASHION_FILES:
            if not (target / stem).is_file() and not (target / f"{stem}.gz").is_file():
                name = f"{stem}.gz"
                download_or_explain(FASHION_URL + name, target / name, DOWNLOAD_MD5[name], info, dirs)
        files = _find_fashion([target], info)
        assert files is not None

    def split(prefix: str) -> ImageSet:
        image_path, label_path = files[f"{prefix}-images-idx3-ubyte"], files[f"{prefix}-labels-idx1-ubyte"]
        images = _read_idx_file(image_path, f"{prefix}-images-idx3-ubyte", info, dirs)
        labels = _read_idx_file(label_path, f"{prefix}-labels-idx1-ubyte", info, dirs)
        if len(images) != len(labels):
            raise AttnconvError(
                f"{image_path} has {len(images)} images but {label_path} has "
                f"{len(labels)} labels; {how_to_get(info, dirs)}"
            )
        return ImageSet(
            torch.from_numpy(images).unsqueeze(1),  # (N, 1, 28, 28); the reader's own writable buffer
            torch.from_numpy(labels.astype(np.int64)),  # (N,)
        )

    return split("train"), split("t10k")
