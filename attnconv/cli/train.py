"""`attnconv train`: train a named model on a dataset into a run directory.

    attnconv train --preset fmnist-sa-quadratic --out runs/sa
    attnconv train --model resnet18 --dataset fashion-mnist --width 16 --epochs 5 --out runs/r
    attnconv train --out runs/sa --resume            # continue after any interruption
    attnconv train --init-from runs/r --init-alpha 3 --epochs 3 --lr 0.01 --out runs/r-attn
                                                     # the CNN run r as attention, trained further
    attnconv train --init-from runs/r --init-content 8 --batch-size 32 --max-steps 200 --out runs/r-content
                                                     # ... plus content attention (8 channels per head)
    torchrun --nproc-per-node 2 -m attnconv train --preset ... --out runs/ddp

Without --preset, the preset registered for the dataset is the base (Fashion-MNIST: the
CPU presets; CIFAR-10: the paper's; folder:PATH: AdamW scaled to the image size and count;
see attnconv.dataset_presets) and the line `preset: ...` says what it set. Explicit flags override
the preset or preset; model flags (--hidden, --layers, ...) override the model's defaults.
With --resume, a run directory's saved config is the base, and
only --device, --workers, --data-dir, --checkpoint-every and --compile may change.
With --init-from, the architecture, dataset and preset are the CNN run's (optimization
flags override the preset): every convolution becomes a multi-head attention layer
whose heads start on the kernel taps with --init-alpha and have learnable centers and
widths (attnconv.cnn_to_attention(..., learnable=True)); --init-content DIM adds content
attention (DIM query/key channels per head, starting at zero) to every layer of a kxk
convolution. Content attention attends over every pixel of the layer's input for every
query, so it costs far more than the position-only layers (9x per training step for the
Fashion-MNIST ResNet-18 on a CPU; see benchmarks/RESULTS.md). --attention-lr-scale K
multiplies the learning rate of the heads' centers and widths and of the content
query/key projections by K (any model with such parameters, the paper's quadratic
attention models too).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from attnconv.errors import AttnconvError

# Model overrides as flags: (flag, type, help). None (the default) keeps the preset's or model's value.
MODEL_FLAGS = (
    ("in-channels", int, "input channels (set from the dataset)"),
    ("image-size", int, "image side (set from the dataset; for folder:PATH the size images are resized and "
                        "center-cropped to, default 32)"),
    ("num-classes", int, "classes (set from the dataset)"),
    ("hidden", int, "attention models: hidden width (paper: 400)"),
    ("heads", int, "attention models: heads (paper: 9)"),
    ("layers", int, "attention models: layers (paper: 6)"),
    ("intermediate", int, "attention models: MLP width (paper: 512)"),
    ("downsample", int, "attention models: space-to-depth factor (paper: 2)"),
    ("dropout", float, "attention models: dropout after attention and MLP (paper: 0.1)"),
    ("attn-dropout", float, "attention models: dropout on attention probabilities (paper: 0.1)"),
    ("impl", str, "attention models: auto, dense, separable, stacked, fused or sdpa"),
    ("init", str, "quadratic attention models: 'paper' (centers ~ N(0, 2^2)) or 'grid' (centers on the KxK grid)"),
    ("locality", float, "quadratic attention models with --init grid: initial alpha of every head (default 1)"),
    ("pos-init", str, "learned-encoding models: 'authors' (N(0, 1) tables, as the authors' code; default) or 'bert'"),
    ("attn-dropout-mask", str, "attention models: 'per-sample' (default) or 'shared' (one mask per batch for "
                               "position-only probabilities, as the authors' code)"),
    ("width", int, "resnet18: base channels (paper: 64)"),
)


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated fractions like 0.27,0.5,0.83, got {text!r}")
    return values


def register(subparsers) -> None:
    from attnconv.config import OPTIMIZERS, PRESETS, SCHEDULES
    from attnconv.models import list_models

    p = subparsers.add_parser(
        "train", help="train a model (paper presets, resume, DDP)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory (config, metrics, checkpoints)")
    p.add_argument("--preset", metavar="NAME", help=f"named preset: {', '.join(PRESETS)}")
    p.add_argument("--model", metavar="NAME", help=f"model: {', '.join(list_models())}")
    p.add_argument("--dataset", metavar="NAME",
                   help="cifar10, fashion-mnist, or folder:PATH (PATH/train/<class>/*.png|jpg..., PATH/test|val/...)")
    p.add_argument("--resume", action="store_true",
                   help="continue from RUN_DIR's last checkpoint (starts fresh if there is none)")
    p.add_argument("--allow-data-change", action="store_true",
                   help="with --resume: continue although the dataset changed since the run started (refused "
                        "by default: another class count, image count or normalization)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run in RUN_DIR (its config, logs, weights, state and tensorboard/ folder; "
                        "other files stay)")
    i = p.add_argument_group("starting from a trained CNN")
    i.add_argument("--init-from", metavar="CNN_RUN", help="a trained CNN run: train it further as attention")
    i.add_argument("--init-alpha", type=float, default=None,
                   help="the heads' initial alpha (default 3: 83%% of each 2-d head's attention on its tap, so "
                        "the heads can move; 20+ starts as the exact CNN, whose heads then hardly get gradients)")
    i.add_argument("--fold-bn", action=argparse.BooleanOptionalAction, default=None,
                   help="fold the CNN's BatchNorms into the attention layers (default: keep them, trained)")
    i.add_argument("--init-content", type=int, default=None, metavar="DIM",
                   help="add content attention with DIM query/key channels per head to every kxk layer; its "
                        "queries start at zero, so the network starts as without it (default: none)")
    g = p.add_argument_group("optimization")
    g.add_argument("--epochs", type=int)
    g.add_argument("--max-steps", type=int, help="stop after this many steps")
    g.add_argument("--batch-size", type=int, help="global batch size (split across processes)")
    g.add_argument("--optimizer", choices=OPTIMIZERS)
    g.add_argument("--lr", type=float)
    g.add_argument("--momentum", type=float, help="SGD momentum (AdamW: beta1)")
    g.add_argument("--weight-decay", type=float, help="not applied to attention centers and widths")
    g.add_argument("--attention-lr-scale", type=float, metavar="K",
                   help="multiply the LR of the attention centers and widths (and, with --init-content, the "
                        "content query/key projections) by K (default 1)")
    g.add_argument("--schedule", choices=SCHEDULES)
    g.add_argument("--warmup", type=float, help="warm-up length, as a fraction of all steps (warmup-cosine)")
    g.add_argument("--milestones", type=_fractions, help="multistep: fractions of all steps, e.g. 0.27,0.5,0.83")
    g.add_argument("--gamma", type=float, help="multistep: LR factor at each milestone")
    g.add_argument("--augment", action=argparse.BooleanOptionalAction, default=None,
                   help="random crops (and horizontal flips, see --flip)")
    g.add_argument("--crop-pad", type=int, metavar="PIXELS",
                   help="with --augment: pad each side by PIXELS and crop back at random (default: the preset's; "
                        "4 for CIFAR-10, about 1/8 of the image for folders; 0: no crop)")
    g.add_argument("--flip", action=argparse.BooleanOptionalAction, default=None,
                   help="with --augment: random horizontal flips (default: the preset's; on for CIFAR-10, off for "
                        "folders, where a flip can change the label: digits, text)")
    g.add_argument("--seed", type=int)
    r = p.add_argument_group("execution")
    r.add_argument("--device", help="cpu or cuda")
    r.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None, help="bfloat16 autocast")
    r.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="torch.compile the model")
    r.add_argument("--workers", type=int, help="CPU threads for torch")
    r.add_argument("--data-dir", help="folder with the dataset files")
    r.add_argument("--checkpoint-every", type=int, metavar="STEPS",
                   help="also checkpoint every STEPS steps (default: at epoch ends only)")
    r.add_argument("--no-progress", action="store_true", help="no progress output (epoch summaries only)")
    r.add_argument("--log-every", type=int, default=100, metavar="STEPS",
                   help="a row of RUN_DIR/steps.csv every STEPS steps (default 100), and, when stderr is not a "
                        "terminal (nohup, CI), a progress line (on a terminal a progress bar is shown instead)")
    r.add_argument("--tensorboard", action="store_true",
                   help="also write TensorBoard event files into RUN_DIR/tensorboard/ (train loss, accuracy and "
                        "LR every --log-every steps, test loss and accuracy every epoch; needs `pip install "
                        "tensorboard`)")
    m = p.add_argument_group("model overrides")
    for flag, kind, text in MODEL_FLAGS:
        m.add_argument(f"--{flag}", type=kind, help=text)
    m.add_argument("--grad-checkpoint", dest="checkpoint", action="store_const", const=True, default=None,
                   help="attention models: recompute each block in backward (less memory, ~1.3x more compute)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnconv.config import TrainConfig, make_config
    from attnconv.runs import CONFIG_FILE, read_config
    from attnconv.training import train
    from attnconv.training.loop import summary_writer_class

    if args.tensorboard:
        summary_writer_class()  # a missing tensorboard package is the first thing said, before any other work
    out = Path(args.out)
    base = None
    if args.resume and args.preset is None and args.model is None and (out / CONFIG_FILE).exists():
        base = TrainConfig.from_dict(read_config(out)["config"])
    fields = ("model", "dataset", "epochs", "max_steps", "batch_size", "optimizer", "lr", "momentum",
              "weight_decay", "schedule", "warmup", "milestones", "gamma", "augment", "crop_pad", "flip", "seed", "device", "amp",
              "compile", "workers", "data_dir", "checkpoint_every", "attention_lr_scale")
    overrides = {flag.replace("-", "_"): getattr(args, flag.replace("-", "_")) for flag, _, _ in MODEL_FLAGS}
    overrides["checkpoint"] = args.checkpoint
    changes = {f: getattr(args, f) for f in fields}
    if args.dataset is not None:
        from attnconv.data import canonical_name, folder_path

        if folder_path(args.dataset) is not None:  # folder:PATH as an absolute path, valid from anywhere
            changes["dataset"] = args.dataset = canonical_name(args.dataset)
    if args.init_from is not None:
        base, changes = _init_from(args, base, overrides, changes)
    elif args.init_alpha is not None or args.fold_bn is not None or args.init_content is not None:
        raise AttnconvError("--init-alpha, --fold-bn and --init-content go with --init-from CNN_RUN")
    preset = None
    if args.preset is None and base is None and args.model is not None and args.dataset is not None:
        from attnconv.dataset_presets import dataset_preset, describe

        preset, base = dataset_preset(args.model, args.dataset, image_size=args.image_size, device=args.device or "cpu")
    config = make_config(preset=args.preset, base=base, model_overrides=overrides, **changes)
    config.validate()  # a bad flag is one error line, before anything else is printed
    announce = None if preset is None else \
        f"preset: {preset}, with your flags on top: {describe(config)} (--preset NAME for another)"
    if args.log_every < 1:
        raise AttnconvError(f"--log-every {args.log_every} is invalid: give a number of steps >= 1")
    row = train(config, out, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress,
                log_every=args.log_every, announce=announce, allow_data_change=args.allow_data_change,
                tensorboard=args.tensorboard)
    if row and os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for all
        print(f"{out}: epoch {int(row['epoch'])}, step {int(row['step'])}, test accuracy {row['test_acc']:.4f}")
        print(f"next: attnconv eval {out}  |  attnconv report {out}  |  attnconv explore {out}", file=sys.stderr)
    return 0


DEFAULT_INIT_ALPHA = 3.0


def _init_from(args: argparse.Namespace, base, overrides: dict, changes: dict):
    """--init-from: the CNN run's config is the base (architecture, data, preset), plus init_from."""
    import dataclasses

    from attnconv.config import TrainConfig
    from attnconv.runs import read_config

    fixed = [f"--{k.replace('_', '-')}" for k, v in overrides.items() if v is not None]
    fixed += [flag for flag, v in (("--preset", args.preset), ("--model", args.model), ("--dataset", args.dataset))
              if v is not None]
    if fixed:
        raise AttnconvError(f"{', '.join(fixed)}: with --init-from the architecture and dataset are those of "
                            f"{args.init_from}; drop {'them' if len(fixed) > 1 else 'it'}")
    source = read_config(args.init_from)
    init = {"run": str(args.init_from),
            "alpha": DEFAULT_INIT_ALPHA if args.init_alpha is None else args.init_alpha,
            "fold_bn": bool(args.fold_bn),
            "content": 0 if args.init_content is None else args.init_content}
    if base is None:  # a fresh run: the CNN's preset
        base = dataclasses.replace(TrainConfig.from_dict(source["config"]), preset=None, init_from=init)
    return base, {**changes, "init_from": init}
