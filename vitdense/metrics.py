"""Dataset-level metrics: semantic segmentation with mmseg's definitions, COCO's mAP, and
the mean evaluation loss."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torchmetrics import Metric
from torchmetrics.classification import MulticlassConfusionMatrix
from torchmetrics.detection import MeanAveragePrecision

from vitdense.types import Losses


class WeightedMean(Metric):
    """sum(value * weight) / sum(weight) over every update, each update adding a sum of
    weighted values and the sum of their weights (a mean `v` over `w` items: `v * w, w`; a
    `LossSum` as it is), the sums added over processes at `compute` (one collective per
    state, none per update). A NaN value makes the mean NaN; no weight at all (a split
    without a labelled pixel or a target box) gives the sum itself, 0 for such losses, as
    DETR's box count clamped at 1 does.

    torchmetrics' `MeanMetric` either drops NaN values (a diverged loss would look finite)
    or, with `nan_strategy="disable"`, drops the weights (torchmetrics 1.9,
    Lightning-AI/torchmetrics#3434).

    Args:
        dtype: of the sums; float64 by default, so that a split's pixel count (5e8 for
            ADE20K's validation) stays exact (float32 holds integers up to 1.7e7 only).
    """

    full_state_update = False

    def __init__(self, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.add_state("total", torch.zeros((), dtype=dtype), dist_reduce_fx="sum")
        self.add_state("weight", torch.zeros((), dtype=dtype), dist_reduce_fx="sum")

    def update(self, total: torch.Tensor | float, weight: torch.Tensor | float) -> None:
        """Add scalars: `total`, a sum of values times their weights, and `weight`, the sum of the weights."""
        self.total += torch.as_tensor(total).detach().to(self.total)
        self.weight += torch.as_tensor(weight).detach().to(self.weight)

    def compute(self) -> torch.Tensor:
        return torch.where(self.weight == 0, self.total, self.total / self.weight)


class LossMeans:
    """Evaluation losses as the dataset's: every term (and the total), summed over every
    batch of every process and divided once.

    A loss given with a `LossSum` (`Losses.sums`: segmentation's summed pixel cross-entropy
    and its labelled pixels; each DETR term's sum and its target boxes or query weights)
    is the split's summed numerators over its summed denominators: the same on any number
    of processes and for any batch size, and, on one batch, the batch's own value. Any
    other loss is taken as a mean over its batch's images and weighted by them (`weight`),
    which gives the dataset's mean for per-image means (cross-entropy). A total left out of
    `sums` whose terms are all in it is their sum (`{stage}/loss` = sum of the term figures).

    Lightning's `self.log(..., on_epoch=True, sync_dist=True)` is not the dataset's mean
    when processes hold different numbers of images (21 images on 2 processes: 11 and 10):
    it averages the processes' integer image counts in place, which floors them (10.5 -> 10),
    so the loss comes out N / (W * floor(N / W)) too high, 21/20 here (Lightning 2.6,
    Lightning-AI/pytorch-lightning#21859). Here each `{stage}/{name}` is a `WeightedMean`:
    `update` adds to sums on this process (no collective per step, so processes may run
    different numbers of steps); `pop` adds the sums over processes once, at epoch end, and
    starts the stage afresh. Every process must call `pop` for a stage it has updated, with
    the same names (a task's terms are the same on every batch).
    """

    def __init__(self) -> None:
        self._means: dict[str, WeightedMean] = {}
        self._totals_of_terms: set[str] = set()  # stages whose total is the sum of its terms' figures

    def update(self, stage: str, losses: Losses, weight: int) -> None:
        """Add a batch's `losses` (`{stage}/loss` and `{stage}/{term}`): each `LossSum` of
        `losses.sums` whole, every other loss weighted by `weight` (the batch's images)."""
        values = {"loss": losses.total, **losses.terms}
        if losses.sums and "loss" not in losses.sums:
            if missing := sorted(set(losses.terms) - set(losses.sums)):
                raise ValueError(f"Losses.sums has no LossSum for {missing}: the total cannot be the sum of its terms")
            self._totals_of_terms.add(stage)
            del values["loss"]
        for name, value in values.items():
            key = f"{stage}/{name}"
            if key not in self._means:  # on the loss's device: the reduction runs where the states live
                dtype = torch.float32 if value.device.type == "mps" else torch.float64  # MPS has no float64
                self._means[key] = WeightedMean(dtype).to(value.device)
            mean = self._means[key]
            # a mean over the batch's images as its sum, in the sums' precision
            numerator, denominator = losses.sums.get(name, (value.detach().to(mean.total.dtype) * weight, weight))
            mean.update(numerator, denominator)

    def pop(self, stage: str) -> dict[str, torch.Tensor]:
        """The stage's figures over the epoch and every process (`{stage}/loss` first, float32),
        then forgotten. Empty when the stage logged no loss."""
        out = {}
        for key in [k for k in self._means if k.startswith(f"{stage}/")]:
            out[key] = self._means.pop(key).compute()  # torchmetrics adds the sums over processes
        if stage in self._totals_of_terms:
            self._totals_of_terms.remove(stage)
            out = {f"{stage}/loss": torch.stack(list(out.values())).sum(), **out}
        return {key: value.float() for key, value in out.items()}


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

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        group = process_group or self.process_group
        world = dist.get_world_size(group)
        for attr in self._reductions:
            # (segm states hold the masks' RLE as tuples, which stay as they are)
            local = [t.cpu() if isinstance(t, torch.Tensor) else t for t in getattr(self, attr)]
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, local, group=group)
            merged = [t for part in gathered for t in part]
            setattr(self, attr, [t.to(self.device) if isinstance(t, torch.Tensor) else t for t in merged])


def _mean_of_valid(values: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [K] float32: the mean over N of the entries > -1 per column (COCOeval's "no
    ground truth" marker), -1 where a column has none, as COCOeval's `summarize`."""
    valid = values > -1
    total = torch.where(valid, values, 0).double().sum(0)
    count = valid.sum(0)
    return torch.where(count > 0, total / count.clamp(min=1), -1.0).float()
