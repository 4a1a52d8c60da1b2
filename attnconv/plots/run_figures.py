"""Figures of a run directory: `plot_centers`, `plot_maps`, `plot_figures` (load, analyze, draw, save)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from attnconv.analysis import head_geometry
from attnconv.errors import AttnconvError, ParameterError
from attnconv.fileio import not_a_folder
from attnconv.limits import MAX_SIDE, path_argument, positive_ints, probabilities_argument, shown_value, whole_number
from attnconv.models.sites import query_on_site, records_heads, site_probs
from attnconv.plots.figures import (
    centers_figure,
    check_out,
    distance_figure,
    maps_figure,
    save_figure,
    snapshot_geometry,
    spread_epochs,
    window_around,
)
from attnconv.runs import HEADS_FILE, Run, as_run

# ----------------------------------------------------------------------------------------
# From a run directory
# ----------------------------------------------------------------------------------------


def _folder(run: Run | str | os.PathLike) -> Path:
    """The run's folder, checked before its output path is (a missing folder or a file is one clear error)."""
    if isinstance(run, Run):
        return run.path
    run = path_argument(run, "run", "the run's directory")
    why = not_a_folder(run)
    if why:
        raise AttnconvError(f"{run}: not a run directory ({why}); give the --out of `attnconv train`")
    return Path(run)


def _run(run: Run | str | os.PathLike, device: str | None = None, data_dir: str | os.PathLike | None = None,
         dataset: str | None = None) -> Run:
    _folder(run)
    return as_run(run, device, data_dir=data_dir, dataset=dataset)


def _grid_words(sites) -> tuple[int, str]:
    """The largest grid side of the sites, and how a title names their grid(s)."""
    sizes = {site.size for site in sites}
    side = max(max(size) for size in sizes)
    if len(sizes) == 1:
        (h, w), = sizes
        return side, f"{h}x{w} token grid"
    return side, "each layer on its own input grid"


def plot_centers(
    run: Run | str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    images: int = 100,
    data_dir: str | os.PathLike | None = None,
    dataset: str | None = None,
    device: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Figure 4 / 12 / 14 for a run: each head's center and 50% / 90% contours per attention layer.

    Works for attention classifiers and CNNs converted to attention alike (each layer on its
    own grid). Content models are averaged over `images` test images sampled across the classes
    (`Run.test_images`); `dataset`: take them from another dataset with the run's classes. Writes `out`
    (default RUN_DIR/centers.png) and returns its path.
    """
    out = check_out(_folder(run) / "centers.png" if out is None else out, overwrite=overwrite)
    run = _run(run, device, data_dir, dataset)
    probs, n = run.site_probs(images)
    geometry = [head_geometry(site.layer, site.size, p) for site, p in zip(run.sites, probs)]
    side, grid = _grid_words(run.sites)
    how = f", mean over {n} test images" if n else ""
    fig = centers_figure(geometry, side, f"{run.config.model}: attention centers ({grid}{how})")
    return save_figure(fig, out, overwrite=True)  # checked above


def _history(run: Run) -> list[dict]:
    """The run's heads.jsonl snapshots; one clear error when it has none."""
    if not run.heads and not records_heads(run.architecture):  # training never records this network's heads
        converted = run.converted or run.config.init_from is not None
        raise AttnconvError(
            f"{run.path}: no {HEADS_FILE}: training records no heads for "
            + (f"a network converted from a CNN ({run.config.model} run); draw its heads as they are with "
               "`attnconv plot centers RUN`" if converted else
               f"a CNN ({run.config.model} run), which has no attention heads; give a run of an attention model"))
    if not run.heads:  # (a file whose every line is damaged is Run.heads' error)
        raise AttnconvError(
            f"{run.path}: no {HEADS_FILE} (the heads recorded during training); only attention classifiers "
            f"trained by this version record them ({run.config.model} run). Train the run again to record them, "
            "or draw the final heads with `attnconv plot centers RUN`")
    return run.heads


def plot_centers_history(
    run: Run | str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    layer: int = 1,
    epochs: Sequence[int] | None = None,
    overwrite: bool = False,
) -> Path:
    """Figure 4 over training: one layer's head centers and 50% / 90% contours at several epochs.

    From the run's heads.jsonl (no weights needed). layer: numbered from 1. epochs: recorded
    epochs to draw (0 is the initialization; default up to five, denser early). Quadratic
    heads get their Gaussian's contours; learned and content heads only their centers.
    Writes `out` (default RUN_DIR/centers-layer<L>.png) and returns its path.
    """
    layer = whole_number(layer, "layer", "a layer number, from 1")
    if epochs is not None:
        epochs = positive_ints(epochs, None, "epochs", "recorded epochs to draw (0: the initialization)", least=0)
    out = check_out(_folder(run) / f"centers-layer{layer}.png" if out is None else out, overwrite=overwrite)
    run = _run(run)
    snapshots = _history(run)
    n_layers = len(snapshots[0]["layers"])
    if not 1 <= layer <= n_layers:
        raise ParameterError("layer", layer, f"is invalid: the run has layers 1..{n_layers}")
    by_epoch = {s["epoch"]: s for s in snapshots}  # a replayed epoch: the last record wins
    if epochs is None:
        epochs = spread_epochs(list(by_epoch))
    missing = [e for e in epochs if e not in by_epoch]
    if missing:
        raise ParameterError("epochs", missing, f": not recorded; the run's heads.jsonl has epochs "
                             f"{_ranges(sorted(by_epoch))}", shown=",".join(map(str, missing)))
    geometry = [snapshot_geometry(by_epoch[e]["layers"][layer - 1]) for e in epochs]
    grid = run.architecture.config.grid  # fresh weights: only the shape is read
    title = f"{run.config.model}: layer {layer} head centers over training ({grid}x{grid} token grid)"
    fig = centers_figure(geometry, grid, title, panel_titles=[f"epoch {e}" for e in epochs])
    return save_figure(fig, out, overwrite=True)  # checked above


def plot_distance(run: Run | str | os.PathLike, out: str | os.PathLike | None = None, *, overwrite: bool = False
                  ) -> Path:
    """Each layer's mean attention distance per head over training, from heads.jsonl.

    Writes `out` (default RUN_DIR/distance.png) and returns its path.
    """
    out = check_out(_folder(run) / "distance.png" if out is None else out, overwrite=overwrite)
    run = _run(run)
    fig = distance_figure(_history(run), f"{run.config.model}: mean attention distance per head over training")
    return save_figure(fig, out, overwrite=True)  # checked above


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 3, 5] -> '0-3, 5'."""
    parts, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(parts)


def _parse_query(query: Sequence[int] | None, size: tuple[int, int]) -> tuple[int, int]:
    if query is None:
        return size[0] // 2, size[1] // 2
    query = positive_ints(query, 2, "query", "the query's (row, col) on the token grid", least=-MAX_SIDE)
    if not (0 <= query[0] < size[0] and 0 <= query[1] < size[1]):
        raise ParameterError(
            "query", query, f"is outside the {size[0]}x{size[1]} token grid "
            f"(rows 0..{size[0] - 1}, columns 0..{size[1] - 1}; coordinates are after downsampling)",
            shown=",".join(map(str, query)),
        )
    return query


def _zoom(zoom: object) -> int:
    return whole_number(zoom, "zoom", "the window side in tokens (None: the whole grid)")


def maps_of_run(run: Run, probs: list, *, query: Sequence[int] | None = None, zoom: int | None = 7,
                how: str = "", image=None):
    """The maps figure (Figures 5 / 6) of a run from its sites' probabilities (`Run.site_probs`).

    query: (row, col) on the model's grid (default its center): the token grid of an attention
    classifier, the image of a converted CNN (each layer then shows the nearest of its own
    output pixels). zoom: window side; None: the whole grid (the smallest odd side >= it).
    image: a test image (H, W[, 3]) drawn beside the maps. how: what the probabilities average.
    Layers and heads are numbered from 1; a map with nothing to show (a converted CNN's 1x1
    and 2x2 grids) is grey and captioned so (`maps_figure`).
    """
    sites = run.sites
    sizes = {site.size for site in sites}
    base = next(iter(sizes)) if len(sizes) == 1 else (run.info.size, run.info.size)  # the grid queries live on
    i, j = _parse_query(query, base)
    zoom = 2 * (max(base) // 2) + 1 if zoom is None else _zoom(zoom)
    if not isinstance(probs, (list, tuple)) or len(probs) != len(sites):
        raise ParameterError("probs", probs, f"is invalid: give one (heads, T_out, T_in) tensor per attention layer of "
                             f"the run ({len(sites)}), as Run.site_probs gives them", shown=shown_value(probs))
    windows, labels, full = [], [], []
    for number, (site, p) in enumerate(zip(sites, probs)):
        probabilities_argument(p, f"probs[{number}]", f"layer {number + 1}'s probabilities (heads, T_out, T_in)")
        out = site.layer.output_size(site.size) if hasattr(site.layer, "output_size") else site.size
        if p.dim() != 3 or tuple(p.shape[1:]) != (math.prod(out), math.prod(site.size)):
            raise ParameterError(f"probs[{number}]", p, f"of shape {tuple(p.shape)} does not fit layer {number + 1}: "
                                 f"give its probabilities (heads, {math.prod(out)}, {math.prod(site.size)}), as "
                                 "Run.site_probs gives them", shown="")
        q, pos = query_on_site(site, base, i, j)
        row = p[:, q].double().cpu().reshape(-1, *site.size).numpy()
        windows.append(window_around(row, pos, zoom))
        full.append(row)
        labels.append(f"layer {number + 1}" + (f"\n{site.size[0]}x{site.size[1]}" if len(sizes) > 1 else ""))
    where = (f"on the {base[0]}x{base[1]} token grid" if len(sizes) == 1
             else "the image pixel as the query of each layer, on its own input grid")
    title = (f"{run.config.model}: attention of query {(i, j)}, {zoom}x{zoom} window\n"
             f"{where}; {how}; each map scaled to its max")
    return maps_figure([], base, (i, j), zoom, image=image, downsample=run.info.size // base[0], title=title,
                       windows=windows, row_labels=labels, full=full)


def plot_maps(
    run: Run | str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    images: int = 100,
    query: Sequence[int] | None = None,
    zoom: int | None = 7,
    image: int | None = None,
    data_dir: str | os.PathLike | None = None,
    dataset: str | None = None,
    device: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Figures 5 / 6 for a run: attention probabilities of `query` per layer and head (`maps_of_run`).

    Content models: mean over `images` test images sampled across the classes, or the single test image `image`
    (drawn beside the grid; position-only maps do not depend on it). Writes `out` (default
    RUN_DIR/maps.png, or RUN_DIR/maps-image-K.png) and returns its path.
    """
    zoom = None if zoom is None else _zoom(zoom)
    default = "maps.png" if image is None else f"maps-image-{image}.png"
    out = check_out(_folder(run) / default if out is None else out, overwrite=overwrite)
    run = _run(run, device, data_dir, dataset)
    sizes = {site.size for site in run.sites}
    _parse_query(query, next(iter(sizes)) if len(sizes) == 1 else (run.info.size, run.info.size))  # before the work
    picture = None
    if image is not None:
        raw, x = run.test_images(index=image)
        probs, how = site_probs(run.model, run.sites, x), f"test image {image}"
        picture = raw[0].permute(1, 2, 0).numpy()
        picture = picture[..., 0] if picture.shape[-1] == 1 else picture
    else:
        probs, n = run.site_probs(images)
        how = f"mean over {n} test images" if n else "position-only: the same for every input"
    fig = maps_of_run(run, probs, query=query, zoom=zoom, how=how, image=picture)
    return save_figure(fig, out, overwrite=True)  # checked above


def plot_figures(
    run: Run | str | os.PathLike,
    prefix: str | os.PathLike,
    *,
    images: int = 100,
    data_dir: str | os.PathLike | None = None,
    dataset: str | None = None,
    device: str | None = None,
    overwrite: bool = False,
) -> list[Path]:
    """The paper-style figures of one attention run: PREFIX-centers.png and PREFIX-maps.png.

    centers: `plot_centers`, each head's center and 50% / 90% contours per layer (Figure 4
    for isotropic quadratic heads, Figure 12's ellipses for full-covariance ones, contours
    of the middle query's probabilities for learned and content heads). maps: `plot_maps`
    of the middle query over the whole token grid, layers x heads (Figure 5 for learned
    relative heads; content heads averaged over `images` test images sampled across the classes, Figure 6).
    Returns the two paths; a run without attention (a CNN) raises AttnconvError. overwrite:
    replace existing files that attnconv did not write (see `fileio.check_output_file`).
    """
    prefix = path_argument(prefix, "prefix", "a path to begin the figures' names with")
    run = _run(run, device, data_dir, dataset)  # loaded once for both figures
    return [plot_centers(run, prefix.with_name(prefix.name + "-centers.png"), images=images, overwrite=overwrite),
            plot_maps(run, prefix.with_name(prefix.name + "-maps.png"), zoom=None, images=images,
                      overwrite=overwrite)]
