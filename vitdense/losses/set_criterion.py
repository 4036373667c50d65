"""DETR's set prediction loss (Carion et al. 2020, section 3.1 and appendix A.2).

After the Hungarian matching, every query is classified by the injected class loss (DETR's
softmax cross-entropy with "no object" weighted `eos_coef` by default; Deformable DETR's
focal loss or LW-DETR's IoU-aware BCE for sigmoid heads, `class_losses`), and every matched
query's box is regressed with an L1 and a GIoU loss, both summed over the matched boxes and
divided by the number of target boxes in the batch (in training averaged over processes, as
DETR's; at least 1). With auxiliary losses on, every earlier decoder layer is matched and
supervised the same way, and so are a two-stage head's encoder proposals (`_enc`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torchvision.ops import box_convert, box_iou, generalized_box_iou_loss

from vitdense.losses.class_losses import ClassLoss, SoftmaxCrossEntropy
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
        num_classes: object classes K, without "no object".
        matcher: assigns queries to targets (default: `HungarianMatcher()`, DETR's costs),
            pricing classes with the class loss's own matching cost.
        eos_coef: weight of the "no object" class in the default softmax cross-entropy.
        loss_ce, loss_bbox, loss_giou: weights of the three terms (`loss_ce` weighs the
            class loss, whichever it is).
        aux_loss: also supervise every earlier decoder layer's predictions.
        class_loss: the class term (default `SoftmaxCrossEntropy(eos_coef)`, DETR's); a
            sigmoid one (`SigmoidFocalLoss`, `IoUAwareBCELoss`) for heads whose outputs say
            `sigmoid`.
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
        class_loss: ClassLoss | None = None,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.matcher = matcher or HungarianMatcher()
        self.eos_coef = eos_coef
        self.weights = {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}
        self.aux_loss = aux_loss
        self.class_loss = class_loss or SoftmaxCrossEntropy(eos_coef)

    def layer_losses(
        self,
        logits: torch.Tensor,
        boxes: torch.Tensor,
        targets: Sequence[BoxTargets],
        matches: Matches,
        num_boxes: float,
    ) -> dict[str, torch.Tensor]:
        """Unweighted `loss_ce`, `loss_bbox`, `loss_giou` of one decoder layer's predictions
        (logits [B, Q, K + 1] or [B, Q, K], boxes [B, Q, 4]) under the given matching."""
        device = logits.device
        batch_idx = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(matches)]).to(device)
        query_idx = torch.cat([q for q, _ in matches]).to(device)
        matched_labels = torch.cat(
            [t.labels[j.to(t.labels.device)] for t, (_, j) in zip(targets, matches, strict=True)]
        )
        matched_boxes = torch.cat([t.boxes[j.to(t.boxes.device)] for t, (_, j) in zip(targets, matches, strict=True)])

        pred_boxes = boxes[batch_idx, query_idx].float()
        matched_boxes = matched_boxes.to(device).float()
        with torch.no_grad():  # the IoU-aware loss's quality target
            ious = box_iou(box_convert(pred_boxes, "cxcywh", "xyxy"), box_convert(matched_boxes, "cxcywh", "xyxy"))
            ious = ious.diagonal() if len(pred_boxes) else pred_boxes.new_zeros(0)
        loss_ce = self.class_loss(logits.float(), (batch_idx, query_idx), matched_labels.to(device), ious, num_boxes)
        loss_bbox = F.l1_loss(pred_boxes, matched_boxes, reduction="sum") / num_boxes
        loss_giou = (
            generalized_box_iou_loss(
                box_convert(pred_boxes, "cxcywh", "xyxy"), box_convert(matched_boxes, "cxcywh", "xyxy"), reduction="sum"
            )
            / num_boxes
        )
        return {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}

    def check_logits(self, output: DetectionOutput) -> None:
        """The head's kind of logits must be the class loss's: a softmax loss on sigmoid
        logits (or the reverse) would silently train the wrong thing."""
        expected = self.num_classes if self.class_loss.sigmoid else self.num_classes + 1
        if output.sigmoid != self.class_loss.sigmoid or output.logits.shape[-1] != expected:
            head = "sigmoid logits [B, Q, K]" if output.sigmoid else "softmax logits [B, Q, K + 1]"
            raise ValueError(
                f"the head gives {head} with {output.logits.shape[-1]} classes but the criterion's class loss "
                f"{type(self.class_loss).__name__} expects {expected} {'sigmoid' if self.class_loss.sigmoid else 'softmax'} "
                "logits: set model.init_args.criterion.init_args.class_loss to match the head (SoftmaxCrossEntropy for "
                "DETRHead; SigmoidFocalLoss or IoUAwareBCELoss for LWDETRHead)"
            )

    def forward(self, output: DetectionOutput, targets: Sequence[BoxTargets]) -> Losses:
        """Weighted terms of the last layer (`loss_ce`, `loss_bbox`, `loss_giou`), of each
        earlier layer (`loss_ce_0`, ... for the first), of the two-stage proposals
        (`loss_ce_enc`, ...) and of the denoising queries with their known targets
        (`loss_ce_dn`, ... and `loss_ce_dn_0`, ...), and their sum as the total. Computed
        in fp32 whatever the autocast setting; the box count is synchronised across processes
        in training mode only (see the class docstring)."""
        self.check_logits(output)
        with torch.autocast(output.logits.device.type, enabled=False):
            num_boxes = num_target_boxes(targets, output.logits.device, synchronize=self.training)
            # Group DETR: each group holds every target once, so there are num_groups times as many matches
            num_boxes = num_boxes * output.num_groups
            layers = [(output.logits, output.boxes, "")]
            if self.aux_loss:
                layers += [(logits, boxes, f"_{i}") for i, (logits, boxes) in enumerate(output.aux)]
            if output.enc is not None:
                layers.append((*output.enc, "_enc"))
            terms: dict[str, torch.Tensor] = {}
            for logits, boxes, suffix in layers:
                matches = self.matcher(logits, boxes, targets, output.num_groups, self.class_loss)
                for name, value in self.layer_losses(logits, boxes, targets, matches, num_boxes).items():
                    terms[name + suffix] = self.weights[name] * value
            if output.dn is not None:  # denoising queries: their targets are known, no matching
                dn_boxes = num_boxes / output.num_groups * output.dn.num_groups
                *earlier, last = output.dn.layers
                dn_layers = [(*last, "_dn")]
                if self.aux_loss:
                    dn_layers += [(*layer, f"_dn_{i}") for i, layer in enumerate(earlier)]
                for logits, boxes, suffix in dn_layers:
                    for name, value in self.layer_losses(logits, boxes, targets, output.dn.matches, dn_boxes).items():
                        terms[name + suffix] = self.weights[name] * value
            total = torch.stack(list(terms.values())).sum()
        return Losses(total, terms)
