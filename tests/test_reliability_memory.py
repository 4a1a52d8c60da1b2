"""Images decoded within a memory budget (docs/failure-model.md, "Memory when decoding images").

A 1 x 2,000,000 pixel PNG compresses to a few KB; resizing it whole to a shorter side of 32
before cropping would allocate 32 x 64,000,000 pixels (2 GB grey, 8 GB RGB). Decoding resizes
only the region the crop keeps, so `predict` and a folder dataset holding such a strip stay
within a few times the decoded strip; an image whose decoding alone needs more than the budget
is refused from its header, in one line naming it. Peak memory is measured in a subprocess
(its peak resident size, reset before each step), so nothing here allocates gigabytes even if it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from attnconv.cli import main
from attnconv.data import decode, load_dataset
from attnconv.errors import AttnconvError

STRIP = 2_000_000


def _strip(path: Path, mode: str, wide: bool) -> Path:
    """A 1 x 2,000,000 (or 2,000,000 x 1) PNG: 0 up to the middle pixel, 255 from the one after it."""
    values = np.zeros(STRIP, np.uint8)
    values[STRIP // 2:] = 255
    pixels = values[None, :] if wide else values[:, None]
    image = Image.fromarray(pixels, "L").convert(mode)
    image.save(path)
    assert path.stat().st_size < 64 * 1024  # a few KB on disk
    return path


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from fixtures_runs import TINY, train_tiny_runs

    return train_tiny_runs(tmp_path_factory.mktemp("memory"), [("sa-quadratic", TINY)], epochs=1, max_steps=1)


_MEASURE = r"""
import json, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from attnconv.cli import main
from attnconv.data import decode, load_dataset
from attnconv.errors import AttnconvError

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

def start():
    "Reset the peak resident size to the current one (Linux: clear_refs 5); the resident size now."
    Path("/proc/self/clear_refs").write_text("5")
    return status("VmRSS")

run, small, folder, strips = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
assert main(["predict", run, small]) == 0  # the model loaded, torch warmed up
grown = {}
for strip in strips:
    before = start()
    assert main(["predict", run, strip]) == 0
    for grey in (True, False):
        pixels = decode.decode_image(Path(strip), grey, 32)
        assert pixels.shape == ((1 if grey else 3), 32, 32)
    grown[strip] = status("VmHWM") - before
before = start()
train, test = load_dataset("folder:" + folder, image_size=32)
grown["folder"] = status("VmHWM") - before
print(json.dumps(grown))
"""


def test_memory_a_long_strip_decodes_without_resizing_it_whole(tiny_run, tmp_path):
    strips = [_strip(tmp_path / f"{mode}-{'wide' if wide else 'tall'}.png", mode, wide)
              for mode in ("L", "RGB") for wide in (True, False)]
    small = tmp_path / "small.png"
    Image.new("L", (28, 28), 128).save(small)
    folder = tmp_path / "imgs"
    for split in ("train", "test"):
        for cls in ("a", "b"):
            (folder / split / cls).mkdir(parents=True)
            Image.new("RGB", (40, 30), (10, 20, 30)).save(folder / split / cls / "plain.png")
    _strip(folder / "train" / "a" / "strip.png", "RGB", wide=True)
    _strip(folder / "test" / "b" / "strip.png", "RGB", wide=False)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(tiny_run["sa-quadratic"]), str(small), str(folder),
                           *map(str, strips)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    grown = json.loads(done.stdout.strip().splitlines()[-1])
    # the decoded strip is 2 MB grey, 8 MB RGB (Pillow keeps RGB in 4 bytes); resized whole it was 2-8 GB
    assert all(extra < 96 * 2**20 for extra in grown.values()), grown


@pytest.mark.parametrize("wide", [True, False])
def test_memory_a_strip_is_the_center_crop_of_the_resized_image(tmp_path, wide):
    """Resized to a shorter side of 32 (1 -> 32: bilinear between the two middle pixels), the center 32 pixels of
    the long side are a ramp from near 0 to near 255, the same in every row (or column)."""
    path = _strip(tmp_path / "strip.png", "L", wide)
    pixels = decode.decode_image(path, True, 32)[0].astype(int)
    line = pixels[0] if wide else pixels[:, 0]
    ramp = np.clip(np.round(255 * (np.arange(32) + 0.5) / 32), 0, 255)  # centers of 32 sub-pixels of two pixels
    assert np.abs(line - ramp).max() <= 1, line
    assert (pixels == (line[None, :] if wide else line[:, None])).all()


def _recipe(image: Image.Image, size: int) -> np.ndarray:
    """torchvision's Resize(size) + CenterCrop(size) on a PIL image, written out (the reference)."""
    w, h = image.size
    nw, nh = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    if (nw, nh) != (w, h):
        image = image.resize((nw, nh), Image.Resampling.BILINEAR)
    top, left = round((nh - size) / 2), round((nw - size) / 2)
    return np.asarray(image.crop((left, top, left + size, top + size)), dtype=np.uint8)


def test_memory_decoding_is_the_torchvision_recipe(tmp_path):
    """Random shapes and sizes: pixel for pixel the full recipe wherever resizing whole costs no more than decoding
    (and 16 crops); within 1 of 255 where only the crop's region is resized (long strips)."""
    rng = np.random.default_rng(0)
    exact = boxed = 0
    for trial in range(60):
        size = int(rng.integers(1, 24))
        w, h = (int(v) for v in rng.integers(1, 90, 2))
        if trial % 4 == 0:  # a strip: the crop's region alone is resized
            w, h = (int(rng.integers(1, 4)), int(rng.integers(40 * size, 60 * size)))[:: 1 if trial % 8 else -1]
        grey = trial % 2 == 0
        array = rng.integers(0, 256, (h, w) if grey else (h, w, 3), dtype=np.uint8)
        image = Image.fromarray(array, "L" if grey else "RGB")
        image.save(tmp_path / "x.png")
        got = decode.decode_image(tmp_path / "x.png", grey, size)
        want = _recipe(image, size)
        want = want[None] if grey else want.transpose(2, 0, 1)
        assert got.shape == want.shape == ((1 if grey else 3), size, size)
        if decode._crop_first(w, h, size):
            boxed += 1
            assert np.abs(got.astype(int) - want).max() <= 1, (w, h, size)
        else:
            exact += 1
            assert np.array_equal(got, want), (w, h, size)
    assert exact > 20 and boxed > 10


def test_memory_the_estimate_counts_what_decoding_allocates():
    # Pillow keeps RGB in 4 bytes a pixel: a 1000x1000 RGB PNG is 4 MB decoded, 4 MB rotated, 4 MB converted
    assert decode.decode_bytes("RGB", 1000, 1000, False, 32) >= 3 * 4 * 10**6
    assert decode.decode_bytes("L", 1000, 1000, True, 32) < decode.decode_bytes("RGB", 1000, 1000, False, 32)
    assert decode.decode_bytes("I;16", 1000, 1000, True, 32) > decode.decode_bytes("L", 1000, 1000, True, 32)
    # a strip: what its pixels take, not its resized whole (32 x 64,000,000)
    assert decode.decode_bytes("L", STRIP, 1, True, 32) < 16 * STRIP
    assert decode.decode_bytes("L", 1, STRIP, True, 32) < 16 * STRIP


def test_memory_an_image_over_the_budget_is_one_line_naming_it(tiny_run, tmp_path, capsys, monkeypatch):
    """Refused from the header: the pixels are never decoded (Image.load is not reached)."""
    big = tmp_path / "big.png"
    Image.new("RGB", (600, 500), (1, 2, 3)).save(big)
    monkeypatch.setattr(decode, "MAX_DECODE_BYTES", 2 * 2**20)

    def load(*args, **kwargs):
        raise AssertionError("the pixels were decoded before the budget was checked")

    monkeypatch.setattr(Image.Image, "load", load)
    with pytest.raises(AttnconvError, match="over the 2.0 MiB allowed for one image"):
        decode.decode_image(big, False, 32)
    capsys.readouterr()
    assert main(["predict", str(tiny_run["sa-quadratic"]), str(big)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: {big}: decoding this 600x500 RGB image needs about ")
    assert "shrink it" in lines[0]
    # a folder dataset holding it: the same line, nothing cached
    folder = tmp_path / "imgs"
    for split in ("train", "test"):
        (folder / split / "a").mkdir(parents=True)
    big.rename(folder / "train" / "a" / "big.png")
    monkeypatch.undo()
    monkeypatch.setattr(decode, "MAX_DECODE_BYTES", 2 * 2**20)
    Image.new("RGB", (8, 8)).save(folder / "test" / "a" / "small.png")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(AttnconvError, match=r"big\.png: decoding this 600x500 RGB image needs about"):
        load_dataset(f"folder:{folder}", image_size=8)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # nothing half-built is kept


def test_memory_threads_share_the_budget(tmp_path):
    """Each image reserves what it needs; a thread waits while the others hold the rest, and gives it back."""
    import threading

    budget = decode.DecodeBudget(100)
    order = []

    def second():
        with budget.reserve(50, tmp_path, "y"):
            order.append(("in", budget.held))

    with budget.reserve(70, tmp_path, "x"):
        waiter = threading.Thread(target=second)
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive() and order == [] and budget.held == 70  # 70 + 50 > 100: it waits
        order.append(("out", budget.held))
    waiter.join(10)
    assert order == [("out", 70), ("in", 50)] and budget.held == 0
    with pytest.raises(AttnconvError, match="allowed for one image"), budget.reserve(101, tmp_path, "z"):
        pass
    assert budget.held == 0


@pytest.mark.parametrize("content, why", [(b"", "an empty file"), (b"hello, I am text\n", "not in an image format")])
def test_memory_a_file_that_is_no_image_is_named_in_words(tmp_path, content, why):
    """Pillow's own text for a file it cannot identify names its file object (`<_io.BufferedReader name=3>`),
    not the file: the line says what the file is instead."""
    path = tmp_path / "photo.png"
    path.write_bytes(content)
    with pytest.raises(AttnconvError) as info:
        decode.decode_image(path, False, 8)
    assert str(info.value) == (f"{path}: cannot decode the image ({why}{'' if content == b'' else ' Pillow reads'}); "
                               "replace the file or remove it from the folder")


def test_memory_a_png_with_huge_text_metadata_is_named_in_words(tmp_path):
    """A PNG whose compressed text chunk unpacks past Pillow's limit: Pillow's words name its own constant
    (`PngImagePlugin.MAX_TEXT_CHUNK`); the line says that the text metadata is the fault."""
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("comment", "a" * (20 * 2**20), zip=True)
    path = tmp_path / "tagged.png"
    Image.new("RGB", (8, 8)).save(path, pnginfo=info)
    with pytest.raises(AttnconvError) as raised:
        decode.decode_image(path, False, 8)
    assert str(raised.value) == (f"{path}: cannot decode the image (its text metadata is larger than Pillow reads; "
                                 "save the pixels again without it); replace the file or remove it from the folder")


def test_memory_a_file_name_with_control_characters_stays_one_line(tiny_run, tmp_path, capsys):
    """A file name may hold a newline or a terminal escape: the error naming it is still one line, the
    characters shown as escapes (`\\n`, `\\x1b`), so they neither split the line nor act on the terminal."""
    path = tmp_path / "cut\nshort\x1b[31m.png"
    noise = np.random.default_rng(0).integers(0, 256, (12, 12, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "whole.png")
    path.write_bytes((tmp_path / "whole.png").read_bytes()[:60])  # cut inside its pixels
    capsys.readouterr()
    assert main(["predict", str(tiny_run["sa-quadratic"]), str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err, err
    assert err.startswith(f"error: {tmp_path}/cut\\nshort\\x1b[31m.png: cannot decode the image"), err


def test_memory_a_jpeg_2000_counts_openjpegs_own_samples(tmp_path):
    """A 4 KB JPEG 2000 of 9400x9400 was decoded at a peak of 1.6 GiB over the interpreter's, past the 1 GiB budget:
    openjpeg holds 32-bit samples per band before Pillow's image. They are counted, and such a file is refused."""
    from PIL import features

    assert decode.decode_bytes("RGB", 9400, 9400, False, 32, "JPEG2000") > decode.MAX_DECODE_BYTES
    assert decode.decode_bytes("RGB", 9400, 9400, False, 32, "JPEG2000") > \
        decode.decode_bytes("RGB", 9400, 9400, False, 32, "PNG") + 9400 * 9400 * 4 * 3 - 1
    if not features.check("jpg_2000"):
        pytest.skip("Pillow here decodes no JPEG 2000")
    small = tmp_path / "small.jp2"
    Image.new("RGB", (40, 40), (10, 20, 30)).save(small)
    assert decode.decode_image(small, False, 32).shape == (3, 32, 32)


def test_memory_a_16_bit_pgm_is_decoded_as_16_bit_grey(tmp_path):
    """A PGM of maxval 65535 (mode I in Pillow) was refused as `32-bit integer or float`, with the fix to save it
    as 16-bit, which it was. It is decoded as 16-bit grey: the high byte of each pixel."""
    values = (np.arange(144, dtype=np.uint32).reshape(12, 12) * 450).astype(">u2")
    path = tmp_path / "s16.pgm"
    path.write_bytes(b"P5\n12 12\n65535\n" + values.tobytes())
    got = decode.decode_image(path, True, 12)
    assert got.shape == (1, 12, 12) and np.array_equal(got[0], (values.astype(np.uint16) >> 8).astype(np.uint8))
    assert decode.probe_grey(path)


def _png(path: Path, width: int, height: int, data: bytes, interlaced: bool) -> Path:
    """An 8-bit grey PNG of `data` (filter bytes and pixels, already laid out) under a header of width x height."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, int(interlaced))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(data))
                     + chunk(b"IEND", b""))
    return path


def test_images_within_a_memory_budget_the_png_row_check_inflates_a_chunk_at_a_time(tmp_path):
    """The row check of a PNG ran before the decoding budget and inflated the stream up to the bytes its header states
    in one call: a 100 KB file of 8000 x 8000 zeros (under Pillow's bomb limit) made it hold 64 MB at once, a 16-bit
    RGBA one 512 MB, so every decoding thread of a folder could go far over the budget before a pixel was counted."""
    import struct
    import tracemalloc
    import zlib

    from attnconv.data.png_rows import png_problem

    side = 8000
    squeeze, parts = zlib.compressobj(), []
    for _ in range(side - 1):  # one row short of the header's
        parts.append(squeeze.compress(bytes(side + 1)))
    data = b"".join(parts) + squeeze.flush()
    assert len(data) < 200_000

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    path = tmp_path / "bomb.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    tracemalloc.start()
    try:
        with path.open("rb") as f:
            found = png_problem(f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found == (f"its image data ends before its last row ({(side - 1) * (side + 1)} of the {side * (side + 1)} "
                     "bytes its header states)")  # still counted right, row by row
    assert peak < 8 << 20, f"the row check held {peak / 2**20:.0f} MiB at once"
    with pytest.raises(AttnconvError, match=r"bomb\.png: cannot decode the image \(ValueError: its image data ends"):
        decode.decode_image(path, True, 28)


def test_round_79_a_a_palette_png_without_its_palette_is_refused(tmp_path):
    """Round 79: a palette PNG without its PLTE chunk was decoded with Pillow's default palette, without a word. What
    Pillow writes (palette, 16-bit, 1-bit, optimized) is taken as before."""
    import io

    rng = np.random.default_rng(0)
    for mode, options in (("P", {}), ("L", {}), ("RGB", {}), ("RGBA", {"optimize": True}),
                          ("I;16", {}), ("1", {})):
        img = Image.fromarray(rng.integers(0, 255, (40, 30, 3), dtype=np.uint8)).convert(mode)
        block = io.BytesIO()
        img.save(block, "PNG", **options)
        (tmp_path / f"{mode.replace(';', '')}.png").write_bytes(block.getvalue())
        assert decode.decode_image(tmp_path / f"{mode.replace(';', '')}.png", mode != "RGB", 16).shape[1:] == (16, 16)
    data = (tmp_path / "P.png").read_bytes()
    start = data.index(b"PLTE") - 4
    length = int.from_bytes(data[start:start + 4], "big")
    (tmp_path / "nopalette.png").write_bytes(data[:start] + data[start + 12 + length:])
    with pytest.raises(AttnconvError, match=r"nopalette\.png: cannot decode the image \(ValueError: a palette image "
                                            r"without its palette"):
        decode.decode_image(tmp_path / "nopalette.png", False, 16)


@pytest.mark.parametrize("interlaced", [False, True])
def test_round_78_b_a_png_whose_data_ends_before_its_last_row_is_refused(tmp_path, interlaced, capsys):
    """Round 78: a PNG whose complete compressed stream holds fewer rows than its header states was decoded with the
    missing rows black (Pillow says nothing), and `predict` answered for it, exit 0; a file cut short was refused."""
    width, height = 5, 7
    passes = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)) \
        if interlaced else ((0, 0, 1, 1),)
    rows = [b"\x00" + bytes(range(10, 10 + -(-(width - x0) // dx))) for x0, y0, dx, dy in passes
            for _ in range(max(-(-(height - y0) // dy), 0)) if width > x0]
    whole = _png(tmp_path / "whole.png", width, height, b"".join(rows), interlaced)
    assert Image.open(whole).info.get("interlace", 0) == int(interlaced)
    assert decode.decode_image(whole, True, 4).shape == (1, 4, 4)  # every row there: taken, by Pillow too
    short = _png(tmp_path / "short.png", width, height, b"".join(rows[:-2]), interlaced)
    with pytest.raises(AttnconvError, match=r"short\.png: cannot decode the image \(ValueError: its image data ends "
                                            r"before its last row \(\d+ of the \d+ bytes its header states\)\)"):
        decode.decode_image(short, True, 4)
