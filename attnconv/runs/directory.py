"""The run directory contract of `attnconv train`: which folder it may write, what --overwrite replaces,
and the logs a resumed run keeps (docs/failure-model.md)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from attnconv.errors import AttnconvError, DamagedFile, ParameterError
from attnconv.fileio import (
    LOCK_FILE,
    TMP_SUFFIX,
    DirectoryLock,
    atomic_write,
    dangling_link,
    describe_os_error,
    fsync_dir,
    interrupts_held,
    is_temporary,
    marked,
    not_a_folder,
    permission_fix,
    permission_words,
    refused_by_place,
    unreadable_folder,
    write_bytes,
)
from attnconv.pathwords import resume_command
from attnconv.runs.files import (
    CONFIG_FILE,
    HEADS_FILE,
    LOG_FIX,
    METRICS_FILE,
    RUN_FILES,
    STATE_FILE,
    STEPS_COLUMNS,
    STEPS_FILE,
    TENSORBOARD_DIR,
    WEIGHTS_FILE,
    NotARunConfig,
    read_config,
    state_head,
)
from attnconv.runs.heads_file import heads_line, read_heads
from attnconv.runs.logs_file import metrics_text, read_metrics, read_steps
from attnconv.runs.logs_record import judged_heads, logs_problem, state_logs, with_last_line
from attnconv.runs.record import recorded_metadata

# --overwrite keeps the old run here, inside the run directory, until the new run's first checkpoint
# (`SetAside`); renamed to DISCARDED before it is deleted, so a half-deleted one is never restored.
SET_ASIDE = ".replaced-run" + TMP_SUFFIX
DISCARDED = ".replaced-run.done" + TMP_SUFFIX
_MANIFEST = "manifest.json"
# What `train --tensorboard` writes into tensorboard/ (torch's SummaryWriter): only these files there are ours.
EVENTS_PREFIX = "events.out.tfevents."


def run_config(out: Path, *, foreign_only: bool = False) -> dict:
    """config.json of the run `train` is to resume or replace in `out` (`read_config`); a file attnconv did not
    write (a Hugging Face model folder's) or cannot read is `is not an attnconv run`, naming {out}
    (`foreign_only`: only one that holds no "config" object; a damaged run config is named as `read_config` names
    it)."""
    try:
        return read_config(out)
    except DamagedFile as err:
        if foreign_only and not isinstance(err, NotARunConfig):
            raise
        raise ParameterError("out", out, f"is not an attnconv run: its {CONFIG_FILE} is not an attnconv run config "
                             f"({err.reason}); nothing was changed there; choose a new or empty directory") from None


def claim_run_dir(out: Path, lock: DirectoryLock, *, resume: bool, overwrite: bool) -> list[str]:
    """Take `out` for `attnconv train`, under the run directory contract (docs/failure-model.md).

    `out` is created if missing and locked (`lock`, one writer); it must then be empty, or hold
    an attnconv run (a config.json that `read_config` accepts) that `resume` continues or
    `overwrite` replaces. Returns the files (relative paths) that `overwrite` will replace: the run's
    files and the event files in its tensorboard/ folder, nothing else there. Nothing is moved here
    (`SetAside` does, once every other check has passed). An old run that an interrupted --overwrite
    had set aside is first put back (`recover_set_aside`). A folder holding anything else, or a run
    without `resume` / `overwrite`, is one AttnconvError, and is left as it was.
    """
    if out.exists() and not out.is_dir():
        raise ParameterError("out", out, f"is not a directory ({not_a_folder(out)}); give a directory")
    link = dangling_link(out)
    if link is not None:  # mkdir would say "File exists"
        raise ParameterError("out", out, f": {link}; give the run's folder itself, or fix the link")
    kept = (resume or overwrite) and out.is_dir()

    def fix() -> str:  # asked of the file system only when something is refused
        # A run to resume or replace stays where it is: its folder's permission is the fix, not another directory.
        # A new run's fix is another place, unless a flag or a read-only file system refuses it there: those are named.
        return permission_fix(out) if kept else (refused_by_place(out) or "choose another directory")

    try:
        out.mkdir(parents=True, exist_ok=True)
        lock.acquire()  # opens the folder to read: a folder that can be written but not read fails here
    except PermissionError:
        raise ParameterError("out", out, f": {permission_words(out)}; {fix()}") from None
    except OSError as err:  # a read-only file system, a flag: its words carry the fix; else the OS's, and another place
        why = f": cannot write there: {permission_fix(out)}" if err.errno in (errno.EROFS, errno.EPERM) else \
            f": cannot write there ({describe_os_error(err)}); choose another directory"
        raise ParameterError("out", out, why) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ParameterError("out", out, f": not writable; {fix()}")
    flag = marked(out)  # append-only: files can be made there, but none renamed into place, moved aside or removed
    if flag:
        raise ParameterError("out", out, f": {flag}; a run's files are written whole and put in place, which it "
                             "refuses")
    recover_set_aside(out)
    names = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE and not is_temporary(p.name, RUN_FILES))
    if not (out / CONFIG_FILE).exists() and not (out / CONFIG_FILE).is_symlink():
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise ParameterError("out", out, f"is not empty and holds no attnconv run ({shown}); "
                                 "choose a new or empty directory")
        return []
    run_config(out)  # only a config.json that attnconv wrote makes the folder a run to resume or replace
    if resume:
        for name in (METRICS_FILE, HEADS_FILE, STEPS_FILE):  # the logs a resume appends to, as they are
            if (out / name).is_file() and not os.access(out / name, os.W_OK):
                raise ParameterError("out", out, f": this user may not write its {name}, which the run appends to; "
                                     f"{permission_fix(out / name)}")
        return []
    if not overwrite:
        raise ParameterError("out", out, "already holds an attnconv run; pass {resume} to continue it, {overwrite} "
                             "to replace it, or choose a new {out}", mentions=("resume", "overwrite", "out"))
    replaced = [n for n in names if n in RUN_FILES]
    for name in replaced:
        path = out / name
        if path.is_symlink() or not path.is_file():
            raise ParameterError("out", out, f": {name} is not a regular file (a folder or a link), so it is not a "
                                 "file attnconv wrote; move it away, or choose another {out}", mentions=("out",))
    return replaced + event_files(out)


def event_files(out: Path) -> list[str]:
    """The TensorBoard event files `train --tensorboard` wrote into out/tensorboard/ (as relative paths):
    regular files named events.out.tfevents.* directly in a real folder. Anything else there (a user's
    notes, sub-folders, a link) is not the run's."""
    board = out / TENSORBOARD_DIR
    if board.is_symlink() or not board.is_dir():
        return []
    if not os.access(board, os.R_OK | os.X_OK):  # its event files, the run's, cannot be told from a user's files
        raise ParameterError("out", out, f": this user may not list its {TENSORBOARD_DIR}/ folder, whose event files "
                             f"are the run's; {permission_fix(board)}")
    return sorted(f"{TENSORBOARD_DIR}/{p.name}" for p in board.iterdir()
                  if p.name.startswith(EVENTS_PREFIX) and not p.is_symlink() and p.is_file())


class SetAside:
    """--overwrite's old run, kept until the new run has something to replace it with.

    `move()` (once every check has passed) moves the old run's files (`claim_run_dir` named them) into
    out/.replaced-run.attnconv-tmp/, with a manifest written first; `discard()` deletes them once the new
    run has written its first checkpoint; `restore()` puts them back, removing what the new run wrote
    (its run files and event files, nothing else), when the command fails before then. A process killed
    meanwhile leaves the folder for the next `train` into `out` to restore (`recover_set_aside`).
    """

    def __init__(self, out: Path, names: list[str]):
        self.out, self.names = out, list(names)
        self.folder = out / SET_ASIDE
        self.pending = False  # moved, neither discarded nor restored yet
        self.moved = False  # move() has begun: the old run is no longer as it was

    def move(self) -> None:
        if not self.names:
            return
        board = self.out / TENSORBOARD_DIR
        manifest = {"files": self.names, "board": board.is_dir() and not board.is_symlink()}
        self.moved = True
        self.folder.mkdir()
        self.pending = True
        atomic_write(self.folder / _MANIFEST, write_bytes(json.dumps(manifest).encode()))
        for name in self.names:
            (self.folder / name).parent.mkdir(exist_ok=True)
            os.replace(self.out / name, self.folder / name)
        if manifest["board"] and not any(board.iterdir()):
            board.rmdir()  # it held the old run's event files only (`restore` makes it again)
        fsync_dir(self.folder)
        fsync_dir(self.out)

    def discard(self) -> None:
        """The new run's first checkpoint is written: the old run goes for good (renamed first, so a half-deleted
        one is never taken for a run to restore; Ctrl-C held back until it is gone)."""
        if self.pending:
            with interrupts_held():
                os.replace(self.folder, self.out / DISCARDED)
                self.pending = False
                shutil.rmtree(self.out / DISCARDED, ignore_errors=True)

    def restore(self) -> None:
        """The command failed before the new run's first checkpoint: the old run comes back as it was."""
        if self.pending:
            _restore(self.out, self.folder)
            self.pending = False


def set_aside_pending(out: Path) -> bool:
    """Whether `out` holds an old run that `train --overwrite` set aside (its manifest written) and has not put
    back or deleted yet: that train is still before its first checkpoint, or was killed there. The first look
    every reader of a run takes inside its folder: a folder that cannot be entered is one error naming it."""
    try:
        return (out / SET_ASIDE / _MANIFEST).is_file()
    except PermissionError:
        raise AttnconvError(unreadable_folder(out)) from None
    except OSError as err:  # the path itself too long: said of the path given, not of the manifest looked for inside
        if err.errno != errno.ENAMETOOLONG:
            raise
        raise AttnconvError(f"{out}: not a run directory (its path is too long for this system: a name past "
                            f"{os.pathconf('/', 'PC_NAME_MAX')} bytes, or all past {os.pathconf('/', 'PC_PATH_MAX')}); "
                            "give the run's folder by a shorter path") from None


def replaced_run_line(out: Path) -> str:
    """Why a reader of `out` finds no whole run there while `set_aside_pending(out)`: the words after `out`'s name
    (or its weights file's) in the error, and the fix."""
    return (f"a `train --overwrite` into {out} has not reached its first checkpoint (it is running, or was "
            f"killed), and the run it replaces is kept in {out / SET_ASIDE}; if no train is running there, "
            f"`{resume_command(out)}` puts it back first (and then continues it, if it was not finished)")


def check_not_replaced(out: Path) -> None:
    """One AttnconvError if `out` is a run being replaced (`replaced_run_line`): what its folder holds then is the
    new run's first files (config.json, a row or two of logs), not a run to read."""
    if set_aside_pending(out):
        raise AttnconvError(f"{out}: no whole run: {replaced_run_line(out)}")


def resumed_folder(out: Path) -> Path:
    """The folder whose config.json `train --resume` into `out` continues: `out`, or the set-aside folder where an
    `--overwrite` killed before its new run's first checkpoint left the old run's config.json (`claim_run_dir`
    puts that run back before anything else; the config.json in `out` is then the killed new run's)."""
    aside = out / SET_ASIDE
    if set_aside_pending(out) and (aside / CONFIG_FILE).is_file() and not (aside / CONFIG_FILE).is_symlink():
        return aside
    return out


def recover_set_aside(out: Path) -> None:
    """Put back an old run that an --overwrite killed before its new run's first checkpoint left set aside
    (one line on stderr says so), and delete one whose new run had checkpointed. Called with the lock held:
    no live process is using either folder."""
    shutil.rmtree(out / DISCARDED, ignore_errors=True)
    if (out / SET_ASIDE).is_dir() and not (out / SET_ASIDE).is_symlink():
        if _restore(out, out / SET_ASIDE):
            sys.stderr.write(f"--out {out}: restored the run that an interrupted --overwrite had set aside "
                             "(the new run never reached its first checkpoint)\n")
            sys.stderr.flush()


def _restore(out: Path, folder: Path) -> bool:
    """Move the files set aside in `folder` back into `out`, after removing the files of the new run (run
    files and event files the old run did not have); False if nothing had been moved (no manifest)."""
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
        names, had_board = list(manifest["files"]), bool(manifest["board"])
    except (OSError, ValueError, KeyError, TypeError):  # killed before anything was moved
        # Then the folder holds at most the manifest's temporary; anything else is not attnconv's to delete.
        foreign = sorted(p.name for p in folder.iterdir() if not is_temporary(p.name, (_MANIFEST,)))
        if foreign:
            raise ParameterError("out", out, f": {folder.name} holds files attnconv did not set aside "
                                 f"({', '.join(foreign[:3])}); move it away, or choose another {{out}}",
                                 mentions=("out",)) from None
        shutil.rmtree(folder, ignore_errors=True)
        return False
    for name in [*RUN_FILES, *event_files(out)]:
        path = out / name
        if name not in names and path.is_file() and not path.is_symlink():
            path.unlink()  # the new run's
    for name in names:
        if (folder / name).exists():  # else never moved: still in place
            (out / name).parent.mkdir(exist_ok=True)
            os.replace(folder / name, out / name)
    board = out / TENSORBOARD_DIR
    if not had_board and board.is_dir() and not board.is_symlink() and not any(board.iterdir()):
        board.rmdir()  # the new run's empty folder
    fsync_dir(out)
    shutil.rmtree(folder)
    return True


def resume_problem(out: Path, heads: bool) -> str | None:
    """Why `train --resume` of the run in `out` would refuse its logs as its state.pt counts them (`trim_logs`' checks,
    nothing written; `heads`: the run records heads.jsonl), or None where it would take them."""
    try:
        head = state_head(out / STATE_FILE)
        progress = head["progress"]
        meta = state_logs(head["logs"], progress["epoch"], progress["step"]) if isinstance(head.get("logs"), str) \
            else recorded_metadata(out / WEIGHTS_FILE)
        trim_logs(out, progress["rows"], progress["snapshots"] if heads else None, progress.get("step_rows", 0),
                  step=progress["step"], write=not progress.get("finished"), metadata=meta, dry=True)
    except (AttnconvError, OSError, KeyError, TypeError) as err:
        return str(err) or type(err).__name__
    return None


def resume_cuts(out: Path, heads: bool) -> bool:
    """Whether `train --resume` of the run in `out` would continue it, cutting what its logs hold past its last
    checkpoint (damage there included): the run is unfinished and its logs pass the resume's checks (`resume_problem`).
    A finished run's resume writes nothing to its logs, so it mends none of them."""
    try:
        finished = state_head(out / STATE_FILE)["progress"].get("finished")
    except (AttnconvError, OSError, KeyError, TypeError, AttributeError):
        return False
    return not finished and resume_problem(out, heads) is None


def trim_logs(out: Path, rows: int, snapshots: int | None, step_rows: int = 0, *, step: int | None = None,
              write: bool = True, metadata: dict[str, str] | None = None, dry: bool = False) -> None:
    """Keep exactly the metrics rows, steps.csv rows (and heads.jsonl lines, unless `snapshots` is None)
    a checkpoint knows of: what was logged after the last checkpoint is replayed, and must not be logged twice.

    Logs that lost what the checkpoint counts (rows or lines deleted by hand, a file restored from an older
    copy) are one AttnconvError naming the file, before any file is changed: fewer rows than counted, or,
    with `step` (the checkpoint's), a kept row logged after that step (a row before it was deleted), and kept rows
    other than the checkpoint's record of them (`metadata`, the checkpoint's; default model.safetensors'). `write`
    False: checked only (a finished run, which replays nothing, and after whose last checkpoint nothing is logged: a
    row past its count is refused). `dry`: checked only, as a resume would check them."""
    meta = metadata
    if meta is None:
        try:  # a last line without its newline that the checkpoint vouches for is whole
            meta = recorded_metadata(out / WEIGHTS_FILE)
        except AttnconvError:  # weights this user may not read: they vouch for nothing here
            meta = {}
    done = not write
    # A finished run's log deleted (the readers' fix for a damaged one) is not judged: nothing is replayed into it.
    gone = {name for name in (METRICS_FILE, STEPS_FILE, HEADS_FILE) if done and not os.path.lexists(out / name)}
    metrics = None if METRICS_FILE in gone else _kept(
        out / METRICS_FILE, with_last_line(out, "metrics", _resumed(read_metrics, out, rows + 1, past=not done), meta),
        rows, "rows", step, done)
    if STEPS_FILE not in gone:
        steps = _resumed(read_steps, out, step_rows + 1, past=not done)
        if len(steps) < step_rows:  # a counted last row re-saved without its newline (no crash cuts a counted one)
            steps = _resumed(lambda o, limit: read_steps(o, limit, unterminated=True), out, step_rows + 1,
                             past=not done)
        steps = _kept(out / STEPS_FILE, steps, step_rows, "rows", step, done)
    heads = None if snapshots is None or HEADS_FILE in gone or done and _finished_heads_damaged(out, meta) else _kept(
        out / HEADS_FILE, with_last_line(out, "heads", _resumed(read_heads, out, snapshots + 1, "lines", past=not done),
                                         meta), snapshots, "lines", step, done)
    for name, what, kept in ((METRICS_FILE, "metrics", metrics), (HEADS_FILE, "heads", heads)):
        problem = None if kept is None else logs_problem(meta, what, kept)  # edited since the checkpoint vouched
        if problem is not None:
            raise DamagedFile(f"{out / name}: {problem}", "restore it from a copy of the run, or train into a new "
                              "--out (resuming would take its rows as the run's)")
    if not write or dry:  # a finished run: nothing is replayed, and a user's columns or keys are not rewritten away
        return
    atomic_write(out / METRICS_FILE, write_bytes(metrics_text(metrics).encode()))
    atomic_write(out / STEPS_FILE, write_bytes(metrics_text(steps, STEPS_COLUMNS).encode()))
    if heads is not None:
        atomic_write(out / HEADS_FILE, write_bytes("".join(map(heads_line, heads)).encode()))


def _finished_heads_damaged(out: Path, meta: dict[str, str]) -> bool:
    """Whether a finished run's heads.jsonl has damaged lines, judged as its readers judge it (`Run.heads`): its sound
    lines must each be a snapshot the checkpoint recorded (one DamagedFile if not); the damaged ones are the readers'
    to skip, as nothing is replayed into the file. False where no line is damaged (checked whole, as any log)."""
    _, skipped, problem = judged_heads(out, meta)
    if problem is not None:
        raise DamagedFile(f"{out / HEADS_FILE}: {problem}", "restore it from a copy of the run, or delete it (a finished "
                          "run's resume does not need it)")
    return bool(skipped)


def _resumed(read, out: Path, limit: int, unit: str = "rows", *, past: bool = False) -> list[dict[str, Any]]:
    """`read(out, limit=limit)`, a damaged log named with the fix a resume can take, not the readers' `LOG_FIX`
    ("or delete it", which the next resume refuses as rows lost). `past`: the last of the `limit` is the one past the
    checkpoint's count, which resuming cuts; damaged, it is cut unread (the first `limit - 1` read alone)."""
    try:
        return read(out, limit=limit)
    except DamagedFile as err:
        if past:
            try:
                return read(out, limit=limit - 1)
            except DamagedFile:
                pass  # the damage is in what the checkpoint counts: said as it was
        if not err.fix.startswith(LOG_FIX):
            raise
        raise err.with_fix("restore it from a copy of the run, or train into a new --out (without it the run cannot "
                           f"be resumed: the checkpoint counts its {unit})") from None


def _kept(path: Path, records: list[dict[str, Any]], count: int, unit: str, step: int | None,
          finished: bool = False) -> list[dict[str, Any]]:
    """`records` (a log's first `count` and the one after, if any), checked against the checkpoint that counts
    `count` of them; the first `count`. The one after is cut by resuming: it must have been logged after the
    checkpoint's step (or repeat a kept one), else the checkpoint and the log disagree and cutting would lose it;
    a `finished` run's last checkpoint follows its last row, so it has none."""
    fix = "restore the file from a copy of the run, or train into a new {out}; resuming would lose them for good"
    records, dropped = records[:count], (records[count] if len(records) > count else None)
    if dropped is not None and finished:
        raise DamagedFile(f"{path}: {unit[:-1]} {count + 1} (step {int(dropped['step'])}) comes after the finished "
                          f"run's last checkpoint (step {step}), which counts {count} {unit} and is written after its "
                          "last: it is not the run's (an edited copy, or another run's)",
                          f"restore the file from a copy of the run, or delete its {unit} after the first {count}")
    if dropped is not None and step is not None and dropped["step"] <= step and dropped not in records:
        raise ParameterError(None, None, f"{path}: {unit[:-1]} {count + 1} is of step {int(dropped['step'])}, not "
                             f"after the checkpoint's step {step}, yet the checkpoint counts only {count} {unit} (the "
                             "log or the checkpoint was edited); resume from another copy of the run, or train into a "
                             "new {out}; resuming would lose it for good", mentions=("out",))
    if len(records) < count:
        held = f"{len(records)} {unit if len(records) != 1 else unit[:-1]}"
        raise ParameterError(None, None, f"{path}: holds {held}, the checkpoint counts {count} (some were deleted "
                             f"or cut after they were written); {fix}", mentions=("out",))
    late = next((i for i, r in enumerate(records, 1) if step is not None and r["step"] > step), None)
    if late is not None:
        raise ParameterError(None, None, f"{path}: {unit[:-1]} {late} is of step {int(records[late - 1]['step'])}, "
                             f"after the checkpoint's step {step}, so {unit} before it were deleted; {fix}", mentions=("out",))
    return records
