"""Groups of runs side by side: accuracy and how far the heads moved, per layer, from heads.jsonl alone.

    rows = compare_groups(["benchmarks/table1/sa-quadratic", "benchmarks/recipes/sgd/sa-quadratic"])
    print(format_comparison(rows, kernels=(3,)))

A group is a folder of seeds (`seed0/`, `seed1/`, ... each a run directory, or only its
config.json, metrics.csv and heads.jsonl) or one run directory. For each group and layer, at
the last snapshot (or the one after `epoch` epochs), averaged over seeds:

  - moved: how far each head's center is from its center at initialization (epoch 0), in
    tokens, the mean over heads and the largest over heads and seeds. Quadratic heads' centers
    are their Delta_h; other heads' are their centers of mass (`attnconv.analysis.head_snapshot`).
  - grid: `match_to_grid` of the centers against each K x K grid of offsets (heads within
    0.5 token of a distinct offset, and the mean matched distance).
  - distance: the mean attention distance in tokens (E ||delta||).

and the group's test accuracy after that epoch (metrics.csv; mean and sample std over seeds).
No weights are read: the numbers come from the committed logs.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from attnconv.analysis.grid import match_to_grid
from attnconv.errors import AttnconvError, DamagedFile
from attnconv.evaluate import content_digest, logs_digest, run_setup, setup_differences
from attnconv.fileio import dangling_link, not_a_folder
from attnconv.limits import shown_value
from attnconv.runs import CONFIG_FILE, STATE_FILE, WEIGHTS_FILE, Run, read_heads, read_metrics
from attnconv.runs.directory import check_not_replaced, set_aside_pending
from attnconv.runs.files import read_config, trained_here
from attnconv.runs.logs_record import with_last_line
from attnconv.tables import format_table

MAX_KERNEL = 15  # the largest grid K the centers are matched against (`compare_groups`, `attnconv compare`)


def group_runs(group: str | os.PathLike) -> list[Path]:
    """The run directories of a group: its `seed*/` folders with a metrics.csv, or the folder itself. A metrics.csv
    that is there but no regular file (a FIFO, a folder, a broken link) makes a run, for its reader to name."""
    root = Path(group)
    why = not_a_folder(root, "no such folder")
    if why:
        raise AttnconvError(f"{root}: not a group or run directory ({why}); give a folder of seed*/ runs or one run "
                            "directory")
    if os.path.lexists(root / "metrics.csv") or set_aside_pending(root):  # a run being replaced: its reader says so
        return [root]
    seeds = []
    for p in sorted(p for p in root.iterdir() if p.name.startswith("seed")):
        if link := dangling_link(p):  # a seed that leads nowhere is no seed fewer, said in silence
            raise AttnconvError(f"{p}: {link}; fix the link, or move it out of the group")
        if p.is_file() and not p.is_symlink():  # a user's notes (seeds.txt): a run is a folder, so none is left out
            continue
        why = not_a_folder(p)
        if why:  # a seed* that is no folder (a device, a link to a file) is no seed fewer, said in silence
            raise AttnconvError(f"{p}: not a run directory ({why}); a group's seed* entries are its runs: move it "
                                "out of the group")
        if os.path.lexists(p / "metrics.csv") or set_aside_pending(p):
            seeds.append(p)
        else:
            _no_logs(p, ", or move the folder out of the group")
    if not seeds:
        _no_logs(root, "")  # the folder given is itself a run without logs: said as a seed's would be
        raise AttnconvError(f"{root}: holds no run (no metrics.csv in it or in a seed*/ folder below it)")
    real: dict[str, Path] = {}
    for p in seeds:  # one run by two names (a link to a seed, or to the group's own run) would count twice
        key = os.path.realpath(p)
        if key in real:
            raise AttnconvError(f"{real[key]} and {p} are one run (a link to it): give each run once")
        real[key] = p
    if len(seeds) > 1:  # what makes them one configuration of several seeds is in config.json: all have it, or none
        have = [os.path.lexists(p / CONFIG_FILE) for p in seeds]
        if any(have) and not all(have):
            with_, without = seeds[have.index(True)], seeds[have.index(False)]
            raise AttnconvError(f"{without}: config.json is missing, while {with_} has one: its configuration and "
                                "seed cannot be checked against the group's; restore it from a copy of the run, or "
                                "move the folder out of the group")
        logs: dict[tuple[str, str], Path] = {}
        for p in seeds:  # the same logs twice are one run twice, whatever two config.json say of their seeds
            metrics = logs_digest(read_metrics(p)) if (p / "metrics.csv").is_file() else None
            for name, digest in ((("metrics.csv", metrics),) if metrics else ()) + tuple(
                    ("heads.jsonl", d) for d in _trained_heads_digests(p)):
                if (name, digest) in logs:
                    what = "the same metrics.csv" if name == "metrics.csv" else "heads.jsonl snapshots in common"
                    raise AttnconvError(f"{logs[name, digest]} and {p} hold {what}: one run's logs twice; give each "
                                        "run once")
                logs[name, digest] = p
    return seeds


def _no_logs(run: Path, or_else: str) -> None:
    """One AttnconvError for a run folder without metrics.csv that is a run all the same: one `attnconv convert` made
    (no training, so no logs to compare), or one trained here whose log is gone (not left out of a mean without a
    word); `or_else`: the other fix (a group's seed: moved out of the group)."""
    if _converted(run):
        raise AttnconvError(f"{run}: a converted run (`attnconv convert`), which has no training logs to compare; "
                            "compare trained runs (`attnconv eval` measures a converted one)")
    if found := trained_here(run):
        raise AttnconvError(f"{run}: metrics.csv is missing, while {', '.join(found)} show a run was trained here; "
                            f"restore it from a copy of the run{or_else}")


def _trained_heads_digests(run: Path) -> set[str]:
    """What tells one run's heads.jsonl from another's: each snapshot after training began, its heads alone (no two
    seeds share one; two seeds may start alike), to 6 significant digits; none for a damaged file (its reader names
    it)."""
    try:
        return {content_digest(s["layers"]) for s in read_heads(run) if s["epoch"] >= 1}
    except AttnconvError:
        return set()


def _converted(run: Path) -> bool:
    """Whether `run` holds a run `attnconv convert` made (its config.json says so)."""
    try:
        return "converted" in read_config(run)
    except AttnconvError:
        return False


def _snapshot(snaps: list[dict[str, Any]], epoch: int | None, where: Path) -> dict[str, Any]:
    if epoch is None:
        return snaps[-1]
    for s in snaps:
        if s["epoch"] == epoch:
            return s
    raise AttnconvError(f"{where}: heads.jsonl has no snapshot after epoch {epoch} "
                        f"(it has epochs {', '.join(str(s['epoch']) for s in snaps)})")


def _centers(layer: list[dict[str, Any]]) -> np.ndarray:
    return np.array([h["center"] for h in layer], dtype=float).reshape(-1, 2)


def center_displacement(first: dict[str, Any], later: dict[str, Any]) -> list[np.ndarray]:
    """Per layer, each head's distance in tokens between its centers in two heads.jsonl snapshots."""
    if len(first["layers"]) != len(later["layers"]):
        raise AttnconvError("the two snapshots have different numbers of layers")
    out = []
    for a, b in zip(first["layers"], later["layers"]):
        if len(a) != len(b):
            raise AttnconvError("the two snapshots have different numbers of heads in a layer")
        out.append(np.linalg.norm(_centers(b) - _centers(a), axis=1))
    return out


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def compare_group(group: str | os.PathLike, *, epoch: int | None = None,
                  kernels: tuple[int, ...] = (3,), tol: float = 0.5) -> dict[str, Any]:
    """One group's row of the comparison (see the module docstring): a dict, JSON-ready."""
    runs = group_runs(group)
    accs, layers, epochs, heads_runs = [], None, [], 0
    per_layer: list[dict[str, list[float]]] = []
    seeds: dict[int, Path] = {}
    setup: tuple[Path, dict[str, Any]] | None = None
    for run in runs:
        whole = _whole_run(run)
        if whole is not None:  # one configuration, each seed once (a copy of a run is its seed again, as in `table`)
            mine = run_setup(whole.meta)
            if setup is None:
                setup = (run, mine)
            elif mine != setup[1]:
                raise AttnconvError(f"{setup[0]} and {run} are runs of other configurations "
                                    f"({'; '.join(setup_differences(setup[1], mine))}): a group's runs differ only by "
                                    "their seed; give each configuration as a group of its own")
            if whole.config.seed in seeds and len(runs) > 1:
                raise AttnconvError(f"{seeds[whole.config.seed]} and {run} are runs with the same seed "
                                    f"{whole.config.seed}: give each run once (a copy counts as a second seed)")
            seeds[whole.config.seed] = run
        metrics = whole.metrics if whole is not None else read_metrics(run)
        if not metrics:
            raise AttnconvError(f"{run}: metrics.csv has no finished epoch yet")
        row = metrics[-1] if epoch is None else next((m for m in metrics if int(m["epoch"]) == epoch), None)
        if row is None and epoch != 0:  # epoch 0 (initialization) has heads but no metrics row
            raise AttnconvError(f"{run}: metrics.csv has no row for epoch {epoch} (it has {len(metrics)})")
        if row is not None:
            accs.append(row["test_acc"])
        epochs.append(0 if row is None else int(row["epoch"]))
        snaps = _checked_heads(run, whole)
        if not snaps:
            continue  # a CNN, or a run without heads.jsonl: accuracy only
        heads_runs += 1
        first, last = snaps[0], _snapshot(snaps, epoch, run)
        if first["epoch"] != 0:
            raise AttnconvError(f"{run}: heads.jsonl does not start at initialization (epoch 0); restore it from a "
                                "copy of the run, or move it out of the run folder (the run is then compared by its "
                                "accuracy alone)")
        moved = center_displacement(first, last)
        if layers is None:
            layers = len(moved)
            per_layer = [{} for _ in range(layers)]
        elif layers != len(moved):
            raise AttnconvError(f"{run}: {len(moved)} attention layers, the group's other runs have {layers}")
        for k, (layer, d) in enumerate(zip(last["layers"], moved)):
            cell = per_layer[k]
            cell.setdefault("moved_mean", []).append(float(d.mean()))
            cell.setdefault("moved_max", []).append(float(d.max()))
            cell.setdefault("distance", []).append(float(np.mean([h["attention_distance"] for h in layer])))
            cell.setdefault("heads", []).append(len(layer))
            for kernel in kernels:
                m = match_to_grid(_centers(layer), kernel, tol)
                cell.setdefault(f"within{kernel}", []).append(m["within"])
                cell.setdefault(f"matched{kernel}", []).append(m["mean_distance"])
    acc_mean, acc_std = _mean_std(accs) if accs else (None, None)
    out_layers = []
    for cell in per_layer:
        entry: dict[str, Any] = {
            "heads": max(cell["heads"]),
            "moved_mean": statistics.mean(cell["moved_mean"]),
            "moved_max": max(cell["moved_max"]),
            "attention_distance": statistics.mean(cell["distance"]),
        }
        for kernel in kernels:
            entry[f"grid{kernel}_within"] = statistics.mean(cell[f"within{kernel}"])
            entry[f"grid{kernel}_matched"] = statistics.mean(cell[f"matched{kernel}"])
        out_layers.append(entry)
    return {"group": str(group), "seeds": len(runs), "epoch": min(epochs), "test_acc": acc_mean,
            "test_acc_std": acc_std, "runs_with_heads": heads_runs, "layers": out_layers}


def compare_groups(groups: list[str | os.PathLike], *, epoch: int | None = None,
                   kernels: tuple[int, ...] = (3,), tol: float = 0.5) -> list[dict[str, Any]]:
    """`compare_group` of each group, in the order given."""
    if isinstance(groups, (str, bytes, os.PathLike)) or not isinstance(groups, (list, tuple)):
        raise AttnconvError(f"groups {shown_value(groups)} is not a list of groups: give a list of folders of seed*/ "
                            "runs or run directories (one group: [folder])")
    if not groups:
        raise AttnconvError("give at least one group (a folder of seed*/ runs, or a run directory)")
    bad = [g for g in groups if not isinstance(g, (str, os.PathLike)) or str(g) == ""]
    if bad:
        raise AttnconvError(f"groups holds {shown_value(bad[0])}: give each group as a folder's path")
    if not isinstance(kernels, (list, tuple)) or not kernels or any(
            isinstance(k, bool) or not isinstance(k, int) or k < 1 or k > MAX_KERNEL for k in kernels):
        raise AttnconvError(f"kernels {shown_value(kernels)} is invalid: give kernel sizes from 1 to {MAX_KERNEL}, "
                            "e.g. (3,)")
    owner: dict[str, str | os.PathLike] = {}
    for g in groups:  # one run in two columns is no comparison (`table` refuses it too)
        for run in group_runs(g):
            key = os.path.realpath(run)
            if key in owner:
                first = owner[key]
                said = f"{g} is given twice" if os.path.realpath(first) == os.path.realpath(g) else \
                    f"{first} and {g} hold the same run ({run})"
                raise AttnconvError(f"{said}: give each group once")
            owner[key] = g
    return [compare_group(g, epoch=epoch, kernels=kernels, tol=tol) for g in groups]


def displacement_history(group: str | os.PathLike) -> dict[str, Any]:
    """How far the centers have moved from initialization after each recorded epoch, per layer.

    Returns {"epochs": [0, 1, ...], "moved_mean": [[per layer] per epoch], "moved_max": same}: the
    mean over heads (then over seeds) and the largest over heads and seeds, for the epochs every
    seed of the group has recorded.
    """
    histories = []
    for run in group_runs(group):
        snaps = {s["epoch"]: s for s in _checked_heads(run, _whole_run(run))}  # a replayed epoch: the last record wins
        if 0 not in snaps:
            raise AttnconvError(f"{run}: heads.jsonl has no snapshot at initialization (epoch 0); restore it from a "
                                "copy of the run, or leave the run out of the group")
        histories.append({e: center_displacement(snaps[0], s) for e, s in snaps.items()})
    epochs = sorted(set.intersection(*(set(h) for h in histories)))
    return {"epochs": epochs,
            "moved_mean": [[float(np.mean([h[e][k].mean() for h in histories])) for k in range(len(histories[0][e]))]
                           for e in epochs],
            "moved_max": [[float(max(h[e][k].max() for h in histories)) for k in range(len(histories[0][e]))]
                          for e in epochs]}


def format_comparison(rows: list[dict[str, Any]], *, kernels: tuple[int, ...] = (3,), markdown: bool = False) -> str:
    """The comparison as a table: a line per group and layer (a CNN's group: one line, accuracy only)."""
    headers = ["group", "seeds", "epoch", "test acc", "layer", "moved mean", "moved max"]
    for kernel in kernels:
        headers += [f"{kernel}x{kernel} within", f"{kernel}x{kernel} matched"]
    headers.append("attn distance")
    table = []
    for row in rows:
        acc = "-" if row["test_acc"] is None else \
            f"{row['test_acc']:.4f}" + (f" ± {row['test_acc_std']:.4f}" if row["test_acc_std"] is not None else "")
        head = [row["group"], str(row["seeds"]), str(row["epoch"]), acc]
        if not row["layers"]:
            table.append(head + ["-"] * (len(headers) - len(head)))
        for k, layer in enumerate(row["layers"]):
            cells = [str(k + 1), f"{layer['moved_mean']:.2f}", f"{layer['moved_max']:.2f}"]
            for kernel in kernels:
                cells += [f"{layer[f'grid{kernel}_within']:.1f}/{min(layer['heads'], kernel * kernel)}",
                          f"{layer[f'grid{kernel}_matched']:.2f}"]
            cells.append(f"{layer['attention_distance']:.2f}")
            table.append((head if k == 0 else ["", "", "", ""]) + cells)
    return format_table(headers, table, markdown=markdown, align="lrrrr" + "r" * (len(headers) - 5)) + "\n"


def _whole_run(run: Path) -> Run | None:
    """The run as a `Run` when its folder holds config.json (copied whole, not only its two logs), else None. A
    config.json that is there but no regular file (a broken link, a FIFO) is a whole run's, for `Run` to name; a
    run that `train --overwrite` is replacing is refused here, whether or not its config.json is written yet."""
    check_not_replaced(run)
    trained = any(os.path.lexists(run / name) for name in (WEIGHTS_FILE, STATE_FILE))  # config.json gone: Run says so
    return Run(run) if os.path.lexists(run / CONFIG_FILE) or trained else None


def _checked_heads(run: Path, whole: Run | None) -> list[dict[str, Any]]:
    """`read_heads` of a run; for a whole run (`_whole_run`), the snapshots checked against the model and the
    length its config.json describes (`Run.check_heads_fit`), and those its last checkpoint was written after
    (`Run.check_logs`)."""
    try:
        snaps = read_heads(run)
    except DamagedFile as err:  # damage past an unfinished run's checkpoint: its resume cuts it (`Run.resumable`)
        raise (whole.resumable(err) if whole is not None else err) from None
    if whole is not None:
        snaps = with_last_line(run, "heads", snaps, whole.logs_metadata)  # re-saved without its final newline
        whole.check_heads_fit(snaps)
        if not snaps or snaps[0]["epoch"] == 0:  # one without its start: said by its readers, with their fix
            whole.check_logs("heads", snaps)
    return snaps
