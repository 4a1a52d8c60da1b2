"""Whole networks: replace every convolution of a CNN by its exact attention layer (Theorem 1).

`cnn_to_attention(model)` returns a deep copy of `model` in which each `nn.Conv1d/2d/3d`,
at any depth, is the `ConvAttention` of `construct.conv_to_attention`: one head per
kernel tap, quadratic positional scores (Lemma 2), value maps W_val^h W_out^h = W[:, :, tap_h]^T
(Lemma 1). Everything else is the same module object the copy made, so the converted
network computes the original's function up to the softmax leakage (about float32
rounding at the default alpha) and calls no convolution op: convolutions that a module's
forward calls as functions (F.conv2d) are found on one forward pass and refused (`strict`)
or named in a warning.

With `fold_bn=True` a BatchNorm that directly consumes a convolution's output is folded
into that attention layer's value maps and bias (inference only, see `cnn_to_attention`),
so a ResNet becomes attention, residual additions, ReLUs, pooling and a Linear head.
"""

from __future__ import annotations

import copy
import math
import re
import sys
import threading
import warnings
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.lazy import LazyModuleMixin
from torch.utils._python_dispatch import TorchDispatchMode

from attnconv.construct.bound import MAX_ALPHA
from attnconv.construct.conv_attention import ConvAttention
from attnconv.construct.factory import conv_to_attention, torch_compiled, unconvertible_reason
from attnconv.construct.learnable import check_key_dim
from attnconv.construct.reads import ConvParameterRead, refused_reads
from attnconv.errors import AttnconvError
from attnconv.limits import flag_argument, real_number

__all__ = ["cnn_to_attention"]

# BatchNorm forwards we know compute (x - running_mean) / sqrt(running_var + eps) * weight + bias in eval.
_BN_FORWARDS = (_BatchNorm.forward, nn.SyncBatchNorm.forward)


def cnn_to_attention(
    model: nn.Module, *, fold_bn: bool = False, strict: bool = True, alpha: float | None = None,
    learnable: bool = False, key_dim: int = 0, example_input: Any = None,
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

    Modules that cannot be converted faithfully (`construct.unconvertible_reason`, the rule
    `conv_to_attention` applies too): `nn.ConvTranspose*`, an uninitialized `nn.LazyConv*`,
    a conv subclass that overrides `forward` or `_conv_forward` (its computation is not the
    one Theorem 1 reproduces), and a conv with forward hooks or pre-hooks (e.g. the old
    `weight_norm`/`spectral_norm`, whose effect would be lost). With `strict=True` they
    raise one `AttnconvError` naming the modules' paths, a line per reason; with
    `strict=False` each is left as it is and named in a `warnings.warn` (one per reason).
    A conv with a parametrization (`torch.nn.utils.parametrize`) is converted with its
    current weight.

    Convolutions a module's own `forward` calls as functions (`F.conv2d(x, self.filt)`, an
    anti-aliasing blur) are no modules to replace. They are found on one forward pass of the
    converted network under a `TorchDispatchMode` that records aten's convolution ops and
    the innermost module running each: on `example_input` (a tensor, or a tuple of the
    positional inputs) right here, in eval mode and without gradients (the copy's modes,
    buffers and the CPU random state are left as they were), or else on the copy's first
    forward that is not being traced (torch.compile, torch.export, torch.jit.trace). Those
    modules are refused like the ones above when `strict` (at its first forward: that
    forward, and every later one, raises) and named in a warning otherwise. Give
    `example_input` to have the check done at conversion and leave no hooks on the result
    (`torch.jit.script` does not compile them). The same forward finds the reads of a converted
    layer's `weight` or `bias` (which it does not have) by the network's own modules, in the
    checking thread: refused (or warned of) even where the network went on from them
    (`getattr(conv, "weight", None)`). Not seen: a forward that tests its layers otherwise
    (`isinstance(conv, nn.Conv2d)`, their parameter names); compare outputs on your inputs.

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
    if isinstance(model, torch.jit.ScriptModule) or any(isinstance(m, torch.jit.ScriptModule) for m in model.modules()):
        raise AttnconvError("cnn_to_attention takes an nn.Module, not one compiled by torch.jit.script or traced by "
                            "torch.jit.trace (its modules run TorchScript, not the Python forward the conversion "
                            "replaces); convert the nn.Module first, then script or trace the result")
    compiled = next((name for name, m in model.named_modules() if name and torch_compiled(m)), None)
    if compiled is not None:  # a torch.compile wrapper inside: it runs a graph captured from the module it wraps
        raise AttnconvError(f"cnn_to_attention takes a network without torch.compile'd modules inside ({compiled} "
                            "is one); convert the module it wraps (its _orig_mod) first, then compile the result")
    if alpha is not None:
        alpha = real_number(alpha, "alpha", "the heads' softmax sharpness (None: the dtype's default)", low=0,
                            low_open=True, high=MAX_ALPHA)
    fold_bn, strict = flag_argument(fold_bn, "fold_bn"), flag_argument(strict, "strict")
    learnable = flag_argument(learnable, "learnable")
    key_dim = check_key_dim(key_dim, learnable)  # here too: a model of 1x1 convs only never passes it on
    example = _example_args(example_input)
    converted = copy.deepcopy(model)
    paths = _module_paths(converted)  # id -> first path (the one named_modules gives)

    # 1. Which convolutions convert, and which must be refused.
    problems: dict[str, list[str]] = {}  # reason -> module paths
    convs: dict[int, nn.Module] = {}
    for module in converted.modules():
        if not isinstance(module, _ConvNd):
            continue
        reason = unconvertible_reason(module)
        if reason is None:
            convs[id(module)] = module
        else:
            problems.setdefault(reason, []).append(_label(paths[id(module)], module))
    if problems and strict:
        raise AttnconvError(_refusal(problems, "cannot be converted exactly"))
    for reason, where in problems.items():
        warnings.warn(f"cnn_to_attention left {_listing(where, None)} as they are: {reason}", stacklevel=2)
    # 2. Convert (and fold BatchNorms into the converted layers).
    replaced: dict[int, nn.Module] = {}
    for key, conv in convs.items():
        try:
            taps = math.prod(conv.weight.shape[2:])  # the forward reads the weights, not kernel_size
            layer = conv_to_attention(conv, alpha=alpha, learnable=learnable, key_dim=key_dim if taps > 1 else 0)
        except AttnconvError as err:  # not expected after unconvertible_reason; say which module
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
        converted = replaced[id(converted)]
    for parent in converted.modules():
        for name, child in parent._modules.items():
            if child is not None and id(child) in replaced:
                parent._modules[name] = replaced[id(child)]

    # 4. Convolutions that are no module (F.conv2d in a forward): one forward pass finds them.
    if example is not None:
        _refuse_or_warn(*_conv_ops_of_forward(converted, example), strict)
    else:
        _OpCheck(strict).install(converted)
    return converted


# ----------------------------------------------------------------------------------------
# What converts
# ----------------------------------------------------------------------------------------


_KEEP = "pass strict=False to leave such modules as they are (the network then still runs a convolution there)"
_DIRECT_CONV = (
    "its own forward calls a convolution op (F.conv1d/2d/3d or the like), which is no conv module "
    "cnn_to_attention could replace; make that convolution an nn.Conv module of the network"
)
_LISTED = 8  # module paths an error shows per reason (a warning shows them all)


def _refusal(problems: dict[str, list[str]], what: str) -> str:
    """One refusal for every module that has a problem, grouped by reason: a line per reason."""
    total = sum(len(labels) for labels in problems.values())
    if total == 1:
        (reason, (label,)), = problems.items()
        return f"{label}: {reason}; {_KEEP}"
    lines = [f"cnn_to_attention: {total} modules {what}; {_KEEP}:"]
    for reason, labels in problems.items():
        lines.append(f"  {_listing(labels, _LISTED)}: {reason}")
    return "\n".join(lines)


def _listing(labels: list[str], limit: int | None) -> str:
    if limit is None or len(labels) <= limit:
        return ", ".join(labels)
    return f"{', '.join(labels[:limit])}, ... and {len(labels) - limit} more ({len(labels)} in all)"


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
# Convolutions called as functions
# ----------------------------------------------------------------------------------------

# aten's convolution ops: convolution, _convolution, conv2d, conv_transpose2d, cudnn_convolution,
# mkldnn_convolution, slow_conv3d_forward, _conv_depthwise2d, conv_tbc, quantized conv2d, ...
_CONV_OP = re.compile(r"(^|_)conv(\d|_transpose|_tbc|_depthwise|_dilated|olution)")


def _example_args(example_input: Any) -> tuple[Any, ...] | None:
    if example_input is None:
        return None
    if isinstance(example_input, torch.Tensor):
        return (example_input,)
    if isinstance(example_input, (tuple, list)):
        return tuple(example_input)
    raise AttnconvError(
        f"example_input must be a tensor or a tuple of the network's positional inputs, got "
        f"{type(example_input).__name__}"
    )


class _ConvOpFinder(TorchDispatchMode):
    """Records which modules run a convolution op while active: for each op, the innermost module
    of `root` that was called (through __call__) when it ran. Convolution modules themselves are left
    out (they are refused or kept by name before); `close()` removes the hooks that keep track."""

    def __init__(self, root: nn.Module):
        super().__init__()
        self.paths = _module_paths(root)
        self.stack: list[nn.Module] = [root]
        self.found: dict[int, nn.Module] = {}
        self.thread = threading.get_ident()  # the forward it watches; another thread's calls of the modules are not
        self.handles = []
        for module in root.modules():
            if module is not root:
                self.handles.append(module.register_forward_pre_hook(self._enter))
                self.handles.append(module.register_forward_hook(self._leave, always_call=True))

    def _enter(self, module: nn.Module, args: Any) -> None:
        if threading.get_ident() == self.thread:
            self.stack.append(module)

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() == self.thread and len(self.stack) > 1 and self.stack[-1] is module:
            self.stack.pop()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        top = self.stack[-1]
        if _CONV_OP.search(func.__name__) and not isinstance(top, _ConvNd):
            self.found.setdefault(id(top), top)
        return func(*args, **(kwargs or {}))

    def close(self) -> list[str]:
        """Remove the hooks; the modules that ran a convolution op, as labels."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
        return [_label(self.paths.get(id(m), "?"), m) for m in self.found.values()]


def _conv_ops_of_forward(model: nn.Module, args: tuple[Any, ...]) -> tuple[list[str], list[str]]:
    """The modules of `model` that run a convolution op in one forward on `args` (eval mode, no
    gradients, the CPU random state restored: the pass changes nothing in the model), and the reads of a converted
    layer's weight or bias it refused and the network went on from (`_reads`)."""
    modes = {m: m.training for m in model.modules()}
    finder = _ConvOpFinder(model)
    refused_reads().clear()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model.eval()
            with finder:
                model(*args)
    except Exception as err:
        refused = _refusal_behind(err, model)
        if refused:  # not the input's fault: a module read a replaced conv's weight
            raise AttnconvError(f"cnn_to_attention: {_label(finder.paths.get(id(refused[1]), '?'), refused[1])}: "
                                f"{refused[0]}") from None
        # the model's own error, named as the example's
        first = (str(err).strip().splitlines() or [""])[0]
        what = first if isinstance(err, AttnconvError) else f"{type(err).__name__}: {first}"
        raise AttnconvError(
            f"cnn_to_attention: the converted network failed on example_input ({what}); "
            "give an input the network accepts"
        ) from err
    finally:
        found = finder.close()
        for module, training in modes.items():
            module.training = training
    return found, _reads(finder.paths)


def _reads(paths: dict[int, str]) -> list[str]:
    """The refused reads of a forward that ran on (`getattr(conv, "weight", None)`, hasattr, an except), labelled as
    the check's findings: the network probed a convolution's weight, and computes something else converted."""
    return [f"{_label(paths[id(reader)], reader)}: {words}"  # its own modules' reads (not another network's)
            for words, reader in dict.fromkeys(refused_reads()) if id(reader) in paths]


def _refusal_behind(err: BaseException, model: nn.Module) -> tuple[str, nn.Module] | None:
    """(words, the module that read) where a forward's error is a converted layer's refusal of `weight` or `bias`, or
    Python's own "no attribute" for a property of a module whose getter met one (Python puts its error in the
    refusal's place); None for any other error, the model's own."""
    reads = refused_reads()
    if not reads or not isinstance(err, AttributeError):
        return None
    reader = _innermost_module(err, model)
    if isinstance(err, ConvParameterRead):
        return str(err), reader
    said = re.fullmatch(r"'\w+' object has no attribute '(\w+)'", str(err))
    if said and isinstance(getattr(type(reader), said.group(1), None), property):
        return reads[-1][0], reader
    return None


def _innermost_module(err: BaseException, model: nn.Module) -> nn.Module:
    """The innermost module of `model` whose code the error passed through (its traceback's frames' `self`), leaving
    out the converted layers themselves; `model` if none."""
    modules = {id(m): m for m in model.modules() if not isinstance(m, ConvAttention)}
    found, tb = model, err.__traceback__
    while tb is not None:
        module = modules.get(id(tb.tb_frame.f_locals.get("self")))
        found, tb = module if module is not None else found, tb.tb_next
    return found


def _refuse_or_warn(found: list[str], reads: list[str], strict: bool) -> None:
    """Refuse (`strict`) or warn of the modules that still run a convolution op, and of the reads of a converted
    layer's weight a forward went on from (`getattr(conv, "weight", None)`: it computed something else)."""
    if reads and strict:
        raise AttnconvError(f"cnn_to_attention: {reads[0]}" + (f" (and {len(reads) - 1} more such reads)"
                                                                 if len(reads) > 1 else ""))
    for read in reads:
        warnings.warn(f"cnn_to_attention: the converted network will not compute as the CNN: {read}", stacklevel=3)
    if not found:
        return
    if strict:
        raise AttnconvError(_refusal({_DIRECT_CONV: found}, "still run a convolution"))
    warnings.warn(f"cnn_to_attention kept a convolution in {_listing(found, None)}: {_DIRECT_CONV}", stacklevel=3)


def _being_traced(args: tuple[Any, ...]) -> bool:
    """A forward run by torch.compile, torch.export or torch.jit.trace (fake or traced tensors)."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return True
    return any(isinstance(a, torch.Tensor) and type(a) not in (torch.Tensor, nn.Parameter) for a in args)


class _OpCheck:
    """The check of a converted network given no example_input, on its first eager forward.

    A forward pre-hook and an always-called forward hook on the network: the first forward not
    being traced runs under a `_ConvOpFinder`; then the hooks remove themselves, unless `strict`
    and a module ran a convolution: that forward raises, and so does every later one. Each thread's forward is
    checked under its own finder (a dispatch mode is the thread's own), so first forwards several threads run at once
    are each checked; the hooks go once one has passed and none is still being checked.
    """

    def __init__(self, strict: bool):
        self.strict = strict
        self.checking: dict[int, tuple[_ConvOpFinder, BaseException | None, int]] = {}  # per thread: (finder, the
        # exception being handled around the forward, nested forwards of the root)
        self.passed = False
        self.handles: tuple[Any, ...] = ()
        self.lock = threading.Lock()

    def install(self, root: nn.Module) -> None:
        self.handles = (
            root.register_forward_pre_hook(self.before),
            root.register_forward_hook(self.after, always_call=True),
        )

    def before(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if _being_traced(args):
            return
        thread = threading.get_ident()
        with self.lock:
            if thread in self.checking:  # the root's forward called again inside its own
                finder, handled, depth = self.checking[thread]
                self.checking[thread] = (finder, handled, depth + 1)
                return
            if self.passed:
                return
            finder = _ConvOpFinder(module)
            self.checking[thread] = (finder, sys.exc_info()[1], 0)
        refused_reads().clear()
        finder.__enter__()

    def after(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not self.checking:  # no check in flight; and a forward torch.compile traces, which no thread call may reach
            return
        thread = threading.get_ident()
        with self.lock:
            if thread not in self.checking:
                return
            finder, handled, depth = self.checking[thread]
            if depth:
                self.checking[thread] = (finder, handled, depth - 1)
                return
            del self.checking[thread]
        finder.__exit__(None, None, None)
        found = finder.close()
        # the forward's own error, on its way out (torch calls this hook with no output before it goes on); not the
        # error a caller was handling around the forward (an except block calling it), whatever the forward returned
        failing = sys.exc_info()[1] if output is None else None
        if failing is not None and failing is not handled:
            refused = _refusal_behind(failing, module)
            if refused and not isinstance(failing, ConvParameterRead):
                # a replaced conv's weight read through a property: Python said "no attribute" of the property instead
                failing.add_note(f"attnconv: {refused[0]}")
            return  # the check stays for the next forward
        reads = _reads(finder.paths)
        with self.lock:
            self.passed = self.passed or not ((found or reads) and self.strict)
            if self.passed and not self.checking:
                for handle in self.handles:
                    handle.remove()
        _refuse_or_warn(found, reads, self.strict)
