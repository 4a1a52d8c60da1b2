"""What a checkpoint records of the logs it was written after, and the check that the logs a command reads are those.

model.safetensors' metadata holds, under `LOGS_KEY`, {"rows": metrics.csv rows the checkpoint counts, "metrics": a
digest of them, "snapshots": heads.jsonl lines it counts, "heads": a digest of them, "finished": true for a finished
run's last} (`logs_record`), written with every checkpoint, and in state.pt under "logs" (`checkpoint_logs`: the
later checkpoint's record vouches, state.pt's where the weights are lost, damaged or an older copy). `logs_problem`
compares the logs read now with it: fewer rows than the checkpoint counts (cut short, an older copy) or other rows
(another run's, other seeds', an edited copy) are one line naming the file. Rows past the count are not judged,
but in a finished run: a run stopped between its last row and its checkpoint has one more (`train --resume` cuts it).
Weights without the record (written before it, converted runs) are not checked.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from attnconv.errors import AttnconvError
from attnconv.runs.files import STATE_FILE, WEIGHTS_FILE, state_head
from attnconv.runs.heads_file import read_heads, read_heads_skipping
from attnconv.runs.logs_file import read_metrics
from attnconv.runs.record import recorded_metadata, recorded_step, state_record_problem

LOGS_KEY = "attnconv_logs"
# checkpoint_logs' mark on state.pt's record where model.safetensors, which may be a later checkpoint, could not be read
UNREAD_KEY = "attnconv_weights_unread"

# What a run's training decides in metrics.csv (not its timing: a copy with its seconds edited is the same run).
TRAINED_COLUMNS = ("epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "lr")


def content_digest(value: Any) -> str:
    """A short digest of JSON-able `value`: dict keys in any order, and numbers to 6 significant digits, the same."""
    return hashlib.blake2b(json.dumps(_rounded(value), sort_keys=True).encode(), digest_size=8).hexdigest()


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def logs_digest(rows: list[dict[str, Any]]) -> str | None:
    """What tells one run's metrics.csv from another's, as read: the columns its training decides, by the header's
    names, to 6 significant digits (a copy saved with a byte-order mark, CRLF, its columns in another order, a
    column added, its timing or a value edited past the sixth digit is the same), or None for no rows."""
    return content_digest([{k: row.get(k) for k in TRAINED_COLUMNS} for row in rows]) if rows else None


def heads_digest(snapshots: list[dict[str, Any]]) -> str | None:
    """What tells one run's heads.jsonl from another's: each snapshot's epoch, step and heads, or None for none."""
    return content_digest([[s["epoch"], s["step"], s["layers"]] for s in snapshots]) if snapshots else None


def snapshot_digest(snapshot: dict[str, Any]) -> str:
    """One snapshot's digest (its epoch, step and heads): what vouches for each line where others are damaged."""
    return content_digest([snapshot["epoch"], snapshot["step"], snapshot["layers"]])


def logs_record(run_dir: Path, rows: int, snapshots: int | None, finished: bool = False) -> str | None:
    """The `LOGS_KEY` metadata of a checkpoint that counts `rows` metrics.csv rows and `snapshots` heads.jsonl lines
    (None: the run records no heads), from the files as they are now, and whether it is a finished run's last (after
    which nothing is logged); None where they cannot be read whole (the checkpoint then vouches for nothing, and
    their own readers say what is wrong)."""
    try:
        metrics = read_metrics(run_dir)[:rows]
        heads = read_heads(run_dir)[:snapshots] if snapshots is not None else None
    except (AttnconvError, OSError):
        return None
    if len(metrics) != rows or (heads is not None and len(heads) != snapshots):
        return None
    record: dict[str, Any] = {"rows": rows, "metrics": logs_digest(metrics)}
    if heads is not None:
        record.update(snapshots=snapshots, heads=heads_digest(heads), heads_each=[snapshot_digest(s) for s in heads])
    if finished:
        record["finished"] = True
    return json.dumps(record, sort_keys=True)


def checkpoint_logs(run_dir: Path) -> dict[str, str]:
    """What vouches for a run's logs: the record of its later checkpoint, model.safetensors' metadata or state.pt's
    (`files.state_head`), where state.pt is this run's: state.pt's where the weights record none (missing, their
    metadata damaged, written before the record) or are an older copy; else the weights' metadata ({} without
    weights), which vouches for nothing."""
    meta = recorded_metadata(run_dir / WEIGHTS_FILE)
    head = state_head(run_dir / STATE_FILE) if os.path.lexists(run_dir / STATE_FILE) else None
    if head is None or not isinstance(head.get("logs"), str):
        return meta
    step, saved = recorded_step(meta), head["progress"]["step"]
    if LOGS_KEY in meta and step is not None and step >= saved:  # the weights' checkpoint is the later (or the same)
        return meta
    try:
        if state_record_problem(head, run_dir) is not None:
            return meta  # another run's state.pt (another seed's) vouches for nothing here
    except AttnconvError:  # config.json's own reader says what is wrong with it
        return meta
    record = state_logs(head["logs"], head["progress"]["epoch"], head["progress"]["step"])
    if not meta:  # no weights, or weights whose header or metadata does not read: a later checkpoint, maybe
        weights = run_dir / WEIGHTS_FILE
        record[UNREAD_KEY] = "is missing" if not os.path.lexists(weights) else \
            "is a link to nowhere" if not os.path.exists(weights) else "is a directory" if os.path.isdir(weights) \
            else "is no regular file" if not os.path.isfile(weights) else "does not read (damaged)"
    return record


def state_logs(logs: str, epoch: int, step: int) -> dict[str, str]:
    """state.pt's record of the logs (its "logs") as a checkpoint's metadata holds it, with the checkpoint's epoch and
    step: what `logs_problem` and the other readers of a record take."""
    return {LOGS_KEY: logs, "epoch": str(epoch), "step": str(step)}


def recorded_finished(metadata: dict[str, str]) -> bool:
    """Whether a checkpoint's metadata records a finished run's last checkpoint (a record attnconv writes)."""
    record = _recorded(metadata)
    return record is not None and record.get("finished") is True


def recorded_unfinished(metadata: dict[str, str]) -> bool:
    """Whether a checkpoint's metadata records a run that had not finished when it was written (a record attnconv
    writes, without "finished": a run stopped or still going; converted runs and runs from before the record have
    none, and are not said to be unfinished)."""
    record = _recorded(metadata)
    return record is not None and record.get("finished") is not True


def _recorded(metadata: dict[str, str]) -> dict[str, Any] | None:
    """The record, or None where there is none or it is not one attnconv writes (edited by hand: it vouches for
    nothing, and sound logs are not blamed for it)."""
    try:
        record = json.loads(metadata[LOGS_KEY], object_pairs_hook=_no_key_twice)
    except (KeyError, TypeError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("finished", False), bool):
        return None
    each = record.get("heads_each", [])
    if not isinstance(each, list) or not all(isinstance(d, str) for d in each) or \
            "heads_each" in record and len(each) != record.get("snapshots"):
        return None
    epoch = metadata.get("epoch")  # the checkpoint's own: a row per epoch done, and one for a run ended mid-epoch
    if epoch is not None and not (isinstance(epoch, str) and epoch.isascii() and epoch.isdigit() and len(epoch) < 20):
        return None  # not an epoch attnconv writes
    if epoch is not None and record.get("rows") not in (int(epoch), int(epoch) + 1):
        return None
    if isinstance(record.get("snapshots"), int) and isinstance(record.get("rows"), int) \
            and record["snapshots"] > record["rows"] + 1:  # a line at the start and one per row, at most
        return None
    for count, digest in (("rows", "metrics"), ("snapshots", "heads")):
        n, d = record.get(count), record.get(digest)
        if count == "snapshots" and count not in record:
            continue
        if isinstance(n, bool) or not isinstance(n, int) or n < 0 or (n == 0) != (d is None) or \
                not (d is None or isinstance(d, str)):
            return None
    return record


def logs_problem(metadata: dict[str, str], what: str, entries: list[dict[str, Any]]) -> str | None:
    """Why the log `what` ("metrics" for metrics.csv's rows, "heads" for heads.jsonl's snapshots), read as `entries`,
    is not the one the run's last checkpoint (its weights' `metadata`) was written after; None where it is, or the
    weights record nothing of it."""
    record = _recorded(metadata)  # its counts, where present, are whole numbers >= 0
    count_key, digest = ("rows", logs_digest) if what == "metrics" else ("snapshots", heads_digest)
    if record is None or count_key not in record:
        return None
    count, noun = record[count_key], "row" if what == "metrics" else "snapshot"
    if len(entries) < count:
        return (f"it holds {_many(len(entries), noun)}, and the run's last checkpoint was written after {count}: {noun}s were "
                "lost (cut short, or an older copy of the file)")
    if digest(entries[:count]) != record.get(what):
        first = f"its first {count} {noun}s are" if count > 1 else f"its first {noun} is"
        return f"{first} not what the run's last checkpoint was written after (another run's, or an edited copy)"
    if not record.get("finished") and len(entries) > count + 1:  # one row ends an epoch, and a checkpoint follows
        return (f"it holds {_many(len(entries) - count, noun)} after the {count} the run's last checkpoint was written "
                f"after, where a run stopped between a row and its checkpoint has one: the others are not the run's "
                f"(an edited copy, or another run's; its {noun}s after the first {count + 1} can be deleted)")
    if record.get("finished") and len(entries) > count:
        extra = len(entries) - count
        return (f"it holds {_many(extra, noun)} after the {count} the finished run's last checkpoint was written "
                f"after, which follows its last: {'they are' if extra > 1 else 'it is'} not the run's (an edited copy, "
                f"or another run's; its {noun}s after the first {count} can be deleted)")
    return None


def unvouched_problem(metadata: dict[str, str], what: str, entries: list[dict[str, Any]], skipped: int = 0
                      ) -> str | None:
    """Where `metadata` is state.pt's record beside weights that could not be read (`checkpoint_logs`' UNREAD_KEY:
    missing, a link to nowhere, damaged: a later checkpoint, maybe) and the log `what` holds the entries it counts
    and more: words naming the weights, which alone could vouch for the later entries (not the log, which may be
    sound); else None. `skipped`: damaged lines left out of `entries`, which may be snapshots it counts (a line
    deleted is not: the log is then named)."""
    record = _recorded(metadata)
    key, noun = ("rows", "row") if what == "metrics" else ("snapshots", "snapshot")
    if UNREAD_KEY not in metadata or record is None or not isinstance(record.get(key), int):
        return None
    count, each = record[key], record.get("heads_each") if what == "heads" else None
    if each is not None:  # each snapshot by its own digest: damaged lines skipped before it shift none
        early = [snapshot_digest(e) for e in entries if e["step"] <= int(metadata["step"])]
        recorded = iter(each)
        if len(early) == len(entries) or len(early) + skipped < count or not all(d in recorded for d in early):
            return None  # all its own, in the record's order, but those damaged
        count = len(early)
    elif len(entries) <= count or logs_problem(metadata, what, entries[:count]) is not None:
        return None
    return (f"the file {metadata[UNREAD_KEY]}, and {STATE_FILE}, an earlier checkpoint (step {metadata['step']}), "
            f"vouches for {_many(count, noun)} of the {len(entries)} the {what} log holds: the later ones are the "
            f"run's only where {WEIGHTS_FILE} was a later checkpoint, and it is what can vouch for them")


def recorded_digests(metadata: dict[str, str]) -> list[str]:
    """The digest of each heads.jsonl snapshot the checkpoint recorded ([] where it recorded none)."""
    record = _recorded(metadata)
    return list(record.get("heads_each", [])) if record is not None else []


def skipped_heads_problem(metadata: dict[str, str], snapshots: list[dict[str, Any]]) -> str | None:
    """Why the sound snapshots of a heads.jsonl whose damaged lines were skipped are not the run's: each must be one
    the checkpoint recorded (`snapshot_digest`), in order; past them, one only in a run not finished (logged after
    its checkpoint). None where they are, or the record holds no digest of each (written before it)."""
    record = _recorded(metadata)
    if record is None or "heads_each" not in record:
        return None
    recorded, at, after, step = record["heads_each"], 0, 0, recorded_step(metadata)
    for snapshot in snapshots:
        digest = snapshot_digest(snapshot)
        if digest in recorded[at:]:
            at = recorded.index(digest, at) + 1
            continue
        after += 1  # past the recorded ones: a run not finished writes one after its last checkpoint, at most
        logged_after = snapshot["step"] > step if step is not None else at == len(recorded)
        if record.get("finished") or not logged_after or after > 1:
            return (f"its snapshot of epoch {snapshot['epoch']}, step {snapshot['step']} is not one the run's last "
                    "checkpoint was written after (an edited copy, or another run's)")
    return None


def _many(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def with_last_line(run_dir: Path, what: str, entries: list[dict[str, Any]], metadata: dict[str, str]
                   ) -> list[dict[str, Any]]:
    """`entries` of the log `what` ("metrics" or "heads") read again with a last line that lacks its newline, where
    the checkpoint counts that line and it is what the checkpoint recorded (a file saved again without its final
    newline, as editors and CSV tools save them: not a line a crash cut short, which no checkpoint counts); else
    `entries`."""
    record = _recorded(metadata)
    if record is None or record.get("rows" if what == "metrics" else "snapshots") != len(entries) + 1:
        return entries
    try:
        whole = (read_metrics if what == "metrics" else read_heads)(run_dir, unterminated=True)
    except (AttnconvError, OSError):
        return entries
    return whole if len(whole) == len(entries) + 1 and logs_problem(metadata, what, whole) is None else entries


def judged_heads(run_dir: Path, metadata: dict[str, str]) -> tuple[list[dict[str, Any]], list[int], str | None]:
    """heads.jsonl in `run_dir` as every reader takes it: (its sound snapshots, the numbers of the damaged lines
    skipped, the problem with the sound ones or None). A last line saved without its newline is whole where the
    checkpoint (`metadata`) recorded it, alone (`with_last_line`) or beside other damaged lines (its digest
    recorded); where lines were skipped, each sound one must be a snapshot the checkpoint recorded, in order
    (`skipped_heads_problem`)."""
    records, skipped = read_heads_skipping(run_dir)
    if len(skipped) == 1:
        whole = with_last_line(run_dir, "heads", records, metadata)
        records, skipped = whole, [] if len(whole) > len(records) else skipped
    elif skipped:
        whole, left = read_heads_skipping(run_dir, unterminated=True)
        if len(whole) == len(records) + 1 and len(left) == len(skipped) - 1 \
                and snapshot_digest(whole[-1]) in recorded_digests(metadata):
            records, skipped = whole, left
    return records, skipped, skipped_heads_problem(metadata, records) if skipped else None


def _no_key_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):  # attnconv writes each key once
        raise ValueError("a key twice")
    return dict(pairs)
