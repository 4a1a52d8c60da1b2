"""A path that is there is never called missing: a file, a device, a link to either, a link to nowhere or into a
loop, given where a folder (a run, a group, a dataset, a split, a class) or a dataset file is expected, is named as
what it is, in one line. And what such paths would have made silently wrong: a test split that is the train
split, a finished run whose weights are a link to nowhere."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from fixtures_data import write_cifar, write_fashion, write_image_folder
from safetensors.torch import load_file
from test_run_reliability import ONE_EPOCH, finished  # noqa: F401  (a fixture)
from test_train import data_dir, tiny_args  # noqa: F401  (data_dir is a fixture)

from attnconv.cli import main
from attnconv.data import load_dataset
from attnconv.data.folder_layout import scan_folder
from attnconv.errors import AttnconvError
from attnconv.fileio import not_a_file, not_a_folder


def odd_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Paths that are there but no folder, and the words that name each."""
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "to_file").symlink_to(tmp_path / "a_file")
    (tmp_path / "to_dev").symlink_to("/dev/null")
    (tmp_path / "loop").symlink_to("loop")
    return {"file": (tmp_path / "a_file", "(it is a file)"),
            "link to a file": (tmp_path / "to_file", f"(a link to {tmp_path / 'a_file'}, which is a file)"),
            "link to a device": (tmp_path / "to_dev", "(a link to /dev/null, which is a character device)"),
            "loop": (tmp_path / "loop", "(a link to loop, which loops back through links")}


def test_the_words_for_what_is_there(tmp_path):
    for path, words in odd_paths(tmp_path).values():
        assert f"({not_a_folder(path)}" .startswith(words.rstrip(")")), (path, not_a_folder(path))
    assert not_a_folder(tmp_path) is None and not_a_folder(tmp_path / "none") == "no such directory"
    assert not_a_folder(tmp_path / "a_file" / "below") == "no such directory"
    assert not_a_file(tmp_path / "a_file") is None and not_a_file(tmp_path / "to_file") is None
    assert not_a_file(tmp_path) == "it is a directory" and not_a_file("/dev/null") == "it is a character device"


@pytest.mark.parametrize("command", [
    ["explore", "{path}", "--export", "{tmp}/page.html"], ["compare", "{path}"], ["report", "{path}"],
    ["plot", "centers", "{path}"], ["eval", "{path}"], ["analyze", "{path}"]])
def test_a_run_folder_that_is_no_folder_is_named_as_what_it_is(command, tmp_path, capsys):
    """`explore` and `compare` called a file, a device, or a link to either "no such run directory" / "no such
    folder"."""
    for path, words in odd_paths(tmp_path).values():
        args = [a.format(path=path, tmp=tmp_path) for a in command]
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1 and "no such" not in err, (args, err)
        assert not (tmp_path / "page.html").exists()


def test_a_data_dir_that_is_no_folder_is_named(tmp_path, capsys):
    for path, words in odd_paths(tmp_path).values():
        for args in (["train", "--model", "sa-quadratic", "--dataset", "fashion-mnist", "--data-dir", str(path),
                      "--out", str(tmp_path / "r")],
                     ["learn-conv", "--source", "fmnist", "--data-dir", str(path), "--out", str(tmp_path / "l")]):
            assert main(args) == 2, args
            err = capsys.readouterr().err
            assert f"--data-dir {path}: {words[1:-1]}" in err and err.count("\n") == 1, (args, err)
    assert not (tmp_path / "r").exists() and not (tmp_path / "l").exists()


def test_a_dataset_file_that_is_there_but_no_file_is_named_not_called_missing(tmp_path):
    """A Fashion-MNIST or CIFAR-10 file that is a folder, a link to a device or a loop was "is missing
    train-labels-idx1-ubyte[.gz]" (and a FIFO or device would block or never end if read)."""
    for make, words in ((lambda p: p.mkdir(), "(it is a directory)"),
                        (lambda p: p.symlink_to("/dev/null"), "(a link to /dev/null, which is a character device)"),
                        (lambda p: p.symlink_to(p.name), "which loops back through links")):
        fashion = tmp_path / f"fashion{len(list(tmp_path.iterdir()))}"
        write_fashion(fashion, gz=False)
        odd = fashion / "train-labels-idx1-ubyte"
        odd.unlink()
        make(odd)
        with pytest.raises(AttnconvError, match="is not a readable file") as err:
            load_dataset("fashion-mnist", fashion, download=False)
        assert str(odd) in str(err.value) and words in str(err.value) and "missing" not in str(err.value)
        cifar = tmp_path / f"cifar{len(list(tmp_path.iterdir()))}"
        write_cifar(cifar / "cifar-10-batches-py")
        odd = cifar / "cifar-10-batches-py" / "data_batch_3"
        odd.unlink()
        make(odd)
        with pytest.raises(AttnconvError, match="is not a readable file") as err:
            load_dataset("cifar10", cifar, download=False)
        assert str(odd) in str(err.value) and words in str(err.value) and "missing" not in str(err.value)


def test_a_test_split_that_is_the_train_split_is_refused(tmp_path, capsys):
    """`test -> train` trained and measured the test accuracy on the training images, exit 0 (a test class folder
    linked to its train folder was already refused as counted twice)."""
    for name, link in (("same", lambda root: "train"), ("inside", lambda root: "train/cat"),
                       ("around", lambda root: ".")):
        root = tmp_path / name
        write_image_folder(root)
        shutil.rmtree(root / "test")
        (root / "test").symlink_to(link(root))
        with pytest.raises(AttnconvError, match="would be counted as training and test images") as err:
            scan_folder(root)
        assert f"{root / 'test'} resolves to" in str(err.value)
    args = ["train", "--model", "sa-quadratic", "--dataset", f"folder:{tmp_path / 'same'}", "--out", str(tmp_path / "r")]
    assert main(args) == 2 and "the same folder as the train folder" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_splits_and_class_folders_that_are_there_but_no_folder_are_named(tmp_path):
    (tmp_path / "odd").mkdir()
    for label, (path, _) in odd_paths(tmp_path / "odd").items():
        root = tmp_path / label.replace(" ", "_")
        write_image_folder(root)
        shutil.rmtree(root / "train" / "dog")  # a class folder in its place: was "class 'dog' has no folder in train"
        (root / "train" / "dog").symlink_to(path)
        with pytest.raises(AttnconvError, match="is a symlink loop" if label == "loop" else "not a class folder") as err:
            scan_folder(root)
        assert label == "loop" or f"(a link to {path}, which is" in str(err.value), str(err.value)
        assert "has no folder" not in str(err.value)
        shutil.rmtree(root / "test")  # a split in its place: was "has no test/ (or val/) folder"
        (root / "test").symlink_to(path)
        with pytest.raises(AttnconvError, match="test: not a folder") as err:
            scan_folder(root)
        assert f"(a link to {path}, which {'loops' if label == 'loop' else 'is'}" in str(err.value), str(err.value)


def test_a_finished_runs_weights_that_are_a_link_to_nowhere_are_written_anew(finished, data_dir, tmp_path,  # noqa: F811
                                                                             capsys):
    """`--resume` of a finished run whose model.safetensors is a link to nowhere said "run already finished" and
    left the link, which every reader then refused; a missing file was written anew from state.pt."""
    for target in ("nowhere", "model.safetensors"):  # a link to nothing, a link to itself
        out = tmp_path / target / "run"
        shutil.copytree(finished, out)
        want = load_file(out / "model.safetensors")
        (out / "model.safetensors").unlink()
        (out / "model.safetensors").symlink_to(target)
        capsys.readouterr()
        assert main(tiny_args(out, data_dir, *ONE_EPOCH, "--resume")) == 0
        err = capsys.readouterr().err
        assert "model.safetensors was a link to" in err and "written anew from state.pt" in err, err
        assert not (out / "model.safetensors").is_symlink()
        got = load_file(out / "model.safetensors")
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        assert not (out / target).exists() or target == "model.safetensors"  # nothing written through the link
        assert main(["eval", str(out)]) == 0


def test_an_init_from_weights_digest_of_the_wrong_type_is_named(finished, tmp_path, capsys):  # noqa: F811
    """config.json's init_from_weights edited to a number blamed the CNN's weights; it is named as config.json's."""
    for value in (12, "ab" * 31, "g" * 64, ["ab" * 32]):
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        shutil.copytree(finished, out)
        meta = json.loads((out / "config.json").read_text())
        meta["init_from_weights"] = value
        (out / "config.json").write_text(json.dumps(meta))
        capsys.readouterr()
        assert main(["eval", str(out)]) == 2, value
        err = capsys.readouterr().err
        assert "corrupt run config (init_from_weights " in err, err
        assert "is not a SHA-256 digest (64 hexadecimal digits)" in err and err.count("\n") == 1


def test_a_run_inside_its_own_image_folder_is_refused_naming_both(tmp_path, capsys):
    """`train --dataset folder:D --out D/train/run1` made the run folder, then read it as a class of no images
    ("add some or remove the folder"); under test/ as a class with no training folder."""
    root = tmp_path / "imgs"
    write_image_folder(root)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    for out in (root / "train" / "run1", root / "test" / "run1", root / "run1", root):
        assert main(["train", "--model", "sa-quadratic", "--dataset", f"folder:{root}", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--out {out} lies inside the image folder {root} the run trains on" in err and err.count("\n") == 1, err
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # no folder made, none left


def test_weights_out_and_image_folders_that_are_odd_paths_are_named(finished, tmp_path, capsys):  # noqa: F811
    """A weights file that is a link into a loop was "cannot read the weights (Too many levels of symbolic links)",
    `train --out` a link to a device "is a file", `--dataset folder:` a device "does not exist (or is not a
    directory)", an image that is a link to nowhere "cannot read (No such file or directory)"."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "model.safetensors").unlink()
    (run / "model.safetensors").symlink_to("model.safetensors")
    assert main(["eval", str(run)]) == 2
    assert "model.safetensors: a link to model.safetensors, which loops back" in capsys.readouterr().err
    (tmp_path / "odd").mkdir()
    paths = odd_paths(tmp_path / "odd")
    for path, words in (paths["link to a device"], paths["file"]):
        assert main(["train", "--model", "sa-quadratic", "--dataset", "fashion-mnist", "--out", str(path)]) == 2
        assert f"--out {path} is not a directory {words}" in capsys.readouterr().err
        assert main(["train", "--model", "sa-quadratic", "--dataset", f"folder:{path}", "--out", str(tmp_path / "r")]) == 2
        assert f"image folder {path}: {words[1:-1]}" in capsys.readouterr().err
    root = tmp_path / "imgs"
    write_image_folder(root)
    (root / "train" / "cat" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    with pytest.raises(AttnconvError, match="gone.png: a link to .*nowhere.png, which does not exist; fix or remove it"):
        scan_folder(root)


def test_a_folder_that_cannot_be_entered_is_named_as_one(finished, tmp_path, monkeypatch, capsys):  # noqa: F811
    """As another user, a run folder of mode 000 (or below one) was "RUN/.replaced-run.attnconv-tmp/manifest.json:
    not writable; choose another location" (a file never named, "writable" for a read). The permission is
    simulated (the tests may run as root, who may enter anything)."""
    import os

    run = tmp_path / "locked" / "run"
    shutil.copytree(finished, run)
    real_stat, real_access = os.stat, os.access
    locked = str(tmp_path / "locked")

    def stat(path, *args, **kwargs):
        if str(path).startswith(locked + os.sep):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: str(path) != locked and real_access(path, mode, **kw))
    for command in (["eval", str(run)], ["compare", str(run)], ["report", str(run), "--out", str(tmp_path / "r.html")],
                    ["plot", "centers", str(run), "--out", str(tmp_path / "p.png")], ["table", str(run)]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert f"{run}: cannot be read: permission denied (the folder {locked} above it cannot be entered)" in err \
            and err.count("\n") == 1 and "not writable" not in err, (command, err)


def test_a_resume_into_a_file_names_it_instead_of_asking_for_flags(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "to_dev").symlink_to("/dev/null")
    for out, words in ((tmp_path / "afile", "(it is a file)"), (tmp_path / "to_dev", "(a link to /dev/null, which is "
                                                                                    "a character device)")):
        assert main(["train", "--resume", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--out {out} is not a directory {words}; give the folder of the run to resume" in err, err
        assert "missing --model" not in err


def test_a_test_split_that_is_a_copy_of_the_train_split_is_refused(tmp_path, monkeypatch, capsys):
    """A byte copy of train/ as test/ trained with "test accuracy 1.0000" although the digests the run recorded
    were equal."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "imgs"
    write_image_folder(root)
    shutil.rmtree(root / "test")
    shutil.copytree(root / "train", root / "test")
    out = tmp_path / "run"
    assert main(["train", "--model", "sa-quadratic", "--hidden", "8", "--layers", "1", "--heads", "4", "--batch-size",
                 "4", "--workers", "1", "--max-steps", "1", "--dataset", f"folder:{root}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "every image of its test split, with its label, is in its train split" in err, err
    assert not out.exists() or not any(out.iterdir())


def test_a_run_moved_into_the_image_folder_is_named_not_called_a_class_to_delete(finished, tmp_path, monkeypatch,  # noqa: F811
                                                                                 capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "imgs"
    write_image_folder(root)
    shutil.copytree(finished, root / "train" / "moved")
    with pytest.raises(AttnconvError, match="moved holds an attnconv run \\(config.json\\), not images: a folder in "
                                            ".*train is read as a class; move the run out of the image folder"):
        scan_folder(root)
    assert (root / "train" / "moved" / "config.json").exists()


def test_two_class_folders_linked_to_one_folder_outside_get_a_fix_that_works(tmp_path):
    root = tmp_path / "imgs"
    write_image_folder(root)
    shutil.move(root / "train" / "cat", tmp_path / "cats")
    (root / "train" / "cat").symlink_to(tmp_path / "cats")
    shutil.rmtree(root / "test" / "cat")
    (root / "test" / "cat").symlink_to(tmp_path / "cats")
    with pytest.raises(AttnconvError, match="counted twice; remove the link, or point it to a folder no other class "
                                            "folder leads to"):
        scan_folder(root)


def deny(monkeypatch, *denied):
    """Simulate paths this user may not read (the tests may run as root): opening or listing each path in `denied`,
    and anything below it, fails with EACCES (stat too, below it), and os.access says no, as for mode 000."""
    import os

    denied = tuple(str(p) for p in denied)
    real = {name: getattr(os, name) for name in ("stat", "open", "scandir", "access")}
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # a user, whom the mode bits refuse (so the fix is chmod)

    def blocked(path, itself: bool = True) -> bool:
        return any((itself and str(path) == d) or str(path).startswith(d + os.sep) for d in denied)

    def guard(name):
        def call(path, *args, **kwargs):
            if blocked(path, itself=name != "stat"):  # a folder that cannot be entered can still be looked at
                raise PermissionError(13, "Permission denied", str(path))
            return real[name](path, *args, **kwargs)
        return call

    for name in ("stat", "open", "scandir"):
        monkeypatch.setattr(os, name, guard(name))
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: not blocked(path) and real["access"](path, mode, **kw))


def test_a_run_file_this_user_cannot_read_is_not_called_damaged(finished, tmp_path, monkeypatch, capsys):  # noqa: F811
    """A config.json, metrics.csv, heads.jsonl or model.safetensors of mode 000 was "restore it from a copy, or
    delete it" / "train the run again" (the file is sound), and unreadable weights let table print a run whose
    config.json was edited, their record unread."""
    for name, command in (("config.json", "eval"), ("metrics.csv", "table"), ("heads.jsonl", "analyze"),
                          ("model.safetensors", "eval"), ("model.safetensors", "table")):
        run = tmp_path / f"{name}-{command}"
        shutil.copytree(finished, run)
        with monkeypatch.context() as m:
            deny(m, run / name)
            assert main([command, str(run)]) == 2, (name, command)
        err = capsys.readouterr().err
        assert f"{run / name}: permission denied: it cannot be read; give this user the permission" in err \
            and err.count("\n") == 1 and "restore" not in err and "again" not in err, (name, command, err)


def test_a_class_folder_or_dataset_folder_this_user_cannot_read_is_named(tmp_path, monkeypatch, capsys):
    """A class folder of mode 000 was "holds no images; add some or remove the folder" (a class of the user's data);
    a Fashion-MNIST folder of mode 000 was blamed on --out, and a .gz of mode 000 called corrupt."""
    from fixtures_data import write_fashion

    root = tmp_path / "imgs"
    write_image_folder(root)
    with monkeypatch.context() as m:
        deny(m, root / "train" / "cat")
        with pytest.raises(AttnconvError, match="cat: cannot be read: permission denied") as err:
            scan_folder(root)
    assert "remove" not in str(err.value)
    fashion = tmp_path / "fashion"
    write_fashion(fashion)
    with monkeypatch.context() as m:
        deny(m, fashion)
        with pytest.raises(AttnconvError, match=f"{fashion}: cannot be read: permission denied"):
            load_dataset("fashion-mnist", fashion, download=False)
    with monkeypatch.context() as m:
        deny(m, fashion / "t10k-labels-idx1-ubyte.gz")
        with pytest.raises(AttnconvError, match="t10k-labels-idx1-ubyte.gz: permission denied: it cannot be read") as err:
            load_dataset("fashion-mnist", fashion, download=False)
    assert "corrupt" not in str(err.value)


def test_the_last_resort_line_names_the_folder_that_blocks(tmp_path, monkeypatch, capsys):
    """An output below a folder that cannot be entered ended in "FILE: permission denied; ... chmod it" of a file
    that is not there."""

    from attnconv.fileio import permission_words

    (tmp_path / "locked").mkdir()
    with monkeypatch.context() as m:
        deny(m, tmp_path / "locked")
        assert permission_words(tmp_path / "locked" / "run" / "x.html") == \
            f"permission denied: the folder {tmp_path / 'locked'} cannot be entered"
    with monkeypatch.context() as m:
        deny(m, tmp_path / "locked")
        assert main(["express", "--plot", str(tmp_path / "locked" / "x.png")]) == 2
    err = capsys.readouterr().err
    assert f"the folder {tmp_path / 'locked'} cannot be entered" in err and err.count("\n") == 1, err


def test_round_33_permissions_name_the_permission(finished, tmp_path, monkeypatch, capsys):  # noqa: F811
    """A resume into a run folder this user may not write said "choose another directory" (a resume cannot); a run
    folder that can be written but not read said "cannot write there"; a Fashion-MNIST or CIFAR-10 file this user
    may not read was followed by how to get the dataset, or called a corrupt archive; a folder that can be written
    but not read failed after the file was written (its fsync)."""
    from fixtures_data import write_cifar, write_fashion

    from attnconv.fileio import DirectoryLock, atomic_write, write_bytes
    from attnconv.runs import claim_run_dir

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    with monkeypatch.context() as m:
        deny(m, run)
        with pytest.raises(AttnconvError, match="permission denied: it cannot be read; give this user the permission"):
            claim_run_dir(run, DirectoryLock(run), resume=True, overwrite=False)
    fashion = tmp_path / "fashion"
    write_fashion(fashion)
    with monkeypatch.context() as m:
        deny(m, fashion / "train-images-idx3-ubyte.gz")
        with pytest.raises(AttnconvError) as err:
            load_dataset("fashion-mnist", fashion, download=False)
    assert "it cannot be read" in str(err.value) and "searched" not in str(err.value)
    from attnconv.data.cifar import _safe_unpickle

    cifar = tmp_path / "cifar"
    write_cifar(cifar / "cifar-10-batches-py")
    with monkeypatch.context() as m:
        deny(m, cifar / "cifar-10-batches-py" / "data_batch_2")
        with pytest.raises(AttnconvError, match="data_batch_2: permission denied: it cannot be read") as err:
            _safe_unpickle(cifar / "cifar-10-batches-py" / "data_batch_2")
    assert "PermissionError" not in str(err.value)
    import os

    real_open = os.open
    out = tmp_path / "write-only"
    out.mkdir()

    def no_read(path, flags, *args, **kwargs):  # the folder itself cannot be opened to read (mode 0300)
        if str(path) == str(out) and not flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(os, "open", no_read)
        atomic_write(out / "x.bin", write_bytes(b"done"))
    assert (out / "x.bin").read_bytes() == b"done"


def test_a_test_split_made_of_training_images_is_refused_and_a_large_overlap_said(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    args = ["--model", "sa-quadratic", "--hidden", "8", "--layers", "1", "--heads", "4", "--batch-size", "4",
            "--workers", "1", "--max-steps", "1", "--no-progress"]
    root = tmp_path / "subset"
    write_image_folder(root)
    for cls in ("cat", "dog"):  # test/ holds some of the training images only
        for f in (root / "test" / cls).iterdir():
            f.unlink()
        for f in sorted((root / "train" / cls).iterdir())[:2]:
            shutil.copy(f, root / "test" / cls / f.name)
    assert main(["train", *args, "--dataset", f"folder:{root}", "--out", str(tmp_path / "r1")]) == 2
    assert "every image of its test split, with its label, is in its train split" in capsys.readouterr().err
    root = tmp_path / "most"
    write_image_folder(root)
    for cls in ("cat", "dog"):  # one image of its own a class, the rest training images
        for f in sorted((root / "train" / cls).iterdir())[:2]:
            shutil.copy(f, root / "test" / cls / ("copy-" + f.name))
    assert main(["train", *args, "--dataset", f"folder:{root}", "--out", str(tmp_path / "r2")]) == 0
    assert "of its 8 test images, with their labels, are training images too" in capsys.readouterr().err


def test_a_run_moved_into_the_test_split_is_named_as_a_run(finished, tmp_path, monkeypatch):  # noqa: F811
    """A run moved into test/ was "class 'X' has no folder in train; add ... or remove <the run>"."""
    root = tmp_path / "imgs"
    write_image_folder(root)
    shutil.copytree(finished, root / "test" / "moved")
    with pytest.raises(AttnconvError, match="moved holds an attnconv run \\(config.json\\), not images") as err:
        scan_folder(root)
    assert "remove" not in str(err.value)


def test_round_34_columns_reordered_bench_with_stdout_closed_and_a_board_folder_not_listable(finished, tmp_path,  # noqa: F811
                                                                                              monkeypatch, capsys):
    """One run's metrics.csv with its columns in another order under another seed's config.json counted as a third
    seed; `bench` with stdout closed and no --json exited 0 with every number lost; a tensorboard/ folder this user
    may write but not list was "not writable; choose another location"."""
    import os
    import subprocess
    import sys

    from attnconv.training.board import check_board_folder

    group = tmp_path / "group"
    shutil.copytree(finished, group / "seed0")
    (group / "seed1").mkdir()
    meta = json.loads((finished / "config.json").read_text())
    meta["config"]["seed"] = 1
    (group / "seed1" / "config.json").write_text(json.dumps(meta))
    lines = [line.split(",") for line in (finished / "metrics.csv").read_text().splitlines()]
    order = list(reversed(range(len(lines[0]))))
    (group / "seed1" / "metrics.csv").write_text("".join(",".join(row[i] for i in order) + "\n" for row in lines))
    shutil.copy(finished / "heads.jsonl", group / "seed1" / "heads.jsonl")
    assert main(["compare", str(group)]) == 2
    assert "hold the same metrics.csv: one run's logs twice" in capsys.readouterr().err
    proc = subprocess.run([sys.executable, "-m", "attnconv", "bench", "--only", "matmul", "--quick"],
                          stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=lambda: os.close(1))
    assert proc.returncode == 2 and "standard output is closed, and `attnconv bench` answers there" in proc.stderr
    board = tmp_path / "run" / "tensorboard"
    board.mkdir(parents=True)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: not (str(p) == str(board) and mode & os.R_OK)
                        and real(p, mode, **kw))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(AttnconvError, match="tensorboard: this user may not list it, as the event files need; give"):
        check_board_folder(tmp_path / "run")
    monkeypatch.setattr("attnconv.pathwords.modes_overridden", lambda: True)  # round 73: root, refused by
    # `chattr +i`, was told to chmod
    with pytest.raises(AttnconvError, match=r"event files need; root is refused only by a file or folder marked immutable "
                                            r"\(lsattr shows an i; chattr -i lifts it\)"):
        check_board_folder(tmp_path / "run")


def test_round_35_logs_a_resume_appends_to_a_board_overwrite_lists_a_column_added_and_heads_twice(
        finished, data_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    """A resume of a run whose steps.csv this user may not write trained, then failed with "not writable; choose
    another location" (and so did the resume it named); --overwrite of a run whose tensorboard/ this user may not
    list said the same; one seed's metrics.csv with a column added, or its heads.jsonl, under another seed counted
    as a third seed."""
    import os

    from attnconv.training.stopping import stopped_line

    run = tmp_path / "run"
    assert main(tiny_args(run, data_dir, *ONE_EPOCH, "--max-steps", "5")) == 0  # stopped at its checkpoint of step 5
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    real = os.access
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # a user, whom the mode bits refuse (root: test_round_75_b)
    for name in ("steps.csv", "metrics.csv", "heads.jsonl"):
        monkeypatch.setattr(os, "access", lambda p, mode, name=name, **kw: not (
            str(p) == str(run / name) and mode & os.W_OK) and real(p, mode, **kw))
        assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"this user may not write its {name}, which the run appends to; give this user the permission " \
               "(chmod)" in err, err
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # refused before any work
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"old events")
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: not (
        str(p) == str(run / "tensorboard") and mode & os.R_OK) and real(p, mode, **kw))
    assert main(tiny_args(run, data_dir, "--overwrite", *ONE_EPOCH)) == 2
    assert "may not list its tensorboard/ folder, whose event files are the run's; give this user the permission" \
        in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    monkeypatch.setattr(os, "access", real)
    line = stopped_line(PermissionError(13, "Permission denied", str(run / "steps.csv")), run, None, False, False, False)
    assert f"could not write {run / 'steps.csv'} (permission denied; give this user the permission (chmod)" \
        in line.as_flag()

    group = tmp_path / "group"
    shutil.copytree(finished, group / "seed0")
    meta = json.loads((finished / "config.json").read_text())
    meta["config"]["seed"] = 1
    (group / "seed1").mkdir()
    (group / "seed1" / "config.json").write_text(json.dumps(meta))
    lines = (finished / "metrics.csv").read_text().splitlines()
    (group / "seed1" / "metrics.csv").write_text("\n".join([lines[0] + ",extra", *(r + ",7" for r in lines[1:])]) + "\n")
    for command in (["compare", str(group)], ["table", str(group / "seed0"), str(group / "seed1")]):
        assert main(command) == 2
        assert "hold the same metrics.csv: one run's logs twice" in capsys.readouterr().err
    shutil.rmtree(group / "seed1")
    shutil.copytree(finished, group / "seed1")
    (group / "seed1" / "config.json").write_text(json.dumps(meta))
    rows = [r.split(",") for r in lines]
    col = rows[0].index("test_acc")
    for r in rows[1:]:
        r[col] = "0.5"
    (group / "seed1" / "metrics.csv").write_text("".join(",".join(r) + "\n" for r in rows))
    assert main(["compare", str(group)]) == 2
    assert "hold heads.jsonl snapshots in common: one run's logs twice" in capsys.readouterr().err


def test_round_36_logs_edited_past_the_sixth_digit_heads_in_part_and_a_checkpoint_that_cannot_be_read(
        finished, tmp_path, capsys):  # noqa: F811
    """One seed's metrics.csv under another seed with one value changed by 1e-12 (or its seconds), or its heads.jsonl
    with a snapshot left out or a center moved by 1e-12, counted as another seed; a run stopped while its state.pt
    could not be read (a FIFO, a folder, no permission) said "no checkpoint was written yet"."""
    from attnconv.runs.logs_file import metrics_text
    from attnconv.training.checks import where_the_run_stands

    meta = json.loads((finished / "config.json").read_text())
    meta["config"]["seed"] = 1
    rows = __import__("attnconv.runs", fromlist=["read_metrics"]).read_metrics(finished)
    snaps = [json.loads(line) for line in (finished / "heads.jsonl").read_text().splitlines()]
    trained = [s for s in snaps if s["epoch"] >= 1]
    assert trained

    def seed1(group, metrics, heads):
        shutil.copytree(finished, group / "seed0")
        (group / "seed1").mkdir()
        (group / "seed1" / "config.json").write_text(json.dumps(meta))
        (group / "seed1" / "metrics.csv").write_text(metrics_text(metrics))
        (group / "seed1" / "heads.jsonl").write_text("".join(json.dumps(s) + "\n" for s in heads))

    edited = [dict(r) for r in rows]
    edited[-1]["test_loss"] += 1e-12
    timed = [dict(r) for r in rows]
    timed[-1]["seconds"] += 5.0
    own = [dict(r) for r in rows]
    own[-1]["train_loss"] += 1e-3  # its own run's metrics, for the heads cases
    moved, others = json.loads(json.dumps(snaps)), json.loads(json.dumps(snaps))
    moved[-1]["layers"][0][0]["center"][0] += 1e-12
    for s in others:  # its own run's heads, for the metrics cases
        s["layers"][0][0]["attention_distance"] += 1e-3
    for k, (metrics, heads, said) in enumerate((
            (edited, others, "hold the same metrics.csv"), (timed, others, "hold the same metrics.csv"),
            (own, snaps[:1] + trained[:1], "hold heads.jsonl snapshots in common"),
            (own, moved, "hold heads.jsonl snapshots in common"))):
        group = tmp_path / f"g{k}"
        seed1(group, metrics, heads)
        assert main(["compare", str(group)]) == 2
        assert f"{said}: one run's logs twice" in capsys.readouterr().err
        if heads is others:
            assert main(["table", str(group / "seed0"), str(group / "seed1")]) == 2
            assert "one run's logs twice" in capsys.readouterr().err

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "state.pt").unlink()
    (run / "state.pt").mkdir()
    said = where_the_run_stands(run, False, False)
    assert said.startswith("its checkpoint cannot be read (") and "no checkpoint was written yet" not in said, said
    (run / "state.pt").rmdir()
    assert "no checkpoint was written yet" in where_the_run_stands(run, False, False)


def test_round_37_a_cut_state_a_help_into_a_full_stdout_and_heads_without_their_start(finished, tmp_path, capsys):  # noqa: F811
    """A state.pt cut at 5,000 to 50,000 bytes was "cannot read the training state (Invalid argument)"; `--help` with
    stdout full exited 0 with nothing written; compare's "heads.jsonl does not start at initialization" gave no fix."""
    import subprocess
    import sys

    from attnconv.runs.files import load_state

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    whole = (run / "state.pt").read_bytes()
    for cut in (100, 5_000, 20_000, len(whole) // 2, len(whole) - 10):
        (run / "state.pt").write_bytes(whole[:cut])
        with pytest.raises(AttnconvError, match=r"cannot read the training state: the file is corrupt \(truncated"):
            load_state(run / "state.pt")
    for argv in (["--help"], ["eval", "--help"], ["plot", "distance", "--help"]):
        with open("/dev/full", "w") as full:
            proc = subprocess.run([sys.executable, "-m", "attnconv", *argv], stdout=full, stderr=subprocess.PIPE,
                                  text=True, timeout=120)
        assert (proc.returncode, proc.stderr) == (2, "error: standard output: no space left on the device; free some "
                                                     "space\n"), (argv, proc.returncode, proc.stderr)
    (run / "state.pt").write_bytes(whole)
    snaps = (run / "heads.jsonl").read_text().splitlines()
    (run / "heads.jsonl").write_text("\n".join(snaps[1:]) + "\n")  # its start lost (a resume wrote it anew)
    assert main(["compare", str(run)]) == 2
    assert "does not start at initialization (epoch 0); restore it from a copy of the run, or move it out of the run " \
           "folder" in capsys.readouterr().err
