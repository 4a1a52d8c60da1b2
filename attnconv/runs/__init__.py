"""Run directories: what `attnconv train` writes, and everything that reads it back.

A run directory holds:

    config.json        the resolved TrainConfig ("config"), the parameter count ("parameters"),
                       steps, versions, date, the dataset it saw ("data"); a converted run adds
                       a "converted" block
    metrics.csv        one row per epoch (train/test loss and accuracy, time, lr)
    heads.jsonl        attention models: every head at initialization and after each epoch
    steps.csv          a row every --log-every steps (loss, accuracy, lr, images/s, time)
    tensorboard/       with --tensorboard: event files of the same curves
    model.safetensors  the weights (state_dict), metadata: model, step, epoch, and the fields of
                       config.json they were written for (record.py)
    state.pt           everything resume needs: step, epoch, batch, optimizer, RNG states,
                       and a copy of the weights (read with torch.load(weights_only=True) only)

`Run(path)` reads one lazily (run.py). The modules: files.py (names, reading and writing
each file), run_data.py (the run's dataset), build.py (its network: `load_run`, `convert_run`),
record.py (what model.safetensors records of config.json, so that an edit of either is caught),
directory.py (the run directory contract of `attnconv train`: what it may write, what --overwrite
sets aside until the new run's first checkpoint, the logs a resumed run keeps).
Every file is written atomically through `attnconv.fileio.atomic_write`.
"""

from attnconv.runs.build import (
    build_run_architecture,
    build_run_model,
    convert_run,
    load_run,
    load_weights,
    nonfinite_tensor,
    weights_fit,
)
from attnconv.runs.directory import SetAside, claim_run_dir, event_files, recover_set_aside, trim_logs
from attnconv.runs.files import (
    CONFIG_FILE,
    HEADS_FILE,
    METRICS_COLUMNS,
    METRICS_FILE,
    RUN_FILES,
    STATE_FILE,
    STATE_FORMAT,
    STEPS_COLUMNS,
    STEPS_FILE,
    TENSORBOARD_DIR,
    WEIGHTS_FILE,
    load_state,
    read_config,
    save_checkpoint,
    save_weights,
    write_config,
)
from attnconv.runs.heads_file import heads_line, read_heads, read_heads_skipping
from attnconv.runs.logs_file import append_rows, metrics_text, read_metrics, read_steps
from attnconv.runs.record import RECORD_KEY, check_record, config_record, record_problem, recorded_metadata
from attnconv.runs.run import Run, as_run
from attnconv.runs.run_data import (
    SAMPLE_SEED,
    DataNotFound,
    check_other_dataset,
    data_changes,
    data_digest,
    data_digest_and_overlap,
    data_fingerprint,
    other_test_set,
    recorded_info,
    run_data_dir,
    run_image_size,
    run_info,
    run_test_set,
    sample_across_classes,
    split_digest,
)

__all__ = [
    "CONFIG_FILE",
    "METRICS_FILE",
    "WEIGHTS_FILE",
    "STATE_FILE",
    "HEADS_FILE",
    "METRICS_COLUMNS",
    "STATE_FORMAT",
    "RUN_FILES",
    "STEPS_FILE",
    "STEPS_COLUMNS",
    "TENSORBOARD_DIR",
    "save_weights",
    "save_checkpoint",
    "RECORD_KEY",
    "config_record",
    "record_problem",
    "check_record",
    "recorded_metadata",
    "load_state",
    "read_config",
    "read_metrics",
    "read_heads",
    "read_heads_skipping",
    "read_steps",
    "append_rows",
    "heads_line",
    "metrics_text",
    "write_config",
    "run_data_dir",
    "run_image_size",
    "run_info",
    "run_test_set",
    "other_test_set",
    "check_other_dataset",
    "DataNotFound",
    "recorded_info",
    "sample_across_classes",
    "SAMPLE_SEED",
    "data_fingerprint",
    "data_changes",
    "data_digest",
    "data_digest_and_overlap",
    "split_digest",
    "load_run",
    "build_run_architecture",
    "load_weights",
    "nonfinite_tensor",
    "weights_fit",
    "build_run_model",
    "convert_run",
    "claim_run_dir",
    "SetAside",
    "event_files",
    "recover_set_aside",
    "trim_logs",
    "Run",
    "as_run",
]
