"""Commands against data that does not fit the run (docs/failure-model.md, "Data that does not fit the run").

Every command taking `--dataset` refuses, in one line and exit 2, a folder that does not exist
and a dataset with other classes than the run was trained on, also when it would not have read
the test images at all (position-only attention, centers over training); nothing is written.
`report` never buries an error in the page: a section is left out only when the run's own data
is not on this machine, with a note in the page and one `warning:` line on stderr.
"""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

import pytest
from fixtures_data import write_class_folder
from fixtures_runs import TINY, train_folder_runs

from attnconv.cli import main


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """2-step position-only and content-attention runs on an image folder (ant, bee, cow) at 8x8, private cache."""
    root = tmp_path_factory.mktemp("data-fit")
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(root / "cache"))
    runs = train_folder_runs(root, [("sa-quadratic", dict(TINY, downsample=2)),
                                    ("sa-learned-content", dict(TINY, downsample=2))])
    yield runs
    mp.undo()


def _run(capsys, argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_error(capsys, argv) -> str:
    code, _, err = _run(capsys, argv)
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# Every command that takes --dataset, writing (if anything) `{tmp}/out.*`; {run} is position-only attention, so
# analyze, plot and report never needed the test images and used to ignore a wrong --dataset with exit 0.
COMMANDS = {
    "eval": ["eval", "{run}"],
    "table": ["table", "{run}", "--recompute"],
    "analyze": ["analyze", "{run}"],
    "plot-centers": ["plot", "centers", "{run}", "--out", "{tmp}/out.png"],
    "plot-maps": ["plot", "maps", "{run}", "--out", "{tmp}/out.png"],
    "report": ["report", "{run}", "--out", "{tmp}/out.html"],
    "explore-export": ["explore", "{run}", "--export", "{tmp}/out.html"],
}


def _argv(command: str, run: Path, tmp: Path, dataset: str) -> list[str]:
    return [a.format(run=run, tmp=tmp) for a in COMMANDS[command]] + ["--dataset", dataset]


def _bad_datasets(tmp: Path) -> list[tuple[str, str]]:
    """(--dataset value, a piece of the one error line) for each way a dataset can fail to fit an (ant, bee, cow)
    run: a missing folder, a file, a folder that is no image folder, other, fewer and more classes, another dataset."""
    (tmp / "a-file").write_text("not images\n")
    (tmp / "empty").mkdir()
    dogs = write_class_folder(tmp / "dogs", classes=("dog", "elk", "fox"), train=1, test=1, size=8)
    fewer = write_class_folder(tmp / "fewer", classes=("ant", "bee"), train=1, test=1, size=8)
    more = write_class_folder(tmp / "more", classes=("ant", "bee", "cow", "deer"), train=1, test=1, size=8)
    return [
        (f"folder:{tmp / 'MISSING'}", f"--dataset folder:{tmp / 'MISSING'}: {tmp / 'MISSING'} does not exist"),
        (f"folder:{tmp / 'a-file'}", f"{tmp / 'a-file'} is not a folder"),
        (f"folder:{tmp / 'empty'}", f"--dataset folder:{tmp / 'empty'}: {tmp / 'empty'} has no train/ folder"),
        (f"folder:{dogs}", "its classes (dog, elk, fox) are not the run's (ant, bee, cow)"),
        (f"folder:{fewer}", "its classes (ant, bee) are not the run's (ant, bee, cow)"),
        (f"folder:{more}", "its classes (ant, bee, cow, deer) are not the run's (ant, bee, cow)"),
        ("fashion-mnist", "its classes (T-shirt/top, Trouser"),
        ("imagenet", "--dataset imagenet: unknown dataset"),
    ]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_data_fit_a_dataset_that_does_not_fit_the_run_is_one_line_and_nothing_is_written(folder, tmp_path, capsys,
                                                                                        command):
    for dataset, message in _bad_datasets(tmp_path):
        line = _one_error(capsys, _argv(command, folder["sa-quadratic"], tmp_path, dataset))
        assert message in line, (dataset, line)
        assert ";" in line  # what is wrong; the fix
        assert not list(tmp_path.glob("out.*")) and not list(tmp_path.glob(".out.*"))


def test_data_fit_a_dataset_with_the_runs_classes_is_used(folder, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(folder["data"], copy)
    for command in ("analyze", "plot-centers", "report"):
        code, _, err = _run(capsys, _argv(command, folder["sa-quadratic"], tmp_path, f"folder:{copy}"))
        assert code == 0 and err == "", err
    page = html.unescape((tmp_path / "out.html").read_text())
    assert f"of folder:{copy} (given with --dataset; the run's classes)" in page


def test_data_fit_grey_images_for_a_colour_run_are_measured_and_said_to_be_widened(folder, tmp_path, capsys):
    """Grey images given with --dataset to a colour run are given three equal channels and measured (nothing is
    lost); eval said nothing of it, as though they were the run's kind. A colour folder says nothing extra."""
    from PIL import Image

    grey, colour = tmp_path / "grey", tmp_path / "colour"
    shutil.copytree(folder["data"], grey)
    shutil.copytree(folder["data"], colour)
    for image in grey.rglob("*.png"):
        Image.open(image).convert("L").save(image)
    code, out, err = _run(capsys, ["eval", folder["sa-quadratic"], "--dataset", f"folder:{grey}"])
    assert code == 0 and "(12 images, the run's classes; grey, each given the run's 3 equal channels)" in out, err
    code, out, err = _run(capsys, ["eval", folder["sa-quadratic"], "--dataset", f"folder:{colour}"])
    assert code == 0 and "(12 images, the run's classes)" in out, err


def test_data_fit_centers_over_training_refuse_data_flags_they_would_ignore(folder, tmp_path, capsys):
    run = folder["sa-quadratic"]
    line = _one_error(capsys, ["plot", "centers", run, "--layer", "1", "--dataset", f"folder:{folder['data']}",
                               "--out", tmp_path / "c.png"])
    assert "--dataset: centers over training (--layer, --epochs) come from" in line and "leave them out" in line
    line = _one_error(capsys, ["plot", "centers", run, "--epochs", "0,1", "--data-dir", tmp_path,
                               "--out", tmp_path / "c.png"])
    assert line.startswith("error: --data-dir: centers over training")
    assert not (tmp_path / "c.png").exists()
    code, _, err = _run(capsys, ["plot", "centers", run, "--layer", "1", "--out", tmp_path / "c.png"])
    assert code == 0 and (tmp_path / "c.png").is_file(), err


def _moved_copy(folder, tmp_path: Path, model: str) -> tuple[Path, Path]:
    """A copy of the `model` run whose image folder is a copy of the data; (run, data)."""
    data, run = tmp_path / "imgs", tmp_path / model
    if not data.exists():
        shutil.copytree(folder["data"], data)
    shutil.copytree(folder[model], run)
    meta = json.loads((run / "config.json").read_text())
    meta["config"]["dataset"] = f"folder:{data}"
    (run / "config.json").write_text(json.dumps(meta))
    return run, data


def test_data_fit_report_of_a_run_whose_data_is_gone_warns_for_each_section_it_leaves_out(folder, tmp_path, capsys):
    quadratic, data = _moved_copy(folder, tmp_path, "sa-quadratic")
    content, _ = _moved_copy(folder, tmp_path, "sa-learned-content")
    shutil.rmtree(data)
    gone = f"the run's image folder {data} no longer exists"
    # position-only attention needs no images: only the test set section is left out
    code, out, err = _run(capsys, ["report", quadratic, "--out", tmp_path / "q.html"])
    lines = err.strip().splitlines()
    assert code == 0 and out.strip() == str(tmp_path / "q.html"), err
    assert len(lines) == 1 and lines[0].startswith("warning: report: the test set section") and gone in lines[0]
    page = html.unescape((tmp_path / "q.html").read_text())
    assert "the test set could not be read" in page and "Analysis per layer and head" in page
    # content attention averages over test images: the attention section is left out too, and says so
    code, _, err = _run(capsys, ["report", content, "--out", tmp_path / "c.html"])
    lines = err.strip().splitlines()
    assert code == 0 and len(lines) == 2 and all(line.startswith("warning: report: ") for line in lines), err
    assert "the attention section (content attention is averaged over test images) is left out" in lines[1]
    assert gone in lines[1]
    page = html.unescape((tmp_path / "c.html").read_text())
    assert "content attention depends on the input and the test images could not be read" in page


def test_data_fit_report_fails_when_the_runs_own_data_no_longer_fits_it(folder, tmp_path, capsys):
    """A folder that gained a class: the model cannot classify it, so the test set section cannot be made. This
    used to be a note inside a page written with exit 0."""
    run, data = _moved_copy(folder, tmp_path, "sa-quadratic")
    write_class_folder(data, classes=("dog",), train=1, test=1, size=8)
    line = _one_error(capsys, ["report", run, "--out", tmp_path / "r.html"])
    assert "the dataset changed since the run was trained: it has 4 classes, the run's model 3" in line
    assert not (tmp_path / "r.html").exists()


def test_data_fit_a_runs_own_folder_that_changed_is_named_and_another_folder_is_read_as_the_run_was(
        folder, tmp_path, capsys):
    """A run whose image folder changed under it (a class added, the images made grey): `eval --dataset
    folder:ORIGINAL` was judged by the changed folder (`its classes (a, b, c) are not the run's (a, b, c, d)`, or
    the model's shape error from the FLOP count), plain `eval` of grey images gave the model's shape error, and the
    line's fix was `--data-dir`, which a folder run ignores."""
    from PIL import Image

    run, data = _moved_copy(folder, tmp_path, "sa-quadratic")
    code, out, _ = _run(capsys, ["eval", run])
    assert code == 0
    accuracy = next(line for line in out.splitlines() if "accuracy" in line)
    shutil.copytree(data, tmp_path / "original")
    write_class_folder(data, classes=("dog",), train=1, test=1, size=8)
    changed = ("the dataset changed since the run was trained: it has {} {}, the run's model {}; give the data it "
               "was trained on (--dataset folder:PATH), or train a new run on this data")
    assert changed.format(4, "classes", 3) in _one_error(capsys, ["eval", run])
    code, out, err = _run(capsys, ["eval", run, "--dataset", f"folder:{tmp_path / 'original'}"])
    assert code == 0 and accuracy in out, err
    shutil.rmtree(data / "train" / "dog")
    shutil.rmtree(data / "test" / "dog")
    for image in data.rglob("*.png"):  # grey, as a folder converted in place
        Image.open(image).convert("L").save(image)
    for command in (["eval", run], ["report", run, "--out", tmp_path / "r.html"]):
        assert changed.format(1, "channels", 3) in _one_error(capsys, command)
    code, out, err = _run(capsys, ["eval", run, "--dataset", f"folder:{tmp_path / 'original'}"])
    assert code == 0 and accuracy in out, err


def test_data_fit_a_cnn_runs_folder_that_changed_converts_and_starts_attention_as_the_run_was(tmp_path, capsys,
                                                                                              monkeypatch):
    """A CNN run whose image folder was made grey after training: `convert` built its example input from the
    folder as it is now (`the converted network failed on example_input ... got (1, 1, 16, 16)`, with --no-eval and
    --dataset folder:ORIGINAL too); `train --init-from` blamed a flag nobody gave (`--in-channels 3 does not match
    ...; drop --in-channels`)."""
    from PIL import Image

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    runs = train_folder_runs(tmp_path, [("resnet18", {"width": 4})])
    cnn, data = runs["resnet18"], runs["data"]
    shutil.copytree(data, tmp_path / "original")
    for image in data.rglob("*.png"):
        Image.open(image).convert("L").save(image)
    code, _, err = _run(capsys, ["convert", cnn, "--out", tmp_path / "cv", "--no-eval"])
    assert code == 0, err
    code, out, err = _run(capsys, ["convert", cnn, "--out", tmp_path / "cv2", "--dataset",
                                   f"folder:{tmp_path / 'original'}"])
    assert code == 0, err
    line = _one_error(capsys, ["train", "--init-from", cnn, "--out", tmp_path / "attn", "--max-steps", "1",
                               "--batch-size", "4", "--no-progress"])
    assert line.startswith(f"error: --init-from {cnn}: the CNN was built for in_channels = 3, and its dataset "), line
    assert line.endswith("has in_channels = 1 now (it changed since the CNN was trained); restore the data the CNN "
                         "was trained on"), line
    assert not (tmp_path / "attn").exists()


def test_data_fit_a_resume_whose_image_folder_moved_names_the_folder_to_move_back(folder, tmp_path, capsys):
    """`train --resume` of a run whose image folder was moved: it said the folder's expected layout (`image folder
    ... does not exist; expected PATH/train/<class>/...`), as to a new dataset, and the readers' fix `--dataset
    folder:PATH` is a different config to a resume. It names the run's folder and the fix that works."""
    run, data = _moved_copy(folder, tmp_path, "sa-quadratic")
    data.rename(tmp_path / "elsewhere")
    line = _one_error(capsys, ["train", "--out", run, "--resume", "--no-progress"])
    assert line == (f"error: --out {run}: the run's image folder {data} no longer exists (moved or deleted); --resume "
                    f"continues on the folder the run was trained on: move it back to {data}, or train on the images "
                    "where they are now into a new --out")
    import attnconv
    from attnconv.config import TrainConfig
    from attnconv.errors import ParameterError

    config = TrainConfig.from_dict(json.loads((run / "config.json").read_text())["config"])
    with pytest.raises(ParameterError, match=f"the run's image folder {data} no longer exists .* move it back to "):
        attnconv.train(config, run, resume=True, progress=False)
    (tmp_path / "elsewhere").rename(data)
    code, _, err = _run(capsys, ["train", "--out", run, "--resume", "--no-progress"])
    assert code == 0 and "already finished" in err, err
