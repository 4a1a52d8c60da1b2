"""``ImageSet``: a labelled set of uint8 images, and its per-channel statistics."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from attnconv.errors import AttnconvError


@dataclass(repr=False)
class ImageSet(Dataset):
    """A labelled image set held in memory (or memory-mapped); a `torch.utils.data.Dataset`.

    images: uint8 (N, C, H, W); labels: int64 (N,). `set[i]` is (image uint8 (C, H, W), label
    int), raw pixels: normalize them as the dataset's info says (`attnconv.data.normalize`).
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise AttnconvError(
                f"ImageSet.images must be uint8 (N, C, H, W), got {self.images.dtype} {tuple(self.images.shape)}"
            )
        if self.labels.dtype != torch.int64 or self.labels.dim() != 1:
            raise AttnconvError(f"ImageSet.labels must be int64 (N,), got {self.labels.dtype} {tuple(self.labels.shape)}")
        if len(self.images) != len(self.labels):
            raise AttnconvError(f"ImageSet has {len(self.images)} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], int(self.labels[i])

    def __repr__(self) -> str:
        return f"ImageSet({len(self)} images of {tuple(self.images.shape[1:])}, uint8)"

    def to(self, device: torch.device | str) -> ImageSet:
        """Copy to ``device`` (e.g. the whole uint8 set on the GPU once, then batches never cross PCIe)."""
        return ImageSet(self.images.to(device), self.labels.to(device))


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and population std, in [0, 1] units, of uint8 images (N, C, H, W).

    Accumulated in float64 one channel at a time (exact enough for 50000 CIFAR images).
    """
    means, stds = [], []
    for c in range(images.shape[1]):
        v = images[:, c].to(torch.float64) / 255.0  # (N, H, W)
        m = v.mean()
        means.append(float(m))
        stds.append(float(((v - m) ** 2).mean().sqrt()))
    return tuple(means), tuple(stds)
