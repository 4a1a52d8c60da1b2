"""Accuracy versus training time for the initializations of issue #6 (Fashion-MNIST, CPU).

Reads the four runs written by `runs/init-compare/run.sh`-style commands (see
benchmarks/RESULTS.md for the exact commands):

    paper     attnconv train --preset fmnist-sa-quadratic --epochs 8
    grid      attnconv train --preset fmnist-sa-quadratic --epochs 8 --init grid
    cnn       attnconv train --preset fmnist-resnet-small --epochs 4
    from-cnn  attnconv train --init-from RUNS/cnn --init-alpha 3 --epochs 1 --lr 0.01 --schedule warmup-cosine

and plots test accuracy against cumulative training time (the `seconds` column of each
metrics.csv: time in training steps, no evaluation). The from-cnn curve starts where the
CNN's ends (its training time counts), with the converted network's accuracy before any
attention training, which this script measures.

    python benchmarks/init_compare.py RUNS_DIR [--out docs/figures/init-compare.png]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path


def curve(run: Path, t0: float = 0.0) -> list[tuple[float, float]]:
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    out, t = [], t0
    for r in rows:
        t += float(r["seconds"])
        out.append((t, float(r["test_acc"])))
    return out


def start_accuracy(run: Path) -> float:
    """Test accuracy of the --init-from network before its first step (the CNN's weights, heads at alpha)."""
    import torch

    from attnconv import data as D
    from attnconv.config import TrainConfig
    from attnconv.evaluate import evaluate
    from attnconv.runs import build_run_model, read_config

    config = TrainConfig.from_dict(read_config(run)["config"])
    torch.manual_seed(config.seed)
    model = build_run_model(config, source_weights=True).eval()
    info = D.dataset_info(config.dataset)
    _, test = D.load_dataset(config.dataset, config.data_dir)
    return evaluate(model, test, info)[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path)
    p.add_argument("--out", type=Path, default=Path("docs/figures/init-compare.png"))
    args = p.parse_args()

    from matplotlib.figure import Figure

    curves = {"paper init (centers ~ N(0, 2^2))": curve(args.runs / "paper"),
              "grid init (centers on the 3x3 grid)": curve(args.runs / "grid")}
    cnn = curve(args.runs / "cnn")
    start = start_accuracy(args.runs / "from-cnn")
    from_cnn = [(cnn[-1][0], start)] + curve(args.runs / "from-cnn", cnn[-1][0])
    for name, points in [*curves.items(), ("ResNet-18/4 (the CNN, 4 epochs)", cnn),
                         ("--init-from the CNN (alpha 3)", from_cnn)]:
        print(f"{name}: " + ", ".join(f"{t / 60:.1f} min {a:.4f}" for t, a in points))

    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    for name, points in curves.items():
        ax.plot([t / 60 for t, _ in points], [a for _, a in points], marker="o", label=name)
    ax.plot([t / 60 for t, _ in cnn], [a for _, a in cnn], marker="s", color="0.5", label="ResNet-18 width 16 (CNN)")
    ax.plot([t / 60 for t, _ in from_cnn], [a for _, a in from_cnn], marker="^", color="C3",
            label="attention from the CNN (--init-from, alpha 3)")
    ax.set_xlabel("training time (minutes, 2-core CPU; evaluation excluded)")
    ax.set_ylabel("Fashion-MNIST test accuracy")
    ax.set_ylim(0.75, 0.95)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("Initializations at equal training time", fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
