"""The learned + content attention layer through FlexAttention (a GPU variant of the layer and model benchmarks)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
from torch import Tensor

from attnconv.attention import SelfAttention2d
from attnconv.errors import AttnconvError


def flex_unavailable(device: str, needs_grad: bool = True) -> str | None:
    """Why FlexAttention cannot run here, or None when it can."""
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError as err:
        return f"FlexAttention not importable ({err})"
    if device == "cpu" and needs_grad:
        return "FlexAttention has no backward on CPU in this torch; it runs on CUDA"
    return None


_COMPILED_FLEX: Callable | None = None


def _flex_fn(device: str) -> Callable:
    """flex_attention, compiled on CUDA (eager FlexAttention is a slow reference implementation)."""
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import flex_attention

    if device != "cuda":
        return flex_attention
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention)
    return _COMPILED_FLEX


def flex_content_tokens(layer: SelfAttention2d, x: Tensor) -> Tensor:
    """A learned + content layer through FlexAttention: (B, H, W, C_in) -> (B, H, W, C_out)."""
    return layer.out(flex_content_heads(layer, x))


def flex_content_heads(layer: SelfAttention2d, x: Tensor) -> Tensor:
    """The heads' outputs of a learned + content layer through FlexAttention, concatenated before the output
    projection: (B, H, W, C_in) -> (B, H, W, heads * D).

    The layer's own parameters, its function (the dense path's, without attention
    dropout): score = q.k / sqrt(D_k) + q_row . r_row(delta_1) + q_col . r_col(delta_2),
    with the positional term added by a score_mod from per-query shift scores
    (B, heads, T, 2S - 1), so no (T x T) tensor is formed.
    """
    B, H, W, _ = x.shape
    T, heads, dk = H * W, layer.heads, layer.key_dim
    enc = layer.encoding
    q = layer.query(x).view(B, T, heads, dk).transpose(1, 2)  # (B, heads, T, D_k)
    k = layer.key(x).view(B, T, heads, dk).transpose(1, 2)
    row_scores = (q[..., : enc.row_dim] @ enc.row_embeddings.T).float()  # (B, heads, T, 2S-1), by row shift
    col_scores = (q[..., enc.row_dim :] @ enc.col_embeddings.T).float()  # (B, heads, T, 2S-1), by column shift
    S = enc.max_size

    def score_mod(score, b, h, q_idx, kv_idx):
        d_row = kv_idx // W - q_idx // W + S - 1
        d_col = kv_idx % W - q_idx % W + S - 1
        return score + row_scores[b, h, q_idx, d_row] + col_scores[b, h, q_idx, d_col]

    if layer.value_mode == "shared":
        v = x.reshape(B, 1, T, layer.in_channels).expand(B, heads, T, layer.in_channels)
    else:
        v = layer.value(x).view(B, T, heads, layer.head_dim).transpose(1, 2)
    out = _flex_fn(x.device.type)(q, k, v.to(q.dtype), score_mod=score_mod, scale=1.0 / math.sqrt(dk))
    return out.transpose(1, 2).reshape(B, H, W, heads * layer.head_dim)


class FlexContentAttention(nn.Module):
    """Wraps a learned + content SelfAttention2d to run through FlexAttention (same parameters)."""

    def __init__(self, layer: SelfAttention2d):
        super().__init__()
        if layer.position_only:
            raise AttnconvError("FlexContentAttention wraps learned + content layers only")
        self.layer = layer

    @property
    def out(self) -> nn.Linear:
        """The layer's output projection (a block folds the Linear after the attention into it)."""
        return self.layer.out

    def forward_tokens(self, x: Tensor) -> Tensor:
        return flex_content_tokens(self.layer, x)

    def forward_projected(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """`forward_tokens` with the output projection's weight and bias in place of `out`'s, as the layer's."""
        return nn.functional.linear(flex_content_heads(self.layer, x), weight, bias)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) like SelfAttention2d
        return self.forward_tokens(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def flex_model(model: nn.Module) -> nn.Module:
    """The paper's classifier with every block's attention run through FlexAttention (in place)."""
    for block in model.layers:
        block.attention = FlexContentAttention(block.attention)
    return model
