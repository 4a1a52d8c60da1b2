"""Training configuration: `TrainConfig`, the named presets and `make_config`.

    config = make_config(preset="fmnist-sa-quadratic", epochs=2)

A config is everything that defines a training run (the run directory is not part of
it); `config.json` of every run holds one (`TrainConfig.to_dict`).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from attnconv import data as D
from attnconv.errors import AttnconvError, ParameterError
from attnconv.fileio import not_a_folder
from attnconv.limits import as_real, plain_number, shown_value
from attnconv.models import list_models
from attnconv.options import FieldError, check_fields, option
from attnconv.pathwords import expanded
from attnconv.precision import check_device

SCHEDULES = ("warmup-cosine", "multistep", "constant")
MAX_WORKERS = 256  # torch threads: far more than any CPU here; 5,000 hangs torch, 100,000 crashes it
OPTIMIZERS = ("sgd", "adamw")
# Fields that may change when a run is resumed: where and how fast it runs, not what it computes.
RESUMABLE_CHANGES = frozenset({"device", "workers", "data_dir", "checkpoint_every", "compile", "preset"})
# The paper's ResNet steps, at epochs 80/150/250 of 300, as fractions of training.
PAPER_MILESTONES = (80 / 300, 150 / 300, 250 / 300)


def _optimization(*args: Any, **kwargs: Any) -> Any:
    return option(*args, section="optimization", **kwargs)


def _execution(*args: Any, **kwargs: Any) -> Any:
    return option(*args, section="execution", **kwargs)


@dataclass
class InitFrom:
    """Start an attention network from a trained CNN run (`train --init-from`): every convolution
    becomes attention (Theorem 1) with its heads' initial alpha, BatchNorms folded or kept, and
    optionally content attention of `content` query/key channels per head (0: none)."""

    run: str = option(help="the trained CNN run directory", cli=False)
    alpha: float = option(3.0, "the heads' initial alpha (default 3: 83% of each 2-d head's attention on its tap, "
                          "so the heads can move; 20+ starts as the exact CNN, whose heads then hardly get gradients)",
                          low=1e-9, high=1e4, flag="init-alpha",
                          fix="give a positive number (1 to 4 lets the heads move; 20+ is exact)")
    fold_bn: bool = option(False, "fold the CNN's BatchNorms into the attention layers (default: keep them, trained)",
                           flag="fold-bn")
    content: int = option(0, "add content attention with DIM query/key channels per head to every kxk layer; its "
                          "queries start at zero, so the network starts as without it (default: none)",
                          low=0, high=4096, flag="init-content", metavar="DIM",
                          fix="give the query/key width per head, a whole number from 1 to 4096 (0 or left out: none)")


@dataclass
class TrainConfig:
    """Everything that defines a training run (the run directory is not part of it).

    Each field carries its help text and range (`attnconv.options`): the flags of `attnconv
    train` and the checks of `validate` are derived from them. `batch_size` is the global batch
    (split across DDP ranks); `warmup` and `milestones` are fractions of all steps.
    """

    model: str = option(help="model name", cli=False)
    dataset: str = option(help="cifar10, fashion-mnist, or folder:PATH", cli=False)
    model_overrides: dict[str, Any] = option(default_factory=dict, cli=False)
    preset: str | None = option(None, cli=False)
    epochs: int = _optimization(10, low=1, high=10**6)
    max_steps: int | None = _optimization(None, "stop after this many steps", low=1, high=10**12)
    batch_size: int = _optimization(128, "global batch size (split across processes)", low=1, high=10**7)
    optimizer: str = _optimization("sgd", choices=OPTIMIZERS)
    lr: float = _optimization(0.1, low=1e-12, high=1e38, fix="give a positive number")
    momentum: float = _optimization(0.9, "SGD momentum (AdamW: beta1)", low=0, high=1, high_open=True)
    weight_decay: float = _optimization(1e-4, "not applied to attention centers and widths", low=0, high=1e6)
    schedule: str = _optimization("warmup-cosine", choices=SCHEDULES)
    warmup: float = _optimization(0.05, "warm-up length, as a fraction of all steps (warmup-cosine)", low=0, high=1,
                           high_open=True, fix="give the warm-up as a fraction of all steps, in [0, 1)")
    milestones: tuple[float, ...] = option(PAPER_MILESTONES, cli=False)
    gamma: float = _optimization(0.1, "multistep: LR factor at each milestone", low=1e-12, high=1)
    augment: bool = _optimization(True, "random crops (and horizontal flips, see --flip)")
    # with augment: random crops padded by `crop_pad` pixels a side, and horizontal flips when `flip`
    # (the paper's CIFAR-10 recipe: 4 and on; folders: a pad scaled to the image, no flip).
    crop_pad: int = _optimization(4, "with --augment: pad each side by PIXELS and crop back at random (default: the preset's; "
                           "4 for CIFAR-10, about 1/8 of the image for folders; 0: no crop)", low=0, high=1024,
                           metavar="PIXELS")
    flip: bool = _optimization(True, "with --augment: random horizontal flips (default: the preset's; on for CIFAR-10, off "
                        "for folders, where a flip can change the label: digits, text)")
    seed: int = _optimization(0, low=0, high=2**63 - 1, fix="give a whole number from 0 to 2^63 - 1")  # torch.manual_seed's range
    device: str = _execution("cpu", "cpu or cuda")
    amp: bool = _execution(False, "bfloat16 autocast")
    compile: bool = _execution(False, "torch.compile the model")
    workers: int | None = _execution(None, "CPU threads for torch", low=1, high=MAX_WORKERS)
    data_dir: str | None = _execution(None, "folder with the dataset files")
    checkpoint_every: int = _execution(0, "also checkpoint every STEPS steps (default: at epoch ends only)", low=0,
                                   high=10**12, metavar="STEPS")
    # Multiplies the learning rate of the parameters that decide where attention looks
    # (`attnconv.models.attention_placement`: centers, widths, converted layers' content query/key).
    attention_lr_scale: float = _optimization(1.0, "multiply the LR of the attention centers and widths (and, with "
                                       "--init-content, the content query/key projections) by K (default 1)",
                                       low=1e-9, high=1e9, metavar="K",
                                       fix="give a positive factor (1: the same learning rate as the other parameters)")
    init_from: InitFrom | None = option(None, cli=False)

    def validate(self) -> None:
        """Raise FieldError (an AttnconvError) naming the first bad field and the fix."""
        if self.model not in list_models():
            raise AttnconvError(f"unknown model {self.model!r}; choose one of: {', '.join(list_models())}")
        D.dataset_info(self.dataset)  # raises for an unknown dataset
        if not isinstance(self.model_overrides, dict):
            raise FieldError("model_overrides", self.model_overrides, "give a dict of model options")
        self.check_values()
        check_device(self.device)
        why = None if self.data_dir is None else not_a_folder(expanded(self.data_dir))
        if why:
            raise ParameterError("data_dir", self.data_dir, f": {why}; give the folder holding the dataset's files")

    def check_values(self) -> None:
        """FieldError for the first field out of its range or choices (milestones and init_from included):
        what `validate` checks apart from this machine (the device, the data folder, the model list)."""
        check_fields(self)
        fractions = [as_real(m) for m in self.milestones] \
            if isinstance(self.milestones, (tuple, list)) else [None]
        if not (all(m is not None and 0 < m < 1 for m in fractions)
                and all(a < b for a, b in zip(fractions, fractions[1:]))):
            raise FieldError("milestones", self.milestones,
                             "give increasing fractions of all steps, each in (0, 1), e.g. 0.27,0.5,0.83")
        object.__setattr__(self, "milestones", tuple(fractions))  # Python floats, as config.json holds them
        if not isinstance(self.model_overrides, dict):
            raise FieldError("model_overrides", self.model_overrides, "give a dict of model options")
        odd = next((key for key in self.model_overrides if not isinstance(key, str)), None)
        if odd is not None:
            raise AttnconvError(f"model_overrides key {shown_value(odd)} is not a string: give the model's options by "
                                "name")
        overrides = plain_number(self.model_overrides)
        for key, value in overrides.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError):  # what config.json cannot hold (an object, a tensor of many values)
                raise AttnconvError(f"model_overrides[{key!r}] {shown_value(value)} cannot be written to config.json: "
                                    "give a number, a string, or a list of them") from None
        object.__setattr__(self, "model_overrides", overrides)
        if self.init_from is not None:
            if not isinstance(self.init_from, InitFrom):
                raise FieldError("init_from", self.init_from, "give an InitFrom(run=..., alpha=..., fold_bn=...)")
            check_fields(self.init_from)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["milestones"] = list(self.milestones)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of `to_dict`; unknown keys are an error (a config from another tool or version),
        and so is a value of the wrong type (a list for model_overrides, a string for epochs) or out of
        its range or choices (`check_values`): what reads a run directory can rely on the field values."""
        if not isinstance(d, dict):
            raise AttnconvError(f"the training config is a {type(d).__name__}, not a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise AttnconvError(f"unknown training config field(s) {', '.join(unknown)}")
        hints = typing.get_type_hints(cls)
        for name, value in d.items():
            if name != "init_from" and not _fits(value, hints[name]):
                shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
                raise AttnconvError(f"field {name} is {shown}, expected {_type_name(hints[name])}")
        d = dict(d)
        if "milestones" in d:
            d["milestones"] = tuple(d["milestones"])
        if d.get("init_from") is not None:
            d["init_from"] = _init_from_dict(d["init_from"])
        try:
            config = cls(**d)
        except TypeError as err:
            raise AttnconvError(f"incomplete training config: {err}") from None
        try:  # a value out of range (epochs -5, workers 100000) is the file's fault, not a flag's
            config.check_values()
        except FieldError as err:
            where = "init_from." if err.field in {f.name for f in dataclasses.fields(InitFrom)} else ""
            raise AttnconvError(f"field {where}{err}") from None
        return config


def _init_from_dict(d: Any) -> InitFrom:
    """config.json's init_from object as an InitFrom, each key checked (one error naming the key)."""
    expected = 'expected {"run": CNN_RUN_DIR, "alpha": number, "fold_bn": true/false, "content": whole number}'
    if not isinstance(d, dict):
        raise AttnconvError(f"field init_from is {d!r}: {expected}")
    names = {f.name for f in dataclasses.fields(InitFrom)}
    if set(d) - names or not {"run", "alpha", "fold_bn"} <= set(d):
        raise AttnconvError(f"field init_from has keys {', '.join(sorted(d))}: {expected}")
    hints = typing.get_type_hints(InitFrom)
    for name, value in d.items():
        if not _fits(value, hints[name]):
            raise AttnconvError(f"field init_from.{name} is {value!r}, expected {_type_name(hints[name])}")
    return InitFrom(**d)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a TrainConfig field's annotation (ints fit float, bools fit only bool)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin is dict:
        return isinstance(value, dict) and all(_fits(k, args[0]) for k in value) if args else isinstance(value, dict)
    if origin is tuple:  # tuple[X, ...]: JSON gives a list
        return isinstance(value, (list, tuple)) and all(_fits(v, args[0]) for v in value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return _is_int(value)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    names = {dict: "an object", tuple: "a list of numbers", bool: "true or false", int: "a whole number",
             float: "a number", str: "a string"}
    return names.get(typing.get_origin(hint) or hint) or getattr(hint, "__name__", str(hint))


# ---------------------------------------------------------------------------------- presets


def _paper(model: str, schedule: str) -> TrainConfig:
    # Section 4 of the paper / its code: SGD 0.1, momentum 0.9, wd 1e-4 (not on the
    # attention centers and widths), batch 100, 300 epochs, crop + flip.
    return TrainConfig(
        model=model, dataset="cifar10", epochs=300, batch_size=100, optimizer="sgd", lr=0.1,
        momentum=0.9, weight_decay=1e-4, schedule=schedule, warmup=0.05, milestones=PAPER_MILESTONES,
        augment=True,
    )


# The Fashion-MNIST attention presets' model: the paper's block, narrower, on 7x7 tokens, no dropout.
_FMNIST_ATTENTION = {"hidden": 96, "layers": 4, "heads": 9, "intermediate": 192, "downsample": 4,
                     "dropout": 0.0, "attn_dropout": 0.0}

PRESETS: dict[str, TrainConfig] = {
    "paper-cifar10-resnet18": _paper("resnet18", "multistep"),
    "paper-cifar10-sa-quadratic": _paper("sa-quadratic", "warmup-cosine"),
    "paper-cifar10-sa-quadratic-aniso": _paper("sa-quadratic-aniso", "warmup-cosine"),
    "paper-cifar10-sa-learned": _paper("sa-learned", "warmup-cosine"),
    "paper-cifar10-sa-learned-content": _paper("sa-learned-content", "warmup-cosine"),
    # Fashion-MNIST presets sized for a 2-core CPU. The attention model keeps the paper's block
    # (9 heads, shared values, post-LN) but downsamples 4x4 (28x28x1 -> 7x7x16 tokens) and is
    # narrower, since 14x14 tokens cost several times more per epoch; AdamW for the short
    # budget; no crop/flip and no dropout, both of which hurt at this length. The CNN baseline
    # is ResNet-18 at a quarter width, of similar cost per image. What they reach, and the
    # pilots behind these choices: benchmarks/RESULTS.md.
    "fmnist-sa-quadratic": TrainConfig(
        model="sa-quadratic", dataset="fashion-mnist",
        model_overrides=dict(_FMNIST_ATTENTION),
        epochs=12, batch_size=128, optimizer="adamw", lr=2e-3, weight_decay=0.05,
        schedule="warmup-cosine", warmup=0.05, augment=False,
    ),
    # The same model under the paper's optimizer (SGD lr 0.1, momentum 0.9, weight decay 1e-4 not on
    # centers and widths, batch 100, warm-up + cosine), for the question the AdamW preset cannot
    # settle: how far the centers travel, and whether they form a grid, under the paper's recipe.
    # Differs from the paper in data, length (12 epochs, not 300) and no crop/flip.
    "fmnist-sa-quadratic-sgd": TrainConfig(
        model="sa-quadratic", dataset="fashion-mnist",
        model_overrides=dict(_FMNIST_ATTENTION),
        epochs=12, batch_size=100, optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4,
        schedule="warmup-cosine", warmup=0.05, augment=False,
    ),
    # A plain ViT (attnconv.models.vit: patches of 4, a class token, absolute positions, pre-LN, SDPA) beside
    # the attention model, under the same optimizer, schedule and length: 7x7 patch tokens, 9 heads, 4 layers,
    # hidden 108 (MLP 4x), about as many parameters (0.57M against 0.52M).
    "fmnist-vit": TrainConfig(
        model="vit", dataset="fashion-mnist",
        model_overrides={"hidden": 108, "layers": 4, "heads": 9, "intermediate": 432, "patch": 4,
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
    `model_overrides` is merged into the preset's, not substituted. A value out of its field's range
    raises FieldError naming the field (`epochs 0 is invalid: ...`); what depends on the machine
    (device, data_dir, the dataset) is checked by `TrainConfig.validate` when the run starts.
    """
    if preset is not None and base is not None:
        raise ValueError("give preset or base, not both")
    if preset is not None:
        if preset not in PRESETS:
            raise AttnconvError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
        base = dataclasses.replace(PRESETS[preset], preset=preset)
    changes = {k: v for k, v in changes.items() if v is not None}
    if base is None:
        missing = [k for k in ("model", "dataset") if k not in changes]
        if missing:
            them = "them" if len(missing) > 1 else "it"
            raise AttnconvError(f"missing {' and '.join(missing)}: give {them}, or a preset ({', '.join(PRESETS)})")
        base = TrainConfig(model=changes.pop("model"), dataset=changes.pop("dataset"))
    overrides = {**base.model_overrides, **{k: v for k, v in changes.pop("model_overrides", {}).items()
                                            if v is not None}}
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise TypeError(f"unknown TrainConfig field(s): {', '.join(unknown)}")
    if "milestones" in changes and not isinstance(changes["milestones"], (str, bytes)):  # "0.5": refused as it is
        changes["milestones"] = tuple(changes["milestones"])
    config = dataclasses.replace(base, model_overrides=overrides, **changes)
    config.check_values()  # each value in its range now (FieldError naming the field); `validate` checks the rest
    return config
