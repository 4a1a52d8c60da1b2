"""Tests for attnconv.data: real-format files written on the fly, offline downloads, augmentation, batching."""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnconv import data
from attnconv.errors import AttnconvError
from fixtures_data import (
    CIFAR_BATCHES,
    FASHION_STEMS,
    cifar_arrays,
    cifar_batch_bytes,
    fake_urlopen,
    fashion_arrays,
    idx_bytes,
    write_cifar,
    write_cifar_tar,
    write_fashion,
    write_idx,
)

REAL_FASHION = Path("/usr/share/datasets/fashion-mnist")
FASHION = data.dataset_info("fashion-mnist")
CIFAR = data.dataset_info("cifar10")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No network, no $ATTNCONV_DATA, a private cache, no system dirs: only what a test writes is seen."""
    monkeypatch.delenv("ATTNCONV_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setattr(data, "SYSTEM_DIRS", {"cifar10": (), "fashion-mnist": ()})
    monkeypatch.setattr(data.urllib.request, "urlopen", fake_urlopen({}))


def cache() -> Path:
    return data.cache_dir()


def assert_fashion_equal(train: data.ImageSet, test: data.ImageSet, arrays: dict[str, np.ndarray]) -> None:
    assert train.images.dtype == torch.uint8 and train.labels.dtype == torch.int64
    n_train, n_test = len(arrays["train-labels-idx1-ubyte"]), len(arrays["t10k-labels-idx1-ubyte"])
    assert train.images.shape == (n_train, 1, 28, 28) and test.images.shape == (n_test, 1, 28, 28)
    assert np.array_equal(train.images[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    assert np.array_equal(train.labels.numpy(), arrays["train-labels-idx1-ubyte"])
    assert np.array_equal(test.images[:, 0].numpy(), arrays["t10k-images-idx3-ubyte"])
    assert np.array_equal(test.labels.numpy(), arrays["t10k-labels-idx1-ubyte"])


def assert_cifar_equal(train: data.ImageSet, test: data.ImageSet, arrays) -> None:
    train_images = np.concatenate([arrays[n][0] for n in CIFAR_BATCHES[:5]])
    train_labels = np.concatenate([arrays[n][1] for n in CIFAR_BATCHES[:5]])
    assert train.images.dtype == torch.uint8 and train.labels.dtype == torch.int64
    assert train.images.shape == (len(train_labels), 3, 32, 32)
    assert np.array_equal(train.images.numpy(), train_images)
    assert np.array_equal(train.labels.numpy(), train_labels)
    assert np.array_equal(test.images.numpy(), arrays["test_batch"][0])
    assert np.array_equal(test.labels.numpy(), arrays["test_batch"][1])


def error_of(name: str, data_dir, **kwargs) -> str:
    with pytest.raises(AttnconvError) as e:
        data.load_dataset(name, data_dir, **kwargs)
    return str(e.value)


# --------------------------------------------------------------------------- info


def test_dataset_info_fields_and_aliases():
    assert (FASHION.channels, FASHION.size, FASHION.num_classes, len(FASHION.classes)) == (1, 28, 10, 10)
    assert (CIFAR.channels, CIFAR.size, CIFAR.num_classes, len(CIFAR.classes)) == (3, 32, 10, 10)
    assert len(CIFAR.mean) == len(CIFAR.std) == 3 and len(FASHION.mean) == len(FASHION.std) == 1
    assert data.dataset_info("Fashion_MNIST") is FASHION and data.dataset_info("CIFAR-10") is CIFAR
    assert set(data.DATASETS) == {"cifar10", "fashion-mnist"}


def test_unknown_dataset_name_lists_valid_names(tmp_path):
    for call in (lambda: data.dataset_info("mnist"), lambda: data.load_dataset("mnist", tmp_path)):
        with pytest.raises(AttnconvError, match="unknown dataset 'mnist'.*cifar10, fashion-mnist"):
            call()


def test_imageset_rejects_wrong_dtypes_and_lengths():
    with pytest.raises(AttnconvError, match="uint8"):
        data.ImageSet(torch.zeros(2, 1, 4, 4), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(AttnconvError, match="2 images but 3 labels"):
        data.ImageSet(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.zeros(3, dtype=torch.int64))
    assert len(data.ImageSet(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64))) == 2


def test_channel_stats_is_population_mean_and_std():
    images = torch.randint(0, 256, (6, 3, 5, 4), dtype=torch.uint8)
    mean, std = data.channel_stats(images)
    x = images.double().numpy() / 255
    assert np.allclose(mean, x.mean(axis=(0, 2, 3)), atol=1e-12)
    assert np.allclose(std, x.std(axis=(0, 2, 3)), atol=1e-12)


# --------------------------------------------------------------------------- Fashion-MNIST files


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
def test_fashion_loads_idx_files(tmp_path, gz):
    arrays = write_fashion(tmp_path / "d", gz=gz)
    assert_fashion_equal(*data.load_dataset("fashion-mnist", tmp_path / "d", download=False), arrays)


def test_fashion_accepts_subfolder_and_env_var(tmp_path, monkeypatch):
    arrays = write_fashion(tmp_path / "root" / "fashion-mnist")
    monkeypatch.setenv("ATTNCONV_DATA", str(tmp_path / "root"))
    assert_fashion_equal(*data.load_dataset("fashion-mnist", download=False), arrays)


def test_search_order_data_dir_then_env_then_cache_then_system(tmp_path, monkeypatch):
    copies = {k: write_fashion(tmp_path / k, seed=i) for i, k in enumerate(["arg", "env", "system"])}
    copies["cache"] = write_fashion(cache() / "fashion-mnist", seed=3)
    monkeypatch.setenv("ATTNCONV_DATA", str(tmp_path / "env"))
    monkeypatch.setattr(data, "SYSTEM_DIRS", {"fashion-mnist": (tmp_path / "system",), "cifar10": ()})
    assert_fashion_equal(*data.load_dataset("fashion-mnist", tmp_path / "arg", download=False), copies["arg"])
    assert_fashion_equal(*data.load_dataset("fashion-mnist", download=False), copies["env"])
    monkeypatch.delenv("ATTNCONV_DATA")
    assert_fashion_equal(*data.load_dataset("fashion-mnist", download=False), copies["cache"])
    (cache() / "fashion-mnist").rename(tmp_path / "moved")
    assert_fashion_equal(*data.load_dataset("fashion-mnist", download=False), copies["system"])
    assert data.search_dirs("fashion-mnist", "x") == [Path("x"), cache(), tmp_path / "system"]


def test_missing_data_dir_is_an_error(tmp_path):
    assert "does-not-exist" in error_of("fashion-mnist", tmp_path / "does-not-exist")


def test_fashion_not_found_without_download_explains_how_to_get_it(tmp_path):
    msg = error_of("fashion-mnist", tmp_path, download=False)
    assert "download=False" in msg and str(tmp_path) in msg and str(cache()) in msg
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
    table = dict(data._DOWNLOAD_MD5)
    for stem, array in (("t10k-images-idx3-ubyte", np.zeros((10000, 28, 28), np.uint8)),
                        ("t10k-labels-idx1-ubyte", np.zeros(10000, np.uint8))):
        path = write_idx(tmp_path / stem, array, gz=True)
        table[path.name] = hashlib.md5(path.read_bytes()).hexdigest()
    monkeypatch.setattr(data, "_DOWNLOAD_MD5", table)
    _, test = data.load_dataset("fashion-mnist", tmp_path, download=False)
    assert len(test) == 10000


# --------------------------------------------------------------------------- downloads (offline)


def fashion_served(arrays: dict[str, np.ndarray]) -> dict[str, bytes]:
    return {f"{data.FASHION_URL}{stem}.gz": gzip.compress(idx_bytes(a)) for stem, a in arrays.items()}


def use_md5_of(monkeypatch, served: dict[str, bytes]) -> None:
    """Make the small served files the 'official' ones, so the success path of download runs offline."""
    table = dict(data._DOWNLOAD_MD5)
    for url, payload in served.items():
        table[url.rsplit("/", 1)[1]] = hashlib.md5(payload).hexdigest()
    monkeypatch.setattr(data, "_DOWNLOAD_MD5", table)


def test_download_verifies_md5_and_renames_into_place(tmp_path, monkeypatch):
    payload = b"some archive bytes" * 1000
    monkeypatch.setattr(data.urllib.request, "urlopen", fake_urlopen({"http://x/f.gz": payload}))
    dest = data.download("http://x/f.gz", tmp_path / "sub" / "f.gz", hashlib.md5(payload).hexdigest(), chunk=100)
    assert dest.read_bytes() == payload and os.listdir(tmp_path / "sub") == ["f.gz"]


def test_download_wrong_checksum_deletes_temp_file(tmp_path, monkeypatch):
    monkeypatch.setattr(data.urllib.request, "urlopen", fake_urlopen({"http://x/f.gz": b"tampered"}))
    with pytest.raises(AttnconvError, match=r"checksum mismatch for f.gz .*expected 0{32}"):
        data.download("http://x/f.gz", tmp_path / "f.gz", "0" * 32)
    assert os.listdir(tmp_path) == []


def test_fashion_download_offline(tmp_path, monkeypatch):
    arrays = fashion_arrays()
    served, calls = fashion_served(arrays), []
    monkeypatch.setattr(data.urllib.request, "urlopen", fake_urlopen(served, calls))
    use_md5_of(monkeypatch, served)
    assert_fashion_equal(*data.load_dataset("fashion-mnist", tmp_path), arrays)
    assert sorted(calls) == sorted(served)
    assert sorted(os.listdir(cache() / "fashion-mnist")) == sorted(f"{s}.gz" for s in FASHION_STEMS)
    calls.clear()  # second load: from the cache, no network
    assert_fashion_equal(*data.load_dataset("fashion-mnist", tmp_path), arrays)
    assert calls == []


def test_fashion_download_completes_a_partial_download(tmp_path, monkeypatch):
    arrays = fashion_arrays()
    served, calls = fashion_served(arrays), []
    (cache() / "fashion-mnist").mkdir(parents=True)
    for stem in FASHION_STEMS[:2]:  # an earlier run got these two, then lost the network
        write_idx(cache() / "fashion-mnist" / stem, arrays[stem], gz=True)
    monkeypatch.setattr(data.urllib.request, "urlopen", fake_urlopen(served, calls))
    use_md5_of(monkeypatch, served)
    assert_fashion_equal(*data.load_dataset("fashion-mnist"), arrays)
    assert calls == [f"{data.FASHION_URL}{s}.gz" for s in FASHION_STEMS[2:]]


def test_fashion_download_with_official_checksums_rejects_other_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(data.urllib.request, "urlopen", fake_urlopen(fashion_served(fashion_arrays())))
    msg = error_of("fashion-mnist", tmp_path)
    assert "checksum mismatch for train-images-idx3-ubyte.gz" in msg and "8d4fb7e6c68d591d4c3dfef9ec88bf0d" in msg
    assert list((cache() / "fashion-mnist").iterdir()) == []  # temp file deleted, nothing renamed into place


def test_network_failure_says_where_and_how(tmp_path):
    msg = error_of("fashion-mnist", tmp_path)  # the autouse fixture's urlopen fails like an offline machine
    assert "could not download" in msg and "Temporary failure in name resolution" in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "--data-dir" in msg and str(tmp_path) in msg
    msg = error_of("cifar10", tmp_path)
    assert data.CIFAR_URL in msg and "--data-dir" in msg


# --------------------------------------------------------------------------- CIFAR-10 files


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
    extracted = cache() / "cifar-10-batches-py"
    assert {p.name for p in extracted.iterdir()} == {*CIFAR_BATCHES, ".source"}
    assert [p.name for p in cache().iterdir()] == ["cifar-10-batches-py"]  # no temporary folders left
    monkeypatch.setattr(data.tarfile, "open", None)  # a second load must reuse the extraction
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
    outside = tmp_path / "absolute-escape"
    evil = {"../../escaped": b"x", str(outside): b"x", "cifar-10-batches-py/../up": b"x"}
    (tmp_path / "d").mkdir()
    write_cifar_tar(tmp_path / "d" / "cifar-10-python.tar.gz", cifar_arrays(), extra=evil)
    data.load_dataset("cifar10", tmp_path / "d", download=False)
    written = {p.name for p in tmp_path.parent.rglob("*")}
    assert not {"escaped", "up", "absolute-escape"} & written


def test_cifar_corrupt_tar_is_named(tmp_path):
    path = write_cifar_tar(tmp_path / "cifar-10-python.tar.gz", cifar_arrays())
    path.write_bytes(path.read_bytes()[:-200])
    msg = error_of("cifar10", tmp_path)
    assert "cifar-10-python.tar.gz: corrupt archive" in msg and data.CIFAR_URL in msg
    assert [p for p in cache().glob(".*")] == []  # temporary extraction folder removed


def test_cifar_tar_missing_a_batch_is_named(tmp_path):
    arrays = cifar_arrays()
    del arrays["data_batch_4"]
    write_cifar_tar(tmp_path / "cifar-10-python.tar.gz", arrays)
    assert "archive lacks cifar-10-batches-py/data_batch_4" in error_of("cifar10", tmp_path)


def test_cifar_download_offline(tmp_path, monkeypatch):
    arrays = cifar_arrays()
    served = {data.CIFAR_URL: write_cifar_tar(tmp_path / "served.tar.gz", arrays).read_bytes()}
    monkeypatch.setattr(data.urllib.request, "urlopen", fake_urlopen(served))
    use_md5_of(monkeypatch, served)
    (tmp_path / "empty").mkdir()
    assert_cifar_equal(*data.load_dataset("cifar10", tmp_path / "empty"), arrays)
    assert (cache() / "cifar-10-python.tar.gz").read_bytes() == served[data.CIFAR_URL]


def test_cifar_download_wrong_checksum(tmp_path, monkeypatch):
    served = {data.CIFAR_URL: write_cifar_tar(tmp_path / "served.tar.gz", cifar_arrays()).read_bytes()}
    monkeypatch.setattr(data.urllib.request, "urlopen", fake_urlopen(served))
    (tmp_path / "empty").mkdir()
    msg = error_of("cifar10", tmp_path / "empty")
    assert "checksum mismatch for cifar-10-python.tar.gz" in msg and "c58f30108f718f92721af3b95e74349a" in msg
    assert list(cache().iterdir()) == []


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


@pytest.mark.parametrize(
    "batch, expected",
    [
        ({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}, "uint8 array (N, 3072)"),
        ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, "uint8 array (N, 3072)"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "2 images but 1 labels"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 12]}, "labels must be in 0..9"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": ["a", "b"]}, "list of ints"),
        ([1, 2], "expected a dict"),
    ],
)
def test_cifar_wrong_content_is_named(tmp_path, batch, expected):
    write_cifar(tmp_path)
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps(batch, protocol=4))
    msg = error_of("cifar10", tmp_path)
    assert "data_batch_1" in msg and expected in msg


def test_cifar_official_size_batch_must_match_md5(tmp_path):
    arrays = cifar_arrays()
    arrays["test_batch"] = (np.zeros((10000, 3, 32, 32), np.uint8), np.zeros(10000, np.int64))
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name, (images, labels) in arrays.items():
        (folder / name).write_bytes(cifar_batch_bytes(images, labels))
    msg = error_of("cifar10", tmp_path)
    assert "test_batch: has the size of the official test_batch" in msg and "40351d587109b95175f43aff81a1287e" in msg


# --------------------------------------------------------------------------- real data


@pytest.mark.skipif(not REAL_FASHION.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_real_fashion_mnist(monkeypatch):
    monkeypatch.setattr(data, "SYSTEM_DIRS", {"fashion-mnist": (REAL_FASHION,), "cifar10": ()})
    train, test = data.load_dataset("fashion-mnist", download=False)
    assert train.images.shape == (60000, 1, 28, 28) and test.images.shape == (10000, 1, 28, 28)
    assert torch.bincount(train.labels).tolist() == [6000] * 10
    assert torch.bincount(test.labels).tolist() == [1000] * 10
    mean, std = data.channel_stats(train.images)
    assert np.allclose(mean, FASHION.mean, atol=1e-6) and np.allclose(std, FASHION.std, atol=1e-6)
    x = data.normalize(train.images[:20000], FASHION)
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1) < 0.01


# --------------------------------------------------------------------------- augmentation


def test_normalize_matches_formula():
    images = torch.randint(0, 256, (4, 3, 5, 6), dtype=torch.uint8)
    expected = (images.double() / 255 - torch.tensor(CIFAR.mean).view(1, 3, 1, 1).double()) / torch.tensor(
        CIFAR.std
    ).view(1, 3, 1, 1).double()
    got = data.normalize(images, CIFAR)
    assert got.dtype == torch.float32 and torch.allclose(got.double(), expected, atol=1e-5)


def test_normalize_does_not_modify_float_input():
    x = torch.rand(2, 3, 4, 4) * 255
    before = x.clone()
    data.normalize(x, CIFAR)
    assert torch.equal(x, before)


@pytest.mark.parametrize("pad", [0, 1, 4])
def test_centered_crop_is_identity(pad):
    x = torch.randint(0, 256, (5, 3, 7, 9), dtype=torch.uint8)
    offsets = torch.full((5, 2), pad)
    assert torch.equal(data.crop_flip(x, offsets, torch.zeros(5, dtype=torch.bool), pad), x)


def test_flip_equals_torch_flip():
    x = torch.randn(5, 3, 7, 9)
    got = data.crop_flip(x, torch.full((5, 2), 4), torch.ones(5, dtype=torch.bool), 4)
    assert torch.equal(got, x.flip(-1))


def test_corner_crop_shows_zero_padding():
    x = torch.randint(1, 256, (2, 1, 6, 6), dtype=torch.uint8)
    got = data.crop_flip(x, torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, dtype=torch.bool), 2)
    assert (got[:, :, :2, :] == 0).all() and (got[:, :, :, :2] == 0).all()
    assert torch.equal(got[:, :, 2:, 2:], x[:, :, :4, :4])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_random_crop_flip_matches_per_image_reference(dtype):
    g = torch.Generator().manual_seed(3)
    B, C, H, W, pad = 16, 3, 7, 10, 3
    x = torch.randint(0, 256, (B, C, H, W), generator=g).to(dtype)
    offsets = torch.randint(0, 2 * pad + 1, (B, 2), generator=g)
    flips = torch.randint(0, 2, (B,), generator=g).bool()
    got = data.crop_flip(x, offsets, flips, pad)
    padded = F.pad(x, (pad, pad, pad, pad))
    for i in range(B):  # reference: slice the padded image, then mirror
        top, left = offsets[i].tolist()
        ref = padded[i, :, top : top + H, left : left + W]
        assert torch.equal(got[i], ref.flip(-1) if flips[i] else ref)
    assert got.dtype == dtype


def test_random_crop_flip_depends_only_on_generator():
    x = torch.randint(0, 256, (64, 1, 8, 8), dtype=torch.uint8)
    a = data.random_crop_flip(x, torch.Generator().manual_seed(5))
    torch.manual_seed(123)  # the global RNG must not matter
    b = data.random_crop_flip(x, torch.Generator().manual_seed(5))
    c = data.random_crop_flip(x, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_random_crop_flip_draws_every_offset_and_both_flips():
    offsets, flips = data._draw_crop_flip(2000, torch.Generator().manual_seed(0), pad=4, flip=True)
    assert set(offsets.flatten().tolist()) == set(range(9))
    assert 900 < int(flips.sum()) < 1100
    _, no_flips = data._draw_crop_flip(100, torch.Generator().manual_seed(0), pad=4, flip=False)
    assert not no_flips.any()


# --------------------------------------------------------------------------- batches


def id_set(n: int, info: data.DatasetInfo = FASHION) -> data.ImageSet:
    """Images with random pixels in 1..255 (so padding, 0, is recognizable); labels = sample ids."""
    images = torch.randint(1, 256, (n, info.channels, info.size, info.size), dtype=torch.uint8)
    return data.ImageSet(images, torch.arange(n))


def collect(batches) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    xs, ys = zip(*batches) if len(batches) else ((), ())
    return list(xs), list(ys)


def test_num_batches():
    assert data.num_batches(10, 3, drop_last=True) == 3 and data.num_batches(10, 3, drop_last=False) == 4
    assert data.num_batches(9, 3, drop_last=False) == 3 and data.num_batches(2, 3, drop_last=True) == 0


def test_train_epoch_visits_each_sample_at_most_once_and_shuffles():
    s = id_set(50)
    batches = data.iterate_batches(s, FASHION, 8, seed=0, epoch=0, train=True, augment=True)
    xs, ys = collect(batches)
    assert len(batches) == len(ys) == 6  # drop_last defaults to train
    seen = torch.cat(ys)
    assert len(seen) == 48 and len(set(seen.tolist())) == 48 and not torch.equal(seen, torch.arange(48))
    assert all(x.shape == (8, 1, 28, 28) and x.dtype == torch.float32 for x in xs)


def test_eval_batches_are_the_normalized_images_in_order():
    s = id_set(21)
    xs, ys = collect(data.iterate_batches(s, FASHION, 8, seed=0, epoch=0, train=False, augment=False))
    assert [len(y) for y in ys] == [8, 8, 5]
    assert torch.equal(torch.cat(ys), torch.arange(21))
    assert torch.equal(torch.cat(xs), data.normalize(s.images, FASHION))


def test_batches_are_a_function_of_seed_epoch_and_index_only():
    s = id_set(40)

    def run(seed, epoch):
        return collect(data.iterate_batches(s, FASHION, 8, seed=seed, epoch=epoch, train=True, augment=True))

    a = run(1, 2)
    torch.manual_seed(99)
    b = run(1, 2)
    assert all(torch.equal(u, v) for u, v in zip(a[0] + a[1], b[0] + b[1]))
    assert not torch.equal(torch.cat(run(1, 3)[1]), torch.cat(a[1]))
    assert not torch.equal(torch.cat(run(2, 2)[1]), torch.cat(a[1]))


@pytest.mark.parametrize("k", [1, 3, 5])
def test_resume_from_start_batch_replays_the_same_batches(k):
    s = id_set(45)
    kwargs = dict(seed=7, epoch=4, train=True, augment=True)
    full_x, full_y = collect(data.iterate_batches(s, FASHION, 8, **kwargs))
    resumed = data.iterate_batches(s, FASHION, 8, start_batch=k, **kwargs)
    res_x, res_y = collect(resumed)
    assert len(resumed) == len(full_x) - k == len(res_x)
    for u, v in zip(full_x[k:] + full_y[k:], res_x + res_y):
        assert torch.equal(u, v)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("drop_last", [True, False])
def test_shards_union_equals_global_batch(world_size, drop_last):
    s = id_set(43, CIFAR)
    kwargs = dict(seed=0, epoch=1, train=True, augment=True, drop_last=drop_last)
    glob_x, glob_y = collect(data.iterate_batches(s, CIFAR, 16, **kwargs))
    shards = [
        collect(data.iterate_batches(s, CIFAR, 16, rank=r, world_size=world_size, **kwargs))
        for r in range(world_size)
    ]
    assert all(len(sh[0]) == len(glob_x) for sh in shards)  # every rank runs the same number of steps
    for k in range(len(glob_x)):
        assert torch.equal(torch.cat([sh[0][k] for sh in shards]), glob_x[k])  # same samples, same augmentation
        assert torch.equal(torch.cat([sh[1][k] for sh in shards]), glob_y[k])
    if drop_last:
        assert all(len(sh[1][0]) == 16 // world_size for sh in shards)


def test_augmented_batches_pad_with_black():
    s = id_set(64)  # pixels 1..255, so only padding is 0 before normalization
    black = (0 - FASHION.mean[0]) / FASHION.std[0]
    darkest = (1 / 255 - FASHION.mean[0]) / FASHION.std[0]
    x = torch.cat(collect(data.iterate_batches(s, FASHION, 32, seed=0, epoch=0, train=True, augment=True))[0])
    is_black = torch.isclose(x, torch.tensor(black, dtype=torch.float32))
    assert is_black.any() and ((x >= darkest - 1e-5) | is_black).all()


def test_iterate_batches_rejects_bad_arguments():
    s = id_set(10)
    kw = dict(seed=0, epoch=0, train=True, augment=False)
    with pytest.raises(AttnconvError, match="not divisible by world_size"):
        data.iterate_batches(s, FASHION, 5, world_size=2, **kw)
    with pytest.raises(AttnconvError, match="rank"):
        data.iterate_batches(s, FASHION, 4, rank=2, world_size=2, **kw)
    with pytest.raises(AttnconvError, match="start_batch 3 is outside 0..2"):
        data.iterate_batches(s, FASHION, 4, start_batch=3, **kw)
    with pytest.raises(AttnconvError, match="expects \\(3, 32, 32\\)"):
        data.iterate_batches(s, CIFAR, 4, **kw)


def test_each_batch_gets_its_own_augmentation():
    # Identical images: any difference between batches comes from the per-batch crop/flip draws.
    image = torch.randint(1, 256, (1, 1, 28, 28), dtype=torch.uint8)
    s = data.ImageSet(image.expand(32, -1, -1, -1).clone(), torch.zeros(32, dtype=torch.int64))
    xs, _ = collect(data.iterate_batches(s, FASHION, 16, seed=0, epoch=0, train=True, augment=True))
    assert not torch.equal(xs[0], xs[1])
    assert len({tuple(x.flatten().tolist()) for x in xs[0]}) > 8  # and differing crops within a batch
