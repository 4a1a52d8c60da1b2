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
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert permission_fix(tmp_path).startswith(ROOT) and permission_fix(tmp_path / "not" / "yet").startswith(ROOT)
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: types.SimpleNamespace(f_flag=os.ST_RDONLY) if str(p).startswith(
        str(tmp_path)) else real(p))
    for who in (0, 1000):  # a read-only mount refuses everyone: no chmod or chattr lifts it
        monkeypatch.setattr(os, "geteuid", lambda who=who: who)
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
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert main(tiny_args(run, data_dir, "--max-steps", "2", "--overwrite")) == 2
    err = capsys.readouterr().err
    assert f"not writable; {ROOT}" in err and "chmod" not in err, err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(AttnconvError, match=f"not writable; {USER.replace('(', '[(]').replace(')', '[)]')}"):
        claim_run_dir(run, DirectoryLock(run), resume=False, overwrite=True)
