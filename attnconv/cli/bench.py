"""`attnconv bench`: the fast attention paths against the dense baseline, in one run.

    attnconv bench --quick                         # a few minutes on a CPU
    attnconv bench --markdown out.md --json out.json
    attnconv bench --only layer --sides 16,32 --repeats 7
    attnconv bench --device cuda --amp --compile   # GPU: bf16 autocast, compiled variants, FlexAttention
    attnconv bench --only presets,conv,fullsize,compile --threads 1   # the CPU sections, fp32 and bf16
    attnconv bench --only grid --precisions fp32                      # 7x7 to 32x32 tokens

Each comparison runs in one process on the same inputs, after warm-up, with the
variants' repeats interleaved; it prints the medians, dense/variant ratios next to
their targets, the output error against a float64 reference, and peak memory.
Benchmarks: matmul, layer, model (with utilization: model FLOP/s / matmul FLOP/s), data, memory;
on request (--only): presets (the Fashion-MNIST attention and ResNet presets), grid (the
attention preset's step at 7x7, 14x14, 16x16 and 32x32 tokens against 7x7 and ResNet), conv (the
quadratic layer vs Conv2d vs Swin-style attention), fullsize (the paper's step against the
matmul rate, fp32 and bf16), compile (torch.compile's cost and gain per named model).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from attnconv.errors import AttnconvError
from attnconv.fileio import atomic_write_all, check_output_file, describe_os_error, same_path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark the attention paths, the models, the data pipeline", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="reduced sizes and repeats (a few minutes on a CPU)")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # toy sizes: the smoke test
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu (default) or cuda")
    p.add_argument("--amp", action="store_true", help="bf16 autocast around forward passes")
    p.add_argument("--compile", action="store_true", help="also time torch.compile'd fast variants")
    p.add_argument("--only", type=_names, metavar="LIST",
                   help="comma-separated subset of: matmul,layer,model,data,memory (default: these five; "
                        "utilization is reported when matmul and model both run) and the CPU sections "
                        "presets,grid,conv,fullsize,compile")
    p.add_argument("--precisions", type=_precisions, metavar="LIST",
                   help="precisions of the CPU sections: fp32,bf16 (default both; bf16 = bf16 autocast)")
    p.add_argument("--fullsize-batch", type=_positive, metavar="N",
                   help="batch of the fullsize section's step (default 100, the paper's)")
    p.add_argument("--repeats", type=_positive, metavar="N", help="timed runs per variant (default 5, --quick 3)")
    p.add_argument("--sides", type=_sides, metavar="LIST", help="layer image sides (default 8,16,32,64; --quick 8,16,32)")
    p.add_argument("--grids", type=_sides, metavar="LIST",
                   help="token grids of the grid section, tokens a side, from 7,14,16,32 (default all; --quick 7,14,16)")
    p.add_argument("--channels", type=_positive, metavar="N",
                   help="channels of the layer benchmark's layers (default 400, the paper's hidden size)")
    p.add_argument("--model-batch", type=_positive, metavar="N",
                   help="batch of the model training steps, both token grids (default 100, the paper's)")
    p.add_argument("--model-layers", type=_positive, metavar="N",
                   help="layers of the attention models in the model benchmarks (default 6, the paper's; "
                        "every layer is the same, so the dense/fast ratio hardly depends on it)")
    p.add_argument("--threads", type=_positive, metavar="N", help="torch intra-op threads (default: torch's)")
    p.add_argument("--memory-budget-gb", type=float, metavar="GB",
                   help="skip cases estimated above this (default: 60%% of RAM, at most 80%% of what is free)")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.profiler on each case that misses its target (default: on, off with --quick)")
    p.add_argument("--json", metavar="OUT.json", help="also write every number measured, as JSON")
    p.add_argument("--markdown", metavar="OUT.md", help="also write a section for benchmarks/RESULTS.md")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --json / --markdown file that attnconv did not write")
    p.set_defaults(func=run_bench)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _sides(text: str) -> tuple[int, ...]:
    try:
        return tuple(_positive(v) for v in text.split(",") if v.strip()) or _bad_sides(text)
    except argparse.ArgumentTypeError:
        return _bad_sides(text)


def _bad_sides(text: str):
    raise argparse.ArgumentTypeError(f"expected comma-separated image sides such as 8,16,32, got {text!r}")


def _choices(text: str, options, what: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [n for n in names if n not in options]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(bad) or repr(text)}; "
                                         f"choose from {','.join(options)}")
    return names


def _names(text: str) -> tuple[str, ...]:
    from attnconv.bench import SECTIONS

    return _choices(text, SECTIONS, "benchmark")


def _precisions(text: str) -> tuple[str, ...]:
    from attnconv.bench import PRECISIONS

    return _choices(text, PRECISIONS, "precision")


def command_line(args: argparse.Namespace) -> str:
    """The command, rebuilt from the parsed options (those that differ from the defaults)."""
    parts = ["attnconv", "bench"]
    for flag in ("quick", "tiny", "amp", "compile"):
        if getattr(args, flag):
            parts.append(f"--{flag}")
    if args.profile is not None:
        parts.append("--profile" if args.profile else "--no-profile")
    if args.device != "cpu":
        parts += ["--device", args.device]
    if args.only:
        parts += ["--only", ",".join(args.only)]
    if args.sides:
        parts += ["--sides", ",".join(map(str, args.sides))]
    if args.grids:
        parts += ["--grids", ",".join(map(str, args.grids))]
    if args.precisions:
        parts += ["--precisions", ",".join(args.precisions)]
    for flag in ("repeats", "channels", "model_batch", "model_layers", "fullsize_batch", "threads", "memory_budget_gb",
                 "json", "markdown"):
        value = getattr(args, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    return shlex.join(parts)


def config_from_args(args: argparse.Namespace):
    """BenchConfig for the parsed options (--quick / --tiny pick the base sizes)."""
    from attnconv import bench

    if args.quick and args.tiny:
        raise AttnconvError("choose one of --quick and --tiny")
    make = bench.tiny_config if args.tiny else bench.quick_config if args.quick else bench.BenchConfig
    changes = {"device": args.device, "amp": args.amp, "compile": args.compile, "threads": args.threads}
    if args.only:
        changes["only"] = args.only
    if args.repeats:
        changes["repeats"] = args.repeats
    if args.profile is not None:
        changes["profile"] = args.profile
    if args.sides:
        changes["sides"] = args.sides
    if args.grids:
        changes["grids"] = args.grids
    if args.precisions:
        changes["precisions"] = args.precisions
    if args.fullsize_batch:
        changes["fullsize_batch"] = args.fullsize_batch
    if args.channels:
        changes["channels"] = args.channels
    if args.model_batch:
        changes["model_batch"] = changes["full_res_batch"] = args.model_batch
    if args.model_layers:
        base = make().model_overrides
        changes["model_overrides"] = {**base, "layers": args.model_layers}
    if args.memory_budget_gb is not None:
        if args.memory_budget_gb <= 0:
            raise AttnconvError(f"--memory-budget-gb must be positive, got {args.memory_budget_gb}")
        changes["memory_budget"] = int(args.memory_budget_gb * 1e9)
    return make(**changes)


def run_bench(args: argparse.Namespace) -> int:
    from attnconv import bench

    cfg = config_from_args(args)
    cfg.validate()
    # Before any benchmark runs: an output that cannot be written fails now, not after the whole run.
    if args.markdown and args.json and same_path(args.markdown, args.json):
        raise AttnconvError(f"--markdown {args.markdown} and --json {args.json} name one file, which would hold only "
                            "the JSON; give each its own path")
    outputs = {flag: check_output_file(path, flag[2:], (), overwrite=args.overwrite)
               for flag, path in (("--markdown", args.markdown), ("--json", args.json)) if path}
    command = command_line(args)
    print(command, flush=True)
    report = bench.run_benchmarks(cfg, command, on_section=lambda s: print("\n" + bench.format_section(s), flush=True))
    m = report.machine
    print(f"machine: {m['cpu']}, {m['cores']} cores, {m['threads']} threads, torch {m['torch']}"
          + (f", GPU {m['gpu']}" if m.get("gpu") else "") + f"; load average at start {m['load']}; {report.date}")
    texts = {"--markdown": lambda: bench.format_report(report, markdown=True), "--json": lambda: bench.report_json(report)}
    _write({flag: (path, texts[flag]()) for flag, path in outputs.items()})
    if report.failures:
        print(f"error: {len(report.failures)} benchmark case(s) failed; their errors are in the notes", file=sys.stderr)
        return 1
    return 0


def _write(outputs: dict[str, tuple[Path, str]]) -> None:
    """--markdown and --json as one pair (`fileio.atomic_write_all`): a failure leaves both old files as they were."""
    from attnconv.cli import one_line

    def writer(text: str):
        return lambda tmp: tmp.write_text(text)

    try:
        atomic_write_all([(path, writer(text)) for path, text in outputs.values()])
    except OSError as err:
        flag = next((f for f, (path, _) in outputs.items() if err.filename == str(path)), None)
        where = f"{flag} {err.filename}" if flag else ", ".join(f"{f} {p}" for f, (p, _) in outputs.items())
        kept = " (nothing was written)" if len(outputs) > 1 else ""
        raise AttnconvError(f"{where}: {describe_os_error(err)}{kept}") from None
    for path, _ in outputs.values():
        print(f"wrote {one_line(str(path))}", file=sys.stderr)
