"""`attnconv report` and `attnconv explore`: a run as one HTML page, and a live attention explorer.

    attnconv report runs/sa [--out sa.html]              config, curves, Table-1 row, figures, analysis
    attnconv explore runs/sa [--port 0] [--images 32]    pick an image and a query pixel, see every head
    attnconv explore runs/sa --export sa.html            the same page as one file, no server needed

`report` writes one self-contained file (figures embedded, no external assets).
`explore` serves a page on 127.0.0.1 only; the attention of every layer and head is
computed from the checkpoint for each request. Stop it with Ctrl-C. With --export it
writes the page, its script and the attention of the --images N test images into one
HTML file instead (`attnconv.explorer.export`).
"""

from __future__ import annotations

import argparse

from attnconv.cli.evaluate import DATASET_HELP


def register(subparsers) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    r = subparsers.add_parser(
        "report", help="one self-contained HTML page of a run (config, curves, table row, attention)",
        description=_doc("report"), formatter_class=fmt,
    )
    r.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `attnconv train` or `convert`")
    r.add_argument("--out", metavar="FILE.html", help="where to write the page (default RUN_DIR/report.html)")
    r.add_argument("--images", type=int, default=100, metavar="N",
                   help="content models: average the attention over N test images sampled across the classes "
                        "(default 100)")
    r.add_argument("--data-dir", help="dataset folder (default: the run's, then the usual places)")
    r.add_argument("--dataset", metavar="folder:PATH", help=DATASET_HELP)
    r.add_argument("--device", default="cpu", help="cpu or cuda")
    r.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out file that attnconv did not write (by default it is refused)")
    r.set_defaults(func=run_report)

    e = subparsers.add_parser(
        "explore", help="a local web page: pick a test image and a pixel, see every layer's and head's attention",
        description=_doc("explorer"), formatter_class=fmt,
    )
    e.add_argument("run_dir", metavar="RUN_DIR",
                   help="a run of an attention model (sa-*), or of a CNN converted to attention (convert, --init-from)")
    e.add_argument("--port", type=int, default=8765, help="TCP port on 127.0.0.1 (default 8765; 0: any free port)")
    e.add_argument("--images", type=int, default=32, metavar="N",
                   help="offer N test images, sampled across the classes (default 32)")
    e.add_argument("--export", metavar="FILE.html",
                   help="write the explorer as one self-contained file for the --images N test images "
                        "(opens from disk: no server, no network) instead of serving it")
    e.add_argument("--overwrite", action="store_true",
                   help="with --export: replace an existing file that attnconv did not write (by default refused)")
    e.add_argument("--no-browser", dest="browser", action="store_false", help="do not open a web browser")
    e.add_argument("--data-dir", help="dataset folder (default: the run's, then the usual places)")
    e.add_argument("--dataset", metavar="folder:PATH", help=DATASET_HELP)
    e.add_argument("--device", default="cpu", help="cpu or cuda")
    e.set_defaults(func=run_explore)


def _doc(which: str) -> str:
    if which == "report":
        from attnconv import report

        return report.__doc__
    from attnconv.explorer import export, server

    return f"{server.__doc__}\n{export.__doc__}"


def run_report(args: argparse.Namespace) -> int:
    from attnconv.cli import one_line
    from attnconv.report import write_report

    print(one_line(str(write_report(args.run_dir, args.out, images=args.images, data_dir=args.data_dir,
                                    dataset=args.dataset, device=args.device, overwrite=args.overwrite))))
    return 0


def run_explore(args: argparse.Namespace) -> int:
    import sys
    import webbrowser

    from attnconv.cli import one_line
    from attnconv.errors import AttnconvError
    from attnconv.explorer import Explorer, make_server, write_export
    from attnconv.limits import format_bytes

    if args.export is not None:
        out = write_export(args.run_dir, args.export, images=args.images, data_dir=args.data_dir,
                           dataset=args.dataset, device=args.device, overwrite=args.overwrite)
        print(f"{one_line(str(out))} ({format_bytes(out.stat().st_size)})")
        return 0
    if args.overwrite:
        raise AttnconvError("--overwrite applies to --export FILE.html only; leave it out, or give --export")
    explorer = Explorer(args.run_dir, images=args.images, data_dir=args.data_dir, dataset=args.dataset,
                        device=args.device)
    server = make_server(explorer, args.port)
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    print(f"attnconv explorer: {one_line(explorer.title)} at {url} (Ctrl-C to stop)", flush=True)
    if args.browser:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0
