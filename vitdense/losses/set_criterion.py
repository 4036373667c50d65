"""DETR's set prediction loss (Carion et al. 2020, section 3.1 and appendix A.2).

After the Hungarian matching, every query is classified (its matched target's class, or
"no object" with weight `eos_coef`), and every matched query's box is regressed with an L1
and a GIoU loss, both summed over the matched boxes and divided by the number of target
boxes in the batch (in training averaged over processes, as DETR's; at least 1). With
auxiliary losses on, every earlier decoder layer is matched and supervised the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torchvision.ops import box_convert, generalized_box_iou_loss

from vitdense.losses.matcher import HungarianMatcher, Matches
from vitdense.types import BoxTargets, DetectionOutput, Losses


def num_target_boxes(targets: Sequence[BoxTargets], device: torch.device, synchronize: bool = True) -> float:
    """Target boxes per process, at least 1: with `synchronize`, the batch's count averaged
    over all processes (DETR's), else this process's own count.

    Gradients are averaged over processes, so dividing each process's sum by the mean count
    divides the global sum by the global count, as one process holding every batch would.
    The average is a collective, which every process must reach on every step: true in
    training, where every process runs the same number of steps, not in evaluation, where
    processes may hold different numbers of batches (see `SetCriterion`).
    """
    count = torch.tensor(float(sum(len(t.labels) for t in targets)), device=device)
    if synchronize and dist.is_available() and dist.is_initialized():
        dist.all_reduce(count)
        count = count / dist.get_world_size()
    return max(count.item(), 1.0)


class SetCriterion(nn.Module):
    """Matching plus DETR's weighted loss terms.

    In training mode (`criterion.train()`) the box terms divide by the number of target boxes
    averaged over processes, as DETR does; in evaluation mode (`criterion.eval()`, which
    Lightning sets for validation and test) by the batch's own count, with no collective:
    evaluation splits a dataset across processes without repeating samples, so processes
    may run different numbers of steps (11 and 10 images at batch 1), and a per-step
    collective would wait forever for the process that has finished. The evaluation loss of
    a batch then depends on that batch only, as on one process. A criterion left in
    evaluation mode in training merely normalises by local counts; it cannot hang.

    Args:
        num_classes: object classes K, without "no object" (the logits have K + 1).
        matcher: assigns queries to targets (default: `HungarianMatcher()`, DETR's costs).
        eos_coef: weight of the "no object" class in the cross-entropy.
        loss_ce, loss_bbox, loss_giou: weights of the three terms.
        aux_loss: also supervise every earlier decoder layer's predictions.
    """

    def __init__(
        self,
        num_classes: int,
        matcher: HungarianMatcher | None = None,
        eos_coef: float = 0.1,
        loss_ce: float = 1.0,
        loss_bbox: float = 5.0,
        loss_giou: float = 2.0,
        aux_loss: bool = True,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.matcher = matcher or HungarianMatcher()
        self.eos_coef = eos_coef
        self.weights = {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}
        self.aux_loss = aux_loss
        class_weight = torch.ones(num_classes + 1)
        class_weight[-1] = eos_coef
        self.register_buffer("class_weight", class_weight, persistent=False)

    def layer_losses(
        self,
        logits: torch.Tensor,
        boxes: torch.Tensor,
        targets: Sequence[BoxTargets],
        matches: Matches,
        num_boxes: float,
    ) -> dict[str, torch.Tensor]:
        """Unweighted `loss_ce`, `loss_bbox`, `loss_giou` of one decoder layer's predictions
        (logits [B, Q, K + 1], boxes [B, Q, 4]) under the given matching."""
        device = logits.device
        batch_idx = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(matches)]).to(device)
        query_idx = torch.cat([q for q, _ in matches]).to(device)
        matched_labels = torch.cat(
            [t.labels[j.to(t.labels.device)] for t, (_, j) in zip(targets, matches, strict=True)]
        )
        matched_boxes = torch.cat([t.boxes[j.to(t.boxes.device)] for t, (_, j) in zip(targets, matches, strict=True)])

        classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=device)
        classes[batch_idx, query_idx] = matched_labels.to(device)
        # weighted mean over all queries: "no object" counts eos_coef, as in DETR
        loss_ce = F.cross_entropy(logits.float().transpose(1, 2), classes, self.class_weight.to(device))

        pred_boxes = boxes[batch_idx, query_idx].float()
        matched_boxes = matched_boxes.to(device).float()
        loss_bbox = F.l1_loss(pred_boxes, matched_boxes, reduction="sum") / num_boxes
        loss_giou = (
            generalized_box_iou_loss(
                box_convert(pred_boxes, "cxcywh", "xyxy"), box_convert(matched_boxes, "cxcywh", "xyxy"), reduction="sum"
            )
            / num_boxes
        )
        return {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}

    def forward(self, output: DetectionOutput, targets: Sequence[BoxTargets]) -> Losses:
        """Weighted terms of the last layer (`loss_ce`, `loss_bbox`, `loss_giou`) and of each
        earlier layer (`loss_ce_0`, ... for the first), and their sum as the total. Computed
        in fp32 whatever the autocast setting; the box count is synchronised across processes
        in training mode only (see the class docstring)."""
        with torch.autocast(output.logits.device.type, enabled=False):
            num_boxes = num_target_boxes(targets, output.logits.device, synchronize=self.training)
            # Group DETR: each group holds every target once, so there are num_groups times as many matches
            num_boxes = num_boxes * output.num_groups
            layers = [(output.logits, output.boxes, "")]
            if self.aux_loss:
                layers += [(logits, boxes, f"_{i}") for i, (logits, boxes) in enumerate(output.aux)]
            terms: dict[str, torch.Tensor] = {}
            for logits, boxes, suffix in layers:
                matches = self.matcher(logits, boxes, targets, output.num_groups)
                for name, value in self.layer_losses(logits, boxes, targets, matches, num_boxes).items():
                    terms[name + suffix] = self.weights[name] * value
            total = torch.stack(list(terms.values())).sum()
        return Losses(total, terms)
