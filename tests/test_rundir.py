"""The run directory contract: train writes only where it may, one writer at a time, never a user's file."""

import dataclasses
import errno
import io
import json
import os
import re
import shlex
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_runs import unrecord
from test_train import data_dir, tiny_args  # noqa: F401  (data_dir is a fixture)

import attnconv.runs as runs
import attnconv.training.checkpoint as checkpoint
import attnconv.training.loop as loop
from attnconv.cli import main
from attnconv.errors import AttnconvError
from attnconv.fileio import LOCK_FILE, TMP_SUFFIX, DirectoryLock, atomic_write, is_temporary
from attnconv.runs import convert_run, load_run, load_state
from attnconv.training.checkpoint import Checkpointer
from attnconv.training.progress import ProgressLog, format_duration

RUN_FILES = ["config.json", "heads.jsonl", "metrics.csv", "model.safetensors", "state.pt", "steps.csv"]


def one_epoch(out, data_dir, *extra):  # noqa: F811
    return tiny_args(out, data_dir, "--epochs", "1", *extra)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_train_refuses_a_folder_of_user_files_and_touches_nothing(tmp_path, data_dir, capsys):  # noqa: F811
    out = tmp_path / "mine"
    out.mkdir()
    for name, text in (("notes.txt", "my notes"), ("metrics.csv", "a,b\n1,2\n"), ("model.safetensors", "x"),
                       (".name.tmp-x", "hidden")):
        (out / name).write_text(text)
    before = snapshot(out)
    assert main(one_epoch(out, data_dir)) == 2
    err = capsys.readouterr().err
    assert "is not empty and holds no attnconv run" in err and "notes.txt" in err
    assert snapshot(out) == before  # nothing modified, nothing deleted, no lock file left
    # --resume and --overwrite do not make a stranger's folder a run either
    assert main(one_epoch(out, data_dir, "--overwrite")) == 2
    assert main(one_epoch(out, data_dir, "--resume")) == 2
    assert snapshot(out) == before


def test_train_into_an_empty_folder_and_the_lock_file_is_gone_after(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "empty"
    out.mkdir()
    assert main(one_epoch(out, data_dir)) == 0
    assert sorted(p.name for p in out.iterdir()) == RUN_FILES


def test_existing_run_needs_resume_or_overwrite_and_overwrite_keeps_other_files(tmp_path, data_dir, capsys):  # noqa: F811,E501
    out = tmp_path / "run"
    assert main(one_epoch(out, data_dir)) == 0
    (out / "notes.txt").write_text("keep me")
    capsys.readouterr()
    assert main(one_epoch(out, data_dir, "--seed", "1")) == 2
    assert "already holds an attnconv run" in capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["config"]["seed"] == 0
    assert main(one_epoch(out, data_dir, "--seed", "1", "--overwrite")) == 0
    err = capsys.readouterr().err
    assert "--overwrite: replacing the run in" in err and "config.json" in err
    assert json.loads((out / "config.json").read_text())["config"]["seed"] == 1
    assert (out / "notes.txt").read_text() == "keep me"
    assert [r["epoch"] for r in runs.read_metrics(out)] == [1]  # the old run's rows are gone, not mixed in
    assert main(one_epoch(out, data_dir, "--resume", "--overwrite")) == 2


def test_a_second_writer_fails_at_once(tmp_path, data_dir, capsys):  # noqa: F811
    out = tmp_path / "busy"
    out.mkdir()
    with DirectoryLock(out):  # another process writing there (flock conflicts across open files)
        assert main(one_epoch(out, data_dir)) == 2
        assert "another attnconv process is writing there" in capsys.readouterr().err
        assert list(out.iterdir()) == []  # the lock is on the directory: no lock file
    assert not (out / LOCK_FILE).exists()


def test_deleting_or_replacing_files_cannot_let_a_second_writer_in(tmp_path, data_dir, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert main(one_epoch(out, data_dir)) == 0
    with DirectoryLock(out):  # a training run in progress
        for p in out.iterdir():
            p.unlink()  # a user deletes everything in the run, the lock file of old versions included
        (out / LOCK_FILE).write_text("")
        assert main(one_epoch(out, data_dir, "--resume")) == 2
        assert "another attnconv process is writing there" in capsys.readouterr().err
        with pytest.raises(AttnconvError, match="another attnconv process"):
            DirectoryLock(out).acquire()


def test_a_lock_file_that_is_a_dangling_symlink_creates_nothing_outside(tmp_path, data_dir):  # noqa: F811
    out, outside = tmp_path / "run", tmp_path / "elsewhere" / "victim"
    out.mkdir()
    (out / LOCK_FILE).symlink_to(outside)
    with DirectoryLock(out):
        pass
    assert not outside.exists() and not outside.parent.exists()
    assert (out / LOCK_FILE).is_symlink()  # a link is never followed, nor removed


def test_a_stale_lock_file_from_a_killed_process_does_not_block_resume(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "run"
    assert main(one_epoch(out, data_dir)) == 0
    (out / LOCK_FILE).write_text("")  # what a SIGKILLed writer leaves: the file, but no lock on it
    assert main(one_epoch(out, data_dir, "--resume")) == 0  # takes the lock: the run is already finished
    assert [r["epoch"] for r in runs.read_metrics(out)] == [1] and not (out / LOCK_FILE).exists()


def test_only_our_own_temporaries_are_cleaned_up(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "run"
    assert main(one_epoch(out, data_dir)) == 0
    ours = out / f".state.pt.k3j2{TMP_SUFFIX}"
    theirs = [out / ".name.tmp-x", out / ".state.pt.tmp-123", out / f".notes.txt.abc{TMP_SUFFIX}"]
    for p in [ours, *theirs]:
        p.write_text("x")
    assert main(one_epoch(out, data_dir, "--resume")) == 0
    assert not ours.exists() and all(p.read_text() == "x" for p in theirs)


def test_is_temporary_and_atomic_write_names():
    assert is_temporary(f".config.json.ab12{TMP_SUFFIX}", ("config.json",))
    assert not is_temporary(".config.json.tmp-1", ("config.json",))
    assert not is_temporary(f".other.ab{TMP_SUFFIX}", ("config.json",))


def test_atomic_write_failure_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")

    def full(tmp):
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(target, full)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
    target.unlink()
    target.mkdir()  # a folder where the file goes: the rename fails, named by the target, not by the temporary
    (target / "mine").write_text("x")
    with pytest.raises(OSError) as caught:
        atomic_write(target, lambda tmp: tmp.write_text("new"))
    assert caught.value.filename == str(target) and (target / "mine").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_resume_without_a_checkpoint_starts_again_and_writes_the_logs_anew(tmp_path, data_dir, capsys):  # noqa: F811
    """A new run stopped while its first checkpoint was written (a Ctrl-C as state.pt was renamed, a full disk)
    left logs and weights but no state.pt; `--resume` was refused as if a log had been edited. The pair is now
    written as one, so weights without state.pt mean state.pt was lost: one line with the fixes. With neither, no
    checkpoint was ever whole: the run starts again from step 0 and its logs are written anew, as a run trained
    once."""
    ref, out = tmp_path / "ref", tmp_path / "run"
    assert main(one_epoch(ref, data_dir)) == 0
    assert main(one_epoch(out, data_dir)) == 0
    (out / "state.pt").unlink()
    capsys.readouterr()
    assert main(one_epoch(out, data_dir, "--resume")) == 2  # model.safetensors: a checkpoint was whole once
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {out / 'state.pt'}: missing, while model.safetensors shows the run has checkpointed (the "
                   "two are written as one pair): it was moved or deleted; restore it from a copy of the run, or "
                   "train the run again over this one (`attnconv train` with its settings and --overwrite)"], err
    (out / "model.safetensors").unlink()  # what a first checkpoint stopped before its pair was whole leaves
    assert main(one_epoch(out, data_dir, "--resume")) == 0
    err = capsys.readouterr().err
    assert f"{out}: no checkpoint to resume from (it stopped before its first): training starts again" in err, err
    for read in (runs.read_metrics, runs.read_heads):
        drop = ("seconds", "images_per_s")
        assert [{k: v for k, v in r.items() if k not in drop} for r in read(out)] == \
            [{k: v for k, v in r.items() if k not in drop} for r in read(ref)]


def test_round_80_b_resume_where_no_run_is_names_the_folder_and_says_a_new_run_starts(tmp_path, data_dir,  # noqa: F811
                                                                                        capsys):
    """Round 80: `train --resume --out DIR` where DIR is missing or empty said "missing --model and --dataset"
    (the folder was the mistake); with those given, a new run started there without a word."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for out, where in ((tmp_path / "typo", "no such directory"), (empty, "no config.json in it")):
        assert main(["train", "--resume", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"error: --out {out} holds no run to resume ({where}); give the folder of the run to resume, "
                       "or --model and --dataset (or a --preset) to start a new run there"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"] and not any(empty.iterdir())
    assert main(one_epoch(tmp_path / "new", data_dir, "--resume")) == 0
    err = capsys.readouterr().err
    assert f"{tmp_path / 'new'}: no run to resume (no such directory): a new run starts there" in err, err


def test_atomic_write_all_replaces_a_pair_whole_or_not_at_all(tmp_path, monkeypatch):
    """learn-conv wrote its JSON, then its PNG: a full disk (or Ctrl-C) in between left the new result beside the
    old figure. `atomic_write_all` writes every temporary first; a failure keeps the old pair, and a Ctrl-C during
    the renames is delivered after the last one."""
    import signal

    from attnconv.fileio import atomic_write_all

    result, figure = tmp_path / "r.json", tmp_path / "r.png"
    result.write_text("old result")
    figure.write_text("old figure")

    def full(tmp):
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write_all([(result, lambda tmp: tmp.write_text("new result")), (figure, full)])
    assert (result.read_text(), figure.read_text()) == ("old result", "old figure")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.png"]

    replace = os.replace

    def interrupted_replace(src, dst):  # Ctrl-C between the two renames
        replace(src, dst)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "replace", interrupted_replace)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_all([(result, lambda tmp: tmp.write_text("new result")),
                          (figure, lambda tmp: tmp.write_text("new figure"))])
    assert (result.read_text(), figure.read_text()) == ("new result", "new figure")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.png"]


def test_atomic_write_all_makes_parent_folders_only_for_what_it_writes(tmp_path):
    """The output check made --out's missing parent folders, which stayed, empty, when the command then failed
    or was refused (learn-conv, report, export, explore --export; a full disk whose line said "nothing was
    written"). The check makes nothing; the write makes them, and removes them again when it fails."""
    from attnconv.errors import ParameterError
    from attnconv.fileio import atomic_write_all, check_output_file

    target = tmp_path / "a" / "b" / "r.json"
    assert check_output_file(target, "out", (".json",)) == target and not (tmp_path / "a").exists()
    (tmp_path / "a").mkdir()  # one of the two exists: only b is made, and only b goes

    def full(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write_all([(target, full)])
    assert [p.name for p in tmp_path.rglob("*")] == ["a"]
    atomic_write_all([(target, lambda tmp: tmp.write_text("{}")), (tmp_path / "c" / "r.png", lambda tmp: None)])
    assert target.read_text() == "{}" and (tmp_path / "c" / "r.png").is_file()

    through = tmp_path / "x" / "y" / ".." / "z" / "r.json"  # was refused: "x/y/..: File exists"
    check_output_file(through, "out", (".json",))
    atomic_write_all([(through, lambda tmp: tmp.write_text("{}"))])
    assert (tmp_path / "x" / "z" / "r.json").is_file() and (tmp_path / "x" / "y").is_dir()  # as mkdir -p
    with pytest.raises(OSError, match="No space left"):
        atomic_write_all([(tmp_path / "v" / "w" / ".." / "u" / "r.json", full)])
    assert not (tmp_path / "v").exists()

    (tmp_path / "file").write_text("x")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    for parent, why in (("file", "a file"), ("gone", f"a link to {tmp_path / 'nowhere'}, which does not exist")):
        with pytest.raises(ParameterError, match=re.escape(f"is {why}, not a folder")):
            check_output_file(tmp_path / parent / "sub" / "r.json", "out", (".json",))
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        with pytest.raises(ParameterError, match="is not writable"):
            check_output_file(tmp_path / "ro" / "sub" / "r.json", "out", (".json",))


def test_atomic_write_all_ctrl_c_as_a_temporary_is_made_leaves_none(tmp_path, monkeypatch):
    """A Ctrl-C right after `mkstemp` made a temporary, before it was recorded: `train` left
    `.model.safetensors.*.attnconv-tmp` (0 bytes) beside the run. Ctrl-C is held back until it is recorded."""
    import signal
    import tempfile

    from attnconv.fileio import atomic_write_all

    mkstemp = tempfile.mkstemp

    def interrupted(*args, **kwargs):
        made = mkstemp(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return made

    monkeypatch.setattr(tempfile, "mkstemp", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_all([(tmp_path / "new" / "r.json", lambda tmp: tmp.write_text("{}"))])
    assert list(tmp_path.iterdir()) == []


def test_disk_full_while_checkpointing_is_one_clear_error_and_the_last_checkpoint_survives(
        tmp_path, data_dir, monkeypatch, capsys):  # noqa: F811
    out = tmp_path / "run"
    calls = {"n": 0}
    real = checkpoint.save_checkpoint

    def fill_up(model, metadata, state, run_dir):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(model, metadata, state, run_dir)

    monkeypatch.setattr(checkpoint, "save_checkpoint", fill_up)
    assert main(tiny_args(out, data_dir, "--checkpoint-every", "5")) == 2
    err = [line for line in capsys.readouterr().err.splitlines()
           if not line.startswith(("epoch ", "preset: ", "estimated time: "))]
    assert len(err) == 1 and "no space left on the device" in err[0] and "checkpoint (step 5) is intact" in err[0]
    assert load_state(out / "state.pt")["progress"]["step"] == 5
    assert not any(p.name.endswith(TMP_SUFFIX) for p in out.iterdir())
    monkeypatch.setattr(checkpoint, "save_checkpoint", real)
    assert main(tiny_args(out, data_dir, "--resume", "--checkpoint-every", "5")) == 0


def test_no_room_at_all_leaves_no_empty_run_folder(tmp_path, data_dir, monkeypatch, capsys):  # noqa: F811
    out = tmp_path / "new" / "run"

    def no_room(run_dir, meta):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(loop, "write_config", no_room)
    assert main(one_epoch(out, data_dir)) == 2
    assert "no space left" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # nor the folder made to hold it


def test_ctrl_c_before_anything_is_written_leaves_the_users_empty_folder_as_it_was(  # noqa: F811
        tmp_path, data_dir, monkeypatch, capsys):  # noqa: F811
    """An empty folder the user made, Ctrl-C before the first file: the folder stays (it is the user's), and the line
    named a `--resume` of it, which has no run to read ("missing --model and --dataset")."""
    out = tmp_path / "mine"
    out.mkdir()

    def interrupted(run_dir, meta):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "write_config", interrupted)
    assert main(one_epoch(out, data_dir)) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted at step 0 of 8; nothing was written, and {out} is left as it was (give the same command to "
        "start the run)")
    assert out.is_dir() and not any(out.iterdir())


def test_resume_on_data_of_other_channels_names_the_run_not_a_flag():
    """`train --resume --dataset folder:GREY` of a colour run said `--in-channels 3 does not match ...; drop
    --in-channels`, a flag the user never gave: the value is the run's."""
    from attnconv.config import TrainConfig
    from attnconv.runs import run_info
    from attnconv.training.checks import resolve_overrides

    config = TrainConfig(model="sa-quadratic", dataset="fashion-mnist", model_overrides={"in_channels": 3})
    info = run_info(config)
    with pytest.raises(AttnconvError) as given:  # a value the user gave: the flag is the fix
        resolve_overrides(config, info)
    assert given.value.as_flag().endswith("; drop --in-channels")
    with pytest.raises(AttnconvError) as refused:
        resolve_overrides(config, info, resuming=True)
    assert refused.value.as_flag() == ("the run's model was built for in_channels = 3, and fashion-mnist has "
                                       "in_channels = 1: resume it on the data it was trained on, or train on this "
                                       "data into a new --out")
    assert resolve_overrides(TrainConfig(model="sa-quadratic", dataset="fashion-mnist"), info,
                             resuming=True).model_overrides["in_channels"] == 1


def test_ctrl_c_before_anything_is_written_leaves_no_folder(tmp_path, data_dir, monkeypatch, capsys):  # noqa: F811
    """`train --out x/y/run` stopped by Ctrl-C before it wrote anything removed run/ but left x/y/, empty; and its
    line said that `--resume` of the folder it had just removed would start the run again."""
    (tmp_path / "x").mkdir()

    def interrupted(run_dir, meta):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "write_config", interrupted)
    out = tmp_path / "x" / "y" / "z" / "run"
    assert main(one_epoch(out, data_dir)) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted at step 0 of 8; nothing was written, and {out} is removed with it (give the same command to "
        "start the run)")
    assert list(tmp_path.iterdir()) == [tmp_path / "x"] and not any((tmp_path / "x").iterdir())


def test_convert_never_touches_a_users_folder_next_to_its_output(tmp_path, data_dir):  # noqa: F811
    run = tmp_path / "cnn"
    assert main(["train", "--model", "resnet18", "--width", "4", "--dataset", "fashion-mnist", "--data-dir",
                 str(data_dir), "--max-steps", "2", "--batch-size", "32", "--workers", "1", "--no-progress",
                 "--out", str(run)]) == 0
    cv = tmp_path / "cv"
    users = cv / ".NAME.tmp"
    users.mkdir(parents=True)
    (users / "precious.txt").write_text("mine")
    convert_run(run, cv / "NAME")
    assert (users / "precious.txt").read_text() == "mine"
    assert sorted(p.name for p in (cv / "NAME").iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in cv.iterdir()) == [".NAME.tmp", "NAME"]
    meta = json.loads((cv / "NAME" / "config.json").read_text())
    assert "params" not in meta and meta["parameters"] > 0
    with pytest.raises(AttnconvError, match="already exists"):
        convert_run(run, cv / "NAME")


# ---------------------------------------------------------------------------------- logs


def test_logs_are_lines_with_eta_off_a_terminal(tmp_path, data_dir, capfd):  # noqa: F811
    out = tmp_path / "run"
    args = [a for a in one_epoch(out, data_dir) if a != "--no-progress"]
    assert main([*args, "--log-every", "2"]) == 0
    err = capfd.readouterr().err
    assert "\r" not in err
    steps = [line for line in err.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["2/8", "4/8", "6/8", "8/8"]  # synced every step at this size
    assert all("img/s" in line and "ETA" in line and "lr" in line for line in steps)
    assert "next: attnconv eval" in err


def test_progress_log_lines_only_when_a_multiple_is_passed():
    stream = io.StringIO()
    log = ProgressLog("lines", total_steps=100, epoch_steps=50, initial=0, desc="epoch 1/2", log_every=25,
                      stream=stream)
    for step in (10, 20, 30, 40, 60):
        log.update(step, 10 if step != 60 else 20, loss=1.0, acc=0.5, rate=100.0, lr=0.1, seconds_per_step=2.0)
    lines = stream.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["30/100", "60/100"]
    assert lines[0].endswith("ETA 2m20s")
    assert ProgressLog.auto_mode(True, io.StringIO()) == "lines" and ProgressLog.auto_mode(False) == "off"


def test_format_duration():
    assert [format_duration(s) for s in (9.4, 192, 3725)] == ["9s", "3m12s", "1h02m"]


def test_lock_is_per_directory_and_released_on_error(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    with DirectoryLock(a), DirectoryLock(b):
        with pytest.raises(AttnconvError, match="another attnconv process"):
            DirectoryLock(a).acquire()
    with pytest.raises(RuntimeError):
        with DirectoryLock(a):
            raise RuntimeError("boom")
    DirectoryLock(a).acquire().release()
    assert os.listdir(a) == []


@pytest.mark.parametrize("flags", [
    ["--batch-size", "70000"], ["--heads", "0"], ["--layers", "0"], ["--hidden", "-4"], ["--downsample", "5"],
    ["--impl", "bogus"], ["--dropout", "1.5"],
], ids=lambda f: " ".join(f))
def test_overwrite_checks_everything_before_it_removes_the_old_run(tmp_path, data_dir, flags, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert main(one_epoch(out, data_dir)) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert main(one_epoch(out, data_dir, "--overwrite", *flags)) == 2
    err = capsys.readouterr().err
    assert "replacing" not in err and len(err.strip().splitlines()) == 1, err
    assert snapshot(out) == before  # the old run is whole


def test_overwrite_refuses_a_run_file_that_is_a_folder_and_removes_nothing(tmp_path, data_dir, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert main(one_epoch(out, data_dir)) == 0
    (out / "state.pt").unlink()
    (out / "state.pt").mkdir()
    (out / "state.pt" / "mine.txt").write_text("x")
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(one_epoch(out, data_dir, "--overwrite")) == 2
    assert "state.pt is not a regular file" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == files
    assert (out / "state.pt" / "mine.txt").read_text() == "x"


def test_a_folder_with_someone_elses_config_json_is_not_a_run(tmp_path, data_dir, capsys):  # noqa: F811
    out = tmp_path / "hf-model"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "hidden_size": 768}))
    (out / "model.safetensors").write_bytes(b"weights")
    before = snapshot(out)
    for extra in ([], ["--overwrite"], ["--resume"]):
        capsys.readouterr()
        assert main(one_epoch(out, data_dir, *extra)) == 2
        err = capsys.readouterr().err
        assert "is not an attnconv run" in err and "--overwrite" not in err, err
        assert snapshot(out) == before


def test_a_folder_whose_config_json_is_a_broken_link_is_not_a_run(tmp_path, data_dir, capsys):  # noqa: F811
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").symlink_to(tmp_path / "gone.json")
    for extra in ([], ["--overwrite"], ["--resume"]):
        capsys.readouterr()
        assert main(one_epoch(out, data_dir, *extra)) == 2
        err = capsys.readouterr().err
        assert "is not an attnconv run: its config.json is not an attnconv run config (not a regular file: a link to " \
            f"{tmp_path / 'gone.json'}, which does not exist); nothing was changed there" in err, err
        assert [p.name for p in out.iterdir()] == ["config.json"] and (out / "config.json").is_symlink()


def test_a_run_whose_config_json_went_is_named_as_one_by_every_reader(tmp_path, data_dir, capsys):  # noqa: F811
    """Readers said `not a run directory (no config.json); give the folder that attnconv train --out wrote`: it
    is that folder."""
    out = tmp_path / "run"
    assert main(one_epoch(out, data_dir)) == 0
    (out / "config.json").unlink()
    for args in (["eval", str(out)], ["table", str(out)], ["analyze", str(out)]):
        capsys.readouterr()
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {out}: config.json is missing, while model.safetensors, state.pt, metrics.csv "
                              "show a run was trained here; restore it from a copy of the run\n"), (args, err)
    with pytest.raises(AttnconvError, match="config.json is missing, while model.safetensors"):
        load_run(out)


def test_a_damaged_run_file_is_one_error_with_its_fix_apart(tmp_path):
    """Every reader's error for a damaged file keeps what is wrong and the fix apart (`DamagedFile`), so a caller
    that knows a better fix (a resume) gives it without rewording the reader's text."""
    from attnconv.errors import DamagedFile
    from attnconv.runs.directory import _resumed
    from attnconv.runs.files import LOG_FIX, read_config
    from attnconv.runs.heads_file import read_heads
    from attnconv.runs.logs_file import read_metrics, read_steps

    (tmp_path / "config.json").write_text("{")
    (tmp_path / "metrics.csv").write_text("epoch,step\n1,x\n")
    (tmp_path / "steps.csv").write_bytes(b"\xff\xfe\n")
    (tmp_path / "heads.jsonl").write_text("[]\n")
    for read, name, fix in ((read_config, "config.json", "restore it from a copy, or train the run again"),
                            (read_metrics, "metrics.csv", LOG_FIX), (read_steps, "steps.csv", LOG_FIX),
                            (read_heads, "heads.jsonl", LOG_FIX)):
        with pytest.raises(DamagedFile) as caught:
            read(tmp_path)
        err = caught.value
        assert err.head.startswith(f"{tmp_path / name}: corrupt ") and err.fix.startswith(fix), str(err)
        assert str(err) == f"{err.head}; {err.fix}" and err.reason
        if read is not read_config:
            with pytest.raises(DamagedFile) as resumed:
                _resumed(read, tmp_path, 5)
            assert resumed.value.head == err.head and "or delete it" not in str(resumed.value)
            assert resumed.value.fix.startswith("restore it from a copy of the run, or train into a new --out")


# ---------------------------------------------------------------------------------- data that changed under a run


def _folder_run(tmp_path, monkeypatch, *extra):
    from fixtures_data import write_image_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_image_folder(tmp_path / "imgs")
    out = tmp_path / "run"
    args = ["train", "--model", "sa-quadratic", "--dataset", f"folder:{tmp_path / 'imgs'}", "--hidden", "8",
            "--layers", "1", "--heads", "4", "--intermediate", "8", "--batch-size", "4", "--workers", "1",
            "--no-progress", "--out", str(out), *extra]
    return out, args


def _stopped_at(monkeypatch, args, step):
    """`train ARGS` stopped by Ctrl-C right after its checkpoint of `step` (exit 130)."""
    original = Checkpointer.save

    def checkpoint_then_die(self, model, optimizer, progress):
        original(self, model, optimizer, progress)
        if progress.step == step:
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(Checkpointer, "save", checkpoint_then_die)
        assert main(args) == 130


def _add_image(folder, name, seed=1):
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / name)


def test_a_run_records_its_dataset_and_eval_says_when_a_class_was_added(tmp_path, monkeypatch, capsys):
    out, args = _folder_run(tmp_path, monkeypatch)
    assert main([*args, "--epochs", "1"]) == 0
    data = json.loads((out / "config.json").read_text())["data"]
    assert data["classes"] == ["bird", "cat", "dog"] and (data["train_size"], data["test_size"]) == (12, 4)
    _add_image(tmp_path / "imgs" / "train" / "fish", "f0.png")
    _add_image(tmp_path / "imgs" / "test" / "fish", "f0.png")
    capsys.readouterr()
    message = "the dataset changed since the run was trained: it has 4 classes, the run's model 3"
    for cmd in (["eval", str(out)], ["explore", str(out), "--no-browser", "--port", "0"]):
        assert main(cmd) == 2, cmd  # eval was an IndexError traceback
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    # report's test-set section reads the folder too: it fails rather than leaving the error in the page
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (out / "report.html").exists()


def test_eval_on_a_test_set_that_grew_is_refused_or_warns_in_one_line(tmp_path, monkeypatch, capsys):
    out, args = _folder_run(tmp_path, monkeypatch)
    assert main([*args, "--epochs", "1"]) == 0
    _add_image(tmp_path / "imgs" / "test" / "cat", "new.png")
    capsys.readouterr()
    assert main(["eval", str(out)]) == 2  # the accuracy would not be the run's
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "test images 4 -> 5" in err
    assert "--allow-data-change" in err
    assert main(["eval", str(out), "--allow-data-change"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: ") and captured.err.count("\n") == 1
    assert "the dataset changed since training (test images 4 -> 5)" in captured.err and "test acc" in captured.out


@pytest.mark.parametrize("change", ["gained images", "lost images"])
def test_resume_refuses_a_changed_dataset_unless_told(tmp_path, monkeypatch, capsys, change):
    out, args = _folder_run(tmp_path, monkeypatch, "--epochs", "3", "--checkpoint-every", "5")
    _stopped_at(monkeypatch, args, 5)  # interrupted after 5 of 9 steps
    cat = tmp_path / "imgs" / "train" / "cat"
    if change == "gained images":
        for i in range(4):
            _add_image(cat, f"more{i}.png", seed=i)
        expected = "training images 12 -> 16"
    else:
        for p in sorted(cat.glob("*.*"))[:2]:
            if p.suffix != ".txt":
                p.unlink()
        expected = "training images 12 -> 10"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "the dataset changed since this run started" in err and expected in err and "--allow-data-change" in err
    assert "normalization" in err and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main([*args, "--resume", "--allow-data-change"]) == 0  # asked for: continues on the new data
    # The run counts in epochs on the new data: three epochs, the last one whole. Lost images: the checkpoint's
    # batch 2 is the new epoch's end (it ended there without its row, its sums carried into the next one, and a
    # second resume was refused as a corrupt state.pt); then one epoch of 2 steps, not a last epoch cut at the old
    # run's 9 - 3 steps. Gained images: 2 more steps, then 4 (counted in steps, 12 in all, an epoch 4 was written,
    # which eval and table then refused).
    rows = runs.read_metrics(out)
    assert [r["epoch"] for r in rows] == [1, 2, 3], rows
    assert [r["step"] for r in rows] == ([3, 5, 7] if change == "lost images" else [3, 7, 11]), rows
    assert rows[1]["images_per_s"] > 0 and load_state(out / "state.pt")["progress"]["seen"] == 0
    assert load_state(out / "state.pt")["progress"]["finished"]
    capsys.readouterr()
    assert main([*args, "--resume", "--allow-data-change"]) == 0  # finished: nothing more, no length refused
    assert "run already finished" in capsys.readouterr().err
    assert main(["eval", str(out), "--allow-data-change", "--json"]) == 0
    # The weights went on with the run's normalization (config.json's, which every reader takes), so eval measures
    # what the last epoch's row measured: the resume normalized by the new images' statistics, and eval did not.
    measured = json.loads(capsys.readouterr().out)
    assert measured["test_loss"] == pytest.approx(rows[-1]["test_loss"], rel=1e-5), (measured, rows[-1])
    assert json.loads((out / "config.json").read_text())["data"]["train_size"] == 12  # the data it started on


@pytest.mark.parametrize("epochs", [2, 3])
def test_allow_data_change_onto_shorter_epochs_ends_the_epoch_in_progress_even_the_last(tmp_path, monkeypatch, capsys,
                                                                                       epochs):
    """12 images (3 steps an epoch) cut to 8 (2) with the checkpoint at epoch 2, batch 2: that epoch ends where it
    stands, with its row. When it was the last epoch the run, counted in epochs, had no step left and its state
    was refused as "at or past the run's end, yet not finished"; the row took the learning rate of a next step
    (not the one its last step ran at); a resume stopped under --allow-data-change named a plain --resume, which
    the data at hand is refused for."""
    from attnconv.config import TrainConfig
    from attnconv.training.schedule import learning_rate

    out, args = _folder_run(tmp_path, monkeypatch, "--epochs", str(epochs), "--checkpoint-every", "1")
    original = Checkpointer.save
    stop_at = {5}

    def checkpoint_then_die(self, model, optimizer, progress):
        original(self, model, optimizer, progress)
        if progress.step in stop_at:
            stop_at.discard(progress.step)
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(Checkpointer, "save", checkpoint_then_die)
        assert main(args) == 130  # at step 5: epoch 2, batch 2
        for cls in ("cat", "dog"):
            for p in sorted((tmp_path / "imgs" / "train" / cls).glob("*.*"))[:2]:
                if p.suffix != ".txt":
                    p.unlink()
        capsys.readouterr()
        if epochs == 3:
            stop_at.add(5)  # the epoch's end, checkpointed after its row: stopped there again
        code = main([*args, "--resume", "--allow-data-change"])
        err = capsys.readouterr().err
    if epochs == 2:  # the last epoch: the run ends with that row
        assert code == 0, err
    else:
        assert code == 130 and err.strip().splitlines()[-1].endswith(
            f"continue with `attnconv train --out {out} --resume --allow-data-change`"), err
        assert main([*args, "--resume", "--allow-data-change"]) == 0
    rows = runs.read_metrics(out)
    assert [(r["epoch"], r["step"]) for r in rows] == [(1, 3), (2, 5), (3, 7)][:epochs], rows
    config = TrainConfig.from_dict(json.loads((out / "config.json").read_text())["config"])
    assert rows[1]["lr"] == pytest.approx(learning_rate(config, 4, 3 * epochs))  # step 5's, of the run as it was
    assert load_state(out / "state.pt")["progress"]["finished"]


def test_resume_starts_from_the_runs_own_config_whatever_flags_are_given(tmp_path, monkeypatch, capsys):
    """`--resume --model M` (the run's own model) took the dataset's preset as the base: "missing --dataset", or,
    with --dataset, a different config listing epochs, batch size and seed the user never gave; another model met
    the run's model options ("no option 'hidden'"). Data smaller than one batch named --batch-size, which
    --resume refuses to change. A model option changed is named by its key, not as two whole dicts."""
    from fixtures_data import write_image_folder

    out, args = _folder_run(tmp_path, monkeypatch, "--epochs", "1")
    assert main(args) == 0
    resume = ["train", "--out", str(out), "--resume", "--no-progress"]
    folder = f"folder:{tmp_path / 'imgs'}"
    for given in (["--model", "sa-quadratic"], ["--model", "sa-quadratic", "--dataset", folder], ["--dataset", folder],
                  ["--init", "paper", "--impl", "auto", "--locality", "1"]):  # the defaults config.json leaves out
        capsys.readouterr()
        assert main([*resume, *given]) == 0, given
        assert "run already finished" in capsys.readouterr().err
    changed = {("--model", "resnet18"): "(model: 'sa-quadratic' -> 'resnet18')",
               ("--hidden", "16"): "(model_overrides.hidden: 8 -> 16)",
               ("--model", "sa-quadratic", "--epochs", "3"): "(epochs: 1 -> 3)",
               # the settings before the data: a flag given is named, not only what the other data does not fit
               ("--image-size", "24", "--dataset", f"folder:{tmp_path / 'grey'}"):
                   f"(dataset: '{folder}' -> 'folder:{tmp_path / 'grey'}'; model_overrides.image_size: 32 -> 24)"}
    write_image_folder(tmp_path / "grey", grey=True)
    for given, what in changed.items():
        capsys.readouterr()
        assert main([*resume, *given]) == 2
        assert capsys.readouterr().err == (f"error: --out {out} holds a run with a different config {what}; resume "
                                           "with the same settings, or choose a new --out\n"), given
    for cls in ("bird", "cat", "dog"):  # one image each
        for p in sorted((tmp_path / "imgs" / "train" / cls).glob(f"{cls}*"))[1:]:
            p.unlink()
    capsys.readouterr()
    for flag in ([], ["--allow-data-change"]):
        assert main([*resume, *flag]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: the run's batch size 4 is larger than the training set of folder:") and \
            "(3 images): resume it on the data it was trained on, or train on this data into a new --out" in err, err
    new = [str(tmp_path / "new") if a == str(out) else a for a in args]
    assert main([*new, "--allow-data-change"]) == 2  # a new run has no data to compare
    line = "error: --allow-data-change goes with --resume: give both to continue a run on other data (a new run " \
           "records the data it starts on)\n"
    assert capsys.readouterr().err == line
    assert main(["train", "--out", str(out), "--allow-data-change"]) == 2  # before "missing --model and --dataset"
    assert capsys.readouterr().err == line
    assert not (tmp_path / "new").exists()


def test_resume_with_a_preset_and_the_api_with_a_relative_folder_start_from_the_runs_config(tmp_path, monkeypatch,
                                                                                           capsys):
    """`--resume --preset P` (the run's own preset) rebuilt the config from the preset: a "different config" listing
    the dataset, sizes, epochs and batch size the user never gave. The Python API recorded `folder:imgs` as given
    (the CLI records it absolute): a resume naming the same folder was a "different config", and readers started
    from another folder looked for the images there."""
    from fixtures_data import write_image_folder

    import attnconv

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    write_image_folder(tmp_path / "imgs")
    out = tmp_path / "run"
    flags = ["--dataset", "folder:imgs", "--hidden", "8", "--layers", "1", "--heads", "4", "--epochs", "1",
             "--batch-size", "4", "--workers", "1", "--no-progress", "--out", str(out)]
    assert main(["train", "--preset", "fmnist-sa-quadratic", *flags]) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--preset", "fmnist-sa-quadratic"]) == 0
    assert "run already finished" in capsys.readouterr().err
    assert main(["train", "--out", str(out), "--resume", "--preset", "fmnist-vit"]) == 2  # what it would change
    err = capsys.readouterr().err
    assert "holds a run with a different config (" in err and "model: 'sa-quadratic' -> 'vit'" in err, err

    config = attnconv.make_config(model="sa-quadratic", dataset="folder:imgs", epochs=1, batch_size=4, workers=1,
                                  model_overrides={"hidden": 8, "layers": 1, "heads": 4})
    api = tmp_path / "api"
    attnconv.train(config, api, progress=False)
    assert runs.read_config(api)["config"]["dataset"] == f"folder:{tmp_path / 'imgs'}"
    attnconv.train(config, api, resume=True, progress=False)  # the same folder, named as before: finished
    with pytest.raises(AttnconvError, match=r"model_overrides.intermediate: default 512 -> 16\)"):
        attnconv.train(dataclasses.replace(config, model_overrides={**config.model_overrides, "intermediate": 16}),
                       api, resume=True, progress=False)
    monkeypatch.chdir(tmp_path / "cache")
    assert main(["eval", str(api)]) == 0  # from another folder: the images are where they were


def test_a_run_started_again_on_other_data_records_that_data(tmp_path, monkeypatch, capsys):
    """A run stopped before its first checkpoint, its data then changed, resumed with --allow-data-change: it
    starts again from step 0 on the new data, and config.json kept the old data's record, so every reader called
    the run's own data changed (`eval`: "restore the data it was trained on", data the model never saw)."""
    out, args = _folder_run(tmp_path, monkeypatch, "--epochs", "1")

    def die(self, model, optimizer, progress):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(Checkpointer, "save", die)
        assert main(args) == 130  # after epoch 1's row, before its checkpoint
    for i in range(4):
        _add_image(tmp_path / "imgs" / "train" / "cat", f"more{i}.png", seed=i)
    assert main([*args, "--resume", "--allow-data-change"]) == 0
    assert runs.read_config(out)["data"]["train_size"] == 16
    capsys.readouterr()
    assert main(["eval", str(out)]) == 0
    assert "changed" not in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0  # finished, on the data it was trained on: no flag needed


@pytest.mark.parametrize("log", ["steps.csv", "metrics.csv", "heads.jsonl"])
def test_a_damaged_log_on_resume_is_not_told_to_be_deleted(tmp_path, monkeypatch, capsys, log):
    """`--resume` of a run with a damaged log gave the readers' fix, "restore it from a copy, or delete it"; deleted,
    the next resume refused the log as rows lost. A resume says only what it can take."""
    out, args = _folder_run(tmp_path, monkeypatch, "--epochs", "2", "--checkpoint-every", "1", "--log-every", "1")
    _stopped_at(monkeypatch, args, 4)  # epoch 2, its first row written
    lines = (out / log).read_text().splitlines()
    lines[1] = "x" + lines[1]
    (out / log).write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    err = capsys.readouterr().err
    if log == "metrics.csv":  # config.json gone too: named, not "missing --model and --dataset"
        (out / "config.json").rename(tmp_path / "config.json")
        assert main(["train", "--out", str(out), "--resume"]) == 2
        assert capsys.readouterr().err == (f"error: --out {out}: config.json is missing, while model.safetensors, "
                                           "state.pt, metrics.csv show a run was trained here; --resume needs it: "
                                           "restore it from a copy of the run, or train into a new --out\n")
        (tmp_path / "config.json").rename(out / "config.json")
    assert f"{out / log}: corrupt" in err and "delete it" not in err and err.strip().endswith(
        "restore it from a copy of the run, or train into a new --out (without it the run cannot be resumed: the "
        f"checkpoint counts its {'lines' if log == 'heads.jsonl' else 'rows'})"), err


def test_a_resume_checks_the_checkpoint_files_before_it_trains(tmp_path, monkeypatch, capsys):
    """model.safetensors a folder: a resume trained on, then failed at its checkpoint naming attnconv's temporary and
    sending the user to the same resume. Both checkpoint files gone under a metrics.csv of two rows: "no checkpoint
    to resume from (it stopped before its first)", and the finished run was trained again, its logs written anew."""
    from safetensors.torch import load, load_file

    out, args = _folder_run(tmp_path, monkeypatch, "--epochs", "2")
    assert main(args) == 0
    weights, saved = out / "model.safetensors", (out / "model.safetensors").read_bytes()
    logs = {name: (out / name).read_bytes() for name in ("metrics.csv", "steps.csv", "heads.jsonl")}
    weights.unlink()
    weights.mkdir()
    (weights / "mine.txt").write_text("x")
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    assert capsys.readouterr().err == (f"error: {weights} is a directory, not the run's weights file, and the resume "
                                       "is to write the weights there; move it out of the run folder (the weights are "
                                       "written anew from state.pt)\n")
    assert (weights / "mine.txt").read_text() == "x" and not any(TMP_SUFFIX in p.name for p in out.iterdir())
    (weights / "mine.txt").unlink()
    weights.rmdir()
    assert main([*args, "--resume"]) == 0  # the fix the line gives, for a finished run too
    assert f"{out}: model.safetensors was missing: written anew from state.pt" in capsys.readouterr().err
    old, new = load(saved), load_file(weights)
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old)
    assert {name: (out / name).read_bytes() for name in logs} == logs
    weights.write_bytes(saved[: len(saved) // 2])  # cut short: as an unfinished run's next checkpoint would
    assert main([*args, "--resume"]) == 0
    assert f"{out}: model.safetensors did not hold the run's weights: written anew from state.pt" in \
        capsys.readouterr().err
    assert all(torch.equal(old[k], t) for k, t in load_file(weights).items())
    assert main([*args, "--resume"]) == 0 and "written anew" not in capsys.readouterr().err
    (out / "state.pt").unlink()
    weights.unlink()
    for command in ([*args, "--resume"], ["eval", str(out)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        said = ("state.pt and model.safetensors are missing" if command[0] == "train" else
                "model.safetensors: missing, and so is state.pt") + ", while metrics.csv has a row of step 6, past " \
            "step 3, where the run writes its first checkpoint and which it goes past only once that checkpoint is " \
            "whole: they were moved or deleted; restore them from a copy of the run"
        assert said in err, err
    assert {name: (out / name).read_bytes() for name in logs} == logs


def test_a_resume_given_the_runs_image_folder_by_a_link_is_no_other_config(tmp_path, monkeypatch, capsys):
    out, args = _folder_run(tmp_path, monkeypatch, "--epochs", "1")
    assert main(args) == 0
    (tmp_path / "link").symlink_to(tmp_path / "imgs")
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--dataset", f"folder:{tmp_path / 'link'}"]) == 0
    assert "run already finished" in capsys.readouterr().err
    shutil.copytree(tmp_path / "imgs", tmp_path / "other")  # the same images in another folder: named
    assert main(["train", "--out", str(out), "--resume", "--dataset", f"folder:{tmp_path / 'other'}"]) == 2
    assert "holds a run with a different config (dataset: " in capsys.readouterr().err


def test_a_resume_without_either_checkpoint_file_starts_again_only_if_the_logs_stop_at_the_first(tmp_path,
                                                                                                monkeypatch, capsys):
    """Both files gone from a run checkpointing every step: its steps.csv went past the first checkpoint's step, yet
    `--resume` said `it stopped before its first` and trained it again, its logs written anew."""
    out, args = _folder_run(tmp_path, monkeypatch, "--epochs", "2", "--checkpoint-every", "1", "--log-every", "1")
    _stopped_at(monkeypatch, args, 2)  # in epoch 1: metrics.csv its header alone, steps.csv two rows
    (out / "state.pt").unlink()
    (out / "model.safetensors").unlink()
    logs = {name: (out / name).read_bytes() for name in ("metrics.csv", "steps.csv", "heads.jsonl", "config.json")}
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    assert capsys.readouterr().err == (f"error: {out}: state.pt and model.safetensors are missing, while steps.csv "
                                       "has a row of step 2, past step 1, where the run writes its first checkpoint "
                                       "and which it goes past only once that checkpoint is whole: they were moved or "
                                       "deleted; restore them from a copy of the run, or train the run again over "
                                       "this one (`attnconv train` with its settings and --overwrite)\n")
    assert {name: (out / name).read_bytes() for name in logs} == logs
    lines = (out / "steps.csv").read_text().splitlines()  # logs up to the first checkpoint's step: it may have failed
    (out / "steps.csv").write_text("\n".join(lines[:2]) + "\n")
    assert main([*args, "--resume"]) == 0
    assert "no checkpoint to resume from (it stopped before its first)" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- smaller things done right


def test_run_files_and_converted_runs_get_the_modes_the_umask_allows(tmp_path, data_dir):  # noqa: F811
    old = os.umask(0o022)
    try:
        out = tmp_path / "run"
        assert main(one_epoch(out, data_dir)) == 0
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
        assert set(modes.values()) == {0o644}, modes  # mkstemp's 0600 no more
    finally:
        os.umask(old)


def test_a_failed_write_names_the_file_it_was_writing(tmp_path):
    def full_disk(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")  # write() errors name no file

    with pytest.raises(OSError) as info:
        atomic_write(tmp_path / "metrics.csv", full_disk)
    assert info.value.filename == str(tmp_path / "metrics.csv") and info.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_says_the_step_the_checkpoint_and_how_to_resume(tmp_path, data_dir, monkeypatch, capsys):  # noqa: F811
    original = Checkpointer.save

    def checkpoint_then_ctrl_c(self, model, optimizer, progress):
        original(self, model, optimizer, progress)
        if progress.step == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpointer, "save", checkpoint_then_ctrl_c)
    out = tmp_path / "run"
    assert main(one_epoch(out, data_dir, "--checkpoint-every", "5")) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"interrupted at step 5 of 8; the last good checkpoint (step 5) is intact; "
                   f"continue with `attnconv train --out {out} --resume`")


def test_an_edited_config_json_on_resume_is_blamed_and_the_checkpoint_kept(tmp_path, data_dir, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert main(one_epoch(out, data_dir, "--epochs", "2", "--max-steps", "3")) == 0
    meta = json.loads((out / "config.json").read_text())
    meta["config"]["model_overrides"]["hidden"] = 24  # edited by hand
    (out / "config.json").write_text(json.dumps(meta))
    state = (out / "state.pt").read_bytes()
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    # model.safetensors records what config.json said (runs.record): the edit is named before any tensor is loaded
    assert err.strip() == (f"error: {out / 'config.json'} does not describe the run model.safetensors was written for "
                           "(config.model_overrides.hidden 24 in config.json, 16 in the record of model.safetensors); one of the "
                           "two was edited or copied from another run: restore it from a copy of the run (or, if "
                           "config.json was edited, set those fields back to the record's values)"), err
    assert (out / "state.pt").read_bytes() == state
    (out / "model.safetensors").unlink()
    unrecord(out)  # no record to compare (a checkpoint written before it): state.pt does not fit the edited model
    state = (out / "state.pt").read_bytes()
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"does not fit the model that {out / 'config.json'} describes" in err
    assert "size mismatch for" in err and "restore it (the checkpoint is kept as it is)" in err
    assert "delete" not in err and (out / "state.pt").read_bytes() == state


def test_round_62_b_the_next_line_quotes_the_run_folder_to_paste_back(tmp_path, data_dir, capfd):  # noqa: F811
    """Round 62: the `next:` line after `train` printed the run folder unquoted, so a folder with a space pasted back
    as two arguments."""
    import shlex

    out = tmp_path / "my run"
    assert main([*one_epoch(out, data_dir), "--max-steps", "1"]) == 0
    line = next(line for line in capfd.readouterr().err.splitlines() if line.startswith("next: "))
    assert shlex.split(line.split("|")[0])[-1] == str(out), line


@pytest.mark.parametrize("name", ["run\x1b[31mred", "run\nsplit"], ids=["escape", "newline"])
def test_round_63_b_trains_last_lines_show_the_folder_escaped_and_paste_back(name, tmp_path, data_dir, capfd):  # noqa: F811
    """Round 63: train's result line (stdout) and its next: line printed the run folder raw: a newline split both,
    a terminal escape acted on the terminal."""
    import subprocess

    out = tmp_path / name
    assert main([*one_epoch(out, data_dir), "--max-steps", "1"]) == 0
    stdout, stderr = capfd.readouterr()
    assert "\x1b" not in stdout + stderr and stdout.count("\n") == 1, stdout
    assert stdout.startswith(str(tmp_path) + "/" + name.encode("unicode_escape").decode() + ": epoch 1, step 1,"), stdout
    line = next(line for line in stderr.splitlines() if line.startswith("next: "))
    word = line.split("|")[0].split(" ", 3)[3].strip()
    pasted = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, check=True).stdout
    assert pasted == os.fsencode(out), line


def test_round_64_b_a_run_folder_with_a_leading_dash_pastes_back_as_a_folder(tmp_path, data_dir, monkeypatch,  # noqa: F811
                                                                            capfd):
    """Round 64: for `--out -dash` (relative) the next: line offered `attnconv eval -dash`, read back as an option."""
    import subprocess

    monkeypatch.chdir(tmp_path)
    args = one_epoch("-dash", data_dir, "--max-steps", "1")
    at = args.index("--out")
    args[at:at + 2] = ["--out=-dash"]  # as argparse takes a value that begins with a dash
    assert main(args) == 0
    line = next(line for line in capfd.readouterr().err.splitlines() if line.startswith("next: "))
    assert line.startswith("next: attnconv eval ./-dash  |"), line
    word = line.split("|")[0].split(" ", 3)[3].strip()
    assert subprocess.run(["bash", "-c", f"cd {shlex.quote(str(tmp_path))} && test -d {word}"]).returncode == 0
