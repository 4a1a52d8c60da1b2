import os

import pytest
import torch
from fixtures_data import write_random_fashion

from attnconv.train import make_config, train

TINY_ENCODINGS = ("sa-quadratic", "sa-quadratic-aniso", "sa-learned", "sa-learned-content")

# Two pytest-xdist workers on two cores: one intra-op thread each avoids oversubscription.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_attention_runs(tmp_path_factory):
    """Tiny 2-step runs of every attention encoding (7x7 token grid), and their 12-image test set on disk."""
    root = tmp_path_factory.mktemp("tiny-runs")
    data = root / "data"
    data.mkdir()
    write_random_fashion(data, 32, 12, seed=0)
    out = {}
    for model in TINY_ENCODINGS:
        cfg = make_config(model=model, dataset="fashion-mnist", epochs=1, max_steps=2, batch_size=16, workers=1,
                          data_dir=str(data),
                          model_overrides=dict(hidden=8, layers=2, heads=4, intermediate=8, downsample=4))
        train(cfg, root / model, progress=False)
        out[model] = root / model
    return out
