"""The data benchmark: attnconv.data's input pipeline (batching, crop + flip, normalization) vs the model."""

from __future__ import annotations

import torch

from attnconv.bench.config import DATA_TARGET, BenchConfig
from attnconv.bench.results import Report, Section, fmt_timing
from attnconv.bench.timing import attempt, progress, target_status, time_variants


def bench_data(report: Report, cfg: BenchConfig) -> Section:
    """attnconv.data's batches (crop + flip + normalize) over an in-memory synthetic CIFAR-shape set."""
    sec = Section("data", "Data pipeline (batching, random crop + flip, normalization) vs the model",
                  ["pipeline", "images", "batch", "median epoch", "min - max", "images/s",
                   "model images/s", "data/model", "target"])
    try:
        from attnconv import data as D

        info = D.dataset_info("cifar10")
        loader = D.iterate_batches
    except (ImportError, AttributeError) as err:
        sec.notes.append(f"attnconv.data is not usable here ({err}); skipped")
        return sec
    gen = torch.Generator().manual_seed(0)
    n = cfg.data_images
    images = torch.randint(0, 256, (n, info.channels, info.size, info.size), dtype=torch.uint8, generator=gen)
    imageset = D.ImageSet(images, torch.randint(0, info.num_classes, (n,), generator=gen))
    if cfg.device == "cuda":
        imageset = imageset.to("cuda")
    epoch = iter(range(10**9))

    def one_epoch() -> int:
        seen = 0
        for xb, _ in loader(imageset, info, cfg.data_batch, seed=0, epoch=next(epoch), train=True, augment=True,
                            device=cfg.device):
            seen += len(xb)
        return seen

    progress("data pipeline")
    counts: list[int] = []
    error = attempt(lambda: counts.append(one_epoch()))  # the warm-up epoch
    if error:
        sec.data.append({"failed": error})
        sec.notes.append(f"iterate_batches failed: {error}")
        return sec
    images_per_epoch = counts[0]
    t = time_variants({"data": one_epoch}, warmup=max(cfg.warmup - 1, 0), repeats=cfg.repeats,
                      device=cfg.device)["data"]
    rate = images_per_epoch / t.median
    model_rate = _model_images_per_s(report)
    ratio = rate / model_rate if model_rate else None
    sec.rows.append([f"iterate_batches (augment, {cfg.device})", str(images_per_epoch), str(cfg.data_batch),
                     *fmt_timing(t), f"{rate:.0f}", f"{model_rate:.1f}" if model_rate else "-",
                     f"{ratio:.1f}x" if ratio else "-", target_status(ratio, DATA_TARGET)])
    sec.data.append({"images": images_per_epoch, "seconds": t.samples, "images_per_s": rate,
                     "model_images_per_s": model_rate, "ratio": ratio, "target": DATA_TARGET})
    sec.notes.append("synthetic uint8 images of CIFAR-10's shape held in memory (no files); model images/s: "
                     "the fastest sa-quadratic CIFAR-shape training step of this run" if model_rate else
                     "model images/s: run the model benchmark in the same run to get the ratio")
    return sec


def _model_images_per_s(report: Report) -> float | None:
    sec = report.section("model")
    if sec is None:
        return None
    rates = [r["images_per_s"] for r in sec.data if r["model"] == "sa-quadratic" and r["case"] == "cifar"
             and "images_per_s" in r and r["variant"] != "dense"]
    return max(rates, default=None)
