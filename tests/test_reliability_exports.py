"""Exports are single, recognisable files written atomically (docs/failure-model.md, "Exports").

`attnconv export` makes the file in memory, checks it from those bytes, then writes it with
`fileio.atomic_write`: a full disk is one line and exit 2 (never a C++ abort), the earlier file
stays as it was and no temporary is left; ONNX carries its weights inside the one file; an
export names attnconv inside it, so a rerun replaces it and a user's file of the same name is
still refused; nothing but the path reaches the terminal.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_runs import TINY, train_tiny_runs

from attnconv import export as export_module
from attnconv.cli import main
from attnconv.fileio import written_by_attnconv
from attnconv.runs import Run

SUFFIX = {"exported": ".pt2", "torchscript": ".ts", "onnx": ".onnx"}
FORMATS = [f for f in SUFFIX if f != "onnx" or all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript"))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return train_tiny_runs(tmp_path_factory.mktemp("exports"), [("sa-quadratic", TINY)], epochs=1,
                           max_steps=1)["sa-quadratic"]


def _run_copy(tiny, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(tiny, run)
    return run


def _hidden(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


@pytest.mark.parametrize("fmt", FORMATS)
def test_exports_a_rerun_replaces_its_own_file_and_a_users_file_is_refused(tiny, tmp_path, capfd, fmt):
    run = _run_copy(tiny, tmp_path)
    before = set(os.listdir(run))
    target = run / f"model{SUFFIX[fmt]}"
    capfd.readouterr()
    assert main(["export", str(run), "--format", fmt]) == 0
    out, err = capfd.readouterr()
    assert out == f"{target}\n" and err == "", err  # no warnings, no exporter chatter, no temporary named
    assert set(os.listdir(run)) == before | {target.name}  # one file: no external data, no temporary
    assert written_by_attnconv(target)
    first = target.stat().st_ino
    # a rerun replaces attnconv's own export, without --overwrite
    assert main(["export", str(run), "--format", fmt]) == 0
    assert target.stat().st_ino != first and capfd.readouterr().err == ""
    assert set(os.listdir(run)) == before | {target.name}
    # a user's file of that name is refused (its bytes kept), whatever it holds, unless --overwrite
    mine = {"exported": _zip_without_mark, "torchscript": _zip_without_mark, "onnx": _onnx_without_mark}[fmt]
    for content in (b"my notes\n", mine(target)):
        target.write_bytes(content)
        assert not written_by_attnconv(target)
        assert main(["export", str(run), "--format", fmt]) == 2
        err = capfd.readouterr().err
        assert "attnconv did not write it" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
        assert target.read_bytes() == content
    assert main(["export", str(run), "--format", fmt, "--overwrite"]) == 0 and written_by_attnconv(target)


def _zip_without_mark(export: Path) -> bytes:
    """The same archive with attnconv's record left out: a user's torch file."""
    mine = export.with_name("mine.zip")
    with zipfile.ZipFile(export) as src, zipfile.ZipFile(mine, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith("/attnconv.json"):
                dst.writestr(item, src.read(item))
    data = mine.read_bytes()
    mine.unlink()
    return data


def _onnx_without_mark(export: Path) -> bytes:
    """The same ONNX model without attnconv's doc_string: a user's ONNX file."""
    import onnx

    model = onnx.load(str(export))
    model.doc_string = "exported by hand"
    return model.SerializeToString()


def test_exports_onnx_holds_its_weights_and_a_copy_loads_alone(tiny, tmp_path):
    for module in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(module)
    import onnx
    import onnxruntime
    from onnx.external_data_helper import uses_external_data

    run = _run_copy(tiny, tmp_path)
    path = export_module.export_run(run, "onnx", tmp_path / "out" / "model.onnx")
    assert os.listdir(tmp_path / "out") == ["model.onnx"]  # no .model.onnx.<random>.attnconv-tmp.data beside it
    alone = tmp_path / "elsewhere" / "copied.onnx"
    alone.parent.mkdir()
    shutil.copy(path, alone)
    model = onnx.load(str(alone), load_external_data=False)
    assert model.graph.initializer and not any(uses_external_data(t) for t in model.graph.initializer)
    assert {p.key: p.value for p in model.metadata_props}["generator"].startswith("attnconv ")
    session = onnxruntime.InferenceSession(str(alone))
    x = torch.randn(3, 1, 28, 28)
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, Run(run).model(x).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_exports_a_full_disk_is_one_line_and_keeps_the_earlier_file(tiny, tmp_path, capsys, monkeypatch, fmt):
    """The write fails half way (no space left): one line naming the file, exit 2, the earlier file (a user's,
    replaced with --overwrite) as it was, no temporary left."""
    run = _run_copy(tiny, tmp_path)
    target = run / f"model{SUFFIX[fmt]}"
    target.write_bytes(b"the earlier file\n")
    before = sorted(os.listdir(run))
    writes = []

    def full_disk(self, data):
        writes.append(self.name)
        with open(self, "wb") as f:
            f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    capsys.readouterr()
    assert main(["export", str(run), "--format", fmt, "--overwrite"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == (f"error: {target}: could not write the export (no space left on the device; free some "
                        "space); nothing was written (an earlier file of that name is as it was)")
    assert writes and all(name.startswith(f".{target.name}.") for name in writes)  # it did try, beside the target
    assert target.read_bytes() == b"the earlier file\n" and sorted(os.listdir(run)) == before
    target.unlink()  # no earlier file: the line does not speak of one
    assert main(["export", str(run), "--format", fmt]) == 2
    assert capsys.readouterr().err.strip().endswith("space); nothing was written")


_FULL_DISK = r"""
import resource, signal, sys
from attnconv.cli import main
import torch  # imported before the limit: the command itself is what writes
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
codes = [main(["export", sys.argv[1], "--format", fmt]) for fmt in sys.argv[2:]]
print(codes)
"""


def test_exports_a_file_size_limit_in_a_subprocess_is_one_line_per_export_not_an_abort(tiny, tmp_path):
    """The real writers against a real failing write (RLIMIT_FSIZE: EFBIG past 4 KB): torch's own archive writer
    aborted the process (rc 134) here; the export is now written from Python, after it is made in memory."""
    run = _run_copy(tiny, tmp_path)
    before = sorted(os.listdir(run))
    done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(run), "exported", "torchscript"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "[2, 2]", (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert [line.split(": could not write the export")[0] for line in lines] == [
        f"error: {run / 'model.pt2'}", f"error: {run / 'model.ts'}"], done.stderr
    assert all("File too large" in line for line in lines)
    assert sorted(os.listdir(run)) == before  # no file, no temporary


def test_exports_a_file_that_fails_its_check_is_never_written(tiny, tmp_path, capsys, monkeypatch):
    run = _run_copy(tiny, tmp_path)
    monkeypatch.setattr(export_module, "TOLERANCE", -1.0)
    before = sorted(os.listdir(run))
    assert main(["export", str(run), "--format", "torchscript"]) == 2
    assert "logits differ from the run's" in capsys.readouterr().err
    assert sorted(os.listdir(run)) == before


def _svg_titled(title: str) -> bytes:
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Title": title})
    plt.close(fig)
    return buf.getvalue()


# A user's files that mention attnconv, or quote its commands, anywhere but where attnconv puts its mark: each was
# taken for attnconv's own and replaced without --overwrite (bench --markdown cut a copy of RESULTS.md to 28 lines).
USERS_FILES = {
    "notes.md": lambda: b"# My results\n\nRun `attnconv bench --quick` and paste the table here.\n",
    "results-copy.md": lambda: b"# Results\n\n## `attnconv bench --quick` (2026-11-22)\n\nmy numbers\n",
    "package.json": lambda: b'{"scripts": {"bench": "attnconv bench --quick --markdown out.md"}}',
    "bench.json": lambda: b'{"command": "attnconv bench --quick", "mine": true}',
    "learn.json": lambda: b'{"notes": "x", "generator": "attnconv"}',
    "plot.svg": lambda: _svg_titled("attnconv speed on my laptop"),
    "page.html": lambda: (b'<!DOCTYPE html>\n<!-- <html lang="en"><head><meta charset="utf-8"><meta name="generator" '
                          b'content="attnconv"> -->\n<html><body>mine</body></html>'),
    "fig.png": lambda: b"\x89PNG\r\n\x1a\n....tEXtSoftware\x00attnconv fan club....",
    # the mark where attnconv never puts it (the eighth round): in a comment, in a nested figure, in a string, in
    # another chunk, in another folder of an archive, and a bench section pasted at the top of a longer file
    "comment.svg": lambda: _svg_titled("mine").replace(b"<metadata>", b"<!-- <metadata><rdf:RDF><cc:Work><dc:creator>"
                                                       b"<cc:Agent><dc:title>attnconv (matplotlib 3) --><metadata>", 1),
    "nested.svg": lambda: (b'<?xml version="1.0"?>\n<!DOCTYPE svg PUBLIC "x" "y">\n<svg xmlns="z"><g/>'
                           + _svg_titled("x").split(b"<metadata>", 1)[1]),
    "title.pdf": lambda: (b"%PDF-1.4\n1 0 obj\n<< /Title (see /Creator (attnconv \\(matplotlib 3\\)) here) >>\nendobj\n"
                          b"%%EOF\n"),
    "chunk.png": lambda: _png_with_comment(b"tEXtSoftware\x00attnconv (matplotlib 3.11)"),
    "backup.pt2": lambda: _zip({"backup/notes.txt": "mine", "backup/old-export/attnconv.json":
                                '{"generator": "attnconv 0.1.0"}'}),
    "pasted.md": lambda: b"## `attnconv bench --quick` (2026-11-22)\n\n### layer\n\n| a |\n\n# Results\n\nmine\n",
}


def _png_with_comment(text: bytes) -> bytes:
    import io

    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", text.decode("latin-1"))
    buf = io.BytesIO()
    Image.new("L", (4, 4)).save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


def _zip(files: dict[str, str]) -> bytes:
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buf.getvalue()


@pytest.mark.parametrize("name", sorted(USERS_FILES))
def test_exports_a_file_that_mentions_attnconv_is_not_taken_for_its_own(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(USERS_FILES[name]())
    assert not written_by_attnconv(path)


def test_exports_bench_refuses_a_users_notes_that_quote_its_command(tmp_path, capsys):
    notes = tmp_path / "RESULTS.md"
    text = "# Results\n\nRun `attnconv bench --quick` for these.\n" + "| row |\n" * 1000
    notes.write_text(text)
    assert main(["bench", "--quick", "--only", "layer", "--sides", "8", "--repeats", "1", "--markdown",
                 str(notes)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists and attnconv did not write it" in err[0], err
    assert notes.read_text() == text


def test_exports_a_ctrl_c_that_torch_wraps_is_one_interrupted_line(tiny, tmp_path, capsys, monkeypatch):
    """Ctrl-C while torch.export traced: its tracer turned the KeyboardInterrupt into an AttributeError of its own
    (115 lines of traceback, exit 1). The signal is noted during the export: one `interrupted` line, 130."""
    import signal

    run = _run_copy(tiny, tmp_path)

    def traced_then_wrapped(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:  # as torch._dynamo does with what it catches
            raise AttributeError("module 'torch._dynamo' has no attribute 'exc'") from None
        return b""

    monkeypatch.setattr(export_module, "_serialize", traced_then_wrapped)
    monkeypatch.setattr(export_module, "_INTERRUPTED", False)
    capsys.readouterr()
    assert main(["export", str(run), "--format", "exported"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["interrupted"], err
    assert not (run / "model.pt2").exists() and _hidden(run) == []
    assert export_module._INTERRUPTED  # a later failed export of this process names the Ctrl-C as its likely cause


def test_round_55_exports_from_threads_at_once_and_beside_other_threads_output(tiny, tmp_path, capfd, recwarn):
    """Round 55: export pointed the process's fds 1 and 2 and sys.stdout/sys.stderr at nothing while it ran, and put
    them back per call: threads exporting at once left them silenced for good, failed each other (torch.export's
    tracing state is the process's: "try another --format" on a sound run, or a traceback), and another thread's
    warnings and prints meanwhile were lost. Now one export runs at a time, only its own thread is silenced, and a
    FutureWarning torch says from copyreg while the ONNX exporter copies is quieted (under -W error it failed)."""
    import threading
    import warnings

    run = _run_copy(tiny, tmp_path)
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in (1, 2)]
    streams = (sys.stdout, sys.stderr)
    codes: list[int] = []
    done = threading.Event()

    def export(number: int) -> None:
        codes.append(main(["export", str(run), "--format", "torchscript", "--out", str(tmp_path / f"m{number}.ts")]))

    said = 0

    def other() -> None:  # another thread's warnings and prints while the exports run
        nonlocal said
        while not done.is_set() or said < 20:
            said += 1
            warnings.warn_explicit(f"note {said}", UserWarning, "mine.py", said, module="mine", registry={})
            print(f"printed {said}", file=sys.stderr)

    capfd.readouterr()
    exporters = [threading.Thread(target=export, args=(n,)) for n in range(3)]
    talker = threading.Thread(target=other)
    for t in (*exporters, talker):
        t.start()
    for t in exporters:
        t.join()
    done.set()
    talker.join()
    err = capfd.readouterr().err
    assert codes == [0, 0, 0], err
    assert [os.readlink(f"/proc/self/fd/{fd}") for fd in (1, 2)] == fds and (sys.stdout, sys.stderr) == streams
    noted = {str(w.message) for w in recwarn.list}
    lost = [n for n in range(1, said + 1) if f"note {n}" not in noted or f"printed {n}\n" not in err]
    assert not lost, (said, lost[:20], err[-500:])
    if "onnx" in FORMATS:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert main(["export", str(run), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]) == 0, \
                capfd.readouterr().err


def test_round_57_a_wrappers_put_back_by_a_users_capture_pass_through_and_debug_logs_stay_quiet(
        tiny, tmp_path, capsys, recwarn):
    """Round 57: a user's capture whose span overlapped an export's without nesting put the export's stream wrapper
    back for good, and the exporting thread's later prints were lost; with attnconv's loggers at DEBUG, an export's
    trace formatted a record holding traced tensors and a TracerWarning came out."""
    import io
    import logging

    wrapping = export_module._silent_output()
    wrapping.__enter__()
    saved = sys.stdout  # a user's capture begins inside the export's span...
    sys.stdout = io.StringIO()
    wrapping.__exit__(None, None, None)
    sys.stdout = saved  # ...and ends after it, putting back the export's wrapper
    print("after the export")
    assert capsys.readouterr().out == "after the export\n"
    seen: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: seen.append(record.getMessage())  # formatted as it comes, as handlers do
    logger = logging.getLogger("attnconv")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        assert main(["export", str(tiny), "--format", "torchscript", "--out", str(tmp_path / "m.ts")]) == 0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert not [w for w in recwarn.list if "Tracer" in type(w.message).__name__], [str(w.message) for w in recwarn.list]


@pytest.mark.skipif("onnx" not in FORMATS, reason="needs onnx and onnxscript")
def test_round_58_the_first_onnx_export_of_a_process_is_quiet(tiny, tmp_path):
    """Round 58: the exporter's loggers are made during the first ONNX export of a process, after the export's filters
    went on: its "torchvision is not installed" notes (four lines) reached stderr through torch's own handler."""
    run = _run_copy(tiny, tmp_path)
    done = subprocess.run([sys.executable, "-m", "attnconv", "export", str(run), "--format", "onnx"], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.strip() == str(run / "model.onnx")
