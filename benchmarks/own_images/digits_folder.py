"""Write the UCI handwritten digits (8x8 grey, 1,797 images, 10 classes) as a folder dataset.

    python benchmarks/own_images/digits_folder.py OUT [--wheel scikit_learn-*.whl]

The digits ship inside scikit-learn's wheel (sklearn/datasets/data/digits.csv.gz): the script
reads them from a wheel given with --wheel, or fetches one with `pip download scikit-learn
--no-deps` (scikit-learn itself is not installed or imported). Split as scikit-learn's
train_test_split(test_size=0.2) would size it, with a fixed permutation: 1,437 train / 360 test,
written as OUT/train/<digit>/<k>.png and OUT/test/<digit>/<k>.png (8x8, values 0-16 scaled to 0-255).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import io
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

MEMBER = "sklearn/datasets/data/digits.csv.gz"


def digits_from_wheel(wheel: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) uint8 in 0..255, labels (1797,) int) from scikit-learn's wheel."""
    with zipfile.ZipFile(wheel) as z:
        raw = gzip.decompress(z.read(MEMBER)).decode()
    table = np.loadtxt(io.StringIO(raw), delimiter=",")
    pixels, labels = table[:, :64], table[:, 64].astype(int)
    return np.round(pixels * 255 / 16).astype(np.uint8).reshape(-1, 8, 8), labels


def fetch_wheel(into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "scikit-learn", "--no-deps", "-q", "-d", str(into)],
                   check=True)
    return Path(sorted(glob.glob(str(into / "scikit_learn-*.whl")))[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--wheel", type=Path, help="scikit-learn wheel (default: pip download one)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel or fetch_wheel(Path(tmp))
        images, labels = digits_from_wheel(wheel)
    order = np.random.default_rng(0).permutation(len(labels))
    n_test = int(np.ceil(0.2 * len(labels)))  # 360, as train_test_split(test_size=0.2)
    splits = {"test": order[:n_test], "train": order[n_test:]}
    for split, idx in splits.items():
        for k in idx:
            folder = args.out / split / str(labels[k])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[k], mode="L").save(folder / f"{k:04d}.png")
    print(f"{args.out}: {len(splits['train'])} train / {len(splits['test'])} test images, 10 classes, 8x8 grey")
    return 0


if __name__ == "__main__":
    sys.exit(main())
