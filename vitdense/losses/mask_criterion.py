"""Mask2Former's set loss for mask classification (Cheng et al. 2022), as EoMT trains with it.

After the Hungarian matching (`MaskHungarianMatcher`), every query is classified by DETR's
softmax cross-entropy over K + 1 classes ("no object" weighted `eos_coef`), and every
matched query's mask is compared with its target on PointRend's uncertain points
(`uncertain_point_coords`: 3 * P uniform points, the 0.75 * P with logits nearest 0, plus
0.25 * P uniform ones) by a sigmoid BCE (mean over the points) and a dice loss, both summed
over the matched masks and divided by the number of target masks in the batch (in training
averaged over processes, as Mask2Former's; at least 1). With auxiliary losses on, every
earlier block's predictions are matched anew and supervised the same way (`loss_ce_0`, ...).
Evaluation's figure of each term is the split's: its sum over the split's images divided by
the split's count (`Losses.sums`), as `SetCriterion`'s.

Points fall anywhere in the frame the mask logits cover, padding included, where targets are
0 (Mask2Former's own behaviour: its "TODO use valid to mask invalid areas due to padding").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vitdense.losses.class_losses import SoftmaxCrossEntropy
from vitdense.losses.mask_matcher import (
    MaskHungarianMatcher,
    point_sample,
    sample_target_masks,
    target_frame,
    uncertain_point_coords,
)
from vitdense.losses.matcher import Matches
from vitdense.losses.set_criterion import SetCriterion, num_target_boxes
from vitdense.types import ImageSizes, Losses, LossSum, MaskClassOutput, SegmentTargets, Size


class MaskSetCriterion(nn.Module):
    """Matching plus Mask2Former's weighted class, mask and dice terms.

    Training and evaluation modes as `SetCriterion`'s: in training (`criterion.train()`) the
    mask terms divide by the number of target masks averaged over processes (a collective);
    in evaluation (`criterion.eval()`) by the batch's own count, with no collective, and each
    term also comes as a `LossSum` (the term times what it was divided by, and the count it
    is a mean over: the batch's target masks unclamped, or the class weights of all queries
    for the cross-entropy), so that `vitdense.metrics.LossMeans` gives the split's figure for
    any batch size and number of processes.

    Frames: the mask logits [B, Q, h, w] cover the padded input as the model saw it, and the
    targets [n_i, H_i, W_i] are at their images' pixels; both are sampled at the same
    normalised coordinates of that frame, the targets placed at its top left with 0 around
    (as Mask2Former pads target masks to the padded input). `forward`'s `image_sizes` says
    where the frame ends: the batch's `ImageSizes` at the stride of the mask logits, e.g.
    `batch.image_sizes.at_stride(4)` for EoMT's 1/4-resolution masks, the frame being the
    grid times the stride, (h * 4, w * 4) pixels, which includes the model's own padding to
    a multiple of the patch size. Without it the frame is the largest target, right only when
    the logits cover exactly the largest image.

    Args:
        num_classes: classes K, without "no object".
        matcher: assigns queries to targets (default `MaskHungarianMatcher(num_points=num_points)`,
            Mask2Former's costs 2 / 5 / 5).
        eos_coef: weight of the "no object" class in the cross-entropy.
        loss_ce, loss_mask, loss_dice: weights of the three terms.
        num_points: points P per matched mask for the mask terms (Mask2Former: 112 * 112).
        oversample_ratio: uniform candidates per point for the uncertain ones.
        importance_sample_ratio: share of the P points chosen by uncertainty, the rest uniform.
        aux_loss: also supervise every earlier block's predictions (`MaskClassOutput.aux`).
    """

    def __init__(
        self,
        num_classes: int,
        matcher: MaskHungarianMatcher | None = None,
        eos_coef: float = 0.1,
        loss_ce: float = 2.0,
        loss_mask: float = 5.0,
        loss_dice: float = 5.0,
        num_points: int = 12544,
        oversample_ratio: float = 3.0,
        importance_sample_ratio: float = 0.75,
        aux_loss: bool = True,
    ) -> None:
        super().__init__()
        if num_points < 1 or oversample_ratio < 1 or not 0 <= importance_sample_ratio <= 1:
            raise ValueError(
                f"MaskSetCriterion: num_points {num_points} must be >= 1, oversample_ratio {oversample_ratio} >= 1 "
                f"and importance_sample_ratio {importance_sample_ratio} in [0, 1]"
            )
        self.num_classes = num_classes
        self.matcher = matcher or MaskHungarianMatcher(num_points=num_points)
        self.eos_coef = eos_coef
        self.weights = {"loss_ce": loss_ce, "loss_mask": loss_mask, "loss_dice": loss_dice}
        self.num_points = num_points
        self.oversample_ratio = oversample_ratio
        self.importance_sample_ratio = importance_sample_ratio
        self.aux_loss = aux_loss
        self.class_loss = SoftmaxCrossEntropy(eos_coef)

    def check(self, output: MaskClassOutput, targets: Sequence[SegmentTargets], image_sizes: ImageSizes | None) -> Size:
        """Fail early on inputs that would train the wrong thing or fail obscurely; return
        the frame (H, W) in pixels that the mask logits cover (see the class docstring)."""
        b, q, classes = output.class_logits.shape
        if classes != self.num_classes + 1:
            raise ValueError(
                f"MaskClassOutput.class_logits has {classes} classes but the criterion has num_classes "
                f"{self.num_classes} + 1 (no object): set the criterion's num_classes to the head's"
            )
        if output.mask_logits.shape[:2] != (b, q) or len(targets) != b:
            raise ValueError(
                f"MaskClassOutput.mask_logits {tuple(output.mask_logits.shape)} and {len(targets)} targets do not "
                f"match class_logits [B={b}, Q={q}, K+1]"
            )
        for i, t in enumerate(targets):
            if t.masks.ndim != 3 or len(t.labels) != t.masks.shape[0]:
                raise ValueError(
                    f"targets[{i}]: SegmentTargets.masks {tuple(t.masks.shape)} must be [n, H, W] with one mask per "
                    f"label ({len(t.labels)} labels)"
                )
        labels = torch.cat([t.labels.flatten() for t in targets])
        low, high = torch.stack(labels.aminmax()).tolist() if len(labels) else (0, 0)  # one read from the device
        if low < 0 or high >= self.num_classes:
            i = next(
                i
                for i, t in enumerate(targets)
                if len(t.labels) and not 0 <= t.labels.min() <= t.labels.max() < self.num_classes
            )
            raise ValueError(
                f"targets[{i}]: SegmentTargets.labels must be contiguous class indices in [0, {self.num_classes}), "
                f"got {sorted(set(targets[i].labels.tolist()))}: map the dataset's category ids to contiguous indices"
            )
        if image_sizes is None:
            return target_frame(targets)
        if len(image_sizes.sizes) != b:
            raise ValueError(f"image_sizes describes {len(image_sizes.sizes)} images but the batch has {b}")
        sizes = tuple(tuple(t.masks.shape[-2:]) for t in targets)
        for i, (size, expected) in enumerate(zip(sizes, image_sizes.sizes, strict=True)):
            if size != tuple(expected):
                raise ValueError(
                    f"targets[{i}]: SegmentTargets.masks are {size[0]} x {size[1]} but image_sizes says the image is "
                    f"{expected[0]} x {expected[1]}: training targets must be at the (augmented) image's pixels"
                )
        h, w = output.mask_logits.shape[-2:]
        frame = (h * image_sizes.stride[0], w * image_sizes.stride[1])
        if any(s[0] > frame[0] or s[1] > frame[1] for s in sizes):
            raise ValueError(
                f"mask logits {h} x {w} at image_sizes' stride {image_sizes.stride} cover {frame[0]} x {frame[1]} "
                f"pixels, less than the images ({image_sizes.padded[0]} x {image_sizes.padded[1]} padded): pass the "
                "batch's image_sizes at the mask logits' stride (image_sizes.at_stride(4) for 1/4-resolution masks)"
            )
        return frame

    def layer_losses(
        self,
        class_logits: torch.Tensor,
        mask_logits: torch.Tensor,
        targets: Sequence[SegmentTargets],
        matches: Matches,
        num_masks: float,
        frame: Size,
        generator: torch.Generator | None = None,
    ) -> dict[str, torch.Tensor]:
        """Unweighted `loss_ce`, `loss_mask`, `loss_dice` of one block's predictions (class
        logits [B, Q, K + 1], mask logits [B, Q, h, w], fp32) under the given matching."""
        device = class_logits.device
        matched = SetCriterion.matched_queries(matches, device)
        labels = torch.cat([t.labels[j.to(t.labels.device)] for t, (_, j) in zip(targets, matches, strict=True)])
        loss_ce = self.class_loss(class_logits, matched, labels.to(device), None, num_masks)  # softmax: no IoU

        masks = mask_logits[matched][:, None]  # [m, 1, h, w]
        if len(masks) == 0:  # zeros that keep the graph (every parameter gets a gradient)
            zero = masks.sum()
            return {"loss_ce": loss_ce, "loss_mask": zero, "loss_dice": zero}
        with torch.no_grad():
            coords = uncertain_point_coords(
                masks, self.num_points, self.oversample_ratio, self.importance_sample_ratio, generator
            )
            per_image = coords.split([len(j) for _, j in matches])
            point_labels = torch.cat(
                [
                    sample_target_masks(t.masks, c, frame, j).to(device)
                    for t, c, (_, j) in zip(targets, per_image, matches, strict=True)
                ]
            )  # [m, P]
        points = point_sample(masks, coords)[:, 0]  # [m, P]
        loss_mask = F.binary_cross_entropy_with_logits(points, point_labels, reduction="none").mean(1).sum()
        probs = points.sigmoid()
        dice = 1 - (2 * (probs * point_labels).sum(-1) + 1) / (probs.sum(-1) + point_labels.sum(-1) + 1)
        return {"loss_ce": loss_ce, "loss_mask": loss_mask / num_masks, "loss_dice": dice.sum() / num_masks}

    def forward(
        self,
        output: MaskClassOutput,
        targets: Sequence[SegmentTargets],
        image_sizes: ImageSizes | None = None,
        generator: torch.Generator | None = None,
    ) -> Losses:
        """Weighted terms of the last block (`loss_ce`, `loss_mask`, `loss_dice`) and of each
        earlier one (`loss_ce_0`, ... for the first), and their sum as the total. Computed in
        fp32 whatever the autocast setting; the mask count is synchronised across processes
        in training mode only, and the terms' sums are given in evaluation mode only.

        Args:
            output: the model's predictions.
            targets: B `SegmentTargets` at their images' pixels, crowds excluded.
            image_sizes: the batch's `ImageSizes` at the stride of the mask logits (see the
                class docstring), or None: the frame is the largest target.
            generator: source of the random points, matcher's then loss's, block by block in
                Mask2Former's order (default torch's global generator); one seeded per batch
                makes evaluation losses repeatable.
        """
        frame = self.check(output, targets, image_sizes)
        device = output.class_logits.device
        with torch.autocast(device.type, enabled=False):
            num_masks = num_target_boxes(targets, device, synchronize=self.training)
            # in evaluation, each term's sum over the batch and its count: this batch's masks, not clamped
            count = None if self.training else float(sum(len(t.labels) for t in targets))
            terms: dict[str, torch.Tensor] = {}
            sums: dict[str, LossSum] = {}
            layers = [(output.class_logits, output.mask_logits, "")]
            if self.aux_loss:
                layers += [(c, m, f"_{i}") for i, (c, m) in enumerate(output.aux)]
            for class_logits, mask_logits, suffix in layers:
                class_logits, mask_logits = class_logits.float(), mask_logits.float()
                matches = self.matcher(class_logits, mask_logits, targets, frame, generator)
                values = self.layer_losses(class_logits, mask_logits, targets, matches, num_masks, frame, generator)
                for name, value in values.items():
                    terms[name + suffix] = self.weights[name] * value
                if count is not None:
                    matched = SetCriterion.matched_queries(matches, device)
                    divisors = {
                        "loss_ce": (self.class_loss.normalizer(class_logits, matched, num_masks),) * 2,
                        "loss_mask": (num_masks, count),
                        "loss_dice": (num_masks, count),
                    }
                    for name, (divisor, denominator) in divisors.items():
                        sums[name + suffix] = LossSum(terms[name + suffix] * divisor, denominator)
            total = torch.stack(list(terms.values())).sum()
        return Losses(total, terms, sums)
