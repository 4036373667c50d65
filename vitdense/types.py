"""The contract types every part of vitdense passes around: batches, task outputs,
predictions and losses. NamedTuples (Lightning moves their tensors between devices as
they are), importable without importing any dataset family, transform library or task.

Batches come from one padding collate (`vitdense.data.collate.pad_collate`): images are
zero-padded right and bottom to the batch's largest size; `pad_mask` marks the padding
and `image_sizes` holds each image's (H, W) as Python ints, so the backbone gets its
token grids without reading a device tensor back to the host.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

Size = tuple[int, int]


class LabeledImages(NamedTuple):
    """An image with its class, or a padded batch of them.

    Attributes:
        image: [3, H, W] normalised image, or [B, 3, H, W] once collated.
        label: class index (int), or [B] int64 once collated.
        index: position of the sample in its dataset (-1 if unknown); [B] int64 in a batch.
        pad_mask: [B, H, W] bool, True on padding (None for a single sample).
        image_sizes: (H, W) of the image before padding; one pair per image in a batch.
    """

    image: torch.Tensor
    label: torch.Tensor | int
    index: torch.Tensor | int = -1
    pad_mask: torch.Tensor | None = None
    image_sizes: tuple[Size, ...] | Size | None = None


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
        pad_mask: [B, H, W] bool, True on image padding (None for a single sample).
        image_sizes: (H, W) of the image before padding; one pair per image in a batch.
        mask_sizes: (h, w) of the label map before padding; one pair per image in a batch.
    """

    image: torch.Tensor
    mask: torch.Tensor
    index: torch.Tensor | int = -1
    pad_mask: torch.Tensor | None = None
    image_sizes: tuple[Size, ...] | Size | None = None
    mask_sizes: tuple[Size, ...] | Size | None = None

    @classmethod
    def of(cls, image: torch.Tensor, mask: torch.Tensor, index: int) -> SegmentedImages:
        """One sample, its sizes read off the tensors: image [3, H, W], mask [h, w] int64."""
        return cls(image, mask, index, image_sizes=tuple(image.shape[-2:]), mask_sizes=tuple(mask.shape[-2:]))


class Losses(NamedTuple):
    """What `BaseTask.compute_loss` returns: the total that is optimised and its named
    terms (already weighted, e.g. `loss_ce`, `loss_bbox`, `loss_giou`, `loss_ce_0`), each a
    scalar tensor. The base logs the total as `{stage}/loss` and each term as `{stage}/{name}`."""

    total: torch.Tensor
    terms: dict[str, torch.Tensor] = {}


class ClassificationOutput(NamedTuple):
    """logits [B, K]; soft_targets [B, K] when Mixup/CutMix mixed the batch, else None."""

    logits: torch.Tensor
    soft_targets: torch.Tensor | None = None


class ClassPrediction(NamedTuple):
    """Top-k classes of each image: index [B] (in its dataset), probs and classes [B, k]."""

    index: torch.Tensor
    probs: torch.Tensor
    classes: torch.Tensor


class SegmentationOutput(NamedTuple):
    """Pixel logits and their labels, as pairs: one pair [B, K, H, W] / [B, H, W] for a
    training batch, one pair [1, K, h, w] / [1, h, w] per image in evaluation (sizes differ)."""

    logits: list[torch.Tensor]
    targets: list[torch.Tensor]


class SegmentationPrediction(NamedTuple):
    """Label maps at each image's original size: index [B], labels: B tensors [h, w] int64."""

    index: torch.Tensor
    labels: list[torch.Tensor]
