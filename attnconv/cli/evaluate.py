"""`attnconv eval`, `attnconv table` and `attnconv compare`: accuracy, parameters and FLOPs of
trained runs, and how far their heads moved.

    attnconv eval runs/sa [--json]                    accuracy, per class, confusion matrix
    attnconv eval runs/mine --dataset folder:new-photos   on another test folder with the run's classes
    attnconv table benchmarks/table1/*/*              Table 1, seeds averaged, as text
    attnconv table runs/resnet runs/sa --markdown > table.md

`eval` loads the weights and measures the test set in one pass: the accuracy and loss, then
each class's accuracy and image count, and the confusion matrix (rows: true class, columns:
predicted; column names abbreviated). --json holds the same as "classes", "per_class"
(class name -> accuracy, null for a class with no test images) and "confusion".

The run's own test data must be the data it recorded when it was trained (config.json "data": classes,
image counts, normalization, and a digest of the test images' pixels and labels): data that changed
since (an image replaced, labels swapped, images added) is one error saying what changed, unless
--allow-data-change, which measures it anyway with a warning line (not data the model cannot take:
another class count or other channels).

--dataset folder:PATH measures the run on another image folder's test split (PATH/test/ or
PATH/val/, in the ImageFolder layout, PATH/train/ naming the classes): its classes must be the
run's, the same names, else one error listing both. The images are decoded at the run's size
and normalized as the run was trained. A run whose image folder was moved or deleted says so
(the stored path) and asks for --dataset folder:PATH; a built-in dataset whose --data-dir is
gone, and not found elsewhere, asks for --data-dir.

`table` puts the runs of one configuration (everything but the seed and where the run
ran: device, workers, data_dir, checkpoint_every, compile, preset) in one row: test
accuracy as mean ± sample standard deviation over the seeds (last metrics.csv row of
each), parameters, FLOPs and seconds per epoch (mean), rows in the paper's order. It
reads config.json and metrics.csv only, so run directories without their weights do;
--recompute loads the weights and measures the accuracy on the test set instead.

FLOPs are per image at batch size 1. "all ops" is what torch.utils.flop_counter
counts: matrix products, convolutions and attention (2 per multiply-add); it leaves
out elementwise ops (softmax, activations, normalization, residual adds).
"Linear only" is the paper's convention: nn.Linear layers alone.

`compare GROUP...` puts groups of runs side by side (a group: a folder of seed*/ runs, or one
run), from their metrics.csv and heads.jsonl alone: per layer, how far the heads' centers moved
from initialization (mean and largest, tokens), how many sit within 0.5 token of a distinct
K x K offset (--kernels 3,4) with the mean matched distance, and the mean attention distance;
the test accuracy over seeds. --epoch N compares after N epochs instead of at the end.

    attnconv compare benchmarks/table1/sa-quadratic benchmarks/recipes/*/sa-quadratic
"""

from __future__ import annotations

import argparse
import json

# The --dataset flag of every command that reads a run's test images (eval, table, report, explore, plot, ...).
DATASET_HELP = ("take the test images from this dataset instead of the run's (e.g. the run's image folder "
                "where it is now, or another folder with the same classes)")


ALLOW_HELP = ("measure the run although its test data changed since it was trained (refused by default: another "
              "image count, normalization, or test images whose pixels or labels differ); a warning says what "
              "changed. Data the run's model cannot take (another class count, other channels) stays refused: "
              "give the data it was trained on with --dataset folder:PATH")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="test accuracy, parameters and FLOPs of a run", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `attnconv train`")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--data-dir", help="dataset folder (default: the run's, then the usual places)")
    p.add_argument("--dataset", metavar="folder:PATH", help=DATASET_HELP)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--allow-data-change", action="store_true", help=ALLOW_HELP)
    p.set_defaults(func=run_eval)

    t = subparsers.add_parser(
        "table", help="Table 1 of the paper from run directories (seeds averaged)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("run_dirs", metavar="RUN_DIR", nargs="+",
                   help="run directories (config.json and metrics.csv; weights only for --recompute)")
    t.add_argument("--markdown", action="store_true", help="print a Markdown table instead of aligned text")
    t.add_argument("--recompute", action="store_true",
                   help="load each run's weights and measure its test accuracy anew (default: metrics.csv)")
    t.add_argument("--data-dir", help="with --recompute: dataset folder (default: the run's, then the usual places)")
    t.add_argument("--dataset", metavar="folder:PATH", help="with --recompute: " + DATASET_HELP)
    t.add_argument("--device", default="cpu", help="with --recompute: cpu or cuda")
    t.add_argument("--batch-size", type=int, default=500, help="with --recompute: images per forward pass")
    t.add_argument("--allow-data-change", action="store_true", help="with --recompute: " + ALLOW_HELP)
    t.set_defaults(func=run_table)

    c = subparsers.add_parser(
        "compare", help="groups of runs side by side: accuracy, centers moved, grid-likeness per layer",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("groups", metavar="GROUP", nargs="+", help="a folder of seed*/ runs, or one run directory")
    c.add_argument("--epoch", type=int, help="compare after this many epochs (default: each run's last)")
    c.add_argument("--kernels", default="3", metavar="LIST",
                   help="comma-separated grid sizes K to match the centers against (default 3; e.g. 3,4)")
    shown = c.add_mutually_exclusive_group()
    shown.add_argument("--markdown", action="store_true", help="print a Markdown table instead of aligned text")
    shown.add_argument("--json", action="store_true", help="print the rows as JSON")
    c.set_defaults(func=run_compare)


def _warn(message: str) -> None:
    """A `warning:` line, said as the commands' other warnings are (Python's warnings, so that `-W error` makes it an
    error line and `-W ignore` silences it)."""
    from attnconv.errors import attnconv_warning

    attnconv_warning(message, 3)


def run_eval(args: argparse.Namespace) -> int:
    from attnconv.analysis import json_ready
    from attnconv.cli import escaped, one_line
    from attnconv.evaluate import describe_run

    s = describe_run(args.run_dir, recompute=True, device=args.device, data_dir=args.data_dir,
                     dataset=args.dataset, batch_size=args.batch_size, allow_data_change=args.allow_data_change)
    if "warning" in s:  # e.g. NaN weights: the numbers below are printed, but say what they are worth
        _warn(s["warning"])
    if args.json:
        print(json.dumps(json_ready(s), indent=2, allow_nan=False))  # a diverged run's NaN as null: strict JSON
        return 0

    def out(text: str) -> None:  # names from the run's files (the folder, classes, dataset): escaped, as error lines
        print(one_line(text))  # are, a newline in them too: each is one line

    out(f"run          {s['run']}")
    where = f"epoch {s['epochs']}, step {s['step']}" if "weights_step" not in s else \
        f"epoch {s['epochs']}, step {s['step']} in metrics.csv; measured: the weights of step {s['weights_step']}"
    if "converted_from" in s:  # no steps of its own: the source run's weights, as attention
        where = f"converted from {s['converted_from']}, not trained since"
    out(f"model        {s['model']} on {s['dataset']} ({where})")
    if "test_dataset" in s:
        widened = "; grey, each given the run's 3 equal channels" if s.get("test_widened") else ""
        out(f"test set     {s['test_dataset']} ({s['test_images']:,} images, the run's classes{widened})")
    out(f"test acc     {s['test_acc']:.4f}  (loss {s['test_loss']:.4f})")
    out(f"parameters   {s['params']:,}")
    out(f"FLOPs/image  {s['flops_total']:,} (all ops counted by torch.utils.flop_counter)")
    out(f"             {s['flops_linear']:,} (Linear layers only, the paper's convention)")
    top = sorted(s["flops_by_op"].items(), key=lambda kv: -kv[1])
    out("by op        " + ", ".join(f"{op} {v:,}" for op, v in top))
    classes = escaped(s["classes"])  # tables of several lines: their names escaped, the rows kept
    print(f"\n{per_class_text(classes, s['confusion'])}\n\n{confusion_text(classes, s['confusion'])}")
    return 0


def _accuracy(value: float | None) -> str:
    from attnconv.tables import significant

    return significant(value)  # 3 significant digits, as the report; "-" for None


def per_class_text(classes: list[str], confusion: list[list[int]]) -> str:
    """One line per class: its name, its test accuracy (3 significant digits; "-" without images), its image count."""
    from attnconv.evaluate import per_class_accuracy
    from attnconv.tables import format_table

    rows = [[name, _accuracy(acc), f"{sum(row):,}"]
            for name, acc, row in zip(classes, per_class_accuracy(confusion), confusion)]
    return "per class\n" + format_table(["class", "accuracy", "images"], rows, align="lrr")


MAX_MATRIX_CLASSES = 30  # wider than a terminal beyond this: --json has the matrix


def abbreviations(names: list[str], width: int = 5) -> list[str]:
    """Names cut to `width` characters, longer where two would read alike; numbered if still equal."""
    names = [str(n) for n in names]
    longest = max((len(n) for n in names), default=0)
    for w in range(width, max(width, longest) + 1):
        short = [n[:w] for n in names]
        if len(set(short)) == len(short):
            return short
    return [f"{i}:{n[:width]}" for i, n in enumerate(names)]


def confusion_text(classes: list[str], confusion: list[list[int]]) -> str:
    """The confusion matrix as a table: a row per true class, a column per predicted class (names abbreviated)."""
    from attnconv.tables import format_table

    if len(classes) > MAX_MATRIX_CLASSES:
        return f"confusion matrix: {len(classes)} classes, too wide to print (see --json)"
    rows = [[name, *(str(n) for n in row)] for name, row in zip(classes, confusion)]
    header = ["true \\ predicted", *abbreviations(classes)]
    return ("confusion matrix (rows: true class, columns: predicted)\n"
            + format_table(header, rows, align="l" + "r" * len(classes)))


def run_table(args: argparse.Namespace) -> int:

    from attnconv.cli import escaped
    from attnconv.evaluate import describe_run, runs_table

    if args.dataset is not None and not args.recompute:
        from attnconv.errors import AttnconvError

        raise AttnconvError("--dataset applies with --recompute only (without it the accuracy is metrics.csv's)")
    summaries = [describe_run(d, recompute=args.recompute, device=args.device, data_dir=args.data_dir,
                              dataset=args.dataset, batch_size=args.batch_size,
                              allow_data_change=args.allow_data_change) for d in args.run_dirs]
    for s in summaries:
        if "warning" in s:
            _warn(s["warning"])
    print(runs_table(escaped(summaries), markdown=args.markdown), end="")  # each name escaped: one row each
    return 0


def run_compare(args: argparse.Namespace) -> int:
    import json

    from attnconv.analysis import json_ready
    from attnconv.analysis.compare import MAX_KERNEL, compare_groups, format_comparison
    from attnconv.cli import escaped
    from attnconv.errors import AttnconvError

    try:
        kernels = tuple(dict.fromkeys(int(k) for k in args.kernels.split(",")))  # 3,3: one column each
    except ValueError:
        kernels = ()
    if not kernels or not all(1 <= k <= MAX_KERNEL for k in kernels):
        raise AttnconvError(f"--kernels {args.kernels!r}: give comma-separated kernel sizes from 1 to {MAX_KERNEL}, "
                            "e.g. 3,4")
    rows = compare_groups(args.groups, epoch=args.epoch, kernels=kernels)
    if args.json:
        print(json.dumps(json_ready(rows), indent=1, allow_nan=False))
    else:
        print(format_comparison(escaped(rows), kernels=kernels, markdown=args.markdown), end="")  # one row each
    return 0
