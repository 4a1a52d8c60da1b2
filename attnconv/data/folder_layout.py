"""Folder datasets, the layout: torchvision's ImageFolder, one folder per split.

    PATH/train/<class>/*.png|jpg|jpeg|bmp|gif|webp|tif|ppm|pgm   (any depth below <class>)
    PATH/test/<class>/...    (or PATH/val/<class>/... when there is no test/)

Classes are the train split's sub-folders, sorted by name (label = index). Hidden
files and folders (".name") and files with other extensions are skipped. A class
folder may be a symlink to a folder outside the dataset, but not into it, not onto
another class folder, and not a loop (each would count images twice). Every mistake
in the layout is one error naming the folder and the fix.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from attnconv.data.decode import IMAGE_EXTENSIONS
from attnconv.errors import AttnconvError
from attnconv.fileio import dangling_link, file_kind, not_a_folder, open_regular, unreadable_folder

TEST_SPLITS = ("test", "val")
LAYOUT_HELP = "expected PATH/train/<class>/<images> and PATH/test/<class>/<images> (or PATH/val/...)"
# Part of every cache key: bump it when the decoded pixels or the cache format change.
DECODE_VERSION = 1


@dataclass(frozen=True)
class FolderLayout:
    """The files of a folder dataset: (relative path, label) per image, train split first."""

    root: Path
    test_split: str  # "test" or "val"
    classes: tuple[str, ...]
    train: tuple[tuple[str, int], ...]
    test: tuple[tuple[str, int], ...]
    stamps: tuple[tuple[str, int, int], ...]  # (relative path, size, mtime_ns) of every image, in order

    @property
    def files(self) -> tuple[tuple[str, int], ...]:
        return self.train + self.test

    def cache_key(self, image_size: int) -> str:
        """A hash of the folder, the image size, and every image's name, size, modification time and bytes.

        Reads every file (far cheaper than decoding it): an edit that keeps the size and
        restores the modification time still changes the key.
        """
        text = json.dumps([DECODE_VERSION, str(self.root), image_size, self.test_split, self.stamps, self.content_hash()])
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def content_hash(self) -> str:
        """A hash of every image's bytes, in order."""
        paths = [self.root / rel for rel, _, _ in self.stamps]
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:  # hashlib reads without the GIL
            digests = list(pool.map(_file_hash, paths))
        return hashlib.blake2b(b"".join(digests), digest_size=16).hexdigest()


def _file_hash(path: Path) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    try:
        with open_regular(path, "remove it from the folder") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError as e:
        raise AttnconvError(f"{path}: cannot read ({e.strerror}); fix or remove it") from e
    return h.digest()


def _is_image(name: str) -> bool:
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def _class_folders(split: Path) -> list[str]:
    entries = sorted(os.scandir(split), key=lambda e: e.name)
    for e in entries:
        if e.is_symlink() and not e.name.startswith("."):
            try:
                os.stat(e.path)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise AttnconvError(
                        f"{split / e.name} is a symlink loop ({err.strerror}); remove the link, "
                        "or point it to a folder of images"
                    ) from err
    names = [e.name for e in entries if e.is_dir() and not e.name.startswith(".")]
    stray = [e.name for e in entries if e.is_file() and _is_image(e.name)]
    if stray:
        raise AttnconvError(
            f"{split / stray[0]} is not in a class folder; move the images of {split} into "
            f"{split}/<class>/ folders ({LAYOUT_HELP})"
        )
    if not names:
        raise AttnconvError(f"{split} has no class folders; {LAYOUT_HELP}")
    return names


def _images_in(folder: Path) -> list[Path]:
    """Image files below ``folder`` (symlinked files followed, symlinked sub-folders not), sorted."""
    found = []

    def unreadable(err: OSError) -> None:  # a folder this user cannot list is no empty class
        if isinstance(err, PermissionError):
            raise AttnconvError(unreadable_folder(err.filename or folder)) from None

    for dirpath, dirnames, filenames in os.walk(folder, onerror=unreadable):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found.extend(Path(dirpath) / f for f in filenames if _is_image(f))
    return sorted(found)


def _within(path: Path, folder: Path) -> bool:
    return path == folder or path.is_relative_to(folder)


def _check_links(root: Path, class_folders: dict[str, list[str]]) -> None:
    """Refuse class folders that resolve to the dataset, a split, or (into or around) another class folder."""
    real = {(s, c): Path(os.path.realpath(root / s / c)) for s, names in class_folders.items() for c in names}
    splits = {s: Path(os.path.realpath(root / s)) for s in class_folders}
    containers = [(f"the dataset folder {root}", Path(os.path.realpath(root)))]
    containers += [(f"the {s} folder", path) for s, path in splits.items()]
    for (split, cls), path in real.items():
        if path == splits[split] / cls:  # not a symlink itself (a symlinked split or root is fine)
            continue
        holds = [f"{name} itself" if path == c else f"which holds {name}" for name, c in containers if _within(c, path)]
        where = holds[0] if holds else None
        for (s, c), other in real.items():
            if where is None and (s, c) != (split, cls) and (_within(path, other) or _within(other, path)):
                relation = "the same folder as" if path == other else "inside" if _within(path, other) else "which holds"
                where = f"{relation} the class folder {root / s / c}"
        if where is None:
            where = next((f"inside {name}" for name, c in containers if _within(path, c)), None)
        if where is not None:
            inside = any(_within(path, c) or _within(c, path) for _, c in containers)
            fix = f"remove the link, or point it to a folder outside {root}" if inside else \
                "remove the link, or point it to a folder no other class folder leads to"  # both lead outside
            raise AttnconvError(f"{root / split / cls} resolves to {path}, {where}: its images would be counted "
                                f"twice; {fix}")


# Control characters (C0, DEL, C1): never part of a class name, here or in a run's config.json (`runs.files`).
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _reads_as(name: str) -> str:
    """What a class name reads as: é one way or the other (NFC), a ligature as its letters, spaces at its ends dropped
    and runs of them inside as one (as a page shows them). Not every compatibility form: x² and x2, H₂O and H2O read
    otherwise."""
    composed = unicodedata.normalize("NFC", name)
    letters = "".join(unicodedata.normalize("NFKC", c) if 0xFB00 <= ord(c) <= 0xFB4F else c for c in composed)
    return re.sub(r"\s+", " ", letters).strip()


def _told_apart(a: str, b: str) -> tuple[str, str]:
    """Two names that read alike, quoted as they are, each with the code points of its characters beyond ASCII that the
    other lacks, since they may print the same ('café' (U+00E9) and 'café' (U+0301): é as one character or as e and
    an accent; 'ﬁsh' (U+FB01) and 'fish'). No escapes: the CLI's error line escapes what needs it, once."""
    def quoted(name: str, other: str) -> str:
        own = sorted({c for c in name if not c.isascii() and c not in other}, key=name.index)
        return f"'{name}'" + (f" ({' '.join(f'U+{ord(c):04X}' for c in own)})" if own else "")

    return quoted(a, b), quoted(b, a)


def scan_folder(root: Path) -> FolderLayout:
    """List a folder dataset's images; raises one AttnconvError for any layout mistake."""
    why = not_a_folder(root, "does not exist")
    if why:
        raise AttnconvError(f"image folder {root}: {why}; {LAYOUT_HELP}")
    for split in ("train", *TEST_SPLITS):  # there, but no folder (a file, a device, a link to nowhere): named
        why = not_a_folder(root / split)
        if why and os.path.lexists(root / split):
            raise AttnconvError(f"{root / split}: not a folder ({why}); make it a folder of class folders, or "
                                f"remove it ({LAYOUT_HELP})")
    if not (root / "train").is_dir():
        raise AttnconvError(f"{root} has no train/ folder; {LAYOUT_HELP}")
    test_split = next((s for s in TEST_SPLITS if (root / s).is_dir()), None)
    if test_split is None:
        raise AttnconvError(f"{root} has no test/ (or val/) folder to evaluate on; {LAYOUT_HELP}")
    train, test = Path(os.path.realpath(root / "train")), Path(os.path.realpath(root / test_split))
    if _within(train, test) or _within(test, train):  # a link: the test accuracy would be a training accuracy
        relation = "the same folder as" if train == test else "inside" if _within(test, train) else "which holds"
        raise AttnconvError(f"{root / test_split} resolves to {test}, {relation} the train folder {root / 'train'}: "
                            f"its images would be counted as training and test images; give {test_split}/ images of "
                            "its own")
    class_folders = {split: _class_folders(root / split) for split in ("train", test_split)}
    for split, names in class_folders.items():  # a run records its class names; commands print them
        bad = next((c for c in names if CONTROL_CHARACTERS.search(c)), None)
        if bad is not None:
            raise AttnconvError(f"{root / split}: the class folder '{bad}' has a control character in its name (a "
                                "class name is printed by predict, eval and the report): rename the folder")
        alike: dict[str, str] = {}
        for c in names:  # two names that read the same (é as one character or as e and an accent, a ligature, a
            key = _reads_as(c)  # trailing space): two classes shown as one in every table
            if key in alike:
                first, second = _told_apart(alike[key], c)
                raise AttnconvError(f"{root / split}: the class folders {first} and {second} read alike (the same "
                                    "name in two Unicode forms, a ligature and its letters, or but for spaces): rename one "
                                    "of them")
            alike[key] = c
    _check_links(root, class_folders)
    classes = class_folders["train"]
    label = {c: i for i, c in enumerate(classes)}
    splits: dict[str, list[tuple[str, int]]] = {"train": [], test_split: []}
    stamps = []
    for split, items in splits.items():
        for cls in class_folders[split]:
            folder = root / split / cls
            if os.path.lexists(folder / "config.json") and not _images_in(folder):  # a run moved in: not a class
                raise AttnconvError(f"{folder} holds an attnconv run (config.json), not images: a folder in "
                                    f"{root / split} is read as a class; move the run out of the image folder {root}")
            there = root / "train" / cls
            why = not_a_folder(there) if os.path.lexists(there) else None  # there, but no folder: not "missing"
            if why:
                raise AttnconvError(f"{there}: not a class folder ({why}); make it a folder of training images, or "
                                    f"remove it and {folder}")
            same = None if cls in label else next((c for c in label if _reads_as(c) == _reads_as(cls)), None)
            if same is not None:
                ours, theirs = _told_apart(cls, same)
                raise AttnconvError(f"{folder}: the class {ours} reads as {root / 'train'}'s {theirs} but is another "
                                    "name (another Unicode form, a ligature for its letters, or other spaces): rename one "
                                    "to match the other")
            if cls not in label:
                cased = next((c for c in label if _reads_as(c).casefold() == _reads_as(cls).casefold()), None)
                if cased is not None:  # Cat and cat: two names to attnconv, as to the file system here
                    ours, theirs = _told_apart(cls, cased)
                    raise AttnconvError(f"{folder}: class {ours} has no folder in {root / 'train'}, which has {theirs} "
                                        "(the names differ in case or letter forms only, and class names are compared "
                                        "exactly): rename one to match the other")
                raise AttnconvError(
                    f"{folder}: class {cls!r} has no folder in {root / 'train'}; add {root / 'train' / cls}/ "
                    f"with training images, or remove {folder}"
                )
            images = _images_in(folder)
            if not images:
                raise AttnconvError(
                    f"{folder} holds no images ({', '.join(IMAGE_EXTENSIONS)}); add some or remove the folder"
                )
            for path in images:
                rel = path.relative_to(root).as_posix()
                try:
                    st = path.stat()
                except OSError as e:  # e.g. a symlink to nowhere: named as one
                    raise AttnconvError(f"{path}: {dangling_link(path) or f'cannot read ({e.strerror})'}; fix or "
                                        "remove it") from e
                if not stat.S_ISREG(st.st_mode):  # a named pipe would block the scan forever, a device never end
                    raise AttnconvError(f"{path} is {file_kind(st.st_mode)}, not an image file; remove it from the "
                                        "folder")
                items.append((rel, label[cls]))
                stamps.append((rel, st.st_size, st.st_mtime_ns))
    return FolderLayout(
        root, test_split, tuple(classes), tuple(splits["train"]), tuple(splits[test_split]), tuple(stamps)
    )
