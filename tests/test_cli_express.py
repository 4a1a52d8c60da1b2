"""Tests for `attnconv express` (attnconv/cli/express.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from attnconv.cli import build_parser, main
from attnconv.cli.express import _build_conv

REPO = Path(__file__).resolve().parents[1]


def _relative_error(stdout: str) -> float:
    match = re.search(r"relative error .* = ([0-9.e+-]+)", stdout)
    assert match, stdout
    return float(match.group(1))


def _fails_with_one_line(capsys, argv: list[str], pattern: str) -> None:
    assert main(["express", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert re.search(pattern, err), err
    assert "Traceback" not in err


def test_express_2d_reports_a_tiny_error_and_the_centers(capsys):
    argv = ["express", "--dim", "2", "--kernel", "3", "--in-channels", "3", "--out-channels", "5", "--size", "7,9"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert _relative_error(out) < 1e-12
    assert "9 heads" in out and "alpha = 40.9" in out and "bound" in out
    assert "   1  (-1, -1)" in out and "   9  (1, 1)" in out  # heads numbered from 1


@pytest.mark.parametrize(
    "argv",
    [
        ["--dim", "1", "--kernel", "5", "--stride", "2", "--padding-mode", "reflect", "--dtype", "float32"],
        ["--dim", "3", "--kernel", "3,1,3", "--size", "5,4,6", "--groups", "2", "--padding", "valid", "--no-bias"],
        ["--dim", "2", "--kernel", "4", "--padding", "same", "--dilation", "2", "--padding-mode", "circular"],
    ],
    ids=["1d-strided-reflect-f32", "3d-grouped-valid", "2d-even-kernel-same"],
)
def test_express_other_configurations(capsys, argv):
    assert main(["express", *argv]) == 0
    out = capsys.readouterr().out
    limit = 1e-5 if "float32" in argv else 1e-12
    assert _relative_error(out) < limit


def test_express_plot_writes_a_png_atomically(tmp_path, capsys):
    target = tmp_path / "new" / "dir" / "heads.png"
    assert main(["express", "--kernel", "3,5", "--in-channels", "2", "--out-channels", "2", "--plot", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in target.parent.iterdir()] == ["heads.png"]  # no temp file left behind
    assert f"wrote {target}" in capsys.readouterr().out


def test_express_loads_weights_from_safetensors(tmp_path, capsys):
    weight, bias = torch.randn(4, 2, 3, 3), torch.randn(4)
    path = tmp_path / "conv.safetensors"
    save_file({"weight": weight, "bias": bias}, str(path))
    argv = ["express", "--in-channels", "2", "--out-channels", "4", "--weights", str(path)]
    conv = _build_conv(build_parser().parse_args(argv))
    assert torch.equal(conv.weight.detach().float(), weight) and torch.equal(conv.bias.detach().float(), bias)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"weights from {path}" in out and _relative_error(out) < 1e-12
    no_bias = tmp_path / "nobias.safetensors"
    save_file({"weight": weight}, str(no_bias))
    conv = _build_conv(build_parser().parse_args(argv[:-1] + [str(no_bias)]))
    assert conv.bias is None


@pytest.mark.parametrize(
    "argv, pattern",
    [
        (["--groups", "3"], "--groups 3 must divide"),
        (["--padding", "same", "--stride", "2"], "same.*stride"),
        (["--size", "0"], "--size"),
        (["--size", "-3"], "--size"),
        (["--in-channels", "0"], "--in-channels"),
        (["--kernel", "2,2,2"], "1 or 2 values"),
        (["--kernel", "5", "--padding", "0", "--size", "3"], "too small"),
        (["--alpha", "-1"], "--alpha"),
        (["--dim", "3", "--plot", "x.png"], "2-D"),
        (["--weights", "does/not/exist.safetensors"], "does not exist"),
    ],
)
def test_express_bad_arguments_fail_with_one_line(capsys, argv, pattern):
    _fails_with_one_line(capsys, argv, pattern)


def test_express_bad_weight_files_fail_with_one_line(tmp_path, capsys):
    base = ["--in-channels", "2", "--out-channels", "4", "--weights"]
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    _fails_with_one_line(capsys, [*base, str(corrupt)], "cannot read")
    wrong_shape = tmp_path / "shape.safetensors"
    save_file({"weight": torch.randn(4, 2, 5, 5)}, str(wrong_shape))
    _fails_with_one_line(capsys, [*base, str(wrong_shape)], r"shape \(4, 2, 5, 5\).*\(4, 2, 3, 3\)")
    no_weight = tmp_path / "empty.safetensors"
    save_file({"kernel": torch.randn(4, 2, 3, 3)}, str(no_weight))
    _fails_with_one_line(capsys, [*base, str(no_weight)], "'weight'")
    with_bias = tmp_path / "bias.safetensors"
    save_file({"weight": torch.randn(4, 2, 3, 3), "bias": torch.randn(4)}, str(with_bias))
    _fails_with_one_line(capsys, [*base, str(with_bias), "--no-bias"], "--no-bias")
    _fails_with_one_line(capsys, [*base, str(tmp_path)], "not a regular file")


def test_express_as_a_module_exits_2_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "attnconv", "express", "--in-channels", "4", "--groups", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --groups 3 must divide --in-channels 4"


def test_round_74_b_weights_that_are_not_finite_are_refused(tmp_path, capsys):
    """Round 74: `express --weights` of a NaN or inf weight (or bias) printed `relative error ... = nan` and a NaN
    leakage bound, exit 0; it is one line naming the tensor and the file, nothing measured."""
    argv = ["express", "--in-channels", "2", "--out-channels", "4", "--weights"]
    for name, tensors in (("weight", {"weight": torch.full((4, 2, 3, 3), float("nan"))}),
                          ("bias", {"weight": torch.randn(4, 2, 3, 3), "bias": torch.tensor([0, float("inf"), 0, 0])})):
        path = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(path))
        assert main([*argv, str(path)]) == 2
        err = capsys.readouterr().err
        assert f"'{name}' in {path} holds" in err and "NaN or infinite" in err and len(err.splitlines()) == 1
