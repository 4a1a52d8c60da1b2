"""Decoding one image file with Pillow into a fixed-size uint8 array (folder datasets).

The recipe is torchvision's ``Resize(S)`` + ``CenterCrop(S)`` on a PIL image: the shorter
side is resized to S (bilinear, antialiased), the longer one to ``int(S * long / short)``,
then the center S x S is cut (top-left at ``round((side - S) / 2)``). Before that the
EXIF orientation is applied (a photo is used the way viewers show it), and JPEGs are
decoded at the smallest 1/2, 1/4 or 1/8 scale that still covers S (``Image.draft``).
"""

from __future__ import annotations

import contextlib
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from attnconv.errors import AttnconvError
from attnconv.fileio import open_regular

# What torchvision's ImageFolder accepts, plus GIF (first frame).
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".pgm", ".png", ".ppm", ".tif", ".tiff", ".webp")
# Modes whose pixels are grey by construction (a palette image is grey when every palette entry is).
_GREY_MODES = {"1", "L", "LA", "La", "I;16", "I;16B", "I;16L", "I;16N"}
_SIXTEEN_BIT = {"I;16", "I;16B", "I;16L", "I;16N"}
_UNSUPPORTED = {"I", "F"}  # 32-bit integer / float pixels: no one right way to map them to 8 bits


def _pil():  # imported on first use: only folder datasets need Pillow
    from PIL import Image, ImageOps

    return Image, ImageOps


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Pillow's warnings silenced (DecompressionBombWarning, palette notes): the user sees our one error line or none.

    Filters are process-wide, so a pool of decoding threads is wrapped once, around the pool.
    """
    Image, _ = _pil()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


def _too_large(path: Path, e: BaseException) -> AttnconvError:
    return AttnconvError(f"{path}: the image is too large to decode ({e}); shrink it or remove it from the folder")


def _fail(path: Path, e: BaseException) -> AttnconvError:
    what = " ".join(f"{type(e).__name__}: {e}".split())  # one line
    return AttnconvError(f"{path}: cannot decode the image ({what}); replace the file or remove it from the folder")


_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, zlib.error)


@contextlib.contextmanager
def _opened(path: Path):
    """The image at ``path``, open, with warnings silenced and every decoding failure as one AttnconvError."""
    Image, _ = _pil()
    try:
        with quiet(), open_regular(path, "give an image file") as f, Image.open(f) as img:
            _check_mode(img, path)
            yield img
    except AttnconvError:
        raise
    except Image.DecompressionBombError as e:
        raise _too_large(path, e) from e
    except _DECODE_ERRORS as e:
        raise _fail(path, e) from e


def _check_mode(img, path: Path) -> None:
    if img.mode in _UNSUPPORTED:
        raise AttnconvError(
            f"{path}: {img.mode}-mode pixels (32-bit integer or float) are not supported; "
            "save it as an 8- or 16-bit image"
        )


def probe_grey(path: Path) -> bool:
    """Whether the image is grey (from its header and palette; the pixels are not decoded)."""
    with _opened(path) as img:
        if img.mode == "P":
            palette = img.getpalette() or []
            return all(palette[i] == palette[i + 1] == palette[i + 2] for i in range(0, len(palette) - 2, 3))
        return img.mode in _GREY_MODES


def decode_image(path: Path, grey: bool, size: int) -> np.ndarray:
    """The image at ``path`` as uint8 (C, size, size), C = 1 when ``grey`` else 3 (RGB)."""
    Image, ImageOps = _pil()
    mode = "L" if grey else "RGB"
    with _opened(path) as img:
        img.draft(mode, (size, size))  # JPEG: decode at the smallest scale that is still >= size
        img.load()
        ImageOps.exif_transpose(img, in_place=True)
        if img.mode in _SIXTEEN_BIT:  # 16-bit grey: keep the high byte (convert("L") would clip)
            img = Image.fromarray((np.asarray(img, dtype=np.uint16) >> 8).astype(np.uint8), mode="L")
        img = img.convert(mode)
        w, h = img.size
        short = min(w, h)
        if short == 0:
            raise ValueError("the image is empty (0 pixels wide or high)")
        nw, nh = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
        if (nw, nh) != (w, h):
            img = img.resize((nw, nh), Image.Resampling.BILINEAR)
        top, left = round((nh - size) / 2), round((nw - size) / 2)  # as torchvision's CenterCrop
        img = img.crop((left, top, left + size, top + size))
        pixels = np.asarray(img, dtype=np.uint8)  # (S, S) or (S, S, 3)
    return pixels[None] if grey else pixels.transpose(2, 0, 1)
