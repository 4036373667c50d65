"""Universal segmentation's batches, outputs and predictions (EoMT: semantic, instance and
panoptic segments as masks with classes)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from vitdense.types.common import ImageSizes, Size


# ------------------------------------------------------------------ universal segmentation
class SegmentTargets(NamedTuple):
    """One image's segments (things and stuff; an instance dataset has things only).

    In training they are what the mask loss matches queries to, at the pixels of the
    (augmented, unpadded) image, crowds excluded; in evaluation the original annotation at
    the size it was made, crowds kept (PQ and COCOeval ignore predictions on them).

    Attributes:
        masks: [n, H, W] bool, one per segment (n may be 0). Panoptic segments do not
            overlap, instance masks may; pixels under no segment are void.
        labels: [n] int64 contiguous class indices.
        iscrowd: [n] bool, True for crowd regions.
        area: [n] float, the annotation's own area (COCO's small/medium/large use it), or
            None: the masks' pixel counts.
    """

    masks: torch.Tensor
    labels: torch.Tensor
    iscrowd: torch.Tensor
    area: torch.Tensor | None = None

    @classmethod
    def empty(cls, size: Size) -> SegmentTargets:
        """No segment on an image of (H, W)."""
        return cls(
            torch.zeros(0, *size, dtype=torch.bool), torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.bool)
        )


class PanopticImages(NamedTuple):
    """An image with its segments (`SegmentTargets`), or a padded batch of them: the sample
    of universal (semantic, instance, panoptic) segmentation.

    Attributes:
        image: [3, H, W] normalised image; [B, 3, H, W] zero-padded right/bottom in a batch.
        targets: the segments to learn, at the image's pixels, crowds excluded; a tuple of
            B in a batch.
        index: position of the sample in its dataset.
        image_sizes: (H, W) of a single image; the batch's `ImageSizes` once collated.
        orig_sizes: (H0, W0) of the image as stored, before any resize; predictions are
            resized to it for evaluation and output.
        eval_targets: the original annotation (`SegmentTargets` at (H0, W0), crowds kept),
            or None where not needed (training, prediction).
    """

    image: torch.Tensor
    targets: SegmentTargets | tuple[SegmentTargets, ...]
    index: torch.Tensor | int = -1
    image_sizes: ImageSizes | Size | None = None
    orig_sizes: tuple[Size, ...] | Size | None = None
    eval_targets: SegmentTargets | tuple[SegmentTargets | None, ...] | None = None

    @classmethod
    def unlabeled(cls, image: torch.Tensor, size: Size, index: int, ignore_index: int = 255) -> PanopticImages:
        """An image to predict on: [3, H, W] preprocessed, no segments; predictions are made
        at `size`, the image's (H0, W0) as given."""
        size = (int(size[0]), int(size[1]))
        return cls(image, SegmentTargets.empty(tuple(image.shape[-2:])), index, tuple(image.shape[-2:]), size)


class MaskClassOutput(NamedTuple):
    """A mask-classification model's predictions (Mask2Former, EoMT) for a batch.

    Attributes:
        class_logits: [B, Q, K + 1] class logits, the last class being "no object".
        mask_logits: [B, Q, h, w] mask logits on a grid of the padded input (EoMT: 1/4 of
            it); the part of each image is its own `ImageSizes` at that grid's stride.
        aux: the same pair from the blocks the queries joined, before each (EoMT's
            intermediate predictions, whose masks restrict the next block's attention), for
            the auxiliary losses; in evaluation only while masked attention applies.
    """

    class_logits: torch.Tensor
    mask_logits: torch.Tensor
    aux: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()


class PanopticSegments(NamedTuple):
    """One image's panoptic segmentation: segment ids [H, W] int64 per pixel (0: no
    segment, void), and per segment: ids [n] int64 (> 0), labels [n] contiguous class
    indices, scores [n] float."""

    id_map: torch.Tensor
    ids: torch.Tensor
    labels: torch.Tensor
    scores: torch.Tensor


class InstanceMasks(NamedTuple):
    """One image's instances, best first: masks [k, H, W] bool, labels [k] contiguous class
    indices, scores [k] float."""

    masks: torch.Tensor
    labels: torch.Tensor
    scores: torch.Tensor


class PanopticPrediction(NamedTuple):
    """A batch's panoptic segmentations at each image's original size: index [B] (in its
    dataset), and B `PanopticSegments`."""

    index: torch.Tensor
    segments: list[PanopticSegments]


class InstancePrediction(NamedTuple):
    """A batch's instances at each image's original size: index [B] (in its dataset), and
    B `InstanceMasks`."""

    index: torch.Tensor
    instances: list[InstanceMasks]
