"""A trained run as a file other tools load: torch.export, TorchScript or ONNX.

    from attnconv.export import export_run
    export_run("runs/sa", "onnx")            # runs/sa/model.onnx, checked with onnxruntime when it is installed

Every format takes normalized images (B, C, H, W) at the run's image size, any batch size, and
returns logits (B, classes); `Run.transform` (or `attnconv predict`) does the preprocessing.

One file, written once. The export is made in memory, loaded back from those bytes and its
output compared with the model's, and only then written (`fileio.atomic_write`: a temporary
beside it, renamed over the target), so a failure at any point (a full disk included) leaves
the earlier file as it was and no temporary, and what lands on disk is exactly what was
checked. ONNX keeps its weights inside the file (no external-data file beside it), which
protobuf allows up to 2 GB; larger models are refused before exporting. Each file says that
attnconv wrote it (`EXPORT_MARK`: an `attnconv.json` record in the .pt2 and .ts archives, the
ONNX model's doc_string and a "generator" metadata entry), so `fileio.written_by_attnconv`
recognises it and a rerun replaces it, while a user's file of the same name is refused
without --overwrite.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import attnconv
from attnconv.errors import AttnconvError, ParameterError, attnconv_warning, warnings_held, warnings_ignored
from attnconv.fileio import (
    EXPORT_MARK,
    SIGNATURE,
    atomic_write,
    check_output_file,
    describe_os_error,
    interrupts_held,
    write_bytes,
)
from attnconv.limits import format_bytes
from attnconv.modes import eval_mode
from attnconv.pathwords import resume_command
from attnconv.runs import WEIGHTS_FILE, Run, as_run, recorded_metadata
from attnconv.runs.logs_record import recorded_unfinished
from attnconv.runs.record import recorded_step
from attnconv.streams import unwrap

FORMATS = {"exported": ".pt2", "torchscript": ".ts", "onnx": ".onnx"}
TOLERANCE = 1e-4  # max |logits difference| between the file and the model, float32
ONNX_LIMIT = (2 << 30) - (16 << 20)  # protobuf's 2 GB for one message, less room for the graph


def export_run(run: Run | str | os.PathLike, fmt: str = "exported", out: str | os.PathLike | None = None, *,
               overwrite: bool = False) -> Path:
    """Write the run's model as `fmt` to `out` (default RUN_DIR/model.pt2 | .ts | .onnx) and check it.

    exported: `torch.export` (load with `torch.export.load(path).module()`); torchscript:
    `torch.jit.trace` (load with `torch.jit.load`); onnx: `torch.onnx.export` (needs the `onnx`
    and `onnxscript` packages; checked with onnxruntime when it is installed). The batch size is
    free in every format. An existing `out` is replaced if attnconv wrote it (or with `overwrite`).
    """
    if fmt not in FORMATS:
        raise ParameterError("fmt", fmt, f": choose one of {', '.join(FORMATS)}", shown=repr(fmt), flags={"fmt": "format"})
    if fmt == "onnx":
        missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
        if missing:
            raise ParameterError("fmt", fmt, f"needs {' and '.join(missing)}: pip install {' '.join(missing)}",
                                 flags={"fmt": "format"})
    run = as_run(run)
    run.same_run()  # a Run whose folder was replaced since: its network is not what the folder holds now
    suffix = FORMATS[fmt]
    out = check_output_file(run.path / f"model{suffix}" if out is None else out, "out", (suffix,),
                            overwrite=overwrite)
    metadata = recorded_metadata(run.path / WEIGHTS_FILE)
    if recorded_unfinished(metadata):  # said, as eval says it: the export holds a checkpoint, not the trained model
        step = recorded_step(metadata)
        attnconv_warning(f"{run.path}: the run has not finished; the export holds the weights of its latest checkpoint"
                         f"{'' if step is None else f' (step {step})'}: finish it with `{resume_command(run.path)}` "
                         "and export again for the trained model", 2)
    model = run.model  # exported in eval mode, each module's flag put back after (`modes.eval_mode`)
    if not isinstance(model, torch.nn.Module):
        raise AttnconvError(f"{run.path}: run.model is {type(model).__name__}, not a torch.nn.Module: an export "
                            "holds a module; put one in its place, or load the run again (attnconv.Run) for its own")
    own = run.own_model(model)
    if not own:  # a user's model: any forward (`*args`, another input name, torch.compile'd) taken as one positional
        model = _Logits(model)  # batch in, its logits out
    if fmt == "onnx":
        weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        if weights > ONNX_LIMIT:
            raise ParameterError(None, None, f"{run.path}: the model's weights take {format_bytes(weights)}, more than "
                                 "one ONNX file holds (2 GB); export it with {fmt} exported or torchscript instead",
                                 mentions=("fmt",), flags={"fmt": "format"})
    weight = run.model_weight(model, "export its weights")  # a user's cast or move followed
    like = {} if weight is None else {"device": weight.device, "dtype": weight.dtype}
    example = torch.randn(2, *run.input_shape, **like)
    record = {"generator": f"{SIGNATURE} {attnconv.__version__}", "run": str(run.path.resolve()),
              "model": run.config.model, "format": fmt}
    exporter_imported(fmt)
    with torch.no_grad(), eval_mode(model), _quiet(), _interruptible():
        try:
            data = _serialize(fmt, model, example, record)
        except (AttnconvError, MemoryError, KeyboardInterrupt):
            raise
        except Exception as err:  # torch could not trace or export this network: one line, not its traceback
            again = ("; an earlier export in this Python process was stopped by Ctrl-C, which can leave torch's "
                     "exporter half-loaded: run it again in a new process, or try another {fmt}"
                     if _INTERRUPTED else "; try another {fmt}")
            raise ParameterError(None, None, f"{run.path}: torch could not export the model as {fmt} "
                                 f"({_cause_line(err)}){again}", mentions=("fmt",),
                                 flags={"fmt": "format"}) from None
        for batch in (3, 1):  # batch sizes it was not traced at; one image too (a model may treat it otherwise)
            _check(data, out, fmt, model, torch.randn(batch, *example.shape[1:], **like), own)
    earlier = out.exists()
    try:
        atomic_write(out, write_bytes(data))
    except OSError as err:
        kept = " (an earlier file of that name is as it was)" if earlier else ""
        raise AttnconvError(f"{out}: could not write the export ({describe_os_error(err)}); nothing was "
                            f"written{kept}") from None
    return out


class _Logits(torch.nn.Module):
    """A model a user put in `run.model`, as an export takes it: one positional image batch in, the model's output
    out (its own forward may take `*args` or name its input otherwise; a torch.compile'd one is exported as its
    module)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = getattr(model, "_orig_mod", model)

    def forward(self, x: torch.Tensor) -> Any:
        return self.model(x)


# Set once a Ctrl-C stopped an export in this process: an import it cut short (sympy, torch._dynamo) stays
# half-done, so a later export's failure names that as the likely cause instead of torch's AttributeError alone.
_INTERRUPTED = False

# What each format's exporter imports on first use: imported whole before an export starts (`exporter_imported`).
EXPORTER_MODULES = {"exported": ("sympy", "torch._dynamo", "torch.export"), "torchscript": (),
                    "onnx": ("sympy", "torch._dynamo", "torch.export", "onnx", "onnxscript", "torch.onnx")}


def exporter_imported(fmt: str) -> None:
    """Import what the `fmt` exporter imports, with Ctrl-C held until every import is done (`fileio.interrupts_held`):
    a first export interrupted while torch imported onnxscript or sympy left a package half made for the rest of the
    process, and every later export in it failed ("module 'sympy' has no attribute 'core'; try another fmt")."""
    with interrupts_held():
        for name in EXPORTER_MODULES[fmt]:
            try:
                importlib.import_module(name)
            except ImportError:  # the exporter says what is missing in its own words, as before
                pass


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """A Ctrl-C while torch traces, exports and checks is one KeyboardInterrupt (the CLI's `interrupted`, 130),
    however torch wraps it: torch.export's tracer turns the KeyboardInterrupt raised in its frames into errors of
    its own (an AttributeError of torch._dynamo, a TypeError ending in KeyboardInterrupt), and may go on. The
    signal is noted here, and whatever the block then raises, or if it ends, a KeyboardInterrupt follows.
    Only Python's own Ctrl-C is taken over: a SIGINT the caller ignores or handles itself stays theirs."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    noted: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        global _INTERRUPTED
        noted.append(signum)
        _INTERRUPTED = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    except BaseException:
        if noted:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
    if noted:
        raise KeyboardInterrupt


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1f\x7f]")  # color codes and other controls
# The modules whose notes an export silences: the tracers and exporters (torch's, onnx's, onnxscript's, onnxruntime's),
# attnconv's model code they run, and the standard library's modules they warn through (torch's deprecations said
# from copyreg as the exporter deep-copies); another thread's warnings meanwhile are still said, a user's model's too.
_EXPORTERS = re.compile(r"(torch|onnx|onnxscript|onnxruntime|onnx_ir|attnconv|copy|copyreg|contextlib|functools|inspect"
                        r"|typing|dataclasses)(\.|$)")
_ONNX_PROSE = re.compile(r"\s*This is step \d+/\d+ of exporting the model to ONNX\..*$")  # its advice follows


def _cause_line(err: BaseException) -> str:
    """`Type: first line` of what torch raised at the bottom of its `raise ... from` chain (the ONNX exporter wraps
    torch.export's error in prose of its own), without terminal color codes or control characters, at most 300
    characters."""
    seen = {id(err)}
    while isinstance(err.__cause__, Exception) and id(err.__cause__) not in seen:
        err = err.__cause__
        seen.add(id(err))
    lines = [line.strip() for line in _ANSI.sub("", str(err)).splitlines()]
    first = _ONNX_PROSE.sub("", next((line for line in lines if line), "")).strip()
    return f"{type(err).__name__}: {first}"[:300] if first else type(err).__name__


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The tracers' and exporters' notes silenced, in this thread only: their warnings (shape checks, deprecations),
    their log lines (the ONNX exporter's "torchvision is not installed" at WARNING) and what they print (torch.export
    prints the partial FX graph of a failed export to sys.stderr: 77 lines before attnconv's own one); errors still
    raise, and attnconv's own line comes after. Other threads' output, warnings and log lines are said meanwhile, and
    the user's own warnings in this thread (their model's forward, traced) are said when the export is done. One
    export at a time in a process (torch.export's tracing state is the process's)."""
    with _EXPORT_LOCK, warnings_ignored(modules=_EXPORTERS), warnings_held(), _loggers_quiet(), _silent_output():
        yield


# torch.export's and the ONNX exporter's tracing state (fake-tensor modes, the patcher, the deserializer) is the
# process's: two exports at once fail each other.
_EXPORT_LOCK = threading.RLock()
_EXPORT_LOGGERS = ("torch", "onnx", "onnxscript", "onnx_ir", "onnxruntime", "attnconv")  # attnconv's: the traced model's


class _ThreadNotes(logging.Filter):
    """Drops the records below ERROR that `thread` logs on the exporters' logger trees (`_EXPORT_LOGGERS`: a handler
    sees every logger's): the exporters' notes; another thread's, and the user's loggers', are kept."""

    def __init__(self, thread: int):
        super().__init__()
        self.thread = thread

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread or record.levelno >= logging.ERROR \
            or record.name.split(".")[0] not in _EXPORT_LOGGERS


@contextlib.contextmanager
def _loggers_quiet() -> Iterator[None]:
    """The exporters' notes (records below ERROR that this thread logs on the `_EXPORT_LOGGERS` trees) dropped; other
    threads' records on them, and every record on the user's loggers, kept. A filter on every logger of those trees
    (a logger's filters see only the records logged on it) and on the handlers their records reach."""
    notes = _ThreadNotes(threading.get_ident())
    manager = logging.root.manager
    loggers = [logging.getLogger(name) for name in _EXPORT_LOGGERS] + [
        logger for name, logger in list(manager.loggerDict.items()) if isinstance(logger, logging.Logger)
        and name.split(".")[0] in _EXPORT_LOGGERS]
    # Loggers the exporters make during the first export (its modules imported then) have no filter: their records
    # reach their trees' handlers (torch's own, on its top logger), the root logger's, or Python's last resort, which
    # drop this thread's notes of those trees too.
    handlers = list({id(h): h for h in (*logging.root.handlers, logging.lastResort,
                                        *(h for logger in loggers for h in logger.handlers)) if h is not None}.values())
    for filtered in (*loggers, *handlers):
        filtered.addFilter(notes)
    try:
        yield
    finally:
        for filtered in (*loggers, *handlers):
            filtered.removeFilter(notes)


class _ThreadQuiet:
    """In place of sys.stdout or sys.stderr: what `thread` writes goes nowhere, every other thread's to the stream it
    stands for (`_stream`, as `streams.unwrap` finds it)."""

    def __init__(self, stream: Any, thread: int):
        self._stream, self.thread, self._done = stream, thread, False

    def write(self, text: str) -> int:
        if self._stream is None or (not self._done and threading.get_ident() == self.thread):
            return len(text)
        return self._stream.write(text)

    def flush(self) -> None:
        if self._stream is not None and (self._done or threading.get_ident() != self.thread):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _silent_output() -> Iterator[None]:
    """sys.stdout and sys.stderr to nothing for this thread (another thread's writes go where they went). Native code
    writing to the file descriptors themselves (onnxruntime's session notes) is told to be quiet instead (`_check`):
    pointing fds 1 and 2 at nothing would silence every thread of the process."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # what was written before goes out first
    quiet = (_ThreadQuiet(sys.stdout, threading.get_ident()), _ThreadQuiet(sys.stderr, threading.get_ident()))
    sys.stdout, sys.stderr = quiet
    try:
        yield
    finally:  # taken out wherever they sit (`main` in another thread may have wrapped them meanwhile)
        unwrap("stdout", quiet[0])
        unwrap("stderr", quiet[1])


def _dynamic_batch(export: Callable[[Any], Any]) -> Any:
    """`export(batch)` with the batch size dynamic up to 65,536; where torch cannot prove a guard of the traced network
    over that range (the export refuses it: e.g. a stride check `B * min(8, 128 * B) == 8 * B`, true for every batch
    of 1 or more), with the range torch finds (`Dim.AUTO`). Every format is checked at batches 1, 5 and 257 in
    tests/test_export.py."""
    try:
        return export(torch.export.Dim("batch", min=1, max=1 << 16))
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception:  # torch.export's UserError, or ONNX's error wrapping it: once more, torch choosing the range
        return export(torch.export.Dim.AUTO)


def _serialize(fmt: str, model: torch.nn.Module, example: torch.Tensor, record: dict[str, str]) -> bytes:
    """The export as the bytes of its file, made in memory (nothing on disk yet), marked as attnconv's."""
    buffer = io.BytesIO()
    if fmt == "exported":
        program = _dynamic_batch(lambda batch: torch.export.export(model, (example,), dynamic_shapes=({0: batch},)))
        torch.export.save(program, buffer, extra_files={EXPORT_MARK: json.dumps(record)})
        return buffer.getvalue()
    if fmt == "torchscript":
        traced = torch.jit.trace(model, example, check_trace=False)
        torch.jit.save(traced, buffer, _extra_files={EXPORT_MARK: json.dumps(record)})
        return buffer.getvalue()
    program = _dynamic_batch(lambda batch: torch.onnx.export(model, (example,), dynamo=True,
                                                             dynamic_shapes=({0: batch},), verbose=False))
    proto = program.model_proto  # the weights inside, as initializers with their data
    proto.doc_string = f"{record['generator']}: {record['model']} from {record['run']}"
    entry = proto.metadata_props.add()
    entry.key, entry.value = "generator", record["generator"]
    try:
        return proto.SerializeToString()
    except ValueError as err:  # over protobuf's 2 GB after all
        raise ParameterError(None, None, f"the ONNX model does not fit in one file ({err}); export it with {{fmt}} "
                             "exported or torchscript instead", mentions=("fmt",), flags={"fmt": "format"}) from None


def _check(data: bytes, out: Path, fmt: str, model: torch.nn.Module, x: torch.Tensor, own: bool) -> None:
    """Load the export from its bytes and compare its logits with the model's on x (a batch size it was not
    traced at); an export that differs is refused before anything is written. `own`: the model is the run's as
    loaded (`Run.own_model`), whose NaN outputs are the run's divergence."""
    try:
        want = model(x.clone())  # a clone each: a model that changes its input in place must not change the other's
    except (AttnconvError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - the model's own failure at another batch size: one line
        raise AttnconvError(f"{out}: nothing was written: the model fails on a batch of {len(x)} images "
                            f"({_cause_line(err)}); an export takes any batch size: give run.model a model that "
                            "does") from None
    if not isinstance(want, torch.Tensor) or not want.is_floating_point():
        what = type(want).__name__ if not isinstance(want, torch.Tensor) else f"a {want.dtype} tensor"
        raise AttnconvError(f"{out}: nothing was written: the model returns {what}, not its logits as one floating "
                            "tensor: give run.model a model that returns them")
    if not bool(want.isfinite().all()):  # the model's own outputs: no export can match them, and none is at fault
        if own:
            raise AttnconvError(f"{out}: nothing was written: the run's weights give NaN or infinite outputs (the run "
                                "diverged before this checkpoint); retrain it with a lower --lr")
        raise AttnconvError(f"{out}: nothing was written: run.model gives NaN or infinite outputs, and it is not the "
                            "run's model as loaded (another model, or the run's cast to another dtype): check what was "
                            "put in its place, or load the run again (attnconv.Run) for its own")
    if fmt == "onnx" and importlib.util.find_spec("onnxruntime") is None:
        return  # written, not checked: onnxruntime is optional
    try:
        got = _run_export(data, fmt, x.clone())
    except (AttnconvError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - the export made, but not runnable here: one line, nothing written
        cast = "" if fmt != "onnx" or x.dtype in (torch.float32, torch.float16) else (
            f"the model computes in {str(x.dtype).removeprefix('torch.')}, which onnxruntime may not run: cast it to "
            "float32 (run.model.float()), or ")
        raise ParameterError(None, None, f"{out}: nothing was written: the {fmt} export could not be run back to "
                             f"check it ({_cause_line(err)}); {cast}try another {{fmt}}", mentions=("fmt",),
                             flags={"fmt": "format"}) from None
    diff = float((got.to(want) - want).abs().max())
    # float32 logits within 1e-4; a model cast to a half type within its own rounding of the largest logit
    tolerance = TOLERANCE if want.dtype in (torch.float32, torch.float64) else \
        max(TOLERANCE, 16 * torch.finfo(want.dtype).eps * float(want.abs().max()))
    if not diff <= tolerance:
        raise AttnconvError(f"{out}: the exported model's logits differ from the {'run' if own else 'model'}'s by "
                            f"{diff:.3g}; nothing was "
                            "written (a model whose outputs depend on the batch size, one image apart, or change from "
                            "one call to the next cannot be exported as one file; else please report this)")


def _run_export(data: bytes, fmt: str, x: torch.Tensor) -> torch.Tensor:
    """The export in `data`, loaded from its bytes, run on x."""
    if fmt == "exported":
        return torch.export.load(io.BytesIO(data)).module()(x)
    if fmt == "torchscript":
        return torch.jit.load(io.BytesIO(data), map_location=x.device)(x)
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: its notes go to the process's stderr from native code
    session = onnxruntime.InferenceSession(data, sess_options=options)
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.cpu().numpy()})[0])
