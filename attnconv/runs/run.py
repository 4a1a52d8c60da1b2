"""`Run`: a run directory read once and lazily."""

from __future__ import annotations

import contextlib
import functools
import operator
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from attnconv import data as D
from attnconv.config import TrainConfig
from attnconv.data.decode import decode_image
from attnconv.errors import AttnconvError, DamagedFile, ParameterError, caller_warning, user_frame
from attnconv.limits import (
    flag_argument,
    is_whole,
    one_image_hint,
    path_argument,
    shown_value,
    tensor_argument,
    whole_number,
)
from attnconv.models.sites import AttentionSite, attention_sites, needs_inputs, records_heads, site_probs
from attnconv.modes import eval_mode
from attnconv.pathwords import resume_command
from attnconv.precision import check_device
from attnconv.runs.build import build_run_architecture, load_run
from attnconv.runs.directory import check_not_replaced, resume_cuts, resume_problem
from attnconv.runs.files import (
    CONFIG_FILE,
    HEADS_FILE,
    HEADS_LOST,
    LOG_FIX,
    METRICS_FILE,
    METRICS_LOST,
    STATE_FILE,
    WEIGHTS_FILE,
    log_fix,
    read_config,
)
from attnconv.runs.logs_file import read_metrics
from attnconv.runs.logs_record import (
    checkpoint_logs,
    judged_heads,
    logs_problem,
    unvouched_problem,
    with_last_line,
)
from attnconv.runs.record import check_record
from attnconv.runs.run_data import (
    check_other_dataset,
    data_changes,
    data_fingerprint,
    recorded_info,
    run_info,
    run_test_set,
    sample_across_classes,
    split_digest,
)


class Run:
    """A run directory, read once: its config, metrics, heads, weights, dataset and attention sites.

        run = Run("runs/sa")
        run.config.model, run.metrics[-1]["test_acc"], run.heads      # files, read on first use
        run.model                                                    # weights loaded, eval mode
        raw, x = run.test_images(100)                                # 100 test images across the classes
        run.sites                                                    # attention_sites of the model

    Everything is loaded lazily and kept; a missing or corrupt file is one AttnconvError naming
    it (raised when the part that needs it is first used). Commands take a Run (or a path,
    turned into one) instead of re-reading the files.

    data_dir: where the run's (built-in) dataset is, if not where it was. dataset: another
    dataset to take the test images from (`--dataset folder:PATH`), with the run's classes
    (`runs.run_data.other_test_set`); `info` stays the run's (its classes and normalization).
    A run whose image folder is gone still has `info` from what it recorded; `test_set` is
    then one error naming the stored path and `--dataset folder:PATH` (a `DataNotFound`).
    A `dataset` that cannot stand for the run's data (no such folder, other classes) is refused
    here, at once (`runs.run_data.check_other_dataset`), whether or not the test images are read later.
    The run's own test data, when read, is compared with what the run recorded (`test_data_changes`);
    data that changed since training is one AttnconvWarning (analysing a run on changed data can be
    intended), unless `warn_data_change` is False (`eval` refuses such data itself).
    """

    def __init__(self, path: str | os.PathLike, device: str | torch.device = "cpu", *,
                 data_dir: str | os.PathLike | None = None, dataset: str | None = None,
                 allow_nonfinite: bool = False, warn_data_change: bool = True):
        # absolute: the weights, logs and test data are read later, after the caller may have changed directory
        self.path = path_argument(path, "run", "the run's directory").absolute()
        check_device(str(device))  # "meta" holds no values; a device this machine lacks fails here, not in a load
        check_not_replaced(self.path)  # an --overwrite before its first checkpoint: the old run is set aside
        self.meta = read_config(self.path)  # checked first: a file or a folder that is no run fails here
        self._folder = _folder_id(self.path)  # the folder it read: its logs and weights are read later (`same_run`)
        check_record(self.path, self.meta)  # config.json as the weights record it: not edited, not another run's
        self.config = TrainConfig.from_dict(self.meta["config"])
        self.device = device
        self.data_dir = _data_dir(data_dir)
        folder = None if dataset is None else D.folder_path(dataset)  # absolute too, as the run path and data_dir
        self.dataset = dataset if folder is None else f"{D.FOLDER_PREFIX}{folder}"
        self.allow_nonfinite = flag_argument(allow_nonfinite, "allow_nonfinite")
        self.warn_data_change = flag_argument(warn_data_change, "warn_data_change")
        if dataset is not None:
            check_other_dataset(self.config, dataset, self.meta.get("data"))

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}: {self.config.model} on {self.config.dataset})"

    @property
    def converted(self) -> bool:
        """Written by `attnconv convert`: a CNN's convolutions as attention layers."""
        return "converted" in self.meta

    def same_run(self) -> None:
        """One AttnconvError unless the folder is still the run this Run read: its logs and weights are read when first
        asked for, and a folder moved, removed or replaced by another run since gave [] for its logs, or the other
        run's logs and network under this run's config."""
        try:
            same = _folder_id(self.path) == self._folder and read_config(self.path) == self.meta
        except (OSError, AttnconvError):
            same = False
        if not same:
            raise AttnconvError(f"{self.path}: not the run this Run read (its folder was moved, removed or replaced, "
                                "or its config.json changed since); make a new Run of the run where it is now")

    @functools.cached_property
    def metrics(self) -> list[dict[str, float]]:
        """metrics.csv's rows (`runs.read_metrics`), none past the run's epochs in config.json. (Its steps are not
        bounded by config.json's total_steps: a resume with `allow_data_change` may change a run's length.)"""
        self.same_run()
        try:
            rows = read_metrics(self.path)
        except DamagedFile as err:
            raise self.resumable(err) from None
        rows = with_last_line(self.path, "metrics", rows, self.logs_metadata)
        if rows and rows[-1]["epoch"] > self.config.epochs:
            raise DamagedFile(f"{self.path / METRICS_FILE}: corrupt metrics file (its last row, of epoch "
                              f"{rows[-1]['epoch']:g}, lies past the run's {_count(self.config.epochs, 'epoch')} "
                              "in config.json)", log_fix(METRICS_LOST, config_edited=True))
        self.check_logs("metrics", rows)
        return rows

    def resumable(self, err: DamagedFile) -> DamagedFile:
        """A damaged log's line (`err`), with the fix an unfinished run's resume gives where it would take the log as
        it is: the damage lies past what its last checkpoint counts, and a resume cuts what was logged after that
        (deleting the log instead would leave the run no resume: its checkpoint counts the rows)."""
        if not err.fix.startswith(LOG_FIX) or not resume_cuts(self.path, bool(self.heads_per_layer)):
            return err
        return err.with_fix(f"resume the run, which cuts what was logged after its last checkpoint, the damage "
                            f"with it: `{resume_command(self.path)}`; or restore it from a copy")

    def check_logs(self, what: str, entries: list[dict[str, Any]]) -> None:
        """One DamagedFile where metrics.csv's rows (`what` "metrics") or heads.jsonl's snapshots ("heads"), read as
        `entries`, are not those the run's last checkpoint was written after (`runs.logs_record.logs_problem`: cut,
        an older copy, another run's)."""
        name, fix = (METRICS_FILE, log_fix(METRICS_LOST)) if what == "metrics" else \
            (HEADS_FILE, log_fix(HEADS_LOST, hint=_FINAL_HEADS))
        if not os.path.lexists(self.path / name):  # deleted, as the fix for a damaged one allows: nothing to judge
            return
        problem = logs_problem(self.logs_metadata, what, entries)
        if problem is not None:
            self.check_vouched(what, entries)
            raise DamagedFile(f"{self.path / name}: {problem}", fix)

    def check_vouched(self, what: str, entries: list[dict[str, Any]], skipped: int = 0) -> None:
        """Where a log holds more than the earlier checkpoint (state.pt) vouches for, and the weights, which may be a
        later one, do not read: one DamagedFile naming the weights (`runs.logs_record.unvouched_problem`), with the
        fixes that keep the log, not the log's (deleting its rows would lose the run's own)."""
        problem = unvouched_problem(self.logs_metadata, what, entries, skipped)
        if problem is None:
            return
        if resume_problem(self.path, bool(self.heads_per_layer)) is None:  # the resume would take the logs
            raise DamagedFile(f"{self.path / WEIGHTS_FILE}: {problem}",
                              f"restore {WEIGHTS_FILE} from a copy of the run, or continue the run from {STATE_FILE}: "
                              f"`{resume_command(self.path)}` writes the later "
                              f"{'rows' if what == 'metrics' else 'snapshots'} again")
        raise DamagedFile(f"{self.path / WEIGHTS_FILE}: {problem}", f"restore {WEIGHTS_FILE} from a copy of the run "
                          f"(a resume from {STATE_FILE} would refuse the logs it counts, as they are now)")

    @functools.cached_property
    def logs_metadata(self) -> dict[str, str]:
        """What the run's last checkpoint records of its logs (`runs.logs_record.checkpoint_logs`: model.safetensors'
        metadata, from its header alone, else state.pt's record)."""
        self.same_run()
        return checkpoint_logs(self.path)

    @functools.cached_property
    def heads(self) -> list[dict[str, Any]]:
        """heads.jsonl's sound snapshots ([] for CNNs and runs trained before heads were recorded).

        What reads a Run (figures, report, explorer, analyze) needs only some of them: damaged lines
        are skipped (`runs.logs_record.judged_heads`) with one AttnconvWarning saying how many; a file with
        no sound line left is one AttnconvError."""
        self.same_run()
        records, skipped, problem = judged_heads(self.path, self.logs_metadata)
        if skipped and not records:  # nothing left to use: one error, not a warning and then an error
            raise DamagedFile(f"{self.path / HEADS_FILE}: corrupt heads file (no sound snapshot in it: every line "
                              "is damaged)", log_fix(HEADS_LOST, hint=_FINAL_HEADS))
        if problem is not None:  # each sound line must be a snapshot the checkpoint recorded: one error, no warning
            self.check_vouched("heads", records, len(skipped))
            raise DamagedFile(f"{self.path / HEADS_FILE}: {problem}", log_fix(HEADS_LOST, hint=_FINAL_HEADS))
        self.check_heads_fit(records)  # before the warning: a file refused is one error
        if skipped:
            shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
            caller_warning(user_frame(), f"{self.path / HEADS_FILE}: skipped {len(skipped)} damaged line"
                           f"{'s' if len(skipped) > 1 else ''} ({shown}); using the other {len(records)}")()
        if not skipped:  # damaged lines skipped: the sound ones were matched with the record one by one above
            self.check_logs("heads", records)
        return records

    def check_heads_fit(self, records: Sequence[dict[str, Any]]) -> None:
        """One AttnconvError when heads.jsonl's snapshots `records` hold other layers or heads than the run's
        model (`heads_per_layer`): a file edited, or copied from another run, would be read as this one's."""
        if not records:
            return
        # every sound line has the first one's layers and heads (`runs.snapshot_problem`)
        recorded, expected = [len(layer) for layer in records[0]["layers"]], self.heads_per_layer
        last = records[-1]  # the latest: snapshots rise in epoch and step (`runs.read_heads`); steps as in `metrics`
        if last["epoch"] > self.config.epochs:
            raise DamagedFile(f"{self.path / HEADS_FILE}: corrupt heads file (a snapshot of epoch {last['epoch']} "
                              f"lies past the run's {_count(self.config.epochs, 'epoch')} in config.json)",
                              log_fix(HEADS_LOST, config_edited=True))
        if recorded != expected:
            raise DamagedFile(f"{self.path / HEADS_FILE}: corrupt heads file (its snapshots hold "
                              f"{_layers_text(recorded)}, the run's model in config.json has "
                              f"{_layers_text(expected)})", log_fix(HEADS_LOST, config_edited=True, hint=_FINAL_HEADS))

    @functools.cached_property
    def heads_per_layer(self) -> list[int]:
        """The heads of each layer a snapshot of heads.jsonl holds, from config.json alone (no weights): one
        entry per attention site of the network ([] for a network training records no heads of)."""
        arch = self.architecture
        if not records_heads(arch):
            return []
        return [site.layer.heads for site in attention_sites(arch, self.input_shape)]

    @functools.cached_property
    def info(self) -> D.DatasetInfo:
        """The run's dataset as the run was trained on it (config.json "data": classes, shape, normalization), which
        the network takes whatever its image folder holds now; `current_info` where the run recorded none."""
        return recorded_info(self.config, self.meta.get("data")) or self.current_info

    @functools.cached_property
    def current_info(self) -> D.DatasetInfo:
        """The run's dataset as it is now (what `test_data_changes` compares with the record); what the run
        recorded when its image folder is gone."""
        return run_info(self.config, recorded=self.meta.get("data"))

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the images the trained network takes (`info`)."""
        return (self.info.channels, self.info.size, self.info.size)

    @functools.cached_property
    def architecture(self) -> nn.Module:
        """The network config.json describes, with fresh weights (parameter and FLOP counts need no more)."""
        try:
            return build_run_architecture(self.meta)
        except AttnconvError as err:  # e.g. a "converted" block on a model with no convolution: name the file
            raise AttnconvError(f"{self.path / CONFIG_FILE}: {err}") from None

    @functools.cached_property
    def model(self) -> nn.Module:
        """The trained network: weights loaded, on `device`, eval mode."""
        self.same_run()
        model = load_run(self.path, self.device, allow_nonfinite=self.allow_nonfinite)[0]
        self._loaded = model  # what predict tells from a model a user put in its place
        return model

    def model_weight(self, model: Any, doing: str) -> torch.Tensor | None:
        """The first floating parameter of `model` (whose device and dtype its inputs follow: a user's cast or move),
        None for a model without one; one line for a model on the meta device, in whole or in part (any parameter or
        buffer: `doing` is what needs their values)."""
        module = isinstance(model, torch.nn.Module)
        weights = list(model.parameters()) if module else []
        meta = next((name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta), None) \
            if module else None
        if meta is not None:
            which = "is" if all(t.is_meta for t in (*weights, *model.buffers())) else f"has {meta}"
            raise AttnconvError(f"{self.path}: the run's model {which} on the meta device, which holds no values: "
                                f"load the run again (attnconv.Run) to {doing}")
        return next((p for p in weights if p.is_floating_point()), None)

    def own_model(self, model: Any) -> bool:
        """Whether `model` is this run's model as loaded (`Run.model`, in float32), not one a user put in its place or
        cast: NaN outputs of the run's own are the run's divergence, those of another are not."""
        return model is self.__dict__.get("_loaded") and all(
            p.dtype == torch.float32 for p in model.parameters() if p.is_floating_point())

    @functools.cached_property
    def test_set(self) -> D.ImageSet:
        """The run's test split (or `dataset`'s, when given), at the run's image size; one AttnconvWarning
        when the run's own test data is not what it was trained with (`test_data_changes`)."""
        test = run_test_set(self.config, self.data_dir, dataset=self.dataset, info=self.info)
        self._test_changes = [] if self.dataset is not None else data_changes(
            self.meta.get("data"), {**data_fingerprint(self.current_info), "digest": {
                "test": split_digest(test), "test_unordered": split_digest(test, ordered=False)}})
        if self._test_changes and self.warn_data_change:
            caller_warning(user_frame(), f"{self.path}: the test data differs from the run's "
                           f"({'; '.join(self._test_changes)}); what follows is of the data as it is now")()
        return test

    @property
    def test_data_changes(self) -> list[str]:
        """How the run's test data (read now, `test_set`) differs from what config.json recorded at training
        (classes, counts, normalization, the test split's content: `runs.data_changes`), in words; [] when
        it does not, when the run recorded nothing, or for another `dataset` (not compared)."""
        self.test_set  # noqa: B018  (compared when first read)
        return self._test_changes

    def test_sample(self, count: int) -> list[int]:
        """The indices of the `count` test images the commands show and average over (all if fewer):
        spread over the classes with a fixed seed (`runs.run_data.sample_across_classes`), in pick order."""
        count = whole_number(count, "images", "a number of test images")
        return sample_across_classes(self.test_set.labels, count)

    def test_images(self, count: int | None = None, *, index: int | None = None,
                    device: str | torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Test images: (raw uint8 (N, C, H, W), normalized float32 on `device`, default the run's):
        `count` of them sampled across the classes (`test_sample`), all of them in order (no count),
        or the single image `index` (its place in the test set)."""
        count = None if count is None else whole_number(count, "images", "a number of test images")
        test = self.test_set
        if index is not None:
            if not is_whole(index):
                raise ParameterError("index", index, "is invalid: give an image's place in the test set, a whole "
                                     "number", shown=shown_value(index), flags={"index": "image"})
            index = operator.index(index)
            if not 0 <= index < len(test):
                raise ParameterError("index", index, f"is out of range: the {self.config.dataset} test set has "
                                     f"{len(test)} images (0..{len(test) - 1})", flags={"index": "image"})
            raw = test.images[index : index + 1]
        elif count is not None:
            raw = test.images[torch.tensor(self.test_sample(count), dtype=torch.int64)]
        else:
            raw = test.images
        return raw, D.normalize(raw, self.info).to(self.device if device is None else device)

    @functools.cached_property
    def sites(self) -> list[AttentionSite]:
        """`attention_sites` of the trained model (AttnconvError for a CNN)."""
        return attention_sites(self.model, self.input_shape)

    def site_probs(self, images: int = 100, *, term: str = "combined") -> tuple[list[torch.Tensor], int]:
        """Each site's probabilities (`site_probs`) and how many test images they average (0: exact)."""
        images = whole_number(images, "images", "a number of test images")
        x = self.test_images(images)[1] if needs_inputs(self.sites) else None
        return site_probs(self.model, self.sites, x, term=term), 0 if x is None else len(x)

    def transform(self, images: Sequence[str | os.PathLike] | torch.Tensor, *, folder: bool = False) -> torch.Tensor:
        """Image files (decoded as the run's data was: resized and center-cropped to its size, RGB or
        grey as its channels) or uint8 images (N, C, H, W) -> the normalized batch the model takes (on the device
        and in the dtype of the model's weights as they are: `run.model.double()` is given float64 images).

        Uses what the run recorded of its dataset (config.json "data": size, channels, mean, std),
        so no training data is needed; runs that recorded nothing use their dataset's description.
        folder: the files were found in a folder the caller gave (the fix of one that cannot be decoded is then to
        remove it from the folder; else to leave it out).
        """
        folder = flag_argument(folder, "folder")
        data = self.meta.get("data") or data_fingerprint(self.info)
        size, channels = int(data["size"]), int(data["channels"])
        if isinstance(images, (str, os.PathLike)):
            images = [images]  # one image file
        if isinstance(images, torch.Tensor):
            raw = tensor_argument(images, "images", f"uint8 images (N, {channels}, {size}, {size})", values=True,
                                  floating=False)
        else:
            if not isinstance(images, Sequence) or isinstance(images, (bytes, bytearray)) or \
                    not all(isinstance(p, (str, os.PathLike)) and str(p) != "" for p in images):
                raise AttnconvError(f"images given as {shown_value(images)}: give image files (a list of paths) or "
                                    f"uint8 images (N, {channels}, {size}, {size}) as a torch.Tensor")
            if not images:
                raise AttnconvError("give at least one image file")
            budget = D.decode_budget()  # an image too large to decode is refused from its header
            paths = [path_argument(p, "images", "image files") for p in images]  # `~` as every path reads it
            raw = torch.from_numpy(np.stack([decode_image(p, channels == 1, size, budget=budget, in_folder=folder)
                                             for p in paths]))
        if raw.dtype != torch.uint8 or raw.ndim != 4 or tuple(raw.shape[1:]) != (channels, size, size):
            wrong = []  # what is wrong, and only that
            if raw.dtype != torch.uint8:
                wrong.append(f"{str(raw.dtype).replace('torch.', '')} where uint8 (0..255) is read")
            if raw.ndim != 4 or tuple(raw.shape[1:]) != (channels, size, size):
                image = tuple(raw.shape[-2:]) == (size, size)  # one image of the run's size, without the batch axis
                wrong.append(f"shape {tuple(raw.shape)}" + (one_image_hint(raw, channels, "images") if image else ""))
            raise AttnconvError(f"images must be uint8 (N, {channels}, {size}, {size}) for this run, got "
                                + " and ".join(wrong))
        # On the device and in the dtype of the model's weights as they are now (a user may have cast or moved it)
        weight = self.model_weight(self.model, "compute with its weights")
        device, dtype = (self.device, torch.float32) if weight is None else (weight.device, weight.dtype)
        exact = torch.promote_types(torch.float32, dtype)  # float64 computed as such; half types from float32
        mean = torch.tensor(data["mean"], dtype=exact).view(1, -1, 1, 1)
        std = torch.tensor(data["std"], dtype=exact).view(1, -1, 1, 1)
        return ((raw.to(exact) / 255.0 - mean) / std).to(device=device, dtype=dtype)

    @torch.no_grad()
    def predict(self, images: Sequence[str | os.PathLike] | torch.Tensor, top: int = 1, *, folder: bool = False
                ) -> list[list[tuple[str, float]]]:
        """The `top` most probable classes of each image, as (class name, probability), best first (`folder`: see
        `transform`)."""
        top = whole_number(top, "top", "how many classes to give for each image")  # `folder`: checked by transform
        data = self.meta.get("data") or data_fingerprint(self.info)
        classes = list(data["classes"])
        x = self.transform(images, folder=folder)
        if len(x) == 0:
            raise AttnconvError("images is an empty batch: give at least one image")
        model = self.model  # in eval mode for the pass, each module's flag put back (a user's train() or frozen BN)
        if not callable(model):
            raise AttnconvError(f"{self.path}: run.model is {type(model).__name__}, not a model: put one in its place, "
                                "or load the run again (attnconv.Run) for its own")
        with eval_mode(model) if isinstance(model, torch.nn.Module) else contextlib.nullcontext():
            logits = model(x)
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (len(x), len(classes)):
            got = f"shape {tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else f"a {type(logits).__name__}"
            raise AttnconvError(f"{self.path}: the run's model gives {got} for {len(x)} images, where the run has "
                                f"{len(classes)} classes: give run.model a model of ({len(x)}, {len(classes)}) logits, "
                                "or load the run again (attnconv.Run) for its own")
        probs = logits.float().softmax(-1).cpu()
        if not bool(probs.isfinite().all()):  # finite weights whose outputs are not (NaN weights fail the load)
            if self.own_model(model):
                raise AttnconvError(f"{self.path}: the run's weights give NaN or infinite outputs for these images; the "
                                    "run diverged before this checkpoint: retrain it with a lower --lr")
            raise AttnconvError(f"{self.path}: run.model gives NaN or infinite outputs for these images, and it is not "
                                "the run's model as loaded (another model, or the run's cast to another dtype): check "
                                "what was put in its place, or load the run again (attnconv.Run) for its own")
        best = probs.topk(min(top, probs.shape[1]), dim=1)
        return [[(classes[int(i)], float(v)) for v, i in zip(vals, idx)] for vals, idx in zip(best.values, best.indices)]


def as_run(run: Run | str | os.PathLike, device: str | torch.device | None = None, *,
           data_dir: str | os.PathLike | None = None, dataset: str | None = None) -> Run:
    """`run` itself, or the Run of a run directory (a command given a path; `device` None: cpu). A Run has its own
    device, data_dir and dataset: one given with it that is not its own is one AttnconvError (it was dropped)."""
    if not isinstance(run, Run):
        return Run(run, "cpu" if device is None else device, data_dir=data_dir, dataset=dataset)
    if device is not None:
        check_device(str(device))
    given = {"device": None if device is None else str(device),
             "data_dir": _data_dir(data_dir),
             "dataset": None if dataset is None else D.canonical_name(dataset)}  # checked: a str, a known name
    own = {"device": str(run.device), "data_dir": run.data_dir,  # its dataset: the one given to it, else the run's own
           "dataset": _dataset_key(run.config.dataset if run.dataset is None else run.dataset)}
    differ = [f"{name}={value}" for name, value in given.items() if value is not None and value != own[name]]
    if differ:
        held = ", ".join(f"{name}={value}" for name, value in own.items())
        raise AttnconvError(f"{', '.join(differ)} given with a Run, which reads with its own ({held}); give them to "
                            "Run(...), or give the run's folder instead")
    return run


def _data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    """A `data_dir` given to a Run, or with one to `as_run`, as the Run holds it: checked, absolute."""
    return None if data_dir is None else path_argument(data_dir, "data_dir", "the folder holding the dataset's files"
                                                       ).absolute()


def _dataset_key(name: str) -> str:
    """A dataset name as its canonical one (`Fashion_MNIST` is `fashion-mnist`, `folder:~/x` the absolute folder), for
    comparing two spellings; an unknown name as given (`Run` refuses it in its own words)."""
    try:
        return D.canonical_name(name)
    except AttnconvError:
        return name


def _folder_id(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_dev, info.st_ino


def _layers_text(heads: list[int]) -> str:
    """[9, 9, 9, 9] -> '4 layers of 9 heads'; [2, 4] -> 'layers of 2, 4 heads'; [] -> 'no attention layer'."""
    if not heads:
        return "no attention layer"
    if len(set(heads)) == 1:
        return f"{len(heads)} layer{'s' if len(heads) > 1 else ''} of {heads[0]} head{'s' if heads[0] > 1 else ''}"
    return f"layers of {', '.join(map(str, heads))} heads"


# What a damaged heads.jsonl leaves: the figure of the final heads, drawn from the weights.
_FINAL_HEADS = "; `attnconv plot centers RUN` draws the final heads"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"

