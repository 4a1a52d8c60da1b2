"""What `attnconv plot` and `attnconv analyze` share: their help text and the arguments that read a run.

Both look at what a trained attention run's layers learned, on the same images: `add_run_arguments`
gives them the same RUN_DIR, --images, --data-dir, --dataset and --device.
"""

from __future__ import annotations

import argparse

from attnconv.cli.evaluate import DATASET_HELP

# The description `attnconv plot --help` and `attnconv analyze --help` open with.
HELP = """`attnconv plot`, `attnconv analyze`, `attnconv learn-conv`: what trained attention layers learned.

    attnconv plot centers runs/sa [--out centers.svg]         Figures 4, 12, 14: head centers per layer
    attnconv plot centers runs/sa --layer 2 [--epochs 0,1,12] Figure 4 over training: one layer at several epochs
    attnconv plot distance runs/sa                            mean attention distance per head over epochs
    attnconv plot maps runs/sa [--query 3,3] [--zoom 7]       Figures 5, 6: attention around a query
    attnconv plot maps runs/sa-content --image 0              one test image, drawn beside the maps
    attnconv analyze runs/sa [--json]                         centers, widths, distances, conv-likeness
    attnconv learn-conv --out runs/learn-conv                 does attention learn a 3x3 conv?

Coordinates are token-grid coordinates: the image after the model's d x d downsampling
(a 28x28 image with downsample 4 has a 7x7 token grid), (row, column), rows down.
Content-attention models are averaged over --images test images of the run's dataset,
sampled across its classes (a fixed seed: the same images every time); position-only models
need no images. Layers and heads are numbered from 1, in the figures and in `analyze` (--json
too), as in the paper; query coordinates and test image indices (--image K) count from 0.
"""

COORDS = "coordinates are on the token grid (image_size // downsample), not image pixels"


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """RUN_DIR and the flags that choose the images a run's attention is shown on."""
    p.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `attnconv train`")
    p.add_argument("--images", type=int, default=100, metavar="N",
                   help="content models: average over N test images sampled across the classes (default 100)")
    p.add_argument("--data-dir", help="dataset folder (default: the run's, then the usual places)")
    p.add_argument("--dataset", metavar="folder:PATH", help=DATASET_HELP)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
