"""`attnconv predict` and Run.predict: a run classifies image files with what it recorded, no training data."""

import json
import shutil

import numpy as np
import pytest
import torch
from fixtures_data import write_image_folder

from attnconv.cli import main
from attnconv.data import load_dataset
from attnconv.runs import Run


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    """A tiny run on an image folder (3 classes, RGB, 32x32); the folder is then moved away."""
    root = tmp_path_factory.mktemp("predict")
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(root / "cache"))
    write_image_folder(root / "imgs")
    test = load_dataset(f"folder:{root / 'imgs'}")[1]
    out = root / "run"
    assert main(["train", "--model", "sa-quadratic", "--dataset", f"folder:{root / 'imgs'}", "--hidden", "8",
                 "--layers", "1", "--heads", "4", "--intermediate", "8", "--max-steps", "2", "--batch-size", "4",
                 "--workers", "1", "--no-progress", "--out", str(out)]) == 0
    files = [root / "imgs" / "test" / "cat" / name for name in ("cat0.png", "cat1.jpg")]
    kept = root / "kept"
    kept.mkdir()
    for f in files:
        shutil.copy(f, kept / f.name)
    shutil.rmtree(root / "imgs")  # predict must not need the training data
    yield out, kept, test
    mp.undo()


def test_predict_decodes_and_normalizes_as_the_run_was_trained(folder_run):
    out, kept, test = folder_run
    run = Run(out)
    files = sorted(kept.iterdir())  # cat0.png, cat1.jpg: the first two test images, decoded when training
    x = run.transform(files)
    assert x.shape == (2, 3, 32, 32)
    data = json.loads((out / "config.json").read_text())["data"]  # what the run recorded of its dataset
    mean, std = (torch.tensor(data[k]).view(1, -1, 1, 1) for k in ("mean", "std"))
    torch.testing.assert_close(x, (test.images[:2].float() / 255 - mean) / std)  # as decoded for training
    best = run.predict(files, top=3)
    probs = run.model(x).softmax(-1)
    for row, p in zip(best, probs):
        assert [c for c, _ in row] == [["bird", "cat", "dog"][i] for i in p.argsort(descending=True)[:3]]
        assert [v for _, v in row] == pytest.approx(p.sort(descending=True).values[:3].tolist(), rel=1e-5)


def test_the_command_line_prints_each_image_and_json(folder_run, capsys):
    out, kept, _ = folder_run
    assert main(["predict", str(out), str(kept)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [str(kept / "cat0.png"), str(kept / "cat1.jpg")]
    assert main(["predict", str(out), str(kept / "cat0.png"), "--top", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    (only,) = result["predictions"]
    assert len(only["top"]) == 2 and sum(t["probability"] for t in only["top"]) <= 1 + 1e-6


@pytest.mark.parametrize("args, message", [
    (["{kept}/nope.png"], "nope.png: no such file or folder"),
    (["{empty}"], "no image files in it"),
    (["{bad}"], "bad.png"),
    # a loop of links said "no such file or folder"; a folder's image-named link to nothing was skipped in silence
    (["{loop}"], "loop.png: a link to again.png, which loops back through links"),
    (["{links}"], "links/gone.png: a link to nowhere.png, which does not exist; fix or remove the link"),
])
def test_bad_images_are_one_line(folder_run, tmp_path, capsys, args, message):
    out, kept, _ = folder_run
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.png").write_bytes(b"not a png")
    (tmp_path / "loop.png").symlink_to("again.png")
    (tmp_path / "again.png").symlink_to("loop.png")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "a.png").symlink_to(kept / "cat0.png")
    (tmp_path / "links" / "gone.png").symlink_to("nowhere.png")
    names = {"kept": kept, "empty": tmp_path / "empty", "bad": tmp_path / "bad.png", "loop": tmp_path / "loop.png",
             "links": tmp_path / "links"}
    assert main(["predict", str(out), *[a.format(**names) for a in args]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(**names) in err


def test_round_77_b_a_run_given_where_the_images_go_is_named(folder_run, capsys):
    """Round 77: `predict IMAGE RUN` (the order reversed) said only "RUN: no image files in it"."""
    out, kept, _ = folder_run
    assert main(["predict", str(kept / "cat0.png"), str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out} is a run folder, given where the images go: attnconv predict takes one run, then image files" in err
    assert main(["predict", str(out), str(out)]) == 2  # a run given first, and again where the images go
    assert "takes one run, then image files or folders" in capsys.readouterr().err


def test_uint8_tensors_of_the_wrong_shape_are_refused(folder_run):
    run = Run(folder_run[0])
    with pytest.raises(Exception, match=r"uint8 \(N, 3, 32, 32\)"):
        run.transform(torch.zeros(1, 1, 32, 32, dtype=torch.uint8))
    assert np.isfinite(run.transform(torch.zeros(1, 3, 32, 32, dtype=torch.uint8)).numpy()).all()
