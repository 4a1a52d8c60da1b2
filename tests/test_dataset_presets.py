"""Defaults that fit the dataset (attnconv.dataset_presets), and a folder of images used end to end like a built-in dataset."""

import json

import pytest
from fixtures_data import write_image_folder
from test_train import data_dir  # noqa: F401  (a fixture)

from attnconv import data as D
from attnconv.cli import main
from attnconv.config import PRESETS
from attnconv.dataset_presets import FOLDER_EPOCHS, dataset_preset, folder_preset

TINY = ["--hidden", "16", "--layers", "1", "--heads", "4", "--intermediate", "16"]


@pytest.mark.parametrize("model", ["sa-quadratic", "sa-learned", "sa-learned-content", "sa-quadratic-aniso"])
def test_fashion_mnist_attention_models_get_the_cpu_preset(model):
    name, base = dataset_preset(model, "fashion-mnist")
    ref = PRESETS["fmnist-sa-quadratic"]
    assert "fmnist-sa-quadratic" in name and base.model == model
    assert (base.optimizer, base.lr, base.weight_decay, base.epochs, base.augment) == \
        (ref.optimizer, ref.lr, ref.weight_decay, ref.epochs, ref.augment)
    assert base.model_overrides == ref.model_overrides


def test_resnet_and_cifar_presets():
    assert dataset_preset("resnet18", "fashion-mnist")[1] == PRESETS["fmnist-resnet-small"]
    name, base = dataset_preset("sa-learned", "cifar10")
    assert "paper-cifar10-sa-learned" in name and base == PRESETS["paper-cifar10-sa-learned"]
    assert dataset_preset("resnet18", "CIFAR10")[1].schedule == "multistep"


@pytest.mark.parametrize("train_size,size,batch,downsample", [(12, 32, 3, 2), (5000, 64, 128, 4), (600, 28, 128, 2),
                                                             (100_000, 224, 128, 16)])
def test_folder_recipe_scales_with_image_count_and_size(train_size, size, batch, downsample):
    info = D.DatasetInfo(name="folder:/x", channels=3, size=size, num_classes=2, mean=(0.5,) * 3, std=(0.2,) * 3,
                         classes=("a", "b"), train_size=train_size, test_size=4, stats_source="train")
    cfg = folder_preset("sa-quadratic", info)
    assert cfg.batch_size == batch and cfg.batch_size <= max(1, train_size // 4)
    assert FOLDER_EPOCHS[0] <= cfg.epochs <= FOLDER_EPOCHS[1]
    steps = cfg.epochs * (train_size // batch)
    assert steps >= 3000 or cfg.epochs == FOLDER_EPOCHS[1]  # enough steps unless capped
    assert cfg.epochs == FOLDER_EPOCHS[0] or (cfg.epochs - 1) * (train_size // batch) < 3000  # and no more
    d = cfg.model_overrides["downsample"]
    assert size % d == 0 and (size // d <= 16 or d == downsample) and d == downsample
    assert cfg.optimizer == "adamw" and cfg.augment
    assert folder_preset("resnet18", info).model_overrides == {"width": 16}


def test_cli_without_preset_applies_and_prints_the_dataset_preset(tmp_path, data_dir, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert main(["train", "--model", "sa-learned", "--dataset", "fashion-mnist", "--data-dir", str(data_dir), *TINY,
                 "--epochs", "1", "--batch-size", "64", "--workers", "1", "--no-progress", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "preset: the Fashion-MNIST CPU preset (fmnist-sa-quadratic)" in err and "adamw lr 0.002" in err
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["optimizer"] == "adamw" and config["augment"] is False and config["epochs"] == 1
    assert config["model_overrides"]["hidden"] == 16 and config["model_overrides"]["downsample"] == 4
    # with a preset, no preset line
    assert main(["train", "--preset", "fmnist-sa-quadratic", "--data-dir", str(data_dir), *TINY, "--max-steps", "1",
                 "--batch-size", "64", "--workers", "1", "--no-progress", "--out", str(tmp_path / "p")]) == 0
    assert "preset:" not in capsys.readouterr().err


def test_a_folder_of_images_trains_evaluates_reports_and_explores(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_image_folder(tmp_path / "imgs")
    out = tmp_path / "run"
    assert main(["train", "--model", "sa-quadratic", "--dataset", f"folder:{tmp_path / 'imgs'}", *TINY,
                 "--epochs", "2", "--workers", "1", "--no-progress", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "preset: the folder preset (12 training images of 32x32)" in err and "crop+flip" in err
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["dataset"] == f"folder:{tmp_path / 'imgs'}" and config["model_overrides"]["num_classes"] == 3
    assert main(["eval", str(out)]) == 0
    assert "on folder:" in capsys.readouterr().out
    assert main(["report", str(out)]) == 0 and (out / "report.html").exists()
    from attnconv.explorer.server import Explorer

    ex = Explorer(out, images=4)
    info = ex.info()
    assert json.dumps(info) and ex.image(0)
    probs = ex.attention(0, 3, 4)
    assert probs  # the same API answers as for a built-in dataset


def test_folder_image_size_is_the_decode_size_of_every_later_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_image_folder(tmp_path / "imgs", grey=True)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    assert main(["train", "--model", "sa-quadratic", "--dataset", "folder:imgs", "--image-size", "24", *TINY,
                 "--max-steps", "2", "--workers", "1", "--no-progress", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["dataset"] == f"folder:{tmp_path / 'imgs'}"  # absolute: later commands work from anywhere
    assert config["model_overrides"]["image_size"] == 24 and config["model_overrides"]["in_channels"] == 1
    monkeypatch.chdir("/")
    assert main(["eval", str(out)]) == 0
    assert "on folder:" in capsys.readouterr().out
