"""Where one training step of the paper's full SA-quadratic model spends its time (CPU).

The paper's CIFAR-shape model (6 layers, hidden 400, 9 heads, 16x16 tokens), batch 100,
`impl="separable"`, SGD: one warm-up step, then one step under `torch.profiler`; prints
the ops with the most self time and their share. (The profiler slows the step down, so
read the shares, not the absolute times.)

    python benchmarks/profile_full_step.py [--impl dense] [--batch 100] [--top 12]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import profile

from attnconv.models import build_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="separable", choices=("dense", "separable"))
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()

    torch.manual_seed(0)
    model = build_model("sa-quadratic", impl=args.impl)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step()  # warm-up
    with profile() as prof:
        step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(f"{e.key:55s} {e.self_cpu_time_total / 1e6:7.2f} s  {100 * e.self_cpu_time_total / total:5.1f}%")
    print(f"{'total self time':55s} {total / 1e6:7.2f} s")


if __name__ == "__main__":
    main()
