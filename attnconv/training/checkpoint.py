"""A run's checkpoint: what model.safetensors and state.pt hold, how they are written and read back,
and how a resumed run replays from them (`Checkpointer`).

    state.pt           {"format": STATE_FORMAT,
                        "progress": RunProgress as a dict (the sums over every rank),
                        "model": the weights (CPU tensors; a copy, so state.pt alone is a resume point),
                        "optimizer": the optimizer's state_dict,
                        "rng": {"torch": [CPU generator state per rank], "cuda": [per rank] or None},
                        "record": config.json as `runs.record.config_record` gives it,
                        "logs": the logs it was written after, as model.safetensors records them}
    model.safetensors  the same weights, metadata {"model", "step", "epoch", "attnconv_run": the record,
                        "attnconv_logs": the logs it was written after (`runs.logs_record`),
                        "attnconv_checksum": its tensors' checksum}

Both are written as one pair (`runs.save_checkpoint`: both temporaries written and synced, then both
renamed with Ctrl-C held back in between; only a crash between the two renames leaves
model.safetensors one checkpoint newer, which is still a consistent set of weights), and
state.pt is read with `runs.load_state` (weights_only, structure and torch's CRC-32s checked;
model.safetensors carries a checksum of its tensors, `runs.files.tensors_checksum`). A resumed run replays
exactly: batches and the learning rate are pure functions of the counters, dropout draws come from
the restored RNG states, and the logs are cut back to what the checkpoint knows of
(`runs.trim_logs`, which refuses logs that lost rows the checkpoint counted).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from attnconv.errors import AttnconvError, DamagedFile, ParameterError
from attnconv.fileio import dangling_link
from attnconv.runs import (
    CONFIG_FILE,
    HEADS_FILE,
    METRICS_FILE,
    RECORD_KEY,
    STATE_FILE,
    STATE_FORMAT,
    WEIGHTS_FILE,
    load_state,
    read_config,
    read_metrics,
    save_checkpoint,
    save_weights,
    trim_logs,
    weights_fit,
)
from attnconv.runs.build import weights_changed
from attnconv.runs.files import STATE_FIX
from attnconv.runs.logs_record import (
    LOGS_KEY,
    judged_heads,
    logs_problem,
    logs_record,
    recorded_finished,
    state_logs,
    with_last_line,
)
from attnconv.runs.record import record_problem, recorded_metadata, recorded_step, state_record_problem
from attnconv.runs.values import is_finite, short_value
from attnconv.training.distributed import Dist
from attnconv.training.progress import RunProgress

# The sums a checkpoint adds over the ranks (rank 0 carries them on resume; the others start from 0).
_SUMS = ("loss_sum", "correct", "seen", "row_loss", "row_correct", "row_seen")


def _same_kind(got: Any, want: Any) -> bool:
    """Whether a saved optimizer setting is of the kind the optimizer's own is (numbers alike, bools apart)."""
    if isinstance(want, bool) or want is None or isinstance(want, str):
        return type(got) is type(want)
    if isinstance(want, (int, float)):
        return is_finite(got)
    if isinstance(want, (tuple, list)):
        return isinstance(got, (tuple, list)) and len(got) == len(want) and all(map(_same_kind, got, want))
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.shape == want.shape
    return True


def _same_setting(got: Any, want: Any) -> bool:
    """Whether a saved optimizer setting equals the optimizer's own (a tuple saved as a list alike; NaN never)."""
    if not _same_kind(got, want):
        return False
    if isinstance(want, (tuple, list)):
        return all(map(_same_setting, got, want))
    if isinstance(want, torch.Tensor):
        return got.dtype == want.dtype and bool(torch.equal(got.cpu(), want.cpu()))
    return bool(got == want)


# The one setting a run changes as it goes: the learning rate, set before every step from the counters.
_SCHEDULED = frozenset({"lr"})


def _optimizer_problem(saved: dict[str, Any], optimizer: torch.optim.Optimizer, steps: int) -> str | None:
    """What keeps a saved optimizer state_dict from being this optimizer's, or None: its parameter groups (as
    many, as many parameters each, each parameter in one group only, every setting equal to the optimizer's,
    which the run's config made; the learning rate, which the schedule sets, of its kind) and each parameter's
    state (the keys, dtypes, shapes and strides a step of this optimizer makes, dense: found by one step of a
    copy on zero gradients; finite, a sum of squares not negative, a step count equal to the checkpoint's
    `steps`), for every parameter once `steps` > 0, for none before (every step gives each parameter of these
    models a gradient, and no step is skipped: bf16 needs no loss scaling). torch loads such a state without a
    word, then fails at the first step or trains on with other numbers."""
    fresh = optimizer.state_dict()
    if len(saved["param_groups"]) != len(fresh["param_groups"]):
        return f"has {len(saved['param_groups'])} parameter groups, the optimizer {len(fresh['param_groups'])}"
    ids: list[Any] = []
    for group, want in zip(saved["param_groups"], fresh["param_groups"]):
        params = group.get("params")
        if not isinstance(params, list) or len(params) != len(want["params"]):
            held = len(params) if isinstance(params, list) else short_value(params)
            return f"holds a group of {held} parameters where the optimizer's has {len(want['params'])}"
        ids += params
        for key, value in want.items():
            if key == "params" or (key not in group and (value is None or isinstance(value, (bool, str)))):
                continue  # flags a later torch adds are defaulted on load; numeric settings never are
            if key not in group:
                return f"has no setting {key} (the optimizer's is {short_value(value)})"
            if not (_same_kind if key in _SCHEDULED else _same_setting)(group[key], value):
                return (f"setting {key} is {short_value(group[key])}, where the optimizer that config.json makes "
                        f"has {short_value(value)}")
    position: dict[int, int] = {}  # parameter id -> its index among the groups' parameters
    for i, pid in enumerate(ids):
        if not isinstance(pid, int) or isinstance(pid, bool) or pid in position:
            return f"names parameter {short_value(pid)} twice, or by something other than a whole number"
        position[pid] = i
    made = _one_step_state(optimizer)
    if made is None:
        return None
    missing = [pid for i, pid in enumerate(ids) if i in made and pid not in saved["state"]]
    if steps > 0 and missing:  # every parameter of these models has a gradient at every step
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return (f"holds no state for parameter {short_value(missing[0])}{more} after {steps} steps, each of which "
                "gives every parameter one")
    if steps == 0 and saved["state"]:
        return f"holds the state of {len(saved['state'])} parameters before the first step"
    for pid, per in saved["state"].items():
        if pid not in position or not isinstance(per, dict):
            return f"holds the state of parameter {short_value(pid)}, which no group has"
        want = made.get(position[pid], {})
        if set(per) != set(want):
            return (f"holds {sorted(per)} for parameter {short_value(pid)}, where this optimizer keeps "
                    f"{sorted(want)}")
        for name, value in per.items():
            problem = _state_tensor_problem(value, want[name]) or _state_value_problem(name, value, steps)
            if problem is not None:
                return f"{name} of parameter {short_value(pid)} is {problem}"
    return None


# Per-parameter state that sums squares (Adam's second moments, amsgrad's maximum of them): never negative.
_SQUARES = frozenset({"exp_avg_sq", "max_exp_avg_sq"})


def _state_value_problem(name: str, value: Any, steps: int) -> str | None:
    """What is impossible in a per-parameter state of the right kind, or None: values that are not finite, a
    negative sum of squares, a step count other than the checkpoint's (`steps`: every step is every parameter's)."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return None
    if not bool(torch.isfinite(value).all()):
        return "not finite everywhere"
    if name in _SQUARES and bool((value < 0).any()):
        return "negative somewhere, and it sums squares"
    if name == "step" and value.numel() == 1 and value.item() != torch.tensor(steps, dtype=value.dtype).item():
        return f"{short_value(value.item())}, where the checkpoint has taken {steps} steps"  # as its dtype counts
    return None


def _state_tensor_problem(value: Any, expected: Any) -> str | None:
    """How a saved per-parameter optimizer value differs from the one a step of this optimizer makes (for a
    tensor: dtype, shape, a dense layout and its strides: a sparse or overlapping one fails the next step)."""
    if not isinstance(expected, torch.Tensor):
        return None
    want = f"this optimizer's {expected.dtype} {tuple(expected.shape)}"
    if not isinstance(value, torch.Tensor):
        return f"{short_value(value)}, {want}"
    if value.layout != torch.strided:
        return f"a {value.layout} tensor, {want} dense"
    if value.dtype != expected.dtype or value.shape != expected.shape:
        return f"{value.dtype} {tuple(value.shape)}, {want}"
    if _strides(value) != _strides(expected):  # a dimension of size 1 can have any stride
        return f"laid out with strides {value.stride()}, {want} with strides {expected.stride()}"
    return None


def _strides(t: torch.Tensor) -> list[int]:
    return [stride for stride, size in zip(t.stride(), t.shape) if size > 1]


def _one_step_state(optimizer: torch.optim.Optimizer) -> dict[int, dict[str, Any]] | None:
    """The per-parameter state one step of `optimizer`'s kind makes, by parameter index: one step of a copy over
    parameters of the same shapes, dtypes and devices, on zero gradients (the model and the optimizer are not
    touched); None for an optimizer that cannot be remade from its groups."""
    groups = []
    for group in optimizer.param_groups:
        params = [torch.zeros_like(p, requires_grad=True) for p in group["params"]]
        for p in params:
            p.grad = torch.zeros_like(p)
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
    try:
        copy = type(optimizer)(groups)
        copy.step()
    except Exception:  # noqa: BLE001 (an optimizer of another form: its state is left to torch)
        return None
    return copy.state_dict()["state"]


def _images_counted(progress: RunProgress, batch_size: int) -> int:
    """The images the epoch's sums count: every batch done is whole, and the sums start again once the epoch's
    metrics row is written (a row for the epoch in progress: a run that --max-steps ended)."""
    return 0 if progress.rows > progress.epoch else progress.batch * batch_size


class Checkpointer:
    """The checkpoint files of the run directory `out`: `save` (collective under DDP; rank 0 writes),
    `restore` (every rank reads), `replay_logs` (rank 0) and `last_step` (for messages).

    `model_name` goes into model.safetensors' metadata; `device` is where the CUDA RNG state lives.
    """

    def __init__(self, out: Path, d: Dist, device: torch.device, model_name: str):
        self.out, self.d, self.device, self.model_name = out, d, device, model_name
        self.path = out / STATE_FILE
        # `runs.record.config_record` of the run's config.json, once written (rank 0): model.safetensors records it
        self.record: str | None = None
        self.logs: str | None = None  # the restored state.pt's record of the logs (`runs.logs_record`), if it has one

    def exists(self) -> bool:
        """Whether the run has a checkpoint to resume from (a link at state.pt, even to nothing, is one: its
        reader names it, rather than the run starting over)."""
        return os.path.lexists(self.path)

    def last_step(self) -> int | None:
        """The step of the checkpoint on disk, or None when there is none (or none that reads)."""
        try:
            return load_state(self.path)["progress"]["step"]
        except AttnconvError:
            return None

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, progress: RunProgress) -> None:
        """Write model.safetensors and state.pt as one pair (`runs.save_checkpoint`). Collective: the sums
        are added over the ranks and every rank's RNG state is gathered; rank 0 writes."""
        p = dataclasses.replace(progress)
        totals = self.d.sum([getattr(p, k) for k in _SUMS], self.device)
        for key, value in zip(_SUMS, totals):
            setattr(p, key, value)
        rng_torch, rng_cuda = self._rng_states()
        if not self.d.main:
            return
        meta = self._weights_meta(p)
        state = {
            "format": STATE_FORMAT,
            "progress": dataclasses.asdict(p),
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(),
            "rng": {"torch": rng_torch, "cuda": rng_cuda},
        }
        if self.record is not None:
            state["record"] = self.record  # both files know which run they are
        if LOGS_KEY in meta:  # and which logs: state.pt's CRC-32s keep it when the weights are lost or damaged
            state["logs"] = meta[LOGS_KEY]
        save_checkpoint(model, meta, state, self.out)

    def _weights_meta(self, p: RunProgress) -> dict[str, str]:
        meta = {"model": self.model_name, "step": str(p.step), "epoch": str(p.epoch)}
        if self.record is not None:
            meta[RECORD_KEY] = self.record
        logs = logs_record(self.out, p.rows, p.snapshots, p.finished)  # the logs it is written after, for their readers
        if logs is not None:
            meta[LOGS_KEY] = logs
        return meta

    def logs_metadata(self, progress: RunProgress) -> dict[str, str]:
        """What vouches for the logs a resume keeps: the restored state.pt's record of them (the checkpoint itself,
        its CRC-32s checked), else model.safetensors' metadata (a state.pt written before it kept one)."""
        if self.logs is not None:
            return state_logs(self.logs, progress.epoch, progress.step)
        try:
            return recorded_metadata(self.out / WEIGHTS_FILE)
        except AttnconvError:  # weights this user may not read: they vouch for nothing here
            return {}

    def finished_later(self, model: nn.Module, progress: RunProgress) -> int | None:
        """The step of model.safetensors where it is the run's finished last checkpoint, later than the state.pt
        restored (`progress`: an older copy of the run's, put back by hand): weights that fit `model`, pass their
        checksum, record config.json as it is and the run finished. The run is then finished, and its readers take
        those weights: a resume trains nothing and leaves every file as it is (`finished_row`). None otherwise."""
        path = self.out / WEIGHTS_FILE
        try:
            meta = recorded_metadata(path)
            step = recorded_step(meta)
            if progress.finished or step is None or step <= progress.step or not recorded_finished(meta) \
                    or record_problem(meta, read_config(self.out), path) is not None:
                return None
            return step if weights_fit(model, path) and not weights_changed(path) else None
        except (AttnconvError, OSError):  # weights its readers refuse: the resume goes on from state.pt
            return None

    def finished_row(self, progress: RunProgress, step: int) -> dict[str, float]:
        """A resume of a finished run whose state.pt is older than its weights (`finished_later`): said, nothing
        written; metrics.csv's last row as its readers take it, it and heads.jsonl checked against the weights'
        record as a finished run's resume checks them (heads.jsonl as its readers take it: `judged_heads`)."""
        meta = recorded_metadata(self.out / WEIGHTS_FILE)
        rows = with_last_line(self.out, "metrics", read_metrics(self.out), meta) \
            if (self.out / METRICS_FILE).exists() else []
        problems = [(METRICS_FILE, logs_problem(meta, "metrics", rows) if rows else None)]
        if (self.out / HEADS_FILE).exists():
            heads, skipped, problem = judged_heads(self.out, meta)
            problems.append((HEADS_FILE, problem if skipped else logs_problem(meta, "heads", heads)))
        for name, problem in problems:
            if problem is not None:
                raise DamagedFile(f"{self.out / name}: {problem}", "restore it from a copy of the run")
        if self.d.main:
            print(f"{self.out}: run already finished ({step} steps, as {WEIGHTS_FILE} records); {STATE_FILE} is an "
                  f"older checkpoint of it (step {progress.step}), left as it is: nothing to train", file=sys.stderr)
        return rows[-1] if rows else {}

    def rewrite_weights(self, model: nn.Module, progress: RunProgress) -> str | None:
        """Rank 0, a finished run resumed: model.safetensors written anew from the restored state where it is
        missing (deleted, moved away), a link to nowhere (or into a loop), or a file that does not hold the model's
        tensors (`runs.weights_fit`: cut short, junk), those of another step (an older copy) or tensors that fail their
        checksum (`runs.build.weights_changed`), as an unfinished run's
        next checkpoint writes it (a link is
        replaced, nothing is written through it); what it was, or None."""
        path = self.out / WEIGHTS_FILE
        dangling = dangling_link(path)
        step, changed = None, False
        if dangling is None and path.exists() and weights_fit(model, path):
            step, changed = recorded_step(recorded_metadata(path)), weights_changed(path)
            if not changed and (step is None or step == progress.step):
                return None
        why = f"was {dangling}" if dangling else "was missing" if not path.exists() else \
            "failed its checksum (bytes changed on disk)" if changed else \
            f"held the weights of step {step}, not the checkpoint's {progress.step} (an older copy, or another run's)" \
            if step is not None else "did not hold the run's weights"
        meta = self._weights_meta(progress)
        if self.logs is not None:  # the logs the checkpoint vouched for, not whatever they hold now
            meta[LOGS_KEY] = self.logs
        save_weights(model, path, meta)
        return why

    def _rng_states(self) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Every rank's CPU (and CUDA) generator state, in rank order (a collective under DDP)."""
        rng_torch = [torch.get_rng_state()]
        rng_cuda = [torch.cuda.get_rng_state(self.device)] if self.device.type == "cuda" else None
        if self.d.active:
            gathered: list[Any] = [None] * self.d.world_size
            dist.all_gather_object(gathered, (rng_torch[0], rng_cuda[0] if rng_cuda else None))
            rng_torch = [g[0] for g in gathered]
            rng_cuda = [g[1] for g in gathered] if rng_cuda else None
        return rng_torch, rng_cuda

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer, seed: int,
                batch_size: int | None = None) -> RunProgress:
        """Load state.pt into `model` and `optimizer` and set this rank's RNG state; the counters it saved
        (with `batch_size`, the run's global batch: the images the epoch's sums count must be its batches').

        Weights of another dtype are refused (load_state_dict would cast them); weights that do not fit
        the model are blamed on state.pt when model.safetensors fits it (config.json and the weights agree,
        so state.pt is another run's), else on an edited config.json. With another number of
        processes than the run had, dropout streams start anew from `seed` and the step."""
        state = load_state(self.path)
        self.logs = state.get("logs")
        problem = state_record_problem(state, self.out)  # another run's (another seed), or config.json edited since
        if problem is not None:
            raise AttnconvError(problem)
        expected = model.state_dict()
        cast = next((k for k, t in state["model"].items() if k in expected and t.dtype != expected[k].dtype), None)
        if cast is not None:
            raise AttnconvError(
                f"{self.path}: tensor {cast} is {state['model'][cast].dtype}, the model's is "
                f"{expected[cast].dtype}: not a checkpoint of this run; resume from another copy of the run")
        try:
            model.load_state_dict(state["model"])
            problem = _optimizer_problem(state["optimizer"], optimizer, state["progress"]["step"])  # the rest too?
            if problem is None:
                optimizer.load_state_dict(state["optimizer"])
                progress = RunProgress(**state["progress"])
        except (KeyError, RuntimeError, ValueError, TypeError) as err:
            # torch's first line is "Error(s) in loading state_dict for X:"; the next says what differs.
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            detail = lines[1] if len(lines) > 1 and lines[0].startswith("Error(s) in loading") else lines[0]
            if weights_fit(model, self.out / WEIGHTS_FILE):  # config.json and the weights agree: state.pt is foreign
                raise ParameterError(
                    None, None, f"{self.path} does not fit the model that {self.out / CONFIG_FILE} describes "
                    f"({detail}), while {WEIGHTS_FILE} does: {STATE_FILE} is not this run's; restore it from a copy "
                    "of this run (without it the run cannot be resumed: train it again into a new {out}, or over "
                    "this one with {overwrite})", mentions=("out", "overwrite")) from None
            raise AttnconvError(
                f"{self.path} does not fit the model that {self.out / CONFIG_FILE} describes ({detail}); "
                f"if {CONFIG_FILE} was edited, restore it (the checkpoint is kept as it is)") from None
        if problem is not None:  # torch would load it, and fail at the first step (a traceback), or train on
            problem = f"its optimizer state {problem}"
        elif batch_size is not None and progress.seen != _images_counted(progress, batch_size):
            problem = (f"progress seen {progress.seen:g} is not the {_images_counted(progress, batch_size)} images of "
                       f"its {progress.batch} batches of {batch_size}, counted until the epoch's row is written")
        if problem is not None:
            raise AttnconvError(f"{self.path}: cannot read the training state: the file is corrupt ({problem}); "
                                f"{STATE_FIX}")
        if not self.d.main:
            for key in _SUMS:
                setattr(progress, key, 0.0)
        rng = state["rng"]
        if len(rng["torch"]) == self.d.world_size:
            torch.set_rng_state(rng["torch"][self.d.rank])
            if self.device.type == "cuda" and rng["cuda"] is not None:
                try:  # only its size is checked before (a CPU machine cannot try it)
                    torch.cuda.set_rng_state(rng["cuda"][self.d.rank], self.device)
                except RuntimeError:
                    raise AttnconvError(f"{self.path}: cannot read the training state: the file is corrupt (the CUDA "
                                        f"random number generator state is not one torch can set); {STATE_FIX}"
                                        ) from None
        else:
            torch.manual_seed(seed + self.d.rank + 7919 * progress.step)
        return progress

    def check_length(self, progress: RunProgress, total_steps: int, *, epochs: int | None = None,
                     row_due: bool = False) -> None:
        """The counters `restore` gave must fit a run of `total_steps`: a run not finished before its last step, or
        finished at it; an AttnconvError naming state.pt otherwise. (Not the step against the epoch and batch: a
        resume with --allow-data-change changes the epochs' length mid-run.) `epochs`: the run's, when that flag
        is given (`total_steps` then counts the epochs left at the data's length now); `row_due`: the epoch in
        progress ends where it stands (it got shorter), so a run at its last step still has that epoch's row to
        write."""
        if progress.finished == (progress.step >= total_steps) or (row_due and progress.step == total_steps):
            return
        where = f"at step {progress.step}" if epochs is None else \
            f"at step {progress.step} (epoch {progress.epoch + 1} of {epochs})"
        why = (f"finished at step {progress.step}, before the run's last step {total_steps}" if progress.finished else
               f"{where}, at or past the run's end, yet not finished" if epochs is not None else
               f"{where}, at or past the run's {total_steps} steps, yet not finished")
        hint = "" if epochs is not None else ("if it was resumed with --allow-data-change on data of another size, "
                                              "give that flag again; else ")
        raise AttnconvError(f"{self.path}: the training state does not fit this run ({why}); {hint}{STATE_FIX}")

    def replay_logs(self, progress: RunProgress, heads: bool, *, restored: bool = True) -> None:
        """Rank 0, before the first step: cut metrics.csv, steps.csv (and heads.jsonl when `heads`) back to
        the rows `progress` counts, so what was logged after the checkpoint is logged once, when replayed.
        Logs that lost rows the checkpoint counted are refused (`runs.trim_logs`). Without a checkpoint to
        restore (`restored` False: an attempt stopped before its first one was whole, or a run resumed from
        nothing) no row is vouched for: the run starts from step 0 and every log is written anew."""
        if restored:  # a finished run replays nothing: its logs are checked, not rewritten
            trim_logs(self.out, progress.rows, progress.snapshots if heads else None, progress.step_rows,
                      step=progress.step, write=not progress.finished, metadata=self.logs_metadata(progress))
        else:
            trim_logs(self.out, 0, 0 if heads else None, 0)
