"""The files of a run directory: names, and reading and writing config.json, model.safetensors and state.pt
(one clear AttnconvError naming a missing or corrupt file); metrics.csv and steps.csv are logs_file.py's,
heads.jsonl heads_file.py's."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors.torch import save

from attnconv import data as D
from attnconv.config import TrainConfig
from attnconv.data.folder_layout import CONTROL_CHARACTERS
from attnconv.data.info import builtin_info
from attnconv.errors import AttnconvError, DamagedFile, warnings_ignored
from attnconv.fileio import (
    RUN_FILE_NAMES,
    Unreadable,
    atomic_write,
    atomic_write_all,
    dangling_link,
    not_a_folder,
    open_regular,
    read_regular,
    write_bytes,
)
from attnconv.limits import format_bytes
from attnconv.models import list_models
from attnconv.runs.values import file_text, is_finite, is_whole, json_loads, path_kind, short_value, shown_pair

CONFIG_FILE = "config.json"

METRICS_FILE = "metrics.csv"

WEIGHTS_FILE = "model.safetensors"

STATE_FILE = "state.pt"

HEADS_FILE = "heads.jsonl"

STEPS_FILE = "steps.csv"

# `train --tensorboard`: the run's own folder of TensorBoard event files (not in RUN_FILES: a folder, which
# --overwrite replaces whole and no other command writes).
TENSORBOARD_DIR = "tensorboard"

METRICS_COLUMNS = (
    "epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "seconds", "images_per_s", "lr",
)

# steps.csv: a row every --log-every steps; loss and accuracy are means over the steps since the previous
# row, images_per_s over that stretch too, seconds the run's training time so far.
STEPS_COLUMNS = ("step", "epoch", "loss", "accuracy", "lr", "images_per_s", "seconds")

STATE_FORMAT = 1

# The files `train` writes into a run directory (only temporaries of these are ever cleaned up).
RUN_FILES = RUN_FILE_NAMES  # (CONFIG_FILE, METRICS_FILE, WEIGHTS_FILE, STATE_FILE, HEADS_FILE, STEPS_FILE); fileio
# guards them

# The metadata key of model.safetensors that holds `tensors_checksum` of its tensors (safetensors has none of its
# own): a byte changed on disk inside a tensor is then "corrupt", not other numbers. Files without it (written
# before it existed, or by other tools) are read as before.
CHECKSUM_KEY = "attnconv_checksum"

# The metadata key that holds a digest of the rest of the metadata (the step, the run's record, the logs record, the
# tensors' checksum): a byte changed on disk there is damage, not another run's record or edited logs. Files
# without it are read as before.
META_CHECKSUM_KEY = "attnconv_metadata_checksum"


def tensors_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """A digest of named CPU tensors: each one's name, dtype, shape and bytes, in name order."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        digest.update(f"{len(name)}:{name}:{t.dtype}:{tuple(t.shape)};".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def metadata_checksum(metadata: dict[str, str]) -> str:
    """A digest of a weights file's metadata, each key and value, but `META_CHECKSUM_KEY`'s own."""
    rest = {k: v for k, v in metadata.items() if k != META_CHECKSUM_KEY}
    return hashlib.blake2b(json.dumps(rest, sort_keys=True).encode(), digest_size=16).hexdigest()


def sealed_metadata(metadata: dict[str, str]) -> dict[str, str]:
    """`metadata` with its checksum (`META_CHECKSUM_KEY`), as attnconv writes it."""
    return {**metadata, META_CHECKSUM_KEY: metadata_checksum(metadata)}


def metadata_problem(metadata: dict[str, str]) -> str | None:
    """Why a weights file's metadata is not what was written (`META_CHECKSUM_KEY`), or None (it is, or the file
    records no such checksum)."""
    recorded = metadata.get(META_CHECKSUM_KEY)
    if recorded is None or recorded == metadata_checksum(metadata):
        return None
    return "its metadata is not what was written: the file changed on disk since (a damaged disk or copy, or an edit)"


def checksum_problem(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> str | None:
    """Why `tensors`, or the metadata beside them, are not what a weights file says they were when written
    (`CHECKSUM_KEY`, `META_CHECKSUM_KEY`), or None (they are, or the file records no checksum)."""
    problem = metadata_problem(metadata)
    if problem is not None:
        return problem
    recorded = metadata.get(CHECKSUM_KEY)
    if recorded is None or recorded == tensors_checksum(tensors):
        return None
    return ("its tensors' bytes are not the ones written: the file changed on disk since (a damaged disk or copy, or "
            "an edit)")


def weights_bytes(model: nn.Module, metadata: dict[str, str]) -> bytes:
    """A model's state_dict as a safetensors file's bytes, with `metadata`, the tensors' checksum and the
    metadata's."""
    # A copy of each tensor: safetensors refuses tensors that share storage, and a state_dict may hold views.
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}
    return save(tensors, metadata=sealed_metadata({**metadata, CHECKSUM_KEY: tensors_checksum(tensors)}))


def state_bytes(state: dict[str, Any]) -> bytes:
    """torch.save's bytes of `state`: a zip archive with a CRC-32 of every record (`load_state` checks them)."""
    buf = io.BytesIO()
    crc = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(True)  # torch's default; a process that turned it off still gets them
    try:
        torch.save(state, buf)
    finally:
        torch.serialization.set_crc32_options(crc)
    return buf.getvalue()


def save_weights(model: nn.Module, path: Path, metadata: dict[str, str]) -> None:
    atomic_write(path, write_bytes(weights_bytes(model, metadata)))


def save_checkpoint(model: nn.Module, metadata: dict[str, str], state: dict[str, Any], run_dir: Path) -> None:
    """model.safetensors and state.pt as one pair (`fileio.atomic_write_all`): a full disk or a Ctrl-C while
    they are written leaves both of the last checkpoint (or neither, before the first), never one of each."""
    atomic_write_all([(run_dir / WEIGHTS_FILE, write_bytes(weights_bytes(model, metadata))),
                      (run_dir / STATE_FILE, write_bytes(state_bytes(state)))])

# How a line about a damaged log begins its fix (`runs.directory.trim_logs` gives a resume its own).
LOG_FIX = "restore it from a copy, or delete it"


def log_fix(lost: str, *, config_edited: bool = False, hint: str = "") -> str:
    """`LOG_FIX`, saying what deleting the log loses (`the heads' history is`); `config_edited`: the log may be
    sound and config.json the file edited."""
    fix = LOG_FIX.replace(" it ", " it (or config.json, if that was edited) ", 1) if config_edited else LOG_FIX
    return f"{fix} ({lost} then unknown{hint})"


# What deleting metrics.csv or heads.jsonl loses (`log_fix`).
METRICS_LOST = "the run's curves and accuracy are"
HEADS_LOST = "the heads' history is"

# What every line about a damaged state.pt ends with.
STATE_FIX = ("restore it from a copy of the run; without it the run cannot be resumed: train it again into a new "
             "--out, or over this one with --overwrite")
# ... and about a state.pt that is no file attnconv wrote (a folder, a link, a pipe), which --overwrite refuses to replace.
STATE_MOVE_FIX = ("move it out of the run folder first (--overwrite replaces only files attnconv wrote), then restore "
                  "state.pt from a copy of the run; without it the run cannot be resumed: train it again into a new "
                  "--out, or over this one with --overwrite")


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """Read a training-state file and check its structure; one AttnconvError if it is not sound.

    Only tensors and plain containers are unpickled (weights_only=True: a pickle that asks
    for anything else is refused without running it). The structure is checked here, so
    that resuming never meets a bad one: "progress" holds whole-number counters (step,
    epoch, batch, rows; snapshots and step_rows where present) that fit each other (no fewer steps than
    epochs and batches done, no more heads.jsonl lines than metrics rows and one, no more steps.csv rows
    than steps), a bool "finished" and real-number sums; "model" maps names to
    tensors; "optimizer" is a state_dict; "rng" holds CPU generator states (ByteTensors
    of the size torch.get_rng_state() has), one per process, and CUDA ones or None.
    """
    path = Path(path)
    fix = STATE_MOVE_FIX if path.is_symlink() or (path.exists() and not path.is_file()) else STATE_FIX
    try:
        # A FIFO would block: refused first. Warnings ignored: e.g. torch's note on the pickle protocol of a foreign file.
        with open_regular(path, fix) as f, warnings_ignored():
            state = torch.load(f, map_location="cpu", weights_only=True)
            f.seek(0)
            changed = _changed_record(f)  # torch reads without checking its own CRCs
    except AttnconvError:
        raise
    except FileNotFoundError:
        if path.is_symlink():  # a link to nowhere (or into a loop) is no run that has not checkpointed
            raise DamagedFile(f"{path}: {dangling_link(path)}", fix) from None
        raise AttnconvError(f"{path}: no training state here (the run has not checkpointed yet)") from None
    except IsADirectoryError:
        raise DamagedFile(f"{path} is a directory, not a training state", fix) from None
    except OSError as err:
        if err.errno in (errno.EINVAL, None):  # torch's reader seeking past the end of a file cut short: corrupt
            raise DamagedFile(f"{path}: cannot read the training state: the file is corrupt (truncated, damaged, or "
                              "not written by torch.save)", fix) from None
        raise DamagedFile(f"{path}: cannot read the training state ({err.strerror or err})", fix) from None
    except Exception as err:  # corrupt or foreign file: unpickling errors of many kinds
        # torch's own message suggests weights_only=False, which would run whatever the file asks: never.
        asked = re.search(r"GLOBAL ([\w.]+)", str(err))
        why = (f"it asks for {asked.group(1)}, which a training state never holds; refused, nothing ran" if asked
               else "truncated, damaged, or not written by torch.save")
        raise DamagedFile(f"{path}: cannot read the training state: the file is corrupt ({why})", fix) from None
    problem = _state_problem(state)
    if problem is None and changed is not None:
        problem = (f"the bytes of its record {changed} are not the ones written (their CRC-32 differs): the file "
                   "changed on disk since (a damaged disk or copy, or an edit)")
    if problem is not None:
        raise DamagedFile(f"{path}: cannot read the training state: the file is corrupt ({problem})", fix)
    return state


def state_head(path: Path) -> dict[str, Any] | None:
    """state.pt's "progress", "record" and "logs", read without its tensors' bytes (mapped, not read: cheap for a
    large state), the CRC-32 of the record that holds them checked; None where it does not read as a sound state
    (`load_state`, where the state is loaded, says why)."""
    try:
        with open_regular(path, "") as f, zipfile.ZipFile(f) as archive:  # a FIFO would block: refused first
            archive.read(next(i.filename for i in archive.infolist() if i.filename.endswith("/data.pkl")))
        with warnings_ignored():
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        if _state_problem(state) is not None:
            return None
    except Exception:  # noqa: BLE001 - unreadable, damaged or foreign: the state's own reader words each
        return None
    return {key: state[key] for key in ("progress", "record", "logs") if key in state}


def _changed_record(f: Any) -> str | None:
    """The first record of the zip archive torch.save wrote whose bytes fail their CRC-32, or None; one a zip
    reader cannot read at all is named as such (torch read it, so the damage is in what torch skips)."""
    try:
        with zipfile.ZipFile(f) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, ValueError) as err:
        return f"index ({err})"

_STATE_COUNTERS = ("step", "epoch", "batch", "rows")

# Counters that states written before they existed lack (they then start at 0).
_STATE_NEWER_COUNTERS = ("snapshots", "step_rows")

_STATE_SUMS = ("loss_sum", "correct", "seen", "seconds", "run_seconds", "row_loss", "row_correct", "row_seen",
               "row_seconds")

def _state_problem(state: Any) -> str | None:
    """What is wrong with a training state's structure (`load_state`), or None."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        return f"not an attnconv training state of format {STATE_FORMAT}"
    progress = state.get("progress")
    if not isinstance(progress, dict):
        return "no progress counters"
    for key in _STATE_COUNTERS:
        v = progress.get(key)
        if not is_whole(v) or v < 0:
            return f"progress {key} is {v!r}, not a whole number >= 0"
    for key in _STATE_NEWER_COUNTERS:
        v = progress.get(key, 0)
        if not is_whole(v) or v < 0:
            return f"progress {key} is {v!r}, not a whole number >= 0"
    step, epoch, batch, rows = (progress[k] for k in _STATE_COUNTERS)
    if step < epoch + batch:  # every epoch done took a step at least, and so did every batch of this one
        return f"progress step {step} is fewer than its epoch {epoch} and batch {batch} took"
    if epoch == 0 and step != batch:  # the first epoch's steps are its batches (later ones may change length)
        return f"progress step {step} is not its batch {batch} of the first epoch"
    if progress.get("snapshots", 0) > rows + 1:  # heads.jsonl: one line at the start, one per metrics row
        return f"progress snapshots {progress['snapshots']} is more than its {rows} metrics rows and the first"
    if progress.get("step_rows", 0) > step:  # steps.csv: at most one row per step
        return f"progress step_rows {progress['step_rows']} is more than its {step} steps"
    if not isinstance(progress.get("finished", False), bool):
        return f"progress finished is {progress['finished']!r}, not true or false"
    finished = progress.get("finished", False)
    if not epoch <= rows <= epoch + finished or (finished and rows == 0):
        # metrics.csv: a row per epoch done, and one for the epoch a finished run ended in (--max-steps)
        return (f"progress rows {short_value(rows)} does not fit its {epoch} epochs done, "
                f"{'finished' if finished else 'not finished'}")
    for key in _STATE_SUMS:
        v = progress.get(key, 0.0)
        if not is_finite(v) or v < 0:  # losses, counts of images and seconds
            return f"progress {key} is {short_value(v)}, not a finite number >= 0"
    for correct, seen in (("correct", "seen"), ("row_correct", "row_seen")):
        if progress.get(correct, 0.0) > progress.get(seen, 0.0):
            return f"progress {correct} {progress[correct]:g} is more than the {progress.get(seen, 0.0):g} images {seen}"
    model = state.get("model")
    if not isinstance(model, dict) or not all(isinstance(k, str) and isinstance(t, torch.Tensor)
                                              for k, t in model.items()):
        return "the weights are not a mapping of names to tensors"
    opt = state.get("optimizer")
    if not isinstance(opt, dict) or not isinstance(opt.get("state"), dict) \
            or not isinstance(opt.get("param_groups"), list) or not all(isinstance(g, dict) for g in opt["param_groups"]):
        return "the optimizer state is not an optimizer's state_dict"
    if "record" in state and not isinstance(state["record"], str):  # runs.record.config_record, where written
        return "its record of config.json is not text"
    if "logs" in state and not isinstance(state["logs"], str):  # runs.logs_record.logs_record, where written
        return "its record of the logs is not text"
    rng = state.get("rng")
    if not isinstance(rng, dict):
        return "no random number generator states"
    cpu, cuda = rng.get("torch"), rng.get("cuda")
    size = torch.get_rng_state().numel()
    if not isinstance(cpu, list) or not cpu or not all(_byte_vector(t, size) for t in cpu):
        return f"the CPU random number generator states are not ByteTensors of {size} bytes, one per process"
    bad = next((i for i, t in enumerate(cpu) if not _cpu_generator_state(t)), None)
    if bad is not None:  # the right size, yet not a state torch can set (a traceback at resume otherwise)
        return f"the CPU random number generator state of process {bad} is not one torch can set"
    if cuda is not None and (not isinstance(cuda, list) or len(cuda) != len(cpu)
                             or not all(_byte_vector(t) for t in cuda)):
        return "the CUDA random number generator states are not ByteTensors, one per process"
    return None

def _cpu_generator_state(t: torch.Tensor) -> bool:
    """Whether `t` is a state a CPU generator takes (tried on a new generator; the global one is untouched)."""
    try:
        torch.Generator().set_state(t)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True

def _byte_vector(t: Any, size: int | None = None) -> bool:
    return (isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1
            and (size is None or t.numel() == size))

class NotARunConfig(DamagedFile):
    """A config.json that is JSON but holds no "config" object: corrupt, or another program's (a Hugging Face
    model folder's)."""


def trained_here(run_dir: Path) -> list[str]:
    """The files of a trained run in `run_dir` (weights, state, metrics) that show one was trained there."""
    return [name for name in (WEIGHTS_FILE, STATE_FILE, METRICS_FILE) if (run_dir / name).exists()]


def read_config(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The parsed config.json of a run directory (with the TrainConfig under "config").

    Checked before anything is built from it: the directory and the file exist, the file
    is UTF-8 JSON holding a "config" object that `TrainConfig.from_dict` accepts (field
    types included), with a known model. One AttnconvError otherwise. (The dataset is
    checked where it is used, the size of the network as `build_run_model` builds it.)
    """
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    hint = "give the folder that `attnconv train --out` wrote"
    why = not_a_folder(run_dir)
    if why:
        raise AttnconvError(f"{run_dir}: not a run directory ({why}); {hint}")
    if not path.exists() and not path.is_symlink():
        found = trained_here(run_dir)
        if found:  # the folder `train --out` wrote, its config.json gone: not "give the folder train wrote"
            raise AttnconvError(f"{run_dir}: {CONFIG_FILE} is missing, while {', '.join(found)} show a run was trained "
                                "here; restore it from a copy of the run")
        raise AttnconvError(f"{run_dir}: not a run directory (no {CONFIG_FILE}); {hint}")
    fix = CONFIG_FIX
    if not path.is_file():
        raise _corrupt(path, f"not a regular file: {path_kind(path)}")
    if path.stat().st_size > _MAX_CONFIG_BYTES:
        raise _corrupt(path, f"{format_bytes(path.stat().st_size)}; a run config is a few KiB")
    try:
        meta = json_loads(file_text(read_regular(path, fix)))
    except Unreadable:  # sound, this user may not read it: the permission is the fix (an AttnconvError is a ValueError)
        raise
    except UnicodeDecodeError:
        raise _corrupt(path, "binary data, not UTF-8 JSON text") from None
    except ValueError as err:  # not JSON, or nested too deeply
        raise _corrupt(path, f"not JSON: {err}") from None
    except OSError as err:
        why = f"cannot read the run config ({err.strerror or err})"
        raise DamagedFile(f"{path}: {why}", fix, reason=why) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):  # another program's config.json?
        raise NotARunConfig(f'{path}: not an attnconv run config (no "config" object: another program\'s config.json, '
                            f'or a damaged one)', f'{hint}, or restore it from a copy of the run',
                            reason='no "config" object')
    try:
        problem = strings_problem(meta)
        if problem is not None:
            raise AttnconvError(problem)
        config = TrainConfig.from_dict(meta["config"])
        if config.model not in list_models():
            raise AttnconvError(f"unknown model {config.model!r}")
        builtin = None if D.folder_path(config.dataset) is not None else builtin_info(config.dataset)  # else: unknown
        problem = counts_problem(meta)
        if problem is None and "data" in meta:
            problem = data_problem(meta["data"]) or _overrides_problem(config, meta["data"]) or \
                _builtin_problem(config.dataset, builtin, meta["data"])
        if problem is None and "converted" in meta:
            problem = converted_problem(meta["converted"])
        if problem is None and meta.get("init_from_weights") is not None and not is_digest(meta["init_from_weights"]):
            problem = (f"init_from_weights {short_value(meta['init_from_weights'])} is not a SHA-256 digest (64 "
                       "hexadecimal digits)")
        if problem is not None:
            raise AttnconvError(problem)
    except AttnconvError as err:
        raise _corrupt(path, str(err)) from None
    return meta


def is_digest(value: Any) -> bool:
    """A SHA-256 digest as config.json records one: 64 hexadecimal digits (either case)."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdefABCDEF" for c in value)


def _corrupt(path: Path, reason: str) -> DamagedFile:
    return DamagedFile(f"{path}: corrupt run config ({reason})", CONFIG_FIX, reason=reason)

# What a corrupt config.json's message ends with.
CONFIG_FIX = "restore it from a copy, or train the run again"


# config.json's counts besides the config (written by `train` and `convert`), and their least values.
_META_COUNTS = {"parameters": 0, "params": 0, "steps_per_epoch": 0, "total_steps": 0, "world_size": 1, "log_every": 1}


def counts_problem(meta: dict[str, Any]) -> str | None:
    """What is wrong with config.json's counts (`_META_COUNTS`: parameters, steps_per_epoch, total_steps,
    world_size), or None: each, where present, a whole number from its least value to 2^53."""
    for key, least in _META_COUNTS.items():
        if key in meta and not (is_whole(meta[key]) and least <= meta[key] <= 2**53):
            return f"{key} {short_value(meta[key])} is not a whole number >= {least}"
    return None


# The longest string config.json holds anywhere (names and paths; a path is at most 4096 bytes on Linux), and the
# longest name in a path (a file or folder name: 255 bytes).
MAX_CONFIG_STRING = 4096
_MAX_NAME_BYTES = 255


def strings_problem(meta: dict[str, Any]) -> str | None:
    """What is wrong with config.json's strings, or None: every string and key, anywhere, at most
    MAX_CONFIG_STRING characters, and the paths (config dataset's folder, data_dir, init_from.run,
    "converted" from) without a NUL, under 4096 bytes, with names of at most 255 bytes, so that no value of the file
    reaches the system as a path it refuses (an OSError naming neither the file nor the field)."""
    stack: list[tuple[str, Any]] = [("", meta)]
    while stack:  # not recursive: the parser already refused nesting too deep for Python
        field, value = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            name = f"{field}.{key}" if isinstance(key, str) else f"{field}[{key}]"
            name = name.lstrip(".")
            if isinstance(key, str) and len(key) > MAX_CONFIG_STRING:
                return f"a key of {len(key):,} characters in {field or 'the top level'} ({short_value(key)})"
            if isinstance(item, str) and len(item) > MAX_CONFIG_STRING:
                return (f"{_short_name(name)} is a string of {len(item):,} characters ({short_value(item)}); names and paths "
                        f"are at most {MAX_CONFIG_STRING:,}")
            stack.append((name, item))
    config, converted = meta["config"], meta.get("converted")
    init = config.get("init_from")
    dataset = config.get("dataset")
    paths = {
        "config.dataset": dataset.removeprefix("folder:") if isinstance(dataset, str) else None,
        "config.data_dir": config.get("data_dir"),
        "config.init_from.run": init.get("run") if isinstance(init, dict) else None,
        "converted.from": converted.get("from") if isinstance(converted, dict) else None,
    }
    for name, path in paths.items():
        if not isinstance(path, str):
            continue  # the field's type is checked with the rest of its block
        if "\0" in path:
            return f"{name} {short_value(path)} holds a NUL character, which no path can"
        size = len(path.encode("utf-8", "surrogatepass"))
        if size >= MAX_CONFIG_STRING:  # characters of several bytes: under the count of characters, over the bytes
            return f"{name} {short_value(path)} is a path of {size:,} bytes; a path is at most {MAX_CONFIG_STRING - 1:,}"
        longest = max(path.split("/"), key=lambda part: len(part.encode("utf-8", "surrogatepass")))
        if len(longest.encode("utf-8", "surrogatepass")) > _MAX_NAME_BYTES:
            return (f"{name} {short_value(path)} holds a name of {len(longest.encode('utf-8', 'surrogatepass')):,} bytes; "
                    f"a file or folder name is at most {_MAX_NAME_BYTES}")
    return None


def _short_name(name: str) -> str:
    """A field's dotted name as shown in a message: escaped (no invisible characters), at most 60 characters."""
    text = json.dumps(name)[1:-1]
    return text if len(text) <= 60 else text[:57] + "..."


def data_problem(data: Any) -> str | None:
    """What is wrong with config.json's "data" block (`runs.data_fingerprint`: what the run's dataset
    was), or None: classes a list of distinct names (none empty, none with a control character), image
    counts whole numbers >= 0, channels 1 or 3, size 1..65536, mean and std one number per channel of
    pixels scaled to 0..1 (mean 0..1, std above 0, at most 1), the content's "digest" (where present) 32
    hex digits for each split (and for "train_unordered", "test_unordered" where present). Other keys are ignored."""
    if not isinstance(data, dict):
        return f'"data" is {short_value(data)}, not an object'
    missing = [k for k in ("classes", "train_size", "test_size", "channels", "size", "mean", "std") if k not in data]
    if missing:
        return f'"data" has no {", ".join(missing)}'
    classes = data["classes"]
    if not (isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes)
            and len(set(classes)) == len(classes)):
        return f'"data" classes {short_value(classes)} is not a list of distinct class names'
    bad = next((c for c in classes if not c or CONTROL_CHARACTERS.search(c)), None)
    if bad is not None:  # printed by predict, eval and the report: a terminal escape must not act on the terminal
        return f'"data" class name {short_value(bad)} {"is empty" if not bad else "holds a control character"}'
    for key in ("train_size", "test_size"):
        if not (is_whole(data[key]) and data[key] >= 0):
            return f'"data" {key} {short_value(data[key])} is not a whole number >= 0'
    if data["channels"] not in (1, 3) or isinstance(data["channels"], bool) or not is_whole(data["channels"]):
        return f'"data" channels {short_value(data["channels"])} is not 1 or 3'
    if not (is_whole(data["size"]) and 1 <= data["size"] <= 65536):
        return f'"data" size {short_value(data["size"])} is not a whole number from 1 to 65536'
    for key in ("mean", "std"):
        values = data[key]
        if not (isinstance(values, list) and len(values) == data["channels"] and all(is_finite(v) for v in values)
                and all((0 <= v if key == "mean" else 0 < v) and v <= 1 for v in values)):
            what = "number from 0 to 1" if key == "mean" else "number above 0, at most 1"
            return f'"data" {key} {short_value(values)} is not one {what} per channel ({data["channels"]})'
    digest = data.get("digest")
    if "digest" in data and not (isinstance(digest, dict) and all(
            isinstance(digest.get(k), str) and re.fullmatch(r"[0-9a-f]{32}", digest[k]) for k in ("train", "test"))):
        return f'"data" digest {short_value(digest)} is not {{"train": ..., "test": ...}} of 32 hex digits each'
    for key in ("train_unordered", "test_unordered"):  # the order-free digests: runs written before have none
        if "digest" in data and key in digest and not (
                isinstance(digest[key], str) and re.fullmatch(r"[0-9a-f]{32}", digest[key])):
            return f'"data" digest {key} {short_value(digest[key])} is not 32 hex digits'
    return None


def _overrides_problem(config: TrainConfig, data: dict[str, Any]) -> str | None:
    """The model's classes and input channels (model_overrides) against the "data" block they were set
    from at training time, or None: the two disagree only when one of them was edited."""
    for key, recorded, what in (("num_classes", len(data["classes"]), "classes"),
                                ("in_channels", data["channels"], "channels")):
        value = config.model_overrides.get(key)
        if value is not None and value != recorded:
            return (f'model_overrides {key} {short_value(value)} does not match the {recorded} {what} of its "data" '
                    "block (one of the two was edited)")
    return None


def _builtin_problem(name: str, info: D.DatasetInfo | None, data: dict[str, Any]) -> str | None:
    """A built-in dataset's classes and channels against the "data" block the run recorded, or None: they
    differ only when config.dataset was edited (a folder run renamed "cifar10" would be read, and blamed, as
    CIFAR-10)."""
    if info is None:
        return None
    for what, ours, recorded in (("classes", list(info.classes), data["classes"]), ("channels", info.channels,
                                                                                   data["channels"])):
        if ours != recorded:
            ours_text, recorded_text = shown_pair(ours, recorded)
            return (f"config.dataset {short_value(name)} has {ours_text} {what}, its \"data\" block {recorded_text} "
                    "(one of the two was edited)")
    return None


# safetensors refuses a header larger than this (its own limit); attnconv's are a few KiB.
MAX_HEADER = 100_000_000


def weights_metadata(data: bytes) -> dict[str, str]:
    """The "__metadata__" of a safetensors file's bytes ({} if none or unreadable): its header is 8 bytes of
    length, then that many bytes of JSON."""
    try:
        size = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8:8 + size]).get("__metadata__") if 0 < size <= len(data) - 8 else None
    except (ValueError, AttributeError, RecursionError):
        return {}
    return meta if isinstance(meta, dict) else {}


def converted_problem(converted: Any) -> str | None:
    """What is wrong with config.json's "converted" block (written by `attnconv convert`), or None:
    "from" a path, "fold_bn" true or false, "alpha" null or a finite number > 0."""
    if not isinstance(converted, dict):
        return f'"converted" is {short_value(converted)}, not an object'
    if not isinstance(converted.get("from", ""), str):
        return f'"converted" from {short_value(converted["from"])} is not a path'
    if not isinstance(converted.get("fold_bn", False), bool):
        return f'"converted" fold_bn {short_value(converted["fold_bn"])} is not true or false'
    alpha = converted.get("alpha")
    if alpha is not None and not (is_finite(alpha) and alpha > 0):
        return f'"converted" alpha {short_value(alpha)} is not null or a finite number > 0'
    return None


_MAX_CONFIG_BYTES = 2**24  # 16 MiB

def write_config(run_dir: str | os.PathLike, meta: dict[str, Any]) -> None:
    """Write config.json (atomically): `meta` with the TrainConfig dict under "config"."""
    atomic_write(Path(run_dir) / CONFIG_FILE, write_bytes((json.dumps(meta, indent=2) + "\n").encode()))
