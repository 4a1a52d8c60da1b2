"""A converted layer with content attention: the folded SDPA forward against the plain formulation.

`LearnableConvAttention(key_dim > 0)` (what `attnconv train --init-from --init-content`
trains) computes its attention with one `scaled_dot_product_attention` call in which
Lemma 2's positional score is folded into the dot product (see its docstring). The
plain formulation builds the (B, heads, T_out, P) score matrix (`padded_scores`),
takes its softmax and multiplies by the values. Both run on the same layer and input:
forward + backward of `(y * g).sum()` with a fixed random g, one warm-up each, then
interleaved repeats (A B, B A, ...); the medians and their ratio are printed. Before
timing, both outputs are compared with the plain formulation run in float64. With
`--memory`, each variant runs alone in a fresh process and reports its peak resident
memory (VmHWM) during the step above the level before it.

With `--precision SIDE,SIDE,...`, nothing is timed: for one input of each side, the
float32 layer's output is compared with the same layer in float64 (exact to ~1e-12 at
these sizes, where the float64 score matrix of the plain formulation would not fit in
memory), next to the same comparison for the layer without content.

    python benchmarks/content_conv_attention.py [--batch 32] [--side 28] [--channels 16]
        [--key-dim 8] [--repeats 5] [--memory] [--precision 28,64,128,224]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

from attnconv.construct import conv_to_attention


def build(args):
    torch.manual_seed(0)
    conv = nn.Conv2d(args.channels, args.channels, 3, padding=1)
    layer = conv_to_attention(conv, alpha=3.0, learnable=True, key_dim=args.key_dim)
    with torch.no_grad():  # a trained-looking layer: content on, heads moved a little
        layer.query.weight.normal_(0, 0.3)
        layer.positions.center.add_(0.3 * torch.randn_like(layer.positions.center))
    x = torch.randn(args.batch, args.channels, args.side, args.side)
    g = torch.randn(args.batch, args.channels, args.side, args.side)
    return layer, x, g


def plain(layer, x):
    """softmax(position + content scores over the padded grid) @ tokens, then the value maps."""
    z = layer._pad(x)
    probs = layer.padded_scores(x)["combined"].softmax(-1).to(x.dtype)  # (B, heads, T_out, P)
    avg = probs @ z.flatten(2).transpose(1, 2)[:, None]  # (B, heads, T_out, C_in)
    maps, bias = layer.value_maps()
    y = torch.einsum("bhtc,hoc->bot", avg, maps) + bias[:, None]
    return y.reshape(x.shape[0], -1, *layer.output_size(x.shape[2:]))


VARIANTS = {"folded-sdpa": lambda layer, x: layer(x), "plain": plain}


def step(fn, layer, x, g):
    layer.zero_grad(set_to_none=True)
    (fn(layer, x) * g).sum().backward()


def precision(sides: list[int], args) -> None:
    """Relative error (Frobenius) of float32 outputs against float64, with and without content."""
    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())

    print(f"float32 against float64, 3x3 conv {args.channels}->{args.channels}, key_dim {args.key_dim}, "
          f"alpha 3, heads moved, random queries (the timed layer), batch 1")
    for side in sides:
        args.side, args.batch = side, 1
        layer, x, _ = build(args)
        position_only = conv_to_attention(nn.Conv2d(args.channels, args.channels, 3, padding=1), alpha=3.0,
                                          learnable=True)
        position_only.load_state_dict(layer.state_dict(), strict=False)
        with torch.no_grad():
            content = rel(layer(x), copy.deepcopy(layer).double()(x.double()))
            plain32 = rel(position_only(x), copy.deepcopy(position_only).double()(x.double()))
        print(f"  {side:4d}x{side:<4d} with content {content:.1e}   position only {plain32:.1e}")


def vm_hwm() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
    return 0


def reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--side", type=int, default=28)
    p.add_argument("--channels", type=int, default=16)
    p.add_argument("--key-dim", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--memory", action="store_true", help="peak memory of each variant in a fresh process")
    p.add_argument("--precision", help="comma-separated sides: float32 error against float64 only, no timing")
    p.add_argument("--only", choices=list(VARIANTS), help=argparse.SUPPRESS)  # the memory subprocess
    args = p.parse_args()

    if args.precision:
        precision([int(n) for n in args.precision.split(",")], args)
        return

    if args.only:  # one variant alone: warm-up, then the measured step
        layer, x, g = build(args)
        step(VARIANTS[args.only], layer, x, g)
        reset_hwm()
        before = vm_hwm()
        step(VARIANTS[args.only], layer, x, g)
        print((vm_hwm() - before) / 2**20)
        return

    print(f"layer: 3x3 conv {args.channels}->{args.channels} as 9 heads, key_dim {args.key_dim}, "
          f"input {args.batch}x{args.channels}x{args.side}x{args.side}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    layer, x, g = build(args)
    with torch.no_grad():
        ref64 = plain(copy.deepcopy(layer).double(), x.double())
        for name, fn in VARIANTS.items():
            err = (fn(layer, x).double() - ref64).abs().max() / ref64.abs().max()
            print(f"  {name:12s} err vs fp64 {err:.1e}")
    times = {name: [] for name in VARIANTS}
    for fn in VARIANTS.values():
        step(fn, layer, x, g)  # warm-up
    order = list(VARIANTS)
    for r in range(args.repeats):
        for name in order if r % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            step(VARIANTS[name], layer, x, g)
            times[name].append(time.perf_counter() - t)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        print(f"  {name:12s} forward+backward median {med[name]:.3f} s (min {min(ts):.3f}, max {max(ts):.3f})")
    print(f"  plain / folded-sdpa time: {med['plain'] / med['folded-sdpa']:.2f}x")
    if args.memory:
        mib = {}
        for name in VARIANTS:
            cmd = [sys.executable, __file__, "--only", name, "--batch", str(args.batch), "--side", str(args.side),
                   "--channels", str(args.channels), "--key-dim", str(args.key_dim)]
            mib[name] = float(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()[-1])
            print(f"  {name:12s} peak memory of one step {mib[name]:.0f} MiB (fresh process)")
        print(f"  plain / folded-sdpa memory: {mib['plain'] / max(mib['folded-sdpa'], 1e-9):.1f}x")


if __name__ == "__main__":
    main()
