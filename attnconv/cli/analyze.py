"""`attnconv analyze`: per layer and head of a trained attention run, the numbers behind the figures.

    attnconv analyze runs/sa [--json]                         centers, widths, distances, conv-likeness
"""

from __future__ import annotations

import argparse
import json

from attnconv.cli.runargs import HELP, add_run_arguments


def register(subparsers) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    a = subparsers.add_parser(
        "analyze", help="per layer and head: center, width, distance, window mass, conv-likeness",
        description=HELP + "\n" + _analysis_doc(), formatter_class=fmt,
    )
    add_run_arguments(a)
    a.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    a.set_defaults(func=run_analyze)


def _analysis_doc() -> str:
    from attnconv import analysis

    return analysis.__doc__.split("\n\n", 1)[1]


def run_analyze(args: argparse.Namespace) -> int:
    from attnconv.analysis import analyze_run, format_analysis
    from attnconv.cli import escaped

    result = analyze_run(args.run_dir, args.images, data_dir=args.data_dir, dataset=args.dataset, device=args.device)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(format_analysis(escaped(result)), end="")  # the run folder, the dataset: escaped, one line each
    return 0
