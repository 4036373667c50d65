"""Typed samples and batches (the default collate keeps NamedTuples as they are)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class LabeledImages(NamedTuple):
    """An image with its class, or a batch of them.

    Attributes:
        image: [3, H, W] normalised image, or [B, 3, H, W] once collated.
        label: class index (int), or [B] int64 once collated.
        index: position of the sample in its dataset (-1 if unknown); lets a linear probe
            cache features per sample.
    """

    image: torch.Tensor
    label: torch.Tensor | int
    index: torch.Tensor | int = -1


class SegmentedImages(NamedTuple):
    """An image with its label map, or a padded batch of them (see `pad_collate`).

    In training the label map matches the (augmented) image pixel for pixel. In evaluation
    the image is resized (e.g. short side 512) but the label map keeps the original
    resolution, because metrics are computed at the size the annotation was made.

    Attributes:
        image: [3, H, W] normalised image; [B, 3, H, W] zero-padded right/bottom in a batch.
        mask: [h, w] int64 class indices with the ignore index (255) where unlabelled;
            [B, h, w] padded with the ignore index in a batch.
        index: position of the sample in its dataset.
        pad_mask: [B, H, W] bool, True on image padding (None for a single sample).
        image_size: (H, W) of the image before padding; [B, 2] in a batch.
        mask_size: (h, w) of the label map before padding; [B, 2] in a batch.
    """

    image: torch.Tensor
    mask: torch.Tensor
    index: torch.Tensor | int = -1
    pad_mask: torch.Tensor | None = None
    image_size: torch.Tensor | tuple[int, int] | None = None
    mask_size: torch.Tensor | tuple[int, int] | None = None

    @classmethod
    def of(cls, image: torch.Tensor, mask: torch.Tensor, index: int) -> SegmentedImages:
        """One sample, its sizes read off the tensors: image [3, H, W], mask [h, w] int64."""
        return cls(image, mask, index, image_size=tuple(image.shape[-2:]), mask_size=tuple(mask.shape[-2:]))
