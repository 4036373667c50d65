"""DETR's bipartite matching between predicted and ground-truth boxes (Carion et al. 2020, eq. 1).

The cost of giving target j to query i is

    cost_class * -p_i(c_j) + cost_bbox * ||b_i - b_j||_1 + cost_giou * -GIoU(b_i, b_j)

(boxes as (cx, cy, w, h) in [0, 1]); the class cost is the set loss's own (`ClassLoss.
matching_cost`: DETR's -p(c) by default, the focal cost for sigmoid losses); each image is assigned on its own (scipy's
`linear_sum_assignment`), so an image's matching never depends on the rest of its batch.

DETR's set prediction loss (Carion et al. 2020, section 3.1 and appendix A.2).

After the Hungarian matching, every query is classified by the injected class loss (DETR's
softmax cross-entropy with "no object" weighted `eos_coef` by default; Deformable DETR's
focal loss or LW-DETR's IoU-aware BCE for sigmoid heads, `class_losses`), and every matched
query's box is regressed with an L1 and a GIoU loss, both summed over the matched boxes and
divided by the number of target boxes in the batch (in training averaged over processes, as
DETR's; at least 1). With auxiliary losses on, every earlier decoder layer is matched and
supervised the same way, and so are a two-stage head's encoder proposals (`_enc`).
Evaluation's figure of each term is the split's: its sum over the split's images divided by
the split's count (`Losses.sums`), equal to DETR's value when the split is one batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn
from torchvision.ops import box_convert, box_iou, generalized_box_iou, generalized_box_iou_loss

from vitdense.core.errors import NonFiniteError
from vitdense.losses.classification import ClassLoss, SoftmaxCrossEntropy
from vitdense.losses.keypoints import KeypointLoss
from vitdense.types import BoxTargets, DetectionOutput, Losses, LossSum

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
        keypoints: torch.Tensor | None = None,
        keypoint_loss: KeypointLoss | None = None,
    ) -> torch.Tensor:
        """Costs of every query against every target of the batch: [B, Q, sum_i n_i] in fp32.

        Computed for the whole batch at once (one set of matrix operations), then split per
        image by the caller. fp32 even under autocast: half-precision GIoUs and
        probabilities round ties differently and fp16 costs overflow. With predicted
        `keypoints` [B, Q, K, 7] and a `keypoint_loss`, its matching cost is added (RF-DETR's:
        the keypoint terms weighted as in the loss, the target box's area normalising).
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
            if keypoints is not None and keypoint_loss is not None:
                tgt_keypoints = torch.cat([target_keypoints(t) for t in targets])
                areas = tgt_boxes[:, 2] * tgt_boxes[:, 3]
                cost = cost + keypoint_loss.matching_cost(keypoints.flatten(0, 1), tgt_keypoints, areas)
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
        elif torch.isfinite(boxes[image, query]).all():
            what += " with keypoints holding NaN or inf"
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
        keypoints: torch.Tensor | None = None,
        keypoint_loss: KeypointLoss | None = None,
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
            keypoints, keypoint_loss: predicted keypoints [B, Q, K, 7] and the loss whose
                `matching_cost` prices them (both or neither; the targets then carry keypoints).

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
        cost = self.cost_matrix(logits, boxes, targets, class_loss, keypoints, keypoint_loss).cpu()
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


def target_keypoints(targets: BoxTargets) -> torch.Tensor:
    """One image's keypoints [n, K, 3], or the error for data without them."""
    if targets.keypoints is None:
        raise ValueError(
            "the head predicts keypoints (num_keypoints > 0) but the targets have none: train it on a keypoint "
            "dataset (COCO person_keypoints JSON, YOLO-pose folders), or set the head's num_keypoints to 0"
        )
    return targets.keypoints


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

    In evaluation mode it also gives each term as a `LossSum` (`Losses.sums`): the term
    times what it was divided by, and the count it is a mean over (the batch's target boxes,
    not clamped; for DETR's cross-entropy the class weights of all its queries, the class
    loss's `normalizer`), so that `vitdense.metrics.LossMeans` divides the split's sum by
    the split's count: the same figure for any batch size and number of processes.

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
        keypoint_loss: the keypoint terms for heads that predict keypoints (default
            `KeypointLoss()`, RF-DETR's four terms, in the loss and the matching cost alike);
            used only when the head's output has keypoints.
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
        keypoint_loss: KeypointLoss | None = None,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.matcher = matcher or HungarianMatcher()
        self.eos_coef = eos_coef
        self.weights = {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}
        self.aux_loss = aux_loss
        self.class_loss = class_loss or SoftmaxCrossEntropy(eos_coef)
        self.keypoint_loss = keypoint_loss or KeypointLoss()

    def layer_losses(
        self,
        logits: torch.Tensor,
        boxes: torch.Tensor,
        targets: Sequence[BoxTargets],
        matches: Matches,
        num_boxes: float,
        keypoints: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Unweighted `loss_ce`, `loss_bbox`, `loss_giou` of one decoder layer's predictions
        (logits [B, Q, K + 1] or [B, Q, K], boxes [B, Q, 4]) under the given matching, and
        with its `keypoints` [B, Q, K, 7] the keypoint terms, summed over the matched
        objects and divided by `num_boxes` as the box terms (RF-DETR's)."""
        device = logits.device
        batch_idx, query_idx = self.matched_queries(matches, device)
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
        terms = {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}
        if keypoints is not None:
            matched_keypoints = torch.cat(
                [target_keypoints(t)[j.to(t.boxes.device)] for t, (_, j) in zip(targets, matches, strict=True)]
            )
            per_object = self.keypoint_loss.per_object(
                keypoints[batch_idx, query_idx], matched_keypoints.to(device), matched_boxes[:, 2] * matched_boxes[:, 3]
            )
            terms |= {name: value.sum() / num_boxes for name, value in per_object.items()}
        return terms

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
        in training mode only, and the terms' sums are given in evaluation mode only (see the
        class docstring)."""
        self.check_logits(output)
        with torch.autocast(output.logits.device.type, enabled=False):
            num_boxes = num_target_boxes(targets, output.logits.device, synchronize=self.training)
            # in evaluation, also each term's sum over the batch and the count it is a mean over, for
            # the split's loss: this batch's own boxes, not clamped (an image without boxes adds none)
            count = None if self.training else float(sum(len(t.labels) for t in targets))
            terms: dict[str, torch.Tensor] = {}
            sums: dict[str, LossSum] = {}

            weights = self.weights | self.keypoint_loss.weights

            def supervise(logits, boxes, keypoints, matches: Matches, groups: int, suffix: str) -> None:
                # Group DETR and denoising groups: each group holds every target once, so `groups` times the boxes
                values = self.layer_losses(logits, boxes, targets, matches, num_boxes * groups, keypoints)
                for name, value in values.items():
                    terms[name + suffix] = weights[name] * value
                if count is not None:
                    normalizers = self.normalizers(logits, matches, num_boxes * groups, count * groups)
                    for name in values:
                        divisor, denominator = normalizers[name]
                        sums[name + suffix] = LossSum(terms[name + suffix] * divisor, denominator)

            # each layer's keypoints where the head predicts them (the object queries' decoder
            # layers, the two-stage proposals); the denoising queries learn boxes and classes
            aux_keypoints = output.aux_keypoints or (None,) * len(output.aux)
            layers = [(output.logits, output.boxes, output.keypoints, "")]
            if self.aux_loss:
                layers += [
                    (logits, boxes, keypoints, f"_{i}")
                    for i, ((logits, boxes), keypoints) in enumerate(zip(output.aux, aux_keypoints, strict=True))
                ]
            if output.enc is not None:
                layers.append((*output.enc, output.enc_keypoints, "_enc"))
            for logits, boxes, keypoints, suffix in layers:
                matches = self.matcher(
                    logits, boxes, targets, output.num_groups, self.class_loss, keypoints, self.keypoint_loss
                )
                supervise(logits, boxes, keypoints, matches, output.num_groups, suffix)
            if output.dn is not None:  # denoising queries: their targets are known, no matching
                dn_keypoints = output.dn.keypoints or (None,) * len(output.dn.layers)
                *earlier, last = zip(output.dn.layers, dn_keypoints, strict=True)
                dn_layers = [(*last, "_dn")]
                if self.aux_loss:
                    dn_layers += [(*layer, f"_dn_{i}") for i, layer in enumerate(earlier)]
                for (logits, boxes), keypoints, suffix in dn_layers:
                    supervise(logits, boxes, keypoints, output.dn.matches, output.dn.num_groups, suffix)
            total = torch.stack(list(terms.values())).sum()
        return Losses(total, terms, sums)

    def normalizers(
        self, logits: torch.Tensor, matches: Matches, num_boxes: float, count: float
    ) -> dict[str, tuple[torch.Tensor | float, torch.Tensor | float]]:
        """Per term of a layer, (what `layer_losses` divided its sum by, with `num_boxes`;
        the same for the batch's own box `count`, unclamped), so that term * divisor is the
        batch's sum and the split's sums over the split's denominators are its loss."""
        matched = self.matched_queries(matches, logits.device)
        class_terms = (
            self.class_loss.normalizer(logits, matched, num_boxes),
            self.class_loss.normalizer(logits, matched, count),
        )
        box_terms = ("loss_bbox", "loss_giou", *self.keypoint_loss.weights)  # all sums over matched objects
        return {"loss_ce": class_terms} | {name: (num_boxes, count) for name in box_terms}

    @staticmethod
    def matched_queries(matches: Matches, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch index, query index) [m] of the matched queries, image by image."""
        batch_idx = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(matches)]).to(device)
        return batch_idx, torch.cat([q for q, _ in matches]).to(device)
