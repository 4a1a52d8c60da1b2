"""The IDX file format (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT"), read with numpy.

magic (0, 0, type code, ndim), ndim big-endian uint32 sizes, then the payload.
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np

from attnconv.errors import AttnconvError

# IDX type codes -> numpy big-endian dtypes.
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(raw: bytes, path: Path) -> np.ndarray:
    """Parse IDX bytes: magic (0, 0, type code, ndim), ndim big-endian uint32 sizes, payload."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise AttnconvError(f"{path}: not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise AttnconvError(f"{path}: truncated IDX header ({len(raw)} bytes, {ndim} dims)")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    expected = math.prod(dims) * dtype.itemsize
    if len(raw) - header != expected:
        raise AttnconvError(
            f"{path}: IDX payload is {len(raw) - header} bytes, header {dims} says {expected} "
            f"({'truncated' if len(raw) - header < expected else 'trailing bytes'})"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def read_bytes(path: Path) -> bytes:
    """File contents, gunzipped when the name ends in .gz (gzip checks its CRC32 and length)."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise AttnconvError(f"{path}: cannot read ({type(e).__name__}: {e}); the file is corrupt") from e
