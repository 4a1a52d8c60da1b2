"""CIFAR-10 ("python version"): find the six batch pickles (or the .tar.gz), read them safely.

Pickles are read with a restricted unpickler (numpy array reconstruction only), so a
tampered file cannot run code, nor build an array larger than the bytes it holds. A
batch must have the official shape (10000 images, checked before anything is copied)
and match the official file bit for bit (``CIFAR_BATCH_MD5``). An archive is extracted once into the cache,
atomically, reading members by name (no path from the archive is used).
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

import numpy as np
import torch

from attnconv.data.imageset import ImageSet
from attnconv.data.info import DatasetInfo, check_labels
from attnconv.data.sources import (
    CIFAR_DIR,
    CIFAR_TAR,
    CIFAR_URL,
    DOWNLOAD_MD5,
    LAYOUTS,
    cache_dir,
    check_searchable,
    download_or_explain,
    file_md5,
    how_to_get,
    odd_file,
)
from attnconv.errors import AttnconvError
from attnconv.fileio import open_regular

CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = "test_batch"
# MD5 of the official extracted batch files (the same values torchvision checks).
CIFAR_BATCH_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
# Every official batch file holds 10000 images; anything else is refused (tests shrink BATCH_ROWS).
OFFICIAL_ROWS = 10000
BATCH_ROWS = OFFICIAL_ROWS
_PIXELS = 3 * 32 * 32  # one row of b'data': 1024 R, 1024 G, 1024 B values


def max_batch_bytes(rows: int) -> int:
    """An upper bound on a batch file's size: the pixels plus generous room for labels and file names.

    (The official files are 31.0 MB; a larger file is refused before it is unpickled.)
    """
    return rows * (_PIXELS + 256) + (64 << 10)


class _Refused(Exception):
    """A batch pickle asked for something no CIFAR-10 batch contains."""


class _NdarrayName:
    """Stands in for ``numpy.ndarray`` in a batch pickle: handed to ``_reconstruct``, never called.

    A real batch only names ndarray as the type to reconstruct. Calling it, as in
    ``ndarray(shape, dtype, buffer, offset, strides)``, would build an array of any shape
    over a few bytes (zero strides): 200 bytes posing as 300,000 images.
    """

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise _Refused("calls numpy.ndarray(...) directly, which a CIFAR-10 batch never does")


_NDARRAY = _NdarrayName()
# numpy's array reconstruction function, whatever module this numpy version files it under.
_NP_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]


def _reconstruct(subtype: object, shape: object, dtype: object) -> np.ndarray:
    """numpy's ``_reconstruct``, limited to what ndarray pickles do: an empty array whose state follows.

    The state (BUILD: shape, dtype, raw bytes) goes through ``ndarray.__setstate__``, which
    insists the bytes are all there: an array costs what the file holds, no more.
    """
    if subtype is not _NDARRAY or shape != (0,) or dtype not in (b"b", "b"):
        raise _Refused(f"reconstructs {subtype!r} {shape!r} {dtype!r}, not a plain numpy array")
    return _NP_RECONSTRUCT(np.ndarray, (0,), b"b")


# The only globals a CIFAR batch pickle refers to: (module, name) -> object.
_PICKLE_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): np.dtype,
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only numpy's array reconstruction globals.

    Anything else (os.system, builtins.eval, ...) is refused before it is called,
    so a malicious file cannot run code. This is the project's rule for every
    pickle a user might have downloaded.
    """

    def __init__(self, file: io.BufferedIOBase, path: Path) -> None:
        super().__init__(file, encoding="bytes")
        self._path = path

    def find_class(self, module: str, name: str) -> object:
        try:
            return _PICKLE_ALLOWED[(module, name)]
        except KeyError:
            raise AttnconvError(
                f"{self._path}: refusing to load: the pickle asks for {module}.{name}, which a CIFAR-10 batch "
                "never contains (the file is not a CIFAR-10 batch, or it was tampered with)"
            ) from None


def _safe_unpickle(path: Path) -> object:
    size, limit = path.stat().st_size, max_batch_bytes(BATCH_ROWS)
    if size > limit:
        raise AttnconvError(
            f"{path}: {size} bytes, more than a CIFAR-10 batch of {BATCH_ROWS} images can take ({limit}); "
            "the file is not a CIFAR-10 batch"
        )
    try:
        with open_regular(path, "replace it with the dataset's file") as f:
            return _RestrictedUnpickler(f, path).load()
    except AttnconvError:
        raise
    except _Refused as e:
        raise AttnconvError(
            f"{path}: refusing to load: the pickle {e} (the file is not a CIFAR-10 batch, or it was tampered with)"
        ) from None
    except Exception as e:  # any parse failure of a corrupt file: UnpicklingError, EOFError, ValueError, ...
        raise AttnconvError(f"{path}: not a readable CIFAR-10 batch ({type(e).__name__}: {e})") from e


def _describe(x: object) -> str:
    if isinstance(x, np.ndarray):
        return f"{x.dtype} {x.shape} strides {x.strides}"
    return f"{type(x).__name__} of {len(x)}" if isinstance(x, list) else type(x).__name__


def check_batch(batch: object, path: Path, num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """A batch's ``(data uint8 (BATCH_ROWS, 3072), labels int64 (BATCH_ROWS,))``, or one error naming ``path``.

    A real batch is exactly that: a C-contiguous uint8 array (fixed shape, plain strides)
    and a list (or 1-d int array) of as many labels in 0..num_classes-1. Everything is
    checked before anything is copied, so a batch posing as a huge one costs nothing.
    """
    rows = BATCH_ROWS
    if not isinstance(batch, dict):
        raise AttnconvError(f"{path}: expected a dict, got {type(batch).__name__}")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if not (
        type(data) is np.ndarray and data.dtype == np.uint8 and data.shape == (rows, _PIXELS)
        and data.flags.c_contiguous and data.strides == (_PIXELS, 1)
    ):
        raise AttnconvError(
            f"{path}: b'data' must be a C-contiguous uint8 array ({rows}, {_PIXELS}) as in every CIFAR-10 "
            f"batch, got {_describe(data)}"
        )
    if type(labels) is np.ndarray and labels.dtype.kind in "iu" and labels.ndim == 1:
        if labels.shape != (rows,) or not labels.flags.c_contiguous:
            raise AttnconvError(f"{path}: {rows} images but labels {_describe(labels)}")
        labels = labels.astype(np.int64)
    elif isinstance(labels, list) and all(type(v) is int for v in labels):
        if len(labels) != rows:
            raise AttnconvError(f"{path}: {rows} images but {len(labels)} labels")
        labels = np.array(labels, dtype=np.int64)
    else:
        raise AttnconvError(f"{path}: b'labels' must be a list of ints, got {_describe(labels)}")
    check_labels(labels, path, num_classes)
    return data, labels


def _read_batch(path: Path, info: DatasetInfo, dirs: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> images uint8 (N, 3, 32, 32), labels int64 (N,)."""
    try:
        data, labels = check_batch(_safe_unpickle(path), path, info.num_classes)
        if len(data) == OFFICIAL_ROWS and path.name in CIFAR_BATCH_MD5:
            got = file_md5(path)
            if got != CIFAR_BATCH_MD5[path.name]:
                raise AttnconvError(
                    f"{path}: has the size of the official {path.name} but MD5 {got}, expected "
                    f"{CIFAR_BATCH_MD5[path.name]}; the file is corrupt"
                )
    except AttnconvError as e:
        raise AttnconvError(f"{e}; {how_to_get(info, dirs)}") from None
    # CIFAR rows are channel-major: 1024 R, then G, then B values, each 32 x 32 row-major.
    return data.reshape(-1, info.channels, info.size, info.size), labels


def _cifar_files_in(folder: Path) -> list[Path]:
    return [folder / n for n in (*CIFAR_TRAIN, CIFAR_TEST) if (folder / n).is_file()]


def _find_cifar(dirs: list[Path], info: DatasetInfo) -> Path | None:
    """A folder with all six batch files, extracting the first archive found on the way."""
    for base in dirs:
        for layout in LAYOUTS[info.name]:
            folder = base / layout
            if not folder.is_dir():
                continue
            check_searchable(folder)
            present = _cifar_files_in(folder)
            odd_file(info, [folder / n for n in (*CIFAR_TRAIN, CIFAR_TEST)], dirs)  # there but no file: named
            if len(present) == 6:
                return folder
            if present:
                missing = sorted({*CIFAR_TRAIN, CIFAR_TEST} - {p.name for p in present})
                raise AttnconvError(
                    f"{info.name}: {folder} has {', '.join(p.name for p in present)} but is missing "
                    f"{', '.join(missing)}; {how_to_get(info, dirs)}"
                )
        archive = base / CIFAR_TAR
        if archive.is_file():
            return _extract_cifar(archive, info, dirs)
    return None


def _archive_stamp(archive: Path) -> str:
    st = archive.stat()
    return f"{archive.resolve()}\n{st.st_size}\n{st.st_mtime_ns}\n"


def _extract_cifar(archive: Path, info: DatasetInfo, dirs: list[Path]) -> Path:
    """Extract the six batches of ``archive`` into ``cache_dir()/cifar-10-batches-py``, atomically.

    Members are read by name and written by us (no path from the archive is used,
    so no path traversal). A stamp file records which archive the folder came from;
    a matching folder is reused instead of extracting again.
    """
    target = cache_dir() / CIFAR_DIR
    stamp = _archive_stamp(archive)
    stamp_file = target / ".source"
    if stamp_file.is_file() and stamp_file.read_text() == stamp and len(_cifar_files_in(target)) == 6:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{CIFAR_DIR}."))
    try:
        wanted = {*CIFAR_TRAIN, CIFAR_TEST, "batches.meta"}
        try:
            with open_regular(archive, "replace it with the dataset's archive") as raw, \
                    tarfile.open(fileobj=raw, mode="r:gz") as tar:
                for member in tar:
                    parts = Path(member.name).parts
                    if member.isfile() and len(parts) == 2 and parts[0] == CIFAR_DIR and parts[1] in wanted:
                        if member.size > max_batch_bytes(BATCH_ROWS):
                            raise AttnconvError(
                                f"{archive}: member {member.name} is {member.size} bytes, more than a CIFAR-10 "
                                f"batch can take ({max_batch_bytes(BATCH_ROWS)}); the archive is not CIFAR-10; "
                                f"{how_to_get(info, dirs)}"
                            )
                        src = tar.extractfile(member)
                        assert src is not None
                        with src, open(tmp / parts[1], "wb") as out:
                            shutil.copyfileobj(src, out)
        except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
            raise AttnconvError(
                f"{archive}: corrupt archive ({type(e).__name__}: {e}); {how_to_get(info, dirs)}"
            ) from e
        missing = sorted({*CIFAR_TRAIN, CIFAR_TEST} - {p.name for p in _cifar_files_in(tmp)})
        if missing:
            raise AttnconvError(
                f"{archive}: archive lacks {CIFAR_DIR}/{', '.join(missing)}; {how_to_get(info, dirs)}"
            )
        (tmp / ".source").write_text(stamp)
        if target.exists():  # a directory cannot be renamed over a non-empty one: move the old one aside
            old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{CIFAR_DIR}.old."))
            os.replace(target, old / "x")
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process (e.g. a second DDP rank) won the race with the same archive.
            if not (stamp_file.is_file() and stamp_file.read_text() == stamp):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_cifar(info: DatasetInfo, dirs: list[Path], allow_download: bool) -> tuple[ImageSet, ImageSet]:
    """Find (or download into the cache and extract) and read CIFAR-10: (train, test)."""
    folder = _find_cifar(dirs, info)
    if folder is None:
        if not allow_download:
            raise AttnconvError(f"{info.name} not found and download=False; {how_to_get(info, dirs)}")
        archive = cache_dir() / CIFAR_TAR
        download_or_explain(CIFAR_URL, archive, DOWNLOAD_MD5[CIFAR_TAR], info, dirs)
        folder = _extract_cifar(archive, info, dirs)

    def split(names: tuple[str, ...]) -> ImageSet:
        parts = [_read_batch(folder / n, info, dirs) for n in names]
        images = np.concatenate([p[0] for p in parts])  # (N, 3, 32, 32)
        labels = np.concatenate([p[1] for p in parts])  # (N,)
        return ImageSet(torch.from_numpy(images), torch.from_numpy(labels))

    return split(CIFAR_TRAIN), split((CIFAR_TEST,))
