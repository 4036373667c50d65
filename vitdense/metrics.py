"""Dataset-level metrics: semantic segmentation with mmseg's definitions, COCO's mAP."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torchmetrics.classification import MulticlassConfusionMatrix
from torchmetrics.detection import MeanAveragePrecision


class SegmentationMetrics(MulticlassConfusionMatrix):
    """Dataset-level mIoU, mean accuracy and pixel accuracy from an accumulated confusion matrix.

    Intersections and unions are summed over every pixel of every image first and divided
    once at the end (the dataset-level IoU of mmseg and Segmenter), not averaged per image.
    Pixels labelled `ignore_index` do not count. Per class c, with the matrix summed over the
    dataset: IoU_c = TP / (TP + FP + FN) and Acc_c = TP / (TP + FN); a class with no pixel in
    either labels or predictions has IoU NaN and is left out of the mean (mmseg's nanmean);
    aAcc = sum TP / labelled pixels.

    `update(preds [N, ...] int, target [N, ...] int)`; `compute()` -> dict with scalars
    "mIoU", "mAcc", "aAcc" and [K] tensors "IoU", "Acc".
    """

    def __init__(self, num_classes: int, ignore_index: int = 255) -> None:
        super().__init__(num_classes=num_classes, ignore_index=ignore_index, validate_args=False)

    def compute(self) -> dict[str, torch.Tensor]:
        cm = self.confmat.double()  # rows: label, columns: prediction
        tp = cm.diag()
        labelled = cm.sum(1)
        union = labelled + cm.sum(0) - tp
        iou = tp / union  # 0/0 -> NaN: class absent from labels and predictions
        acc = tp / labelled
        return {
            "mIoU": iou.nanmean(),
            "mAcc": acc.nanmean(),
            "aAcc": tp.sum() / labelled.sum().clamp(min=1),
            "IoU": iou,
            "Acc": acc,
        }


class DetectionMeanAP(MeanAveragePrecision):
    """torchmetrics' `MeanAveragePrecision` that several processes can share when they hold
    different numbers of images.

    vitdense evaluates every image once, so processes may hold different counts (7 images
    on 2 processes: 4 and 3). torchmetrics gathers a list state element by element, a
    collective per image that then does not match across processes; here each list state is
    gathered whole (`all_gather_object`, on the CPU), in rank order. AP does not depend on
    the order of images.
    """

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        group = process_group or self.process_group
        world = dist.get_world_size(group)
        for attr in self._reductions:
            local = [t.cpu() for t in getattr(self, attr)]
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, local, group=group)
            setattr(self, attr, [t.to(self.device) for part in gathered for t in part])
