"""What makes a group of seeds one configuration (`compare`, and `table`'s rows): the data by the content the runs
recorded, not the folder's path; `--init-from` by its options, not by which CNN seed; config.json in every seed or
none; the same logs twice; converted runs named as such."""

import json
import shutil

import pytest
from fixtures_data import write_image_folder
from PIL import Image

from attnconv.cli import main

SMALL = ["--model", "sa-quadratic", "--hidden", "8", "--layers", "1", "--heads", "4", "--intermediate", "8",
         "--batch-size", "4", "--workers", "1", "--no-progress", "--max-steps", "2"]


@pytest.fixture
def images(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_image_folder(tmp_path / "imgs")
    return tmp_path / "imgs"


def train(dataset, out, seed, *extra):
    assert main(["train", *SMALL, "--dataset", f"folder:{dataset}", "--seed", str(seed), "--out", str(out), *extra]) == 0


def test_the_same_images_by_another_path_are_one_configuration_other_images_at_one_path_are_not(images, tmp_path,
                                                                                                  capsys):
    """Seeds on a copy of the image folder (or a link to it) were "runs of other configurations (dataset
    folder:A -> folder:B)"; seeds whose test images changed between them under one path were averaged."""
    shutil.copytree(images, tmp_path / "copy")
    (tmp_path / "link").symlink_to(images)
    train(images, tmp_path / "same" / "seed0", 0)
    train(tmp_path / "copy", tmp_path / "same" / "seed1", 1)
    train(tmp_path / "link", tmp_path / "same" / "seed2", 2)
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "same")]) == 0
    assert main(["table", *[str(tmp_path / "same" / f"seed{s}") for s in range(3)]]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sa-quadratic")]
    assert len(rows) == 1 and " 3 " in rows[0], rows  # one row of three seeds
    train(images, tmp_path / "other" / "seed0", 0)
    for path in sorted((images / "test").rglob("*.png"))[:1]:  # another test image at the same path
        Image.new("RGB", (20, 20), (200, 10, 10)).save(path)
    train(images, tmp_path / "other" / "seed1", 1)
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert "are runs of other configurations (data " in err and err.count("\n") == 1, err


def test_seeds_started_from_their_own_cnn_seeds_are_one_configuration(images, tmp_path, capsys):
    for seed in (0, 1):
        assert main(["train", "--model", "resnet18", "--width", "4", "--dataset", f"folder:{images}", "--batch-size",
                     "4", "--workers", "1", "--no-progress", "--max-steps", "1", "--seed", str(seed), "--out",
                     str(tmp_path / "cnn" / f"seed{seed}")]) == 0
        assert main(["train", "--init-from", str(tmp_path / "cnn" / f"seed{seed}"), "--batch-size", "4", "--workers",
                     "1", "--no-progress", "--max-steps", "1", "--seed", str(seed), "--out",
                     str(tmp_path / "attn" / f"seed{seed}")]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "attn")]) == 0
    meta = json.loads((tmp_path / "attn" / "seed1" / "config.json").read_text())
    meta["config"]["init_from"]["alpha"] = 7.0  # another option of the start is another configuration
    (tmp_path / "attn" / "seed1" / "config.json").write_text(json.dumps(meta))
    for name in ("model.safetensors", "state.pt"):  # committed logs only: the record is in the weights
        (tmp_path / "attn" / "seed1" / name).unlink()
    assert main(["compare", str(tmp_path / "attn")]) == 2
    err = capsys.readouterr().err
    assert 'are runs of other configurations (init_from {"alpha": 3.0' in err and '-> {"alpha": 7.0' in err, err


def test_seeds_without_config_json_beside_seeds_with_one_or_the_same_logs_twice_are_refused(images, tmp_path, capsys):
    train(images, tmp_path / "runs" / "seed0", 0)
    group = tmp_path / "group"
    for name, files in (("seed0", ("config.json", "metrics.csv", "heads.jsonl")), ("seed1", ("metrics.csv", "heads.jsonl"))):
        (group / name).mkdir(parents=True)
        for f in files:
            shutil.copy(tmp_path / "runs" / "seed0" / f, group / name / f)
    capsys.readouterr()
    assert main(["compare", str(group)]) == 2
    assert "seed1: config.json is missing, while" in capsys.readouterr().err
    (group / "seed0" / "config.json").unlink()  # logs alone: the same metrics.csv twice is one run twice
    assert main(["compare", str(group)]) == 2
    assert "hold the same metrics.csv: one run's logs twice" in capsys.readouterr().err


def test_a_group_of_converted_runs_is_named_as_such(images, tmp_path, capsys):
    for seed in (0, 1):
        assert main(["train", "--model", "resnet18", "--width", "4", "--dataset", f"folder:{images}", "--batch-size",
                     "4", "--workers", "1", "--no-progress", "--max-steps", "1", "--seed", str(seed), "--out",
                     str(tmp_path / "cnn" / f"seed{seed}")]) == 0
        assert main(["convert", str(tmp_path / "cnn" / f"seed{seed}"), "--out", str(tmp_path / "conv" / f"seed{seed}")]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "conv")]) == 2
    err = capsys.readouterr().err
    assert "a converted run (`attnconv convert`), which has no training logs to compare" in err and "restore" not in err


def test_test_images_in_another_order_are_one_configuration_and_logs_saved_again_are_one_run(images, tmp_path,
                                                                                             capsys):
    """The same test images renamed into another order were "other configurations" (the ordered digest), and the
    same metrics.csv saved again with a byte-order mark or CRLF counted as a second seed."""
    shutil.copytree(images, tmp_path / "renamed")
    for cls in (tmp_path / "renamed" / "test").iterdir():
        files = sorted(cls.iterdir())
        for i, f in enumerate(files):
            f.rename(cls / f"tmp{i}{f.suffix}")
        for i, f in enumerate(sorted(cls.iterdir())):
            f.rename(cls / f"z{len(files) - i:03d}{f.suffix}")  # the order reversed
    train(images, tmp_path / "order" / "seed0", 0)
    train(tmp_path / "renamed", tmp_path / "order" / "seed1", 1)
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "order")]) == 0, capsys.readouterr().err
    group = tmp_path / "logs"
    for name in ("seed0", "seed1"):
        (group / name).mkdir(parents=True)
        shutil.copy(tmp_path / "order" / "seed0" / "heads.jsonl", group / name / "heads.jsonl")
    text = (tmp_path / "order" / "seed0" / "metrics.csv").read_bytes()
    (group / "seed0" / "metrics.csv").write_bytes(text)
    for again in (b"\xef\xbb\xbf" + text, text.replace(b"\n", b"\r\n")):
        (group / "seed1" / "metrics.csv").write_bytes(again)
        assert main(["compare", str(group)]) == 2
        assert "hold the same metrics.csv: one run's logs twice" in capsys.readouterr().err


def test_round_61_b_one_run_given_to_compare_is_named_as_a_seed_would_be(images, tmp_path, capsys):
    """Round 61: `compare RUN` of a converted run, or of a trained run whose metrics.csv is gone, said "holds no run",
    where the same folder as a group's seed is named for what it is; and `predict RUN ''` (an unset variable) read the
    empty path as the current folder and classified every image there."""
    cnn, conv = tmp_path / "cnn", tmp_path / "conv"
    assert main(["train", "--model", "resnet18", "--width", "4", "--dataset", f"folder:{images}", "--batch-size", "4",
                 "--workers", "1", "--no-progress", "--max-steps", "1", "--out", str(cnn)]) == 0
    assert main(["convert", str(cnn), "--out", str(conv)]) == 0
    shutil.copytree(cnn, tmp_path / "nolog")
    (tmp_path / "nolog" / "metrics.csv").unlink()
    capsys.readouterr()
    assert main(["compare", str(conv)]) == 2
    err = capsys.readouterr().err
    assert "conv: a converted run (`attnconv convert`), which has no training logs to compare" in err, err
    assert main(["compare", str(tmp_path / "nolog")]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith("show a run was trained here; restore it from a copy of the run"), err
    assert main(["predict", str(cnn), ""]) == 2
    assert capsys.readouterr().err.strip().startswith("error: IMAGE '' is empty (an unset variable?)")
