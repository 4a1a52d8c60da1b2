"""Figures: attention centers and attention maps of tiny runs of every encoding, and their bad inputs."""

import math

import matplotlib.image
import numpy as np
import pytest

from attnconv.cli import main
from attnconv.plots import _ellipse, _window, mass_level, save_figure

MODELS = ("sa-quadratic", "sa-quadratic-aniso", "sa-learned", "sa-learned-content")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tiny_attention_runs):
    return tiny_attention_runs


def assert_png(path) -> np.ndarray:
    raw = path.read_bytes()
    assert raw[:8] == PNG_SIGNATURE and len(raw) > 1024
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels.std() > 0  # not a blank canvas
    return pixels


def run_cli(capsys, *argv) -> str:
    assert main([str(a) for a in argv]) == 0
    return capsys.readouterr().out.strip()


# ------------------------------------------------------------------------------ figures


@pytest.mark.parametrize("model", MODELS)
def test_plot_centers_writes_a_png_in_the_run(runs, model, capsys):
    printed = run_cli(capsys, "plot", "centers", runs[model], "--images", 4)
    assert printed == str(runs[model] / "centers.png")
    assert_png(runs[model] / "centers.png")


@pytest.mark.parametrize("model", MODELS)
def test_plot_maps_writes_a_png_in_the_run(runs, model, capsys):
    run_cli(capsys, "plot", "maps", runs[model], "--images", 3, "--query", "1,5", "--zoom", 5)
    assert_png(runs[model] / "maps.png")


def test_plot_maps_of_one_image_draws_it_beside_the_grid(runs, tmp_path, capsys):
    run = runs["sa-learned-content"]
    run_cli(capsys, "plot", "maps", run, "--images", 3, "--out", tmp_path / "mean.png")
    printed = run_cli(capsys, "plot", "maps", run, "--image", 0)
    assert printed == str(run / "maps-image-0.png")
    mean, single = assert_png(tmp_path / "mean.png"), assert_png(run / "maps-image-0.png")
    assert single.shape[1] > mean.shape[1] + 50  # the image column makes the figure wider


def test_plot_writes_svg_into_new_folders_atomically(runs, tmp_path, capsys):
    out = tmp_path / "a" / "b" / "centers.svg"
    run_cli(capsys, "plot", "centers", runs["sa-quadratic"], "--out", out)
    assert out.read_text().lstrip().startswith("<?xml") and "<svg" in out.read_text()
    assert sorted(p.name for p in out.parent.iterdir()) == ["centers.svg"]  # no temporary file left


def test_save_figure_replaces_an_existing_file(tmp_path):
    from matplotlib.figure import Figure

    path = tmp_path / "f.png"
    path.write_bytes(b"old")
    fig = Figure()
    fig.subplots().plot([0, 1], [1, 0])
    save_figure(fig, path)
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert [p.name for p in tmp_path.iterdir()] == ["f.png"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plot", "centers", "{missing}"], "no such run directory"),
        (["plot", "maps", "{missing}"], "no such run directory"),
        (["plot", "maps", "{quad}", "--query", "7,0"], "outside the 7x7 token grid"),
        (["plot", "maps", "{quad}", "--query=-1,3"], "outside the 7x7 token grid"),
        (["plot", "maps", "{quad}", "--query", "3"], "give the token as I,J"),
        (["plot", "maps", "{quad}", "--zoom", "0"], "--zoom 0"),
        (["plot", "maps", "{content}", "--image", "12"], "--image 12 is out of range"),
        (["plot", "maps", "{content}", "--image", "-1"], "--image -1 is out of range"),
        (["plot", "maps", "{content}", "--images", "0"], "--images 0"),
        (["plot", "centers", "{quad}", "--out", "{tmp}/x.jpg"], "ending in .png, .svg, .pdf"),
        (["plot", "centers", "{quad}", "--out", "{tmp}"], "ending in .png"),
        (["plot", "nothing", "{quad}"], "invalid choice"),
    ],
)
def test_plot_bad_input_is_one_line_exit_2(runs, tmp_path, capsys, argv, message):
    fill = dict(missing=tmp_path / "nope", quad=runs["sa-quadratic"], content=runs["sa-learned-content"], tmp=tmp_path)
    assert main([a.format(**fill) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------ geometry


def test_mass_level_keeps_the_fewest_most_probable_pixels():
    p = np.array([[0.5, 0.2], [0.2, 0.1]])
    assert (p > mass_level(p, 0.5)).sum() == 1  # the 0.5 pixel alone holds 50%
    assert (p > mass_level(p, 0.6)).sum() == 3  # ties at 0.2 stay together: 0.9 of the mass
    assert (p > mass_level(p, 0.9)).sum() == 3
    assert (p > mass_level(p, 0.95)).sum() == 4
    uniform = np.full((3, 3), 1 / 9)
    assert (uniform > mass_level(uniform, 0.5)).sum() == 9


@pytest.mark.parametrize("mass", [0.5, 0.9])
def test_ellipse_is_the_gaussian_level_set_holding_the_mass(mass):
    s = np.array([[2.0, 0.6], [0.6, 0.5]])
    center = np.array([1.0, -2.0])
    pts = _ellipse(center, s, mass)
    d = pts - center
    q = np.einsum("ni,ij,nj->n", d, s, d)
    np.testing.assert_allclose(q, -2 * math.log(1 - mass))
    # Monte Carlo: the Gaussian with precision s puts `mass` inside the ellipse
    rng = np.random.default_rng(0)
    x = rng.multivariate_normal(np.zeros(2), np.linalg.inv(s), 200_000)
    inside = np.einsum("ni,ij,nj->n", x, s, x) <= -2 * math.log(1 - mass)
    assert inside.mean() == pytest.approx(mass, abs=0.005)


def test_window_covers_centers_but_never_exceeds_the_grid():
    near = [{"centers": np.array([[1.0, 0.0]]), "inverse_covariance": np.eye(2)[None] * 50}]
    far = [{"centers": np.array([[30.0, 0.0]]), "inverse_covariance": np.eye(2)[None] * 50}]
    assert _window(near, 7) == 2
    assert _window(far, 7) == 7
