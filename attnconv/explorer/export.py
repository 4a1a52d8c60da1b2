"""The explorer as one self-contained HTML file: `attnconv explore RUN --export FILE.html`.

    from attnconv.explorer import write_export
    write_export("runs/sa", "sa-explorer.html", images=32)

The page is the live explorer's own (`static/index.html`, `app.js`, `style.css`, inlined) with
the answers of its API embedded, so it needs no server, no Python and no network: open it
from disk, attach it to a paper, put it on a website. It offers what the live page offers for
the exported images (`--images N`, the same test images as `attnconv explore --images N`,
sampled across the classes): pick an image and a query pixel, see every layer's and head's
attention probabilities (the layer's attention, the combined term), and the heads recorded
during training (heads.jsonl). The live page's scores and its content and position terms
alone are left out.

What is stored, computed in-process by `Explorer` (the same code that answers /api/attention):

    info, images, heads   /api/info, /api/image/K (pixels as base64 uint8), /api/heads
    maps                  one map set for a position-only model (its attention does not depend on
                          the image), else one per image; a map set is every query's attention,
                          per layer and head, as uint8 fractions of each query row's maximum
                          (`fractions`, (layers, heads, T, T)) and those maxima in float32
                          (`maxima`, (layers, heads, T)), both base64: a value is read back to
                          within 1/510 of its row's maximum, the maximum itself exactly

The page carries a Content-Security-Policy that allows its own inline script and style and
data: images, nothing else: no request can leave it. Its maps are on one grid, every layer's;
a network whose layers have grids of their own (converted from a CNN) is not exported: explore
it live.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import torch

import attnconv
from attnconv.errors import AttnconvError, ParameterError
from attnconv.explorer.server import Explorer
from attnconv.fileio import SIGNATURE, atomic_write, check_output_file
from attnconv.limits import format_bytes, path_argument

__all__ = ["EXPORT_LIMIT", "FORMAT", "build_export", "export_data", "write_export"]

FORMAT = "attnconv-explorer-export"
EXPORT_LIMIT = 100 * 2**20  # bytes of embedded maps a page may hold: browsers open larger files slowly


def export_data(explorer: Explorer) -> dict[str, Any]:
    """The data the exported page reads: the API's answers for every offered image and every query.

    Raises AttnconvError for layers on grids of their own (a network converted from a CNN: the page's
    format holds one grid), and for maps larger than `EXPORT_LIMIT` (a content model with many images
    or a large grid), before computing them."""
    if explorer.own_grids:
        raise AttnconvError(f"{explorer.run_dir}: its layers attend over grids of their own, which --export does "
                            "not write (its page holds one grid); explore it live (attnconv explore RUN)")
    H, W = explorer.grid
    T, layers, heads, n = H * W, len(explorer.layers), explorer.layers[0].heads, len(explorer.raw)
    per_image = not explorer.position_only
    sets = n if per_image else 1
    size = sets * layers * heads * T * (T + 4) * 4 / 3  # uint8 fractions and float32 maxima, as base64
    if size > EXPORT_LIMIT:
        raise ParameterError("images", n, f": the page would hold {format_bytes(size)} of attention maps "
                             f"({sets} map sets of {layers} layers x {heads} heads x {T}x{T} queries and keys), "
                             f"more than the {format_bytes(EXPORT_LIMIT)} limit; give fewer {{images}}",
                             mentions=("images",))
    info = explorer.info()
    images = []
    for k in range(n):
        image = explorer.image(k)
        image["pixels"] = _b64(explorer.raw[k].permute(1, 2, 0).contiguous().numpy().tobytes())  # H x W x C
        images.append(image)
    maps = [_quantize(torch.stack(explorer.attention_maps(k))) for k in range(sets)]  # (layers, heads, T, T)
    same = "the same for every image: the model's attention depends on positions alone" if not per_image \
        else "per image"
    info.update(
        modes=["probs"], terms=["combined"], exported=True,
        note=f"Exported by attnconv explore --export: each layer's attention probabilities for these {n} images "
             f"({same}), each value to within 0.2% of its map's maximum. The live explorer (attnconv explore "
             "RUN) also shows the scores and the content and position terms alone.",
    )
    return {
        "format": FORMAT,
        "version": 1,
        "generator": f"{SIGNATURE} {attnconv.__version__}",
        "info": info,
        "images": images,
        "heads": explorer.heads(),
        "maps": {"per_image": per_image, "shape": [layers, heads, T, T], "sets": maps},
    }


def build_export(explorer: Explorer) -> str:
    """The exported page of `explorer`'s run as HTML text: the live page with its script, style and data inlined."""
    data = export_data(explorer)
    static = resources.files("attnconv.explorer").joinpath("static")
    page, script, style = (static.joinpath(name).read_text(encoding="utf-8")
                           for name in ("index.html", "app.js", "style.css"))
    for name, text, closing in (("app.js", script, "</script"), ("style.css", style, "</style")):
        if closing in text.lower() or "<!--" in text:
            raise AssertionError(f"explorer/static/{name} cannot be inlined: it contains {closing!r} or '<!--'")
    # JSON with every '<' escaped: nothing inside the data can end its <script> element
    blob = json.dumps(data, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")
    policy = ("default-src 'none'; "
              f"script-src '{_sha256(script)}'; style-src '{_sha256(style)}'; img-src data:; "
              "base-uri 'none'; form-action 'none'")
    info = data["info"]
    footer = (f'<footer class="sub">Exported by <code>attnconv explore --export</code> (attnconv '
              f"{html.escape(attnconv.__version__)}) from the run {html.escape(info['run'])}: the attention was "
              "computed from the checkpoint when the page was written (each layer's <code>attention_scores</code> "
              "on its input, as the live explorer does) and is stored in the page; nothing is fetched. "
              "Coordinates are (row, column) on the token grid, rows down.</footer>")
    page = _replace(page, '<meta charset="utf-8">',
                    '<meta charset="utf-8">\n'
                    f'<meta name="generator" content="{SIGNATURE} {html.escape(attnconv.__version__)}">\n'
                    f'<meta http-equiv="Content-Security-Policy" content="{policy}">')
    page = _replace(page, "<title>attnconv explorer</title>",
                    f"<title>attnconv explorer: {html.escape(info['title'])}</title>")
    page = _replace(page, '<link rel="stylesheet" href="/static/style.css">', f"<style>{style}</style>")
    page = _replace(page, '<script src="/static/app.js"></script>',
                    f'<script type="application/json" id="attnconv-data">{blob}</script>\n<script>{script}</script>')
    return _replace(page, re.compile(r'<footer class="sub">.*?</footer>', re.S), footer)


def write_export(
    run_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    images: int = 32,
    data_dir: str | os.PathLike | None = None,
    dataset: str | None = None,
    device: str = "cpu",
    overwrite: bool = False,
) -> Path:
    """Write the exported explorer of `run_dir` for `images` test images to `out` atomically; return its path.

    `out` is checked before the model is loaded: an .html name, its folder writable, and not an
    existing file that attnconv did not write (unless `overwrite`)."""
    if path_argument(run_dir, "run_dir", "the run's directory").is_dir():  # else Explorer names the missing run
        out = check_output_file(out, "out", (".html", ".htm"), overwrite=overwrite, flag="export")
    text = build_export(Explorer(run_dir, images=images, data_dir=data_dir, dataset=dataset, device=device))
    atomic_write(out, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return Path(out)


# ---------------------------------------------------------------------------------- helpers


def _quantize(probs: torch.Tensor) -> dict[str, str]:
    """Probabilities (..., T keys) as uint8 fractions of each row's maximum and the maxima in float32 (NaN for a
    row with no finite values), base64."""
    probs = probs.float()
    finite = torch.isfinite(probs).all(-1)
    maxima = torch.where(finite, probs.amax(-1), torch.tensor(math.nan))
    scale = torch.where(finite & (maxima > 0), maxima, torch.tensor(1.0))
    fractions = torch.where(finite[..., None], probs / scale[..., None] * 255, torch.tensor(0.0))
    fractions = fractions.round().clamp(0, 255).to(torch.uint8)
    return {"fractions": _b64(fractions.contiguous().numpy().tobytes()),
            "maxima": _b64(maxima.contiguous().numpy().astype("<f4").tobytes())}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


def _replace(page: str, old: str | re.Pattern, new: str) -> str:
    """`page` with its one `old` replaced by `new` (AssertionError when index.html no longer has exactly one)."""
    found = len(old.findall(page)) if isinstance(old, re.Pattern) else page.count(old)
    if found != 1:
        raise AssertionError(f"explorer/static/index.html has {found} of {old!r}, expected 1")
    return old.sub(lambda _: new, page) if isinstance(old, re.Pattern) else page.replace(old, new)
