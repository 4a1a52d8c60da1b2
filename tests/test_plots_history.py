"""Figures of the heads over training (from heads.jsonl): Figure 4 at several epochs, attention distance."""

import json
import shutil
import warnings

import matplotlib.image
import numpy as np
import pytest
from fixtures_runs import TINY, train_tiny_runs

from attnconv.cli import main
from attnconv.errors import AttnconvError
from attnconv.plots import (
    distance_figure,
    plot_centers_history,
    plot_distance,
    snapshot_geometry,
    spread_epochs,
)
from attnconv.runs import read_heads

MODELS = ("sa-quadratic", "sa-quadratic-aniso", "sa-learned", "sa-learned-content")
EPOCHS = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every attention encoding trained for 4 short epochs (2 steps each): 5 snapshots per run."""
    return train_tiny_runs(tmp_path_factory.mktemp("history"), ((m, TINY) for m in MODELS), epochs=EPOCHS)


def _png(path):
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    return image


def test_every_attention_run_has_a_snapshot_per_epoch_and_one_at_initialization(runs):
    for model in MODELS:
        snaps = read_heads(runs[model])
        assert [s["epoch"] for s in snaps] == list(range(EPOCHS + 1))
        assert [s["step"] for s in snaps] == [2 * e for e in range(EPOCHS + 1)]
        assert all(len(s["layers"]) == TINY["layers"] and len(s["layers"][0]) == TINY["heads"] for s in snaps)


@pytest.mark.parametrize("model", MODELS)
def test_centers_over_training_draws_one_panel_per_epoch(runs, model, tmp_path):
    path = plot_centers_history(runs[model], tmp_path / "c.png", layer=2, epochs=[0, 1, 4])
    _png(path)
    default = plot_centers_history(runs[model], layer=1)  # default epochs and file name
    assert default == runs[model] / "centers-layer1.png"
    _png(default)


def test_centers_over_training_draws_contours_only_for_quadratic_heads(runs):
    quad = snapshot_geometry(read_heads(runs["sa-quadratic"])[-1]["layers"][0])
    alphas = [h["alpha"] for h in read_heads(runs["sa-quadratic"])[-1]["layers"][0]]
    assert np.allclose(quad["inverse_covariance"], [2 * a * np.eye(2) for a in alphas])  # Sigma^-1 = 2 alpha I
    aniso = read_heads(runs["sa-quadratic-aniso"])[-1]["layers"][1]
    assert np.allclose(snapshot_geometry(aniso)["inverse_covariance"], [h["inverse_covariance"] for h in aniso])
    learned = snapshot_geometry(read_heads(runs["sa-learned"])[-1]["layers"][0])
    assert learned["inverse_covariance"] is None and learned["centers"].shape == (TINY["heads"], 2)


def test_distance_figure_has_a_line_per_head_and_the_layer_mean(runs, tmp_path):
    snaps = read_heads(runs["sa-learned-content"])
    fig = distance_figure(snaps)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == TINY["layers"]
    for i, ax in enumerate(panels):
        assert len(ax.lines) == TINY["heads"] + 1
        mean = ax.lines[-1].get_ydata()
        assert np.allclose(mean, [np.mean([h["attention_distance"] for h in s["layers"][i]]) for s in snaps])
        assert list(ax.lines[0].get_xdata()) == list(range(EPOCHS + 1))
    assert plot_distance(runs["sa-quadratic"]) == runs["sa-quadratic"] / "distance.png"


def test_distance_figure_shows_every_value_in_every_panel():
    """The panels share their y axis from 0: a later layer's larger distances are not cut off at the
    first panel's top (they were, with ylim(bottom=0) set per panel)."""
    snaps = [{"epoch": e, "step": e, "layers": [[{"attention_distance": 1.0 + 0.1 * e}] * 2,
                                                [{"attention_distance": 2.0 + e}] * 2]} for e in range(3)]
    fig = distance_figure(snaps)
    for ax in (a for a in fig.axes if a.get_visible()):
        bottom, top = ax.get_ylim()
        assert bottom == 0 and top >= 4.0  # the largest distance, layer 2 at epoch 2


def test_spread_epochs_is_dense_early_and_ends_at_the_last():
    assert spread_epochs(range(13)) == [0, 1, 2, 5, 12]
    assert spread_epochs(range(3)) == [0, 1, 2]
    assert spread_epochs([0, 2, 4, 6, 8, 10, 12]) == [0, 2, 4, 6, 12]
    assert spread_epochs(range(101))[-1] == 100 and len(spread_epochs(range(101))) == 5


def test_bad_requests_are_one_clear_error(runs, tmp_path, capsys):
    run = runs["sa-quadratic"]
    with pytest.raises(AttnconvError, match=r"^layer 3 is invalid: the run has layers 1..2"):
        plot_centers_history(run, tmp_path / "x.png", layer=3)
    with pytest.raises(AttnconvError, match=r"^epochs 7: not recorded; the run's heads.jsonl has epochs 0-4"):
        plot_centers_history(run, tmp_path / "x.png", epochs=[0, 7])
    # the command line says the same with its flags
    assert main(["plot", "centers", str(run), "--layer", "3", "--out", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err == "error: --layer 3 is invalid: the run has layers 1..2\n"
    assert main(["plot", "centers", str(run), "--epochs", "0,7", "--out", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err.startswith("error: --epochs 7: not recorded; the run's heads.jsonl has epochs 0-4")
    old = tmp_path / "old"
    shutil.copytree(run, old)
    (old / "heads.jsonl").unlink()  # a run trained before heads were recorded
    for draw in (lambda: plot_distance(old), lambda: plot_centers_history(old)):
        with pytest.raises(AttnconvError, match="no heads.jsonl .* Train the run again"):
            draw()
    (old / "heads.jsonl").write_text('{"epoch": 0, "step": 0, "layers": 3}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one error, not a warning before it
        with pytest.raises(AttnconvError, match="corrupt heads file \\(no sound snapshot in it"):
            plot_distance(old)
    assert not (tmp_path / "x.png").exists()


def test_the_command_line(runs, tmp_path, capsys):
    run = runs["sa-learned"]
    assert main(["plot", "centers", str(run), "--layer", "2", "--epochs", "0,4", "--out", str(tmp_path / "a.png")]) == 0
    assert main(["plot", "distance", str(run), "--out", str(tmp_path / "d.svg")]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "a.png"), str(tmp_path / "d.svg")]
    assert main(["plot", "centers", str(run), "--epochs", "zero"]) == 2
    assert "--epochs 'zero'" in capsys.readouterr().err
    # analyze prints the grid-likeness over training from heads.jsonl
    assert main(["analyze", str(runs["sa-quadratic"]), "--json"]) == 0
    history = json.loads(capsys.readouterr().out)["history"]
    assert [h["epoch"] for h in history] == list(range(EPOCHS + 1))
    assert all(0 <= layer["within"] <= layer["heads"] == TINY["heads"] for h in history for layer in h["layers"])
    assert main(["analyze", str(runs["sa-quadratic"])]) == 0
    assert "over training (heads.jsonl)" in capsys.readouterr().out
