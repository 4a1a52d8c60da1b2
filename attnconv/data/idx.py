"""The IDX file format (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT"), read with a bound.

magic (0, 0, type code, ndim), ndim big-endian uint32 sizes, then the payload.

The header says how big the payload is, so a reader can check the header against
what it expects *before* reading on, and then read exactly the promised bytes: a
small .gz that unpacks to gigabytes (or a header claiming a huge array) costs at
most the expected size, never the file's.
"""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from attnconv.errors import AttnconvError
from attnconv.fileio import open_regular

# IDX type codes -> numpy big-endian dtypes.
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass(frozen=True)
class IdxHeader:
    """An IDX header: element type, dims, and its own bytes (for checksums over the whole file)."""

    dtype: np.dtype
    dims: tuple[int, ...]
    raw: bytes

    @property
    def payload_bytes(self) -> int:
        return math.prod(self.dims) * self.dtype.itemsize


def open_idx(path: Path) -> BinaryIO:
    """The file's IDX bytes as a stream: gunzipped when the name ends in .gz (gzip checks CRC32 and length). Opened
    as every reader opens (`fileio.open_regular`: a file this user may not read is said so, not called corrupt)."""
    f = open_regular(path, "replace it with the dataset's file")
    if path.suffix != ".gz":
        return f
    stream = gzip.GzipFile(fileobj=f, mode="rb")
    stream.myfileobj = f  # closed with the stream, as gzip.open closes the file it opened
    return stream


def _read_up_to(f: BinaryIO, n: int) -> bytearray:
    """Up to ``n`` bytes from ``f`` (fewer only at end of file), into one preallocated buffer."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            break
        got += k
    view.release()
    del buf[got:]
    return buf


def read_header(f: BinaryIO, path: Path) -> IdxHeader:
    """Read and parse the header only (4 + 4 * ndim bytes)."""
    magic = bytes(_read_up_to(f, 4))
    if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] not in IDX_DTYPES:
        raise AttnconvError(f"{path}: not an IDX file (bad magic number {magic.hex() or 'empty'})")
    ndim = magic[3]
    sizes = bytes(_read_up_to(f, 4 * ndim))
    if ndim == 0 or len(sizes) < 4 * ndim:
        raise AttnconvError(f"{path}: truncated IDX header ({4 + len(sizes)} bytes, {ndim} dims)")
    dims = tuple(int(d) for d in np.frombuffer(sizes, dtype=">u4"))
    return IdxHeader(np.dtype(IDX_DTYPES[magic[2]]), dims, magic + sizes)


def read_payload(f: BinaryIO, header: IdxHeader, path: Path) -> np.ndarray:
    """Read exactly the payload the header promises, then check the file ends there (reading one byte).

    Returns a writable array of ``header.dims`` (backed by a fresh buffer, no extra copy).
    """
    expected = header.payload_bytes
    payload = _read_up_to(f, expected)
    if len(payload) < expected:
        raise AttnconvError(
            f"{path}: IDX payload is {len(payload)} bytes, header {header.dims} says {expected} "
            "(truncated); the file is corrupt"
        )
    if f.read(1):
        raise AttnconvError(
            f"{path}: IDX payload is longer than the {expected} bytes header {header.dims} says "
            "(trailing bytes); the file is corrupt"
        )
    return np.frombuffer(payload, dtype=header.dtype).reshape(header.dims)
