"""Memory estimates, used only to skip the cases that would not fit (never reported as measurements)."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn


def estimate_layer_bytes(impl: str, encoding: str, batch: int, side: int, channels: int, heads: int) -> int:
    """Rough upper estimate of the memory of one SelfAttention2d forward + backward (float32).

    Counts the big tensors alive at the peak: P = batch x heads x T x T probabilities
    (dense: the broadcast product copies the shared probabilities per sample, and the
    backward makes one more), V = batch x heads x T x C per-head values, X = batch x T x C.
    """
    T = side * side
    P, V, X = batch * heads * T * T, batch * heads * T * channels, batch * T * channels
    content = encoding == "learned-content"
    if impl == "dense":
        n = (5 * P if content else 2 * P + 3 * heads * T * T) + 6 * V
    elif impl == "sdpa":
        n = 4 * P + 4 * V  # the bias is (B, heads, T, T); CPU falls back to the math kernel when it needs a grad
    elif impl == "stacked":  # broadcast probabilities, but their gradient is summed from one (T*heads, T) per sample
        n = (3 * P if content else P) + 5 * V
    else:  # separable, flex: a few (B, heads, T, C) intermediates and their grads (measured: ~8.5 V)
        n = 9 * V
    if content:
        n += 6 * V  # queries and keys, (B, heads, T, key_dim = C), and their grads
    return 4 * (n + 4 * X)


def estimate_step_bytes(impl: str, model: nn.Module, batch: int) -> int:
    """Rough upper estimate of one training step's memory (float32): activations kept by
    every layer for the backward, one layer's backward transient, weights + grads + momentum."""
    cfg = model.config
    T, h, C = cfg.grid**2, cfg.heads, cfg.hidden
    P, V, X = batch * h * T * T, batch * h * T * C, batch * T * C
    content = cfg.encoding == "learned-content"
    if impl in ("dense", "sdpa"):
        kept, transient = (3 * P if content else 1.5 * P) + 3 * V, (3 * P if content else 2 * P) + V
    elif impl == "stacked":
        kept, transient = (3 * P if content else 0) + 3 * V, P + 2 * V
    else:
        kept, transient = 3 * V, 2 * V
    if content:
        kept += 2 * V  # queries and keys
    kept += 8 * X + 4 * batch * T * cfg.intermediate
    params = sum(p.numel() for p in model.parameters())
    return int(4 * (cfg.layers * kept + transient + 3 * params))


def fit_batch(estimate: Callable[[int], int], batch: int, budget: int) -> int:
    """The largest of batch, batch/2, batch/4, ... whose estimate fits the budget (0: none does)."""
    while batch >= 1:
        if estimate(batch) <= budget:
            return batch
        batch //= 2
    return 0
