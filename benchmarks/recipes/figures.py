"""The recipes' heads side by side, from the committed logs (heads.jsonl; no weights needed).

    .venv/bin/python benchmarks/recipes/figures.py                  # -> docs/figures/recipes-*.png
    .venv/bin/python benchmarks/recipes/figures.py --layer 4 --out docs/figures

Writes:
    OUT/recipes-layer<L>-over-training.png   Figure 4 over training: layer L's head centers and
                                             50% / 90% contours, a row per recipe (seed 0), at up to
                                             five epochs from 0 (initialization) to the end
    OUT/recipes-displacement.png             how far the centers moved from initialization against
                                             epochs: a panel per layer, a line per recipe (mean over
                                             heads and seeds; dotted: the largest head)

Recipes: the AdamW preset (benchmarks/table1/sa-quadratic) and every folder
benchmarks/recipes/<recipe>/sa-quadratic that holds a finished seed, but the 16-head ones (the
figures compare recipes at 9 heads); `--groups` replaces the list.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnconv.analysis.compare import displacement_history, group_runs
from attnconv.plots.figures import centers_figure, head_colors, save_figure, snapshot_geometry, spread_epochs
from attnconv.runs import read_heads

ROOT = Path(__file__).resolve().parents[2]


def default_groups() -> list[tuple[str, Path]]:
    groups = [("adamw (preset)", ROOT / "benchmarks/table1/sa-quadratic")]
    for folder in sorted((ROOT / "benchmarks/recipes").glob("*/sa-quadratic")):
        if folder.parent.name.endswith("-h16"):  # 16 heads: drawn apart (one figure's colours are per head)
            continue
        if any(folder.glob("seed*/heads.jsonl")):
            groups.append((folder.parent.name, folder))
    return groups


def over_training(groups: list[tuple[str, Path]], layer: int, out: Path) -> Path:
    panels, titles, rows = [], [], 0
    ncols = 5
    for label, folder in groups:
        snaps = {s["epoch"]: s for s in read_heads(group_runs(folder)[0])}
        epochs = spread_epochs(list(snaps), ncols)
        for e in epochs:
            panels.append(snapshot_geometry(snaps[e]["layers"][layer - 1]))
            titles.append(f"{label}: epoch {e}")
        for _ in range(ncols - len(epochs)):  # short runs: empty panels keep one recipe per row
            panels.append(panels[-1])
            titles.append("")
        rows += 1
    fig = centers_figure(panels, 7, f"layer {layer} head centers over training, one recipe a row (seed 0)",
                         panel_titles=titles, ncols=ncols)
    for ax, title in zip(fig.axes, titles):
        if not title:
            ax.set_visible(False)
    return save_figure(fig, out, overwrite=True)


def displacement(groups: list[tuple[str, Path]], out: Path) -> Path:
    from matplotlib.figure import Figure

    histories = [(label, displacement_history(folder)) for label, folder in groups]
    layers = len(histories[0][1]["moved_mean"][0])
    fig = Figure(figsize=(3.0 * layers + 1.8, 3.0))
    axes = fig.subplots(1, layers, squeeze=False, sharey=True)[0]
    colors = head_colors(len(histories))
    for (label, h), color in zip(histories, colors):
        for k, ax in enumerate(axes):
            ax.plot(h["epochs"], [m[k] for m in h["moved_mean"]], "-", color=color, lw=1.6, label=label if k == 0 else None)
            ax.plot(h["epochs"], [m[k] for m in h["moved_max"]], ":", color=color, lw=1.0)
    for k, ax in enumerate(axes):
        ax.set_title(f"layer {k + 1}", fontsize=9)
        ax.grid(color="0.9", lw=0.6)
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)
    fig.legend(loc="center right", fontsize=7, frameon=False)
    fig.supxlabel("epoch", fontsize=8)
    fig.supylabel("centers moved from init (tokens)", fontsize=8)
    fig.suptitle("sa-quadratic: center displacement per recipe (solid: mean over heads and seeds; dotted: largest)",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0, 1 - 1.6 / fig.get_figwidth(), 1))
    return save_figure(fig, out, overwrite=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layer", type=int, default=4, help="layer of Figure 4 over training (default 4)")
    p.add_argument("--out", type=Path, default=ROOT / "docs/figures", help="folder for the figures")
    p.add_argument("--groups", nargs="+", metavar="LABEL=FOLDER", help="recipes to draw instead of the default list")
    args = p.parse_args(argv)
    groups = ([(g.split("=", 1)[0], Path(g.split("=", 1)[1])) for g in args.groups] if args.groups
              else default_groups())
    args.out.mkdir(parents=True, exist_ok=True)
    for path in (over_training(groups, args.layer, args.out / f"recipes-layer{args.layer}-over-training.png"),
                 displacement(groups, args.out / "recipes-displacement.png")):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
