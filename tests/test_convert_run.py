"""`attnconv convert`: a trained CNN run becomes an attention run the other commands accept."""

import json

import numpy as np
import pytest
import torch
from fixtures_data import write_idx

from attnconv.cli import main
from attnconv.construct import ConvAttention
from attnconv.runs import load_run


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fmnist-conv")
    rng = np.random.default_rng(1)
    for prefix, n in (("train", 128), ("t10k", 64)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 60, (n, 28, 28)) + 20 * labels[:, None, None]
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images.astype(np.uint8), gz=False)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels.astype(np.uint8), gz=False)
    return folder


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("runs") / "resnet"
    rc = main(["train", "--model", "resnet18", "--width", "4", "--dataset", "fashion-mnist", "--data-dir",
               str(data_dir), "--epochs", "1", "--batch-size", "32", "--workers", "1", "--no-progress",
               "--out", str(out)])
    assert rc == 0
    return out


def test_convert_writes_an_attention_run_with_identical_accuracy(cnn_run, data_dir, tmp_path, capsys):
    new = tmp_path / "resnet-attn"
    assert main(["convert", str(cnn_run), "--out", str(new), "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    rows = out.splitlines()[2:4]  # after the `converted ... -> ...` line and the table's header
    accs = {line.split()[0]: float(line.split()[1]) for line in rows}
    assert accs["resnet18"] == accs["converted"]  # rows named by the run's model, not "cnn" (a ViT is none)
    assert "predictions that differ: 0 of 64" in out

    attn, config = load_run(new)
    cnn, _ = load_run(cnn_run)
    assert config.model == "resnet18"
    assert not any(isinstance(m, (torch.nn.Conv2d, torch.nn.BatchNorm2d)) for m in attn.modules())
    assert sum(isinstance(m, ConvAttention) for m in attn.modules()) == 20
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        assert ((attn(x) - cnn(x)).norm() / cnn(x).norm()).item() < 1e-4
    meta = json.loads((new / "config.json").read_text())
    assert meta["converted"]["from"] == str(cnn_run) and meta["converted"]["fold_bn"] is True

    # other commands accept it
    assert main(["eval", str(new), "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out  # not "(epoch 0, step 0)": it has no steps of its own (round 70's note)
    assert "(as attention)" in out and f"(converted from {cnn_run}, not trained since)" in out


def test_convert_refuses_bad_requests_without_writing(cnn_run, data_dir, tmp_path, capsys):
    existing = tmp_path / "exists"
    existing.mkdir()
    assert main(["convert", str(cnn_run), "--out", str(existing), "--data-dir", str(data_dir)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_convert_on_a_full_disk_leaves_no_parent_folder(cnn_run, tmp_path, capsys, monkeypatch):
    """A full disk: `convert` said "nothing was written" and left --out's missing parent folders, empty. They go
    with the temporary; a path through `..` under folders not made yet was refused ("File exists")."""
    import errno

    import attnconv.runs.build as build

    new = tmp_path / "new" / "deeper" / "cv"
    real = build.save_weights

    def no_room(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(build, "save_weights", no_room)
    assert main(["convert", str(cnn_run), "--out", str(new), "--no-eval"]) == 2
    assert "(no space left on the device; free some space); nothing was written" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    monkeypatch.setattr(build, "save_weights", real)
    assert main(["convert", str(cnn_run), "--out", str(tmp_path / "a" / ".." / "b" / "cv"), "--no-eval"]) == 0
    assert (tmp_path / "b" / "cv" / "config.json").is_file()


def test_convert_rejects_a_model_without_convolutions(data_dir, tmp_path, capsys):
    run = tmp_path / "sa"
    assert main(["train", "--model", "sa-quadratic", "--hidden", "8", "--layers", "1", "--heads", "4",
                 "--intermediate", "8", "--downsample", "4", "--dataset", "fashion-mnist", "--data-dir",
                 str(data_dir), "--max-steps", "1", "--batch-size", "32", "--workers", "1", "--no-progress",
                 "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["convert", str(run), "--out", str(tmp_path / "new"), "--data-dir", str(data_dir)]) == 2
    assert "no convolution" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_analyze_plot_and_report_accept_a_converted_run(cnn_run, data_dir, tmp_path, capsys):
    new = tmp_path / "resnet-attn"
    assert main(["convert", str(cnn_run), "--out", str(new), "--data-dir", str(data_dir)]) == 0
    capsys.readouterr()
    assert main(["analyze", str(new), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert main(["analyze", str(new)]) == 0
    text = capsys.readouterr().out
    # ResNet-18: 17 3x3 convs (the three 1x1 shortcuts have one head and are left out)
    assert len(result["layers"]) == 17 and result["size"] is None
    assert result["history"] == []  # no heads.jsonl: the key is there all the same (round 62)
    assert [layer["size"] for layer in result["layers"]][:2] == [[28, 28], [28, 28]]
    assert result["layers"][-1]["size"] == [4, 4]
    for layer in result["layers"]:
        # each layer is its conv exactly: heads on the taps, all mass in the 3x3 window, distance 0
        assert sorted(tuple(h["center"]) for h in layer["heads"]) == [(a, b) for a in (-1, 0, 1) for b in (-1, 0, 1)]
        assert layer["conv_likeness"]["distance"] < 1e-5 and layer["mean_mass_3x3"] > 0.999
    assert "each layer on its own input grid" in text and f"layer 1 ({result['layers'][0]['path']}, 28x28 input" in text
    assert [layer["layer"] for layer in result["layers"]] == list(range(1, 18))  # numbered from 1

    assert main(["plot", "centers", str(new), "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert main(["plot", "maps", str(new), "--query", "20,9", "--zoom", "5", "--out", str(tmp_path / "m.png")]) == 0
    assert (tmp_path / "m.png").stat().st_size > 1000
    capsys.readouterr()
    assert main(["report", str(new), "--out", str(tmp_path / "r.html"), "--data-dir", str(data_dir)]) == 0
    html = (tmp_path / "r.html").read_text()
    assert "converted from the CNN run" in html and "Analysis per layer and head" in html


def test_convert_can_skip_or_shorten_the_evaluation_and_makes_an_ordinary_folder(cnn_run, data_dir, tmp_path, capsys):
    import os
    import stat

    old = os.umask(0o022)
    try:
        assert main(["convert", str(cnn_run), "--out", str(tmp_path / "quick"), "--no-eval"]) == 0
        assert capsys.readouterr().out.strip().splitlines() == [f"converted {cnn_run} -> {tmp_path / 'quick'}  "
                                                                "(BatchNorm folded)"]
        assert stat.S_IMODE((tmp_path / "quick").stat().st_mode) == 0o755  # not mkdtemp's 0700
        assert main(["convert", str(cnn_run), "--out", str(tmp_path / "some"), "--data-dir", str(data_dir),
                     "--eval-images", "10"]) == 0
        assert "predictions that differ: 0 of 10" in capsys.readouterr().out
    finally:
        os.umask(old)


@pytest.mark.parametrize("edit", [{"alpha": 3.0}, {"fold_bn": False}])
def test_an_edited_conversion_block_is_config_jsons_error(cnn_run, data_dir, tmp_path, capsys, edit):
    """config.json's "converted" alpha edited (the shapes stay): `eval` measured other numbers with exit 0. The
    converted weights record what config.json said of the run (`runs.record`), conversion included; an edit of
    the block is one line naming config.json and the field."""
    new = tmp_path / "resnet-attn"
    assert main(["convert", str(cnn_run), "--out", str(new), "--data-dir", str(data_dir), "--no-eval"]) == 0
    meta = json.loads((new / "config.json").read_text())
    meta["converted"].update(edit)
    (new / "config.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["eval", str(new), "--data-dir", str(data_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    (key, value), = edit.items()
    was = "null" if key == "alpha" else "true"
    assert err == [f"error: {new / 'config.json'} does not describe the run model.safetensors was written for "
                   f"(converted.{key} {json.dumps(value)} in config.json, {was} in the record of model.safetensors); "
                   "one of the two was edited or copied from another run: restore it from a copy of the run (or, if "
                   "config.json was edited, set those fields back to the record's values)"], err


def test_convert_into_a_link_to_nowhere_is_one_line_naming_it(cnn_run, tmp_path, capsys):
    """`convert --out LINK` for a link to nothing or a loop said "could not write the converted run (Not a
    directory)", with no fix."""
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    for name, why in (("loop", "which loops back through links"), ("gone", "which does not exist")):
        assert main(["convert", str(cnn_run), "--out", str(tmp_path / name), "--no-eval"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err and "choose a new directory" in err, err
        assert (tmp_path / name).is_symlink() and not (tmp_path / "nowhere").exists()


def test_round_78_a_convert_into_a_place_it_may_not_write_says_what_refuses_it(cnn_run, tmp_path, capsys,
                                                                                monkeypatch):
    """Round 78: `convert` into a folder it may not write, or on a read-only file system, gave the OS's words and
    "choose another directory", where every other output says what refuses the place (`fileio.output_fix`)."""
    import errno

    import attnconv.runs.build as build

    for err, said in ((PermissionError(errno.EACCES, "Permission denied"), "choose another location"),
                      (OSError(errno.EROFS, "Read-only file system"), "choose another location"),
                      (OSError(errno.ENOSPC, "No space left on device"), "No space left on device; choose another "
                                                                         "directory")):
        def refused(*args, err=err, **kwargs):
            raise err

        monkeypatch.setattr(build.tempfile, "mkdtemp", refused)
        assert main(["convert", str(cnn_run), "--out", str(tmp_path / "cv"), "--no-eval"]) == 2
        line = capsys.readouterr().err
        assert f"--out {tmp_path / 'cv'}: cannot write there; " in line and said in line, line
        assert line.count("choose another") == 1 and not (tmp_path / "cv").exists()
