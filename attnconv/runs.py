"""Run directories: what `attnconv train` writes, and everything that reads it back.

A run directory holds:

    config.json        the resolved TrainConfig ("config"), the parameter count ("parameters"),
                       steps, versions, date; a converted run adds a "converted" block
    metrics.csv        one row per epoch (train/test loss and accuracy, time, lr)
    model.safetensors  the weights (state_dict), metadata: model, step, epoch
    state.pt           everything resume needs: step, epoch, batch, optimizer,
                       RNG states, and a copy of the weights (read with
                       torch.load(weights_only=True) only)
    .attnconv.lock     the advisory lock of the process writing the run (`attnconv.fileio`)

Every file is written atomically through `attnconv.fileio.atomic_write`. `load_run`
rebuilds a run's model (through `build_run_model`, and `cnn_to_attention` for a run
written by `attnconv convert`) and is what every later command goes through.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from attnconv import data as D
from attnconv.config import TrainConfig
from attnconv.construct import ConvAttention, LearnableConvAttention
from attnconv.convert import cnn_to_attention
from attnconv.errors import AttnconvError
from attnconv.fileio import RUN_FILE_NAMES, atomic_write, current_umask, write_bytes
from attnconv.limits import AllocationLimit, format_bytes, parameter_limit
from attnconv.models import build_model, list_models
from attnconv.models.sites import AttentionSite, attention_sites, needs_inputs, site_probs

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.csv"
WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "state.pt"
HEADS_FILE = "heads.jsonl"
METRICS_COLUMNS = (
    "epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "seconds", "images_per_s", "lr",
)
STATE_FORMAT = 1
# The files `train` writes into a run directory (only temporaries of these are ever cleaned up).
RUN_FILES = RUN_FILE_NAMES  # (CONFIG_FILE, METRICS_FILE, WEIGHTS_FILE, STATE_FILE, HEADS_FILE); fileio guards them


def save_weights(model: nn.Module, path: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save

    # A copy of each tensor: safetensors refuses tensors that share storage, and a state_dict may hold views.
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}
    atomic_write(path, write_bytes(save(tensors, metadata=metadata)))


def save_state(state: dict[str, Any], path: Path) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write(path, write_bytes(buf.getvalue()))


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """Read a training-state file and check its structure; one AttnconvError if it is not sound.

    Only tensors and plain containers are unpickled (weights_only=True: a pickle that asks
    for anything else is refused without running it). The structure is checked here, so
    that resuming never meets a bad one: "progress" holds whole-number counters (step,
    epoch, batch, rows), a bool "finished" and real-number sums; "model" maps names to
    tensors; "optimizer" is a state_dict; "rng" holds CPU generator states (ByteTensors
    of the size torch.get_rng_state() has), one per process, and CUDA ones or None.
    """
    path = Path(path)
    fix = "delete it to restart the run from scratch, or resume from another copy of the run"
    try:
        with warnings.catch_warnings():  # e.g. torch's note on the pickle protocol of a foreign file
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise AttnconvError(f"{path}: no training state here (the run has not checkpointed yet)") from None
    except IsADirectoryError:
        raise AttnconvError(f"{path} is a directory, not a training state; {fix}") from None
    except OSError as err:
        raise AttnconvError(f"{path}: cannot read the training state ({err.strerror or err}); {fix}") from None
    except Exception as err:  # corrupt or foreign file: unpickling errors of many kinds
        # torch's own message suggests weights_only=False, which would run whatever the file asks: never.
        asked = re.search(r"GLOBAL ([\w.]+)", str(err))
        why = (f"it asks for {asked.group(1)}, which a training state never holds; refused, nothing ran" if asked
               else "truncated, damaged, or not written by torch.save")
        raise AttnconvError(f"{path}: cannot read the training state: the file is corrupt ({why}); {fix}") from None
    problem = _state_problem(state)
    if problem is not None:
        raise AttnconvError(f"{path}: cannot read the training state: the file is corrupt ({problem}); {fix}")
    return state


_STATE_COUNTERS = ("step", "epoch", "batch", "rows")
_STATE_SUMS = ("loss_sum", "correct", "seen", "seconds")


def _state_problem(state: Any) -> str | None:
    """What is wrong with a training state's structure (`load_state`), or None."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        return f"not an attnconv training state of format {STATE_FORMAT}"
    progress = state.get("progress")
    if not isinstance(progress, dict):
        return "no progress counters"
    for key in _STATE_COUNTERS:
        v = progress.get(key)
        if not _whole(v) or v < 0:
            return f"progress {key} is {v!r}, not a whole number >= 0"
    if not isinstance(progress.get("finished", False), bool):
        return f"progress finished is {progress['finished']!r}, not true or false"
    for key in _STATE_SUMS:
        v = progress.get(key, 0.0)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            return f"progress {key} is {v!r}, not a finite number"
    model = state.get("model")
    if not isinstance(model, dict) or not all(isinstance(k, str) and isinstance(t, torch.Tensor)
                                              for k, t in model.items()):
        return "the weights are not a mapping of names to tensors"
    opt = state.get("optimizer")
    if not isinstance(opt, dict) or not isinstance(opt.get("state"), dict) \
            or not isinstance(opt.get("param_groups"), list) or not all(isinstance(g, dict) for g in opt["param_groups"]):
        return "the optimizer state is not an optimizer's state_dict"
    rng = state.get("rng")
    if not isinstance(rng, dict):
        return "no random number generator states"
    cpu, cuda = rng.get("torch"), rng.get("cuda")
    size = torch.get_rng_state().numel()
    if not isinstance(cpu, list) or not cpu or not all(_byte_vector(t, size) for t in cpu):
        return f"the CPU random number generator states are not ByteTensors of {size} bytes, one per process"
    if cuda is not None and (not isinstance(cuda, list) or len(cuda) != len(cpu)
                             or not all(_byte_vector(t) for t in cuda)):
        return "the CUDA random number generator states are not ByteTensors, one per process"
    return None


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _byte_vector(t: Any, size: int | None = None) -> bool:
    return (isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1
            and (size is None or t.numel() == size))


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
    if not run_dir.is_dir():
        why = "it is a file" if run_dir.exists() else "no such directory"
        raise AttnconvError(f"{run_dir}: not a run directory ({why}); {hint}")
    if not path.exists():
        raise AttnconvError(f"{run_dir}: not a run directory (no {CONFIG_FILE}); {hint}")
    fix = "restore it from a copy, or train the run again"
    if not path.is_file():
        raise AttnconvError(f"{path}: corrupt run config (not a regular file); {fix}")
    if path.stat().st_size > _MAX_CONFIG_BYTES:
        raise AttnconvError(f"{path}: corrupt run config ({format_bytes(path.stat().st_size)}; a run config is a "
                            f"few KiB); {fix}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise AttnconvError(f"{path}: corrupt run config (binary data, not UTF-8 JSON text); {fix}") from None
    except json.JSONDecodeError as err:
        raise AttnconvError(f"{path}: corrupt run config (not JSON: {err}); {fix}") from None
    except OSError as err:
        raise AttnconvError(f"{path}: cannot read the run config ({err.strerror or err}); {fix}") from None
    try:
        if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
            raise AttnconvError('no "config" object')
        config = TrainConfig.from_dict(meta["config"])
        if config.model not in list_models():
            raise AttnconvError(f"unknown model {config.model!r}")
    except AttnconvError as err:
        raise AttnconvError(f"{path}: corrupt run config ({err}); {fix}") from None
    return meta


_MAX_CONFIG_BYTES = 2**24  # 16 MiB
_MAX_METRICS_BYTES = 2**26  # 64 MiB: about a million epochs


def read_metrics(run_dir: str | os.PathLike, limit: int | None = None) -> list[dict[str, float]]:
    """Rows of metrics.csv as dicts of numbers ([] if no epoch finished yet), at most `limit`.

    A last line without its newline is a row cut short by a crash and is skipped. The
    header must name every column of METRICS_COLUMNS; a file that is not UTF-8 text, not
    CSV, or holds a value that is not a number is one AttnconvError naming the file.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    fix = "restore it from a copy, or delete it (the run's curves and accuracy are then unknown)"
    if not path.is_file():
        raise AttnconvError(f"{path}: corrupt metrics file (not a regular file); {fix}")
    if path.stat().st_size > _MAX_METRICS_BYTES:
        raise AttnconvError(f"{path}: corrupt metrics file (over {_MAX_METRICS_BYTES >> 20} MiB); {fix}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise AttnconvError(f"{path}: corrupt metrics file (binary data, not CSV text); {fix}") from None
    except OSError as err:
        raise AttnconvError(f"{path}: cannot read the metrics file ({err.strerror or err}); {fix}") from None
    lines = text.split("\n")[:-1]  # the piece after the last newline is empty or cut short
    if not lines:
        return []
    if limit is not None:
        lines = lines[: limit + 1]
    try:
        reader = csv.DictReader(lines)
        missing = [c for c in METRICS_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise AttnconvError(f"no {', '.join(missing)} column{'s' if len(missing) > 1 else ''}")
        return [{k: float(v) for k, v in row.items()} for row in reader]
    except (ValueError, TypeError, csv.Error, AttnconvError) as err:
        raise AttnconvError(f"{path}: corrupt metrics file ({err}); {fix}") from None


_MAX_HEADS_BYTES = 2**28  # 256 MiB: thousands of snapshots of a large model


def read_heads(run_dir: str | os.PathLike, limit: int | None = None) -> list[dict[str, Any]]:
    """The snapshots of heads.jsonl, oldest first ([] for a run without one), at most `limit`.

    Each is {"epoch", "step", "layers": [[{"center", "attention_distance", "alpha" or
    "inverse_covariance"}, ...per head], ...per layer]} (`attnconv.analysis.head_snapshot`),
    written by `train` at initialization (epoch 0, step 0) and after every epoch. A last line
    without its newline was cut short by a crash and is skipped; anything else that is not
    such a record is one AttnconvError naming the file.
    """
    path = Path(run_dir) / HEADS_FILE
    if not path.exists():
        return []
    fix = "restore it from a copy, or delete it (the heads' history is then unknown)"
    if not path.is_file():
        raise AttnconvError(f"{path}: corrupt heads file (not a regular file); {fix}")
    if path.stat().st_size > _MAX_HEADS_BYTES:
        raise AttnconvError(f"{path}: corrupt heads file (over {_MAX_HEADS_BYTES >> 20} MiB); {fix}")
    try:
        lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    except UnicodeDecodeError:
        raise AttnconvError(f"{path}: corrupt heads file (binary data, not JSON lines); {fix}") from None
    except OSError as err:
        raise AttnconvError(f"{path}: cannot read the heads file ({err.strerror or err}); {fix}") from None
    records = []
    for number, line in enumerate(lines[:limit] if limit is not None else lines, 1):
        try:
            record = json.loads(line)
            ok = (isinstance(record, dict) and isinstance(record.get("epoch"), (int, float))
                  and isinstance(record.get("step"), int) and isinstance(record.get("layers"), list)
                  and all(isinstance(layer, list) and all(isinstance(h, dict) and "center" in h for h in layer)
                          for layer in record["layers"]))
        except json.JSONDecodeError:
            ok = False
        if not ok:
            raise AttnconvError(f"{path}: corrupt heads file (line {number} is not a snapshot of the heads); {fix}")
        records.append(record)
    return records


def heads_line(record: dict[str, Any]) -> str:
    """One snapshot as the line of heads.jsonl that `read_heads` reads back."""
    return json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"


def metrics_text(rows: list[dict[str, float]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, METRICS_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _fmt(row[k]) for k in METRICS_COLUMNS})
    return out.getvalue()


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 2**53 else repr(float(v))


def load_run(run_dir: str | os.PathLike, device: str | torch.device = "cpu", *,
             allow_nonfinite: bool = False) -> tuple[nn.Module, TrainConfig]:
    """Rebuild a run's model from config.json and load model.safetensors into it (eval mode).

    Returns (model, config). Missing or corrupt files raise AttnconvError, and so do weights
    holding NaN or inf (a diverged run) unless `allow_nonfinite` (then `nonfinite_tensor`
    of the model's state_dict names the first such tensor).
    """
    run_dir = Path(run_dir)
    meta = read_config(run_dir)
    config = TrainConfig.from_dict(meta["config"])
    try:
        model = build_run_architecture(meta)
    except AttnconvError as err:  # e.g. model_overrides too large to build: name the file that asks for it
        raise AttnconvError(f"{run_dir / CONFIG_FILE}: {err}") from None
    load_weights(model, run_dir / WEIGHTS_FILE, config.model, allow_nonfinite=allow_nonfinite)
    return model.to(device).eval(), config


def build_run_architecture(meta: dict[str, Any]) -> nn.Module:
    """The network a run's config.json (`read_config`) describes, with fresh weights, in eval mode.

    `build_run_model`, then, for a run written by `attnconv convert`, the same conversion.
    What needs no weights (parameter and FLOP counts) is read off it; `load_run` loads them into it.
    """
    model = build_run_model(TrainConfig.from_dict(meta["config"]))
    if "converted" in meta:  # written by `attnconv convert`: the CNN's convs as attention layers
        conv = meta["converted"]
        model = cnn_to_attention(model.eval(), fold_bn=bool(conv.get("fold_bn")), alpha=conv.get("alpha"))
    return model.eval()


def load_weights(model: nn.Module, path: Path, what: str, *, allow_nonfinite: bool = False) -> None:
    """Load a safetensors file into `model`; one AttnconvError naming the file if that fails,
    or if a floating-point tensor holds NaN or inf (unless `allow_nonfinite`)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.exists():
        raise AttnconvError(f"{path}: missing (the run has not written a checkpoint yet)")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise AttnconvError(f"{path}: corrupt weights file ({err})") from None
    bad = None if allow_nonfinite else nonfinite_tensor(tensors)
    if bad is not None:
        raise AttnconvError(f"{path}: the run's weights hold NaN/inf (parameter {bad}); the run diverged: "
                            "retrain it with a lower --lr")
    try:
        model.load_state_dict(tensors)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0]
        raise AttnconvError(f"{path}: weights do not fit model {what!r} ({first})") from None


def nonfinite_tensor(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor holding NaN or inf, or None."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None


def build_run_model(config: TrainConfig, *, source_weights: bool = False) -> nn.Module:
    """The network a training config describes, in training mode.

    `build_model(config.model, **config.model_overrides)`, or, with `config.init_from`,
    that CNN turned into attention by `cnn_to_attention(..., learnable=True)` with the
    heads' initial alpha, BatchNorm folding and content attention (`key_dim`) of `init_from`. `source_weights=True`
    first loads the source CNN run's trained weights (a fresh `--init-from` run);
    otherwise the architecture is built with fresh weights (to load a checkpoint into).
    A network whose tensors would pass `attnconv.limits.parameter_limit` (2e9 float32
    parameters, or the machine's memory) is refused before that tensor is allocated.
    """
    what = f"model {config.model!r} with model_overrides {json.dumps(config.model_overrides)}"
    with AllocationLimit(parameter_limit(), what, "fix the model_overrides"):
        model = build_model(config.model, **config.model_overrides)
    src = config.init_from
    if src is None:
        return model
    if source_weights:
        run = Path(src["run"])
        meta = read_config(run)
        if "converted" in meta or meta["config"].get("init_from"):
            raise AttnconvError(f"--init-from {run}: is already an attention network; give the run of a CNN")
        load_weights(model, run / WEIGHTS_FILE, config.model)
    model = cnn_to_attention(model.eval(), fold_bn=src["fold_bn"], alpha=float(src["alpha"]), learnable=True,
                             key_dim=int(src.get("content", 0)))
    if not any(isinstance(m, LearnableConvAttention) for m in model.modules()):
        raise AttnconvError(f"--init-from {src['run']}: model {config.model!r} has no convolution to start from")
    return model.train()




def write_config(run_dir: str | os.PathLike, meta: dict[str, Any]) -> None:
    """Write config.json (atomically): `meta` with the TrainConfig dict under "config"."""
    atomic_write(Path(run_dir) / CONFIG_FILE, write_bytes((json.dumps(meta, indent=2) + "\n").encode()))


def parameter_count(meta: dict[str, Any]) -> int | None:
    """The parameter count config.json records ("parameters"; converted runs written before
    it was the one key said "params", and that count, the converted network's, is the right one)."""
    value = meta.get("params", meta.get("parameters")) if "converted" in meta else meta.get("parameters")
    return int(value) if isinstance(value, (int, float)) else None


def run_data_dir(config: TrainConfig, data_dir: str | os.PathLike | None = None) -> str | None:
    """Where to look for a run's data: `data_dir` if given, else the run's own data_dir if that
    folder still exists, else None (`load_dataset` then searches the usual places). A given
    `data_dir` that is not a folder is an AttnconvError (a typo must not fall back silently)."""
    if data_dir is not None:
        if not Path(data_dir).expanduser().is_dir():
            why = "it is a file" if Path(data_dir).expanduser().exists() else "no such directory"
            raise AttnconvError(f"--data-dir {data_dir}: {why}; give the folder holding the dataset's files")
        return str(data_dir)
    if config.data_dir is not None and Path(config.data_dir).expanduser().is_dir():
        return config.data_dir
    return None  # the run's data folder is gone (or it had none): search the usual places


def run_image_size(config: TrainConfig) -> int | None:
    """The image size a run's data is read at (what a folder dataset is decoded to; None: its default)."""
    size = config.model_overrides.get("image_size")
    return size if D.folder_path(config.dataset) is not None else None


def run_info(config: TrainConfig) -> D.DatasetInfo:
    """The DatasetInfo of a run's dataset, at the run's image size (folder datasets)."""
    return D.dataset_info(config.dataset, image_size=run_image_size(config))


def run_test_set(config: TrainConfig, data_dir: str | os.PathLike | None = None) -> D.ImageSet:
    """The test split of a run's dataset, found as `run_data_dir` says, at the run's image size.

    A dataset whose classes or channels no longer fit the run's model (a folder that gained a
    class) is one AttnconvError saying so, not a crash in the model.
    """
    found = run_data_dir(config, data_dir)
    test = D.load_dataset(config.dataset, found, download=True, image_size=run_image_size(config))[1]
    info = run_info(config)
    for key, now, what in (("num_classes", info.num_classes, "classes"), ("in_channels", info.channels, "channels")):
        trained = config.model_overrides.get(key)
        if trained is not None and trained != now:
            raise AttnconvError(
                f"{config.dataset}: the dataset changed since the run was trained: it has {now} {what}, the run's "
                f"model {trained}; give the data it was trained on (--data-dir), or train a new run on this data")
    return test


def data_fingerprint(info: D.DatasetInfo) -> dict[str, Any]:
    """What a run records of its dataset (config.json "data"): classes, sizes, shape, normalization."""
    return {"classes": list(info.classes), "train_size": info.train_size, "test_size": info.test_size,
            "channels": info.channels, "size": info.size, "mean": list(info.mean), "std": list(info.std)}


def data_changes(saved: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """What differs between a run's recorded dataset and `now` (`data_fingerprint`), in words; [] if
    nothing does, or if the run recorded none (written before runs recorded their data)."""
    if not isinstance(saved, dict):
        return []
    changes = []
    if saved.get("classes") != now["classes"]:
        old, new = list(saved.get("classes") or []), now["classes"]
        gained, lost = [c for c in new if c not in old], [c for c in old if c not in new]
        detail = "; ".join(part for part in (f"new: {', '.join(gained[:3])}" if gained else "",
                                             f"gone: {', '.join(lost[:3])}" if lost else "") if part)
        changes.append(f"classes {len(old)} -> {len(new)}" + (f" ({detail})" if detail else " (renamed or reordered)"))
    for key, what in (("train_size", "training images"), ("test_size", "test images"), ("channels", "channels"),
                      ("size", "image size")):
        if saved.get(key) != now[key]:
            changes.append(f"{what} {saved.get(key)} -> {now[key]}")
    if not all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for key in ("mean", "std")
               for a, b in zip(saved.get(key) or [], now[key])):
        changes.append("normalization (per-channel mean/std of the training images)")
    return changes


class Run:
    """A run directory, read once: its config, metrics, heads, weights, dataset and attention sites.

        run = Run("runs/sa")
        run.config.model, run.metrics[-1]["test_acc"], run.heads      # files, read on first use
        run.model                                                    # weights loaded, eval mode
        raw, x = run.test_images(100)                                # uint8 and normalized
        run.sites                                                    # attention_sites of the model

    Everything is loaded lazily and kept; a missing or corrupt file is one AttnconvError naming
    it (raised when the part that needs it is first used). Commands take a Run (or a path,
    turned into one) instead of re-reading the files.
    """

    def __init__(self, path: str | os.PathLike, device: str | torch.device = "cpu", *,
                 data_dir: str | os.PathLike | None = None, allow_nonfinite: bool = False):
        self.path = Path(path)
        self.meta = read_config(self.path)  # checked first: a file or a folder that is no run fails here
        self.config = TrainConfig.from_dict(self.meta["config"])
        self.device = device
        self.data_dir = data_dir
        self.allow_nonfinite = allow_nonfinite

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}: {self.config.model} on {self.config.dataset})"

    @property
    def converted(self) -> bool:
        """Written by `attnconv convert`: a CNN's convolutions as attention layers."""
        return "converted" in self.meta

    @functools.cached_property
    def metrics(self) -> list[dict[str, float]]:
        return read_metrics(self.path)

    @functools.cached_property
    def heads(self) -> list[dict[str, Any]]:
        """heads.jsonl's snapshots ([] for CNNs and runs trained before heads were recorded)."""
        return read_heads(self.path)

    @functools.cached_property
    def info(self) -> D.DatasetInfo:
        return run_info(self.config)

    @functools.cached_property
    def architecture(self) -> nn.Module:
        """The network config.json describes, with fresh weights (parameter and FLOP counts need no more)."""
        return build_run_architecture(self.meta)

    @functools.cached_property
    def model(self) -> nn.Module:
        """The trained network: weights loaded, on `device`, eval mode."""
        return load_run(self.path, self.device, allow_nonfinite=self.allow_nonfinite)[0]

    @functools.cached_property
    def test_set(self) -> D.ImageSet:
        return run_test_set(self.config, self.data_dir)

    def test_images(self, count: int | None = None, *, index: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Test images: (raw uint8 (N, C, H, W), normalized float32 on `device`), the first `count`
        (all if fewer) or the single image `index`."""
        test = self.test_set
        if count is not None and count < 1:
            raise AttnconvError(f"--images {count} is invalid: give a number of test images >= 1")
        if index is not None:
            if not 0 <= index < len(test):
                raise AttnconvError(f"--image {index} is out of range: the {self.config.dataset} test set has "
                                    f"{len(test)} images (0..{len(test) - 1})")
            raw = test.images[index : index + 1]
        else:
            raw = test.images[: count if count is not None else len(test)]
        return raw, D.normalize(raw, self.info).to(self.device)

    @functools.cached_property
    def sites(self) -> list[AttentionSite]:
        """`attention_sites` of the trained model (AttnconvError for a CNN)."""
        return attention_sites(self.model, (self.info.channels, self.info.size, self.info.size))

    def site_probs(self, images: int = 100, *, term: str = "combined") -> tuple[list[torch.Tensor], int]:
        """Each site's probabilities (`site_probs`) and how many test images they average (0: exact)."""
        x = self.test_images(images)[1] if needs_inputs(self.sites) else None
        return site_probs(self.model, self.sites, x, term=term), 0 if x is None else len(x)


def as_run(run: Run | str | os.PathLike, device: str | torch.device = "cpu", *,
           data_dir: str | os.PathLike | None = None) -> Run:
    """`run` itself, or the Run of a run directory (a command given a path)."""
    return run if isinstance(run, Run) else Run(run, device, data_dir=data_dir)


def convert_run(
    run_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    fold_bn: bool = True,
    alpha: float | None = None,
) -> Path:
    """Write a run directory holding the all-attention equivalent of a trained CNN run.

    `out` gets the source's config.json plus a "converted" block (source, fold_bn,
    alpha) and the converted network's parameter count, and model.safetensors with its
    weights, so that `load_run` (and every command built on it) rebuilds the CNN, converts
    it the same way and loads these weights. Nothing is written if the source cannot
    be loaded or converted; `out` must not exist yet. The directory is assembled in a
    uniquely named temporary folder next to `out` and renamed into place whole.
    """
    run_dir, out = Path(run_dir), Path(out)
    if out.exists():
        raise AttnconvError(f"--out {out} already exists; choose a new directory for the converted run")
    meta = read_config(run_dir)
    if "converted" in meta:
        raise AttnconvError(f"{run_dir} is already a converted run (from {meta['converted'].get('from')})")
    model, _ = load_run(run_dir)
    converted = cnn_to_attention(model, fold_bn=fold_bn, alpha=alpha)
    if not any(isinstance(m, ConvAttention) for m in converted.modules()):
        raise AttnconvError(f"{run_dir}: model {meta['config']['model']!r} has no convolution to convert")
    meta = {k: v for k, v in meta.items() if k != "params"}
    meta.update(converted={"from": str(run_dir), "fold_bn": fold_bn, "alpha": alpha},
                parameters=sum(p.numel() for p in converted.parameters()))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".attnconv-tmp", dir=out.parent))
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it 0700; the run is a folder like any other
    except OSError as err:
        raise AttnconvError(f"--out {out}: cannot write there ({err.strerror or err}); choose another directory") \
            from None
    try:
        save_weights(converted, tmp / WEIGHTS_FILE, {"converted_from": str(run_dir)})
        write_config(tmp, meta)
        os.replace(tmp, out)  # the run directory appears whole or not at all
    except OSError as err:
        raise AttnconvError(f"--out {out}: could not write the converted run ({err.strerror or err}); "
                            "nothing was written") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
