"""learn-conv: the assignment, the zero-padded student, and a few-step run of the command."""

import itertools
import json
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from fixtures_data import write_random_fashion

from attnconv.analysis import assignment, match_to_grid
from attnconv.attention import SelfAttention2d
from attnconv.cli import main
from attnconv.errors import AttnconvError
from attnconv.learnconv import _relative_error, learn_conv


@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (5, 5), (4, 6), (6, 4), (6, 6)])
def test_assignment_is_optimal_against_brute_force(shape):
    rng = np.random.default_rng(sum(shape))
    for _ in range(5):
        cost = rng.random(shape)
        pairs = assignment(cost)
        n, m = shape
        assert len(pairs) == min(n, m)
        assert len({r for r, _ in pairs}) == len({c for _, c in pairs}) == min(n, m)
        if n <= m:
            best = min(sum(cost[i, p[i]] for i in range(n)) for p in itertools.permutations(range(m), n))
        else:
            best = min(sum(cost[p[j], j] for j in range(m)) for p in itertools.permutations(range(n), m))
        assert sum(cost[r, c] for r, c in pairs) == pytest.approx(best)


def test_match_to_grid_finds_permuted_grid_points():
    grid = np.array([[a, b] for a in (-1, 0, 1) for b in (-1, 0, 1)], dtype=float)
    centers = grid[np.random.default_rng(0).permutation(9)] + 0.1
    m = match_to_grid(centers, 3)
    assert m["within"] == 9
    assert m["mean_distance"] == pytest.approx(math.hypot(0.1, 0.1))
    assert sorted(map(tuple, m["matched_point"])) == sorted(map(tuple, grid.tolist()))
    # two heads on one grid point: only one of them can have it
    crowded = match_to_grid(np.zeros((2, 2)), 3)
    assert crowded["within"] == 1 and crowded["max_distance"] == pytest.approx(1.0)


def test_theorem_1_student_on_the_padded_grid_matches_the_conv_exactly():
    """The student's exact solution exists: one head per tap, large alpha, W_out = the tap's weights."""
    torch.manual_seed(0)
    c, k = 3, 3
    conv = nn.Conv2d(c, c, k, padding=1).double()
    student = SelfAttention2d(c, c, heads=k * k).double()
    with torch.no_grad():
        taps = torch.tensor([[a, b] for a in (-1, 0, 1) for b in (-1, 0, 1)], dtype=torch.float64)
        student.encoding.centers.copy_(taps)
        student.encoding.widths.fill_(math.sqrt(2 * 40.0))  # alpha = 40: leakage ~ e^-40
        # out.weight (C_out, heads * C_in): head h's block is W[:, :, tap_h]
        student.out.weight.copy_(conv.weight.flatten(2).permute(0, 2, 1).reshape(c, k * k * c))
        student.out.bias.copy_(conv.bias)
    x = torch.randn(4, c, 9, 9, dtype=torch.float64)
    assert _relative_error(student, conv, x, pad=1) < 1e-12
    assert _relative_error(student, conv, x, pad=0) > 1e-3  # without the zero-padded grid, borders differ


def check_result(r, heads):
    assert math.isfinite(r["relative_error"]) and r["relative_error"] >= 0
    assert len(r["centers"]) == heads and all(math.isfinite(v) for c in r["centers"] for v in c)
    assert len(r["trajectory"]) == len(r["steps_recorded"]) == len(r["relative_error_curve"])
    m = r["matching"]
    assert math.isfinite(m["mean_distance"]) and 0 <= m["within"] <= heads
    assert len(r["window_mass"]) == heads and all(0 <= w <= 1 + 1e-9 for w in r["window_mass"])


def test_learn_conv_command_writes_json_and_figure(tmp_path, capsys):
    out = tmp_path / "lc"
    argv = ["learn-conv", "--steps", "4", "--source", "random", "--size", "6", "--channels", "2",
            "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "held-out relative error" in text and "Hungarian" in text
    r = json.loads((out / "learn-conv.json").read_text())
    check_result(r, 9)
    assert r["config"]["source"] == "random" and r["steps_recorded"][-1] == 4
    png = (out / "learn-conv.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1024


def test_learn_conv_on_fashion_mnist_files(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_random_fashion(data, 20, 10, seed=0)
    r = learn_conv(kernel=3, heads=4, steps=3, channels=3, size=8, source="fmnist", data_dir=data)
    check_result(r, 4)
    assert r["config"]["source"] == "fmnist" and r["tap_mixing_condition"] is None  # 4 heads cannot span 9 taps
    assert r["relative_error_curve"][0] == r["initial_relative_error"]


def test_learn_conv_falls_back_to_gaussian_images_without_fashion_mnist(monkeypatch):
    import attnconv.data

    def missing(*args, **kwargs):
        raise AttnconvError("no Fashion-MNIST here")

    monkeypatch.setattr(attnconv.data, "load_dataset", missing)
    r = learn_conv(steps=2, channels=2, size=5)
    assert r["config"]["source"] == "random" and "no Fashion-MNIST here" in r["note"]
    with pytest.raises(AttnconvError, match="no Fashion-MNIST"):
        learn_conv(steps=2, channels=2, size=5, source="fmnist")


def test_learn_conv_is_reproducible_and_restores_threads():
    threads = torch.get_num_threads()
    a = learn_conv(steps=3, channels=2, size=5, source="random", seed=3)
    b = learn_conv(steps=3, channels=2, size=5, source="random", seed=3)
    assert a["centers"] == b["centers"] and a["relative_error"] == b["relative_error"]
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--kernel", "4"], "odd kernel"),
        (["--steps", "-1"], "--steps -1"),
        (["--lr", "0"], "--lr 0"),
        (["--source", "fmnist", "--size", "40"], "larger than the 28x28"),
        (["--source", "cifar"], "invalid choice"),
    ],
)
def test_learn_conv_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message):
    assert main(["learn-conv", *argv, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_learn_conv_a_folder_in_the_way_is_named_with_a_fix_that_works(tmp_path, capsys):
    """learn-conv.png a folder in --out: the line said `give a file name inside it`, but the names are fixed."""
    out = tmp_path / "lc"
    (out / "learn-conv.png").mkdir(parents=True)
    argv = ["learn-conv", "--steps", "2", "--source", "random", "--size", "6", "--channels", "2", "--no-progress",
            "--out", str(out), "--overwrite"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --out {out}: learn-conv.png in it is a folder, not attnconv's result; move it away, or "
                   "choose another --out"], err


def test_learn_conv_stopped_before_its_results_leaves_no_empty_folder(tmp_path, capsys, monkeypatch):
    """Ctrl-C during the training: the output check had made --out, and an empty folder was left."""
    import attnconv.learnconv as module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "match_to_grid", interrupted)
    out = tmp_path / "new" / "lc"
    argv = ["learn-conv", "--steps", "2", "--source", "random", "--size", "6", "--channels", "2", "--no-progress",
            "--out", str(out)]
    assert main(argv) == 130
    assert capsys.readouterr().err.strip() == "interrupted" and not out.exists()
