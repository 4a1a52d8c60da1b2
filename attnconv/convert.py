"""Whole networks: replace every convolution of a CNN by its exact attention layer (Theorem 1).

`cnn_to_attention(model)` returns a deep copy of `model` in which each `nn.Conv1d/2d/3d`,
at any depth, is the `ConvAttention` of `construct.conv_to_attention`: one head per
kernel tap, quadratic positional scores (Lemma 2), value maps W_val^h W_out^h = W[:, :, tap_h]^T
(Lemma 1). Everything else is the same module object the copy made, so the converted
network computes the original's function up to the softmax leakage (about float32
rounding at the default alpha) and calls no convolution op.

With `fold_bn=True` a BatchNorm that directly consumes a convolution's output is folded
into that attention layer's value maps and bias (inference only, see `cnn_to_attention`),
so a ResNet becomes attention, residual additions, ReLUs, pooling and a Linear head.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.lazy import LazyModuleMixin

from attnconv.construct import ConvAttention, check_key_dim, conv_to_attention
from attnconv.errors import AttnconvError

__all__ = ["ConversionReport", "cnn_to_attention", "conversion_report"]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
# BatchNorm forwards we know compute (x - running_mean) / sqrt(running_var + eps) * weight + bias in eval.
_BN_FORWARDS = (_BatchNorm.forward, nn.SyncBatchNorm.forward)


def cnn_to_attention(
    model: nn.Module, *, fold_bn: bool = False, strict: bool = True, alpha: float | None = None,
    learnable: bool = False, key_dim: int = 0,
) -> nn.Module:
    """A deep copy of `model` with every convolution replaced by its exact attention layer.

    Every `nn.Conv1d`, `nn.Conv2d` and `nn.Conv3d` at any depth (inside `nn.Sequential`,
    `nn.ModuleList`, `nn.ModuleDict`, custom modules, or the model itself) becomes the
    `ConvAttention` of `conv_to_attention(conv, alpha=alpha)` (Theorem 1): any kernel size,
    stride, padding, dilation, groups (depthwise included) and padding_mode, exactly. A
    conv shared by several parents becomes one shared attention layer. All other modules
    are untouched; `model` itself is not modified. The copy keeps each module's train/eval
    mode, device, dtype and `requires_grad`. `alpha` defaults per conv to
    `default_alpha(dtype, ndim)`, which puts the softmax leakage below the dtype's rounding.

    `learnable=True` makes every layer a `LearnableConvAttention`: the same function at
    the same alpha, but each head's center and width are parameters, so the network can
    be trained further as an attention network that starts from the CNN (what
    `attnconv train --init-from` does). Pass a small `alpha` (1 to 4) for gradients
    that move the heads; the network then starts close to, not equal to, the CNN. With
    `key_dim` > 0 (learnable only) every layer of more than one head (a kernel larger than
    1x1) also gets content attention with that query/key width per head, starting at zero
    (so the network starts as without it); 1x1 convolutions stay position-only.

    Modules that cannot be converted faithfully: `nn.ConvTranspose*`, an uninitialized
    `nn.LazyConv*`, a conv subclass that overrides `forward` or `_conv_forward` (its
    computation is not the one Theorem 1 reproduces), and a conv with forward hooks or
    pre-hooks (e.g. the old `weight_norm`/`spectral_norm`, whose effect would be lost).
    With `strict=True` they raise one `AttnconvError` naming each module's path; with
    `strict=False` each is left as it is and named in a `warnings.warn`. Convolutions
    called functionally (`F.conv2d` inside a custom `forward`) are not modules and are not
    seen; check with a `TorchDispatchMode` that records ops (as the tests do). A conv with
    a parametrization (`torch.nn.utils.parametrize`) is converted with its current weight.

    `fold_bn=True` first finds each BatchNorm{1,2,3}d (or SyncBatchNorm) that directly
    consumes a convolution's output, then folds it into the converted layer,

        W' = W * gamma / sqrt(var + eps)         (per output channel, all heads),
        b' = (b - mean) * gamma / sqrt(var + eps) + beta      (b = 0 without a conv bias),

    and replaces the BatchNorm by `nn.Identity`. This uses the running statistics, so it
    is valid for inference only: a folded network no longer normalizes with batch
    statistics in training. Every BatchNorm to fold must be in eval mode (`model.eval()`
    first; else AttnconvError) and track running statistics. Patterns detected:

    - consecutive children (conv, bn) of an `nn.Sequential` whose `forward` is the
      standard one: a ResNet's `shortcut`/`downsample` = Sequential(conv, bn), a stem
      Sequential(conv, bn, relu), VGG-style feature stacks;
    - a conv and a BatchNorm called by the same module's `forward` where the BatchNorm's
      only input is the conv's output and nothing else uses that output: attribute pairs
      such as `conv1`/`bn1`, `conv2`/`bn2` in a ResNet block, also inside a ModuleList.
      This is checked on the module's `forward` with `torch.fx` (all submodules as leaves),
      not guessed from names, so pre-activation blocks (`conv1(relu(bn1(x)))`) are not
      folded. A module whose `forward` cannot be traced has its pairs left unfolded, with
      a warning when it has conv and BatchNorm children.

    A pair is folded only if the conv and the BatchNorm each appear once in the module
    tree, the conv is converted, and the channel counts agree. Any BatchNorm not folded
    stays in place, and the converted network is still exact.
    """
    if not isinstance(model, nn.Module):
        raise AttnconvError(f"cnn_to_attention takes an nn.Module, got {type(model).__name__}")
    if alpha is not None and not (isinstance(alpha, (int, float)) and alpha > 0 and alpha < float("inf")):
        raise AttnconvError(f"alpha must be a positive finite number or None, got {alpha!r}")
    check_key_dim(key_dim, learnable)  # here too: a model of 1x1 convs only never passes it on
    converted = copy.deepcopy(model)
    paths = _module_paths(converted)  # id -> first path (the one named_modules gives)

    # 1. Which convolutions convert, and which must be refused.
    problems: list[str] = []
    convs: dict[int, nn.Module] = {}
    for module in converted.modules():
        if not isinstance(module, _ConvNd):
            continue
        reason = _unconvertible(module)
        if reason is None:
            convs[id(module)] = module
        else:
            problems.append(f"{_label(paths[id(module)], module)}: {reason}")
    if problems and strict:
        more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:])})" if len(problems) > 1 else ""
        raise AttnconvError(
            f"{problems[0]}{more}. Pass strict=False to leave such modules as they are (the result then "
            "still calls a convolution there)"
        )
    for problem in problems:
        warnings.warn(f"cnn_to_attention left {problem}", stacklevel=2)

    # 2. Convert (and fold BatchNorms into the converted layers).
    replaced: dict[int, nn.Module] = {}
    for key, conv in convs.items():
        try:
            taps = math.prod(conv.kernel_size)
            layer = conv_to_attention(conv, alpha=alpha, learnable=learnable, key_dim=key_dim if taps > 1 else 0)
        except AttnconvError as err:  # not expected after _unconvertible; say which module
            raise AttnconvError(f"{_label(paths[key], conv)}: {err}") from None
        layer.train(conv.training)
        layer.requires_grad_(conv.weight.requires_grad)  # value maps (and learnable positions) as the weight
        if layer.out_bias is not None:
            layer.out_bias.requires_grad_(conv.bias.requires_grad)
        replaced[key] = layer
    if fold_bn:
        for conv, bn in _conv_bn_pairs(converted, convs, paths):
            if bn.training:
                raise AttnconvError(
                    f"{_label(paths[id(bn)], bn)}: fold_bn folds the running statistics, which is only valid "
                    "for inference; call model.eval() before cnn_to_attention(..., fold_bn=True)"
                )
            _fold_bn(replaced[id(conv)], bn)
            replaced[id(bn)] = nn.Identity().train(bn.training)

    # 3. Swap the modules in place in the copy (every reference, so sharing is kept).
    if id(converted) in replaced:
        return replaced[id(converted)]
    for parent in converted.modules():
        for name, child in parent._modules.items():
            if child is not None and id(child) in replaced:
                parent._modules[name] = replaced[id(child)]
    return converted


# ----------------------------------------------------------------------------------------
# What converts
# ----------------------------------------------------------------------------------------


def _unconvertible(module: nn.Module) -> str | None:
    """Why a `_ConvNd` cannot be replaced by Theorem 1's layer, with the fix; None if it can."""
    name = type(module).__name__
    if isinstance(module, nn.modules.conv._ConvTransposeNd):
        return (
            f"{name} is a transposed convolution, which conv_to_attention does not construct; "
            "replace it by an upsampling + Conv, or keep it"
        )
    if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
        return f"{name} is lazy and uninitialized; run the model once on an input before converting"
    base = next((c for c in _CONVS if isinstance(module, c)), None)
    if base is None:
        return f"{name} is not a Conv1d/2d/3d"
    if type(module).forward is not base.forward or type(module)._conv_forward is not base._conv_forward:
        return (
            f"{name} subclasses {base.__name__} with its own forward, which the attention layer would not "
            "reproduce; convert it by hand with conv_to_attention if it computes a plain convolution"
        )
    if not module.weight.is_floating_point():
        return f"{name} has {module.weight.dtype} weights; the attention layer needs floating point"
    if module._forward_hooks or module._forward_pre_hooks:
        return (
            f"{name} has forward hooks (e.g. weight_norm or spectral_norm) whose effect the attention "
            "layer would lose; remove them first (e.g. torch.nn.utils.remove_weight_norm)"
        )
    return None


# ----------------------------------------------------------------------------------------
# Conv -> BatchNorm pairs
# ----------------------------------------------------------------------------------------


class _ChildrenAsLeaves(torch.fx.Tracer):
    """Trace only a module's own forward: every submodule call is one opaque node."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


def _conv_bn_pairs(
    root: nn.Module, convs: dict[int, nn.Module], paths: dict[int, str]
) -> list[tuple[nn.Module, nn.Module]]:
    """The (conv, bn) pairs where bn consumes only conv's output (see cnn_to_attention)."""
    refs = _reference_counts(root)

    def foldable(conv: Any, bn: Any) -> bool:
        return (
            id(conv) in convs
            and isinstance(bn, _BatchNorm)
            and type(bn).forward in _BN_FORWARDS
            and refs.get(id(conv)) == 1
            and refs.get(id(bn)) == 1
            and bn.track_running_stats
            and bn.running_mean is not None
            and not (isinstance(bn, LazyModuleMixin) and bn.has_uninitialized_params())
            and bn.num_features == conv.out_channels
        )

    pairs: list[tuple[nn.Module, nn.Module]] = []
    untraced: list[str] = []
    for module in root.modules():
        if isinstance(module, (_ConvNd, _BatchNorm, nn.ModuleList, nn.ModuleDict)):
            continue
        if type(module).forward is nn.Sequential.forward:  # runs its children in order
            children = list(module._modules.values())
            pairs += [(a, b) for a, b in zip(children, children[1:]) if foldable(a, b)]
            continue
        subs = list(module.modules())[1:]
        if not (any(id(m) in convs for m in subs) and any(isinstance(m, _BatchNorm) for m in subs)):
            continue
        try:
            graph = _ChildrenAsLeaves().trace(module)
        except Exception:  # data-dependent control flow, unsupported ops, ...: do not guess
            direct = module._modules.values()
            if any(id(m) in convs for m in direct) and any(isinstance(m, _BatchNorm) for m in direct):
                untraced.append(_label(paths[id(module)], module))
            continue
        calls = [n for n in graph.nodes if n.op == "call_module"]
        times = {}
        for n in calls:
            times[n.target] = times.get(n.target, 0) + 1
        for n in calls:
            if len(n.args) != 1 or n.kwargs or not isinstance(n.args[0], torch.fx.Node):
                continue
            src = n.args[0]
            if src.op != "call_module" or len(src.users) != 1 or times[n.target] != 1 or times[src.target] != 1:
                continue
            conv, bn = module.get_submodule(src.target), module.get_submodule(n.target)
            if foldable(conv, bn):
                pairs.append((conv, bn))
    if untraced:
        warnings.warn(
            "fold_bn: could not trace the forward of " + ", ".join(untraced) + " with torch.fx to check which "
            "BatchNorm consumes which conv; their BatchNorms are left in place (the result is still exact)",
            stacklevel=3,
        )
    seen: set[int] = set()
    unique = []
    for conv, bn in pairs:  # each conv and each BatchNorm folds at most once
        if id(conv) not in seen and id(bn) not in seen:
            seen.update((id(conv), id(bn)))
            unique.append((conv, bn))
    return unique


@torch.no_grad()
def _fold_bn(layer: ConvAttention, bn: _BatchNorm) -> None:
    """Fold an eval-mode BatchNorm that follows `layer` into its value maps and bias."""
    stats = {"device": "cpu", "dtype": torch.float64}  # per-channel vectors: fold in float64
    mean = bn.running_mean.to(**stats)
    inv_std = torch.rsqrt(bn.running_var.to(**stats) + bn.eps)
    gamma = bn.weight.to(**stats) if bn.weight is not None else torch.ones_like(mean)
    beta = bn.bias.to(**stats) if bn.bias is not None else torch.zeros_like(mean)
    scale = gamma * inv_std  # (C_out,)
    bias = layer.out_bias.to(**stats) if layer.out_bias is not None else torch.zeros_like(mean)
    new_bias = (bias - mean) * scale + beta
    w = layer.out_weight  # (heads, C_out, C_in / groups)
    w.copy_((w.to(**stats) * scale[None, :, None]).to(w.dtype))
    if layer.out_bias is None:
        layer.out_bias = nn.Parameter(
            new_bias.to(device=w.device, dtype=w.dtype), requires_grad=w.requires_grad
        )
    else:
        layer.out_bias.copy_(new_bias)


# ----------------------------------------------------------------------------------------
# Module-tree helpers
# ----------------------------------------------------------------------------------------


def _module_paths(root: nn.Module) -> dict[int, str]:
    return {id(m): name for name, m in root.named_modules()}


def _reference_counts(root: nn.Module) -> dict[int, int]:
    """How many (parent, attribute) slots hold each module (1 for an unshared module)."""
    counts: dict[int, int] = {id(root): 1}
    for parent in root.modules():
        for child in parent._modules.values():
            if child is not None:
                counts[id(child)] = counts.get(id(child), 0) + 1
    return counts


def _label(path: str, module: nn.Module) -> str:
    return f"{path or '<root>'} ({type(module).__name__})"


# ----------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------


@dataclass
class ConversionReport:
    """What `cnn_to_attention` did, by module path (paths of the original model)."""

    converted: list[str] = field(default_factory=list)  # convs now ConvAttention
    folded_bn: list[str] = field(default_factory=list)  # BatchNorms now nn.Identity
    kept_convs: list[str] = field(default_factory=list)  # conv modules still there (strict=False)
    kept_bn: list[str] = field(default_factory=list)  # BatchNorms not folded
    heads: int = 0  # attention heads in all converted layers
    params_before: int = 0
    params_after: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def conversion_report(original: nn.Module, converted: nn.Module) -> ConversionReport:
    """Compare a model with `cnn_to_attention(model, ...)` path by path."""
    after = dict(converted.named_modules())
    report = ConversionReport(
        params_before=sum(p.numel() for p in original.parameters()),
        params_after=sum(p.numel() for p in converted.parameters()),
    )
    for path, module in original.named_modules():
        new = after.get(path)
        if isinstance(module, _ConvNd):
            if isinstance(new, ConvAttention):
                report.converted.append(path)
                report.heads += new.heads
            else:
                report.kept_convs.append(path)
        elif isinstance(module, _BatchNorm):
            (report.folded_bn if isinstance(new, nn.Identity) else report.kept_bn).append(path)
    return report
