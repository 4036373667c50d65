"""Classification terms of the set loss, each with the matching cost that agrees with it.

- `SoftmaxCrossEntropy`: DETR's, over K + 1 logits ("no object" last, weighted `eos_coef`).
- `SigmoidFocalLoss`: Deformable DETR's, K sigmoid logits, focal loss (Lin et al. 2017).
- `IoUAwareBCELoss`: LW-DETR / RF-DETR's `ia_bce_loss`: a matched query's target is
  t = p^alpha * IoU^(1 - alpha) of its own box with its target, so the score learns to rank
  boxes by quality; unmatched queries are pushed to 0 with focal weights p^gamma.

A class loss is injected into `SetCriterion` (`class_loss`), which hands its
`matching_cost` to the matcher: the cost that assigns queries is always the loss's own.
The sigmoid losses give `DetectionOutput.sigmoid` heads (logits [B, Q, K]); the softmax one
DETR's (logits [B, Q, K + 1]).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ClassLoss(nn.Module):
    """A classification term and its matching cost.

    Attributes:
        sigmoid: logits are K independent sigmoids (True) or a softmax over K + 1 with
            "no object" last (False).
    """

    sigmoid: bool = False

    def matching_cost(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """logits [N, C] (fp32), target labels [M] -> cost [N, M] of giving each target to
        each query (lower is better)."""
        raise NotImplementedError

    def forward(
        self,
        logits: torch.Tensor,
        matched: tuple[torch.Tensor, torch.Tensor],
        labels: torch.Tensor,
        ious: torch.Tensor,
        num_boxes: float,
    ) -> torch.Tensor:
        """The term for one layer.

        Args:
            logits: [B, Q, C] in fp32.
            matched: (batch index, query index) [m] of the matched queries.
            labels: [m] their targets' classes.
            ious: [m] IoU of each matched query's box with its target (detached).
            num_boxes: the number of target boxes to normalise by (DETR's `num_boxes`).
        """
        raise NotImplementedError

    def normalizer(
        self, logits: torch.Tensor, matched: tuple[torch.Tensor, torch.Tensor], num_boxes: float
    ) -> torch.Tensor | float:
        """What `forward` divides its sum over the batch by, given the same arguments:
        `num_boxes` (the default), or what the loss itself averages over. `SetCriterion`
        asks it in evaluation to sum the term over a whole split (`LossSum`)."""
        return num_boxes


class SoftmaxCrossEntropy(ClassLoss):
    """DETR's: cross-entropy over K + 1 classes, the weighted mean over all queries with
    "no object" weighted `eos_coef`; matching cost -p(c) (DETR: the constant 1 dropped)."""

    sigmoid = False

    def __init__(self, eos_coef: float = 0.1) -> None:
        super().__init__()
        self.eos_coef = eos_coef

    def matching_cost(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return -logits.softmax(-1)[:, labels]

    def forward(self, logits, matched, labels, ious, num_boxes):  # noqa: D102 (see ClassLoss)
        num_classes = logits.shape[-1] - 1
        classes = torch.full(logits.shape[:2], num_classes, dtype=torch.int64, device=logits.device)
        classes[matched] = labels
        weight = torch.ones(num_classes + 1, device=logits.device)
        weight[-1] = self.eos_coef
        return F.cross_entropy(logits.transpose(1, 2), classes, weight)

    def normalizer(self, logits, matched, num_boxes):  # noqa: D102 (see ClassLoss)
        # the weighted mean's denominator: 1 per matched query, eos_coef per other query
        unmatched = logits.shape[0] * logits.shape[1] - len(matched[0])
        return float(len(matched[0]) + self.eos_coef * unmatched)


def focal_cost(logits: torch.Tensor, labels: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """Deformable DETR's focal matching cost: alpha (1-p)^gamma (-log p) - (1-alpha) p^gamma
    (-log(1-p)) of the target's class (log-sigmoids, as RF-DETR, for stability)."""
    logits = logits[:, labels]
    prob = logits.sigmoid()
    positive = alpha * (1 - prob) ** gamma * -F.logsigmoid(logits)
    negative = (1 - alpha) * prob**gamma * -F.logsigmoid(-logits)
    return positive - negative


class SigmoidClassLoss(ClassLoss):
    """The base of the sigmoid losses: K logits, Deformable DETR's focal matching cost with
    the loss's own alpha and gamma."""

    sigmoid = True

    def __init__(self, alpha: float = 0.25, gamma: float = 2.0) -> None:
        super().__init__()
        self.alpha, self.gamma = alpha, gamma

    def matching_cost(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return focal_cost(logits, labels, self.alpha, self.gamma)


class SigmoidFocalLoss(SigmoidClassLoss):
    """Deformable DETR's: sigmoid focal loss of every (query, class) against one-hot targets
    (unmatched queries: all 0), summed and divided by `num_boxes` (its `sigmoid_focal_loss`
    times the number of queries)."""

    def forward(self, logits, matched, labels, ious, num_boxes):  # noqa: D102 (see ClassLoss)
        target = torch.zeros_like(logits)
        target[(*matched, labels)] = 1.0
        prob = logits.sigmoid()
        ce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        p_t = prob * target + (1 - prob) * (1 - target)
        loss = ce * (1 - p_t) ** self.gamma
        if self.alpha >= 0:
            loss = (self.alpha * target + (1 - self.alpha) * (1 - target)) * loss
        return loss.sum() / num_boxes


class IoUAwareBCELoss(SigmoidClassLoss):
    """LW-DETR / RF-DETR's IoU-aware BCE (`ia_bce_loss`).

    For the matched (query, class) pairs the target is t = clamp(p^alpha IoU^(1-alpha), 0.01)
    (detached), weighted t towards 1 and 1 - t towards 0; every other (query, class) pair is
    weighted p^gamma towards 0 (not detached: as in LW-DETR's and RF-DETR's code, the weight
    has a gradient too). Summed and divided by `num_boxes`. Matching uses the focal cost, as
    RF-DETR's matcher does.
    """

    def forward(self, logits, matched, labels, ious, num_boxes):  # noqa: D102 (see ClassLoss)
        prob = logits.sigmoid()
        positive = (*matched, labels)
        t = (prob[positive].detach().pow(self.alpha) * ious.detach().pow(1 - self.alpha)).clamp(min=0.01)
        pos_weights = torch.zeros_like(logits)
        neg_weights = prob**self.gamma
        pos_weights[positive] = t
        neg_weights[positive] = 1 - t
        # -pos log p - neg log(1 - p), with log(1 - p) = log p - x (one fused log-sigmoid)
        loss = neg_weights * logits - F.logsigmoid(logits) * (pos_weights + neg_weights)
        return loss.sum() / num_boxes
