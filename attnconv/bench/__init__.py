"""Benchmarks: the fast attention paths against the dense baseline, measured in one run.

Every comparison is made in one process, on the same inputs, after warm-up, with
the median of repeated runs; the variants' repeats are interleaved (A B B A ...)
so that a drifting machine load hits them alike, and the reported ratio is
dense median / variant median. Before timing, every variant's output is compared
with a float64 dense reference (relative error: max |a - b| / max |b|), which is
the evidence that the fast paths compute the same function to float32 rounding.

Sections (`run_benchmarks(config)` runs those in `config.only`, in this order; util
whenever matmul and model both run), one module each:

- matmul.py:      square matrix product, GFLOP/s, the machine's reference rate.
- layer.py:       SelfAttention2d alone (quadratic, learned, learned + content), forward +
                  backward, dense vs the fast path ("auto": separable or SDPA; on CUDA also
                  FlexAttention for the content layer, flex.py; with --compile also compiled).
- model.py:       one training step (forward, cross-entropy, backward, SGD) of the paper's
                  CIFAR-shape classifiers, and of the full-resolution (32x32-token) variant.
- utilization.py: model FLOPs (attnconv.flops, forward + backward) per second, divided by
                  the matmul rate.
- pipeline.py:    the tensor-side input pipeline (attnconv.data.iterate_batches with crop +
                  flip) in images/s, against the model's training images/s.
- memory.py:      peak memory of one training step at 32x32 and 64x64 tokens, each case in
                  a fresh subprocess (CPU: peak resident set, VmHWM; CUDA: max_memory_allocated).

Sections run only when named (`--only presets,conv,fullsize,compile`), fp32 and bf16 autocast each:

- presets.py:     the Fashion-MNIST CPU presets' training steps, fmnist-sa-quadratic against
                  fmnist-resnet-small (images/s ratio, same precision), with counted FLOPs.
- conv.py:        the quadratic layer against nn.Conv2d 3x3 and a Swin-style relative-bias attention
                  (SDPA), forward + backward, counted FLOPs and GFLOP/s.
- fullsize.py:    the paper's full-size sa-quadratic training step against the matmul rate of the
                  same precision, measured in the same process (utilization).
- compiled.py:    torch.compile against eager for every named model at the Fashion-MNIST sizes:
                  compile cost, steady-state speed, whether it pays within an epoch.

The harness: config.py (BenchConfig, sizes, targets), timing.py (interleaved repeats,
medians, ratios), cases.py (one dense-vs-fast comparison), peakmem.py (/proc peak
memory), estimates.py, profiling.py, results.py (Section, Report, their text), suite.py.

Cases that would not fit in memory are not run: their memory is estimated first
(`estimate_layer_bytes`, `estimate_step_bytes`) and compared with a budget; they
are reported as skipped, with the estimate. Where dense does not fit at the
requested batch, the comparison is also run at the largest halved batch where it
fits, and says so. Nothing is reported that was not measured in the run.
"""

from attnconv.bench.config import CPU_SECTIONS, DEFAULT_SECTIONS, PRECISIONS, SECTIONS, BenchConfig, quick_config, tiny_config
from attnconv.bench.results import format_report, format_section, report_json
from attnconv.bench.suite import run_benchmarks

__all__ = [
    "BenchConfig",
    "CPU_SECTIONS",
    "DEFAULT_SECTIONS",
    "PRECISIONS",
    "SECTIONS",
    "format_report",
    "format_section",
    "quick_config",
    "report_json",
    "run_benchmarks",
    "tiny_config",
]
