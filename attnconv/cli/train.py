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
the preset; model flags (--hidden, --layers, ...) override the model's defaults.
With --resume, a run directory's saved config is the base, and
only --device, --workers, --data-dir, --checkpoint-every and --compile may change.
With --init-from, the architecture, dataset and preset are the CNN run's (optimization
flags override the preset): every convolution becomes a multi-head attention layer
whose heads start on the kernel taps with --init-alpha and have learnable centers and
widths (attnconv.cnn_to_attention(..., learnable=True)); --init-content DIM adds content
attention (DIM query/key channels per head, starting at zero) to every layer of a kxk
convolution. Content attention attends over every pixel of the layer's input for every
query, so it costs far more than the position-only layers (measured in
benchmarks/RESULTS.md). --attention-lr-scale K multiplies the learning rate of the heads'
centers and widths and of the content query/key projections by K (any model with such
parameters, the paper's quadratic attention models too).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from attnconv.errors import AttnconvError


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated fractions like 0.27,0.5,0.83, got {text!r}")
    return values


def _model_fields() -> list:
    """(config class, field name, argparse dest) of the registered models' option fields with a flag,
    each once (the shared dataset-derived ones first)."""
    from attnconv.models import MODEL_CONFIGS
    from attnconv.options import flag_name, option_fields

    seen: dict[str, tuple[type, str, str]] = {}
    for cls in MODEL_CONFIGS:
        for f in option_fields(cls):
            if f.metadata["cli"] and f.name not in seen:
                seen[f.name] = (cls, f.name, flag_name(f).replace("-", "_"))
    return list(seen.values())


def register(subparsers) -> None:
    from attnconv.config import PRESETS, InitFrom, TrainConfig
    from attnconv.models import list_models
    from attnconv.options import add_field_flags

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
                        "by default: another class count, image count or normalization, or images whose pixels or "
                        "labels differ)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run in RUN_DIR (its config, logs, weights, state and tensorboard/ event files; "
                        "other files stay). The old run is kept aside until the new run's first checkpoint, and put "
                        "back if the new run fails before it")
    i = p.add_argument_group("starting from a trained CNN")
    i.add_argument("--init-from", metavar="CNN_RUN", help="a trained CNN run: train it further as attention")
    add_field_flags(i, InitFrom, ("alpha", "fold_bn", "content"))
    g = p.add_argument_group("optimization")
    add_field_flags(g, TrainConfig, section="optimization")
    g.add_argument("--milestones", type=_fractions, help="multistep: fractions of all steps, e.g. 0.27,0.5,0.83")
    r = p.add_argument_group("execution")
    add_field_flags(r, TrainConfig, section="execution")
    r.add_argument("--no-progress", action="store_true", help="no progress output (epoch summaries only)")
    r.add_argument("--log-every", type=int, metavar="STEPS",
                   help="a row of RUN_DIR/steps.csv every STEPS steps (default 100; with --resume, the run's own), and, "
                        "when stderr is not a "
                        "terminal (nohup, CI), a progress line (on a terminal a progress bar is shown instead)")
    r.add_argument("--tensorboard", action="store_true",
                   help="also write TensorBoard event files into RUN_DIR/tensorboard/ (train loss, accuracy and "
                        "LR every --log-every steps, test loss and accuracy every epoch; needs `pip install "
                        "tensorboard`); not recorded in the run: give it again with --resume to go on writing them")
    m = p.add_argument_group("model overrides")
    for cls, name, _ in _model_fields():
        add_field_flags(m, cls, (name,))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnconv.config import PRESETS, TrainConfig, make_config
    from attnconv.errors import ParameterError
    from attnconv.fileio import dangling_link, not_a_folder
    from attnconv.limits import path_argument
    from attnconv.options import option_fields
    from attnconv.runs.directory import resumed_folder, run_config
    from attnconv.runs.files import CONFIG_FILE, trained_here
    from attnconv.training import train
    from attnconv.training.board import summary_writer_class
    from attnconv.training.checks import check_folder_there, check_resume_point, check_run_flags, check_same_config

    check_run_flags(args.resume, args.overwrite, args.allow_data_change)
    if args.tensorboard:
        summary_writer_class()  # a missing tensorboard package is the first thing said, before any other work
    out = path_argument(args.out, "out", "the run's directory")  # `~` read as every reader of the run reads it
    base = None
    link = dangling_link(out)
    if link is not None:  # before a resume of "nothing" asks for --model and --dataset, and mkdir says File exists
        raise ParameterError("out", out, f": {link}; give the run's folder itself, or fix the link")
    why = not_a_folder(out) if args.resume else None  # a file or device: no run to resume, not flags to ask for
    if why is not None and os.path.lexists(out):
        raise ParameterError("out", out, f"is not a directory ({why}); give the folder of the run to resume")
    # --resume: the run's own config is the base, the flags given are changes to it (a --model, --dataset or
    # --preset equal to the run's is none; a preset, which flags not given would otherwise take, plays no part)
    source = resumed_folder(out) if args.resume else out  # an old run an interrupted --overwrite set aside
    if args.resume and (source / CONFIG_FILE).exists():
        meta = run_config(source, foreign_only=True)
        if "converted" in meta:  # nothing to resume, said before any flag is compared
            check_resume_point(out)
        base = TrainConfig.from_dict(meta["config"])
        if args.model is not None and args.model != base.model:  # before the run's model options meet another model
            check_same_config(out, base, dataclasses.replace(base, model=args.model))
        if args.preset is not None and args.preset != base.preset:  # what that preset would change
            check_same_config(out, base, make_config(preset=args.preset))
    elif args.resume:
        found = trained_here(out)
        if found:  # a run whose config.json went: not a new run to ask --model and --dataset for
            gone = dangling_link(out / CONFIG_FILE)  # a loop, or a link to a file that is gone: said as such
            raise ParameterError("out", out, f": {CONFIG_FILE} is {gone or 'missing'}, while {', '.join(found)} show a run was "
                                 "trained here; --resume needs it: restore it from a copy of the run, or train into "
                                 "a new {out}", mentions=("out",))
    nothing = args.resume and base is None and args.init_from is None  # --resume where no run is: a new one starts
    where = "no such directory" if not os.path.lexists(out) else "no config.json in it"
    overrides = {name: getattr(args, dest) for _, name, dest in _model_fields()}
    changes = {f.name: getattr(args, f.name) for f in option_fields(TrainConfig)
               if f.metadata["cli"] or f.name in ("model", "dataset", "milestones")}
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
    if args.preset is None and base is None:
        missing = [f"--{k}" for k in ("model", "dataset") if changes[k] is None]
        if missing and nothing:  # the folder is what is wrong (a typo, a run not started yet), not the flags
            raise ParameterError("out", out, f"holds no run to resume ({where}); give the folder of the run to "
                                 f"resume, or {' and '.join(missing)} (or a --preset) to start a new run there")
        if missing:
            them = "them" if len(missing) > 1 else "it"
            raise AttnconvError(f"missing {' and '.join(missing)}: give {them}, or a --preset ({', '.join(PRESETS)})")
    config = make_config(preset=args.preset if base is None else None, base=base, model_overrides=overrides, **changes)
    if args.resume and base is not None:  # the run's own folder, gone: said as such (validate scans it as new data)
        check_folder_there(out, config)
    config.validate()  # a bad flag is one error line, before anything else is printed
    announce = None if preset is None else \
        f"preset: {preset}, with your flags on top: {describe(config)} (--preset NAME for another)"
    if nothing:  # the same command again after an interruption before the run's first file: said, not silent
        announce = "\n".join(filter(None, (f"{out}: no run to resume ({where}): a new run starts there", announce)))
    if args.log_every is not None and args.log_every < 1:
        raise AttnconvError(f"--log-every {args.log_every} is invalid: give a number of steps >= 1")
    row = train(config, out, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress,
                log_every=args.log_every, announce=announce, allow_data_change=args.allow_data_change,
                tensorboard=args.tensorboard)
    if row and os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for all
        from attnconv.cli import one_line
        from attnconv.pathwords import shell_path

        print(f"{one_line(str(out))}: epoch {int(row['epoch'])}, step {int(row['step'])}, "
              f"test accuracy {row['test_acc']:.4f}")
        shown = shell_path(out)  # pasted back as one argument: spaces, quotes, control characters, a leading dash
        print(f"next: attnconv eval {shown}  |  attnconv report {shown}  |  attnconv explore {shown}", file=sys.stderr)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # A rank of a clean run ends here, its files written and its process group destroyed. gloo's
        # worker threads can still abort the interpreter's finalization under load ("terminate called
        # without an active exception", exit -6, and torchrun reports the run failed): skip it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _init_from(args: argparse.Namespace, base, overrides: dict, changes: dict):
    """--init-from: the CNN run's config is the base (architecture, data, preset), plus init_from."""
    from attnconv.config import InitFrom, TrainConfig
    from attnconv.runs import read_config

    fixed = [f"--{k.replace('_', '-')}" for k, v in overrides.items() if v is not None]
    fixed += [flag for flag, v in (("--preset", args.preset), ("--model", args.model), ("--dataset", args.dataset))
              if v is not None]
    if fixed:
        raise AttnconvError(f"{', '.join(fixed)}: with --init-from the architecture and dataset are those of "
                            f"{args.init_from}; drop {'them' if len(fixed) > 1 else 'it'}")
    source = read_config(args.init_from)
    given = {"alpha": args.init_alpha, "fold_bn": args.fold_bn, "content": args.init_content}
    # recorded whole: a resume from another working directory finds the same CNN run
    init = InitFrom(run=os.path.abspath(args.init_from), **{k: v for k, v in given.items() if v is not None})
    if base is None:  # a fresh run: the CNN's preset
        base = dataclasses.replace(TrainConfig.from_dict(source["config"]), preset=None, init_from=init)
    return base, {**changes, "init_from": init}
