"""Training: presets, schedules, run directory, resume after kill -9, DDP, NaN, bad input."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_data import write_idx
from safetensors.torch import load_file

from attnconv.cli import main
from attnconv.config import PRESETS, TrainConfig, make_config
from attnconv.errors import AttnconvError
from attnconv.fileio import atomic_write
from attnconv.models import build_model, list_models, no_weight_decay
from attnconv.runs import load_run, load_state, read_heads, read_metrics
from attnconv.training import learning_rate, make_optimizer

REPO = Path(__file__).resolve().parents[1]
N_TRAIN, N_TEST = 256, 128


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """A tiny Fashion-MNIST look-alike (256 train / 128 test, 28x28) whose class sets the brightness."""
    folder = tmp_path_factory.mktemp("fmnist")
    rng = np.random.default_rng(0)
    for prefix, n in (("train", N_TRAIN), ("t10k", N_TEST)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 60, (n, 28, 28)) + 20 * labels[:, None, None]
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images.astype(np.uint8), gz=False)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels.astype(np.uint8), gz=False)
    return folder


# A model small enough for many runs in the test budget; it keeps dropout (0.1) so
# that resume must restore the RNG state.
TINY_MODEL = ["--model", "sa-quadratic", "--hidden", "16", "--layers", "1", "--heads", "4",
              "--intermediate", "32", "--downsample", "4", "--dropout", "0.1"]


def tiny_args(out, data_dir, *extra) -> list[str]:
    return ["train", *TINY_MODEL, "--dataset", "fashion-mnist", "--data-dir", str(data_dir),
            "--epochs", "2", "--batch-size", "32", "--workers", "1", "--no-progress", "--out", str(out), *extra]


def cli_subprocess(*args, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def stop_after_checkpoint(monkeypatch, step: int) -> None:
    """The next `train` stops with a KeyboardInterrupt right after its checkpoint at `step` (a Ctrl-C there)."""
    from attnconv.training.checkpoint import Checkpointer

    original = Checkpointer.save

    def checkpoint_then_stop(self, model, optimizer, progress):
        original(self, model, optimizer, progress)
        if progress.step == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpointer, "save", checkpoint_then_stop)


def weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(str(Path(run_dir) / "model.safetensors"))


def assert_bit_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs (max {(a[k] - b[k]).abs().max().item():.3g})"


# ---------------------------------------------------------------------------------- config


def test_paper_presets_use_the_papers_recipe():
    paper = {k: v for k, v in PRESETS.items() if k.startswith("paper-")}
    assert sorted(paper) == sorted(f"paper-cifar10-{m}" for m in
                                   ("resnet18", "sa-quadratic", "sa-quadratic-aniso", "sa-learned",
                                    "sa-learned-content"))
    for name, cfg in paper.items():
        assert (cfg.dataset, cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.batch_size, cfg.epochs,
                cfg.augment) == ("cifar10", "sgd", 0.1, 0.9, 1e-4, 100, 300, True), name
        assert cfg.model == name.removeprefix("paper-cifar10-")
        assert cfg.schedule == ("multistep" if cfg.model == "resnet18" else "warmup-cosine"), name
        if cfg.schedule == "warmup-cosine":
            assert cfg.warmup == 0.05
        assert cfg.model_overrides == {}  # the models' defaults are the paper's


def test_fmnist_sgd_preset_is_the_attention_preset_under_the_papers_optimizer():
    sgd, adamw, paper = (PRESETS[k] for k in ("fmnist-sa-quadratic-sgd", "fmnist-sa-quadratic",
                                               "paper-cifar10-sa-quadratic"))
    assert sgd.model_overrides == adamw.model_overrides and sgd.dataset == adamw.dataset
    assert (sgd.epochs, sgd.augment) == (adamw.epochs, adamw.augment)
    fields = ("optimizer", "lr", "momentum", "weight_decay", "batch_size", "schedule", "warmup")
    assert [getattr(sgd, f) for f in fields] == [getattr(paper, f) for f in fields]


def test_every_preset_names_a_registered_model_and_validates():
    for name, cfg in PRESETS.items():
        assert cfg.model in list_models(), name
        make_config(preset=name).validate()


def test_explicit_values_override_the_preset_and_merge_model_overrides():
    cfg = make_config(preset="fmnist-sa-quadratic", epochs=3, lr=None, model_overrides={"layers": 1, "heads": None})
    base = PRESETS["fmnist-sa-quadratic"]
    assert cfg.epochs == 3 and cfg.lr == base.lr and cfg.preset == "fmnist-sa-quadratic"
    assert cfg.model_overrides == {**base.model_overrides, "layers": 1}


def test_make_config_needs_model_and_dataset_without_preset():
    with pytest.raises(AttnconvError, match="missing dataset: give it, or a preset"):
        make_config(model="resnet18")
    with pytest.raises(AttnconvError, match="unknown preset 'nope'"):
        make_config(preset="nope")


def test_config_round_trips_through_a_dict():
    cfg = make_config(preset="paper-cifar10-resnet18", seed=3)
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(AttnconvError, match="bogus"):
        TrainConfig.from_dict({**cfg.to_dict(), "bogus": 1})


def test_paper_multistep_drops_at_epochs_80_150_250_of_300():
    cfg = PRESETS["paper-cifar10-resnet18"]
    steps_per_epoch = 50_000 // cfg.batch_size
    total = cfg.epochs * steps_per_epoch
    for epoch, lr in ((0, 0.1), (79, 0.1), (80, 0.01), (149, 0.01), (150, 1e-3), (249, 1e-3), (250, 1e-4)):
        for step in (epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch - 1):
            assert learning_rate(cfg, step, total) == pytest.approx(lr), (epoch, step)


def test_warmup_cosine_rises_linearly_then_decays_to_zero():
    cfg = PRESETS["paper-cifar10-sa-quadratic"]
    total = 1000
    lrs = [learning_rate(cfg, s, total) for s in range(total)]
    assert lrs[0] == pytest.approx(0.1 / 50) and lrs[49] == pytest.approx(0.1)  # 5% of 1000 steps
    assert all(b > a for a, b in zip(lrs[:49], lrs[1:50]))
    assert all(b <= a for a, b in zip(lrs[50:], lrs[51:]))
    assert lrs[50 + 475] == pytest.approx(0.05, rel=1e-2)  # half-way through the cosine
    assert lrs[-1] < 1e-5


def test_no_weight_decay_on_attention_centers_and_widths():
    model = build_model("sa-quadratic", hidden=16, heads=4, layers=2, intermediate=16)
    cfg = make_config(model="sa-quadratic", dataset="cifar10", weight_decay=5e-4)
    opt = make_optimizer(model, cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    free = {names[id(p)] for g in opt.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    decayed = {names[id(p)] for g in opt.param_groups if g["weight_decay"] == 5e-4 for p in g["params"]}
    assert free == no_weight_decay(model) and free
    assert all(n.endswith(("centers", "widths")) for n in free)
    assert decayed | free == set(names.values()) and not decayed & free


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "f.bin"
    atomic_write(target, lambda tmp: tmp.write_bytes(b"old"))

    def crash(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(target, crash)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]  # no temporary left behind


def test_read_metrics_skips_a_row_cut_short_by_a_crash(tmp_path):
    header = "epoch,step,train_loss,train_acc,test_loss,test_acc,seconds,images_per_s,lr\n"
    (tmp_path / "metrics.csv").write_text(header + "1,8,2.0,0.2,1.9,0.3,0.5,512.0,0.1\n2,16,1.5,0.")
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1]
    assert read_metrics(tmp_path, limit=0) == []


# ---------------------------------------------------------------------------------- runs


def test_train_writes_a_complete_run_directory(tmp_path, data_dir):
    out = tmp_path / "run"
    assert main(tiny_args(out, data_dir, "--checkpoint-every", "5")) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "heads.jsonl", "metrics.csv", "model.safetensors",
                                                     "state.pt", "steps.csv"]
    meta = json.loads((out / "config.json").read_text())
    assert meta["config"]["model"] == "sa-quadratic" and meta["config"]["model_overrides"]["in_channels"] == 1
    assert meta["steps_per_epoch"] == N_TRAIN // 32 and meta["total_steps"] == 2 * (N_TRAIN // 32)
    assert meta["torch"] == torch.__version__ and meta["parameters"] > 0 and meta["created"]
    rows = read_metrics(out)
    assert [r["epoch"] for r in rows] == [1, 2] and [r["step"] for r in rows] == [8, 16]
    header = (out / "metrics.csv").read_text().splitlines()[0]
    assert header == "epoch,step,train_loss,train_acc,test_loss,test_acc,seconds,images_per_s,lr"
    assert all(0 <= r["test_acc"] <= 1 and r["images_per_s"] > 0 and math.isfinite(r["train_loss"]) for r in rows)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]  # it learns the brightness of each class
    state = torch.load(out / "state.pt", weights_only=True)
    assert state["progress"]["step"] == 16 and state["progress"]["finished"]
    model, cfg = load_run(out)
    assert cfg.model == "sa-quadratic"
    assert_bit_identical({k: v for k, v in model.state_dict().items()}, weights(out))
    # The heads at initialization and after each epoch; the last snapshot is of the final weights.
    snaps = read_heads(out)
    assert [(s["epoch"], s["step"]) for s in snaps] == [(0, 0), (1, 8), (2, 16)]
    assert [len(s["layers"]) for s in snaps] == [1, 1, 1] and all(len(s["layers"][0]) == 4 for s in snaps)
    assert torch.allclose(torch.tensor([h["center"] for h in snaps[-1]["layers"][0]], dtype=torch.float64),
                          model.attention_layers[0].encoding.centers.double(), atol=1e-12, rtol=0)
    assert snaps[0]["layers"] != snaps[-1]["layers"]  # the heads moved
    # Resuming a finished run does nothing and succeeds.
    assert main(tiny_args(out, data_dir, "--checkpoint-every", "5", "--resume")) == 0
    assert len(read_metrics(out)) == 2 and len(read_heads(out)) == 3


def test_max_steps_stops_mid_epoch_and_logs_the_partial_epoch(tmp_path, data_dir):
    out = tmp_path / "run"
    assert main(tiny_args(out, data_dir, "--max-steps", "11")) == 0
    rows = read_metrics(out)
    assert [(r["epoch"], r["step"]) for r in rows] == [(1, 8), (2, 11)]
    assert [(s["epoch"], s["step"]) for s in read_heads(out)] == [(0, 0), (1, 8), (2, 11)]
    assert load_state(out / "state.pt")["progress"]["finished"]


def test_crop_pad_and_flip_reach_the_batches(tmp_path, data_dir):
    """--crop-pad 0 --no-flip under --augment trains exactly as --no-augment; a crop or a flip alone does not."""
    runs = {}
    for name, flags in {"none": ["--no-augment"], "zero": ["--augment", "--crop-pad", "0", "--no-flip"],
                        "crop": ["--augment", "--crop-pad", "2", "--no-flip"],
                        "flip": ["--augment", "--crop-pad", "0", "--flip"]}.items():
        assert main(tiny_args(tmp_path / name, data_dir, "--max-steps", "2", *flags)) == 0
        runs[name] = weights(tmp_path / name)
        config = json.loads((tmp_path / name / "config.json").read_text())["config"]
        assert (config["crop_pad"], config["flip"]) == {"none": (4, True), "zero": (0, False), "crop": (2, False),
                                                        "flip": (0, True)}[name]
    assert_bit_identical(runs["none"], runs["zero"])
    for name in ("crop", "flip"):
        assert any(not torch.equal(runs[name][k], runs["none"][k]) for k in runs["none"]), name


@pytest.mark.parametrize("precision", [(), ("--amp",)], ids=["float32", "bf16"])
def test_resume_mid_epoch_replays_exactly(tmp_path, data_dir, monkeypatch, capsys, precision):
    """An interruption right after the mid-epoch checkpoint at step 10 (epoch 2, batch 2 of 8); in bf16 too.

    On a CPU without native bfloat16 (AVX2 only) --amp is refused before any work instead: that is
    what this case checks there (a CPU feature, not a missing tool, so it never skips)."""
    from attnconv.precision import bf16_supported

    ref = tmp_path / "ref"
    if precision and not bf16_supported("cpu"):
        assert main(tiny_args(ref, data_dir, *precision)) == 2
        assert "--amp: cpu here has no native bfloat16 support" in capsys.readouterr().err
        assert not ref.exists()
        return
    assert main(tiny_args(ref, data_dir, *precision)) == 0

    stop_after_checkpoint(monkeypatch, 10)
    out = tmp_path / "run"
    assert main(tiny_args(out, data_dir, "--checkpoint-every", "5", *precision)) == 130
    progress = load_state(out / "state.pt")["progress"]
    assert (progress["step"], progress["epoch"], progress["batch"]) == (10, 1, 2)
    monkeypatch.undo()
    assert main(tiny_args(out, data_dir, "--checkpoint-every", "5", "--resume", *precision)) == 0
    assert_bit_identical(weights(ref), weights(out))
    assert json.loads((out / "config.json").read_text())["precision"].startswith("bfloat16" if precision else "float32")
    ref_rows, rows = read_metrics(ref), read_metrics(out)
    assert len(rows) == 2  # epoch 1 is not logged twice
    assert (out / "heads.jsonl").read_bytes() == (ref / "heads.jsonl").read_bytes()
    for a, b in zip(ref_rows, rows):  # the interrupted epoch's training sums were carried over
        assert {k: v for k, v in a.items() if k not in ("seconds", "images_per_s")} == \
            {k: v for k, v in b.items() if k not in ("seconds", "images_per_s")}


def test_heads_logged_after_the_last_checkpoint_are_not_logged_twice(tmp_path, data_dir, monkeypatch):
    """Killed after epoch 1's heads were appended but before its checkpoint: the resumed run
    replays epoch 1 and ends with the same heads.jsonl as an uninterrupted one."""
    ref = tmp_path / "ref"
    assert main(tiny_args(ref, data_dir)) == 0

    from attnconv.training.logs import HeadsLog

    original = HeadsLog.append

    def record_then_die(self, epoch, progress):
        original(self, epoch, progress)
        if epoch == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(HeadsLog, "append", record_then_die)
    out = tmp_path / "run"
    assert main(tiny_args(out, data_dir, "--checkpoint-every", "5")) == 130
    assert [s["epoch"] for s in read_heads(out)] == [0, 1]
    progress = load_state(out / "state.pt")["progress"]
    assert (progress["step"], progress["snapshots"]) == (5, 1)  # the checkpoint knows of the first only
    monkeypatch.undo()
    assert main(tiny_args(out, data_dir, "--checkpoint-every", "5", "--resume")) == 0
    assert (out / "heads.jsonl").read_bytes() == (ref / "heads.jsonl").read_bytes()
    assert [s["epoch"] for s in read_heads(out)] == [0, 1, 2]


def test_cnn_runs_record_no_heads(tmp_path, data_dir):
    out = tmp_path / "run"
    args = tiny_args(out, data_dir, "--max-steps", "2")
    cut = args.index("--model")
    args[cut:cut + len(TINY_MODEL)] = ["--model", "resnet18", "--width", "4"]
    assert main(args) == 0
    assert not (out / "heads.jsonl").exists() and read_heads(out) == []


@pytest.mark.slow
def test_resume_after_sigkill_reaches_bit_identical_weights(tmp_path, data_dir):
    # 32 steps per epoch, 4 epochs, a checkpoint every 5 steps: long enough that the
    # kill lands well before the end, and most checkpoints fall mid-epoch.
    extra = ("--batch-size", "8", "--epochs", "4", "--checkpoint-every", "5")
    ref, out = tmp_path / "ref", tmp_path / "run"

    proc = cli_subprocess("-m", "attnconv", *tiny_args(out, data_dir, *extra))
    deadline = time.monotonic() + 120
    while not (out / "state.pt").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = load_state(out / "state.pt")["progress"]
    assert 0 < killed_at["step"] < 4 * 32

    assert main(tiny_args(ref, data_dir, *extra)) == 0  # the uninterrupted reference
    resumed = cli_subprocess("-m", "attnconv", *tiny_args(out, data_dir, *extra), "--resume")
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert f"resuming {out} at step {killed_at['step']}" in stderr
    assert_bit_identical(weights(ref), weights(out))
    assert len(read_metrics(out)) == 4
    assert (out / "heads.jsonl").read_bytes() == (ref / "heads.jsonl").read_bytes()


@pytest.mark.slow
def test_two_ddp_processes_match_one_process_with_the_same_global_batch(tmp_path, data_dir):
    """2 gloo processes x 16 images vs 1 process x 32, for 16 SGD steps (no dropout, no BatchNorm).

    Both compute the gradient of the same global-batch mean; they differ only in float32
    summation order (two half-batch means all-reduced and averaged vs one mean over 32),
    about 1e-7 relative per step. Measured after 16 steps: at most 4e-6 of a tensor's
    largest entry. The tolerance, 1e-4 of the largest entry, leaves 25x margin and is
    far below what a real mistake gives (a missed shard or a gradient not averaged
    changes the weights by 1e-2 or more). Dropout would differ (each rank draws its own
    masks) and so would BatchNorm (statistics per shard), hence a model without either.
    """
    common = [*TINY_MODEL, "--dropout", "0", "--attn-dropout", "0", "--dataset", "fashion-mnist",
              "--data-dir", str(data_dir), "--epochs", "2", "--batch-size", "32", "--workers", "1", "--no-progress"]
    # --standalone: torchrun binds its own free rendezvous port (no race with other tests' ports).
    proc = cli_subprocess("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "attnconv", "train", *common, "--out", str(tmp_path / "ddp"))
    assert main(["train", *common, "--out", str(tmp_path / "one")]) == 0
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert stdout.count("test accuracy") == 1  # rank 0 alone reports
    a, b = weights(tmp_path / "one"), weights(tmp_path / "ddp")
    assert a.keys() == b.keys()
    for k in a:
        scale = a[k].abs().max().item()
        assert (a[k] - b[k]).abs().max().item() <= 1e-4 * scale + 1e-7, k
    assert not all(torch.equal(a[k], b[k]) for k in a)  # two processes really ran a different reduction
    meta = json.loads((tmp_path / "ddp" / "config.json").read_text())
    assert meta["world_size"] == 2
    assert len(read_metrics(tmp_path / "ddp")) == 2


# ---------------------------------------------------------------------------------- failures


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, data_dir, capsys, monkeypatch):
    out = tmp_path / "run"
    # lr 1e30: step 1 (finite loss) gives weights ~1e30, whose forward overflows: that step's checkpoint, within the
    # epoch, is evaluated on the first test images first (round 59: it was kept as "the last good checkpoint").
    code = main(tiny_args(out, data_dir, "--lr", "1e30", "--schedule", "constant", "--checkpoint-every", "1"))
    err = "".join(line for line in capsys.readouterr().err.splitlines(True) if not line.startswith("preset: "))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: test loss on the first 64 test images became non-finite (NaN or inf) at step 1")
    assert "no checkpoint was written yet" in err and "--lr" in err and not (out / "state.pt").exists()

    from attnconv.training import loop

    step = loop.train_step

    def diverging(model, optimizer, x, y, autocast):  # a sound first step, a NaN loss at the second
        loss, logits = step(model, optimizer, x, y, autocast)
        diverging.calls += 1
        return (loss * float("nan") if diverging.calls == 2 else loss), logits

    diverging.calls = 0
    monkeypatch.setattr(loop, "train_step", diverging)
    code = main(tiny_args(tmp_path / "good", data_dir, "--checkpoint-every", "1"))
    err = "".join(line for line in capsys.readouterr().err.splitlines(True) if not line.startswith("preset: "))
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: loss became non-finite"), err
    assert "at step 2" in err and "last good checkpoint (step 1)" in err and "--lr" in err
    assert load_state(tmp_path / "good" / "state.pt")["progress"]["step"] == 1
    model, _ = load_run(tmp_path / "good")
    assert all(torch.isfinite(t).all() for t in model.state_dict().values())


def _bad_input_cases(tmp: Path, data_dir: Path) -> dict[str, tuple[list[str], str]]:
    (tmp / "a-file").write_text("x")
    existing = tmp / "existing"
    existing.mkdir()
    (existing / "config.json").write_text("{}")
    base = tiny_args(tmp / "out", data_dir)
    swap = lambda old, new: [new if a == old else a for a in base]  # noqa: E731
    return {
        "unknown model": (swap("sa-quadratic", "no-such-model"), "unknown model 'no-such-model'"),
        "unknown preset": (["train", "--preset", "imagenet", "--out", str(tmp / "o")], "unknown preset 'imagenet'"),
        "negative epochs": (swap("2", "-1"), "--epochs -1"),
        "zero lr": ([*base, "--lr", "0"], "--lr 0"),
        "not a number": ([*base, "--lr", "fast"], "--lr"),
        "bad schedule": ([*base, "--schedule", "linear"], "--schedule"),
        "bad warmup": ([*base, "--warmup", "1.5"], "--warmup 1.5"),
        "unwritable out": (swap(str(tmp / "out"), str(tmp / "a-file" / "run")), "cannot write"),
        "missing data": (swap(str(data_dir), str(tmp / "nowhere")), "nowhere"),
        "no cuda": ([*base, "--device", "cuda"], "--device cuda"),
        "batch too large": ([*base, "--batch-size", "1000"], "--batch-size 1000"),
        "model option the model lacks": ([*base, "--width", "8"], "width"),
        "channels that do not fit the data": ([*base, "--in-channels", "3"], "--in-channels 3"),
        "out holds a config.json attnconv did not write": (swap(str(tmp / "out"), str(existing)),
                                                            "is not an attnconv run"),
        "missing model": (["train", "--dataset", "cifar10", "--out", str(tmp / "o")], "--model"),
    }


def test_bad_input_gives_one_line_and_exit_2(tmp_path, data_dir, capsys):
    cases = _bad_input_cases(tmp_path, data_dir)
    if torch.cuda.is_available():
        del cases["no cuda"]
    for name, (argv, expected) in cases.items():
        code = main(argv)
        captured = capsys.readouterr()
        assert code == 2, name
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, (name, captured.err)
        assert expected in captured.err, (name, captured.err)
        assert "Traceback" not in captured.err
    assert not (tmp_path / "out").exists()  # nothing written, not even an empty run directory


def test_resume_with_a_different_config_is_refused(tmp_path, data_dir, capsys):
    out = tmp_path / "run"
    assert main(tiny_args(out, data_dir, "--max-steps", "2")) == 0
    capsys.readouterr()
    assert main(tiny_args(out, data_dir, "--max-steps", "2", "--lr", "0.5", "--resume")) == 2
    err = capsys.readouterr().err
    assert "different config" in err and "lr: 0.002 -> 0.5" in err and err.count("\n") == 1
    # Where it runs may change: the saved config is the base when only --out is given.
    assert main(["train", "--out", str(out), "--resume", "--workers", "1", "--no-progress"]) == 0


def test_bad_input_from_the_command_line_has_no_traceback(tmp_path, data_dir):
    proc = cli_subprocess("-m", "attnconv", *tiny_args(tmp_path / "out", data_dir, "--epochs", "-3"))
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert stderr.startswith("error: --epochs -3") and stderr.count("\n") == 1 and "Traceback" not in stderr


def test_load_run_reports_missing_and_corrupt_files(tmp_path, data_dir):
    with pytest.raises(AttnconvError, match="not a run directory"):
        load_run(tmp_path)
    out = tmp_path / "run"
    assert main(tiny_args(out, data_dir, "--max-steps", "1")) == 0
    (out / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(AttnconvError, match="corrupt weights"):
        load_run(out)
    (out / "state.pt").write_bytes(b"garbage")
    with pytest.raises(AttnconvError, match="cannot read the training state"):
        load_state(out / "state.pt")
    (out / "config.json").write_text("{not json")
    with pytest.raises(AttnconvError, match="corrupt run config"):
        load_run(out)


def test_amp_is_refused_where_bf16_is_emulated(monkeypatch):
    import attnconv.precision as P

    monkeypatch.setattr(P.torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False, raising=False)
    assert not P.bf16_supported("cpu")
    with pytest.raises(AttnconvError, match="no native bfloat16"):
        P.check_amp(True, "cpu")
    P.check_amp(False, "cpu")
