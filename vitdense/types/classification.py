"""Classification's batches, outputs and predictions."""

from __future__ import annotations

from typing import NamedTuple

import torch

from vitdense.types.common import ImageSizes, Size


class LabeledImages(NamedTuple):
    """An image with its class, or a padded batch of them.

    Attributes:
        image: [3, H, W] normalised image, or [B, 3, H, W] once collated.
        label: class index (int), or [B] int64 once collated.
        index: position of the sample in its dataset (-1 if unknown); [B] int64 in a batch.
        image_sizes: (H, W) of a single image; the batch's `ImageSizes` once collated.
    """

    image: torch.Tensor
    label: torch.Tensor | int
    index: torch.Tensor | int = -1
    image_sizes: ImageSizes | Size | None = None

    @classmethod
    def unlabeled(cls, image: torch.Tensor, size: Size, index: int, ignore_index: int = 255) -> LabeledImages:
        """An image to predict on: [3, H, W] preprocessed, `size` its (H0, W0) as given (label -1)."""
        return cls(image, -1, index)


class ClassificationOutput(NamedTuple):
    """logits [B, K]; soft_targets [B, K] when Mixup/CutMix mixed the batch, else None."""

    logits: torch.Tensor
    soft_targets: torch.Tensor | None = None


class ClassPrediction(NamedTuple):
    """Top-k classes of each image: index [B] (in its dataset), probs and classes [B, k]."""

    index: torch.Tensor
    probs: torch.Tensor
    classes: torch.Tensor
