"""Datasets (CIFAR-10, Fashion-MNIST) and the tensor-side input pipeline.

Three parts, top to bottom:

1. ``DatasetInfo`` / ``dataset_info``: shape, classes and normalization constants.
2. ``load_dataset``: find the files (or download them, checksum-verified), parse
   them with our own readers (IDX with numpy; CIFAR pickles through a restricted
   unpickler) and return two ``ImageSet`` of uint8 images.
3. ``iterate_batches``: deterministic, shardable batches with batched random
   crop + flip and per-channel normalization, all on tensors (no torchvision).

Where files are searched, in order (first hit wins):

    data_dir argument -> $ATTNCONV_DATA -> cache_dir() -> system dirs
    (Fashion-MNIST: /usr/share/datasets/fashion-mnist, Debian `dataset-fashion-mnist`)

A folder that holds *some* but not all files of a dataset is an error (never
partial data, never a silent fall-through to another copy).

Integrity checks:

- downloads are verified against the official MD5 of the archive before they
  are renamed into place;
- every file is validated structurally (IDX magic, dims, exact payload length;
  gzip CRC; pickle content types, shapes, label range);
- a file that claims to be a full official split (Fashion-MNIST 60000/10000
  items, CIFAR-10 batch of 10000 images) must also match the official data
  bit for bit (``_FASHION_SHA256`` of the decompressed IDX bytes, ``_CIFAR_BATCH_MD5``
  of the batch files). The Fashion-MNIST check is on the decompressed bytes because
  the Debian package's .gz files do not have the official MD5s (their gzip headers
  differ: no stored file name, a 2020 time stamp), so a check on the .gz would reject
  the copy every run on these machines uses.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import logging
import math
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from attnconv.errors import AttnconvError

__all__ = [
    "DATASETS",
    "Batches",
    "DatasetInfo",
    "ImageSet",
    "cache_dir",
    "channel_stats",
    "crop_flip",
    "dataset_info",
    "download",
    "iterate_batches",
    "load_dataset",
    "normalize",
    "num_batches",
    "random_crop_flip",
    "search_dirs",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- info


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a dataset.

    ``mean`` and ``std`` are per channel, in [0, 1] pixel units, over every pixel
    of the training set (population std, ddof=0); ``stats_source`` says where the
    numbers come from.
    """

    name: str
    channels: int
    size: int  # images are size x size
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: tuple[str, ...]
    train_size: int
    test_size: int
    stats_source: str


DATASETS: dict[str, DatasetInfo] = {
    "cifar10": DatasetInfo(
        name="cifar10",
        channels=3,
        size=32,
        num_classes=10,
        # Per-channel mean / population std of the 50000 x 32 x 32 training pixels.
        # Not recomputed here (these machines are offline, no CIFAR-10 copy); they are
        # the widely published values, and `channel_stats(load_dataset("cifar10")[0])`
        # reproduces them. (The (0.2023, 0.1994, 0.2010) that circulates in CIFAR code
        # is not the pixel std.)
        mean=(0.49139968, 0.48215841, 0.44653091),
        std=(0.24703223, 0.24348513, 0.26158784),
        classes=(
            "airplane", "automobile", "bird", "cat", "deer",
            "dog", "frog", "horse", "ship", "truck",
        ),
        train_size=50000,
        test_size=10000,
        stats_source="published CIFAR-10 training-set pixel statistics (50000 images)",
    ),
    "fashion-mnist": DatasetInfo(
        name="fashion-mnist",
        channels=1,
        size=28,
        num_classes=10,
        # Measured with `channel_stats` on the 60000 training images of the Debian
        # package dataset-fashion-mnist (0.0~git20200523.55506a9-1); tested in
        # tests/test_data.py when the package is installed.
        mean=(0.2860406,),
        std=(0.3530242,),
        classes=(
            "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
            "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
        ),
        train_size=60000,
        test_size=10000,
        stats_source="channel_stats() over the 60000 Fashion-MNIST training images",
    ),
}

_ALIASES = {"cifar-10": "cifar10", "fashion_mnist": "fashion-mnist", "fashionmnist": "fashion-mnist"}


def dataset_info(name: str) -> DatasetInfo:
    """Return the ``DatasetInfo`` for ``name`` (case-insensitive; ``fashion_mnist`` works too)."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DATASETS:
        raise AttnconvError(f"unknown dataset {name!r}; valid names: {', '.join(sorted(DATASETS))}")
    return DATASETS[key]


# --------------------------------------------------------------------------- ImageSet


@dataclass
class ImageSet:
    """A labelled image set held in memory.

    images: uint8 (N, C, H, W); labels: int64 (N,).
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise AttnconvError(
                f"ImageSet.images must be uint8 (N, C, H, W), got {self.images.dtype} {tuple(self.images.shape)}"
            )
        if self.labels.dtype != torch.int64 or self.labels.dim() != 1:
            raise AttnconvError(f"ImageSet.labels must be int64 (N,), got {self.labels.dtype} {tuple(self.labels.shape)}")
        if len(self.images) != len(self.labels):
            raise AttnconvError(f"ImageSet has {len(self.images)} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)

    def to(self, device: torch.device | str) -> ImageSet:
        """Copy to ``device`` (e.g. the whole uint8 set on the GPU once, then batches never cross PCIe)."""
        return ImageSet(self.images.to(device), self.labels.to(device))


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and population std, in [0, 1] units, of uint8 images (N, C, H, W).

    Accumulated in float64 one channel at a time (exact enough for 50000 CIFAR images).
    """
    means, stds = [], []
    for c in range(images.shape[1]):
        v = images[:, c].to(torch.float64) / 255.0  # (N, H, W)
        m = v.mean()
        means.append(float(m))
        stds.append(float(((v - m) ** 2).mean().sqrt()))
    return tuple(means), tuple(stds)


# --------------------------------------------------------------------------- where files live

FASHION_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"

_FASHION_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
# MD5 of the official .gz files (Fashion-MNIST README) and of the CIFAR archive
# (https://www.cs.toronto.edu/~kriz/cifar.html). Checked on every download.
_DOWNLOAD_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12e480ee83cd310",
    "cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a",
}
# SHA-256 of the decompressed IDX files, measured on the Debian package
# dataset-fashion-mnist 0.0~git20200523.55506a9-1 (60000/10000 items, 6000/1000 per
# class). Its .gz files are each exactly len(name) + 1 bytes shorter than the official
# ones (the stored file name is gone), consistent with a re-written gzip header around
# the same data; not cross-checked against a fresh official download (offline here).
_FASHION_SHA256 = {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
_CIFAR_DIR = "cifar-10-batches-py"
_CIFAR_TAR = "cifar-10-python.tar.gz"
_CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST = "test_batch"
# MD5 of the official extracted batch files (the same values torchvision checks).
_CIFAR_BATCH_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
_CIFAR_OFFICIAL_BATCH = 10000

# System-wide installs, searched last. Module-level so tests can replace it.
SYSTEM_DIRS: dict[str, tuple[Path, ...]] = {
    "cifar10": (),
    "fashion-mnist": (Path("/usr/share/datasets/fashion-mnist"),),
}
# Sub-folders accepted inside a search directory ("." = files directly inside).
_LAYOUTS: dict[str, tuple[str, ...]] = {
    "cifar10": (_CIFAR_DIR, "."),
    "fashion-mnist": (".", "fashion-mnist", "FashionMNIST/raw"),
}


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/attnconv``, or ``~/.cache/attnconv``; downloads go here."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attnconv"


def search_dirs(name: str, data_dir: str | os.PathLike | None = None) -> list[Path]:
    """The directories ``load_dataset`` looks in, in order (existing or not)."""
    info = dataset_info(name)
    dirs: list[Path] = []
    if data_dir is not None:
        dirs.append(Path(data_dir).expanduser())
    if os.environ.get("ATTNCONV_DATA"):
        dirs.append(Path(os.environ["ATTNCONV_DATA"]).expanduser())
    dirs.append(cache_dir())
    dirs.extend(SYSTEM_DIRS.get(info.name, ()))
    return dirs


def _how_to_get(info: DatasetInfo, dirs: list[Path]) -> str:
    where = ", ".join(str(d) for d in dirs)
    if info.name == "fashion-mnist":
        fix = (
            "install it with `apt-get install dataset-fashion-mnist` (into /usr/share/datasets/fashion-mnist), "
            f"or download the four .gz files from {FASHION_URL}<file>.gz into a folder and pass --data-dir"
        )
    else:
        fix = f"download {CIFAR_URL} into a folder (the .tar.gz or its extracted {_CIFAR_DIR}/) and pass --data-dir"
    return f"searched: {where}; to get {info.name}: {fix}"


# --------------------------------------------------------------------------- download


def download(url: str, dest: str | os.PathLike, md5: str, *, chunk: int = 1 << 20) -> Path:
    """Download ``url`` to ``dest`` through a temporary file, verify its MD5, then rename into place.

    The temporary file lives next to ``dest`` (same filesystem, so the rename is
    atomic); on any failure, or a checksum mismatch, it is deleted and an
    ``AttnconvError`` naming the file is raised. Network access goes through
    ``urllib.request.urlopen`` (tests replace it).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    digest = hashlib.md5(usedforsecurity=False)
    log.info("downloading %s -> %s", url, dest)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    while block := response.read(chunk):
                        digest.update(block)
                        out.write(block)
            except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
                raise AttnconvError(f"could not download {url} to {dest}: {e}") from e
        got = digest.hexdigest()
        if got != md5:
            raise AttnconvError(
                f"checksum mismatch for {dest.name} downloaded from {url}: MD5 {got}, expected {md5}; "
                "the download is corrupt or the file changed upstream; it was deleted, try again"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _download_or_explain(url: str, dest: Path, md5: str, info: DatasetInfo, dirs: list[Path]) -> None:
    try:
        download(url, dest, md5)
    except AttnconvError as e:
        raise AttnconvError(f"{info.name}: {e}; {_how_to_get(info, dirs)}") from e


# --------------------------------------------------------------------------- public loader


def load_dataset(
    name: str, data_dir: str | os.PathLike | None = None, download: bool = True
) -> tuple[ImageSet, ImageSet]:
    """Load ``(train, test)`` for ``"cifar10"`` or ``"fashion-mnist"``.

    Searches ``search_dirs(name, data_dir)`` (see the module docstring); if the
    dataset is nowhere and ``download`` is true, downloads the official files into
    ``cache_dir()`` with MD5 verification. Any missing, truncated, corrupt or
    wrong-checksum file raises one ``AttnconvError`` naming the file and how to get it.
    """
    info = dataset_info(name)
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        raise AttnconvError(f"data directory {data_dir} does not exist (or is not a directory)")
    dirs = search_dirs(info.name, data_dir)
    if info.name == "fashion-mnist":
        return _load_fashion(info, dirs, download)
    return _load_cifar(info, dirs, download)


# --------------------------------------------------------------------------- Fashion-MNIST (IDX)

# IDX type codes -> numpy big-endian dtypes (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT").
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _parse_idx(raw: bytes, path: Path) -> np.ndarray:
    """Parse IDX bytes: magic (0, 0, type code, ndim), ndim big-endian uint32 sizes, payload."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise AttnconvError(f"{path}: not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise AttnconvError(f"{path}: truncated IDX header ({len(raw)} bytes, {ndim} dims)")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = math.prod(dims) * dtype.itemsize
    if len(raw) - header != expected:
        raise AttnconvError(
            f"{path}: IDX payload is {len(raw) - header} bytes, header {dims} says {expected} "
            f"({'truncated' if len(raw) - header < expected else 'trailing bytes'})"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def _read_bytes(path: Path) -> bytes:
    """File contents, gunzipped when the name ends in .gz (gzip checks its CRC32 and length)."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise AttnconvError(f"{path}: cannot read ({type(e).__name__}: {e}); the file is corrupt") from e


def _find_fashion(dirs: list[Path], info: DatasetInfo, resumable: Path | None = None) -> dict[str, Path] | None:
    """First directory holding all four IDX files (raw or .gz).

    A folder with only some of them is an error, except ``resumable`` (our download
    folder), where a half-finished download counts as "not found" so it gets completed.
    """
    for base in dirs:
        for layout in _LAYOUTS[info.name]:
            folder = base / layout
            if not folder.is_dir():
                continue
            found: dict[str, Path] = {}
            for stem in _FASHION_FILES:
                for candidate in (folder / stem, folder / f"{stem}.gz"):  # raw first: no gunzip
                    if candidate.is_file():
                        found[stem] = candidate
                        break
            if len(found) == len(_FASHION_FILES):
                return found
            if found and resumable is not None and folder.resolve() == resumable.resolve():
                continue  # keep searching; if nothing else turns up, the download completes it
            if found:
                missing = [s for s in _FASHION_FILES if s not in found]
                raise AttnconvError(
                    f"{info.name}: {folder} has {', '.join(p.name for p in found.values())} but is missing "
                    f"{', '.join(m + '[.gz]' for m in missing)}; {_how_to_get(info, dirs)}"
                )
    return None


def _is_official_fashion(path: Path, raw: bytes, stem: str) -> bool:
    """The decompressed bytes are the known ones, or the file is the official .gz (its MD5)."""
    if hashlib.sha256(raw).hexdigest() == _FASHION_SHA256[stem]:
        return True
    official_md5 = _DOWNLOAD_MD5[f"{stem}.gz"]
    return path.suffix == ".gz" and hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest() == official_md5


def _read_idx_file(path: Path, stem: str, ndim: int, info: DatasetInfo, dirs: list[Path]) -> np.ndarray:
    try:
        raw = _read_bytes(path)
        array = _parse_idx(raw, path)
        if array.dtype != np.uint8 or array.ndim != ndim:
            raise AttnconvError(f"{path}: expected uint8 with {ndim} dims, got {array.dtype} {array.shape}")
        if ndim == 3 and array.shape[1:] != (info.size, info.size):
            raise AttnconvError(f"{path}: images are {array.shape[1:]}, expected ({info.size}, {info.size})")
        official = info.train_size if stem.startswith("train") else info.test_size
        if len(array) == official and not _is_official_fashion(path, raw, stem):
            raise AttnconvError(
                f"{path}: has the size of the official {stem} but not its content (SHA-256 mismatch); "
                "the file is corrupt"
            )
    except AttnconvError as e:
        raise AttnconvError(f"{e}; {_how_to_get(info, dirs)}") from None
    return array


def _load_fashion(info: DatasetInfo, dirs: list[Path], allow_download: bool) -> tuple[ImageSet, ImageSet]:
    target = cache_dir() / "fashion-mnist"
    files = _find_fashion(dirs, info, resumable=target if allow_download else None)
    if files is None:
        if not allow_download:
            raise AttnconvError(f"{info.name} not found and download=False; {_how_to_get(info, dirs)}")
        for stem in _FASHION_FILES:
            if not (target / stem).is_file() and not (target / f"{stem}.gz").is_file():
                name = f"{stem}.gz"
                _download_or_explain(FASHION_URL + name, target / name, _DOWNLOAD_MD5[name], info, dirs)
        files = _find_fashion([target], info)
        assert files is not None

    def split(prefix: str) -> ImageSet:
        images = _read_idx_file(files[f"{prefix}-images-idx3-ubyte"], f"{prefix}-images-idx3-ubyte", 3, info, dirs)
        labels = _read_idx_file(files[f"{prefix}-labels-idx1-ubyte"], f"{prefix}-labels-idx1-ubyte", 1, info, dirs)
        label_path = files[f"{prefix}-labels-idx1-ubyte"]
        if len(images) != len(labels):
            raise AttnconvError(
                f"{files[f'{prefix}-images-idx3-ubyte']} has {len(images)} images but {label_path} has "
                f"{len(labels)} labels; {_how_to_get(info, dirs)}"
            )
        _check_labels(labels, label_path, info, dirs)
        return ImageSet(
            torch.from_numpy(images.copy()).unsqueeze(1),  # (N, 1, 28, 28)
            torch.from_numpy(labels.astype(np.int64)),  # (N,)
        )

    return split("train"), split("t10k")


def _check_labels(labels: np.ndarray, path: Path, info: DatasetInfo, dirs: list[Path]) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= info.num_classes):
        raise AttnconvError(
            f"{path}: labels must be in 0..{info.num_classes - 1}, found {labels.min()}..{labels.max()}; "
            f"{_how_to_get(info, dirs)}"
        )


# --------------------------------------------------------------------------- CIFAR-10 (pickles)

# numpy's array reconstruction function, whatever module this numpy version files it under.
_NP_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]
# The only globals a CIFAR batch pickle refers to: (module, name) -> object.
_PICKLE_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _NP_RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _NP_RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
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
    try:
        with open(path, "rb") as f:
            return _RestrictedUnpickler(f, path).load()
    except AttnconvError:
        raise
    except Exception as e:  # any parse failure of a corrupt file: UnpicklingError, EOFError, ValueError, ...
        raise AttnconvError(f"{path}: not a readable CIFAR-10 batch ({type(e).__name__}: {e})") from e


def _read_cifar_batch(path: Path, info: DatasetInfo, dirs: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> images uint8 (N, 3, 32, 32), labels int64 (N,)."""
    try:
        batch = _safe_unpickle(path)
        if not isinstance(batch, dict):
            raise AttnconvError(f"{path}: expected a dict, got {type(batch).__name__}")
        data = batch.get(b"data", batch.get("data"))
        labels = batch.get(b"labels", batch.get("labels"))
        pixels = info.channels * info.size * info.size
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != pixels:
            got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
            raise AttnconvError(f"{path}: b'data' must be a uint8 array (N, {pixels}), got {got}")
        if isinstance(labels, np.ndarray) and labels.ndim == 1 and labels.dtype.kind in "iu":
            labels = labels.astype(np.int64)
        elif isinstance(labels, list) and all(type(v) is int for v in labels):
            labels = np.array(labels, dtype=np.int64)
        else:
            raise AttnconvError(f"{path}: b'labels' must be a list of ints")
        if len(labels) != len(data):
            raise AttnconvError(f"{path}: {len(data)} images but {len(labels)} labels")
        if len(data) == _CIFAR_OFFICIAL_BATCH and path.name in _CIFAR_BATCH_MD5:
            got = hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()
            if got != _CIFAR_BATCH_MD5[path.name]:
                raise AttnconvError(
                    f"{path}: has the size of the official {path.name} but MD5 {got}, expected "
                    f"{_CIFAR_BATCH_MD5[path.name]}; the file is corrupt"
                )
    except AttnconvError as e:
        raise AttnconvError(f"{e}; {_how_to_get(info, dirs)}") from None
    _check_labels(labels, path, info, dirs)
    # CIFAR rows are channel-major: 1024 R, then G, then B values, each 32 x 32 row-major.
    return data.reshape(-1, info.channels, info.size, info.size), labels


def _cifar_files_in(folder: Path) -> list[Path]:
    return [folder / n for n in (*_CIFAR_TRAIN, _CIFAR_TEST) if (folder / n).is_file()]


def _find_cifar(dirs: list[Path], info: DatasetInfo) -> Path | None:
    """A folder with all six batch files, extracting the first archive found on the way."""
    for base in dirs:
        for layout in _LAYOUTS[info.name]:
            folder = base / layout
            if not folder.is_dir():
                continue
            present = _cifar_files_in(folder)
            if len(present) == 6:
                return folder
            if present:
                missing = sorted({*_CIFAR_TRAIN, _CIFAR_TEST} - {p.name for p in present})
                raise AttnconvError(
                    f"{info.name}: {folder} has {', '.join(p.name for p in present)} but is missing "
                    f"{', '.join(missing)}; {_how_to_get(info, dirs)}"
                )
        archive = base / _CIFAR_TAR
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
    target = cache_dir() / _CIFAR_DIR
    stamp = _archive_stamp(archive)
    stamp_file = target / ".source"
    if stamp_file.is_file() and stamp_file.read_text() == stamp and len(_cifar_files_in(target)) == 6:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{_CIFAR_DIR}."))
    try:
        wanted = {*_CIFAR_TRAIN, _CIFAR_TEST, "batches.meta"}
        try:
            with tarfile.open(archive, "r:gz") as tar:
                for member in tar:
                    parts = Path(member.name).parts
                    if member.isfile() and len(parts) == 2 and parts[0] == _CIFAR_DIR and parts[1] in wanted:
                        src = tar.extractfile(member)
                        assert src is not None
                        with src, open(tmp / parts[1], "wb") as out:
                            shutil.copyfileobj(src, out)
        except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
            raise AttnconvError(
                f"{archive}: corrupt archive ({type(e).__name__}: {e}); {_how_to_get(info, dirs)}"
            ) from e
        missing = sorted({*_CIFAR_TRAIN, _CIFAR_TEST} - {p.name for p in _cifar_files_in(tmp)})
        if missing:
            raise AttnconvError(
                f"{archive}: archive lacks {_CIFAR_DIR}/{', '.join(missing)}; {_how_to_get(info, dirs)}"
            )
        (tmp / ".source").write_text(stamp)
        if target.exists():  # a directory cannot be renamed over a non-empty one: move the old one aside
            old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{_CIFAR_DIR}.old."))
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


def _load_cifar(info: DatasetInfo, dirs: list[Path], allow_download: bool) -> tuple[ImageSet, ImageSet]:
    folder = _find_cifar(dirs, info)
    if folder is None:
        if not allow_download:
            raise AttnconvError(f"{info.name} not found and download=False; {_how_to_get(info, dirs)}")
        archive = cache_dir() / _CIFAR_TAR
        _download_or_explain(CIFAR_URL, archive, _DOWNLOAD_MD5[_CIFAR_TAR], info, dirs)
        folder = _extract_cifar(archive, info, dirs)

    def split(names: tuple[str, ...]) -> ImageSet:
        parts = [_read_cifar_batch(folder / n, info, dirs) for n in names]
        images = np.concatenate([p[0] for p in parts])  # (N, 3, 32, 32)
        labels = np.concatenate([p[1] for p in parts])  # (N,)
        return ImageSet(torch.from_numpy(images), torch.from_numpy(labels))

    return split(_CIFAR_TRAIN), split((_CIFAR_TEST,))


# --------------------------------------------------------------------------- augmentation


def normalize(images: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    """uint8 (B, C, H, W) -> float32 (B, C, H, W): (x / 255 - mean) / std per channel."""
    mean = torch.tensor(info.mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    std = torch.tensor(info.std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    return images.to(torch.float32, copy=True).div_(255.0).sub_(mean).div_(std)  # in place on the fresh float copy


def crop_flip(x: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """Crop each image of x (B, C, H, W) from its zero-padded copy, then optionally mirror it.

    offsets: int (B, 2), the (top, left) corner of each crop in the padded image,
    each in [0, 2 * pad] (pad, pad is the identity); flips: bool (B,). Zero padding
    is zero in x's units: call it on uint8 / [0, 1] images to pad with black, as the
    paper's pipeline does (torchvision RandomCrop(32, padding=4) before Normalize).
    Vectorized: one pad and one gather for the whole batch.
    """
    B, C, H, W = x.shape
    device = x.device
    Wp = W + 2 * pad
    xp = F.pad(x, (pad, pad, pad, pad))  # (B, C, H + 2p, W + 2p)
    offsets = offsets.to(device)
    rows = offsets[:, :1] + torch.arange(H, device=device)  # (B, H)
    cols = offsets[:, 1:] + torch.arange(W, device=device)  # (B, W)
    cols = torch.where(flips.to(device)[:, None], cols.flip(1), cols)  # a mirrored crop reads columns backwards
    # One gather over the flattened padded image (4.5x faster than 4-tensor advanced indexing on CPU).
    flat = (rows[:, :, None] * Wp + cols[:, None, :]).view(B, 1, H * W).expand(B, C, H * W)  # (B, C, H*W)
    return xp.flatten(2).gather(2, flat).view(B, C, H, W)


def _draw_crop_flip(n: int, generator: torch.Generator, pad: int, flip: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets (n, 2) uniform in [0, 2 * pad] and flips (n,) with p = 1/2, in this order, from ``generator``."""
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator, device=generator.device)
    if flip:
        flips = torch.randint(0, 2, (n,), generator=generator, device=generator.device).bool()
    else:
        flips = torch.zeros(n, dtype=torch.bool, device=generator.device)
    return offsets, flips


def random_crop_flip(x: torch.Tensor, generator: torch.Generator, pad: int = 4, flip: bool = True) -> torch.Tensor:
    """Random crop with zero padding ``pad`` and random horizontal flip, for the whole batch x (B, C, H, W).

    Randomness comes only from ``generator`` (its device draws the numbers; then they move
    to x's device, so a CPU generator gives the same crops on every device).
    """
    offsets, flips = _draw_crop_flip(len(x), generator, pad, flip)
    return crop_flip(x, offsets, flips, pad)


# --------------------------------------------------------------------------- batches


def num_batches(n: int, batch_size: int, drop_last: bool) -> int:
    """Number of global batches of ``batch_size`` in ``n`` samples."""
    return n // batch_size if drop_last else -(-n // batch_size)


def _derive_seed(*parts: object) -> int:
    """A 63-bit seed that depends only on ``parts`` (stable across runs and platforms)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _shard(m: int, rank: int, world_size: int) -> tuple[int, int]:
    """[lo, hi) of rank's contiguous shard of m items (sizes differ by at most one, like tensor_split)."""
    q, r = divmod(m, world_size)
    lo = rank * q + min(rank, r)
    return lo, lo + q + (rank < r)


@dataclass(frozen=True)
class Batches:
    """Deterministic batches of one epoch; iterate to get ``(x float32 (B, C, H, W), y int64 (B,))``.

    Determinism contract (what makes resume bit-exact):

    - the epoch's sample order is ``randperm`` seeded by (seed, epoch) only (train=True;
      evaluation keeps the stored order);
    - global batch k is ``order[k * batch_size : (k + 1) * batch_size]``;
    - its crop/flip numbers are drawn for the whole global batch from a generator
      seeded by (seed, epoch, k) only.

    So starting at ``start_batch=k`` replays exactly batches k.. of an uninterrupted
    epoch, with any ``world_size``.

    Sharding (DDP): each global batch is cut into ``world_size`` contiguous shards and
    ``rank`` gets shard ``rank`` (augmentation numbers sliced the same way), so
    2 processes x batch_size/2 see exactly the samples, and the augmented pixels, of
    the 1-process global batch. ``batch_size`` is the global batch size. Every rank
    yields the same number of batches; in a short last batch (drop_last=False) a shard
    may be smaller by one, or empty.
    """

    data: ImageSet
    info: DatasetInfo
    batch_size: int
    seed: int
    epoch: int
    train: bool
    augment: bool
    rank: int = 0
    world_size: int = 1
    drop_last: bool = True
    start_batch: int = 0
    device: torch.device = torch.device("cpu")
    pad: int = 4
    flip: bool = True

    @property
    def total(self) -> int:
        """Number of global batches in the epoch (ignoring start_batch)."""
        return num_batches(len(self.data), self.batch_size, self.drop_last)

    def __len__(self) -> int:
        return self.total - self.start_batch

    def order(self) -> torch.Tensor:
        """Sample order of the epoch, int64 (N,) on the CPU."""
        n = len(self.data)
        if not self.train:
            return torch.arange(n)
        g = torch.Generator().manual_seed(_derive_seed("order", self.seed, self.epoch))
        return torch.randperm(n, generator=g)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self.order().to(self.data.images.device)
        n = len(order)
        for k in range(self.start_batch, self.total):
            global_idx = order[k * self.batch_size : min((k + 1) * self.batch_size, n)]  # (m,)
            lo, hi = _shard(len(global_idx), self.rank, self.world_size)
            idx = global_idx[lo:hi]  # (b,)
            x = self.data.images[idx].to(self.device, non_blocking=True)  # uint8 (b, C, H, W)
            y = self.data.labels[idx].to(self.device, non_blocking=True)  # (b,)
            if self.augment:
                g = torch.Generator().manual_seed(_derive_seed("augment", self.seed, self.epoch, k))
                offsets, flips = _draw_crop_flip(len(global_idx), g, self.pad, self.flip)
                x = crop_flip(x, offsets[lo:hi], flips[lo:hi], self.pad)  # pads uint8 with black
            yield normalize(x, self.info), y


def iterate_batches(
    data: ImageSet,
    info: DatasetInfo,
    batch_size: int,
    *,
    seed: int,
    epoch: int,
    train: bool,
    augment: bool,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool | None = None,
    start_batch: int = 0,
    device: torch.device | str = "cpu",
    pad: int = 4,
    flip: bool = True,
) -> Batches:
    """Batches of one epoch (see ``Batches`` for the determinism and sharding contract).

    train: shuffle with (seed, epoch); augment: random crop (zero pad ``pad``, black)
    and horizontal flip; drop_last defaults to ``train``. ``batch_size`` is global and
    must be divisible by ``world_size``.
    """
    if drop_last is None:
        drop_last = train
    if batch_size <= 0:
        raise AttnconvError(f"batch_size must be positive, got {batch_size}")
    if world_size <= 0 or not 0 <= rank < world_size:
        raise AttnconvError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if batch_size % world_size:
        raise AttnconvError(f"global batch_size {batch_size} is not divisible by world_size {world_size}")
    if pad < 0:
        raise AttnconvError(f"pad must be >= 0, got {pad}")
    if data.images.shape[1:] != (info.channels, info.size, info.size):
        raise AttnconvError(
            f"images are {tuple(data.images.shape[1:])}, {info.name} expects "
            f"({info.channels}, {info.size}, {info.size})"
        )
    total = num_batches(len(data), batch_size, drop_last)
    if not 0 <= start_batch <= total:
        raise AttnconvError(f"start_batch {start_batch} is outside 0..{total} (batches in this epoch)")
    return Batches(
        data, info, batch_size, seed, epoch, train, augment, rank, world_size, drop_last,
        start_batch, torch.device(device), pad, flip,
    )
