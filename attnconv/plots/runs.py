"""Figures of a run directory: `plot_centers`, `plot_maps`, `plot_figures` (load, analyze, draw, save)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from attnconv.errors import AttnconvError
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

# ----------------------------------------------------------------------------------------
# From a run directory
# ----------------------------------------------------------------------------------------


def _load(run_dir, device: str):
    """(model, config, converted layers or []) of a run with attention; one clear error otherwise."""
    from attnconv.analysis import load_attention_run

    _check_run_dir(run_dir)
    return load_attention_run(run_dir, device)


def _check_run_dir(run_dir) -> None:
    if not Path(run_dir).exists():
        raise AttnconvError(f"{run_dir}: no such run directory; give the --out of `attnconv train`")
    if not Path(run_dir).is_dir():
        raise AttnconvError(f"{run_dir}: not a run directory (it is a file); give the --out of `attnconv train`")


def plot_centers(
    run_dir: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    images: int = 100,
    data_dir: str | os.PathLike | None = None,
    device: str = "cpu",
    overwrite: bool = False,
) -> Path:
    """Figure 4 / 12 / 14 for a run: each head's center and 50% / 90% contours per layer.

    Content models are averaged over the first `images` test images. Writes `out`
    (default RUN_DIR/centers.png) and returns its path.
    """
    from attnconv.analysis import (
        attention_layers,
        conv_head_geometry,
        converted_needs_images,
        converted_probs,
        head_geometry,
        mean_layer_probs,
        needs_images,
        run_images,
        token_grid,
    )

    _check_run_dir(run_dir)  # before the default out inside it is checked (which would create it)
    out = check_out(Path(run_dir) / "centers.png" if out is None else out, overwrite=overwrite)
    model, config, layers = _load(run_dir, device)
    if layers:  # converted from a CNN: each layer on its own input grid
        x = run_images(config, images, data_dir=data_dir)[1].to(device) if converted_needs_images(layers) else None
        probs = converted_probs(model, layers, x)
        geometry = [conv_head_geometry(layer, size, p) for (_, layer, size), p in zip(layers, probs)]
        how = f", mean over {len(x)} test images" if x is not None else ""
        title = (f"{config.model} as attention: head centers per converted layer "
                 f"(kxk convs; shifts on each input grid{how})")
        fig = centers_figure(geometry, max(max(s) for *_, s in layers), title)
        return save_figure(fig, out, overwrite=True)  # checked above
    size = token_grid(model)
    x = run_images(config, images, data_dir=data_dir)[1].to(device) if needs_images(model) else None
    probs = mean_layer_probs(model, x)
    layers = [head_geometry(layer, p, size) for layer, p in zip(attention_layers(model), probs)]
    how = f", mean over {len(x)} test images" if x is not None else ""
    title = f"{config.model}: attention centers ({size[0]}x{size[1]} token grid{how})"
    fig = centers_figure(layers, max(size), title)
    return save_figure(fig, out, overwrite=True)  # checked above


def _history(run_dir) -> list[dict]:
    """The run's heads.jsonl snapshots; one clear error when it has none."""
    from attnconv.runs import HEADS_FILE, read_config, read_heads

    _check_run_dir(run_dir)
    config = read_config(run_dir)["config"]
    snapshots = read_heads(run_dir)
    if not snapshots:
        raise AttnconvError(
            f"{run_dir}: no {HEADS_FILE} (the heads recorded during training); only attention classifiers "
            f"trained by this version record them ({config['model']} run). Train the run again to record them, "
            "or draw the final heads with `attnconv plot centers RUN`")
    return snapshots


def plot_centers_history(
    run_dir: str | os.PathLike,
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
    from attnconv.runs import build_run_architecture, read_config

    _check_run_dir(run_dir)
    out = check_out(Path(run_dir) / f"centers-layer{layer}.png" if out is None else out, overwrite=overwrite)
    snapshots = _history(run_dir)
    n_layers = len(snapshots[0]["layers"])
    if not isinstance(layer, int) or not 1 <= layer <= n_layers:
        raise AttnconvError(f"--layer {layer} is invalid: the run has layers 1..{n_layers}")
    by_epoch = {s["epoch"]: s for s in snapshots}  # a replayed epoch: the last record wins
    if epochs is None:
        epochs = spread_epochs(list(by_epoch))
    missing = [e for e in epochs if e not in by_epoch]
    if missing:
        raise AttnconvError(f"--epochs {','.join(map(str, missing))}: not recorded; the run's heads.jsonl has epochs "
                            f"{_ranges(sorted(by_epoch))}")
    geometry = [snapshot_geometry(by_epoch[e]["layers"][layer - 1]) for e in epochs]
    meta = read_config(run_dir)
    grid = build_run_architecture(meta).config.grid  # fresh weights: only the shape is read
    title = f"{meta['config']['model']}: layer {layer} head centers over training ({grid}x{grid} token grid)"
    fig = centers_figure(geometry, grid, title, panel_titles=[f"epoch {e}" for e in epochs])
    return save_figure(fig, out, overwrite=True)  # checked above


def plot_distance(run_dir: str | os.PathLike, out: str | os.PathLike | None = None, *, overwrite: bool = False
                  ) -> Path:
    """Each layer's mean attention distance per head over training, from heads.jsonl.

    Writes `out` (default RUN_DIR/distance.png) and returns its path.
    """
    from attnconv.runs import read_config

    _check_run_dir(run_dir)
    out = check_out(Path(run_dir) / "distance.png" if out is None else out, overwrite=overwrite)
    snapshots = _history(run_dir)
    model = read_config(run_dir)["config"]["model"]
    fig = distance_figure(snapshots, f"{model}: mean attention distance per head over training")
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
    query = tuple(int(v) for v in query)
    if len(query) != 2 or not (0 <= query[0] < size[0] and 0 <= query[1] < size[1]):
        raise AttnconvError(
            f"--query {','.join(map(str, query))} is outside the {size[0]}x{size[1]} token grid "
            f"(rows 0..{size[0] - 1}, columns 0..{size[1] - 1}; coordinates are after downsampling)"
        )
    return query


def plot_maps(
    run_dir: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    images: int = 100,
    query: Sequence[int] | None = None,
    zoom: int | None = 7,
    image: int | None = None,
    data_dir: str | os.PathLike | None = None,
    device: str = "cpu",
    overwrite: bool = False,
) -> Path:
    """Figures 5 / 6 for a run: attention probabilities of `query` per layer and head.

    query: (row, col) on the token grid (default its center). zoom: side of the window;
    None: the whole token grid around its middle (the smallest odd side >= the grid's; for a
    network converted from a CNN, 7).
    Content models: mean over the first `images` test images, or the single test image
    `image` (drawn beside the grid; for position-only models the maps do not depend on it).
    Writes `out` (default RUN_DIR/maps.png, or RUN_DIR/maps-image-K.png) and returns its path.
    """
    from attnconv.analysis import (
        converted_needs_images,
        converted_probs,
        mean_layer_probs,
        needs_images,
        run_images,
        token_grid,
    )

    if zoom is not None and (not isinstance(zoom, int) or zoom < 1):
        raise AttnconvError(f"--zoom {zoom} is invalid: give the window side in tokens, >= 1")
    default = "maps.png" if image is None else f"maps-image-{image}.png"
    _check_run_dir(run_dir)
    out = check_out(Path(run_dir) / default if out is None else out, overwrite=overwrite)
    model, config, layers = _load(run_dir, device)
    if layers:  # converted from a CNN: the query is an image pixel; check it before any work
        from attnconv.runs import run_info

        side = run_info(config).size
        _parse_query(query, (side, side))
    content = converted_needs_images(layers) if layers else needs_images(model)
    raw, x = None, None
    if image is not None:
        raw, x = run_images(config, index=image, data_dir=data_dir)
        how = f"test image {image}"
    elif content:
        _, x = run_images(config, images, data_dir=data_dir)
        how = f"mean over {len(x)} test images"
    else:
        how = "position-only: the same for every input"
    x = None if x is None else x.to(device)
    if layers:  # converted from a CNN
        zoom = 7 if zoom is None else zoom
        fig = _converted_maps(config, layers, converted_probs(model, layers, x), query, zoom, how)
        return save_figure(fig, out, overwrite=True)  # checked above
    size = token_grid(model)
    zoom = 2 * (max(size) // 2) + 1 if zoom is None else zoom
    q = _parse_query(query, size)
    probs = mean_layer_probs(model, x)
    picture = None
    if raw is not None:
        picture = raw[0].permute(1, 2, 0).numpy()
        picture = picture[..., 0] if picture.shape[-1] == 1 else picture
    title = (f"{config.model}: attention of query {q}, {zoom}x{zoom} window\n"
             f"on the {size[0]}x{size[1]} token grid; {how}; each map scaled to its max")
    fig = maps_figure(probs, size, q, zoom, image=picture, downsample=model.config.downsample, title=title)
    return save_figure(fig, out, overwrite=True)  # checked above


def _converted_maps(config, layers, probs: list[Tensor], query: Sequence[int] | None, zoom: int, how: str):
    """Maps of a network converted from a CNN: image pixel `query` placed on each layer's grid.

    probs: `converted_probs` of the layers, (heads, T_out, T_in) each; `how` says over which inputs.
    """
    from attnconv.analysis import converted_query
    from attnconv.runs import run_info

    info = run_info(config)
    image_size = (info.size, info.size)
    i, j = _parse_query(query, image_size)
    windows, labels = [], []
    for n, ((_, layer, size), p) in enumerate(zip(layers, probs)):
        q, pos = converted_query(layer, size, image_size, i, j)
        row = p[:, q].double().cpu().reshape(-1, *size).numpy()
        windows.append(window_around(row, pos, zoom))
        labels.append(f"layer {n + 1}\n{size[0]}x{size[1]}")
    title = (f"{config.model} as attention: image pixel ({i}, {j}) as the query of each converted layer "
             f"(on its own input grid), {zoom}x{zoom} window;\n{how}; each map scaled to its max")
    return maps_figure([], image_size, (i, j), zoom, title=title, windows=windows, row_labels=labels)


def plot_figures(
    run_dir: str | os.PathLike,
    prefix: str | os.PathLike,
    *,
    images: int = 100,
    data_dir: str | os.PathLike | None = None,
    device: str = "cpu",
    overwrite: bool = False,
) -> list[Path]:
    """The paper-style figures of one attention run: PREFIX-centers.png and PREFIX-maps.png.

    centers: `plot_centers`, each head's center and 50% / 90% contours per layer (Figure 4
    for isotropic quadratic heads, Figure 12's ellipses for full-covariance ones, contours
    of the middle query's probabilities for learned and content heads). maps: `plot_maps`
    of the middle query over the whole token grid, layers x heads (Figure 5 for learned
    relative heads; content heads averaged over the first `images` test images, Figure 6).
    Returns the two paths; a run without attention (a CNN) raises AttnconvError. overwrite:
    replace existing files that attnconv did not write (see `fileio.check_output_file`).
    """
    prefix = Path(prefix)
    common = {"images": images, "data_dir": data_dir, "device": device, "overwrite": overwrite}
    return [plot_centers(run_dir, prefix.with_name(prefix.name + "-centers.png"), **common),
            plot_maps(run_dir, prefix.with_name(prefix.name + "-maps.png"), zoom=None, **common)]
