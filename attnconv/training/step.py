"""One optimization step, as `attnconv.training` runs it and `attnconv bench` times it."""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class StepOverflow(ArithmeticError):
    """The optimizer's step overflowed the weights' number range: a step size past it (AdamW's lr / (1 - beta1) from
    about 3.4e37 in float32, an SGD rate times `attention_lr_scale`), which torch refuses before updating."""


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
    try:
        optimizer.step()
    except RuntimeError as err:  # "value cannot be converted to type float without overflow": as a diverged run
        if "without overflow" not in str(err):
            raise
        raise StepOverflow(str(err)) from None
    return loss.detach(), logits.detach()
