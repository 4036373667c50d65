"""DETR's bipartite matching between predicted and ground-truth boxes (Carion et al. 2020, eq. 1).

The cost of giving target j to query i is

    cost_class * -p_i(c_j) + cost_bbox * ||b_i - b_j||_1 + cost_giou * -GIoU(b_i, b_j)

(boxes as (cx, cy, w, h) in [0, 1]); the class cost is the set loss's own (`ClassLoss.
matching_cost`: DETR's -p(c) by default, the focal cost for sigmoid losses); each image is assigned on its own (scipy's
`linear_sum_assignment`), so an image's matching never depends on the rest of its batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn
from torchvision.ops import box_convert, generalized_box_iou

from vitdense.errors import NonFiniteError
from vitdense.losses.class_losses import ClassLoss, SoftmaxCrossEntropy
from vitdense.types import BoxTargets

#: per image, (query indices [m], target indices [m]) int64, m = min(queries, targets)
Matches = list[tuple[torch.Tensor, torch.Tensor]]


class HungarianMatcher(nn.Module):
    """One-to-one assignment of queries to targets, per image (and per query group).

    Args:
        cost_class: weight of the negative class probability.
        cost_bbox: weight of the L1 distance between (cx, cy, w, h) boxes.
        cost_giou: weight of the negative generalised IoU.
    """

    def __init__(self, cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0) -> None:
        super().__init__()
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("HungarianMatcher: all costs are 0, so every assignment would be equal")
        self.cost_class = cost_class
        self.cost_bbox = cost_bbox
        self.cost_giou = cost_giou

    @torch.no_grad()
    def cost_matrix(
        self,
        logits: torch.Tensor,
        boxes: torch.Tensor,
        targets: Sequence[BoxTargets],
        class_loss: ClassLoss | None = None,
    ) -> torch.Tensor:
        """Costs of every query against every target of the batch: [B, Q, sum_i n_i] in fp32.

        Computed for the whole batch at once (one set of matrix operations), then split per
        image by the caller. fp32 even under autocast: half-precision GIoUs and
        probabilities round ties differently and fp16 costs overflow.
        """
        with torch.autocast(logits.device.type, enabled=False):
            b, q = logits.shape[:2]
            class_loss = class_loss or SoftmaxCrossEntropy()
            out_boxes = boxes.flatten(0, 1).float()  # [B*Q, 4]
            tgt_labels = torch.cat([t.labels for t in targets])
            tgt_boxes = torch.cat([t.boxes for t in targets]).float()
            cost_class = class_loss.matching_cost(logits.flatten(0, 1).float(), tgt_labels)
            cost_bbox = torch.cdist(out_boxes, tgt_boxes, p=1)
            cost_giou = -generalized_box_iou(
                box_convert(out_boxes, "cxcywh", "xyxy"), box_convert(tgt_boxes, "cxcywh", "xyxy")
            )
            cost = self.cost_bbox * cost_bbox + self.cost_class * cost_class + self.cost_giou * cost_giou
            return cost.view(b, q, -1)

    @staticmethod
    def non_finite(logits: torch.Tensor, boxes: torch.Tensor, image_cost: torch.Tensor, image: int) -> NonFiniteError:
        """The error for image `image`'s cost matrix [Q, n] holding NaN or inf (scipy would
        only say "matrix contains invalid numeric entries"), naming its first bad query."""
        query = int((~torch.isfinite(image_cost)).any(1).nonzero()[0])
        box = [round(v, 4) for v in boxes[image, query].float().tolist()]
        what = f"predicted box (cx, cy, w, h) {box}"
        if not torch.isfinite(logits[image, query]).all():
            what += " and class logits with NaN or inf"
        return NonFiniteError(
            f"image {image} of the batch, query {query}: {what}, so it cannot be matched. The training "
            "has diverged: lower the learning rate, clip gradients (trainer.gradient_clip_val, DETR: 0.1), "
            "or train in fp32 (trainer.precision=32-true) if it happened under 16-bit precision",
            image,
            query,
        )

    @torch.no_grad()
    def forward(
        self,
        logits: torch.Tensor,
        boxes: torch.Tensor,
        targets: Sequence[BoxTargets],
        num_groups: int = 1,
        class_loss: ClassLoss | None = None,
    ) -> Matches:
        """Match a batch.

        Args:
            logits: [B, Q, K + 1] class logits ("no object" last), or [B, Q, K] for a
                sigmoid `class_loss`.
            boxes: [B, Q, 4] predicted (cx, cy, w, h) in [0, 1].
            targets: B `BoxTargets` (n_i boxes each, possibly 0).
            num_groups: Group DETR's query groups: the Q queries are `num_groups` consecutive
                blocks, each matched one-to-one to all targets on its own, so every target
                gets one query per group.
            class_loss: whose `matching_cost` prices the classes (default DETR's softmax).

        Returns:
            Per image, (query indices, target indices), int64 on the CPU, ordered by query
            group; within a group, each target appears at most once.

        Raises:
            NonFiniteError: an image with targets has a NaN or infinite box or logit.
        """
        b, q = logits.shape[:2]
        if q % num_groups:
            raise ValueError(f"{q} queries do not split into {num_groups} equal groups")
        sizes = [len(t.labels) for t in targets]
        if len(sizes) != b:
            raise ValueError(f"{b} images of predictions but {len(sizes)} targets")
        empty = torch.empty(0, dtype=torch.int64)
        if sum(sizes) == 0:
            return [(empty, empty) for _ in range(b)]
        cost = self.cost_matrix(logits, boxes, targets, class_loss).cpu()
        per_group = q // num_groups
        matches: Matches = []
        for i, image_cost in enumerate(cost.split(sizes, -1)):
            image_cost = image_cost[i]  # [Q, n_i]
            if image_cost.shape[1] == 0:
                matches.append((empty, empty))
                continue
            if not torch.isfinite(image_cost).all():
                raise self.non_finite(logits, boxes, image_cost, i)
            rows, cols = [], []
            for g in range(num_groups):
                r, c = linear_sum_assignment(image_cost[g * per_group : (g + 1) * per_group].numpy())
                rows.append(torch.as_tensor(r, dtype=torch.int64) + g * per_group)
                cols.append(torch.as_tensor(c, dtype=torch.int64))
            matches.append((torch.cat(rows), torch.cat(cols)))
        return matches
