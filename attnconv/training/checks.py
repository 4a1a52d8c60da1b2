"""What `train` checks before it writes anything: the data, the model the config asks for, a resumed run's config."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from attnconv import data as D
from attnconv.config import RESUMABLE_CHANGES, TrainConfig
from attnconv.errors import AttnconvError, ParameterError, attnconv_warning
from attnconv.fileio import dangling_link, same_path
from attnconv.limits import AllocationLimit, flag_argument, parameter_limit, path_argument, shown_value
from attnconv.models import build_model
from attnconv.models.registry import model_defaults
from attnconv.pathwords import resume_command
from attnconv.runs import (
    CONFIG_FILE,
    STATE_FILE,
    WEIGHTS_FILE,
    data_changes,
    data_fingerprint,
    load_run,
    load_state,
    read_config,
)
from attnconv.runs.files import STATE_MOVE_FIX
from attnconv.runs.logs_file import CHECKPOINT_GONE, checkpointed_once
from attnconv.runs.values import path_kind, short_value


def train_arguments(config: TrainConfig, out: str | os.PathLike, *flags: Any) -> tuple[Any, ...]:
    """`train`'s config, run directory and flags (resume, overwrite, allow_data_change, progress, tensorboard), of the
    types it takes: (out as a Path, the flags as bools), or one error naming the argument; then `check_run_flags`."""
    if not isinstance(config, TrainConfig):
        raise AttnconvError(f"config {shown_value(config)} is invalid: give a TrainConfig (make_config(...), or "
                            "TrainConfig(**fields))")
    out = path_argument(out, "out", "the run's directory")
    names = ("resume", "overwrite", "allow_data_change", "progress", "tensorboard")
    flags = tuple(flag_argument(value, name) for value, name in zip(flags, names, strict=True))
    check_run_flags(*flags[:3])
    return (out, *flags)


def check_run_flags(resume: bool, overwrite: bool, allow_data_change: bool) -> None:
    """The flags that say what `train` does with --out go together (checked first, by the CLI too)."""
    if resume and overwrite:
        raise ParameterError("resume", resume, "and {overwrite} contradict each other: give one", shown="",
                             mentions=("overwrite",))
    if allow_data_change and not resume:  # a new run records the data it starts on: there is nothing to compare
        raise ParameterError("allow_data_change", allow_data_change, "goes with {resume}: give both to continue a "
                             "run on other data (a new run records the data it starts on)", shown="",
                             mentions=("resume",))


def check_data(info: D.DatasetInfo, train_set, test_set, batch_size: int, world_size: int, *,
               resuming: bool = False) -> None:
    """The (train, test) sets have the dataset's shape and labels, and the batch fits them (`resuming`: the batch
    size is the run's, which the user did not give and `--resume` cannot change)."""
    for name, s in (("train", train_set), ("test", test_set)):
        if not isinstance(s, D.ImageSet):
            raise AttnconvError(f"{name} set must be an attnconv.data.ImageSet, got {type(s).__name__}")
        if tuple(s.images.shape[1:]) != (info.channels, info.size, info.size):
            raise AttnconvError(f"{name} images are {tuple(s.images.shape[1:])}, {info.name} is "
                                f"({info.channels}, {info.size}, {info.size})")
        if len(s) == 0:
            raise ParameterError(None, None, f"the {info.name} {name} set is empty; check {{data_dir}}",
                                 mentions=("data_dir",))
        if s.labels.min() < 0 or s.labels.max() >= info.num_classes:
            raise AttnconvError(f"{name} labels must be in 0..{info.num_classes - 1}")
    flat = [c for c, spread in enumerate(info.std) if not spread > 0]
    if flat:  # images of one colour: nothing to normalize by, before config.json is written with a spread of 0
        where = "" if len(flat) == len(info.std) else f" in channel {flat[0]}"
        raise ParameterError("dataset", info.name, f": its training images are all of one value{where} (a spread of "
                             "0), which cannot be normalized; give images that vary",
                             shown=info.name.removeprefix("folder:") if info.name.startswith("folder:") else None)
    if batch_size > len(train_set):
        if resuming:
            raise ParameterError(None, None, f"the run's batch size {batch_size} is larger than the training set of "
                                 f"{info.name} ({len(train_set)} images): resume it on the data it was trained on, "
                                 "or train on this data into a new {out}", mentions=("out",))
        raise ParameterError("batch_size", batch_size, f"is larger than the training set ({len(train_set)} images)")
    if batch_size % world_size:
        if resuming:
            raise ParameterError(None, None, f"the run's batch size {batch_size} is not divisible by the {world_size} "
                                 "processes: resume it with a number of processes that divides it")
        raise ParameterError("batch_size", batch_size, f"(global) is not divisible by the {world_size} processes")


# The model options the data decides (`resolve_overrides`): a config may leave them out.
DERIVED = ("in_channels", "image_size", "num_classes")


def resolve_overrides(config: TrainConfig, info: D.DatasetInfo, *, resuming: bool = False) -> TrainConfig:
    """The config with the overrides the data decides (channels, image size, classes) filled in.

    A conflicting explicit value is an error (`resuming`: a value the run's config.json holds, which the
    user did not give), and so is a model that cannot be built from the overrides, or one too large for
    the machine (refused before allocating: `AllocationLimit`).
    """
    derived = dict(zip(DERIVED, (info.channels, info.size, info.num_classes)))
    overrides = dict(config.model_overrides)
    for key, value in derived.items():
        if overrides.setdefault(key, value) == value:
            continue
        if resuming:
            raise ParameterError(None, None, f"the run's model was built for {key} = {overrides[key]}, and "
                                 f"{info.name} has {key} = {value}: resume it on the data it was trained on, or train "
                                 "on this data into a new {out}", mentions=("out",))
        if config.init_from is not None:  # the CNN run's own value, which the user did not give: its data changed
            raise ParameterError("init_from", config.init_from.run, f": the CNN was built for {key} = "
                                 f"{overrides[key]}, and its dataset {info.name} has {key} = {value} now (it changed "
                                 "since the CNN was trained); restore the data the CNN was trained on")
        raise ParameterError(key, overrides[key], f"does not match {info.name} ({key} = {value}); drop {{{key}}}",
                             mentions=(key,))
    config = dataclasses.replace(config, model_overrides=overrides)
    with AllocationLimit(parameter_limit(), f"model {config.model!r} with {overrides}", "lower the sizes"):
        build_model(config.model, **overrides)
    return config


# steps.csv's interval, when neither the caller nor (on --resume) the run's config.json gives one.
LOG_EVERY = 100


def recorded_log_every(out: Path) -> int:
    """The steps.csv interval a resumed run was started with (config.json "log_every"); LOG_EVERY when it
    records none, or config.json does not read (the resume's own checks then say why)."""
    try:
        return int(read_config(out).get("log_every", LOG_EVERY))
    except AttnconvError:
        return LOG_EVERY


# The other fix for a run whose checkpoint is lost (`check_resume_point`): --overwrite alone asks for the settings.
_TRAIN_AGAIN = "train the run again over this one (`attnconv train` with its settings and {overwrite})"


def check_resume_point(out: Path) -> None:
    """--resume: the run has a checkpoint to resume from, or never had one. A converted run (`attnconv convert`)
    was made by no training; weights without state.pt mean state.pt was lost (the two are written as one pair)."""
    state, weights = out / STATE_FILE, out / WEIGHTS_FILE
    meta = read_config(out)
    converted = meta.get("converted")
    if converted is not None:  # no training made it: nothing to resume, and its weights are not a CNN's
        raise ParameterError("out", out, ": written by `attnconv convert` (from "
                             f"{short_value(converted.get('from'))}), not by training: there is nothing to resume; "
                             "to train attention that starts from that CNN, `attnconv train --init-from CNN_RUN "
                             "--out NEW_DIR`", mentions=("out",))
    if weights.exists() and not weights.is_file():  # where the resume is to write the weights: refused before training
        raise ParameterError(None, None, f"{weights} is {path_kind(weights)}, not the run's weights file, and the "
                             "resume is to write the weights there; move it out of the run folder (the weights are "
                             f"written anew from {STATE_FILE})")
    if not state.exists() and (weights.exists() or weights.is_symlink()):  # a checkpoint was whole once
        if state.is_symlink():  # which --overwrite would not replace: not a file attnconv wrote
            raise AttnconvError(f"{state}: {dangling_link(state)}, while {WEIGHTS_FILE} shows the run has checkpointed "
                                f"(the two are written as one pair); {STATE_MOVE_FIX}")
        raise ParameterError(None, None, f"{state}: missing, while {WEIGHTS_FILE} shows the run has checkpointed (the "
                             "two are written as one pair): it was moved or deleted; restore it from a copy of the "
                             f"run, or {_TRAIN_AGAIN}", mentions=("overwrite",))
    shown = None if state.exists() or state.is_symlink() or weights.is_symlink() else checkpointed_once(out, meta)
    if shown is not None:  # not a run stopped before its first checkpoint, to start again
        raise ParameterError(None, None, f"{out}: {STATE_FILE} and {WEIGHTS_FILE} are missing, while {shown}: "
                             f"{CHECKPOINT_GONE}, or {_TRAIN_AGAIN}",
                             mentions=("overwrite",))


def check_folder_there(out: Path, config: TrainConfig) -> None:
    """--resume of a run on an image folder: the folder the run was trained on is where config.json says (a resume
    takes no other: `--dataset` naming where it is now would be another config)."""
    folder = D.folder_path(config.dataset)
    if folder is not None and not folder.is_dir():
        link = dangling_link(folder)
        what = "is not a folder" if folder.exists() else f"is {link}" if link else "no longer exists (moved or deleted)"
        raise ParameterError("out", out, f": the run's image folder {folder} {what}; --resume continues on the "
                             f"folder the run was trained on: move it back to {folder}, or train on the images where "
                             "they are now into a new {out}", mentions=("out",))


def check_same_config(out: Path, saved: TrainConfig, config: TrainConfig) -> None:
    """--resume: `config` is the run's `saved` one but for `RESUMABLE_CHANGES`; else one line naming each field that
    differs (a model option by its key; an option one of them leaves out has the model's default,
    `models.registry.model_defaults`, and one the data decides may be left out of `config`)."""
    old, new = saved.to_dict(), config.to_dict()
    diff = []
    for k in new:
        if (k in RESUMABLE_CHANGES or new[k] == old.get(k) or (k == "dataset" and _same_folder(old.get(k), new[k]))
                or (k == "init_from" and _same_init(old.get(k), new[k]))):
            continue
        if k == "model_overrides" and isinstance(old.get(k), dict):
            before, after = model_defaults(saved.model), model_defaults(config.model)
            for key in {**old[k], **new[k]}:
                if key in DERIVED and key not in new[k]:
                    continue
                a, b = old[k].get(key, before.get(key)), new[k].get(key, after.get(key))
                if a != b or isinstance(a, bool) != isinstance(b, bool):
                    diff.append(f"{k}.{key}: {_option(old[k], key, a, before)} -> {_option(new[k], key, b, after)}")
        else:
            diff.append(f"{k}: {old.get(k)!r} -> {new[k]!r}")
    if diff:
        raise ParameterError("out", out, f"holds a run with a different config ({'; '.join(diff)}); "
                             "resume with the same settings, or choose a new {out}", mentions=("out",))


def _same_folder(a: object, b: object) -> bool:
    """Two `folder:PATH` datasets naming one folder by other paths (a link to it; the data's content is compared
    apart, `check_resumable`)."""
    try:
        paths = [D.folder_path(x) if isinstance(x, str) else None for x in (a, b)]
    except AttnconvError:
        return False
    return None not in paths and same_path(*paths)


def _same_init(a: object, b: object) -> bool:
    """Two `init_from` blocks alike but for naming one CNN run by other paths (a link to it)."""
    if not (isinstance(a, dict) and isinstance(b, dict)) or not all(isinstance(x.get("run"), str) for x in (a, b)):
        return False
    return {**a, "run": None} == {**b, "run": None} and same_path(a["run"], b["run"])


def _option(options: dict, key: str, value: object, defaults: dict) -> str:
    """A model option as a config difference names it: its value, `default VALUE` where the config leaves it out,
    `unset` where the model has no such option."""
    return repr(value) if key in options else f"default {value!r}" if key in defaults else "unset"


def kept_normalization(info: D.DatasetInfo, recorded: dict | None) -> D.DatasetInfo:
    """The data at hand (`info`) normalized as the run recorded (config.json "data" mean and std): weights
    trained on one normalization go on with it. Only `--allow-data-change` resumes data whose statistics
    changed; counted in other statistics, its images would be normalized otherwise than every reader of the
    run normalizes them (`Run.info`, from the record), and `eval` would not measure what training measured."""
    mean, std = (recorded.get(key) if isinstance(recorded, dict) else None for key in ("mean", "std"))
    if not (isinstance(mean, list) and isinstance(std, list) and len(mean) == len(std) == info.channels):
        return info  # a run that recorded none (written before runs recorded their data)
    mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
    if (mean, std) == (tuple(info.mean), tuple(info.std)):
        return info
    return dataclasses.replace(info, mean=mean, std=std, stats_source='recorded by the run (config.json "data")')


def check_resumable(out: Path, config: TrainConfig, info: D.DatasetInfo, digest: dict[str, str] | None = None, *,
                    allow_data_change: bool) -> None:
    """A run in `out` that --resume continues: its saved config matches `config` except for
    `RESUMABLE_CHANGES`, and its recorded dataset matches `info` and the content `digest` of the
    data at hand (`runs.data_digest`) (unless `allow_data_change`)."""
    meta = read_config(out)
    # the settings first: a flag given on resume also changes the data it decodes. (Checked before the data is read
    # too; again here, as the data has filled in the options a config may leave out, `DERIVED`.)
    check_same_config(out, TrainConfig.from_dict(meta["config"]), config)
    changes = data_changes(meta.get("data"), {**data_fingerprint(info), "digest": digest})
    if changes and not allow_data_change:
        raise ParameterError("out", out, f": the dataset changed since this run started ({'; '.join(changes)}); "
                             "resuming would continue on other data: restore the data, train into a new {out}, or "
                             "pass {allow_data_change} to continue anyway", mentions=("out", "allow_data_change"))


def where_the_run_stands(out: Path, fresh: bool, untouched: bool, *, data_change: bool = False) -> str:
    """How a `train` stopped early leaves `out` (the end of its one line): an old run `--overwrite` had not begun to
    replace (`untouched`) as it was, nothing written (the folder removed if `fresh`, as `train` does), no checkpoint
    yet, or the last good one; each with the command that goes on from there (`data_change`: its `--resume` with
    `--allow-data-change`, as the stopped one was given)."""
    resume = resume_command(out, " --allow-data-change" if data_change else "")
    if untouched and (out / CONFIG_FILE).exists():  # the old run, whatever it holds: nothing of it moved
        return f"the run in {out} is as it was (stopped before anything of it was replaced)"
    try:
        step = load_state(out / STATE_FILE)["progress"]["step"]
    except AttnconvError as err:
        if not (out.is_dir() and any(out.iterdir())):  # no run there to --resume (`train` removes a folder it made)
            kept = f"{out} is removed with it" if fresh else f"{out} is left as it was"
            return f"nothing was written, and {kept} (give the same command to start the run)"
        if os.path.lexists(out / STATE_FILE):  # there, but not readable as one: not "no checkpoint yet"
            return f"its checkpoint cannot be read ({err})"
        return f"no checkpoint was written yet (`{resume}` starts the run again from step 0)"
    return f"the last good checkpoint (step {step}) is intact; continue with `{resume}`"


def check_test_split(dataset: str, overlap: int, tested: int) -> ParameterError | None:
    """The error when every test image, with its label, is a training image (`overlap` of `tested`: a copy of the
    train split, or part of one), for every rank to raise; a warning when a tenth or more are."""
    if tested and overlap == tested:
        return ParameterError("dataset", dataset, ": every image of its test split, with its label, is in its train "
                              "split (a copy of it, or part of one): the test accuracy would be measured on training "
                              "images; give test images of their own")
    if tested and overlap >= 0.1 * tested:
        attnconv_warning(f"--dataset {dataset}: {overlap} of its {tested} test images, with their labels, are training "
                         "images too; the test accuracy counts them")
    return None


def sound_run(run: Path) -> bool:
    """Whether `run` reads as a whole run (its config, and weights that fit it): the CNN folder of an --init-from
    resume that fails then holds another network; a damaged one is left to the error that names its file."""
    try:
        load_run(run)
        return True
    except AttnconvError:
        return False
