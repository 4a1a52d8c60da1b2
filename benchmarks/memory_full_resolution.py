# Usage: python benchmarks/memory_full_resolution.py ckpt|plain
# One training step of the paper's full-resolution model (32x32 tokens: downsample 1), 6 layers, batch 100.
import resource
import sys
import time

import torch

from attnconv.models import build_model

torch.manual_seed(0)
ckpt = sys.argv[1] == "ckpt"
m = build_model("sa-quadratic", downsample=1, checkpoint=ckpt)  # impl auto -> separable
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
x, y = torch.randn(100, 3, 32, 32), torch.randint(0, 10, (100,))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
loss = torch.nn.functional.cross_entropy(m(x), y)
opt.zero_grad()
loss.backward()
opt.step()
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"checkpoint={ckpt} step {dt:.1f} s  peak RSS {peak/1e6:.2f} GB (before the step {base/1e6:.2f} GB)  "
      f"loss {loss.item():.3f}")
