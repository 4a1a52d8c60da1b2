"""`attnconv plot`, `attnconv analyze`, `attnconv learn-conv`: what trained attention layers learned.

    attnconv plot centers runs/sa [--out centers.svg]         Figures 4, 12, 14: head centers per layer
    attnconv plot centers runs/sa --layer 2 [--epochs 0,1,12] Figure 4 over training: one layer at several epochs
    attnconv plot distance runs/sa                            mean attention distance per head over epochs
    attnconv plot maps runs/sa [--query 3,3] [--zoom 7]       Figures 5, 6: attention around a query
    attnconv plot maps runs/sa-content --image 0              one test image, drawn beside the maps
    attnconv analyze runs/sa [--json]                         centers, widths, distances, conv-likeness
    attnconv learn-conv --out runs/learn-conv                 does attention learn a 3x3 conv?

Coordinates are token-grid coordinates: the image after the model's d x d downsampling
(a 28x28 image with downsample 4 has a 7x7 token grid), (row, column), rows down.
Content-attention models are averaged over --images test images of the run's dataset,
sampled across its classes (a fixed seed: the same images every time); position-only models
need no images. Layers and heads are numbered from 1, in the figures and in `analyze` (--json
too), as in the paper; query coordinates and test image indices (--image K) count from 0.
"""

from __future__ import annotations

import argparse
import json

from attnconv.cli.evaluate import DATASET_HELP

_COORDS = "coordinates are on the token grid (image_size // downsample), not image pixels"


def register(subparsers) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser("plot", help="figures of a trained attention run (centers, maps)", description=__doc__,
                              formatter_class=fmt)
    figures = p.add_subparsers(dest="figure", metavar="FIGURE")
    figures.required = True

    c = figures.add_parser(
        "centers", help="each head's center and 50%%/90%% mass contours per layer (Figures 4, 12, 14)",
        description="Each head's attention center relative to the query pixel (black square), with the "
                    "contours holding 50% (solid) and 90% (dotted) of its mass, one panel per layer. "
                    "Quadratic heads: their Gaussian's level sets; learned and content heads: contours of the "
                    f"middle query's attention probabilities. Shifts are in tokens: {_COORDS}.",
    )
    _common(c)
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
                    f"zoom x zoom window around it (the query is outlined in red); {_COORDS}.",
    )
    _common(m)
    m.add_argument("--query", metavar="I,J", help="query token (row,col) on the token grid (default: its center)")
    m.add_argument("--zoom", type=int, default=7, metavar="N", help="side of the window in tokens (default 7)")
    m.add_argument("--image", type=int, metavar="K",
                   help="use test image K alone and draw it beside the maps (default: the mean over --images)")
    m.add_argument("--out", metavar="FILE",
                   help="output .png, .svg or .pdf (default RUN_DIR/maps.png, or RUN_DIR/maps-image-K.png)")
    _overwrite(m)
    m.set_defaults(func=run_maps)

    a = subparsers.add_parser(
        "analyze", help="per layer and head: center, width, distance, window mass, conv-likeness",
        description=__doc__ + "\n" + _analysis_doc(), formatter_class=fmt,
    )
    _common(a)
    a.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    a.set_defaults(func=run_analyze)

    from attnconv.learnconv import DEFAULTS

    lc = subparsers.add_parser(
        "learn-conv", help="train attention to reproduce a random KxK conv; where do the centers go?",
        description=_learnconv_doc(), formatter_class=fmt,
    )
    lc.add_argument("--kernel", type=int, default=DEFAULTS["kernel"], help="teacher kernel size K (odd)")
    lc.add_argument("--heads", type=int, default=DEFAULTS["heads"], help="attention heads (K^2 for Theorem 1)")
    lc.add_argument("--steps", type=int, default=DEFAULTS["steps"], help="Adam steps")
    lc.add_argument("--channels", type=int, default=DEFAULTS["channels"], help="channels C of conv and attention")
    lc.add_argument("--size", type=int, default=DEFAULTS["size"], help="side of the input images")
    lc.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    lc.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="Adam learning rate (cosine decay to 0)")
    lc.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    lc.add_argument("--source", choices=("fmnist", "random"),
                    help="inputs: Fashion-MNIST crops or Gaussian images (default: fmnist when found, else random)")
    lc.add_argument("--data-dir", help="Fashion-MNIST folder (default: the usual places; never downloaded)")
    lc.add_argument("--out", default="learn-conv", metavar="DIR",
                    help="folder for learn-conv.json and learn-conv.png (default ./learn-conv)")
    lc.add_argument("--json", action="store_true", help="print the result as JSON")
    lc.add_argument("--overwrite", action="store_true",
                    help="replace learn-conv.json / learn-conv.png in --out even if attnconv did not write them")
    lc.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    lc.set_defaults(func=run_learn_conv)


def _overwrite(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out file that attnconv did not write (by default it is refused)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `attnconv train`")
    p.add_argument("--images", type=int, default=100, metavar="N",
                   help="content models: average over N test images sampled across the classes (default 100)")
    p.add_argument("--data-dir", help="dataset folder (default: the run's, then the usual places)")
    p.add_argument("--dataset", metavar="folder:PATH", help=DATASET_HELP)
    p.add_argument("--device", default="cpu", help="cpu or cuda")


def _analysis_doc() -> str:
    from attnconv import analysis

    return analysis.__doc__.split("\n\n", 1)[1]


def _learnconv_doc() -> str:
    from attnconv import learnconv

    return learnconv.__doc__


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
    from attnconv.plots import plot_centers, plot_centers_history

    if args.layer is not None or args.epochs is not None:
        from attnconv.errors import AttnconvError

        given = [flag for flag, value in (("--dataset", args.dataset), ("--data-dir", args.data_dir)) if value]
        if given:  # the figure over training reads heads.jsonl only: a data flag would be silently ignored
            raise AttnconvError(f"{' and '.join(given)}: centers over training (--layer, --epochs) come from "
                                "RUN_DIR/heads.jsonl and read no images; leave them out")
        epochs = _epochs(args.epochs)
        layer = 1 if args.layer is None else args.layer
        print(plot_centers_history(args.run_dir, args.out, layer=layer, epochs=epochs, overwrite=args.overwrite))
        return 0
    print(plot_centers(args.run_dir, args.out, images=args.images, data_dir=args.data_dir, dataset=args.dataset,
                       device=args.device,
                       overwrite=args.overwrite))
    return 0


def run_distance(args: argparse.Namespace) -> int:
    from attnconv.plots import plot_distance

    print(plot_distance(args.run_dir, args.out, overwrite=args.overwrite))
    return 0


def run_maps(args: argparse.Namespace) -> int:
    from attnconv.plots import plot_maps

    print(plot_maps(args.run_dir, args.out, images=args.images, query=_query(args.query), zoom=args.zoom,
                    image=args.image, data_dir=args.data_dir, dataset=args.dataset, device=args.device, overwrite=args.overwrite))
    return 0


def run_analyze(args: argparse.Namespace) -> int:
    from attnconv.analysis import analyze_run, format_analysis

    result = analyze_run(args.run_dir, args.images, data_dir=args.data_dir, dataset=args.dataset, device=args.device)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(format_analysis(result), end="")
    return 0


def run_learn_conv(args: argparse.Namespace) -> int:
    from attnconv.learnconv import learn_conv

    r = learn_conv(args.kernel, args.heads, args.steps, args.channels, args.size, seed=args.seed,
                   source=args.source, batch_size=args.batch_size, lr=args.lr, out=args.out,
                   data_dir=args.data_dir, progress=args.progress, overwrite=args.overwrite)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    m, k = r["matching"], args.kernel
    if "note" in r:
        print(f"note: {r['note']}")
    print(f"teacher {k}x{k} conv, {args.heads} quadratic heads, {args.channels} channels, "
          f"{args.size}x{args.size} {r['config']['source']} inputs, {args.steps} steps in {r['seconds']:.1f} s")
    print(f"held-out relative error ||attn(x) - conv(x)|| / ||conv(x)||: {r['relative_error']:.4g} "
          f"(at init {r['initial_relative_error']:.4g}; all pixels, attention on the zero-padded grid)")
    print(f"centers vs the {k}x{k} grid (Hungarian matching): mean distance {m['mean_distance']:.3f}, "
          f"max {m['max_distance']:.3f}, {m['within']}/{args.heads} heads within {m['tolerance']} px")
    cond = r["tap_mixing_condition"]
    print(f"mass inside the {k}x{k} window per head: min {min(r['window_mass']):.3f}; "
          f"tap-mixing condition number {'-' if cond is None else f'{cond:.3g}'}")
    print(f"  {'head':>4} {'center':>16} {'alpha':>7} {'grid point':>11} {'dist':>6} {'in window':>9}")
    for h, c in enumerate(r["centers"]):
        g = m["matched_point"][h]
        gp = "-" if g is None else f"({g[0]:+.0f}, {g[1]:+.0f})"
        d = m["distance"][h]
        print(f"  {h + 1:>4} {f'({c[0]:+.2f}, {c[1]:+.2f})':>16} {r['alpha'][h]:>7.2f} {gp:>11} "
              f"{'-' if d is None else f'{d:.3f}':>6} {r['window_mass'][h]:>9.3f}")
    print(f"wrote {args.out}/learn-conv.json and {args.out}/learn-conv.png")
    return 0

