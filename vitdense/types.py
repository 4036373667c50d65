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


class BoxTargets(NamedTuple):
    """One image's objects as the detection loss sees them: boxes [n, 4] (cx, cy, w, h) in
    [0, 1] of the unpadded image, labels [n] int64 contiguous class indices (n may be 0)."""

    boxes: torch.Tensor
    labels: torch.Tensor


class EvalTargets(NamedTuple):
    """One image's original annotations for COCO evaluation: boxes [n, 4] absolute (x1, y1,
    x2, y2) pixels of the original image, labels [n] contiguous class indices, iscrowd [n]
    int64 and area [n] float (the annotation's own, which COCO's small/medium/large use).
    Crowd regions are kept here (COCOeval ignores detections on them) and dropped from
    training targets."""

    boxes: torch.Tensor
    labels: torch.Tensor
    iscrowd: torch.Tensor
    area: torch.Tensor


class DetectedImages(NamedTuple):
    """An image with its objects, or a padded batch of them.

    Attributes:
        image: [3, H, W] normalised image; [B, 3, H, W] zero-padded right/bottom in a batch.
        targets: the objects to learn (`BoxTargets`, crowds excluded); a tuple of B in a batch.
        index: position of the sample in its dataset.
        pad_mask: [B, H, W] bool, True on image padding (None for a single sample).
        image_sizes: (H, W) of the image before padding; one pair per image in a batch.
        orig_sizes: (H0, W0) of the image as stored, before any resize; boxes are predicted
            relative to the image and scaled to this size for evaluation and export.
        eval_targets: the original annotations (`EvalTargets`), or None where not needed.
    """

    image: torch.Tensor
    targets: BoxTargets | tuple[BoxTargets, ...]
    index: torch.Tensor | int = -1
    pad_mask: torch.Tensor | None = None
    image_sizes: tuple[Size, ...] | Size | None = None
    orig_sizes: tuple[Size, ...] | Size | None = None
    eval_targets: EvalTargets | tuple[EvalTargets | None, ...] | None = None


class DetectionOutput(NamedTuple):
    """A DETR head's predictions for a batch.

    Attributes:
        logits: [B, Q, K + 1] class logits, the last class being "no object".
        boxes: [B, Q, 4] (cx, cy, w, h) in [0, 1] of each unpadded image.
        aux: the same pair from every earlier decoder layer (first to last but one), for
            the auxiliary losses; empty when they are off.
        num_groups: query groups (Group DETR) in `logits`/`boxes`, Q = num_groups x queries
            per group; each group is matched one-to-one on its own. 1 at inference.
    """

    logits: torch.Tensor
    boxes: torch.Tensor
    aux: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    num_groups: int = 1


class Detections(NamedTuple):
    """Post-processed detections of a batch: index [B] (in its dataset); per image, boxes
    [k, 4] absolute (x1, y1, x2, y2) at the original size, scores [k] and labels [k]
    (contiguous class indices), best first."""

    index: torch.Tensor
    boxes: list[torch.Tensor]
    scores: list[torch.Tensor]
    labels: list[torch.Tensor]
