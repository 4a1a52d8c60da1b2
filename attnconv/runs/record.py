"""What model.safetensors records of config.json: the whole of it, as it was written.

An edit of config.json that changes the tensors' shapes (hidden 8 -> 16) is caught when the weights do
not fit the model it describes. An edit that keeps them (a normalization's std, a class renamed, the
epochs, a converted run's alpha, an option that changes no tensor) would give other numbers, or show values
that are not the run's, with exit 0; so would a model.safetensors copied from another run of the same
shapes (another seed). attnconv writes config.json once, when a run starts (`train`) or is made
(`convert`), and never rewrites it, so every file of weights it writes for a run records config.json
in its metadata (`config_record`), and every command that reads the run compares (`record_problem`):
the two files disagree only when one of them was edited or copied from another run. Weights written
before this record hold none and are read as before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from attnconv import data as D
from attnconv.config import RESUMABLE_CHANGES
from attnconv.errors import AttnconvError
from attnconv.fileio import Unreadable, open_regular
from attnconv.runs.files import (
    CONFIG_FILE,
    MAX_HEADER,
    STATE_FILE,
    WEIGHTS_FILE,
    metadata_problem,
    read_config,
    weights_metadata,
)
from attnconv.runs.values import shown_pair

# The metadata key of model.safetensors that holds `config_record`.
RECORD_KEY = "attnconv_run"

# Differences named in a message, at most.
_SHOWN = 3

# Characters of each value shown in a difference.
_WIDTH = 40


def config_record(meta: dict[str, Any]) -> str:
    """config.json (`meta`, as `read_config` parsed it) as the weights record it: compact JSON with sorted keys,
    without the config's `RESUMABLE_CHANGES` (where the data is, the device, workers: what a command may be told
    otherwise by its flags, and what changes nothing the weights compute) and without an image folder's path
    (where the data is, too: the "data" block records what it holds)."""
    config = {k: v for k, v in meta["config"].items() if k not in RESUMABLE_CHANGES}
    if isinstance(config.get("dataset"), str) and D.folder_path(config["dataset"]) is not None:
        config["dataset"] = "folder:"  # where an image folder is, like data_dir (its content: the "data" block)
    return json.dumps({**meta, "config": config}, sort_keys=True, separators=(",", ":"))


def state_record_problem(state: dict[str, Any], run_dir: Path) -> str | None:
    """Where run_dir's config.json and the record of it in its state.pt (read as `state`) disagree (`record_problem`:
    another run's state.pt, another seed's, or config.json edited since); None when they agree or the state records
    nothing (written before the record). config.json's own reader raises where it does not read."""
    if "record" not in state:
        return None
    return record_problem({RECORD_KEY: state["record"]}, read_config(run_dir), run_dir / STATE_FILE)


def record_problem(weights_meta: dict[str, str], meta: dict[str, Any], weights: Path) -> str | None:
    """Where config.json (`meta`) and the record in the metadata of `weights` (its "__metadata__") disagree,
    as one line naming both files, the fields and the fix; None when they agree or the weights record
    nothing (written before the record existed)."""
    recorded = weights_meta.get(RECORD_KEY)
    if recorded is None:
        return None
    try:
        old = json.loads(recorded) if isinstance(recorded, str) else None
    except (ValueError, RecursionError):
        old = None
    if not isinstance(old, dict):
        what = "weights file" if weights.name == WEIGHTS_FILE else "file"
        return (f"{weights}: corrupt {what} (its record of config.json is not a JSON object); restore it from a copy "
                "of the run")
    diff = _differences(old, json.loads(config_record(meta)))
    if not diff:
        return None
    config = weights.parent / CONFIG_FILE
    shown = "; ".join(f"{_shown_name(name)} {new} in config.json, {was} in the record of {weights.name}"
                      for name, (was, new) in ((name, shown_pair(was, new)) for name, was, new in diff[:_SHOWN]))
    more = f"; and {len(diff) - _SHOWN} more" if len(diff) > _SHOWN else ""
    return (f"{config} does not describe the run {weights.name} was written for ({shown}{more}); one of the two "
            "was edited or copied from another run: restore it from a copy of the run (or, if config.json was "
            "edited, set those fields back to the record's values)")


def check_record(run_dir: Path, meta: dict[str, Any]) -> None:
    """One AttnconvError (`record_problem`) when the run's config.json (`meta`) is not what its model.safetensors
    records of it; the weights' header alone is read, and a run without weights (or a record) passes."""
    weights = run_dir / WEIGHTS_FILE
    problem = record_problem(recorded_metadata(weights), meta, weights)
    if problem is not None:
        raise AttnconvError(problem)


def recorded_step(metadata: dict[str, Any]) -> int | None:
    """The step a checkpoint's model.safetensors records (its metadata's "step", ASCII digits as attnconv writes
    them), or None: a converted run's weights record none, and any other text is none attnconv wrote."""
    step = metadata.get("step")
    if not isinstance(step, str) or not (step.isascii() and step.isdigit() and len(step) <= 18):
        return None
    return int(step)


def recorded_metadata(path: Path) -> dict[str, Any]:
    """The "__metadata__" of the safetensors file `path`, read from its header alone (the header `load_weights`
    reads, up to safetensors' limit); {} when there is none or the file cannot be read (where the weights are
    loaded, their own reader says why), as it is when the metadata fails its checksum (damaged on disk: it vouches
    for nothing, and `load_weights` names it)."""
    try:
        with open_regular(path, "") as f:
            head = f.read(8)
            size = int.from_bytes(head, "little")
            if len(head) < 8 or not 0 < size <= min(os.fstat(f.fileno()).st_size - 8, MAX_HEADER):
                return {}
            meta = weights_metadata(head + f.read(size))
            return {} if metadata_problem(meta) is not None else meta
    except Unreadable:  # sound weights this user may not read: their record cannot vouch for config.json, said so
        raise
    except (AttnconvError, OSError):
        return {}


def _shown_name(path: tuple[str, ...]) -> str:
    """A field's path as a line shows it: its keys joined by dots, each escaped (non-ASCII as \\u escapes) and cut
    to 40 characters, and the whole cut to 120 (keys of thousands of characters, or of dots, stay short)."""
    keys = (json.dumps(key)[1:-1] for key in path)
    name = ".".join(k if len(k) <= _WIDTH else k[:_WIDTH - 3] + "..." for k in keys)
    return name if len(name) <= 3 * _WIDTH else name[:3 * _WIDTH - 3] + "..."


def _differences(old: Any, new: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any, Any]]:
    """(path of keys, old value, new value) for each field that differs, objects compared field by field (a field
    missing on one side is None there)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[tuple[tuple[str, ...], Any, Any]] = []
        for key in sorted(set(old) | set(new)):
            out += _differences(old.get(key), new.get(key), (*path, key))
        return out
    return [] if _same_json(old, new) else [(path, old, new)]


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: Python's `true == 1` and `1.0 == 1` are not (an edit of `"layers": 1` to `true` or
    `1.0` is one), nor are lists whose items differ so."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    kind = lambda v: bool if isinstance(v, bool) else int if isinstance(v, int) else type(v)  # noqa: E731
    return kind(a) is kind(b) and a == b
