"""Does self-attention learn a convolution? A teacher-student experiment.

Theorem 1 says a multi-head self-attention layer with K^2 heads and the quadratic
encoding of Lemma 2 *can* express any K x K convolution. `learn_conv` asks whether
gradient descent finds that solution from the paper's random initialization:

    teacher  y = nn.Conv2d(C, C, K, padding=K // 2)(x)            fixed random weights, zero padding
    student  SelfAttention2d(C, C, heads, encoding="quadratic", value="shared")
             centers Delta_h ~ N(0, 2^2), a_h = 1 + N(0, 0.01^2)  (the paper's init)

trained with Adam on ||student(x) - teacher(x)||^2. Borders: attention has no notion of
"outside", so the student runs on the input placed inside a zero-padded grid (K // 2
zeros each side) and its output is cropped back, as in the exact construction of
Theorem 1; then an exact solution exists and the error is measured on all pixels.

Inputs: real Fashion-MNIST images (random size x size crops, normalized, lifted to C
channels by a fixed random 1x1 projection with bias), or Gaussian noise images
(`source="random"`). The held-out inputs are crops of the test split (or fresh noise).

Reported: the held-out relative error ||attn(x) - conv(x)|| / ||conv(x)||, where the
centers ended up against the K x K grid of shifts {-(K//2), ..., K//2}^2 (heads matched
one-to-one to grid points by the Hungarian algorithm on Euclidean distance), the mean
matched distance, how many heads are within 0.5 px of their (distinct) grid point, each
head's final alpha = a^2 / 2, and the trajectories of the centers. Also each head's
mass inside the teacher's K x K window and the K^2 x heads matrix M[t, h] of the
attention each head pays to each tap (with its condition number): the layer matches the
conv whenever M has full rank and nothing leaks outside the window, so a low error with
centers off the grid means the heads found a mixed solution rather than Theorem 1's
one-head-per-tap one.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from attnconv import data as D
from attnconv.analysis.grid import match_to_grid
from attnconv.attention import SelfAttention2d
from attnconv.errors import AttnconvError, ParameterError
from attnconv.fileio import SIGNATURE, atomic_write_all, check_output_file, not_a_folder
from attnconv.limits import check_memory, flag_argument, path_argument, whole_number
from attnconv.plots import figure_writer, learn_conv_figure

SOURCES = ("fmnist", "random")
DEFAULTS = dict(kernel=3, heads=9, steps=3000, channels=8, size=12, batch_size=32, lr=0.03, seed=0)
_EVAL_IMAGES = 256

__all__ = ["DEFAULTS", "SOURCES", "learn_conv"]


# ----------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------


class _Images:
    """Batches of (B, C, S, S) inputs: Fashion-MNIST crops lifted to C channels, or Gaussian noise."""

    def __init__(self, source: str, channels: int, size: int, generator: torch.Generator, data_dir=None):
        self.source, self.channels, self.size, self.gen = source, channels, size, generator
        if source == "fmnist":
            info = D.dataset_info("fashion-mnist")
            if size > info.size:
                raise ParameterError("size", size, f"is larger than the {info.size}x{info.size} Fashion-MNIST images")
            train, test = D.load_dataset("fashion-mnist", data_dir, download=False)
            self.train, self.test, self.info = train.images, test.images, info  # uint8, normalized per crop
            # The fixed random 1x1 "lift" from 1 channel to C: x_c = w_c * image + b_c.
            self.weight = torch.randn(channels, 1, 1, 1, generator=generator)
            self.bias = torch.randn(channels, 1, 1, generator=generator) * 0.5

    def _crops(self, images: Tensor, n: int) -> Tensor:
        idx = torch.randint(len(images), (n,), generator=self.gen)
        lim = images.shape[-1] - self.size + 1
        r = torch.randint(lim, (n,), generator=self.gen)
        c = torch.randint(lim, (n,), generator=self.gen)
        crops = torch.stack([images[i, :, a : a + self.size, b : b + self.size] for i, a, b in zip(idx, r, c)])
        crops = D.normalize(crops, self.info)  # (n, 1, S, S)
        return crops * self.weight[:, 0].view(1, -1, 1, 1) + self.bias  # (n, C, S, S)

    def batch(self, n: int, held_out: bool = False) -> Tensor:
        if self.source == "random":
            return torch.randn(n, self.channels, self.size, self.size, generator=self.gen)
        return self._crops(self.test if held_out else self.train, n)


# ----------------------------------------------------------------------------------------
# The experiment
# ----------------------------------------------------------------------------------------


def _relative_error(student: nn.Module, teacher: nn.Module, x: Tensor, pad: int) -> float:
    with torch.no_grad():
        y = teacher(x)
        return float((_student(student, x, pad) - y).norm() / y.norm())


def _student(student: nn.Module, x: Tensor, pad: int) -> Tensor:
    """Attention over the zero-padded grid, cropped back to the input's size (Theorem 1's borders)."""
    y = student(F.pad(x, [pad] * 4))
    return y[..., pad : pad + x.shape[-2], pad : pad + x.shape[-1]] if pad else y


def learn_conv(
    kernel: int = DEFAULTS["kernel"],
    heads: int = DEFAULTS["heads"],
    steps: int = DEFAULTS["steps"],
    channels: int = DEFAULTS["channels"],
    size: int = DEFAULTS["size"],
    *,
    seed: int = DEFAULTS["seed"],
    source: str | None = None,
    batch_size: int = DEFAULTS["batch_size"],
    lr: float = DEFAULTS["lr"],
    record_every: int | None = None,
    out: str | os.PathLike | None = None,
    data_dir: str | os.PathLike | None = None,
    progress: bool = False,
    threads: int | None = 1,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train a quadratic SelfAttention2d to reproduce a fixed random K x K conv (see the module docstring).

    source: "fmnist" (real images), "random" (Gaussian), or None: Fashion-MNIST when it can
    be found (`data_dir`, then the usual places; never downloaded), else random.
    record_every: steps between recorded centers (default: about 100 records).
    out: a folder for learn-conv.json and learn-conv.png (created), or None for no files;
    existing files there that attnconv did not write are refused unless `overwrite`.
    threads: torch intra-op threads for the run (restored afterwards; None: leave as is).
    The layers are tiny (a step is a few milliseconds), so one thread is the default:
    on this 2-core machine, under load, 2 threads took 0.30 s a step against 0.008 s for one.
    Returns the numbers written to learn-conv.json.
    """
    if threads is not None:
        threads = whole_number(threads, "threads", "a number of threads", most=1024)
    seed = whole_number(seed, "seed", "a random seed", least=0, most=2**63 - 1)
    progress, overwrite = flag_argument(progress, "progress"), flag_argument(overwrite, "overwrite")
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _learn_conv(kernel, heads, steps, channels, size, seed, source, batch_size, lr, record_every, out,
                           data_dir, progress, overwrite)
    finally:
        torch.set_num_threads(previous)


def _learn_conv(kernel, heads, steps, channels, size, seed, source, batch_size, lr, record_every, out, data_dir,
                progress, overwrite) -> dict[str, Any]:
    for name, v, lo in (("kernel", kernel, 1), ("heads", heads, 1), ("steps", steps, 0), ("channels", channels, 1),
                        ("size", size, 1), ("batch_size", batch_size, 1)):
        if not isinstance(v, int) or v < lo:
            raise ParameterError(name, v, f"is invalid: give a whole number >= {lo}", shown=repr(v))
    if kernel % 2 == 0:
        raise ParameterError("kernel", kernel, ": give an odd kernel size (an even kernel has no center tap)")
    if not (math.isfinite(lr) and lr > 0):
        raise ParameterError("lr", lr, "is invalid: give a positive number")
    if record_every is not None:
        record_every = whole_number(record_every, "record_every", "steps between records", most=math.inf)
    if source is not None and source not in SOURCES:
        raise ParameterError("source", source, f": choose one of {', '.join(SOURCES)}", shown=repr(source))
    if out is not None:
        out = path_argument(out, "out", "a folder for learn-conv.json and learn-conv.png")
    if data_dir is not None:
        data_dir = path_argument(data_dir, "data_dir", "the folder holding Fashion-MNIST's files")
    why = None if data_dir is None else not_a_folder(data_dir)
    if why:
        raise ParameterError("data_dir", data_dir, f": {why}; give the folder holding Fashion-MNIST's files")
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ParameterError("out", out, "is a file; give a folder for learn-conv.json and learn-conv.png")
    check_memory(_memory_needed(kernel, heads, channels, size, batch_size),
                 f"with {{channels}} {channels}, {{heads}} {heads}, {{batch_size}} {batch_size}",
                 "give a smaller {size}, fewer {channels} or {heads}, or a smaller {batch_size}",
                 name="size", value=size, mentions=("size", "channels", "heads", "batch_size"))

    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the layers' initializations
    teacher = nn.Conv2d(channels, channels, kernel, padding=kernel // 2).requires_grad_(False)
    student = SelfAttention2d(channels, channels, heads=heads, encoding="quadratic", value="shared")
    note = None
    try:
        data = _Images(source or "fmnist", channels, size, gen, data_dir)
    except AttnconvError as err:
        if source == "fmnist" or (isinstance(err, ParameterError) and err.name == "size"):
            raise
        note = f"Fashion-MNIST not found, used Gaussian images ({err})"
        data = _Images("random", channels, size, gen, data_dir)
    source = data.source
    if out is not None:  # before the training, not after it
        for name in ("learn-conv.json", "learn-conv.png"):
            if (Path(out) / name).is_dir():  # the names are fixed: the folder in the way is what to move
                raise ParameterError("out", out, f": {name} in it is a folder, not attnconv's result; move it away, "
                                     "or choose another {out}", mentions=("out",))
            check_output_file(Path(out) / name, "out", (Path(name).suffix,), overwrite=overwrite)
    held_out = data.batch(_EVAL_IMAGES, held_out=True)
    pad = kernel // 2
    opt = torch.optim.Adam(student.parameters(), lr=lr)
    every = record_every or max(1, steps // 100)

    def record(step: int) -> None:
        trajectory.append(student.encoding.centers.detach().double().tolist())
        alphas.append((student.encoding.widths.detach().double() ** 2 / 2).tolist())
        recorded_steps.append(step)
        errors.append(_relative_error(student, teacher, held_out, pad))

    trajectory: list = []
    alphas: list = []
    recorded_steps: list[int] = []
    errors: list[float] = []
    record(0)
    bar = None
    if progress:
        bar = tqdm(total=steps, desc="learn-conv", unit="step", leave=False)
    for step in range(1, steps + 1):
        # Cosine decay to 0: the centers settle instead of jittering at Adam's step size.
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / steps))
        x = data.batch(batch_size)
        loss = F.mse_loss(_student(student, x, pad), teacher(x))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if not math.isfinite(loss.item()):
            raise ParameterError(None, None, f"learn-conv diverged at step {step} (loss {loss.item()}); "
                                 "try a smaller {lr}", mentions=("lr",))
        if step % every == 0 or step == steps:
            record(step)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - start

    final = np.asarray(trajectory[-1])
    result: dict[str, Any] = {
        "config": {"kernel": kernel, "heads": heads, "steps": steps, "channels": channels, "size": size,
                   "seed": seed, "source": source, "batch_size": batch_size, "lr": lr, "schedule": "cosine",
                   "optimizer": "adam", "held_out_images": _EVAL_IMAGES},
        "borders": "student attends over the input zero-padded by kernel//2 and is cropped back (Theorem 1's "
                   "construction), so the error is measured on all pixels",
        "relative_error": errors[-1],
        "initial_relative_error": errors[0],
        "centers": final.tolist(),
        "initial_centers": trajectory[0],
        "alpha": alphas[-1],
        "matching": match_to_grid(final, kernel),
        **_tap_mixing(student, size + 2 * pad, kernel),
        "steps_recorded": recorded_steps,
        "relative_error_curve": errors,
        "trajectory": trajectory,
        "seconds": seconds,
    }
    if note:
        result["note"] = note
    if out is not None:
        out = Path(out)  # made by the writes (and removed again if they fail)
        text = json.dumps({"generator": SIGNATURE, **result}, indent=1) + "\n"
        # the result and its figure as one pair (checked before training): a failure or Ctrl-C leaves the old pair
        atomic_write_all([(out / "learn-conv.json", lambda tmp: tmp.write_text(text)),
                          (out / "learn-conv.png", figure_writer(learn_conv_figure(result), "png"))])
    return result


def _memory_needed(kernel: int, heads: int, channels: int, size: int, batch_size: int) -> int:
    """Bytes learn-conv needs at its peak, about (float32): the held-out forward (256 images)
    and a training step's activations and gradients, each per head on the padded grid
    ((heads, B, T, C) twice on the separable path), the inputs, and the layers with Adam's state."""
    padded = (size + 2 * (kernel // 2)) ** 2  # tokens T of the zero-padded grid
    elements = (heads * channels * padded * (2 * _EVAL_IMAGES + 4 * batch_size)
                + _EVAL_IMAGES * channels * (size**2 + 2 * padded)
                + 4 * channels**2 * (kernel**2 + heads) + 2 * heads * padded)
    return 4 * elements


def _tap_mixing(student: SelfAttention2d, side: int, kernel: int) -> dict[str, Any]:
    """How the heads cover the teacher's K x K window, seen from the middle query.

    M[t, h] = P_h(tap t): the attention head h pays to tap t. Inside the window the layer
    computes sum_t (sum_h M[t, h] W_h) x[q + t], so it can match any K x K conv whenever M
    has full rank K^2 and little mass leaks outside the window, with or without centers on
    the grid (Theorem 1's one-hot M is one such solution).

    Only the middle query's probabilities are computed: for the separable (isotropic)
    encoding, the outer product of its row and column softmaxes, (heads, side, side),
    not the (heads, T, T) matrix of every query.
    """
    mid = side // 2
    with torch.no_grad():
        if student.encoding.separable:
            row, col = student.encoding.factors(side, side)  # (heads, side, side) each, [h, query, key]
            p = row[:, mid].double().softmax(-1)[:, :, None] * col[:, mid].double().softmax(-1)[:, None, :]
        else:
            probs = student.attention_probs(size=(side, side))[0].double()  # (heads, T, T)
            p = probs[:, mid * side + mid].reshape(-1, side, side)  # (heads, side, side) over keys
    lo = side // 2 - kernel // 2
    window = p[:, lo : lo + kernel, lo : lo + kernel].reshape(p.shape[0], -1)  # (heads, K^2)
    sv = torch.linalg.svdvals(window.T)  # singular values of M (K^2, heads)
    rank_full = min(window.shape) == kernel**2
    return {
        "window_mass": window.sum(-1).tolist(),
        "tap_mixing": window.T.tolist(),
        "tap_mixing_condition": float(sv[0] / sv[-1]) if rank_full and sv[-1] > 0 else None,
    }
