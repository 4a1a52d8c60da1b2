"""A permission refused is said with the fix that works for whoever runs the command: the mode bits (chmod) or the
owner for a user; for root, whom no mode bit refuses, the immutable flag (chattr -i) or a read-only file system;
a read-only file system for anyone whose path is on one (`pathwords.permission_fix`)."""

from __future__ import annotations

import os
import types

import pytest
from test_train import data_dir, tiny_args  # noqa: F401  (data_dir is a fixture)

from attnconv.cli import main
from attnconv.errors import AttnconvError
from attnconv.fileio import DirectoryLock
from attnconv.pathwords import permission_fix
from attnconv.runs.directory import claim_run_dir

USER = "give this user the permission (chmod), or run as the files' owner"
ROOT = "root is refused only by a file or folder marked immutable (lsattr shows an i; chattr -i lifts it)"


def test_the_fix_is_the_one_that_works_for_who_runs_it(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert permission_fix(tmp_path) == USER and permission_fix() == USER
    monkeypatch.setattr("attnconv.pathwords.modes_overridden", lambda: True)  # root, who passes every mode bit
    assert permission_fix(tmp_path).startswith(ROOT) and permission_fix(tmp_path / "not" / "yet").startswith(ROOT)
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: types.SimpleNamespace(f_flag=os.ST_RDONLY) if str(p).startswith(
        str(tmp_path)) else real(p))
    for root in (True, False):  # a read-only mount refuses everyone: no chmod or chattr lifts it
        monkeypatch.setattr("attnconv.pathwords.modes_overridden", lambda root=root: root)
        assert permission_fix(tmp_path / "missing.txt") == "it is on a read-only file system; choose another location"
        assert permission_fix() != permission_fix(tmp_path)  # a place not named: the user's words


def test_round_75_b_root_refused_by_an_immutable_run_is_told_chattr_not_chmod(tmp_path, data_dir,  # noqa: F811
                                                                               monkeypatch, capsys):
    """Round 75: `train --overwrite` of a run marked immutable (`chattr +i`), as root, said "not writable; give this
    user the permission (chmod), or run as the files' owner": root owns it and chmod is refused there too."""
    run = tmp_path / "run"
    assert main(tiny_args(run, data_dir, "--max-steps", "2")) == 0
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: not (str(p) == str(run) and mode & os.W_OK)
                        and real(p, mode, **kw))  # as `chattr +i` refuses root's writing there
    monkeypatch.setattr("attnconv.pathwords.modes_overridden", lambda: True)
    assert main(tiny_args(run, data_dir, "--max-steps", "2", "--overwrite")) == 2
    err = capsys.readouterr().err
    assert f"not writable; {ROOT}" in err and "chmod" not in err, err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    monkeypatch.setattr("attnconv.pathwords.modes_overridden", lambda: False)  # a user, or root without the
    # capability to pass the mode bits (a container started with it dropped): chmod is the fix for both
    with pytest.raises(AttnconvError, match=f"not writable; {USER.replace('(', '[(]').replace(')', '[)]')}"):
        claim_run_dir(run, DirectoryLock(run), resume=False, overwrite=True)


def test_round_76_b_root_without_the_capability_is_told_chmod(tmp_path, monkeypatch):
    """Round 76: root in a container started without CAP_DAC_OVERRIDE is refused by the mode bits as a user is, and
    was told that only an immutable flag or a read-only file system refuses root; chmod, which works, went unsaid."""
    import attnconv.pathwords as pathwords

    status = tmp_path / "status"
    monkeypatch.setattr(pathwords, "_STATUS", str(status))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for caps, overridden in (("00000000a80425fb", True), ("00000000a80425f9", False), ("0000000000000000", False)):
        status.write_text(f"Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{caps}\n")
        assert pathwords.modes_overridden() is overridden
        assert (permission_fix(tmp_path) == USER) is not overridden
    status.unlink()  # no /proc to ask: root is taken to pass the mode bits
    assert pathwords.modes_overridden() and permission_fix(tmp_path).startswith(ROOT)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert not pathwords.modes_overridden()
    assert pathwords.marked(tmp_path) == "" and pathwords.marked(tmp_path / "missing") == ""


def test_round_76_b_an_append_only_folder_is_refused_before_anything_is_written(tmp_path, data_dir,  # noqa: F811
                                                                                  monkeypatch, capsys):
    """Round 76: in a folder marked append-only (`chattr +a`) a file can be made but not renamed or removed: `train
    --overwrite` said the old run was in .replaced-run.attnconv-tmp/ (it never left, and the empty folder stayed for
    good); report, plot, export, convert, explore --export and learn-conv left their temporary behind, named it as
    the output ("not writable; choose another location") or said "nothing was written" beside it."""
    import attnconv.fileio as fileio
    import attnconv.runs.directory as directory

    run, folder = tmp_path / "run", tmp_path / "ap"
    assert main(tiny_args(run, data_dir, "--max-steps", "2")) == 0
    folder.mkdir()
    flagged = {str(run), str(folder)}

    def marked(path):
        return f"{path} is marked append-only (lsattr -d shows an a; chattr -a lifts it)" if str(path) in flagged \
            else ""

    monkeypatch.setattr(fileio, "marked", marked)
    monkeypatch.setattr(directory, "marked", marked)
    monkeypatch.setattr("attnconv.pathwords.marked", marked)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert main(tiny_args(run, data_dir, "--max-steps", "2", "--overwrite")) == 2
    err = capsys.readouterr().err
    assert f"--out {run}: {run} is marked append-only (lsattr -d shows an a; chattr -a lifts it); a run's files" in err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # nothing set aside, nothing made
    for args in (["report", str(run), "--out", str(folder / "r.html")],
                 ["export", str(run), "--format", "onnx", "--out", str(folder / "m.onnx")],
                 ["plot", "centers", str(run), "--out", str(folder / "c.png")],
                 ["explore", str(run), "--export", str(folder / "e.html")]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert f"{folder} is marked append-only (lsattr -d shows an a; chattr -a lifts it): a file written there " \
               "cannot be put in place; choose another location" in err and "attnconv-tmp" not in err, (args, err)
    with pytest.raises(fileio.Unplaceable, match="is marked append-only") as info:
        fileio.atomic_write(folder / "x.txt", fileio.write_bytes(b"x"))
    assert fileio.describe_os_error(info.value).startswith(f"{folder} is marked append-only")
    assert list(folder.iterdir()) == []  # no temporary made, none left


def test_round_76_b_a_new_run_on_a_read_only_file_system_is_said_once(tmp_path, data_dir, monkeypatch,  # noqa: F811
                                                                        capsys):
    """Round 76: a new --out on a read-only file system said its fix twice ("(not writable; choose another location);
    choose another directory") and not why."""
    from pathlib import Path

    real_statvfs, real_mkdir = os.statvfs, Path.mkdir
    monkeypatch.setattr(os, "statvfs", lambda p: types.SimpleNamespace(f_flag=os.ST_RDONLY) if str(p).startswith(
        str(tmp_path)) else real_statvfs(p))

    def mkdir(self, *args, **kwargs):
        if str(self).startswith(str(tmp_path / "ro")):
            raise OSError(30, "Read-only file system", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert main(tiny_args(tmp_path / "ro" / "run", data_dir, "--max-steps", "2")) == 2
    err = capsys.readouterr().err
    assert "cannot write there: it is on a read-only file system; choose another location" in err, err
    assert err.count("choose another") == 1 and not (tmp_path / "ro").exists()


def test_round_77_a_every_output_names_the_flag_or_read_only_file_system_that_refuses_it(tmp_path, data_dir,  # noqa: F811
                                                                                          monkeypatch, capsys):
    """Round 77: a single-file output (export, report, plot, explore --export, learn-conv, bench) into a folder marked
    immutable, or on a read-only file system, said only "not writable; choose another location", and a new run
    there "permission denied: the folder ... is not writable; choose another directory", though `train --overwrite`
    named the flag and its fix for the same folder."""
    import attnconv.pathwords as pathwords

    run, folder = tmp_path / "run", tmp_path / "im"
    assert main(tiny_args(run, data_dir, "--max-steps", "2")) == 0
    folder.mkdir()
    said = f"{folder} is marked immutable (lsattr -d shows an i; chattr -i lifts it)"
    monkeypatch.setattr(pathwords, "marked", lambda p: said if str(p) == str(folder) else "")
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: not (str(p) == str(folder) and mode & os.W_OK)
                        and real(p, mode, **kw))  # as the flag refuses every user, root too
    for args in (["report", str(run), "--out", str(folder / "r.html")],
                 ["export", str(run), "--format", "onnx", "--out", str(folder / "m.onnx")],
                 ["bench", "--only", "matmul", "--quick", "--json", str(folder / "b.json")]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert f"not writable; {said}, or choose another location" in err, (args, err)
    from pathlib import Path

    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):  # as the flag refuses a folder made in it
        if str(self).startswith(str(folder) + os.sep):
            raise PermissionError(1, "Operation not permitted", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert main(tiny_args(folder / "new", data_dir, "--max-steps", "2")) == 2
    err = capsys.readouterr().err
    assert f"the folder {folder} is not writable; {said}" in err and "choose another directory" not in err, err
    monkeypatch.setattr(pathwords, "marked", lambda p: "")
    for overridden, fix in ((True, "not writable; choose another location"),
                            (False, "not writable; give this user the permission (chmod), or choose another location")):
        monkeypatch.setattr(pathwords, "modes_overridden", lambda overridden=overridden: overridden)
        monkeypatch.setattr("attnconv.fileio.modes_overridden", lambda overridden=overridden: overridden)
        assert main(["report", str(run), "--out", str(folder / "r.html")]) == 2
        assert fix in capsys.readouterr().err
    assert list(folder.iterdir()) == []
