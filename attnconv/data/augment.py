"""Tensor-side augmentation and normalization: batched random crop + flip, per-channel normalize.

Everything works on whole batches of tensors (no torchvision, no per-image Python loop).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnconv.data.info import DatasetInfo


def normalize(images: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    """uint8 (B, C, H, W) -> float32 (B, C, H, W): (x / 255 - mean) / std per channel."""
    mean = torch.tensor(info.mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    std = torch.tensor(info.std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    return images.to(torch.float32, copy=True).div_(255.0).sub_(mean).div_(std)  # in place on the fresh float copy


def crop_flip(x: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """Crop each image of x (B, C, H, W) from its zero-padded copy, then optionally mirror it.

    offsets: int (B, 2), the (top, left) corner of each crop in the padded image,
    each in [0, 2 * pad] (pad, pad is the identity); flips: bool (B,). Zero padding
    is zero in x's units: call it on uint8 / [0, 1] images to pad with black, as the
    paper's pipeline does (torchvision RandomCrop(32, padding=4) before Normalize).
    Vectorized: one pad and one gather for the whole batch.
    """
    B, C, H, W = x.shape
    device = x.device
    Wp = W + 2 * pad
    xp = F.pad(x, (pad, pad, pad, pad))  # (B, C, H + 2p, W + 2p)
    offsets = offsets.to(device)
    rows = offsets[:, :1] + torch.arange(H, device=device)  # (B, H)
    cols = offsets[:, 1:] + torch.arange(W, device=device)  # (B, W)
    cols = torch.where(flips.to(device)[:, None], cols.flip(1), cols)  # a mirrored crop reads columns backwards
    # One gather over the flattened padded image (4.5x faster than 4-tensor advanced indexing on CPU).
    flat = (rows[:, :, None] * Wp + cols[:, None, :]).view(B, 1, H * W).expand(B, C, H * W)  # (B, C, H*W)
    return xp.flatten(2).gather(2, flat).view(B, C, H, W)


def draw_crop_flip(n: int, generator: torch.Generator, pad: int, flip: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets (n, 2) uniform in [0, 2 * pad] and flips (n,) with p = 1/2, in this order, from ``generator``."""
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator, device=generator.device)
    if flip:
        flips = torch.randint(0, 2, (n,), generator=generator, device=generator.device).bool()
    else:
        flips = torch.zeros(n, dtype=torch.bool, device=generator.device)
    return offsets, flips


def random_crop_flip(x: torch.Tensor, generator: torch.Generator, pad: int = 4, flip: bool = True) -> torch.Tensor:
    """Random crop with zero padding ``pad`` and random horizontal flip, for the whole batch x (B, C, H, W).

    Randomness comes only from ``generator`` (its device draws the numbers; then they move
    to x's device, so a CPU generator gives the same crops on every device).
    """
    offsets, flips = draw_crop_flip(len(x), generator, pad, flip)
    return crop_flip(x, offsets, flips, pad)
