"""`conv_to_attention`: an `nn.Conv1d/2d/3d` -> its `ConvAttention` (or `LearnableConvAttention`)."""

from __future__ import annotations

import torch
from torch import nn

from attnconv.construct.bound import default_alpha
from attnconv.construct.conv_attention import ConvAttention
from attnconv.construct.learnable import LearnableConvAttention, check_key_dim
from attnconv.errors import AttnconvError

__all__ = ["conv_to_attention"]


def _conv_padding(conv: nn.Module) -> tuple[tuple[int, int], ...]:
    """Per-axis (low, high) padding of a conv, as nn.ConvNd applies it (incl. 'same'/'valid')."""
    if conv.padding == "valid":
        return tuple((0, 0) for _ in conv.kernel_size)
    if conv.padding == "same":  # total dilation*(K-1); the odd pixel goes to the high side
        totals = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((int(p), int(p)) for p in conv.padding)


def conv_to_attention(
    conv: nn.Module, *, alpha: float | None = None, learnable: bool = False, key_dim: int = 0
) -> ConvAttention:
    """Build the attention layer of Theorem 1 that computes `conv` exactly.

    `conv` is an `nn.Conv1d`, `nn.Conv2d` or `nn.Conv3d` with any kernel size, stride,
    padding (int, tuple, 'same', 'valid'), dilation, groups, bias and padding_mode. The
    result has one head per kernel tap (Lemma 2 centers, Lemma 1 value maps), lives on
    the conv's device and dtype, and its output equals conv(x) up to the bound of
    `ConvAttention.error_bound` for every finite x. `alpha` defaults to
    `default_alpha(dtype, ndim)`. A NaN or inf in x does not stay in its receptive field
    as it does in the conv: it makes every output of its image (in its channel group)
    non-finite; see `ConvAttention`.

    `learnable=True` returns a `LearnableConvAttention` instead: the same heads, with
    each head's center and width as parameters to train further. It equals the conv up
    to the same bound at the same alpha; a small alpha (e.g. 1 to 4) trades exactness
    for gradients that can move the centers (see `LearnableConvAttention`). `key_dim` > 0
    (learnable layers only) adds content attention with that query/key width per head,
    starting at zero, so the layer still starts as the convolution.
    """
    if not isinstance(conv, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        raise AttnconvError(f"conv_to_attention takes nn.Conv1d/2d/3d, got {type(conv).__name__}")
    if isinstance(conv.weight, nn.parameter.UninitializedParameter):
        raise AttnconvError("the convolution is lazy and uninitialized; run it once on an input first")
    if conv.in_channels < 1 or conv.out_channels < 1:
        raise AttnconvError(
            f"conv_to_attention needs at least one input and one output channel, got {type(conv).__name__} with "
            f"in_channels={conv.in_channels}, out_channels={conv.out_channels}; build the conv with both >= 1"
        )
    weight = conv.weight.detach()  # (C_out, C_in / groups, *K)
    if not weight.is_floating_point():
        raise AttnconvError(f"conv weights must be floating point, got {weight.dtype}")
    ndim = weight.dim() - 2
    check_key_dim(key_dim, learnable)
    extra = {"key_dim": key_dim} if learnable else {}
    layer = (LearnableConvAttention if learnable else ConvAttention)(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        stride=conv.stride,
        padding=_conv_padding(conv),
        dilation=conv.dilation,
        groups=conv.groups,
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
        alpha=default_alpha(weight.dtype, ndim) if alpha is None else alpha,
        device=weight.device,
        dtype=weight.dtype,
        **extra,
    )
    with torch.no_grad():
        layer.out_weight.copy_(weight.flatten(2).permute(2, 0, 1))  # (heads, C_out, C_in / groups)
        if conv.bias is not None:
            layer.out_bias.copy_(conv.bias.detach())
    return layer
