"""`attnconv plot`: figures of what a trained attention run's layers learned (centers, distances, maps).

    attnconv plot centers runs/sa [--out centers.svg]         Figures 4, 12, 14: head centers per layer
    attnconv plot centers runs/sa --layer 2 [--epochs 0,1,12] Figure 4 over training: one layer at several epochs
    attnconv plot distance runs/sa                            mean attention distance per head over epochs
    attnconv plot maps runs/sa [--query 3,3] [--zoom 7]       Figures 5, 6: attention around a query

The help text and the run's arguments are shared with `attnconv analyze` (runargs.py).
"""

from __future__ import annotations

import argparse

from attnconv.cli.runargs import COORDS, HELP, add_run_arguments


def register(subparsers) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser("plot", help="figures of a trained attention run (centers, maps)", description=HELP,
                              formatter_class=fmt)
    figures = p.add_subparsers(dest="figure", metavar="FIGURE")
    figures.required = True

    c = figures.add_parser(
        "centers", help="each head's center and 50%%/90%% mass contours per layer (Figures 4, 12, 14)",
        description="Each head's attention center relative to the query pixel (black square), with the "
                    "contours holding 50% (solid) and 90% (dotted) of its mass, one panel per layer. "
                    "Quadratic heads: their Gaussian's level sets; learned and content heads: contours of the "
                    f"middle query's attention probabilities. Shifts are in tokens: {COORDS}.",
    )
    add_run_arguments(c)
    c.add_argument("--out", metavar="FILE",
                   help="output .png, .svg or .pdf (default RUN_DIR/centers.png, or RUN_DIR/centers-layerL.png)")
    _overwrite(c)
    c.add_argument("--layer", type=int, metavar="L",
                   help="draw layer L (from 1) at several epochs of training, from RUN_DIR/heads.jsonl")
    c.add_argument("--epochs", metavar="E,E,...",
                   help="with --layer (default 1): the recorded epochs to draw, 0 = initialization "
                        "(default: up to five, denser early)")
    c.set_defaults(func=run_centers)

    dist = figures.add_parser(
        "distance", help="each layer's mean attention distance per head over training (ViT Figure 7 style)",
        description="From RUN_DIR/heads.jsonl: for every layer, each head's mean attention distance (tokens, "
                    "averaged over queries) at initialization and after each epoch.",
    )
    dist.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `attnconv train`")
    dist.add_argument("--out", metavar="FILE", help="output .png, .svg or .pdf (default RUN_DIR/distance.png)")
    _overwrite(dist)
    dist.set_defaults(func=run_distance)

    m = figures.add_parser(
        "maps", help="attention probabilities around a query pixel, layers x heads (Figures 5, 6)",
        description="A layers x heads grid of the attention probabilities of one query, cropped to a "
                    f"zoom x zoom window around it (the query is outlined in red); {COORDS}.",
    )
    add_run_arguments(m)
    m.add_argument("--query", metavar="I,J", help="query token (row,col) on the token grid (default: its center)")
    m.add_argument("--zoom", type=int, default=7, metavar="N", help="side of the window in tokens (default 7)")
    m.add_argument("--image", type=int, metavar="K",
                   help="use test image K alone and draw it beside the maps (default: the mean over --images)")
    m.add_argument("--out", metavar="FILE",
                   help="output .png, .svg or .pdf (default RUN_DIR/maps.png, or RUN_DIR/maps-image-K.png)")
    _overwrite(m)
    m.set_defaults(func=run_maps)


def _overwrite(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out file that attnconv did not write (by default it is refused)")


def _query(text: str | None) -> tuple[int, int] | None:
    from attnconv.errors import AttnconvError

    if text is None:
        return None
    try:
        i, j = (int(v) for v in text.split(","))
    except ValueError:
        raise AttnconvError(f"--query {text!r}: give the token as I,J (row,column), e.g. --query 3,3") from None
    return i, j


def _epochs(text: str | None) -> list[int] | None:
    from attnconv.errors import AttnconvError

    if text is None:
        return None
    try:
        epochs = [int(v) for v in text.split(",")]
    except ValueError:
        raise AttnconvError(f"--epochs {text!r}: give whole numbers separated by commas, e.g. 0,1,2,5,12") from None
    if any(e < 0 for e in epochs):
        raise AttnconvError(f"--epochs {text!r}: epochs count from 0 (the initialization)")
    return epochs


def run_centers(args: argparse.Namespace) -> int:
    from attnconv.cli import one_line
    from attnconv.plots import plot_centers, plot_centers_history

    if args.layer is not None or args.epochs is not None:
        from attnconv.errors import AttnconvError

        given = [flag for flag, value in (("--dataset", args.dataset), ("--data-dir", args.data_dir)) if value]
        if given:  # the figure over training reads heads.jsonl only: a data flag would be silently ignored
            raise AttnconvError(f"{' and '.join(given)}: centers over training (--layer, --epochs) come from "
                                "RUN_DIR/heads.jsonl and read no images; leave them out")
        epochs = _epochs(args.epochs)
        layer = 1 if args.layer is None else args.layer
        print(one_line(str(plot_centers_history(args.run_dir, args.out, layer=layer, epochs=epochs,
                                                overwrite=args.overwrite))))
        return 0
    print(one_line(str(plot_centers(args.run_dir, args.out, images=args.images, data_dir=args.data_dir,
                                    dataset=args.dataset, device=args.device, overwrite=args.overwrite))))
    return 0


def run_distance(args: argparse.Namespace) -> int:
    from attnconv.cli import one_line
    from attnconv.plots import plot_distance

    print(one_line(str(plot_distance(args.run_dir, args.out, overwrite=args.overwrite))))
    return 0


def run_maps(args: argparse.Namespace) -> int:
    from attnconv.cli import one_line
    from attnconv.plots import plot_maps

    print(one_line(str(plot_maps(args.run_dir, args.out, images=args.images, query=_query(args.query), zoom=args.zoom,
                                 image=args.image, data_dir=args.data_dir, dataset=args.dataset, device=args.device,
                                 overwrite=args.overwrite))))
    return 0
