"""Detection's mean average precision, COCO's definition (checked against pycocotools)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from torchmetrics.detection import MeanAveragePrecision

from vitdense.metrics.common import WholeListGather

#: COCOeval's IoU and recall thresholds, made as pycocotools' `Params.setDetParams` makes them
#: (float64 `np.linspace`): 0.50:0.05:0.95 and 0:0.01:1
COCO_IOU_THRESHOLDS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True).tolist()
COCO_REC_THRESHOLDS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True).tolist()


class DetectionMeanAP(WholeListGather, MeanAveragePrecision):
    """torchmetrics' `MeanAveragePrecision` with COCOeval's own thresholds, which several
    processes can share when they hold different numbers of images.

    torchmetrics 1.9 makes its default thresholds with `torch.linspace` in float32 and hands
    them to COCOeval as such (recall 0.07000000029802322 for 0.07): wherever a class's recall
    lands exactly on the 0.01 grid (5 or 10 objects of a class in an area range) COCOeval
    then reads the precision of the next recall point, and the AP differs from COCO's own
    evaluation. The defaults here are COCO's float64 thresholds; with them every number
    equals COCOeval's run directly (tested, both backends).

    vitdense evaluates every image once, so processes may hold different counts (7 images
    on 2 processes: 4 and 3): each list state is gathered whole, in rank order
    (`WholeListGather`), where torchmetrics gathers it element by element, a collective per
    image that then does not match across processes. AP does not depend on the order of
    images.

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

    def compute(self) -> dict[str, torch.Tensor]:
        """torchmetrics' figures; with `class_metrics`, the per-class AP and AR@max are read
        from the one COCOeval run's precision and recall arrays, as COCOeval's `summarize`
        reads them for one category, where torchmetrics runs COCOeval again for every class
        (most of the time on sets with many classes). The same numbers (tested): COCOeval
        evaluates each (image, category) pair on its own, so one category's entries do not
        depend on the others'."""
        if not self.class_metrics or self.average != "macro" or len(self.iou_type) != 1:
            return super().compute()
        extended = self.extended_summary
        self.class_metrics, self.extended_summary = False, True
        try:
            result = super().compute()
        finally:
            self.class_metrics, self.extended_summary = True, extended
        mar_key = f"mar_{self.max_detection_thresholds[-1]}_per_class"
        if "precision" in result:
            precision, recall = result["precision"], result["recall"]  # [T, R, K, A, M], [T, K, A, M]
            # area "all" (index 0) at the largest max-detections (last), as summarize's stats[0] and [8]
            result["map_per_class"] = _mean_of_valid(precision[:, :, :, 0, -1].flatten(0, 1))
            result[mar_key] = _mean_of_valid(recall[:, :, 0, -1])
        else:  # no image or no detection: torchmetrics' -1
            result["map_per_class"] = result[mar_key] = torch.tensor([-1.0])
        if not extended:
            for key in ("ious", "precision", "recall", "scores"):
                result.pop(key, None)
        return result


def _mean_of_valid(values: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [K] float32: the mean over N of the entries > -1 per column (COCOeval's "no
    ground truth" marker), -1 where a column has none, as COCOeval's `summarize`."""
    valid = values > -1
    total = torch.where(valid, values, 0).double().sum(0)
    count = valid.sum(0)
    return torch.where(count > 0, total / count.clamp(min=1), -1.0).float()
