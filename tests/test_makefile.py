"""`make test` sets up what its tests need (Chromium, Fashion-MNIST) or says in one line what it could not."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def run_deps(**variables) -> subprocess.CompletedProcess:
    args = [f"{k}={v}" for k, v in variables.items()]
    return subprocess.run(["make", "-s", "--no-print-directory", "-C", str(REPO), "test-deps", *args],
                          capture_output=True, text=True, timeout=60)



def fake_apt(tmp_path: Path) -> Path:
    """An apt-get that logs its arguments and installs nothing."""
    script = tmp_path / "apt-get"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'apt.log'}\n")
    script.chmod(0o755)
    return script


def test_missing_packages_are_installed_with_apt_get_and_what_failed_is_one_line(tmp_path):
    apt = fake_apt(tmp_path)
    done = run_deps(APT_GET=apt, SUDO="", FMNIST=tmp_path / "none", HAVE_CHROMIUM="false")
    assert done.returncode == 0
    calls = (tmp_path / "apt.log").read_text().splitlines()
    assert calls == ["update -qq", "install -y -qq chromium dataset-fashion-mnist"]
    assert done.stdout.splitlines() == [
        "note: could not install chromium and dataset-fashion-mnist (needs apt-get and root or sudo): the page "
        "tests in Chromium skip (fail under CI=true); the real Fashion-MNIST tests skip"]


def test_nothing_is_installed_or_said_when_all_is_there(tmp_path):
    apt = fake_apt(tmp_path)
    (tmp_path / "fmnist").mkdir()
    done = run_deps(APT_GET=apt, SUDO="", FMNIST=tmp_path / "fmnist", HAVE_CHROMIUM="true")
    assert done.returncode == 0 and done.stdout == "" and not (tmp_path / "apt.log").exists()


def test_without_apt_get_it_says_which_tests_skip(tmp_path):
    done = run_deps(APT_GET="no-such-apt-get", FMNIST=tmp_path / "fmnist", HAVE_CHROMIUM="true")
    assert done.returncode == 0
    assert done.stdout == ("note: could not install dataset-fashion-mnist (needs apt-get and root or sudo): the real "
                           "Fashion-MNIST tests skip\n")


def test_ci_runs_the_readme_command():
    run = (REPO / ".ci" / "run").read_text()
    assert "make test" in (REPO / "README.md").read_text()
    assert [line for line in run.splitlines() if line and not line.startswith("#")][-1] == "exec make test"
    assert "apt-get" not in run  # one place installs: the Makefile
