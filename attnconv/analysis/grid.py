"""Heads against a K x K kernel grid: one-to-one matching (Hungarian) and the grid-likeness of a layer.

Theorem 1's construction puts one head on each of the K^2 shifts {-(K//2)..K//2}^2 of a
K x K convolution. `match_to_grid` measures how close learned centers are to that
layout: heads matched one-to-one to the shifts by minimum total Euclidean distance, the
mean matched distance, and how many heads sit within `tol` tokens of a distinct shift.
`grid_likeness` applies it to every layer of every snapshot of a run's heads.jsonl.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnconv.errors import AttnconvError
from attnconv.limits import real_number, whole_number


def assignment(cost: np.ndarray) -> list[tuple[int, int]]:
    """Minimum-cost one-to-one assignment (Hungarian algorithm, O(n^2 m)).

    cost (n, m): returns min(n, m) pairs (row, col), each row and column used at most once,
    with the smallest total cost. The shortest-augmenting-path form with potentials
    (Kuhn 1955, Munkres 1957; as in Jonker-Volgenant without the initialization heuristics).
    """
    cost = np.asarray(cost, dtype=float)
    if cost.ndim != 2:
        raise AttnconvError(f"assignment needs a 2-d cost matrix, got shape {cost.shape}")
    if cost.shape[0] > cost.shape[1]:
        return [(r, c) for c, r in assignment(cost.T)]
    n, m = cost.shape
    if n == 0:
        return []
    INF = math.inf
    u, v = np.zeros(n + 1), np.zeros(m + 1)  # potentials of rows and columns (1-based, 0 = virtual)
    match = np.zeros(m + 1, dtype=int)  # match[j] = row assigned to column j (0: none)
    way = np.zeros(m + 1, dtype=int)
    for i in range(1, n + 1):
        match[0] = i
        j0 = 0
        minv = np.full(m + 1, INF)
        used = np.zeros(m + 1, dtype=bool)
        while True:  # grow the alternating tree until it reaches a free column
            used[j0] = True
            i0, delta, j1 = match[j0], INF, 0
            for j in range(1, m + 1):
                if not used[j]:
                    cur = cost[i0 - 1, j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(m + 1):
                if used[j]:
                    u[match[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if match[j0] == 0:
                break
        while j0:  # flip the augmenting path
            j1 = way[j0]
            match[j0] = match[j1]
            j0 = j1
    return sorted((int(match[j]) - 1, j - 1) for j in range(1, m + 1) if match[j])


def grid_points(kernel: int) -> np.ndarray:
    """The K x K shifts (row, col) of a zero-padded K x K conv: (K^2, 2), row-major."""
    kernel = whole_number(kernel, "kernel", "the compared convolution's kernel size", most=99)
    r = np.arange(kernel) - kernel // 2
    return np.stack(np.meshgrid(r, r, indexing="ij"), -1).reshape(-1, 2).astype(float)


def match_to_grid(centers: np.ndarray, kernel: int, tol: float = 0.5) -> dict[str, Any]:
    """Match head centers (heads, 2) one-to-one to the K x K grid points (Hungarian, Euclidean).

    Returns the matched grid point and distance per head (None for heads left over when
    heads > K^2), their mean, and how many heads lie within `tol` of their grid point.
    """
    centers = np.asarray(centers, dtype=float)
    if centers.ndim != 2 or centers.shape[1] != 2:
        raise AttnconvError(f"centers must be (heads, 2) shifts as (row, col), got shape {centers.shape}")
    grid = grid_points(kernel)
    tol = real_number(tol, "tol", "the distance in tokens that counts as on a grid point", low=0)
    dist = np.linalg.norm(centers[:, None, :] - grid[None, :, :], axis=-1)  # (heads, K^2)
    pairs = assignment(dist)
    matched: list[list[float] | None] = [None] * len(centers)
    distance: list[float | None] = [None] * len(centers)
    for h, g in pairs:
        matched[h], distance[h] = grid[g].tolist(), float(dist[h, g])
    d = [x for x in distance if x is not None]
    return {
        "grid_points": grid.tolist(),
        "matched_point": matched,
        "distance": distance,
        "mean_distance": float(np.mean(d)) if d else None,
        "max_distance": float(np.max(d)) if d else None,
        "within": int(sum(x < tol for x in d)),
        "tolerance": tol,
        "nearest_distance": dist.min(axis=1).tolist(),  # to any grid point (not one-to-one)
    }


def grid_likeness(snapshots: list[dict[str, Any]], kernel: int = 3, tol: float = 0.5) -> list[dict[str, Any]]:
    """`match_to_grid` of each layer's centers in each snapshot of heads.jsonl (`attnconv.runs.read_heads`).

    Returns one entry per snapshot: {"epoch", "step", "layers": [{"mean_distance",
    "within", "heads", "attention_distance"}, ...]}: the mean matched distance, the heads
    within `tol` tokens of a distinct K x K shift, the layer's head count, and its heads'
    mean attention distance.
    """
    grid_points(kernel)  # its one check before any snapshot is read
    real_number(tol, "tol", "the distance in tokens that counts as on a grid point", low=0)
    out = []
    for snap in snapshots:
        layers = []
        for heads in snap["layers"]:
            m = match_to_grid(np.array([h["center"] for h in heads], dtype=float).reshape(-1, 2), kernel, tol)
            layers.append({"mean_distance": m["mean_distance"], "within": m["within"], "heads": len(heads),
                           "attention_distance": float(np.mean([h["attention_distance"] for h in heads]))})
        out.append({"epoch": snap["epoch"], "step": snap["step"], "layers": layers})
    return out
