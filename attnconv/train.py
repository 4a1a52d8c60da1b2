"""Training: config and presets, LR schedules, atomic checkpoints, bit-exact resume, DDP.

    from attnconv.train import make_config, train
    train(make_config(preset="fmnist-sa-quadratic", epochs=2), "runs/sa")

A run directory holds:

    config.json        the resolved TrainConfig, parameter count, versions, date
    metrics.csv        one row per epoch (train/test loss and accuracy, time, lr)
    model.safetensors  the weights (state_dict), metadata: model, step, epoch
    state.pt           everything resume needs: step, epoch, batch, optimizer,
                       RNG states, and a copy of the weights (read with
                       torch.load(weights_only=True) only)

Checkpoints. Each file is written atomically (temporary file in the same
directory, flush, fsync, os.replace, fsync of the directory), so a reader sees
either the old or the new file, never half of one, even after `kill -9` or a power
loss. Two files cannot be swapped together, so `state.pt` carries its own copy of
the weights: it alone is the resume point and is always self-consistent.
`model.safetensors` is written first, so it is never older than `state.pt`; after
a crash between the two renames it may be one checkpoint newer, which is still a
consistent set of weights (its metadata records the step).

Resume. Batches are a pure function of (seed, epoch, batch index) (see
`attnconv.data.Batches`) and the learning rate a pure function of the step, so a
checkpoint needs only the step counters, the optimizer state and the torch RNG
state (for dropout) to continue exactly where the run stopped, mid-epoch too. On
the CPU the resumed run reaches bit-identical weights (tests/test_train.py kills a
real subprocess with SIGKILL to check it).

Several processes. Under `torchrun`, every rank takes a contiguous shard of each
*global* batch (`batch_size` is global) and DDP averages the per-shard mean
gradients, which equals the 1-process gradient of the global batch mean. Only rank
0 prints, logs and writes checkpoints. BatchNorm statistics are per shard (as in
any DDP run without SyncBatchNorm).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import io
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import attnconv
from attnconv import data as D
from attnconv.errors import AttnconvError
from attnconv.models import attention_placement, build_model, list_models, no_weight_decay

SCHEDULES = ("warmup-cosine", "multistep", "constant")
OPTIMIZERS = ("sgd", "adamw")
# Model overrides that the dataset decides; set from the data, never guessed.
DATA_OVERRIDES = ("in_channels", "image_size", "num_classes")
# Fields that may change when a run is resumed: where and how fast it runs, not what it computes.
RESUMABLE_CHANGES = frozenset({"device", "workers", "data_dir", "checkpoint_every", "compile", "preset"})
# The paper's ResNet steps, at epochs 80/150/250 of 300, as fractions of training.
PAPER_MILESTONES = (80 / 300, 150 / 300, 250 / 300)

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.csv"
WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "state.pt"
METRICS_COLUMNS = (
    "epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "seconds", "images_per_s", "lr",
)
_STATE_FORMAT = 1
# Steps between host syncs (NaN check, progress bar): a sync per step would stall a GPU.
_SYNC_EVERY = 10


@dataclass
class TrainConfig:
    """Everything that defines a training run (the run directory is not part of it).

    `batch_size` is the global batch (split across DDP ranks). `warmup` is a fraction
    of all steps; `milestones` are fractions of all steps where multistep multiplies
    the LR by `gamma`. `max_steps` caps the run before `epochs` are done. `workers`
    is the number of torch intra-op threads (None: torch's default).
    `checkpoint_every` adds a checkpoint every that many steps (0: at epoch ends only).
    """

    model: str
    dataset: str
    model_overrides: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None
    epochs: int = 10
    max_steps: int | None = None
    batch_size: int = 128
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    schedule: str = "warmup-cosine"
    warmup: float = 0.05
    milestones: tuple[float, ...] = PAPER_MILESTONES
    gamma: float = 0.1
    augment: bool = True
    seed: int = 0
    device: str = "cpu"
    amp: bool = False
    compile: bool = False
    workers: int | None = None
    data_dir: str | None = None
    checkpoint_every: int = 0
    # Multiplies the learning rate of the parameters that decide where attention looks
    # (`attnconv.models.attention_placement`: centers, widths, converted layers' content query/key).
    attention_lr_scale: float = 1.0
    # Start from a trained CNN run (`--init-from`): {"run": its directory, "alpha": the heads'
    # initial alpha, "fold_bn": fold its BatchNorms, "content": the query/key width per head of
    # content attention, 0 for none (optional; runs written before it had none)};
    # `model` and `model_overrides` are the CNN's.
    init_from: dict[str, Any] | None = None

    def validate(self) -> None:
        """Raise AttnconvError naming the first bad value and the fix."""
        if self.model not in list_models():
            raise AttnconvError(f"unknown model {self.model!r}; choose one of: {', '.join(list_models())}")
        D.dataset_info(self.dataset)  # raises for an unknown dataset
        if not isinstance(self.model_overrides, dict):
            raise AttnconvError(f"model_overrides must be a dict, got {type(self.model_overrides).__name__}")

        def need(ok: bool, flag: str, value: Any, what: str) -> None:
            if not ok:
                raise AttnconvError(f"--{flag} {value!r} is invalid: {what}")

        need(_is_int(self.epochs) and self.epochs >= 1, "epochs", self.epochs, "give a whole number >= 1")
        need(self.max_steps is None or (_is_int(self.max_steps) and self.max_steps >= 1), "max-steps",
             self.max_steps, "give a whole number >= 1 (or leave it out)")
        need(_is_int(self.batch_size) and self.batch_size >= 1, "batch-size", self.batch_size,
             "give a whole number >= 1")
        need(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer, f"choose one of {', '.join(OPTIMIZERS)}")
        need(math.isfinite(self.lr) and self.lr > 0, "lr", self.lr, "give a positive number")
        need(0 <= self.momentum < 1, "momentum", self.momentum, "give a number in [0, 1)")
        need(math.isfinite(self.weight_decay) and self.weight_decay >= 0, "weight-decay", self.weight_decay,
             "give a number >= 0")
        need(self.schedule in SCHEDULES, "schedule", self.schedule, f"choose one of {', '.join(SCHEDULES)}")
        need(0 <= self.warmup < 1, "warmup", self.warmup, "give the warm-up as a fraction of all steps, in [0, 1)")
        need(all(0 < m < 1 for m in self.milestones) and list(self.milestones) == sorted(self.milestones),
             "milestones", ",".join(map(str, self.milestones)),
             "give increasing fractions of all steps, each in (0, 1), e.g. 0.27,0.5,0.83")
        need(0 < self.gamma <= 1, "gamma", self.gamma, "give a factor in (0, 1]")
        need(_is_int(self.seed) and self.seed >= 0, "seed", self.seed, "give a whole number >= 0")
        need(self.device == "cpu" or self.device == "cuda" or self.device.startswith("cuda:"), "device",
             self.device, "choose cpu or cuda")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise AttnconvError(
                f"--device {self.device}: CUDA is not available here (torch {torch.__version__}); use --device cpu"
            )
        need(self.workers is None or (_is_int(self.workers) and self.workers >= 1), "workers", self.workers,
             "give the number of CPU threads, >= 1")
        need(_is_int(self.checkpoint_every) and self.checkpoint_every >= 0, "checkpoint-every",
             self.checkpoint_every, "give a number of steps >= 1, or 0 for epoch ends only")
        if self.data_dir is not None and not Path(self.data_dir).expanduser().is_dir():
            raise AttnconvError(f"--data-dir {self.data_dir}: no such directory")
        need(isinstance(self.attention_lr_scale, (int, float)) and math.isfinite(self.attention_lr_scale)
             and self.attention_lr_scale > 0, "attention-lr-scale", self.attention_lr_scale,
             "give a positive factor (1: the same learning rate as the other parameters)")
        if self.init_from is not None:
            src = self.init_from
            keys = {"run", "alpha", "fold_bn"}
            need(isinstance(src, dict) and keys <= set(src) <= keys | {"content"} and isinstance(src["run"], str),
                 "init-from", src, 'expected {"run": RUN_DIR, "alpha": number, "fold_bn": bool, "content": int}')
            need(isinstance(src["alpha"], (int, float)) and math.isfinite(src["alpha"]) and src["alpha"] > 0,
                 "init-alpha", src["alpha"], "give a positive number (1 to 4 lets the heads move; 20+ is exact)")
            need(isinstance(src["fold_bn"], bool), "fold-bn", src["fold_bn"], "give true or false")
            need(_is_int(src.get("content", 0)) and src.get("content", 0) >= 0, "init-content", src.get("content"),
                 "give the query/key width per head, a whole number >= 1 (or leave it out for no content attention)")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["milestones"] = list(self.milestones)
        if d["init_from"] is not None and d["init_from"].get("content") == 0:
            del d["init_from"]["content"]  # one form for "no content": runs written before it had no key
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of `to_dict`; unknown keys are an error (a config from another tool or version)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise AttnconvError(f"unknown training config field(s) {', '.join(unknown)}")
        d = dict(d)
        if "milestones" in d:
            d["milestones"] = tuple(d["milestones"])
        try:
            return cls(**d)
        except TypeError as err:
            raise AttnconvError(f"incomplete training config: {err}") from None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# ---------------------------------------------------------------------------------- presets


def _paper(model: str, schedule: str) -> TrainConfig:
    # Section 4 of the paper / its code: SGD 0.1, momentum 0.9, wd 1e-4 (not on the
    # attention centers and widths), batch 100, 300 epochs, crop + flip.
    return TrainConfig(
        model=model, dataset="cifar10", epochs=300, batch_size=100, optimizer="sgd", lr=0.1,
        momentum=0.9, weight_decay=1e-4, schedule=schedule, warmup=0.05, milestones=PAPER_MILESTONES,
        augment=True,
    )


PRESETS: dict[str, TrainConfig] = {
    "paper-cifar10-resnet18": _paper("resnet18", "multistep"),
    "paper-cifar10-sa-quadratic": _paper("sa-quadratic", "warmup-cosine"),
    "paper-cifar10-sa-quadratic-aniso": _paper("sa-quadratic-aniso", "warmup-cosine"),
    "paper-cifar10-sa-learned": _paper("sa-learned", "warmup-cosine"),
    "paper-cifar10-sa-learned-content": _paper("sa-learned-content", "warmup-cosine"),
    # Fashion-MNIST recipes sized for a 2-core CPU (see benchmarks/RESULTS.md for what they
    # reach and in how long). The attention model keeps the paper's block (9 heads, shared
    # values, post-LN) but downsamples 4x4 (28x28x1 -> 7x7x16 tokens) and is narrower: with
    # 2x2 downsampling (14x14 tokens) an epoch costs about 4x more on the CPU. AdamW
    # is used for this short budget, and no crop/flip augmentation (in a 1-epoch pilot
    # without crops the model reached 81.5% test accuracy, with crops 71.5%; whether crops
    # pay off over longer runs was not measured), and no dropout: with dropout 0.1 an
    # 8-epoch run underfit (train 90.7%, test 89.5%). The CNN baseline is ResNet-18 at a
    # quarter width, of similar cost per image.
    "fmnist-sa-quadratic": TrainConfig(
        model="sa-quadratic", dataset="fashion-mnist",
        model_overrides={"hidden": 96, "layers": 4, "heads": 9, "intermediate": 192, "downsample": 4,
                         "dropout": 0.0, "attn_dropout": 0.0},
        epochs=12, batch_size=128, optimizer="adamw", lr=2e-3, weight_decay=0.05,
        schedule="warmup-cosine", warmup=0.05, augment=False,
    ),
    "fmnist-resnet-small": TrainConfig(
        model="resnet18", dataset="fashion-mnist", model_overrides={"width": 16},
        epochs=8, batch_size=128, lr=0.1, weight_decay=5e-4, schedule="multistep", milestones=PAPER_MILESTONES,
        augment=False,
    ),
}


def make_config(*, preset: str | None = None, base: TrainConfig | None = None, **changes: Any) -> TrainConfig:
    """A config from a preset (or `base`), with explicit `changes` on top.

    Changes that are None are ignored, so CLI flags can be passed straight through;
    `model_overrides` is merged into the preset's, not substituted.
    """
    if preset is not None and base is not None:
        raise ValueError("give preset or base, not both")
    if preset is not None:
        if preset not in PRESETS:
            raise AttnconvError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
        base = dataclasses.replace(PRESETS[preset], preset=preset)
    changes = {k: v for k, v in changes.items() if v is not None}
    if base is None:
        missing = [f"--{k}" for k in ("model", "dataset") if k not in changes]
        if missing:
            raise AttnconvError(f"missing {' and '.join(missing)}: give them, or a --preset ({', '.join(PRESETS)})")
        base = TrainConfig(model=changes.pop("model"), dataset=changes.pop("dataset"))
    overrides = {**base.model_overrides, **{k: v for k, v in changes.pop("model_overrides", {}).items()
                                            if v is not None}}
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise TypeError(f"unknown TrainConfig field(s): {', '.join(unknown)}")
    if "milestones" in changes:
        changes["milestones"] = tuple(changes["milestones"])
    return dataclasses.replace(base, model_overrides=overrides, **changes)


# ---------------------------------------------------------------------------------- schedule


def learning_rate(config: TrainConfig, step: int, total_steps: int) -> float:
    """Learning rate of optimizer step `step` (0-based) out of `total_steps`.

    A pure function of the step, so resuming needs no scheduler state.
    warmup-cosine: linear from lr/warm to lr over the first `warmup * total` steps,
    then half a cosine down to 0 (the paper's attention models). multistep: lr times
    gamma for each milestone passed (the paper's ResNet: epochs 80/150/250 of 300).
    """
    if config.schedule == "constant":
        return config.lr
    if config.schedule == "multistep":
        passed = sum(step >= round(m * total_steps) for m in config.milestones)
        return config.lr * config.gamma**passed
    warm = round(config.warmup * total_steps)
    if step < warm:
        return config.lr * (step + 1) / warm
    progress = (step - warm) / max(1, total_steps - warm)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# ---------------------------------------------------------------------------------- files


def _fsync_dir(path: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Write `path` atomically: `write(tmp)` into a temporary file next to it, fsync, rename.

    A crash at any point leaves either the old file or the new one, never a mix.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def _write_bytes(data: bytes) -> Callable[[Path], None]:
    return lambda tmp: tmp.write_bytes(data)


def _save_weights(model: nn.Module, path: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save

    # A copy of each tensor: safetensors refuses tensors that share storage, and a state_dict may hold views.
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}
    atomic_write(path, _write_bytes(save(tensors, metadata=metadata)))


def _save_state(state: dict[str, Any], path: Path) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write(path, _write_bytes(buf.getvalue()))


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
    if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
        raise AttnconvError(f"{path}: not an attnconv training state (format {_STATE_FORMAT})")
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


def _metrics_text(rows: list[dict[str, float]]) -> str:
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
        from attnconv.convert import cnn_to_attention

        conv = meta["converted"]
        model = cnn_to_attention(model.eval(), fold_bn=bool(conv.get("fold_bn")), alpha=conv.get("alpha"))
    _load_weights(model, run_dir / WEIGHTS_FILE, config.model)
    return model.to(device).eval(), config


def _load_weights(model: nn.Module, path: Path, what: str) -> None:
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
    from attnconv.construct import LearnableConvAttention
    from attnconv.convert import cnn_to_attention

    if source_weights:
        run = Path(src["run"])
        meta = read_config(run)
        if "converted" in meta or meta["config"].get("init_from"):
            raise AttnconvError(f"--init-from {run}: is already an attention network; give the run of a CNN")
        _load_weights(model, run / WEIGHTS_FILE, config.model)
    model = cnn_to_attention(model.eval(), fold_bn=src["fold_bn"], alpha=float(src["alpha"]), learnable=True,
                             key_dim=int(src.get("content", 0)))
    if not any(isinstance(m, LearnableConvAttention) for m in model.modules()):
        raise AttnconvError(f"--init-from {src['run']}: model {config.model!r} has no convolution to start from")
    return model.train()


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD (or AdamW) with parameter groups: weight decay, and none for `no_weight_decay(model)`;
    with `attention_lr_scale` != 1, each split again by `attention_placement(model)`.

    The paper exempts the attention centers and widths from weight decay. The LR is
    set before every step from `learning_rate` times each group's "lr_scale", so the
    value given here is a placeholder.
    """
    skip = no_weight_decay(model)
    scaled = set() if config.attention_lr_scale == 1 else attention_placement(model)
    if not scaled and config.attention_lr_scale != 1:
        raise AttnconvError(f"--attention-lr-scale {config.attention_lr_scale}: model {config.model!r} has no "
                            "attention centers, widths or content projections to scale; drop the flag")
    params = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in params if (n in skip) == exempt and (n in scaled) == placed],
         "weight_decay": 0.0 if exempt else config.weight_decay,
         "lr_scale": config.attention_lr_scale if placed else 1.0}
        for placed in (False, True) for exempt in (False, True)
    ]
    groups = [g for g in groups if g["params"]]
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.momentum, 0.999))


# ---------------------------------------------------------------------------------- processes


@dataclass
class _Dist:
    """Where this process sits among torchrun's processes (world_size 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def agree(self, error: str | None) -> None:
        """Raise on every rank if any rank failed, so no rank waits forever in a collective."""
        if self.active:
            errors: list[str | None] = [None] * self.world_size
            dist.all_gather_object(errors, error)
            error = next((e for e in errors if e), None)
        if error:
            raise AttnconvError(error)

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        if not self.active:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()


def _init_distributed(config: TrainConfig) -> _Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return _Dist()
    d = _Dist(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    cuda = config.device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(d.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    return d


# ---------------------------------------------------------------------------------- training


@dataclass
class _Progress:
    """Counters that a checkpoint saves; sums are global (all ranks) when saved."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # epoch in progress (0-based)
    batch: int = 0  # batches of `epoch` done
    rows: int = 0  # rows in metrics.csv
    finished: bool = False
    loss_sum: float = 0.0  # this epoch's training loss, summed over samples
    correct: float = 0.0
    seen: float = 0.0
    seconds: float = 0.0  # training time of this epoch so far (no eval, no checkpoint writes)


def train(
    config: TrainConfig,
    out: str | os.PathLike,
    *,
    resume: bool = False,
    dataset: tuple[D.ImageSet, D.ImageSet] | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Train `config` into the run directory `out`; returns the last metrics row.

    resume: continue from out/state.pt if there is one (start fresh if not), after
    checking that the config matches out/config.json except for `RESUMABLE_CHANGES`.
    dataset: (train, test) ImageSets to use instead of loading `config.dataset`
    (they must have that dataset's shape). Launched by torchrun, trains with DDP.
    """
    config.validate()
    out = Path(out)
    fresh = not out.exists()
    d = _init_distributed(config)
    try:
        return _Trainer(config, out, resume, dataset, progress, d).run()
    except AttnconvError:
        if fresh and d.main and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a run that failed before writing anything leaves no empty directory behind
        raise
    finally:
        if d.active and dist.is_initialized():
            dist.destroy_process_group()


class _Trainer:
    def __init__(self, config, out: Path, resume: bool, dataset, progress: bool, d: _Dist):
        self.config, self.out, self.resume, self.d = config, out, resume, d
        self.show_bar = progress and d.main  # the bar; epoch summaries print on rank 0 regardless
        if config.workers is not None:
            torch.set_num_threads(config.workers)
        if config.device.startswith("cuda"):
            self.device = torch.device("cuda", d.local_rank if d.active else torch.device(config.device).index or 0)
        else:
            self.device = torch.device("cpu")

        # Cheap checks first: a bad --out fails before the data is read.
        d.agree(self._check_out() if d.main else None)
        self.info = D.dataset_info(config.dataset)
        try:
            self.train_set, self.test_set = dataset if dataset is not None else D.load_dataset(
                config.dataset, config.data_dir, download=True)
            self._check_data()
        except AttnconvError as err:
            d.agree(str(err))  # every rank fails the same way here; agree keeps them in step anyway
        d.agree(None)
        if self.device.type == "cuda":  # the uint8 sets live on the GPU: batches never cross PCIe
            self.train_set, self.test_set = self.train_set.to(self.device), self.test_set.to(self.device)
        self.config = config = self._resolve_overrides(config)
        d.agree(self._check_existing_config() if d.main else None)

        self.steps_per_epoch = len(self.train_set) // config.batch_size
        self.total_steps = config.epochs * self.steps_per_epoch
        if config.max_steps is not None:
            self.total_steps = min(self.total_steps, config.max_steps)

        torch.manual_seed(config.seed)  # the same initial weights on every rank and every resume
        has_state = resume and (out / STATE_FILE).exists()
        error = None
        try:
            self.model = build_run_model(config, source_weights=not has_state).to(self.device)
        except AttnconvError as err:
            error = str(err)
        d.agree(error)
        # Dropout streams differ per rank (the shards are different samples anyway).
        torch.manual_seed(config.seed + d.rank)
        self.optimizer = make_optimizer(self.model, config)
        self.progress = _Progress()
        if has_state:
            self._restore(load_state(out / STATE_FILE))

        net: nn.Module = self.model
        if d.active:
            net = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.train_net = torch.compile(net) if config.compile else net
        self.eval_net = self.train_net if not d.active else (
            torch.compile(self.model) if config.compile else self.model)
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=config.amp)

    # ---------------------------------------------------------------- setup checks

    def _check_out(self) -> str | None:
        """Rank 0: the run directory can be written, and holds no other run."""
        out = self.out
        try:
            out.mkdir(parents=True, exist_ok=True)
            probe = out / f".write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            return f"--out {out}: cannot write there ({err.strerror or err}); choose another directory"
        if (out / CONFIG_FILE).exists() and not self.resume:
            return (f"--out {out} already holds a run; pass --resume to continue it, "
                    "or choose a new --out to start over")
        return None

    def _check_data(self) -> None:
        info, bs, w = self.info, self.config.batch_size, self.d.world_size
        for name, s in (("train", self.train_set), ("test", self.test_set)):
            if not isinstance(s, D.ImageSet):
                raise AttnconvError(f"{name} set must be an attnconv.data.ImageSet, got {type(s).__name__}")
            if tuple(s.images.shape[1:]) != (info.channels, info.size, info.size):
                raise AttnconvError(f"{name} images are {tuple(s.images.shape[1:])}, {info.name} is "
                                    f"({info.channels}, {info.size}, {info.size})")
            if len(s) == 0:
                raise AttnconvError(f"the {info.name} {name} set is empty; check --data-dir")
            if s.labels.min() < 0 or s.labels.max() >= info.num_classes:
                raise AttnconvError(f"{name} labels must be in 0..{info.num_classes - 1}")
        if bs > len(self.train_set):
            raise AttnconvError(f"--batch-size {bs} is larger than the training set ({len(self.train_set)} images)")
        if bs % w:
            raise AttnconvError(f"--batch-size {bs} (global) is not divisible by the {w} processes")

    def _resolve_overrides(self, config: TrainConfig) -> TrainConfig:
        """Fill in the overrides that the data decides; a conflicting explicit value is an error."""
        info = self.info
        derived = {"in_channels": info.channels, "image_size": info.size, "num_classes": info.num_classes}
        overrides = dict(config.model_overrides)
        for key, value in derived.items():
            if overrides.get(key, value) != value:
                flag = "--" + key.replace("_", "-")
                self.d.agree(f"{flag} {overrides[key]} does not match {info.name} ({key} = {value}); drop {flag}")
            overrides[key] = value
        config = dataclasses.replace(config, model_overrides=overrides)
        try:
            build_model(config.model, **overrides)  # bad overrides fail here, before any file is written
        except AttnconvError as err:
            self.d.agree(str(err))
        return config

    def _check_existing_config(self) -> str | None:
        """Rank 0: on --resume, the saved config must match except for RESUMABLE_CHANGES."""
        path = self.out / CONFIG_FILE
        if not path.exists():
            return None
        try:
            saved = TrainConfig.from_dict(read_config(self.out)["config"]).to_dict()
        except AttnconvError as err:
            return str(err)
        new = self.config.to_dict()
        diff = [f"{k}: {saved[k]!r} -> {new[k]!r}" for k in new if k not in RESUMABLE_CHANGES and new[k] != saved[k]]
        if diff:
            return (f"--out {self.out} holds a run with a different config ({'; '.join(diff)}); "
                    "resume with the same settings, or choose a new --out")
        return None

    # ---------------------------------------------------------------- checkpoints

    def _restore(self, state: dict[str, Any]) -> None:
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.progress = _Progress(**state["progress"])
        except (KeyError, RuntimeError, ValueError, TypeError) as err:
            raise AttnconvError(f"{self.out / STATE_FILE}: does not fit this run ({str(err).splitlines()[0]}); "
                                "delete it to restart from scratch") from None
        if not self.d.main:  # rank 0 carries the epoch's sums so far; the others start from 0
            p = self.progress
            p.loss_sum = p.correct = p.seen = 0.0
        rng = state["rng"]
        if len(rng["torch"]) == self.d.world_size:
            torch.set_rng_state(rng["torch"][self.d.rank])
            if self.device.type == "cuda" and rng["cuda"] is not None:
                torch.cuda.set_rng_state(rng["cuda"][self.d.rank], self.device)
        else:  # a different number of processes: continue, but dropout streams start anew
            torch.manual_seed(self.config.seed + self.d.rank + 7919 * self.progress.step)

    def _checkpoint(self) -> None:
        """Write model.safetensors, then state.pt (collective: gathers every rank's RNG state)."""
        p = dataclasses.replace(self.progress)
        p.loss_sum, p.correct, p.seen = self.d.sum([p.loss_sum, p.correct, p.seen], self.device)
        rng_torch = [torch.get_rng_state()]
        rng_cuda = [torch.cuda.get_rng_state(self.device)] if self.device.type == "cuda" else None
        if self.d.active:
            gathered: list[Any] = [None] * self.d.world_size
            dist.all_gather_object(gathered, (rng_torch[0], rng_cuda[0] if rng_cuda else None))
            rng_torch = [g[0] for g in gathered]
            rng_cuda = [g[1] for g in gathered] if rng_cuda else None
        # Checked on every rank (the weights are the same everywhere), so all stop together.
        bad = [n for n, t in self.model.state_dict().items() if t.is_floating_point() and not t.isfinite().all()]
        if bad:
            raise AttnconvError(self._nan_message(f"weights became non-finite ({bad[0]})", p.step))
        if not self.d.main:
            return
        metadata = {"model": self.config.model, "step": str(p.step), "epoch": str(p.epoch)}
        _save_weights(self.model, self.out / WEIGHTS_FILE, metadata)
        state = {
            "format": _STATE_FORMAT,
            "progress": dataclasses.asdict(p),
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "rng": {"torch": rng_torch, "cuda": rng_cuda},
        }
        _save_state(state, self.out / STATE_FILE)

    def _nan_message(self, what: str, step: int) -> str:
        state = self.out / STATE_FILE
        if state.exists():
            good = load_state(state)["progress"]["step"]
            last = f"the last good checkpoint (step {good}) is intact in {self.out}"
        else:
            last = "no checkpoint was written yet"
        return (f"{what} at step {step} (lr {learning_rate(self.config, step - 1, self.total_steps):.3g}); "
                f"{last}; lower --lr or raise --warmup and train into a new --out")

    # ---------------------------------------------------------------- loop

    def run(self) -> dict[str, float]:
        p, d = self.progress, self.d
        if d.main:
            self._prepare_files()
        if p.finished:
            if self.d.main:
                print(f"{self.out}: run already finished ({p.step} steps)", file=sys.stderr)
            return read_metrics(self.out)[-1]
        if self.d.main and p.step:
            print(f"resuming {self.out} at step {p.step} (epoch {p.epoch + 1}, batch {p.batch})", file=sys.stderr)
        row: dict[str, float] = {}
        while not p.finished:
            row = self._epoch()
        return row

    def _prepare_files(self) -> None:
        out, cfg = self.out, self.config
        for leftover in out.glob(".*.tmp-*"):  # temporaries of a killed writer
            leftover.unlink(missing_ok=True)
        if not (out / CONFIG_FILE).exists():
            meta = {
                "config": cfg.to_dict(),
                "parameters": sum(t.numel() for t in self.model.parameters()),
                "steps_per_epoch": self.steps_per_epoch,
                "total_steps": self.total_steps,
                "world_size": self.d.world_size,
                "torch": torch.__version__,
                "attnconv": attnconv.__version__,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            }
            atomic_write(out / CONFIG_FILE, _write_bytes((json.dumps(meta, indent=2) + "\n").encode()))
        # Keep exactly the rows the checkpoint knows of: an epoch logged after the last
        # checkpoint is replayed, and must not be logged twice.
        rows = read_metrics(out, limit=self.progress.rows)
        atomic_write(out / METRICS_FILE, _write_bytes(_metrics_text(rows).encode()))

    def _epoch(self) -> dict[str, float]:
        cfg, p, d = self.config, self.progress, self.d
        batches = D.iterate_batches(
            self.train_set, self.info, cfg.batch_size, seed=cfg.seed, epoch=p.epoch, train=True,
            augment=cfg.augment, rank=d.rank, world_size=d.world_size, drop_last=True, start_batch=p.batch,
            device=self.device,
        )
        bar = _bar(self.show_bar, self.steps_per_epoch, p.batch, f"epoch {p.epoch + 1}/{cfg.epochs}")
        self.train_net.train()
        # Device-side accumulators: no host sync per step (a sync per step stalls a GPU).
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss_sum, correct, seen
        first_bad = torch.full((), -1, dtype=torch.int64, device=self.device)
        lr = learning_rate(cfg, p.step, self.total_steps)
        tick = time.perf_counter()
        for x, y in batches:
            lr = learning_rate(cfg, p.step, self.total_steps)
            for group in self.optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
            with self.autocast:
                logits = self.train_net(x)
            loss = F.cross_entropy(logits.float(), y)  # the shard's mean; DDP averages shards
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            p.step += 1
            p.batch += 1
            with torch.no_grad():
                n = len(y)
                sums += torch.stack([loss.detach().double() * n, (logits.argmax(1) == y).sum().double(),
                                     torch.tensor(float(n), dtype=torch.float64, device=self.device)])
                first_bad = torch.where((first_bad < 0) & ~loss.isfinite(), p.step, first_bad)
            bar.update(1)
            epoch_done = p.batch == self.steps_per_epoch
            run_done = p.step >= self.total_steps
            ckpt = cfg.checkpoint_every and p.step % cfg.checkpoint_every == 0
            if epoch_done or run_done or ckpt or p.step % _SYNC_EVERY == 0:
                now = time.perf_counter()
                p.seconds += now - tick
                self._sync(sums, first_bad, bar)
                if epoch_done or run_done:
                    break
                if ckpt:
                    self._checkpoint()
                tick = time.perf_counter()
        bar.close()

        # End of the epoch (or of the run, at --max-steps): evaluate, log, checkpoint.
        p.loss_sum, p.correct, p.seen = d.sum([p.loss_sum, p.correct, p.seen], self.device)
        test_loss, test_acc = self._evaluate()
        row = {
            "epoch": p.epoch + 1, "step": p.step, "train_loss": p.loss_sum / p.seen, "train_acc": p.correct / p.seen,
            "test_loss": test_loss, "test_acc": test_acc, "seconds": p.seconds,
            "images_per_s": p.seen / p.seconds if p.seconds > 0 else 0.0, "lr": lr,
        }
        if self.d.main:
            _write(
                f"epoch {p.epoch + 1}/{cfg.epochs}  step {p.step}  train loss {row['train_loss']:.4f} "
                f"acc {row['train_acc']:.4f}  test loss {test_loss:.4f} acc {test_acc:.4f}  "
                f"{p.seconds:.1f} s  {row['images_per_s']:.0f} img/s"
            )
        p.finished = p.step >= self.total_steps
        if p.batch == self.steps_per_epoch:
            p.epoch, p.batch = p.epoch + 1, 0
        p.rows += 1
        if d.main:
            with open(self.out / METRICS_FILE, "a", newline="") as f:
                f.write(_metrics_text([row]).split("\n", 1)[1])
                f.flush()
                os.fsync(f.fileno())
        p.loss_sum = p.correct = p.seen = p.seconds = 0.0
        self._checkpoint()
        return row

    def _sync(self, sums: torch.Tensor, first_bad: torch.Tensor, bar) -> None:
        """Move the device-side sums into `progress`, and stop on a non-finite loss (on every rank)."""
        p = self.progress
        bad = int(first_bad)
        if self.d.active:
            t = torch.tensor([bad if bad >= 0 else 2**62], device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            bad = int(t) if int(t) < 2**62 else -1
        if bad >= 0:
            raise AttnconvError(self._nan_message("loss became non-finite (NaN or inf)", bad))
        loss_sum, correct, seen = sums.tolist()
        sums.zero_()
        p.loss_sum += loss_sum
        p.correct += correct
        p.seen += seen
        if p.seen and bar is not None:
            rate = p.seen * self.d.world_size / p.seconds if p.seconds > 0 else 0.0
            bar.set_postfix(loss=f"{p.loss_sum / p.seen:.4f}", acc=f"{p.correct / p.seen:.4f}",
                            img_s=f"{rate:.0f}", refresh=False)

    def _evaluate(self) -> tuple[float, float]:
        from attnconv.evaluate import evaluate

        with self.autocast:
            return evaluate(self.eval_net, self.test_set, self.info, batch_size=max(self.config.batch_size, 256),
                            device=self.device, rank=self.d.rank, world_size=self.d.world_size)


def _bar(show: bool, total: int, initial: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not show, leave=False, unit="step",
                dynamic_ncols=True, mininterval=0.5)


def _write(line: str) -> None:
    # tqdm.write keeps an active progress bar intact.
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)
