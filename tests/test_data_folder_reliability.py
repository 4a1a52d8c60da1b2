"""Folder datasets when things go wrong: a full or read-only cache disk, a killed writer,
symlinked class folders, huge images, files edited in place."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import tempfile
import threading
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


def folders() -> Path:
    return data.cache_dir() / "folders"


def caches() -> list[Path]:
    return sorted(p for p in folders().iterdir() if not p.name.startswith(".")) if folders().is_dir() else []


def hidden() -> list[str]:
    return sorted(p.name for p in folders().glob(".*")) if folders().is_dir() else []


def folder_error(root: Path, **kwargs) -> str:
    with pytest.raises(AttnconvError) as e:
        data.load_dataset(name(root), **kwargs)
    assert "\n" not in str(e.value)
    return str(e.value)


def dead_pid() -> int:
    child = subprocess.Popen(["sleep", "0"])
    child.wait()  # reaped: the pid names no process now
    return child.pid


# --------------------------------------------------------------------------- a full disk, a killed writer


def test_full_disk_is_one_error_naming_the_cache_and_leaves_no_temporary(tmp_path, monkeypatch):
    write_image_folder(tmp_path)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    msg = folder_error(tmp_path, image_size=16)
    assert f"{folders()}: no space left for the dataset cache" in msg
    assert "free space there, or set XDG_CACHE_HOME to a disk with room" in msg
    assert caches() == [] and hidden() == []


def test_a_filesystem_that_cannot_reserve_space_gets_the_zeros_written(tmp_path, monkeypatch):
    write_image_folder(tmp_path)
    expected, _ = data.load_dataset(name(tmp_path), image_size=16)
    for cache in caches():
        os.rename(cache, tmp_path / "old-cache")

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported, raising=False)
    train, _ = data.load_dataset(name(tmp_path), image_size=16)
    assert torch.equal(train.images, expected.images) and hidden() == []


def test_the_temporary_folder_names_its_writer(tmp_path):
    seen = []

    def fill(images):
        seen.extend(hidden())
        return {"train_size": 1, "test_size": 1, "channels": 1, "size": 2, "classes": ["a"], "mean": [0.5], "std": [0.25]}

    folder_cache.build_cache(folders() / ("ab" * 16), np.zeros(2, np.int64), (1, 2, 2), fill)
    [tmp] = seen
    assert tmp.startswith(f".{'ab' * 16}.{folder_cache.writer_tag(os.getpid())}.") and tmp.endswith(".attnconv-tmp")
    assert hidden() == [] and folder_cache.open_cache(folders() / ("ab" * 16)) is not None


def test_a_dead_writers_temporary_folder_is_removed_on_the_next_load(tmp_path):
    write_image_folder(tmp_path / "d")
    folders().mkdir(parents=True)
    key = "0123456789abcdef" * 2
    dead = folders() / f".{key}.{folder_cache.writer_tag(dead_pid())}.k3j_x9z2.attnconv-tmp"
    dead_old = folders() / f".{key}.old.{folder_cache.writer_tag(dead_pid())}.q1w2e3r4.attnconv-tmp"
    live = folders() / f".{key}.{folder_cache.writer_tag(os.getpid())}.a1b2c3d4.attnconv-tmp"
    other_host = folders() / f".{key}.{dead_pid()}-00000000.a1b2c3d4.attnconv-tmp"
    not_ours = [folders() / f".{key}.a1b2c3d4.attnconv-tmp", folders() / ".notes.attnconv-tmp", folders() / ".keep"]
    for d in (dead, dead_old, live, other_host, *not_ours):
        d.mkdir()
        (d / "images.npy").write_bytes(b"half written")
    assert folder_cache.writer_tag(os.getpid()) != f"{os.getpid()}-00000000"
    data.load_dataset(name(tmp_path / "d"), image_size=8)
    assert not dead.exists() and not dead_old.exists()
    assert live.is_dir() and other_host.is_dir() and all(d.is_dir() for d in not_ours)
    data.load_dataset(name(tmp_path / "d"), image_size=8)  # a cached load cleans up too, and keeps the live one
    assert live.is_dir()


# --------------------------------------------------------------------------- a read-only cache


@pytest.mark.parametrize("read_only", ["folders", "attnconv"])
def test_read_only_cache_folder_names_the_cache_and_xdg_cache_home(tmp_path, monkeypatch, read_only):
    write_image_folder(tmp_path / "d")
    locked = folders() if read_only == "folders" else data.cache_dir()
    locked.mkdir(parents=True)
    if os.geteuid() == 0:  # root writes through chmod: make the calls fail as they would for a user
        real_mkdtemp, real_mkdir = tempfile.mkdtemp, Path.mkdir

        def mkdtemp(*args, **kwargs):
            if Path(kwargs.get("dir") or args[2]) == locked:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(locked))
            return real_mkdtemp(*args, **kwargs)

        def mkdir(self, *args, **kwargs):
            if self.parent == locked and not self.exists():
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
            return real_mkdir(self, *args, **kwargs)

        monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
        monkeypatch.setattr(Path, "mkdir", mkdir)
    locked.chmod(0o555)
    try:
        msg = folder_error(tmp_path / "d", image_size=8)
    finally:
        locked.chmod(0o755)
    assert f"{folders()}: cannot write the dataset cache (" in msg
    assert "make it writable, or set XDG_CACHE_HOME to put the cache elsewhere" in msg
    assert caches() == [] and hidden() == []


# --------------------------------------------------------------------------- symlinked class folders


@pytest.mark.parametrize("case, link, target, expected", [
    ("split", "train/loop", ".", "the train folder itself"),
    ("root", "train/up", "..", "the dataset folder {root} itself"),
    ("above-root", "train/all", "../..", "which holds the dataset folder {root}"),
    ("other-class", "train/kitty", "cat", "the same folder as the class folder {root}/train/cat"),
    ("other-split", "train/leak", "../test/cat", "the same folder as the class folder {root}/test/cat"),
    ("test-to-train", "test/cat", "../train/cat", "the same folder as the class folder {root}/train/cat"),
    ("inside-root", "train/extra", "../notes", "inside the dataset folder {root}"),
    ("loop", "train/loop", "loop", "is a symlink loop"),
    ("two-loop", "train/ping", "pong", "is a symlink loop"),
    ("same-outside", "train/twin", "{outside}", "the same folder as the class folder {root}/train/x-shared"),
    ("inside-outside", "train/part", "{outside}/sub", "inside the class folder {root}/train/x-shared"),
    ("split-twins", "test/x-shared", "{outside}", "the same folder as the class folder {root}/test/x-shared"),
])
def test_class_folder_symlinked_into_the_dataset_or_onto_another_class_is_refused(tmp_path, case, link, target, expected):
    root, outside = tmp_path / "d", tmp_path / "outside"
    write_image_folder(root)
    (outside / "sub").mkdir(parents=True)
    halves(8, 8).save(outside / "a.png")
    halves(8, 8).save(outside / "sub" / "b.png")
    (root / "notes").mkdir()
    halves(8, 8).save(root / "notes" / "n.png")
    (root / "train" / "x-shared").symlink_to(outside)
    if case == "test-to-train":
        for f in (root / "test" / "cat").iterdir():
            f.unlink()
        (root / "test" / "cat").rmdir()
    if case == "two-loop":
        (root / "train" / "pong").symlink_to("ping")
    (root / link).symlink_to(target.format(outside=outside))
    msg = folder_error(root, image_size=8)
    named = "train/x-shared" if case == "split-twins" else link  # the first of the two links, in scan order
    assert msg.startswith(f"{root / named} ") and expected.format(root=root) in msg
    assert "remove the link" in msg and caches() == []


def test_class_folder_symlinked_to_a_folder_outside_the_dataset_loads(tmp_path):
    root, outside = tmp_path / "d", tmp_path / "elsewhere" / "fish"
    write_image_folder(root)
    outside.mkdir(parents=True)
    for i in range(3):
        halves(10, 10, dark=10 * i).save(outside / f"fish{i}.png")
    (root / "train" / "fish").symlink_to(outside)
    (root / "test" / "fish").mkdir()
    halves(10, 10).save(root / "test" / "fish" / "fish9.png")
    train, test = data.load_dataset(name(root), image_size=8)
    info = data.dataset_info(name(root), image_size=8)
    assert info.classes == ("bird", "cat", "dog", "fish")
    assert train.labels.tolist().count(3) == 3 and len(train) == 15 and len(test) == 5


# --------------------------------------------------------------------------- huge images


def test_decompression_bomb_warning_never_escapes_and_too_large_is_one_error(tmp_path, monkeypatch, recwarn):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # the folder's images are 1089..1500 pixels: warned about
    write_image_folder(tmp_path)
    train, _ = data.load_dataset(name(tmp_path), image_size=8)
    assert len(train) == 12
    huge = tmp_path / "train" / "cat" / "huge.png"
    halves(50, 50).save(huge)  # 2500 pixels, beyond Pillow's hard limit (twice MAX_IMAGE_PIXELS)
    msg = folder_error(tmp_path, image_size=8)
    assert msg.startswith(f"{huge}: the image is too large to decode (") and "shrink it or remove it" in msg
    assert [str(w.message) for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)] == []


def test_decoding_threads_leave_the_warning_filters_as_they_were(tmp_path):
    import warnings

    write_image_folder(tmp_path)
    before = list(warnings.filters)
    data.load_dataset(name(tmp_path), image_size=8)
    assert warnings.filters == before
    assert decode.decode_image(tmp_path / "train" / "cat" / "cat0.png", False, 8).shape == (3, 8, 8)
    assert warnings.filters == before


# --------------------------------------------------------------------------- edits in place


def test_same_size_edit_with_restored_mtime_is_decoded_again(tmp_path):
    write_image_folder(tmp_path)
    image = tmp_path / "train" / "cat" / "cat0.png"
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(image, compress_level=0)
    first, _ = data.load_dataset(name(tmp_path), image_size=16)
    before = image.stat()
    Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(image, compress_level=0)
    os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = image.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    again, _ = data.load_dataset(name(tmp_path), image_size=16)
    i = 4  # bird0..3, then cat0
    assert torch.equal(again.images[i], torch.tensor(decode.decode_image(image, False, 16)))
    assert not torch.equal(again.images[i], first.images[i]) and len(caches()) == 1


# --------------------------------------------------------------------------- round 35


def test_round_35_cache_entries_empty_files_in_the_way_and_another_users_entry(tmp_path, monkeypatch):
    """An empty labels.npy in a cache entry was an EOFError traceback; a file or a link to nowhere where a folder of
    the cache goes was "(Not a directory); free space there", naming another path; an entry that could not be moved
    aside (another user's) left an empty `.old` temporary folder behind, one a try."""
    write_image_folder(tmp_path / "d")
    first, _ = data.load_dataset(name(tmp_path / "d"), image_size=8)
    (entry,) = caches()
    (entry / folder_cache.LABELS).write_bytes(b"")
    again, _ = data.load_dataset(name(tmp_path / "d"), image_size=8)  # rebuilt, as other broken entries are
    assert torch.equal(again.labels, first.labels) and folder_cache.open_cache(entry) is not None

    shutil.rmtree(entry)
    (entry / folder_cache.LABELS).parent.mkdir()
    (entry / folder_cache.LABELS).write_bytes(b"")  # inconsistent: moved aside and rebuilt, unless it cannot move
    real = os.replace

    def refuse(src, dst, *args, **kwargs):
        if str(src) == str(entry):
            raise PermissionError(13, "Permission denied", str(src))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", refuse)
    msg = folder_error(tmp_path / "d", image_size=8)
    assert "cannot write the dataset cache (Permission denied" in msg and hidden() == []
    monkeypatch.setattr(os, "replace", real)

    for what, make, words, places in (
            ("a file", lambda p: p.write_text("x"), "it is a file", (data.cache_dir(), folders())),  # an entry's: replaced
            ("a link to nowhere", lambda p: p.symlink_to(tmp_path / "gone"), f"a link to {tmp_path / 'gone'}, which "
                                                                              "does not exist",
             (data.cache_dir(), folders(), entry))):
        for where in places:
            shutil.rmtree(data.cache_dir(), ignore_errors=True)
            if data.cache_dir().is_symlink() or data.cache_dir().is_file():
                data.cache_dir().unlink()
            where.parent.mkdir(parents=True, exist_ok=True)
            make(where)
            msg = folder_error(tmp_path / "d", image_size=8)
            assert msg.startswith(f"{where}: {words}, where the dataset cache needs a folder; move it away, or set "
                                  "XDG_CACHE_HOME"), (what, where, msg)
            where.unlink()


def test_round_36_cache_files_that_are_no_regular_file_or_an_index_of_wrong_types_are_rebuilt(tmp_path):
    """A cache entry's images.npy, labels.npy or index.json that is a FIFO (or index.json a link to /dev/zero) hung
    the load; an index.json with a mean of "x", or nested 100,000 deep, was a traceback: each is an entry that does
    not match its index, rebuilt."""
    write_image_folder(tmp_path / "d")
    first, _ = data.load_dataset(name(tmp_path / "d"), image_size=8)
    (entry,) = caches()
    index = json.loads((entry / folder_cache.INDEX).read_text())
    damages = [(folder_cache.IMAGES, "fifo"), (folder_cache.LABELS, "fifo"), (folder_cache.INDEX, "fifo"),
               (folder_cache.INDEX, "zero"), (folder_cache.INDEX, json.dumps({**index, "mean": ["x"]})),
               (folder_cache.INDEX, json.dumps({**index, "std": [-1]})), (folder_cache.INDEX, "[" * 100_000),
               (folder_cache.INDEX, json.dumps({**index, "classes": [1, 2, 3, 4]}))]
    for file, damage in damages:
        path = entry / file
        path.unlink()
        if damage == "fifo":
            os.mkfifo(path)
        elif damage == "zero":
            path.symlink_to("/dev/zero")
        else:
            path.write_text(damage)
        opened: list = []  # a FIFO read would block: in a thread, so that the test fails instead of hanging
        reader = threading.Thread(target=lambda out=opened: out.append(folder_cache.open_cache(entry)), daemon=True)
        reader.start()
        reader.join(30)
        assert opened == [None], (file, damage[:20])
        again, _ = data.load_dataset(name(tmp_path / "d"), image_size=8)
        assert torch.equal(again.images, first.images) and torch.equal(again.labels, first.labels)
        assert caches() == [entry] and hidden() == []


def test_round_37_an_index_edited_to_values_of_the_right_type_is_rebuilt(tmp_path):
    """index.json's classes set to ["a", "b", "c"] or swapped, or a mean of 1e308 or a spread of 1e-320, was trusted:
    a 3-class model trained on 2-class data in silence, or `eval` told to restore data that never changed. An index
    that does not say what its folder holds, or holds statistics no folder of images has, is rebuilt."""
    write_image_folder(tmp_path / "d")
    first, _ = data.load_dataset(name(tmp_path / "d"), image_size=8)
    info = folder.folder_info(tmp_path / "d", 8)
    (entry,) = caches()
    index = json.loads((entry / folder_cache.INDEX).read_text())
    classes = list(index["classes"])
    for edit in ({"classes": [*classes, "extra"]}, {"classes": classes[::-1]}, {"classes": [classes[0]] * len(classes)},
                 {"mean": [1e308] * len(index["mean"])}, {"std": [1e-320] * len(index["std"])},
                 {"train_size": index["train_size"] - 1}):
        (entry / folder_cache.INDEX).write_text(json.dumps({**index, **edit}))
        again, _ = data.load_dataset(name(tmp_path / "d"), image_size=8)
        assert torch.equal(again.images, first.images) and torch.equal(again.labels, first.labels), edit
        assert folder.folder_info(tmp_path / "d", 8) == info, edit
        assert json.loads((entry / folder_cache.INDEX).read_text()) == index, edit


def test_round_38_an_index_edited_within_range_is_rebuilt_and_one_colour_training_images_are_refused(tmp_path, capsys):
    """A mean of 0.5 where the folder's is 0.39 (a value a folder could have) was trusted: `eval` sent to restore data
    that never changed, `train` writing the edited statistics into its config.json. The index is sealed when
    written; an edited one is rebuilt. Training images all of one value (a spread of 0) blamed the run's own new
    config.json and left it behind: refused naming the dataset, before any file is written."""
    from PIL import Image

    from attnconv.cli import main

    write_image_folder(tmp_path / "d")
    first, _ = data.load_dataset(name(tmp_path / "d"), image_size=8)
    (entry,) = caches()
    index = json.loads((entry / folder_cache.INDEX).read_text())
    for edit in ({"mean": [0.5] * len(index["mean"])}, {"std": [0.25] * len(index["std"])}, {"size": 8}):
        (entry / folder_cache.INDEX).write_text(json.dumps({**index, **edit}))
        folder.folder_info(tmp_path / "d", 8)
        assert json.loads((entry / folder_cache.INDEX).read_text()) == index, edit

    flat = tmp_path / "flat"
    for split, count in (("train", 4), ("test", 2)):
        for cls in ("a", "b"):
            (flat / split / cls).mkdir(parents=True)
            for i in range(count):
                value = 128 if split == "train" else 40 * i + (cls == "b") * 10
                Image.new("L", (8, 8), value).save(flat / split / cls / f"{i}.png")
    out = tmp_path / "run"
    assert main(["train", "--model", "sa-quadratic", "--hidden", "8", "--layers", "1", "--heads", "4", "--max-steps",
                 "1", "--no-progress", "--dataset", f"folder:{flat}", "--out", str(out)]) == 2
    assert "its training images are all of one value (a spread of 0)" in capsys.readouterr().err
    assert not out.exists()


def test_round_39_a_cache_entry_is_its_own_index_and_arrays_another_users_is_named_one_flat_channel_trains(
        tmp_path, monkeypatch):
    """An index.json (validly sealed) copied from another folder's entry with the same classes and sizes was trusted:
    `train` recorded the other folder's statistics, or, with its images.npy too, trained on the other folder's pixels;
    labels.npy rewritten was trained on. Each entry's index now names the entry and holds a digest of its arrays: a
    copy or an edit is rebuilt. An entry another user made (mode 0700) was "cannot write ... make it writable", after
    decoding the whole folder: now the entry is named, with its owner, first. RGB images with one constant channel (the
    others varying) were refused as "all of one value": that channel is left at 0 by its mean (std 1)."""
    write_image_folder(tmp_path / "d", seed=0)
    write_image_folder(tmp_path / "e", seed=1)
    first_d, _ = data.load_dataset(name(tmp_path / "d"), image_size=8)
    data.load_dataset(name(tmp_path / "e"), image_size=8)
    info_d = data.dataset_info(name(tmp_path / "d"), image_size=8)
    entry_d, entry_e = (next(p for p in caches() if json.loads((p / folder_cache.INDEX).read_text())["folder"] == str(
        tmp_path / f)) for f in "de")
    for names in ((folder_cache.INDEX,), (folder_cache.INDEX, folder_cache.IMAGES, folder_cache.LABELS),
                  (folder_cache.IMAGES,), (folder_cache.LABELS,)):
        for n in names:
            shutil.copy(entry_e / n, entry_d / n)
        again, _ = data.load_dataset(name(tmp_path / "d"), image_size=8)
        assert torch.equal(again.images, first_d.images) and torch.equal(again.labels, first_d.labels), names
        assert data.dataset_info(name(tmp_path / "d"), image_size=8).mean == info_d.mean, names
    labels = np.load(entry_d / folder_cache.LABELS)
    np.save(entry_d / folder_cache.LABELS, labels[::-1].copy())  # the labels reordered, the index untouched
    again, _ = data.load_dataset(name(tmp_path / "d"), image_size=8)
    assert torch.equal(again.labels, first_d.labels)

    import pwd

    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != entry_d)  # another user's entry
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: type("P", (), {"pw_name": "alice"})())
    monkeypatch.setattr(folder, "open_cache", lambda directory: None)  # as it cannot be read
    message = folder_error(tmp_path / "d", image_size=8)
    assert message.startswith(f"{entry_d}: this user may not read it (owned by alice, mode ") and message.endswith(
        "so the dataset cache there cannot be used; set XDG_CACHE_HOME to a cache folder of your own, or have its owner "
        "open it to you"), message
    monkeypatch.undo()

    blue = tmp_path / "blue"
    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("test", 2)):
        for cls in ("a", "b"):
            (blue / split / cls).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
                pixels[..., 2] = 0  # two-band data stored as RGB
                Image.fromarray(pixels, mode="RGB").save(blue / split / cls / f"{i}.png")
    info = data.dataset_info(name(blue), image_size=8)
    assert info.std[2] == 1.0 and info.std[0] > 0 and info.mean[2] == 0.0
    from attnconv.cli import main

    assert main(["train", "--model", "sa-quadratic", "--hidden", "8", "--layers", "1", "--heads", "4", "--max-steps",
                 "1", "--no-progress", "--dataset", name(blue), "--image-size", "8", "--out", str(tmp_path / "run")]) == 0
