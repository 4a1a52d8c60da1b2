"""``iterate_batches``: deterministic, shardable epochs of augmented, normalized batches."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from attnconv.data.augment import crop_flip, draw_crop_flip, normalize
from attnconv.data.imageset import ImageSet
from attnconv.data.info import DatasetInfo
from attnconv.errors import AttnconvError


def num_batches(n: int, batch_size: int, drop_last: bool) -> int:
    """Number of global batches of ``batch_size`` in ``n`` samples."""
    return n // batch_size if drop_last else -(-n // batch_size)


def _derive_seed(*parts: object) -> int:
    """A 63-bit seed that depends only on ``parts`` (stable across runs and platforms)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _shard(m: int, rank: int, world_size: int) -> tuple[int, int]:
    """[lo, hi) of rank's contiguous shard of m items (sizes differ by at most one, like tensor_split)."""
    q, r = divmod(m, world_size)
    lo = rank * q + min(rank, r)
    return lo, lo + q + (rank < r)


@dataclass(frozen=True)
class Batches:
    """Deterministic batches of one epoch; iterate to get ``(x float32 (B, C, H, W), y int64 (B,))``.

    Determinism contract (what makes resume bit-exact):

    - the epoch's sample order is ``randperm`` seeded by (seed, epoch) only (train=True;
      evaluation keeps the stored order);
    - global batch k is ``order[k * batch_size : (k + 1) * batch_size]``;
    - its crop/flip numbers are drawn for the whole global batch from a generator
      seeded by (seed, epoch, k) only.

    So starting at ``start_batch=k`` replays exactly batches k.. of an uninterrupted
    epoch, with any ``world_size``.

    Sharding (DDP): each global batch is cut into ``world_size`` contiguous shards and
    ``rank`` gets shard ``rank`` (augmentation numbers sliced the same way), so
    2 processes x batch_size/2 see exactly the samples, and the augmented pixels, of
    the 1-process global batch. ``batch_size`` is the global batch size. Every rank
    yields the same number of batches; in a short last batch (drop_last=False) a shard
    may be smaller by one, or empty.
    """

    data: ImageSet
    info: DatasetInfo
    batch_size: int
    seed: int
    epoch: int
    train: bool
    augment: bool
    rank: int = 0
    world_size: int = 1
    drop_last: bool = True
    start_batch: int = 0
    device: torch.device = torch.device("cpu")
    pad: int = 4
    flip: bool = True

    @property
    def total(self) -> int:
        """Number of global batches in the epoch (ignoring start_batch)."""
        return num_batches(len(self.data), self.batch_size, self.drop_last)

    def __len__(self) -> int:
        return self.total - self.start_batch

    def order(self) -> torch.Tensor:
        """Sample order of the epoch, int64 (N,) on the CPU."""
        n = len(self.data)
        if not self.train:
            return torch.arange(n)
        g = torch.Generator().manual_seed(_derive_seed("order", self.seed, self.epoch))
        return torch.randperm(n, generator=g)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self.order().to(self.data.images.device)
        n = len(order)
        for k in range(self.start_batch, self.total):
            global_idx = order[k * self.batch_size : min((k + 1) * self.batch_size, n)]  # (m,)
            lo, hi = _shard(len(global_idx), self.rank, self.world_size)
            idx = global_idx[lo:hi]  # (b,)
            x = self.data.images[idx].to(self.device, non_blocking=True)  # uint8 (b, C, H, W)
            y = self.data.labels[idx].to(self.device, non_blocking=True)  # (b,)
            if self.augment:
                g = torch.Generator().manual_seed(_derive_seed("augment", self.seed, self.epoch, k))
                offsets, flips = draw_crop_flip(len(global_idx), g, self.pad, self.flip)
                x = crop_flip(x, offsets[lo:hi], flips[lo:hi], self.pad)  # pads uint8 with black
            yield normalize(x, self.info), y


def iterate_batches(
    data: ImageSet,
    info: DatasetInfo,
    batch_size: int,
    *,
    seed: int,
    epoch: int,
    train: bool,
    augment: bool,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool | None = None,
    start_batch: int = 0,
    device: torch.device | str = "cpu",
    pad: int = 4,
    flip: bool = True,
) -> Batches:
    """Batches of one epoch (see ``Batches`` for the determinism and sharding contract).

    train: shuffle with (seed, epoch); augment: random crop (zero pad ``pad``, black)
    and horizontal flip; drop_last defaults to ``train``. ``batch_size`` is global and
    must be divisible by ``world_size``.
    """
    if drop_last is None:
        drop_last = train
    if batch_size <= 0:
        raise AttnconvError(f"batch_size must be positive, got {batch_size}")
    if world_size <= 0 or not 0 <= rank < world_size:
        raise AttnconvError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if batch_size % world_size:
        raise AttnconvError(f"global batch_size {batch_size} is not divisible by world_size {world_size}")
    if pad < 0:
        raise AttnconvError(f"pad must be >= 0, got {pad}")
    if data.images.shape[1:] != (info.channels, info.size, info.size):
        raise AttnconvError(
            f"images are {tuple(data.images.shape[1:])}, {info.name} expects "
            f"({info.channels}, {info.size}, {info.size})"
        )
    total = num_batches(len(data), batch_size, drop_last)
    if not 0 <= start_batch <= total:
        raise AttnconvError(f"start_batch {start_batch} is outside 0..{total} (batches in this epoch)")
    return Batches(
        data, info, batch_size, seed, epoch, train, augment, rank, world_size, drop_last,
        start_batch, torch.device(device), pad, flip,
    )
