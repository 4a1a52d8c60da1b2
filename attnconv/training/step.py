"""One optimization step, as `attnconv.training` runs it and `attnconv bench` times it."""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor,
               autocast: AbstractContextManager) -> tuple[Tensor, Tensor]:
    """Forward under `autocast`, float32 cross-entropy, backward, the optimizer's step.

    Returns (loss, logits), detached (the step's graph goes with the step) and still on the
    device (no host sync). The loss is the batch mean (under DDP the shard's mean; DDP averages
    the shards' gradients).
    """
    with autocast:
        logits = model(x)
    loss = F.cross_entropy(logits.float(), y)  # float32 loss whatever the autocast dtype
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach(), logits.detach()
