"""Dataset-level metrics: semantic segmentation with mmseg's definitions, COCO's mAP."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
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


#: COCOeval's IoU and recall thresholds, made as pycocotools' `Params.setDetParams` makes them
#: (float64 `np.linspace`): 0.50:0.05:0.95 and 0:0.01:1
COCO_IOU_THRESHOLDS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True).tolist()
COCO_REC_THRESHOLDS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True).tolist()


class DetectionMeanAP(MeanAveragePrecision):
    """torchmetrics' `MeanAveragePrecision` with COCOeval's own thresholds, which several
    processes can share when they hold different numbers of images.

    torchmetrics 1.9 makes its default thresholds with `torch.linspace` in float32 and hands
    them to COCOeval as such (recall 0.07000000029802322 for 0.07): wherever a class's recall
    lands exactly on the 0.01 grid (5 or 10 objects of a class in an area range) COCOeval
    then reads the precision of the next recall point, and the AP differs from COCO's own
    evaluation. The defaults here are COCO's float64 thresholds; with them every number
    equals COCOeval's run directly (tested, both backends).

    vitdense evaluates every image once, so processes may hold different counts (7 images
    on 2 processes: 4 and 3). torchmetrics gathers a list state element by element, a
    collective per image that then does not match across processes; here each list state is
    gathered whole (`all_gather_object`, on the CPU), in rank order. AP does not depend on
    the order of images.

    Args: as `MeanAveragePrecision`'s; `iou_thresholds` and `rec_thresholds` default to
    COCO's (`COCO_IOU_THRESHOLDS`, `COCO_REC_THRESHOLDS`).
    """

    def __init__(
        self,
        box_format: Literal["xyxy", "xywh", "cxcywh"] = "xyxy",
        iou_type: Literal["bbox", "segm"] | tuple[Literal["bbox", "segm"], ...] = "bbox",
        iou_thresholds: list[float] | None = None,
        rec_thresholds: list[float] | None = None,
        max_detection_thresholds: list[int] | None = None,
        class_metrics: bool = False,
        backend: Literal["pycocotools", "faster_coco_eval"] = "pycocotools",
        **kwargs: Any,  # torchmetrics' `Metric` options (compute_on_cpu, process_group, ...)
    ) -> None:
        super().__init__(
            box_format=box_format,
            iou_type=iou_type,
            iou_thresholds=list(COCO_IOU_THRESHOLDS) if iou_thresholds is None else iou_thresholds,
            rec_thresholds=list(COCO_REC_THRESHOLDS) if rec_thresholds is None else rec_thresholds,
            max_detection_thresholds=max_detection_thresholds,
            class_metrics=class_metrics,
            backend=backend,
            **kwargs,
        )

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        group = process_group or self.process_group
        world = dist.get_world_size(group)
        for attr in self._reductions:
            local = [t.cpu() for t in getattr(self, attr)]
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, local, group=group)
            setattr(self, attr, [t.to(self.device) for part in gathered for t in part])
