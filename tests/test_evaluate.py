"""Evaluation: accuracy, FLOPs (all ops and the paper's Linear-only convention), eval/table commands."""

import json
import math
import statistics

import pytest
import torch
import torch.nn as nn
from fixtures_data import write_random_fashion

from attnconv.cli import main
from attnconv.data import ImageSet, dataset_info
from attnconv.errors import AttnconvError
from attnconv.evaluate import (
    confusion_matrix,
    count_flops,
    count_params,
    describe_run,
    evaluate,
    group_runs,
    per_class_accuracy,
    predict_all,
    runs_table,
    table_row,
)
from attnconv.models import build_model
from attnconv.runs import Run, metrics_text, read_metrics
from attnconv.tables import significant


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A 4-step run of a tiny attention model on 64 + 48 random 28x28 images."""
    root = tmp_path_factory.mktemp("eval")
    data = root / "data"
    data.mkdir()
    write_random_fashion(data, 64, 48, seed=1)
    out = root / "run"
    argv = ["train", "--model", "sa-quadratic", "--hidden", "16", "--layers", "1", "--heads", "4",
            "--intermediate", "16", "--downsample", "4", "--dataset", "fashion-mnist", "--data-dir", str(data),
            "--epochs", "2", "--batch-size", "32", "--workers", "1", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    return out


class _Tokens(nn.Module):
    """(B, C, H, W) -> Linear over channels at every pixel -> mean -> Linear to classes."""

    def __init__(self, c: int, d: int, k: int):
        super().__init__()
        self.proj, self.head = nn.Linear(c, d), nn.Linear(d, k)

    def forward(self, x):
        return self.head(self.proj(x.permute(0, 2, 3, 1)).mean(dim=(1, 2)))


def test_linear_flops_are_two_per_multiply_add_per_token():
    flops = count_flops(_Tokens(3, 8, 5), (3, 4, 6))
    expected = 2 * (4 * 6) * 3 * 8 + 2 * 8 * 5
    assert flops["linear_only"] == expected
    assert flops["total"] == expected  # nothing but Linear layers: both conventions agree
    assert count_flops(_Tokens(3, 8, 5), (7, 3, 4, 6))["total"] == expected  # per image at batch 7


def test_resnet18_flops_match_the_papers_multiply_adds():
    flops = count_flops(build_model("resnet18"), (3, 32, 32))
    # Table 1 lists 0.56B for ResNet-18: the convolutions' multiply-adds.
    assert flops["total"] / 2 == pytest.approx(0.556e9, rel=0.01)
    assert flops["linear_only"] == 2 * 512 * 10
    assert set(flops["by_op"]) == {"aten.convolution", "aten.addmm"}


@pytest.mark.parametrize("name, paper", [("sa-quadratic", 6.2e9), ("sa-learned-content", 15e9)])
def test_linear_only_flops_reproduce_table_1(name, paper):
    flops = count_flops(build_model(name), (3, 32, 32))
    assert flops["linear_only"] == pytest.approx(paper, rel=0.01)
    assert flops["total"] > flops["linear_only"] * 1.05  # attention's own products are counted too


def test_every_attention_path_is_counted_the_same():
    """Content attention through SDPA (on the CPU kernel too) costs what the dense path does."""
    kw = dict(hidden=16, heads=4, layers=1, intermediate=16, image_size=16)
    dense = count_flops(build_model("sa-learned-content", impl="dense", **kw), (3, 16, 16))
    sdpa = count_flops(build_model("sa-learned-content", impl="sdpa", **kw), (3, 16, 16))
    assert sdpa["total"] == dense["total"] and dense["total"] > dense["linear_only"]


def test_evaluate_matches_a_hand_computed_loss_and_accuracy():
    info = dataset_info("fashion-mnist")
    labels = torch.tensor([3, 3, 1, 0, 3, 9, 2])
    images = torch.zeros(7, 1, 28, 28, dtype=torch.uint8)

    class Always3(nn.Module):
        def forward(self, x):
            logits = torch.zeros(len(x), 10)
            logits[:, 3] = math.log(2.0)  # p(3) = 2/11, every other class 1/11
            return logits

    loss, acc = evaluate(Always3(), ImageSet(images, labels), info, batch_size=3)
    assert acc == pytest.approx(3 / 7)
    assert loss == pytest.approx((3 * math.log(11 / 2) + 4 * math.log(11)) / 7)


def test_evaluate_restores_training_mode():
    model = build_model("resnet18", in_channels=1, width=4).train()
    info = dataset_info("fashion-mnist")
    evaluate(model, ImageSet(torch.zeros(2, 1, 28, 28, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64)), info)
    assert model.training


def test_eval_command_reports_accuracy_params_and_flops(tiny_run, capsys):
    assert main(["eval", str(tiny_run), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    last = read_metrics(tiny_run)[-1]
    assert result["test_acc"] == last["test_acc"]  # recomputed from the weights on the test set
    assert result["test_loss"] == pytest.approx(last["test_loss"], rel=1e-5)
    model = build_model("sa-quadratic", hidden=16, layers=1, heads=4, intermediate=16, downsample=4,
                        in_channels=1, image_size=28)
    assert result["params"] == count_params(model)
    assert result["flops_total"] == count_flops(model, (1, 28, 28))["total"] > result["flops_linear"] > 0
    assert main(["eval", str(tiny_run)]) == 0
    text = capsys.readouterr().out
    assert "test acc" in text and "Linear layers only" in text and f"{result['params']:,}" in text


def test_confusion_matrix_rows_are_true_classes_columns_predictions():
    labels = [0, 0, 1, 2, 2, 2]
    predicted = [0, 1, 1, 2, 0, 2]  # class 3 has no images
    confusion = confusion_matrix(torch.tensor(labels), torch.tensor(predicted), 4)
    assert confusion.dtype == torch.int64
    assert confusion.tolist() == [[1, 1, 0, 0],  # two 0s: one right, one taken for a 1
                                  [0, 1, 0, 0],
                                  [1, 0, 2, 0],  # a 2 taken for a 0 (row 2, column 0; not row 0, column 2)
                                  [0, 0, 0, 0]]
    assert per_class_accuracy(confusion) == [0.5, 1.0, pytest.approx(2 / 3), None]
    assert per_class_accuracy(confusion.tolist())[:2] == [0.5, 1.0]  # lists (a --json summary) too
    with pytest.raises(AttnconvError, match="outside 0..3"):
        confusion_matrix([0, 4], [0, 0], 4)


def test_predict_all_agrees_with_evaluate_and_restores_training_mode():
    info = dataset_info("fashion-mnist")
    torch.manual_seed(0)
    test = ImageSet(torch.randint(0, 256, (11, 1, 28, 28), dtype=torch.uint8), torch.arange(11) % 10)
    model = build_model("resnet18", in_channels=1, width=2).train()
    result = predict_all(model, test, info, batch_size=4)
    assert model.training
    loss, acc = evaluate(model, test, info, batch_size=4)
    assert (result["loss"], result["accuracy"]) == (loss, acc)
    x = ((test.images.float() / 255 - info.mean[0]) / info.std[0])
    probs = model.eval()(x).softmax(1)
    assert torch.equal(result["predictions"], probs.argmax(1))
    assert torch.allclose(result["probabilities"], probs.max(1).values, atol=1e-6)


def _direct_confusion(run_dir):
    """The confusion matrix counted by hand from the model's own predictions on the run's test set."""
    run = Run(run_dir)
    _, x = run.test_images()
    with torch.no_grad():
        predicted = run.model(x).argmax(1).tolist()
    labels = run.test_set.labels.tolist()
    n = run.info.num_classes
    counts = [[0] * n for _ in range(n)]
    for t, p in zip(labels, predicted):
        counts[t][p] += 1
    return list(run.info.classes), counts


def test_eval_reports_each_class_and_the_confusion_matrix_of_the_models_predictions(tiny_run, capsys):
    classes, counts = _direct_confusion(tiny_run)
    assert main(["eval", str(tiny_run), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["classes"] == classes and result["confusion"] == counts
    assert result["test_acc"] == sum(counts[i][i] for i in range(10)) / 48
    for name, row, i in zip(classes, counts, range(10)):
        assert result["per_class"][name] == (row[i] / sum(row) if sum(row) else None)

    assert main(["eval", str(tiny_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("per class")
    for name, row, i in zip(classes, counts, range(10)):
        acc = significant(row[i] / sum(row)) if sum(row) else "-"
        assert lines[start + 3 + i].split() == [*name.split(), acc, str(sum(row))]
    matrix = lines.index("confusion matrix (rows: true class, columns: predicted)")
    assert lines[matrix + 1].split()[3:] == ["T-shi", "Trous", "Pullo", "Dress", "Coat", "Sanda", "Shirt", "Sneak",
                                             "Bag", "Ankle"]
    for name, row, line in zip(classes, counts, lines[matrix + 3 : matrix + 13]):
        assert line.split() == [*name.split(), *map(str, row)]


def test_eval_measures_the_test_set_once(tiny_run):
    run = Run(tiny_run)
    seen = []
    run.model.register_forward_hook(lambda module, args, out: seen.append(len(args[0])))
    summary = describe_run(run, recompute=True, batch_size=20)
    # count_flops's one image, then one pass over the 48 test images for accuracy, loss and the matrix
    assert seen == [1, 20, 20, 8]
    assert sum(map(sum, summary["confusion"])) == 48


HEADER = "| model | dataset | seeds | epochs | test acc | params | FLOPs (all ops) | FLOPs (Linear only) | s/epoch |"


def test_table_command_prints_markdown(tiny_run, capsys):
    assert main(["table", str(tiny_run), "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == HEADER and lines[1] == "|---|---|" + "---:|" * 7
    assert len(lines) == 3 and lines[2].startswith("| sa-quadratic | fashion-mnist | 1 | 2 | ")


def test_table_command_prints_aligned_text_by_default(tiny_run, capsys):
    assert main(["table", str(tiny_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["model", "dataset", "seeds", "epochs", "test", "acc", "params", "FLOPs", "(all",
                                "ops)", "FLOPs", "(Linear", "only)", "s/epoch"]
    assert set(lines[1]) == {"-", " "} and len(lines) == 3 and lines[2].split()[:4] == ["sa-quadratic",
                                                                                     "fashion-mnist", "1", "2"]


def _summary(model="resnet18", setup=None, **numbers):
    row = {"run": "r", "model": model, "dataset": "cifar10", "epochs": 300, "test_acc": 0.938, "seed": 0,
           "params": 11_173_962, "flops_total": 1_110_845_440, "flops_linear": 10_240, "seconds_per_epoch": 12.34,
           "setup": {"model": model, **(setup or {})}}
    return {**row, **numbers}


def test_runs_table_rounds_like_the_paper():
    row = _summary()
    table = runs_table([row], markdown=True)
    assert table.splitlines()[2] == "| resnet18 | cifar10 | 1 | 300 | 0.9380 | 11.2M | 1.11B | 10.2k | 12.3 |"
    unfinished = {**row, "test_acc": None, "seconds_per_epoch": None, "epochs": 0}
    table = runs_table([unfinished], markdown=True)
    assert table.splitlines()[2] == "| resnet18 | cifar10 | 1 | 0 | - | 11.2M | 1.11B | 10.2k | - |"


def test_group_runs_averages_the_seeds_of_one_setup():
    runs = [_summary(test_acc=a, seed=s, seconds_per_epoch=t, run=f"seed{s}")
            for s, (a, t) in enumerate([(0.90, 10.0), (0.92, 12.0), (0.97, 20.0)])]
    (row,) = group_runs(runs)
    assert row["n"] == 3 and row["seeds"] == [0, 1, 2] and row["runs"] == ["seed0", "seed1", "seed2"]
    assert row["test_acc"] == pytest.approx(0.93)
    assert row["test_acc_std"] == pytest.approx(math.sqrt(((0.03) ** 2 + 0.01**2 + 0.04**2) / 2))  # n - 1
    assert row["seconds_per_epoch"] == pytest.approx(14.0)
    assert table_row(row)[4] == "0.9300 ± 0.0361"


def test_group_runs_orders_rows_as_table_1_and_tells_apart_setups_of_one_model():
    runs = [_summary(m, test_acc=0.5) for m in ("sa-learned-content", "zz-other", "sa-learned", "sa-quadratic-aniso")]
    runs += [_summary("sa-quadratic", {"amp": amp}, seed=s) for amp in (True, False) for s in (0, 1)]
    runs += [_summary("resnet18"), _summary("resnet18 (as attention)", {"model": "resnet18", "converted": {"fold_bn": True}})]
    rows = group_runs(runs)
    assert [r["model"] for r in rows] == ["resnet18", "sa-quadratic (amp=False)", "sa-quadratic (amp=True)",
                                          "sa-quadratic-aniso", "sa-learned", "sa-learned-content",
                                          "resnet18 (as attention)", "zz-other"]
    assert [r["n"] for r in rows] == [1, 2, 2, 1, 1, 1, 1, 1]
    assert rows[1]["test_acc_std"] == 0 and rows[0]["test_acc_std"] is None


def test_a_run_given_twice_is_not_two_seeds(tiny_run, capsys):
    with pytest.raises(AttnconvError, match="same seed 0: give each run once"):
        group_runs([_summary(run="a"), _summary(run="b"), _summary(run="c", seed=1)])
    assert main(["table", str(tiny_run), str(tiny_run)]) == 2
    assert "hold the same metrics.csv: one run's logs twice; give each run once" in capsys.readouterr().err


def test_one_runs_logs_under_two_seeds_config_json_are_one_run(tiny_run, tmp_path, capsys):
    """A seed whose metrics.csv is a copy of another's (saved again with a byte-order mark) under its own
    config.json of another seed was averaged as a second seed, in table and compare."""
    group = tmp_path / "group"
    for seed in (0, 1):
        _strip(tiny_run, group / f"seed{seed}", seed=seed)
    text = (group / "seed0" / "metrics.csv").read_bytes()
    (group / "seed1" / "metrics.csv").write_bytes(b"\xef\xbb\xbf" + text.replace(b"\n", b"\r\n"))
    for command in (["table", str(group / "seed0"), str(group / "seed1")], ["compare", str(group)]):
        assert main(command) == 2, command
        assert "hold the same metrics.csv: one run's logs twice" in capsys.readouterr().err


def test_table_epochs_show_runs_that_have_not_all_finished():
    rows = group_runs([_summary(epochs=3, seed=0), _summary(epochs=2, seed=1, test_acc=None)])
    assert rows[0]["epochs"] == (2, 3) and rows[0]["n"] == 2
    # the mean of the runs with an accuracy, and how many of the row's runs those are (it said "0.9380" under n 2)
    assert table_row(rows[0])[2:5] == ["2", "2-3", "0.9380 (1 of 2 runs)"]
    both = group_runs([_summary(epochs=3, seed=0), _summary(epochs=2, seed=1)])
    assert table_row(both[0])[4] == "0.9380 ± 0.0000"


# ------------------------------------------------------------- Table 1 from run directories without weights


def _strip(run, dest, *, acc=None, meta_changes=None, **config):
    """A copy of run holding only config.json (config fields changed) and metrics.csv (last accuracy `acc`)."""
    dest.mkdir(parents=True)
    meta = json.loads((run / "config.json").read_text())
    meta["config"].update(config)
    meta.update(meta_changes or {})
    (dest / "config.json").write_text(json.dumps(meta))
    rows = read_metrics(run)
    if acc is not None:
        rows[-1]["test_acc"] = acc
    (dest / "metrics.csv").write_text(metrics_text(rows))
    return dest


def test_table_of_runs_without_weights_groups_seeds(tiny_run, tmp_path, capsys):
    accs = [0.25, 0.5, 0.75]
    dirs = [_strip(tiny_run, tmp_path / f"seed{s}", acc=a, seed=s, device="cuda", workers=s + 1, data_dir=None,
                   checkpoint_every=s, compile=bool(s), preset="fmnist-sa-quadratic" if s else None)
            for s, a in enumerate(accs)]
    assert not any((d / "model.safetensors").exists() for d in dirs)
    with_weights = describe_run(tiny_run)
    summaries = [describe_run(d) for d in dirs]
    for s in summaries:  # parameters from config.json, FLOPs from the architecture: as with the weights
        for key in ("params", "flops_total", "flops_linear", "setup"):
            assert s[key] == with_weights[key]
    assert main(["table", *map(str, dirs), "--markdown"]) == 0
    cells = capsys.readouterr().out.splitlines()[2].strip("| ").split(" | ")
    alone = runs_table([with_weights], markdown=True).splitlines()[2].strip("| ").split(" | ")
    assert cells[:5] == ["sa-quadratic", "fashion-mnist", "3", "2", "0.5000 ± 0.2500"]
    assert cells[5:8] == alone[5:8]  # params, FLOPs (all ops), FLOPs (Linear only)
    assert cells[8] == f"{statistics.fmean(s['seconds_per_epoch'] for s in summaries):.1f}"


def test_table_of_a_run_without_its_parameter_count_counts_the_architecture(tiny_run, tmp_path):
    meta = json.loads((tiny_run / "config.json").read_text())
    del meta["parameters"]
    d = _strip(tiny_run, tmp_path / "old")
    (d / "config.json").write_text(json.dumps(meta))
    assert describe_run(d)["params"] == describe_run(tiny_run)["params"] > 0


def test_table_recompute_needs_the_weights(tiny_run, tmp_path, capsys):
    d = _strip(tiny_run, tmp_path / "stripped")
    assert main(["table", str(d), "--recompute"]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors" in err and err.count("\n") == 1
    assert main(["table", str(tiny_run), "--recompute", "--markdown"]) == 0
    acc = read_metrics(tiny_run)[-1]["test_acc"]
    assert f" {acc:.4f} " in capsys.readouterr().out  # measured anew: the last epoch's accuracy again


def test_eval_of_a_directory_that_is_not_a_run_is_one_line_exit_2(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not a run directory" in err and err.count("\n") == 1
    assert main(["table", str(tmp_path / "missing")]) == 2


def test_crop_and_flip_count_in_a_setup_only_with_augment_on():
    """Runs without augmentation compute the same whatever their crop and flip options say (an older
    config.json lacks them): one setup; with augmentation they tell runs apart."""
    from attnconv.evaluate import run_setup

    base = {"model": "sa-quadratic", "dataset": "fashion-mnist", "lr": 0.1, "seed": 0}
    off_new = run_setup({"config": {**base, "augment": False, "crop_pad": 4, "flip": True}})
    off_old = run_setup({"config": {**base, "augment": False, "seed": 1}})
    assert off_new == off_old
    on = [run_setup({"config": {**base, "augment": True, "crop_pad": p, "flip": True}}) for p in (2, 4)]
    assert on[0] != on[1] and on[0]["crop_pad"] == 2
