"""The learning rate as a pure function of the step, and the optimizer's parameter groups."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from attnconv.config import TrainConfig
from attnconv.limits import whole_number
from attnconv.models import attention_placement, no_weight_decay
from attnconv.options import FieldError


def learning_rate(config: TrainConfig, step: int, total_steps: int) -> float:
    """Learning rate of optimizer step `step` (0-based) out of `total_steps`.

    A pure function of the step, so resuming needs no scheduler state.
    warmup-cosine: linear from lr/warm to lr over the first `warmup * total` steps,
    then half a cosine down to 0 (the paper's attention models). multistep: lr times
    gamma for each milestone passed (the paper's ResNet: epochs 80/150/250 of 300).
    """
    step = whole_number(step, "step", "the optimizer step, counted from 0", least=0, most=2**53)  # exact as floats
    total_steps = whole_number(total_steps, "total_steps", "the run's optimizer steps", most=2**53)
    if config.schedule == "constant":
        return config.lr
    if config.schedule == "multistep":
        passed = sum(step >= round(m * total_steps) for m in config.milestones)
        return config.lr * config.gamma**passed
    warm = round(config.warmup * total_steps)
    if step < warm:
        return config.lr * (step + 1) / warm
    progress = (step - warm) / max(1, total_steps - warm)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))



def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD (or AdamW) with parameter groups: weight decay, and none for `no_weight_decay(model)`;
    with `attention_lr_scale` != 1, each split again by `attention_placement(model)`.

    The paper exempts the attention centers and widths from weight decay. The LR is
    set before every step from `learning_rate` times each group's "lr_scale", so the
    value given here is a placeholder.
    """
    skip = no_weight_decay(model)
    scaled = set() if config.attention_lr_scale == 1 else attention_placement(model)
    if not scaled and config.attention_lr_scale != 1:
        raise FieldError("attention_lr_scale", config.attention_lr_scale, f"model {config.model!r} has no attention "
                         "centers, widths or content projections to scale; leave it at 1")
    params = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in params if (n in skip) == exempt and (n in scaled) == placed],
         "weight_decay": 0.0 if exempt else config.weight_decay,
         "lr_scale": config.attention_lr_scale if placed else 1.0}
        for placed in (False, True) for exempt in (False, True)
    ]
    groups = [g for g in groups if g["params"]]
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.momentum, 0.999))
