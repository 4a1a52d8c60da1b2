"""`attnconv express`: show Theorem 1 at work on one convolution.

Builds a random convolution (or loads `weight`/`bias` from a safetensors file), converts
it with `conv_to_attention` into one attention head per kernel tap, runs both on the same
random input, and prints the configuration, the measured error, the error bound, alpha
and the heads' centers. `--plot` draws each head's attention around a middle pixel (2-D).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from safetensors.torch import load
from torch import nn

from attnconv.construct import ConvAttention, conv_to_attention, leakage_bound
from attnconv.construct.geometry import MAX_DENSE
from attnconv.errors import AttnconvError, warnings_ignored
from attnconv.fileio import read_regular
from attnconv.limits import check_memory
from attnconv.plots import check_out, conv_heads_figure, save_figure

_CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_PLOT_FORMATS = (".png", ".svg", ".pdf")


def _int_list(minimum: int, maximum: int | None = None):
    """argparse type: "3" or "3,5,3" -> [3] / [3, 5, 3], every entry >= minimum (and <= maximum)."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer or a comma-separated list, got {text!r}") from None
        if min(values) < minimum or maximum is not None and max(values) > maximum:
            within = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            raise argparse.ArgumentTypeError(f"expected integers {within}, got {text!r}") from None
        return values

    return parse


def _padding(text: str) -> str | list[int]:
    if text in ("same", "valid"):
        return text
    return _int_list(0)(text)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected one positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected one positive integer, got {text!r}") from None
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}") from None
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "express",
        help="convert a convolution into an exactly equivalent attention layer (Theorem 1)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--dim", type=int, choices=(1, 2, 3), default=2, help="spatial dimensions (Conv1d/2d/3d)")
    p.add_argument("--kernel", type=_int_list(1), default=[3], metavar="K[,K..]", help="kernel size (per axis)")
    p.add_argument("--in-channels", type=_positive_int, default=4, metavar="C")
    p.add_argument("--out-channels", type=_positive_int, default=4, metavar="C")
    p.add_argument("--stride", type=_int_list(1, 8192), default=[1], metavar="S[,S..]")  # past any --size
    p.add_argument(
        "--padding",
        type=_padding,
        default=None,
        metavar="P[,P..]|same|valid",
        help="default: dilation*(K-1)//2 per axis (keeps the size at stride 1)",
    )
    p.add_argument("--dilation", type=_int_list(1), default=[1], metavar="D[,D..]")
    p.add_argument("--groups", type=_positive_int, default=1)
    p.add_argument("--padding-mode", choices=("zeros", "reflect", "replicate", "circular"), default="zeros")
    p.add_argument("--dtype", choices=tuple(_DTYPES), default="float64")
    p.add_argument("--alpha", type=_positive_float, default=None, help="softmax width (default: from the dtype)")
    p.add_argument("--size", type=_int_list(1), default=[12], metavar="N[,N..]", help="input side(s) (default 12)")
    p.add_argument(
        "--bias",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="random conv: with bias unless --no-bias; weights file: must agree with the file",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights", type=Path, default=None, metavar="FILE.safetensors", help="load weight (and bias)")
    p.add_argument("--plot", type=Path, default=None, metavar="heads.png",
                   help="draw each head's attention (2-D) into a .png, .svg or .pdf file")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --plot file that attnconv did not write (by default it is refused)")
    p.set_defaults(func=run)


def _per_axis(name: str, values: list[int], dim: int) -> tuple[int, ...]:
    if len(values) == 1:
        return tuple(values) * dim
    if len(values) != dim:
        raise AttnconvError(f"--{name} needs {'1 value' if dim == 1 else f'1 or {dim} values'} for --dim {dim}, got "
                            f"{len(values)}")
    return tuple(values)


def _load_weights(
    path: Path, weight_shape: tuple[int, ...], bias_flag: bool | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Read `weight` (and optional `bias`) from a safetensors file, checked against the flags."""
    if not path.exists():
        raise AttnconvError(f"weights file {path} does not exist")
    if not path.is_file():
        raise AttnconvError(f"weights file {path} is not a regular file")
    try:
        tensors = load(read_regular(path, "give a safetensors file"))
    except AttnconvError:
        raise
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise AttnconvError(f"cannot read {path} as a safetensors file ({type(err).__name__}: {err})") from None
    unknown = sorted(set(tensors) - {"weight", "bias"})
    if "weight" not in tensors or unknown:
        raise AttnconvError(
            f"{path} must hold a tensor 'weight' and optionally 'bias'; found {sorted(tensors) or 'nothing'}"
        )
    weight, bias = tensors["weight"], tensors.get("bias")
    if tuple(weight.shape) != weight_shape:
        raise AttnconvError(
            f"'weight' in {path} has shape {tuple(weight.shape)}, but the flags give {weight_shape} "
            "(out_channels, in_channels/groups, *kernel)"
        )
    if bias is not None and tuple(bias.shape) != (weight_shape[0],):
        raise AttnconvError(f"'bias' in {path} has shape {tuple(bias.shape)}, expected ({weight_shape[0]},)")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and not t.is_floating_point():
            raise AttnconvError(f"'{name}' in {path} has dtype {t.dtype}; expected floating point")
        if t is not None and not bool(t.isfinite().all()):  # the errors and the bound would be NaN, measured nothing
            bad = int((~t.isfinite()).sum())
            raise AttnconvError(f"'{name}' in {path} holds {bad} NaN or infinite value{'s' if bad != 1 else ''}; give "
                                "a convolution's finite weights")
    if bias_flag is True and bias is None:
        raise AttnconvError(f"--bias given but {path} has no 'bias' tensor")
    if bias_flag is False and bias is not None:
        raise AttnconvError(f"--no-bias given but {path} has a 'bias' tensor")
    return weight, bias


def _build_conv(args: argparse.Namespace) -> nn.Module:
    dim = args.dim
    kernel = _per_axis("kernel", args.kernel, dim)
    stride = _per_axis("stride", args.stride, dim)
    dilation = _per_axis("dilation", args.dilation, dim)
    if args.padding is None:
        padding: str | tuple[int, ...] = tuple(d * (k - 1) // 2 for d, k in zip(dilation, kernel))
    elif isinstance(args.padding, str):
        padding = args.padding
    else:
        padding = _per_axis("padding", args.padding, dim)
    for name, channels in (("--in-channels", args.in_channels), ("--out-channels", args.out_channels)):
        if channels % args.groups:
            raise AttnconvError(f"--groups {args.groups} must divide {name} {channels}")
    if padding == "same" and max(stride) > 1:
        raise AttnconvError("--padding same needs --stride 1 (PyTorch rejects 'same' for strided convolutions)")
    with_bias = args.bias if args.weights is None else True
    try:
        conv = _CONVS[dim](
            args.in_channels,
            args.out_channels,
            kernel,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=args.groups,
            bias=with_bias is not False,
            padding_mode=args.padding_mode,
            dtype=_DTYPES[args.dtype],
        )
    except (ValueError, RuntimeError) as err:
        raise AttnconvError(f"invalid convolution: {err}") from None
    if args.weights is not None:
        weight, bias = _load_weights(args.weights, tuple(conv.weight.shape), args.bias)
        conv.weight = nn.Parameter(weight.to(conv.weight.dtype))
        conv.bias = None if bias is None else nn.Parameter(bias.to(conv.weight.dtype))
    return conv


def _plot_heads(attn: ConvAttention, size: tuple[int, ...], path: Path) -> None:
    save_figure(conv_heads_figure(attn, size), path, dpi=120, name="plot", overwrite=True)  # checked in run


def _check_memory(args: argparse.Namespace, size: tuple[int, ...]) -> None:
    """Refuse, before allocating, a run that cannot fit in memory; and a --plot too large to draw.

    Peak memory (elements, batch B = 2): the conv's weight and the attention layer's copy,
    the input and its padded grid, the per-head averages of the attention's einsums
    (B * C_in * heads * T_out, twice: the conv's unfolded input is as large), and the
    outputs of both layers and their difference.
    """
    dim, batch = args.dim, 2
    kernel = _per_axis("kernel", args.kernel, dim)
    stride = _per_axis("stride", args.stride, dim)
    dilation = _per_axis("dilation", args.dilation, dim)
    if args.padding is None or args.padding == "same":
        pad = tuple(d * (k - 1) // 2 for d, k in zip(dilation, kernel))
    elif args.padding == "valid":
        pad = (0,) * dim
    else:
        pad = _per_axis("padding", args.padding, dim)
    heads, padded = math.prod(kernel), math.prod(n + 2 * p for n, p in zip(size, pad))
    out = math.prod(max(1, (n + 2 * p - d * (k - 1) - 1) // s + 1)
                    for n, p, d, k, s in zip(size, pad, dilation, kernel, stride))
    c_in, c_out = args.in_channels, args.out_channels
    elements = (2 * c_out * (c_in // max(args.groups, 1)) * heads + batch * c_in * (math.prod(size) + padded)
                + 2 * batch * c_in * heads * out + 3 * batch * c_out * out)
    check_memory(elements * _DTYPES[args.dtype].itemsize,
                 f"--size {','.join(map(str, args.size))} with a {'x'.join(map(str, kernel))} kernel and "
                 f"{c_in} -> {c_out} channels", "give a smaller --size, fewer channels or a smaller --kernel")
    if args.plot is not None and heads * out * math.prod(size) > MAX_DENSE:
        raise AttnconvError(f"--plot with --size {','.join(map(str, args.size))}: the attention maps would have "
                            f"{heads * out * math.prod(size):,} entries, more than {MAX_DENSE:,}; plot a smaller "
                            "--size (the heads' maps look the same at any size)")


def run(args: argparse.Namespace) -> int:
    from attnconv.cli import one_line

    if args.plot is not None and args.dim != 2:
        raise AttnconvError(f"--plot draws 2-D attention maps only; got --dim {args.dim} (drop --plot or use --dim 2)")
    if args.plot is not None:
        args.plot = check_out(args.plot, "plot", overwrite=args.overwrite)
    size = _per_axis("size", args.size, args.dim)
    _check_memory(args, size)
    torch.manual_seed(args.seed)
    conv = _build_conv(args)
    attn = conv_to_attention(conv, alpha=args.alpha)
    attn.output_size(size)  # a clear error when the input is too small for this conv
    x = torch.randn(2, args.in_channels, *size, dtype=conv.weight.dtype)  # (B, C_in, *size)
    # PyTorch warns that 'same' with an even kernel pads a copy of the input: expected here.
    with torch.no_grad(), warnings_ignored(UserWarning, message=".*padding='same' with even kernel"):
        y_conv, y_attn = conv(x), attn(x)
    diff = y_attn - y_conv
    rel = float(diff.norm() / y_conv.norm().clamp_min(torch.finfo(y_conv.dtype).tiny))
    lam = leakage_bound(attn.alpha, attn.ndim)

    source = f"weights from {args.weights}" if args.weights is not None else f"random weights (seed {args.seed})"
    print(f"convolution   {conv}  [{source}]")
    print(f"input         {tuple(x.shape)} {args.dtype} -> output {tuple(y_conv.shape)}")
    print(f"attention     {attn.heads} heads (one per kernel tap), alpha = {attn.alpha:g}")
    print(f"relative error ||attn(x) - conv(x)|| / ||conv(x)|| = {rel:.3e}")
    print(f"max abs error  {float(diff.abs().max()):.3e}")
    print(
        f"leakage bound  {attn.error_bound(x):.3e}  on max abs error from softmax leakage "
        f"(= 2 lambda ||W||_inf,1 max|x|, lambda = leakage_bound(alpha, {attn.ndim}) = {lam:.3e}); "
        f"float rounding (eps = {torch.finfo(x.dtype).eps:.1e}) comes on top"
    )
    print("head  center (Delta_h)")
    for h, center in enumerate(attn.centers.tolist()):
        print(f"{h + 1:4d}  {tuple(center)}")  # heads numbered from 1, as in the figures
    if args.plot is not None:
        _plot_heads(attn, size, args.plot)
        print(f"wrote {one_line(str(args.plot))}")
    return 0
