"""Semantic segmentation's metrics with mmseg's definitions (mIoU, mAcc, aAcc)."""

from __future__ import annotations

import torch
from torchmetrics.classification import MulticlassConfusionMatrix


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
