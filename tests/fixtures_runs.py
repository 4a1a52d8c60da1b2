"""Tiny training runs on random Fashion-MNIST-format data, for the tests that read run directories."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fixtures_data import write_random_fashion

from attnconv.config import make_config
from attnconv.training import train

# The attention classifiers at a 7x7 token grid, a few hundred parameters a layer.
TINY = dict(hidden=8, layers=2, heads=4, intermediate=8, downsample=4)


def train_tiny_runs(root: Path, specs: Iterable[tuple[str, dict[str, Any]]], *, seed: int = 0,
                    **config: Any) -> dict[str, Path]:
    """Write 32 + 12 random images under root/data and train each (model, overrides) into root/model.

    `config` goes to `make_config` (epochs, max_steps, ...); batch 16, 1 thread. Returns
    {"data": the data folder, model: its run directory, ...}.
    """
    data = root / "data"
    data.mkdir()
    write_random_fashion(data, 32, 12, seed=seed)
    out = {"data": data}
    for model, overrides in specs:
        cfg = make_config(model=model, dataset="fashion-mnist", batch_size=16, workers=1, data_dir=str(data),
                          model_overrides=overrides, **config)
        train(cfg, root / model, progress=False)
        out[model] = root / model
    return out


def train_folder_runs(root: Path, specs: Iterable[tuple[str, dict[str, Any]]], *, image_size: int = 8,
                      **config: Any) -> dict[str, Path]:
    """`fixtures_data.write_class_folder` under root/imgs (3 classes, 3 + 4 images each) and 2-step runs of each
    (model, overrides) on it at `image_size` into root/model. At size 8 a CIFAR ResNet-18's last stages see
    2x2 and 1x1 grids. Returns {"data": the folder, model: its run directory, ...}."""
    from fixtures_data import write_class_folder

    data = write_class_folder(root / "imgs")
    out = {"data": data}
    for model, overrides in specs:
        cfg = make_config(model=model, dataset=f"folder:{data}", batch_size=4, workers=1, epochs=1, max_steps=2,
                          augment=False, model_overrides={"image_size": image_size, **overrides}, **config)
        train(cfg, root / model, progress=False)
        out[model] = root / model
    return out


def rerecord(run: Path) -> None:
    """Write model.safetensors' record of config.json (`attnconv.runs.record`) anew from config.json as it is now:
    the run as if it had been trained with what an edit put there (class names no folder of the tests holds)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from attnconv.runs import RECORD_KEY, WEIGHTS_FILE, config_record, read_config
    from attnconv.runs.files import sealed_metadata

    path = run / WEIGHTS_FILE
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata() or {}
    save_file(load_file(path), path, metadata=sealed_metadata({**metadata, RECORD_KEY: config_record(read_config(run))}))


def unrecord(run: Path) -> None:
    """Take the record of config.json out of model.safetensors' metadata and state.pt: the run as one whose
    checkpoints were written before the record existed, where the checks of config.json's own readers (and of
    the tensors) are the only ones."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from attnconv.runs import RECORD_KEY, STATE_FILE, WEIGHTS_FILE
    from attnconv.runs.files import META_CHECKSUM_KEY

    path = run / WEIGHTS_FILE
    if path.exists():  # written before the record, and before the metadata's checksum
        with safe_open(str(path), "pt") as f:
            metadata = {k: v for k, v in (f.metadata() or {}).items() if k not in (RECORD_KEY, META_CHECKSUM_KEY)}
        save_file(load_file(path), path, metadata=metadata)
    if (run / STATE_FILE).exists():
        state = torch.load(run / STATE_FILE, weights_only=True)
        state.pop("record", None)
        torch.save(state, run / STATE_FILE)
