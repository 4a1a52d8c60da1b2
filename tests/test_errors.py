"""ParameterError: the library names a bad argument by its parameter, the command line by its flag."""

import dataclasses
import pickle
import re

import pytest

from attnconv.cli import main
from attnconv.errors import AttnconvError, Interrupted, ParameterError
from attnconv.options import FieldError


def test_a_parameter_error_says_the_parameter_from_python_and_the_flag_from_the_command_line():
    err = ParameterError("out", "/x", "already holds a run; pass {resume} to continue it, or choose a new {out}",
                         mentions=("resume", "out"), flags={"out": "export"})
    assert str(err) == "out /x already holds a run; pass resume to continue it, or choose a new out"
    assert err.as_flag() == "--export /x already holds a run; pass --resume to continue it, or choose a new --export"
    assert isinstance(err, AttnconvError) and err.flag == "export"
    # punctuation right after the value; a value left out; braces not mentioned stay text (a path may hold them)
    assert ParameterError("data_dir", "/d{out}", ": no such directory").as_flag() == "--data-dir /d{out}: no such directory"
    assert ParameterError("port", None, "is busy", shown="").as_flag() == "--port is busy"
    assert str(ParameterError("out", "/x", "holds {resume}")) == "out /x holds {resume}"
    # no one argument: the sentence alone, naming the parameters that fix it
    nan = ParameterError(None, None, "loss became non-finite; lower {lr} or raise {warmup}", mentions=("lr", "warmup"))
    assert str(nan) == "loss became non-finite; lower lr or raise warmup" and nan.flag is None
    assert nan.as_flag() == "loss became non-finite; lower --lr or raise --warmup"
    stop = Interrupted("interrupted; the run that {overwrite} was replacing is restored", mentions=("overwrite",))
    assert isinstance(stop, KeyboardInterrupt) and str(stop) == "interrupted; the run that overwrite was replacing is restored"
    assert stop.as_flag() == "interrupted; the run that --overwrite was replacing is restored"


def test_errors_survive_pickling_as_the_ranks_of_a_distributed_run_gather_them():
    for err in (ParameterError("out", "/x", "is a file; {out}", mentions=("out",)),
                FieldError("alpha", -1.0, "give a positive number", flag="init-alpha")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.as_flag() == err.as_flag()
    assert FieldError("alpha", -1.0, "x").field == "alpha"


def _config():
    from attnconv.config import make_config

    return make_config(preset="fmnist-sa-quadratic")


def _calls(tmp_path):
    """(call, what Python says, what the command line says) for library functions given a bad argument."""
    from attnconv.config import make_config
    from attnconv.data import dataset_info
    from attnconv.explorer.export import write_export
    from attnconv.explorer.server import make_server
    from attnconv.export import export_run
    from attnconv.fileio import DirectoryLock
    from attnconv.learnconv import learn_conv
    from attnconv.plots import plot_maps
    from attnconv.precision import check_amp
    from attnconv.report import build_report, write_report
    from attnconv.runs import check_other_dataset, claim_run_dir, convert_run, run_data_dir
    from attnconv.training import train
    from attnconv.training.checks import resolve_overrides

    run, a_file, taken = tmp_path / "run", tmp_path / "file", tmp_path / "taken"
    run.mkdir(), a_file.write_text("x"), taken.mkdir()
    return [
        (lambda: build_report(run, images=0), "images 0 is invalid: give a number of test images, a whole number",
         "--images 0"),
        (lambda: make_server(None, port=-1), "port -1 is invalid: give a TCP port", "--port -1 is invalid"),
        (lambda: write_report(run, tmp_path / "r.txt"), f"out {tmp_path / 'r.txt'}: give a file name ending in .html",
         f"--out {tmp_path / 'r.txt'}:"),
        (lambda: write_export(run, tmp_path / "p.png"), f"out {tmp_path / 'p.png'}: give a file name ending in .html",
         f"--export {tmp_path / 'p.png'}:"),
        (lambda: export_run(run, "jpeg"), "fmt 'jpeg': choose one of exported, torchscript, onnx", "--format 'jpeg':"),
        (lambda: plot_maps(run, zoom=0), "zoom 0 is invalid", "--zoom 0 is invalid"),
        (lambda: claim_run_dir(a_file, DirectoryLock(a_file), resume=False, overwrite=False),
         f"out {a_file} is not a directory (it is a file); give a directory",
         f"--out {a_file} is not a directory (it is a file)"),
        (lambda: convert_run(run, taken), f"out {taken} already exists", f"--out {taken} already exists"),
        (lambda: run_data_dir(_config(), tmp_path / "nope"), f"data_dir {tmp_path / 'nope'}: no such directory",
         f"--data-dir {tmp_path / 'nope'}: no such directory"),
        (lambda: check_other_dataset(_config(), f"folder:{tmp_path / 'gone'}"),
         f"dataset folder:{tmp_path / 'gone'}: {tmp_path / 'gone'} does not exist", f"--dataset folder:{tmp_path / 'gone'}:"),
        # learn-conv, training, devices and precision
        (lambda: learn_conv(kernel=4), "kernel 4: give an odd kernel size", "--kernel 4: give an odd"),
        (lambda: learn_conv(batch_size=0), "batch_size 0 is invalid: give a whole number >= 1", "--batch-size 0 is invalid"),
        (lambda: learn_conv(size=5000, channels=8, heads=9, batch_size=32),
         "size 5000 with channels 8, heads 9, batch_size 32: needs about",
         "--size 5000 with --channels 8, --heads 9, --batch-size 32: needs about"),
        (lambda: train(_config(), run, resume=True, overwrite=True), "resume and overwrite contradict each other",
         "--resume and --overwrite contradict each other"),
        (lambda: make_config(preset="fmnist-sa-quadratic", device="tpu").validate(),
         "device 'tpu' is not a device attnconv runs on", "--device 'tpu' is not a device"),
        (lambda: make_config(preset="fmnist-sa-quadratic", data_dir=str(tmp_path / "nope")).validate(),
         f"data_dir {tmp_path / 'nope'}: no such directory", f"--data-dir {tmp_path / 'nope'}: no such directory"),
        (lambda: check_amp(True, "meta"), "amp: meta here has no native bfloat16 support",
         "--amp: meta here has no native bfloat16 support"),
        (lambda: resolve_overrides(dataclasses.replace(_config(), model_overrides={"in_channels": 3}),
                                   dataset_info("fashion-mnist")),
         "in_channels 3 does not match fashion-mnist (in_channels = 1); drop in_channels",
         "--in-channels 3 does not match fashion-mnist (in_channels = 1); drop --in-channels"),
    ]


def test_library_errors_name_the_parameter_and_the_command_line_its_flag(tmp_path):
    for call, said, flagged in _calls(tmp_path):
        with pytest.raises(ParameterError, match="^" + re.escape(said)) as info:
            call()
        assert "--" not in str(info.value), str(info.value)
        assert info.value.as_flag().startswith(flagged), info.value.as_flag()


def test_the_command_line_prints_the_flag(tmp_path, capsys):
    a_file, run = tmp_path / "file", tmp_path / "run"
    a_file.write_text("x")
    run.mkdir()
    # train: the run directory is claimed inside the trainer, whose ranks agree on the error before it is raised
    assert main(["train", "--preset", "fmnist-sa-quadratic", "--out", str(a_file)]) == 2
    assert capsys.readouterr().err == f"error: --out {a_file} is not a directory (it is a file); give a directory\n"
    assert main(["explore", str(run), "--export", str(tmp_path / "p.png")]) == 2
    assert capsys.readouterr().err == f"error: --export {tmp_path / 'p.png'}: give a file name ending in .html, .htm\n"
    assert main(["report", str(run), "--out", str(tmp_path / "r.txt")]) == 2
    assert capsys.readouterr().err == f"error: --out {tmp_path / 'r.txt'}: give a file name ending in .html, .htm\n"
    assert not (tmp_path / "p.png").exists() and not (tmp_path / "r.txt").exists()


def test_a_directory_another_process_writes_is_named_by_its_parameter(tmp_path):
    from attnconv.fileio import DirectoryLock

    with DirectoryLock(tmp_path), pytest.raises(ParameterError, match=f"^out {re.escape(str(tmp_path))}: another") as info:
        DirectoryLock(tmp_path).acquire()
    assert info.value.as_flag().startswith(f"--out {tmp_path}: another attnconv process is writing there")


EXPRESS = ["express", "--dim", "2", "--kernel", "3", "--in-channels", "2", "--out-channels", "2"]


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_output_to_a_full_device_names_standard_output_and_errors_never_go_to_stdout():
    """`attnconv express ... > /dev/full` said "error: no space left on the device; free some space", naming no
    file (the lines the command prints were what could not be written); with stderr closed (`2>&-`), the error line
    went to stdout (print(file=None) writes there). Now: the full device is named standard output, and with
    stderr closed an error is not printed at all, to stdout least of all. Each in a process of its own."""
    import os
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "attnconv", *EXPRESS], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == "error: standard output: no space left on the device; free some " \
                                                   "space\n", proc.stderr
    proc = subprocess.run([sys.executable, "-m", "attnconv", *EXPRESS, "--kernel", "0"], capture_output=True,
                          text=True, timeout=120, preexec_fn=lambda: os.close(2))
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr == "", (proc.stdout, proc.stderr)


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_stderr_that_cannot_be_written_does_not_stop_the_work(tmp_path):
    """`train ... 2>/dev/full` (or stderr a pipe whose reader left) stopped at its first progress line with exit 1,
    leaving config.json and empty logs: the failed write was taken for a full disk of the run's, whose error line
    failed again. A diagnostic that cannot be written is dropped; the run is trained and checkpointed, exit 0."""
    import os
    import subprocess
    import sys

    from fixtures_data import write_random_fashion

    data = tmp_path / "data"
    data.mkdir()
    write_random_fashion(data, 32, 12)
    read, write = os.pipe()
    os.close(read)  # a reader that left: every write to stderr fails with EPIPE
    for name, stderr in (("full", open("/dev/full", "w")), ("pipe", write)):
        out = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "attnconv", "train", "--model", "sa-quadratic", "--hidden", "8",
                               "--layers", "1", "--heads", "4", "--intermediate", "8", "--downsample", "4",
                               "--dataset", "fashion-mnist", "--data-dir", str(data), "--epochs", "1", "--max-steps",
                               "2", "--batch-size", "16", "--workers", "1", "--out", str(out)],
                              stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=300)
        assert proc.returncode == 0 and f"{out}: epoch 1, step 2, test accuracy" in proc.stdout, (name, proc)
        assert (out / "model.safetensors").is_file() and (out / "state.pt").is_file(), name
    os.close(write)


def test_a_command_whose_answer_is_what_it_prints_refuses_a_closed_stdout():
    """`attnconv eval RUN >&-` (and compare, predict) exited 0 with the answer lost. In a process of its own,
    stdout closed."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "attnconv", *EXPRESS], capture_output=False, stderr=subprocess.PIPE,
                          text=True, timeout=120, preexec_fn=lambda: os.close(1))
    assert proc.returncode == 2 and proc.stderr == (
        "error: standard output is closed, and `attnconv express` answers there; give it somewhere to go (`> FILE`, "
        "or a pipe)\n"), proc.stderr
