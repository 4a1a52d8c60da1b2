"""`attnconv export`: torch.export, TorchScript and ONNX files that compute the run's logits at any batch size."""

import importlib.util
import os

import numpy as np
import pytest
import torch

from attnconv.cli import main
from attnconv.export import export_run
from attnconv.runs import Run


def _needs(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{', '.join(missing)} missing under CI: `make test` installs them (pyproject [test] extras)")
        pytest.skip(f"{', '.join(missing)} not installed")


@pytest.mark.parametrize("model", ["sa-quadratic", "sa-learned-content"])
@pytest.mark.parametrize("fmt", ["exported", "torchscript"])
def test_exported_files_load_and_match_the_model_at_another_batch_size(tiny_attention_runs, tmp_path, model, fmt):
    run = Run(tiny_attention_runs[model])
    path = export_run(run, fmt, tmp_path / f"m.{'pt2' if fmt == 'exported' else 'ts'}")
    loaded = torch.export.load(str(path)).module() if fmt == "exported" else torch.jit.load(str(path))
    x = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), run.model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", ["sa-quadratic", "sa-learned"])
def test_onnx_runs_in_onnxruntime_like_the_model(tiny_attention_runs, tmp_path, model):
    _needs("onnx", "onnxscript", "onnxruntime")
    import onnxruntime

    run = Run(tiny_attention_runs[model])
    path = export_run(run, "onnx", tmp_path / "m.onnx")
    session = onnxruntime.InferenceSession(str(path))
    for batch in (1, 4):
        x = torch.randn(batch, 1, 28, 28)
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        with torch.no_grad():
            np.testing.assert_allclose(got, run.model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_the_command_line_writes_next_to_the_run_and_never_over_a_users_file(tiny_attention_runs, capsys):
    run_dir = tiny_attention_runs["sa-quadratic"]
    target = run_dir / "model.ts"
    target.unlink(missing_ok=True)
    assert main(["export", str(run_dir), "--format", "torchscript"]) == 0
    assert capsys.readouterr().out.strip() == str(target) and target.exists()
    assert main(["export", str(run_dir), "--format", "torchscript"]) == 0  # attnconv's own export: replaced
    target.write_text("my notes\n")  # a user's file of that name: refused without --overwrite
    assert main(["export", str(run_dir), "--format", "torchscript"]) == 2
    assert "--overwrite" in capsys.readouterr().err and target.read_text() == "my notes\n"
    assert main(["export", str(run_dir), "--format", "torchscript", "--overwrite"]) == 0
    assert main(["export", str(run_dir), "--format", "exported", "--out", str(run_dir / "x.onnx")]) == 2
    assert "ending in .pt2" in capsys.readouterr().err
    target.unlink()


def test_onnx_without_its_packages_is_one_clear_line(tiny_attention_runs, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    assert main(["export", str(tiny_attention_runs["sa-quadratic"]), "--format", "onnx"]) == 2
    assert "pip install onnxscript" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["exported", "torchscript", "onnx"])
def test_an_export_takes_batches_past_one_tile_of_the_fused_path(fmt):
    """sa-quadratic with downsample 2 (make_config's default) on 32x32 images runs the fused path, which tiles a
    batch by 256 images with gradients on. Its tile was compared with the traced batch size even without them, so
    torch.export refused the batch range 1..65536 (`attnconv export` ended in its traceback, exit 1), and once it
    took the range torch found, the .pt2 failed at run time on any batch past 256 (a guard `min(256, B) >= B`)."""
    import io

    import attnconv
    from attnconv.export import _serialize

    model = attnconv.build_model("sa-quadratic", hidden=8, heads=2, layers=1, downsample=2, image_size=32,
                                 in_channels=3, num_classes=3).eval()
    record = {"generator": "attnconv test", "run": "run", "model": "sa-quadratic", "format": fmt}
    with torch.no_grad():
        data = _serialize(fmt, model, torch.randn(2, 3, 32, 32), record)
        if fmt == "exported":
            program = torch.export.load(io.BytesIO(data)).module()
        elif fmt == "torchscript":
            program = torch.jit.load(io.BytesIO(data))
        else:
            import onnxruntime

            session = onnxruntime.InferenceSession(data)
            def program(x):
                return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
        for batch in (1, 5, 257):
            x = torch.randn(batch, 3, 32, 32)
            torch.testing.assert_close(program(x), model(x), atol=1e-4, rtol=1e-4)
