"""`attnconv learn-conv`: train attention to reproduce a random KxK convolution; where do the centers go?

    attnconv learn-conv --out runs/learn-conv                 does attention learn a 3x3 conv?
"""

from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    from attnconv.learnconv import DEFAULTS

    lc = subparsers.add_parser(
        "learn-conv", help="train attention to reproduce a random KxK conv; where do the centers go?",
        description=_learnconv_doc(), formatter_class=argparse.RawDescriptionHelpFormatter,
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


def _learnconv_doc() -> str:
    from attnconv import learnconv

    return learnconv.__doc__


def run_learn_conv(args: argparse.Namespace) -> int:
    from attnconv.cli import one_line
    from attnconv.learnconv import learn_conv

    # --out's folder is made by the write of its results (and removed again if that write fails)
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
    print(f"wrote {one_line(str(args.out))}/learn-conv.json and {one_line(str(args.out))}/learn-conv.png")
    return 0

