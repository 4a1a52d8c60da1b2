"""Training: `train(config, out)` writes a run directory.

    from attnconv.training import train
    from attnconv.config import make_config
    train(make_config(preset="fmnist-sa-quadratic", epochs=2), "runs/sa")

`training.loop` is the loop (set-up, epochs, what a failure says), `training.checkpoint` the
checkpoint format and the resume replay, `training.logs` steps.csv and heads.jsonl,
`training.checks` what is checked before anything is written, `training.schedule` the learning
rate and optimizer groups, `training.distributed` torchrun, `training.progress` the progress lines,
`training.board` the TensorBoard event files.
The config lives in `attnconv.config`, the run directory in `attnconv.runs`.
"""

from attnconv.training.loop import train
from attnconv.training.schedule import learning_rate, make_optimizer

__all__ = ["learning_rate", "make_optimizer", "train"]
