"""`conv_to_attention`: an `nn.Conv1d/2d/3d` -> its `ConvAttention` (or `LearnableConvAttention`)."""

from __future__ import annotations

import numbers

import torch
from torch import nn
from torch.nn.modules.conv import _ConvNd, _ConvTransposeNd
from torch.nn.modules.lazy import LazyModuleMixin

from attnconv.construct.bound import default_alpha
from attnconv.construct.conv_attention import ConvAttention
from attnconv.construct.learnable import LearnableConvAttention, check_key_dim
from attnconv.errors import AttnconvError
from attnconv.limits import flag_argument

__all__ = ["conv_to_attention", "unconvertible_reason"]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


# What nn.Module calls on the way to forward: a subclass (or an instance) with its own computes something else.
_CALLS = ("__call__", "_call_impl", "_wrapped_call_impl")


def torch_compiled(module: nn.Module) -> bool:
    """Whether `module` is torch.compile's wrapper (an OptimizedModule), which runs a graph captured from the module
    it wraps (`_orig_mod`)."""
    return isinstance(getattr(module, "_orig_mod", None), nn.Module)


def unconvertible_reason(module: nn.Module) -> str | None:
    """Why `module` has no exact Theorem 1 attention layer, with the fix; None if it has one.

    The one rule `conv_to_attention` and `cnn_to_attention` apply: a plain `nn.Conv1d/2d/3d`
    (a subclass only if it keeps their `forward` and `_conv_forward`: its own would compute
    something the attention layer does not reproduce, e.g. static 'same' padding; likewise
    neither replaced on the module itself, nor compiled by TorchScript), initialized,
    with floating-point weights and no forward hooks (whose effect would be lost).
    """
    name = type(module).__name__
    if isinstance(module, _ConvTransposeNd):
        return (
            f"{name} is a transposed convolution, which conv_to_attention does not construct; "
            "replace it by an upsampling + Conv, or keep it"
        )
    if isinstance(module, torch.jit.ScriptModule):  # a scripted conv is no _ConvNd: said before "not a conv"
        return (f"{name} is compiled by torch.jit.script or traced by torch.jit.trace; convert the nn.Module first, "
                "then script or trace the result")
    if torch_compiled(module):
        return (f"{name} is compiled by torch.compile; convert the module it wraps (its _orig_mod), then compile the "
                "result")
    base = next((c for c in _CONVS if isinstance(module, c)), None)
    if base is None:
        return f"{name} is not an nn.Conv1d/2d/3d"
    if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
        return f"{name} is lazy and uninitialized; run the model once on an input before converting"
    replaced = [attr for attr in ("forward", "_conv_forward", *_CALLS) if attr in vars(module)]
    if replaced:
        return (
            f"{name} has its {replaced[0]} replaced on the module itself, which the attention layer would not "
            f"reproduce; remove the replacement (del module.{replaced[0]}), or replace the module by a plain "
            f"nn.{base.__name__} computing the same function and convert that"
        )
    if type(module).forward is not base.forward or type(module)._conv_forward is not base._conv_forward or any(
            getattr(type(module), attr) is not getattr(nn.Module, attr) for attr in _CALLS):
        return (
            f"{name} subclasses {base.__name__} with its own forward, which the attention layer would not "
            f"reproduce; replace it by a plain nn.{base.__name__} computing the same function (e.g. explicit "
            "padding, or an nn.ZeroPad before it) and convert that"
        )
    if not module.weight.is_floating_point():
        return f"{name} has {module.weight.dtype} weights; the attention layer needs floating point"
    n = module.weight.dim() - 2  # the forward reads the weights, never kernel_size
    for attr in ("kernel_size", "stride", "dilation") + (() if isinstance(module.padding, str) else ("padding",)):
        if _per_axis(getattr(module, attr), n) is None:
            return (f"{name} has {attr} {getattr(module, attr)!r}, not a whole number or one per axis of its "
                    f"{n}-d kernel; make the conv anew with that {attr}")
    shape = (module.out_channels, module.in_channels // module.groups, *_per_axis(module.kernel_size, n))
    if tuple(module.weight.shape) != shape or (module.bias is not None and tuple(module.bias.shape) != shape[:1]):
        got = tuple(module.weight.shape) if tuple(module.weight.shape) != shape else f"bias {tuple(module.bias.shape)}"
        return (f"{name} has weights of shape {got}, not the {shape} of its out_channels, in_channels / groups and "
                "kernel_size (set after it was made?); make the conv anew with the sizes of its weights")
    if module._forward_hooks or module._forward_pre_hooks:
        return (
            f"{name} has forward hooks (e.g. weight_norm or spectral_norm) whose effect the attention "
            "layer would lose; remove them first (e.g. torch.nn.utils.remove_weight_norm)"
        )
    return None


def _per_axis(value: object, n: int) -> tuple[int, ...] | None:
    """A conv's kernel_size, stride, dilation or padding as one whole number per axis, as its forward reads it (a
    bare int, numpy's included, set after the conv was made, counts for every axis), or None when it is neither."""
    def whole(v: object) -> bool:
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    if whole(value):
        return (int(value),) * n
    if isinstance(value, (tuple, list)) and len(value) == n and all(whole(v) for v in value):
        return tuple(int(v) for v in value)
    return None


def _conv_padding(conv: nn.Module) -> tuple[tuple[int, int], ...]:
    """Per-axis (low, high) padding of a conv, as nn.ConvNd's forward applies it (incl. 'same'/'valid'): from
    `padding` for zeros, from `_reversed_padding_repeated_twice` (set when the conv was made) for the other modes,
    whatever `padding` was set to since."""
    n = conv.weight.dim() - 2
    if conv.padding_mode != "zeros":
        r = conv._reversed_padding_repeated_twice  # (last axis low, high, ..., first axis low, high)
        return tuple((int(r[2 * (n - 1 - i)]), int(r[2 * (n - 1 - i) + 1])) for i in range(n))
    if conv.padding == "valid":
        return ((0, 0),) * n
    if conv.padding == "same":  # total dilation*(K-1); the odd pixel goes to the high side
        totals = [d * (k - 1) for d, k in zip(_per_axis(conv.dilation, n), conv.weight.shape[2:])]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((p, p) for p in _per_axis(conv.padding, n))


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

    Refused (AttnconvError, with the fix), by the rule `cnn_to_attention` applies too
    (`unconvertible_reason`): a subclass with its own `forward` or `_conv_forward` (whatever
    it computes, it is not the plain convolution the attention layer reproduces), a lazy
    uninitialized conv, integer weights, and forward hooks or pre-hooks.
    """
    if isinstance(conv, torch.jit.ScriptModule) or torch_compiled(conv):  # no _ConvNd: said before "not a conv"
        raise AttnconvError(f"conv_to_attention: {unconvertible_reason(conv)}")
    if not isinstance(conv, _ConvNd) or isinstance(conv, _ConvTransposeNd):
        raise AttnconvError(f"conv_to_attention takes nn.Conv1d/2d/3d, got {type(conv).__name__}")
    reason = unconvertible_reason(conv)
    if reason is not None:
        raise AttnconvError(f"conv_to_attention: {reason}")
    if conv.in_channels < 1 or conv.out_channels < 1:
        raise AttnconvError(
            f"conv_to_attention needs at least one input and one output channel, got {type(conv).__name__} with "
            f"in_channels={conv.in_channels}, out_channels={conv.out_channels}; build the conv with both >= 1"
        )
    weight = conv.weight.detach()  # (C_out, C_in / groups, *K)
    ndim = weight.dim() - 2
    learnable = flag_argument(learnable, "learnable")
    key_dim = check_key_dim(key_dim, learnable)
    extra = {"key_dim": key_dim} if learnable else {}
    layer = (LearnableConvAttention if learnable else ConvAttention)(
        conv.in_channels,
        conv.out_channels,
        _per_axis(conv.kernel_size, ndim),
        stride=_per_axis(conv.stride, ndim),
        padding=_conv_padding(conv),
        dilation=_per_axis(conv.dilation, ndim),
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
