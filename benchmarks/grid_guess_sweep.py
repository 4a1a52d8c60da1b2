"""How often `capture_attention`'s token-grid guess reads a layout right, over layouts ViTs use.

Each layout is images of H x W, a patch embedding of side p (exact: p divides both sides; floor: a
convolution without padding; padded: the rounded-up grid, sides 14 and 16 only, as timm pads), and
some leading tokens (none, a class token, a class and a distillation token, 4 registers and a class
token, 8 and one, 16 and one). Its token count goes through `image_tokens` (the reading) and
`guess_layout` (what the pass says of it: a rival reading, or that it is no sure one). Counted: right and silent, right with a
warning (noise), wrong with a warning (said), wrong and silent (the failures that matter).

Then the same for windows folded into the batch (Swin-like, also repeated around the model) and for a ViT's
batch repeated inside the model, read by `guess_layout` with the batch entries an image.

    python benchmarks/grid_guess_sweep.py [--show 10]
"""

from __future__ import annotations

import argparse
from collections import Counter

from attnconv.models.captured import guess_layout, reading_words

SIZES = [(s, s) for s in (28, 32, 48, 56, 64, 96, 112, 128, 160, 192, 224, 256, 384)] + [
    (16, 32), (48, 64), (96, 128), (224, 320), (128, 256), (240, 320), (100, 100), (200, 300)]
PATCHES = (4, 7, 8, 14, 16, 32)
LEADING = (0, 1, 2, 5, 9, 17)
# More leading tokens than the guess places (MAX_EXTRA): exact patch grids only, fewer of them than image positions.
BEYOND = (33, 40, 48, 64, 100)


def layouts(leading=LEADING):
    """(H, W, patch, how, leading tokens, the true grid) of every layout swept."""
    for H, W in SIZES:
        for p in PATCHES:
            exact = H % p == 0 and W % p == 0
            grids = [("exact", (H // p, W // p))] if exact else \
                [("floor", (H // p, W // p)), ("padded", (-(-H // p), -(-W // p)))] if p in (14, 16) else []
            for how, grid in grids:
                if grid[0] * grid[1] >= 4 and (leading is LEADING or how == "exact"):
                    for lead in leading:
                        if leading is LEADING or lead < grid[0] * grid[1]:
                            yield H, W, p, how, lead, grid


WIDE = [(h, w) for h in (28, 32, 56, 64, 96, 112, 128, 192, 224, 256) for w in (28, 32, 64, 96, 128, 224, 256, 384)]


def windows():
    """Swin-like windows (patch 2 or 4, square windows 7, 8, 12, 16, the patch grid padded to whole windows, the
    stages' grids halved), one set an image or up to 4 copies of the batch around the model: (H, W, tokens,
    entries an image, the true reading: the window)."""
    for H, W in WIDE:
        for p in (2, 4):
            for side in (7, 8, 12, 16):
                h, w = -(-H // p), -(-W // p)
                while max(h, w) > side:  # a stage shorter than a window is padded up to one
                    tiles = -(-h // side) * -(-w // side)
                    for copies in (1, 2, 4):
                        if tiles * copies >= 2:
                            yield H, W, side * side, tiles * copies, (0, (side, side))
                    h, w = -(-h // 2), -(-w // 2)


def repeats():
    """A ViT's batch repeated 2 to 16 times inside the model (exact patch grids, 0 or 1 leading token): (H, W,
    tokens, entries an image, the true reading)."""
    for H, W in WIDE:
        for p in (4, 8, 14, 16, 32):
            if H % p == 0 and W % p == 0 and (H // p) * (W // p) >= 4:
                for lead in (0, 1):
                    for k in range(2, 17):
                        yield H, W, lead + (H // p) * (W // p), k, (lead, (H // p, W // p))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", type=int, default=10, help="how many layouts of each failing kind to list")
    args = parser.parse_args()
    counts, shown = Counter(), {"wrong and silent": [], "right with a warning": []}
    for H, W, p, how, lead, grid in layouts():
        count = lead + grid[0] * grid[1]
        read, other = guess_layout(count, (H, W), 1, 1)
        kind = ("right with a warning" if other else "right and silent") if read == (lead, grid) else \
            ("wrong with a warning" if other else "wrong and silent")
        counts[kind] += 1
        if kind in shown:
            shown[kind].append(f"{H}x{W}, patch {p} ({how}), {lead} leading: read {read}, said {other!r}")
    print(f"{sum(counts.values())} layouts: " + ", ".join(f"{k} {counts[k]}" for k in (
        "right and silent", "right with a warning", "wrong with a warning", "wrong and silent")))
    for kind, lines in shown.items():
        for line in lines[:args.show]:
            print(f"  {kind}: {line}")
    beyond = Counter()
    for H, W, _p, _how, lead, grid in layouts(BEYOND):
        count = lead + grid[0] * grid[1]
        read, said = guess_layout(count, (H, W), 1, 1)
        beyond["right" if read == (lead, grid) else
               "wrong, the truth said" if said and f" {reading_words(lead, grid)} " in said else
               "wrong with another warning" if said else "wrong and silent"] += 1
    for name, cases in (("windows", windows()), ("repeated batches", repeats())):
        seen = Counter()
        for H, W, count, entries, truth in cases:
            read, said = guess_layout(count, (H, W), entries, 1)
            seen[("right" if read == truth else "wrong") + (" with a warning" if said else " and silent")] += 1
        print(f"{sum(seen.values())} {name}: " + ", ".join(f"{k} {seen[k]}" for k in (
            "right and silent", "right with a warning", "wrong with a warning", "wrong and silent")))
    print(f"{sum(beyond.values())} layouts with {', '.join(map(str, BEYOND))} leading tokens (more than the guess "
          "places): " + ", ".join(f"{k} {beyond[k]}" for k in (
              "right", "wrong, the truth said", "wrong with another warning", "wrong and silent")))


if __name__ == "__main__":
    main()
