"""Datasets, transforms and DataModules."""

from vitdense.data.cifar import CIFAR10_CLASSES, CIFAR100_CLASSES, CIFARDataModule, CIFARImages
from vitdense.data.imagefolder import ImageFolderDataModule, ImageFolderDataset, find_classes
from vitdense.data.synthetic import SyntheticClassificationDataModule, SyntheticShapes
from vitdense.data.transforms import (
    classification_eval_transforms,
    classification_train_transforms,
    decode_image,
    normalization,
    seed_worker_transforms,
)
from vitdense.data.types import LabeledImages

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR100_CLASSES",
    "CIFARDataModule",
    "CIFARImages",
    "ImageFolderDataModule",
    "ImageFolderDataset",
    "LabeledImages",
    "SyntheticClassificationDataModule",
    "SyntheticShapes",
    "classification_eval_transforms",
    "classification_train_transforms",
    "decode_image",
    "find_classes",
    "normalization",
    "seed_worker_transforms",
]
