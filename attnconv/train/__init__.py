"""Training: `train(config, out)` and what it is built from.

    from attnconv.train import make_config, train
    train(make_config(preset="fmnist-sa-quadratic", epochs=2), "runs/sa")

The pieces live in their own modules: `attnconv.config` (TrainConfig, presets),
`attnconv.runs` (the run directory), `train.schedule` (learning rate, optimizer groups),
`train.distributed` (torchrun), `train.loop` (the loop, checkpoints, resume). The names
below are re-exported so `from attnconv.train import ...` keeps working.
"""

from attnconv.config import OPTIMIZERS, PRESETS, RESUMABLE_CHANGES, SCHEDULES, TrainConfig, make_config
from attnconv.fileio import atomic_write
from attnconv.runs import (
    CONFIG_FILE,
    METRICS_COLUMNS,
    METRICS_FILE,
    STATE_FILE,
    WEIGHTS_FILE,
    build_run_model,
    load_run,
    load_state,
    read_config,
    read_metrics,
)
from attnconv.train.loop import train
from attnconv.train.schedule import learning_rate, make_optimizer

__all__ = [
    "CONFIG_FILE", "METRICS_COLUMNS", "METRICS_FILE", "OPTIMIZERS", "PRESETS", "RESUMABLE_CHANGES", "SCHEDULES",
    "STATE_FILE", "TrainConfig", "WEIGHTS_FILE", "atomic_write", "build_run_model", "learning_rate", "load_run",
    "load_state", "make_config", "make_optimizer", "read_config", "read_metrics", "train",
]
