"""Every bad input is one line on stderr ("error: ..." naming the input and the fix), exit 2, no traceback.

One table: each case builds its bad input under tmp_path (most from a copy of a tiny
trained run), runs one command in-process, and checks the exit code, the single error
line and a piece of its text. Cases whose check must come before any long work name a
function that the command must not reach ("forbid"): it raises AssertionError, which
`attnconv.cli.main` does not turn into an error line.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures_runs import TINY, rerecord, train_folder_runs, train_tiny_runs, unrecord
from safetensors.torch import load_file, save_file

from attnconv.cli import main
from attnconv.errors import AttnconvError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A finished 2-step sa-quadratic run (7x7 token grid) and its 32 + 12 random images."""
    return train_tiny_runs(tmp_path_factory.mktemp("bad-inputs"), [("sa-quadratic", TINY)], epochs=1, max_steps=2)


# ------------------------------------------------------------------------------------ builders
# Each takes (tmp_path, the fixture's dict) and returns the names the argv templates use.


def _copy(tmp: Path, tiny) -> Path:
    run = tmp / "run"
    shutil.copytree(tiny["sa-quadratic"], run)
    return run


def a_file(tmp, tiny):
    (tmp / "run.txt").write_text("not a run\n")
    return {"run": tmp / "run.txt"}


def missing(tmp, tiny):
    return {"run": tmp / "nope"}


def a_run(tmp, tiny):
    return {"run": _copy(tmp, tiny), "data": tiny["data"]}


def config_folder(tmp, tiny):
    run = _copy(tmp, tiny)
    (run / "config.json").unlink()
    (run / "config.json").mkdir()
    return {"run": run}


def config_binary(tmp, tiny):
    run = _copy(tmp, tiny)
    (run / "config.json").write_bytes(bytes(range(128, 256)) * 8)
    return {"run": run}


def _edit_config(tmp, tiny, **changes):
    """config.json's "config" edited, in a run whose weights record nothing of config.json (`unrecord`; written
    before the record existed): config.json's own checks are the ones tested."""
    run = _copy(tmp, tiny)
    unrecord(run)
    meta = json.loads((run / "config.json").read_text())
    for key, value in changes.items():
        if key == "hidden":
            meta["config"]["model_overrides"]["hidden"] = value
        else:
            meta["config"][key] = value
    (run / "config.json").write_text(json.dumps(meta))
    return {"run": run}


def overrides_list(tmp, tiny):
    return _edit_config(tmp, tiny, model_overrides=[8, 2])


def hidden_huge(tmp, tiny):
    return _edit_config(tmp, tiny, hidden=10**7)


def unknown_model_in_config(tmp, tiny):
    return _edit_config(tmp, tiny, model="sa-nonexistent")


def metrics_binary(tmp, tiny):
    run = _copy(tmp, tiny)
    (run / "metrics.csv").write_bytes(bytes(range(128, 256)) * 8)
    return {"run": run}


def metrics_without_test_loss(tmp, tiny):
    run = _copy(tmp, tiny)
    path = run / "metrics.csv"
    path.write_text(path.read_text().replace("test_loss", "loss_on_test"))
    return {"run": run}


def _edit_state(tmp, tiny, edit):
    run = _copy(tmp, tiny)
    state = torch.load(run / "state.pt", weights_only=True)
    edit(state)
    torch.save(state, run / "state.pt")
    return {"run": run}


def state_string_step(tmp, tiny):
    return _edit_state(tmp, tiny, lambda s: s["progress"].update(step="two"))


def state_bad_rng(tmp, tiny):
    return _edit_state(tmp, tiny, lambda s: s["rng"].update(torch=[torch.zeros(3)]))


def state_random_bytes(tmp, tiny):
    run = _copy(tmp, tiny)
    noise = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    (run / "state.pt").write_bytes(bytes(noise.tolist()))
    return {"run": run}


class _RunsCode:
    """Unpickling this runs `touch marker` (what a malicious state.pt would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def state_malicious(tmp, tiny):
    run = _copy(tmp, tiny)
    marker = tmp / "code-ran"
    (run / "state.pt").write_bytes(pickle.dumps({"format": 1, "x": _RunsCode(marker)}, protocol=2))
    return {"run": run, "marker": marker}


def nan_weights(tmp, tiny):
    run = _copy(tmp, tiny)
    tensors = load_file(str(run / "model.safetensors"))
    name = next(k for k in sorted(tensors) if k.endswith("centers"))
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, str(run / "model.safetensors"))
    return {"run": run, "param": name}


def out_under_a_file(tmp, tiny):
    (tmp / "file.txt").write_text("a file, not a folder\n")
    return {"run": _copy(tmp, tiny), "under": tmp / "file.txt"}


def corrupt_fashion(tmp, tiny):
    data = tmp / "data"
    shutil.copytree(tiny["data"], data)
    images = data / "t10k-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-1])
    return {"run": _copy(tmp, tiny), "data": data}


def _weights_edited(tmp, tiny, edit):
    run = _copy(tmp, tiny)
    tensors = load_file(str(run / "model.safetensors"))
    name = sorted(k for k, t in tensors.items() if t.is_floating_point() and t.dim() == 2)[0]
    tensors[name] = edit(tensors[name])
    save_file(tensors, str(run / "model.safetensors"))
    return {"run": run, "param": name}


def weights_int32(tmp, tiny):
    return _weights_edited(tmp, tiny, lambda t: (t * 100).to(torch.int32))


def weights_bool(tmp, tiny):
    return _weights_edited(tmp, tiny, lambda t: t > 0)


def weights_float8(tmp, tiny):
    return _weights_edited(tmp, tiny, lambda t: t.to(torch.float8_e4m3fn))


def weights_float64(tmp, tiny):
    return _weights_edited(tmp, tiny, lambda t: t.double())


def weights_other_shape(tmp, tiny):
    return _weights_edited(tmp, tiny, lambda t: t[:, :-1].contiguous())


def weights_extra_tensor(tmp, tiny):
    run = _copy(tmp, tiny)
    tensors = load_file(str(run / "model.safetensors"))
    tensors["mine"] = torch.zeros(3)
    save_file(tensors, str(run / "model.safetensors"))
    return {"run": run}


def state_int_weights(tmp, tiny):
    def edit(state):
        name = sorted(k for k, t in state["model"].items() if t.is_floating_point())[0]
        state["model"][name] = state["model"][name].to(torch.int32)
    return _edit_state(tmp, tiny, edit)


def _edit_meta(tmp, tiny, edit, *, record: bool = False):
    """config.json edited by `edit(meta)`; the weights' record of config.json is taken out (`unrecord`: config.json's
    own checks are tested) unless `record` (the record is what is tested)."""
    run = _copy(tmp, tiny)
    if not record:
        unrecord(run)
    meta = json.loads((run / "config.json").read_text())
    edit(meta)
    (run / "config.json").write_text(json.dumps(meta))
    from PIL import Image

    Image.new("L", (28, 28), 100).save(tmp / "shirt.png")
    return {"run": run, "image": tmp / "shirt.png"}


def _data(**changes):
    def build(tmp, tiny):
        def edit(meta):
            for key, value in changes.items():
                if value is _DROP:
                    del meta["data"][key]
                else:
                    meta["data"][key] = value
        return _edit_meta(tmp, tiny, edit)
    return build


_DROP = object()


def converted_yes(tmp, tiny):
    return _edit_meta(tmp, tiny, lambda meta: meta.update(converted="yes"))


def converted_alpha_string(tmp, tiny):
    return _edit_meta(tmp, tiny, lambda meta: meta.update(converted={"from": "x", "fold_bn": True, "alpha": "big"}))


def data_not_an_object(tmp, tiny):
    return _edit_meta(tmp, tiny, lambda meta: meta.update(data=[1, 2]))


def config_nested_200000(tmp, tiny):
    run = _copy(tmp, tiny)
    (run / "config.json").write_text("[" * 200_000 + "]" * 200_000)
    return {"run": run}


def _edit_text(name: str, edit):
    """A builder: the run's `name` (text) replaced by `edit(text)`."""

    def build(tmp, tiny):
        run = _copy(tmp, tiny)
        (run / name).write_text(edit((run / name).read_text()))
        return {"run": run}

    return build


def _first_value(column: str, value: str):
    """An edit of metrics.csv: `column` of its first row set to `value`."""

    def edit(text: str) -> str:
        header, row, *rest = text.split("\n")
        cells = row.split(",")
        cells[header.split(",").index(column)] = value
        return "\n".join([header, ",".join(cells), *rest])

    return edit


def config_count(key: str, value):
    return lambda tmp, tiny: _edit_meta(tmp, tiny, lambda meta: meta.update({key: value}))


def override_unknown(tmp, tiny):
    return _edit_meta(tmp, tiny, lambda meta: meta["config"]["model_overrides"].update(colour=3))


def override_num_classes_99(tmp, tiny):
    return _edit_meta(tmp, tiny, lambda meta: meta["config"]["model_overrides"].update(num_classes=99))


def override_in_channels_2(tmp, tiny):
    return _edit_meta(tmp, tiny, lambda meta: meta["config"]["model_overrides"].update(in_channels=2))


def config_5000_digits(tmp, tiny):
    run = _copy(tmp, tiny)
    text = (run / "config.json").read_text()
    (run / "config.json").write_text(text.replace('"seed": 0', '"seed": ' + "9" * 5000, 1))
    return {"run": run}


# ---------------------------------------------------------------------------------------- table

TRAIN = ["--max-steps", "1", "--batch-size", "16", "--workers", "1", "--no-progress"]
def config_field(key: str, value):
    """A builder: config.json's training config with `key` set to `value` (out of its range or choices)."""
    return lambda tmp, tiny: _edit_meta(tmp, tiny, lambda meta: meta["config"].update({key: value}))


def state_progress(**changes):
    """A builder: state.pt's progress counters changed (each sound alone, not together or with the run)."""
    return lambda tmp, tiny: _edit_state(tmp, tiny, lambda s: s["progress"].update(changes))


def _row_fields(extra: str):
    """An edit of a CSV log: `extra` appended to its first row (fields the header does not have)."""

    def edit(text: str) -> str:
        lines = text.split("\n")
        lines[1] += extra
        return "\n".join(lines)

    return edit


RESUME = ["train", "--out", "{run}", "--resume", "--no-progress"]

CASES = [
    # id, builder, argv, message, forbid (a function the command must not reach)
    ("eval-run-is-a-file", a_file, ["eval", "{run}"], "not a run directory (it is a file)", None),
    ("table-run-is-a-file", a_file, ["table", "{run}"], "not a run directory (it is a file)", None),
    ("analyze-run-is-a-file", a_file, ["analyze", "{run}"], "not a run directory (it is a file)", None),
    ("convert-run-is-a-file", a_file, ["convert", "{run}", "--out", "{tmp}/new"], "not a run directory (it is a file)",
     None),
    ("report-run-is-a-file", a_file, ["report", "{run}"], "not a run directory (it is a file)", None),
    ("plot-run-is-a-file", a_file, ["plot", "centers", "{run}"], "not a run directory (it is a file)", None),
    ("train-init-from-a-file", a_file, ["train", "--init-from", "{run}", "--out", "{tmp}/attn", *TRAIN],
     "not a run directory (it is a file)", None),
    ("eval-missing-run", missing, ["eval", "{run}"], "not a run directory (no such directory)", None),
    ("table-missing-run", missing, ["table", "{run}"], "not a run directory (no such directory)", None),
    ("report-missing-run", missing, ["report", "{run}"], "not a run directory (no such directory)", None),
    ("config-json-is-a-folder", config_folder, ["eval", "{run}"],
     "config.json: corrupt run config (not a regular file: a directory)", None),
    ("config-json-is-binary", config_binary, ["table", "{run}"], "config.json: corrupt run config (binary data", None),
    ("config-overrides-a-list", overrides_list, ["eval", "{run}"], "field model_overrides is [8, 2], expected an object",
     None),
    ("config-hidden-10**7", hidden_huge, ["analyze", "{run}"],
     "config.json: hidden 10000000 is invalid: give a whole number from 1 to 65536", None),
    ("config-unknown-model", unknown_model_in_config, ["eval", "{run}"], "unknown model 'sa-nonexistent'", None),
    ("metrics-binary-report", metrics_binary, ["report", "{run}", "--out", "{tmp}/r.html"],
     "metrics.csv: corrupt metrics file (binary data", None),
    ("metrics-binary-table", metrics_binary, ["table", "{run}"], "metrics.csv: corrupt metrics file (binary data", None),
    ("metrics-no-test-loss-report", metrics_without_test_loss, ["report", "{run}", "--out", "{tmp}/r.html"],
     "corrupt metrics file (no test_loss column)", None),
    ("metrics-no-test-loss-table", metrics_without_test_loss, ["table", "{run}"],
     "corrupt metrics file (no test_loss column)", None),
    ("state-string-step", state_string_step, RESUME, "progress step is 'two', not a whole number", None),
    ("state-bad-rng", state_bad_rng, RESUME, "random number generator states are not ByteTensors", None),
    ("state-random-bytes", state_random_bytes, RESUME, "state.pt: cannot read the training state: the file is corrupt",
     None),
    ("state-malicious-pickle", state_malicious, RESUME, "asks for posix.system, which a training state never holds",
     None),
    ("report-out-under-a-file", out_under_a_file, ["report", "{run}", "--out", "{under}/r.html"],
     "file.txt is a file, not a folder; choose another location", "attnconv.report.build_report"),
    ("plot-out-under-a-file", out_under_a_file, ["plot", "centers", "{run}", "--out", "{under}/c.png"],
     "file.txt is a file, not a folder", "attnconv.runs.load_run"),
    ("express-plot-under-a-file", out_under_a_file, ["express", "--plot", "{under}/h.png"],
     "file.txt is a file, not a folder", "attnconv.cli.express.conv_to_attention"),
    ("learn-conv-out-under-a-file", out_under_a_file,
     ["learn-conv", "--source", "random", "--steps", "5", "--out", "{under}/lc"], "file.txt is a file, not a folder",
     "torch.optim.Adam"),
    ("express-size-100000", missing, ["express", "--size", "100000"],
     "--size 100000 with a 3x3 kernel and 4 -> 4 channels: needs about", "attnconv.cli.express.conv_to_attention"),
    ("learn-conv-size-5000", missing, ["learn-conv", "--source", "random", "--size", "5000", "--out", "{tmp}/lc"],
     "--size 5000 with --channels 8, --heads 9, --batch-size 32: needs about", "attnconv.learnconv.SelfAttention2d"),
    ("analyze-nan-weights", nan_weights, ["analyze", "{run}"],
     "the run's weights hold NaN/inf (parameter {param}); the run diverged: retrain it with a lower --lr", None),
    ("report-nan-weights", nan_weights, ["report", "{run}"], "hold NaN/inf (parameter {param})", None),
    ("plot-nan-weights", nan_weights, ["plot", "maps", "{run}"], "hold NaN/inf (parameter {param})", None),
    ("eval-missing-data-dir", a_run, ["eval", "{run}", "--data-dir", "{tmp}/no-data"],
     "--data-dir {tmp}/no-data: no such directory", None),
    ("learn-conv-missing-data-dir", missing, ["learn-conv", "--data-dir", "{tmp}/no-data", "--out", "{tmp}/lc"],
     "--data-dir {tmp}/no-data: no such directory", "attnconv.learnconv.SelfAttention2d"),
    ("express-plot-txt", missing, ["express", "--plot", "{tmp}/h.txt"],
     "--plot {tmp}/h.txt: give a file name ending in .png, .svg, .pdf", "attnconv.cli.express.conv_to_attention"),
    ("plot-query-negative-separate", a_run, ["plot", "maps", "{run}", "--query", "-1,0"],
     "--query -1,0 is outside the 7x7 token grid", None),
    ("plot-query-negative-joined", a_run, ["plot", "maps", "{run}", "--query=-1,0"],
     "--query -1,0 is outside the 7x7 token grid", None),
    ("eval-corrupt-fashion-mnist", corrupt_fashion, ["eval", "{run}", "--data-dir", "{data}"],
     "t10k-images-idx3-ubyte", None),
    ("train-unknown-model", missing,
     ["train", "--preset", "fmnist-sa-quadratic", "--model", "sa-nope", "--out", "{tmp}/x"],
     "unknown model 'sa-nope'", None),
    ("train-unknown-preset", missing, ["train", "--preset", "cifar-nope", "--out", "{tmp}/x"],
     "unknown preset 'cifar-nope'", None),
    # Flags without bounds crashed, hung or printed tracebacks; every numeric flag now has a range (cli.RANGES).
    ("train-workers-100000", missing, ["train", "--preset", "fmnist-sa-quadratic", "--workers", "100000",
                                       "--out", "{tmp}/x"], "--workers 100000 is out of range", "torch.set_num_threads"),
    ("train-workers-5000", missing, ["train", "--preset", "fmnist-sa-quadratic", "--workers", "5000",
                                     "--out", "{tmp}/x"], "--workers 5000 is out of range", "torch.set_num_threads"),
    ("train-seed-2**66", missing, ["train", "--preset", "fmnist-sa-quadratic", "--seed", "99999999999999999999",
                                   "--out", "{tmp}/x"], "--seed 99999999999999999999 is out of range", None),
    ("train-milestones-empty", missing, ["train", "--preset", "fmnist-resnet-small", "--milestones", ",",
                                         "--out", "{tmp}/x"], "expected comma-separated fractions", None),
    ("eval-device-tpu", a_run, ["eval", "{run}", "--device", "tpu"], "--device 'tpu' is not a device", None),
    ("report-device-tpu", a_run, ["report", "{run}", "--device", "tpu"], "--device 'tpu' is not a device", None),
    ("explore-device-tpu", a_run, ["explore", "{run}", "--device", "tpu", "--no-browser"],
     "--device 'tpu' is not a device", None),
    ("explore-port-70000", a_run, ["explore", "{run}", "--port", "70000", "--no-browser"],
     "--port 70000 is out of range", None),
    ("lr-nan", missing, ["learn-conv", "--lr", "nan", "--out", "{tmp}/lc"], "--lr nan is out of range", None),
    # Silent wrong weights: load_state_dict casts whatever dtype it is given, so the file's dtypes are checked.
    ("eval-weights-int32", weights_int32, ["eval", "{run}"],
     "weights do not fit model 'sa-quadratic' (tensor {param} is int32, the model's is float32)", None),
    ("analyze-weights-bool", weights_bool, ["analyze", "{run}"], "(tensor {param} is bool, the model's is float32)",
     None),
    ("eval-weights-float8", weights_float8, ["eval", "{run}"],
     "(tensor {param} is float8_e4m3fn, the model's is float32)", None),
    ("report-weights-float64", weights_float64, ["report", "{run}", "--out", "{tmp}/r.html"],
     "(tensor {param} is float64, the model's is float32)", None),
    ("eval-weights-other-shape", weights_other_shape, ["eval", "{run}"], "(tensor {param} has shape", None),
    ("eval-weights-extra-tensor", weights_extra_tensor, ["eval", "{run}"],
     "(tensor mine is not one of the model's)", None),
    ("resume-state-int-weights", state_int_weights, RESUME, "is torch.int32, the model's is torch.float32", None),
    # Run files read without checks: config.json's "data" and "converted" blocks, its nesting.
    ("predict-data-size-missing", _data(size=_DROP), ["predict", "{run}", "{image}"],
     'corrupt run config ("data" has no size)', None),
    ("predict-data-size-abc", _data(size="abc"), ["predict", "{run}", "{image}"],
     'corrupt run config ("data" size "abc" is not a whole number from 1 to 65536)', None),
    ("predict-data-classes-empty", _data(classes=[]), ["predict", "{run}", "{image}"],
     '"data" classes [] is not a list of distinct class names', None),
    ("predict-data-std-zero", _data(std=[0]), ["predict", "{run}", "{image}"],
     '"data" std [0] is not one number above 0, at most 1 per channel (1)', None),
    ("eval-data-mean-two-channels", _data(mean=[0.1, 0.2]), ["eval", "{run}"],
     '"data" mean [0.1, 0.2] is not one number from 0 to 1 per channel (1)', None),
    ("predict-data-mean-minus-1e308", _data(mean=[-1e308]), ["predict", "{run}", "{image}"],
     '"data" mean [-1e+308] is not one number from 0 to 1 per channel (1)', None),
    ("eval-data-std-1e308", _data(std=[1e308]), ["eval", "{run}"],
     '"data" std [1e+308] is not one number above 0, at most 1 per channel (1)', None),
    ("eval-data-channels-2", _data(channels=2), ["eval", "{run}"], '"data" channels 2 is not 1 or 3', None),
    ("eval-data-a-list", data_not_an_object, ["eval", "{run}"], '"data" is [1, 2], not an object', None),
    ("eval-converted-yes", converted_yes, ["eval", "{run}"], '"converted" is "yes", not an object', None),
    ("report-converted-yes", converted_yes, ["report", "{run}", "--out", "{tmp}/r.html"],
     '"converted" is "yes", not an object', None),
    ("table-converted-yes", converted_yes, ["table", "{run}"], '"converted" is "yes", not an object', None),
    ("analyze-converted-alpha", converted_alpha_string, ["analyze", "{run}"],
     '"converted" alpha "big" is not null or a finite number > 0', None),
    ("eval-config-nested-200000", config_nested_200000, ["eval", "{run}"],
     "corrupt run config (not JSON: nested too deeply to be read)", None),
    # The checked readers, one level further: metrics.csv's counts, config.json's counts and overrides, long numbers.
    ("table-metrics-epoch-1e999", _edit_text("metrics.csv", _first_value("epoch", "1e999")), ["table", "{run}"],
     "metrics.csv: corrupt metrics file (line 2: epoch inf is not a whole number >= 0)", None),
    ("table-metrics-epoch-minus-1", _edit_text("metrics.csv", _first_value("epoch", "-1")), ["table", "{run}"],
     "metrics.csv: corrupt metrics file (line 2: epoch -1.0 is not a whole number >= 0)", None),
    ("report-metrics-step-2.5", _edit_text("metrics.csv", _first_value("step", "2.5")),
     ["report", "{run}", "--out", "{tmp}/r.html"], "(line 2: step 2.5 is not a whole number >= 0)", None),
    ("table-config-parameters-abc", config_count("parameters", "abc"), ["table", "{run}"],
     'corrupt run config (parameters "abc" is not a whole number >= 0)', None),
    ("report-config-steps-per-epoch-minus-1", config_count("steps_per_epoch", -1),
     ["report", "{run}", "--out", "{tmp}/r.html"], "corrupt run config (steps_per_epoch -1 is not a whole number", None),
    ("eval-config-world-size-x", config_count("world_size", "x"), ["eval", "{run}"],
     'corrupt run config (world_size "x" is not a whole number >= 1)', None),
    ("resume-config-log-every-0", config_count("log_every", 0), RESUME,
     "corrupt run config (log_every 0 is not a whole number >= 1)", None),
    # a built-in dataset's name over a "data" block of other classes (a folder run's renamed "cifar10" was read,
    # and its download advised, as CIFAR-10; a fashion-mnist run's as CIFAR-10 gave a shape error naming no file)
    ("table-config-dataset-of-other-classes", lambda tmp, tiny: _edit_meta(tmp, tiny, lambda meta: meta["config"].update(
        dataset="cifar10")), ["table", "{run}"],
     'corrupt run config (config.dataset "cifar10" has ["airplane", "automobile", "bird", "cat"... classes, its '
     '"data" block ["T-shirt/top", "Trouser", "Pullover", "... (one of the two was edited))', None),
    ("eval-config-unknown-override", override_unknown, ["eval", "{run}"],
     "config.json: model 'sa-quadratic' has no option 'colour'; leave it out", None),
    # The model's classes or channels edited apart from the "data" block they came from: config.json is named,
    # not the weights that no longer fit the model.
    ("eval-config-num-classes-99", override_num_classes_99, ["eval", "{run}"],
     'corrupt run config (model_overrides num_classes 99 does not match the', None),
    ("predict-config-in-channels-2", override_in_channels_2, ["predict", "{run}", "{image}"],
     'corrupt run config (model_overrides in_channels 2 does not match the', None),
    ("eval-config-5000-digits", config_5000_digits, ["eval", "{run}"],
     "corrupt run config (not JSON: a number of 5000 digits)", None),
    # The next round: config.json's fields out of range (read as sound, or blamed on a flag the user did not give),
    # metrics.csv rows of the wrong width or an accuracy out of [0, 1], state.pt counters that do not fit together.
    ("table-config-epochs-minus-5", config_field("epochs", -5), ["table", "{run}"],
     "corrupt run config (field epochs -5 is invalid: give a whole number from 1 to 1e+06)", None),
    ("eval-config-optimizer-lion", config_field("optimizer", "lion"), ["eval", "{run}"],
     "corrupt run config (field optimizer 'lion' is invalid: choose one of sgd, adamw)", None),
    ("resume-config-workers-100000", config_field("workers", 100000), RESUME,
     "config.json: corrupt run config (field workers 100000 is invalid: give a whole number from 1 to 256)", None),
    ("resume-config-lr-nan", config_field("lr", float("nan")), RESUME,
     "corrupt run config (field lr nan is invalid: give a positive number; the range: from 1e-12 to 1e+38)", None),
    ("table-metrics-test-acc-2.5", _edit_text("metrics.csv", _first_value("test_acc", "2.5")), ["table", "{run}"],
     "metrics.csv: corrupt metrics file (line 2: test_acc 2.5 is not an accuracy from 0 to 1)", None),
    ("table-metrics-row-too-long", _edit_text("metrics.csv", _row_fields(",9")), ["table", "{run}"],
     "corrupt metrics file (line 2: 10 fields, the header has 9)", None),
    ("report-metrics-header-twice", _edit_text("metrics.csv", lambda t: t + t.split("\n")[0] + "\n"),
     ["report", "{run}", "--out", "{tmp}/r.html"], "corrupt metrics file (line 3: epoch 'epoch' is not a number)",
     None),
    ("resume-steps-accuracy-minus-3", _edit_text("steps.csv", lambda t: t + "1,0,0.5,-3,0.1,10,0.1\n"), RESUME,
     "steps.csv: corrupt steps log (line 2: accuracy -3.0 is not an accuracy from 0 to 1)", None),
    ("resume-state-past-the-run", state_progress(step=10**12, finished=False), RESUME,
     "state.pt: the training state does not fit this run (at step 1000000000000, at or past the run's 2 steps, yet not "
     "finished)", None),
    ("resume-state-past-the-epochs-data-change", state_progress(step=10**12, finished=False),  # counted in epochs
     [*RESUME, "--allow-data-change"], "state.pt: the training state does not fit this run (at step 1000000000000 "
     "(epoch 2 of 1), at or past the run's end, yet not finished); restore it from a copy", None),
    ("resume-state-finished-early", state_progress(step=1), RESUME,
     "state.pt: the training state does not fit this run (finished at step 1, before the run's last step 2)", None),
    ("resume-state-epoch-500", state_progress(epoch=500), RESUME,
     "the file is corrupt (progress step 2 is fewer than its epoch 500 and batch 0 took)", None),
    ("resume-state-loss-sum-10-to-400", state_progress(loss_sum=10**400), RESUME,  # was an OverflowError traceback
     "the file is corrupt (progress loss_sum is 1000000000000000000000000000000000000..., not a finite number >= 0)",
     None),
    ("resume-state-step-past-the-first-epochs-batch", state_progress(epoch=0, batch=1, rows=1), RESUME,  # trained
     "the file is corrupt (progress step 2 is not its batch 1 of the first epoch)", None),  # on, other numbers
    ("resume-state-rows-10-to-17", state_progress(rows=10**17), RESUME,  # was blamed on metrics.csv
     "the file is corrupt (progress rows 100000000000000000 does not fit its ", None),
    ("resume-state-loss-sum-minus-1", state_progress(loss_sum=-1.0), RESUME,  # trained on: a wrong epoch row
     "the file is corrupt (progress loss_sum is -1.0, not a finite number >= 0)", None),
    ("resume-state-correct-past-seen", state_progress(correct=5.0), RESUME,
     "the file is corrupt (progress correct 5 is more than the 0 images seen)", None),
    ("resume-state-seen-not-its-batches", state_progress(seen=7.0), RESUME,
     "the file is corrupt (progress seen 7 is not the ", None),
    ("resume-state-counts-no-rows", state_progress(rows=0, snapshots=1), RESUME,  # finished, so it wrote a row
     "the file is corrupt (progress rows 0 does not fit its 1 epochs done, finished)", None),
    ("resume-state-a-row-mid-epoch", state_progress(rows=2, snapshots=2, finished=False), RESUME,  # was blamed
     "the file is corrupt (progress rows 2 does not fit its 1 epochs done, not finished)", None),  # on metrics.csv
]


def _not_regular(name: str, kind: str):
    """A builder: the run's `name` replaced by a named pipe ("fifo") or a link to /dev/zero ("device")."""

    def build(tmp, tiny):
        run = _copy(tmp, tiny)
        (run / name).unlink()
        if kind == "fifo":
            os.mkfifo(run / name)
        else:
            (run / name).symlink_to("/dev/zero")
        return {"run": run}

    return build


def fifo_image(tmp, tiny):
    os.mkfifo(tmp / "photo.png")
    return {"run": _copy(tmp, tiny), "image": tmp / "photo.png"}


def fifo_in_folder_dataset(tmp, tiny):
    from PIL import Image

    for split in ("train", "test"):
        for cls in ("a", "b"):
            (tmp / "imgs" / split / cls).mkdir(parents=True)
            Image.new("L", (8, 8), 100).save(tmp / "imgs" / split / cls / "1.png")
    os.mkfifo(tmp / "imgs" / "train" / "b" / "2.png")
    return {"folder": tmp / "imgs"}


PIPE = "a named pipe (FIFO)"
HANG_CASES = [
    # A named pipe blocks whoever opens it for reading until a writer comes; /dev/zero never ends.
    ("eval-weights-fifo", _not_regular("model.safetensors", "fifo"), ["eval", "{run}"],
     f"model.safetensors is {PIPE}, not a regular file"),
    ("report-weights-fifo", _not_regular("model.safetensors", "fifo"), ["report", "{run}", "--out", "{tmp}/r.html"],
     f"model.safetensors is {PIPE}, not a regular file"),
    ("analyze-weights-device", _not_regular("model.safetensors", "device"), ["analyze", "{run}"],
     "model.safetensors is a character device, not a regular file"),
    ("resume-state-fifo", _not_regular("state.pt", "fifo"), RESUME, f"state.pt is {PIPE}, not a regular file"),
    ("resume-state-device", _not_regular("state.pt", "device"), RESUME,
     "state.pt is a character device, not a regular file"),
    ("init-from-weights-fifo", _not_regular("model.safetensors", "fifo"),
     ["train", "--init-from", "{run}", "--out", "{tmp}/attn", *TRAIN], f"model.safetensors is {PIPE}"),
    ("eval-config-fifo", _not_regular("config.json", "fifo"), ["eval", "{run}"],
     f"config.json: corrupt run config (not a regular file: {PIPE})"),
    ("table-metrics-fifo", _not_regular("metrics.csv", "fifo"), ["table", "{run}"],
     f"metrics.csv: corrupt metrics file (not a regular file: {PIPE})"),
    ("compare-metrics-fifo", _not_regular("metrics.csv", "fifo"), ["compare", "{run}"],  # was 'holds no run'
     f"metrics.csv: corrupt metrics file (not a regular file: {PIPE})"),
    ("plot-heads-fifo", _not_regular("heads.jsonl", "fifo"), ["plot", "distance", "{run}", "--out", "{tmp}/d.png"],
     f"heads.jsonl: corrupt heads file (not a regular file: {PIPE})"),
    ("predict-image-fifo", fifo_image, ["predict", "{run}", "{image}"], f"photo.png is {PIPE}, not an image file"),
    ("train-folder-with-a-fifo", fifo_in_folder_dataset,
     ["train", "--preset", "fmnist-resnet-small", "--dataset", "folder:{folder}", "--out", "{tmp}/out", *TRAIN],
     f"2.png is {PIPE}, not an image file"),
]


@pytest.fixture
def no_hang():
    """Fail a test that blocks for 60 s instead of hanging the suite (SIGALRM interrupts a blocking open)."""
    import signal

    def stop(signum, frame):
        raise TimeoutError("the command blocked for 60 s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("build, argv, message", [c[1:] for c in HANG_CASES], ids=[c[0] for c in HANG_CASES])
def test_hangs_a_file_that_is_no_regular_file_is_one_error_line(tiny, tmp_path, capsys, no_hang, build, argv,
                                                               message):
    names = {"tmp": tmp_path, **build(tmp_path, tiny)}
    capsys.readouterr()
    code = main([a.format(**names) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert message.format(**names) in lines[0]
    parts = [part.strip("() ") for part in lines[0].split(";")]
    assert len(parts) == len(set(parts)), f"a part of the message is repeated: {lines[0]}"


def test_open_regular_refuses_a_fifo_swapped_in_after_the_check(tmp_path, monkeypatch, no_hang):
    """The kind is checked again on the opened descriptor: a pipe swapped in after the first check cannot block."""
    import attnconv.fileio as fileio

    path = tmp_path / "weights"
    os.mkfifo(path)
    real = os.stat
    monkeypatch.setattr(fileio.os, "stat", lambda p, *a, **k: real(tmp_path / "plain") if p == path else real(p))
    (tmp_path / "plain").write_bytes(b"x")
    with pytest.raises(AttnconvError, match="is a named pipe"):
        fileio.open_regular(path, "fix")
    assert fileio.read_regular(tmp_path / "plain", "fix") == b"x"


@pytest.mark.parametrize("build, argv, message, forbid", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line_exit_2(tiny, tmp_path, capsys, monkeypatch, build, argv, message, forbid):
    names = {"tmp": tmp_path, **build(tmp_path, tiny)}
    if forbid is not None:
        module, _, attr = forbid.rpartition(".")

        def reached(*args, **kwargs):
            raise AssertionError(f"{forbid} was reached: the bad input must be refused before this work")

        monkeypatch.setattr(f"{module}.{attr}", reached)
    capsys.readouterr()
    code = main([a.format(**names) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message.format(**names) in lines[0]
    assert "weights_only=False" not in err and "weights_only` set to `False`" not in err
    if "marker" in names:
        assert not names["marker"].exists(), "unpickling state.pt ran code"


def test_eval_of_nan_weights_warns_in_one_line_naming_the_parameter(tiny, tmp_path, capsys):
    names = nan_weights(tmp_path, tiny)
    assert main(["eval", str(names["run"])]) == 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ")
    assert f"hold NaN/inf (parameter {names['param']})" in lines[0] and "lower --lr" in lines[0]
    assert "test acc" in captured.out


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root writes into read-only folders; the file-as-parent cases cover this as root")
def test_read_only_output_folder_is_refused_before_the_work(tiny, tmp_path, capsys, monkeypatch):
    run = _copy(tmp_path, tiny)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    monkeypatch.setattr("attnconv.report.build_report", lambda *a, **k: pytest.fail("built before checking --out"))
    try:
        assert main(["report", str(run), "--out", str(locked / "r.html")]) == 2
    finally:
        locked.chmod(0o755)
    err = capsys.readouterr().err
    assert "not writable; give this user the permission (chmod), or choose another location" in err
    assert len(err.strip().splitlines()) == 1


def test_no_command_writes_over_a_runs_files_or_a_users_file(tmp_path, capsys):
    """Every command that writes a file: a run's own files are refused always, a user's file unless --overwrite."""
    from attnconv.fileio import check_output_file

    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.json", "metrics.csv", "model.safetensors", "state.pt", "heads.jsonl"):
        (run / name).write_text("x")
    user = tmp_path / "mine"
    user.mkdir()
    for name in ("a.png", "a.svg", "a.pdf", "a.json", "a.md", "a.html", "learn-conv.json"):
        (user / name).write_text("mine")
    before = {p: p.read_bytes() for p in [*run.iterdir(), *user.iterdir()]}
    argv = [
        ["plot", "distance", str(run), "--out", str(user / "a.png")],
        ["plot", "centers", str(run), "--out", str(user / "a.svg")],
        ["plot", "maps", str(run), "--out", str(user / "a.pdf")],
        ["express", "--plot", str(user / "a.png")],
        ["bench", "--only", "matmul", "--json", str(user / "a.json")],
        ["bench", "--only", "matmul", "--markdown", str(user / "a.md")],
        ["bench", "--only", "matmul", "--json", str(run / "config.json")],
        ["learn-conv", "--out", str(user), "--steps", "1"],
    ]
    for args in argv:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("attnconv did not write it" in err or "a file of the attnconv run" in err
                                         or "is not a regular file" in err), (args, err)
    with pytest.raises(AttnconvError, match="a file of the attnconv run"):
        check_output_file(run / "heads.jsonl", "out", (), overwrite=True)  # never, even when asked
    assert {p: p.read_bytes() for p in [*run.iterdir(), *user.iterdir()]} == before


def test_an_output_that_is_a_link_is_named_as_one_and_overwrite_replaces_the_link_itself(tmp_path, capsys):
    """An output path that is a link (to a file, to nothing, a loop) is refused naming the link and where it leads;
    --overwrite replaces the link itself, with the mode a new file gets (not the linked file's), and the linked
    file is left as it was. A folder in its place is named as a folder."""
    import os
    import stat

    target = tmp_path / "theirs.png"
    target.write_bytes(b"theirs")
    target.chmod(0o755)
    (tmp_path / "to_file.png").symlink_to(target)
    (tmp_path / "to_nothing.png").symlink_to(tmp_path / "nowhere.png")
    (tmp_path / "loop.png").symlink_to(tmp_path / "loop.png")
    (tmp_path / "folder.json").mkdir()
    cases = {"to_file.png": f"is a link to {target}; choose another name (or pass --overwrite to replace the link "
                            "itself: nothing is written through it)",
             "to_nothing.png": "which does not exist; choose another name",
             "loop.png": "which loops back through links"}
    for name, words in cases.items():
        assert main(["express", "--plot", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, (name, err)
    assert main(["bench", "--only", "matmul", "--json", str(tmp_path / "folder.json")]) == 2
    assert "is a directory" in capsys.readouterr().err
    old = os.umask(0o022)
    try:
        assert main(["express", "--plot", str(tmp_path / "to_file.png"), "--overwrite"]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    written = tmp_path / "to_file.png"
    assert not written.is_symlink() and written.read_bytes()[:4] == b"\x89PNG"
    assert stat.S_IMODE(written.stat().st_mode) == 0o644  # the umask's mode, not the linked file's 0755
    assert target.read_bytes() == b"theirs" and stat.S_IMODE(target.stat().st_mode) == 0o755


def test_every_numeric_flag_of_every_command_has_a_range():
    from attnconv.cli import build_parser, numeric_flags, ranges

    missing = sorted({f"{' '.join(cmd)} {a.option_strings[-1]}" for cmd, a in numeric_flags(build_parser())
                      if a.dest not in ranges()})
    assert missing == [], f"give these flags a range (a config field's option(), or attnconv.cli._CLI_RANGES): {missing}"


def test_a_reader_that_leaves_early_ends_the_command_quietly(monkeypatch, capfd, tmp_path):
    """`attnconv eval RUN | head`: the command's output fails with a broken pipe once head has left: exit 141
    (128 + SIGPIPE), nothing on stderr (it used to print 'error: Broken pipe')."""
    import sys

    import attnconv.cli as cli

    def write_to_a_closed_pipe(*args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "check_ranges", write_to_a_closed_pipe)
    with open(tmp_path / "stdout", "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert cli.main(["eval", "some-run"]) == 141
    assert capfd.readouterr().err == ""


# ------------------------------------------------------------------ run files read with checks: heads.jsonl

_DAMAGE = {
    "center-x": lambda rec: rec["layers"][0][0].update(center="x"),
    "center-3d": lambda rec: rec["layers"][0][0].update(center=[1.0, 2.0, 3.0]),
    "center-nan": lambda rec: rec["layers"][0][0].update(center=[float("nan"), 0.0]),
    # finite, but past any grid: the grid matching of analyze and report ran for ever (distances overflowed)
    "center-1e155": lambda rec: rec["layers"][0][0].update(center=[1e155, 0.0]),
    "distance-1e308": lambda rec: rec["layers"][0][0].update(attention_distance=1e308),
    "alpha-1e308": lambda rec: rec["layers"][0][0].update(alpha=1e308),
    # an integer past any float (JSON reads 10**400): an OverflowError traceback in the range checks
    "center-10-to-400": lambda rec: rec["layers"][0][0].update(center=[10**400, 0]),
    "epoch-10-to-400": lambda rec: rec.update(epoch=10**400),
    "no-attention-distance": lambda rec: rec["layers"][1][2].pop("attention_distance"),
    "epoch-1e308": lambda rec: rec.update(epoch=1e308),
    "step-negative": lambda rec: rec.update(step=-1),
    "alpha-string": lambda rec: rec["layers"][0][1].update(alpha="wide"),
    "a-layer-less": lambda rec: rec["layers"].pop(),
    "nested-200000": None,
}


def _damaged_heads(tmp, tiny, damage: str) -> Path:
    """A copy of the tiny run whose heads.jsonl gets a damaged line 2 between two sound ones."""
    run = _copy(tmp, tiny)
    path = run / "heads.jsonl"
    lines = path.read_text().splitlines()
    if _DAMAGE[damage] is None:
        bad = "[" * 200_000 + "]" * 200_000
    else:
        record = json.loads(lines[-1])
        _DAMAGE[damage](record)
        bad = json.dumps(record)
    path.write_text("\n".join([lines[0], bad, *lines[1:]]) + "\n")
    return run


@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_run_files_read_with_checks_damaged_heads_lines_are_skipped_with_one_warning(tiny, tmp_path, capsys,
                                                                                     damage):
    from attnconv.runs import read_heads

    run = _damaged_heads(tmp_path, tiny, damage)
    sound = len((run / "heads.jsonl").read_text().splitlines()) - 1
    with pytest.raises(AttnconvError, match=r"heads.jsonl: corrupt heads file \(line 2: "):  # what resume reads: all
        read_heads(run)
    capsys.readouterr()
    assert main(["plot", "distance", str(run), "--out", str(tmp_path / "d.png")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"warning: {run / 'heads.jsonl'}: skipped 1 damaged line (2); using the other {sound}"]
    assert (tmp_path / "d.png").stat().st_size > 0


def test_run_files_read_with_checks_a_heads_line_cut_short_is_named_where_it_is_skipped(tiny, tmp_path, capsys):
    """A last heads.jsonl line cut short (a crash mid-write) was left out of plots, reports and the explorer without
    a word, where a whole damaged line is named. It is named the same way (resuming trims it, as before)."""
    from attnconv.runs import read_heads

    run = _copy(tmp_path, tiny)
    path = run / "heads.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines) + "\n" + lines[-1][: len(lines[-1]) // 2])
    assert len(read_heads(run)) == len(lines)  # what resume reads: the whole lines
    capsys.readouterr()
    assert main(["plot", "distance", str(run), "--out", str(tmp_path / "d.png")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"warning: {path}: skipped 1 damaged line ({len(lines) + 1}); using the other {len(lines)}"]


def test_run_files_read_with_checks_analyze_report_and_explorer_skip_damaged_heads_lines(tiny, tmp_path, capsys):
    from attnconv.explorer.server import Explorer

    run = _damaged_heads(tmp_path, tiny, "center-3d")
    for argv in (["analyze", str(run)], ["report", str(run), "--out", str(tmp_path / "r.html")]):
        capsys.readouterr()
        assert main(argv) == 0, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"warning: {run / 'heads.jsonl'}: skipped 1 damaged line (2); using the other 2"], argv
    with pytest.warns(UserWarning, match="skipped 1 damaged line"):
        explorer = Explorer(run, images=2, data_dir=tiny["data"])
    snapshots = explorer.heads()["snapshots"]  # the page's epoch slider: the two sound snapshots
    assert [s["epoch"] for s in snapshots] == [json.loads(line)["epoch"] for line in
                                               (tiny["sa-quadratic"] / "heads.jsonl").read_text().splitlines()]


def test_run_files_read_with_checks_a_byte_order_mark_is_read_as_text(tiny, tmp_path, capsys):
    """An editor on Windows saves UTF-8 with a byte-order mark: config.json, metrics.csv and heads.jsonl read
    the same with one (it was "not JSON", "no epoch column" and a skipped first snapshot)."""
    from attnconv.runs import read_config, read_heads, read_metrics

    run = _copy(tmp_path, tiny)
    for name in ("config.json", "metrics.csv", "heads.jsonl"):
        (run / name).write_bytes(b"\xef\xbb\xbf" + (run / name).read_bytes())
    original = tiny["sa-quadratic"]
    assert read_config(run) == read_config(original)
    assert read_metrics(run) == read_metrics(original)
    assert read_heads(run) == read_heads(original) != []
    capsys.readouterr()
    assert main(["plot", "distance", str(run), "--out", str(tmp_path / "d.png")]) == 0
    assert capsys.readouterr().err == ""


def test_run_files_read_with_checks_heads_with_no_sound_line_is_one_error(tiny, tmp_path, capsys):
    """Every line of heads.jsonl damaged: nothing is left to skip to, so one error line (it was a warning
    "using the other 0" and then an error, or a warning and exit 0), from every command that reads it."""
    run = _copy(tmp_path, tiny)
    path = run / "heads.jsonl"
    path.write_text(path.read_text().replace('"attention_distance":', '"attention_distance":NaN,"x":'))
    for argv in (["plot", "distance", str(run), "--out", str(tmp_path / "d.png")], ["analyze", str(run)]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {path}: corrupt heads file (no sound snapshot in it"), err


@pytest.mark.parametrize("change", ["a-head-more", "a-head-less", "a-layer-more"])
def test_run_files_read_with_checks_heads_that_do_not_fit_the_model_are_one_error(tiny, tmp_path, capsys, change):
    """Every line of heads.jsonl consistent with the others but not with config.json's model (an edit, or a file
    copied from another run): one error naming the file and both shapes, from every command that reads it (it was
    read as sound: `analyze` listed 0/2 heads of a one-head layer and exited 0)."""
    run = _copy(tmp_path, tiny)
    path = run / "heads.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    model = [len(layer) for layer in records[0]["layers"]]
    for record in records:
        layers = record["layers"]
        if change == "a-head-more":
            layers[0].append(dict(layers[0][0]))
        elif change == "a-head-less":
            layers[-1].pop() if len(layers[-1]) > 1 else layers.pop()
        else:
            layers.append([dict(head) for head in layers[-1]])
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    for argv in (["plot", "distance", str(run), "--out", str(tmp_path / "d.png")], ["analyze", str(run)],
                 ["compare", str(run)]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {path}: corrupt heads file (its snapshots hold "), err
        assert "the run's model in config.json has" in err[0] and str(model[0]) in err[0], err
    assert not (tmp_path / "d.png").exists()


def _metrics_lines(run: Path) -> list[str]:
    return (run / "metrics.csv").read_text().splitlines()


def _with_field(line: str, header: str, name: str, value: str) -> str:
    fields, names = line.split(","), header.split(",")
    fields[names.index(name)] = value
    return ",".join(fields)


_METRICS_EDITS = {  # name: (new lines from (header, row), what the one error line says)
    "rows-out-of-order": (lambda h, r: [h, _with_field(r, h, "epoch", "2"), r],
                          "corrupt metrics file (line 3: epoch 1 after epoch 2; each row's epoch must be larger"),
    "an-epoch-twice": (lambda h, r: [h, r, _with_field(r, h, "test_acc", "0.9")],
                       "corrupt metrics file (line 3: epoch 1 after epoch 1;"),
    "a-column-twice": (lambda h, r: [h + ",test_acc", r + ",0.99"],
                       'corrupt metrics file (the header names column "test_acc" twice)'),
    "seconds-negative": (lambda h, r: [h, _with_field(r, h, "seconds", "-5")],
                         "corrupt metrics file (line 2: seconds -5.0 is negative)"),
    "past-the-run": (lambda h, r: [h, _with_field(_with_field(r, h, "epoch", "7"), h, "step", "21")],
                     "corrupt metrics file (its last row, of epoch 7, lies past the run's 1 epoch in config.json); "
                     "restore it (or config.json, if that was edited) from a copy"),
}


@pytest.mark.parametrize("edit", sorted(_METRICS_EDITS))
def test_run_files_read_with_checks_metrics_rows_that_contradict_each_other_or_the_run_are_one_error(
        tiny, tmp_path, capsys, edit):
    """metrics.csv rows out of order, an epoch twice, a column twice, a negative duration, a row past the run's
    length in config.json: `table` printed one of the contradicting values (or -5 s an epoch, or 7 epochs of a
    1-epoch run) and exited 0; now one line naming the file and the row."""
    run = _copy(tmp_path, tiny)
    header, row = _metrics_lines(run)
    change, says = _METRICS_EDITS[edit]
    (run / "metrics.csv").write_text("\n".join(change(header, row)) + "\n")
    for argv in (["table", str(run)],):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {run / 'metrics.csv'}: {says}"), err
        assert "restore it" in err[0] and "from a copy" in err[0], err


@pytest.mark.parametrize("ends", ["\r\n", "\r"])
def test_run_files_read_with_checks_metrics_and_steps_with_other_line_ends_read_the_same(tiny, tmp_path, ends):
    """An editor on Windows (CRLF) or an old Mac (CR) saves the logs: read as they were (CR alone read no row:
    `table` said 0 epochs)."""
    from attnconv.runs import read_metrics, read_steps

    run = _copy(tmp_path, tiny)
    _write_steps(run, [1, 2])
    before = read_metrics(run), read_steps(run)
    for name in ("metrics.csv", "steps.csv"):
        path = run / name
        path.write_bytes(path.read_bytes().replace(b"\n", ends.encode()))
    assert (read_metrics(run), read_steps(run)) == before
    assert len(before[0]) == 1 and len(before[1]) == 2


def _write_steps(run: Path, steps: list[int]) -> None:
    """steps.csv with a row at each of `steps` (the tiny run logs none: it has 2 steps, a row every 100)."""
    header = (run / "steps.csv").read_text().splitlines()[0]
    rows = [f"{s},1,2.3,0.1,0.001,100.0,{0.5 * s}" for s in steps]
    (run / "steps.csv").write_text("\n".join([header, *rows]) + "\n")


def test_run_files_read_with_checks_steps_out_of_order_are_one_error(tiny, tmp_path):
    from attnconv.runs import read_steps

    run = _copy(tmp_path, tiny)
    _write_steps(run, [2, 1])
    with pytest.raises(AttnconvError, match=r"steps.csv: corrupt steps log \(line 3: step 1 after step 2; "):
        read_steps(run)


def test_run_files_read_with_checks_a_heads_snapshot_past_the_run_is_one_error(tiny, tmp_path, capsys):
    """A snapshot of epoch 9 in a 1-epoch run: `analyze` listed it and exited 0."""
    run = _copy(tmp_path, tiny)
    path = run / "heads.jsonl"
    last = json.loads(path.read_text().splitlines()[-1])
    path.write_text(path.read_text() + json.dumps({**last, "epoch": 9, "step": 27}) + "\n")
    for argv in (["analyze", str(run)], ["plot", "distance", str(run), "--out", str(tmp_path / "d.png")]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: {path}: corrupt heads file (a snapshot of epoch 9 lies past the run's 1 epoch in "
                       "config.json); restore it (or config.json, if that was edited) from a copy, or delete it (the "
                       "heads' history is then unknown)"], err


@pytest.mark.parametrize("order", ["0,0,1", "0,1,1", "1,0", "steps-down"])
def test_run_files_read_with_checks_heads_snapshots_out_of_order_are_skipped_or_refused(tiny, tmp_path, capsys,
                                                                                         order):
    """Snapshots are written one an epoch, in order: one repeated or out of order (epoch 0 twice, epochs 0,3,1,2,
    a step going down) was listed as the file held it by `analyze` and served by the explorer; now it is a damaged
    line, skipped with one warning by what needs only some snapshots, refused by `read_heads` (resume)."""
    from attnconv.runs import read_heads

    run = _copy(tmp_path, tiny)
    path = run / "heads.jsonl"
    first, last = (json.loads(line) for line in path.read_text().splitlines()[:2])
    lines = {"0,0,1": [first, first, last], "0,1,1": [first, last, last], "1,0": [first, last, first],
             "steps-down": [first, last, {**last, "epoch": last["epoch"] + 1, "step": 0}]}[order]
    path.write_text("".join(json.dumps(record) + "\n" for record in lines))
    with pytest.raises(AttnconvError, match=r"heads.jsonl: corrupt heads file \(line 3: epoch .* after epoch .*; each "
                                            r"snapshot is of a later epoch and step than the one before\)"
                       if order != "0,0,1" else r"\(line 2: epoch 0 at step 0 after epoch 0 at step 0; "):
        read_heads(run)
    capsys.readouterr()
    assert main(["analyze", str(run)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: {path}: skipped 1 damaged line"), err


@pytest.mark.parametrize("name", ["cat\u200b", "\u202edog", "cat\u2028dog", "cat\ud800"])
def test_run_files_read_with_checks_invisible_characters_in_class_names_are_printed_as_escapes(tiny, tmp_path,
                                                                                               capfd, name):
    """A class name with a zero-width space (read as another class's name), a direction override (the line shown
    reversed), a line separator, or a lone surrogate (a UnicodeEncodeError traceback): printed as escapes."""
    run = _copy(tmp_path, tiny)
    config = json.loads((run / "config.json").read_text())
    config["data"]["classes"] = [name, *config["data"]["classes"][1:]]
    config["config"]["dataset"] = f"folder:{tmp_path / 'images'}"  # a class folder of that name (no built-in has it)
    (run / "config.json").write_text(json.dumps(config))
    rerecord(run)  # as a run trained on that folder
    script = ("import sys\nfrom attnconv.cli import main\nsys.exit(main(sys.argv[1:]))")
    raw = torch.zeros(1, 1, 28, 28, dtype=torch.uint8)
    image = tmp_path / "img.png"
    from PIL import Image
    Image.fromarray(raw[0, 0].numpy()).save(image)
    proc = subprocess.run([sys.executable, "-c", script, "predict", str(run), str(image), "--top", "10"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    shown = name.encode("ascii", "backslashreplace").decode()
    assert shown in proc.stdout, proc.stdout
    assert not any(not c.isprintable() for c in proc.stdout.replace("\n", "")), proc.stdout



# ------------------------------------------------------------------ run files read with checks: the fourth round


def _one_error(argv, capsys) -> str:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and captured.out == "", captured
    return lines[0]


def test_run_files_read_with_checks_parameters_are_counted_not_taken_from_config(tiny, tmp_path, capsys):
    """config.json's "parameters" 0 (an edit): `table` showed `params 0`; the count is the architecture's."""
    from attnconv.evaluate import describe_run

    true = describe_run(tiny["sa-quadratic"])["params"]
    run = _edit_meta(tmp_path, tiny, lambda meta: meta.update(parameters=0))["run"]
    assert true > 0 and describe_run(run)["params"] == true
    tables = []
    for path in (tiny["sa-quadratic"], run):
        capsys.readouterr()
        assert main(["table", str(path)]) == 0
        tables.append(capsys.readouterr().out)
    assert tables[0] == tables[1], tables


@pytest.mark.parametrize("block", ["converted", "init_from"])
def test_run_files_read_with_checks_a_conversion_block_on_a_model_without_convolution(tiny, tmp_path, capsys, block):
    """"converted" {} on an sa-quadratic run was read as sound; an init_from was refused as a flag's mistake
    without a fix. Both are one corrupt-run-config line, from commands that load the weights and those that do not."""
    def edit(meta):
        if block == "converted":
            meta["converted"] = {}
        else:
            meta["config"]["init_from"] = {"run": "/nonexistent", "alpha": 3, "fold_bn": False}
    run = _edit_meta(tmp_path, tiny, edit)["run"]
    for argv in (["eval", run], ["table", run]):
        line = _one_error(argv, capsys)
        assert line.startswith(f"error: {run / 'config.json'}: corrupt run config (") and "no convolution" in line
        assert line.endswith("; restore it from a copy, or train the run again"), line


@pytest.mark.parametrize("key", ["hidden\u200b", "hid\nden", "x" * 300])
def test_run_files_read_with_checks_any_unknown_override_key_is_named_escaped(tiny, tmp_path, capsys, key):
    """A model override key with a zero-width space leaked Python's `unexpected keyword argument` (the key
    raw); any unknown key now says the model has no such option, the key escaped and shortened."""
    run = _edit_meta(tmp_path, tiny, lambda meta: meta["config"]["model_overrides"].update({key: 8}))["run"]
    line = _one_error(["eval", run], capsys)
    assert "model 'sa-quadratic' has no option '" in line and "unexpected keyword" not in line, line
    assert key not in line and key.isprintable() == (key[:10] in line) and len(line) < 400, line


@pytest.mark.parametrize("field, value", [("dataset", "folder:" + "a" * 100_000), ("data_dir", "/" + "b" * 100_000),
                                          ("dataset", "folder:/tmp/" + "c" * 300), ("data_dir", "/tmp/x\u0000y"),
                                          ("dataset", "folder:/" + "\u00e9/" * 2044)])  # 4,096 characters, 6,132 bytes
def test_run_files_read_with_checks_long_strings_and_impossible_paths_in_config(tiny, tmp_path, capsys, field,
                                                                               value):
    """config.dataset of 100,000 characters gave a 100 kB line from an OSError, config.json not named: strings are
    limited where config.json is read, and so are the names in its paths; the line names the field, short."""
    run = _edit_meta(tmp_path, tiny, lambda meta: meta["config"].update({field: value}))["run"]
    line = _one_error(["eval", run], capsys)
    assert line.startswith(f"error: {run / 'config.json'}: corrupt run config (config.{field} "), line
    assert len(line) < 400, len(line)


def test_run_files_read_with_checks_a_long_folder_that_is_gone_is_shown_by_its_ends(tiny, tmp_path, capsys):
    """A run's image folder of 4,094 bytes (within the limits) that no longer exists: the line showed the path
    whole, twice (5,651 characters); now by its two ends."""
    folder = "/" + "\u00e9/" * 1364 + "a"
    run = _edit_meta(tmp_path, tiny, lambda meta: meta["config"].update(dataset="folder:" + folder))["run"]
    line = _one_error(["eval", run], capsys)
    assert "no longer exists (moved or deleted); point at the images with --dataset folder:PATH" in line, line
    assert "..." in line and line.count("\u00e9/\u00e9/\u00e9/") < 100 and len(line) < 700, len(line)


def test_run_files_read_with_checks_an_os_error_line_shows_a_long_path_shortened(monkeypatch, capsys):
    """The last-resort OSError line: a path of thousands of characters is shown by its two ends."""
    import attnconv.cli as cli

    def fail(*args):
        raise OSError(36, "File name too long", "/" + "d" * 4000)

    monkeypatch.setattr(cli, "check_ranges", fail)
    assert cli.main(["eval", "some-run"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.endswith("ddd: File name too long") and "..." in line and len(line) < 300, line


@pytest.mark.parametrize("name", ["\x1b[2J\x1b[31mcat", "", "dog\x85", "\x7f"])
def test_run_files_read_with_checks_class_names_with_control_characters(tiny, tmp_path, capsys, name):
    """Class names with terminal escapes were printed raw by `predict`: a name empty or holding a control
    character (C0, DEL, C1) is a corrupt "data" block."""
    names = _data(classes=[name, "dog" if name != "dog\x85" else "cat", *[f"c{i}" for i in range(8)]])(tmp_path, tiny)
    line = _one_error(["predict", names["run"], names["image"]], capsys)
    assert 'corrupt run config ("data" class name "' in line and "\x1b" not in line, line


def test_run_files_read_with_checks_what_commands_print_is_escaped(tiny, tmp_path, capsys):
    """What `predict` and `eval` print to stdout goes through the escaping of error lines: an image file name
    with a terminal escape is shown as `\\x1b`, never raw."""
    from PIL import Image

    run = _copy(tmp_path, tiny)
    image = tmp_path / "a\x1b[2Jb.png"
    Image.new("L", (28, 28), 100).save(image)
    capsys.readouterr()
    assert main(["predict", str(run), str(image)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "a\\x1b[2Jb.png: " in out, out
    assert main(["eval", str(run)]) == 0
    out = capsys.readouterr().out
    assert "test acc" in out and all(line.isprintable() for line in out.splitlines()), out


def test_run_files_read_with_checks_state_of_another_run_is_blamed_on_state(tiny, tmp_path, capsys):
    """state.pt of a run of another model size: the line blamed config.json although config.json and
    model.safetensors agree; it now names state.pt as foreign with its fix. When the weights do not fit
    either, config.json is still the one blamed."""
    (tmp_path / "big").mkdir()
    big = train_tiny_runs(tmp_path / "big", [("sa-quadratic", dict(TINY, hidden=16))], epochs=1, max_steps=2)
    run = _copy(tmp_path, tiny)
    shutil.copy(big["sa-quadratic"] / "state.pt", run / "state.pt")
    line = _one_error(RESUME[:2] + [str(run)] + RESUME[3:], capsys)  # state.pt's record says whose it is
    assert line.startswith(f"error: {run / 'config.json'} does not describe the run state.pt was written for ("), line
    assert "config.model_overrides.hidden 8 in config.json, 16 in the record of state.pt" in line, line
    unrecord(big["sa-quadratic"])  # a state.pt written before the record: its tensors tell
    shutil.copy(big["sa-quadratic"] / "state.pt", run / "state.pt")
    line = _one_error(RESUME[:2] + [str(run)] + RESUME[3:], capsys)
    assert f"{run / 'state.pt'} does not fit the model that {run / 'config.json'} describes (" in line, line
    assert ("while model.safetensors does: state.pt is not this run's; restore it from a copy of this run "
            "(without it the run cannot be resumed: train it again into a new --out, or over this one with "
            "--overwrite)") in line and "if config.json was edited" not in line, line
    shutil.copy(big["sa-quadratic"] / "model.safetensors", run / "model.safetensors")  # no record either
    line = _one_error(RESUME[:2] + [str(run)] + RESUME[3:], capsys)
    assert "if config.json was edited, restore it" in line and "not this run's" not in line, line


@pytest.mark.parametrize("name", ["fmnist", "fmnist\u200b"])
def test_run_files_read_with_checks_a_dataset_no_one_has_is_config_jsons_error(tiny, tmp_path, capsys, name):
    """config.dataset edited to a name no dataset has: `unknown dataset 'fmnist'` named neither config.json nor
    the fix; now it is a corrupt run config, read before anything is loaded."""
    run = _edit_meta(tmp_path, tiny, lambda meta: meta["config"].update(dataset=name))["run"]
    line = _one_error(["eval", run], capsys)
    assert line.startswith(f"error: {run / 'config.json'}: corrupt run config (unknown dataset "), line
    assert "restore it from a copy" in line and "\u200b" not in line.replace("\\u200b", ""), line


_KEEP_SHAPES = {  # edits of config.json that change what the weights compute but no tensor's shape
    "data.std": lambda meta: meta["data"].update(std=[0.5]),
    "data.mean": lambda meta: meta["data"].update(mean=[0.3]),
    "data.size": lambda meta: meta["data"].update(size=32),
    "config.model_overrides.attn_dropout": lambda meta: meta["config"]["model_overrides"].update(attn_dropout=0.5),
    "config.epochs": lambda meta: meta["config"].update(epochs=3),
    "config.seed": lambda meta: meta["config"].update(seed=1),  # as weights copied from the run of another seed
}


@pytest.mark.parametrize("field", sorted(_KEEP_SHAPES))
def test_run_files_read_with_checks_an_edit_that_keeps_the_shapes_is_named(tiny, tmp_path, capsys, field):
    """An edit of config.json that keeps every tensor's shape (a normalization, a class name, an option, the
    epochs, the dataset) gave other numbers with exit 0 (only a converted run's alpha was caught).
    model.safetensors records config.json as it was written (`runs.record`): `eval`, `predict`, `table`
    (which reads no weights but their header) and `--resume` name the field."""
    names = _edit_meta(tmp_path, tiny, _KEEP_SHAPES[field], record=True)
    run = names["run"]
    for argv in (["eval", run, "--data-dir", tiny["data"]], ["predict", run, names["image"]], ["table", run],
                 RESUME[:2] + [run] + RESUME[3:]):
        line = _one_error(argv, capsys)
        assert line.startswith(f"error: {run / 'config.json'} does not describe the run model.safetensors was "
                               f"written for ({field} "), line
        assert line.endswith("one of the two was edited or copied from another run: restore it from a copy of the "
                             "run (or, if config.json was edited, set those fields back to the record's values)"), line


def test_run_files_read_with_checks_a_class_renamed_in_a_folder_run_is_named(tmp_path, capsys):
    """Two class names swapped in a folder run's config.json (names no built-in dataset fixes): `predict` gave
    the other class's name with exit 0. The weights' record names the edit; `table` too."""
    runs = train_folder_runs(tmp_path, [("sa-quadratic", TINY)])
    run = runs["sa-quadratic"]
    meta = json.loads((run / "config.json").read_text())
    meta["data"]["classes"] = meta["data"]["classes"][::-1]
    (run / "config.json").write_text(json.dumps(meta))
    image = next(p for p in sorted(runs["data"].rglob("*.png")))
    for argv in (["predict", run, image], ["table", run]):
        line = _one_error(argv, capsys)
        assert line.startswith(f"error: {run / 'config.json'} does not describe the run model.safetensors was "
                               "written for (data.classes "), line


def test_run_files_read_with_checks_the_record_itself_is_checked(tiny, tmp_path, capsys):
    """A record that is not a JSON object is model.safetensors' error; weights with no record (written before
    it existed) are read as before, and an edit that changes nothing of the record's fields passes."""
    from safetensors.torch import load_file, save_file

    from attnconv.runs import RECORD_KEY

    run = _copy(tmp_path, tiny)
    weights = run / "model.safetensors"
    tensors = load_file(weights)
    save_file(tensors, weights, metadata={RECORD_KEY: "[1, 2"})
    line = _one_error(["eval", run, "--data-dir", tiny["data"]], capsys)
    assert line == (f"error: {weights}: corrupt weights file (its record of config.json is not a JSON object); "
                    "restore it from a copy of the run"), line
    save_file(tensors, weights, metadata={"model": "sa-quadratic"})  # as weights written before the record
    meta = json.loads((run / "config.json").read_text())
    meta["config"]["model_overrides"]["attn_dropout"] = 0.5
    (run / "config.json").write_text(json.dumps(meta))
    assert main(["eval", str(run), "--data-dir", str(tiny["data"])]) == 0
    (tmp_path / "again").mkdir()
    again = _copy(tmp_path / "again", tiny)
    meta = json.loads((again / "config.json").read_text())  # saved as an editor would: another layout, the same JSON
    (again / "config.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(meta, indent=1, sort_keys=True).replace(
        "\n", "\r\n").encode())
    assert main(["eval", str(again), "--data-dir", str(tiny["data"])]) == 0
    for value in (3, [1, 2]):  # a record that is no JSON text: model.safetensors' error, --resume included
        save_file(tensors, weights, metadata={RECORD_KEY: "x"})
        raw = weights.read_bytes()
        size = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + size])
        header["__metadata__"][RECORD_KEY] = value
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        weights.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + size:])
        for argv in (["eval", run, "--data-dir", tiny["data"]], RESUME[:2] + [run] + RESUME[3:]):
            line = _one_error(argv, capsys)
            assert line.endswith("corrupt weights file (its record of config.json is not a JSON object); restore it "
                                 "from a copy of the run"), line


def test_run_files_read_with_checks_the_state_of_another_run_of_the_same_shapes_is_named(tiny, tmp_path, capsys):
    """state.pt copied from a run of the same model (another lr) was resumed without a word, mixing the two runs
    into one. state.pt records config.json too, and --resume compares it before anything is restored."""
    (tmp_path / "other").mkdir()
    other = train_tiny_runs(tmp_path / "other", [("sa-quadratic", TINY)], epochs=1, max_steps=2, lr=0.003)
    run = _copy(tmp_path, tiny)
    shutil.copy(other["sa-quadratic"] / "state.pt", run / "state.pt")
    line = _one_error(RESUME[:2] + [run] + RESUME[3:], capsys)
    assert line.startswith(f"error: {run / 'config.json'} does not describe the run state.pt was written for ("), line
    assert "config.lr 0.1 in config.json, 0.003 in the record of state.pt" in line, line


def _set_step(run: Path, step: int | str, *, state: bool = False) -> None:
    """model.safetensors' recorded step set to `step` (and state.pt's progress, if `state`): an older checkpoint."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from attnconv.runs.files import sealed_metadata

    weights = run / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        metadata = dict(f.metadata())
    save_file(load_file(weights), weights, metadata=sealed_metadata({**metadata, "step": str(step)}))
    if state:
        saved = torch.load(run / "state.pt", weights_only=True)
        saved["progress"].update(step=step, epoch=0, batch=step, rows=0, snapshots=1, step_rows=0, finished=False)
        torch.save(saved, run / "state.pt")


def test_run_files_read_with_checks_weights_older_than_the_logs_are_named(tiny, tmp_path, capsys):
    """An older copy of the run's own weights (step 1 of 2) was measured and shown as the run's last step. Weights
    older than metrics.csv's last row are refused: as an older copy, or, when state.pt is at their step too, as a
    run stopped between its last row and its checkpoint (which --resume mends)."""
    from PIL import Image

    run = _copy(tmp_path, tiny)
    _set_step(run, 1)
    Image.new("L", (28, 28), 100).save(tmp_path / "shirt.png")
    for argv in (["eval", run, "--data-dir", tiny["data"]], ["predict", run, tmp_path / "shirt.png"]):
        line = _one_error(argv, capsys)
        assert line == (f"error: {run / 'model.safetensors'} holds the weights of step 1 (its metadata), but "
                        f"{run / 'metrics.csv'} goes on to step 2: one of the two is not the run's (an older copy of "
                        "the weights, another run's, or an edited metrics.csv); restore it from a copy of the run"), line
    for step in ("\u00b2", "9" * 5000):  # digits Python's int() refuses, or will not read: no step recorded
        _set_step(run, step)
        assert main(["eval", str(run), "--data-dir", str(tiny["data"])]) == 0
    _set_step(run, 1)
    _set_step(run, 1, state=True)
    line = _one_error(["eval", run, "--data-dir", tiny["data"]], capsys)
    assert "the run's last checkpoint, and" in line and f"`attnconv train --out {run} --resume`" in line, line


def test_run_files_read_with_checks_weights_that_are_not_there_or_too_large(tiny, tmp_path, capsys):
    """A finished run's model.safetensors deleted (or a broken link) was "missing (the run has not written a
    checkpoint yet)"; a sparse 64 GiB file, or a header claiming 64 GiB, was a generic out-of-memory line."""
    run = _copy(tmp_path, tiny)
    weights = run / "model.safetensors"
    weights.unlink()
    line = _one_error(["eval", run], capsys)
    assert line == (f"error: {weights}: missing, although the run has checkpointed (state.pt says so): "
                    f"it was moved or deleted; restore it from a copy of the run, or `attnconv train --out {run} "
                    "--resume` writes it anew from state.pt (and goes on training, if the run was not finished)"), line
    state = (run / "state.pt").read_bytes()
    (run / "state.pt").unlink()  # as a first checkpoint that failed after the epoch's row (a full disk)
    line = _one_error(["eval", run], capsys)  # was "the run has checkpointed (metrics.csv says so) ... restore it"
    assert line == (f"error: {weights}: missing, and so is state.pt, while metrics.csv has a row: the run stopped "
                    f"before its first checkpoint was whole (`attnconv train --out {run} --resume` starts it again "
                    "from step 0), or its files were moved or deleted (restore them from a copy of the run)"), line
    metrics = (run / "metrics.csv").read_bytes()
    (run / "metrics.csv").write_bytes(metrics.split(b"\n")[0] + b"\n")  # only its header: stopped in epoch 1
    line = _one_error(["eval", run], capsys)  # was "while metrics.csv has rows: ... first checkpoint was whole"
    assert line == f"error: {weights}: missing (the run has not written a checkpoint yet)", line
    (run / "metrics.csv").write_bytes(metrics)
    (run / "state.pt").write_bytes(state)
    weights.symlink_to(tmp_path / "nonexistent" / "w")
    line = _one_error(["eval", run], capsys)
    assert line.startswith(f"error: {weights}: a link to {tmp_path / 'nonexistent' / 'w'}, which does not exist"), line
    weights.unlink()
    with open(weights, "wb") as f:
        f.write((64 << 30).to_bytes(8, "little"))
        f.truncate(64 << 30)  # sparse: nothing is stored
    line = _one_error(["eval", run], capsys)
    assert line.startswith(f"error: {weights}: corrupt weights file (64.0 GiB, and the model's weights are "), line
    assert main(["table", str(run)]) == 0  # table reads no weights: the record is not read from such a header
    weights.write_bytes((64 << 30).to_bytes(8, "little") + b"{}")
    line = _one_error(["eval", run], capsys)
    assert line.startswith(f"error: {weights}: corrupt weights file (its header claims 64.0 GiB; safetensors "), line


def test_run_files_read_with_checks_long_field_names_are_shortened(tiny, tmp_path):
    """A key of 4,002 characters (or of 4,000 U+202E) in config.json: the record's line printed it whole (a line
    of 72,401 characters for three such keys); each key is now cut to 40 characters, escaped."""
    from attnconv.runs import WEIGHTS_FILE, config_record, read_config, record_problem

    run = _copy(tmp_path, tiny)
    meta = read_config(run)
    recorded = {"attnconv_run": config_record(meta)}
    for key in ("k" * 4002, "\u202e" * 4000, "." * 4000, "\u202e." * 1000):  # dots too: a key is not split on them
        edited = {**meta, key: {"x": 1}, key + "2": 2, key + "3": 3, key + "4": 4}
        line = record_problem(recorded, edited, run / WEIGHTS_FILE)
        assert line is not None and len(line) < 1000 and "\u202e" not in line and "and 1 more" in line, len(line)


def test_run_files_read_with_checks_class_lists_are_shown_where_they_differ(tiny, tmp_path, capsys):
    """A built-in dataset's last class renamed in the "data" block: both lists were shown by their first 37
    characters, which are the same. They are shown around where they first differ."""
    def edit(meta):
        meta["data"]["classes"][-1] = "Ankle Boot"
    run = _edit_meta(tmp_path, tiny, edit)["run"]
    line = _one_error(["table", run], capsys)
    assert '"Ankle boot"]' in line and '"Ankle Boot"]' in line, line


@pytest.mark.parametrize("damage", ["a-tensor-of-another-shape", "a-setting-of-another-kind", "a-group-more",
                                    "a-setting-missing", "a-state-key-missing", "a-tensor-of-another-dtype",
                                    "maximize", "nesterov", "differentiable", "another-weight-decay",
                                    "a-sparse-tensor", "an-expanded-tensor", "a-parameter-named-twice",
                                    "a-parameters-state-deleted", "a-setting-as-a-tensor", "every-state-deleted",
                                    "a-momentum-not-finite"])
def test_run_files_read_with_checks_the_optimizer_state_is_checked(tiny, tmp_path, capsys, damage):
    """state.pt's optimizer state was loaded as torch takes it: a moment estimate of shape (3, 3), or betas "ab",
    gave a traceback at the first step. It is checked against the optimizer before anything is restored."""
    run = _copy(tmp_path, tiny)
    state = torch.load(run / "state.pt", weights_only=True)
    opt = state["optimizer"]
    if damage == "a-tensor-of-another-shape":
        per = next(iter(opt["state"].values()))
        name = next(k for k, v in per.items() if isinstance(v, torch.Tensor) and v.dim() > 0)
        per[name] = torch.zeros(3, 3)
    elif damage == "a-setting-of-another-kind":
        opt["param_groups"][0]["lr"] = "ab"
    elif damage == "a-group-more":
        opt["param_groups"].append(dict(opt["param_groups"][0]))
    elif damage == "a-setting-missing":  # a traceback (KeyError) at the first step
        del opt["param_groups"][0]["lr"]
    elif damage == "a-state-key-missing":  # likewise
        per = next(iter(opt["state"].values()))
        per.pop(next(iter(per)))
    elif damage in ("maximize", "nesterov", "differentiable"):  # checked by kind only: trained on, other numbers
        for group in opt["param_groups"]:
            assert group[damage] is False
            group[damage] = True
    elif damage == "another-weight-decay":  # trained on with other numbers
        opt["param_groups"][0]["weight_decay"] = 5.0
    elif damage in ("a-sparse-tensor", "an-expanded-tensor"):  # tracebacks at the first step
        per = next(iter(opt["state"].values()))
        name = next(k for k, v in per.items() if isinstance(v, torch.Tensor) and v.numel() > 1)
        per[name] = per[name].to_sparse() if damage == "a-sparse-tensor" else torch.zeros(()).expand(per[name].shape)
    elif damage == "a-parameters-state-deleted":  # the twelfth round: torch starts it afresh, other numbers
        del opt["state"][next(iter(opt["state"]))]
    elif damage == "every-state-deleted":  # the thirteenth round: trained on from a fresh state, other numbers
        opt["state"].clear()
    elif damage == "a-momentum-not-finite":  # blamed on the learning rate (weights became non-finite)
        per = next(iter(opt["state"].values()))
        per["momentum_buffer"][0] = float("nan")
    elif damage == "a-setting-as-a-tensor":  # refused, but described as "a deeply nested Tensor"
        opt["param_groups"][0]["momentum"] = torch.tensor(opt["param_groups"][0]["momentum"])
    elif damage == "a-parameter-named-twice":  # a traceback (sizes that do not match) at the first step
        group = opt["param_groups"][0]
        group["params"] = [group["params"][0]] * len(group["params"])
    else:  # trained on with other numbers
        per = next(iter(opt["state"].values()))
        name = next(k for k, v in per.items() if isinstance(v, torch.Tensor) and v.dim() > 0)
        per[name] = per[name].to(torch.int64)
    torch.save(state, run / "state.pt")
    line = _one_error(RESUME[:2] + [run] + RESUME[3:], capsys)
    assert line.startswith(f"error: {run / 'state.pt'}: cannot read the training state: the file is corrupt (its "
                           "optimizer state "), line
    assert "nested" not in line and ("(a float32 tensor of shape ())" in line) == (damage == "a-setting-as-a-tensor")
    assert line.endswith("train it again into a new --out, or over this one with --overwrite"), line


@pytest.mark.parametrize("setting, value", [("amsgrad", True), ("capturable", True), ("maximize", True),
                                            ("betas", [0.9, 0.99]), ("eps", float("nan")), ("lr", float("inf"))])
def test_run_files_read_with_checks_adamw_settings_are_the_ones_the_config_makes(setting, value):
    """AdamW's saved amsgrad or capturable (of the right kind) gave a traceback at the first step, maximize trained
    on: each setting must equal the optimizer's own, except the learning rate, which the schedule sets (and which
    must be a finite number); betas saved as a list are the same betas."""
    from attnconv.training.checkpoint import _optimizer_problem

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    saved = optimizer.state_dict()
    saved["param_groups"][0]["betas"] = list(saved["param_groups"][0]["betas"])
    saved["param_groups"][0]["lr"] = 0.5  # what a schedule leaves: accepted
    assert _optimizer_problem(saved, optimizer, 1) is None
    saved["param_groups"][0][setting] = value
    problem = _optimizer_problem(saved, optimizer, 1)
    assert problem is not None and problem.startswith(f"setting {setting} is "), problem


@pytest.mark.parametrize("argv", [["report", "{run}", "--out", "{new}/r.html"],
                                  ["explore", "{run}", "--export", "{new}/e.html"],
                                  ["plot", "maps", "{run}", "--out", "{new}/m.png"]], ids=lambda a: a[0])
def test_outputs_refused_leave_no_parent_folder(tiny, tmp_path, capsys, argv):
    """A command refused after its output check (here, data that is not there) left the output's missing parent
    folders behind, empty. They are made only when the file is written."""
    run = _copy(tmp_path, tiny)
    new = tmp_path / "new" / "deeper"
    line = _one_error([a.format(run=run, new=new) for a in argv] + ["--dataset", f"folder:{tmp_path / 'none'}"],
                      capsys)
    assert "does not exist" in line, line
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("damage, message", [
    ("one-deleted", "holds no state for parameter 0 after 1 steps"), ("all-deleted", "holds no state for parameter 0 "
     "and 1 more after 1 steps"), ("a-step-count", "step of parameter 1 is 7.0, where the checkpoint has taken 1 steps"),
    ("negative-squares", "exp_avg_sq of parameter 0 is negative somewhere"),
    ("inf", "exp_avg of parameter 1 is not finite everywhere")])
def test_run_files_read_with_checks_adamw_state_that_no_step_makes_is_refused(damage, message):
    """The thirteenth round: AdamW's state with every parameter's entry deleted, a step count other than the
    checkpoint's, or a negative second moment was loaded; the run trained on with other numbers (or its weights
    became non-finite, blamed on the learning rate)."""
    import copy

    from attnconv.training.checkpoint import _optimizer_problem

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())
    assert _optimizer_problem(saved, optimizer, 1) is None
    assert _optimizer_problem(saved, optimizer, 0) == "holds the state of 2 parameters before the first step"
    per = saved["state"]
    if damage == "one-deleted":
        del per[0]
    elif damage == "all-deleted":
        per.clear()
    elif damage == "a-step-count":
        per[1]["step"] = torch.tensor(7.0)
    elif damage == "negative-squares":
        per[0]["exp_avg_sq"][0, 0] = -1.0
    else:
        per[1]["exp_avg"][0] = float("inf")
    assert _optimizer_problem(saved, optimizer, 1).startswith(message)


def test_run_files_read_with_checks_a_step_count_is_compared_as_its_dtype_counts():
    """AdamW keeps its step count in float32, which stops counting at 2**24: an honest run past 16,777,216 steps
    was refused. The count is compared with the run's step as that dtype holds it, and shown exactly."""
    from attnconv.training.checkpoint import _state_value_problem

    assert _state_value_problem("step", torch.tensor(2.0**24), 2**24 + 1) is None
    assert _state_value_problem("step", torch.tensor(3.0000002), 3) == (
        "3.000000238418579, where the checkpoint has taken 3 steps")


def test_run_files_read_with_checks_the_cpu_generator_state_is_one_torch_can_set(tiny, tmp_path, capsys):
    """Random bytes of the right size as the CPU generator state: `RuntimeError: Invalid mt19937 state` on
    --resume (only the size was checked). It is tried on a new generator when state.pt is read."""
    run = _copy(tmp_path, tiny)
    state = torch.load(run / "state.pt", weights_only=True)
    rng = state["rng"]["torch"]
    rng[0] = torch.randint(0, 256, rng[0].shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    torch.save(state, run / "state.pt")
    line = _one_error(RESUME[:2] + [run] + RESUME[3:], capsys)
    assert line.startswith(f"error: {run / 'state.pt'}: cannot read the training state: the file is corrupt (the "
                           "CPU random number generator state of process 0 is not one torch can set)"), line


def test_run_files_read_with_checks_eval_names_the_step_it_measured(tiny, tmp_path, capsys):
    """Weights of a checkpoint past metrics.csv's last row (--checkpoint-every, then stopped): eval printed the
    row's step for a measurement of later weights. It says which weights it measured."""
    run = _copy(tmp_path, tiny)
    _set_step(run, 3)
    capsys.readouterr()
    assert main(["eval", str(run), "--data-dir", str(tiny["data"])]) == 0
    out = capsys.readouterr().out
    assert "(epoch 1, step 2 in metrics.csv; measured: the weights of step 3)" in out, out


def test_run_files_read_with_checks_a_converted_run_is_not_resumed(tmp_path, capsys):
    """`train --resume` on a run `convert` wrote was told its state.pt was moved or deleted (convert writes none),
    with --overwrite as a fix that would replace the converted weights. It is named for what it is."""
    runs = train_folder_runs(tmp_path, [("resnet18", {"width": 4})])
    converted = tmp_path / "converted"
    assert main(["convert", str(runs["resnet18"]), "--out", str(converted), "--no-eval"]) == 0
    for flags in ([], ["--width", "8"], ["--model", "sa-quadratic"], ["--preset", "fmnist-sa-quadratic"]):  # said first
        line = _one_error(["train", "--out", converted, "--resume", "--no-progress", *flags], capsys)
        assert line.startswith(f"error: --out {converted}: written by `attnconv convert` (from "), line
        assert "there is nothing to resume; to train attention that starts from that CNN, `attnconv train " \
            "--init-from CNN_RUN --out NEW_DIR`" in line and "--overwrite" not in line, line


@pytest.mark.parametrize("field", ["lr", "weight_decay"])
def test_run_files_read_with_checks_an_integer_past_any_float_is_out_of_range(tiny, tmp_path, capsys, field):
    """config.json's lr of 10**400 (an integer JSON reads): an OverflowError traceback from the range check."""
    run = _edit_config(tmp_path, tiny, **{field: 10**400})["run"]
    line = _one_error(["table", run], capsys)
    assert line.startswith(f"error: {run / 'config.json'}: corrupt run config (field {field} "), line


@pytest.mark.parametrize("key, edit, shown, was", [("layers", 2.0, "2.0", "2"), ("heads", 4.0, "4.0", "4")])
def test_run_files_read_with_checks_an_option_edited_to_an_equal_python_value_is_an_edit(tiny, tmp_path, capsys,
                                                                                        key, edit, shown, was):
    """`"layers": 2` edited to `2.0` passed the record check (Python's `2.0 == 2`, as `true == 1`), and the model's
    option check then said `layers 2.0 is invalid: give a whole number`, without config.json or a fix: it is the
    record's line, in JSON's spelling."""
    run = _copy(tmp_path, tiny)
    meta = json.loads((run / "config.json").read_text())
    assert json.dumps(meta["config"]["model_overrides"][key]) == was
    meta["config"]["model_overrides"][key] = edit
    (run / "config.json").write_text(json.dumps(meta))
    line = _one_error(["eval", str(run)], capsys)
    assert f"config.model_overrides.{key} {shown} in config.json, {was} in the record of model.safetensors" in line, \
        line


@pytest.mark.parametrize("argv", [["train", "--preset", "fmnist-sa-quadratic", "--out", ""], ["eval", ""],
                                  ["eval", "--json", ""], ["analyze", ""], ["predict", "", "x.png"],
                                  ["learn-conv", "--out", ""], ["plot", "centers", ""], ["compare", "a", ""],
                                  ["export", "run", "--out", ""]],
                         ids=lambda a: "-".join(x or "EMPTY" for x in a))
def test_round_62_b_an_empty_argument_is_refused_not_read_as_the_current_folder(argv, tmp_path, monkeypatch, capsys):
    """Round 62: an empty argument ("$RUN" of an unset variable) was read as the current folder: `train --out ''`
    wrote a run into it, `learn-conv --out ''` wrote there and said it wrote at the filesystem root, `eval`,
    `analyze` and `predict` read whatever run was there, with exit 0."""
    from attnconv.cli import main

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'' is empty (an unset variable?)" in err, err
    assert not list(tmp_path.iterdir())  # nothing written where it stands


@pytest.mark.parametrize("command", ["eval", "analyze", "table"])
def test_round_62_b_a_run_path_too_long_is_said_of_the_path_given(command, tmp_path, monkeypatch, capsys):
    """Round 62: a run path whose name is too long was answered with the internal set-aside manifest's name
    (`.../.replaced-run.attnconv-tmp/manifest.json: File name too long`), as if an overwrite were pending."""
    from attnconv.cli import main

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main([command, "a" * 300]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its path is too long for this system" in err and "manifest" not in err, err


@pytest.mark.parametrize("argv,said", [(["table", "x", "--json"], "attnconv table"),
                                       (["plot", "centers", "x", "--json"], "attnconv plot centers"),
                                       (["eval", "x", "--bogus"], "attnconv eval")], ids=lambda a: str(a))
def test_round_62_b_an_unknown_option_is_said_by_the_command_given(argv, said, capsys):
    """Round 62: an option no command takes was answered as the top level's (`attnconv: unrecognized arguments:
    --json (see `attnconv --help`)`), whose help does not list the command's options."""
    from attnconv.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {said}: unrecognized arguments: ") and err.endswith(f"(see `{said} --help`)"), err


@pytest.mark.parametrize("argv,option,command", [
    (["--json", "eval", "x"], "--json", "attnconv eval"),
    (["--js", "eval", "x"], "--js", "attnconv eval"),
    (["--top=3", "predict", "x", "y.png"], "--top=3", "attnconv predict"),
    (["plot", "--overwrite", "centers", "x"], "--overwrite", "attnconv plot centers"),
], ids=lambda a: str(a))
def test_round_63_b_an_option_given_before_its_command_is_said_to_go_after_it(argv, option, command, capsys):
    """Round 63: an option the command takes, given before the command's name, was said to be unknown to that command
    (`attnconv eval: unrecognized arguments: --json`), whose --help lists it."""
    from attnconv.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: attnconv: {option} is an option of `{command}`, given before its name: put it after " \
                  f"`{command}` (see `{command} --help`)", err


@pytest.mark.parametrize("argv", [["eval", "--", "x", "--json"], ["eval", "x", "--", "--json"],
                                  ["plot", "centers", "--", "x", "--overwrite"]], ids=lambda a: " ".join(a))
def test_round_64_b_an_option_after_a_double_dash_is_a_value_not_an_option_given_before_its_command(argv, capsys):
    """Round 64: after `--` every argument is a value; one there that reads like an option of the command was said
    to have been given before the command's name."""
    from attnconv.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --" in err and "given before its name" not in err, err


def test_round_64_b_every_path_a_command_prints_is_escaped(tiny_attention_runs, tmp_path, capsys):
    """Round 64: `export`, `plot`, `report` and `explore --export` printed the path they wrote raw: a newline split the
    line, a terminal escape acted on the terminal."""
    from attnconv.cli import main

    run = tiny_attention_runs["sa-quadratic"]
    for argv in (["export", str(run), "--out", str(tmp_path / "m\x1b[31m\n.pt2")],
                 ["plot", "centers", str(run), "--out", str(tmp_path / "c\x1b[31m\n.png")],
                 ["plot", "distance", str(run), "--out", str(tmp_path / "d\x1b[31m\n.png")],
                 ["report", str(run), "--out", str(tmp_path / "r\x1b[31m\n.html"), "--images", "2"],
                 ["explore", str(run), "--export", str(tmp_path / "e\x1b[31m\n.html"), "--images", "2"]):
        capsys.readouterr()
        assert main(argv) == 0, argv
        out, err = capsys.readouterr()
        assert "\x1b" not in out + err and out.count("\n") == 1 and "\\x1b[31m\\n." in out, (argv, out)


@pytest.mark.parametrize("argv,said,command", [
    (["--device", "cpu", "eval", "x"], "--device cpu", "attnconv eval"),
    (["--out", "x", "train"], "--out x", "attnconv train"),
    (["plot", "--layer", "1", "centers", "x"], "--layer 1", "attnconv plot centers"),
], ids=lambda a: str(a))
def test_round_64_b_a_valued_option_before_its_command_is_said_with_its_value(argv, said, command, capsys):
    """Round 64's KNOWN: a valued option before the command's name (`attnconv --device cpu eval RUN`) was answered
    as argparse reads it, `invalid choice: 'cpu'` for the command, naming neither the option nor where it goes."""
    from attnconv.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"error: attnconv: {said} is an option of `{command}` and its value, " \
                                              f"given before its name: put them after `{command}` (see `{command} --help`)"
    assert main(["evl", "x"]) == 2  # a misspelt command: argparse's reading stands
    assert "invalid choice: 'evl'" in capsys.readouterr().err


@pytest.mark.parametrize("argv,said", [
    (["--zoom", "3", "eval", "x"], "--zoom, given before `attnconv eval`, is an option neither `attnconv` nor "
                                   "`attnconv eval` takes"),
    (["--nosuch", "3", "eval", "x"], "--nosuch, given before `attnconv eval`, is an option neither"),
    (["--d", "cpu", "eval", "x"], "--d, given before `attnconv eval`, could be --data-dir, --dataset, --device of "
                                  "`attnconv eval`"),
], ids=lambda a: str(a))
def test_round_65_b_an_option_no_command_takes_before_the_command_is_named_not_its_value(argv, said, capsys):
    """Round 65: `attnconv --zoom 3 eval RUN` (an option eval does not take, with a value, before the command) was
    answered `invalid choice: '3'`, naming the value as an unknown command and not the option."""
    from attnconv.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: attnconv: {said}") and err.endswith("options go after the command's name"), err


def test_round_65_b_eval_table_compare_and_analyze_keep_a_run_with_a_newline_on_one_line(tiny_attention_runs,
                                                                                         tmp_path, capsys):
    """Round 65: a newline in a run folder's name split `eval`'s run line, `table`'s and `compare`'s rows (and the
    Markdown table), and `analyze` printed the name raw (a terminal escape too)."""
    import shutil

    from attnconv.cli import main

    run = tmp_path / "a\nb\x1b[31m"
    shutil.copytree(tiny_attention_runs["sa-quadratic"], run)
    for argv in (["eval", str(run)], ["table", str(run)], ["table", str(run), "--markdown"], ["compare", str(run)],
                 ["compare", str(run), "--markdown"], ["analyze", str(run)]):
        capsys.readouterr()
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        assert "a\nb" not in out and "\x1b" not in out, (argv, out)
        shown = re.sub(r"\\(.)", r"\1", out) if "--markdown" in argv else out  # Markdown's own escapes undone
        assert argv[0] == "table" or "a\\nb\\x1b[31m" in shown, (argv, out)  # table shows no run folder


@pytest.mark.parametrize("argv,said", [
    (["-x", "3", "eval", "x"], "-x, given before `attnconv eval`, is an option neither `attnconv` nor `attnconv eval`"),
    (["plot", "-Z", "3", "maps", "x"], "-Z, given before `attnconv plot maps`, is an option neither"),
    (["--json", "--device", "cpu", "eval", "x"], "--device cpu is an option of `attnconv eval` and its value"),
], ids=lambda a: str(a))
def test_round_66_b_short_options_and_a_flag_before_a_valued_option_are_read_as_they_are(argv, said, capsys):
    """Round 66: an unknown short option with a value before the command was still `invalid choice: '3'`, and a flag
    before a valued option (`--json --device cpu eval`) was said to be `--json --device`, an option and its value."""
    from attnconv.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: attnconv: {said}"), err


def test_round_66_b_odd_class_names_and_run_folders_in_tables_reports_and_training(tmp_path, capsys):
    """Round 66: a folder dataset's class name with a control character made `train` write config.json and refuse
    it as corrupt (and leave it); a `|` in a run folder's name split Markdown cells (`table`, `compare`, the report's
    table); class names of math text (`$\\foo$`) or with a byte that is not UTF-8 crashed the report's figures."""
    from fixtures_data import write_class_folder

    from attnconv.cli import main
    from attnconv.tables import format_table, markdown_cells

    bad = write_class_folder(tmp_path / "bad", classes=("ant", "b\nee"))
    train = ["train", "--model", "sa-quadratic", "--image-size", "8", "--max-steps", "2", "--batch-size", "4",
             "--layers", "1", "--hidden", "8", "--heads", "2", "--no-progress"]
    assert main([*train, "--dataset", f"folder:{bad}", "--out", str(tmp_path / "r0")]) == 2
    err = capsys.readouterr().err
    assert "the class folder 'b\\nee' has a control character in its name" in err and "rename the folder" in err
    assert not (tmp_path / "r0").exists()

    text = format_table(["a", "b"], [["x|y", "1"]], markdown=True)
    assert [markdown_cells(line) for line in text.splitlines()] == [["a", "b"], ["---", "---"], ["x|y", "1"]]
    odd = write_class_folder(tmp_path / "odd", classes=("$\\foo$", os.fsdecode(b"x\xffy")))
    run = tmp_path / "a|b"
    assert main([*train, "--dataset", f"folder:{odd}", "--out", str(run)]) == 0
    for argv in (["table", str(run), "--markdown"], ["compare", str(run), "--markdown"]):
        capsys.readouterr()
        assert main(argv) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert len({len(markdown_cells(line)) for line in lines}) == 1, lines
    assert main(["report", str(run), "--out", str(tmp_path / "r.html"), "--images", "2"]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "a|b" in page and "<td>folder:" in page


def test_round_66_b_version_is_said_by_the_top_level(capsys):
    """Round 66's note: there was no `--version`; `attnconv --version` asked for a command."""
    import attnconv
    from attnconv.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as done:  # as --help ends
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"attnconv {attnconv.__version__}\n"


def test_round_67_b_invisible_characters_in_pages_and_class_names_alike(tmp_path, capsys):
    """Round 67: the report's and explore --export's pages wrote direction overrides and zero-width characters raw
    (a class `rtl\\u202eevil` read `rtllive` in a browser); two class folders differing only in Unicode form (é as
    one character, or e and an accent) trained without a word, shown as one name twice."""
    import re as _re

    from fixtures_data import write_class_folder

    from attnconv.cli import main

    train = ["train", "--model", "sa-quadratic", "--image-size", "8", "--max-steps", "2", "--batch-size", "4",
             "--layers", "1", "--hidden", "8", "--heads", "2", "--no-progress"]
    alike = write_class_folder(tmp_path / "alike", classes=("\u00e9", "e\u0301"))
    assert main([*train, "--dataset", f"folder:{alike}", "--out", str(tmp_path / "r0")]) == 2
    assert "read alike (the same name in two Unicode forms" in capsys.readouterr().err
    assert not (tmp_path / "r0").exists()
    odd = write_class_folder(tmp_path / "odd\u200b", classes=("ant", "rtl\u202eevil"))
    run = tmp_path / "run\u2066x"
    assert main([*train, "--dataset", f"folder:{odd}", "--out", str(run)]) == 0
    assert main(["report", str(run), "--out", str(tmp_path / "r.html"), "--images", "2"]) == 0
    assert main(["explore", str(run), "--export", str(tmp_path / "e.html"), "--images", "2"]) == 0
    for page in ("r.html", "e.html"):
        text = (tmp_path / page).read_text()
        assert not _re.search("[\u200b\u202e\u2066]", text), page
        assert "rtl\\u202eevil" in text, page


def test_round_68_b_names_in_the_reports_tables_markdown_and_classes_that_read_alike(tmp_path, capsys):
    """Round 68: the report's run table showed config.json's "data" as JSON escaped again by the page (`back\\\\slash`,
    `\\u00e9t\\u00e9` for `été`); Markdown tables escaped only `|` (a folder `r<script>x` rendered as HTML, a real
    backslash read as an escape); class folders alike but for a trailing space or a ligature trained as two
    classes shown as one; é in two Unicode forms in train/ and test/ was said to have no train/ folder."""
    from fixtures_data import write_class_folder

    from attnconv.cli import main
    from attnconv.tables import format_table, markdown_cells

    rows = [["r<script>x", "a|b"], ["p\\q", "&lt;"]]
    text = format_table(["run", "x"], rows, markdown=True)
    assert "<script>" not in text and [markdown_cells(line) for line in text.splitlines()[2:]] == rows
    train = ["train", "--model", "sa-quadratic", "--image-size", "8", "--max-steps", "2", "--batch-size", "4",
             "--layers", "1", "--hidden", "8", "--heads", "2", "--no-progress"]
    for n, classes in enumerate((("a", "a "), ("\ufb01", "fi"))):
        data = write_class_folder(tmp_path / f"alike{n}", classes=classes)
        assert main([*train, "--dataset", f"folder:{data}", "--out", str(tmp_path / f"r{n}")]) == 2
        assert "read alike" in capsys.readouterr().err and not (tmp_path / f"r{n}").exists()
    split = write_class_folder(tmp_path / "split", classes=("\u00e9t\u00e9", "b"))
    (split / "test" / "\u00e9t\u00e9").rename(split / "test" / "e\u0301te\u0301")
    assert main([*train, "--dataset", f"folder:{split}", "--out", str(tmp_path / "r2")]) == 2
    assert "reads as" in capsys.readouterr().err
    data = write_class_folder(tmp_path / "odd", classes=("\u00e9t\u00e9", "back\\slash"))
    run = tmp_path / "run"
    assert main([*train, "--dataset", f"folder:{data}", "--out", str(run)]) == 0
    assert main(["report", str(run), "--out", str(tmp_path / "r.html"), "--images", "2"]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "\\u00e9" not in page and "back\\\\\\\\slash" not in page and "classes: back\\\\slash, \u00e9t\u00e9" in page


def test_round_69_b_markdown_markup_spaces_and_names_that_only_look_related(tmp_path, capsys):
    """Round 69: Markdown cells did not escape `[`, `]` and `!` (a run folder `[r](x.html)` rendered as a link) and
    lost spaces at their ends; class folders `a b` and `a  b` trained as two classes a page shows alike; `x2` and `x²`,
    `H2O` and `H₂O` were refused as alike (every compatibility form was folded)."""
    from fixtures_data import write_class_folder

    from attnconv.cli import main
    from attnconv.tables import format_table, markdown_cells

    rows = [["[r](x.html)", "![i](x.png)"], [" r", "a  b "], ["\\[x\\](y)", "*_`"]]
    text = format_table(["a", "b"], rows, markdown=True)
    assert "](" not in text.replace("\\](", "") and [markdown_cells(line) for line in text.splitlines()[2:]] == rows
    train = ["train", "--model", "sa-quadratic", "--image-size", "8", "--max-steps", "2", "--batch-size", "4",
             "--layers", "1", "--hidden", "8", "--heads", "2", "--no-progress"]
    spaced = write_class_folder(tmp_path / "spaced", classes=("a b", "a  b"))
    assert main([*train, "--dataset", f"folder:{spaced}", "--out", str(tmp_path / "r0")]) == 2
    assert "read alike" in capsys.readouterr().err and not (tmp_path / "r0").exists()
    distinct = write_class_folder(tmp_path / "distinct", classes=("x2", "x\u00b2", "H2O", "H\u2082O"))
    assert main([*train, "--dataset", f"folder:{distinct}", "--out", str(tmp_path / "r1")]) == 0


def test_a_test_class_folder_that_differs_from_trains_only_in_case_points_at_it(tmp_path):
    """Round 69's note: train/Cat and test/cat were refused as "no folder in train; add train/cat/", without
    pointing at the Cat folder the user sees there."""
    import shutil

    from fixtures_data import write_class_folder

    from attnconv.data.folder_layout import scan_folder

    root = write_class_folder(tmp_path / "cased", classes=("Cat", "dog"))
    shutil.move(root / "test" / "Cat", root / "test" / "cat")
    with pytest.raises(AttnconvError, match=r"class 'cat' has no folder in .*train, which has 'Cat' \(the names "
                                            r"differ in case or letter forms only, .*\): rename one"):
        scan_folder(root)
    shutil.move(root / "test" / "cat", root / "test" / "bird")  # no name alike: the plain message
    with pytest.raises(AttnconvError, match=r"class 'bird' has no folder in .*; add .*bird/ with training images"):
        scan_folder(root)


def test_round_70_b_markdown_strikethrough_and_math_names_that_print_alike_and_unknown_options(tmp_path, capsys):
    """Round 70: a run folder `~~s~~` rendered struck through in `compare --markdown` (GitHub's `$x$` as math);
    class folders `café` in two Unicode forms were refused as 'café' and 'café', printed the same; a test class
    reading as train's through a ligature or inner spaces was said to differ in "Unicode form, or spaces at its
    ends"; `attnconv eval -x` and `attnconv eval --version` were said to miss RUN_DIR, not to take the option."""
    from fixtures_data import write_class_folder

    from attnconv.cli import main
    from attnconv.data.folder_layout import scan_folder
    from attnconv.tables import format_table, markdown_cells

    rows = [["~~s~~", "$x$"], ["a~b", "$$"]]
    text = format_table(["a", "b"], rows, markdown=True)
    assert re.search(r"(?<!\\)[~$]", text) is None and "\\~\\~s\\~\\~" in text
    assert [markdown_cells(line) for line in text.splitlines()[2:]] == rows
    nfd = write_class_folder(tmp_path / "nfd", classes=("caf\u00e9", "cafe\u0301"))
    with pytest.raises(AttnconvError, match=r"class folders 'cafe\u0301' \(U\+0301\) and 'caf\xe9' \(U\+00E9\) read alike"):
        scan_folder(nfd)
    spaced = write_class_folder(tmp_path / "spaced", classes=("a b",))
    (spaced / "test" / "a b").rename(spaced / "test" / "a  b")
    with pytest.raises(AttnconvError, match=r"class 'a  b' reads as .*'a b' but is another name \(another Unicode "
                                            r"form, a ligature for its letters, or other spaces\)"):
        scan_folder(spaced)
    for argv, said in ((["eval", "-x"], "attnconv eval: unrecognized arguments: -x"),
                       (["eval", "--version"], "attnconv eval: unrecognized arguments: --version"),
                       (["eval", "--json", "-q"], "attnconv eval: unrecognized arguments: -q"),
                       (["eval"], "the following arguments are required: RUN_DIR")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_round_71_b_number_like_options_and_names_that_read_alike_escaped_once(tmp_path, capsys):
    """Round 71: words Python 3.11's argparse reads as options though they look like numbers (`-1e5`, `-inf`, `-1.`)
    were let through as values by the unknown-option check, so `attnconv eval -1e5` said RUN_DIR was missing; the names
    of class folders that read alike were escaped by `ascii` and again by the CLI's line (`'cafe\\\\u0301'`, a folder
    `a\\ b` shown with four backslashes), naming folders that do not exist."""
    from fixtures_data import write_class_folder

    from attnconv.cli import main

    for word in ("-1e5", "-inf", "-nan", "-1."):
        assert main(["eval", word]) == 2
        err = capsys.readouterr().err
        assert f"attnconv eval: unrecognized arguments: {word}" in err and len(err.strip().splitlines()) == 1
    assert main(["eval", "-1"]) == 2  # a negative number is a value: the run folder -1, missing
    assert "-1: not a run directory" in capsys.readouterr().err
    train = ["train", "--model", "sa-quadratic", "--image-size", "8", "--max-steps", "1", "--batch-size", "4",
             "--layers", "1", "--hidden", "8", "--heads", "2", "--no-progress"]
    for classes, said in ((("caf\u00e9", "cafe\u0301"), "'cafe\u0301' (U+0301) and 'caf\u00e9' (U+00E9) read alike"),
                          (("a\\ b", "a\\  b"), "'a\\\\  b' and 'a\\\\ b' read alike")):
        root = write_class_folder(tmp_path / f"d{len(said)}", classes=classes)
        assert main([*train, "--dataset", f"folder:{root}", "--out", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err
        assert said in err and "\\\\u" not in err and "\\\\\\\\" not in err, err
        assert not (tmp_path / "r").exists()


def test_round_73_a_the_alpha_range_said_is_the_one_taken(capsys):
    """Round 73: `--alpha 0` was told "give a number from 1e-09 to 1e+09", and any alpha above 10000 was then refused
    by the layer's own range, (0, 10000]: the range said is the converted layers' (`construct.bound.MAX_ALPHA`)."""
    from attnconv.cli import main, ranges
    from attnconv.construct.bound import MAX_ALPHA

    assert ranges()["alpha"][1] == MAX_ALPHA
    assert main(["express", "--alpha", "20000"]) == 2
    assert "--alpha 20000.0 is out of range: give a number from 1e-09 to 10000" in capsys.readouterr().err
