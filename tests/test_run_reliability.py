"""Failures no check can foresee, and data that changed under a run (docs/failure-model.md):

- class 2, `--overwrite` replaces a run only when the new one has something to replace it with
  (`test_overwrite_replaces_only_*`);
- class 7, a run knows its data by content, and its logs by the checkpoint (`test_run_knows_its_data_*`);
- class 4, background writers (TensorBoard) fail as one line (`test_background_writers_fail_as_one_line_*`).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_train import REPO, data_dir, stop_after_checkpoint, tiny_args  # noqa: F401  (data_dir is a fixture)

import attnconv.training.loop as loop
from attnconv.cli import main
from attnconv.errors import AttnconvError, AttnconvWarning
from attnconv.runs import SetAside, claim_run_dir, load_state, metrics_text, read_config, read_metrics, read_steps
from attnconv.runs.directory import SET_ASIDE
from attnconv.runs.files import sealed_metadata
from attnconv.training.checkpoint import Checkpointer

ONE_EPOCH = ("--epochs", "1", "--log-every", "3", "--checkpoint-every", "5")  # 8 steps, checkpoints at 5 and 8


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and folder (None) under `folder`, by relative path."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):  # noqa: F811
    """A finished one-epoch run (checkpoint at step 8; steps.csv rows of steps 3 and 6; heads at epochs 0, 1)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(tiny_args(out, data_dir, *ONE_EPOCH)) == 0
    return out


@pytest.fixture
def run_with_user_files(finished, tmp_path):
    """A copy of the finished run with an earlier --tensorboard's event file and a user's files beside it,
    in tensorboard/ too."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "notes.txt").write_text("keep me")
    board = out / "tensorboard"
    (board / "mine").mkdir(parents=True)
    (board / "NOTES.txt").write_text("my notes")
    (board / "mine" / "events.out.tfevents.9.mine").write_bytes(b"my own events")
    (board / "events.out.tfevents.1.host").write_bytes(b"the old run's events")
    return out


# ---------------------------------------------------------------------------------- class 2: --overwrite


def test_overwrite_replaces_only_when_the_new_run_checkpoints_nan_restores_the_old_run(
        run_with_user_files, data_dir, capsys):  # noqa: F811
    out = run_with_user_files
    before = tree(out)
    capsys.readouterr()
    assert main(tiny_args(out, data_dir, "--overwrite", "--lr", "1e30", "--max-steps", "3")) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "non-finite" in errors[0], err
    assert "restored as it was" in errors[0] and "no checkpoint was written yet" not in errors[0]
    assert tree(out) == before  # every file of the old run, the user's files, nothing set aside left


@pytest.mark.parametrize("failure", ["out of memory", "ctrl-c", "a bug"])
def test_overwrite_replaces_only_when_the_new_run_checkpoints_failure_at_step_1(
        run_with_user_files, data_dir, capsys, monkeypatch, failure):  # noqa: F811
    out = run_with_user_files
    before = tree(out)
    raised = {"ctrl-c": KeyboardInterrupt(), "a bug": ZeroDivisionError("a bug"),
              "out of memory": RuntimeError("DefaultCPUAllocator: can't allocate memory")}[failure]
    calls = []

    def fail(*args):
        calls.append(1)
        raise raised

    monkeypatch.setattr(loop, "train_step", fail)
    capsys.readouterr()
    args = tiny_args(out, data_dir, "--overwrite", "--tensorboard", "--seed", "3")
    if failure == "a bug":  # a bug keeps its traceback; the old run comes back all the same
        with pytest.raises(ZeroDivisionError):
            main(args)
        assert calls == [1] and tree(out) == before
        return
    assert main(args) == (130 if failure == "ctrl-c" else 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert calls == [1] and any("it is kept aside until the new run's first checkpoint" in line for line in err)
    assert err[-1].startswith("interrupted at step 0 of 16; " if failure == "ctrl-c" else
                              "error: out of memory at step 0 of 16; ")
    assert err[-1].endswith("the run that --overwrite was replacing is restored as it was (the new run had no "
                            "checkpoint yet)")
    assert tree(out) == before  # the new run's config.json, logs and event file are gone, the old ones back


def test_overwrite_replaces_only_when_the_new_run_checkpoints_then_only_attnconv_files_go(
        run_with_user_files, data_dir, capsys, monkeypatch):  # noqa: F811
    out = run_with_user_files
    seen = {}
    save, discard = Checkpointer.save, SetAside.discard

    def look_then_save(self, model, optimizer, progress):  # the old run is kept aside until the first checkpoint
        seen.setdefault("before", (out / SET_ASIDE / "state.pt").is_file())
        save(self, model, optimizer, progress)

    def look_then_discard(self):  # ... and goes once it is written
        seen.setdefault("checkpointed", load_state(out / "state.pt")["progress"]["step"] if "before" in seen else None)
        discard(self)
        seen.setdefault("after", (out / SET_ASIDE).exists())

    monkeypatch.setattr(Checkpointer, "save", look_then_save)
    monkeypatch.setattr(SetAside, "discard", look_then_discard)
    assert main(tiny_args(out, data_dir, "--overwrite", "--seed", "3", "--max-steps", "2")) == 0
    assert seen == {"before": True, "checkpointed": 2, "after": False}
    assert read_config(out)["config"]["seed"] == 3 and load_state(out / "state.pt")["progress"]["step"] == 2
    assert (out / "notes.txt").read_text() == "keep me"
    assert sorted(str(p.relative_to(out)) for p in (out / "tensorboard").rglob("*")) == [
        "tensorboard/NOTES.txt", "tensorboard/mine", "tensorboard/mine/events.out.tfevents.9.mine"]
    assert not any(p.name.startswith(".") for p in out.iterdir())  # nothing set aside is left


def test_overwrite_replaces_only_when_the_new_run_checkpoints_even_after_kill_9(run_with_user_files, capsys):
    """A process killed between setting the old run aside and the new run's first checkpoint: the next
    `train` into the folder puts the old run back before anything else (here, a --resume of it)."""
    out = run_with_user_files
    before = tree(out)
    lock = loop.DirectoryLock(out)
    names = claim_run_dir(out, lock, resume=False, overwrite=True)
    lock.release()
    assert "tensorboard/events.out.tfevents.1.host" in names and "tensorboard/NOTES.txt" not in names
    SetAside(out, names).move()
    (out / "config.json").write_text(json.dumps({"config": {}}))  # the new run's files, as a kill left them
    (out / "metrics.csv").write_text("epoch\n")
    (out / "tensorboard" / "events.out.tfevents.2.new").write_bytes(b"new")
    assert not (out / "state.pt").exists() and (out / SET_ASIDE).is_dir()
    capsys.readouterr()
    lock = loop.DirectoryLock(out)
    assert claim_run_dir(out, lock, resume=True, overwrite=False) == []
    lock.release()
    assert "restored the run that an interrupted --overwrite had set aside" in capsys.readouterr().err
    assert tree(out) == before


@pytest.mark.parametrize("flag", [("--seed", 5), ("--epochs", 30)], ids=["seed", "epochs"])
def test_overwrite_replaces_only_when_the_new_run_checkpoints_a_resume_after_kill_9_continues_the_old_run(
        run_with_user_files, capsys, flag):
    """The `--resume` that every reader names after a kill between the set-aside and the new run's first checkpoint
    puts the old run back and continues it, compared with the old run's own config.json (it read the killed new
    run's: 'different config (seed: 0 -> 5)', exit 2, for settings the user never gave)."""
    out = run_with_user_files
    before = tree(out)
    lock = loop.DirectoryLock(out)
    names = claim_run_dir(out, lock, resume=False, overwrite=True)
    lock.release()
    SetAside(out, names).move()
    record = json.loads((out / SET_ASIDE / "config.json").read_text())
    record["config"][flag[0][2:]] = flag[1]
    (out / "config.json").write_text(json.dumps(record))  # the new run's config.json, as a kill left it
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "restored the run that an interrupted --overwrite had set aside" in err and "different config" not in err
    assert "already finished" in err, err
    assert tree(out) == before


@pytest.mark.parametrize("kind", ["folder", "broken-link"])
def test_overwrite_replaces_only_when_the_new_run_checkpoints_a_state_that_is_no_file_is_moved_first(
        finished, tmp_path, data_dir, capsys, kind):  # noqa: F811
    """A state.pt that is a folder or a link to nothing: `--resume`'s line said `train it again ... over this one
    with --overwrite`, which refuses a run file attnconv did not write; it says to move it out first, and that
    fix, followed, works."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "state.pt").unlink()
    if kind == "folder":
        (out / "state.pt").mkdir()
    else:
        (out / "state.pt").symlink_to(tmp_path / "nothing")
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 2
    _one_error(capsys, f"{out / 'state.pt'}", "move it out of the run folder first", "over this one with --overwrite")
    assert main(tiny_args(out, data_dir, *ONE_EPOCH, "--overwrite")) == 2  # not moved yet: refused, as it says
    capsys.readouterr()
    os.rename(out / "state.pt", tmp_path / "moved")
    assert main(tiny_args(out, data_dir, *ONE_EPOCH, "--overwrite")) == 0
    assert (out / "state.pt").is_file()


def test_overwrite_replaces_only_when_the_new_run_checkpoints_ctrl_c_while_the_old_run_goes(
        run_with_user_files, monkeypatch):
    """A Ctrl-C right after the new run's first checkpoint, while the old run was being deleted, left
    `.replaced-run.done.attnconv-tmp/` (once holding the whole old run). The deletion holds Ctrl-C back, which
    arrives once it is done."""
    import signal

    import attnconv.runs.directory as directory

    out = run_with_user_files
    lock = loop.DirectoryLock(out)
    names = claim_run_dir(out, lock, resume=False, overwrite=True)
    lock.release()
    aside = SetAside(out, names)
    aside.move()
    rmtree = shutil.rmtree

    def interrupted(path, **kwargs):  # Ctrl-C as the deletion starts
        os.kill(os.getpid(), signal.SIGINT)
        rmtree(path, **kwargs)

    monkeypatch.setattr(directory.shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        aside.discard()
    assert not (out / SET_ASIDE).exists() and not (out / directory.DISCARDED).exists()
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "tensorboard"]


def test_overwrite_replaces_only_when_the_new_run_checkpoints_ctrl_c_before_anything_moved(
        run_with_user_files, data_dir, monkeypatch, capsys):  # noqa: F811
    """Ctrl-C during `train --overwrite`'s checks, before the old run was set aside: the line said `the last good
    checkpoint (step 12) is intact; continue with ... --resume`, which only answers `run already finished`."""
    out = run_with_user_files
    before = tree(out)

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(SetAside, "move", interrupted)
    assert main(tiny_args(out, data_dir, *ONE_EPOCH, "--overwrite", "--seed", "3")) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted at step 0 of 8; the run in {out} is as it was (stopped before anything of it was replaced)")
    assert tree(out) == before


def test_overwrite_replaces_only_when_the_new_run_checkpoints_ctrl_c_before_anything_moved_of_a_run_without_state(
        run_with_user_files, data_dir, monkeypatch, capsys):  # noqa: F811
    """The same over an old run that never checkpointed (no state.pt): the line named its `--resume`, which trains
    the old config, not the one given with --overwrite."""
    out = run_with_user_files
    (out / "state.pt").unlink()
    (out / "model.safetensors").unlink()
    before = tree(out)
    monkeypatch.setattr(SetAside, "move", lambda self: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert main(tiny_args(out, data_dir, *ONE_EPOCH, "--overwrite", "--seed", "3")) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted at step 0 of 8; the run in {out} is as it was (stopped before anything of it was replaced)")
    assert tree(out) == before


def test_overwrite_replaces_only_when_the_new_run_checkpoints_a_users_folder_of_the_set_aside_name_stays(
        run_with_user_files, data_dir, capsys):  # noqa: F811
    """A folder named as --overwrite's set-aside one but without its manifest (a user's, or a copy) is not
    deleted as a leftover: the command refuses in one line and every file stays."""
    out = run_with_user_files
    (out / SET_ASIDE).mkdir()
    (out / SET_ASIDE / "mine.txt").write_text("keep me")
    before = tree(out)
    capsys.readouterr()
    assert main(tiny_args(out, data_dir, "--overwrite", "--max-steps", "1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{SET_ASIDE} holds files attnconv did not set aside (mine.txt)" in err[0], err
    assert tree(out) == before


def test_overwrite_replaces_only_when_the_new_run_checkpoints_a_run_being_replaced_says_where_the_old_one_is(
        run_with_user_files, capsys):
    """Between setting the old run aside and the new run's first checkpoint (or after a kill there), a command
    reading the run does not call it a run without a checkpoint: it names the folder holding the old run and
    the command that puts it back; nothing moves."""
    out = run_with_user_files
    lock = loop.DirectoryLock(out)
    names = claim_run_dir(out, lock, resume=False, overwrite=True)
    lock.release()
    SetAside(out, names).move()
    (out / "config.json").write_bytes((out / SET_ASIDE / "config.json").read_bytes())  # the new run's first files
    before = tree(out)
    capsys.readouterr()
    assert main(["eval", str(out)]) == 2
    _one_error(capsys, f"{out}: no whole run: a `train --overwrite` into {out} has not reached its first "
                       f"checkpoint", f"kept in {out / SET_ASIDE}", f"`attnconv train --out {out} --resume` puts it back")
    assert tree(out) == before
    # compare took a folder without the new run's metrics.csv for no run ("holds no run"), and left such a seed
    # out of a group in silence (exit 0, one seed fewer)
    group = out.parent / "group"
    shutil.copytree(out, group / "seed1", symlinks=True)
    shutil.copytree(out / SET_ASIDE, group / "seed0")
    for folder, replaced in ((out, out), (group, group / "seed1")):
        assert main(["compare", str(folder)]) == 2
        _one_error(capsys, f"{replaced}: no whole run: a `train --overwrite` into {replaced} has not reached")
    # readers of the logs alone (`table` without --recompute, `compare`) showed the killed new run's rows, or
    # "metrics.csv has no finished epoch yet": the same line
    (out / "metrics.csv").write_bytes((out / SET_ASIDE / "metrics.csv").read_bytes()[:120])  # a row of the new run
    before = tree(out)
    for command in (["table", str(out)], ["compare", str(out)], ["analyze", str(out)]):
        assert main(command) == 2, command
        _one_error(capsys, f"{out}: no whole run: a `train --overwrite` into {out} has not reached its first "
                           "checkpoint", f"`attnconv train --out {out} --resume` puts it back")
    assert tree(out) == before


def test_overwrite_replaces_only_when_the_new_run_checkpoints_init_from_its_own_folder_is_refused(
        tmp_path, data_dir, capsys, monkeypatch):  # noqa: F811
    """`train --init-from CNN --out CNN --overwrite` would replace the CNN run by the run started from it (its
    record then naming itself as its source): refused in one line, the CNN run as it was."""
    cnn = tmp_path / "cnn"
    assert main(["train", "--model", "resnet18", "--width", "4", "--dataset", "fashion-mnist", "--data-dir",
                 str(data_dir), "--epochs", "1", "--max-steps", "1", "--batch-size", "32", "--workers", "1",
                 "--no-progress", "--out", str(cnn)]) == 0
    before = tree(cnn)
    for spelled in (str(cnn), f"{tmp_path}/./cnn/"):
        capsys.readouterr()
        assert main(["train", "--init-from", spelled, "--out", str(cnn), "--overwrite", "--max-steps", "1",
                     "--no-progress"]) == 2
        _one_error(capsys, f"--init-from {os.path.abspath(spelled)} is --out itself", "give another --out")
        assert tree(cnn) == before
    # A run started from the CNN and killed before its first checkpoint (config.json alone) starts again from the
    # CNN's weights on --resume; the CNN folder moved, or a file in its place, said "not a run directory ...; give
    # the folder that `attnconv train --out` wrote", which no flag of a resume can do: it says to move it back.
    run = tmp_path / "attn"
    monkeypatch.chdir(tmp_path)  # named relative to here: recorded whole, so a resume from elsewhere finds it
    assert main(["train", "--init-from", "cnn", "--out", str(run), "--max-steps", "1", "--no-progress"]) == 0
    assert json.loads((run / "config.json").read_text())["config"]["init_from"]["run"] == str(cnn)
    monkeypatch.chdir(tmp_path / "attn")
    for name in ("model.safetensors", "state.pt", "metrics.csv", "steps.csv", "heads.jsonl"):
        (run / name).unlink(missing_ok=True)
    cnn.rename(tmp_path / "moved")
    for now in ("gone", "a file now"):
        capsys.readouterr()
        assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 2
        _one_error(capsys, f"{cnn}: the CNN run this run starts from", f"is {now}", f"move the CNN run back to {cnn}")
        cnn.write_text("not a run")
    cnn.unlink()
    # another CNN run in its place (another width): its sound weights were blamed ("restore it from a copy")
    assert main(["train", "--model", "resnet18", "--width", "8", "--dataset", "fashion-mnist", "--data-dir",
                 str(data_dir), "--epochs", "1", "--max-steps", "1", "--batch-size", "32", "--workers", "1",
                 "--no-progress", "--out", str(cnn)]) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 2
    _one_error(capsys, f"{cnn}: the CNN run this run starts from", "now holds another network than the one this run "
               "started from", f"move the CNN run it started from back to {cnn}")
    # another run of the same network (seed 7) in its place: it was used without a word; config.json records a
    # digest of the weights the run started from (init_from_weights), and a resume compares it
    shutil.rmtree(cnn)
    assert main(["train", "--model", "resnet18", "--width", "4", "--dataset", "fashion-mnist", "--data-dir",
                 str(data_dir), "--epochs", "1", "--max-steps", "1", "--batch-size", "32", "--workers", "1",
                 "--seed", "7", "--no-progress", "--out", str(cnn)]) == 0
    assert len(json.loads((run / "config.json").read_text())["init_from_weights"]) == 64
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 2
    _one_error(capsys, f"{cnn}: the CNN run this run starts from", "holds other weights than those this run started "
               "from (model.safetensors differs", f"move the CNN run it started from back to {cnn}")
    shutil.rmtree(cnn)
    (tmp_path / "moved").rename(cnn)
    # the CNN run damaged where it is (its weights gone): its own line, not "holds another network"
    (cnn / "model.safetensors").rename(tmp_path / "weights")
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "another network" not in err and err.count("\n") == 1, err
    (tmp_path / "weights").rename(cnn / "model.safetensors")
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    assert main(["eval", str(run)]) == 0  # config.json with its digest is what the weights record


def test_compare_refuses_a_run_counted_twice_or_a_seed_that_is_left_out(finished, tmp_path, capsys):
    """`compare` counted a seed that is a link to another, or a copy of one, as a second seed (a wrong mean and
    spread), and left out in silence a seed that is a link to nothing or a run whose metrics.csv is gone."""
    group = tmp_path / "group"
    shutil.copytree(finished, group / "seed0")

    def logs(p, **config):  # the seed's committed logs (a run of its own: its own losses and heads), config edited
        p.mkdir()
        snaps = [json.loads(line) for line in (group / "seed0" / "heads.jsonl").read_text().splitlines()]
        for s in snaps:
            s["layers"][0][0]["attention_distance"] += 1e-3
        (p / "heads.jsonl").write_text("".join(json.dumps(s) + "\n" for s in snaps))
        rows = read_metrics(group / "seed0")
        rows[-1]["train_loss"] += 1e-3
        (p / "metrics.csv").write_text(metrics_text(rows))
        meta = json.loads((group / "seed0" / "config.json").read_text())
        meta["config"].update(config)
        (p / "config.json").write_text(json.dumps(meta))

    lr = json.loads((finished / "config.json").read_text())["config"]["lr"]
    for seed, make, want in (
            ("seed1", lambda p: p.symlink_to(group / "seed0"), "give each run once"),
            ("seed1", lambda p: shutil.copytree(group / "seed0", p), "give each run once"),
            ("seed9", lambda p: p.symlink_to(tmp_path / "nowhere"), "which does not exist"),
            ("seed5", lambda p: (shutil.copytree(group / "seed0", p), (p / "metrics.csv").unlink()),
             "metrics.csv is missing, while"),
            # another configuration in the group: one mean over two networks (and "a copy" for another seed 0)
            ("seed2", lambda p: logs(p, seed=2, lr=lr * 3), f"are runs of other configurations (lr {lr!r} -> "
                                                            f"{lr * 3!r}): a group's runs differ only by their seed"),
            ("seed3", lambda p: logs(p, lr=lr * 3), "are runs of other configurations"),
            ("seed4", lambda p: p.symlink_to("/dev/null"), "seed4: not a run directory (a link to /dev/null, which is "
                                                           "a character device)"),  # was left out in silence
            ("seed6", lambda p: (shutil.copytree(group / "seed0", p), (p / "config.json").unlink()),  # was counted
             "config.json is missing, while")):
        make(group / seed)
        capsys.readouterr()
        assert main(["compare", str(group)]) == 2, seed
        err = capsys.readouterr().err
        assert want in err and err.count("\n") == 1, (seed, err)
        path = group / seed
        path.unlink() if path.is_symlink() or path.is_file() else shutil.rmtree(path)
    (group / "seeds.txt").write_text("0")  # a user's notes beside the seeds: a run is a folder, so none is left out
    assert main(["compare", str(group)]) == 0


# ---------------------------------------------------------------------------------- class 7: data by content


def _folder_run(tmp_path, monkeypatch):
    from fixtures_data import write_image_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_image_folder(tmp_path / "imgs")
    out = tmp_path / "run"
    args = ["train", "--model", "sa-quadratic", "--dataset", f"folder:{tmp_path / 'imgs'}", "--hidden", "8",
            "--layers", "1", "--heads", "4", "--intermediate", "8", "--batch-size", "4", "--workers", "1",
            "--no-progress", "--epochs", "1", "--out", str(out)]
    assert main(args) == 0
    return out, args


def _one_error(capsys, *pieces):
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and all(p in err for p in pieces), (err, pieces)


def test_run_knows_its_data_by_content_labels_swapped_refuse_resume(tmp_path, monkeypatch, capsys):
    out, args = _folder_run(tmp_path, monkeypatch)
    digest = read_config(out)["data"]["digest"]
    assert sorted(digest) == ["test", "test_unordered", "train", "train_unordered"] and all(len(v) == 32 for v in digest.values())
    train = tmp_path / "imgs" / "train"
    os.rename(train / "cat" / "cat0.png", train / "dog" / "cat0.png")  # two images change class: same counts,
    os.rename(train / "dog" / "dog0.png", train / "cat" / "dog0.png")  # same pixels, same normalization
    before = tree(out)
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    _one_error(capsys, "the dataset changed since this run started (the training images' content: an image or a "
                       "label differs)", "--allow-data-change")
    assert tree(out) == before
    assert main([*args, "--resume", "--allow-data-change"]) == 0  # asked for: the (finished) run goes on


def test_run_knows_its_data_by_content_a_replaced_test_image_stops_eval(tmp_path, monkeypatch, capsys):
    from PIL import Image

    out, _ = _folder_run(tmp_path, monkeypatch)
    image = tmp_path / "imgs" / "test" / "cat" / "cat0.png"
    size = Image.open(image).size
    Image.fromarray(np.random.default_rng(7).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(image)
    capsys.readouterr()
    assert main(["eval", str(out)]) == 2
    _one_error(capsys, "the dataset changed since training (the test images' content: an image or a label "
                       "differs)", "--allow-data-change")
    assert main(["eval", str(out), "--allow-data-change"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: ") and captured.err.count("\n") == 1 and "test acc" in captured.out
    assert "the test images' content" in captured.err


def test_run_knows_its_data_by_content_analyses_of_changed_test_data_say_so_in_one_warning(
        tmp_path, monkeypatch, capsys):
    """report, plot and explore read the run's test images as they are now: when they are not what the run
    was trained with, one `warning:` line says so (analysing a run on changed data can be intended: exit 0);
    on the data the run recorded, nothing is said."""
    from PIL import Image

    out, _ = _folder_run(tmp_path, monkeypatch)
    commands = [["report", str(out), "--out", str(tmp_path / "r.html")],
                ["plot", "maps", str(out), "--image", "0", "--out", str(tmp_path / "m.png")],
                ["explore", str(out), "--export", str(tmp_path / "e.html"), "--images", "2"]]
    capsys.readouterr()
    for argv in commands:  # the data as recorded: no warning
        assert main(argv) == 0, argv
        assert capsys.readouterr().err == "", argv
    note = "The test data differs from what the run was trained with"
    assert note not in (tmp_path / "r.html").read_text()
    image = tmp_path / "imgs" / "test" / "cat" / "cat0.png"
    size = Image.open(image).size
    Image.fromarray(np.random.default_rng(7).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(image)
    for argv in commands:
        assert main(argv) == 0, argv
        err = capsys.readouterr().err.splitlines()
        assert err == [f"warning: {out}: the test data differs from the run's (the test images' content: an image "
                       "or a label differs); what follows is of the data as it is now"], argv
    # The page outlives the warning line: its test section says so too.
    assert f"{note} (the test images&#x27; content: an image or a label differs)" in (tmp_path / "r.html").read_text()


def test_run_knows_its_data_by_content_a_digest_that_is_no_digest_is_a_corrupt_config(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    meta = json.loads((out / "config.json").read_text())
    meta["data"]["digest"] = {"train": "x", "test": meta["data"]["digest"]["test"]}
    (out / "config.json").write_text(json.dumps(meta))
    with pytest.raises(AttnconvError, match='"data" digest .* is not'):
        read_config(out)


def _drop_line(path: Path, number: int) -> None:
    lines = path.read_text().splitlines(keepends=True)
    del lines[number]
    path.write_text("".join(lines))


@pytest.mark.parametrize("log,line,expected", [
    ("metrics.csv", 1, "metrics.csv: holds 0 rows, the checkpoint counts 1"),
    ("steps.csv", 2, "steps.csv: holds 1 row, the checkpoint counts 2"),
    ("heads.jsonl", 0, "heads.jsonl: holds 1 line, the checkpoint counts 2"),
    ("steps.csv", 1, "steps.csv: row 2 is of step 9, after the checkpoint's step 8"),
])
def test_run_knows_its_data_by_content_logs_that_lost_rows_are_refused_on_resume(
        finished, tmp_path, data_dir, capsys, log, line, expected):  # noqa: F811
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    if "after the checkpoint" in expected:  # a row logged after the checkpoint (a kill left it), one before it gone
        with open(out / "steps.csv", "a") as f:
            f.write("9,2,1.0,0.5,0.001,100,1.0\n")
        assert [r["step"] for r in read_steps(out)] == [3, 6, 9]
    _drop_line(out / log, line)
    before = tree(out)
    capsys.readouterr()
    assert main(tiny_args(out, data_dir, *ONE_EPOCH, "--resume")) == 2
    _one_error(capsys, expected, "restore the file from a copy of the run")
    assert tree(out) == before


# ---------------------------------------------------------------------------------- class 4: TensorBoard


def test_background_writers_fail_as_one_line_a_file_where_the_folder_should_be(  # noqa: F811
        finished, tmp_path, data_dir, capsys):  # noqa: F811
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "tensorboard").write_text("a file of mine")
    before = tree(out)
    capsys.readouterr()
    assert main(tiny_args(out, data_dir, *ONE_EPOCH, "--resume", "--tensorboard")) == 2
    _one_error(capsys, "--tensorboard: ", "tensorboard is a file, not a folder")
    assert tree(out) == before
    assert main(tiny_args(out, data_dir, "--overwrite", "--max-steps", "1")) == 0  # without --tensorboard: not ours
    assert (out / "tensorboard").read_text() == "a file of mine"
    (out / "tensorboard").unlink()
    (out / "tensorboard").symlink_to(tmp_path / "nowhere")  # was "is a file"
    capsys.readouterr()
    assert main(tiny_args(out, data_dir, "--max-steps", "1", "--resume", "--tensorboard")) == 2
    _one_error(capsys, "--tensorboard: ", f"tensorboard is a link to {tmp_path / 'nowhere'}, which does not exist, not a "
               "folder")
    (tmp_path / "nowhere").mkdir()  # round 82: a link to a folder: a failed run left its event file there
    before = tree(tmp_path / "nowhere")
    assert main(tiny_args(out, data_dir, "--max-steps", "1", "--resume", "--tensorboard")) == 2
    _one_error(capsys, "--tensorboard: ", f"tensorboard is a link to {tmp_path / 'nowhere'}, and a run's event files go "
               "in a folder of its own")
    assert tree(tmp_path / "nowhere") == before


FAILING_WRITES = """
import errno, sys
from tensorboard.summary.writer import record_writer
from attnconv.cli import main

real, calls = record_writer.RecordWriter.write, []

def write(self, data):  # the event file's first records go through, then the disk is full
    calls.append(1)
    if len(calls) > 10:
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(self, data)

record_writer.RecordWriter.write = write
sys.exit(main(sys.argv[1:]))
"""


def test_background_writers_fail_as_one_line_when_the_event_file_cannot_be_written(tmp_path, data_dir):  # noqa: F811
    """The writer's thread fails (a full disk): no "Exception in thread" traceback, one error line naming the
    folder and the last good checkpoint, exit 2; the run's checkpoint is intact and resumable."""
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    args = tiny_args(out, data_dir, "--tensorboard", "--log-every", "1", "--checkpoint-every", "2")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", FAILING_WRITES, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1800)
    err = [line for line in proc.stderr.splitlines() if not line.startswith(("epoch ", "preset: ", "estimated time: "))]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception in thread" not in proc.stderr
    assert len(err) == 1 and err[0].startswith(f"error: --out {out}: could not write {out / 'tensorboard'} "
                                               "(no space left on the device"), proc.stderr
    step = load_state(out / "state.pt")["progress"]["step"]
    assert f"the last good checkpoint (step {step}) is intact" in err[0] and step > 0


def test_a_full_disk_while_a_log_line_is_appended_names_the_log(tmp_path, data_dir, monkeypatch, capsys):  # noqa: F811
    """A write to an open file that fails (a full disk: here the log is /dev/full) raises an OSError naming no file;
    the stop line said `could not write (no space left ...)`. It names the log now."""
    import errno

    from attnconv.fileio import append_synced
    from attnconv.training.logs import HeadsLog

    with pytest.raises(OSError) as caught:
        append_synced("/dev/full", "a line\n")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == "/dev/full"
    real = HeadsLog.__init__

    def onto_a_full_disk(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.path = Path("/dev/full")

    monkeypatch.setattr(HeadsLog, "__init__", onto_a_full_disk)
    out = tmp_path / "run"
    assert main(tiny_args(out, data_dir, "--max-steps", "1")) == 2
    _one_error(capsys, f"--out {out}: could not write /dev/full (no space left on the device")


# ---------------------------------------------------------------------------------- class 7: data by content, order


def _rename_within_class(folder: Path) -> None:
    """A file renamed in its class folder: the same images and labels, listed in another order."""
    first = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.endswith(".txt"))[0]
    os.rename(first, folder / f"zz-{first.name}")


def test_run_knows_its_data_by_content_a_renamed_test_image_is_the_same_test_data(tmp_path, monkeypatch, capsys):
    """The test split in another order (a file renamed within its class) is the same test data: `eval` measures
    it without a word, to the same accuracy; the run records both digests of both splits."""
    out, _ = _folder_run(tmp_path, monkeypatch)
    digest = read_config(out)["data"]["digest"]
    assert sorted(digest) == ["test", "test_unordered", "train", "train_unordered"]
    assert all(len(v) == 32 for v in digest.values())
    capsys.readouterr()
    assert main(["eval", str(out)]) == 0
    before = capsys.readouterr()
    assert before.err == "" and "test acc" in before.out
    _rename_within_class(tmp_path / "imgs" / "test" / "cat")
    assert main(["eval", str(out)]) == 0
    after = capsys.readouterr()
    assert after.err == "" and after.out == before.out


def test_run_knows_its_data_by_content_a_renamed_training_image_refuses_resume_naming_the_order(
        tmp_path, monkeypatch, capsys):
    """The training split in another order changes the shuffle: `train --resume` of an unfinished run refuses it
    in words that are true (its order, not its content), and goes on with --allow-data-change."""
    from fixtures_data import write_image_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_image_folder(tmp_path / "imgs")
    out = tmp_path / "run"
    args = ["train", "--model", "sa-quadratic", "--dataset", f"folder:{tmp_path / 'imgs'}", "--hidden", "8",
            "--layers", "1", "--heads", "4", "--intermediate", "8", "--batch-size", "4", "--workers", "1",
            "--no-progress", "--epochs", "1", "--max-steps", "1", "--out", str(out)]
    assert main(args) == 0
    _rename_within_class(tmp_path / "imgs" / "train" / "cat")
    before = tree(out)
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    _one_error(capsys, "the dataset changed since this run started (the training images' order (the same images and "
                       "labels, in another order: a file renamed?))", "--allow-data-change")
    assert tree(out) == before
    assert main([*args, "--resume", "--allow-data-change"]) == 0


def test_run_knows_its_data_by_content_an_old_record_cannot_tell_order_from_content(tmp_path, monkeypatch, capsys):
    """A run written before the order-free digests (its "digest" only "train" and "test") reads as before: a
    changed test image, or a renamed one (it cannot tell), is refused by `eval`, in words that say both."""
    from fixtures_runs import rerecord
    from PIL import Image

    out, _ = _folder_run(tmp_path, monkeypatch)
    meta = json.loads((out / "config.json").read_text())
    meta["data"]["digest"] = {k: meta["data"]["digest"][k] for k in ("train", "test")}
    (out / "config.json").write_text(json.dumps(meta))
    rerecord(out)  # the weights' record of config.json: as written then
    capsys.readouterr()
    assert main(["eval", str(out)]) == 0 and capsys.readouterr().err == ""  # the data as recorded
    _rename_within_class(tmp_path / "imgs" / "test" / "cat")
    assert main(["eval", str(out)]) == 2
    _one_error(capsys, "the dataset changed since training (the test images' content: an image, a label or their "
                       "order differs)", "--allow-data-change")
    image = sorted((tmp_path / "imgs" / "test" / "dog").iterdir())[0]
    size = Image.open(image).size
    Image.fromarray(np.random.default_rng(7).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(image)
    assert main(["eval", str(out)]) == 2
    _one_error(capsys, "(the test images' content: an image, a label or their order differs)")


@pytest.mark.parametrize("value", ["x", 7, "0" * 31, "A" * 32, None])
def test_run_knows_its_data_by_content_an_unordered_digest_that_is_no_digest_is_a_corrupt_config(
        finished, tmp_path, value):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    meta = json.loads((out / "config.json").read_text())
    assert len(meta["data"]["digest"]["test_unordered"]) == 32
    meta["data"]["digest"]["test_unordered"] = value
    (out / "config.json").write_text(json.dumps(meta))
    with pytest.raises(AttnconvError, match='"data" digest test_unordered .* is not 32 hex digits'):
        read_config(out)
    del meta["data"]["digest"]["test_unordered"], meta["data"]["digest"]["train_unordered"]  # an old run's record
    (out / "config.json").write_text(json.dumps(meta))
    assert sorted(read_config(out)["data"]["digest"]) == ["test", "train"]


def _fresh_copy(finished: Path, tmp_path: Path) -> Path:
    """tmp_path/run: a copy of the finished run, made anew."""
    run = tmp_path / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(finished, run)
    return run


def _only_error(capsys, argv) -> str:
    """The one `error:` line of a CLI command that must exit 2."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), (argv, err)
    return err[0]


def _flip_inside(path: Path, start: int, end: int) -> None:
    """One byte of `path` inverted, halfway between offsets `start` and `end`."""
    data = bytearray(path.read_bytes())
    data[(start + end) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_round_38_s1_a_byte_changed_inside_a_checkpoint_tensor_is_corrupt(finished, data_dir, tmp_path,  # noqa: F811
                                                                          capsys):
    """A byte flipped inside a tensor of state.pt was resumed from (or stopped the run as "non-finite" with the
    checkpoint called intact), and one inside model.safetensors gave other numbers: neither file had a checksum
    of its tensors. state.pt's zip records carry torch's CRC-32s (torch does not check them; `load_state` does)
    and model.safetensors records a checksum of its tensors in its metadata."""
    import zipfile

    from safetensors.torch import load_file, save_file

    out = tmp_path / "run"
    shutil.copytree(finished, out)
    with zipfile.ZipFile(out / "state.pt") as archive:  # the largest tensor's record
        record = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        start = record.header_offset + 30 + len(record.filename.encode()) + len(record.extra)
    sound = (out / "state.pt").read_bytes()
    _flip_inside(out / "state.pt", start, start + record.file_size)
    before = tree(out)
    for argv in (tiny_args(out, data_dir, *ONE_EPOCH, "--resume"),):
        capsys.readouterr()
        code = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, (argv, err)
        assert f"{out / 'state.pt'}: cannot read the training state: the file is corrupt (the bytes of its record " \
               f"{record.filename} are not the ones written" in err[0], err
        assert err[0].endswith("restore it from a copy of the run; without it the run cannot be resumed: train it "
                               "again into a new --out, or over this one with --overwrite"), err
    assert tree(out) == before
    with pytest.raises(AttnconvError, match="record archive/data/"):
        load_state(out / "state.pt")
    (out / "state.pt").write_bytes(sound)

    path = out / "model.safetensors"
    size = int.from_bytes(path.read_bytes()[:8], "little")
    _flip_inside(path, 8 + size, path.stat().st_size)
    for argv in (["eval", str(out), "--data-dir", str(data_dir)], ["analyze", str(out)]):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0] == (
            f"error: {path}: corrupt weights file (its tensors' bytes are not the ones written: the file changed on "
            f"disk since (a damaged disk or copy, or an edit)); restore it from a copy of the run, or `attnconv train "
            f"--out {out} --resume` writes it anew from state.pt"), err
    # Weights without a checksum (written before it, or by another tool) read as before; one written with a
    # checksum is whole again once rewritten; a state written where torch's CRCs were turned off still has them.
    from attnconv.runs.files import CHECKSUM_KEY, META_CHECKSUM_KEY, state_bytes

    tensors = load_file(str(finished / "model.safetensors"))
    save_file(tensors, str(path), metadata={k: v for k, v in _metadata(finished).items()
                                            if k not in (CHECKSUM_KEY, META_CHECKSUM_KEY)})
    assert main(["analyze", str(out)]) == 0
    crc = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        data = state_bytes(load_state(finished / "state.pt"))
    finally:
        torch.serialization.set_crc32_options(crc)
    (out / "state.pt").write_bytes(data)
    assert load_state(out / "state.pt")["progress"]["step"] == load_state(finished / "state.pt")["progress"]["step"]


def _metadata(run_dir: Path) -> dict[str, str]:
    from attnconv.runs.files import weights_metadata

    return weights_metadata((Path(run_dir) / "model.safetensors").read_bytes())


def test_round_39_logs_that_are_not_the_checkpoints_are_named_and_an_older_copy_of_the_weights_is_written_anew(
        data_dir, tmp_path, capsys):  # noqa: F811
    """metrics.csv or heads.jsonl cut at a line, an older copy, or a sibling run's (another seed) were read by `table`,
    `compare`, `report` and `analyze` as the run's (`table` showing 1 epoch of 2, or the sibling's accuracy), exit 0.
    Each checkpoint now records the logs it was written after (their row counts and digests) in model.safetensors;
    the readers compare. `train --resume` of a finished run whose model.safetensors was an older copy said "already
    finished" and left it: it is written anew from state.pt, as a cut one is. `report` said the heads were recorded
    at initialization when heads.jsonl had no such line. A backslash in a name was shown as is, so `a\\nb.png` passed
    for the name with a newline."""
    from safetensors.torch import load_file, save_file

    from attnconv.cli import one_line
    from attnconv.runs.files import weights_metadata

    runs = {}
    for seed in ("0", "1"):
        runs[seed] = tmp_path / f"seed{seed}"
        assert main(tiny_args(runs[seed], data_dir, "--seed", seed, "--log-every", "3")) == 0
    run = tmp_path / "run"

    metrics, heads = run / "metrics.csv", run / "heads.jsonl"
    for edit, file, argv, said in (
            ("cut", metrics, ["table", run], "it holds 1 row, and the run's last checkpoint was written after 2: "
                                             "rows were lost (cut short, or an older copy of the file)"),
            ("sibling", metrics, ["table", run], "its first 2 rows are not what the run's last checkpoint was written after "
                                                 "(another run's, or an edited copy)"),
            ("cut", heads, ["analyze", run], "it holds 2 snapshots, and the run's last checkpoint was written after 3"),
            ("sibling", heads, ["analyze", run], "its first 3 snapshots are not what the run's last checkpoint was"),
            ("sibling", heads, ["compare", run, runs["1"]], "its first 3 snapshots are not what")):
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(runs["0"], run)
        lines = file.read_text().splitlines(keepends=True)
        file.write_text("".join(lines[:-1]) if edit == "cut" else (runs["1"] / file.name).read_text())
        line = _only_error(capsys, argv)
        assert line.startswith(f"error: {file}: {said}"), line

    shutil.rmtree(run)
    shutil.copytree(runs["0"], run)  # the weights of an older step (their metadata says so), state.pt at the last
    weights_path = run / "model.safetensors"
    meta = weights_metadata(weights_path.read_bytes())
    save_file(load_file(str(weights_path)), str(weights_path), metadata=sealed_metadata({**meta, "step": "3"}))
    capsys.readouterr()
    assert main(tiny_args(run, data_dir, "--seed", "0", "--log-every", "3", "--resume")) == 0
    err = capsys.readouterr().err
    assert "model.safetensors held the weights of step 3, not the checkpoint's 16 (an older copy, or another run's): " \
           "written anew from state.pt" in err, err
    assert main(["eval", str(run), "--data-dir", str(data_dir)]) == 0

    from attnconv.report import _recorded_when

    assert _recorded_when([0, 1, 2]) == "at initialization (epoch 0) and after each epoch"
    assert "no line from initialization (epoch 0)" in _recorded_when([1, 2])
    assert one_line("a\\nb.png") == "a\\\\nb.png" and one_line("a\nb.png") == "a\\nb.png"


def test_round_40_a_last_line_without_its_newline_that_the_checkpoint_counts_is_whole_and_weights_failing_their_checksum_are_rewritten(  # noqa: E501
        finished, data_dir, tmp_path, capsys):  # noqa: F811
    """metrics.csv or heads.jsonl saved again without the final newline (as editors and CSV tools save them) lost
    their last row, read as cut short by a crash, and since each checkpoint records the logs it was written after,
    `table`, `report` and `train --resume` refused the run as rows lost. A last line the checkpoint counts and
    recorded is whole. `train --resume` of a finished run whose model.safetensors fails its checksum said "already
    finished" and left it: it is written anew from state.pt."""
    from safetensors.torch import load_file, save_file

    from attnconv.runs.files import weights_metadata

    run = tmp_path / "run"
    for name in ("metrics.csv", "heads.jsonl"):
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(finished, run)
        whole = (run / name).read_bytes()
        (run / name).write_bytes(whole.rstrip(b"\n").replace(b"\n", b"\r\n"))  # CRLF, no final line end
        capsys.readouterr()
        for argv in (["table", str(run)], ["analyze", str(run)], tiny_args(run, data_dir, *ONE_EPOCH, "--resume")):
            assert main(argv) == 0, (name, argv, capsys.readouterr().err)
        assert "error" not in capsys.readouterr().err
    with open(run / "heads.jsonl", "ab") as f:  # blank lines at the end, as an editor leaves them: no damage
        f.write(b"\n\n")
    capsys.readouterr()
    assert main(["analyze", str(run)]) == 0 and "damaged" not in capsys.readouterr().err
    cut = run / "metrics.csv"  # a last row a crash cut short, which the checkpoint does not count: still dropped
    cut.write_bytes(cut.read_bytes() + b"2,16,2.3")
    assert main(["table", str(run)]) == 0

    shutil.rmtree(run)
    shutil.copytree(finished, run)
    path = run / "model.safetensors"
    tensors, meta = load_file(str(path)), weights_metadata(path.read_bytes())
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1  # other numbers under the recorded checksum: a byte changed on disk
    save_file(tensors, str(path), metadata=meta)
    capsys.readouterr()
    assert main(tiny_args(run, data_dir, *ONE_EPOCH, "--resume")) == 0
    assert "model.safetensors failed its checksum (bytes changed on disk): written anew from state.pt" in \
        capsys.readouterr().err
    assert main(["eval", str(run), "--data-dir", str(data_dir)]) == 0


def test_round_41_a_finished_runs_logs_are_not_rewritten_a_state_link_to_nowhere_is_named_and_odd_records_vouch_for_nothing(  # noqa: E501
        finished, data_dir, tmp_path, capsys):  # noqa: F811
    """`train --resume` of a finished run rewrote its logs (a column a user added, dropped); with state.pt a link to
    nowhere it trained the run again from step 0 over its logs. A record of the logs edited by hand (rows 0 with a
    digest, rows true) blamed a sound metrics.csv; a line of spaces at the end of metrics.csv made it corrupt;
    `compare` refused a heads.jsonl re-saved without its final newline, which the other readers take; `eval` of a
    run without model.safetensors offered `train --resume`, which a damaged state.pt then refused."""
    import json

    from safetensors.torch import load_file, save_file

    from attnconv.runs.files import weights_metadata

    run = _fresh_copy(finished, tmp_path)
    lines = (run / "metrics.csv").read_text().splitlines()
    mine = "\n".join([lines[0] + ",mine"] + [line + ",42" for line in lines[1:]]) + "\n"
    (run / "metrics.csv").write_text(mine)
    assert main(tiny_args(run, data_dir, *ONE_EPOCH, "--resume")) == 0
    assert (run / "metrics.csv").read_text() == mine

    run = _fresh_copy(finished, tmp_path)
    (run / "model.safetensors").unlink()
    (run / "state.pt").unlink()
    (run / "state.pt").symlink_to(tmp_path / "backup" / "state.pt")
    before = tree(run)
    line = _only_error(capsys, tiny_args(run, data_dir, *ONE_EPOCH, "--resume"))
    assert line.startswith(f"error: {run / 'state.pt'}: a link to {tmp_path / 'backup' / 'state.pt'}, which does not "
                           "exist; move it out of the run folder first"), line
    assert tree(run) == before and (run / "state.pt").is_symlink()

    run = _fresh_copy(finished, tmp_path)
    path = run / "model.safetensors"
    meta = weights_metadata(path.read_bytes())
    record = json.loads(meta["attnconv_logs"])
    for edit in ({"rows": 0}, {"rows": True}, {"metrics": None}, {"snapshots": -1}):
        save_file(load_file(str(path)), str(path),
                  metadata=sealed_metadata({**meta, "attnconv_logs": json.dumps({**record, **edit})}))
        capsys.readouterr()
        assert main(["table", str(run)]) == 0 and main(["analyze", str(run)]) == 0, (edit, capsys.readouterr().err)

    run = _fresh_copy(finished, tmp_path)
    with open(run / "metrics.csv", "a") as f:
        f.write("   \n\t\n")
    assert main(["table", str(run)]) == 0
    assert main(tiny_args(run, data_dir, *ONE_EPOCH, "--resume")) == 0

    group = tmp_path / "group"
    shutil.copytree(finished, group / "seed0")
    heads = group / "seed0" / "heads.jsonl"
    heads.write_bytes(heads.read_bytes().rstrip(b"\n"))
    capsys.readouterr()
    assert main(["compare", str(group)]) == 0, capsys.readouterr().err

    run = _fresh_copy(finished, tmp_path)
    (run / "model.safetensors").unlink()
    data = bytearray((run / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (run / "state.pt").write_bytes(bytes(data))
    line = _only_error(capsys, ["eval", run, "--data-dir", data_dir])
    assert f"{run / 'model.safetensors'}: missing, and state.pt, which could write it anew, cannot (" in line
    assert line.endswith("restore both from a copy of the run, or train the run again"), line


def test_round_42_resume_checks_the_logs_it_keeps_against_the_record_and_odd_records_vouch_for_nothing(
        finished, data_dir, tmp_path, capsys):  # noqa: F811
    """`train --resume` counted the logs but never compared them with the checkpoint's record, so an edited row was
    written into the next record and `table` showed the edited accuracy; a finished run's steps.csv saved without its
    final newline was refused as rows deleted; `eval` of a run without weights offered `--resume` where state.pt was
    another run's; records with counts the checkpoint's epoch cannot have, or a key given twice, blamed sound logs."""
    import json

    from safetensors.torch import load_file, save_file

    from attnconv.runs.files import weights_metadata

    run = _fresh_copy(finished, tmp_path)
    lines = (run / "metrics.csv").read_text().splitlines()
    fields = lines[1].split(",")
    fields[lines[0].split(",").index("test_acc")] = "0.9375"  # an edited accuracy
    (run / "metrics.csv").write_text("\n".join([lines[0], ",".join(fields), *lines[2:]]) + "\n")
    before = tree(run)
    capsys.readouterr()
    assert main(tiny_args(run, data_dir, *ONE_EPOCH, "--resume")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {run / 'metrics.csv'}: its first row is not what the run's "
                                               "last checkpoint was written after"), err
    assert tree(run) == before

    run = _fresh_copy(finished, tmp_path)
    steps = run / "steps.csv"
    steps.write_bytes(steps.read_bytes().rstrip(b"\n"))
    assert main(tiny_args(run, data_dir, *ONE_EPOCH, "--resume")) == 0

    run = _fresh_copy(finished, tmp_path)
    (run / "model.safetensors").unlink()
    (tmp_path / "other").mkdir()
    assert main(tiny_args(tmp_path / "other" / "run", data_dir, *ONE_EPOCH, "--lr", "0.003")) == 0
    shutil.copy(tmp_path / "other" / "run" / "state.pt", run / "state.pt")
    capsys.readouterr()
    assert main(["eval", str(run), "--data-dir", str(data_dir)]) == 2
    assert "state.pt, which could write it anew, cannot (it is another run's" in capsys.readouterr().err

    run = _fresh_copy(finished, tmp_path)
    path = run / "model.safetensors"
    meta = weights_metadata(path.read_bytes())
    record = json.loads(meta["attnconv_logs"])
    for text in (json.dumps({**record, "rows": 5}), json.dumps({**record, "snapshots": 9}),
                 json.dumps(record)[:-1] + ', "rows": 1}'):
        save_file(load_file(str(path)), str(path), metadata=sealed_metadata({**meta, "attnconv_logs": text}))
        capsys.readouterr()
        assert main(["table", str(run)]) == 0 and main(["analyze", str(run)]) == 0, (text, capsys.readouterr().err)


def test_round_43_the_checkpoint_keeps_its_logs_record_in_state_pt_and_its_metadata_under_a_checksum(
        finished, data_dir, tmp_path, capsys):  # noqa: F811
    """A finished run's `--resume` printed a metrics.csv row past its last checkpoint as the run's result (and
    `analyze` offered that resume to cut it back); an epoch in the weights' metadata that `isdigit` takes and `int`
    refuses was a traceback; a byte changed on disk inside the logs record passed the tensors' checksum and blamed
    sound logs; weights deleted or damaged beside edited logs were written anew from state.pt with a record of the
    edited logs, which `table` then showed as the run's. state.pt now keeps the record, the metadata has a checksum
    of its own, and a finished run has no row past its last checkpoint."""
    from safetensors.torch import load_file, save_file

    from attnconv.runs.files import weights_metadata

    # A1: a row past a finished run's last checkpoint.
    run = _fresh_copy(finished, tmp_path)
    lines = (run / "metrics.csv").read_text().splitlines()
    names, row = lines[0].split(","), lines[-1].split(",")
    row[names.index("epoch")], row[names.index("step")], row[names.index("test_acc")] = "2", "16", "0.99"
    (run / "metrics.csv").write_text("\n".join([*lines, ",".join(row)]) + "\n")
    before = tree(run)
    err = _only_error(capsys, tiny_args(run, data_dir, *ONE_EPOCH, "--resume"))
    assert err.startswith(f"error: {run / 'metrics.csv'}: row 2 (step 16) comes after the finished run's last "
                          "checkpoint (step 8)") and "delete its rows after the first 1" in err, err
    err = _only_error(capsys, ["analyze", run])
    assert "delete its rows after step 8" in err and "--resume" not in err, err
    assert tree(run) == before

    # A2: epochs no checkpoint writes vouch for nothing, in one piece.
    for epoch in ("\u00b3", "9" * 5000):
        run = _fresh_copy(finished, tmp_path)
        path = run / "model.safetensors"
        save_file(load_file(str(path)), str(path),
                  metadata=sealed_metadata({**weights_metadata(path.read_bytes()), "epoch": epoch}))
        capsys.readouterr()
        assert main(["table", str(run)]) == 0, capsys.readouterr().err
        assert main(tiny_args(run, data_dir, *ONE_EPOCH, "--resume")) == 0, capsys.readouterr().err

    # A3: a byte changed inside the metadata is damage: sound logs are not blamed, eval names the weights, and a
    # finished run's resume writes them anew.
    run = _fresh_copy(finished, tmp_path)
    path = run / "model.safetensors"
    data = bytearray(path.read_bytes())
    at = data.index(b'metrics\\": \\"') + 14
    data[at] = ord("0") if data[at] != ord("0") else ord("1")
    path.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["table", str(run)]) == 0, capsys.readouterr().err
    err = _only_error(capsys, ["eval", run, "--data-dir", data_dir])
    assert "model.safetensors" in err and "its metadata is not what was written" in err, err
    capsys.readouterr()
    assert main(tiny_args(run, data_dir, *ONE_EPOCH, "--resume")) == 0
    assert "model.safetensors failed its checksum (bytes changed on disk): written anew" in capsys.readouterr().err
    assert weights_metadata(path.read_bytes())["attnconv_logs"] == weights_metadata(
        (finished / "model.safetensors").read_bytes())["attnconv_logs"]

    # A4: edited logs beside weights deleted or damaged: state.pt's record judges them, nothing is written anew.
    for loss in ("deleted", "cut"):
        run = _fresh_copy(finished, tmp_path)
        lines = (run / "metrics.csv").read_text().splitlines()
        row = lines[1].split(",")
        row[lines[0].split(",").index("test_acc")] = "0.9375"
        (run / "metrics.csv").write_text("\n".join([lines[0], ",".join(row), *lines[2:]]) + "\n")
        path = run / "model.safetensors"
        path.unlink() if loss == "deleted" else path.write_bytes(b"")
        before = tree(run)
        for argv in (tiny_args(run, data_dir, *ONE_EPOCH, "--resume"), ["table", run]):
            err = _only_error(capsys, argv)
            assert err.startswith(f"error: {run / 'metrics.csv'}: its first row is not what the run's last "
                                  "checkpoint was written after"), (loss, argv, err)
        assert tree(run) == before


def test_round_43_metrics_saved_with_padded_names_a_comma_ending_each_line_or_comma_space_read_as_written(
        finished, tmp_path):  # noqa: F811
    """Round 43's notes: metrics.csv saved by a tool that pads the header's names with spaces, ends every line with a
    comma, or separates fields by ", " was refused as `no lr column` or `'' is not a number`; the rows are the same."""
    run = _fresh_copy(finished, tmp_path)
    text = (run / "metrics.csv").read_text()
    sound = read_metrics(run)
    lines = text.splitlines()
    for saved in ("\n".join(line + "  " for line in lines), "\n".join(line + "," for line in lines),
                  text.replace(",", ", "), "\n".join(", ".join(f" {f} " for f in line.split(",")) for line in lines)):
        (run / "metrics.csv").write_text(saved + "\n")
        assert read_metrics(run) == sound, saved
    (run / "metrics.csv").write_text("\n".join(line + "," for line in lines[:1]) + "\n" + "\n".join(lines[1:]) + ",7\n")
    with pytest.raises(AttnconvError, match="fields, the header has"):  # a value in the empty column: not that form
        read_metrics(run)


def test_round_44_the_later_checkpoint_judges_the_logs_a_finished_run_has_none_past_it_and_deleted_logs_are_not_judged(
        finished, data_dir, tmp_path, capsys):  # noqa: F811
    """A finished run whose weights and a log were deleted (the readers' own fix for a damaged log) could not get its
    weights back: `--resume` refused the deleted log, which `eval` did not say; an older copy of model.safetensors
    beside the run's last state.pt made `table` judge the logs by the older record only (an edited or cut last row
    shown as the run's); a heads.jsonl line past a finished run's last checkpoint was read by `analyze` and `report`
    as its next epoch."""
    from safetensors.torch import load_file, save_file

    from attnconv.runs.files import state_bytes, weights_metadata
    from attnconv.runs.logs_record import logs_record

    # A1: weights and a log deleted in a finished run: the weights are written anew, the log is not judged.
    for log in ("metrics.csv", "heads.jsonl", "steps.csv"):
        run = _fresh_copy(finished, tmp_path)
        (run / "model.safetensors").unlink()
        (run / log).unlink()
        capsys.readouterr()
        assert main(tiny_args(run, data_dir, *ONE_EPOCH, "--resume")) == 0, (log, capsys.readouterr().err)
        assert "model.safetensors was missing: written anew from state.pt" in capsys.readouterr().err
        assert not (run / log).exists() and (run / "model.safetensors").is_file()
    # ... and where the run is unfinished, eval does not offer the resume that would refuse.
    run = _fresh_copy(finished, tmp_path)
    state = load_state(run / "state.pt")
    state["progress"]["finished"] = False
    (run / "state.pt").write_bytes(state_bytes(state))
    (run / "model.safetensors").unlink()
    (run / "metrics.csv").unlink()
    err = _only_error(capsys, ["eval", run, "--data-dir", data_dir])
    assert "so is metrics.csv, which the run's checkpoint counts: it cannot be resumed without them" in err, err

    # B1: an older copy of the weights (the checkpoint at step 5: no row, the first snapshot) beside the last state.pt.
    for edit in ("edited", "cut"):
        run = _fresh_copy(finished, tmp_path)
        path = run / "model.safetensors"
        older = {**weights_metadata(path.read_bytes()), "step": "5", "epoch": "0",
                 "attnconv_logs": logs_record(run, 0, 1)}
        save_file(load_file(str(path)), str(path), metadata=sealed_metadata(older))
        lines = (run / "metrics.csv").read_text().splitlines()
        if edit == "edited":
            row = lines[1].split(",")
            row[lines[0].split(",").index("test_acc")] = "0.9375"
            (run / "metrics.csv").write_text("\n".join([lines[0], ",".join(row)]) + "\n")
        else:
            (run / "metrics.csv").write_text(lines[0] + "\n")
        err = _only_error(capsys, ["table", run])
        assert f"{run / 'metrics.csv'}: " in err and "the run's last checkpoint was written after" in err, (edit, err)

    # C1: a heads.jsonl line past the last checkpoint of a run finished by --max-steps (its epoch within config's).
    run = tmp_path / "short"
    assert main(tiny_args(run, data_dir, "--epochs", "2", "--max-steps", "8", "--log-every", "3")) == 0
    last = json.loads((run / "heads.jsonl").read_text().splitlines()[-1])
    with open(run / "heads.jsonl", "a") as f:
        f.write(json.dumps({**last, "epoch": 2, "step": 16}) + "\n")
    for argv in (["analyze", run], ["report", run, "--out", tmp_path / "page.html"]):
        err = _only_error(capsys, argv)
        assert err.startswith(f"error: {run / 'heads.jsonl'}: it holds 1 snapshot after the 2 the finished run's "
                              "last checkpoint was written after"), err
    assert not (tmp_path / "page.html").exists()


def test_round_44_notes_damaged_weights_of_a_finished_run_offer_the_resume_that_writes_them_anew(
        finished, data_dir, tmp_path, capsys):  # noqa: F811
    """Round 44's notes: damaged weights were named with `restore it from a copy of the run, or train the run
    again`, not the `train --resume` that writes them anew from state.pt; offered only where it works (a finished
    run, its state.pt sound and its own), and it does."""
    run = _fresh_copy(finished, tmp_path)
    path = run / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-7])
    err = _only_error(capsys, ["eval", run, "--data-dir", data_dir])
    assert err.endswith(f"`attnconv train --out {run} --resume` writes it anew from state.pt"), err
    capsys.readouterr()
    assert main(tiny_args(run, data_dir, *ONE_EPOCH, "--resume")) == 0
    assert main(["eval", str(run), "--data-dir", str(data_dir)]) == 0
    path.write_bytes(path.read_bytes()[:-7])
    (run / "state.pt").write_bytes(b"junk")
    err = _only_error(capsys, ["eval", run, "--data-dir", data_dir])
    assert err.endswith("restore it from a copy of the run, or train the run again"), err


def test_round_45_a_damaged_heads_line_does_not_let_edited_snapshots_through_and_a_cache_entry_moved_meanwhile_is_no_error(
        finished, data_dir, tmp_path, capsys):  # noqa: F811
    """One damaged line in heads.jsonl turned off the check against the checkpoint's record, so an edited snapshot,
    another seed's, or one made up past a finished run's end was read as the run's (with only "skipped 1 damaged
    line"); two commands rebuilding one damaged cache entry at once failed the slower one on sound data ("free space
    there"). The record now holds a digest of each snapshot; an entry moved aside meanwhile is out of the way."""
    from attnconv.data.folder_cache import _move_aside

    lines = (finished / "heads.jsonl").read_text().splitlines()
    edited = json.loads(lines[1])
    edited["layers"][0][0]["center"] = [0.5, -0.5]
    short = tmp_path / "short"  # finished by --max-steps: a snapshot of epoch 2 is within config.json's epochs
    assert main(tiny_args(short, data_dir, "--epochs", "2", "--max-steps", "8", "--log-every", "3")) == 0
    past = [*(short / "heads.jsonl").read_text().splitlines(), json.dumps({**edited, "epoch": 2, "step": 16}), "{"]
    for name, run, text in (("edited", finished, [lines[0], json.dumps(edited), *lines[2:], "junk"]),
                            ("past the end", short, past)):
        run = _fresh_copy(run, tmp_path)
        (run / "heads.jsonl").write_text("\n".join(text) + "\n")
        err = _only_error(capsys, ["analyze", run])
        assert err.startswith(f"error: {run / 'heads.jsonl'}: its snapshot of epoch ") and \
            "is not one the run's last checkpoint was written after" in err, (name, err)
    for name, text in (("junk appended", [*lines, "junk"]), ("a counted line cut", [lines[0][:-9], *lines[1:]])):
        run = _fresh_copy(finished, tmp_path)
        (run / "heads.jsonl").write_text("\n".join(text) + "\n")
        capsys.readouterr()
        assert main(["analyze", str(run)]) == 0, (name, capsys.readouterr().err)
        assert "skipped 1 damaged line" in capsys.readouterr().err, name

    gone = tmp_path / "cache" / "entry"
    gone.parent.mkdir()
    _move_aside(gone)  # another process moved it first: no error, nothing left behind
    assert list(gone.parent.iterdir()) == []


def test_round_46_a_finished_runs_resume_takes_heads_jsonl_as_its_readers_do_and_a_file_in_place_of_a_cache_entry_is_rebuilt(
        finished, data_dir, tmp_path, capsys):  # noqa: F811
    """A finished run with damaged weights and one damaged heads.jsonl line: `eval` offered `train --resume`, which
    refused the line the readers skip ("without it the run cannot be resumed"); a damaged line beside a snapshot past
    config.json's epochs gave the skip warning and then an error; a file where a dataset cache entry belongs was
    blamed on permissions, never rebuilt."""
    from safetensors.torch import load_file, save_file

    from attnconv.data.folder_cache import closed_entry
    from attnconv.runs.files import weights_metadata

    run = _fresh_copy(finished, tmp_path)
    path = run / "model.safetensors"
    size = int.from_bytes(path.read_bytes()[:8], "little")
    _flip_inside(path, 8 + size, path.stat().st_size)
    lines = (run / "heads.jsonl").read_text().splitlines()
    (run / "heads.jsonl").write_text("\n".join([lines[0], "junk{", *lines[1:]]) + "\n")
    heads = (run / "heads.jsonl").read_bytes()
    assert "--resume` writes it anew" in _only_error(capsys, ["eval", run, "--data-dir", data_dir])
    capsys.readouterr()
    assert main(tiny_args(run, data_dir, *ONE_EPOCH, "--resume")) == 0, capsys.readouterr().err
    assert "written anew from state.pt" in capsys.readouterr().err
    assert (run / "heads.jsonl").read_bytes() == heads  # checked, never rewritten
    assert main(["eval", str(run), "--data-dir", str(data_dir)]) == 0
    edited = json.loads(lines[1])
    edited["layers"][0][0]["center"] = [0.5, -0.5]
    (run / "heads.jsonl").write_text("\n".join([lines[0], "junk{", json.dumps(edited)]) + "\n")
    err = _only_error(capsys, tiny_args(run, data_dir, *ONE_EPOCH, "--resume"))
    assert "is not one the run's last checkpoint was written after" in err, err

    run = _fresh_copy(finished, tmp_path)  # a record without the finished flag (written before it)
    record = json.loads(weights_metadata((run / "model.safetensors").read_bytes())["attnconv_logs"])
    record.pop("finished")
    save_file(load_file(str(run / "model.safetensors")), str(run / "model.safetensors"), metadata=sealed_metadata(
        {**weights_metadata((run / "model.safetensors").read_bytes()), "attnconv_logs": json.dumps(record)}))
    (run / "heads.jsonl").write_text("\n".join(["junk{", *lines, json.dumps({**edited, "epoch": 2, "step": 16})])
                                     + "\n")
    assert "lies past the run's 1 epoch" in _only_error(capsys, ["analyze", run])

    entry = tmp_path / "cache" / "attnconv" / "folders" / "key"
    entry.parent.mkdir(parents=True)
    entry.write_text("x")
    assert closed_entry(entry) is None  # damage, built anew: not another user's entry


def test_round_46_notes_more_than_one_row_past_a_checkpoint_is_not_the_runs(data_dir, tmp_path, capsys):  # noqa: F811
    """Round 46's notes: rows and snapshots past an unfinished run's checkpoint were not judged, although a run
    writes one at most after its last checkpoint (each epoch's row is followed by one): three made-up snapshots, or
    another seed's, were shown as the run's."""
    from safetensors.torch import load_file, save_file

    from attnconv.runs.files import weights_metadata

    run = tmp_path / "run"
    assert main(tiny_args(run, data_dir, "--epochs", "4", "--max-steps", "8", "--log-every", "3")) == 0
    path = run / "model.safetensors"
    meta = weights_metadata(path.read_bytes())
    record = json.loads(meta["attnconv_logs"])
    record.pop("finished")  # as an unfinished run's checkpoint records it
    save_file(load_file(str(path)), str(path), metadata=sealed_metadata({**meta, "attnconv_logs": json.dumps(record)}))
    lines = (run / "heads.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    one = json.dumps({**last, "epoch": 2, "step": 16})
    (run / "heads.jsonl").write_text("\n".join([*lines, one]) + "\n")
    capsys.readouterr()
    assert main(["analyze", str(run)]) == 0, capsys.readouterr().err  # one after the checkpoint: a stopped run's
    for extra in ([one, json.dumps({**last, "epoch": 3, "step": 24})], ["junk{", one, json.dumps({**last, "epoch": 3,
                                                                                                  "step": 24})]):
        (run / "heads.jsonl").write_text("\n".join([*lines, *extra]) + "\n")
        err = _only_error(capsys, ["analyze", run])
        assert err.startswith(f"error: {run / 'heads.jsonl'}: ") and ("the others are not the run's" in err or
                                                                      "is not one the run's" in err), err


def test_round_47_a_last_heads_line_without_its_newline_beside_a_damaged_one_and_the_snapshot_after_a_checkpoint(
        data_dir, tmp_path, capsys):  # noqa: F811
    """Round 47: a heads.jsonl saved without its final newline was read whole only while no other line was damaged
    (with a junk line the run's last snapshot was dropped too); in a run stopped between a row and its checkpoint, a
    damaged last recorded line made the snapshot logged after the checkpoint be blamed as an edited copy."""
    from attnconv.runs import Run

    run = tmp_path / "run"
    assert main(tiny_args(run, data_dir, "--epochs", "3", "--log-every", "3")) == 0
    lines = (run / "heads.jsonl").read_text().splitlines()
    (run / "heads.jsonl").write_text("\n".join([lines[0], "junk{", *lines[1:]]))  # no final newline
    with pytest.warns(AttnconvWarning, match="skipped 1 damaged line"):
        assert [s["epoch"] for s in Run(run).heads] == [0, 1, 2, 3]

    # An unfinished run's record (its checkpoint at epoch 2), a snapshot logged after it, the last recorded damaged.
    from safetensors.torch import load_file, save_file

    from attnconv.runs.files import weights_metadata
    from attnconv.runs.logs_record import logs_record

    (run / "heads.jsonl").write_text("\n".join(lines) + "\n")
    path = run / "model.safetensors"
    meta = weights_metadata(path.read_bytes())
    step = json.loads(lines[2])["step"]
    save_file(load_file(str(path)), str(path), metadata=sealed_metadata(
        {**meta, "step": str(step), "epoch": "2", "attnconv_logs": logs_record(run, 2, 3)}))
    (run / "state.pt").unlink()  # the weights' record judges
    (run / "heads.jsonl").write_text("\n".join([*lines[:2], "junk{", lines[3]]) + "\n")
    with pytest.warns(AttnconvWarning, match="skipped 1 damaged line"):
        assert [s["epoch"] for s in Run(run).heads] == [0, 1, 3]
    edited = json.loads(lines[2])
    edited["layers"][0][0]["center"] = [0.5, -0.5]
    (run / "heads.jsonl").write_text("\n".join([*lines[:2], "junk{", json.dumps(edited)]) + "\n")
    with pytest.raises(AttnconvError, match="is not one the run's last checkpoint was written after"):
        Run(run).heads  # noqa: B018 - an edited recorded snapshot is not one logged after the checkpoint


def _finished_with_first_state(tmp_path: Path, data: Path, monkeypatch) -> tuple[Path, Path]:
    """A finished 3-epoch run, and a copy of its first checkpoint's state.pt kept aside (an older copy of its own)."""
    run, older = tmp_path / "run", tmp_path / "older-state.pt"
    save = Checkpointer.save

    def keep_first(self, *args, **kwargs):
        save(self, *args, **kwargs)
        if not older.exists():
            shutil.copyfile(self.path, older)

    monkeypatch.setattr(Checkpointer, "save", keep_first)
    assert main(tiny_args(run, data, "--epochs", "3")) == 0
    monkeypatch.undo()
    return run, older


def test_round_48_a_finished_runs_resume_beside_an_older_copy_of_its_state(
        data_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Round 48: a finished run whose state.pt was an older checkpoint of the same run (a copy put back by hand) was
    trained again by `train --resume` from that step: its finished weights written anew and metrics.csv rewritten (a
    column the user added lost), where its readers take the finished weights. The later checkpoint decides."""
    run, older = _finished_with_first_state(tmp_path, data_dir, monkeypatch)
    with open(run / "metrics.csv", encoding="utf-8") as f:
        lines = f.read().splitlines()
    (run / "metrics.csv").write_text("\n".join([lines[0] + ",note", *(f"{x},{i}" for i, x in enumerate(lines[1:]))]) + "\n")
    shutil.copyfile(older, run / "state.pt")
    before = tree(run)
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "run already finished (" in err and "state.pt is an older checkpoint of it (step " in err, err
    assert "resuming" not in err and tree(run) == before
    # Weights of another run, or failing their checksum, do not decide: the resume goes on from state.pt.
    (run / "model.safetensors").write_bytes((run / "model.safetensors").read_bytes()[:-8] + b"\0" * 8)
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    assert "resuming" in capsys.readouterr().err
    assert read_metrics(run)[-1]["epoch"] == 3


def test_round_49_logs_beside_an_older_state_and_unread_weights_and_a_finished_resume_judging_heads(
        data_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Round 49: with state.pt an older checkpoint and model.safetensors damaged, deleted or a link to nowhere, the
    readers judged the sound logs by state.pt's record and said their later rows were not the run's and could be
    deleted (which lost the run's rows); a finished run's resume beside an older state.pt did not judge heads.jsonl
    (its readers refused a snapshot that was not the run's, the resume said "run already finished")."""
    from attnconv.runs import Run

    run, older = _finished_with_first_state(tmp_path, data_dir, monkeypatch)
    sound, weights = tree(run), run / "model.safetensors"
    shutil.copyfile(older, run / "state.pt")
    damaged = weights.read_bytes().replace(b'"step":"24"', b'"step":"25"', 1)
    assert damaged != weights.read_bytes()
    for damage in ("metadata", "deleted", "dangling", "directory"):
        weights.unlink(missing_ok=True)
        if damage == "metadata":
            weights.write_bytes(damaged)
        elif damage == "dangling":
            weights.symlink_to(tmp_path / "nowhere")
        elif damage == "directory":
            weights.mkdir()
        for read in (lambda r: r.metrics, lambda r: r.heads):
            with pytest.raises(AttnconvError) as err:
                read(Run(run))
            assert str(err.value).startswith(f"{weights}: the file ") and "--resume" in str(err.value), str(err.value)
            assert "can be deleted" not in str(err.value)
    assert "is a directory, and state.pt" in str(err.value)
    weights.rmdir()
    capsys.readouterr()  # the fix it gives works: the run continues from state.pt and ends as before
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    assert [r["test_acc"] for r in Run(run).metrics] == [r["test_acc"] for r in read_metrics_text(sound["metrics.csv"])]
    lines = (run / "heads.jsonl").read_text().splitlines()
    edited = json.loads(lines[2])
    edited["layers"][0][0]["attention_distance"] += 0.5
    (run / "heads.jsonl").write_text("\n".join([*lines[:2], json.dumps(edited), *lines[3:]]) + "\n")
    shutil.copyfile(older, run / "state.pt")
    before = tree(run)
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'heads.jsonl'}: " in err and "already finished" not in err, err
    assert tree(run) == before


def read_metrics_text(data: bytes) -> list[dict[str, float]]:
    import csv
    import io

    return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(data.decode()))]


def test_round_49_a_warning_made_an_error_by_the_users_filters_is_one_error_line(
        data_dir, tmp_path, capsys):  # noqa: F811
    """Round 49 (a note): under `PYTHONWARNINGS=error` (or -W error) a warning a command says (a damaged heads.jsonl
    line skipped) ended the command with a Python traceback; it is one `error:` line, exit 2."""
    import warnings

    run = tmp_path / "run"
    assert main(tiny_args(run, data_dir)) == 0
    with open(run / "heads.jsonl", "a", encoding="utf-8") as f:
        f.write("junk{\n")
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["analyze", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: AttnconvWarning: ") and "skipped 1 damaged line" in err, err


def test_round_50_a_runs_warnings_point_at_the_callers_line(data_dir, tmp_path):  # noqa: F811
    """Round 50 (a note): the warning that damaged heads.jsonl lines were skipped, read through `Run.heads` (a cached
    property), pointed at a line of functools, so filters by the caller's module or line did not apply."""
    import warnings

    from attnconv.runs import Run

    run = tmp_path / "run"
    assert main(tiny_args(run, data_dir)) == 0
    with open(run / "heads.jsonl", "a", encoding="utf-8") as f:
        f.write("junk{\n")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert len(Run(run).heads) == 3
    assert [(w.filename, w.category) for w in said] == [(__file__, AttnconvWarning)], [str(w.message) for w in said]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module=re.escape(__name__))
        assert len(Run(run).heads) == 3
    assert said == []


def test_round_50_unread_weights_beside_damaged_or_deleted_logs_and_eval_warnings_by_the_filters(
        data_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Round 50: with the weights missing and state.pt older, a damaged heads.jsonl line among those state.pt counts
    had a sound later snapshot called not the run's (a skipped line shifted the digests compared), and the fix
    offered, deleting the file, lost the history; with metrics.csv deleted, the readers offered a resume that
    refuses. `eval --allow-data-change` printed its warning past the warning filters."""
    import warnings

    from PIL import Image

    from attnconv.runs import Run

    run, older = _finished_with_first_state(tmp_path, data_dir, monkeypatch)
    (run / "model.safetensors").unlink()
    shutil.copyfile(older, run / "state.pt")
    lines = (run / "heads.jsonl").read_text().splitlines()
    (run / "heads.jsonl").write_text("\n".join(["junk{", *lines[1:]]) + "\n")  # one of the two state.pt counts
    with pytest.raises(AttnconvError) as err:
        Run(run).heads  # noqa: B018
    text = str(err.value)
    assert text.startswith(f"{run / 'model.safetensors'}: the file is missing") and "vouches for 1 snapshot" in text
    assert "--resume" not in text and "delete" not in text, text  # the resume refuses a damaged counted line
    (run / "heads.jsonl").write_text("\n".join(lines) + "\n")
    (run / "metrics.csv").unlink()
    with pytest.raises(AttnconvError) as err:
        Run(run).heads  # noqa: B018
    assert str(err.value).startswith(f"{run / 'model.safetensors'}: the file is missing")
    assert "--resume" not in str(err.value), str(err.value)

    out, _ = _folder_run(tmp_path / "folder", monkeypatch)
    image = tmp_path / "folder" / "imgs" / "test" / "cat" / "cat0.png"
    size = Image.open(image).size
    Image.fromarray(np.random.default_rng(7).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(image)
    for action, code, said in (("error", 2, "error: AttnconvWarning: "), ("ignore", 0, "")):
        capsys.readouterr()
        with warnings.catch_warnings():
            warnings.simplefilter(action)
            assert main(["eval", str(out), "--allow-data-change"]) == code
        err = capsys.readouterr().err
        assert err.startswith(said) and err.count("\n") == (1 if said else 0), err


def test_round_51_a_runs_image_counts_of_the_wrong_kind(data_dir, tmp_path):  # noqa: F811
    """Round 51: a Run's image counts were checked only against 1 (1.5 and True read as one image, a string, NaN or
    None a traceback), and the explorer refused a numpy integer as if it were not a count."""
    from attnconv.analysis import analyze_run
    from attnconv.errors import ParameterError
    from attnconv.explorer.server import Explorer
    from attnconv.runs import Run

    run = tmp_path / "run"
    assert main(tiny_args(run, data_dir)) == 0
    r = Run(run)
    for bad in (1.5, True, "3", None, float("nan"), float("inf"), [1], 0, 10**30):
        for call in (r.test_sample, r.site_probs, lambda n: analyze_run(run, n), lambda n: Explorer(run, images=n)) + (
                (r.test_images,) if bad is not None else ()):
            with pytest.raises(ParameterError) as err:
                call(bad)
            assert err.value.name == "images" and "\n" not in str(err.value), str(err.value)
    assert len(r.test_images(np.int64(3))[0]) == 3 and Explorer(run, images=np.int64(4)) is not None


def test_round_51_a_deleted_counted_snapshot_beside_unread_weights_and_reading_keeps_the_registries(
        data_dir, tmp_path, monkeypatch):  # noqa: F811
    """Round 51: beside missing weights and an older state.pt, a heads.jsonl snapshot that state.pt counts, deleted,
    still had the weights named (the snapshots had only to come in the record's order); and reading a run reset every
    module's once-per-line warning registry (catch_warnings around torch.load), so under `default` a Run's warning,
    and the user's own, came again at one line on every call."""
    import warnings

    from attnconv.runs import Run

    run, older = _finished_with_first_state(tmp_path, data_dir, monkeypatch)
    lines = (run / "heads.jsonl").read_text().splitlines()
    (run / "heads.jsonl").write_text("\n".join(lines) + "\njunk{\n")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("default")
        for _ in range(3):
            Run(run).heads  # noqa: B018 - one call site: its warning once
            warnings.warn("the user's own", UserWarning, stacklevel=1)
    assert sorted(str(w.message).split(": ")[-1][:7] for w in said) == ["skipped", "the use"], [str(w.message)
                                                                                               for w in said]
    (run / "model.safetensors").unlink()
    shutil.copyfile(older, run / "state.pt")
    (run / "heads.jsonl").write_text("\n".join([lines[0], *lines[2:]]) + "\n")  # a snapshot state.pt counts, deleted
    with pytest.raises(AttnconvError) as err:
        Run(run).heads  # noqa: B018
    assert str(err.value).startswith(f"{run / 'heads.jsonl'}: "), str(err.value)


def test_round_52_a_run_read_amid_other_threads_and_interrupts_leaves_no_filter_and_hides_no_warning(
        data_dir, tmp_path):  # noqa: F811
    """Round 52: the filter that quiets torch's notes while a run is read ignored every warning of the process, so
    another thread's own warnings were lost meanwhile, and a thread's catch_warnings restoring the filters (or a
    Ctrl-C in the clean-up) left it in place for good; a Run's image index was not checked (a float a traceback,
    tensor(True) read as image 1)."""
    import threading
    import warnings

    from attnconv.errors import ParameterError, warnings_ignored
    from attnconv.runs import Run

    run = tmp_path / "run"
    assert main(tiny_args(run, data_dir)) == 0
    before = list(warnings.filters)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        stop = threading.Event()

        def reader():
            while not stop.is_set():
                Run(run).logs_metadata  # noqa: B018 - state.pt read (torch.load) under warnings_ignored

        thread = threading.Thread(target=reader)
        thread.start()
        for i in range(200):
            warnings.warn(f"the user's own {i}", UserWarning, stacklevel=1)
        stop.set()
        thread.join()
    assert len([w for w in said if "the user's own" in str(w.message)]) == 200
    quiet, other = warnings_ignored(), warnings.catch_warnings()  # another thread's catch_warnings, interleaved
    quiet.__enter__()
    other.__enter__()  # saves the list holding the filter added, and swaps in a copy
    quiet.__exit__(None, None, None)
    other.__exit__(None, None, None)  # puts the saved list back
    assert list(warnings.filters) == before
    r = Run(run)
    for bad in (1.5, "1", torch.tensor(True), None.__class__):
        with pytest.raises(ParameterError, match="index .* is invalid: give an image's place in the test set"):
            r.test_images(index=bad)


def test_round_52_a_ctrl_c_as_a_file_is_opened_closes_its_descriptor_once(tmp_path, monkeypatch):
    """Round 52: a Ctrl-C landing as `open_regular` handed its descriptor to the file object had it closed twice (by
    hand, then by the object when collected, by then another file's number): a later read of a sound run failed
    with "Bad file descriptor"."""
    import gc

    from attnconv import fileio

    (tmp_path / "a").write_bytes(b"a" * 10)
    (tmp_path / "b").write_bytes(b"b" * 10)
    fdopen = os.fdopen

    def interrupted(fd, *args):
        fdopen(fd, *args)  # the object owns fd now (and is dropped: collected below)
        raise KeyboardInterrupt

    monkeypatch.setattr(fileio.os, "fdopen", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fileio.open_regular(tmp_path / "a", "")
    monkeypatch.undo()
    with open(tmp_path / "b", "rb") as g:  # likely the number the first file had
        gc.collect()
        assert g.read() == b"b" * 10


def test_round_53_a_quieted_notes_only_a_runs_top_and_a_flags_range_in_whole_numbers(
        data_dir, tmp_path, capsys):  # noqa: F811
    """Round 53: the filter quieting torch's and Pillow's notes hid every warning said from an attnconv module meanwhile
    (eval's line, in another thread); Run.predict's `top` skipped the one check (0 gave empty answers, 1.5 torch's
    traceback); a flag's range was printed with %g (2**20 as 1.04858e+06, above the real bound)."""
    import warnings

    from attnconv.errors import ParameterError, warnings_ignored
    from attnconv.runs import Run

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with warnings_ignored():
            warnings.warn_explicit("eval's line", UserWarning, "x.py", 1, module="attnconv.cli.evaluate")
            warnings.warn_explicit("torch's note", UserWarning, "y.py", 1, module="torch.serialization")
    assert [str(w.message) for w in said] == ["eval's line"]
    run = tmp_path / "run"
    assert main(tiny_args(run, data_dir)) == 0
    r = Run(run)
    raw = r.test_images(1)[0]
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ParameterError, match="top"):
            r.predict(raw, top=bad)
    capsys.readouterr()
    assert main(["analyze", str(run), "--images", str(2**20 + 4)]) == 2
    assert "from 1 to 1048576" in capsys.readouterr().err


def test_round_53_a_ctrl_c_as_a_file_is_opened_leaks_no_descriptor(tmp_path, monkeypatch):
    """Round 53: a Ctrl-C landing just as `open_regular`'s os.open returned left the descriptor open for good (never
    stored, so never closed): reading a run again and again under interrupts leaked ever more of them."""
    import signal

    from attnconv import fileio

    (tmp_path / "a").write_bytes(b"a")
    real = os.open

    def interrupted(*args, **kwargs):
        fd = real(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # its handler runs as the call returns
        return fd

    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(fileio.os, "open", interrupted)
    for _ in range(20):
        with pytest.raises(KeyboardInterrupt):
            fileio.read_regular(tmp_path / "a", "")
    monkeypatch.undo()
    assert len(os.listdir("/proc/self/fd")) == before


def test_round_54_a_threads_calling_main_at_once_leave_the_warnings_state_as_it_was(tiny_attention_runs, capsys):
    """Round 54: `main` wrapped each command in `catch_warnings`, which swaps the process's one showwarning and filter
    list: threads leaving it at once put back each other's copies, so after several threads called `main` the CLI's
    showwarning stayed installed and attnconv's filter quieting torch stayed in the list (torch's warnings hidden for
    good). Now each thread's warnings go to its own showwarning, and nothing is swapped."""
    import warnings

    run = str(tiny_attention_runs["sa-quadratic"])
    assert main(["compare", run]) == 0
    shown: list[str] = []

    def mine(message, category, filename, lineno, file=None, line=None):
        shown.append(str(message))

    before_list = warnings.filters
    warnings.showwarning, saved = mine, warnings.showwarning
    before = list(warnings.filters)
    errors: list[BaseException] = []

    def work():
        try:
            for _ in range(6):
                assert main(["compare", run]) == 0
        except BaseException as err:  # noqa: BLE001 - said by the main thread
            errors.append(err)

    try:
        _in_threads(work, 4, 1e-6)
        assert not errors
        assert warnings.showwarning is mine and warnings.filters is before_list
        assert warnings.filters == before
        warnings.warn_explicit("a note from torch", UserWarning, "torch_file.py", 1, module="torch.nn.modules.x")
        assert shown == ["a note from torch"]
    finally:
        warnings.showwarning = saved
    capsys.readouterr()


def test_round_54_a_damaged_line_just_past_an_unfinished_runs_checkpoint_is_cut_by_the_resume(
        data_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Round 54: the resume reads one line past what the checkpoint counts (to check it was logged after it); a damaged
    one there made `train --resume` refuse, saying the checkpoint counts it, with fixes that gave the run up (a junk
    line two lines past was cut); `eval` said to delete metrics.csv, after which the resume refused for good."""
    from attnconv.training import checkpoint as ck

    save, copies = ck.Checkpointer.save, tmp_path / "at5"

    def copied(self, model, optimizer, progress):  # the run as its checkpoint at step 5 left it: unfinished
        save(self, model, optimizer, progress)
        if progress.step == 5:
            shutil.copytree(self.out, copies)

    monkeypatch.setattr(ck.Checkpointer, "save", copied)
    assert main(tiny_args(tmp_path / "full", data_dir, *ONE_EPOCH)) == 0
    monkeypatch.undo()
    for log, junk in (("heads.jsonl", '{"junk": 1}\n'), ("metrics.csv", "x,y,z\n"), ("steps.csv", "x,y\n")):
        run = tmp_path / log
        shutil.copytree(copies, run)
        with open(run / log, "a") as f:
            f.write(junk)
        offer = f"resume the run, which cuts what was logged after its last checkpoint, the damage with it: " \
                f"`attnconv train --out {run} --resume`"
        if log == "metrics.csv":  # the readers offer the resume, which cuts it
            assert offer in _only_error(capsys, ["eval", run, "--data-dir", data_dir])

        capsys.readouterr()
        assert main(tiny_args(run, data_dir, *ONE_EPOCH, "--resume")) == 0, (log, capsys.readouterr().err)
        assert _firsts(run / log) == _firsts(tmp_path / "full" / log), log


def _firsts(path: Path) -> list:
    """Epoch and step of each row of a log, or each snapshot's step (times differ from run to run)."""
    return [json.loads(line)["step"] if path.suffix == ".jsonl" else line.split(",")[:2]
            for line in path.read_text().splitlines()]


def test_round_55_b_an_optimizer_step_past_the_weights_range_is_a_diverged_run(data_dir, tmp_path, capsys):  # noqa: F811
    """Round 55: `--lr 1e38` is in its range, but AdamW's first step size (lr / (1 - beta1)) is past float32's: torch
    refused the step with a traceback (exit 1), and `--resume` did the same. Now it is said as a diverged run is."""
    capsys.readouterr()
    assert main(tiny_args(tmp_path / "run", data_dir, *ONE_EPOCH, "--optimizer", "adamw", "--lr", "1e38")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("error: the optimizer's step overflowed the weights' number range at step 1 (lr 1e+38); no "
                   "checkpoint was written yet; lower --lr or raise --warmup and train into a new --out"), err


def test_round_55_a_threads_calling_main_at_once_each_say_their_warning(tiny_attention_runs, tmp_path, capsys):
    """Round 55: a command's warning was issued into the caller's once-per-line registry; with threads calling `main`
    at once, one thread's entry (made after another's command began) dropped that command's `warning:` line (12 of
    20 said). Inside `main` each command now says its warnings every time, as a process of its own would."""

    run = tmp_path / "run"
    shutil.copytree(tiny_attention_runs["sa-quadratic"], run)
    with open(run / "heads.jsonl", "a") as f:
        f.write('{"junk": 1}\n')
    codes: list[int] = []

    def work():
        for _ in range(3):
            codes.append(main(["analyze", str(run), "--images", "2"]))

    capsys.readouterr()
    _in_threads(work, 4, 1e-5)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert codes == [0] * 12 and len(said) == 12, (codes, said)
    assert all("skipped 1 damaged line" in line for line in said)


def test_round_55_a_compare_offers_the_resume_for_heads_damaged_past_an_unfinished_runs_checkpoint(
        data_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Round 55: for a damaged heads.jsonl line past an unfinished run's checkpoint, `compare` said to restore or
    delete the file; deleting it left the run no resume. It offers the resume, which cuts the line (round 54)."""
    from attnconv.training import checkpoint as ck

    save, copy = ck.Checkpointer.save, tmp_path / "at10"

    def copied(self, model, optimizer, progress):  # the checkpoint at step 10: one epoch done of two
        save(self, model, optimizer, progress)
        if progress.step == 10:
            shutil.copytree(self.out, copy)

    monkeypatch.setattr(ck.Checkpointer, "save", copied)
    assert main(tiny_args(tmp_path / "full", data_dir, "--log-every", "3", "--checkpoint-every", "5")) == 0
    monkeypatch.undo()
    with open(copy / "heads.jsonl", "a") as f:
        f.write('{"epoch": null}\n')
    err = _only_error(capsys, ["compare", copy])
    assert f"resume the run, which cuts what was logged after its last checkpoint, the damage with it: `attnconv " \
           f"train --out {copy} --resume`" in err, err
    assert main(tiny_args(copy, data_dir, "--log-every", "3", "--checkpoint-every", "5", "--resume")) == 0
    assert _firsts(copy / "heads.jsonl") == _firsts(tmp_path / "full" / "heads.jsonl")


def test_round_56_a_streams_loggers_finished_runs_and_the_answer_out_before_main_returns(
        finished, tmp_path, monkeypatch, capsys):
    """Round 56: an export's stream wrappers and `main`'s, in spans that overlap without nesting (threads), put back
    each other's for good (a thread's prints lost after); an export set the torch and onnx loggers to ERROR, dropping
    another thread's lines; compare offered the resume for a finished run's damaged heads.jsonl (which it does not
    mend); `main` with a closed stdout raised ValueError, and with a full one returned 0 (its answer never out)."""
    import logging
    import threading

    import attnconv.cli as cli
    from attnconv import export

    streams = (sys.stdout, sys.stderr)
    for first, second in ((export._silent_output(), cli._wrapped_streams()),
                          (cli._wrapped_streams(), export._silent_output())):
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)  # the first out before the second: not nested
        second.__exit__(None, None, None)
        assert (sys.stdout, sys.stderr) == streams
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("torch.other_work")
    logger.addHandler(handler)
    try:
        with export._loggers_quiet():
            logger.warning("this thread's note")  # the exporting thread's: dropped
            thread = threading.Thread(target=lambda: logger.warning("another thread's line"))
            thread.start()
            thread.join()
        logger.warning("after")
    finally:
        logger.removeHandler(handler)
    assert seen == ["another thread's line", "after"]
    run = _fresh_copy(finished, tmp_path)
    with open(run / "heads.jsonl", "a") as f:
        f.write("junk{\n")
    err = _only_error(capsys, ["compare", run])
    assert "restore it from a copy, or delete it" in err and "resume" not in err, err
    closed = open(tmp_path / "answer.txt", "w")  # noqa: SIM115
    closed.close()
    for stdout, words in ((closed, "error: standard output is closed"),
                          (open("/dev/full", "w"), "error: standard output: no space left")):  # noqa: SIM115
        monkeypatch.setattr(sys, "stdout", stdout)
        code = main(["compare", str(finished)])
        monkeypatch.undo()
        err = capsys.readouterr().err
        assert code == 2 and err.strip().splitlines()[-1].startswith(words), (code, err)


def _in_threads(work, count: int, switch: float) -> None:
    """`work` in `count` threads at once, the interpreter switching between them every `switch` seconds (races made
    likely), joined; the switch interval put back."""
    import threading

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(switch)
        threads = [threading.Thread(target=work) for _ in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("rates", [("--lr", "0.5"), ("--lr", "0.5", "--attention-lr-scale", "10")],
                         ids=["lr", "attention-scale"])
def test_round_57_b_a_run_diverging_inside_attention_is_a_diverged_run(data_dir, tmp_path, monkeypatch, capsys,  # noqa: F811
                                                                       rates):
    """Round 57: a run whose attention probabilities became non-finite (found by the heads' snapshot before the loss
    was looked at) stopped with the layer's own line, "check its weights and inputs", naming no flag; it is a diverged
    run, with its advice. And `ConvAttention.error_bound` given something other than a tensor raised AttributeError."""
    from attnconv.models.capture_numbers import NonFiniteAttention
    from attnconv.training import loop

    append = loop.HeadsLog.append

    def diverged(self, epoch, progress):  # what the snapshot after a last step of an epoch whose update diverged finds
        if epoch >= 1:
            raise NonFiniteAttention("layers.0.attention: its attention probabilities hold NaN or inf (...); check its "
                                     "weights and inputs")
        append(self, epoch, progress)

    monkeypatch.setattr(loop.HeadsLog, "append", diverged)
    capsys.readouterr()
    code = main(tiny_args(tmp_path / "run", data_dir, "--optimizer", "sgd", "--schedule", "constant", "--epochs", "1",
                          *rates))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "attention probabilities became non-finite" in err and "lower --lr" in err, err
    assert ("--attention-lr-scale" in err) == ("--attention-lr-scale" in rates) and "--warmup" not in err, err
    from attnconv import conv_to_attention

    layer = conv_to_attention(torch.nn.Conv2d(2, 3, 3, padding=1))
    for value in ((8, 8), "x", [[1.0]]):
        with pytest.raises(AttnconvError, match=r"^x .* is invalid: give the input .*, a torch.Tensor$"):
            layer.error_bound(value)


def test_round_57_a_main_with_a_stdout_closed_meanwhile_or_without_a_descriptor(finished, data_dir, monkeypatch,  # noqa: F811
                                                                                capsys):
    """Round 57: a closed sys.stdout put in while `main` ran let a ValueError out (the one line was only for one closed
    before); a stdout raising BrokenPipeError with no file descriptor gave an AttributeError, not the quiet 141."""
    import io

    from attnconv.cli import evaluate

    class PipeLike:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    argv = ["eval", str(finished), "--data-dir", str(data_dir)]
    monkeypatch.setattr(sys, "stdout", PipeLike())
    assert main(argv) == 141
    monkeypatch.undo()
    real = evaluate.run_eval

    def swapped(args):  # the caller's code swaps in a closed stream while the command runs
        closed = io.StringIO()
        closed.close()
        sys.stdout = closed
        return real(args)

    monkeypatch.setattr(evaluate, "run_eval", swapped)
    saved = sys.stdout
    capsys.readouterr()
    try:
        code = main(argv)
    finally:
        sys.stdout = saved
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1] == "error: standard output is closed; give the command an open one (a file, a pipe)"


def test_round_58_b_a_non_finite_test_loss_or_a_models_own_attention_is_a_diverged_run(data_dir, tmp_path,  # noqa: F811
                                                                                          monkeypatch, capsys):
    """Round 58: a test loss that became NaN on finite (huge) weights was written and checkpointed as the last good
    checkpoint (a ResNet finished with exit 0); a ViT's own attention found non-finite stopped with the capture's line,
    naming no flag; and a stdout whose encoding lacks a character was said to be closed."""
    import io

    import attnconv.cli as cli
    from attnconv.models.capture_numbers import NonFiniteAttention, check_scores
    from attnconv.training import loop

    monkeypatch.setattr(loop._Trainer, "_evaluate", lambda self, images=None: (0.5 if images else float("nan"), 0.5))
    capsys.readouterr()
    assert main(tiny_args(tmp_path / "run", data_dir, *ONE_EPOCH)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: test loss became non-finite (NaN or inf) at step 8") and "lower --lr" in err, err
    assert "at step 8" in err and "the last good checkpoint (step 5)" in err, err
    with pytest.raises(NonFiniteAttention):
        check_scores(torch.tensor([[[float("nan"), 0.0]]]), None, torch.float32, "blocks.0.attn")
    wrapped = cli._NamedStdout(io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    wrapped.write("r\u00fcn\n")
    wrapped.flush()
    assert wrapped._stream.buffer.getvalue() == b"r\\xfcn\n"


def test_round_59_b_a_checkpoint_within_an_epoch_is_good_only_if_its_outputs_are(data_dir, tmp_path,  # noqa: F811
                                                                                  monkeypatch, capsys):
    """Round 59: a checkpoint within an epoch was checked for finite weights only: a ResNet whose batch norm statistics
    overflowed kept a checkpoint whose test loss was NaN, named "the last good checkpoint", and `eval` and `predict` of
    it answered NaN with exit 0; `Run.predict` of an empty uint8 batch was torch's error; `maps_of_run` drew NaN,
    negative and integer "probabilities" and failed inside on meta or wrong-shaped ones; a damaged or missing image
    given to `predict` alone was told to leave "the folder" (and a missing one "cannot decode")."""
    from attnconv import Run, evaluate
    from attnconv.plots.run_figures import maps_of_run

    real = loop._Trainer._evaluate
    probes = []

    def evaluate_probe(self, images=None):  # the second checkpoint within the epoch: outputs of NaN
        if images is not None:
            probes.append(self.progress.step)
            if len(probes) == 2:
                return float("nan"), 0.1
        return real(self, images)

    monkeypatch.setattr(loop._Trainer, "_evaluate", evaluate_probe)
    capsys.readouterr()
    out = tmp_path / "run"
    assert main(tiny_args(out, data_dir, "--epochs", "1", "--checkpoint-every", "3")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert probes == [3, 6] and err.startswith("error: test loss on the first 64 test images became non-finite (NaN "
                                                "or inf) at step 6"), err
    assert "the last good checkpoint (step 3) is intact" in err and "lower --lr" in err, err
    assert load_state(out / "state.pt")["progress"]["step"] == 3
    monkeypatch.setattr(loop._Trainer, "_evaluate", real)

    run = Run(out)
    with pytest.raises(AttnconvError, match=r"^images is an empty batch: give at least one image"):
        run.predict(torch.zeros(0, 1, 28, 28, dtype=torch.uint8))
    with torch.no_grad():  # the run's own model, its weights finite, its outputs not (activations past float32)
        for p in run.model.parameters():
            p.mul_(1e30)
    assert all(bool(p.isfinite().all()) for p in run.model.parameters())
    with pytest.raises(AttnconvError, match=r"the run's weights give NaN or infinite outputs for these images; the run "
                                            r"diverged before this checkpoint: retrain it with a lower --lr"):
        run.predict(torch.zeros(1, 1, 28, 28, dtype=torch.uint8))
    monkeypatch.setattr(evaluate, "predict_all", lambda *a, **k: {"loss": float("nan"), "accuracy": 0.1,
                                                                  "predictions": torch.zeros(len(a[1]), dtype=torch.long)})
    summary = evaluate.describe_run(out, recompute=True, data_dir=data_dir, allow_data_change=True)
    assert "the run's weights give a non-finite test loss; the run diverged before this checkpoint" in summary["warning"]

    run = Run(out, data_dir=data_dir)
    probs = run.site_probs(4)[0]
    for bad, words in (([probs[0] * float("nan")], r"probs\[0\] has \d+ NaN"), ([-probs[0]], r"probs\[0\] has negative"),
                       ([probs[0].long()], r"probs\[0\] is a tensor of int64"),
                       ([probs[0][:, :3]], r"probs\[0\] of shape \(\d+, 3, \d+\) does not fit layer 1"),
                       ([probs[0].to("meta")], r"probs\[0\] is on the meta device"),
                       (probs[0], r"probs a tensor of shape .* is invalid: give one \(heads, T_out, T_in\) tensor per")):
        with pytest.raises(AttnconvError, match=words):
            maps_of_run(run, bad)
    damaged, missing = tmp_path / "damaged.png", tmp_path / "missing.png"
    damaged.write_bytes(b"not a png")
    for path, words in ((damaged, r"damaged.png: cannot decode the image .*; replace the file or leave it out$"),
                        (missing, r"missing.png: no such file; give the path of an image file$")):
        with pytest.raises(AttnconvError, match=words):
            run.predict([path])


def test_round_60_b_folders_said_as_folders_diverged_runs_said_as_diverged_and_strict_json(tmp_path, monkeypatch,
                                                                                          capsys):
    """Round 60: `predict RUN FOLDER` told a damaged image found in the folder to "leave it out" (the fix for a file
    named alone); `export` of a checkpoint whose outputs are NaN blamed the exporter ("please report this"); `eval
    --json` of such a checkpoint printed a bare NaN, which no strict JSON parser reads; a checkpoint within an epoch of
    a test set under 64 images was said to be judged on "the first 64 test images"."""
    import json

    from attnconv import Run, evaluate
    from attnconv.export import _check

    out, args = _folder_run(tmp_path, monkeypatch)
    photos = tmp_path / "photos"
    photos.mkdir()
    shutil.copy(next((tmp_path / "imgs" / "test" / "cat").iterdir()), photos / "a.png")
    (photos / "b.png").write_bytes(b"")
    capsys.readouterr()
    assert main(["predict", str(out), str(photos)]) == 2
    _one_error(capsys, "b.png: cannot decode the image (an empty file); replace the file or remove it from the folder")
    assert main(["predict", str(out), str(photos / "a.png"), str(photos / "b.png")]) == 2
    _one_error(capsys, "b.png: cannot decode the image (an empty file); replace the file or leave it out")
    with pytest.raises(AttnconvError, match=r"^images given as \[''\]: give image files"):
        Run(out).predict("")  # the empty path was read as the current folder

    with pytest.raises(AttnconvError, match=r"^m.pt2: nothing was written: the run's weights give NaN or infinite "
                                            r"outputs \(the run diverged before this checkpoint\); retrain it"):
        _check(b"", Path("m.pt2"), "exported", lambda x: x * float("nan"), torch.ones(2, 3), own=True)
    monkeypatch.setattr(evaluate, "predict_all", lambda *a, **k: {"loss": float("nan"), "accuracy": 0.1,
                                                                  "predictions": torch.zeros(len(a[1]), dtype=torch.long)})
    assert main(["eval", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    strict = json.loads(captured.out, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert strict["test_loss"] is None and "diverged before this checkpoint" in captured.err

    real = loop._Trainer._evaluate
    monkeypatch.setattr(loop._Trainer, "_evaluate", lambda self, images=None: (float("nan"), 0.0) if images else
                        real(self, images))
    small = [a for a in args if a != str(out)] + ["--out", str(tmp_path / "small"), "--checkpoint-every", "1"]
    small.remove("--out")
    assert main(small) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: test loss on the first 4 test images became non-finite (NaN or inf) at step 1"), err


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-6), (torch.bfloat16, 0.05)], ids=["float64", "bfloat16"])
def test_round_63_a_predict_after_the_model_is_cast_gives_its_answer_in_that_dtype(tiny_attention_runs, dtype, tol):
    """Round 63: `Run.predict` made a float32 batch whatever the model's dtype, so a run whose model a user cast
    (`run.model.double()`) failed with torch's dtype error and its traceback; the batch now follows the weights."""
    from attnconv import Run

    run = Run(tiny_attention_runs["sa-quadratic"])
    raw = torch.randint(0, 256, (3, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    want = [dict(row) for row in run.predict(raw, top=10)]
    run.model.to(dtype)
    assert run.transform(raw).dtype == dtype
    got = [dict(row) for row in run.predict(raw, top=10)]
    for a, b in zip(got, want):
        assert a.keys() == b.keys() and max(abs(a[c] - b[c]) for c in a) < tol


def test_round_63_b_an_unfinished_runs_export_says_so_and_resume_hints_quote_the_folder(tmp_path, data_dir,  # noqa: F811
                                                                                       monkeypatch, capsys):
    """Round 63's notes: `export` of an unfinished run wrote its latest checkpoint's weights without a word, and the
    `--resume` commands the messages offer named a folder with a space unquoted (pasted back as two arguments)."""
    stop_after_checkpoint(monkeypatch, 5)
    out = tmp_path / "my run"
    resume = f"attnconv train --out '{out}' --resume"
    assert main(tiny_args(out, data_dir, "--checkpoint-every", "5")) == 130
    assert f"continue with `{resume}`" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["export", str(out), "--out", str(tmp_path / "model.txt")]) == 2  # refused: no word of an export
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "warning" not in err, err  # round 65: the warning came before the refusal
    assert main(["export", str(out)]) == 0
    assert capsys.readouterr().err.strip() == (
        f"warning: {out}: the run has not finished; the export holds the weights of its latest checkpoint (step 5): "
        f"finish it with `{resume}` and export again for the trained model")
    assert main([*tiny_args(out, data_dir, "--checkpoint-every", "5"), "--resume"]) == 0
    capsys.readouterr()
    assert main(["export", str(out), "--overwrite"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_round_64_a_predict_says_a_model_that_does_not_fit_the_run_in_one_line(tiny_attention_runs):
    """Round 64: `Run.predict` with `run.model` replaced by one of other outputs (11 classes, an identity, a flat
    output) failed inside attnconv with IndexError or ValueError; moved to the meta device, with torch's error; a
    3-class head was read with the run's first three class names."""
    import torch.nn as nn

    from attnconv import Run

    raw = torch.randint(0, 256, (2, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for wrap, shape in ((lambda m: nn.Sequential(m, nn.Linear(10, 11)), "shape (2, 11)"),
                        (lambda m: nn.Sequential(m, nn.Linear(10, 3)), "shape (2, 3)"),
                        (lambda m: nn.Identity(), "shape (2, 1, 28, 28)"),
                        (lambda m: nn.Sequential(m, nn.Flatten(0)), "shape (20,)"),
                        (lambda m: (lambda x: [m(x)]), "a list")):
        run = Run(tiny_attention_runs["sa-quadratic"])
        run.__dict__["model"] = wrap(run.model)
        with pytest.raises(AttnconvError, match=re.escape(f"the run's model gives {shape} for 2 images, where the run "
                                                          "has 10 classes: give run.model a model of (2, 10) logits")):
            run.predict(raw)
    run = Run(tiny_attention_runs["sa-quadratic"])
    run.model.to("meta")
    with pytest.raises(AttnconvError, match="the run's model is on the meta device, which holds no values: load the "
                                            r"run again \(attnconv.Run\)"):
        run.predict(raw)


def test_round_64_a_predict_runs_the_model_in_eval_mode_and_puts_its_flags_back(tmp_path, data_dir):  # noqa: F811
    """Round 64's note: a model left in train mode was used as it was: answers that depend on the batch, and the
    run's BatchNorm statistics changed by a prediction."""
    from attnconv import Run

    out = tmp_path / "cnn"
    args = tiny_args(out, data_dir, "--max-steps", "2")
    cut = args.index("--model")
    args[cut:cut + 14] = ["--model", "resnet18", "--width", "4"]
    assert main(args) == 0
    run = Run(out)
    raw = torch.randint(0, 256, (3, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    want = run.predict(raw, top=3)
    run.model.train()
    stats = {k: v.clone() for k, v in run.model.state_dict().items()}
    assert run.predict(raw, top=3) == want and run.predict(raw[:1], top=3) == want[:1]
    assert all(torch.equal(v, run.model.state_dict()[k]) for k, v in stats.items())  # running statistics untouched
    assert all(m.training for m in run.model.modules())


def test_round_65_a_predict_blames_the_run_only_for_its_own_model(tiny_attention_runs):
    """Round 65: a model a user put in run.model that gives NaN (a temperature of 0) was said to be the run's
    divergence: `retrain it with a lower --lr`, though the run's weights predict fine."""
    import torch.nn as nn

    from attnconv import Run

    class Hot(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x) / 0.0 * 0.0  # NaN

    raw = torch.zeros(1, 1, 28, 28, dtype=torch.uint8)
    run = Run(tiny_attention_runs["sa-quadratic"])
    assert run.predict(raw)
    run.__dict__["model"] = Hot(run.model)
    with pytest.raises(AttnconvError, match="run.model gives NaN or infinite outputs for these images, and it is not "
                                            "the run's model as loaded") as err:
        run.predict(raw)
    assert "lower --lr" not in str(err.value)


def test_round_65_a_export_keeps_the_models_modes_and_follows_its_dtype(tiny_attention_runs, tmp_path):
    """Round 65: `export_run` left a model the user had in train mode in eval mode; given a run whose model was cast
    to float64, it traced with float32 examples and failed, advising another format."""
    from attnconv import Run
    from attnconv.export import export_run

    run = Run(tiny_attention_runs["sa-quadratic"])
    run.model.train()
    export_run(run, "exported", tmp_path / "a.pt2")
    assert all(m.training for m in run.model.modules())
    run.model.double()
    out = export_run(run, "exported", tmp_path / "b.pt2")
    x = torch.randn(2, *run.input_shape, dtype=torch.float64)
    loaded = torch.export.load(out).module()
    with torch.no_grad():
        assert torch.allclose(loaded(x), run.model.eval()(x), atol=1e-9)


def test_round_66_a_export_of_a_model_a_user_changed(tiny_attention_runs, tmp_path):
    """Round 66: `export_run` of a model whose forward names its input otherwise than `x` (`nn.Sequential(model)`) was
    refused by torch's dynamic_shapes check with "try another fmt"; NaN from a user's model was blamed on the run;
    a model on the meta device was a traceback."""
    import torch.nn as nn

    from attnconv import Run
    from attnconv.export import export_run

    run = Run(tiny_attention_runs["sa-quadratic"])
    run.__dict__["model"] = nn.Sequential(run.model)
    for fmt, name in (("exported", "a.pt2"), ("torchscript", "a.ts")):
        assert export_run(run, fmt, tmp_path / name).exists()
    run.__dict__["model"] = nn.Sequential(run.model, nn.Hardtanh(float("nan"), float("nan")))  # NaN out
    with pytest.raises(AttnconvError, match="run.model gives NaN or infinite outputs, and it is not the run's model "
                                            "as loaded") as err:
        export_run(run, "exported", tmp_path / "b.pt2")
    assert "lower --lr" not in str(err.value) and not (tmp_path / "b.pt2").exists()
    run = Run(tiny_attention_runs["sa-quadratic"])
    run.model.to("meta")
    with pytest.raises(AttnconvError, match="the run's model is on the meta device, which holds no values"):
        export_run(run, "exported", tmp_path / "c.pt2")


def test_round_67_a_export_of_models_a_user_put_in_place(tiny_attention_runs, tmp_path):
    """Round 67: `export_run` of a model with a `*args` forward or a torch.compile'd run model was refused by the
    dynamic batch; one returning a tuple, and a plain function, were AttributeError tracebacks."""
    import torch.nn as nn

    from attnconv import Run
    from attnconv.export import export_run

    class VarArgs(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.m = model

        def forward(self, *xs):
            return self.m(xs[0])

    class Pair(VarArgs):
        def forward(self, x):
            return self.m(x), x

    x = torch.randn(3, 1, 28, 28)
    for wrap in (VarArgs, torch.compile):
        run = Run(tiny_attention_runs["sa-quadratic"])
        run.__dict__["model"] = wrap(run.model)
        out = export_run(run, "exported", tmp_path / f"{wrap.__name__}.pt2")
        with torch.no_grad():
            assert torch.allclose(torch.export.load(out).module()(x), run.model(x), atol=1e-5)
    run = Run(tiny_attention_runs["sa-quadratic"])
    own = run.model
    for replaced, said in ((Pair(own), "the model returns tuple, not its logits as one floating tensor"),
                           (lambda images: own(images), "run.model is function, not a torch.nn.Module")):
        run.__dict__["model"] = replaced
        with pytest.raises(AttnconvError, match=said):
            export_run(run, "exported", tmp_path / "bad.pt2")
        assert not (tmp_path / "bad.pt2").exists()


def test_round_68_a_exports_check_is_one_line_and_fair(tiny_attention_runs, tmp_path):
    """Round 68: export's check of what it made let tracebacks out (a bool output, a model that takes batches of 2
    only), refused a sound export of a model changing its input in place (run on the changed batch), and held a float16
    cast to float32's tolerance ("please report this")."""
    import torch.nn as nn

    from attnconv import Run
    from attnconv.export import export_run

    class Wrap(nn.Module):
        def __init__(self, model, how):
            super().__init__()
            self.m, self.how = model, how

        def forward(self, x):
            if self.how == "bool":
                return self.m(x) > 0
            if self.how == "two":
                return self.m(x.view(2, 1, 28, 28))
            return self.m(x.mul_(2))  # in place

    for how, said in (("bool", "returns a torch.bool tensor, not its logits"), ("two", "fails on a batch of 3 images")):
        run = Run(tiny_attention_runs["sa-quadratic"])
        run.__dict__["model"] = Wrap(run.model, how)
        with pytest.raises(AttnconvError, match=said):
            export_run(run, "exported", tmp_path / "bad.pt2")
        assert not (tmp_path / "bad.pt2").exists()
    run = Run(tiny_attention_runs["sa-quadratic"])
    run.__dict__["model"] = Wrap(run.model, "inplace")
    assert export_run(run, "torchscript", tmp_path / "inplace.ts").exists()
    run = Run(tiny_attention_runs["sa-quadratic"])
    run.model.half()
    for seed in range(3):  # float16's rounding, not float32's tolerance
        torch.manual_seed(seed)
        assert export_run(run, "exported", tmp_path / f"half{seed}.pt2").exists()


def test_round_69_a_a_model_that_treats_one_image_otherwise_is_not_exported_and_none_is_no_model(
        tiny_attention_runs, tmp_path):
    """Round 69: export's check ran at batch 3 only, so a model that treats a single image otherwise was written and
    gave the other branch's logits at batch 1; `Run.predict` with run.model None was a TypeError traceback."""
    import torch.nn as nn

    from attnconv import Run
    from attnconv.export import export_run

    class OneApart(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.m = model

        def forward(self, x):
            return self.m(x) + (1.0 if x.shape[0] == 1 else 0.0)

    run = Run(tiny_attention_runs["sa-quadratic"])
    run.__dict__["model"] = OneApart(run.model)
    with pytest.raises(AttnconvError, match="logits differ from the model's by 1"):
        export_run(run, "exported", tmp_path / "m.pt2")
    assert not (tmp_path / "m.pt2").exists()
    run.__dict__["model"] = None
    with pytest.raises(AttnconvError, match="run.model is NoneType, not a model"):
        run.predict(torch.zeros(1, 1, 28, 28, dtype=torch.uint8))


def test_a_float64_model_refused_for_onnx_is_told_to_cast_to_float32(tiny_attention_runs, tmp_path):
    """Round 69's note: onnxruntime has no float64 convolution, and the refusal said only its own error; it names
    the dtype and the cast now (float32 and float16 models are not told to cast)."""
    pytest.importorskip("onnxruntime")
    from attnconv import Run
    from attnconv.export import export_run

    run = Run(tiny_attention_runs["sa-quadratic"])
    run.__dict__["model"] = run.model.double()
    with pytest.raises(AttnconvError, match=r"computes in float64, .*\(run.model.float\(\)\)"):
        export_run(run, "onnx", tmp_path / "m.onnx")
    assert not list(tmp_path.iterdir())


def test_round_70_a_a_model_on_the_meta_device_in_part_is_refused_as_such(tiny_attention_runs, tmp_path):
    """Round 70: only the model's first floating parameter was looked at for the meta device, so a model whose later
    layer was on meta gave torch's `Tensor on device meta is not on the expected device` from `Run.predict` and
    "torch could not export the model ...; try another fmt" (no format could) from `export_run`."""
    import torch.nn as nn

    from attnconv import Run
    from attnconv.export import export_run

    run = Run(tiny_attention_runs["sa-quadratic"])
    last = [m for m in run.model.modules() if list(m.parameters(recurse=False))][-1]
    for name, p in list(last._parameters.items()):
        last._parameters[name] = nn.Parameter(torch.empty_like(p, device="meta"))
    images = torch.zeros(2, *run.input_shape, dtype=torch.uint8)
    for call in (lambda: run.predict(images), lambda: run.transform(images),
                 lambda: export_run(run, "torchscript", tmp_path / "m.ts")):
        with pytest.raises(AttnconvError, match=r"the run's model has [\w.]+ on the meta device, which holds no values: "
                                                r"load the run again"):
            call()
    assert not list(tmp_path.iterdir())
    run.__dict__["model"] = run.model.to("meta")  # all of it: said as before
    with pytest.raises(AttnconvError, match="the run's model is on the meta device"):
        run.predict(images)
