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
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn

from vitdense.errors import NonFiniteError
from vitdense.losses.matcher import Matches
from vitdense.types import SegmentTargets, Size


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
