"""Semantic segmentation's batches, outputs and predictions (Segmenter)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from vitdense.types.common import ImageSizes, Size


class SegmentedImages(NamedTuple):
    """An image with its label map, or a padded batch of them.

    In training the label map matches the (augmented) image pixel for pixel. In evaluation
    the image is resized (e.g. short side 512) but the label map keeps the original
    resolution, because metrics are computed at the size the annotation was made.

    Attributes:
        image: [3, H, W] normalised image; [B, 3, H, W] zero-padded right/bottom in a batch.
        mask: [h, w] int64 class indices with the ignore index (255) where unlabelled;
            [B, h, w] padded with the ignore index in a batch.
        index: position of the sample in its dataset.
        image_sizes: (H, W) of a single image; the batch's `ImageSizes` once collated.
        mask_sizes: (h, w) of a single label map; the label maps' `ImageSizes` in a batch.
    """

    image: torch.Tensor
    mask: torch.Tensor
    index: torch.Tensor | int = -1
    image_sizes: ImageSizes | Size | None = None
    mask_sizes: ImageSizes | Size | None = None

    @classmethod
    def of(cls, image: torch.Tensor, mask: torch.Tensor, index: int) -> SegmentedImages:
        """One sample, its sizes read off the tensors: image [3, H, W], mask [h, w] int64."""
        return cls(image, mask, index, image_sizes=tuple(image.shape[-2:]), mask_sizes=tuple(mask.shape[-2:]))

    @classmethod
    def unlabeled(cls, image: torch.Tensor, size: Size, index: int, ignore_index: int = 255) -> SegmentedImages:
        """An image to predict on: [3, H, W] preprocessed; its label map all `ignore_index` at
        `size`, the image's (H0, W0) as given: the size predictions are made at."""
        return cls.of(image, torch.full(tuple(size), ignore_index, dtype=torch.int64), index)


class SegmentationOutput(NamedTuple):
    """Pixel logits and their labels, as pairs: one pair [B, K, H, W] / [B, H, W] for a
    training batch, one pair [1, K, h, w] / [1, h, w] per image in evaluation (sizes differ)."""

    logits: list[torch.Tensor]
    targets: list[torch.Tensor]


class SegmentationPrediction(NamedTuple):
    """Label maps at each image's original size: index [B], labels: B tensors [h, w] int64."""

    index: torch.Tensor
    labels: list[torch.Tensor]
