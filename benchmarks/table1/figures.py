"""The figures of Table 1's attention rows, paper-style, from the trained runs.

    .venv/bin/python benchmarks/table1/figures.py                 # runs/table1/<model>/seed0 -> docs/figures/
    .venv/bin/python benchmarks/table1/figures.py --seed 1 --images 100 --root runs/table1 --out docs/figures

For each attention model of the table whose run directory ROOT/<model>/seed<K> holds
weights (model.safetensors), writes (`attnconv.plots.plot_figures`):

    OUT/table1-<model>-centers.png   each head's center and 50% / 90% contours per layer
                                     (Figure 4; sa-quadratic-aniso: Figure 12's ellipses)
    OUT/table1-<model>-maps.png      the middle query's attention over the whole token grid,
                                     layers x heads (Figure 5; sa-learned-content: mean over
                                     the first --images test images, Figure 6)

ResNet-18 has no attention and gets none. Runs not trained yet (no weights) are named on
stderr and skipped, and a run still training is drawn from its last checkpoint with a
note on stderr; the exit status is 1 when no figure was written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnconv.errors import AttnconvError
from attnconv.plots import plot_figures
from attnconv.runs import WEIGHTS_FILE, read_config, read_metrics

MODELS = ("sa-quadratic", "sa-quadratic-aniso", "sa-learned", "sa-learned-content")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path("runs/table1"), help="folder of <model>/seed<K> runs")
    p.add_argument("--seed", type=int, default=0, help="which seed's run to draw (default 0)")
    p.add_argument("--out", type=Path, default=Path("docs/figures"), help="folder for the figures")
    p.add_argument("--models", nargs="+", default=list(MODELS), metavar="MODEL", help="rows to draw")
    p.add_argument("--images", type=int, default=100, help="content model: test images to average over")
    p.add_argument("--data-dir", help="dataset folder (default: the run's, then the usual places)")
    args = p.parse_args(argv)
    written = []
    for model in args.models:
        run = args.root / model / f"seed{args.seed}"
        if not (run / WEIGHTS_FILE).is_file():
            print(f"skip {model}: {run} has no {WEIGHTS_FILE} (not trained yet?)", file=sys.stderr)
            continue
        try:
            config, rows = read_config(run)["config"], read_metrics(run)
            cap, step = config.get("max_steps"), rows[-1]["step"] if rows else 0
            if len(rows) < config["epochs"] and (cap is None or step < cap):
                print(f"note: {run} has finished {len(rows)} of {config['epochs']} epochs; "
                      "drawing its last checkpoint", file=sys.stderr)
            paths = plot_figures(run, args.out / f"table1-{model}", images=args.images, data_dir=args.data_dir,
                                 overwrite=True)  # the repository's own figures, drawn again
        except AttnconvError as err:
            print(f"error: {model}: {err}", file=sys.stderr)
            return 2
        for path in paths:
            print(path)
        written += paths
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
