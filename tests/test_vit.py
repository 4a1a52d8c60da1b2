"""The plain ViT (model `vit`, preset `fmnist-vit`) and every command on its runs, through the capture."""

import json

import pytest
import torch
from test_train import data_dir  # noqa: F401  (a fixture)

from attnconv import AttnconvError, Run, build_model, capture_attention
from attnconv.analysis import head_snapshot
from attnconv.cli import main
from attnconv.config import PRESETS
from attnconv.dataset_presets import dataset_preset
from attnconv.explorer import Explorer
from attnconv.models import no_weight_decay
from attnconv.models.sites import attention_sites, records_heads

SMALL = dict(in_channels=1, image_size=28, hidden=12, heads=3, layers=2, intermediate=16)


def params(name: str, **overrides) -> int:
    return sum(p.numel() for p in build_model(name, **overrides).parameters())


def test_the_preset_is_sized_like_the_attention_preset():
    vit, sa = PRESETS["fmnist-vit"], PRESETS["fmnist-sa-quadratic"]
    data = dict(in_channels=1, image_size=28)
    n_vit, n_sa = params("vit", **data, **vit.model_overrides), params("sa-quadratic", **data, **sa.model_overrides)
    assert 0.4e6 < n_vit < 0.7e6 and 0.9 < n_vit / n_sa < 1.2
    assert (vit.optimizer, vit.lr, vit.weight_decay, vit.schedule, vit.epochs, vit.batch_size) == \
        (sa.optimizer, sa.lr, sa.weight_decay, sa.schedule, 12, sa.batch_size)
    assert vit.model_overrides["heads"] == sa.model_overrides["heads"] == 9
    name, base = dataset_preset("vit", "fashion-mnist")
    assert "fmnist-vit" in name and base == vit


def test_patches_class_token_positions_and_sdpa_blocks():
    torch.manual_seed(0)
    model = build_model("vit", **SMALL).eval()
    x = torch.randn(3, 1, 28, 28)
    tokens = model.tokens(x)
    assert tokens.shape == (3, 1 + 7 * 7, 12) and model.config.grid == 7 and model.config.downsample == 4
    # the class token leads, every patch token carries its own position embedding
    torch.testing.assert_close(tokens[:, 0], (model.positions.cls_token + model.positions.pos_embed[:, :1])[0]
                               .expand(3, -1))
    assert model.forward_features(x).shape == (3, 12) and model(x).shape == (3, 10)
    records = capture_attention(model, x)
    assert [(r.path, r.kind, r.size, r.left_out) for r in records] == \
        [(f"blocks.{i}.attn", "sdpa", (7, 7), (1, 1, 0)) for i in range(2)]
    assert no_weight_decay(model) == {"positions.cls_token", "positions.pos_embed"}


def test_value_maps_reproduce_the_attention_layer():
    torch.manual_seed(1)
    attn = build_model("vit", **SMALL).double().blocks[0].attn
    t = torch.randn(1, 50, 12, dtype=torch.float64)
    q, k, _ = attn.qkv(t).reshape(1, 50, 3, 3, 4).permute(2, 0, 3, 1, 4)
    p = (q @ k.transpose(-1, -2) / 2).softmax(-1)[0]  # (heads, 50, 50), scale 1/sqrt(4)
    maps, bias = attn.value_maps()
    torch.testing.assert_close(torch.einsum("hqk,hoc,kc->qo", p, maps, t[0]) + bias, attn(t)[0])


def test_bad_options_and_inputs_are_one_error():
    with pytest.raises(AttnconvError, match="patch 5 is invalid: image_size 28"):
        build_model("vit", in_channels=1, image_size=28, patch=5)
    with pytest.raises(AttnconvError, match="heads 5 is invalid: hidden 12"):
        build_model("vit", **{**SMALL, "heads": 5})
    with pytest.raises(AttnconvError, match=r"\(B, 1, 28, 28\)"):
        build_model("vit", **SMALL)(torch.randn(1, 1, 32, 32))


def test_sites_and_heads_snapshot_of_a_vit():
    torch.manual_seed(2)
    model = build_model("vit", **SMALL)
    sites = attention_sites(model)
    assert [(s.path, s.size, s.layer.heads, s.position_only) for s in sites] == \
        [(f"blocks.{i}.attn", (7, 7), 3, False) for i in range(2)]
    assert records_heads(model) and not records_heads(build_model("resnet18", in_channels=1, image_size=28, width=4))
    x = torch.randn(5, 1, 28, 28)
    snap = head_snapshot(model, x)
    assert len(snap) == 2 and all(len(layer) == 3 for layer in snap)
    # fresh weights: nearly uniform attention, so centers near the middle and distances near the uniform mean
    grid = torch.stack(torch.meshgrid(torch.arange(7.0), torch.arange(7.0), indexing="ij"), -1).reshape(-1, 2)
    uniform = torch.cdist(grid, grid).mean().item()
    for layer in snap:
        for h in layer:
            assert set(h) == {"center", "attention_distance"}
            assert max(abs(c) for c in h["center"]) < 0.2 and h["attention_distance"] == pytest.approx(uniform, rel=0.05)
    assert model.training  # kept


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory, data_dir):  # noqa: F811
    out = tmp_path_factory.mktemp("vit") / "run"
    assert main(["train", "--model", "vit", "--dataset", "fashion-mnist", "--data-dir", str(data_dir),
                 "--hidden", "12", "--heads", "3", "--layers", "2", "--intermediate", "16", "--epochs", "1",
                 "--max-steps", "2", "--batch-size", "32", "--no-progress", "--out", str(out)]) == 0
    return out


def test_training_a_vit_records_its_heads(vit_run):
    cfg = json.loads((vit_run / "config.json").read_text())["config"]
    assert cfg["model"] == "vit" and cfg["preset"] is None and cfg["optimizer"] == "adamw"
    assert cfg["model_overrides"]["patch"] == 4  # the fmnist-vit preset, with the flags on top
    snaps = [json.loads(line) for line in (vit_run / "heads.jsonl").read_text().splitlines()]
    assert [s["epoch"] for s in snaps] == [0, 1] and all(len(s["layers"]) == 2 for s in snaps)
    assert all(len(layer) == 3 and "attention_distance" in layer[0] for s in snaps for layer in s["layers"])


def test_analyze_plots_report_and_explore_work_on_a_vit_run(vit_run, data_dir, capsys):  # noqa: F811
    common = ["--data-dir", str(data_dir), "--images", "8"]
    assert main(["analyze", str(vit_run), "--json", *common]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "vit" and result["size"] == [7, 7] and result["images"] == 8
    assert [x["path"] for x in result["layers"]] == ["blocks.0.attn", "blocks.1.attn"]
    layer = result["layers"][0]
    assert layer["encoding"] == "captured sdpa" and "leading token" in layer["probabilities"]
    assert layer["conv_likeness"]["distance"] >= 0 and len(layer["heads"]) == 3
    assert [len(s["layers"]) for s in result["history"]] == [2, 2]  # grid-likeness from heads.jsonl
    assert main(["analyze", str(vit_run), *common]) == 0
    assert "distance to the nearest 3x3 conv" in capsys.readouterr().out
    for figure in (["plot", "maps", str(vit_run), *common], ["plot", "maps", str(vit_run), "--image", "3", *common[:2]],
                   ["plot", "distance", str(vit_run)], ["plot", "centers", str(vit_run), *common],
                   ["plot", "centers", str(vit_run), "--layer", "2"]):
        assert main(figure) == 0
    for name in ("maps.png", "maps-image-3.png", "distance.png", "centers.png", "centers-layer2.png"):
        assert (vit_run / name).stat().st_size > 1000, name
    assert main(["report", str(vit_run), *common]) == 0
    page = (vit_run / "report.html").read_text()
    assert "Heads over training" in page and "captured sdpa" in page and "no attention layers" not in page

    explorer = Explorer(vit_run, images=3, data_dir=data_dir)
    info = explorer.info()
    assert (info["layers"], info["heads"], info["grid"], info["downsample"]) == (2, 3, [7, 7], 4)
    assert info["terms"] == ["combined", "content"] and info["recorded_epochs"] == [0, 1]
    probs = explorer.attention(1, 3, 4)
    scores = explorer.attention(1, 3, 4, mode="scores", term="content")
    assert probs["layer_numbers"] == [1, 2] and len(probs["layers"][0]) == 3 and len(probs["layers"][0][0]) == 49
    # the page's probabilities: the attention over the 7x7 positions of image 1, query (3, 4), as captured
    run = Run(vit_run, data_dir=data_dir)
    x = run.test_images(index=explorer.indices[1])[1]
    want = capture_attention(run.model, x)[0].image_probs()[:, 3 * 7 + 4]
    torch.testing.assert_close(torch.tensor(probs["layers"][0]), want.float(), rtol=1e-5, atol=1e-6)
    assert torch.tensor(scores["layers"][0]).softmax(-1).allclose(torch.tensor(probs["layers"][0]), atol=1e-5)
    assert len(explorer.heads()["snapshots"]) == 2


def test_a_vit_with_its_patch_embedding_converted_keeps_its_attention_blocks(vit_run, data_dir, tmp_path,  # noqa: F811
                                                                              capsys):
    """`convert` of a ViT run turns its patch embedding (a 4x4 stride-4 conv) into attention: the converted run's
    sites are that layer and the ViT's own blocks (they were dropped, leaving only the patch embedding, when a
    model held both kinds), and `convert` neither claims a BatchNorm folded (a ViT has none) nor calls the ViT a
    CNN in its table."""
    out = tmp_path / "converted"
    capsys.readouterr()
    assert main(["convert", str(vit_run), "--out", str(out), "--data-dir", str(data_dir), "--eval-images", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"converted {vit_run} -> {out}  (no BatchNorm to fold)", lines
    assert [line.split()[0] for line in lines[1:4]] == ["network", "vit", "converted"], lines
    run = Run(out)
    assert [(s.path, s.size) for s in run.sites] == [("patch_embed", (28, 28)), ("blocks.0.attn", (7, 7)),
                                                     ("blocks.1.attn", (7, 7))]
    assert run.sites[0].layer.heads == 16 and run.sites[1].layer.heads == 3
    assert main(["analyze", str(out), "--json", "--data-dir", str(data_dir), "--images", "4"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [x["path"] for x in result["layers"]] == ["patch_embed", "blocks.0.attn", "blocks.1.attn"]


def test_figures_report_and_explorer_draw_each_layer_with_its_own_heads(vit_run, data_dir, tmp_path, capsys):  # noqa: F811
    """A converted ViT's patch layer has 16 heads (patch 4), its blocks 3: the maps and centers figures and the
    report took the first layer's count for every layer (IndexError: index 3 is out of bounds), and the explorer
    drew 16 columns for every layer. Each layer is drawn with its own heads; `plot distance` on a converted run
    says it records no heads (not "train the run again", which records none either)."""
    from attnconv.explorer import Explorer
    from attnconv.plots.figures import centers_figure, distance_figure

    out = tmp_path / "converted"
    assert main(["convert", str(vit_run), "--out", str(out), "--no-eval"]) == 0
    common = ["--data-dir", str(data_dir), "--images", "4"]
    for command in (["plot", "maps", str(out), *common], ["plot", "centers", str(out), *common],
                    ["report", str(out), *common]):
        assert main(command) == 0, command
    assert (out / "maps.png").stat().st_size > 1000 and (out / "centers.png").stat().st_size > 1000
    capsys.readouterr()
    assert main(["plot", "distance", str(out)]) == 2
    err = capsys.readouterr().err
    assert "a network converted from a CNN" in err and "plot centers" in err and "again" not in err, err
    info = Explorer(out, images=2, data_dir=data_dir).info()
    assert info["heads"] == 16 and info["layer_heads"] == [16, 3, 3]
    # the figures themselves: rows of other head counts, a legend for the widest
    geometry = [{"centers": [[0.0, 0.0]] * n, "inverse_covariance": [[[1.0, 0.0], [0.0, 1.0]]] * n} for n in (4, 6)]
    fig = centers_figure(geometry, 5)
    assert [t.get_text() for t in fig.legends[0].get_texts()][:6] == [f"head {h}" for h in range(1, 7)]
    snaps = [{"epoch": e, "layers": [[{"attention_distance": 1.0}] * 4, [{"attention_distance": 2.0}] * 6]}
             for e in (0, 1)]
    assert len(distance_figure(snaps).axes) == 2
