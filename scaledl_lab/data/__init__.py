"""Datasets for the lab: Fashion-MNIST, MNIST-1D, CIFAR-10 and the licenses text corpus in memory,
plus worker sharding."""

from . import licenses
from .base import (
    ChecksumError,
    Dataset,
    DatasetNotFoundError,
    DataSplits,
    sha256_file,
    verify_sha256,
)
from .cifar10 import write_cifar10_fixture
from .registry import (
    DATASETS,
    dataset_info,
    fetch,
    load_dataset,
    locate,
    num_classes,
    sample_shape,
    search_dirs,
    standard_sizes,
)
from .sharding import SHARDINGS, epoch_batches, shard_indices, steps_per_epoch

__all__ = [
    "DATASETS",
    "SHARDINGS",
    "ChecksumError",
    "DataSplits",
    "Dataset",
    "DatasetNotFoundError",
    "dataset_info",
    "epoch_batches",
    "fetch",
    "licenses",
    "load_dataset",
    "locate",
    "num_classes",
    "sample_shape",
    "search_dirs",
    "sha256_file",
    "shard_indices",
    "standard_sizes",
    "steps_per_epoch",
    "verify_sha256",
    "write_cifar10_fixture",
]
