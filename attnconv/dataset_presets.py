"""Default presets per dataset: what `attnconv train --model M --dataset D` runs without `--preset`.

    name, base, why = dataset_preset("sa-learned", "fashion-mnist")
    config = make_config(base=base, epochs=3)          # explicit settings on top

- Fashion-MNIST: the CPU presets (`fmnist-sa-quadratic`'s optimizer, schedule and model
  size for every attention model; `fmnist-resnet-small` for ResNet-18).
- CIFAR-10: the paper's preset for the model (`paper-cifar10-<model>`).
- A folder of images (`folder:PATH`): AdamW with a warm-up and cosine decay, the attention
  models at the Fashion-MNIST CPU size with a space-to-depth factor that keeps at most
  16x16 tokens, random crops and flips, and a number of epochs that gives about 3,000
  steps (between 5 and 100 epochs), at a batch no larger than a quarter of the training set.
"""

from __future__ import annotations

import dataclasses
import math

from attnconv import data as D
from attnconv.config import PRESETS, TrainConfig

# Steps a folder preset aims for, and its bounds on epochs.
FOLDER_STEPS = 3000
FOLDER_EPOCHS = (5, 100)
MAX_TOKENS_SIDE = 16


def _space_to_depth(image_size: int) -> int:
    """The smallest space-to-depth factor dividing the image with at most MAX_TOKENS_SIDE tokens a side."""
    for d in (1, 2, 4, 8, 16, 32):
        if image_size % d == 0 and image_size // d <= MAX_TOKENS_SIDE:
            return d
    return next(d for d in (32, 16, 8, 4, 2, 1) if image_size % d == 0)


def folder_preset(model: str, info: D.DatasetInfo) -> TrainConfig:
    """The preset for a folder dataset, scaled to its image size and image count."""
    batch = max(1, min(128, info.train_size // 4))
    steps_per_epoch = max(1, info.train_size // batch)
    epochs = min(max(math.ceil(FOLDER_STEPS / steps_per_epoch), FOLDER_EPOCHS[0]), FOLDER_EPOCHS[1])
    overrides: dict = {"width": 16} if model == "resnet18" else {
        **PRESETS["fmnist-sa-quadratic"].model_overrides, "downsample": _space_to_depth(info.size)}
    return TrainConfig(
        model=model, dataset=info.name, model_overrides=overrides, epochs=epochs, batch_size=batch,
        optimizer="adamw", lr=1e-3, weight_decay=0.05, schedule="warmup-cosine", warmup=0.05, augment=True,
    )


def dataset_preset(model: str, dataset: str, *, image_size: int | None = None) -> tuple[str, TrainConfig]:
    """(a short name of the preset, the base config) for `model` on `dataset`."""
    name = D.canonical_name(dataset)
    if name == "fashion-mnist":
        preset = "fmnist-resnet-small" if model == "resnet18" else "fmnist-sa-quadratic"
        return f"the Fashion-MNIST CPU preset ({preset})", dataclasses.replace(PRESETS[preset], model=model)
    if name == "cifar10":
        preset = f"paper-cifar10-{model}"
        if preset in PRESETS:
            return f"the paper's CIFAR-10 preset ({preset})", dataclasses.replace(PRESETS[preset])
        return "the paper's CIFAR-10 preset (paper-cifar10-sa-quadratic)", dataclasses.replace(
            PRESETS["paper-cifar10-sa-quadratic"], model=model)
    info = D.dataset_info(name, image_size=image_size)
    return (f"the folder preset ({info.train_size} training images of {info.size}x{info.size})",
            folder_preset(model, info))


def describe(config: TrainConfig) -> str:
    """One line of the settings a preset decides."""
    opt = f"{config.optimizer} lr {config.lr:g} wd {config.weight_decay:g}"
    model = " ".join(f"{k}={v}" for k, v in sorted(config.model_overrides.items()))
    return (f"{opt}, {config.schedule}, {config.epochs} epochs, batch {config.batch_size}, "
            f"{'crop+flip' if config.augment else 'no augmentation'}" + (f"; model {model}" if model else ""))
