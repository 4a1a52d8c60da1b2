"""Writing files safely: atomic replacement, uniquely named temporaries, one writer per directory.

The bottom layer of the package (it imports only `attnconv.errors`): run directories,
figures, reports and benchmark outputs are all written through it.

    atomic_write(path, lambda tmp: tmp.write_text(text))   # old file or new file, never half of one
    atomic_write_all([(result, ...), (figure, ...)])         # the old pair or the new pair

Temporaries are created by `tempfile` in the target's directory with the name
`.<target name>.<random>.attnconv-tmp`, so they are unique per writer, and a cleanup
(`remove_temporaries`) touches only files of exactly that form, never a user's own
hidden files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import signal
import stat
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from attnconv.errors import DamagedFile, ParameterError
from attnconv.limits import flag_argument, path_argument

# What a path is, in words (`attnconv.pathwords`): also this module's names, which its users import here.
from attnconv.pathwords import (  # noqa: F401
    Unreadable,
    dangling_link,
    file_kind,
    marked,
    modes_overridden,
    not_a_file,
    not_a_folder,
    permission_fix,
    permission_words,
    refused_by_place,
    unreadable_folder,
)

TMP_SUFFIX = ".attnconv-tmp"
LOCK_FILE = ".attnconv.lock"  # the lock file of earlier versions (the lock is now on the directory)


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory, so that a rename inside it is durable (where this user may open it: a folder that can be
    written but not read keeps the file written, its rename unsynced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except PermissionError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Write `path` atomically: `write(tmp)` into a temporary file next to it, fsync, rename.

    A crash at any point leaves either the old file or the new one, never a mix; a
    failure (disk full, a bad figure) leaves the old file as it was and no temporary.
    """
    atomic_write_all([(path, write)])


def atomic_write_all(files: Sequence[tuple[str | os.PathLike, Callable[[Path], None]]]) -> None:
    """Write several files that belong together (a result and its figure) as `atomic_write` does one: every
    temporary is written and synced first, and only then are they renamed into place, one after the other, with
    Ctrl-C held back until the last rename (it is delivered then). A failure while writing (a full disk) leaves
    every old file as it was and no temporary; a new set never stands beside part of an old one."""
    temps: list[tuple[Path, Path]] = []
    made: list[Path] = []  # the parent folders made here, deepest last: removed again unless the writes land
    for target, _ in files:  # a temporary that could neither be renamed there nor removed again: none is made
        refused = unplaceable(target)
        if refused:
            raise Unplaceable(errno.EPERM, refused, str(target))
    try:
        for target, write in files:
            path = Path(target)
            made += make_parents(path)
            with interrupts_held():  # a temporary made is a temporary known: removed whatever happens next
                fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
                tmp = Path(name)
                temps.append((path, tmp))
                os.close(fd)
            try:
                write(tmp)
                # mkstemp makes the file 0600: give it the mode of the file it replaces, else what the umask allows
                # (a link is replaced itself, so the mode of the file it leads to is not the one replaced).
                replaced = os.lstat(path).st_mode if os.path.lexists(path) else 0
                os.chmod(tmp, stat.S_IMODE(replaced) if stat.S_ISREG(replaced) else 0o666 & ~current_umask())
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as err:
                if err.filename is None and err.errno is not None:  # a failed write() names no file: name ours
                    raise OSError(err.errno, err.strerror, str(path)) from err
                raise
        with interrupts_held(len(temps) > 1):
            for path, tmp in temps:
                try:
                    os.replace(tmp, path)
                except OSError as err:  # named by the file it was to replace (a folder there), not our temporary
                    raise OSError(err.errno, err.strerror, str(path)) from err
        made.clear()  # they hold what was written (or the path passes through them: a/../b keeps a, as mkdir -p)
    finally:
        for _, tmp in temps:
            with contextlib.suppress(OSError):  # the error that stopped the writes is the one to say, not this
                tmp.unlink(missing_ok=True)
        remove_empty(made)
    for parent in {path.parent for path, _ in temps}:
        fsync_dir(parent)


def make_parents(path: Path) -> list[Path]:
    """Make the missing parent folders of `path`; the ones made, outermost first (for `remove_empty`). A folder
    that exists by the time it is made (`a/..` once `a` is made, or made by another process meanwhile) is not
    this call's."""
    missing = [p for p in reversed(path.parents) if not p.exists()]
    made: list[Path] = []
    try:
        for folder in missing:
            with interrupts_held():
                try:
                    folder.mkdir()
                except FileExistsError:
                    if folder.is_dir():
                        continue
                    raise
                made.append(folder)
    except BaseException:
        remove_empty(made)
        raise
    return made


def remove_empty(folders: Sequence[Path]) -> None:
    """Remove the folders `make_parents` made that are empty, innermost first."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            pass


@contextlib.contextmanager
def interrupts_held(hold: bool = True) -> Iterator[None]:
    """While the block runs, a SIGINT (Ctrl-C) is only noted; it is delivered, to the handler in place before,
    when the block ends. Only where Python can set handlers (the main thread) and when `hold`."""
    if not hold or threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    noted: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if noted:
            signal.raise_signal(signal.SIGINT)


def same_path(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether `a` and `b` name one file or folder: the same path, or links to one (when one does not exist yet:
    the same path once the links of its folders are resolved)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def open_regular(path: str | os.PathLike, fix: str) -> BinaryIO:
    """`path` opened for reading (binary), refused unless it is a regular file (links followed).

    Every file a command reads goes through here: a named pipe would block the command forever
    and a device would be read without end, so either is one DamagedFile naming the path, what
    it is, and `fix`. The kind is checked before opening and again on the opened descriptor
    (opened without blocking), so a file swapped in between cannot block either. Other failures
    (missing, unreadable) are the OSError of `open`, for the caller to word.
    """
    path = Path(path)
    fd = -1  # set in the same try as the checks after it: a Ctrl-C just as os.open returns still closes it
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise DamagedFile(f"{path} is {file_kind(mode)}, not a regular file", fix)
        with interrupts_held():  # a Ctrl-C as os.open returns is raised only once fd is held here, to be closed
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DamagedFile(f"{path} is {file_kind(mode)}, not a regular file", fix)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException as err:
        if fd >= 0:
            os.close(fd)
        if isinstance(err, PermissionError):  # a sound file this user may not read: the fix is the permission
            raise Unreadable(f"{path}: {permission_words(path)}; {permission_fix(path)}") from None
        raise
    # From here the file object owns fd: a Ctrl-C inside fdopen must not close it here too, or the object would close
    # the number again when collected, by then another file's ("Bad file descriptor" on a sound file, later).
    return os.fdopen(fd, "rb")


def read_regular(path: str | os.PathLike, fix: str) -> bytes:
    """The bytes of the regular file `path` (`open_regular`'s checks)."""
    with open_regular(path, fix) as f:
        return f.read()


def current_umask() -> int:
    """The process's umask: from /proc on Linux (no change to process state), else by setting it back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def append_synced(path: str | os.PathLike, text: str) -> None:
    """Append `text` to the log `path` and fsync it (a crash loses at most a line cut short, which the readers
    skip). A failed write (a full disk) is an OSError naming `path`: Python's own, raised by a write or a flush to
    an open file, names none."""
    try:
        with open(path, "a", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        if err.filename is None:
            err.filename = os.fspath(path)
        raise


def write_bytes(data: bytes) -> Callable[[Path], None]:
    """A writer for `atomic_write` that writes `data`."""
    return lambda tmp: tmp.write_bytes(data)


def is_temporary(name: str, targets: tuple[str, ...]) -> bool:
    """Whether `name` is an `atomic_write` temporary of one of the file names `targets`."""
    return name.endswith(TMP_SUFFIX) and any(name.startswith(f".{t}.") for t in targets)


def remove_temporaries(directory: str | os.PathLike, names: tuple[str, ...]) -> None:
    """Delete the temporaries `atomic_write` left for these file names (a killed writer's)."""
    directory = Path(directory)
    for name in names:
        for leftover in directory.glob(f".{name}.*{TMP_SUFFIX}"):
            leftover.unlink(missing_ok=True)


def check_writable_file(path: str | os.PathLike, name: str, suffixes: tuple[str, ...] = (), *,
                        flag: str | None = None) -> Path:
    """Check, before any long work, that the file `path` can be written; raise one clear error if not.

    Nothing is made: a missing parent folder must be creatable (its nearest existing ancestor a writable
    folder); `atomic_write_all` makes it when the file is written, and removes it again if the write fails.
    `suffixes`: the allowed file name endings. Errors are ParameterErrors naming the parameter `name` (the
    CLI's flag: `flag`, default the name with dashes).
    """
    path = path_argument(path, name, "a file path")

    def bad(rest: str) -> ParameterError:
        return ParameterError(name, path, rest, flags={name: flag} if flag else None)

    if suffixes and path.suffix.lower() not in suffixes:
        raise bad(f": give a file name ending in {', '.join(suffixes)}")
    if path.is_dir():
        raise bad("is a directory; give a file name inside it")
    parent = path.parent
    blocking = next((p for p in (parent, *parent.parents) if p.exists() or p.is_symlink()), None)
    if blocking is not None and not blocking.is_dir():
        what = dangling_link(blocking) or "a file"
        raise bad(f": {blocking} is {what}, not a folder; choose another location")
    if blocking is None:
        raise bad(f": cannot create {parent} (no folder on its path exists); choose another location")
    if blocking != parent and not os.access(blocking, os.W_OK | os.X_OK):
        raise bad(f": cannot create {parent} ({blocking} is not writable; {output_fix(blocking)})")
    if not os.access(blocking, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise bad(f": not writable; {output_fix(path if path.exists() else blocking)}")
    refused = unplaceable(path)
    if refused:
        raise bad(f": {refused}")
    return path


def output_fix(path: str | os.PathLike) -> str:
    """The fix for an output that cannot be written at `path`: what refuses it to everyone (a read-only file system,
    an immutable or append-only flag: `pathwords.refused_by_place`), else the mode bits for a process they refuse,
    and another location in every case."""
    refusing = refused_by_place(path)
    if refusing:
        return refusing if refusing.endswith("location") else f"{refusing}, or choose another location"
    return "choose another location" if modes_overridden() else \
        "give this user the permission (chmod), or choose another location"


def unplaceable(path: str | os.PathLike) -> str:
    """Why a file written whole cannot be put at `path` (a temporary renamed over it), in words with the fix: the
    folder it goes into (or the nearest one above that exists), or the file there, marked append-only or immutable
    (`lsattr`), which refuses the rename and the temporary's removal alike, to root too; '' where nothing is known
    to refuse it."""
    path = Path(path)
    here = path if path.exists() else next((p for p in path.parents if p.exists()), None)
    for place in (here, path.parent) if here == path else (here,):
        words = marked(place) if place is not None else ""
        if words:
            return f"{words}: a file written there cannot be put in place; choose another location"
    return ""


class Unplaceable(PermissionError):
    """A write refused before it began: `unplaceable`'s words (what refuses it and the fix) are its strerror."""


# The files `train` writes into a run directory (`attnconv.runs.RUN_FILES`): no output of another
# command may replace them.
RUN_FILE_NAMES = ("config.json", "metrics.csv", "model.safetensors", "state.pt", "heads.jsonl", "steps.csv")
# What attnconv writes into the files it makes, so that it can tell its own files from a user's.
SIGNATURE = "attnconv"
# The record `attnconv export` puts into its .pt2 and .ts archives (an extra file: {"generator": "attnconv ..."}).
EXPORT_MARK = "attnconv.json"


def written_by_attnconv(path: str | os.PathLike) -> bool:
    """Whether the existing file `path` is one attnconv wrote (a report, figure or benchmark output).

    Each kind carries attnconv's mark where attnconv puts it, and only there counts (a user's file
    that merely mentions attnconv, or quotes an attnconv command, is not ours): reports and exported
    pages begin with the doctype, `<html lang="en"><head><meta charset="utf-8">` and then
    `<meta name="generator" content="attnconv ...">`; PNG figures a "Software" text chunk, SVG and
    PDF figures a "Creator" entry, each `attnconv (matplotlib VERSION)`; `bench --markdown` output
    begins with its heading "## `attnconv bench"; `bench --json` output is a JSON object of exactly
    the report's fields whose "command" is an `attnconv bench` command line; other JSON (learn-conv)
    an object whose first key is "generator", "attnconv"; exports (`attnconv export`) an `EXPORT_MARK`
    record in their archive (.pt2, .ts) or an ONNX doc_string starting "attnconv ". Anything else (a
    user's notes, a run's weights) is not ours.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".pt2", ".ts"):
        return _archive_marked(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(1 << 16)
            f.seek(max(0, size - (1 << 16)))
            tail = f.read()
            whole = head if size <= len(head) else None  # JSON is parsed whole: only small files
    except OSError:
        return False
    figure = SIGNATURE.encode() + b" (matplotlib "
    if suffix == ".onnx":
        return _onnx_doc_string(head).startswith(SIGNATURE.encode() + b" ")
    if suffix in (".html", ".htm"):
        return _PAGE_HEAD.match(head) is not None
    if suffix == ".png":
        return _png_software(head).startswith(figure)
    if suffix == ".svg":
        return _SVG_HEAD.match(head) is not None
    if suffix == ".pdf":
        return head.startswith(b"%PDF") and _PDF_INFO.search(tail) is not None
    if suffix == ".md":  # one bench report: its heading first, and no heading of a level above its sections'
        return head.startswith(b"## `" + SIGNATURE.encode() + b" bench") and whole is not None and \
            re.search(rb"^#{1,2} ", whole.partition(b"\n")[2], re.M) is None
    if suffix == ".json":
        return whole is not None and _json_marked(whole)
    return False


# The start of every HTML page attnconv writes (`attnconv report`, `explore --export`).
_PAGE_HEAD = re.compile(rb'<!DOCTYPE html>\s*<html lang="en">\s*<head>\s*<meta charset="utf-8">\s*'
                        rb'<meta name="generator" content="' + SIGNATURE.encode() + rb'[ "]')

# The start of an SVG figure attnconv writes (matplotlib's prologue, then its metadata naming attnconv as the creator;
# no comment on the way).
_SVG_HEAD = re.compile(rb'<\?xml[^>]*>\s*<!DOCTYPE svg[^>]*>\s*<svg [^>]*>\s*<metadata>\s*<rdf:RDF[^>]*>\s*<cc:Work>'
                       rb'(?:(?!</cc:Work>|<!--).)*?<dc:creator>\s*<cc:Agent>\s*<dc:title>' + SIGNATURE.encode()
                       + rb' \(matplotlib ', re.S)

# The document information of a PDF figure attnconv writes (an object of its own, as matplotlib writes it).
_PDF_INFO = re.compile(rb"\n\d+ 0 obj\n<< /Creator \(" + SIGNATURE.encode() + rb" \\\(matplotlib [^()\\]*\\\)\)\n"
                       rb"/Producer \(Matplotlib pdf backend ")


def _png_software(head: bytes) -> bytes:
    """The text of a PNG's "Software" tEXt chunk, read chunk by chunk (b"" if none before the image data)."""
    if not head.startswith(b"\x89PNG\r\n\x1a\n"):
        return b""
    at = 8
    while at + 8 <= len(head):
        size, kind = int.from_bytes(head[at:at + 4], "big"), head[at + 4:at + 8]
        data = head[at + 8:at + 8 + size]
        if kind == b"tEXt" and data.startswith(b"Software\x00"):
            return data[len(b"Software\x00"):]
        if kind in (b"IDAT", b"IEND"):
            return b""
        at += 12 + size  # length, type, data, CRC
    return b""


# The fields of `attnconv bench --json` output (`bench.results.Report`).
_BENCH_FIELDS = {"command", "machine", "date", "config", "sections"}


def _json_marked(data: bytes) -> bool:
    """Whether JSON text is `attnconv bench --json` output or another of attnconv's JSON files (`written_by_attnconv`)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return False
    if not isinstance(value, dict) or not value:
        return False
    if set(value) == _BENCH_FIELDS:
        return isinstance(value["command"], str) and value["command"].startswith(SIGNATURE + " bench")
    return next(iter(value)) == "generator" and value["generator"] == SIGNATURE


def _archive_marked(path: Path) -> bool:
    """Whether the zip archive `path` (a torch.export or TorchScript file) holds attnconv's export record."""
    try:
        with open(path, "rb") as f, zipfile.ZipFile(f) as archive:
            # where torch.export.save and torch.jit.save put extra files: TOP/extra/NAME, TOP the archive's folder
            tops = {n.split("/", 1)[0] for n in archive.namelist()}
            names = [n for n in archive.namelist() if len(tops) == 1 and n == f"{next(iter(tops))}/extra/{EXPORT_MARK}"]
            if not names or archive.getinfo(names[0]).file_size > 1 << 16:
                return False
            record = json.loads(archive.read(names[0]))
    except (OSError, zipfile.BadZipFile, ValueError, KeyError):
        return False
    return isinstance(record, dict) and str(record.get("generator", "")).startswith(SIGNATURE + " ")


def _onnx_doc_string(head: bytes) -> bytes:
    """The doc_string of an ONNX ModelProto from the file's first bytes, or b"" (not ONNX, or none).

    The top-level fields are read in the order protobuf writes them (by number): ir_version (1),
    producer name and version, domain, model version, doc_string (6), then the graph (7), where we stop."""
    pos, first = 0, True
    while pos < len(head):
        tag, pos = _varint(head, pos)
        field, wire = tag >> 3, tag & 7
        if tag < 0 or field >= 7 or (first and (field, wire) != (1, 0)):  # ONNX starts with its ir_version
            return b""
        first = False
        if wire == 0:
            _, pos = _varint(head, pos)
        elif wire == 2:
            size, pos = _varint(head, pos)
            if field == 6:
                return head[pos : pos + size]
            pos += size
        else:
            return b""
    return b""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A protobuf varint at `pos`: (value, the position after it); (-1, len) when cut short."""
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
    return -1, len(data)


def check_output_file(path: str | os.PathLike, name: str, suffixes: tuple[str, ...], *,
                      overwrite: bool = False, flag: str | None = None) -> Path:
    """`check_writable_file`, and never clobber what is not ours: checked before any long work.

    A run's own files (`RUN_FILE_NAMES` next to a config.json) are refused always; an existing
    file that attnconv did not write (`written_by_attnconv`), or that is a link or not a regular
    file, only with `overwrite` (the command's --overwrite). Errors name the parameter `name`.
    """
    overwrite = flag_argument(overwrite, "overwrite")
    path = check_writable_file(path, name, suffixes, flag=flag)

    def bad(rest: str) -> ParameterError:
        return ParameterError(name, path, rest, mentions=("overwrite",), flags={name: flag} if flag else None)

    if path.name in RUN_FILE_NAMES and (path.parent / RUN_FILE_NAMES[0]).is_file():
        raise bad(f"is a file of the attnconv run in {path.parent}; write somewhere else")
    if (path.exists() or path.is_symlink()) and not overwrite:
        if path.is_symlink():
            target = dangling_link(path) or f"a link to {os.readlink(path)}"
            raise bad(f"is {target}; choose another name (or pass {{overwrite}} to replace the link itself: "
                      "nothing is written through it)")
        if not path.is_file():
            raise bad(f"exists and is {file_kind(path.stat().st_mode)}, not a regular file; choose another name "
                      "(or pass {overwrite} to replace it)")
        if not written_by_attnconv(path):
            raise bad("exists and attnconv did not write it; choose another name, or pass {overwrite} to replace it")
    return path


class DirectoryLock:
    """An advisory lock (`fcntl.flock`) on the directory itself: one writer per directory.

    A second process that tries to take it fails at once with one clear error. The lock
    belongs to the directory's inode, not to a file in it, so deleting or replacing files in
    the directory cannot let a second writer in, and no lock file is ever created (nothing
    to follow through a symlink). The kernel drops the lock when its process dies, so a run
    killed with SIGKILL leaves no stale lock. A `.attnconv.lock` file that earlier versions
    left behind is deleted when the lock is taken (a regular file only; never through a link).

        with DirectoryLock(run_dir, "out"):
            ...  # only this process writes into run_dir
    """

    def __init__(self, directory: str | os.PathLike, name: str = "out"):
        self.directory, self.name = Path(directory), name
        self._fd: int | None = None

    def acquire(self) -> DirectoryLock:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ParameterError(
                    self.name, self.directory, ": another attnconv process is writing there; wait for it "
                    "to finish (or stop it) and try again, or choose another directory") from None
            raise
        self._fd = fd
        legacy = self.directory / LOCK_FILE
        try:
            if stat.S_ISREG(os.lstat(legacy).st_mode):
                legacy.unlink()
        except FileNotFoundError:
            pass
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def describe_os_error(err: OSError) -> str:
    """A short reason for an OSError, with the fix for a full disk."""
    if err.errno == errno.ENOSPC:
        return "no space left on the device; free some space"
    if isinstance(err, Unplaceable):
        return err.strerror
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "not writable; choose another location"
    return err.strerror or str(err)
