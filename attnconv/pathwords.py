"""What a path is, in words, for the errors that name it: a link to nowhere or into a loop, a file where a folder
is expected, a device, a folder or file this user may not read. A path that is there is never called missing.

    not_a_folder("runs/sa")      # None for a folder; "it is a file", "a link to /dev/null, which is a character
                                 # device", "no such directory", ...
    permission_words(path)       # "permission denied: the folder F cannot be entered", ...

The bottom layer with `attnconv.errors` (it imports nothing else of attnconv); `attnconv.fileio` reads and
writes through it and re-exports its names.
"""

from __future__ import annotations

import errno
import os
import shlex
import stat
from pathlib import Path

from attnconv.errors import AttnconvError


def dangling_link(path: str | os.PathLike) -> str | None:
    """A link that leads nowhere, in words, or None for anything else: "a link to X, which does not exist", or
    "... which loops back through links (too many levels of symbolic links)" for a loop (a link to itself)."""
    path = Path(path)
    if not path.is_symlink():
        return None
    try:
        os.stat(path)
        return None
    except OSError as err:
        why = "loops back through links (too many levels of symbolic links)" if err.errno == errno.ELOOP \
            else "does not exist"
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return f"a link to {target}, which {why}"


def expanded(path: str | os.PathLike) -> Path:
    """`path` with `~` expanded as the shell reads it (`Path.expanduser` raises RuntimeError for `~nouser`; this leaves
    a user that does not exist as written, a path that then names nothing)."""
    return Path(os.path.expanduser(os.fspath(path)))


def not_a_folder(path: str | os.PathLike, missing: str = "no such directory") -> str | None:
    """Why `path` is not a folder, in words, or None for a folder (or a link to one): `missing` when nothing is
    there, the link's words when it leads nowhere (`dangling_link`), else what is there ("it is a file", "a link
    to /dev/null, which is a character device"): a path that exists is never called missing. A path below a folder
    that cannot be entered is an AttnconvError (`unreadable_folder`)."""
    if "\0" in os.fspath(path):  # every OS call would say "embedded null byte"
        return "a path holds no NUL character"
    mode, words = _what_is(Path(path), missing)
    return None if mode is not None and stat.S_ISDIR(mode) else words


def unreadable_folder(path: str | os.PathLike) -> str:
    """The words for a folder that cannot be entered or listed (permissions), naming it or the folder above it that
    stops the way, with the fix."""
    path = Path(path)
    blocking = next((p for p in (*reversed(path.parents), path) if p.exists() and not os.access(p, os.R_OK | os.X_OK)),
                    path)
    where = "" if blocking == path else f" (the folder {blocking} above it cannot be entered)"
    return (f"{path}: cannot be read: permission denied{where}; give a folder this user can read (chmod u+rx, or run "
            "as its owner)")


def not_a_file(path: str | os.PathLike, missing: str = "no such file") -> str | None:
    """`not_a_folder` for a regular file: None for one (or a link to one), else why not, in words."""
    mode, words = _what_is(Path(path), missing)
    return None if mode is not None and stat.S_ISREG(mode) else words


def _what_is(path: Path, missing: str) -> tuple[int | None, str]:
    """(st_mode, or None when nothing can be read there; what is there, in words)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None, dangling_link(path) or missing
    except PermissionError:  # a folder on the way cannot be entered: said so, not called missing or "not a folder"
        raise AttnconvError(unreadable_folder(path)) from None
    except OSError as err:
        return None, dangling_link(path) or f"cannot be read ({err.strerror})"
    what = "a file" if stat.S_ISREG(mode) else file_kind(mode)
    return mode, f"a link to {os.readlink(path)}, which is {what}" if path.is_symlink() else f"it is {what}"


def file_kind(mode: int) -> str:
    """What a file of this `st_mode` is, in words ("a named pipe (FIFO)", "a directory", ...)."""
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")]
    return next((text for test, text in kinds if test(mode)), "not a regular file")


class Unreadable(AttnconvError):
    """A file or folder this user has no permission to read: sound, so its fix is the permission, never "restore it"
    or "train again" (`open_regular`, `permission_words`)."""


def permission_words(path: str | os.PathLike) -> str:
    """Why this user may not read (or write) `path`, naming what blocks: a folder on the way that cannot be entered,
    the file itself that cannot be read, or its folder that cannot be written."""
    path = Path(path)
    try:
        for folder in reversed(path.parents):
            if folder.exists() and not os.access(folder, os.X_OK):
                return f"permission denied: the folder {folder} cannot be entered"
        if os.path.lexists(path) and not os.access(path, os.R_OK):
            return "permission denied: it cannot be read"
        if not os.path.lexists(path) and path.parent.exists() and not os.access(path.parent, os.W_OK):
            return f"permission denied: the folder {path.parent} is not writable"
    except OSError:
        pass
    return "permission denied"


def permission_fix(path: str | os.PathLike | None = None) -> str:
    """The fix for a permission refused at `path` (or at a place not named), the one that works for whoever runs the
    command: a read-only file system, where `path`'s is one; the immutable or append-only flag of `path` or its
    folder, where one is set (no mode bit lifts it, for root either); for root who may override the mode bits, those
    flags or a read-only file system in words; else the mode bits (chmod) or the owner (a user, or root without
    CAP_DAC_OVERRIDE, as in a container started with its capabilities dropped)."""
    refusing = refused_by_place(path)
    if refusing:
        return refusing
    if modes_overridden():
        return ("root is refused only by a file or folder marked immutable (lsattr shows an i; chattr -i lifts it) "
                "or append-only (an a; chattr -a), or a read-only file system")
    return "give this user the permission (chmod), or run as the files' owner"


def refused_by_place(path: str | os.PathLike | None) -> str:
    """What refuses writing at `path` to every user, root too, in words with its fix: a read-only file system, or the
    immutable or append-only flag of `path` (or the nearest folder above it that exists) or of its folder; ''
    where neither is known."""
    if path is None:
        return ""
    here = _existing(path)
    try:
        read_only = bool(os.statvfs(here).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows), or nothing of the path exists
        read_only = False
    if read_only:
        return "it is on a read-only file system; choose another location"
    for place in dict.fromkeys((here, os.path.dirname(here) or ".")):
        flag = marked(place)
        if flag:
            return flag
    return ""


_FS_IOC_GETFLAGS = 0x80086601  # Linux's ioctl for a file's attributes (lsattr); FS_IMMUTABLE_FL, FS_APPEND_FL:
_FLAGS = ((0x10, "immutable", "i"), (0x20, "append-only", "a"))


def marked(path: str | os.PathLike) -> str:
    """`PATH is marked immutable (lsattr shows an i; chattr -i lifts it)` (or append-only, an a) where the file or
    folder `path` has that attribute, which refuses replacing or removing what is there to every user, root too;
    '' where it has neither, or where this system cannot tell (not Linux, a file system without attributes, a path
    this user cannot open)."""
    try:
        import fcntl
        import struct

        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            return ""  # a device or a FIFO is not opened to ask (opening some has effects), nor a link followed
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except (OSError, ImportError):
        return ""
    try:
        flags = struct.unpack("l", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 8))[0]
    except OSError:
        return ""
    finally:
        os.close(fd)
    for bit, name, letter in _FLAGS:
        if flags & bit:
            return f"{path} is marked {name} (lsattr{' -d' * stat.S_ISDIR(mode)} shows an {letter}; chattr -{letter} " \
                   "lifts it)"
    return ""


_STATUS = "/proc/self/status"  # Linux's: its CapEff line holds the effective capabilities


def modes_overridden() -> bool:
    """Whether this process passes every mode bit: root with CAP_DAC_OVERRIDE among its effective capabilities (a
    container may start root without it; where /proc cannot tell, root is taken to have it)."""
    if getattr(os, "geteuid", lambda: -1)() != 0:
        return False
    try:
        with open(_STATUS) as status:
            caps = next((line.split()[1] for line in status if line.startswith("CapEff:")), None)
    except OSError:
        return True
    return caps is None or bool(int(caps, 16) & (1 << 1))  # CAP_DAC_OVERRIDE is capability 1


def _existing(path: str | os.PathLike) -> str:
    """`path` as given, or the nearest folder above it that exists (what a file not yet written would be on)."""
    here = os.fspath(path)
    while not os.path.lexists(here):
        up = os.path.dirname(here.rstrip(os.sep) or os.sep) or "."
        if up == here:
            break
        here = up
    return here


def shell_path(path: str | os.PathLike) -> str:
    """`path` as one shell word that bash reads back as the same path: `shlex.quote` where every character is
    printable, else bash's $'...' with escapes (a newline, a terminal escape, a byte that is not UTF-8: what
    `os.fsencode` makes of it); a relative path that begins with a dash as ./-name, so no command reads it as an
    option."""
    text = os.fspath(path)
    if text.startswith("-"):
        text = "./" + text
    if text.isprintable():  # a lone surrogate (a byte that is not UTF-8) is not printable
        return shlex.quote(text)
    words = {"\\": "\\\\", "'": "\\'"}
    parts = [words.get(c) or (c if c.isprintable() else "".join(f"\\x{b:02x}" for b in os.fsencode(c))) for c in text]
    return "$'" + "".join(parts) + "'"


def resume_command(out: str | os.PathLike, extra: str = "") -> str:
    """The command that continues the run in `out` (`extra`: its further flags), the folder as one shell word
    (`shell_path`: spaces, quotes, a leading dash; a message shows a control character escaped, as every message
    does, so such a folder's command is to be typed, not pasted)."""
    return f"attnconv train --out {shell_path(out)} --resume{extra}"
