"""attnconv.data Fashion-MNIST: IDX files (raw and .gz) written on the fly, every way they can be wrong."""

from __future__ import annotations

import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_data import (
    assert_fashion_equal,
    data_cache,
    error_of,
    idx_bytes,
    isolated_data,  # noqa: F401 (fixture)
    write_fashion,
    write_idx,
)

from attnconv import data
from attnconv.data import sources

pytestmark = pytest.mark.usefixtures("isolated_data")

REAL_FASHION = Path("/usr/share/datasets/fashion-mnist")
FASHION = data.dataset_info("fashion-mnist")


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
def test_fashion_loads_idx_files(tmp_path, gz):
    arrays = write_fashion(tmp_path / "d", gz=gz)
    assert_fashion_equal(*data.load_dataset("fashion-mnist", tmp_path / "d", download=False), arrays)


def test_fashion_accepts_subfolder_and_env_var(tmp_path, monkeypatch):
    arrays = write_fashion(tmp_path / "root" / "fashion-mnist")
    monkeypatch.setenv("ATTNCONV_DATA", str(tmp_path / "root"))
    assert_fashion_equal(*data.load_dataset("fashion-mnist", download=False), arrays)



def test_fashion_not_found_without_download_explains_how_to_get_it(tmp_path):
    msg = error_of("fashion-mnist", tmp_path, download=False)
    assert "download=False" in msg and str(tmp_path) in msg and str(data_cache()) in msg
    assert "apt-get install dataset-fashion-mnist" in msg and data.FASHION_URL in msg


def test_fashion_missing_file_is_named(tmp_path):
    write_fashion(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    msg = error_of("fashion-mnist", tmp_path)  # download=True: a partial folder is still an error
    assert "missing t10k-labels-idx1-ubyte" in msg and "apt-get install" in msg


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
def test_fashion_truncated_idx_is_named(tmp_path, gz):
    arrays = write_fashion(tmp_path, gz=gz)
    raw = idx_bytes(arrays["train-images-idx3-ubyte"])[:-1]
    name = "train-images-idx3-ubyte" + (".gz" if gz else "")
    (tmp_path / name).write_bytes(gzip.compress(raw) if gz else raw)
    msg = error_of("fashion-mnist", tmp_path)
    assert name in msg and "truncated" in msg


def test_fashion_trailing_bytes_rejected(tmp_path):
    arrays = write_fashion(tmp_path, gz=False)
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(arrays["t10k-labels-idx1-ubyte"]) + b"\0")
    assert "t10k-labels-idx1-ubyte: IDX payload" in error_of("fashion-mnist", tmp_path)


def test_fashion_bad_magic_is_named(tmp_path):
    arrays = write_fashion(tmp_path, gz=False)
    raw = bytearray(idx_bytes(arrays["train-labels-idx1-ubyte"]))
    raw[0] = 0x1F
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(bytes(raw))
    msg = error_of("fashion-mnist", tmp_path)
    assert "train-labels-idx1-ubyte" in msg and "bad magic" in msg


def test_fashion_labels_file_with_image_dims_rejected(tmp_path):
    arrays = write_fashion(tmp_path, gz=False)
    write_idx(tmp_path / "train-labels-idx1-ubyte", arrays["train-images-idx3-ubyte"], gz=False)
    assert "train-labels-idx1-ubyte: expected uint8 with 1 dims" in error_of("fashion-mnist", tmp_path)


def test_fashion_wrong_image_size_rejected(tmp_path):
    write_fashion(tmp_path, gz=False)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((5, 32, 32), np.uint8), gz=False)
    assert "t10k-images-idx3-ubyte: images are (32, 32)" in error_of("fashion-mnist", tmp_path)


def test_fashion_mismatched_counts_are_named(tmp_path):
    arrays = write_fashion(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", arrays["train-labels-idx1-ubyte"][:-2], gz=True)
    msg = error_of("fashion-mnist", tmp_path)
    assert "train-images-idx3-ubyte.gz has 7 images" in msg and "train-labels-idx1-ubyte.gz has 5 labels" in msg


def test_fashion_label_out_of_range(tmp_path):
    write_fashion(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([0, 1, 10, 2, 3], np.uint8), gz=True)
    msg = error_of("fashion-mnist", tmp_path)
    assert "t10k-labels-idx1-ubyte.gz: labels must be in 0..9, found 0..10" in msg


@pytest.mark.parametrize("damage", ["flip-bytes", "truncate", "not-gzip"])
def test_fashion_corrupt_gz_is_named(tmp_path, damage):
    write_fashion(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    raw = bytearray(path.read_bytes())
    if damage == "flip-bytes":  # inside the deflate stream: zlib error or CRC mismatch
        for i in range(20, 60):
            raw[i] ^= 0xFF
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:
        raw = bytearray(b"<html>404 Not Found</html>")
    path.write_bytes(bytes(raw))
    msg = error_of("fashion-mnist", tmp_path)
    assert "train-images-idx3-ubyte.gz" in msg and "corrupt" in msg


def test_fashion_official_size_with_wrong_content_rejected(tmp_path):
    # A t10k file with the official 10000 items must be the official data (SHA-256 of the IDX bytes).
    write_fashion(tmp_path, gz=False)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((10000, 28, 28), np.uint8), gz=False)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(10000, np.uint8), gz=False)
    assert "t10k-images-idx3-ubyte: has the size of the official" in error_of("fashion-mnist", tmp_path)


def test_fashion_official_size_accepted_when_gz_has_the_official_md5(tmp_path, monkeypatch):
    # The official .gz files pass on their MD5 even if their content hash were not the one we recorded.
    write_fashion(tmp_path)
    for stem, array in (("t10k-images-idx3-ubyte", np.zeros((10000, 28, 28), np.uint8)),
                        ("t10k-labels-idx1-ubyte", np.zeros(10000, np.uint8))):
        path = write_idx(tmp_path / stem, array, gz=True)
        monkeypatch.setitem(sources.DOWNLOAD_MD5, path.name, hashlib.md5(path.read_bytes()).hexdigest())
    _, test = data.load_dataset("fashion-mnist", tmp_path, download=False)
    assert len(test) == 10000


# --------------------------------------------------------------------------- real data


@pytest.mark.skipif(not REAL_FASHION.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_real_fashion_mnist(monkeypatch):
    monkeypatch.setitem(sources.SYSTEM_DIRS, "fashion-mnist", (REAL_FASHION,))
    train, test = data.load_dataset("fashion-mnist", download=False)
    assert train.images.shape == (60000, 1, 28, 28) and test.images.shape == (10000, 1, 28, 28)
    assert torch.bincount(train.labels).tolist() == [6000] * 10
    assert torch.bincount(test.labels).tolist() == [1000] * 10
    mean, std = data.channel_stats(train.images)
    assert np.allclose(mean, FASHION.mean, atol=1e-6) and np.allclose(std, FASHION.std, atol=1e-6)
    x = data.normalize(train.images[:20000], FASHION)
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1) < 0.01



# --------------------------------------------------------------------------- resource exhaustion


class BoundedReader:
    """Wraps a binary stream, counts the bytes it hands out, and fails any read past ``limit``."""

    def __init__(self, stream, limit: int) -> None:
        self.stream, self.limit, self.count = stream, limit, 0

    def _take(self, n: int) -> None:
        self.count += n
        assert self.count <= self.limit, f"read {self.count} bytes, more than the {self.limit} allowed"

    def read(self, n: int = -1) -> bytes:
        assert n is not None and n >= 0, "an unbounded read"
        out = self.stream.read(min(n, self.limit - self.count + 1))
        self._take(len(out))
        return out

    def readinto(self, buf) -> int:
        k = self.stream.readinto(memoryview(buf)[: self.limit - self.count + 1])
        self._take(k)
        return k

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stream.close()


def gzip_bomb(path: Path, head: bytes, gib: float) -> Path:
    """``head`` then ``gib`` GiB of zeros, as a multi-member .gz of about 1 MB per GiB."""
    zeros = gzip.compress(b"\0" * (1 << 20), compresslevel=9)
    path.write_bytes(gzip.compress(head) + zeros * int(gib * 1024))
    return path


def counted_reads(monkeypatch, limit: int) -> list[BoundedReader]:
    """Every IDX stream the loader opens (`open_idx`, gunzipping .gz files), counting what is read of it."""
    import attnconv.data.fashion as fashion

    opened: list[BoundedReader] = []
    real_open = fashion.open_idx

    def bounded_open(path):
        opened.append(BoundedReader(real_open(path), limit))
        return opened[-1]

    monkeypatch.setattr(fashion, "open_idx", bounded_open)
    return opened


def test_gzip_bomb_after_a_valid_file_is_rejected_reading_only_the_promised_bytes(tmp_path, monkeypatch):
    arrays = write_fashion(tmp_path)
    head = idx_bytes(arrays["train-images-idx3-ubyte"])  # 7 images: 16 + 5488 bytes
    bomb = gzip_bomb(tmp_path / "train-images-idx3-ubyte.gz", head, gib=2)
    assert bomb.stat().st_size < 3 << 20  # a 2 MB file that unpacks to 2 GiB
    opened = counted_reads(monkeypatch, limit=len(head) + 1)
    msg = error_of("fashion-mnist", tmp_path)
    assert "train-images-idx3-ubyte.gz: IDX payload is longer than the 5488 bytes" in msg and "trailing" in msg
    assert opened[0].count == len(head) + 1  # the payload, then one byte to see the file goes on


def test_header_claiming_more_than_the_official_count_is_rejected_before_the_payload(tmp_path, monkeypatch):
    write_fashion(tmp_path)
    n = (2 << 30) // 784 + 1  # 2 GiB of 28x28 images
    head = bytes([0, 0, 0x08, 3]) + struct.pack(">3I", n, 28, 28)
    gzip_bomb(tmp_path / "train-images-idx3-ubyte.gz", head, gib=2)
    opened = counted_reads(monkeypatch, limit=16)
    msg = error_of("fashion-mnist", tmp_path)
    assert f"train-images-idx3-ubyte.gz: header says {n} items, more than the 60000 of the official" in msg
    assert opened[0].count == 16  # the header only


@pytest.mark.parametrize("stem, dims, expected", [
    ("t10k-labels-idx1-ubyte", (10001,), "header says 10001 items, more than the 10000"),
    ("t10k-images-idx3-ubyte", (5, 28, 28, 1000), "expected uint8 with 3 dims"),
    ("t10k-images-idx3-ubyte", (5, 28, 100000), "images are (28, 100000), expected (28, 28)"),
])
def test_raw_file_with_a_huge_header_is_rejected_on_the_header(tmp_path, stem, dims, expected):
    write_fashion(tmp_path, gz=False)
    (tmp_path / stem).write_bytes(bytes([0, 0, 0x08, len(dims)]) + struct.pack(f">{len(dims)}I", *dims))
    assert f"{stem}: {expected}" in error_of("fashion-mnist", tmp_path)
