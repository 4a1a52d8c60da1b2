"""The evidence behind the verdicts on the paper's claims, from committed runs (no weights needed).

    python benchmarks/table1/claims.py benchmarks/table1 [benchmarks/grid14]

For every row (model directory) of each root: the seeds' test accuracy per epoch (mean and
sample std; metrics.csv), and from heads.jsonl, per layer at the first and last snapshot (means
over seeds): the mean attention distance in tokens (ViT's Figure 7 measure), and the 3x3
grid-likeness (heads within 0.5 token of a distinct 3x3 offset under one-to-one matching, and
the mean matched distance; `attnconv.analysis.grid_likeness`).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from attnconv.analysis import grid_likeness
from attnconv.runs import read_heads, read_metrics


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def describe_row(row: Path) -> list[str]:
    seeds = sorted(p for p in row.iterdir() if (p / "metrics.csv").exists())
    if not seeds:
        return []
    lines = [f"## {row.parent.name}/{row.name}: {len(seeds)} seed(s) ({', '.join(s.name for s in seeds)})"]
    metrics = [read_metrics(s) for s in seeds]
    epochs = min(len(m) for m in metrics)
    accs = [_mean_std([m[e]["test_acc"] for m in metrics]) for e in range(epochs)]
    lines.append("test acc per epoch: " + ", ".join(f"{e + 1}: {a}" for e, a in enumerate(accs)))
    grids = [grid_likeness(read_heads(s)) for s in seeds if (s / "heads.jsonl").exists()]
    if grids:
        for label, index in (("first", 0), ("last", -1)):
            snaps = [g[index] for g in grids]
            layers = len(snaps[0]["layers"])
            cells = []
            for k in range(layers):
                dist = statistics.mean(s["layers"][k]["attention_distance"] for s in snaps)
                within = statistics.mean(s["layers"][k]["within"] for s in snaps)
                matched = statistics.mean(s["layers"][k]["mean_distance"] for s in snaps)
                cells.append(f"L{k + 1} dist {dist:.2f}, grid {within:.1f}/9 at {matched:.2f}")
            lines.append(f"{label} snapshot (epoch {snaps[0]['epoch']}): " + "; ".join(cells))
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for root in map(Path, argv):
        for row in sorted(p for p in root.iterdir() if p.is_dir()):
            lines = describe_row(row)
            if lines:
                print("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
