import json
import warnings

import pytest
import torch

from attnconv import bench
from attnconv.attention import SelfAttention2d
from attnconv.attention.select import IMPLS, resolve_impl
from attnconv.bench.cases import set_impl
from attnconv.bench.config import EPOCH_STEPS, FULLSIZE_UTILIZATION_TARGET, LAYER_ENCODINGS, PRESET_TARGET
from attnconv.bench.conv import RelativeBiasAttention, swin_heads
from attnconv.bench.estimates import estimate_layer_bytes, fit_batch
from attnconv.bench.flex import FlexContentAttention, flex_unavailable
from attnconv.bench.grid import ONE_TILE, RUNNERS_UP
from attnconv.bench.results import fmt_bytes, fmt_seconds
from attnconv.bench.timing import Timing, interleaved_order, rel_diff, speedup, target_status, time_variants
from attnconv.cli import main
from attnconv.models import build_model
from attnconv.tables import format_table

# ------------------------------------------------------------------ timing and ratio helpers


def test_interleaved_order_alternates_direction():
    assert interleaved_order(["a", "b"], 3) == ["a", "b", "b", "a", "a", "b"]
    assert interleaved_order(["a"], 2) == ["a", "a"]


def test_time_variants_warms_up_then_times_interleaved_runs():
    now = [0.0]
    calls = []

    def clock():
        return now[0]

    def variant(name, seconds):
        def run():
            calls.append(name)
            now[0] += seconds

        return run

    timings = time_variants({"dense": variant("dense", 3.0), "fast": variant("fast", 1.0)},
                                  warmup=2, repeats=3, clock=clock)
    assert calls == ["dense", "fast"] * 2 + ["dense", "fast", "fast", "dense", "dense", "fast"]
    assert timings["dense"].samples == [3.0, 3.0, 3.0] and timings["fast"].samples == [1.0, 1.0, 1.0]
    assert speedup(timings["dense"], timings["fast"]) == 3.0


def test_timing_reports_median_min_max():
    t = Timing([5.0, 1.0, 2.0, 100.0, 3.0])
    assert (t.median, t.min, t.max) == (3.0, 1.0, 100.0)
    assert Timing([1.0, 3.0]).median == 2.0


def test_speedup_is_baseline_median_over_variant_median():
    dense, fast = Timing([4.0, 4.0, 40.0]), Timing([2.0, 1.0, 2.0])
    assert speedup(dense, fast) == 2.0
    assert speedup(fast, dense) == 0.5


def test_rel_diff_is_max_error_over_max_reference():
    ref = torch.tensor([1.0, -4.0, 2.0])
    assert rel_diff(ref + torch.tensor([0.0, 0.0, 0.4]), ref) == pytest.approx(0.1)
    assert rel_diff(ref, ref) == 0.0
    assert rel_diff(torch.tensor([0.5]), torch.zeros(1)) == 0.5


def test_target_status_says_met_or_missed():
    assert target_status(2.6, 2.5) == ">= 2.5x met"
    assert target_status(1.29, 1.3) == ">= 1.3x missed"
    assert target_status(3.0, None) == ""
    assert target_status(None, 1.2) == ""


def test_fit_batch_halves_until_the_estimate_fits():
    per_sample = lambda b: 10 * b  # noqa: E731
    assert fit_batch(per_sample, 32, 1000) == 32
    assert fit_batch(per_sample, 32, 100) == 8
    assert fit_batch(lambda b: 10 * b + 1000, 32, 100) == 0


def test_dense_estimate_grows_with_tokens_squared_and_exceeds_separable():
    small = estimate_layer_bytes("dense", "quadratic", 32, 32, 400, 9)
    large = estimate_layer_bytes("dense", "quadratic", 32, 64, 400, 9)
    assert large > 8 * small  # 4x the tokens: the (T x T) terms dominate
    for side, factor in ((32, 1), (64, 2.5)):  # measured at 32x32, batch 2: dense 1.4x the separable path
        assert estimate_layer_bytes("dense", "quadratic", 32, side, 400, 9) > \
            factor * estimate_layer_bytes("separable", "quadratic", 32, side, 400, 9)
    # the 64x64 layer at batch 32: the dense probabilities alone are 32*9*4096^2 floats (19 GB)
    assert estimate_layer_bytes("dense", "quadratic", 32, 64, 400, 9) > 2 * 19e9


def test_tables_format_as_text_and_markdown():
    rows = [["quadratic", "1.50x"]]
    assert format_table(["encoding", "ratio"], rows, markdown=True).splitlines() == [
        "| encoding | ratio |", "|---|---|", "| quadratic | 1.50x |"]
    text = format_table(["encoding", "ratio"], rows).splitlines()
    assert text[0].split() == ["encoding", "ratio"] and text[2].split() == ["quadratic", "1.50x"]
    assert fmt_seconds(0.0123) == "12.3 ms" and fmt_bytes(2.5e9) == "2.50 GB"


def test_flex_attention_computes_the_content_layer():
    if flex_unavailable("cpu", needs_grad=False):
        pytest.skip("FlexAttention not importable")
    layer = SelfAttention2d(8, 8, heads=2, encoding="learned-content", impl="dense", max_size=5).eval()
    x = torch.randn(2, 8, 3, 5)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is the reference implementation
        out = FlexContentAttention(layer)(x)
    assert rel_diff(out, layer(x).detach()) < 1e-5


def test_impl_of_every_layer_is_set_without_changing_parameters_or_outputs():
    """set_impl changes the path, not the network: the same parameters, outputs and gradients on auto's path as on
    the dense one, and auto's path is one the layer takes by name, with a reason."""
    torch.manual_seed(0)
    model = build_model("sa-learned", hidden=8, heads=2, layers=2, intermediate=8, impl="dense").double().eval()
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    y_dense = model(x)
    g_dense = torch.autograd.grad(y_dense.square().sum(), list(model.parameters()))
    assert set_impl(model, "auto") is model
    assert [m.impl for m in model.attention_layers] == ["auto", "auto"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    y_auto = model(x)
    g_auto = torch.autograd.grad(y_auto.square().sum(), list(model.parameters()))
    torch.testing.assert_close(y_auto, y_dense, rtol=1e-10, atol=1e-12)
    for a, b in zip(g_auto, g_dense):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    for m in model.attention_layers:
        chosen = m.resolved_impl()
        assert chosen in IMPLS[1:]
        m.impl = chosen  # a path the layer takes by name
        impl, why = resolve_impl("auto", (m.max_size, m.max_size), shared_values=m.stackable,
                                 position_only=m.position_only, separable=m.separable, on_cpu=True, explain=True)
        assert impl == chosen and isinstance(why, str) and why


# ------------------------------------------------------------------ the command


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_bench_runs_every_benchmark_end_to_end(tmp_path, capsys, keep_threads):
    """Smoke test: the quick mode's code paths at toy sizes (--tiny), every section, JSON and Markdown."""
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    assert main(["bench", "--tiny", "--threads", "1", "--profile", "--json", str(out_json), "--markdown", str(out_md)]) == 0
    stdout = capsys.readouterr().out
    assert stdout.startswith("attnconv bench --tiny --profile --threads 1")
    for title in ("Matrix multiply", "Attention layer", "Training step", "Utilization", "Data pipeline",
                  "Peak memory"):
        assert title in stdout

    report = json.loads(out_json.read_text())
    sections = {s["key"]: s for s in report["sections"]}
    assert list(sections) == ["matmul", "layer", "model", "util", "data", "memory"]
    layers = sections["layer"]["data"]
    assert {r["encoding"] for r in layers} == set(LAYER_ENCODINGS)
    for r in layers + sections["model"]["data"]:
        assert "skipped" not in r, r
        assert min(r["seconds"]) > 0 and r["speedup"] > 0
        assert r["error_vs_fp64"] < 1e-5  # every path computes the dense function, to float32 rounding
    # every fast path the layer has; at these toy sides (4x4, 8x8) auto takes the stacked path
    assert {r["variant"] for r in layers} == {"dense", "separable", "stacked", "fused", "sdpa"}
    assert {r["variant"] for r in layers if r["auto"]} == {"stacked"}
    assert all(0 < r["utilization"] for r in sections["util"]["data"])
    assert sections["data"]["data"][0]["images_per_s"] > 0 and sections["data"]["data"][0]["ratio"] > 0
    memory = sections["memory"]["data"]
    assert {r["variant"] for r in memory} == {"dense", "fused"}
    assert all(r.get("peak_bytes", 0) > 0 for r in memory), memory

    markdown = out_md.read_text()
    assert "- command: `attnconv bench --tiny --profile --threads 1" in markdown and "- machine: " in markdown
    assert "| encoding | tokens |" in markdown


@pytest.mark.slow
def test_cpu_sections_run_end_to_end(tmp_path, capsys, keep_threads):
    """presets, conv, fullsize and compile at toy sizes (--tiny), fp32 and bf16, through the command."""
    out_json = tmp_path / "bench.json"
    assert main(["bench", "--tiny", "--threads", "1", "--only", "presets,conv,fullsize,compile", "--precisions",
                 "fp32,bf16", "--json", str(out_json)]) == 0
    stdout = capsys.readouterr().out
    assert "--only presets,conv,fullsize,compile --precisions fp32,bf16" in stdout.splitlines()[0]
    sections = {s["key"]: s for s in json.loads(out_json.read_text())["sections"]}
    assert list(sections) == ["presets", "conv", "fullsize", "compile"]

    presets = sections["presets"]["data"]
    assert {(r["model"], r["precision"]) for r in presets} == {
        (name, p) for name in ("sa-quadratic", "sa-quadratic, separable path", "sa-learned-content",
                               "resnet18 (width 16)") for p in ("fp32", "bf16")}
    for r in presets:
        assert r["images_per_s"] > 0 and r["flops"] > 0 and r["vs_resnet"] > 0
        assert (r["target"] == PRESET_TARGET) == (r["model"] == "sa-quadratic")
    assert {r["impl"] for r in presets if r["model"].startswith("sa-quadratic")} == {"stacked", "separable"}

    conv = sections["conv"]["data"]
    assert len(conv) == 3 * 2 and all(r["flops"] > 0 and r["flops_per_s"] > 0 for r in conv)
    assert {r["time_vs_conv"] for r in conv if r["layer"] == "conv 3x3"} == {1.0}

    full = sections["fullsize"]["data"]
    assert [r["precision"] for r in full] == ["fp32", "bf16"]
    assert all(0 < r["utilization"] and r["target"] == FULLSIZE_UTILIZATION_TARGET for r in full)

    compiled = sections["compile"]["data"]
    assert [(r["model"], r["precision"]) for r in compiled] == [("sa-quadratic", "fp32"), ("sa-quadratic", "bf16")]
    for r in compiled:
        assert "failed" not in r, r
        assert r["first_compiled"] > r["compiled"] > 0 and r["compile_cost"] > 0
        assert r["pays_in_epoch"] == (r["eager"] > r["compiled"]
                                      and (r["eager"] - r["compiled"]) * EPOCH_STEPS > r["compile_cost"])


def test_swin_style_attention_gathers_a_relative_bias_table():
    layer = RelativeBiasAttention(8, 2, 3)
    with torch.no_grad():
        layer.table.copy_(torch.arange(25.0)[:, None].expand(25, 2))
    # entry [q, k] is the table row of k - q: (dr + 2) * 5 + (dc + 2)
    assert layer.index[0, 0] == 12 and layer.index[0, 1] == 13 and layer.index[0, 3] == 17 and layer.index[8, 0] == 0
    x = torch.randn(2, 8, 3, 3)
    tokens = x.flatten(2).transpose(1, 2)
    q, k, v = layer.qkv(tokens).view(2, 9, 3, 2, 4).permute(2, 0, 3, 1, 4)
    bias = layer.table[layer.index].permute(2, 0, 1)
    probs = (q @ k.transpose(-1, -2) / 2 + bias).softmax(-1)
    expected = layer.proj((probs @ v).transpose(1, 2).reshape(2, 9, 8)).transpose(1, 2).reshape(2, 8, 3, 3)
    assert rel_diff(layer(x), expected) < 1e-5
    assert swin_heads(64) == 2 and swin_heads(400) == 10 and swin_heads(8) == 1


def test_precisions_flag_reaches_the_config(capsys):
    from attnconv.cli import build_parser
    from attnconv.cli.bench import config_from_args

    cfg = config_from_args(build_parser().parse_args(["bench", "--precisions", "bf16", "--fullsize-batch", "25",
                                                      "--channels", "96"]))
    assert cfg.precisions == ("bf16",) and cfg.fullsize_batch == 25 and cfg.channels == 96
    assert cfg.only == bench.DEFAULT_SECTIONS  # the CPU sections run only when named
    assert main(["bench", "--precisions", "fp16"]) == 2
    assert "fp16" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["a directory", "inside a file"])
@pytest.mark.parametrize("flag", ["--json", "--markdown"])
def test_an_unwritable_output_is_refused_before_any_benchmark_runs(tmp_path, capsys, monkeypatch, flag, where):
    monkeypatch.setattr(bench, "run_benchmarks", lambda *a, **k: pytest.fail("benchmarks ran before the check"))
    (tmp_path / "file").write_text("")
    out = tmp_path if where == "a directory" else tmp_path / "file" / "out"
    assert main(["bench", "--tiny", flag, str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag} ") and err.count("\n") == 1


def test_bench_without_cuda_is_a_clear_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert main(["bench", "--device", "cuda", "--tiny"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_bench_rejects_unknown_benchmark_names(capsys):
    assert main(["bench", "--only", "layer,speed"]) == 2
    assert "speed" in capsys.readouterr().err


def test_model_size_flags_reach_the_config():
    from attnconv.cli import build_parser
    from attnconv.cli.bench import config_from_args

    args = build_parser().parse_args(["bench", "--model-batch", "20", "--model-layers", "2", "--repeats", "3"])
    cfg = config_from_args(args)
    assert cfg.model_batch == cfg.full_res_batch == 20
    assert cfg.model_overrides == {"layers": 2} and cfg.repeats == 3
    quick = config_from_args(build_parser().parse_args(["bench", "--quick", "--model-layers", "3"]))
    assert quick.model_overrides["layers"] == 3 and quick.model_batch == 8


def test_grid_section_times_every_grid_against_7x7_and_resnet(tmp_path, capsys, keep_threads):
    """The grid section at toy batch: per grid the attention preset on auto's path (and separable where auto
    is fused, and fused in one tile), ResNet on the same input, the layer alone; ratios against the 7x7 rows of the same run."""
    out_json = tmp_path / "bench.json"
    assert main(["bench", "--tiny", "--threads", "1", "--only", "grid", "--grids", "7,14", "--precisions", "fp32",
                 "--json", str(out_json)]) == 0
    assert "--only grid --grids 7,14" in capsys.readouterr().out.splitlines()[0]
    rows = json.loads(out_json.read_text())["sections"][0]["data"]
    # Per grid and kind: auto's path first (a valid path, whichever the heuristic takes), then its runners-up;
    # one ResNet row per grid after the attention model's rows.
    seen = [(r["kind"], r["grid"]) for r in rows]
    assert sorted(set(seen)) == [("layer", 7), ("layer", 14), ("model", 7), ("model", 14)]
    for kind, grid in set(seen):
        mine = [r for r in rows if (r["kind"], r["grid"]) == (kind, grid) and not r["name"].startswith("resnet")]
        auto = mine[0]
        assert auto["auto"] and auto["impl"] in IMPLS[1:] and not any(r["auto"] for r in mine[1:])
        assert [r["impl"] for r in mine[1:]] == RUNNERS_UP.get(auto["impl"], [])
        assert {r["name"] for r in mine} == {"sa-quadratic" if kind == "model" else "SelfAttention2d"}
        tiled = [r["flops"] for r in mine if r["impl"] in ("fused", "fused" + ONE_TILE, "separable")]
        assert len(set(tiled)) <= 1  # the same products, ordered or tiled differently
        by_impl = {r["impl"]: r for r in mine}
        if "stacked" in by_impl and "fused" in by_impl:
            assert by_impl["fused"]["flops"] < by_impl["stacked"]["flops"]  # fused forms no dense probabilities
    assert [r["grid"] for r in rows if r["name"].startswith("resnet")] == [7, 14]
    for r in rows:
        assert r["images_per_s"] > 0 and r["flops"] > 0 and r["gflops_per_s"] > 0
        if r["name"] != "resnet18 (width 16)":
            base = next(b for b in rows if b["kind"] == r["kind"] and b["grid"] == 7)
            assert r["vs_7x7"] == pytest.approx(r["images_per_s"] / base["images_per_s"])
        # the targets are on auto's rows: the 14x14 model's images/s against the 7x7 preset's
        assert ("target" in r) == (r["auto"] and r["kind"] == "model" and r["grid"] == 14)
    model14 = next(r for r in rows if r["auto"] and r["kind"] == "model" and r["grid"] == 14)
    resnet14 = next(r for r in rows if r["name"].startswith("resnet") and r["grid"] == 14)
    assert model14["target"] == 0.25 and model14["target_value"] == model14["vs_7x7"]
    assert model14["vs_resnet"] == pytest.approx(model14["images_per_s"] / resnet14["images_per_s"])


def test_grids_flag_names_the_grids_it_knows(capsys):
    assert main(["bench", "--tiny", "--only", "grid", "--grids", "7,15"]) != 0
    assert "--grids: choose from 7,14,16,32" in capsys.readouterr().err


def test_markdown_and_json_are_written_as_a_pair(tmp_path, capsys, monkeypatch):
    """A full disk while writing --json left the new --markdown beside the old --json; both stay old now."""
    import errno
    from pathlib import Path

    from attnconv.bench.results import Report, machine_info

    md, js = tmp_path / "out.md", tmp_path / "out.json"
    md.write_text("## `attnconv bench --tiny` (old)\n")
    js.write_text(json.dumps({"command": "attnconv bench --tiny", "machine": {}, "date": "old", "config": {},
                              "sections": []}))
    before = (md.read_text(), js.read_text())
    report = Report(command="attnconv bench --tiny", machine=machine_info("cpu"), date="new", config={"mode": "tiny"})
    monkeypatch.setattr(bench, "run_benchmarks", lambda *a, **k: report)
    write_text = Path.write_text

    def full_for_json(self, text, *args, **kwargs):
        if text.startswith("{"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_for_json)
    assert main(["bench", "--tiny", "--markdown", str(md), "--json", str(js)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --json {js}: no space left on the device; free some space (nothing was written)"], err
    assert (md.read_text(), js.read_text()) == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "out.json", "out.md"]
    monkeypatch.setattr(Path, "write_text", write_text)
    assert main(["bench", "--tiny", "--markdown", str(md), "--json", str(js)]) == 0
    assert md.read_text().startswith("## `attnconv bench --tiny` (new)") and json.loads(js.read_text())["date"] == "new"


def test_markdown_and_json_naming_one_file_are_refused_before_any_benchmark(tmp_path, capsys, monkeypatch):
    """`--markdown X --json X` wrote the Markdown, then the JSON over it, and said `wrote X` twice, exit 0."""
    monkeypatch.setattr(bench, "run_benchmarks", lambda *a, **k: pytest.fail("benchmarked"))
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "sub")
    for md, js in ((tmp_path / "x", tmp_path / "x"), (tmp_path / "sub" / "x", tmp_path / "link" / "x")):
        assert main(["bench", "--tiny", "--markdown", str(md), "--json", str(js)]) == 2
        err = capsys.readouterr().err
        assert err == (f"error: --markdown {md} and --json {js} name one file, which would hold only the JSON; give "
                       "each its own path\n"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "sub"] and not any((tmp_path / "sub").iterdir())
