"""Detection's batches, targets, outputs and predictions (DETR, LW-DETR)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from vitdense.types.common import ImageSizes, Size


class BoxTargets(NamedTuple):
    """One image's objects as the detection loss sees them: boxes [n, 4] (cx, cy, w, h) in
    [0, 1] of the unpadded image, labels [n] int64 contiguous class indices (n may be 0);
    with a keypoint dataset, keypoints [n, K, 3] (x, y in [0, 1] of the unpadded image, v in
    {0, 1, 2} as COCO's: 0 not labelled, with x = y = 0), else None."""

    boxes: torch.Tensor
    labels: torch.Tensor
    keypoints: torch.Tensor | None = None


class EvalTargets(NamedTuple):
    """One image's original annotations for COCO evaluation: boxes [n, 4] absolute (x1, y1,
    x2, y2) pixels of the original image, labels [n] contiguous class indices, iscrowd [n]
    int64 and area [n] float (the annotation's own, which COCO's small/medium/large use).
    Crowd regions are kept here (COCOeval ignores detections on them) and dropped from
    training targets. With a keypoint dataset, keypoints [n, K, 3] as annotated (x, y
    absolute pixels of the original image, v in {0, 1, 2}; a crowd's all 0), else None."""

    boxes: torch.Tensor
    labels: torch.Tensor
    iscrowd: torch.Tensor
    area: torch.Tensor
    keypoints: torch.Tensor | None = None


class DetectedImages(NamedTuple):
    """An image with its objects, or a padded batch of them.

    Attributes:
        image: [3, H, W] normalised image; [B, 3, H, W] zero-padded right/bottom in a batch.
        targets: the objects to learn (`BoxTargets`, crowds excluded); a tuple of B in a batch.
        index: position of the sample in its dataset.
        image_sizes: (H, W) of a single image; the batch's `ImageSizes` once collated.
        orig_sizes: (H0, W0) of the image as stored, before any resize; boxes are predicted
            relative to the image and scaled to this size for evaluation and export.
        eval_targets: the original annotations (`EvalTargets`), or None where not needed.
    """

    image: torch.Tensor
    targets: BoxTargets | tuple[BoxTargets, ...]
    index: torch.Tensor | int = -1
    image_sizes: ImageSizes | Size | None = None
    orig_sizes: tuple[Size, ...] | Size | None = None
    eval_targets: EvalTargets | tuple[EvalTargets | None, ...] | None = None

    @classmethod
    def unlabeled(cls, image: torch.Tensor, size: Size, index: int, ignore_index: int = 255) -> DetectedImages:
        """An image to predict on: [3, H, W] preprocessed, no objects; boxes are predicted at
        `size`, the image's (H0, W0) as given."""
        no_objects = BoxTargets(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64))
        return cls(image, no_objects, index, tuple(image.shape[-2:]), (int(size[0]), int(size[1])))


class Denoising(NamedTuple):
    """A head's denoising queries (DN-DETR / DINO) in training: noised copies of the targets
    whose answer is known, so they need no matching.

    Attributes:
        layers: (logits [B, D, C], boxes [B, D, 4]) of every decoder layer, first to last.
        matches: per image, (denoising query indices, target indices): each of the
            `num_groups` groups holds every target of the image once.
        num_groups: denoising groups (each target appears once per group).
        keypoints: with a keypoint head, each layer's keypoints [B, D, K, 7], first to last
            (as `DetectionOutput.keypoints`); else None.
    """

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    matches: list[tuple[torch.Tensor, torch.Tensor]]
    num_groups: int
    keypoints: tuple[torch.Tensor, ...] | None = None


class DetectionOutput(NamedTuple):
    """A DETR head's predictions for a batch.

    Attributes:
        logits: [B, Q, K + 1] class logits, the last class being "no object" (softmax
            heads, DETR's); or [B, Q, K] independent sigmoid logits if `sigmoid`.
        boxes: [B, Q, 4] (cx, cy, w, h) in [0, 1] of each unpadded image.
        aux: the same pair from every earlier decoder layer (first to last but one), for
            the auxiliary losses; empty when they are off.
        num_groups: query groups (Group DETR) in `logits`/`boxes`, Q = num_groups x queries
            per group; each group is matched one-to-one on its own. 1 at inference.
        enc: a two-stage head's selected encoder proposals, (logits, boxes) shaped as the
            decoder's, supervised like a decoder layer; None without.
        sigmoid: the logits are per-class sigmoids without "no object" (Deformable DETR
            and its successors) rather than a softmax over K + 1.
        dn: the denoising queries' predictions (training with denoising on), else None.
        keypoints: with a keypoint head, [B, Q, K, 7] per query and keypoint: (x, y) in [0, 1]
            of the unpadded image, findable and visible logits, and the precision's Cholesky
            factor (log l11, l21, log l22) (`vitdense.losses.keypoints`); else None.
        aux_keypoints: the same from every earlier decoder layer, as `aux` (empty without).
        enc_keypoints: a two-stage head's proposals' keypoints, as `enc`'s (None without).
    """

    logits: torch.Tensor
    boxes: torch.Tensor
    aux: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    num_groups: int = 1
    enc: tuple[torch.Tensor, torch.Tensor] | None = None
    sigmoid: bool = False
    dn: Denoising | None = None
    keypoints: torch.Tensor | None = None
    aux_keypoints: tuple[torch.Tensor, ...] = ()
    enc_keypoints: torch.Tensor | None = None

    def class_probs(self) -> torch.Tensor:
        """[B, Q, K] fp32 probability of each real class (softmax without "no object", or sigmoid)."""
        logits = self.logits.float()
        return logits.sigmoid() if self.sigmoid else logits.softmax(-1)[..., :-1]


class Detections(NamedTuple):
    """Post-processed detections of a batch: index [B] (in its dataset); per image, boxes
    [k, 4] absolute (x1, y1, x2, y2) at the original size, scores [k] and labels [k]
    (contiguous class indices), best first; with a keypoint head, keypoints [k, K, 3] per
    image (x, y absolute at the original size, and each keypoint's score in [0, 1]), else
    None."""

    index: torch.Tensor
    boxes: list[torch.Tensor]
    scores: list[torch.Tensor]
    labels: list[torch.Tensor]
    keypoints: list[torch.Tensor] | None = None
