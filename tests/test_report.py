"""`attnconv report`: one self-contained HTML page per run, for every encoding, a CNN and a converted CNN."""

import base64
import json
import os
import re
import shutil
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from fixtures_browser import WIDTHS, chromium_page, sideways_overflow
from fixtures_data import isolated_data  # noqa: F401 (fixture)
from fixtures_runs import TINY, train_tiny_runs

from attnconv.analysis import grid_likeness
from attnconv.cli import main
from attnconv.report import build_report, write_report
from attnconv.runs import Run, convert_run, read_heads, read_metrics
from attnconv.tables import significant

ENCODINGS = ("sa-quadratic", "sa-quadratic-aniso", "sa-learned", "sa-learned-content")
_VOID = {"meta", "img", "br", "hr", "link", "input", "source", "wbr", "col", "area", "base"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny runs (3 epochs of 2 steps) of every attention encoding and of a ResNet, and the ResNet converted."""
    root = tmp_path_factory.mktemp("report")
    out = train_tiny_runs(root, [*((m, TINY) for m in ENCODINGS), ("resnet18", dict(width=2))], epochs=3)
    out["converted"] = convert_run(out["resnet18"], root / "converted")
    return out


class _Page(HTMLParser):
    """Collects tags, ids, images, links and text, and checks that every element is closed in order."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.ids, self.images, self.urls, self.text = [], [], set(), [], [], []
        self.tags = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        for name in ("src", "href"):
            if name in attrs:
                self.urls.append(attrs[name])
        if tag not in _VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    page.close()
    assert page.errors == [] and page.stack == [], (page.errors, page.stack)
    return page


def _png(src: str) -> bytes:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix)
    return base64.b64decode(src[len(prefix):], validate=True)


@pytest.mark.parametrize("model", ENCODINGS)
def test_report_of_an_attention_run_has_every_section_and_embedded_figures(runs, model, capsys):
    run = runs[model]
    assert main(["report", str(run), "--images", "4"]) == 0
    out = run / "report.html"
    assert capsys.readouterr().out.strip() == str(out)
    page = _parse(out.read_text())
    text = " ".join(page.text)
    assert {"summary", "training", "attention", "analysis", "config"} <= page.ids
    # curves, centers, maps: real PNGs inside the file
    assert len(page.images) >= 3
    assert all(_png(src).startswith(b"\x89PNG\r\n\x1a\n") for src in page.images)
    # nothing fetched from anywhere: only in-page anchors and data URIs
    assert all(url.startswith(("#", "data:")) for url in page.urls), page.urls
    assert "http://" not in out.read_text() and "https://" not in out.read_text()
    # the Table-1 row: accuracy as format_table prints it
    acc = read_metrics(run)[-1]["test_acc"]
    assert f"{acc:.4f}" in text and "FLOPs (all ops)" in text and "s/epoch" in text
    # the analysis: a row per head in each of the 2 layers
    assert text.count("Layer 1 (") == 1 and text.count("Layer 2 (") == 1  # numbered from 1, as in the figures
    assert "Layer 0 (" not in text
    assert "distance to the nearest 3x3 convolution" in text
    if model == "sa-learned-content":
        assert "mean over 4 test images" in text
    else:
        assert "position-only" in text
    # heads over training: Figure 4 at the recorded epochs, attention distance, and grid-likeness per epoch
    assert "history" in page.ids and len(page.images) == 7  # with the test set's confusion matrix and errors
    assert "Recorded at initialization (epoch 0) and after each epoch (4 snapshots)" in text
    assert "Epochs 0, 1, 2, 3, one row per layer" in text
    likeness = {row["epoch"]: row["layers"] for row in grid_likeness(read_heads(run))}
    assert [x["within"] <= 4 for x in likeness[3]] == [True, True]
    first = likeness[3][0]
    assert f"{first['within']}/4, {significant(first['mean_distance'])}; " \
           f"{significant(first['attention_distance'])}" in text


def test_report_of_a_run_without_heads_jsonl_says_so(runs, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(runs["sa-quadratic"], old)
    (old / "heads.jsonl").unlink()
    text = " ".join(_parse(build_report(old, images=2)).text)
    assert "This run has no heads.jsonl" in text and "Analysis per layer and head" in text


def test_report_shows_the_config_readably_and_in_full(runs):
    run = runs["sa-quadratic"]
    page = _parse(build_report(run))
    text = " ".join(page.text)
    meta = json.loads((run / "config.json").read_text())
    assert "hidden" in text and "downsample" in text and "warmup-cosine" in text
    full = max((unescape(t) for t in page.text if t.lstrip().startswith("{")), key=len)  # the whole file
    assert json.loads(full) == meta


def test_report_of_a_cnn_says_it_has_no_attention_and_skips_those_sections(runs):
    page = _parse(build_report(runs["resnet18"]))
    text = " ".join(page.text)
    assert "resnet18 has no attention layers" in text
    assert "analysis" not in page.ids and "Head centers" not in text
    assert len(page.images) == 3  # the training curves, the confusion matrix, the misclassified images
    assert "test" in page.ids


def test_report_of_a_converted_cnn_analyzes_each_converted_layer(runs, tmp_path, capsys):
    out = tmp_path / "converted.html"
    assert main(["report", str(runs["converted"]), "--out", str(out)]) == 0
    page = _parse(out.read_text())
    text = " ".join(page.text)
    assert "converted from the CNN run" in text and "17 multi-head attention layers" in text
    assert "analysis" in page.ids and "Head centers" in text and "Attention maps" in text
    # confusion matrix, misclassified images, centers and maps, as for a classifier; no curves (nothing was trained)
    assert len(page.images) == 4 and "test" in page.ids
    distances = re.findall(r"distance to the nearest 3x3 convolution (\S+) ", text)
    assert len(distances) == 17 and all(float(d) < 1e-6 for d in distances)  # each layer is its conv
    assert "has no metrics.csv" in text  # convert trains nothing


def _cells(text: str) -> list[list[str]]:
    """The rows of every HTML table in `text`, as cell texts."""
    class Cells(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.rows, self.cell = [], None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])
            elif tag in ("td", "th"):
                self.cell = ""

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.rows[-1].append(self.cell)
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    parser = Cells()
    parser.feed(text)
    return parser.rows


def _section(text: str, name: str) -> str:
    start = text.index(f'<section id="{name}">')
    return text[start : text.index("</section>", start)]


def test_report_test_set_section_shows_each_class_the_matrix_and_the_errors(runs):
    run = runs["sa-quadratic"]
    text = build_report(run, images=2)
    page = _parse(text)
    # between the training curves and the attention, and linked from the nav
    assert text.index('id="training"') < text.index('id="test"') < text.index('id="attention"')
    assert 'href="#test"' in text and "test" in page.ids
    # per class: each class's accuracy and image count, from the model's own predictions
    r = Run(run)
    _, x = r.test_images()
    with torch.no_grad():
        predicted = r.model(x).argmax(1)
    labels = r.test_set.labels
    section = _section(text, "test")
    rows = _cells(section)
    assert rows[0] == ["class", "accuracy", "images", "misclassified"]
    for name, row, k in zip(r.info.classes, rows[1:11], range(10)):
        mine = predicted[labels == k]
        acc = significant(float((mine == k).float().mean())) if len(mine) else "-"
        assert row == [name, acc, str(len(mine)), str(int((mine != k).sum()))]
    # the confusion matrix and the misclassified images: two more PNGs, in this section
    images = _parse(section + "</section>").images
    assert len(images) == 2 and all(_png(src).startswith(b"\x89PNG") for src in images)
    wrong = int((predicted != labels).sum())
    assert f"{min(wrong, 16)} of {wrong}, sampled across their true classes" in " ".join(page.text)


def test_report_of_a_run_whose_data_is_gone_says_so_in_the_test_set_section(runs, tmp_path, isolated_data):  # noqa: F811
    data, run = tmp_path / "data", tmp_path / "run"
    shutil.copytree(runs["data"], data)
    shutil.copytree(runs["sa-quadratic"], run)
    meta = json.loads((run / "config.json").read_text())
    meta["config"]["data_dir"] = str(data)
    (run / "config.json").write_text(json.dumps(meta))
    assert "Accuracy per class" in build_report(run, images=2)  # with its data
    shutil.rmtree(data)
    text = build_report(run, images=2)
    page = _parse(text)
    section = " ".join(_parse(_section(text, "test") + "</section>").text)
    assert "the test set could not be read" in section and "Accuracy per class" not in section
    # where the data was, and how to point at it
    assert f"the run's data folder {data} no longer exists" in section and "--data-dir" in section
    assert "analysis" in page.ids and len(page.images) == 5  # every other section as before


def test_report_writes_only_the_report(runs, tmp_path):
    run = runs["sa-learned"]
    before = sorted(os.listdir(run))
    out = write_report(run, tmp_path / "sub" / "page.html")
    assert out == tmp_path / "sub" / "page.html" and out.stat().st_size > 0
    assert sorted(os.listdir(run)) == before  # no centers.png / maps.png / temporary files left behind
    assert os.listdir(tmp_path / "sub") == ["page.html"]


def test_a_failed_write_leaves_the_old_report_whole(runs, tmp_path, monkeypatch):
    out = tmp_path / "report.html"
    out.write_text('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta name="generator" '
                   'content="attnconv 0.1.0">old report')  # ours

    def half_then_fail(self, text, *args, **kwargs):
        with open(self, "w") as f:
            f.write(text[: len(text) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        write_report(runs["sa-quadratic"], out)
    monkeypatch.undo()
    assert out.read_text().endswith("old report")
    assert os.listdir(tmp_path) == ["report.html"]


def test_report_never_replaces_the_runs_files_or_a_users_file(runs, tmp_path, capsys):
    run = runs["sa-quadratic"]
    weights = (run / "model.safetensors").read_bytes()
    notes = tmp_path / "notes.html"
    notes.write_text("my notes")
    for out, message in ((run / "model.safetensors", "give a file name ending in .html"),
                         (tmp_path / "notes.txt", "give a file name ending in .html"),
                         (notes, "exists and attnconv did not write it")):
        assert main(["report", str(run), "--out", str(out)]) == 2
        assert message in capsys.readouterr().err
    assert (run / "model.safetensors").read_bytes() == weights and notes.read_text() == "my notes"
    assert main(["report", str(run), "--out", str(notes), "--overwrite", "--images", "2"]) == 0  # asked for
    assert '<meta name="generator" content="attnconv' in notes.read_text()
    assert main(["report", str(run), "--out", str(notes), "--images", "2"]) == 0  # ours now: replaced


@pytest.mark.parametrize(
    "argv, message",
    [
        (["report", "{missing}"], "not a run directory (no such directory)"),
        (["report", "{run}", "--out", "{run}"], "is a directory"),
        (["report", "{run}", "--images", "0"], "--images 0"),
    ],
)
def test_report_bad_input_is_one_line_exit_2(runs, tmp_path, capsys, argv, message):
    argv = [a.format(missing=tmp_path / "nope", run=runs["sa-quadratic"]) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def _significant_digits(number: str) -> int:
    mantissa = number.lstrip("-+").split("e")[0]
    digits = mantissa.replace(".", "").lstrip("0")
    return len(digits) if "." in mantissa else len(digits.rstrip("0"))


def test_report_numbers_have_3_significant_digits_and_layers_count_from_1(runs):
    text = build_report(runs["sa-quadratic-aniso"], images=2)
    for name in ("training", "test", "attention"):
        section = _section(text, name)
        for row in _cells(section):
            for cell in row:
                for number in re.findall(r"[-+]?\d+\.\d+(?:e[+-]\d+)?", cell):
                    assert _significant_digits(number) == 3, (name, cell)
        prose = re.sub(r"<table>.*?</table>", "", section, flags=re.S)
        for number in re.findall(r"(?<![\w.])[-+]?\d+\.\d{4,}", prose):  # no long decimals in the prose either
            raise AssertionError((name, number))
    analysis = _section(text, "attention")
    assert "Layer 1 (" in analysis and "Layer 2 (" in analysis and "Layer 0" not in analysis
    heads = [row[0] for row in _cells(analysis) if row and row[0].isdigit() and len(row) == 11]
    assert heads == ["1", "2", "3", "4"] * 2  # each layer's table, heads numbered from 1


@pytest.mark.parametrize("which", ["sa-learned-content", "sa-quadratic-aniso", "converted"])
def test_report_fits_the_window_at_1400_and_800_pixels_in_chromium(runs, tmp_path, which):
    out = write_report(runs[which], tmp_path / "report.html", images=2)
    with chromium_page(out.resolve().as_uri(), width=WIDTHS[0]) as (page, errors):
        page.wait_for_selector("#config", state="attached")
        for width in WIDTHS:
            overflow, wide = sideways_overflow(page, width)
            assert overflow <= 0 and wide == [], (width, overflow, wide)
        assert not errors, errors
