"""heads.jsonl, a run's record of its attention heads (a snapshot at initialization and after every epoch):
reading it with checks (`read_heads`, or `read_heads_skipping` for what needs only some lines), what a sound
snapshot is (`snapshot_problem`), and the line `train` writes (`heads_line`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from attnconv.errors import DamagedFile
from attnconv.fileio import dangling_link, read_regular
from attnconv.runs.files import HEADS_FILE, HEADS_LOST, log_fix
from attnconv.runs.values import file_text, is_finite, is_whole, json_loads, path_kind, short_value

_MAX_HEADS_BYTES = 2**28  # 256 MiB: thousands of snapshots of a large model

def read_heads(run_dir: str | os.PathLike, limit: int | None = None, *, unterminated: bool = False
               ) -> list[dict[str, Any]]:
    """The snapshots of heads.jsonl, oldest first ([] for a run without one), at most `limit`.

    Each is {"epoch", "step", "layers": [[{"center", "attention_distance", "alpha" or
    "inverse_covariance"}, ...per head], ...per layer]} (`attnconv.analysis.head_snapshot`),
    written by `train` at initialization (epoch 0, step 0) and after every epoch. A last line
    without its newline was cut short by a crash and is skipped; anything else that is not
    such a record (`snapshot_problem`) is one AttnconvError naming the file and the line. With `unterminated`,
    that last line is read too (`runs.logs_record.with_last_line`).
    """
    return _read_heads(Path(run_dir), limit, skip_bad=False, unterminated=unterminated)[0]


def read_heads_skipping(run_dir: str | os.PathLike, unterminated: bool = False
                        ) -> tuple[list[dict[str, Any]], list[int]]:
    """heads.jsonl's sound snapshots, and the numbers of the lines skipped as damaged.

    For what needs only some snapshots (figures, the report, the explorer): a line that
    `read_heads` would refuse is left out instead, and so is a last line cut short (both
    numbered). The file itself (missing, unreadable, too large, binary) is checked as
    `read_heads` checks it."""
    return _read_heads(Path(run_dir), None, skip_bad=True, unterminated=unterminated)


def _read_heads(run_dir: Path, limit: int | None, skip_bad: bool, unterminated: bool = False
                ) -> tuple[list[dict[str, Any]], list[int]]:
    path = run_dir / HEADS_FILE
    fix = log_fix(HEADS_LOST)
    if not path.exists():
        if path.is_symlink():  # a link whose file is gone is no "run without heads"
            raise DamagedFile(f"{path}: {dangling_link(path)}", fix)
        return [], []
    if not path.is_file():
        raise DamagedFile(f"{path}: corrupt heads file (not a regular file: {path_kind(path)})", fix)
    if path.stat().st_size > _MAX_HEADS_BYTES:
        raise DamagedFile(f"{path}: corrupt heads file (over {_MAX_HEADS_BYTES >> 20} MiB)", fix)
    try:
        lines = file_text(read_regular(path, fix)).split("\n")
        cut = "" if unterminated and lines[-1].strip() else lines.pop()  # "" after a last newline; else a last
        # line cut short by a crash (skipped)
    except UnicodeDecodeError:
        raise DamagedFile(f"{path}: corrupt heads file (binary data, not JSON lines)", fix) from None
    except OSError as err:
        raise DamagedFile(f"{path}: cannot read the heads file ({err.strerror or err})", fix) from None
    records: list[dict[str, Any]] = []
    skipped: list[int] = []
    for number, line in enumerate(lines[:limit] if limit is not None else lines, 1):
        if not line.strip():  # a blank line (an editor's, at the end): no snapshot, and no damage
            continue
        try:
            record = json_loads(line)
            problem = snapshot_problem(record, records[0] if records else None)
            if problem is None and records:
                problem = _order_problem(record, records[-1])
        except ValueError as err:
            problem = str(err)
        if problem is None:
            records.append(record)
        elif skip_bad:
            skipped.append(number)
        else:
            raise DamagedFile(f"{path}: corrupt heads file (line {number}: {problem})", fix)
    if skip_bad and cut.strip():  # what reads only some snapshots says it left this one out too
        skipped.append(len(lines) + 1)
    return records, skipped


_MAX_EPOCH = 10**6


def snapshot_problem(record: Any, like: dict[str, Any] | None = None) -> str | None:
    """What keeps `record` from being a snapshot of the heads (a line of heads.jsonl), or None.

    epoch a whole number 0..10^6, step a whole number >= 0, layers a list of lists of heads,
    each head a center of 2 finite numbers (at most 1e6 tokens), an attention_distance of 0 to 1e6, and a finite
    alpha > 0 or a 2x2 inverse_covariance of finite numbers where present; with `like` (the
    file's first snapshot), the same number of layers and of heads in each.
    """
    if not isinstance(record, dict):
        return "not a JSON object"
    epoch, step, layers = record.get("epoch"), record.get("step"), record.get("layers")
    if not (is_finite(epoch) and float(epoch).is_integer() and 0 <= epoch <= _MAX_EPOCH):
        return f"epoch {short_value(epoch)} is not a whole number from 0 to {_MAX_EPOCH}"
    if not (is_whole(step) and step >= 0):
        return f"step {short_value(step)} is not a whole number >= 0"
    if not isinstance(layers, list) or not all(isinstance(layer, list) for layer in layers):
        return "layers is not a list of layers"
    for i, layer in enumerate(layers, 1):
        for j, head in enumerate(layer, 1):
            problem = _head_problem(head)
            if problem is not None:
                return f"layer {i} head {j}: {problem}"
    if like is not None and [len(layer) for layer in layers] != [len(layer) for layer in like["layers"]]:
        return "its layers and heads differ from the first snapshot's"
    return None


def _order_problem(record: dict[str, Any], before: dict[str, Any]) -> str | None:
    """Snapshots are written one an epoch, in order: each of a later epoch and step than the sound one before."""
    if record["epoch"] > before["epoch"] and record["step"] > before["step"]:
        return None
    return (f"epoch {short_value(record['epoch'])} at step {short_value(record['step'])} after epoch "
            f"{short_value(before['epoch'])} at step {short_value(before['step'])}; each snapshot is of a later epoch and "
            "step than the one before")


# Farther than any token grid reaches (at most 65,536 a side), and near enough that distances and their squares
# stay finite in the analysis (a center of 1e155 made the grid matching loop for ever); alpha and the inverse
# covariance (sharper than any pixel by far) have the same bound, for the same overflow in the figures.
_FAR = 1e6


def _head_problem(head: Any) -> str | None:
    if not isinstance(head, dict):
        return "not a JSON object"
    center = head.get("center")
    if not (isinstance(center, list) and len(center) == 2 and all(is_finite(c) and abs(c) <= _FAR for c in center)):
        return f"center {short_value(center)} is not 2 finite numbers of at most {_FAR:g} tokens"
    distance = head.get("attention_distance")
    if not (is_finite(distance) and 0 <= distance <= _FAR):
        return f"attention_distance {short_value(distance)} is not a number from 0 to {_FAR:g} tokens"
    if "alpha" in head and not (is_finite(head["alpha"]) and 0 < head["alpha"] <= _FAR):
        return f"alpha {short_value(head['alpha'])} is not a number > 0 and at most {_FAR:g}"
    cov = head.get("inverse_covariance")
    if "inverse_covariance" in head and not (
            isinstance(cov, list) and len(cov) == 2
            and all(isinstance(row, list) and len(row) == 2 and all(is_finite(v) and abs(v) <= _FAR for v in row)
                    for row in cov)):
        return f"inverse_covariance {short_value(cov)} is not 2x2 finite numbers of at most {_FAR:g}"
    return None


def heads_line(record: dict[str, Any]) -> str:
    """One snapshot as the line of heads.jsonl that `read_heads` reads back."""
    return json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
