"""Evaluation: accuracy, FLOPs (all ops and the paper's Linear-only convention), eval/table commands."""

import json
import math

import pytest
import torch
import torch.nn as nn
from fixtures_data import write_random_fashion

from attnconv.cli import main
from attnconv.data import ImageSet, dataset_info
from attnconv.evaluate import count_flops, count_params, evaluate, format_table
from attnconv.models import build_model
from attnconv.train import read_metrics


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


def test_table_command_prints_markdown(tiny_run, capsys):
    assert main(["table", str(tiny_run), str(tiny_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| model | dataset | test acc | params | FLOPs (all ops) | FLOPs (Linear only) | s/epoch |"
    assert len(lines) == 4 and lines[2] == lines[3] and lines[2].startswith("| sa-quadratic | fashion-mnist | ")


def test_format_table_rounds_like_the_paper():
    row = {"model": "resnet18", "dataset": "cifar10", "test_acc": 0.938, "params": 11_173_962,
           "flops_total": 1_110_845_440, "flops_linear": 10_240, "seconds_per_epoch": 12.34}
    assert format_table([row]).splitlines()[2] == "| resnet18 | cifar10 | 0.9380 | 11.2M | 1.11B | 10.2k | 12.3 |"
    unfinished = {**row, "test_acc": None, "seconds_per_epoch": None}
    assert format_table([unfinished]).splitlines()[2] == "| resnet18 | cifar10 | - | 11.2M | 1.11B | 10.2k | - |"


def test_eval_of_a_directory_that_is_not_a_run_is_one_line_exit_2(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not a run directory" in err and err.count("\n") == 1
    assert main(["table", str(tmp_path / "missing")]) == 2
