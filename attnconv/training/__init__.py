"""Training: `train(config, out)` writes a run directory.

    from attnconv.training import train
    from attnconv.config import make_config
    train(make_config(preset="fmnist-sa-quadratic", epochs=2), "runs/sa")

`train.loop` is the loop (checks, epochs, checkpoints, resume), `train.schedule` the learning
rate and optimizer groups, `train.distributed` torchrun, `train.progress` the logs. The
config lives in `attnconv.config`, the run directory in `attnconv.runs`.
"""

from attnconv.training.loop import train
from attnconv.training.schedule import learning_rate, make_optimizer

__all__ = ["learning_rate", "make_optimizer", "train"]
