"""Whether a PNG's image data is what its header states.

Pillow decodes a PNG whose (complete) compressed stream ends before the last row without a word, the missing rows
black: the picture a model would see is not the file's. A file cut short is Pillow's own "image file is truncated";
this is the other case. `png_problem` reads the header and the IDAT chunks and inflates them no further than the rows
need, a megabyte at a time and kept only as a count (it runs before the decoding budget is reserved: what it holds is
set neither by the stream nor by the header); interlaced (Adam7) images count the seven passes' rows. Pillow
gives a palette image without its PLTE chunk a default palette: refused here too, as a damaged file. (A flipped bit
in the compressed pixels is Pillow's own "broken data stream": zlib's checksum.)
"""

from __future__ import annotations

import struct
import zlib
from typing import BinaryIO

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # per colour type: grey, RGB, palette, grey + alpha, RGBA
_CHUNK = 1 << 20  # inflated bytes held at once
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _data_bytes(width: int, height: int, depth: int, colour: int, interlaced: bool) -> int:
    """The bytes the inflated image data must hold: a filter byte and the packed pixels of every row (of every pass)."""
    bits = depth * _CHANNELS[colour]
    passes = _ADAM7 if interlaced else ((0, 0, 1, 1),)
    total = 0
    for x0, y0, dx, dy in passes:
        w, h = -(-(width - x0) // dx), -(-(height - y0) // dy)
        if w > 0 and h > 0:
            total += h * (1 + -(-(w * bits) // 8))
    return total


def _inflated(inflate, data: bytes, room: int) -> int:
    """The bytes `data` inflates to, `room` at most, counted a chunk at a time: memory of one chunk, whatever the
    stream or the header claims (this runs before the decoding budget is reserved)."""
    n = 0
    while data and n < room:
        n += len(inflate.decompress(data, min(_CHUNK, room - n)))
        data = inflate.unconsumed_tail
    return n


def png_problem(f: BinaryIO) -> str | None:
    """What Pillow would decode without a word in the PNG read from `f` (at its start), in words; None where there is
    nothing, or where this cannot tell (not a PNG it can parse: Pillow's own checks say the rest):
    - image data that ends before the last row its header states (Pillow fills the rest with black);
    - a palette image without its palette (Pillow uses a default one)."""
    if f.read(8) != _SIGNATURE:
        return None
    need, inflate, found, colour, palette = None, zlib.decompressobj(), 0, None, False
    while True:
        head = f.read(8)
        if len(head) < 8:
            break
        length, kind = struct.unpack(">I4s", head)
        if kind == b"IHDR" and length == 13:
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", f.read(13))
            if colour not in _CHANNELS:
                return None
            need = _data_bytes(width, height, depth, colour, interlace == 1)
            f.seek(4, 1)  # its CRC
            continue
        if kind == b"PLTE":
            palette = True
        if kind == b"IDAT" and need is not None:
            if colour == 3 and not palette:
                return "a palette image without its palette (no PLTE chunk before its image data)"
            try:
                found += _inflated(inflate, f.read(length), need - found)
            except zlib.error:
                return None  # a damaged stream: Pillow says so
            if found >= need:
                return None  # every row there: the rest of the stream is not inflated
            f.seek(4, 1)
            continue
        if kind == b"IEND":
            break
        f.seek(length + 4, 1)  # another chunk, and its CRC
    if need is None or found >= need:
        return None
    return f"its image data ends before its last row ({found} of the {need} bytes its header states)"
