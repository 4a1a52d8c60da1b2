"""The paper's figures as matplotlib Figures: head centers with their Gaussian contours, attention maps.

Pure drawing: these functions take numbers (head geometry, probabilities) and return a Figure;
`save_figure` writes one atomically. See the `attnconv.plots` package docstring for the conventions.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from attnconv.errors import AttnconvError, ParameterError
from attnconv.limits import (
    path_argument,
    positive_ints,
    probabilities_argument,
    real_number,
    shown_value,
    whole_number,
)
from attnconv.tables import significant

MASSES = (0.5, 0.9)  # contour masses: solid, dotted
STYLES = {0.5: "-", 0.9: ":"}
FORMATS = (".png", ".svg", ".pdf")


# ----------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------


def check_out(path: str | os.PathLike, name: str = "out", *, overwrite: bool = False) -> Path:
    """The figure's path, checked before any work: a .png/.svg/.pdf name whose folder can be written,
    and not a file attnconv did not write unless `overwrite` (`fileio.check_output_file`). Errors
    name the parameter `name` (the CLI: its flag)."""
    from attnconv.fileio import check_output_file

    path = path_argument(path, name, "a file path")
    if path.suffix.lower() not in FORMATS:
        raise ParameterError(name, path, f": give a file name ending in {', '.join(FORMATS)}")
    if path.exists() and path.is_dir():
        raise ParameterError(name, path, f"is a directory; give a file name such as {path / 'figure.png'}")
    return check_output_file(path, name, FORMATS, overwrite=overwrite)


def save_figure(fig, path: str | os.PathLike, dpi: int = 150, *, name: str = "out", overwrite: bool = False
                ) -> Path:
    """Write a matplotlib Figure to `path` (.png, .svg or .pdf) atomically (parent folders made as needed).

    The file carries attnconv's name (PNG "Software", SVG/PDF "Creator"), so a later command
    knows it may replace it (`fileio.written_by_attnconv`). A bad `path` is a ParameterError naming `name`.
    """
    from attnconv.fileio import atomic_write

    dpi = check_dpi(dpi)
    path = check_out(path, name, overwrite=overwrite)
    atomic_write(path, figure_writer(fig, path.suffix[1:].lower(), dpi))
    return path


def figure_writer(fig, fmt: str, dpi: int = 150) -> Callable[[Path], None]:
    """A writer for `fileio.atomic_write` (and `atomic_write_all`) that saves `fig` as `fmt` (png, svg, pdf) with
    attnconv's name in it (PNG "Software", SVG/PDF "Creator": `fileio.written_by_attnconv`)."""
    import matplotlib

    from attnconv.fileio import SIGNATURE

    dpi = check_dpi(dpi)
    name = f"{SIGNATURE} (matplotlib {matplotlib.__version__})"
    metadata = {"Software": name} if fmt == "png" else {"Creator": name}
    return lambda tmp: fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight", metadata=metadata)


def check_dpi(dpi: Any) -> int:
    """A figure's resolution as a Python int; ParameterError naming `dpi` unless a whole number from 1 to 2400."""
    return whole_number(dpi, "dpi", "the figure's dots per inch", most=2400)


def head_colors(n: int) -> list:
    from matplotlib import colormaps

    n = whole_number(n, "n", "a number of heads", least=0)
    cmap = colormaps["tab10" if n <= 10 else "tab20" if n <= 20 else "hsv"]
    return [cmap(i % cmap.N) if n <= 20 else cmap(i / n) for i in range(n)]


def figure_png(fig, dpi: int = 110) -> bytes:
    """A matplotlib Figure as PNG bytes (no file is written; no metadata naming a web address)."""
    import io

    dpi = check_dpi(dpi)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()



# ----------------------------------------------------------------------------------------
# Centers (Figures 4, 12, 14)
# ----------------------------------------------------------------------------------------


def mass_level(p: np.ndarray, mass: float) -> float:
    """The level L such that the pixels with p > L are the fewest, most probable ones holding `mass`.

    Halfway between the last value needed and the next smaller distinct value, so a
    contour at L separates the two sets cleanly (ties are kept together).
    """
    mass = real_number(mass, "mass", "the share of probability inside the contour", low=0, high=1)
    v = np.sort(np.asarray(p, dtype=float).ravel())[::-1]
    if v.size == 0:
        raise AttnconvError("mass_level needs a map with at least one value, got an empty one")
    total = v.sum()
    if total <= 0:
        return 0.0
    k = int(np.searchsorted(np.cumsum(v), mass * total))
    k = min(k, len(v) - 1)
    below = v[v < v[k]]
    return float((v[k] + (below[0] if len(below) else 0.0)) / 2)


def gaussian_ellipse(inverse_covariance: np.ndarray | Sequence[Sequence[float]], mass: float | None = None
                     ) -> tuple[float, float, float]:
    """Semi-major axis, semi-minor axis and angle (degrees) of a quadratic head's Gaussian ellipse.

    A quadratic head (`positional.QuadraticEncoding`) scores a shift delta = key - query as

        A(delta) = -1/2 (delta - Delta)^T Sigma^-1 (delta - Delta),  Sigma^-1 = `inverse_covariance`

    (isotropic: Sigma^-1 = a^2 I = 2 alpha I; full covariance: Sigma^-1 = A A^T), so its
    attention, softmax(A), is the Gaussian N(Delta, Sigma) with covariance Sigma =
    (Sigma^-1)^-1 restricted to the grid. With Sigma^-1 = V diag(l_1, l_2) V^T (l_1 <= l_2),
    the ellipse {d : d^T Sigma^-1 d = r^2} has semi-axes r / sqrt(l_1) >= r / sqrt(l_2) along
    the eigenvectors v_1, v_2 (r / sqrt(l_i) = r sigma_i, sigma_i^2 the eigenvalues of Sigma).
    r = 1 (`mass` None) is the one-sigma ellipse; r^2 = -2 ln(1 - mass) the ellipse holding
    `mass` of the (continuous) Gaussian, d^T Sigma^-1 d being chi^2 with 2 degrees of freedom.

    Coordinates are (row, col) shifts. The angle is that of the major axis v_1 in the plot's
    (x = col, y = row) frame, from +col towards +row, in (-90, 90]: matplotlib's
    `Ellipse((col, row), 2 * major, 2 * minor, angle=angle)` on axes whose rows point down.
    A circle has angle 0. Eigenvalues below 1e-12 are raised to it (a degenerate head is a
    very long ellipse, not an error).
    """
    try:
        s = np.asarray(inverse_covariance, dtype=float)
    except (TypeError, ValueError):  # strings, ragged rows
        s = None
    if s is None or s.shape != (2, 2):
        raise AttnconvError(f"inverse_covariance must be a 2x2 array of numbers, got "
                            f"{shown_value(inverse_covariance) if s is None else f'shape {s.shape}'}")
    if not np.isfinite(s).all():
        raise AttnconvError(f"inverse_covariance must be finite, got {s.tolist()}")
    if mass is not None:
        mass = real_number(mass, "mass", "the share of the Gaussian inside the ellipse (None: one sigma)", low=0,
                           high=1, high_open=True)
    r = 1.0 if mass is None else math.sqrt(-2.0 * math.log(1.0 - mass))
    evals, evecs = np.linalg.eigh((s + s.T) / 2)  # ascending: the major axis first
    evals = np.maximum(evals, 1e-12)
    major, minor = r / math.sqrt(evals[0]), r / math.sqrt(evals[1])
    if math.isclose(major, minor, rel_tol=1e-12):
        return major, minor, 0.0
    v_row, v_col = evecs[:, 0]
    angle = math.degrees(math.atan2(v_row, v_col))
    angle = angle - 180.0 if angle > 90.0 else angle + 180.0 if angle <= -90.0 else angle
    return major, minor, angle


def ellipse_points(center: np.ndarray, s: np.ndarray, mass: float) -> np.ndarray:
    """Points (n, 2) as (row, col) of {d: (d - c)^T S (d - c) = -2 ln(1 - mass)} (`gaussian_ellipse`)."""
    major, minor, angle = gaussian_ellipse(s, mass)
    t = np.linspace(0, 2 * math.pi, 121)
    u, w = major * np.cos(t), minor * np.sin(t)  # along the major and minor axes
    c, n = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    return center + np.stack([u * n + w * c, u * c - w * n], axis=-1)  # (row, col)


def window_radius(layers: list[dict[str, Any]], grid: int) -> int:
    """Half-width R of the shift window [-R, R]: enough for every center and 90% contour, at most grid."""
    need = 2.0
    for g in layers:
        c = np.asarray(g["centers"], dtype=float)
        need = max(need, float(np.abs(c).max()) + 0.5 if c.size else 0.0)
        if g.get("inverse_covariance") is not None:
            s = np.asarray(g["inverse_covariance"], dtype=float)
            for h in range(len(c)):
                semi = gaussian_ellipse(s[h], max(MASSES))[0]
                need = max(need, float(np.abs(c[h]).max()) + semi)
        elif g.get("map") is not None:
            m = np.asarray(g["map"], dtype=float)
            q = g["query"]
            for h in range(len(m)):
                rows, cols = np.nonzero(m[h] > mass_level(m[h], max(MASSES)))
                if len(rows):
                    need = max(need, float(np.abs(rows - q[0]).max()), float(np.abs(cols - q[1]).max()))
    return int(min(math.ceil(need), grid))


def _draw_centers(ax, g: dict[str, Any], colors: list, R: int, title: str) -> None:
    from matplotlib.patches import Rectangle

    lim = R + 0.5
    c = np.asarray(g["centers"], dtype=float)  # (heads, 2): (row, col)
    s = g.get("inverse_covariance")
    for h in range(len(c)):
        color = colors[h]
        if s is not None:
            for mass in MASSES:
                pts = ellipse_points(c[h], np.asarray(s[h], dtype=float), mass)
                ax.plot(pts[:, 1], pts[:, 0], STYLES[mass], color=color, lw=1.3)
        elif g.get("map") is not None:
            m = np.asarray(g["map"][h], dtype=float)  # (H, W) over keys
            q = g["query"]
            padded = np.pad(m, 1)  # zeros around, so every contour closes inside the grid
            rows = np.arange(-1, m.shape[0] + 1) - q[0]
            cols = np.arange(-1, m.shape[1] + 1) - q[1]
            for mass in MASSES:
                level = mass_level(m, mass)
                if padded.max() > level > padded.min():
                    ax.contour(cols, rows, padded, levels=[level], colors=[color],
                               linestyles=[STYLES[mass]], linewidths=1.3)
        inside = bool(np.all(np.abs(c[h]) <= lim))
        y, x = np.clip(c[h], -lim, lim)
        ax.plot(x, y, "o", ms=5, color=color, mfc=color if inside else "none", mew=1.5, zorder=3)
    ax.add_patch(Rectangle((-0.5, -0.5), 1, 1, color="black", zorder=4))
    ax.set_xlim(-lim, lim)
    ax.set_ylim(lim, -lim)  # rows point down, as in an image
    ax.set_aspect("equal")
    step = 1 if R <= 6 else 2 if R <= 12 else 4
    ticks = np.arange(-(R // step) * step, R + 1, step)
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.set_xticks(np.arange(-R, R + 2) - 0.5, minor=True)
    ax.set_yticks(np.arange(-R, R + 2) - 0.5, minor=True)
    ax.grid(which="minor", color="0.88", lw=0.6)
    ax.tick_params(which="minor", length=0, labelsize=7)
    ax.tick_params(which="major", labelsize=7)
    ax.set_title(title, fontsize=9)


def snapshot_geometry(heads: list[dict[str, Any]]) -> dict[str, Any]:
    """One layer of a heads.jsonl snapshot as `centers_figure` draws it: centers, inverse_covariance or None.

    Isotropic quadratic heads (alpha) become Sigma^-1 = 2 alpha I; learned and content heads
    have no Gaussian, so only their centers are drawn.
    """
    centers = np.array([h["center"] for h in heads], dtype=float).reshape(-1, 2)
    if all("inverse_covariance" in h for h in heads):
        s = np.array([h["inverse_covariance"] for h in heads], dtype=float)
    elif all("alpha" in h for h in heads):
        s = np.array([2 * h["alpha"] * np.eye(2) for h in heads], dtype=float)
    else:
        s = None
    return {"centers": centers, "inverse_covariance": s}


def spread_epochs(available: Sequence[int], count: int = 5) -> list[int]:
    """Up to `count` of the recorded epochs, denser early (where heads move most): 0, 1, 2, 5, 12 of 0..12."""
    count = whole_number(count, "count", "how many epochs to show")
    available = list(available)
    available = sorted(set(positive_ints(available, None, "available", "the recorded epochs", least=0, most=math.inf)
                           if available else ()))
    if len(available) <= count:
        return available
    last = len(available) - 1
    picks = {0} | {int(round(v)) for v in np.geomspace(1, last, count - 1)}  # at most count, last included
    return [available[i] for i in sorted(picks)]


def centers_figure(layers: list[dict[str, Any]], grid: int, title: str = "", panel_titles: Sequence[str] | None = None,
                   ncols: int | None = None):
    """One panel per layer of `analysis.head_geometry` dicts (centers, inverse_covariance or map, query).

    panel_titles: one per panel (default "layer 1", "layer 2", ...); Figure 4 over training
    passes one layer's geometry at several epochs with "epoch E" titles. ncols: panels per
    row (default: up to 4, chosen from the count).
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    grid = whole_number(grid, "grid", "the side of the layer's input grid")
    if ncols is not None:
        ncols = whole_number(ncols, "ncols", "the panels per row (None: chosen from the count)")
    n = len(layers)
    if n == 0:
        raise AttnconvError("no attention layers to draw")
    heads = max(len(g["centers"]) for g in layers)  # layers may differ (a converted ViT: patch layer, blocks)
    ncols = ncols or (n if n <= 4 else math.ceil(n / 2) if n <= 8 else 4)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(2.6 * ncols + 1.4, 2.6 * nrows + 0.5))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    R = window_radius(layers, grid)
    colors = head_colors(heads)
    for i, g in enumerate(layers):
        _draw_centers(axes.flat[i], g, colors, R, panel_titles[i] if panel_titles else f"layer {i + 1}")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=colors[h], marker="o", ls="", label=f"head {h + 1}") for h in range(heads)]
    handles += [
        Line2D([], [], color="0.3", ls="-", label="50% of mass"),
        Line2D([], [], color="0.3", ls=":", label="90% of mass"),
        Line2D([], [], color="black", marker="s", ls="", label="query pixel"),
    ]
    return _finish(fig, handles, "column shift (tokens)", "row shift (tokens, down)", title)


def distance_figure(snapshots: list[dict[str, Any]], title: str = ""):
    """Each layer's mean attention distance per head over training (ViT's Figure 7, against epochs).

    snapshots: heads.jsonl records (epoch, layers of heads with attention_distance). One panel
    per layer, one line per head (colors as in the centers figure), the layer's mean in black.
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    if not snapshots or not snapshots[0]["layers"]:
        raise AttnconvError("no recorded heads to draw")
    epochs = [s["epoch"] for s in snapshots]
    heads = max(len(layer) for s in snapshots for layer in s["layers"])  # layers may have other head counts
    d = np.full((len(snapshots), len(snapshots[0]["layers"]), heads), np.nan)  # (snapshots, layers, heads)
    for t, s in enumerate(snapshots):
        for i, layer in enumerate(s["layers"]):
            d[t, i, :len(layer)] = [h["attention_distance"] for h in layer]
    n = d.shape[1]
    ncols = n if n <= 4 else math.ceil(n / 2) if n <= 8 else 4
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(2.8 * ncols + 1.4, 2.4 * nrows + 0.6))
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    colors = head_colors(heads)
    top = 1.05 * float(np.nanmax(d)) if np.isfinite(d).any() and np.nanmax(d) > 0 else 1.0
    for i in range(n):
        ax = axes.flat[i]
        for h in range(heads):
            if np.isnan(d[:, i, h]).all():  # a layer with fewer heads than the widest
                continue
            ax.plot(epochs, d[:, i, h], "-", color=colors[h], lw=1.1, marker="." if len(epochs) < 30 else None)
        ax.plot(epochs, np.nanmean(d[:, i], -1), "-", color="black", lw=2)
        ax.set_title(f"layer {i + 1}", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(color="0.9", lw=0.6)
        ax.set_ylim(0, top)  # shared: a bottom alone would freeze the top at the first panel's data
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=colors[h], label=f"head {h + 1}") for h in range(heads)]
    handles.append(Line2D([], [], color="black", lw=2, label="layer mean"))
    return _finish(fig, handles, "epoch", "mean attention distance (tokens)", title)


def _finish(fig, handles: list, xlabel: str, ylabel: str, title: str):
    """A panel figure's legend on the right, its shared axis labels and title, laid out."""
    fig.legend(handles=handles, loc="center right", fontsize=7, frameon=False)
    fig.supxlabel(xlabel, fontsize=8)
    fig.supylabel(ylabel, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 1.2 / fig.get_figwidth(), 1))
    return fig


def conv_heads_figure(attn, size: tuple[int, ...]):
    """A ConvAttention's heads, one panel each laid out like the kernel: its attention around the middle query."""
    from matplotlib.figure import Figure

    out = attn.output_size(size)
    mid = (out[0] // 2) * out[1] + out[1] // 2  # flat index of the middle output pixel
    probs = attn.attention_probs(size=size)[0, :, mid].reshape(attn.heads, *size).float().cpu()  # (heads, H, W)
    qi, qj = attn.query_positions(size)[mid].tolist()
    reach = int(attn.centers.abs().max()) + 2  # show the window the heads can reach, plus a margin
    rows = slice(max(qi - reach, 0), min(qi + reach + 1, size[0]))
    cols = slice(max(qj - reach, 0), min(qj + reach + 1, size[1]))
    k_rows, k_cols = attn.kernel_size
    fig = Figure(figsize=(1.6 * k_cols + 0.8, 1.6 * k_rows + 0.6))
    axes = fig.subplots(k_rows, k_cols, squeeze=False)
    centers = attn.centers.tolist()
    for h, ax in enumerate(axes.flat):
        ax.imshow(
            probs[h, rows, cols].numpy(),
            vmin=0.0,
            vmax=1.0,
            cmap="viridis",
            extent=(cols.start - 0.5, cols.stop - 0.5, rows.stop - 0.5, rows.start - 0.5),
        )
        ax.plot([qj], [qi], marker="s", markersize=4, markerfacecolor="none", markeredgecolor="red")
        ax.set_title(f"head {h + 1}: {tuple(centers[h])}", fontsize=7)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"attention of each head at query {(qi, qj)} (red), alpha={attn.alpha:g}", fontsize=8)
    return fig



# ----------------------------------------------------------------------------------------
# Attention maps (Figures 5, 6)
# ----------------------------------------------------------------------------------------


def crop_map(probs: Tensor, size: tuple[int, int], query: tuple[int, int], zoom: int) -> np.ndarray:
    """probs (heads, T, T) -> the query's rows as (heads, zoom, zoom), NaN outside the grid."""
    H, W = size
    return window_around(probs[:, query[0] * W + query[1]].double().cpu().reshape(-1, H, W).numpy(), query, zoom)


NEUTRAL = "#a6a6a6"  # a map with nothing to show (no attention, or one value everywhere): one flat grey
NEGLIGIBLE = 1e-6  # a probability map whose largest value is at most this holds no attention (leakage only)


def flat_map_label(values: np.ndarray | Sequence[float], kind: str = "probability") -> str | None:
    """What to write under an attention map that has nothing to show, or None when it has something.

    A probability map with no mass on the grid (a converted CNN's head whose tap falls off a 1x1
    or 2x2 grid: its attention is on the padding, up to leakage of ~1e-10) is "no attention: all
    zero" (or "all < 1e-6" when `NEGLIGIBLE` leakage is left); one value everywhere (to a
    relative 1e-6) is "uniform: V each" for probabilities ("one key: V" on a 1x1 grid),
    "constant: V" for scores. Such maps
    are drawn in one neutral grey (`NEUTRAL`), not in the colour map's extremes, which would read
    as strong attention. Non-finite entries (outside the grid) are left out; a map without a
    finite entry is "no values". The explorer's page applies the same rules.
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return "no values"
    lo, hi = float(v.min()), float(v.max())
    if kind == "probability" and hi <= NEGLIGIBLE:
        return "no attention: all zero" if hi == 0 else "no attention: all < 1e-6"
    if hi - lo > 1e-6 * max(abs(hi), abs(lo)):
        return None
    if v.size == 1:  # a 1x1 grid: its one key
        return f"one key: {significant(hi)}"
    return f"uniform: {significant(hi)} each" if kind == "probability" else f"constant: {significant(hi)}"


def window_around(maps: np.ndarray, query: Sequence[int], zoom: int) -> np.ndarray:
    """maps (heads, H, W) -> the zoom x zoom window centered on `query`, NaN outside the grid."""
    H, W = maps.shape[1:]
    lo = -(zoom // 2)
    out = np.full((maps.shape[0], zoom, zoom), np.nan)
    for a in range(zoom):
        r = query[0] + lo + a
        if not 0 <= r < H:
            continue
        for b in range(zoom):
            c = query[1] + lo + b
            if 0 <= c < W:
                out[:, a, b] = maps[:, r, c]
    return out


def maps_figure(
    probs: list[Tensor],
    size: tuple[int, int],
    query: tuple[int, int],
    zoom: int,
    *,
    image: np.ndarray | None = None,
    downsample: int = 1,
    title: str = "",
    windows: list[np.ndarray] | None = None,
    row_labels: list[str] | None = None,
    full: list[np.ndarray] | None = None,
):
    """A layers x heads grid of the attention of `query` over a zoom x zoom window around it.

    probs: per layer (heads, T, T); or give `windows`, per layer the (heads, zoom, zoom)
    maps already cut around each layer's query (probs is then ignored). image: optional (H_img, W_img) or (H_img, W_img, 3) array
    drawn on the left with the query token's cell (and the window) outlined; a token covers
    `downsample` x `downsample` image pixels. Each map is scaled to its own maximum and
    captioned with it (3 significant digits). A map with nothing to show (all zero, or one
    value everywhere, `flat_map_label`: judged on the query's whole map, `full` per layer
    (heads, H, W) when given, else on the window) is drawn in neutral grey and captioned so.
    """
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    size = positive_ints(size, 2, "size", "the token grid (H, W)")
    query = positive_ints(query, 2, "query", "the query token's (row, col) on the grid", least=0)
    zoom, downsample = whole_number(zoom, "zoom", "the window's side"), whole_number(downsample, "downsample",
                                                                                      "image pixels per token side")
    if any(q >= n for q, n in zip(query, size)):
        raise ParameterError("query", query, f"is not a token of the {size[0]}x{size[1]} grid")
    if windows is None:
        tokens = size[0] * size[1]
        if not isinstance(probs, (list, tuple)) or not probs:
            raise ParameterError("probs", probs, f"is invalid: give a list of (heads, T, T) tensors, one per layer, T "
                                 f"= {tokens} tokens (size {size[0]}x{size[1]})", shown=shown_value(probs))
        for number, p in enumerate(probs):
            if isinstance(p, Tensor):  # its kind first: a nested tensor has no shape to compare
                probabilities_argument(p, f"probs[{number}]", "a layer's probabilities (heads, T, T)")
            if not isinstance(p, Tensor) or p.dim() != 3 or p.shape[1:] != (tokens, tokens):
                raise ParameterError("probs", p, f"is invalid: give per layer a (heads, T, T) tensor, T = {tokens} "
                                     f"tokens (size {size[0]}x{size[1]}), got layer {number + 1}'s "
                                     f"{shown_value(p)}", shown="")
        probs = [p.detach() for p in probs]  # computed with gradients: drawn as the values they hold
        windows = [crop_map(p, size, query, zoom) for p in probs]
        full = [p[:, query[0] * size[1] + query[1]].double().cpu().reshape(-1, *size).numpy() for p in probs]
    n_layers, heads = len(windows), max(w.shape[0] for w in windows)  # layers' head counts may differ
    cell = 1.05
    side = 2.6 if image is not None else 0.0
    gap = 0.32  # between rows, in axes heights: a caption of two lines fits under every map
    height = cell * (1 + gap) * n_layers + 1.0
    fig = Figure(figsize=(cell * heads + side + 0.5, height))
    margins = dict(top=1 - 0.95 / height, bottom=0.35 / height)  # room for the two-line title and last captions
    if image is not None:
        outer = fig.add_gridspec(1, 2, width_ratios=[side, cell * heads], wspace=0.12, **margins)
        gs = outer[0, 1].subgridspec(n_layers, heads, wspace=0.08, hspace=gap)
    else:
        gs = fig.add_gridspec(n_layers, heads, wspace=0.08, hspace=gap, **margins)
    cmap = colormaps["viridis"].with_extremes(bad="0.85")  # outside the grid: grey
    neutral = ListedColormap([NEUTRAL]).with_extremes(bad="0.85")
    lo = -(zoom // 2)
    for layer in range(n_layers):
        window = windows[layer]
        for h in range(heads):
            if h >= window.shape[0]:  # this layer has fewer heads than the widest: its cell stays empty
                continue
            ax = fig.add_subplot(gs[layer, h])
            m = window[h]
            flat = flat_map_label(m if full is None else full[layer][h])
            if flat is not None:  # nothing to show: one grey, not the colour map's extremes
                ax.imshow(np.ma.masked_invalid(np.where(np.isfinite(m), 0.0, np.nan)), cmap=neutral, vmin=0, vmax=1,
                          interpolation="nearest")
                caption = flat.replace(": ", ":\n", 1)
            else:
                top = float(np.nanmax(m)) if np.isfinite(m).any() else 0.0
                ax.imshow(np.ma.masked_invalid(m), cmap=cmap, vmin=0, vmax=top if top > 0 else 1.0,
                          interpolation="nearest")
                caption = f"max {significant(top)}"
            ax.add_patch(Rectangle((-lo - 0.5, -lo - 0.5), 1, 1, fill=False, ec="red", lw=1.2))
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_xlabel(caption, fontsize=6, labelpad=1, linespacing=1.0)
            if layer == next(k for k in range(n_layers) if windows[k].shape[0] > h):  # the head's first row
                ax.set_title(f"head {h + 1}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {layer + 1}" if row_labels is None else row_labels[layer], fontsize=8)
    if image is not None:
        ax = fig.add_subplot(outer[0, 0])
        ax.imshow(image, cmap="gray" if image.ndim == 2 else None, interpolation="nearest")
        d = downsample
        ax.add_patch(Rectangle((query[1] * d - 0.5, query[0] * d - 0.5), d, d, fill=False, ec="red", lw=1.5))
        ax.add_patch(Rectangle(((query[1] + lo) * d - 0.5, (query[0] + lo) * d - 0.5), zoom * d, zoom * d,
                               fill=False, ec="yellow", lw=1, ls="--"))
        ax.set_xlim(-0.5, image.shape[1] - 0.5)
        ax.set_ylim(image.shape[0] - 0.5, -0.5)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title("input: query token (red),\nwindow (dashed)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig
