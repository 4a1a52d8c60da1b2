"""CIFAR ResNet-18, the paper's convolutional baseline (Table 1: 11.2M parameters).

The CIFAR variant of He et al. (2016): a 3x3 stem convolution with stride 1 and no
max-pool (32x32 inputs are too small to lose resolution at the start), then four
stages of two BasicBlocks with 64/128/256/512 channels, the last three starting
with stride 2, then global average pooling and one Linear layer. Shortcuts that
change shape are 1x1 convolution + BatchNorm (option B of the ResNet paper), which
is what gives exactly 11,173,962 parameters for 10 classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnconv.errors import AttnconvError
from attnconv.limits import one_image_hint, tensor_argument
from attnconv.models.registry import ImageModelConfig, register_model
from attnconv.options import check_fields, option


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a residual connection: (B, C_in, H, W) -> (B, C_out, H/s, W/s)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        # bias=False: BatchNorm's shift makes a conv bias redundant.
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR ResNet: stem conv, stages of BasicBlocks, global average pool, Linear.

    `forward_features` maps (B, C, H, W) to pooled features (B, 8 * width);
    `forward_head` maps those to logits (B, num_classes).
    """

    def __init__(
        self,
        blocks: tuple[int, ...] = (2, 2, 2, 2),
        *,
        in_channels: int = 3,
        num_classes: int = 10,
        width: int = 64,
    ):
        super().__init__()
        self.in_channels = in_channels
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, 1, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        stages = []
        channels = width
        for i, n in enumerate(blocks):
            out_channels = width * 2**i
            stride = 1 if i == 0 else 2
            layers = []
            for j in range(n):
                layers.append(BasicBlock(channels, out_channels, stride if j == 0 else 1))
                channels = out_channels
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.num_features = channels
        self.head = nn.Linear(channels, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) normalized images -> (B, num_features) pooled features."""
        if not torch.jit.is_scripting():  # TorchScript and torch.fx keep the network as a plain CNN: no check there
            if not isinstance(x, torch.fx.Proxy):
                self._check_images(x)
        x = self.stages(self.stem(x))  # (B, 8*width, H/8, W/8)
        return x.mean(dim=(2, 3))

    @torch.jit.unused
    def _check_images(self, x: torch.Tensor) -> None:
        """Checked as the attention models check theirs: one line naming x and the fix, not torch's from a kernel."""
        tensor_argument(x, "x", f"images (B, {self.in_channels}, H, W)", like=self.head.weight, owner="the model")
        if x.ndim != 4 or x.shape[1] != self.in_channels or not x.shape[2] or not x.shape[3]:
            raise AttnconvError(f"model expects images (B, {self.in_channels}, H, W), got {tuple(x.shape)}"
                                + (" (images of no pixels)" if x.ndim == 4 and x.shape[1] == self.in_channels else
                                   one_image_hint(x, self.in_channels)))

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        """(B, num_features) -> (B, num_classes) logits."""
        return self.head(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


@dataclass
class ResNetConfig(ImageModelConfig):
    """ResNet-18's options (each with its help and range: `attnconv.options`)."""

    width: int = option(64, "resnet18: base channels (paper: 64)", low=1, high=65536)


@register_model("resnet18")
def resnet18(
    *, in_channels: int = 3, num_classes: int = 10, image_size: int = 32, width: int = 64
) -> ResNet:
    """CIFAR ResNet-18 (11,173,962 parameters at the defaults).

    `image_size` is accepted so every model takes the same dataset-derived
    overrides; the network is fully convolutional and only needs the image to
    survive three stride-2 stages.
    """
    check_fields(ResNetConfig(in_channels=in_channels, num_classes=num_classes, image_size=image_size, width=width))
    return ResNet((2, 2, 2, 2), in_channels=in_channels, num_classes=num_classes, width=width)
