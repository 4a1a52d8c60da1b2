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


def _content_cnn(in_channels=1, num_classes=10):
    """What `attnconv train --init-from CNN_RUN --init-content 4` trains (`runs.build.build_run_model`): a CIFAR
    ResNet-18 turned into learnable conv-attention with content attention, its query projections moved off zero
    (as training moves them) so that the content term counts."""
    import attnconv
    from attnconv.construct.learnable import LearnableConvAttention

    torch.manual_seed(0)
    cnn = attnconv.build_model("resnet18", width=2, in_channels=in_channels, num_classes=num_classes, image_size=28)
    model = attnconv.cnn_to_attention(cnn.eval(), fold_bn=False, alpha=3.0, learnable=True, key_dim=4)
    layers = [m for m in model.modules() if isinstance(m, LearnableConvAttention) and not m.position_only]
    assert layers and any(m.stride != (1, 1) for m in layers)
    with torch.no_grad():
        for m in layers:
            m.query.weight.normal_(0, 0.5)
    return model.eval()


@pytest.mark.parametrize("fmt", ["exported", "torchscript", "onnx"])
def test_a_cnn_turned_into_content_attention_exports_and_matches_at_any_batch(tiny_attention_runs, tmp_path, capfd,
                                                                              fmt):
    """An `--init-from CNN_RUN --init-content 4` run: its content layers sliced the padded grid at the first query,
    read as `int(tensor)`, a data-dependent value to torch.export, so `exported` and `onnx` failed
    (GuardOnDataDependentSymNode), torch printing a 77-line FX graph before attnconv's error line. That start is
    the layer's dilation * anchor, an int from its config: every format exports, and matches the model."""
    if fmt == "onnx":
        _needs("onnx", "onnxscript", "onnxruntime")
    run = Run(tiny_attention_runs["sa-quadratic"])  # 1x28x28 images, 10 classes
    run.__dict__["model"] = model = _content_cnn()  # the trained network, as `Run.model` caches it
    capfd.readouterr()
    path = export_run(run, fmt, tmp_path / f"m.{ {'exported': 'pt2', 'torchscript': 'ts', 'onnx': 'onnx'}[fmt]}")
    assert capfd.readouterr() == ("", "")  # nothing printed on the way
    if fmt == "exported":
        program = torch.export.load(str(path)).module()
    elif fmt == "torchscript":
        program = torch.jit.load(str(path))
    else:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path))

        def program(x):
            return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    for batch in (1, 2, 5):
        x = torch.randn(batch, 1, 28, 28)
        with torch.no_grad():
            torch.testing.assert_close(program(x), model(x), atol=1e-4, rtol=1e-4)


def _query_tokens_by_int_of_a_tensor(self, z, size):
    """`LearnableConvAttention._query_tokens` as it was: the first query's position read as `int(tensor)`."""
    out = self.output_size(size)
    pick = tuple(slice(q0, q0 + s * (n - 1) + 1, s) for q0, s, n in
                 zip((int(q[0]) for q in self._padded_query_axes(size, out)), self.stride, out))
    return z[(slice(None), slice(None), *pick)].flatten(2).transpose(1, 2)


@pytest.mark.parametrize("fmt", ["exported", "onnx"])
def test_a_network_torch_cannot_export_is_one_error_line_without_its_graph_or_colors(tiny_attention_runs, tmp_path,
                                                                                    capfd, monkeypatch, fmt):
    """torch.export prints the partial FX graph of a failed export to stderr (77 lines before attnconv's own), and
    the ONNX exporter's error opens with colored prose ("\\x1b[96mThis is step 1/3\\x1b[0m ... Next steps:"): one
    `error:` line quoting torch's own cause, nothing else, exit 2. (The network: a content layer that reads a
    tensor's value as an int, as they did.)"""
    import attnconv.export as export_module
    from attnconv.construct.learnable import LearnableConvAttention

    if fmt == "onnx":
        _needs("onnx", "onnxscript")
    monkeypatch.setattr(LearnableConvAttention, "_query_tokens", _query_tokens_by_int_of_a_tensor)
    run = Run(tiny_attention_runs["sa-quadratic"])
    run.__dict__["model"] = _content_cnn()
    monkeypatch.setattr(export_module, "as_run", lambda _: run)
    target = tmp_path / f"m{export_module.FORMATS[fmt]}"
    capfd.readouterr()
    assert main(["export", str(run.path), "--format", fmt, "--out", str(target)]) == 2
    out, err = capfd.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("error: "), err[:3000]
    assert "\x1b" not in err and "step 1/3" not in err and "Next steps" not in err, err
    assert f"could not export the model as {fmt} (GuardOnDataDependentSymNode: Could not extract" in err, err
    assert not target.exists()


@pytest.mark.parametrize("handler", ["ignored", "own"])
def test_an_export_leaves_a_sigint_it_does_not_own_alone(tiny_attention_runs, tmp_path, monkeypatch, handler):
    """The export turned Ctrl-C into its own KeyboardInterrupt whatever SIGINT was: a caller that ignores it (a
    background job, `nohup`) or handles it itself had its export stopped by a Ctrl-C meant for no one, or its own
    handler skipped. Only Python's default handler is taken over; others are in place during the export."""
    import signal

    import attnconv.export as export_module

    seen = []

    def mine(signum, frame):
        seen.append(signum)

    real = export_module._serialize

    def serialize(*args, **kwargs):
        seen.append(signal.getsignal(signal.SIGINT))
        return real(*args, **kwargs)

    monkeypatch.setattr(export_module, "_serialize", serialize)
    wanted = signal.SIG_IGN if handler == "ignored" else mine
    previous = signal.signal(signal.SIGINT, wanted)
    try:
        export_run(tiny_attention_runs["sa-quadratic"], "torchscript", tmp_path / "m.ts")
        assert seen == [wanted] and signal.getsignal(signal.SIGINT) is wanted
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_export_after_one_stopped_by_ctrl_c_names_that_as_the_likely_cause(tiny_attention_runs, tmp_path,
                                                                              monkeypatch, capsys):
    """A Ctrl-C during an export in Python can cut an import of torch's exporter short (sympy, torch._dynamo),
    after which every export of the process failed with a false cause ("module 'sympy' has no attribute
    'printing'"). The failure then says an earlier export was stopped, and to run it in a new process."""
    import attnconv.export as export_module

    def half_imported(*args, **kwargs):
        raise AttributeError("module 'sympy' has no attribute 'printing'")

    monkeypatch.setattr(export_module, "_serialize", half_imported)
    run = tiny_attention_runs["sa-quadratic"]
    assert main(["export", str(run), "--format", "exported", "--out", str(tmp_path / "a.pt2")]) == 2
    assert "new process" not in capsys.readouterr().err
    monkeypatch.setattr(export_module, "_INTERRUPTED", True)
    assert main(["export", str(run), "--format", "exported", "--out", str(tmp_path / "b.pt2")]) == 2
    err = capsys.readouterr().err
    assert "has no attribute 'printing'" in err and "stopped by Ctrl-C" in err and "in a new process" in err, err
