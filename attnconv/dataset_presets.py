"""Default presets per dataset: what `attnconv train --model M --dataset D` runs without `--preset`.

    name, base, why = dataset_preset("sa-learned", "fashion-mnist")
    config = make_config(base=base, epochs=3)          # explicit settings on top

- Fashion-MNIST: the CPU presets (`fmnist-sa-quadratic`'s optimizer, schedule and model
  size for every attention model; `fmnist-vit` for the ViT; `fmnist-resnet-small` for ResNet-18).
- CIFAR-10: the paper's preset for the model (`paper-cifar10-<model>`).
- A folder of images (`folder:PATH`): AdamW with a warm-up and cosine decay, the attention
  models at the Fashion-MNIST CPU size, sized to the data and the device:
    - the token grid: a space-to-depth factor (the ViT's patch) that keeps at most 8x8 tokens on the CPU (the
      Fashion-MNIST preset's 7x7; 16x16, the paper's grid, costs about 9x per image there:
      benchmarks/RESULTS.md, "Speed at the paper's token grid") and 16x16 on a GPU;
    - augmentation that keeps the label: random crops padded by 1/8 of the image side (4 pixels
      at 32, the CIFAR-10 recipe's), no flips (a mirrored digit or letter is another class, or
      none; `--flip` turns them on for photos);
    - the length: about FOLDER_IMAGES images seen (between 10 and 100 epochs), so 1,500 small
      images train for 35 epochs, a few minutes on a 2-core CPU, and 50,000 for 10;
    - a batch no larger than a quarter of the training set.
"""

from __future__ import annotations

import dataclasses
import math

from attnconv import data as D
from attnconv.config import PRESETS, TrainConfig

# Images a folder preset's run sees in all (epochs = this / training images, within FOLDER_EPOCHS),
# and the largest token grid side per device.
FOLDER_IMAGES = 50_000
FOLDER_EPOCHS = (10, 100)
MAX_TOKENS_SIDE = {"cpu": 8, "cuda": 16}


def _space_to_depth(image_size: int, max_side: int) -> int:
    """The smallest space-to-depth factor dividing the image with at most max_side tokens a side."""
    for d in (1, 2, 4, 8, 16, 32):
        if image_size % d == 0 and image_size // d <= max_side:
            return d
    return next(d for d in (32, 16, 8, 4, 2, 1) if image_size % d == 0)


def folder_preset(model: str, info: D.DatasetInfo, device: str = "cpu") -> TrainConfig:
    """The preset for a folder dataset, scaled to its image size and count and to the device."""
    batch = max(1, min(128, info.train_size // 4))
    epochs = min(max(math.ceil(FOLDER_IMAGES / max(1, info.train_size)), FOLDER_EPOCHS[0]), FOLDER_EPOCHS[1])
    max_side = MAX_TOKENS_SIDE["cuda" if str(device).startswith("cuda") else "cpu"]
    side = _space_to_depth(info.size, max_side)
    if model == "resnet18":
        overrides: dict = {"width": 16}
    elif model == "vit":
        overrides = {**PRESETS["fmnist-vit"].model_overrides, "patch": side}
    else:
        overrides = {**PRESETS["fmnist-sa-quadratic"].model_overrides, "downsample": side}
    return TrainConfig(
        model=model, dataset=info.name, model_overrides=overrides, epochs=epochs, batch_size=batch,
        optimizer="adamw", lr=1e-3, weight_decay=0.05, schedule="warmup-cosine", warmup=0.05, augment=True,
        crop_pad=max(1, info.size // 8), flip=False,
    )


def dataset_preset(model: str, dataset: str, *, image_size: int | None = None, device: str = "cpu"
                   ) -> tuple[str, TrainConfig]:
    """(a short name of the preset, the base config) for `model` on `dataset` (folders: on `device`)."""
    name = D.canonical_name(dataset)
    if name == "fashion-mnist":
        preset = {"resnet18": "fmnist-resnet-small", "vit": "fmnist-vit"}.get(model, "fmnist-sa-quadratic")
        return f"the Fashion-MNIST CPU preset ({preset})", dataclasses.replace(PRESETS[preset], model=model)
    if name == "cifar10":
        preset = f"paper-cifar10-{model}"
        if preset in PRESETS:
            return f"the paper's CIFAR-10 preset ({preset})", dataclasses.replace(PRESETS[preset])
        return "the paper's CIFAR-10 preset (paper-cifar10-sa-quadratic)", dataclasses.replace(
            PRESETS["paper-cifar10-sa-quadratic"], model=model)
    info = D.dataset_info(name, image_size=image_size)
    return (f"the folder preset ({info.train_size} training images of {info.size}x{info.size})",
            folder_preset(model, info, device))


def describe(config: TrainConfig) -> str:
    """One line of the settings a preset decides."""
    opt = f"{config.optimizer} lr {config.lr:g} wd {config.weight_decay:g}"
    model = " ".join(f"{k}={v}" for k, v in sorted(config.model_overrides.items()))
    return (f"{opt}, {config.schedule}, {config.epochs} epochs, batch {config.batch_size}, "
            f"{_augmentation(config)}" + (f"; model {model}" if model else ""))


def _augmentation(config: TrainConfig) -> str:
    if not config.augment or (config.crop_pad == 0 and not config.flip):
        return "no augmentation"
    parts = ([f"crop (pad {config.crop_pad})"] if config.crop_pad else []) + (["flip"] if config.flip else [])
    return " + ".join(parts)
