import os

import pytest
import torch
from fixtures_runs import TINY, train_tiny_runs

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
    runs = train_tiny_runs(tmp_path_factory.mktemp("tiny-runs"), ((m, TINY) for m in TINY_ENCODINGS),
                           epochs=1, max_steps=2)
    del runs["data"]
    return runs
