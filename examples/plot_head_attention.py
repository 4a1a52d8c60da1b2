"""Load a trained run from Python and plot where one head of one layer attends.

    python examples/plot_head_attention.py RUN_DIR [--layer 1] [--head 1] [--out head.png]

Layers and heads are numbered from 1, as in the paper and in attnconv's figures.

RUN_DIR is any attention run written by `attnconv train` (for example
`attnconv train --preset fmnist-sa-quadratic --epochs 1 --out runs/sa`). Without RUN_DIR
the script trains a tiny run on random images first, so it runs anywhere in seconds.
"""

import argparse
import tempfile
from pathlib import Path

import torch

from attnconv import SelfAttention2d, load_run


def tiny_run(root: Path) -> Path:
    """Train a 2-layer quadratic attention model for a few steps on random Fashion-MNIST-shaped data."""
    from attnconv import data as D
    from attnconv.config import make_config
    from attnconv.training import train

    g = torch.Generator().manual_seed(0)
    make = lambda n: D.ImageSet(torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=g),  # noqa: E731
                                torch.randint(0, 10, (n,), generator=g))
    config = make_config(model="sa-quadratic", dataset="fashion-mnist", epochs=1, batch_size=32, workers=1,
                         model_overrides=dict(hidden=16, layers=2, heads=9, intermediate=16, downsample=4))
    train(config, root / "run", dataset=(make(128), make(32)), progress=False)
    return root / "run"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--layer", type=int, default=1, help="layer number, from 1")
    p.add_argument("--head", type=int, default=1, help="head number, from 1")
    p.add_argument("--out", default="head.png")
    args = p.parse_args()
    if args.layer < 1 or args.head < 1:
        p.error("--layer and --head count from 1 (the first layer is --layer 1)")

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run_dir or tiny_run(Path(tmp))
        model, config = load_run(run_dir)  # eval mode, weights from model.safetensors
        layers = [m for m in model.modules() if isinstance(m, SelfAttention2d)]
        if args.layer > len(layers) or args.head > layers[0].heads:
            p.error(f"the run has layers 1..{len(layers)} and heads 1..{layers[0].heads}")
        layer = layers[args.layer - 1]
        side = config.model_overrides["image_size"] // config.model_overrides.get("downsample", 2)
        probs = layer.attention_probs(size=(side, side))[0, args.head - 1]  # (T, T), rows = queries
        query = (side // 2) * side + side // 2  # the middle pixel
        grid = probs[query].reshape(side, side).detach()

    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 3))
    ax = fig.add_subplot()
    ax.imshow(grid.numpy(), cmap="viridis")
    ax.plot(side // 2, side // 2, "r+")
    ax.set_title(f"{config.model}: layer {args.layer}, head {args.head}")
    fig.savefig(args.out, dpi=100, bbox_inches="tight")
    peak = divmod(int(grid.argmax()), side)
    print(f"{args.out}: head {args.head} of layer {args.layer} puts {grid.max():.2f} of its attention on pixel "
          f"{peak} (query {(side // 2, side // 2)}, {side}x{side} tokens)")


if __name__ == "__main__":
    main()
