"""The utilization section: the model benchmark's FLOP/s over the matmul benchmark's, both from this run."""

from __future__ import annotations

from attnconv.bench.config import UTILIZATION_TARGET, BenchConfig
from attnconv.bench.matmul import matmul_rate
from attnconv.bench.profiling import describe_profile
from attnconv.bench.results import Report, Section


def bench_utilization(report: Report, cfg: BenchConfig) -> Section:
    """Model FLOP/s over the matmul FLOP/s measured in this run."""
    sec = Section("util", "Utilization: model FLOP/s / matrix-multiply FLOP/s (same run)",
                  ["model", "tokens", "batch", "variant", "FLOPs/step", "GFLOP/s", "matmul GFLOP/s",
                   "utilization", "target"])
    rate = matmul_rate(report, cfg.amp)
    models = report.section("model")
    if rate is None or models is None:
        sec.notes.append("needs the matmul and model benchmarks in the same run (--only matmul,model)")
        return sec
    for r in models.data:
        if "median" not in r or r.get("flops") is None:
            continue
        achieved = r["flops"] / r["median"]
        util = achieved / rate
        target = UTILIZATION_TARGET if (r["model"] == "sa-quadratic" and r["case"] == "cifar"
                                        and r["variant"] != "dense") else None
        status = "" if target is None else f">= {target:.0%} {'met' if util >= target else 'missed'}"
        sec.rows.append([r["model"], f"{r['grid']}x{r['grid']}", str(r["batch"]), r["variant"], f"{r['flops']:.3g}",
                         f"{achieved / 1e9:.1f}", f"{rate / 1e9:.1f}", f"{util:.0%}", status])
        sec.data.append({"model": r["model"], "grid": r["grid"], "variant": r["variant"], "flops": r["flops"],
                         "flops_per_s": achieved, "matmul_flops_per_s": rate, "utilization": util, "target": target})
        if target is not None and util < target and "profile" in r:
            sec.notes.append(f"{r['model']} {r['grid']}x{r['grid']}: {util:.0%} misses {target:.0%}; torch.profiler, "
                             "one step: " + describe_profile(r["variant"], r["profile"]))
    sec.notes.append("FLOPs: attnconv.flops.flop_counter (torch.utils.flop_counter and the CPU attention kernel) over "
                     "forward + backward of one step (matrix products and attention kernels, 2 per multiply-add; "
                     "elementwise ops, softmax and normalization not counted)")
    return sec
