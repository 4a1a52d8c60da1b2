"""One self-contained HTML page per run: config, training curves, Table-1 row, attention figures, analysis.

    from attnconv.report import write_report
    write_report("runs/sa")                  # runs/sa/report.html

The page has no external assets: figures are PNGs embedded as base64 data URIs and the
style sheet is inline, so the file can be mailed, archived or opened offline. Sections:

    config          config.json as a table (training and model options) and in full
    training        train/test loss and accuracy per epoch (metrics.csv)
    summary         the run's Table-1 row (`evaluate.describe_run` / `runs_table`):
                    test accuracy, parameters, FLOPs, seconds per epoch
    test            the test set measured anew with the weights (`evaluate.predict_all`, one
                    pass): accuracy per class, the confusion matrix figure, and 16
                    misclassified test images sampled across their true classes; a run
                    whose data cannot be found (`runs.DataNotFound`) gets a note here instead
                    (saying where the data was and how to point at it)
    attention       attention classifiers only: the centers figure (Fig. 4/12/14), the maps
                    figure around the middle query (Fig. 5/6) and the `analyze` numbers per
                    layer and head. CNN runs say they have no attention and skip it; runs
                    written by `attnconv convert` (ConvAttention layers inside a CNN) get a
                    note saying why the analysis does not apply.

Errors are never buried in the page. A section is left out only when the run itself cannot
have it (its data is not on this machine; attention the analysis cannot take): the page says
so in a note and `write_report` warns (`AttnconvWarning`: one `warning:` line from the CLI).
Anything else that makes a section impossible (a `--dataset` that does not fit the run, a corrupt
file) fails the whole report with its one error. Test data that changed since training is measured
as it is now, said in one `warning:` line and in a note above the page's test results.

Content-attention models are averaged over `images` test images sampled across the
classes (`Run.test_images`, a fixed seed), as in `attnconv plot` and `attnconv analyze`.
The figures are rendered to bytes in memory; the only file written is the report itself,
atomically (temporary file, then rename).

As users read it: layers and heads are numbered from 1 (figures, tables, headings), numbers
have 3 significant digits (`tables.significant`; the Table-1 row keeps the paper's format),
attention maps with nothing to show are grey and captioned so (`plots.flat_map_label`), and
the page fits the window without scrolling sideways from 800 pixels wide up (long tables
wrap their cells; tested in Chromium).
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

import attnconv
from attnconv.analysis import analyze_sites, grid_likeness, head_geometry
from attnconv.errors import AttnconvError, ParameterError, attnconv_warning
from attnconv.evaluate import confusion_matrix, describe_run, per_class_accuracy, predict_all, runs_table
from attnconv.fileio import SIGNATURE, atomic_write, check_output_file, not_a_folder
from attnconv.limits import path_argument, whole_number
from attnconv.models.sites import NoAttentionLayers, needs_inputs
from attnconv.plots import centers_figure, distance_figure, maps_of_run, snapshot_geometry, spread_epochs
from attnconv.plots.figures import figure_png
from attnconv.plots.results import confusion_figure, curves_figure, misclassified_figure
from attnconv.runs import DataNotFound, Run, sample_across_classes
from attnconv.tables import markdown_cells, one_line, significant

__all__ = ["build_report", "write_report"]

REPORT_FILE = "report.html"
_MISCLASSIFIED = 16  # test images in the misclassified grid, sampled across their true classes
_MAPS_ZOOM = 7  # window side of the maps figure, as `attnconv plot maps`

_CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1100px;
       padding: 1.5rem; color: #1d2329; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
h2 { font-size: 1.25rem; border-bottom: 1px solid #d5dbe1; padding-bottom: .2rem; margin-top: 2rem; }
h3 { font-size: 1.05rem; margin-bottom: .3rem; }
.sub { color: #5a6570; margin-top: 0; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .9rem; max-width: 100%; }
th, td { border: 1px solid #d5dbe1; padding: .2rem .45rem; text-align: left; vertical-align: top;
         overflow-wrap: anywhere; white-space: pre-wrap; }
.columns { display: flex; gap: 0 2rem; flex-wrap: wrap; }
.columns > div { min-width: 0; max-width: 100%; }
details, section, header, main { max-width: 100%; min-width: 0; }
th { background: #f1f4f7; overflow-wrap: normal; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; overflow-wrap: normal; }
tr.degenerate td { background: #fdf0ed; }
pre { background: #f6f8fa; padding: .7rem; font-size: .82rem; white-space: pre-wrap; overflow-wrap: anywhere; }
img { max-width: 100%; height: auto; display: block; margin: .5rem 0; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: .5rem .8rem; }
nav a { margin-right: 1rem; display: inline-block; }
@media (max-width: 900px) { body { padding: 1rem .75rem; } table { font-size: .8rem; }
                            th, td { padding: .15rem .3rem; } }
"""


# ----------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------
# HTML pieces
# ----------------------------------------------------------------------------------------


def _e(value: Any) -> str:
    """`value` as HTML text, a character that is not printable (a direction override, a zero-width space) shown as
    its escape (`tables.one_line`), as the command line shows it: a class name reads in the page as it is."""
    return html.escape(one_line(str(value)), quote=True)


def _e_block(text: str) -> str:
    """Lines of text (config.json in full) as HTML: each character that is not printable as a JSON escape
    (`\\u202e`, as json reads it back), the newlines and backslashes kept."""
    return html.escape("".join(c if c.isprintable() or c == "\n" else f"\\u{ord(c):04x}" for c in text), quote=True)


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}">'


def _missing(section: str, err: AttnconvError) -> None:
    """Say on stderr (one `warning:` line from the CLI) that the page leaves out `section`, and why."""
    attnconv_warning(f"report: {section} is left out: {err}", 3)


def _note(text: str) -> str:
    return f'<p class="note">{_e(text)}</p>'


def _table(header: list[str], rows: list[list[Any]], *, numeric: Collection[int] = (),
           row_class: list[str] | None = None) -> str:
    head = "".join(f"<th scope=\"col\">{_e(h)}</th>" for h in header)
    body = []
    for n, row in enumerate(rows):
        cls = f' class="{row_class[n]}"' if row_class and row_class[n] else ""
        cells = "".join(f'<td class="num">{_e(v)}</td>' if i in numeric else f"<td>{_e(v)}</td>"
                        for i, v in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _markdown_table(text: str) -> str:
    """`runs_table` Markdown -> an HTML table with the same cells (the second line is the rule)."""
    lines = text.strip().splitlines()
    header = markdown_cells(lines[0])
    rows = [markdown_cells(line) for line in lines[2:]]
    return _table(header, rows, numeric=set(range(2, len(header))))


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_value(x) for x in v)
    if isinstance(v, dict):  # config.json's "data" and the like: key: value pairs, each name as it is (the page's
        return "; ".join(f"{k}: {_value(x)}" for k, x in v.items())  # escaping, once, shows it as the CLI does)
    if v is None:
        return "-"
    return str(v)


def _config_section(meta: dict[str, Any]) -> str:
    cfg = dict(meta["config"])
    overrides = cfg.pop("model_overrides", {}) or {}
    training = _table(["option", "value"], [[k, _value(v)] for k, v in cfg.items()])
    model = _table(["model option", "value"], [[k, _value(v)] for k, v in overrides.items()]) if overrides else ""
    rest = {k: v for k, v in meta.items() if k != "config"}
    run = _table(["run", "value"], [[k, _value(v)] for k, v in rest.items()])
    full = json.dumps(meta, indent=2, ensure_ascii=False)  # names as they are; _e_block escapes what is not printable
    return (
        '<section id="config"><h2>Configuration</h2>'
        f'<div class="columns"><div>{training}</div><div>{model}{run}</div></div>'
        f"<details><summary>config.json</summary><pre>{_e_block(full)}</pre></details></section>"
    )


def _curves_section(rows: list[dict[str, float]], model: str, meta: dict[str, Any]) -> str:
    out = ['<section id="training"><h2>Training curves</h2>']
    if not rows and "converted" in meta:
        out.append(_note(f"`attnconv convert` trains nothing, so this run has no metrics.csv; the training "
                         f"curves are those of the source run {meta['converted'].get('from')}."))
    elif not rows:
        out.append(_note("metrics.csv has no rows yet: no epoch has finished."))
    else:
        png = figure_png(curves_figure(rows, f"{model}: loss and accuracy per epoch"))
        out.append(_img(png, "training curves: train and test loss and accuracy per epoch"))
        last = rows[-1]
        out.append(_table(
            ["epoch", "step", "train loss", "train acc", "test loss", "test acc", "seconds", "images/s", "lr"],
            [[int(r["epoch"]), int(r["step"]), *(significant(r[k]) for k in ("train_loss", "train_acc", "test_loss",
                                                                              "test_acc", "seconds", "images_per_s",
                                                                              "lr"))]
             for r in (rows if len(rows) <= 12 else rows[:3] + rows[-8:])],
            numeric=set(range(9)),
        ))
        if len(rows) > 12:
            out.append(f"<p>(first 3 and last 8 of {len(rows)} epochs; last test accuracy "
                       f"{significant(last['test_acc'])})</p>")
    out.append("</section>")
    return "".join(out)


def _summary_section(summary: dict[str, Any]) -> str:
    flops = ", ".join(f"{op} {n:,}" for op, n in sorted(summary["flops_by_op"].items(), key=lambda kv: -kv[1]))
    return (
        '<section id="summary"><h2>Summary (Table 1 row)</h2>'
        f"{_markdown_table(runs_table([summary], markdown=True))}"
        f"<p>{summary['params']:,} parameters; {summary['flops_total']:,} FLOPs per image counted by "
        f"torch.utils.flop_counter (matrix products and convolutions, 2 per multiply-add), "
        f"{summary['flops_linear']:,} in Linear layers only (the paper's convention). "
        f"By op: {_e(flops) or '-'}. Accuracy from the last metrics.csv row.</p></section>"
    )


def _test_section(run: Run) -> str:
    """Per-class accuracy, the confusion matrix and misclassified images (sampled across their true classes),
    from one pass over the test set."""
    head = '<section id="test"><h2>Test set</h2>'
    try:
        test = run.test_set
    except DataNotFound as err:  # the run's data is not on this machine: the one section that can do without it
        _missing("the test set section (per-class accuracy, confusion matrix, misclassified images)", err)
        return head + _note(f"the test set could not be read, so there are no per-class results: {err}") + "</section>"
    result = predict_all(run.model, test, run.info, device=run.device)
    classes = list(run.info.classes)
    labels, predicted = test.labels.cpu(), result["predictions"]
    confusion = confusion_matrix(labels, predicted, len(classes))
    rows = [[name, significant(acc), f"{int(row.sum()):,}", f"{int(row.sum() - row[i]):,}"]
            for i, (name, acc, row) in enumerate(zip(classes, per_class_accuracy(confusion), confusion))]
    table = _table(["class", "accuracy", "images", "misclassified"], rows, numeric={1, 2, 3})
    model = run.config.model
    matrix = figure_png(confusion_figure(confusion.numpy(), classes,
                                         f"{model}: confusion matrix ({len(test)} test images)"))
    wrong = torch.nonzero(predicted != labels).flatten()
    source = "" if run.dataset is None else f" of {_e(run.dataset)} (given with --dataset; the run's classes)"
    intro = (f"<p>Measured anew with the run's weights on the {len(test):,} test images{source}: accuracy "
             f"{significant(result['accuracy'])} (loss {significant(result['loss'])}); {len(wrong):,} "
             "misclassified.</p>")
    if run.test_data_changes:  # the warning line on stderr is gone once the page is all that is left
        intro += _note(f"The test data differs from what the run was trained with ({'; '.join(run.test_data_changes)}): "
                       "the results below are of the data as it is now, not the run's own test set.")
    out = [head, intro, "<h3>Accuracy per class</h3>", table,
           "<h3>Confusion matrix</h3><p>Rows: the true class; columns: the predicted class. Each cell holds its "
           "count, coloured by its share of the row (the true class's images).</p>",
           _img(matrix, "confusion matrix: true class by predicted class, with counts")]
    if len(wrong):
        pick = wrong[sample_across_classes(labels[wrong], _MISCLASSIFIED)]
        grid = figure_png(misclassified_figure(test.images[pick].cpu().numpy(), labels[pick].tolist(),
                                               predicted[pick].tolist(), classes, result["probabilities"][pick].tolist()))
        out += [f"<h3>Misclassified images</h3><p>{len(pick)} of {len(wrong):,}, sampled across their true classes "
                "(a fixed seed), each captioned true class → predicted class (the probability the model gave its "
                "prediction, 3 significant digits).</p>",
                _img(grid, "misclassified test images with their true and predicted classes")]
    else:
        out.append(_note("Every test image is classified correctly: there are no misclassified images to show."))
    out.append("</section>")
    return "".join(out)


def _analysis_tables(result: dict[str, Any]) -> str:
    t = result["thresholds"]
    out = ["<p>Layers and heads are numbered from 1, as in the figures and <code>attnconv analyze</code>. "
           "Shifts are (row, column) on "
           + ("each layer's input grid" if result["size"] is None
              else f"the {result['size'][0]}x{result['size'][1]} token grid")
           + ", rows down. "
           f"A head is degenerate when alpha &lt; {t['uniform_alpha']:g}, the condition number of its inverse "
           f"covariance &gt; {t['ill_conditioned']:g}, or its middle query's entropy &gt; "
           f"{t['uniform_entropy']:g} of uniform.</p>"]

    for layer in result["layers"]:
        like = layer["conv_likeness"]
        out.append(
            f"<h3>Layer {layer['layer']} ("
            + (f"{_e(layer['path'])}, {layer['size'][0]}x{layer['size'][1]} input; " if result["size"] is None else "")
            + f"{_e(layer['encoding'])}; probabilities: {_e(layer['probabilities'])})</h3>"
            + ("<p>no distance to the nearest convolution (the layer's value maps are unknown)" if like is None else
               f"<p>distance to the nearest 3x3 convolution {significant(like['distance'])} (5x5: "
               f"{significant(like['distance_5x5'])})")
            + f"; mean window mass 3x3 {significant(layer['mean_mass_3x3'])}, "
            f"5x5 {significant(layer['mean_mass_5x5'])}; "
            f"degenerate heads {len(layer['degenerate_heads'])}/{len(layer['heads'])}</p>"
        )
        rows, classes = [], []
        for h in layer["heads"]:
            eig = "-" if h["eigenvalues"] is None else ", ".join(significant(v) for v in h["eigenvalues"])
            rows.append([h["head"], f"({significant(h['center'][0])}, {significant(h['center'][1])})",
                         h["center_source"], significant(h["alpha"]), eig, significant(h["condition"]),
                         *(significant(h[k]) for k in ("avg_distance", "mass_3x3", "mass_5x5", "entropy")),
                         "DEGENERATE: " + "; ".join(h["reasons"]) if h["degenerate"] else ""])
            classes.append("degenerate" if h["degenerate"] else "")
        out.append(_table(["head", "center", "center from", "alpha", "eig(S^-1)", "cond", "avg dist", "mass 3x3",
                           "mass 5x5", "entropy", "flags"], rows, numeric={0, 3, 5, 6, 7, 8, 9}, row_class=classes))
    return "".join(out)


def _attention_section(run: Run, *, images: int) -> str:
    """Centers, maps, heads over training and the analysis of every attention layer (classifier or converted CNN)."""
    head = '<section id="attention"><h2>Attention</h2>'
    config = run.config
    try:
        sites = run.sites
    except AttnconvError as err:  # a CNN; or attention the per-head analysis cannot take
        if isinstance(err, NoAttentionLayers) and not run.converted:
            why = f"its attention is not over one image grid: {err}" if err.computations else \
                "a convolutional network"
            return head + _note(f"{config.model} has no attention layers ({why}): the attention figures and analysis "
                                "are skipped.") + "</section>"
        _missing("the attention section", err)
        return head + _note(f"the attention analysis could not run on this model: {err}") + "</section>"
    if needs_inputs(sites):
        try:
            run.test_set  # noqa: B018 (content attention averages over test images)
        except DataNotFound as err:
            _missing("the attention section (content attention is averaged over test images)", err)
            return head + _note(f"content attention depends on the input and the test images could not be "
                                f"read: {err}") + "</section>"
    try:
        probs, n = run.site_probs(images)  # the test images, if any, were read above: what fails here is the model
    except AttnconvError as err:
        _missing("the attention section", err)
        return head + _note(f"the attention analysis could not run on this model: {err}") + "</section>"
    how = f"mean over {n} test images (content attention)" if n else "position-only: the same for every input"
    sizes = sorted({site.size for site in sites})
    if len(sizes) == 1:
        grid = f"{sizes[0][0]}x{sizes[0][1]} token grid"
        intro = (f"{len(sites)} layers x {sites[0].layer.heads} heads on the {grid} (images downsampled "
                 f"{run.info.size // sizes[0][0]}x{run.info.size // sizes[0][0]}); probabilities: {how}.")
    else:
        grid = "each layer on its own input grid"
        intro = (f"{len(sites)} multi-head attention layers (one per kxk convolution; 1x1 convolutions are "
                 "single-head and left out), each on its own input grid: "
                 + ", ".join(f"{site.path} {site.size[0]}x{site.size[1]}" for site in sites)
                 + f". Probabilities: {how}.")
    if config.init_from:
        content = config.init_from.content
        intro = (f"This network was trained from the CNN run {config.init_from.run} (`attnconv train "
                 f"--init-from`, heads started on the kernel taps with alpha {config.init_from.alpha:g}; centers "
                 f"and widths learned" + (f"; content attention with {content} query/key channels per head"
                                          if content else "") + "). " + intro)
    elif run.converted:
        intro = (f"This network was converted from the CNN run {run.meta['converted'].get('from')} (`attnconv "
                 "convert`, exact). " + intro)
    geometry = [head_geometry(site.layer, site.size, p) for site, p in zip(sites, probs)]
    centers = figure_png(centers_figure(geometry, max(max(size) for size in sizes),
                                        f"{config.model}: attention centers ({grid}; {how})"))
    maps = figure_png(maps_of_run(run, probs, zoom=_MAPS_ZOOM, how=how))
    history = _history_section(run) if len(sizes) == 1 else ""
    return (
        head + f"<p>{_e(intro)}</p>"
        + "<h3>Head centers (Figures 4, 12, 14)</h3>"
        + "<p>Each head's center relative to the query pixel (black square), with the contours holding 50% "
          "(solid) and 90% (dotted) of its attention mass.</p>"
        + _img(centers, "attention centers of every head, one panel per layer")
        + "<h3>Attention maps (Figures 5, 6)</h3>"
        + "<p>Attention probabilities of the middle query (red square), layers x heads.</p>"
        + _img(maps, "attention maps of the middle query, layers x heads")
        + history
        + '<h3 id="analysis">Analysis per layer and head</h3>'
        + _analysis_tables(analyze_sites(sites, probs, images=n))
        + "</section>"
    )


def _recorded_when(epochs: list[int]) -> str:
    """When heads.jsonl's snapshots were taken, as the file holds them: a run's start and every epoch, or (lines
    lost) which."""
    if epochs == list(range(epochs[-1] + 1)):
        return "at initialization (epoch 0) and after each epoch"
    lost = "no line from initialization (epoch 0)" if epochs[0] else "epochs missing between them"
    return f"at epochs {epochs[0]} to {epochs[-1]}, not all of them (heads.jsonl holds {lost})"


def _history_section(run: Run) -> str:
    """Figure 4 over training (every layer at a few recorded epochs), attention distance, grid-likeness."""
    head = '<h3 id="history">Heads over training</h3>'
    snapshots, model, grid = run.heads, run.config.model, max(run.sites[0].size)
    if not snapshots:
        return head + _note("This run has no heads.jsonl (it was trained before attention runs recorded their "
                            "heads): train it again to see them over training.")
    by_epoch = {s["epoch"]: s for s in snapshots}
    epochs = spread_epochs(list(by_epoch))
    n_layers = len(snapshots[0]["layers"])
    panels = [snapshot_geometry(by_epoch[e]["layers"][layer]) for layer in range(n_layers) for e in epochs]
    titles = [f"layer {layer + 1}, epoch {e}" for layer in range(n_layers) for e in epochs]
    centers = figure_png(centers_figure(panels, grid, f"{model}: head centers over training (rows: layers)",
                                        panel_titles=titles, ncols=len(epochs)))
    distance = figure_png(distance_figure(snapshots, f"{model}: mean attention distance per head"))
    rows = [[snap["epoch"], *(f"{x['within']}/{x['heads']}, {significant(x['mean_distance'])}; "
                              f"{significant(x['attention_distance'])}" for x in snap["layers"])]
            for snap in grid_likeness(snapshots)]
    table = _table(["epoch", *(f"layer {i + 1}" for i in range(n_layers))], rows, numeric=(0,))
    return (
        head
        + f"<p>Recorded {_recorded_when(sorted(by_epoch))} ({len(snapshots)} snapshots). "
          f"Epochs {', '.join(map(str, epochs))}, one row per layer (Figure 4 over training"
          + ("; quadratic heads with their 50% / 90% contours" if panels[0]["inverse_covariance"] is not None
             else "; learned and content heads have no Gaussian: the centers of mass of their positional attention")
          + ").</p>"
        + _img(centers, "head centers per layer at several epochs of training")
        + "<p>Each head's mean attention distance (tokens, averaged over queries) per layer over training.</p>"
        + _img(distance, "mean attention distance per head and layer over training")
        + "<p>Grid-likeness per layer: heads within 0.5 token of a distinct 3x3 kernel offset (one-to-one "
          "Hungarian matching), the mean matched distance; then the layer's mean attention distance.</p>" + table
    )


# ----------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------


def build_report(
    run_dir: str | os.PathLike,
    *,
    images: int = 100,
    data_dir: str | os.PathLike | None = None,
    dataset: str | None = None,
    device: str = "cpu",
) -> str:
    """The HTML text of a run's report (see the module docstring for its sections)."""
    images = whole_number(images, "images", "a number of test images")
    run_dir = path_argument(run_dir, "run_dir", "the run's directory")
    why = not_a_folder(run_dir)
    if why:
        raise AttnconvError(f"{run_dir}: not a run directory ({why}); give the --out of `attnconv train`")
    # a file, or a folder that holds no run: one error naming it
    run = Run(run_dir, device, data_dir=data_dir, dataset=dataset)
    meta, rows = run.meta, run.metrics
    run.model  # noqa: B018 (missing or corrupt weights: one error now, before any section is built)
    summary = describe_run(run)
    name = run_dir.resolve().name
    title = f"{name}: {summary['model']} on {summary['dataset']}"
    acc = summary["test_acc"]
    trained = (f"{summary['epochs']} epoch{'s' if summary['epochs'] != 1 else ''}, {summary['step']} steps"
               if rows else "no epoch recorded")
    sub = (f"{trained}; test accuracy "
           f"{significant(acc)}; {summary['params']:,} parameters; "
           f"run directory {run_dir.resolve()}; created {meta.get('created', '-')}")
    body = [
        f"<header><h1>{_e(title)}</h1><p class=\"sub\">{_e(sub)}</p>",
        '<nav aria-label="sections"><a href="#summary">Summary</a><a href="#training">Training curves</a>'
        '<a href="#test">Test set</a><a href="#attention">Attention</a><a href="#config">Configuration</a></nav></header><main>',
        _summary_section(summary),
        _curves_section(rows, summary["model"], meta),
        _test_section(run),
        _attention_section(run, images=images),
        _config_section(meta),
        f"</main><footer><p class=\"sub\">attnconv {_e(meta.get('attnconv', ''))}, torch "
        f"{_e(meta.get('torch', ''))}. Report generated by <code>attnconv report</code>.</p></footer>",
    ]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta name="generator" content="{SIGNATURE} {_e(attnconv.__version__)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


def write_report(
    run_dir: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    images: int = 100,
    data_dir: str | os.PathLike | None = None,
    dataset: str | None = None,
    device: str = "cpu",
    overwrite: bool = False,
) -> Path:
    """Write the report of `run_dir` to `out` (default RUN_DIR/report.html) atomically; return its path.

    `out` is checked first, before the report is built: an .html name, not a directory, its
    folder writable, not one of a run's own files, and not an existing file that attnconv did
    not write (unless `overwrite`)."""
    run_dir = path_argument(run_dir, "run_dir", "the run's directory")
    out = run_dir / REPORT_FILE if out is None else path_argument(out, "out", "a file path")
    if out.is_dir():
        raise ParameterError("out", out, f"is a directory; give a file name such as {out / REPORT_FILE}")
    if not_a_folder(run_dir) is None:  # else build_report names the missing run directory
        out = check_output_file(out, "out", (".html", ".htm"), overwrite=overwrite)
    text = build_report(run_dir, images=images, data_dir=data_dir, dataset=dataset, device=device)
    # a byte of a name that is not UTF-8 (a lone surrogate) written as its escape: the page stays UTF-8
    atomic_write(out, lambda tmp: tmp.write_text(text, encoding="utf-8", errors="backslashreplace"))
    return out
