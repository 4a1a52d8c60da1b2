"""`attnconv export`: a trained run as a file other tools load.

    attnconv export runs/sa                          runs/sa/model.pt2 (torch.export)
    attnconv export runs/sa --format onnx            runs/sa/model.onnx (needs onnx, onnxscript)
    attnconv export runs/sa --format torchscript --out sa.ts

The file takes normalized images (B, C, H, W) at the run's image size, any batch size, and
returns logits; it is loaded back and checked against the model before the command returns.
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    from attnconv.export import FORMATS

    p = subparsers.add_parser("export", help="write a trained run as torch.export, TorchScript or ONNX",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `attnconv train` or `convert`")
    p.add_argument("--format", default="exported", choices=list(FORMATS), help="file format (default exported)")
    p.add_argument("--out", metavar="FILE", help="where to write (default RUN_DIR/model.pt2, .ts or .onnx)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnconv.cli import one_line
    from attnconv.export import export_run

    print(one_line(str(export_run(args.run_dir, args.format, args.out, overwrite=args.overwrite))))
    return 0
