"""Datasets and the tensor-side input pipeline.

    from attnconv import data as D
    train, test = D.load_dataset("fashion-mnist")       # two ImageSet: uint8 (N, C, H, W), int64 (N,)
    info = D.dataset_info("fashion-mnist")               # channels, size, classes, mean/std
    train, test = D.load_dataset("folder:~/pets", image_size=64)   # any folder of images
    for x, y in D.iterate_batches(train, info, 128, seed=0, epoch=0, train=True, augment=True): ...

One concept per module:

    info.py           DatasetInfo, the built-in table (CIFAR-10, Fashion-MNIST)
    imageset.py       ImageSet (uint8 images + int64 labels), channel_stats
    sources.py        where files are searched, the cache dir, checksum-verified downloads
    idx.py            the IDX format (Fashion-MNIST)
    fashion.py        Fashion-MNIST: find, check, read
    cifar.py          CIFAR-10: find / extract, restricted unpickler, read
    augment.py        batched crop + flip, normalize
    batching.py       iterate_batches: deterministic, shardable epochs
    decode.py         one image file -> uint8 (C, S, S) with Pillow (resize shorter side, center crop)
    folder_layout.py  folder:PATH datasets: PATH/train/<class>/..., PATH/test|val/<class>/...; cache key
    folder_cache.py   the decoded images of a folder, cached atomically, memory-mapped
    folder.py         folder:PATH datasets: decode once (stats on the way), then map the cache
    registry.py       dataset_info / load_dataset / canonical_name by name

Integrity checks: downloads are verified against the official MD5 before they are
renamed into place; every file is validated structurally (IDX magic, dims, exact
payload length; gzip CRC; pickle content types, shapes, label range); a file that
claims to be a full official split must match the official data bit for bit.
"""

from attnconv.data.augment import crop_flip, draw_crop_flip, normalize, random_crop_flip
from attnconv.data.batching import Batches, iterate_batches, num_batches
from attnconv.data.folder import (
    DEFAULT_IMAGE_SIZE,
    FOLDER_PREFIX,
    available_memory,
    check_image_size,
    decode_budget,
    folder_path,
)
from attnconv.data.imageset import ImageSet, channel_stats
from attnconv.data.info import DATASETS, DatasetInfo
from attnconv.data.registry import canonical_name, dataset_info, load_dataset
from attnconv.data.sources import (
    CIFAR_URL,
    FASHION_URL,
    cache_dir,
    download,
    search_dirs,
)

__all__ = [
    "CIFAR_URL",
    "DATASETS",
    "DEFAULT_IMAGE_SIZE",
    "FASHION_URL",
    "FOLDER_PREFIX",
    "Batches",
    "DatasetInfo",
    "ImageSet",
    "available_memory",
    "cache_dir",
    "canonical_name",
    "channel_stats",
    "check_image_size",
    "crop_flip",
    "dataset_info",
    "decode_budget",
    "download",
    "draw_crop_flip",
    "folder_path",
    "iterate_batches",
    "load_dataset",
    "normalize",
    "num_batches",
    "random_crop_flip",
    "search_dirs",
]
