"""Every path and every on/off argument the public API takes goes through one check (attnconv.limits: path_argument,
flag_argument): a path that is no str or os.PathLike (an int, a list, bytes) is one AttnconvError naming the argument,
never pathlib's "expected str, bytes or os.PathLike object, not int" from its own code; a flag that is not True or
False ("no", 2, a tensor, None) is one AttnconvError naming it: Python takes the string "no" for true, so
`overwrite="no"` replaced a run, and a tensor of two values has no truth at all (torch's RuntimeError).

The table below names a call for every path and flag parameter of the public callables and methods of `attnconv`,
`attnconv.analysis`, `attnconv.construct`, `attnconv.plots`, `attnconv.models`, `attnconv.training`, `attnconv.report`,
`attnconv.learnconv` and `attnconv.explorer`, with `export_run` and `convert_run`; the coverage test fails when one
gains such a parameter the table does not try.
"""

from __future__ import annotations

import inspect
import os
import typing
from pathlib import Path

import pytest
import torch
from test_public_numbers import _refused  # one line naming the argument, said as the numbers' table says it
from test_public_tensors import public_callables
from torch import nn

import attnconv
from attnconv.errors import AttnconvError

MODULES = ("attnconv", "attnconv.analysis", "attnconv.construct", "attnconv.plots", "attnconv.models",
           "attnconv.training", "attnconv.report", "attnconv.learnconv", "attnconv.explorer")
# Fields of the configs (their validate() says each: test_public_numbers), image lists (test_public_tensors), and
# a helper handed a flag its callers have checked.
NOT_ARGUMENTS = {("TrainConfig.__init__", "*"), ("ClassifierConfig.__init__", "*"), ("ViTConfig.__init__", "*"),
                 ("Run.predict", "images"), ("Run.transform", "images"), ("check_key_dim", "learnable")}
class _BytesPath(os.PathLike):
    """A path object whose __fspath__ gives bytes (os.PathLike allows it; pathlib refuses it in its own words)."""

    def __fspath__(self):
        return b"run"


PATHS = (5, ["run"], b"run", 2.5, _BytesPath(), "ru\0n")  # NUL: every OS call says "embedded null byte"
FLAGS = ("no", 2, torch.zeros(2), torch.tensor(True), None, 0.5)


def public_parameters() -> set[tuple[str, str]]:
    """(callable, parameter) for every parameter annotated as a path (os.PathLike) or a flag (bool) of the public
    functions, and of the public methods the public classes define themselves, with export_run and convert_run."""
    from attnconv.export import export_run
    from attnconv.runs import convert_run

    found: set[tuple[str, str]] = set()
    for qual, fn in public_callables(MODULES, (("export_run", export_run), ("convert_run", convert_run))):
        try:
            parameters = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            continue
        if any(qual == q and p == "*" for q, p in NOT_ARGUMENTS):
            continue
        found.update((qual, p.name) for p in parameters
                     if "PathLike" in str(p.annotation) or str(p.annotation) == "bool")
    return found


def cases(run_dir, tmp) -> dict[tuple[str, str], tuple[typing.Callable, str, tuple]]:
    """(callable, parameter) -> (call taking the value, the name its error says, the values it must refuse)."""
    from attnconv import analysis as A
    from attnconv import plots as P
    from attnconv.explorer import Explorer, write_export
    from attnconv.export import export_run
    from attnconv.learnconv import learn_conv
    from attnconv.report import build_report, write_report
    from attnconv.runs import convert_run

    conv = nn.Conv2d(2, 3, 3, padding=1)
    # a dataset that is not there: were a flag taken, train would stop at once on it, not train
    config = attnconv.make_config(preset="fmnist-sa-quadratic", dataset="folder:/no-such-attnconv-folder", max_steps=1)

    def run() -> attnconv.Run:  # read when a case is tried (`cases_keys` builds the table without a run)
        return attnconv.Run(run_dir)

    def out(name: str) -> str:
        return os.path.join(str(tmp), name)

    plots = {"plot_centers": P.plot_centers, "plot_maps": P.plot_maps, "plot_distance": P.plot_distance,
             "plot_centers_history": P.plot_centers_history}
    table = {
        ("Run.__init__", "path"): (attnconv.Run, "run", PATHS),
        ("Run.__init__", "data_dir"): (lambda v: attnconv.Run(run_dir, data_dir=v), "data_dir", PATHS),
        ("Run.__init__", "allow_nonfinite"): (lambda v: attnconv.Run(run_dir, allow_nonfinite=v), "allow_nonfinite",
                                              FLAGS),
        ("Run.__init__", "warn_data_change"): (lambda v: attnconv.Run(run_dir, warn_data_change=v),
                                               "warn_data_change", FLAGS),
        ("Run.predict", "folder"): (lambda v: run().predict(torch.zeros(1, 1, 28, 28, dtype=torch.uint8), folder=v),
                                    "folder", FLAGS),
        ("Run.transform", "folder"): (lambda v: run().transform(torch.zeros(1, 1, 28, 28, dtype=torch.uint8),
                                                                folder=v), "folder", FLAGS),
        ("load_run", "run_dir"): (attnconv.load_run, "run_dir", PATHS),
        ("load_run", "allow_nonfinite"): (lambda v: attnconv.load_run(run_dir, allow_nonfinite=v), "allow_nonfinite",
                                          FLAGS),
        ("SelfAttention2d.__init__", "bias"): (lambda v: attnconv.SelfAttention2d(2, heads=2, max_size=8, bias=v),
                                               "bias", FLAGS),
        ("ConvAttention.__init__", "bias"): (
            lambda v: attnconv.ConvAttention(2, 3, (3, 3), stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1),
                                             groups=1, bias=v, alpha=1.0), "bias", FLAGS),
        ("capture_attention", "scores"): (
            lambda v: attnconv.capture_attention(nn.Sequential(attnconv.SelfAttention2d(2, heads=2, max_size=8)),
                                                 torch.randn(1, 2, 8, 8), scores=v), "scores", FLAGS),
        ("conv_to_attention", "learnable"): (lambda v: attnconv.conv_to_attention(conv, learnable=v), "learnable",
                                             FLAGS),
        **{("cnn_to_attention", flag): ((lambda f: lambda v: attnconv.cnn_to_attention(nn.Sequential(conv),
                                                                                        **{f: v}))(flag), flag, FLAGS)
           for flag in ("fold_bn", "learnable", "strict")},
        ("train", "out"): (lambda v: attnconv.train(config, v), "out", PATHS),
        **{("train", flag): ((lambda f: lambda v: attnconv.train(config, out("new-run"), **{f: v}))(flag), flag,
                             FLAGS)
           for flag in ("resume", "overwrite", "allow_data_change", "progress", "tensorboard")},
        ("analyze_run", "run"): (A.analyze_run, "run", PATHS),
        ("analyze_run", "data_dir"): (lambda v: A.analyze_run(run_dir, data_dir=v), "data_dir", PATHS),
        ("Explorer.__init__", "run_dir"): (Explorer, "run_dir", PATHS),
        ("Explorer.__init__", "data_dir"): (lambda v: Explorer(run_dir, data_dir=v), "data_dir", PATHS),
        ("write_export", "run_dir"): (lambda v: write_export(v, out("e.html")), "run_dir", PATHS),
        ("write_export", "out"): (lambda v: write_export(run_dir, v), "out", PATHS),
        ("write_export", "data_dir"): (lambda v: write_export(run_dir, out("e.html"), data_dir=v), "data_dir", PATHS),
        ("write_export", "overwrite"): (lambda v: write_export(run_dir, out("e.html"), overwrite=v), "overwrite",
                                        FLAGS),
        ("build_report", "run_dir"): (build_report, "run_dir", PATHS),
        ("build_report", "data_dir"): (lambda v: build_report(run_dir, data_dir=v), "data_dir", PATHS),
        ("write_report", "run_dir"): (lambda v: write_report(v, out("r.html")), "run_dir", PATHS),
        ("write_report", "out"): (lambda v: write_report(run_dir, v), "out", PATHS),
        ("write_report", "data_dir"): (lambda v: write_report(run_dir, out("r.html"), data_dir=v), "data_dir", PATHS),
        ("write_report", "overwrite"): (lambda v: write_report(run_dir, out("r.html"), overwrite=v), "overwrite",
                                        FLAGS),
        ("learn_conv", "out"): (lambda v: learn_conv(steps=1, source="random", out=v), "out", PATHS),
        ("learn_conv", "data_dir"): (lambda v: learn_conv(steps=1, source="random", data_dir=v), "data_dir", PATHS),
        ("learn_conv", "overwrite"): (lambda v: learn_conv(steps=1, source="random", overwrite=v), "overwrite",
                                      FLAGS),
        ("learn_conv", "progress"): (lambda v: learn_conv(steps=1, source="random", progress=v), "progress",
                                     FLAGS),
        ("export_run", "run"): (lambda v: export_run(v, "onnx", out("m.onnx")), "run", PATHS),
        ("export_run", "out"): (lambda v: export_run(run_dir, "onnx", v), "out", PATHS),
        ("export_run", "overwrite"): (lambda v: export_run(run_dir, "onnx", out("m.onnx"), overwrite=v), "overwrite",
                                      FLAGS),
        ("convert_run", "run_dir"): (lambda v: convert_run(v, out("converted")), "run_dir", PATHS),
        ("convert_run", "out"): (lambda v: convert_run(run_dir, v), "out", PATHS),
        ("convert_run", "fold_bn"): (lambda v: convert_run(run_dir, out("converted"), fold_bn=v), "fold_bn", FLAGS),
        ("check_out", "path"): (P.check_out, "out", PATHS),
        ("check_out", "overwrite"): (lambda v: P.check_out(out("f.png"), overwrite=v), "overwrite", FLAGS),
        ("save_figure", "path"): (lambda v: P.save_figure(None, v), "out", PATHS),
        ("save_figure", "overwrite"): (lambda v: P.save_figure(None, out("f.png"), overwrite=v), "overwrite", FLAGS),
        ("plot_figures", "run"): (lambda v: P.plot_figures(v, out("p")), "run", PATHS),
        ("plot_figures", "prefix"): (lambda v: P.plot_figures(run_dir, v), "prefix", PATHS),
        ("plot_figures", "data_dir"): (lambda v: P.plot_figures(run_dir, out("p"), data_dir=v), "data_dir", PATHS),
        ("plot_figures", "overwrite"): (lambda v: P.plot_figures(run_dir, out("p"), overwrite=v), "overwrite", FLAGS),
    }
    for name, plot in plots.items():
        table[(name, "run")] = ((lambda f: lambda v: f(v, out("f.png")))(plot), "run", PATHS)
        table[(name, "out")] = ((lambda f: lambda v: f(run_dir, v))(plot), "out", PATHS)
        table[(name, "overwrite")] = ((lambda f: lambda v: f(run_dir, out("f.png"), overwrite=v))(plot), "overwrite",
                                      FLAGS)
        if "data_dir" in inspect.signature(plot).parameters:
            table[(name, "data_dir")] = ((lambda f: lambda v: f(run_dir, out("f.png"), data_dir=v))(plot),
                                        "data_dir", PATHS)
    return table


def cases_keys() -> set[tuple[str, str]]:
    return set(cases(None, None))


def test_every_path_and_flag_parameter_of_the_public_api_is_tried():
    missing = sorted(public_parameters() - cases_keys() - NOT_ARGUMENTS)
    assert not missing, f"public path and flag parameters no case tries (add them to the table in this file): {missing}"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return tmp_path_factory.mktemp("outputs")


@pytest.mark.parametrize("key", sorted(cases_keys()), ids="-".join)
def test_public_paths_and_flags_refused_in_one_line_naming_the_argument(key, tiny_attention_runs, outputs):
    call, name, bad = cases(tiny_attention_runs["sa-quadratic"], outputs)[key]
    for value in bad:
        _refused(call, value, name)
    assert not any(outputs.iterdir()), sorted(p.name for p in outputs.iterdir())  # refused before writing a thing


def test_round_79_b_a_run_keeps_the_folder_it_was_made_from(tiny_attention_runs, tmp_path, monkeypatch):
    """Round 79: a Run made from a relative path read config.json at once and its weights later, from whatever folder
    the path named then: after os.chdir, predict and export_run answered with another run's weights under the first
    run's config (same settings, another seed: no check fired)."""
    import shutil

    source = tiny_attention_runs["sa-quadratic"]
    for side in ("a", "b"):
        shutil.copytree(source, tmp_path / side / "run")
    other = attnconv.Run(tmp_path / "b" / "run")
    with torch.no_grad():  # b's run: other weights under the same config and record
        from attnconv.runs import recorded_metadata
        from attnconv.runs.files import save_weights

        weights = tmp_path / "b" / "run" / "model.safetensors"
        model = other.model
        for p in model.parameters():
            p.add_(1.0)
        save_weights(model, weights, recorded_metadata(weights))
    x = torch.full((1, 1, 28, 28), 100, dtype=torch.uint8)
    monkeypatch.chdir(tmp_path / "a")
    run = attnconv.Run("run")
    assert run.path == tmp_path / "a" / "run"
    own = attnconv.Run("run").predict(x, top=3)
    monkeypatch.chdir(tmp_path / "b")
    assert run.predict(x, top=3) == own
    assert attnconv.Run("run").predict(x, top=3) != own  # the other run does answer otherwise


def test_round_79_b_dataset_names_and_models_of_another_type_are_one_line(tiny_attention_runs):
    """Round 79: load_dataset(5), load_dataset(Path(...)), dataset_info(None) failed on str's missing .strip;
    head_snapshot("m") and attention_sites("m") on .modules; analyze_captured([1, 2]) on .kind; a tensor of records
    on its truth; load_run(device="cuda") on a CPU build in torch's AssertionError."""
    from pathlib import Path

    from attnconv import data as D
    from attnconv.analysis import analyze_captured, head_snapshot

    for value in (5, None, ["fashion-mnist"]):
        for call in (D.load_dataset, D.dataset_info):
            with pytest.raises(AttnconvError, match=r"^dataset .* is invalid: give a dataset's name \(fashion-mnist, "
                                                    r"cifar10\) or 'folder:PATH', a str$"):
                call(value)
    with pytest.raises(AttnconvError, match=r"a str \(a folder: 'folder:imgs'\)$"):
        D.load_dataset(Path("imgs"))
    for call, name in ((head_snapshot, "head_snapshot"), (attnconv.attention_sites, "attention_sites")):
        with pytest.raises(AttnconvError, match=rf"^{name} takes an nn.Module, got str$"):
            call("m")
    for records in ([1, 2], "m", torch.zeros(2), iter([])):
        for call in (analyze_captured, attnconv.captured_sites):
            with pytest.raises(AttnconvError, match=r"^records .* is invalid: give the list capture_attention returns"):
                call(records)
    if not torch.cuda.is_available():
        with pytest.raises(AttnconvError, match=r"CUDA is not available here"):
            attnconv.load_run(tiny_attention_runs["sa-quadratic"], device="cuda")
    for device in (5, "gpu"):
        with pytest.raises(AttnconvError, match=r"device"):
            attnconv.load_run(tiny_attention_runs["sa-quadratic"], device=device)


def test_flags_take_what_python_code_passes():
    """What the flag check takes: bools, numpy's bools, and the ints 1 and 0 (a flag computed as `int(x > 0)`)."""
    import numpy as np

    from attnconv.limits import flag_argument

    for value, want in ((True, True), (False, False), (np.bool_(True), True), (1, True), (0, False)):
        got = flag_argument(value, "flag")
        assert got is want
    assert attnconv.SelfAttention2d(2, heads=2, max_size=8, bias=np.False_).out.bias is None


def test_round_80_a_a_run_reads_on_only_while_its_folder_is_the_run_it_read(tiny_attention_runs, tmp_path):
    """Round 80: a Run read its logs and weights when first asked: a folder renamed or removed since gave [] for its
    metrics and heads, and one replaced by another run gave that run's metrics and network under this run's config."""
    import shutil

    source = tiny_attention_runs["sa-quadratic"]
    other = tiny_attention_runs["sa-learned"]
    refused = r"not the run this Run read \(its folder was moved, removed or replaced, or its config.json changed " \
              r"since\); make a new Run of the run where it is now"
    for change in ("moved", "removed", "replaced", "edited"):
        folder = tmp_path / change
        shutil.copytree(source, folder)
        run = attnconv.Run(folder)
        if change == "moved":
            folder.rename(tmp_path / "elsewhere")
        elif change == "removed":
            shutil.rmtree(folder)
        elif change == "replaced":
            shutil.rmtree(folder)
            shutil.copytree(other, folder)
        else:
            (folder / "config.json").write_text((folder / "config.json").read_text().replace('"epochs": 1', '"epochs": 2'))
        for read in ("metrics", "heads", "model", "logs_metadata"):
            with pytest.raises(AttnconvError, match=refused):
                getattr(run, read)
    run = attnconv.Run(source)  # unchanged: read as ever
    assert run.metrics and run.heads and run.model is not None


def test_round_80_a_a_run_given_with_other_settings_is_refused_not_dropped(tiny_attention_runs, tmp_path):
    """Round 80: analyze_run and the run figures given a Run with data_dir, dataset or device dropped them without a
    word (even data_dir=5 or device="meta"); the same values given as the Run's own are taken."""
    from attnconv import plots as P
    from attnconv.analysis import analyze_run

    run = attnconv.Run(tiny_attention_runs["sa-quadratic"])
    for kwargs, said in (({"data_dir": 5}, r"^data_dir 5 is invalid"), ({"device": "meta"}, r"device"),
                         ({"dataset": "cifar10"}, r"^dataset=cifar10 given with a Run, which reads with its own "
                                                  r"\(device=cpu, data_dir=None, dataset=fashion-mnist\); give them to "
                                                  r"Run\(\.\.\.\), or give the run's folder instead$")):
        for call, args in ((analyze_run, {"images": 2}), (P.plot_centers, {"out": tmp_path / "c.png"})):
            with pytest.raises(AttnconvError, match=said):
                call(run, **args, **kwargs)
    assert analyze_run(run, images=2, device="cpu")["run"] == str(run.path)
    assert not list(tmp_path.iterdir())
    from attnconv.runs import as_run

    spelled = attnconv.Run(run.path, dataset="Fashion_MNIST")  # its own dataset, spelled otherwise: the same
    assert as_run(spelled, dataset="fashion-mnist", data_dir=None) is spelled


def test_round_80_a_a_run_holds_its_folder_dataset_absolute(tmp_path, monkeypatch):
    """Round 80: Run(..., dataset="folder:ds") kept the folder relative: after os.chdir the Run read another ds."""
    from fixtures_data import write_class_folder

    write_class_folder(tmp_path / "ds")
    monkeypatch.chdir(tmp_path)
    config = attnconv.make_config(model="sa-quadratic", dataset="folder:ds", max_steps=1, batch_size=2, workers=1,
                                  epochs=1, augment=False, model_overrides={"hidden": 8, "layers": 1, "image_size": 8})
    attnconv.train(config, tmp_path / "run", progress=False)
    run = attnconv.Run("run", dataset="folder:ds")
    assert run.dataset == f"folder:{tmp_path / 'ds'}"
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert len(run.test_set) == len(attnconv.Run(tmp_path / "run").test_set)


def test_round_80_a_head_snapshot_of_a_converted_network_says_what_to_use():
    """Round 80: head_snapshot of a network cnn_to_attention converted said its layers "need its input shape (C, H,
    W)", which head_snapshot cannot take, images given or not."""
    from attnconv.analysis import head_snapshot

    converted = attnconv.cnn_to_attention(nn.Sequential(nn.Conv2d(1, 2, 3)).eval())
    for x in (None, torch.randn(1, 1, 8, 8)):
        with pytest.raises(AttnconvError, match=r"^head_snapshot takes an attention classifier .* analysed by "
                                                r"analyze_layer, or by capture_attention and analyze_captured$"):
            head_snapshot(converted, x)


def test_round_80_a_a_run_path_reads_tilde_as_its_data_dir_does(tiny_attention_runs, tmp_path, monkeypatch):
    """Round 80 (a note): Run("~/run") read "~" as a folder of that name, while its data_dir expanded it."""
    import shutil

    shutil.copytree(tiny_attention_runs["sa-quadratic"], tmp_path / "run")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert attnconv.Run("~/run").path == tmp_path / "run"


def test_round_81_b_a_stale_run_is_not_exported_into_what_its_folder_holds_now(tiny_attention_runs, tmp_path):
    """Round 81: export_run of a Run whose folder was replaced (by a --overwrite, another run's copy) or moved since
    wrote the old network into the folder (a moved one made again holding only the export), and its check passed,
    comparing it with the old network."""
    import shutil

    from attnconv.export import export_run

    folder = tmp_path / "run"
    shutil.copytree(tiny_attention_runs["sa-quadratic"], folder)
    run = attnconv.Run(folder)
    assert run.model is not None  # loaded before the change, as a notebook holds it
    shutil.rmtree(folder)
    shutil.copytree(tiny_attention_runs["sa-learned"], folder)
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(AttnconvError, match=r"not the run this Run read"):
        export_run(run, "torchscript")
    assert sorted(p.name for p in folder.iterdir()) == before


def test_round_81_b_an_exporters_imports_finish_before_a_ctrl_c_is_delivered(monkeypatch):
    """Round 81: a Ctrl-C during a process's first ONNX export, while torch imported onnxscript or sympy, left the
    package half made, and every later export in the process failed ("module 'sympy' has no attribute 'core'; try
    another fmt"). The exporter's imports run whole first, the Ctrl-C held until they are done."""
    import importlib
    import signal

    from attnconv import export as E

    done = []
    real = importlib.import_module

    def interrupted(name, *args):
        if not done:
            signal.raise_signal(signal.SIGINT)  # a Ctrl-C as the first import starts
        done.append(name)
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", interrupted)
    with pytest.raises(KeyboardInterrupt):
        E.exporter_imported("onnx")
    wanted = E.EXPORTER_MODULES["onnx"]  # (the packages import_module some more themselves)
    assert [name for name in done if name in wanted] == list(wanted)  # every import done before the Ctrl-C came


def test_round_81_a_head_snapshot_of_a_model_without_a_config_takes_its_images():
    """Round 81 (a note): head_snapshot of a user's CNN asked for an input shape it cannot take."""
    from attnconv.analysis import head_snapshot
    from attnconv.models.sites import NoAttentionLayers

    cnn = nn.Sequential(nn.Conv2d(1, 2, 3))
    with pytest.raises(AttnconvError, match=r"^head_snapshot: Sequential has no config saying its input shape: give "
                                            r"its images x \(N, C, H, W\)"):
        head_snapshot(cnn)
    with pytest.raises(NoAttentionLayers):
        head_snapshot(cnn, torch.randn(1, 1, 8, 8))


def test_round_84_a_tilde_paths_of_unknown_users_and_of_new_runs(tiny_attention_runs, tmp_path, monkeypatch, capsys):
    """Round 84: a path beginning with `~nouser/` (a user that does not exist) was pathlib's traceback, "Could not
    determine home directory", from every command that reads a run and from every output; `train --out '~/x'` made a
    folder named `~` while every reader of the run read `~` as the home folder, so `eval` of the printed path found
    another run, or none; a dataset of another type, or unknown, given with a Run was said as "given with a Run"."""
    from PIL import Image

    from attnconv.analysis import analyze_run
    from attnconv.cli import main

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    Image.new("L", (28, 28)).save(tmp_path / "x.png")
    for argv in (["eval", "~nouser-attnconv/run"], ["predict", "~nouser-attnconv/run", "x.png"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "~nouser-attnconv" in err, err
    # an output there is a path as written, as the shell leaves it (its parent made, as an output's is)
    assert main(["report", str(tiny_attention_runs["sa-quadratic"]), "--out", "~nouser-attnconv/r.html"]) == 0
    assert (tmp_path / "~nouser-attnconv" / "r.html").is_file()
    with pytest.raises(AttnconvError, match=r"not a run directory"):
        attnconv.Run("~nouser-attnconv/run")
    config = attnconv.make_config(preset="fmnist-sa-quadratic", dataset="folder:/no-such-attnconv-folder")
    with pytest.raises(AttnconvError, match=r"no-such-attnconv-folder"):
        attnconv.train(config, "~/new")  # refused on its data before anything is made, but `out` read first
    run = attnconv.Run(tiny_attention_runs["sa-quadratic"])
    for dataset, said in ((Path("fashion-mnist"), r"^dataset PosixPath\('fashion-mnist'\) is invalid: give a "
                                                  r"dataset's name"),
                          (5, r"^dataset 5 is invalid"), ("mnist9", r"^unknown dataset 'mnist9'")):
        with pytest.raises(AttnconvError, match=said):
            analyze_run(run, images=2, dataset=dataset)
    assert not (tmp_path / "~").exists() and not (tmp_path / "home").exists()


def test_round_84_a_train_out_reads_tilde_as_the_run_s_readers_do(tmp_path, monkeypatch, capsys):
    """Round 84: `train --out '~/x'` wrote ./~/x and then printed `attnconv eval '~/x'`, which read $HOME/x."""
    from attnconv.limits import path_argument

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert path_argument("~/x", "out", "a path") == tmp_path / "home" / "x"
    assert path_argument("./~/x", "out", "a path") == Path("./~/x")  # a folder named ~, written so, stays one
    assert path_argument("~nouser-attnconv/x", "out", "a path") == Path("~nouser-attnconv/x")


def test_round_84_run_predict_reads_tilde_in_image_paths(tiny_attention_runs, tmp_path, monkeypatch):
    """A round-79 note: Run.predict(["~/x.png"]) did not expand `~`, while every other path did."""
    from PIL import Image

    (tmp_path / "home").mkdir()
    Image.new("L", (28, 28), 200).save(tmp_path / "home" / "x.png")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run = attnconv.Run(tiny_attention_runs["sa-quadratic"])
    assert run.predict(["~/x.png"]) == run.predict([tmp_path / "home" / "x.png"])
    with pytest.raises(AttnconvError, match=r"^images 'x\\x00.png' is invalid: a path holds no NUL character"):
        run.predict(["x\0.png"])
