"""A run's network: built from config.json, its weights loaded (`load_run`), or converted (`convert_run`)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load

from attnconv.config import TrainConfig
from attnconv.construct import ConvAttention, LearnableConvAttention, cnn_to_attention
from attnconv.errors import AttnconvError, DamagedFile, ParameterError
from attnconv.fileio import (
    Unreadable,
    current_umask,
    dangling_link,
    describe_os_error,
    interrupts_held,
    make_parents,
    open_regular,
    output_fix,
    read_regular,
    remove_empty,
    unplaceable,
)
from attnconv.limits import AllocationLimit, flag_argument, format_bytes, parameter_limit, path_argument
from attnconv.models import build_model
from attnconv.pathwords import resume_command
from attnconv.precision import check_device
from attnconv.runs.directory import replaced_run_line, set_aside_pending
from attnconv.runs.files import (
    CONFIG_FILE,
    CONFIG_FIX,
    HEADS_FILE,
    MAX_HEADER,
    METRICS_FILE,
    STATE_FILE,
    STEPS_FILE,
    WEIGHTS_FILE,
    checksum_problem,
    load_state,
    read_config,
    save_weights,
    weights_metadata,
    write_config,
)
from attnconv.runs.logs_file import CHECKPOINT_GONE, checkpointed_once, read_metrics, rows_logged
from attnconv.runs.record import RECORD_KEY, config_record, record_problem, recorded_step, state_record_problem
from attnconv.runs.run_data import recorded_info, run_info


def load_run(run_dir: str | os.PathLike, device: str | torch.device = "cpu", *,
             allow_nonfinite: bool = False) -> tuple[nn.Module, TrainConfig]:
    """Rebuild a run's model from config.json and load model.safetensors into it (eval mode).

    Returns (model, config). Missing or corrupt files raise AttnconvError, and so do weights
    holding NaN or inf (a diverged run) unless `allow_nonfinite` (then `nonfinite_tensor`
    of the model's state_dict names the first such tensor).
    """
    run_dir = path_argument(run_dir, "run_dir", "the run's directory")
    check_device(str(device))  # torch's own words otherwise, from model.to(device) after the load
    allow_nonfinite = flag_argument(allow_nonfinite, "allow_nonfinite")
    meta = read_config(run_dir)
    config = TrainConfig.from_dict(meta["config"])
    try:
        model = build_run_architecture(meta)
    except AttnconvError as err:  # e.g. model_overrides too large to build: name the file that asks for it
        raise AttnconvError(f"{run_dir / CONFIG_FILE}: {err}") from None
    load_weights(model, run_dir / WEIGHTS_FILE, config.model, allow_nonfinite=allow_nonfinite, meta=meta)
    return model.to(device).eval(), config

def build_run_architecture(meta: dict[str, Any]) -> nn.Module:
    """The network a run's config.json (`read_config`) describes, with fresh weights, in eval mode.

    `build_run_model`, then, for a run written by `attnconv convert`, the same conversion.
    What needs no weights (parameter and FLOP counts) is read off it; `load_run` loads them into it.
    An "init_from" or a "converted" block on a model with no convolution (only an edit writes one) is
    a corrupt run config, not a flag's mistake nor a conversion of nothing read as sound.
    """
    config = TrainConfig.from_dict(meta["config"])
    try:
        model = build_run_model(config)
    except ParameterError as err:
        if err.name != "init_from":
            raise
        raise _corrupt(f"init_from on model {config.model!r}, which has no convolution to start from") from None
    if "converted" in meta:  # written by `attnconv convert`: the CNN's convs as attention layers
        conv = meta["converted"]
        model = cnn_to_attention(model.eval(), fold_bn=bool(conv.get("fold_bn")), alpha=conv.get("alpha"))
        if not any(isinstance(m, ConvAttention) for m in model.modules()):
            raise _corrupt(f'"converted" on model {config.model!r}, which has no convolution to convert')
    return model.eval()


def _corrupt(reason: str) -> DamagedFile:
    return DamagedFile(f"corrupt run config ({reason})", CONFIG_FIX, reason=reason)

def load_weights(model: nn.Module, path: Path, what: str, *, allow_nonfinite: bool = False,
                 meta: dict[str, Any] | None = None) -> None:
    """Load a safetensors file into `model`; one AttnconvError naming the file if that fails.

    meta: the run's config.json (`read_config`), to compare with what the weights record of it
    (`runs.record`): an edit that keeps the shapes (a normalization, a class name, a conversion's alpha)
    is then one error, not other numbers.

    Refused: a path that is no regular file (a named pipe would block), a file safetensors cannot
    read, a tensor the model lacks or lacks of it, one of another dtype (load_state_dict would
    cast an int32, bool or float8 tensor silently) or shape (`weights_problem`), and, unless
    `allow_nonfinite`, a floating-point tensor holding NaN or inf.
    """
    fix = "restore it from a copy of the run, or train the run again"
    try:
        _check_size(path, model, fix)
        data = read_regular(path, fix)
        tensors = load(data)
    except AttnconvError:  # no regular file: the message names it and the fix already
        raise
    except FileNotFoundError:
        raise AttnconvError(_missing(path)) from None
    except OSError as err:  # a link into a loop is named as one, as every run file is
        why = dangling_link(path) or f"cannot read the weights ({err.strerror or err})"
        raise AttnconvError(f"{path}: {why}; {fix}") from None
    except (SafetensorError, ValueError) as err:
        raise AttnconvError(f"{path}: corrupt weights file ({err}); {_rewrite_fix(path, fix)}") from None
    problem = checksum_problem(tensors, weights_metadata(data))
    if problem is not None:
        raise AttnconvError(f"{path}: corrupt weights file ({problem}); {_rewrite_fix(path, fix)}")
    problem = None if meta is None else record_problem(weights_metadata(data), meta, path)
    if problem is not None:  # what config.json says of the model and its data is not what the weights were for
        raise AttnconvError(problem)
    problem = None if meta is None else _stale_problem(path, weights_metadata(data))
    if problem is not None:
        raise AttnconvError(problem)
    problem = weights_problem(tensors, model.state_dict())
    if problem is not None:
        # the weights, or config.json (the model, its overrides, a conversion block): either may have been edited
        raise AttnconvError(f"{path}: weights do not fit model {what!r} ({problem}); {fix} (or, if config.json was "
                            f"edited, restore config.json from that copy)")
    bad = None if allow_nonfinite else nonfinite_tensor(tensors)
    if bad is not None:
        raise AttnconvError(f"{path}: the run's weights hold NaN/inf (parameter {bad}); the run diverged: "
                            "retrain it with a lower --lr")
    model.load_state_dict(tensors)


def _check_size(path: Path, model: nn.Module, fix: str) -> None:
    """Refuse, before reading it, a weights file far larger than the model's tensors and a header safetensors
    allows (a file of 64 GiB, or a header that claims to be, would be read whole, then fail as out of memory)."""
    size = path.stat().st_size
    tensors = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if size > tensors + MAX_HEADER + 8:
        raise AttnconvError(f"{path}: corrupt weights file ({format_bytes(size)}, and the model's weights are "
                            f"{format_bytes(tensors)}); {fix}")
    with open_regular(path, fix) as f:
        head = f.read(8)
    if len(head) == 8 and int.from_bytes(head, "little") > MAX_HEADER:
        raise AttnconvError(f"{path}: corrupt weights file (its header claims {format_bytes(int.from_bytes(head, 'little'))}; "
                            f"safetensors allows {format_bytes(MAX_HEADER)}); {fix}")


def _rewrite_fix(path: Path, fix: str) -> str:
    """`fix` for a damaged model.safetensors, or, where the run is finished and its state.pt reads and is this run's,
    the `train --resume` that writes the weights anew from it."""
    run = path.parent
    try:
        state = load_state(run / STATE_FILE)
        if not state["progress"].get("finished") or state_record_problem(state, run) is not None:
            return fix
    except AttnconvError:
        return fix
    return f"restore it from a copy of the run, or `{resume_command(run)}` writes it anew from {STATE_FILE}"


def _missing(path: Path) -> str:
    """The line for a model.safetensors that is not there: a run being replaced, a broken link, a run that has
    checkpointed (state.pt or metrics.csv say so), or one that has not yet."""
    run = path.parent
    if set_aside_pending(run):
        return f"{path}: missing: {replaced_run_line(run)}"
    if path.is_symlink():
        return (f"{path}: a link to {os.readlink(path)}, which does not exist; restore the run's weights from a copy "
                "of the run")
    if os.path.lexists(run / STATE_FILE):
        try:
            state = load_state(run / STATE_FILE)
            if state_record_problem(state, run) is not None:
                raise AttnconvError("it is another run's: it records another config.json")
        except AttnconvError as err:  # `--resume` could not write it anew: both are to restore
            why = err.head.removeprefix(f"{run / STATE_FILE}: ") if isinstance(err, DamagedFile) else str(err)
            return (f"{path}: missing, and {STATE_FILE}, which could write it anew, cannot ({why}); restore "
                    "both from a copy of the run, or train the run again")
        progress = state["progress"]
        lost = [name for name, count in ((METRICS_FILE, "rows"), (STEPS_FILE, "step_rows"), (HEADS_FILE, "snapshots"))
                if progress.get(count, 0) and not progress.get("finished") and not os.path.lexists(run / name)]
        if lost:  # an unfinished run resumes from the logs its checkpoint counts: `--resume` would refuse
            return (f"{path}: missing, and so is {' and '.join(lost)}, which the run's checkpoint counts: it cannot be "
                    "resumed without them; restore them from a copy of the run, or train the run again")
        return (f"{path}: missing, although the run has checkpointed ({STATE_FILE} says so): it was moved or deleted; "
                f"restore it from a copy of the run, or `{resume_command(run)}` writes it anew from "
                f"{STATE_FILE} (and goes on training, if the run was not finished)")
    try:
        shown = checkpointed_once(run, read_config(run))
    except AttnconvError:  # config.json's own reader names it where it is read
        shown = None
    if shown is not None:
        return f"{path}: missing, and so is {STATE_FILE}, while {shown}: {CHECKPOINT_GONE}"
    if rows_logged(run, 1):  # a row is written before the epoch's checkpoint, which may have failed
        return (f"{path}: missing, and so is {STATE_FILE}, while {METRICS_FILE} has a row: the run stopped before its "
                f"first checkpoint was whole (`{resume_command(run)}` starts it again from step 0), or "
                "its files were moved or deleted (restore them from a copy of the run)")
    return f"{path}: missing (the run has not written a checkpoint yet)"


def _stale_problem(path: Path, metadata: dict[str, Any]) -> str | None:
    """Weights older than the run's logs, or None: model.safetensors records the step it was written at, and
    metrics.csv may not go past it (a checkpoint follows every epoch's row). Either the run was stopped between
    its last row and its checkpoint (its state.pt is at the weights' step: `--resume` cuts the logs back), or
    the file is an older copy of the run's weights, or another run's."""
    step = recorded_step(metadata)
    if step is None:
        return None
    run = path.parent
    try:
        rows = read_metrics(run)
    except AttnconvError:
        return None  # the metrics' own readers say what is wrong with them
    if not rows or rows[-1]["step"] <= step:
        return None
    last = int(rows[-1]["step"])
    try:
        progress = load_state(run / STATE_FILE)["progress"]
        saved, finished = progress["step"], progress.get("finished") is True
    except AttnconvError:
        saved = finished = None
    if saved == step and finished:  # its last checkpoint follows its last row: nothing is logged after it
        return (f"{run / METRICS_FILE} goes on to step {last}, past step {step}, where the run finished and wrote its "
                f"last checkpoint ({path} and {STATE_FILE}): its rows after step {step} are not the run's (an edited "
                f"copy, or another run's); restore it from a copy of the run, or delete its rows after step {step}")
    if saved == step:
        return (f"{path} holds the weights of step {step}, the run's last checkpoint, and {run / METRICS_FILE} goes on "
                f"to step {last}: the run was stopped between its last row and its checkpoint; continue it with "
                f"`{resume_command(run)}` (which cuts the logs back to the checkpoint)")
    return (f"{path} holds the weights of step {step} (its metadata), but {run / METRICS_FILE} goes on to step "
            f"{last}: one of the two is not the run's (an older copy of the weights, another run's, or an edited "
            "metrics.csv); restore it from a copy of the run")


def weights_fit(model: nn.Module, path: Path) -> bool:
    """Whether the safetensors file `path` reads and holds exactly `model`'s tensors (`weights_problem`):
    what tells, when a checkpoint does not fit config.json's model, which of the run's files is foreign."""
    try:
        tensors = load(read_regular(path, ""))
    except Unreadable:  # sound weights this user may not read: not "another run's"
        raise
    except (AttnconvError, OSError, SafetensorError, ValueError):
        return False
    return weights_problem(tensors, model.state_dict()) is None


def weights_changed(path: Path) -> bool:
    """Whether the safetensors file `path` holds tensors that fail the checksum its metadata records
    (`checksum_problem`: bytes changed on disk since they were written); False where it cannot tell."""
    try:
        data = read_regular(path, "")
        return checksum_problem(load(data), weights_metadata(data)) is not None
    except (AttnconvError, OSError, SafetensorError, ValueError):
        return False


def weights_problem(tensors: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> str | None:
    """What keeps `tensors` (a weights file) from being `expected` (a state_dict) exactly, naming the
    first tensor at fault, or None: names, then each tensor's dtype and shape."""
    missing = [k for k in expected if k not in tensors]
    extra = [k for k in tensors if k not in expected]
    for names, what in ((missing, "is missing"), (extra, "is not one of the model's")):
        if names:
            more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
            return f"tensor {names[0]} {what}{more}"
    for name, want in expected.items():
        got = tensors[name]
        if got.dtype != want.dtype:
            return f"tensor {name} is {_dtype(got)}, the model's is {_dtype(want)}"
        if got.shape != want.shape:
            return f"tensor {name} has shape {tuple(got.shape)}, the model's {tuple(want.shape)}"
    return None


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")

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
        run = Path(src.run)
        if not run.is_dir():  # moved or replaced since this run was started from it (`--resume` before a checkpoint)
            why = "a file now" if run.exists() else dangling_link(run) or "gone"
            raise AttnconvError(f"{run}: the CNN run this run starts from (its config.json's init_from.run) is {why}: "
                                f"move the CNN run back to {run}, or start over from where it is now "
                                "(`attnconv train --init-from ITS_FOLDER --out THIS_RUN --overwrite`)")
        meta = read_config(run)
        if "converted" in meta or meta["config"].get("init_from"):
            raise ParameterError("init_from", run, ": is already an attention network; give the run of a CNN")
        load_weights(model, run / WEIGHTS_FILE, config.model, meta=meta)
    model = cnn_to_attention(model.eval(), fold_bn=src.fold_bn, alpha=float(src.alpha), learnable=True,
                             key_dim=src.content)
    if not any(isinstance(m, LearnableConvAttention) for m in model.modules()):
        raise ParameterError("init_from", src.run, f": model {config.model!r} has no convolution to start from")
    return model.train()

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
    run_dir, out = path_argument(run_dir, "run_dir", "the run's directory"), path_argument(out, "out", "a new folder")
    fold_bn = flag_argument(fold_bn, "fold_bn")
    if out.exists():
        raise ParameterError("out", out, "already exists; choose a new directory for the converted run")
    if link := dangling_link(out):  # the run is renamed into place: over a link that would fail with "Not a directory"
        raise ParameterError("out", out, f": {link}; choose a new directory for the converted run")
    meta = read_config(run_dir)
    if "converted" in meta:
        raise AttnconvError(f"{run_dir} is already a converted run (from {meta['converted'].get('from')})")
    model, config = load_run(run_dir)
    # The images the network was trained on, as config.json recorded them (its folder may have changed since)
    info = recorded_info(config, meta.get("data")) or run_info(config, recorded=meta.get("data"))
    example = torch.zeros(1, info.channels, info.size, info.size)  # finds convolutions the forward calls itself
    converted = cnn_to_attention(model, fold_bn=fold_bn, alpha=alpha, example_input=example)
    if not any(isinstance(m, ConvAttention) for m in converted.modules()):
        raise AttnconvError(f"{run_dir}: model {meta['config']['model']!r} has no convolution to convert")
    meta = {k: v for k, v in meta.items() if k != "params"}
    meta.update(converted={"from": str(run_dir), "fold_bn": fold_bn, "alpha": alpha},
                parameters=sum(p.numel() for p in converted.parameters()))
    refused = unplaceable(out)  # a folder made whole beside it could neither be renamed there nor removed again
    if refused:
        raise ParameterError("out", out, f": {refused}")
    made: list[Path] = []  # out's missing parents: removed again unless the run lands
    tmp: Path | None = None
    try:
        try:
            made = make_parents(out)
            with interrupts_held():  # a temporary made is a temporary known
                tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".attnconv-tmp", dir=out.parent))
            os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it 0700; the run is a folder like any other
        except OSError as err:  # what refuses the place, as every output says it (a read-only mount, a flag, modes)
            fix = output_fix(out) if isinstance(err, PermissionError) or err.errno == errno.EROFS else \
                f"{err.strerror or err}; choose another directory"
            raise ParameterError("out", out, f": cannot write there; {fix}") from None
        try:
            save_weights(converted, tmp / WEIGHTS_FILE, {"converted_from": str(run_dir),
                                                         RECORD_KEY: config_record(meta)})
            write_config(tmp, meta)
            os.replace(tmp, out)  # the run directory appears whole or not at all
            made = []  # out's parents now hold it (or its path passes through them, as mkdir -p makes it)
        except OSError as err:
            raise ParameterError("out", out, f": could not write the converted run ({describe_os_error(err)}); "
                                 "nothing was written") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        remove_empty(made)
    return out
