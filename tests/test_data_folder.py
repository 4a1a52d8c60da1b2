"""attnconv.data folder datasets (folder:PATH): layout, decoding, statistics, the cache, every bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_data import halves, isolated_data, write_image_folder  # noqa: F401 (isolated_data: fixture)
from PIL import Image

from attnconv import data
from attnconv.data import decode, folder, folder_cache
from attnconv.errors import AttnconvError

pytestmark = pytest.mark.usefixtures("isolated_data")


def name(root: Path) -> str:
    return f"folder:{root}"


def caches() -> list[Path]:
    base = data.cache_dir() / "folders"
    return sorted(base.iterdir()) if base.is_dir() else []


def folder_error(root: Path, **kwargs) -> str:
    with pytest.raises(AttnconvError) as e:
        data.load_dataset(name(root), **kwargs)
    assert "\n" not in str(e.value)
    return str(e.value)


def count_decodes(monkeypatch) -> list[Path]:
    calls: list[Path] = []
    real = decode.decode_image

    def counted(path, grey, size, **kwargs):
        calls.append(path)
        return real(path, grey, size, **kwargs)

    monkeypatch.setattr(decode, "decode_image", counted)
    return calls


# --------------------------------------------------------------------------- loading


def test_folder_loads_as_imagesets_with_sorted_classes(tmp_path):
    layout = write_image_folder(tmp_path / "pets")
    train, test = data.load_dataset(name(tmp_path / "pets"), image_size=16)
    assert train.images.dtype == torch.uint8 and train.labels.dtype == torch.int64
    assert train.images.shape == (12, 3, 16, 16) and test.images.shape == (4, 3, 16, 16)
    classes = ("bird", "cat", "dog")
    assert train.labels.tolist() == [classes.index(c) for _, c in layout["train"]]
    assert test.labels.tolist() == [classes.index(c) for _, c in layout["test"]]  # test has no bird: cat is still 1
    info = data.dataset_info(name(tmp_path / "pets"), image_size=16)
    assert (info.classes, info.num_classes, info.channels, info.size) == (classes, 3, 3, 16)
    assert (info.train_size, info.test_size, info.name) == (12, 4, f"folder:{(tmp_path / 'pets').resolve()}")


def test_statistics_are_the_training_split_pixel_mean_and_std(tmp_path):
    write_image_folder(tmp_path)
    train, test = data.load_dataset(name(tmp_path), image_size=12)
    info = data.dataset_info(name(tmp_path), image_size=12)
    mean, std = data.channel_stats(train.images)
    assert np.allclose(info.mean, mean, atol=1e-12) and np.allclose(info.std, std, atol=1e-12)
    assert not np.allclose(info.mean, data.channel_stats(torch.cat([train.images, test.images]))[0], atol=1e-6)


def test_resize_shorter_side_then_center_crop(tmp_path):
    for split in ("train", "test"):
        (tmp_path / split / "a").mkdir(parents=True)
    # wide: 64x32, left half black -> resized to 32x16, the center 16 columns: left 8 black, right 8 white
    halves(64, 32).save(tmp_path / "train" / "a" / "wide.png")
    # tall: 30x90, top half black -> resized to 16x48, the center 16 rows are rows 16..31: the middle
    halves(30, 90, vertical=False).save(tmp_path / "train" / "a" / "tall.png")
    Image.new("RGB", (20, 20), (200, 10, 30)).save(tmp_path / "test" / "a" / "red.png")
    train, test = data.load_dataset(name(tmp_path), image_size=16)
    tall, wide = train.images[0].int(), train.images[1].int()  # sorted: tall.png, wide.png
    assert (wide[:, :, :7] == 0).all() and (wide[:, :, 9:] == 255).all()
    assert (tall[:, :7] == 0).all() and (tall[:, 9:] == 255).all()  # rows 16..23 black, 24..31 white
    assert test.images[0, :, 8, 8].tolist() == [200, 10, 30]  # channel order R, G, B


def test_all_grey_folder_is_one_channel_and_mixed_is_rgb(tmp_path):
    write_image_folder(tmp_path / "grey", grey=True)
    train, _ = data.load_dataset(name(tmp_path / "grey"), image_size=8)
    assert train.images.shape[1] == 1 and data.dataset_info(name(tmp_path / "grey"), image_size=8).channels == 1
    layout = write_image_folder(tmp_path / "mixed")
    train, _ = data.load_dataset(name(tmp_path / "mixed"), image_size=8)
    grey_one = next(i for i, (rel, _) in enumerate(layout["train"]) if rel.endswith("3.jpg"))  # i == 3: mode L
    x = train.images[grey_one]
    assert x.shape[0] == 3 and torch.equal(x[0], x[1]) and torch.equal(x[1], x[2])


def test_sixteen_bit_and_palette_images(tmp_path):
    for split in ("train", "test"):
        (tmp_path / split / "a").mkdir(parents=True)
    Image.fromarray(np.full((10, 10), 0x8123, np.uint16)).save(tmp_path / "train" / "a" / "deep.png")
    grey_palette = Image.new("P", (10, 10), 0)
    grey_palette.putpalette([v for i in range(256) for v in (i, i, i)])
    grey_palette.putpixel((0, 0), 77)
    grey_palette.save(tmp_path / "test" / "a" / "grey.gif")
    train, test = data.load_dataset(name(tmp_path), image_size=10)
    assert train.images.shape[1] == 1 and (train.images == 0x81).all()  # 16 bits -> the high byte
    assert test.images[0, 0, 0, 0] == 77
    colour = Image.new("P", (10, 10), 1)
    colour.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    colour.save(tmp_path / "test" / "a" / "red.gif")
    train, test = data.load_dataset(name(tmp_path), image_size=10)
    assert test.images.shape[1] == 3 and test.images[1, :, 5, 5].tolist() == [255, 0, 0]


def test_exif_orientation_is_applied(tmp_path):
    for split in ("train", "test"):
        (tmp_path / split / "a").mkdir(parents=True)
    exif = Image.Exif()
    exif[0x0112] = 3  # Orientation: rotated 180 degrees
    halves(32, 32).save(tmp_path / "train" / "a" / "photo.jpg", exif=exif, quality=95)
    halves(32, 32).save(tmp_path / "test" / "a" / "plain.jpg", quality=95)
    train, test = data.load_dataset(name(tmp_path), image_size=16)
    assert train.images[0, 0, 8, 1] > 200 and train.images[0, 0, 8, 14] < 50  # shown turned: white on the left
    assert test.images[0, 0, 8, 1] < 50 and test.images[0, 0, 8, 14] > 200


def test_val_split_when_there_is_no_test_folder_and_default_size(tmp_path):
    write_image_folder(tmp_path, test_split="val")
    train, val = data.load_dataset(name(tmp_path))
    assert train.images.shape[2:] == (data.DEFAULT_IMAGE_SIZE,) * 2 == (32, 32) and len(val) == 4


def test_folder_sets_feed_iterate_batches(tmp_path):
    write_image_folder(tmp_path)
    train, _ = data.load_dataset(name(tmp_path), image_size=16)
    info = data.dataset_info(name(tmp_path), image_size=16)
    xs = [x for x, _ in data.iterate_batches(train, info, 4, seed=0, epoch=0, train=True, augment=True)]
    assert len(xs) == 3 and all(x.shape == (4, 3, 16, 16) and x.dtype == torch.float32 for x in xs)


def test_canonical_name_and_image_size_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert data.canonical_name("folder:pets") == f"folder:{tmp_path / 'pets'}"
    assert data.canonical_name("folder:~/x") == f"folder:{Path.home() / 'x'}"
    assert data.canonical_name("CIFAR-10") == "cifar10" and data.canonical_name("fashion_mnist") == "fashion-mnist"
    with pytest.raises(AttnconvError, match="unknown dataset 'mnist'.*folder:PATH"):
        data.canonical_name("mnist")
    with pytest.raises(AttnconvError, match="names no folder"):
        data.dataset_info("folder:")
    assert data.dataset_info("fashion-mnist", image_size=28).size == 28
    with pytest.raises(AttnconvError, match="image size 32 does not apply to fashion-mnist"):
        data.load_dataset("fashion-mnist", image_size=32)
    write_image_folder(tmp_path / "pets")
    for bad in (0, -3, "32", True, 5000):
        with pytest.raises(AttnconvError, match="image size must be an integer from 1 to 4096"):
            data.load_dataset("folder:pets", image_size=bad)


# --------------------------------------------------------------------------- the cache


def test_second_load_maps_the_cache_and_decodes_nothing(tmp_path, monkeypatch):
    write_image_folder(tmp_path)
    first = data.load_dataset(name(tmp_path), image_size=16)
    [cache] = caches()
    assert sorted(p.name for p in cache.iterdir()) == ["images.npy", "index.json", "labels.npy"]

    def no_decoding(*args, **kwargs):
        raise AssertionError("an image was opened on a cached load")

    monkeypatch.setattr(Image, "open", no_decoding)
    second = data.load_dataset(name(tmp_path), image_size=16)
    info = data.dataset_info(name(tmp_path), image_size=16)
    for a, b in zip(first, second):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert info.train_size == 12
    on_disk = np.load(cache / "images.npy")
    assert np.array_equal(on_disk[:12], second[0].images.numpy()) and np.array_equal(on_disk[12:], second[1].images)
    snapshot = first[0].images.clone()
    second[0].images[0] = 0  # writable for torch; the write stays in this process's copy-on-write pages
    assert np.array_equal(np.load(cache / "images.npy")[:12], snapshot) and torch.equal(first[0].images, snapshot)


def test_changed_folder_or_size_decodes_again_and_replaces_the_old_cache(tmp_path, monkeypatch):
    write_image_folder(tmp_path)
    data.load_dataset(name(tmp_path), image_size=16)
    calls = count_decodes(monkeypatch)
    data.load_dataset(name(tmp_path), image_size=16)
    assert calls == []
    data.load_dataset(name(tmp_path), image_size=8)  # another size: its own cache, the 16 one stays
    assert len(calls) == 16 and len(caches()) == 2
    calls.clear()
    image = tmp_path / "train" / "cat" / "cat0.png"
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
    train, _ = data.load_dataset(name(tmp_path), image_size=16)
    assert len(calls) == 16 and len(caches()) == 2  # the stale 16 cache was removed, the 8 one kept
    halves(20, 20).save(tmp_path / "train" / "cat" / "new.png")
    calls.clear()
    train, _ = data.load_dataset(name(tmp_path), image_size=16)
    assert len(calls) == 17 and len(train) == 13


def test_index_records_the_folder(tmp_path):
    write_image_folder(tmp_path, grey=True)
    data.load_dataset(name(tmp_path), image_size=8)
    index = json.loads((caches()[0] / "index.json").read_text())
    assert index["folder"] == str(tmp_path.resolve()) and index["mode"] == "L" and index["classes"] == ["bird", "cat", "dog"]


def test_inconsistent_cache_is_rebuilt(tmp_path, monkeypatch):
    write_image_folder(tmp_path)
    first, _ = data.load_dataset(name(tmp_path), image_size=16)
    [cache] = caches()
    np.save(cache / "labels.npy", np.zeros(3, np.int64))  # does not match the index
    calls = count_decodes(monkeypatch)
    again, _ = data.load_dataset(name(tmp_path), image_size=16)
    assert len(calls) == 16 and torch.equal(again.labels, first.labels) and len(caches()) == 1


def test_failed_decoding_leaves_no_cache_and_no_temporaries(tmp_path):
    write_image_folder(tmp_path)
    bad = tmp_path / "test" / "dog" / "dog1.jpg"
    bad.write_bytes(bad.read_bytes()[: len(bad.read_bytes()) // 2])
    msg = folder_error(tmp_path, image_size=16)
    assert f"{bad}: cannot decode the image" in msg and "replace the file or remove it" in msg
    assert caches() == [] and not any((data.cache_dir() / "folders").glob(".*"))


# --------------------------------------------------------------------------- bad input


def test_truncated_png_and_non_image_are_named(tmp_path):
    write_image_folder(tmp_path)
    png = tmp_path / "train" / "bird" / "bird0.png"
    png.write_bytes(png.read_bytes()[:-40])
    assert f"{png}: cannot decode the image" in folder_error(tmp_path)
    write_image_folder(tmp_path)
    fake = tmp_path / "train" / "dog" / "page.png"
    fake.write_bytes(b"<html>404 Not Found</html>")
    assert f"{fake}: cannot decode the image" in folder_error(tmp_path)


@pytest.mark.parametrize("case, expected", [
    ("no-folder", "image folder {root}: does not exist"),
    ("no-train", "{root} has no train/ folder; expected PATH/train/<class>/"),
    ("no-test", "{root} has no test/ (or val/) folder"),
    ("empty-class", "{root}/train/cat holds no images"),
    ("empty-test-class", "{root}/test/dog holds no images"),
    ("only-text", "{root}/train/bird holds no images (.bmp, .gif, .jpeg, .jpg"),
    ("test-class-not-in-train", "{root}/test/zebra: class 'zebra' has no folder in {root}/train"),
    ("no-classes", "{root}/train has no class folders"),
    ("flat", "{root}/train/loose.png is not in a class folder"),
    ("broken-link", "{root}/train/cat/gone.png: a link to"),  # named as a link to nowhere, not "cannot read"
    ("float-pixels", "{root}/train/cat/float.tif: F-mode pixels"),
])
def test_layout_mistakes_are_one_error_naming_the_folder(tmp_path, case, expected):
    root = tmp_path / "d"
    if case != "no-folder":
        write_image_folder(root)
    if case == "no-train":
        (root / "train").rename(tmp_path / "elsewhere")
    elif case == "no-test":
        (root / "test").rename(tmp_path / "elsewhere")
    elif case == "empty-class":
        for f in (root / "train" / "cat").iterdir():
            f.unlink()
    elif case == "empty-test-class":
        for f in (root / "test" / "dog").iterdir():
            f.unlink()
    elif case == "only-text":
        for f in (root / "train" / "bird").iterdir():
            f.rename(f.with_suffix(".txt"))
    elif case == "test-class-not-in-train":
        (root / "test" / "zebra").mkdir()
        halves(8, 8).save(root / "test" / "zebra" / "z.png")
    elif case == "no-classes":
        for d in (root / "train").iterdir():
            d.rename(tmp_path / f"out-{d.name}")
    elif case == "flat":
        halves(8, 8).save(root / "train" / "loose.png")
    elif case == "broken-link":
        (root / "train" / "cat" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    elif case == "float-pixels":
        Image.fromarray(np.zeros((4, 4), np.float32)).save(root / "train" / "cat" / "float.tif")
    assert expected.format(root=root) in folder_error(root)
    assert caches() == []


def test_folder_too_large_for_memory_says_what_it_needs_and_has(tmp_path, monkeypatch):
    write_image_folder(tmp_path)
    monkeypatch.setattr(folder, "available_memory", lambda: 10_000)
    calls = count_decodes(monkeypatch)
    msg = folder_error(tmp_path, image_size=16)
    need = 16 * 3 * 16 * 16  # N * C * S * S
    assert f"{tmp_path}: 16 images of 3x16x16 need {need / 2**20:.1f} MiB of memory, only 0.0 MiB" in msg
    assert "smaller --image-size" in msg and calls == [] and caches() == []
    monkeypatch.setattr(folder, "available_memory", lambda: need)  # exactly enough
    assert len(data.load_dataset(name(tmp_path), image_size=16)[0]) == 12


def test_available_memory_is_positive_and_at_most_physical():
    have = data.available_memory()
    assert 0 < have <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_builtin_search_is_unaffected_by_folder_names(tmp_path):
    assert data.search_dirs("fashion-mnist", tmp_path)[0] == tmp_path
    with pytest.raises(AttnconvError, match="unknown dataset"):
        data.search_dirs(name(tmp_path))



def test_a_cache_another_process_finished_meanwhile_is_kept(tmp_path):
    write_image_folder(tmp_path)
    data.load_dataset(name(tmp_path), image_size=8)
    [cache] = caches()
    inode = (cache / "images.npy").stat().st_ino
    index = json.loads((cache / "index.json").read_text())
    labels = np.load(cache / "labels.npy")
    fields = {k: v for k, v in index.items() if k != "format"}
    folder_cache.build_cache(cache, labels, (index["channels"], 8, 8), lambda images: fields)  # a racing rank
    assert (cache / "images.npy").stat().st_ino == inode  # the finished cache was not replaced
    assert caches() == [cache] and not list((data.cache_dir() / "folders").glob(".*"))
