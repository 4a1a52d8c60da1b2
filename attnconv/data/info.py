"""What a dataset is: ``DatasetInfo`` (shape, classes, normalization) and the built-in table.

The built-in datasets (CIFAR-10, Fashion-MNIST) are fixed facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnconv.errors import AttnconvError


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a dataset.

    ``mean`` and ``std`` are per channel, in [0, 1] pixel units, over every pixel
    of the training set (population std, ddof=0); ``stats_source`` says where the
    numbers come from.
    """

    name: str
    channels: int
    size: int  # images are size x size
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: tuple[str, ...]
    train_size: int
    test_size: int
    stats_source: str


DATASETS: dict[str, DatasetInfo] = {
    "cifar10": DatasetInfo(
        name="cifar10",
        channels=3,
        size=32,
        num_classes=10,
        # Per-channel mean / population std of the 50000 x 32 x 32 training pixels.
        # Not recomputed here (these machines are offline, no CIFAR-10 copy); they are
        # the widely published values, and `channel_stats(load_dataset("cifar10")[0])`
        # reproduces them. (The (0.2023, 0.1994, 0.2010) that circulates in CIFAR code
        # is not the pixel std.)
        mean=(0.49139968, 0.48215841, 0.44653091),
        std=(0.24703223, 0.24348513, 0.26158784),
        classes=(
            "airplane", "automobile", "bird", "cat", "deer",
            "dog", "frog", "horse", "ship", "truck",
        ),
        train_size=50000,
        test_size=10000,
        stats_source="published CIFAR-10 training-set pixel statistics (50000 images)",
    ),
    "fashion-mnist": DatasetInfo(
        name="fashion-mnist",
        channels=1,
        size=28,
        num_classes=10,
        # Measured with `channel_stats` on the 60000 training images of the Debian
        # package dataset-fashion-mnist (0.0~git20200523.55506a9-1); tested in
        # tests/test_data_fashion.py when the package is installed.
        mean=(0.2860406,),
        std=(0.3530242,),
        classes=(
            "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
            "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
        ),
        train_size=60000,
        test_size=10000,
        stats_source="channel_stats() over the 60000 Fashion-MNIST training images",
    ),
}

_ALIASES = {"cifar-10": "cifar10", "fashion_mnist": "fashion-mnist", "fashionmnist": "fashion-mnist"}


def builtin_info(name: str) -> DatasetInfo:
    """The ``DatasetInfo`` of a built-in dataset (case-insensitive; ``fashion_mnist`` works too)."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DATASETS:
        raise AttnconvError(f"unknown dataset {name!r}; valid names: {', '.join(sorted(DATASETS))}")
    return DATASETS[key]


def check_labels(labels: np.ndarray, path: Path, num_classes: int) -> None:
    """Raise if any label is outside 0..num_classes-1 (the message names ``path``)."""
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise AttnconvError(
            f"{path}: labels must be in 0..{num_classes - 1}, found {labels.min()}..{labels.max()}"
        )
