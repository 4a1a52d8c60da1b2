"""A run's CSV logs: metrics.csv (a row per epoch) and steps.csv (a row every --log-every steps), read with
checks (one DamagedFile naming the file, the line and the fix) and written; what the logs show of a lost
checkpoint (`checkpointed_once`)."""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import Any

from attnconv.config import TrainConfig
from attnconv.errors import AttnconvError, DamagedFile
from attnconv.fileio import append_synced, dangling_link, read_regular
from attnconv.runs.files import (
    METRICS_COLUMNS,
    METRICS_FILE,
    METRICS_LOST,
    STEPS_COLUMNS,
    STEPS_FILE,
    log_fix,
)
from attnconv.runs.values import file_text, path_kind, short_value

_MAX_METRICS_BYTES = 2**26  # 64 MiB: about a million epochs

def read_metrics(run_dir: str | os.PathLike, limit: int | None = None, *, unterminated: bool = False
                 ) -> list[dict[str, float]]:
    """Rows of metrics.csv as dicts of numbers ([] if no epoch finished yet), at most `limit`.

    A last line without its newline is a row cut short by a crash and is skipped (read, with `unterminated`:
    `runs.logs_record.with_last_line` takes it where the checkpoint vouches for it). The
    header must name every column of METRICS_COLUMNS; a file that is not UTF-8 text, not
    CSV, or holds a value that is not a number is one AttnconvError naming the file.
    """
    return _read_csv(Path(run_dir) / METRICS_FILE, METRICS_COLUMNS, "metrics file", limit, _MAX_METRICS_BYTES,
                     log_fix(METRICS_LOST), "epoch", unterminated)

# Why a run's checkpoint (model.safetensors and state.pt) is gone although its logs show one was whole.
CHECKPOINT_GONE = "they were moved or deleted; restore them from a copy of the run"


def rows_logged(run_dir: str | os.PathLike, limit: int) -> int:
    """How many rows metrics.csv holds, counted up to `limit`; a file that does not read counts none (its reader
    says what is wrong with it where the rows are used)."""
    try:
        return len(read_metrics(run_dir, limit=limit))
    except AttnconvError:
        return 0


def checkpointed_once(run_dir: Path, meta: dict[str, Any]) -> str | None:
    """What in the logs shows that a run (config.json `meta`) once had a whole checkpoint, or None: a row of a step
    after the first one it checkpoints at (the first of --checkpoint-every, its first epoch's end, --max-steps),
    which it reaches only once that checkpoint is whole (a checkpoint that fails stops the run). Rows up to that
    step are logged before its checkpoint, so they alone show nothing. Logs that do not read show nothing here."""
    config = TrainConfig.from_dict(meta["config"])
    first = min((s for s in (config.checkpoint_every, meta.get("steps_per_epoch"), config.max_steps)
                 if isinstance(s, int) and s > 0), default=None)
    if first is None:
        return None
    for name, read in ((METRICS_FILE, read_metrics), (STEPS_FILE, read_steps)):
        try:
            rows = read(run_dir)
        except AttnconvError:
            continue
        if rows and rows[-1]["step"] > first:  # rows rise in step (`read_metrics`)
            return (f"{name} has a row of step {int(rows[-1]['step'])}, past step {first}, where the run writes its "
                    "first checkpoint and which it goes past only once that checkpoint is whole")
    return None

def read_steps(run_dir: str | os.PathLike, limit: int | None = None, *, unterminated: bool = False
               ) -> list[dict[str, float]]:
    """Rows of steps.csv (a row every --log-every steps: STEPS_COLUMNS) as dicts of numbers, at most
    `limit`; [] for a run without one. Read and checked as `read_metrics` reads metrics.csv."""
    return _read_csv(Path(run_dir) / STEPS_FILE, STEPS_COLUMNS, "steps log", limit, _MAX_STEPS_BYTES,
                     log_fix("the run's per-step curves are"), "step", unterminated)

_MAX_STEPS_BYTES = 2**28  # 256 MiB: millions of rows (--log-every 1 on a long run)

def _read_csv(path: Path, columns: tuple[str, ...], what: str, limit: int | None, max_bytes: int,
              fix: str, order: str, unterminated: bool = False) -> list[dict[str, float]]:
    """The rows of a run's CSV log (`read_metrics`, `read_steps`); one AttnconvError naming `path` if it is unsound.
    Line ends of any system (LF, CRLF, CR); every column named once; the `order` column rising from row to row (an
    epoch or step logged twice, or rows out of order, would leave two answers to one question)."""
    if not path.exists():
        if path.is_symlink():  # a link whose file is gone (or a loop) is no log "not written yet"
            raise DamagedFile(f"{path}: {dangling_link(path)}", fix)
        return []
    if not path.is_file():
        raise DamagedFile(f"{path}: corrupt {what} (not a regular file: {path_kind(path)})", fix)
    if path.stat().st_size > max_bytes:
        raise DamagedFile(f"{path}: corrupt {what} (over {max_bytes >> 20} MiB)", fix)
    try:
        text = file_text(read_regular(path, fix))
    except UnicodeDecodeError:
        raise DamagedFile(f"{path}: corrupt {what} (binary data, not CSV text)", fix) from None
    except OSError as err:
        raise DamagedFile(f"{path}: cannot read the {what} ({err.strerror or err})", fix) from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # a file saved by an editor on Windows or an old Mac
    lines = text.split("\n")
    if not (unterminated and lines[-1].strip()):
        lines.pop()  # the piece after the last newline is empty or cut short
    if not lines:
        return []
    if limit is not None:
        lines = lines[: limit + 1]
    try:
        reader = csv.reader(lines, skipinitialspace=True)  # ", " separators, as some tools save them
        header = [name.strip() for name in next(reader, None) or []]  # names padded with spaces
        comma = bool(header) and header[-1] == ""  # a comma ending every line: an empty last column, not one
        if comma:
            header.pop()
        missing = [c for c in columns if c not in header]
        if missing:
            raise AttnconvError(f"no {', '.join(missing)} column{'s' if len(missing) > 1 else ''}")
        seen: set[str] = set()
        twice = next((c for c in header if c in seen or seen.add(c)), None)  # linear: headers of 10^5 columns
        if twice is not None:
            raise AttnconvError(f"the header names column {short_value(twice)} twice")
        rows: list[dict[str, float]] = []
        for fields in reader:
            if not any(field.strip() for field in fields):  # a blank line, or one of spaces (an editor's, at the end)
                continue
            if comma and len(fields) == len(header) + 1 and not fields[-1].strip():
                fields = fields[:-1]
            row = _csv_row(header, fields, reader.line_num)
            if rows and not row[order] > rows[-1][order]:
                raise AttnconvError(f"line {reader.line_num}: {order} {row[order]:g} after {order} "
                                    f"{rows[-1][order]:g}; each row's {order} must be larger than the one before")
            rows.append(row)
        return rows
    except (csv.Error, AttnconvError) as err:
        raise DamagedFile(f"{path}: corrupt {what} ({err})", fix) from None


def _csv_row(header: list[str], fields: list[str], number: int) -> dict[str, float]:
    """One row of a run's CSV log as numbers, checked: as many fields as the header, each a number,
    counts whole numbers >= 0, accuracies in [0, 1]; AttnconvError naming line `number` otherwise."""
    if len(fields) != len(header):
        raise AttnconvError(f"line {number}: {len(fields)} fields, the header has {len(header)}")
    row = {}
    for name, text in zip(header, fields):
        try:
            row[name] = float(text)
        except ValueError:
            shown = text if len(text) <= 20 else text[:17] + "..."
            raise AttnconvError(f"line {number}: {name} {shown!r} is not a number") from None
    bad = next((k for k in _COUNT_COLUMNS if k in row and not (
        math.isfinite(row[k]) and row[k].is_integer() and 0 <= row[k] <= 2**53)), None)
    if bad is not None:
        raise AttnconvError(f"line {number}: {bad} {row[bad]!r} is not a whole number >= 0")
    bad = next((k for k in _FRACTION_COLUMNS if k in row and not 0 <= row[k] <= 1), None)
    if bad is not None:
        raise AttnconvError(f"line {number}: {bad} {row[bad]!r} is not an accuracy from 0 to 1")
    bad = next((k for k in _NONNEGATIVE_COLUMNS if k in row and row[k] < 0), None)  # NaN: not measured, shown as -
    if bad is not None:
        raise AttnconvError(f"line {number}: {bad} {row[bad]!r} is negative")
    return row


# The columns of metrics.csv and steps.csv that count (whole numbers >= 0); the others are measurements.
_COUNT_COLUMNS = ("epoch", "step")
# The accuracies of metrics.csv and steps.csv: fractions of the images seen.
_FRACTION_COLUMNS = ("train_acc", "test_acc", "accuracy")
# Durations, rates and learning rates: never below 0.
_NONNEGATIVE_COLUMNS = ("seconds", "images_per_s", "lr")


def metrics_text(rows: list[dict[str, float]], columns: tuple[str, ...] = METRICS_COLUMNS) -> str:
    """metrics.csv (or, with `columns=STEPS_COLUMNS`, steps.csv) holding `rows`, header first."""
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _fmt(row[k]) for k in columns})
    return out.getvalue()

def append_rows(path: Path, rows: list[dict[str, float]], columns: tuple[str, ...]) -> None:
    """Append `rows` to a run's CSV log (metrics.csv, steps.csv), fsync'd (`fileio.append_synced`)."""
    append_synced(path, metrics_text(rows, columns).split("\n", 1)[1])

def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 2**53 else repr(float(v))
