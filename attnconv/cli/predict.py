"""`attnconv predict`: classify image files with a trained run, without its training data.

    attnconv predict runs/sa shirt.png boot.jpg         class and probability per image
    attnconv predict runs/sa photos/ --top 3 --json     every image in a folder, the 3 best classes

Each image is decoded as the run's data was (resized and center-cropped to its image size,
RGB or grey as its channels) and normalized with the mean and std the run recorded
(config.json "data"), so a run directory is all it needs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("predict", help="classify image files with a trained run", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `attnconv train` or `convert`")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files, or folders of them (not recursive)")
    p.add_argument("--top", type=int, default=1, metavar="K", help="the K most probable classes (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.set_defaults(func=run)


def image_files(args: list[str]) -> list[tuple[Path, bool]]:
    """The files named, and the image files of the folders named, sorted, each with whether it was found in a
    folder; one clear error for a missing path."""
    from attnconv.data.decode import IMAGE_EXTENSIONS
    from attnconv.errors import AttnconvError
    from attnconv.fileio import dangling_link, file_kind

    files: list[tuple[Path, bool]] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            named = [p for p in path.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")]
            dangling = next((p for p in sorted(named) if dangling_link(p)), None)
            if dangling is not None:  # an image the folder names but does not hold: not skipped in silence
                raise AttnconvError(f"{_dangling(dangling)}; fix or remove the link, or name the images one by one")
            found = sorted(p for p in named if p.is_file())
            if not found and (path / "config.json").is_file():  # `predict IMAGE RUN`: the run was given second
                raise AttnconvError(f"{path} is a run folder, given where the images go: attnconv predict takes one "
                                    "run, then image files or folders (attnconv predict RUN IMAGE [IMAGE ...])")
            if not found:
                raise AttnconvError(f"{path}: no image files in it ({', '.join(IMAGE_EXTENSIONS)})")
            files += [(p, True) for p in found]
        elif path.is_file():
            files.append((path, False))
        elif path.exists():  # a named pipe would block the command, a device never end
            raise AttnconvError(f"{path} is {file_kind(path.stat().st_mode)}, not an image file; give an image file")
        elif path.is_symlink():
            raise AttnconvError(f"{_dangling(path)}; give an image file")
        else:
            raise AttnconvError(f"{path}: no such file or folder")
    return files


def _chunks(files: list[tuple[Path, bool]], most: int):
    """The files in order, in runs of at most `most` that are all from folders or all named alone."""
    chunk: list[Path] = []
    for i, (path, folder) in enumerate(files):
        chunk.append(path)
        if len(chunk) == most or i + 1 == len(files) or files[i + 1][1] != folder:
            yield chunk, folder
            chunk = []


def _dangling(path: Path) -> str:
    """A link that leads nowhere, in words: to a missing file, or around a loop of links."""
    from attnconv.fileio import dangling_link

    return f"{path}: {dangling_link(path)}"


def run(args: argparse.Namespace) -> int:
    from attnconv.cli import one_line
    from attnconv.runs import Run

    files = image_files(args.images)
    run = Run(args.run_dir, args.device)
    results = []
    for chunk, folder in _chunks(files, 64):  # a batch at a time: a folder of thousands fits in memory
        for path, best in zip(chunk, run.predict(chunk, top=args.top, folder=folder)):
            results.append({"image": str(path), "top": [{"class": c, "probability": p} for c, p in best]})
    if args.json:
        print(json.dumps({"run": str(run.path), "predictions": results}, indent=1))
        return 0
    for r in results:  # class names from config.json, file names: escaped, as error lines are
        print(one_line(f"{r['image']}: " + ", ".join(f"{t['class']} {t['probability']:.3g}" for t in r["top"])))
    return 0
