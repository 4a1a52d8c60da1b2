"""attnconv.data CIFAR-10: batch pickles and archives written on the fly, tampered and corrupt ones."""

from __future__ import annotations

import os
import pickle
import re
import tarfile
import tracemalloc
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from fixtures_data import (
    CIFAR_BATCHES,
    CIFAR_TEST_ROWS,
    assert_cifar_equal,
    cifar_arrays,
    cifar_batch_bytes,
    data_cache,
    error_of,
    fake_urlopen,
    isolated_data,  # noqa: F401 (fixture)
    use_md5_of,
    write_cifar,
    write_cifar_tar,
)

from attnconv import data
from attnconv.data import cifar
from attnconv.errors import AttnconvError

pytestmark = pytest.mark.usefixtures("isolated_data")


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    """Batch files of CIFAR_TEST_ROWS images (the real reader wants exactly 10000 per file)."""
    monkeypatch.setattr(cifar, "BATCH_ROWS", CIFAR_TEST_ROWS)


@pytest.mark.parametrize("py2", [True, False], ids=["python2-pickle", "python3-pickle"])
def test_cifar_loads_batches(tmp_path, py2):
    arrays = write_cifar(tmp_path / "cifar-10-batches-py", py2=py2)
    assert_cifar_equal(*data.load_dataset("cifar10", tmp_path, download=False), arrays)


def test_cifar_pixel_layout_is_channel_major():
    # Row of a batch: 1024 red values, 1024 green, 1024 blue; each 32 x 32 row-major.
    images = np.zeros((1, 3, 32, 32), np.uint8)
    images[0, 1, 2, 3] = 200  # green, row 2, column 3 -> position 1024 + 2 * 32 + 3
    row = pickle.loads(cifar_batch_bytes(images, np.array([0])), encoding="bytes")[b"data"][0]
    assert row[1024 + 2 * 32 + 3] == 200 and row.sum() == 200


def test_cifar_files_directly_in_data_dir(tmp_path):
    arrays = write_cifar(tmp_path)
    assert_cifar_equal(*data.load_dataset("cifar10", tmp_path, download=False), arrays)


def test_cifar_tar_is_extracted_into_cache_atomically_once(tmp_path, monkeypatch):
    arrays = cifar_arrays()
    write_cifar_tar(tmp_path / "cifar-10-python.tar.gz", arrays)
    assert_cifar_equal(*data.load_dataset("cifar10", tmp_path, download=False), arrays)
    extracted = data_cache() / "cifar-10-batches-py"
    assert {p.name for p in extracted.iterdir()} == {*CIFAR_BATCHES, ".source"}
    assert [p.name for p in data_cache().iterdir()] == ["cifar-10-batches-py"]  # no temporary folders left
    monkeypatch.setattr(tarfile, "open", None)  # a second load must reuse the extraction
    assert_cifar_equal(*data.load_dataset("cifar10", tmp_path, download=False), arrays)


def test_cifar_new_archive_replaces_old_extraction(tmp_path):
    first, second = cifar_arrays(seed=1), cifar_arrays(seed=2)
    for folder, arrays in (("a", first), ("b", second)):
        (tmp_path / folder).mkdir()
        write_cifar_tar(tmp_path / folder / "cifar-10-python.tar.gz", arrays)
    assert_cifar_equal(*data.load_dataset("cifar10", tmp_path / "a", download=False), first)
    # data_dir is searched before the cache: b's archive is found and its extraction replaces a's.
    assert_cifar_equal(*data.load_dataset("cifar10", tmp_path / "b", download=False), second)
    assert [p.name for p in data.cache_dir().iterdir()] == ["cifar-10-batches-py"]


def test_cifar_tar_members_outside_the_folder_are_ignored(tmp_path):
    outside = tmp_path / "absolute-escape-cifar"  # names no other test makes (the suite runs in parallel)
    evil = {"../../escaped-cifar": b"x", str(outside): b"x", "cifar-10-batches-py/../up-cifar": b"x"}
    (tmp_path / "d").mkdir()
    write_cifar_tar(tmp_path / "d" / "cifar-10-python.tar.gz", cifar_arrays(), extra=evil)
    data.load_dataset("cifar10", tmp_path / "d", download=False)
    written = {p.name for p in tmp_path.parent.rglob("*")}
    assert not {"escaped-cifar", "up-cifar", "absolute-escape-cifar"} & written


def test_cifar_corrupt_tar_is_named(tmp_path):
    path = write_cifar_tar(tmp_path / "cifar-10-python.tar.gz", cifar_arrays())
    path.write_bytes(path.read_bytes()[:-200])
    msg = error_of("cifar10", tmp_path)
    assert "cifar-10-python.tar.gz: corrupt archive" in msg and data.CIFAR_URL in msg
    assert [p for p in data_cache().glob(".*")] == []  # temporary extraction folder removed


def test_cifar_tar_missing_a_batch_is_named(tmp_path):
    arrays = cifar_arrays()
    del arrays["data_batch_4"]
    write_cifar_tar(tmp_path / "cifar-10-python.tar.gz", arrays)
    assert "archive lacks cifar-10-batches-py/data_batch_4" in error_of("cifar10", tmp_path)


def test_cifar_download_offline(tmp_path, monkeypatch):
    arrays = cifar_arrays()
    served = {data.CIFAR_URL: write_cifar_tar(tmp_path / "served.tar.gz", arrays).read_bytes()}
    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen(served))
    use_md5_of(monkeypatch, served)
    (tmp_path / "empty").mkdir()
    assert_cifar_equal(*data.load_dataset("cifar10", tmp_path / "empty"), arrays)
    assert (data_cache() / "cifar-10-python.tar.gz").read_bytes() == served[data.CIFAR_URL]


def test_cifar_download_wrong_checksum(tmp_path, monkeypatch):
    served = {data.CIFAR_URL: write_cifar_tar(tmp_path / "served.tar.gz", cifar_arrays()).read_bytes()}
    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen(served))
    (tmp_path / "empty").mkdir()
    msg = error_of("cifar10", tmp_path / "empty")
    assert "checksum mismatch for cifar-10-python.tar.gz" in msg and "c58f30108f718f92721af3b95e74349a" in msg
    assert list(data_cache().iterdir()) == []


class _Exploit:
    """Unpickling this runs a shell command (the classic pickle attack)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_without_executing(tmp_path):
    live = tmp_path / "plain-pickle-ran-it"
    pickle.loads(pickle.dumps(_Exploit(live)))
    assert live.exists()  # the payload works against plain pickle, so the check below means something

    marker = tmp_path / "pwned"
    write_cifar(tmp_path)
    (tmp_path / "data_batch_3").write_bytes(pickle.dumps({b"data": _Exploit(marker), b"labels": [1]}, protocol=4))
    msg = error_of("cifar10", tmp_path)
    assert f"data_batch_3: refusing to load: the pickle asks for {os.system.__module__}.system" in msg
    assert not marker.exists()


def test_pickle_with_other_globals_refused(tmp_path):
    write_cifar(tmp_path)
    evil = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [1], b"x": eval}, protocol=4)
    (tmp_path / "test_batch").write_bytes(evil)
    assert "test_batch: refusing to load: the pickle asks for builtins.eval" in error_of("cifar10", tmp_path)


def test_cifar_missing_batch_is_named(tmp_path):
    write_cifar(tmp_path / "cifar-10-batches-py")
    (tmp_path / "cifar-10-batches-py" / "data_batch_2").unlink()
    assert "missing data_batch_2" in error_of("cifar10", tmp_path)


def test_cifar_truncated_batch_is_named(tmp_path):
    write_cifar(tmp_path)
    path = tmp_path / "data_batch_5"
    path.write_bytes(path.read_bytes()[:-500])
    assert "data_batch_5: not a readable CIFAR-10 batch" in error_of("cifar10", tmp_path)


N = CIFAR_TEST_ROWS  # images per batch file in these tests


@pytest.mark.parametrize(
    "batch, expected",
    [
        ({b"data": np.zeros((N, 1024), np.uint8), b"labels": [0] * N}, f"uint8 array ({N}, 3072)"),
        ({b"data": np.zeros((N, 3072), np.float32), b"labels": [0] * N}, f"uint8 array ({N}, 3072)"),
        ({b"data": np.zeros((N + 1, 3072), np.uint8), b"labels": [0] * (N + 1)}, f"uint8 array ({N}, 3072)"),
        ({b"data": np.zeros((3072, N), np.uint8).T, b"labels": [0] * N}, "C-contiguous"),
        ({b"data": np.zeros((N, 3072), np.uint8), b"labels": [0]}, f"{N} images but 1 labels"),
        ({b"data": np.zeros((N, 3072), np.uint8), b"labels": np.zeros(N + 1, np.int64)}, f"{N} images but labels"),
        ({b"data": np.zeros((N, 3072), np.uint8), b"labels": [0, 12, 0]}, "labels must be in 0..9"),
        ({b"data": np.zeros((N, 3072), np.uint8), b"labels": ["a", "b", "c"]}, "list of ints"),
        ([1, 2], "expected a dict"),
    ],
)
def test_cifar_wrong_content_is_named(tmp_path, batch, expected):
    write_cifar(tmp_path)
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps(batch, protocol=4))
    msg = error_of("cifar10", tmp_path)
    assert "data_batch_1" in msg and expected in msg


def test_cifar_official_size_batch_must_match_md5(tmp_path, monkeypatch):
    monkeypatch.setattr(cifar, "BATCH_ROWS", cifar.OFFICIAL_ROWS)  # the real rule: 10000 images, the official bytes
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder)
    (folder / "data_batch_1").write_bytes(cifar_batch_bytes(np.zeros((10000, 3, 32, 32), np.uint8), np.zeros(10000)))
    msg = error_of("cifar10", tmp_path)
    assert "data_batch_1: has the size of the official data_batch_1" in msg
    assert "c99cafc152244af753f735de768cd75f" in msg


def test_cifar_batch_of_another_size_is_refused_in_real_use(tmp_path, monkeypatch):
    monkeypatch.setattr(cifar, "BATCH_ROWS", cifar.OFFICIAL_ROWS)
    write_cifar(tmp_path)  # 3 images per batch: fine for the tests' reader, not for the real one
    assert "data_batch_1: b'data' must be a C-contiguous uint8 array (10000, 3072)" in error_of("cifar10", tmp_path)


# --------------------------------------------------------------------------- resource exhaustion


class _StridedArray:
    """Pickles as numpy.ndarray(shape, dtype, buffer, 0, strides): any shape over a 1-byte buffer."""

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, dtype

    def __reduce__(self):
        return (np.ndarray, (self.shape, np.dtype(self.dtype), b"\0" * 8, 0, (0,) * len(self.shape)))


def test_zero_stride_batch_posing_as_300000_images_is_refused(tmp_path):
    bomb = pickle.dumps(
        {b"data": _StridedArray((300000, 3072), "u1"), b"labels": _StridedArray((300000,), "i8")}, protocol=4
    )
    assert len(bomb) < 400
    # The payload is real: plain pickle builds a 921 MB-looking array over 8 bytes.
    fake = pickle.loads(bomb)[b"data"]
    assert fake.shape == (300000, 3072) and fake.strides == (0, 0)
    write_cifar(tmp_path)
    (tmp_path / "data_batch_2").write_bytes(bomb)
    tracemalloc.start()
    try:
        msg = error_of("cifar10", tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "data_batch_2: refusing to load: the pickle calls numpy.ndarray(...) directly" in msg
    assert peak < 20 << 20  # the 300000 images were never built (they would be 921 MB)


def test_check_batch_refuses_strided_and_oversized_arrays(tmp_path):
    path = tmp_path / "data_batch_1"
    zero_stride = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), (N, 3072), (0, 0))
    for pixels, what in ((zero_stride, "strides (0, 0)"), (np.zeros((10 * N, 3072), np.uint8), f"({10 * N}, 3072)")):
        with pytest.raises(AttnconvError, match=f"data_batch_1: b'data' must be a C-contiguous .*{re.escape(what)}"):
            cifar.check_batch({b"data": pixels, b"labels": [0] * len(pixels)}, path)
    labels = np.lib.stride_tricks.as_strided(np.zeros(1, np.int64), (N,), (0,))
    with pytest.raises(AttnconvError, match="data_batch_1: 3 images but labels int64"):
        cifar.check_batch({b"data": np.zeros((N, 3072), np.uint8), b"labels": labels}, path)
    data, ok = cifar.check_batch({b"data": np.zeros((N, 3072), np.uint8), b"labels": [1, 2, 3]}, path)
    assert data.shape == (N, 3072) and ok.tolist() == [1, 2, 3] and ok.dtype == np.int64


def test_batch_file_larger_than_a_batch_is_refused_before_unpickling(tmp_path, monkeypatch):
    write_cifar(tmp_path)
    big = tmp_path / "data_batch_1"  # read first: nothing is unpickled before the refusal
    big.write_bytes(b"\x80\x02" + b"\0" * cifar.max_batch_bytes(N))
    monkeypatch.setattr(cifar._RestrictedUnpickler, "load", None)  # unpickling it would be a bug
    msg = error_of("cifar10", tmp_path)
    assert f"data_batch_1: {big.stat().st_size} bytes, more than a CIFAR-10 batch" in msg


def test_archive_member_larger_than_a_batch_is_refused_before_extraction(tmp_path):
    arrays = cifar_arrays()
    too_big = b"\0" * (cifar.max_batch_bytes(N) + 1)
    write_cifar_tar(tmp_path / "cifar-10-python.tar.gz", arrays, extra={"cifar-10-batches-py/data_batch_3": too_big})
    msg = error_of("cifar10", tmp_path)
    assert "member cifar-10-batches-py/data_batch_3 is" in msg and "the archive is not CIFAR-10" in msg
    assert not (data_cache() / "cifar-10-batches-py").exists()
