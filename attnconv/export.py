"""A trained run as a file other tools load: torch.export, TorchScript or ONNX.

    from attnconv.export import export_run
    export_run("runs/sa", "onnx")            # runs/sa/model.onnx, checked with onnxruntime when it is installed

Every format takes normalized images (B, C, H, W) at the run's image size, any batch size, and
returns logits (B, classes); `Run.transform` (or `attnconv predict`) does the preprocessing.
Each file is loaded back after writing and its output compared with the model's.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path

import torch

from attnconv.errors import AttnconvError
from attnconv.fileio import atomic_write, check_output_file
from attnconv.runs import Run, as_run

FORMATS = {"exported": ".pt2", "torchscript": ".ts", "onnx": ".onnx"}
TOLERANCE = 1e-4  # max |logits difference| between the file and the model, float32


def export_run(run: Run | str | os.PathLike, fmt: str = "exported", out: str | os.PathLike | None = None, *,
               overwrite: bool = False) -> Path:
    """Write the run's model as `fmt` to `out` (default RUN_DIR/model.pt2 | .ts | .onnx) and check it.

    exported: `torch.export` (load with `torch.export.load(path).module()`); torchscript:
    `torch.jit.trace` (load with `torch.jit.load`); onnx: `torch.onnx.export` (needs the `onnx`
    and `onnxscript` packages; checked with onnxruntime when it is installed). The batch size is
    free in every format.
    """
    if fmt not in FORMATS:
        raise AttnconvError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "onnx":
        missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
        if missing:
            raise AttnconvError(f"--format onnx needs {' and '.join(missing)}: pip install {' '.join(missing)}")
    run = as_run(run)
    suffix = FORMATS[fmt]
    out = check_output_file(run.path / f"model{suffix}" if out is None else Path(out), "--out", (suffix,),
                            overwrite=overwrite)
    model, info = run.model.eval(), run.info
    example = torch.randn(2, info.channels, info.size, info.size, device=next(model.parameters()).device)
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and exporter notes about shape checks, not errors
        if fmt == "exported":
            program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}})
            atomic_write(out, lambda tmp: torch.export.save(program, str(tmp)))
        elif fmt == "torchscript":
            traced = torch.jit.trace(model, example, check_trace=False)
            atomic_write(out, lambda tmp: traced.save(str(tmp)))
        else:
            atomic_write(out, lambda tmp: torch.onnx.export(model, (example,), str(tmp), dynamo=True,
                                                            dynamic_shapes={"x": {0: batch}}, verbose=False))
        _check(out, fmt, model, torch.randn(3, *example.shape[1:], device=example.device))
    return out


def _check(path: Path, fmt: str, model: torch.nn.Module, x: torch.Tensor) -> None:
    """Load the written file and compare its logits with the model's on x (a batch size it was not traced at)."""
    want = model(x)
    if fmt == "exported":
        got = torch.export.load(str(path)).module()(x)
    elif fmt == "torchscript":
        got = torch.jit.load(str(path))(x)
    else:
        if importlib.util.find_spec("onnxruntime") is None:
            return  # written, not checked: onnxruntime is optional
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path))
        got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.cpu().numpy()})[0])
    diff = float((got.to(want) - want).abs().max())
    if not diff <= TOLERANCE:
        path.unlink(missing_ok=True)
        raise AttnconvError(f"{path}: the exported model's logits differ from the run's by {diff:.3g}; "
                            "nothing was kept (please report this)")
