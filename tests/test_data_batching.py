"""attnconv.data.iterate_batches: order, determinism, resume, sharding, padding."""

from __future__ import annotations

import pytest
import torch

from attnconv import data
from attnconv.errors import AttnconvError

FASHION = data.dataset_info("fashion-mnist")
CIFAR = data.dataset_info("cifar10")


def id_set(n: int, info: data.DatasetInfo = FASHION) -> data.ImageSet:
    """Images with random pixels in 1..255 (so padding, 0, is recognizable); labels = sample ids."""
    images = torch.randint(1, 256, (n, info.channels, info.size, info.size), dtype=torch.uint8)
    return data.ImageSet(images, torch.arange(n))


def collect(batches) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    xs, ys = zip(*batches) if len(batches) else ((), ())
    return list(xs), list(ys)


def test_num_batches():
    assert data.num_batches(10, 3, drop_last=True) == 3 and data.num_batches(10, 3, drop_last=False) == 4
    assert data.num_batches(9, 3, drop_last=False) == 3 and data.num_batches(2, 3, drop_last=True) == 0


def test_train_epoch_visits_each_sample_at_most_once_and_shuffles():
    s = id_set(50)
    batches = data.iterate_batches(s, FASHION, 8, seed=0, epoch=0, train=True, augment=True)
    xs, ys = collect(batches)
    assert len(batches) == len(ys) == 6  # drop_last defaults to train
    seen = torch.cat(ys)
    assert len(seen) == 48 and len(set(seen.tolist())) == 48 and not torch.equal(seen, torch.arange(48))
    assert all(x.shape == (8, 1, 28, 28) and x.dtype == torch.float32 for x in xs)


def test_eval_batches_are_the_normalized_images_in_order():
    s = id_set(21)
    xs, ys = collect(data.iterate_batches(s, FASHION, 8, seed=0, epoch=0, train=False, augment=False))
    assert [len(y) for y in ys] == [8, 8, 5]
    assert torch.equal(torch.cat(ys), torch.arange(21))
    assert torch.equal(torch.cat(xs), data.normalize(s.images, FASHION))


def test_batches_are_a_function_of_seed_epoch_and_index_only():
    s = id_set(40)

    def run(seed, epoch):
        return collect(data.iterate_batches(s, FASHION, 8, seed=seed, epoch=epoch, train=True, augment=True))

    a = run(1, 2)
    torch.manual_seed(99)
    b = run(1, 2)
    assert all(torch.equal(u, v) for u, v in zip(a[0] + a[1], b[0] + b[1]))
    assert not torch.equal(torch.cat(run(1, 3)[1]), torch.cat(a[1]))
    assert not torch.equal(torch.cat(run(2, 2)[1]), torch.cat(a[1]))


@pytest.mark.parametrize("k", [1, 3, 5])
def test_resume_from_start_batch_replays_the_same_batches(k):
    s = id_set(45)
    kwargs = dict(seed=7, epoch=4, train=True, augment=True)
    full_x, full_y = collect(data.iterate_batches(s, FASHION, 8, **kwargs))
    resumed = data.iterate_batches(s, FASHION, 8, start_batch=k, **kwargs)
    res_x, res_y = collect(resumed)
    assert len(resumed) == len(full_x) - k == len(res_x)
    for u, v in zip(full_x[k:] + full_y[k:], res_x + res_y):
        assert torch.equal(u, v)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("drop_last", [True, False])
def test_shards_union_equals_global_batch(world_size, drop_last):
    s = id_set(43, CIFAR)
    kwargs = dict(seed=0, epoch=1, train=True, augment=True, drop_last=drop_last)
    glob_x, glob_y = collect(data.iterate_batches(s, CIFAR, 16, **kwargs))
    shards = [
        collect(data.iterate_batches(s, CIFAR, 16, rank=r, world_size=world_size, **kwargs))
        for r in range(world_size)
    ]
    assert all(len(sh[0]) == len(glob_x) for sh in shards)  # every rank runs the same number of steps
    for k in range(len(glob_x)):
        assert torch.equal(torch.cat([sh[0][k] for sh in shards]), glob_x[k])  # same samples, same augmentation
        assert torch.equal(torch.cat([sh[1][k] for sh in shards]), glob_y[k])
    if drop_last:
        assert all(len(sh[1][0]) == 16 // world_size for sh in shards)


def test_augmented_batches_pad_with_black():
    s = id_set(64)  # pixels 1..255, so only padding is 0 before normalization
    black = (0 - FASHION.mean[0]) / FASHION.std[0]
    darkest = (1 / 255 - FASHION.mean[0]) / FASHION.std[0]
    x = torch.cat(collect(data.iterate_batches(s, FASHION, 32, seed=0, epoch=0, train=True, augment=True))[0])
    is_black = torch.isclose(x, torch.tensor(black, dtype=torch.float32))
    assert is_black.any() and ((x >= darkest - 1e-5) | is_black).all()


def test_iterate_batches_rejects_bad_arguments():
    s = id_set(10)
    kw = dict(seed=0, epoch=0, train=True, augment=False)
    with pytest.raises(AttnconvError, match="not divisible by world_size"):
        data.iterate_batches(s, FASHION, 5, world_size=2, **kw)
    with pytest.raises(AttnconvError, match="rank"):
        data.iterate_batches(s, FASHION, 4, rank=2, world_size=2, **kw)
    with pytest.raises(AttnconvError, match="start_batch 3 is outside 0..2"):
        data.iterate_batches(s, FASHION, 4, start_batch=3, **kw)
    with pytest.raises(AttnconvError, match="expects \\(3, 32, 32\\)"):
        data.iterate_batches(s, CIFAR, 4, **kw)


def test_each_batch_gets_its_own_augmentation():
    # Identical images: any difference between batches comes from the per-batch crop/flip draws.
    image = torch.randint(1, 256, (1, 1, 28, 28), dtype=torch.uint8)
    s = data.ImageSet(image.expand(32, -1, -1, -1).clone(), torch.zeros(32, dtype=torch.int64))
    xs, _ = collect(data.iterate_batches(s, FASHION, 16, seed=0, epoch=0, train=True, augment=True))
    assert not torch.equal(xs[0], xs[1])
    assert len({tuple(x.flatten().tolist()) for x in xs[0]}) > 8  # and differing crops within a batch
