"""Figures: attention centers and attention maps of tiny runs of every encoding, and their bad inputs."""

import importlib.util
import math
import shutil
import statistics
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
from fixtures_runs import TINY, train_tiny_runs

from attnconv.analysis import head_geometry
from attnconv.cli import main
from attnconv.errors import AttnconvError
from attnconv.models import build_model
from attnconv.models.sites import attention_sites, site_probs
from attnconv.plots import (
    centers_figure,
    gaussian_ellipse,
    maps_figure,
    mass_level,
    plot_figures,
    save_figure,
)
from attnconv.plots.figures import ellipse_points, window_radius
from attnconv.positional import QuadraticEncoding
from attnconv.runs import read_metrics

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


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_save_figure_replaces_its_own_figures_and_refuses_other_files(tmp_path, suffix):
    from matplotlib.figure import Figure

    fig = Figure()
    fig.subplots().plot([0, 1], [1, 0])
    path = tmp_path / f"f{suffix}"
    path.write_bytes(b"a user's file")
    with pytest.raises(AttnconvError, match="^out .* exists and attnconv did not write it; .* pass overwrite to"):
        save_figure(fig, path)
    assert path.read_bytes() == b"a user's file"
    save_figure(fig, path, overwrite=True)  # asked for: replaced
    first = path.read_bytes()
    assert first != b"a user's file" and (suffix != ".png" or first[:8] == PNG_SIGNATURE)
    save_figure(fig, path)  # now it is ours: replaced without being asked
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plot", "centers", "{missing}"], "not a run directory (no such directory)"),
        (["plot", "maps", "{missing}"], "not a run directory (no such directory)"),
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
    pts = ellipse_points(center, s, mass)
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
    assert window_radius(near, 7) == 2
    assert window_radius(far, 7) == 7


def _rotation(degrees: float) -> np.ndarray:
    """Columns: the unit vectors at `degrees` and `degrees` + 90 in the (col, row) frame, as (row, col)."""
    t = math.radians(degrees)
    return np.array([[math.sin(t), math.cos(t)], [math.cos(t), -math.sin(t)]])


@pytest.mark.parametrize("seed", range(10))
def test_gaussian_ellipse_axes_and_angle_are_the_eigendecomposition(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(2, 2))
    s = a @ a.T + 0.05 * np.eye(2)  # a random inverse covariance
    evals, evecs = np.linalg.eigh(s)
    for mass, r in ((None, 1.0), (0.5, math.sqrt(2 * math.log(2))), (0.9, math.sqrt(2 * math.log(10)))):
        major, minor, angle = gaussian_ellipse(s, mass)
        assert major == pytest.approx(r / math.sqrt(evals[0])) and minor == pytest.approx(r / math.sqrt(evals[1]))
        assert -90 < angle <= 90
        direction = np.array([math.sin(math.radians(angle)), math.cos(math.radians(angle))])  # (row, col)
        assert abs(direction @ evecs[:, 0]) == pytest.approx(1.0)  # along the smallest eigenvalue's vector
    # the one-sigma semi-axes are the standard deviations along the principal directions of Sigma
    np.testing.assert_allclose(sorted(gaussian_ellipse(s)[:2]), np.sqrt(np.linalg.eigvalsh(np.linalg.inv(s))))


def test_gaussian_ellipse_of_known_heads():
    assert gaussian_ellipse(np.diag([1 / 4, 1.0])) == pytest.approx((2.0, 1.0, 90.0))  # long along rows (down)
    assert gaussian_ellipse(np.diag([1.0, 1 / 4])) == pytest.approx((2.0, 1.0, 0.0))  # long along columns
    alpha = 2.0  # isotropic A = -alpha ||delta||^2: Sigma^-1 = 2 alpha I, sigma = 1 / sqrt(2 alpha)
    assert gaussian_ellipse(2 * alpha * np.eye(2)) == pytest.approx((0.5, 0.5, 0.0))
    for degrees in (30.0, -60.0, 90.0):
        v = _rotation(degrees)
        sigma = v @ np.diag([9.0, 1.0]) @ v.T  # standard deviations 3 (at `degrees`) and 1
        assert gaussian_ellipse(np.linalg.inv(sigma)) == pytest.approx((3.0, 1.0, degrees))
    with pytest.raises(AttnconvError, match="2x2"):
        gaussian_ellipse(np.eye(3))


def test_gaussian_ellipse_of_a_full_covariance_encoding_head():
    """positional.QuadraticEncoding(kind="full"), Sigma^-1 = A A^T: the ellipse of its scores' Gaussian."""
    enc = QuadraticEncoding(1, kind="full")
    v = _rotation(25.0)
    with torch.no_grad():
        enc.widths.copy_(torch.tensor(v @ np.diag([1 / 2.5, 1 / 0.8]), dtype=torch.float32)[None])
        enc.centers.zero_()
    s = enc.inverse_covariance()[0].detach().double().numpy()
    major, minor, angle = gaussian_ellipse(s)
    assert (major, minor, angle) == pytest.approx((2.5, 0.8, 25.0), rel=1e-5)
    # the scores the ellipse is drawn from: -1/2 d^T Sigma^-1 d for a shift d = (row, col) from the middle query
    size = 9
    logits = enc.logits(size, size)[0].detach().double().reshape(size, size, size, size)  # (q_r, q_c, k_r, k_c)
    q = size // 2
    for dr, dc in ((1, 2), (-2, 1), (3, 3)):
        d = np.array([dr, dc], dtype=float)
        assert float(logits[q, q, q + dr, q + dc]) == pytest.approx(-0.5 * d @ s @ d, rel=1e-5)
    pts = ellipse_points(np.zeros(2), s, 0.5)  # the drawn 50% contour: the same ellipse, scaled
    radius = np.linalg.norm(pts, axis=1)
    assert radius.max() == pytest.approx(major * math.sqrt(2 * math.log(2)), rel=1e-3)
    assert radius.min() == pytest.approx(minor * math.sqrt(2 * math.log(2)), rel=1e-3)


# ------------------------------------------------------------------------------ figure functions on tiny models


def _tiny_model(name: str, layers: int = 2, heads: int = 4):
    return build_model(name, **{**TINY, "layers": layers, "heads": heads}, in_channels=1, image_size=28).eval()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("layers", [2, 5])
def test_figure_functions_draw_a_panel_per_layer_and_head(model, layers):
    m = _tiny_model(model, layers=layers)
    x = torch.randn(3, 1, 28, 28) if model == "sa-learned-content" else None
    sites = attention_sites(m)
    probs = site_probs(m, sites, x)
    size = sites[0].size
    geometry = [head_geometry(site.layer, size, p) for site, p in zip(sites, probs)]
    centers = centers_figure(geometry, max(size), model)
    assert sum(ax.get_visible() for ax in centers.axes) == layers  # one panel per layer, extras hidden
    assert all(len(ax.lines) >= 4 for ax in centers.axes if ax.get_visible())  # a center per head at least
    if model.startswith("sa-quadratic"):  # 50% and 90% ellipses per head, plus its center
        assert all(len(ax.lines) == 4 * 3 for ax in centers.axes if ax.get_visible())
    maps = maps_figure(probs, size, (3, 3), 7)
    assert len(maps.axes) == layers * 4
    image = np.zeros((28, 28))
    assert len(maps_figure(probs, size, (3, 3), 7, image=image, downsample=4).axes) == layers * 4 + 1


# ------------------------------------------------------------------------------ a row's figures from its run


@pytest.mark.parametrize("model", MODELS)
def test_plot_figures_writes_centers_and_whole_grid_maps(runs, model, tmp_path):
    paths = plot_figures(runs[model], tmp_path / "figs" / f"table1-{model}", images=3)
    assert [p.name for p in paths] == [f"table1-{model}-centers.png", f"table1-{model}-maps.png"]
    for p in paths:
        assert_png(p)


def test_plot_maps_without_zoom_shows_the_whole_grid(runs, tmp_path):
    from attnconv.plots import plot_maps

    whole = assert_png(plot_maps(runs["sa-learned"], tmp_path / "whole.png", zoom=None))
    three = assert_png(plot_maps(runs["sa-learned"], tmp_path / "three.png", zoom=3))
    assert whole.shape == three.shape  # the same panels: only what is inside them differs
    with pytest.raises(AttnconvError, match="^zoom 0 is invalid"):
        plot_maps(runs["sa-learned"], tmp_path / "x.png", zoom=0)


@pytest.fixture(scope="module")
def tiny_cnn_run(tmp_path_factory):
    return train_tiny_runs(tmp_path_factory.mktemp("cnn"), [("resnet18", {"width": 4})], epochs=1,
                           max_steps=1)["resnet18"]


def test_plot_figures_of_a_cnn_is_one_error(tiny_cnn_run, tmp_path):
    with pytest.raises(AttnconvError, match="no attention layers"):
        plot_figures(tiny_cnn_run, tmp_path / "resnet18")
    assert not list(tmp_path.iterdir())


def _figures_script():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "table1" / "figures.py"
    spec = importlib.util.spec_from_file_location("table1_figures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table1_figures_script_draws_every_trained_attention_row(runs, tmp_path, capsys):
    root = tmp_path / "table1"
    for model in MODELS[:3]:  # sa-learned-content not trained yet
        (root / model).mkdir(parents=True)
        (root / model / "seed0").symlink_to(runs[model], target_is_directory=True)
    out = tmp_path / "docs" / "figures"
    script = _figures_script()
    assert script.main(["--root", str(root), "--out", str(out), "--images", "3"]) == 0
    captured = capsys.readouterr()
    expected = sorted(f"table1-{m}-{kind}.png" for m in MODELS[:3] for kind in ("centers", "maps"))
    assert sorted(p.name for p in out.iterdir()) == expected
    assert captured.out.split() == [str(out / f"table1-{m}-{k}.png") for m in MODELS[:3] for k in ("centers", "maps")]
    assert "skip sa-learned-content" in captured.err
    for name in expected:
        assert_png(out / name)
    assert script.main(["--root", str(root), "--out", str(out), "--seed", "1"]) == 1  # nothing trained


# ------------------------------------------------------------------------------ maps with nothing to show


def test_flat_maps_are_named_and_maps_with_something_are_not():
    from attnconv.plots import flat_map_label

    assert flat_map_label(np.zeros((2, 2))) == "no attention: all zero"
    assert flat_map_label(np.array([[9e-10, 0.0], [0.0, np.nan]])) == "no attention: all < 1e-6"  # leakage only
    assert flat_map_label(np.full((2, 2), 0.25)) == "uniform: 0.250 each"
    assert flat_map_label(np.array([[1.0]])) == "one key: 1.00"
    assert flat_map_label(np.full(4, -3.5), kind="score") == "constant: -3.50"
    assert flat_map_label(np.zeros(4), kind="score") == "constant: 0"
    assert flat_map_label(np.array([np.nan, np.nan])) == "no values"
    for something in ([0.5, 0.5, 0.0], [1e-3, 0.0], [0.2, 0.3]):
        assert flat_map_label(np.array(something)) is None
    assert flat_map_label(np.array([-1.0, -2.0]), kind="score") is None


@pytest.fixture(scope="module")
def folder_converted(tmp_path_factory):
    """A CIFAR ResNet-18 trained 2 steps on an 8x8 image folder and converted: its last stages see 2x2 and 1x1 grids."""
    from fixtures_runs import train_folder_runs

    from attnconv.runs import convert_run

    root = tmp_path_factory.mktemp("plots-folder")
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(root / "cache"))
    runs = train_folder_runs(root, [("resnet18", dict(width=2))])
    yield convert_run(runs["resnet18"], root / "converted")
    mp.undo()


def _overlaps(fig) -> list[tuple[str, str]]:
    """Pairs of the figure's visible, non-empty texts whose boxes overlap (drawn at the figure's dpi)."""
    fig.canvas.draw()  # lay the texts out where the saved file has them
    renderer = fig.canvas.get_renderer()
    texts = [t for t in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_window_extent"))
             if t.get_visible() and t.get_text().strip()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    out = [(a, b) for n, (a, ra) in enumerate(boxes) for b, rb in boxes[n + 1:] if ra.overlaps(rb)]
    # and no map's caption runs into another map
    for ax in fig.axes:
        label = ax.xaxis.label
        if label.get_text():
            box = label.get_window_extent(renderer)
            out += [(label.get_text(), "a map") for other in fig.axes
                    if other is not ax and box.overlaps(other.get_window_extent(renderer))]
    return out


def test_maps_of_a_converted_cnn_draw_its_empty_1x1_and_2x2_maps_grey_and_say_so(folder_converted):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from attnconv.plots import NEUTRAL, maps_of_run
    from attnconv.runs import Run

    run = Run(folder_converted)
    sizes = [site.size for site in run.sites]
    assert sizes[-1] == (1, 1) and (2, 2) in sizes
    probs, _ = run.site_probs()
    fig = maps_of_run(run, probs, zoom=7, how="position-only")
    FigureCanvasAgg(fig)
    axes = [ax for ax in fig.axes if ax.get_xlabel()]
    assert len(axes) == len(sizes) * 9
    captions = [ax.get_xlabel() for ax in axes]
    last = captions[-9:]  # the 1x1 grid: the centre head's one key, the others' taps on the padding
    assert last[4] == "one key:\n1.00" and all(c.startswith("no attention:\n") for c in last[:4] + last[5:])
    assert all(c.startswith("max ") for c in captions[:9])  # the first layer has something everywhere
    for c in captions:
        if c.startswith("max "):
            number = c.split()[1]
            assert len(number.replace(".", "").lstrip("0")) == 3, c  # 3 significant digits
    # drawn in one neutral grey: the image of a flat map holds that colour where the grid is
    from matplotlib.colors import to_rgba

    flat = axes[-9].get_images()[0]
    rgba = flat.to_rgba(flat.get_array())
    centre = rgba[3, 3]  # the 7x7 window's middle: the one pixel of the grid
    assert tuple(np.round(centre, 3)) == tuple(np.round(to_rgba(NEUTRAL), 3))
    assert _overlaps(fig) == []  # no caption, title or label runs into another


def test_table1_claims_script_summarizes_the_committed_runs(tmp_path, capsys):
    """benchmarks/table1/claims.py over committed run files: accuracy per epoch over seeds, heads per layer."""
    repo = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("table1_claims", repo / "benchmarks" / "table1" / "claims.py")
    claims = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(claims)
    root = tmp_path / "table1"
    for model, seeds in (("resnet18", (0, 1)), ("sa-quadratic", (0, 1))):
        for k in seeds:
            dest = root / model / f"seed{k}"
            dest.mkdir(parents=True)
            for name in ("metrics.csv", "heads.jsonl"):
                src = repo / "benchmarks" / "table1" / model / f"seed{k}" / name
                if src.exists():
                    shutil.copy(src, dest / name)
    assert claims.main([str(root)]) == 0
    out = capsys.readouterr().out
    resnet, quadratic = out.split("## ")[1:]
    assert resnet.startswith("table1/resnet18: 2 seed(s)") and "snapshot" not in resnet
    accs = [m["test_acc"] for m in (read_metrics(root / "sa-quadratic" / f"seed{k}")[-1] for k in (0, 1))]
    assert f"12: {statistics.mean(accs):.4f} ± {statistics.stdev(accs):.4f}" in quadratic
    first, last = (line for line in quadratic.splitlines() if "snapshot" in line)
    assert first.startswith("first snapshot (epoch 0): L1 dist ") and last.startswith("last snapshot (epoch 12): ")
    assert last.count("/9 at ") == 4  # one cell per layer
