"""The contract types every part of vitdense passes around: batches, task outputs,
predictions and losses. NamedTuples (Lightning moves their tensors between devices as
they are), importable without importing any dataset family, transform library or task.

Batches come from one padding collate (`vitdense.data.collate.pad_collate`): images are
zero-padded right and bottom to the batch's largest size, and the batch's `ImageSizes`
says which part of each image is real. That one object travels unchanged from the collate
through the backbone (as `ViTFeatures.image_sizes`, at the patch stride) to the heads and
post-processing; every pixel mask, token mask or valid ratio is derived from it, at any
stride, and nothing re-derives sizes from a mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

Size = tuple[int, int]


def _int(value: int | torch.SymInt) -> int:
    # sizes traced symbolically (torch.export with dynamic height/width) stay symbolic
    return value if isinstance(value, torch.SymInt) else int(value)


def _pair(value: int | Sequence[int]) -> Size:
    return (_int(value), _int(value)) if isinstance(value, (int, torch.SymInt)) else (_int(value[0]), _int(value[1]))


def _ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for positive ints, also symbolic ones (no float in between)."""
    return -(-a // b)


class SameSize:
    """The sizes of `count` images of one `size` where `count` is symbolic (`torch.export`
    with a dynamic batch): `ImageSizes.full`'s `sizes` then, since a tuple of B sizes needs
    B as a Python int, and reading it would fix the graph's batch to the example's.

    Whatever looks at the images one by one (len, iteration, indexing) cannot be traced for
    any batch: it raises here, and the export falls back to a batch of 1, saying why."""

    def __init__(self, size: Size, count: torch.SymInt) -> None:
        self.size = size
        self.count = count

    def _refuse(self, *_) -> None:
        raise TypeError(
            "ImageSizes of a symbolic batch (torch.export with a dynamic batch) cannot be read image by image: "
            "use ImageSizes.batch, has_padding, grids_tensor() or mask()"
        )

    __len__ = __iter__ = __getitem__ = _refuse

    def __repr__(self) -> str:
        return f"SameSize({self.size}, count={self.count})"


class ImageSizes(NamedTuple):
    """The padding contract: the size of every image of a batch padded right and bottom.

    Sizes are Python ints (no device tensor is read back to the host to learn them). The
    same object describes the batch at any stride: `at_stride(16)` is the view of a ViT
    with 16 x 16 patches, where a token is padding if it covers only padding pixels (the
    last row of an image whose height is not a multiple of 16 is part image, part padding,
    and counts as image, as when the image is encoded alone).

    Attributes:
        sizes: (H_i, W_i) of each image in pixels, before padding; a `SameSize` for images of
            one size whose number is symbolic (an export with a dynamic batch).
        padded: (H, W) of the padded batch in pixels.
        stride: pixels per position (h, w) of the level this object describes (1: pixels).
    """

    sizes: tuple[Size, ...] | SameSize
    padded: Size
    stride: Size = (1, 1)

    @classmethod
    def of(cls, sizes: Sequence[Sequence[int]]) -> ImageSizes:
        """The sizes of images padded to the largest height and width among them."""
        pairs = tuple(_pair(s) for s in sizes)
        if not pairs:
            raise ValueError("ImageSizes.of needs at least one size")
        return cls(pairs, (max(h for h, _ in pairs), max(w for _, w in pairs)))

    @classmethod
    def full(cls, batch: int | torch.SymInt, size: Sequence[int]) -> ImageSizes:
        """`batch` images of the same size: no padding. A symbolic `batch` (torch.export)
        stays symbolic: the sizes are then a `SameSize`."""
        if isinstance(batch, torch.SymInt):
            return cls(SameSize(_pair(size), batch), _pair(size))
        return cls((_pair(size),) * batch, _pair(size))

    @property
    def batch(self) -> int | torch.SymInt:
        """The number of images (symbolic in an export with a dynamic batch)."""
        return self.sizes.count if isinstance(self.sizes, SameSize) else len(self.sizes)

    def at_stride(self, stride: int | Sequence[int]) -> ImageSizes:
        """The same batch seen at `stride` pixels per position (e.g. a ViT's patch size)."""
        return self._replace(stride=_pair(stride))

    @property
    def grids(self) -> tuple[Size, ...] | SameSize:
        """Each image's extent in positions at this stride: (ceil(H_i / s_h), ceil(W_i / s_w))."""
        sh, sw = self.stride
        if isinstance(self.sizes, SameSize):
            (h, w), count = self.sizes.size, self.sizes.count
            return SameSize((_ceil_div(h, sh), _ceil_div(w, sw)), count)
        return tuple((_ceil_div(h, sh), _ceil_div(w, sw)) for h, w in self.sizes)

    @property
    def grid(self) -> Size:
        """The padded batch's extent in positions at this stride."""
        return _ceil_div(self.padded[0], self.stride[0]), _ceil_div(self.padded[1], self.stride[1])

    @property
    def has_padding(self) -> bool:
        """Whether any position at this stride is padding."""
        grids = self.grids
        if isinstance(grids, SameSize):
            return grids.size != self.grid
        return any(g != self.grid for g in grids)

    def grids_tensor(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> torch.Tensor:
        """`grids` as a tensor [B, 2] (rows, cols), int64 unless `dtype` says otherwise; built by
        tensor ops for a symbolic batch (it stays symbolic in an exported graph)."""
        grids = self.grids
        if isinstance(grids, SameSize):
            return torch.tensor([grids.size], dtype=dtype, device=device).expand(grids.count, 2)
        return torch.tensor(grids, dtype=dtype, device=device)

    def mask(self, device: torch.device | str | None = None) -> torch.Tensor:
        """[B, h, w] bool at this stride, True on padding positions."""
        h, w = self.grid
        limits = self.grids_tensor(device=device)  # [B, 2]
        rows = torch.arange(h, device=device)[None, :, None] >= limits[:, 0, None, None]
        cols = torch.arange(w, device=device)[None, None, :] >= limits[:, 1, None, None]
        return rows | cols

    def valid_ratios(self, device: torch.device | str | None = None) -> torch.Tensor:
        """[B, 2] float: each image's share of the padded grid along (h, w) at this stride
        (Deformable DETR's valid ratios)."""
        grid = torch.tensor(self.grid, dtype=torch.float32, device=device)
        return self.grids_tensor(torch.float32, device) / grid


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


class LossSum(NamedTuple):
    """A batch's share of a loss that is normalised by something other than its images:
    the loss summed over the batch (numerator) and what that sum is divided by
    (denominator: labelled pixels, target boxes, the class weights of the queries), both
    on this process and batch, scalars (tensors or floats)."""

    numerator: torch.Tensor | float
    denominator: torch.Tensor | float


class Losses(NamedTuple):
    """What `BaseTask.compute_loss` returns: the total that is optimised and its named
    terms (already weighted, e.g. `loss_ce`, `loss_bbox`, `loss_giou`, `loss_ce_0`), each a
    scalar tensor. The base logs the total as `{stage}/loss` and each term as `{stage}/{name}`.

    `sums` makes the evaluation losses the dataset's (`vitdense.metrics.LossMeans`): per
    name ("loss" for the total, or a term's), the batch's `LossSum`; the figure logged is
    then the split's summed numerators over its summed denominators, whatever the batches
    and processes. A loss without one is a mean over the batch's images. When `sums` has
    every term but not "loss", the total is the sum of the terms (DETR's), and so is its
    dataset figure.
    """

    total: torch.Tensor
    terms: dict[str, torch.Tensor] = {}
    sums: dict[str, LossSum] = {}


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
    """

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    matches: list[tuple[torch.Tensor, torch.Tensor]]
    num_groups: int


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
    """

    logits: torch.Tensor
    boxes: torch.Tensor
    aux: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    num_groups: int = 1
    enc: tuple[torch.Tensor, torch.Tensor] | None = None
    sigmoid: bool = False
    dn: Denoising | None = None

    def class_probs(self) -> torch.Tensor:
        """[B, Q, K] fp32 probability of each real class (softmax without "no object", or sigmoid)."""
        logits = self.logits.float()
        return logits.sigmoid() if self.sigmoid else logits.softmax(-1)[..., :-1]


class Detections(NamedTuple):
    """Post-processed detections of a batch: index [B] (in its dataset); per image, boxes
    [k, 4] absolute (x1, y1, x2, y2) at the original size, scores [k] and labels [k]
    (contiguous class indices), best first."""

    index: torch.Tensor
    boxes: list[torch.Tensor]
    scores: list[torch.Tensor]
    labels: list[torch.Tensor]


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
