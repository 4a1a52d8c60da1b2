"""How often `capture_attention`'s token-grid guess reads a layout right, over layouts ViTs use.

Each layout is images of H x W, a patch embedding of side p (exact: p divides both sides; floor: a
convolution without padding; padded: the rounded-up grid, sides 14 and 16 only, as timm pads), and
some leading tokens (none, a class token, a class and a distillation token, 4 registers and a class
token, 8 and one, 16 and one). Its token count goes through `image_tokens` (the reading) and
`close_reading` (the second reading said in a warning). Counted: right and silent, right with a
warning (noise), wrong with a warning (said), wrong and silent (the failures that matter).

    python benchmarks/grid_guess_sweep.py [--show 10]
"""

from __future__ import annotations

import argparse
from collections import Counter

from attnconv.models.captured import close_reading, image_tokens

SIZES = [(s, s) for s in (28, 32, 48, 56, 64, 96, 112, 128, 160, 192, 224, 256, 384)] + [
    (16, 32), (48, 64), (96, 128), (224, 320), (128, 256), (240, 320), (100, 100), (200, 300)]
PATCHES = (4, 7, 8, 14, 16, 32)
LEADING = (0, 1, 2, 5, 9, 17)


def layouts():
    """(H, W, patch, how, leading tokens, the true grid) of every layout swept."""
    for H, W in SIZES:
        for p in PATCHES:
            exact = H % p == 0 and W % p == 0
            grids = [("exact", (H // p, W // p))] if exact else \
                [("floor", (H // p, W // p)), ("padded", (-(-H // p), -(-W // p)))] if p in (14, 16) else []
            for how, grid in grids:
                if grid[0] * grid[1] >= 4:
                    for lead in LEADING:
                        yield H, W, p, how, lead, grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", type=int, default=10, help="how many layouts of each failing kind to list")
    args = parser.parse_args()
    counts, shown = Counter(), {"wrong and silent": [], "right with a warning": []}
    for H, W, p, how, lead, grid in layouts():
        count = lead + grid[0] * grid[1]
        read, other = image_tokens(count, None, (H, W)), close_reading(count, (H, W))
        kind = ("right with a warning" if other else "right and silent") if read == (lead, grid) else \
            ("wrong with a warning" if other else "wrong and silent")
        counts[kind] += 1
        if kind in shown:
            shown[kind].append(f"{H}x{W}, patch {p} ({how}), {lead} leading: read {read}, said {other}")
    print(f"{sum(counts.values())} layouts: " + ", ".join(f"{k} {counts[k]}" for k in (
        "right and silent", "right with a warning", "wrong with a warning", "wrong and silent")))
    for kind, lines in shown.items():
        for line in lines[:args.show]:
            print(f"  {kind}: {line}")


if __name__ == "__main__":
    main()
