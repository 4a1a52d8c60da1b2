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
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from attnconv.config import TrainConfig
from attnconv.construct import ConvAttention, LearnableConvAttention
from attnconv.convert import cnn_to_attention
from attnconv import data as D
from attnconv.errors import AttnconvError
from attnconv.fileio import atomic_write, write_bytes
from attnconv.models import build_model

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.csv"
WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "state.pt"
METRICS_COLUMNS = (
    "epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "seconds", "images_per_s", "lr",
)
STATE_FORMAT = 1
# The files `train` writes into a run directory (only temporaries of these are ever cleaned up).
RUN_FILES = (CONFIG_FILE, METRICS_FILE, WEIGHTS_FILE, STATE_FILE)


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
    """Read a training-state file (only tensors and plain containers: weights_only=True)."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise AttnconvError(f"{path}: no training state here (the run has not checkpointed yet)") from None
    except Exception as err:  # corrupt or foreign file: unpickling errors of many kinds
        raise AttnconvError(f"{path}: cannot read the training state ({type(err).__name__}: {err}); "
                            "delete it to restart the run from scratch") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise AttnconvError(f"{path}: not an attnconv training state (format {STATE_FORMAT})")
    return state


def read_config(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The parsed config.json of a run directory (with the TrainConfig under "config")."""
    path = Path(run_dir) / CONFIG_FILE
    try:
        meta = json.loads(path.read_text())
        TrainConfig.from_dict(meta["config"])
    except FileNotFoundError:
        raise AttnconvError(f"{run_dir}: not a run directory (no {CONFIG_FILE}); give the --out of a training run")\
            from None
    except (json.JSONDecodeError, KeyError, TypeError, AttnconvError) as err:
        raise AttnconvError(f"{path}: corrupt run config ({err})") from None
    return meta


def read_metrics(run_dir: str | os.PathLike, limit: int | None = None) -> list[dict[str, float]]:
    """Rows of metrics.csv as dicts of numbers ([] if no epoch finished yet), at most `limit`.

    A last line without its newline is a row cut short by a crash and is skipped.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]  # the piece after the last newline is empty or cut short
    if limit is not None:
        lines = lines[: limit + 1]
    try:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(lines)]
    except (ValueError, TypeError) as err:
        raise AttnconvError(f"{path}: corrupt metrics file ({err})") from None


def metrics_text(rows: list[dict[str, float]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, METRICS_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _fmt(row[k]) for k in METRICS_COLUMNS})
    return out.getvalue()


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 2**53 else repr(float(v))


def load_run(run_dir: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[nn.Module, TrainConfig]:
    """Rebuild a run's model from config.json and load model.safetensors into it (eval mode).

    Returns (model, config). Missing or corrupt files raise AttnconvError.
    """
    run_dir = Path(run_dir)
    meta = read_config(run_dir)
    config = TrainConfig.from_dict(meta["config"])
    model = build_run_model(config)
    if "converted" in meta:  # written by `attnconv convert`: the CNN's convs as attention layers
        conv = meta["converted"]
        model = cnn_to_attention(model.eval(), fold_bn=bool(conv.get("fold_bn")), alpha=conv.get("alpha"))
    load_weights(model, run_dir / WEIGHTS_FILE, config.model)
    return model.to(device).eval(), config


def load_weights(model: nn.Module, path: Path, what: str) -> None:
    """Load a safetensors file into `model`; one AttnconvError naming the file if that fails."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.exists():
        raise AttnconvError(f"{path}: missing (the run has not written a checkpoint yet)")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise AttnconvError(f"{path}: corrupt weights file ({err})") from None
    try:
        model.load_state_dict(tensors)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0]
        raise AttnconvError(f"{path}: weights do not fit model {what!r} ({first})") from None


def build_run_model(config: TrainConfig, *, source_weights: bool = False) -> nn.Module:
    """The network a training config describes, in training mode.

    `build_model(config.model, **config.model_overrides)`, or, with `config.init_from`,
    that CNN turned into attention by `cnn_to_attention(..., learnable=True)` with the
    heads' initial alpha, BatchNorm folding and content attention (`key_dim`) of `init_from`. `source_weights=True`
    first loads the source CNN run's trained weights (a fresh `--init-from` run);
    otherwise the architecture is built with fresh weights (to load a checkpoint into).
    """
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
    folder still exists, else None (`load_dataset` then searches the usual places)."""
    if data_dir is not None:
        return str(data_dir)
    if config.data_dir is not None and Path(config.data_dir).expanduser().is_dir():
        return config.data_dir
    return None  # the run's data folder is gone (or it had none): search the usual places


def run_test_set(config: TrainConfig, data_dir: str | os.PathLike | None = None) -> D.ImageSet:
    """The test split of a run's dataset, found as `run_data_dir` says."""
    return D.load_dataset(config.dataset, run_data_dir(config, data_dir), download=True)[1]


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
