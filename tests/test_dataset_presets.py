"""Defaults that fit the dataset (attnconv.dataset_presets), and a folder of images used end to end like a built-in dataset."""

import json

import pytest
from fixtures_data import write_image_folder
from test_train import data_dir  # noqa: F401  (a fixture)

from attnconv import data as D
from attnconv.cli import main
from attnconv.config import PRESETS
from attnconv.dataset_presets import FOLDER_EPOCHS, FOLDER_IMAGES, MAX_TOKENS_SIDE, dataset_preset, describe, folder_preset

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


@pytest.mark.parametrize("train_size,size,batch,downsample,epochs", [
    (12, 32, 3, 4, 100), (1437, 16, 128, 2, 35), (5000, 64, 128, 8, 10), (600, 28, 128, 4, 84),
    (100_000, 224, 128, 32, 10)])
def test_folder_recipe_scales_with_image_count_and_size(train_size, size, batch, downsample, epochs):
    info = D.DatasetInfo(name="folder:/x", channels=3, size=size, num_classes=2, mean=(0.5,) * 3, std=(0.2,) * 3,
                         classes=("a", "b"), train_size=train_size, test_size=4, stats_source="train")
    cfg = folder_preset("sa-quadratic", info)
    assert cfg.batch_size == batch and cfg.batch_size <= max(1, train_size // 4)
    # about FOLDER_IMAGES images seen, within the epoch bounds
    assert cfg.epochs == epochs and FOLDER_EPOCHS[0] <= cfg.epochs <= FOLDER_EPOCHS[1]
    assert cfg.epochs in FOLDER_EPOCHS or (cfg.epochs - 1) * train_size < FOLDER_IMAGES <= cfg.epochs * train_size
    d = cfg.model_overrides["downsample"]
    assert d == downsample and size % d == 0  # at most 8x8 tokens on the CPU where a factor allows
    assert size // d <= MAX_TOKENS_SIDE["cpu"]
    # augmentation that keeps the label: a crop scaled to the image, no flips
    assert cfg.optimizer == "adamw" and cfg.augment and not cfg.flip and cfg.crop_pad == max(1, size // 8)
    assert folder_preset("resnet18", info).model_overrides == {"width": 16}
    # on a GPU the paper's grid: at most 16x16 tokens
    gpu = folder_preset("sa-quadratic", info, device="cuda").model_overrides["downsample"]
    assert size // gpu <= MAX_TOKENS_SIDE["cuda"] < size // d * 3


def test_folder_preset_line_says_what_the_augmentation_is():
    info = D.DatasetInfo(name="folder:/x", channels=1, size=16, num_classes=2, mean=(0.5,), std=(0.2,),
                         classes=("a", "b"), train_size=1437, test_size=4, stats_source="train")
    cfg = folder_preset("sa-quadratic", info)
    assert "crop (pad 2);" in describe(cfg) and "flip" not in describe(cfg)
    assert "crop (pad 4) + flip" in describe(PRESETS["paper-cifar10-sa-quadratic"])
    assert "no augmentation" in describe(PRESETS["fmnist-sa-quadratic"])


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
    assert "preset: the folder preset (12 training images of 32x32)" in err and "crop (pad 4);" in err
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
