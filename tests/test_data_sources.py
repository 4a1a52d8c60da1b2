"""attnconv.data sources: search order, the cache, checksum-verified downloads (offline)."""

from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path

import pytest
from fixtures_data import (
    FASHION_STEMS,
    assert_fashion_equal,
    data_cache,
    error_of,
    fake_urlopen,
    fashion_arrays,
    fashion_served,
    isolated_data,  # noqa: F401 (fixture)
    use_md5_of,
    write_fashion,
    write_idx,
)

from attnconv import data
from attnconv.data import sources
from attnconv.errors import AttnconvError

pytestmark = pytest.mark.usefixtures("isolated_data")


def test_search_order_data_dir_then_env_then_cache_then_system(tmp_path, monkeypatch):
    copies = {k: write_fashion(tmp_path / k, seed=i) for i, k in enumerate(["arg", "env", "system"])}
    copies["cache"] = write_fashion(data_cache() / "fashion-mnist", seed=3)
    monkeypatch.setenv("ATTNCONV_DATA", str(tmp_path / "env"))
    monkeypatch.setitem(sources.SYSTEM_DIRS, "fashion-mnist", (tmp_path / "system",))
    assert_fashion_equal(*data.load_dataset("fashion-mnist", tmp_path / "arg", download=False), copies["arg"])
    assert_fashion_equal(*data.load_dataset("fashion-mnist", download=False), copies["env"])
    monkeypatch.delenv("ATTNCONV_DATA")
    assert_fashion_equal(*data.load_dataset("fashion-mnist", download=False), copies["cache"])
    (data_cache() / "fashion-mnist").rename(tmp_path / "moved")
    assert_fashion_equal(*data.load_dataset("fashion-mnist", download=False), copies["system"])
    assert data.search_dirs("fashion-mnist", "x") == [Path("x"), data_cache(), tmp_path / "system"]


def test_missing_data_dir_is_an_error(tmp_path):
    assert "does-not-exist" in error_of("fashion-mnist", tmp_path / "does-not-exist")



def test_download_verifies_md5_and_renames_into_place(tmp_path, monkeypatch):
    payload = b"some archive bytes" * 1000
    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen({"http://x/f.gz": payload}))
    dest = data.download("http://x/f.gz", tmp_path / "sub" / "f.gz", hashlib.md5(payload).hexdigest(), chunk=100)
    assert dest.read_bytes() == payload and os.listdir(tmp_path / "sub") == ["f.gz"]


def test_download_wrong_checksum_deletes_temp_file(tmp_path, monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen({"http://x/f.gz": b"tampered"}))
    with pytest.raises(AttnconvError, match=r"checksum mismatch for f.gz .*expected 0{32}"):
        data.download("http://x/f.gz", tmp_path / "f.gz", "0" * 32)
    assert os.listdir(tmp_path) == []


def test_fashion_download_offline(tmp_path, monkeypatch):
    arrays = fashion_arrays()
    served, calls = fashion_served(arrays), []
    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen(served, calls))
    use_md5_of(monkeypatch, served)
    assert_fashion_equal(*data.load_dataset("fashion-mnist", tmp_path), arrays)
    assert sorted(calls) == sorted(served)
    assert sorted(os.listdir(data_cache() / "fashion-mnist")) == sorted(f"{s}.gz" for s in FASHION_STEMS)
    calls.clear()  # second load: from the cache, no network
    assert_fashion_equal(*data.load_dataset("fashion-mnist", tmp_path), arrays)
    assert calls == []


def test_fashion_download_completes_a_partial_download(tmp_path, monkeypatch):
    arrays = fashion_arrays()
    served, calls = fashion_served(arrays), []
    (data_cache() / "fashion-mnist").mkdir(parents=True)
    for stem in FASHION_STEMS[:2]:  # an earlier run got these two, then lost the network
        write_idx(data_cache() / "fashion-mnist" / stem, arrays[stem], gz=True)
    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen(served, calls))
    use_md5_of(monkeypatch, served)
    assert_fashion_equal(*data.load_dataset("fashion-mnist"), arrays)
    assert calls == [f"{data.FASHION_URL}{s}.gz" for s in FASHION_STEMS[2:]]


def test_fashion_download_with_official_checksums_rejects_other_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen(fashion_served(fashion_arrays())))
    msg = error_of("fashion-mnist", tmp_path)
    assert "checksum mismatch for train-images-idx3-ubyte.gz" in msg and "8d4fb7e6c68d591d4c3dfef9ec88bf0d" in msg
    assert list((data_cache() / "fashion-mnist").iterdir()) == []  # temp file deleted, nothing renamed into place


def test_network_failure_says_where_and_how(tmp_path):
    msg = error_of("fashion-mnist", tmp_path)  # the autouse fixture's urlopen fails like an offline machine
    assert "could not download" in msg and "Temporary failure in name resolution" in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "--data-dir" in msg and str(tmp_path) in msg
    msg = error_of("cifar10", tmp_path)
    assert data.CIFAR_URL in msg and "--data-dir" in msg

