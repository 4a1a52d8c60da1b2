"""What training logs: ETA lines, counts under --max-steps, steps.csv (resume-exact), --tensorboard."""

import math
import os
import re
import sys

import pytest
from test_train import data_dir, tiny_args  # noqa: F401  (data_dir is a fixture)

from attnconv.cli import main
from attnconv.config import TrainConfig, make_config
from attnconv.errors import AttnconvError
from attnconv.runs import STEPS_COLUMNS, load_state, read_config, read_metrics, read_steps
from attnconv.training import learning_rate, train
from attnconv.training.logs import StepsLog
from attnconv.training.progress import ProgressLog

TIMINGS = ("images_per_s", "seconds")  # the columns of steps.csv that differ from run to run


def logged_args(out, data_dir, *extra) -> list[str]:  # noqa: F811
    """tiny_args with progress on (stderr is not a terminal under pytest: a line every --log-every steps)."""
    args = tiny_args(out, data_dir, *extra)
    args.remove("--no-progress")
    return args


def without_timings(rows):
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]


def event_accumulator():
    """tensorboard's EventAccumulator; the test is skipped without tensorboard, except under CI, where it fails."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("tensorboard is not installed; `make test` installs it (pip install -e '.[test]')")
        pytest.skip("tensorboard is not installed (pip install tensorboard)")
    return EventAccumulator


def scalars(board_dir, tag) -> list[tuple[int, float]]:
    acc = event_accumulator()(str(board_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_progress_lines_and_epoch_lines_show_the_run_eta(tmp_path, data_dir, capsys):  # noqa: F811
    assert main(logged_args(tmp_path / "run", data_dir, "--log-every", "2")) == 0
    err = capsys.readouterr().err.splitlines()
    steps = [line for line in err if line.startswith("step ")]
    epochs = [line for line in err if line.startswith("epoch ")]
    assert [int(line.split()[1].split("/")[0]) for line in steps] == list(range(2, 17, 2))
    assert all(re.search(r"  ETA \d+(s|m\d\ds|h\d\dm)$", line) for line in steps + epochs), steps + epochs
    assert [line.split()[1] for line in epochs] == ["1/2", "2/2"]
    assert epochs[-1].endswith("ETA 0s")  # nothing left after the last epoch
    # one estimate of the whole run after its first 5 steps, before any epoch line
    estimates = [i for i, line in enumerate(err) if line.startswith("estimated time: ")]
    assert len(estimates) == 1 and estimates[0] < err.index(epochs[0]), err
    assert re.match(r"estimated time: \d+(s|m\d\ds|h\d\dm) for the 11 steps left \(", err[estimates[0]])


def test_max_steps_counts_the_steps_and_epochs_that_will_run(tmp_path, data_dir, capsys, monkeypatch):  # noqa: F811
    made = []
    original = ProgressLog.__init__

    def record(self, mode, **kw):
        made.append((kw["total_steps"], kw["epoch_steps"], kw["desc"]))
        original(self, mode, **kw)

    monkeypatch.setattr(ProgressLog, "__init__", record)
    # 8 steps per epoch: --max-steps 11 of 5 epochs runs 2 epochs, the second 3 steps long
    assert main(logged_args(tmp_path / "run", data_dir, "--epochs", "5", "--max-steps", "11", "--log-every", "2")) == 0
    err = capsys.readouterr().err.splitlines()
    assert made == [(11, 8, "epoch 1/2"), (11, 3, "epoch 2/2")]
    steps = [line.split()[1:4] for line in err if line.startswith("step ")]
    assert steps == [[f"{s}/11", "epoch", f"{1 + (s > 8)}/2"] for s in (2, 4, 6, 8, 10)]
    assert [line.split()[1] for line in err if line.startswith("epoch ")] == ["1/2", "2/2"]


def test_steps_csv_has_a_row_every_log_every_steps(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "run"
    assert main(tiny_args(out, data_dir, "--log-every", "3")) == 0
    assert (out / "steps.csv").read_text().splitlines()[0] == ",".join(STEPS_COLUMNS) == \
        "step,epoch,loss,accuracy,lr,images_per_s,seconds"
    rows = read_steps(out)
    assert [(r["step"], r["epoch"]) for r in rows] == [(3, 1), (6, 1), (9, 2), (12, 2), (15, 2)]  # 16 steps
    cfg = TrainConfig.from_dict(read_config(out)["config"])
    for r in rows:
        assert math.isfinite(r["loss"]) and 0 <= r["accuracy"] <= 1 and r["images_per_s"] > 0
        assert r["lr"] == pytest.approx(learning_rate(cfg, int(r["step"]) - 1, 16), rel=1e-12)
    assert [r["seconds"] for r in rows] == sorted(r["seconds"] for r in rows)  # training time so far
    # Each row is the mean over the steps since the previous one: two rows per epoch average to the epoch's.
    out4 = tmp_path / "run4"
    assert main(tiny_args(out4, data_dir, "--log-every", "4")) == 0
    rows, epochs = read_steps(out4), read_metrics(out4)
    assert [r["step"] for r in rows] == [4, 8, 12, 16]
    for e, epoch in enumerate(epochs):
        half = rows[2 * e: 2 * e + 2]
        assert epoch["train_loss"] == pytest.approx(sum(r["loss"] for r in half) / 2, rel=1e-12)
        assert epoch["train_acc"] == pytest.approx(sum(r["accuracy"] for r in half) / 2, rel=1e-12)


def interrupt_after_the_row_of_step_12(monkeypatch, out, data_dir, extra) -> None:  # noqa: F811
    """Train into `out`, killed (Ctrl-C) right after steps.csv's row of step 12; the patch is undone after."""
    original = StepsLog.append

    def log_then_die(self, progress, lr, board=None):
        original(self, progress, lr, board)
        if progress.step == 12:
            raise KeyboardInterrupt

    monkeypatch.setattr(StepsLog, "append", log_then_die)
    assert main(tiny_args(out, data_dir, *extra)) == 130
    monkeypatch.undo()


@pytest.mark.parametrize("again", [("--log-every", "3", "--checkpoint-every", "5"), ("--checkpoint-every", "5")],
                         ids=["flag-given-again", "flag-left-out"])
def test_resume_after_an_interruption_gives_the_same_steps_csv(tmp_path, data_dir, monkeypatch, again):  # noqa: F811
    """Killed right after the row of step 12, whose last checkpoint is step 10: the resumed run drops
    that row and logs it again, and its sums (steps 10 to 12) span the checkpoint. A resume without
    --log-every keeps the run's interval (config.json "log_every"; it fell back to 100 and logged no row)."""
    extra = ("--log-every", "3", "--checkpoint-every", "5")
    ref, out = tmp_path / "ref", tmp_path / "run"
    assert main(tiny_args(ref, data_dir, *extra)) == 0

    interrupt_after_the_row_of_step_12(monkeypatch, out, data_dir, extra)
    assert [r["step"] for r in read_steps(out)] == [3, 6, 9, 12]
    progress = load_state(out / "state.pt")["progress"]
    assert (progress["step"], progress["step_rows"]) == (10, 3)  # the checkpoint knows of 3 rows
    assert read_config(out)["log_every"] == 3
    assert main(tiny_args(out, data_dir, *again, "--resume")) == 0
    assert without_timings(read_steps(out)) == without_timings(read_steps(ref))
    assert [r["step"] for r in read_steps(out)] == [3, 6, 9, 12, 15]


def test_overwrite_replaces_steps_csv_and_the_tensorboard_folder(tmp_path, data_dir, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert main(tiny_args(out, data_dir, "--log-every", "3")) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "heads.jsonl", "metrics.csv", "model.safetensors",
                                                     "state.pt", "steps.csv"]
    (out / "tensorboard").mkdir()  # an earlier --tensorboard run's event files
    (out / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"old")
    (out / "notes.txt").write_text("keep me")
    capsys.readouterr()
    assert main(tiny_args(out, data_dir, "--log-every", "4", "--epochs", "1", "--overwrite")) == 0
    err = capsys.readouterr().err
    assert "--overwrite: replacing the run" in err and "steps.csv" in err and "tensorboard" in err
    assert [r["step"] for r in read_steps(out)] == [4, 8]  # the old rows are gone, not mixed in
    assert not (out / "tensorboard").exists() and (out / "notes.txt").read_text() == "keep me"
    # Only the event files in tensorboard/ are the run's (a user's files there stay, and a "tensorboard" that
    # is a file is left alone): tests/test_run_reliability.py.


def test_tensorboard_writes_scalars_readable_by_event_accumulator(tmp_path, data_dir, monkeypatch):  # noqa: F811
    """The scalars of steps.csv and metrics.csv, once each, also after an interruption and --resume."""
    event_accumulator()
    out = tmp_path / "run"
    extra = ("--log-every", "3", "--checkpoint-every", "5", "--tensorboard")
    interrupt_after_the_row_of_step_12(monkeypatch, out, data_dir, extra)
    assert main(tiny_args(out, data_dir, *extra, "--resume")) == 0
    board, rows, epochs = out / "tensorboard", read_steps(out), read_metrics(out)
    assert board.is_dir() and any(p.name.startswith("events.out.tfevents") for p in board.iterdir())
    for tag, column in (("train/loss", "loss"), ("train/accuracy", "accuracy"), ("lr", "lr")):
        assert scalars(board, tag) == [(int(r["step"]), pytest.approx(r[column], rel=1e-6)) for r in rows], tag
    for tag, column in (("test/loss", "test_loss"), ("test/accuracy", "test_acc")):
        assert scalars(board, tag) == [(int(r["step"]), pytest.approx(r[column], rel=1e-6)) for r in epochs], tag


def test_missing_tensorboard_is_one_error_line_before_any_work(tmp_path, data_dir, capsys, monkeypatch):  # noqa: F811
    for name in ("torch.utils.tensorboard", "tensorboard"):
        monkeypatch.setitem(sys.modules, name, None)  # `import` of either now fails
    out = tmp_path / "run"
    assert main(tiny_args(out, data_dir, "--tensorboard")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --tensorboard") and "pip install tensorboard" in err
    assert not out.exists()
    with pytest.raises(AttnconvError, match="pip install tensorboard"):
        train(make_config(model="sa-quadratic", dataset="fashion-mnist"), out, tensorboard=True)
    assert not out.exists()
