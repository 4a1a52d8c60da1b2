"""The scripts in examples/ run as a user would run them, and say what they promise."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_example(name: str, *args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(REPO / "examples" / name), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_replace_convs(tmp_path):
    out = run_example("replace_convs.py", cwd=tmp_path)
    assert out.startswith("replaced 14 3x3 convolutions by SelfAttention2d") and "logits (4, 10)" in out


@pytest.mark.slow
def test_convert_cnn(tmp_path):
    out = run_example("convert_cnn.py", cwd=tmp_path)
    assert "20 convolutions -> attention layers" in out and "same predictions on 100%" in out
    assert float(out.rsplit("difference", 1)[1]) < 1e-4


@pytest.mark.slow
def test_plot_head_attention(tmp_path):
    out = run_example("plot_head_attention.py", "--layer", "2", "--head", "3", "--out", "h.png", cwd=tmp_path)
    assert out.startswith("h.png: head 3 of layer 2") and (tmp_path / "h.png").stat().st_size > 1000  # from 1


def test_load_run_is_public_and_gives_an_eval_model(tmp_path):
    import torch

    import attnconv
    from attnconv import data as D
    from attnconv.config import make_config
    from attnconv.training import train

    g = torch.Generator().manual_seed(0)
    sets = [D.ImageSet(torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=g),
                       torch.randint(0, 10, (n,), generator=g)) for n in (32, 16)]
    cfg = make_config(model="sa-quadratic", dataset="fashion-mnist", epochs=1, batch_size=16, workers=1,
                      model_overrides=dict(hidden=8, layers=1, heads=4, intermediate=8, downsample=4))
    train(cfg, tmp_path / "run", dataset=tuple(sets), progress=False)
    model, config = attnconv.load_run(tmp_path / "run")
    assert "load_run" in attnconv.__all__ and not model.training and config.model == "sa-quadratic"
    x = D.normalize(sets[1].images, D.dataset_info("fashion-mnist"))
    with torch.no_grad():
        assert model(x).shape == (16, 10)
