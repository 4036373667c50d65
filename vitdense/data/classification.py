"""Image classification: the family's DataModule base and its predict sample.

Datasets yield `LabeledImages(image [3, H, W], label, index)`; the datasets themselves are
particular to where the images are (`imagefolder.py`, `cifar.py`, `synthetic.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import albumentations as A
import numpy as np

from vitdense.core.errors import DataError
from vitdense.core.preprocess import Preprocess
from vitdense.data.base import ImageDataModule
from vitdense.data.transforms.classification import classification_eval_transforms, classification_train_transforms
from vitdense.types import LabeledImages


class ClassificationDataModule(ImageDataModule):
    """An `ImageDataModule` with timm's ImageNet pipelines (`classification_train_transforms`,
    `classification_eval_transforms`) at `img_size`; predicting on a folder of images
    preprocesses them as evaluation does (centre crop `crop_pct`)."""

    #: evaluation centre-crop fraction (images are resized to img_size / crop_pct); 1: whole image
    crop_pct: float = 1.0

    def train_transforms(self, scale: tuple[float, float], color_jitter: float) -> A.Compose:
        return self.seeded(
            classification_train_transforms(self.img_size, self.mean, self.std, scale, color_jitter=color_jitter)
        )

    def eval_transforms(self) -> A.Compose:
        return classification_eval_transforms(self.img_size, self.mean, self.std, crop_pct=self.crop_pct)

    def preprocess(self) -> Preprocess:
        return Preprocess(
            "center_crop", self.img_size, self.mean, self.std, crop_pct=self.crop_pct, interpolation="bicubic"
        )


def labeled_sample(transform: Callable[..., dict[str, Any]], image: np.ndarray, index: int) -> LabeledImages:
    """An unlabelled image (label -1) for a classification task's `predict_step`."""
    return LabeledImages(transform(image=image)["image"], -1, index)


def check_val_fraction(val_fraction: float) -> None:
    """A DataModule's `val_fraction`: 0 (validate on the dataset's own split) or a held-out
    fraction of the training set below 1."""
    if not 0 <= val_fraction < 1:
        raise DataError(f"val_fraction={val_fraction}: the held-out fraction of the training set is in [0, 1)")


def held_out_split(num_samples: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, held-out indices), each sorted: a seeded random `fraction` of
    `num_samples` (at least one) held out, e.g. for choosing hyperparameters on part of the
    training set rather than on the split that is reported."""
    if not 0 < fraction < 1:
        raise DataError(f"val_fraction={fraction}: the held-out fraction of the training set is in (0, 1)")
    order = np.random.default_rng(seed).permutation(num_samples)
    num_val = max(1, round(fraction * num_samples))
    return np.sort(order[num_val:]), np.sort(order[:num_val])
