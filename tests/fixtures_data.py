"""Writers for tiny datasets in the real on-disk formats (IDX, CIFAR-10 pickle batches, tar.gz),
and the helpers the tests/test_data_*.py modules share.

The writers are independent of attnconv.data (they follow the format descriptions:
yann.lecun.com/exdb/mnist "THE IDX FILE FORMAT" and the CIFAR-10 page's
"Python version"), so the tests check our readers against the formats, not against
themselves.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import struct
import tarfile
import urllib.request
from pathlib import Path

import numpy as np
import pytest

FASHION_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
CIFAR_BATCHES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch")


def idx_bytes(array: np.ndarray) -> bytes:
    """IDX encoding of a uint8 array: 0, 0, type 0x08, ndim, big-endian uint32 dims, payload."""
    assert array.dtype == np.uint8
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_idx(path: Path, array: np.ndarray, gz: bool) -> Path:
    """Write ``array`` as IDX to ``path`` (``path`` + '.gz', gzipped, when ``gz``)."""
    raw = idx_bytes(array)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)
    return path


def fashion_arrays(n_train: int = 7, n_test: int = 5, seed: int = 0) -> dict[str, np.ndarray]:
    """Random 28x28 uint8 images and labels 0..9 keyed by IDX file stem."""
    rng = np.random.default_rng(seed)
    return {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }


def write_fashion(folder: Path, gz: bool = True, **kwargs: int) -> dict[str, np.ndarray]:
    """Write the four Fashion-MNIST IDX files into ``folder``; return the arrays written."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = fashion_arrays(**kwargs)
    for stem, array in arrays.items():
        write_idx(folder / stem, array, gz)
    return arrays


class _Py2StylePickler(pickle._Pickler):  # the pure-Python pickler, so its dispatch table can be changed
    """Protocol 2 with bytes written as (SHORT_)BINSTRING, as Python 2's cPickle wrote the real batches."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_str8(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_str8


def cifar_batch_bytes(images: np.ndarray, labels: np.ndarray, py2: bool = True) -> bytes:
    """A CIFAR-10 batch pickle: {b'batch_label', b'labels': list, b'data': uint8 (N, 3072), b'filenames'}."""
    batch = {
        b"batch_label": b"testing batch 1 of 1",
        b"labels": [int(v) for v in labels],
        b"data": images.reshape(len(images), -1),  # (N, 3072): 1024 R, 1024 G, 1024 B
        b"filenames": [f"img_{i}.png".encode() for i in range(len(images))],
    }
    if not py2:
        return pickle.dumps(batch, protocol=4)
    buf = io.BytesIO()
    _Py2StylePickler(buf, protocol=2).dump(batch)
    return buf.getvalue()


# Images per batch file in the tests (the reader insists on one fixed count: 10000 in real use, this
# in tests, through attnconv.data.cifar.BATCH_ROWS).
CIFAR_TEST_ROWS = 3


def cifar_arrays(n_per_batch: int = CIFAR_TEST_ROWS, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Random (images uint8 (N, 3, 32, 32), labels int64 (N,)) per batch name, N = n_per_batch in each."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in CIFAR_BATCHES:
        n = n_per_batch
        out[name] = (rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, n))
    return out


def write_cifar(folder: Path, py2: bool = True, **kwargs: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Write the six CIFAR-10 batch files into ``folder``; return the arrays written."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = cifar_arrays(**kwargs)
    for name, (images, labels) in arrays.items():
        (folder / name).write_bytes(cifar_batch_bytes(images, labels, py2))
    return arrays


def write_cifar_tar(
    path: Path, arrays: dict[str, tuple[np.ndarray, np.ndarray]], extra: dict[str, bytes] | None = None
) -> Path:
    """A cifar-10-python.tar.gz with the batches under cifar-10-batches-py/ (plus ``extra`` members)."""
    members = {f"cifar-10-batches-py/{n}": cifar_batch_bytes(*a) for n, a in arrays.items()}
    members["cifar-10-batches-py/readme.html"] = b"<html></html>"
    members.update(extra or {})
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


class FakeResponse(io.BytesIO):
    """What urllib.request.urlopen returns, enough for attnconv.data.download (read, context manager)."""


def fake_urlopen(served: dict[str, bytes], calls: list[str] | None = None):
    """An urlopen replacement serving ``served[url]``; other URLs fail like a machine without network."""
    import urllib.error

    def urlopen(url: str, timeout: float | None = None) -> FakeResponse:
        if calls is not None:
            calls.append(url)
        if url not in served:
            raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
        return FakeResponse(served[url])

    return urlopen


def write_random_fashion(folder: Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    """Random 28x28 images and labels in the Fashion-MNIST IDX layout (raw files), for tiny runs."""
    rng = np.random.default_rng(seed)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), gz=False)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n, dtype=np.uint8), gz=False)
    return folder


# --------------------------------------------------------------------------- helpers for the data tests
# (These use attnconv.data; the writers above do not.)


@pytest.fixture
def isolated_data(tmp_path, monkeypatch):
    """No network, no $ATTNCONV_DATA, a private cache, no system dirs: only what a test writes is seen."""
    from attnconv.data import sources

    monkeypatch.delenv("ATTNCONV_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    for name in list(sources.SYSTEM_DIRS):
        monkeypatch.setitem(sources.SYSTEM_DIRS, name, ())
    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen({}))


def data_cache() -> Path:
    from attnconv import data

    return data.cache_dir()


def error_of(name: str, data_dir, **kwargs) -> str:
    """The message of the AttnconvError that ``load_dataset(name, data_dir, **kwargs)`` raises."""
    from attnconv import data
    from attnconv.errors import AttnconvError

    with pytest.raises(AttnconvError) as e:
        data.load_dataset(name, data_dir, **kwargs)
    return str(e.value)


def assert_fashion_equal(train, test, arrays: dict[str, np.ndarray]) -> None:
    import torch

    assert train.images.dtype == torch.uint8 and train.labels.dtype == torch.int64
    n_train, n_test = len(arrays["train-labels-idx1-ubyte"]), len(arrays["t10k-labels-idx1-ubyte"])
    assert train.images.shape == (n_train, 1, 28, 28) and test.images.shape == (n_test, 1, 28, 28)
    assert np.array_equal(train.images[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    assert np.array_equal(train.labels.numpy(), arrays["train-labels-idx1-ubyte"])
    assert np.array_equal(test.images[:, 0].numpy(), arrays["t10k-images-idx3-ubyte"])
    assert np.array_equal(test.labels.numpy(), arrays["t10k-labels-idx1-ubyte"])


def assert_cifar_equal(train, test, arrays) -> None:
    import torch

    train_images = np.concatenate([arrays[n][0] for n in CIFAR_BATCHES[:5]])
    train_labels = np.concatenate([arrays[n][1] for n in CIFAR_BATCHES[:5]])
    assert train.images.dtype == torch.uint8 and train.labels.dtype == torch.int64
    assert train.images.shape == (len(train_labels), 3, 32, 32)
    assert np.array_equal(train.images.numpy(), train_images)
    assert np.array_equal(train.labels.numpy(), train_labels)
    assert np.array_equal(test.images.numpy(), arrays["test_batch"][0])
    assert np.array_equal(test.labels.numpy(), arrays["test_batch"][1])


def fashion_served(arrays: dict[str, np.ndarray]) -> dict[str, bytes]:
    """What the Fashion-MNIST server would send for ``arrays``, by URL."""
    from attnconv import data

    return {f"{data.FASHION_URL}{stem}.gz": gzip.compress(idx_bytes(a)) for stem, a in arrays.items()}


def use_md5_of(monkeypatch, served: dict[str, bytes]) -> None:
    """Make the small served files the 'official' ones, so the success path of download runs offline."""
    from attnconv.data import sources

    for url, payload in served.items():
        monkeypatch.setitem(sources.DOWNLOAD_MD5, url.rsplit("/", 1)[1], hashlib.md5(payload).hexdigest())


# --------------------------------------------------------------------------- image folders (Pillow)


def halves(w: int, h: int, mode: str = "RGB", vertical: bool = True, dark=0, light=255):
    """A w x h Pillow image: left half ``dark``, right half ``light`` (top/bottom when not ``vertical``)."""
    from PIL import Image

    bands = len(Image.getmodebands(mode) * "x")
    img = Image.new(mode, (w, h), (light,) * bands if bands > 1 else light)
    box = (0, 0, w // 2, h) if vertical else (0, 0, w, h // 2)
    img.paste((dark,) * bands if bands > 1 else dark, box)
    return img


def write_image_folder(root: Path, grey: bool = False, test_split: str = "test", seed: int = 0) -> dict:
    """A tiny ImageFolder dataset: classes cat, dog (and bird, train only); PNG and JPEG, mixed sizes.

    Returns {"train": [(relative path, class name)], test_split: [...]} in the order a sorted scan
    finds them. Grey folders hold mode-L images only; otherwise colour and grey images mix.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(40, 30), (30, 50), (33, 33), (64, 20)]
    layout: dict[str, list[tuple[str, str]]] = {"train": [], test_split: []}
    for split, per_class in (("train", 4), (test_split, 2)):
        for cls in ("bird", "cat", "dog"):
            if cls == "bird" and split != "train":
                continue
            folder = root / split / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                w, h = sizes[i % len(sizes)]
                mode = "L" if grey or i == 3 else "RGB"
                shape = (h, w) if mode == "L" else (h, w, 3)
                img = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=mode)
                name = f"{cls}{i}.{'jpg' if i % 2 else 'png'}"
                img.save(folder / name, quality=95)
                layout[split].append((f"{split}/{cls}/{name}", cls))
    (root / "train" / "cat" / "notes.txt").write_text("not an image")  # skipped
    (root / "train" / ".DS_Store").write_bytes(b"\0")  # skipped
    return layout


def write_class_folder(root: Path, classes: tuple[str, ...] = ("ant", "bee", "cow"), train: int = 3, test: int = 4,
                       size: int = 12, seed: int = 0) -> Path:
    """An ImageFolder dataset of random RGB PNGs (size x size), `train` and `test` per class. Like any image
    folder, its test images are listed class by class: the first `test` are all of the first class."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, per_class in (("train", train), ("test", test)):
        for cls in classes:
            folder = root / split / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root
