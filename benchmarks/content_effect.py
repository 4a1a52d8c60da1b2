"""How much the content attention of an `--init-from --init-content` run changes its attention
(and, for any `--init-from` run, how far its heads moved and how wide they are).

For each converted layer with content attention, over the first N test images: the
total-variation distance between the layer's attention (position + content scores) and
the attention of its positional scores alone, 1/2 sum_k |P(k) - P_pos(k)|, averaged over
images, heads and queries (0: content changes nothing; 1: disjoint), next to the spread
of the content scores (their standard deviation over the keys of a query, averaged; in
logit units, so ~1 reshapes a head's attention), how far the heads have moved from
their kernel taps, and their widths.

    python benchmarks/content_effect.py RUN_DIR [--images 20] [--data-dir DIR]
"""

from __future__ import annotations

import argparse

import torch

from attnconv.construct import ConvAttention
from attnconv.data import normalize
from attnconv.models.sites import site_inputs
from attnconv.runs import Run


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run")
    p.add_argument("--images", type=int, default=20)
    p.add_argument("--data-dir")
    args = p.parse_args()
    run = Run(args.run, data_dir=args.data_dir)
    model, config, sites = run.model, run.config, run.sites
    layers = [(site.path, site.layer, site.size) for site in sites]
    x = normalize(run.test_set.images[: args.images], run.info)  # the first N, as RESULTS.md measured them
    print(f"{args.run}: {config.init_from}; {len(x)} test images")
    print(f"{'layer':28s} {'grid':>6s} {'TV(all, position)':>17s} {'sd content':>10s} {'max moved':>9s} "
          f"{'alpha':>11s}")
    tv = {path: 0.0 for path, _, _ in layers}
    sd = {path: 0.0 for path, _, _ in layers}
    content = any(not layer.position_only for _, layer, _ in layers)
    for batch in x.split(4) if content else ():
        for (path, layer, _size), inp in zip(layers, site_inputs(model, sites, batch)):
            if layer.position_only:
                continue
            both = layer.attention_probs(inp)
            pos = layer.attention_probs(inp, term="position")
            tv[path] += 0.5 * (both - pos).abs().sum(-1).mean().item() * len(batch)
            sd[path] += layer.padded_scores(inp)["content"].std(-1).mean().item() * len(batch)
    for path, layer, size in layers:  # position-only layers (no --init-content): movement and widths only
        moved = (layer.centers - ConvAttention.centers.fget(layer).to(layer.centers)).norm(dim=-1).max().item()
        a = layer.alphas
        tv_sd = (f"{'-':>17s} {'-':>10s}" if layer.position_only else
                 f"{tv[path] / len(x):>17.3f} {sd[path] / len(x):>10.3f}")
        print(f"{path:28s} {size[0]:>3d}x{size[1]:<2d} {tv_sd} {moved:>9.3f} "
              f"{a.min().item():>5.2f}-{a.max().item():<5.2f}")


if __name__ == "__main__":
    main()
