"""Mask2Former's point-sampled bipartite matching of mask queries to segments (Cheng et al.
2022, section 3.2 "improving training efficiency"), with PointRend's point sampling.

Masks are compared on sampled points rather than whole grids: per image, `num_points`
points are drawn uniformly in [0, 1]^2 of the frame the mask logits cover, the same points
for every query and every target of that image, and the cost of giving target j to query i
is

    cost_class * -p_i(c_j) + cost_mask * BCE(m_i, t_j) + cost_dice * dice(m_i, t_j)

(BCE of the sigmoid mask logits, the mean over the points; dice with +1 smoothing), each
image assigned on its own by scipy's `linear_sum_assignment`.

Frames: mask logits [Q, h, w] describe the padded input the model saw (the batch padded
right and bottom, and padded again to the patch size by the model), while targets are at
their own image's pixels [n, H_i, W_i]. Both are sampled at the same normalised coordinates
of that frame (H, W) in pixels, a target being its image's masks at the top left and 0
elsewhere: Mask2Former's targets padded to the padded input (`prepare_targets`, then
`nested_tensor_from_tensor_list`), sampled here without building the padded copies.

The random coordinates come from `torch.rand` in Mask2Former's order (per image, one draw
of [1, P, 2], images without targets included), from the given `torch.Generator` if any:
the same generator seeded the same way reproduces Mask2Former's own draws.

Mask2Former's set loss for mask classification (Cheng et al. 2022), as EoMT trains with it.

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
0 (Mask2Former's own behaviour: its "TODO use valid to mask invalid areas due to padding")."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn

from vitdense.core.errors import NonFiniteError
from vitdense.losses.classification import SoftmaxCrossEntropy
from vitdense.losses.detection import Matches, SetCriterion, num_target_boxes
from vitdense.types import ImageSizes, Losses, LossSum, MaskClassOutput, SegmentTargets, Size


def point_sample(input: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """Bilinear values of input [N, C, H, W] at coords [N, P, 2] (x, y) in [0, 1] of its
    extent -> [N, C, P]: detectron2's `point_sample` (`grid_sample`, align_corners=False,
    zeros outside), whose pixel centres sit at (i + 0.5) / size."""
    return F.grid_sample(input, 2.0 * coords[:, :, None] - 1.0, align_corners=False)[..., 0]


def sample_target_masks(
    masks: torch.Tensor, coords: torch.Tensor, frame: Size, which: torch.Tensor | None = None
) -> torch.Tensor:
    """Bilinear values of one image's target masks at coords of the frame they sit in.

    Equal to `point_sample` of the masks as float, zero-padded right and bottom to `frame`
    (Mask2Former's padded targets), but reads 4 pixels per point from the masks as they are
    instead of materialising [n, H, W] floats at the frame's size.

    Args:
        masks: [n, H_i, W_i] (bool) the image's masks, at the top left of the frame.
        coords: [k, P, 2] or [1, P, 2] (shared) (x, y) in [0, 1] of the frame.
        frame: (H, W) in pixels that the coordinates span (H >= H_i, W >= W_i).
        which: [k] int64 indices of the masks to sample (default all n, k = n).

    Returns:
        [k, P] float32 on the masks' device.
    """
    n, height, width = masks.shape
    which = torch.arange(n, device=masks.device) if which is None else which.to(masks.device)
    coords = coords.to(masks.device, torch.float32)
    grid = 2.0 * coords - 1.0  # as point_sample hands grid_sample, so that positions round alike
    x = ((grid[..., 0] + 1) * frame[1] - 1) / 2  # [k or 1, P] pixel positions, centres at integers
    y = ((grid[..., 1] + 1) * frame[0] - 1) / 2
    x0, y0 = x.floor(), y.floor()
    wx, wy = x - x0, y - y0
    # the 4 neighbours [4, k or 1, P]: north-west, north-east, south-west, south-east
    xi = x0.long() + torch.tensor([0, 1, 0, 1], device=masks.device)[:, None, None]
    yi = y0.long() + torch.tensor([0, 0, 1, 1], device=masks.device)[:, None, None]
    weights = torch.stack([(1 - wy) * (1 - wx), (1 - wy) * wx, wy * (1 - wx), wy * wx])
    # outside the image (its padding in the frame, or beyond the frame as grid_sample's zeros): 0
    inside = (xi >= 0) & (xi < width) & (yi >= 0) & (yi < height)
    index = which[:, None] * (height * width) + (yi.clamp(0, height - 1) * width + xi.clamp(0, width - 1))
    values = masks.reshape(-1).gather(0, index.reshape(-1)).view(index.shape)  # 1-d gather: CPU's fastest read
    return (weights * (values * inside)).sum(0)


def uncertain_point_coords(
    logits: torch.Tensor,
    num_points: int,
    oversample_ratio: float = 3.0,
    importance_sample_ratio: float = 0.75,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """PointRend's training points (detectron2's `get_uncertain_point_coords_with_randomness`
    with Mask2Former's uncertainty -|logit|): of `oversample_ratio * num_points` uniform
    points, the `importance_sample_ratio * num_points` whose interpolated logit is nearest
    to 0, then uniform points for the rest.

    Args:
        logits: [N, 1, h, w] mask logits.
        num_points: points P per mask.
        generator: the source of the uniform draws (default torch's global one); drawn as
            detectron2 does, [N, oversample_ratio * P, 2] then [N, P - importance points, 2].

    Returns:
        [N, P, 2] (x, y) in [0, 1].
    """
    if oversample_ratio < 1 or not 0 <= importance_sample_ratio <= 1:
        raise ValueError(
            f"uncertain_point_coords: oversample_ratio {oversample_ratio} must be >= 1 and importance_sample_ratio "
            f"{importance_sample_ratio} in [0, 1]"
        )
    n = logits.shape[0]
    num_sampled = int(num_points * oversample_ratio)
    coords = torch.rand(n, num_sampled, 2, device=logits.device, generator=generator)
    # the uncertainty of the interpolated logit, not interpolated uncertainties (PointRend)
    uncertainty = -point_sample(logits, coords)[:, 0].abs()  # [N, S]
    num_uncertain = int(importance_sample_ratio * num_points)
    index = uncertainty.topk(num_uncertain, dim=1).indices
    coords = coords.gather(1, index[..., None].expand(-1, -1, 2))
    if num_points > num_uncertain:
        extra = torch.rand(n, num_points - num_uncertain, 2, device=logits.device, generator=generator)
        coords = torch.cat([coords, extra], dim=1)
    return coords


def batch_sigmoid_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean BCE over P points of every prediction against every target: logits [N, P],
    targets [M, P] in [0, 1] -> [N, M] (Mask2Former's `batch_sigmoid_ce_loss`)."""
    pos = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits), reduction="none")
    neg = F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits), reduction="none")
    return (pos @ targets.T + neg @ (1 - targets).T) / logits.shape[1]


def batch_dice(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Dice loss 1 - (2 |m t| + 1) / (|m| + |t| + 1) of every prediction against every target:
    logits [N, P], targets [M, P] -> [N, M] (Mask2Former's `batch_dice_loss`)."""
    probs = logits.sigmoid()
    numerator = 2 * probs @ targets.T
    denominator = probs.sum(-1)[:, None] + targets.sum(-1)[None, :]
    return 1 - (numerator + 1) / (denominator + 1)


def target_frame(targets: Sequence[SegmentTargets]) -> Size:
    """The largest target size: the frame Mask2Former pads targets to when the mask logits
    cover exactly the largest image (`nested_tensor_from_tensor_list`)."""
    return max(t.masks.shape[-2] for t in targets), max(t.masks.shape[-1] for t in targets)


class MaskHungarianMatcher(nn.Module):
    """One-to-one assignment of mask queries to segments, per image, on sampled points.

    Args:
        cost_class: weight of the negative softmax probability of the target's class.
        cost_mask: weight of the mean sigmoid BCE over the points.
        cost_dice: weight of the dice loss over the points.
        num_points: points sampled per image (Mask2Former: 112 * 112 = 12544).
    """

    def __init__(
        self, cost_class: float = 2.0, cost_mask: float = 5.0, cost_dice: float = 5.0, num_points: int = 12544
    ) -> None:
        super().__init__()
        if cost_class == 0 and cost_mask == 0 and cost_dice == 0:
            raise ValueError("MaskHungarianMatcher: all costs are 0, so every assignment would be equal")
        if num_points < 1:
            raise ValueError(f"MaskHungarianMatcher: num_points must be at least 1, got {num_points}")
        self.cost_class = cost_class
        self.cost_mask = cost_mask
        self.cost_dice = cost_dice
        self.num_points = num_points

    @torch.no_grad()
    def image_cost(
        self,
        class_logits: torch.Tensor,
        mask_logits: torch.Tensor,
        target: SegmentTargets,
        frame: Size,
        coords: torch.Tensor,
    ) -> torch.Tensor:
        """Costs [Q, n] in fp32 of one image's queries (class logits [Q, K + 1], mask logits
        [Q, h, w]) against its n targets, on coords [1, P, 2] of the frame."""
        with torch.autocast(mask_logits.device.type, enabled=False):
            cost_class = -class_logits.float().softmax(-1)[:, target.labels.to(class_logits.device)]
            points = point_sample(mask_logits[None].float(), coords)[0]  # [Q, P]
            labels = sample_target_masks(target.masks, coords, frame).to(points.device)  # [n, P]
            return (
                self.cost_mask * batch_sigmoid_ce(points, labels)
                + self.cost_class * cost_class
                + self.cost_dice * batch_dice(points, labels)
            )

    @torch.no_grad()
    def forward(
        self,
        class_logits: torch.Tensor,
        mask_logits: torch.Tensor,
        targets: Sequence[SegmentTargets],
        frame: Size | None = None,
        generator: torch.Generator | None = None,
    ) -> Matches:
        """Match a batch.

        Args:
            class_logits: [B, Q, K + 1] class logits ("no object" last).
            mask_logits: [B, Q, h, w] mask logits covering the frame.
            targets: B `SegmentTargets`, masks [n_i, H_i, W_i] at the top left of the frame.
            frame: (H, W) pixels the mask logits cover (default the largest target size;
                see the module docstring and `MaskSetCriterion`).
            generator: source of the random points (default torch's global generator).

        Returns:
            Per image, (query indices, target indices), int64 on the CPU, by query.

        Raises:
            NonFiniteError: an image with targets has a NaN or infinite logit.
        """
        b = class_logits.shape[0]
        if len(targets) != b or mask_logits.shape[0] != b:
            raise ValueError(
                f"{b} images of class logits, {mask_logits.shape[0]} of mask logits but {len(targets)} targets"
            )
        frame = frame or target_frame(targets)
        empty = torch.empty(0, dtype=torch.int64)
        matches: Matches = []
        for i, target in enumerate(targets):
            # drawn for every image, with targets or not, to keep Mask2Former's sequence of draws
            coords = torch.rand(1, self.num_points, 2, device=mask_logits.device, generator=generator)
            if len(target.labels) == 0:
                matches.append((empty, empty))
                continue
            cost = self.image_cost(class_logits[i], mask_logits[i], target, frame, coords).cpu()
            if not torch.isfinite(cost).all():
                query = int((~torch.isfinite(cost)).any(1).nonzero()[0])
                raise NonFiniteError(
                    f"image {i} of the batch, query {query}: class or mask logits with NaN or inf, so it cannot be "
                    "matched. The training has diverged: lower the learning rate, clip gradients "
                    "(trainer.gradient_clip_val), or train in fp32 (trainer.precision=32-true) if it happened under "
                    "16-bit precision",
                    i,
                    query,
                )
            rows, cols = linear_sum_assignment(cost.numpy())
            matches.append((torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64)))
        return matches


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
