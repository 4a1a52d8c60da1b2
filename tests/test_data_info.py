"""attnconv.data: DatasetInfo, the built-in table, ImageSet, channel statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnconv import data
from attnconv.errors import AttnconvError

FASHION = data.dataset_info("fashion-mnist")
CIFAR = data.dataset_info("cifar10")


def test_dataset_info_fields_and_aliases():
    assert (FASHION.channels, FASHION.size, FASHION.num_classes, len(FASHION.classes)) == (1, 28, 10, 10)
    assert (CIFAR.channels, CIFAR.size, CIFAR.num_classes, len(CIFAR.classes)) == (3, 32, 10, 10)
    assert len(CIFAR.mean) == len(CIFAR.std) == 3 and len(FASHION.mean) == len(FASHION.std) == 1
    assert data.dataset_info("Fashion_MNIST") is FASHION and data.dataset_info("CIFAR-10") is CIFAR
    assert set(data.DATASETS) == {"cifar10", "fashion-mnist"}


def test_unknown_dataset_name_lists_valid_names(tmp_path):
    for call in (lambda: data.dataset_info("mnist"), lambda: data.load_dataset("mnist", tmp_path)):
        with pytest.raises(AttnconvError, match="unknown dataset 'mnist'.*cifar10, fashion-mnist"):
            call()


def test_imageset_rejects_wrong_dtypes_and_lengths():
    with pytest.raises(AttnconvError, match="uint8"):
        data.ImageSet(torch.zeros(2, 1, 4, 4), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(AttnconvError, match="2 images but 3 labels"):
        data.ImageSet(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.zeros(3, dtype=torch.int64))
    assert len(data.ImageSet(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64))) == 2


def test_channel_stats_is_population_mean_and_std():
    images = torch.randint(0, 256, (6, 3, 5, 4), dtype=torch.uint8)
    mean, std = data.channel_stats(images)
    x = images.double().numpy() / 255
    assert np.allclose(mean, x.mean(axis=(0, 2, 3)), atol=1e-12)
    assert np.allclose(std, x.std(axis=(0, 2, 3)), atol=1e-12)

