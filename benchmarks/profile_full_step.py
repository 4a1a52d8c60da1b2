"""Where one training step of an attention model spends its time (CPU), op by op.

Default: the paper's CIFAR-shape SA-quadratic model (6 layers, hidden 400, 9 heads, 16x16
tokens), batch 100, SGD. `--preset-grid N`: the Fashion-MNIST attention preset's model
(hidden 96, 4 layers, 9 heads) at N x N tokens (7: 28x28 / 4, 14: 28x28 / 2, 16: 32x32 / 2,
32: 32x32 / 1, as in `attnconv bench --only grid`), batch 128, AdamW. One warm-up step, then
one step under `torch.profiler`; prints the ops with the most self time, their share and,
with --shapes, their input shapes. (The profiler slows the step down: read the shares.)

    python benchmarks/profile_full_step.py [--impl auto|dense|separable|stacked|fused] [--batch 100] [--top 12]
    python benchmarks/profile_full_step.py --preset-grid 14 --shapes --threads 2
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import profile

from attnconv.bench.grid import GRIDS
from attnconv.config import make_config
from attnconv.models import build_model
from attnconv.training.schedule import make_optimizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="separable", choices=("auto", "dense", "separable", "stacked", "fused"))
    p.add_argument("--preset-grid", type=int, choices=[g for g, _, _ in GRIDS],
                   help="the Fashion-MNIST attention preset at this many tokens a side (default: the paper's model)")
    p.add_argument("--batch", type=int, help="default 100 (paper), 128 (preset)")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--shapes", action="store_true", help="one line per op and input shapes")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    if args.preset_grid is None:
        model, batch, shape = build_model("sa-quadratic", impl=args.impl), args.batch or 100, (3, 32, 32)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        _, side, factor = next(g for g in GRIDS if g[0] == args.preset_grid)
        cfg = make_config(preset="fmnist-sa-quadratic")
        model = build_model("sa-quadratic", **{**cfg.model_overrides, "in_channels": 1, "image_size": side,
                                               "downsample": factor, "impl": args.impl})
        batch, shape, opt = args.batch or 128, (1, side, side), make_optimizer(model, cfg)
    x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step()  # warm-up
    with profile(record_shapes=args.shapes) as prof:
        step()
    events = prof.key_averages(group_by_input_shape=args.shapes)
    total = sum(e.self_cpu_time_total for e in events)
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        shapes = f"  {e.input_shapes}" if args.shapes else ""
        print(f"{e.key:30s} {e.self_cpu_time_total / 1e6:7.3f} s  {100 * e.self_cpu_time_total / total:5.1f}%{shapes}")
    print(f"{'total self time':30s} {total / 1e6:7.3f} s")


if __name__ == "__main__":
    main()
