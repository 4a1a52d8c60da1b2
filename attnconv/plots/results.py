"""Figures of results rather than of attention: training curves, the learn-conv experiment, the
confusion matrix and misclassified test images. Numbers in, matplotlib Figure out, as in `figures`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnconv.analysis.grid import grid_points
from attnconv.errors import AttnconvError
from attnconv.limits import whole_number
from attnconv.plots.figures import head_colors


def curves_figure(rows: list[dict[str, float]], title: str = ""):
    """Train and test loss (left) and accuracy (right) per epoch, from metrics.csv rows."""
    from matplotlib.figure import Figure

    if not rows:
        raise AttnconvError("no epoch finished yet: metrics.csv has no rows to plot")
    epochs = [r["epoch"] for r in rows]
    fig = Figure(figsize=(9.5, 3.4))
    loss_ax, acc_ax = fig.subplots(1, 2)
    marker = "o" if len(rows) <= 30 else None
    for ax, key, name in ((loss_ax, "loss", "cross-entropy loss"), (acc_ax, "acc", "accuracy")):
        ax.plot(epochs, [r[f"train_{key}"] for r in rows], marker=marker, ms=3, label="train")
        ax.plot(epochs, [r[f"test_{key}"] for r in rows], marker=marker, ms=3, label="test")
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.grid(color="0.9")
        ax.legend(fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def learn_conv_figure(result: dict[str, Any]):
    """Two panels: the centers' trajectories against the K x K grid, and the held-out error."""
    from matplotlib.figure import Figure

    traj = np.asarray(result["trajectory"])  # (records, heads, 2)
    kernel = result["config"]["kernel"]
    heads = traj.shape[1]
    colors = head_colors(heads)
    fig = Figure(figsize=(10, 4.6))
    ax, ax_err = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.1, 1]})
    grid = grid_points(kernel)
    ax.plot(grid[:, 1], grid[:, 0], "s", ms=11, mfc="none", mec="black", mew=1.2, label=f"{kernel}x{kernel} grid")
    for h in range(heads):
        ax.plot(traj[:, h, 1], traj[:, h, 0], "-", color=colors[h], lw=1.2)
        ax.plot(traj[0, h, 1], traj[0, h, 0], "o", color=colors[h], mfc="none", ms=5)
        ax.plot(traj[-1, h, 1], traj[-1, h, 0], "o", color=colors[h], ms=6)
    R = max(kernel // 2 + 1, math.ceil(np.abs(traj).max()))
    ax.set_xlim(-R - 0.5, R + 0.5)
    ax.set_ylim(R + 0.5, -R - 0.5)  # rows point down
    ax.set_aspect("equal")
    ax.set_xticks(np.arange(-R, R + 1, 1 if R <= 6 else 2))
    ax.set_yticks(np.arange(-R, R + 1, 1 if R <= 6 else 2))
    ax.set_xticks(np.arange(-R, R + 2) - 0.5, minor=True)
    ax.set_yticks(np.arange(-R, R + 2) - 0.5, minor=True)
    ax.grid(which="minor", color="0.9", lw=0.6)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("column shift")
    ax.set_ylabel("row shift (down)")
    m = result["matching"]
    ax.set_title(f"head centers: start (open) to end (filled)\n{m['within']}/{heads} heads within "
                 f"{m['tolerance']} px of a distinct grid point, mean distance {m['mean_distance']:.2f}", fontsize=9)
    ax_err.semilogy(result["steps_recorded"], result["relative_error_curve"], color="black")
    ax_err.set_xlabel("step")
    ax_err.set_ylabel("held-out ||attn(x) - conv(x)|| / ||conv(x)||")
    ax_err.set_title(f"final relative error {result['relative_error']:.3g}", fontsize=9)
    ax_err.grid(True, which="both", color="0.9")
    c = result["config"]
    fig.suptitle(f"Does self-attention learn a {kernel}x{kernel} convolution? {heads} quadratic heads, "
                 f"{c['channels']} channels, {c['size']}x{c['size']} {c['source']} inputs, {c['steps']} Adam steps",
                 fontsize=10)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------
# Test set: confusion matrix, misclassified images
# ----------------------------------------------------------------------------------------


def text_label(name: str) -> str:
    """A class name as matplotlib draws it literally: `$` escaped (it starts math text, which fails on names such as
    `$\\foo$`), a byte that is not UTF-8 (a lone surrogate) and control characters shown as escapes."""
    out = []
    for c in str(name):
        if c == "$":
            out.append("\\$")
        elif "\udc80" <= c <= "\udcff":
            out.append(f"\\x{ord(c) - 0xdc00:02x}")
        elif not c.isprintable():
            out.append(c.encode("unicode_escape").decode("ascii"))
        else:
            out.append(c)
    return "".join(out)


def confusion_figure(confusion: Sequence[Sequence[int]] | np.ndarray, classes: Sequence[str], title: str = ""):
    """A confusion matrix drawn with its class names: rows the true class, columns the predicted one.

    Each cell holds its count (up to 30 classes; beyond, the cells are too small to read) and is
    coloured by its row-normalised rate, the share of that class's images predicted as the column,
    so a small class's errors show as clearly as a large one's. A class with no images is a white row.
    """
    from matplotlib.figure import Figure

    counts = np.asarray(confusion, dtype=np.int64)
    n = len(classes)
    if counts.shape != (n, n):
        raise AttnconvError(f"a confusion matrix of {n} classes must be {n}x{n}, got shape {counts.shape}")
    totals = counts.sum(1, keepdims=True)
    rates = np.divide(counts, totals, out=np.zeros(counts.shape), where=totals > 0)
    side = min(max(3.0, 0.55 * n + 2.0), 16.0)
    fig = Figure(figsize=(side + 1.0, side))
    ax = fig.subplots()
    im = ax.imshow(rates, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    if n <= 30:
        size = 8 if n <= 12 else 6 if n <= 20 else 5
        for i in range(n):
            for j in range(n):
                ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=size,
                        color="white" if rates[i, j] > 0.6 else "black")
    labels = [text_label(c) for c in classes]
    ticks = np.arange(n)
    label_size = 8 if n <= 12 else 6 if n <= 30 else 4
    ax.set_xticks(ticks, labels, rotation=45, ha="right", rotation_mode="anchor", fontsize=label_size)
    ax.set_yticks(ticks, labels, fontsize=label_size)
    ax.set_xlabel("predicted class", fontsize=9)
    ax.set_ylabel("true class", fontsize=9)
    cbar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    cbar.set_label("share of the true class's images", fontsize=8)
    cbar.ax.tick_params(labelsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def misclassified_figure(images, true: Sequence[int], predicted: Sequence[int], classes: Sequence[str],
                         probabilities: Sequence[float], title: str = "", limit: int = 16):
    """A grid of up to `limit` images (uint8 (N, C, H, W), the first N drawn), each captioned
    "true → predicted (p)", p the probability the model gave its (wrong) prediction."""
    from matplotlib.figure import Figure

    limit = whole_number(limit, "limit", "how many images to draw at most")
    images = np.asarray(images)
    if images.ndim != 4 or images.dtype != np.uint8:
        raise AttnconvError(f"images must be uint8 (N, C, H, W), got {images.dtype} {images.shape}")
    n = min(len(images), limit)
    if n == 0:
        raise AttnconvError("no images to draw")
    ncols = min(n, 4)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(2.3 * ncols, 2.4 * nrows + (0.4 if title else 0.0)))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for k, ax in enumerate(axes.flat):
        ax.set_xticks([])
        ax.set_yticks([])
        if k >= n:
            ax.set_visible(False)
            continue
        image = images[k].transpose(1, 2, 0)
        if image.shape[2] == 1:
            ax.imshow(image[:, :, 0], cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        else:
            ax.imshow(image, interpolation="nearest")
        ax.set_title(f"{text_label(classes[int(true[k])])} → {text_label(classes[int(predicted[k])])} "
                     f"({float(probabilities[k]):.3g})",
                     fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
