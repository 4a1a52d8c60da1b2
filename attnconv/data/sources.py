"""Where the built-in datasets' files come from: search directories, the cache, downloads.

Where files are searched, in order (first hit wins):

    data_dir argument -> $ATTNCONV_DATA -> cache_dir() -> system dirs
    (Fashion-MNIST: /usr/share/datasets/fashion-mnist, Debian `dataset-fashion-mnist`)

A folder that holds *some* but not all files of a dataset is an error (never
partial data, never a silent fall-through to another copy). Downloads are verified
against the official MD5 of the archive before they are renamed into place.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from attnconv.data.info import DatasetInfo, builtin_info
from attnconv.errors import AttnconvError
from attnconv.fileio import not_a_file, unreadable_folder
from attnconv.limits import path_argument
from attnconv.pathwords import expanded

log = logging.getLogger(__name__)

FASHION_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TAR = "cifar-10-python.tar.gz"

# MD5 of the official .gz files (Fashion-MNIST README) and of the CIFAR archive
# (https://www.cs.toronto.edu/~kriz/cifar.html). Checked on every download.
DOWNLOAD_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12e480ee83cd310",
    CIFAR_TAR: "c58f30108f718f92721af3b95e74349a",
}

# System-wide installs, searched last. Tests empty it (monkeypatch.setitem).
SYSTEM_DIRS: dict[str, tuple[Path, ...]] = {
    "cifar10": (),
    "fashion-mnist": (Path("/usr/share/datasets/fashion-mnist"),),
}
# Sub-folders accepted inside a search directory ("." = files directly inside).
LAYOUTS: dict[str, tuple[str, ...]] = {
    "cifar10": (CIFAR_DIR, "."),
    "fashion-mnist": (".", "fashion-mnist", "FashionMNIST/raw"),
}


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/attnconv``, or ``~/.cache/attnconv``; downloads go here."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attnconv"


def search_dirs(name: str, data_dir: str | os.PathLike | None = None) -> list[Path]:
    """The directories ``load_dataset`` looks in for a built-in dataset, in order (existing or not)."""
    info = builtin_info(name)
    dirs: list[Path] = []
    if data_dir is not None:
        dirs.append(expanded(path_argument(data_dir, "data_dir", "the folder holding the dataset's files")))
    if os.environ.get("ATTNCONV_DATA"):
        dirs.append(expanded(os.environ["ATTNCONV_DATA"]))
    dirs.append(cache_dir())
    dirs.extend(SYSTEM_DIRS.get(info.name, ()))
    return dirs


def how_to_get(info: DatasetInfo, dirs: list[Path]) -> str:
    """The tail of every "not found / corrupt" message: where we looked and how to get the data."""
    where = ", ".join(str(d) for d in dirs)
    if info.name == "fashion-mnist":
        fix = (
            "install it with `apt-get install dataset-fashion-mnist` (into /usr/share/datasets/fashion-mnist), "
            f"or download the four .gz files from {FASHION_URL}<file>.gz into a folder and pass --data-dir"
        )
    else:
        fix = f"download {CIFAR_URL} into a folder (the .tar.gz or its extracted {CIFAR_DIR}/) and pass --data-dir"
    return f"searched: {where}; to get {info.name}: {fix}"


def check_searchable(folder: Path) -> None:
    """One AttnconvError for a dataset folder this user may not list or enter: its files cannot be looked at, which
    is said, not taken for files missing (`fileio.unreadable_folder`)."""
    if not os.access(folder, os.R_OK | os.X_OK):
        raise AttnconvError(unreadable_folder(folder))


def odd_file(info: DatasetInfo, candidates: list[Path], dirs: list[Path]) -> None:
    """One AttnconvError naming the first of a dataset file's `candidates` that is there but is no regular file (a
    folder, a device, a link to nowhere or into a loop): such a file is not "missing". Nothing when none is there."""
    for path in candidates:
        why = not_a_file(path) if os.path.lexists(path) else None
        if why:
            raise AttnconvError(f"{info.name}: {path} is not a readable file ({why}); put the file itself there, or "
                                f"remove it; {how_to_get(info, dirs)}")


def file_md5(path: Path, chunk: int = 1 << 20) -> str:
    """MD5 of a file, read in chunks (never the whole file in memory)."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


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


def download_or_explain(url: str, dest: Path, md5: str, info: DatasetInfo, dirs: list[Path]) -> None:
    """``download``, with the dataset's how-to-get appended to any failure."""
    try:
        download(url, dest, md5)
    except AttnconvError as e:
        raise AttnconvError(f"{info.name}: {e}; {how_to_get(info, dirs)}") from e
