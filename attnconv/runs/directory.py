"""The run directory contract of `attnconv train`: which folder it may write, what --overwrite replaces,
and the logs a resumed run keeps (docs/failure-model.md)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from attnconv.errors import AttnconvError
from attnconv.fileio import (
    LOCK_FILE,
    DirectoryLock,
    atomic_write,
    describe_os_error,
    is_temporary,
    write_bytes,
)
from attnconv.runs.files import (
    CONFIG_FILE,
    HEADS_FILE,
    METRICS_FILE,
    RUN_FILES,
    TENSORBOARD_DIR,
    heads_line,
    metrics_text,
    read_config,
    read_heads,
    read_metrics,
    trim_steps,
)


def claim_run_dir(out: Path, lock: DirectoryLock, *, resume: bool, overwrite: bool) -> list[str]:
    """Take `out` for `attnconv train`, under the run directory contract (docs/failure-model.md).

    `out` is created if missing and locked (`lock`, one writer); it must then be empty, or hold
    an attnconv run (a config.json that `read_config` accepts) that `resume` continues or
    `overwrite` replaces. Returns the run's files (and its tensorboard/ folder) that `overwrite` will replace; nothing is
    removed here (`replace_run_files` does, once every other check has passed). A folder holding
    anything else, or a run without `resume` / `overwrite`, is one AttnconvError, and is left as it was.
    """
    if out.exists() and not out.is_dir():
        raise AttnconvError(f"--out {out} is a file; give a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except OSError as err:
        raise AttnconvError(f"--out {out}: cannot write there ({describe_os_error(err)}); choose another directory")\
            from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise AttnconvError(f"--out {out}: not writable; choose another directory")
    names = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE and not is_temporary(p.name, RUN_FILES))
    if not (out / CONFIG_FILE).exists() and not (out / CONFIG_FILE).is_symlink():
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise AttnconvError(f"--out {out} is not empty and holds no attnconv run ({shown}); "
                                "choose a new or empty directory")
        return []
    try:  # only a config.json that attnconv wrote makes the folder a run to resume or replace
        read_config(out)
    except AttnconvError as err:
        raise AttnconvError(f"--out {out} is not an attnconv run: its {CONFIG_FILE} is not an attnconv run config "
                            f"({str(err).split(': ', 1)[-1]}); nothing was changed there; choose a new or empty "
                            "directory") from None
    if resume:
        return []
    if not overwrite:
        raise AttnconvError(f"--out {out} already holds an attnconv run; pass --resume to continue it, --overwrite "
                            "to replace it, or choose a new --out")
    replaced = [n for n in names if n in RUN_FILES]
    for name in replaced:
        path = out / name
        if path.is_symlink() or not path.is_file():
            raise AttnconvError(f"--out {out}: {name} is not a regular file (a folder or a link), so it is not a file "
                                "attnconv wrote; move it away, or choose another --out")
    board = out / TENSORBOARD_DIR
    if board.is_symlink() or board.exists():
        if board.is_symlink() or not board.is_dir():
            raise AttnconvError(f"--out {out}: {TENSORBOARD_DIR} is not a folder (a file or a link), so it is not the "
                                "one `train --tensorboard` wrote; move it away, or choose another --out")
        replaced.append(TENSORBOARD_DIR)
    return replaced

def replace_run_files(out: Path, names: list[str]) -> None:
    """--overwrite, once every check has passed: remove the old run's files (`claim_run_dir` named them)."""
    if not names:
        return
    sys.stderr.write(f"--overwrite: replacing the run in {out} ({', '.join(names)}); other files stay\n")
    sys.stderr.flush()
    for name in names:
        if name == TENSORBOARD_DIR:  # the run's own folder of event files (`claim_run_dir` checked it is one)
            shutil.rmtree(out / name)
        else:
            (out / name).unlink()

def trim_logs(out: Path, rows: int, snapshots: int | None, step_rows: int = 0) -> None:
    """Keep exactly the metrics rows, steps.csv rows (and heads.jsonl lines, unless `snapshots` is None)
    a checkpoint knows of: what was logged after the last checkpoint is replayed, and must not be logged twice."""
    kept = read_metrics(out, limit=rows)
    atomic_write(out / METRICS_FILE, write_bytes(metrics_text(kept).encode()))
    trim_steps(out, step_rows)
    if snapshots is not None:
        lines = read_heads(out, limit=snapshots)
        atomic_write(out / HEADS_FILE, write_bytes("".join(map(heads_line, lines)).encode()))
