"""Decoding one image file with Pillow into a fixed-size uint8 array (folder datasets, `predict`).

The recipe is torchvision's ``Resize(S)`` + ``CenterCrop(S)`` on a PIL image: the shorter
side is resized to S (bilinear, antialiased), the longer one to ``int(S * long / short)``,
then the center S x S is cut (top-left at ``round((side - S) / 2)``). Before that the
EXIF orientation is applied (a photo is used the way viewers show it), and JPEGs are
decoded at the smallest 1/2, 1/4 or 1/8 scale that still covers S (``Image.draft``).

Memory. Decoding is refused, in one line naming the file, when what it will allocate
(``decode_bytes``: the decoded pixels as Pillow stores them, a rotated copy, the conversion
to L or RGB, the resize) exceeds the budget (``MAX_DECODE_BYTES``, or what the caller can
spare); the header alone says so, before any pixel is decoded. Resizing the whole image
and then cropping can cost far more than the image itself: a 1 x 2,000,000 strip resized
to a shorter side of 32 is 32 x 64,000,000 pixels. So when the resized image would be larger
than both the decoded one and 16 crops, only the region the crop keeps is resized (Pillow's
``resize(box=...)``: the same sample positions and filter, the result within 1 of 255 of the
full recipe); otherwise the full recipe runs, pixel for pixel torchvision's.
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from attnconv.data.png_rows import png_problem
from attnconv.errors import AttnconvError, warnings_ignored
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
    with warnings_ignored(UserWarning, Image.DecompressionBombWarning):  # the user's once-per-line registries kept
        yield


def _too_large(path: Path, e: BaseException, in_folder: bool = True) -> AttnconvError:
    return AttnconvError(f"{path}: the image is too large to decode ({e}); shrink it"
                         + (" or remove it from the folder" if in_folder else ""))


def _fail(path: Path, e: BaseException, in_folder: bool = True) -> AttnconvError:
    """The one line for an image that cannot be decoded; its fix for an image given alone (`in_folder` False: a file
    `predict` was given) leaves the folder out."""
    if type(e).__name__ == "UnidentifiedImageError":  # Pillow's text names its file object, not the file
        try:
            empty = path.stat().st_size == 0
        except OSError:
            empty = False
        what = "an empty file" if empty else "not in an image format Pillow reads"
    elif "MAX_TEXT_CHUNK" in str(e):  # Pillow's words name its own limit, not the file's fault
        what = "its text metadata is larger than Pillow reads; save the pixels again without it"
    else:
        what = " ".join(f"{type(e).__name__}: {e}".split())  # one line
    fix = "replace the file or remove it from the folder" if in_folder else "replace the file or leave it out"
    return AttnconvError(f"{path}: cannot decode the image ({what}); {fix}")


_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, zlib.error)


@contextlib.contextmanager
def _opened(path: Path, in_folder: bool = True):
    """The image at ``path``, open, with warnings silenced and every decoding failure as one AttnconvError (a missing
    file as one: a file given alone by its path, `in_folder` False, that is not there)."""
    Image, _ = _pil()
    try:
        with quiet(), open_regular(path, "give an image file") as f, Image.open(f) as img:
            _check_mode(img, path)
            yield img
    except AttnconvError:
        raise
    except Image.DecompressionBombError as e:
        raise _too_large(path, e, in_folder) from e
    except FileNotFoundError as e:
        raise AttnconvError(f"{path}: no such file; give the path of an image file") from e
    except _DECODE_ERRORS as e:
        raise _fail(path, e, in_folder) from e


def _sixteen_bit(img) -> bool:
    """16-bit grey pixels: Pillow's I;16 modes, and a PGM of more than 8 bits, which Pillow opens in mode I with
    its values scaled to 0..65535."""
    return img.mode in _SIXTEEN_BIT or (img.mode == "I" and img.format == "PPM")


def _check_mode(img, path: Path) -> None:
    if img.mode in _UNSUPPORTED and not _sixteen_bit(img):
        raise AttnconvError(
            f"{path}: {img.mode}-mode pixels (32-bit integer or float) are not supported; "
            "save it as an 8- or 16-bit PNG or TIFF"
        )


def probe_grey(path: Path) -> bool:
    """Whether the image is grey (from its header and palette; the pixels are not decoded)."""
    with _opened(path) as img:
        if img.mode == "P":
            palette = img.getpalette() or []
            return all(palette[i] == palette[i + 1] == palette[i + 2] for i in range(0, len(palette) - 2, 3))
        return img.mode in _GREY_MODES or _sixteen_bit(img)


# What decoding one image may allocate unless the caller gives a budget (`decode_image(budget=)`), and the least
# a budget made from the free memory allows (`folder.decode_budget`).
MAX_DECODE_BYTES = 1 << 30
MIN_DECODE_BYTES = 64 << 20
_CROPS_BEFORE_BOX = 16  # resize the whole image while it is at most this many crops (or the decoded size)


def _pixel_bytes(mode: str) -> int:
    """Bytes Pillow keeps per pixel in `mode` (it stores RGB, LA, CMYK... in 4)."""
    return 1 if mode in ("1", "L", "P") else 2 if mode in _SIXTEEN_BIT else 4


def _resized(w: int, h: int, size: int) -> tuple[int, int]:
    """(width, height) after torchvision's Resize(size): the shorter side to size."""
    return (size, int(size * h / w)) if w <= h else (int(size * w / h), size)


def _crop_first(w: int, h: int, size: int) -> bool:
    """Whether resizing the whole image would allocate more than decoding it did and 16 crops: then only the
    region the crop keeps is resized."""
    nw, nh = _resized(w, h, size)
    return nw * nh > max(w * h, _CROPS_BEFORE_BOX * size * size)


def decode_bytes(mode: str, width: int, height: int, grey: bool, size: int, fmt: str = "") -> int:
    """What `decode_image` allocates at its peak for a `mode` image of width x height (after `Image.draft`):
    the decoded pixels as Pillow stores them, a rotated copy (EXIF orientation: counted always, since
    reading a PNG's EXIF decodes its pixels), the 16-bit -> 8-bit arrays, the conversion to L or RGB,
    and the resize with its intermediate. `fmt` (Pillow's format): a JPEG 2000 is decoded by openjpeg into 32-bit
    samples per band first (measured: a 9400x9400 RGB file peaked at 1.6 GiB over the interpreter's), and a
    16-bit PGM is held in mode I."""
    pixels = width * height
    decoded = pixels * _pixel_bytes(mode)
    if fmt == "JPEG2000":
        decoded += pixels * 4 * len(mode)  # openjpeg's own image, 4 bytes a sample (L: 1 band, RGB: 3, RGBA: 4)
    target = 1 if grey else 4
    steps = decoded  # exif_transpose: a new image, then the old one goes
    if mode in _SIXTEEN_BIT or mode == "I":  # "I": a 16-bit PGM (other I images are refused before)
        steps = max(steps, pixels * (2 + 2 + 1 + 1))  # uint16 array, shifted, uint8, the L image
    steps = max(steps, pixels * target)  # convert(mode)
    if _crop_first(width, height, size):
        resize = 2 * size * (size + 4) * target  # the crop's rows, then the crop
    else:
        nw, nh = _resized(width, height, size)
        resize = (nw * height + nw * nh) * target  # horizontal pass, then the vertical one
    return decoded + steps + pixels * target + resize


def _format_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{n} bytes"


class DecodeBudget:
    """Bytes that decoding may hold at once, shared by the threads decoding a folder.

    Each image reserves what it will allocate (`decode_bytes`) before its pixels are decoded and
    gives it back when done; while the others hold too much it waits. An image that alone needs
    more than the whole budget is refused: one AttnconvError naming the file.
    """

    def __init__(self, total: int | None = None):
        self.total, self.held = int(MAX_DECODE_BYTES if total is None else total), 0
        self._free = threading.Condition()

    @contextlib.contextmanager
    def reserve(self, need: int, path: Path, what: str, in_folder: bool = True) -> Iterator[None]:
        if need > self.total:
            raise AttnconvError(f"{path}: decoding this {what} image needs about {_format_bytes(need)} of memory, "
                                f"over the {_format_bytes(self.total)} allowed for one image; shrink it"
                                + (", or remove it from the folder" if in_folder else ""))
        with self._free:
            self._free.wait_for(lambda: self.held + need <= self.total)
            self.held += need
        try:
            yield
        finally:
            with self._free:
                self.held -= need
                self._free.notify_all()


def decode_image(path: Path, grey: bool, size: int, *, budget: DecodeBudget | None = None,
                 in_folder: bool = True) -> np.ndarray:
    """The image at ``path`` as uint8 (C, size, size), C = 1 when ``grey`` else 3 (RGB).

    budget: the memory decoding may take (`DecodeBudget`, shared by threads; default one image of
    ``MAX_DECODE_BYTES``): an image that needs more (`decode_bytes`) is one AttnconvError naming the
    file, raised from its header, before its pixels are decoded. in_folder: whether the fix of a file that cannot be
    decoded may be to remove it from its folder (False: an image given alone, to `predict`)."""
    with _opened(path, in_folder) as img:
        w, h = img.size
        if min(w, h) == 0:
            raise _fail(path, ValueError("the image is empty (0 pixels wide or high)"), in_folder)
        if img.format == "PNG":  # rows missing, damaged data, no palette: what Pillow decodes without a word
            with open_regular(path, "give an image file") as f:
                problem = png_problem(f)
            if problem:
                raise _fail(path, ValueError(problem), in_folder)
        img.draft("L" if grey else "RGB", (size, size))  # JPEG: decode at the smallest scale still >= size
        need = decode_bytes(img.mode, *img.size, grey, size, img.format or "")
        with (budget or DecodeBudget()).reserve(need, path, f"{w}x{h} {img.mode}", in_folder):
            return _decode(img, grey, size)


def _decode(img, grey: bool, size: int) -> np.ndarray:
    """Load, orient, convert, resize and crop the opened image (see the module docstring)."""
    Image, ImageOps = _pil()
    mode = "L" if grey else "RGB"
    img.load()
    ImageOps.exif_transpose(img, in_place=True)
    if _sixteen_bit(img):  # 16-bit grey: keep the high byte (convert("L") would clip)
        img = Image.fromarray((np.asarray(img, dtype=np.uint16) >> 8).astype(np.uint8), mode="L")
    img = img.convert(mode)
    w, h = img.size
    nw, nh = _resized(w, h, size)
    top, left = round((nh - size) / 2), round((nw - size) / 2)  # as torchvision's CenterCrop
    if (nw, nh) == (w, h):
        img = img.crop((left, top, left + size, top + size))
    elif _crop_first(w, h, size):  # the crop's region of the source, resized alone
        sx, sy = w / nw, h / nh
        img = img.resize((size, size), Image.Resampling.BILINEAR,
                         box=(left * sx, top * sy, (left + size) * sx, (top + size) * sy))
    else:
        img = img.resize((nw, nh), Image.Resampling.BILINEAR).crop((left, top, left + size, top + size))
    pixels = np.asarray(img, dtype=np.uint8)  # (S, S) or (S, S, 3)
    return pixels[None] if grey else pixels.transpose(2, 0, 1)
