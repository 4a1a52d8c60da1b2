"""`attnconv convert`: a trained CNN run as an equivalent all-attention run (Theorem 1, network-wide).

    attnconv convert runs/resnet --out runs/resnet-attention

Every convolution becomes its exact attention equivalent (one head per kernel tap)
and, by default, each BatchNorm that follows a convolution is folded into it. The new
run directory works with every other command (eval, table, ...). Both networks are
evaluated on the test set (or its first --eval-images images; none with --no-eval); their
accuracies must be identical.
"""

from __future__ import annotations

import argparse

from attnconv.cli.evaluate import DATASET_HELP


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "convert", help="convert a trained CNN run into an equivalent attention run", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run of a CNN written by `attnconv train`")
    p.add_argument("--out", required=True, metavar="NEW_RUN_DIR", help="where to write the converted run (new)")
    p.add_argument("--no-fold-bn", dest="fold_bn", action="store_false",
                   help="keep BatchNorm layers instead of folding them into the attention layers")
    p.add_argument("--alpha", type=float, default=None, help="attention width (default: chosen from float32)")
    p.add_argument("--data-dir", help="dataset folder (default: the run's, then the usual places)")
    p.add_argument("--dataset", metavar="folder:PATH", help="evaluate on: " + DATASET_HELP)
    p.add_argument("--batch-size", type=int, default=250)
    p.add_argument("--eval-images", type=int, metavar="N",
                   help="compare the two networks on the first N test images only (default: the whole test set)")
    p.add_argument("--no-eval", dest="evaluate", action="store_false",
                   help="write the converted run without evaluating either network")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from attnconv import data as D
    from attnconv.cli import one_line
    from attnconv.errors import AttnconvError
    from attnconv.evaluate import count_flops, count_params
    from attnconv.runs import Run, convert_run, load_run

    source = Run(args.run_dir, data_dir=args.data_dir, dataset=args.dataset)
    cnn, info = source.model, source.info
    test = source.test_set if args.evaluate else None
    out = convert_run(args.run_dir, args.out, fold_bn=args.fold_bn, alpha=args.alpha)
    norms = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in cnn.modules())
    print(f"converted {one_line(str(args.run_dir))} -> {one_line(str(out))}  "
          f"({('BatchNorm folded' if args.fold_bn else 'BatchNorm kept') if norms else 'no BatchNorm to fold'})")
    if test is None:
        return 0
    if args.eval_images is not None:
        test = D.ImageSet(test.images[: args.eval_images], test.labels[: args.eval_images])
    attn, _ = load_run(out)

    correct = {"cnn": 0, "attention": 0}
    disagree = 0
    max_rel = 0.0
    with torch.no_grad():
        for i in range(0, len(test), args.batch_size):
            x = D.normalize(test.images[i : i + args.batch_size], info)
            y = test.labels[i : i + args.batch_size]
            a, b = cnn(x), attn(x)
            max_rel = max(max_rel, ((a - b).norm() / a.norm()).item())
            correct["cnn"] += (a.argmax(1) == y).sum().item()
            correct["attention"] += (b.argmax(1) == y).sum().item()
            disagree += (a.argmax(1) != b.argmax(1)).sum().item()
    shape = source.input_shape
    n = len(test)
    names = {"cnn": source.config.model, "attention": "converted"}  # a ViT's patch embedding is a conv too
    width = max(10, *(len(v) for v in names.values()))
    print(f"{'network':<{width}} {'test acc':>9} {'params':>12} {'FLOPs/image':>15}")
    for name, model in (("cnn", cnn), ("attention", attn)):
        flops = count_flops(model, shape)["total"]
        print(f"{names[name]:<{width}} {correct[name] / n:>9.4f} {count_params(model):>12,} {flops:>15,}")
    print(f"predictions that differ: {disagree} of {n}; max relative difference of the logits per batch: {max_rel:.2e}")
    if correct["cnn"] != correct["attention"]:
        raise AttnconvError(f"the converted network's accuracy differs from the {names['cnn']}'s; please report this")
    return 0
