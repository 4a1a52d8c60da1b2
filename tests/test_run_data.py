"""A run's dataset: test images sampled across the classes, `eval --dataset folder:PATH`, data that is gone."""

import html
import json
import shutil
from collections import Counter

import pytest
import torch
from fixtures_data import isolated_data, write_class_folder  # noqa: F401 (fixture)
from fixtures_runs import TINY, train_folder_runs, train_tiny_runs

from attnconv.cli import main
from attnconv.data import load_dataset
from attnconv.runs import Run, sample_across_classes


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A 2-step sa-quadratic run on an image folder (ant, bee, cow; 4 test images each), with a private cache."""
    root = tmp_path_factory.mktemp("run-data")
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(root / "cache"))
    runs = train_folder_runs(root, [("sa-quadratic", dict(TINY, downsample=2))])
    yield {"root": root, "data": runs["data"], "run": runs["sa-quadratic"]}
    mp.undo()


def _eval_json(capsys, *args) -> dict:
    assert main(["eval", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _error(capsys, argv) -> str:
    assert main([str(a) for a in argv]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1, captured.err
    return captured.err


# ------------------------------------------------------------------------------ sampling


def test_sampling_takes_each_class_in_turn_with_a_fixed_seed():
    labels = torch.tensor([0] * 6 + [1] * 3 + [2] * 1)  # sorted by class, as an image folder lists them
    picked = sample_across_classes(labels, 7)
    assert len(picked) == len(set(picked)) == 7
    assert [int(labels[i]) for i in picked[:3]] == [0, 1, 2]  # one of every class first
    assert Counter(int(labels[i]) for i in picked) == {0: 3, 1: 3, 2: 1}  # round robin while a class has images
    assert sample_across_classes(labels, 7) == picked  # deterministic
    assert sample_across_classes(labels, 3) == picked[:3]  # a longer sample starts with the shorter one
    assert sorted(sample_across_classes(labels, 100)) == list(range(10))  # at most every image
    assert sample_across_classes(labels, 7, seed=1) != picked  # the seed shuffles within each class
    assert sample_across_classes([], 5) == []


def test_run_test_images_are_the_sample(folder):
    run = Run(folder["run"])
    test = run.test_set
    assert test.labels[:4].tolist() == [0, 0, 0, 0]  # the folder's order: the first four are all "ant"
    indices = run.test_sample(3)
    assert sorted(test.labels[indices].tolist()) == [0, 1, 2]
    raw, x = run.test_images(3)
    assert torch.equal(raw, test.images[indices]) and x.shape == (3, 3, 8, 8)
    assert torch.equal(run.test_images()[0], test.images)  # no count: the whole set, in order
    assert x.device.type == "cpu" and run.test_images(3, device="meta")[1].device.type == "meta"  # device= wins


# ------------------------------------------------------------------------------ eval --dataset folder:PATH


def test_eval_on_another_folder_with_the_same_classes(folder, tmp_path, capsys):
    same = _eval_json(capsys, folder["run"])
    other = tmp_path / "copy"
    shutil.copytree(folder["data"], other)
    s = _eval_json(capsys, folder["run"], "--dataset", f"folder:{other}")
    assert s["test_dataset"] == f"folder:{other}" and s["test_images"] == 12
    assert (s["test_acc"], s["confusion"], s["classes"]) == (same["test_acc"], same["confusion"], same["classes"])
    assert s["dataset"] == f"folder:{folder['data']}"  # the run's own dataset, as trained
    # other images with the run's classes: measured on them, normalized as the run was trained
    fresh = write_class_folder(tmp_path / "fresh", seed=7, test=2)
    s = _eval_json(capsys, folder["run"], "--dataset", f"folder:{fresh}")
    assert s["test_images"] == 6 and sum(map(sum, s["confusion"])) == 6
    assert main(["eval", str(folder["run"]), "--dataset", f"folder:{fresh}"]) == 0
    assert f"test set     folder:{fresh} (6 images, the run's classes)" in capsys.readouterr().out


def test_eval_on_a_folder_with_other_classes_is_one_line_naming_both(folder, tmp_path, capsys):
    other = write_class_folder(tmp_path / "pets", classes=("ant", "bee", "cat"))
    err = _error(capsys, ["eval", folder["run"], "--dataset", f"folder:{other}"])
    assert "its classes (ant, bee, cat) are not the run's (ant, bee, cow)" in err
    fewer = write_class_folder(tmp_path / "two", classes=("ant", "bee"))
    assert "(ant, bee) are not the run's (ant, bee, cow)" in _error(
        capsys, ["eval", folder["run"], "--dataset", f"folder:{fewer}"])
    assert "does not exist" in _error(capsys, ["eval", folder["run"], "--dataset", f"folder:{tmp_path / 'none'}"])


# ------------------------------------------------------------------------------ the data is gone


def test_a_run_whose_image_folder_is_gone_says_where_it_was_and_how_to_point_at_it(folder, tmp_path, capsys):
    from attnconv.report import build_report

    data = tmp_path / "imgs"
    shutil.copytree(folder["data"], data)
    run = tmp_path / "run"
    shutil.copytree(folder["run"], run)
    meta = json.loads((run / "config.json").read_text())
    meta["config"]["dataset"] = f"folder:{data}"
    (run / "config.json").write_text(json.dumps(meta))
    before = _eval_json(capsys, run)
    moved = tmp_path / "moved"
    data.rename(moved)
    why = f"the run's image folder {data} no longer exists (moved or deleted); point at the images with " \
          "--dataset folder:PATH"
    for argv in (["eval", run], ["eval", run, "--json"], ["explore", run, "--no-browser", "--port", "0"],
                 ["table", run, "--recompute"], ["plot", "maps", run, "--image", "0", "--out", tmp_path / "m.png"]):
        assert why in _error(capsys, argv), argv
    # what needs no images still works, from what the run recorded of its data
    assert main(["table", str(run)]) == 0 and "sa-quadratic" in capsys.readouterr().out
    text = html.unescape(build_report(run, images=2))
    assert why in text and "Analysis per layer and head" in text  # position-only attention needs no images
    # pointed at the folder's new place, everything is back
    after = _eval_json(capsys, run, "--dataset", f"folder:{moved}")
    assert (after["test_acc"], after["confusion"]) == (before["test_acc"], before["confusion"])
    data.write_text("a file where the folder was")  # was "no longer exists (moved or deleted)"
    assert f"the run's image folder {data} is no longer a folder; point at the images with --dataset folder:PATH" \
        in _error(capsys, ["eval", run])
    assert "Accuracy per class" in build_report(run, images=2, dataset=f"folder:{moved}")


def test_a_builtin_datasets_data_dir_that_is_gone_asks_for_data_dir(tmp_path, capsys, isolated_data):  # noqa: F811
    runs = train_tiny_runs(tmp_path, [("sa-quadratic", TINY)], epochs=1, max_steps=1)
    assert main(["eval", str(runs["sa-quadratic"])]) == 0
    capsys.readouterr()
    moved = tmp_path / "elsewhere"
    runs["data"].rename(moved)
    err = _error(capsys, ["eval", runs["sa-quadratic"]])
    assert f"the run's data folder {runs['data']} no longer exists" in err and "--data-dir DIR" in err
    assert main(["eval", str(runs["sa-quadratic"]), "--data-dir", str(moved)]) == 0
    assert load_dataset("fashion-mnist", moved)[1].images.shape[0] == 12
