"""The training loop: `train(config, out)` writes a run directory (see `attnconv.runs`).

    from attnconv import make_config, train
    train(make_config(preset="fmnist-sa-quadratic", epochs=2), "runs/sa")

Checkpoints and resume (`training.checkpoint.Checkpointer`, which owns the format). state.pt
carries its own copy of the weights, so it alone is the resume point. Batches are a pure function
of (seed, epoch, batch index) (see `attnconv.data.Batches`) and the learning rate a pure function of
the step, so a checkpoint needs only the step counters, the optimizer state and the RNG states (for
dropout) to continue exactly where the run stopped, mid-epoch too. On the CPU the resumed run reaches
bit-identical weights (tests/test_train.py kills a real subprocess with SIGKILL to check it).

Several processes. Under `torchrun`, every rank takes a contiguous shard of each *global* batch (`batch_size` is
global) and DDP averages the per-shard mean gradients, which equals the 1-process gradient of the global batch mean.
Only rank 0 prints, logs and writes checkpoints. BatchNorm statistics are per shard (as in any DDP run without
SyncBatchNorm).

Logs. metrics.csv gets a row per epoch, steps.csv a row every `log_every` steps (the
loss and accuracy since the previous row, over all ranks), heads.jsonl a snapshot per
epoch; each is an fsync'd append, and on resume each is cut back to what the checkpoint
knows of, so a resumed run ends with the same logs as an uninterrupted one (timings
aside). With `tensorboard=True` the same scalars also go to RUN_DIR/tensorboard/.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

import attnconv
from attnconv import data as D
from attnconv.config import TrainConfig
from attnconv.errors import AttnconvError, ParameterError
from attnconv.evaluate import evaluate
from attnconv.fileio import DirectoryLock, open_regular, remove_empty, remove_temporaries, same_path
from attnconv.models.sites import records_heads
from attnconv.precision import check_amp, precision_name
from attnconv.runs import (
    CONFIG_FILE,
    METRICS_COLUMNS,
    METRICS_FILE,
    RUN_FILES,
    STATE_FILE,
    TENSORBOARD_DIR,
    WEIGHTS_FILE,
    SetAside,
    append_rows,
    build_run_model,
    check_record,
    claim_run_dir,
    config_record,
    data_digest_and_overlap,
    data_fingerprint,
    nonfinite_tensor,
    read_config,
    read_metrics,
    run_image_size,
    run_info,
    write_config,
)
from attnconv.runs.logs_record import with_last_line
from attnconv.training.board import TensorBoardLog, check_board_folder, summary_writer_class
from attnconv.training.checkpoint import Checkpointer
from attnconv.training.checks import (
    LOG_EVERY,
    check_data,
    check_folder_there,
    check_resumable,
    check_resume_point,
    check_same_config,
    check_test_split,
    kept_normalization,
    recorded_log_every,
    resolve_overrides,
    sound_run,
    train_arguments,
)
from attnconv.training.distributed import Dist, init_distributed
from attnconv.training.logs import HeadsLog, StepsLog
from attnconv.training.progress import ProgressLog, RunProgress, eta, write_line
from attnconv.training.schedule import learning_rate, make_optimizer
from attnconv.training.step import train_step
from attnconv.training.stopping import PROBE_IMAGES, RESTORED, CleanupInterrupts, rate_fix, stopped_line

# Steps between host syncs (NaN check, progress bar): a sync per step would stall a GPU.
_SYNC_EVERY = 10
# After this many steps of a run (fresh or resumed) one line estimates the time the rest will take.
ESTIMATE_AFTER = 5


def train(
    config: TrainConfig,
    out: str | os.PathLike,
    *,
    resume: bool = False,
    overwrite: bool = False,
    dataset: tuple[D.ImageSet, D.ImageSet] | None = None,
    progress: bool = True,
    log_every: int | None = None,
    announce: str | None = None,
    allow_data_change: bool = False,
    tensorboard: bool = False,
) -> dict[str, float]:
    """Train `config` into the run directory `out`; returns the last metrics row.

    The run directory contract: `out` must be new or empty, or hold a run already, which
    `resume` continues (from out/state.pt if there is one, after checking that the config
    matches out/config.json except for `RESUMABLE_CHANGES`) and `overwrite` replaces (its
    run files only, named on stderr). A folder holding anything else is refused; files the
    run did not write are never modified or deleted. One process at a time writes a run
    directory (an advisory lock on the directory itself; a killed process holds none).
    dataset: (train, test) ImageSets to use instead of loading `config.dataset`
    (they must have that dataset's shape). progress: print progress (a bar on a terminal,
    a line every `log_every` steps otherwise; steps.csv gets a row every `log_every` steps either
    way; None: the interval config.json records on `resume`, else 100). announce: a line printed
    once every check has passed, before the first step (the CLI's preset line). allow_data_change:
    resume even though the dataset differs from the one the run recorded (config.json "data");
    otherwise refused. tensorboard: also write TensorBoard event files into out/tensorboard/ (needs
    the `tensorboard` package; checked first).
    Launched by torchrun, trains with DDP.
    """
    out, resume, overwrite, allow_data_change, progress, tensorboard = train_arguments(
        config, out, resume, overwrite, allow_data_change, progress, tensorboard)
    if resume and dataset is None and (out / CONFIG_FILE).is_file():  # before validate scans it as new data
        check_folder_there(out, config)
    config.validate()
    if D.folder_path(config.dataset) is not None:  # folder:PATH recorded absolute (readers run from anywhere)
        config = dataclasses.replace(config, dataset=D.canonical_name(config.dataset))
    if log_every is not None and (isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1):
        raise ParameterError("log_every", log_every, "is invalid: give a number of steps >= 1")
    writer_class = summary_writer_class() if tensorboard else None
    fresh = not out.exists()
    new_parents = [p for p in reversed(out.parents) if not p.exists()]  # `claim_run_dir` makes them with out
    d = init_distributed(config)
    lock = DirectoryLock(out, "out") if d.main else None
    trainer = interrupts = None
    try:
        trainer = _Trainer(config, out, resume, overwrite, dataset, progress, log_every, d, lock, allow_data_change,
                           writer_class)
        row = trainer.run(announce)
        d.barrier()  # rank 0 writes the last files after the last collective: every rank leaves together
        return row
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt):  # a second Ctrl-C must not cut the line saying where it stopped
            interrupts = CleanupInterrupts()
        # --overwrite before the first checkpoint: the old run is back
        stopped = stopped_line(err, out, trainer, fresh, overwrite, allow_data_change)
        if stopped is None:
            raise
        raise stopped from None
    finally:
        if lock is not None:
            lock.release()
            if fresh and out.is_dir() and not any(out.iterdir()):
                out.rmdir()  # a run that failed before writing anything leaves no directory behind
                remove_empty(new_parents)  # nor the folders made to hold it
        trainer = None  # DDP's reducer holds the process group: it goes first
        d.shutdown()
        if interrupts is not None:
            interrupts.restore()


class _Trainer:
    def __init__(self, config, out: Path, resume: bool, overwrite: bool, dataset, progress: bool, log_every: int,
                 d: Dist, lock: DirectoryLock | None, allow_data_change: bool = False, writer_class=None):
        self.config, self.out, self.resume, self.overwrite, self.d, self.lock = config, out, resume, overwrite, d, lock
        self.set_aside = SetAside(out, [])  # --overwrite: the old run, kept until the first checkpoint
        self.allow_data_change = allow_data_change
        # progress on rank 0 only; epoch summaries print on rank 0 regardless
        self.progress_mode = ProgressLog.auto_mode(progress and d.main)
        self.log_every = log_every if log_every is not None else recorded_log_every(out) if resume else LOG_EVERY
        self._estimate_at: int | None = None  # the step after which run() estimates the time left
        self.writer_class = writer_class if d.main else None  # --tensorboard: torch's SummaryWriter
        self.board: TensorBoardLog | None = None  # its event files (rank 0), while `run` runs
        if config.workers is not None:
            torch.set_num_threads(config.workers)
        if config.device.startswith("cuda"):
            self.device = torch.device("cuda", d.local_rank if d.active else torch.device(config.device).index or 0)
        else:
            self.device = torch.device("cpu")
        check_amp(config.amp, self.device)  # before any file or data: --amp where bf16 is emulated
        self.checkpoint = Checkpointer(out, d, self.device, config.model)
        self.steps_log = StepsLog(out, d, self.device)  # steps.csv; heads.jsonl's HeadsLog comes with the model
        # Cheap checks first: a bad --out fails before the data is read.
        d.agree(self._check_out() if d.main else None)
        self._load_data(dataset)
        self._plan_steps()
        self._build()

    # ---------------------------------------------------------------- setup

    def _load_data(self, dataset) -> None:
        """The train and test sets (checked against the batch and the ranks) and the config resolved for them;
        every rank fails alike, before any file is written."""
        config, d = self.config, self.d
        self.info = self.data_info = run_info(config)  # the data as it is now (`data_info`: what config.json records)
        resuming = self.resume and (self.out / CONFIG_FILE).exists()  # the batch and the model are the run's
        if resuming and (self.out / STATE_FILE).exists():  # weights trained with the run's normalization keep it
            self.info = kept_normalization(self.info, read_config(self.out).get("data"))
        try:
            self.train_set, self.test_set = dataset if dataset is not None else D.load_dataset(
                config.dataset, config.data_dir, download=True, image_size=run_image_size(config))
            check_data(self.info, self.train_set, self.test_set, config.batch_size, d.world_size, resuming=resuming)
        except AttnconvError as err:
            d.agree(err)  # every rank fails the same way here; agree keeps them in step anyway
        d.agree(None)
        # What the data holds (config.json "data" "digest"): --resume must see the same. Rank 0 alone writes it.
        self.digest, overlap = data_digest_and_overlap(self.train_set, self.test_set) if d.main else (None, 0)
        d.agree(check_test_split(config.dataset, overlap, len(self.test_set)) if d.main else None)
        if self.device.type == "cuda":  # the uint8 sets live on the GPU: batches never cross PCIe
            self.train_set, self.test_set = self.train_set.to(self.device), self.test_set.to(self.device)
        error = None
        try:  # bad overrides fail here, before any file is written; too large ones before allocating
            config = resolve_overrides(config, self.info, resuming=resuming)
        except AttnconvError as err:
            error = err
        d.agree(error)
        self.config = config
        d.agree(self._check_existing_config() if d.main else None)

    def _plan_steps(self) -> None:
        """Steps per epoch, steps in all (--max-steps may cut them) and the epochs that will run."""
        config = self.config
        self.steps_per_epoch = len(self.train_set) // config.batch_size
        self.total_steps = config.epochs * self.steps_per_epoch
        if config.max_steps is not None:
            self.total_steps = min(self.total_steps, config.max_steps)
        self.epochs = math.ceil(self.total_steps / self.steps_per_epoch)  # the epochs that will run (--max-steps)

    def _count_in_epochs(self) -> None:
        """--allow-data-change: the steps left are the rest of the epoch in progress and the epochs after it, at the
        data's steps per epoch now (an epoch of the old data may have had other steps: counted in steps, the run
        would end inside its last epoch or run one past it). Epochs that got shorter end the epoch in progress
        where it stands (its row next)."""
        p, cfg, per_epoch = self.progress, self.config, self.steps_per_epoch
        p.batch = min(p.batch, per_epoch)
        left = per_epoch - p.batch + (cfg.epochs - p.epoch - 1) * per_epoch if p.epoch < cfg.epochs else 0
        self.total_steps = p.step + left if cfg.max_steps is None else min(p.step + left, cfg.max_steps)
        self.epochs = p.epoch + max(1, math.ceil((self.total_steps - p.step + p.batch) / per_epoch))

    def _build(self) -> None:
        """Model, optimizer and counters (restored from the checkpoint on --resume), then the DDP, compile
        and autocast wrappers."""
        config, d = self.config, self.d
        torch.manual_seed(config.seed)  # the same initial weights on every rank and every resume
        has_state = self.restored = self.resume and self.checkpoint.exists()
        error = None
        try:
            self.model = build_run_model(config, source_weights=not has_state).to(self.device)
        except AttnconvError as err:
            error = err
            init = config.init_from
            if self.resume and not has_state and init is not None and Path(init.run).is_dir() \
                    and sound_run(Path(init.run)):
                # a resume starts again from the CNN it started from: the folder holds another run now (another
                # width, an attention network), whose own files are sound; not "restore it" nor "--init-from"
                error = ParameterError(None, None, f"{init.run}: the CNN run this run starts from (its config.json's "
                                       "init_from.run) now holds another network than the one this run started "
                                       f"from ({str(err).split('; ')[0]}); move the CNN run it started from back to "
                                       f"{init.run}, or start over from a CNN run (`attnconv train --init-from "
                                       f"CNN_RUN --out {self.out} --overwrite`)")
        self.init_weights = None  # the CNN's weights this run starts from (a digest), when it starts from them now
        if error is None and config.init_from is not None and not has_state:
            error = self._check_init_weights(Path(config.init_from.run) / WEIGHTS_FILE)
        d.agree(error)
        # Dropout streams differ per rank (the shards are different samples anyway).
        torch.manual_seed(config.seed + d.rank)
        self.optimizer = make_optimizer(self.model, config)
        # Attention classifiers and models whose attention is captured (the ViT) record their heads
        # (heads.jsonl); CNNs and converted networks do not.
        self.heads = HeadsLog(self.out, self.model, self.test_set, self.info) \
            if d.main and records_heads(self.model) else None
        self.progress, self.finished_at = RunProgress(), None
        if has_state:
            p = self.progress = self.checkpoint.restore(self.model, self.optimizer, config.seed, config.batch_size)
            self.finished_at = self.checkpoint.finished_later(self.model, p)  # state.pt older than finished weights
            if not self.allow_data_change:
                self.checkpoint.check_length(p, self.total_steps)
            elif not p.finished:  # under the flag, a finished run's length is its own
                self._count_in_epochs()
                row_due = p.batch == self.steps_per_epoch and p.epoch < config.epochs  # an epoch cut short
                self.checkpoint.check_length(p, self.total_steps, epochs=config.epochs, row_due=row_due)

        net: nn.Module = self.model
        if d.active:
            net = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.train_net = torch.compile(net) if config.compile else net
        self.eval_net = self.train_net if not d.active else (
            torch.compile(self.model) if config.compile else self.model)
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=config.amp)

    def _check_out(self) -> AttnconvError | None:
        """Rank 0: take the run directory (`runs.claim_run_dir`); the error, if any, for every rank."""
        try:
            init = self.config.init_from
            if init is not None and not self.resume and same_path(init.run, self.out):
                raise ParameterError("init_from", init.run, "is {out} itself: the CNN run would be replaced by the run "
                                     "that starts from it; give another {out}", mentions=("out",))
            folder = D.folder_path(self.config.dataset)
            if folder is not None and Path(os.path.realpath(self.out)).is_relative_to(os.path.realpath(folder)):
                raise ParameterError("out", self.out, f"lies inside the image folder {folder} the run trains on: its "
                                     "files would sit among the images (a split, a class of its own); choose an {out} "
                                     "outside it", mentions=("out",))
            replaced = claim_run_dir(self.out, self.lock, resume=self.resume, overwrite=self.overwrite)
            if self.resume and (self.out / CONFIG_FILE).exists():  # before the data is read: an edit is named as one,
                meta = read_config(self.out)  # and so is a flag given (--image-size: the data would be blamed)
                check_record(self.out, meta)
                check_resume_point(self.out)  # a converted run has nothing to resume, whatever flags are given
                check_same_config(self.out, TrainConfig.from_dict(meta["config"]), self.config)
            self.set_aside = SetAside(self.out, replaced)
            if self.writer_class is not None:
                check_board_folder(self.out)
        except AttnconvError as err:
            return err
        return None

    def _check_existing_config(self) -> AttnconvError | None:
        """Rank 0: on --resume, the saved run must be this config on this data (`checks.check_resumable`)."""
        if self.overwrite or not (self.out / CONFIG_FILE).exists():
            return None
        try:
            check_resumable(self.out, self.config, self.data_info, self.digest,
                            allow_data_change=self.allow_data_change)
        except AttnconvError as err:
            return err
        return None

    # ---------------------------------------------------------------- checkpoints

    def _checkpoint(self, probe: bool = False) -> None:
        """A checkpoint of where the run stands (`Checkpointer.save`); non-finite weights stop the run instead, and so
        (`probe`: within an epoch, whose test loss is not evaluated) does a non-finite loss on the first test images."""
        bad = nonfinite_tensor(self.model.state_dict())
        if bad is not None:
            raise self._nan_error(f"weights became non-finite ({bad})", self.progress.step)
        if probe and not math.isfinite(self._evaluate(PROBE_IMAGES)[0]):  # finite weights, outputs not: not good
            raise self._nan_error(f"test loss on the first {min(PROBE_IMAGES, len(self.test_set))} test images became "
                                  "non-finite (NaN or inf)", self.progress.step)
        self.checkpoint.save(self.model, self.optimizer, self.progress)
        self.set_aside.discard()  # the new run can stand on its own: --overwrite's old run goes for good

    def _nan_error(self, what: str, step: int) -> ParameterError:
        good = self.checkpoint.last_step()
        last = RESTORED if self.set_aside.pending else "no checkpoint was written yet" if good is None else \
            f"the last good checkpoint (step {good}) is intact in {self.out}"
        lr = learning_rate(self.config, step - 1, self.total_steps)
        return ParameterError(None, None, f"{what} at step {step} (lr {lr:.3g}); {last}; {rate_fix(self.config)}",
                              mentions=("overwrite", "lr", "warmup", "out", "attention_lr_scale"))

    # ---------------------------------------------------------------- loop

    def run(self, announce: str | None = None) -> dict[str, float]:
        """Train to the end; the last metrics row."""
        p, d = self.progress, self.d
        if self.finished_at is not None:  # a finished run's older state.pt: nothing to train, nothing written
            return self.checkpoint.finished_row(p, self.finished_at)
        if d.main:
            self._set_aside_old_run()  # every check has passed: only now does an old run move
            self._prepare_files()
            if announce and not p.finished:
                write_line(announce)
        if p.finished:
            if self.d.main:
                why = self.checkpoint.rewrite_weights(self.model, p)
                if why is not None:
                    print(f"{self.out}: {WEIGHTS_FILE} {why}: written anew from {STATE_FILE}", file=sys.stderr)
                print(f"{self.out}: run already finished ({p.step} steps)", file=sys.stderr)
            # its logs as trim_logs checked them (a last row re-saved without its newline is the run's; none if deleted)
            rows = with_last_line(self.out, "metrics", read_metrics(self.out), self.checkpoint.logs_metadata(p))
            return rows[-1] if rows else {}
        if self.d.main and p.step:
            print(f"resuming {self.out} at step {p.step} (epoch {p.epoch + 1}, batch {p.batch})", file=sys.stderr)
        row: dict[str, float] = {}
        self._estimate_at = p.step + ESTIMATE_AFTER if p.step + ESTIMATE_AFTER < self.total_steps else None
        if self.writer_class is not None:
            # Events after the checkpoint's step are dropped by TensorBoard's readers: the resumed run logs them anew.
            self.board = TensorBoardLog(self.writer_class, self.out, purge_step=p.step + 1 if p.step else None)
        done = False
        try:
            while not p.finished:
                row = self._epoch()
            done = True
        finally:
            if self.board is not None:
                board, self.board = self.board, None
                board.close(quiet=not done)  # a failure already on its way is the one to report
        return row

    def _set_aside_old_run(self) -> None:
        """--overwrite: move the old run's files aside (named on stderr), until the first checkpoint."""
        names = self.set_aside.names
        if names:
            board = [n for n in names if n.startswith(TENSORBOARD_DIR + "/")]
            shown = [n for n in names if n not in board] + ([f"{len(board)} event file{'s' if len(board) > 1 else ''}"
                                                              f" in {TENSORBOARD_DIR}/"] if board else [])
            write_line(f"--overwrite: replacing the run in {self.out} ({', '.join(shown)}); it is kept aside until "
                        "the new run's first checkpoint, other files stay")
        self.set_aside.move()

    def _check_init_weights(self, weights: Path) -> AttnconvError | None:
        """Note the digest of the CNN weights an --init-from run starts from (config.json records it); on a resume
        that starts the run again, an error if the CNN's weights are not those it started from (a CNN of the same
        shapes put in its place: another seed, trained further)."""
        try:
            with open_regular(weights, "restore the CNN run from a copy") as f:  # read as every reader reads
                self.init_weights = hashlib.file_digest(f, "sha256").hexdigest()
        except AttnconvError as err:  # swapped for a FIFO since it loaded: every rank is told
            return err
        recorded = None
        if self.resume and (self.out / CONFIG_FILE).is_file():
            recorded = read_config(self.out).get("init_from_weights")
        if recorded is None or recorded.lower() == self.init_weights:  # read_config checked it is a digest
            return None
        init = self.config.init_from.run
        return ParameterError(None, None, f"{init}: the CNN run this run starts from (its config.json's init_from.run) "
                              f"holds other weights than those this run started from ({WEIGHTS_FILE} differs: "
                              "another run of the same network put there, or the CNN trained further); move the CNN "
                              f"run it started from back to {init}, or start over from this one (`attnconv train "
                              f"--init-from {init} --out {self.out} --overwrite`)")

    def _prepare_files(self) -> None:
        out, cfg = self.out, self.config
        remove_temporaries(out, RUN_FILES)  # a killed writer's, and only those
        # A resume with no checkpoint starts the run again: config.json records the data it now trains on (after
        # --allow-data-change, the old data's record would make every reader call the run's own data changed).
        if not (out / CONFIG_FILE).exists() or (self.resume and not self.restored):
            meta = {
                "config": cfg.to_dict(),
                "parameters": sum(t.numel() for t in self.model.parameters()),
                "steps_per_epoch": self.steps_per_epoch,
                "total_steps": self.total_steps,
                "world_size": self.d.world_size,
                "log_every": self.log_every,
                "data": {**data_fingerprint(self.data_info), "digest": self.digest},
                "precision": precision_name(cfg.amp),
                "torch": torch.__version__,
                "attnconv": attnconv.__version__,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            }
            if self.init_weights is not None:  # which CNN weights it started from: a resume compares them
                meta["init_from_weights"] = self.init_weights
            write_config(out, meta)
        self.checkpoint.record = config_record(read_config(out))  # what model.safetensors records of config.json
        if self.resume and not self.restored and (out / METRICS_FILE).exists():  # no checkpoint was ever whole
            print(f"{out}: no checkpoint to resume from (it stopped before its first): training starts again from "
                  "step 0 and its logs are written anew", file=sys.stderr)
        self.checkpoint.replay_logs(self.progress, heads=self.heads is not None, restored=self.restored)
        if self.heads is not None and self.progress.step == 0 and self.progress.snapshots == 0:
            self.heads.append(0, self.progress)  # the heads at initialization

    def _epoch(self) -> dict[str, float]:
        """One epoch (or what is left of it): its steps, then the test evaluation, the logs and a checkpoint."""
        lr, bar = self._steps()
        row = self._evaluate_epoch(lr, bar)
        if not math.isfinite(row["test_loss"]):  # finite weights whose outputs are not: diverged, not checkpointed
            raise self._nan_error("test loss became non-finite (NaN or inf)", self.progress.step)
        self._log_epoch(row)
        self._checkpoint()
        return row

    def _steps(self) -> tuple[float, ProgressLog]:
        """The epoch's training steps from where it stands, with checkpoints and syncs on the way; the last
        learning rate and the epoch's (closed) progress log, which the epoch's summary line goes to."""
        cfg, p, d = self.config, self.progress, self.d
        batches = D.iterate_batches(
            self.train_set, self.info, cfg.batch_size, seed=cfg.seed, epoch=p.epoch, train=True,
            augment=cfg.augment, rank=d.rank, world_size=d.world_size, drop_last=True, start_batch=p.batch,
            device=self.device, pad=cfg.crop_pad, flip=cfg.flip,
        )
        epoch_steps = min(self.steps_per_epoch, p.batch + self.total_steps - p.step)  # --max-steps may cut it
        bar = ProgressLog(self.progress_mode, total_steps=self.total_steps, epoch_steps=epoch_steps,
                          initial=p.batch, desc=f"epoch {p.epoch + 1}/{self.epochs}", log_every=self.log_every)
        self._synced = p.step
        self.train_net.train()
        # Device-side accumulators: no host sync per step (a sync per step stalls a GPU).
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss_sum, correct, seen
        first_bad = torch.full((), -1, dtype=torch.int64, device=self.device)
        group = self.optimizer.param_groups[0]  # the last step's rate: an epoch ended where it stands takes no step
        lr = group["lr"] / group.get("lr_scale", 1.0)
        tick = time.perf_counter()
        for x, y in batches:
            lr = learning_rate(cfg, p.step, self.total_steps)
            for group in self.optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
            loss, logits = train_step(self.train_net, self.optimizer, x, y, self.autocast)
            p.step += 1
            p.batch += 1
            with torch.no_grad():
                n = len(y)
                sums[:2] += torch.stack([loss.detach().double() * n, (logits.argmax(1) == y).sum().double()])
                sums[2] += n  # no host-built tensor copied to the device per step
                first_bad = torch.where((first_bad < 0) & ~loss.isfinite(), p.step, first_bad)
            epoch_done = p.batch == self.steps_per_epoch
            run_done = p.step >= self.total_steps
            ckpt = cfg.checkpoint_every and p.step % cfg.checkpoint_every == 0
            log_due = p.step % self.log_every == 0  # a steps.csv row (and a progress line)
            estimate_due = p.step == self._estimate_at
            if epoch_done or run_done or ckpt or log_due or estimate_due or p.step % _SYNC_EVERY == 0:
                now = time.perf_counter()
                p.seconds += now - tick
                p.row_seconds += now - tick
                self._sync(sums, first_bad, bar, lr)
                if estimate_due and d.main:
                    left = self.total_steps - p.step
                    bar.write(f"estimated time: {eta(self.total_steps, p.step, self._seconds_per_step())} for the "
                              f"{left} steps left ({self._seconds_per_step():.3g} s/step so far; test evaluations "
                              f"not counted)")
                if epoch_done or run_done:
                    break
                if ckpt:
                    self._checkpoint(probe=True)
                tick = time.perf_counter()
        bar.close()
        return lr, bar

    def _evaluate_epoch(self, lr: float, bar: ProgressLog) -> dict[str, float]:
        """The epoch's metrics.csv row: training sums over all ranks, the test set's loss and accuracy."""
        p, d = self.progress, self.d
        p.loss_sum, p.correct, p.seen = d.sum([p.loss_sum, p.correct, p.seen], self.device)
        test_loss, test_acc = self._evaluate()
        row = {
            "epoch": p.epoch + 1, "step": p.step, "train_loss": p.loss_sum / p.seen, "train_acc": p.correct / p.seen,
            "test_loss": test_loss, "test_acc": test_acc, "seconds": p.seconds,
            "images_per_s": p.seen / p.seconds if p.seconds > 0 else 0.0, "lr": lr,
        }
        if self.d.main:
            bar.write(
                f"epoch {p.epoch + 1}/{self.epochs}  step {p.step}  train loss {row['train_loss']:.4f} "
                f"acc {row['train_acc']:.4f}  test loss {test_loss:.4f} acc {test_acc:.4f}  "
                f"{p.seconds:.1f} s  {row['images_per_s']:.0f} img/s  "
                f"ETA {eta(self.total_steps, p.step, self._seconds_per_step())}"
            )
        return row

    def _log_epoch(self, row: dict[str, float]) -> None:
        """Close the epoch's counters and write its logs: metrics.csv, TensorBoard, heads.jsonl."""
        p, d = self.progress, self.d
        test_loss, test_acc = row["test_loss"], row["test_acc"]
        p.finished = p.step >= self.total_steps
        if p.batch == self.steps_per_epoch:
            p.epoch, p.batch = p.epoch + 1, 0
        p.rows += 1
        if d.main:
            append_rows(self.out / METRICS_FILE, [row], METRICS_COLUMNS)
            if self.board is not None:
                self.board.scalars({"test/loss": test_loss, "test/accuracy": test_acc}, p.step)
                self.board.flush()
        if self.heads is not None:
            self.heads.append(row["epoch"], self.progress)
        p.run_seconds += p.seconds
        p.loss_sum = p.correct = p.seen = p.seconds = 0.0

    def _sync(self, sums: torch.Tensor, first_bad: torch.Tensor, bar: ProgressLog, lr: float) -> None:
        """Move the device-side sums into `progress`, and stop on a non-finite loss (on every rank)."""
        p = self.progress
        bad = int(first_bad)
        if self.d.active:
            t = torch.tensor([bad if bad >= 0 else 2**62], device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            bad = int(t) if int(t) < 2**62 else -1
        if bad >= 0:
            raise self._nan_error("loss became non-finite (NaN or inf)", bad)
        loss_sum, correct, seen = sums.tolist()
        sums.zero_()
        p.loss_sum += loss_sum
        p.correct += correct
        p.seen += seen
        steps, self._synced = p.step - self._synced, p.step
        p.row_loss += loss_sum
        p.row_correct += correct
        p.row_seen += seen
        if p.seen:
            rate = p.seen * self.d.world_size / p.seconds if p.seconds > 0 else 0.0
            bar.update(p.step, steps, loss=p.loss_sum / p.seen, acc=p.correct / p.seen, rate=rate, lr=lr,
                       seconds_per_step=self._seconds_per_step())
        if p.step % self.log_every == 0:
            self.steps_log.append(p, lr, self.board)  # at a sync point: it costs no extra host sync

    def _seconds_per_step(self) -> float:
        """The run's measured training seconds per step so far (for the ETA)."""
        p = self.progress
        return (p.run_seconds + p.seconds) / max(1, p.step)

    def _evaluate(self, images: int | None = None) -> tuple[float, float]:
        test = self.test_set if images is None else D.ImageSet(self.test_set.images[:images], self.test_set.labels[:images])
        with self.autocast:
            return evaluate(self.eval_net, test, self.info, batch_size=max(self.config.batch_size, 256),
                            device=self.device, rank=self.d.rank, world_size=self.d.world_size)

