"""What the tensor-argument checks cost: the same training steps and layer calls with `limits.tensor_argument` as it
is and with it replaced by a function that returns its argument, interleaved in one process.

The checks run once per public call (`SelfAttention2d.forward`, `forward_tokens`, `forward_projected`,
`ConvAttention.forward`): a few attribute reads and comparisons. This times them against the work they guard:
the fmnist-sa-quadratic preset's training step at batch 128 (AdamW, as `attnconv bench` times it), one
SelfAttention2d forward at that size, and one converted 3x3 convolution's forward; each variant `--repeats`
times, alternating, after a warm-up, median reported. The ratio is checked / unchecked (1.00: no cost).

    python benchmarks/tensor_checks.py [--repeats 15] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

import attnconv
from attnconv import limits
from attnconv.attention import layer as layer_module
from attnconv.construct import conv_attention, kernels, learnable
from attnconv.models import build_model

CHECKED_MODULES = (layer_module, conv_attention, kernels, learnable)


@contextmanager
def unchecked():
    """`tensor_argument` as a function that returns its argument, in every module that calls it on a timed path."""
    saved = [(m, m.tensor_argument) for m in CHECKED_MODULES if hasattr(m, "tensor_argument")]
    saved.append((limits, limits.tensor_argument))
    try:
        for module, _ in saved:
            module.tensor_argument = lambda value, *args, **kwargs: value
        yield
    finally:
        for module, function in saved:
            module.tensor_argument = function


def seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def compare(name: str, call: Callable[[], object], repeats: int) -> None:
    call()  # warm-up, each variant
    with unchecked():
        call()
    checked, plain = [], []
    for _ in range(repeats):
        checked.append(seconds(call))
        with unchecked():
            plain.append(seconds(call))
    a, b = statistics.median(checked), statistics.median(plain)
    print(f"{name:44s} {a * 1e3:9.3f} ms {b * 1e3:9.3f} ms {a / b:7.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)

    config = attnconv.make_config(preset="fmnist-sa-quadratic")
    model = build_model(config.model, in_channels=1, num_classes=10, image_size=28, **config.model_overrides)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images, labels = torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()

    layer = attnconv.SelfAttention2d(96, heads=9, max_size=7)
    tokens = torch.randn(128, 96, 7, 7)
    converted = attnconv.conv_to_attention(nn.Conv2d(16, 16, 3, padding=1))
    small = torch.randn(8, 16, 16, 16)
    print(f"torch {torch.__version__}, {args.threads} threads, median of {args.repeats}, interleaved")
    print(f"{'call':44s} {'checked':>12s} {'unchecked':>12s} {'ratio':>7s}")
    compare("sa-quadratic training step, batch 128", step, args.repeats)
    with torch.no_grad():
        compare("SelfAttention2d(96, 9 heads) forward, 128x7x7", lambda: layer(tokens), args.repeats)
        compare("converted 3x3 conv (16 ch) forward, 8x16x16", lambda: converted(small), args.repeats)


if __name__ == "__main__":
    main()
