"""The decoded-images cache of a folder dataset: one directory per (folder contents, image size).

    $XDG_CACHE_HOME/attnconv/folders/<key>/
        images.npy    uint8 (N, C, S, S), train images then test images; memory-mapped on load
        labels.npy    int64 (N,)
        index.json    classes, split sizes, channels, size, mean/std, the folder it came from, the entry's own
                      name ("entry") and a digest of images.npy and labels.npy ("arrays"), sealed with a digest of
                      itself: an index or arrays copied from another entry, or edited, are rebuilt

The directory is built under a temporary name next to it and renamed into place
(a reader sees all of it or none of it); a cache that does not match its index is
treated as absent and rebuilt. The temporary name carries its writer's PID and host
(``.<key>.<pid>-<host>.<random>.attnconv-tmp``), so the next load can remove the ones
a killed writer left (``remove_dead_temporaries``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attnconv.errors import AttnconvError
from attnconv.fileio import TMP_SUFFIX, atomic_write, fsync_dir, not_a_folder

INDEX, IMAGES, LABELS = "index.json", "images.npy", "labels.npy"
CACHE_FORMAT = 1
# A hash of the host name: a PID means nothing on another machine sharing the cache folder.
_HOST = hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest()
# Exactly the temporary folders build_cache makes: .<key>.[old.]<pid>-<host>.<mkdtemp's random>.attnconv-tmp
_TEMPORARY = re.compile(r"\.[0-9a-f]+\.(?:old\.)?([0-9]+)-([0-9a-f]{8})\.[a-z0-9_]+" + re.escape(TMP_SUFFIX))
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NOT_ALLOWED = (errno.EACCES, errno.EPERM, errno.EROFS)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def writer_tag(pid: int) -> str:
    """``<pid>-<host hash>``: the part of a temporary folder's name that says who is writing it."""
    return f"{pid}-{_HOST}"


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process id: leave it alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. EPERM: it exists, as another user
        return True
    return True


def remove_dead_temporaries(directory: Path) -> None:
    """Delete the temporary folders in ``directory`` whose writer (on this host) no longer runs, e.g. after ``kill -9``."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        match = _TEMPORARY.fullmatch(entry.name)
        if match is None or match.group(2) != _HOST or not entry.is_dir(follow_symlinks=False):
            continue
        if not _alive(int(match.group(1))):
            shutil.rmtree(entry.path, ignore_errors=True)


def _size(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _cache_error(target: Path, e: OSError, nbytes: int) -> AttnconvError:
    """One line for a failed write of the cache entry `target`: a full disk, a file or a link to nowhere where a
    folder of the cache goes (the entry or a folder above it), a folder we may not write, anything else."""
    directory = target.parent
    if e.errno in _NO_SPACE:
        return AttnconvError(
            f"{directory}: no space left for the dataset cache (the decoded images take {_size(nbytes)}); "
            "free space there, or set XDG_CACHE_HOME to a disk with room"
        )
    for path in (target, *target.parents):
        if os.path.lexists(path) and not path.is_dir():  # mkdir or rename would say "Not a directory", "File exists"
            return AttnconvError(f"{path}: {not_a_folder(path)}, where the dataset cache needs a folder; move it "
                                 "away, or set XDG_CACHE_HOME to put the cache elsewhere")
    if e.errno in _NOT_ALLOWED:
        closed = closed_entry(target)
        if closed is not None:  # a folder on the way, or the entry, this user may not enter or read: another user's
            return AttnconvError(closed)
        return AttnconvError(
            f"{directory}: cannot write the dataset cache ({e.strerror}: {e.filename or directory}); "
            "make it writable, or set XDG_CACHE_HOME to put the cache elsewhere"
        )
    return AttnconvError(
        f"{directory}: cannot write the dataset cache ({e.strerror or e}); "
        "free space there, or set XDG_CACHE_HOME to put the cache elsewhere"
    )


def closed_entry(target: Path) -> str | None:
    """The line for a folder on the way to the entry `target` that this user may not enter, or a file of the entry
    (the entry itself) it may not read, with its owner and mode (an entry another user made: attnconv makes them
    0700); None when every one is open to this user."""
    files = [target / name for name in (INDEX, IMAGES, LABELS)]
    for path in (*reversed(target.parents), target, *files):
        try:
            st = os.stat(path)
        except OSError:
            continue  # not there (yet): nothing closed at it
        if path == target and not stat.S_ISDIR(st.st_mode):
            break  # a file where the entry belongs: damage, moved aside and built anew, not another user's entry
        need = os.X_OK | os.R_OK if path == target else os.X_OK if stat.S_ISDIR(st.st_mode) else os.R_OK
        if os.access(path, need):
            continue
        try:
            import pwd

            owner = pwd.getpwuid(st.st_uid).pw_name
        except (ImportError, KeyError):
            owner = f"uid {st.st_uid}"
        what = "enter" if stat.S_ISDIR(st.st_mode) and path != target else "read"
        return (f"{path}: this user may not {what} it (owned by {owner}, mode {stat.S_IMODE(st.st_mode):o}), so the "
                "dataset cache there cannot be used; set XDG_CACHE_HOME to a cache folder of your own, or have its "
                f"owner open it to you")
    return None


def _reserve(fd: int, offset: int, length: int) -> None:
    """Allocate the file's blocks now, so that a full disk is an OSError here, not a SIGBUS on a mapped write."""
    if length == 0:
        return
    try:
        os.posix_fallocate(fd, offset, length)
        return
    except AttributeError:  # no posix_fallocate (macOS): write the zeros
        pass
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):  # the filesystem cannot: write the zeros
            raise
    zeros = bytes(min(length, 1 << 20))
    os.lseek(fd, offset, os.SEEK_SET)
    while length > 0:
        length -= os.write(fd, zeros[: min(length, len(zeros))])


def _new_images(path: Path, shape: tuple[int, ...]) -> np.memmap:
    """A new uint8 .npy file of ``shape`` with all its space reserved, mapped for writing."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False, "shape": shape})
        f.flush()
        offset = f.tell()
        _reserve(f.fileno(), offset, math.prod(shape))
    return np.memmap(path, dtype=np.uint8, mode="r+", offset=offset, shape=shape)


_MAX_INDEX_BYTES = 16 << 20  # classes' names and statistics: far less


def _regular(path: Path) -> bool:
    """Whether `path` is a regular file (through links): a FIFO or a device in a cache entry would hang a read."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _seal(index: dict) -> str:
    """The digest an index is written with (all of it but the digest): one edited by hand no longer matches it."""
    rest = {k: v for k, v in index.items() if k != "sealed"}
    return hashlib.blake2b(json.dumps(rest, sort_keys=True).encode(), digest_size=16).hexdigest()


def _sealed(index: dict) -> dict:
    return {**index, "sealed": _seal(index)}


def _arrays_digest(directory: Path) -> str:
    """A digest of the bytes of the entry's images.npy and labels.npy (read in chunks)."""
    digest = hashlib.blake2b(digest_size=16)
    for name in (IMAGES, LABELS):
        with open(directory / name, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
        digest.update(b"|")
    return digest.hexdigest()


def _sound_index(index: object) -> bool:
    """Whether `index` is as it was written (its seal) and holds what a load reads, of the types it reads them as
    (an edited one, even to values a folder could have, is rebuilt)."""
    if not isinstance(index, dict) or index.get("format") != CACHE_FORMAT or index.get("sealed") != _seal(index) \
            or not all(isinstance(index.get(k), str) for k in ("entry", "arrays")):  # entries before them: rebuilt
        return False
    counts = [index.get(k) for k in ("train_size", "test_size", "channels", "size")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts) or counts[2] not in (1, 3):
        return False
    classes, stats = index.get("classes"), [index.get("mean"), index.get("std")]
    return isinstance(classes, list) and all(isinstance(c, str) for c in classes) and all(
        isinstance(v, list) and len(v) == counts[2] and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                             and math.isfinite(x) for x in v) for v in stats) \
        and all(x >= 0 for x in stats[1])  # 0: images of one colour (refused where a run trains on them)


def read_index(directory: Path) -> dict | None:
    """The cache's index, or None when it is missing, no regular file, unreadable, of another format or unsound."""
    path = directory / INDEX
    try:
        if not _regular(path) or path.stat().st_size > _MAX_INDEX_BYTES:
            return None
        index = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return index if _sound_index(index) else None


def open_cache(directory: Path) -> tuple[dict, np.ndarray, np.ndarray] | None:
    """``(index, images (N, C, S, S) memory-mapped, labels (N,))``, or None if absent or inconsistent.

    The images are mapped copy-on-write (``mmap_mode="c"``): pages are read from the
    file on demand and shared between processes, and the array is writable for torch
    (writes stay private to the process, the file never changes).
    """
    index = read_index(directory)
    if index is None or not (_regular(directory / IMAGES) and _regular(directory / LABELS)):
        return None
    try:  # another entry's index or arrays (copied, linked), or arrays changed since: not this entry's
        if index["entry"] != directory.name or index["arrays"] != _arrays_digest(directory):
            return None
        images = np.load(directory / IMAGES, mmap_mode="c", allow_pickle=False)
        labels = np.load(directory / LABELS, allow_pickle=False)
        n = int(index["train_size"]) + int(index["test_size"])
        shape = (n, int(index["channels"]), int(index["size"]), int(index["size"]))
        num_classes = len(index["classes"])
    except (OSError, ValueError, KeyError, TypeError, EOFError):  # EOFError: an empty .npy
        return None
    if images.dtype != np.uint8 or images.shape != shape or labels.dtype != np.int64 or labels.shape != (n,):
        return None
    if n and (labels.min() < 0 or labels.max() >= num_classes):
        return None
    return index, images, labels


def build_cache(
    target: Path, labels: np.ndarray, item_shape: tuple[int, int, int], fill: Callable[[np.ndarray], dict]
) -> None:
    """Create ``target``: ``fill(images)`` decodes into the (N, *item_shape) uint8 array and returns the index.

    Everything is written under a temporary directory next to ``target`` and renamed into
    place; on any failure the temporary directory is removed and ``target`` is untouched.
    """
    shape = (len(labels), *item_shape)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.{writer_tag(os.getpid())}.", suffix=TMP_SUFFIX))
    except OSError as e:
        raise _cache_error(target, e, math.prod(shape)) from e
    try:
        try:
            images = _new_images(tmp / IMAGES, shape)
            index = fill(images)
            images.flush()
            del images
            _fsync(tmp / IMAGES)
            np.save(tmp / LABELS, labels.astype(np.int64), allow_pickle=False)
            _fsync(tmp / LABELS)
            sealed = _sealed({"format": CACHE_FORMAT, **index, "entry": target.name, "arrays": _arrays_digest(tmp)})
            atomic_write(tmp / INDEX, lambda p: p.write_text(json.dumps(sealed, indent=1)))
            if target.exists():
                if open_cache(target) is not None:  # another process (a second DDP rank) built it meanwhile
                    return
                _move_aside(target)  # an inconsistent cache: a directory cannot be renamed over a non-empty one
            try:
                os.replace(tmp, target)
            except OSError:
                if open_cache(target) is None:  # not another process that won the race with the same folder
                    raise
            fsync_dir(target.parent)
        except OSError as e:
            raise _cache_error(target, e, math.prod(shape)) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_aside(target: Path) -> None:
    """Move the entry `target` out of the way under a temporary name, then delete it (an OSError if it cannot move)."""
    old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old.{writer_tag(os.getpid())}.",
                                suffix=TMP_SUFFIX))
    try:
        os.replace(target, old / "x")
    except FileNotFoundError:  # another process moved it meanwhile (building the same folder): it is out of the way
        pass
    finally:  # moved, or refused (an entry of another user's): the folder made for it goes
        shutil.rmtree(old, ignore_errors=True)


def discard(target: Path) -> None:
    """Remove the entry `target`, one that does not say what its folder holds (an edited index), before it is
    built again; one AttnconvError if it cannot be."""
    try:
        _move_aside(target)
    except OSError as e:
        raise _cache_error(target, e, 0) from e


def prune(target: Path, same_source: Callable[[dict], bool]) -> None:
    """Delete the other caches next to ``target`` that ``same_source`` claims (older versions of one folder)."""
    for other in target.parent.iterdir():
        if other == target or other.name.startswith(".") or not other.is_dir():
            continue
        index = read_index(other)
        if index is not None and same_source(index):
            shutil.rmtree(other, ignore_errors=True)
