"""What model.safetensors records of config.json: the fields that decide what a run's weights compute.

An edit of config.json that changes the tensors' shapes (hidden 8 -> 16) is caught when the weights do
not fit the model it describes. An edit that keeps them (a normalization's std, a class renamed, a
converted run's alpha, an option that changes no tensor) would give other numbers with exit 0, so every
file of weights attnconv writes for a run (`train`'s checkpoints, `convert`) records those fields of
config.json in its metadata (`model_record`), and reading the run compares (`record_problem`): the two
files disagree only when one of them was edited or copied from another run. Weights written before
this record hold none and are read as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnconv.errors import AttnconvError
from attnconv.fileio import open_regular
from attnconv.runs.files import weights_metadata
from attnconv.runs.values import short_value

# The metadata key of model.safetensors that holds `model_record`.
RECORD_KEY = "attnconv_run"

# What of config.json's "data" block the weights' answers depend on (the images' size and channels, their
# normalization, the names of the classes); train_size, test_size and the digest describe the data only.
_DATA_FIELDS = ("channels", "size", "mean", "std", "classes")

# Differences named in a message, at most.
_SHOWN = 3

# A safetensors header larger than this is not attnconv's (its metadata and a few hundred tensor names).
_MAX_HEADER = 1 << 24


def model_record(meta: dict[str, Any]) -> str:
    """The fields of a checked config.json (`read_config`) that decide what the run's weights compute, as
    compact JSON with sorted keys: the model, its overrides, init_from's options (not the source run's path),
    a converted run's options, and `_DATA_FIELDS` of the "data" block."""
    config = meta["config"]  # as written (checked by read_config), so that a later version reads the same record
    record: dict[str, Any] = {"model": config["model"], "model_overrides": config.get("model_overrides", {})}
    if isinstance(config.get("init_from"), dict):
        record["init_from"] = {k: v for k, v in config["init_from"].items() if k != "run"}
    if "converted" in meta:
        converted = meta["converted"]
        record["converted"] = {"fold_bn": bool(converted.get("fold_bn")), "alpha": converted.get("alpha")}
    if isinstance(meta.get("data"), dict):
        record["data"] = {k: meta["data"][k] for k in _DATA_FIELDS if k in meta["data"]}
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def record_problem(weights_meta: dict[str, str], meta: dict[str, Any], weights: Path) -> str | None:
    """Where config.json (`meta`) and the record in the metadata of `weights` (its "__metadata__") disagree,
    as one line naming both files, the fields and the fix; None when they agree or the weights record
    nothing (written before the record existed)."""
    recorded = weights_meta.get(RECORD_KEY)
    if recorded is None:
        return None
    try:
        old = json.loads(recorded)
    except (ValueError, RecursionError):
        old = None
    if not isinstance(old, dict):
        return (f"{weights}: corrupt weights file (its record of config.json is not a JSON object); restore it "
                "from a copy of the run")
    diff = _differences(old, json.loads(model_record(meta)))
    if not diff:
        return None
    config = weights.parent / "config.json"
    shown = "; ".join(f"{name} {short_value(new)} in config.json, {short_value(was)} in the weights' record"
                      for name, was, new in diff[:_SHOWN])
    more = f"; and {len(diff) - _SHOWN} more" if len(diff) > _SHOWN else ""
    return (f"{config} does not describe the run {weights.name} was written for ({shown}{more}); one of the two "
            "was edited or copied from another run: restore it from a copy of the run")


def recorded_metadata(path: Path) -> dict[str, str]:
    """The "__metadata__" of the safetensors file `path`, read from its header alone; {} when there is none or
    the file cannot be read (where the weights are loaded, their own reader says why)."""
    try:
        with open_regular(path, "") as f:
            head = f.read(8)
            size = int.from_bytes(head, "little")
            return weights_metadata(head + f.read(size)) if len(head) == 8 and 0 < size <= _MAX_HEADER else {}
    except (AttnconvError, OSError):
        return {}


def _differences(old: Any, new: Any, name: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted field name, old value, new value) for each field that differs, objects compared field by field
    (a field missing on one side is None there)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[tuple[str, Any, Any]] = []
        for key in sorted(set(old) | set(new)):
            out += _differences(old.get(key), new.get(key), f"{name}.{key}" if name else key)
        return out
    return [] if old == new else [(name, old, new)]
