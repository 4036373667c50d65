"""Metrics of universal segmentation: panoptic quality as cocodataset/panopticapi computes
it, and COCO's mask AP as pycocotools' COCOeval computes it on a results file.

Both work on contiguous class indices 0..K-1 (`SegmentTargets.labels`, the predictions'
labels); the dataset's own category ids are only met when reading annotations and writing
files (`vitdense.results.universal`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torchmetrics import Metric

from vitdense.core.errors import ConfigError
from vitdense.metrics.detection import DetectionMeanAP
from vitdense.types import InstanceMasks, PanopticSegments, SegmentTargets

#: compute()'s summary figures: (PQ, SQ, RQ) over all classes, things (`_th`) and stuff (`_st`)
PQ_KEYS = ("PQ", "SQ", "RQ", "PQ_th", "SQ_th", "RQ_th", "PQ_st", "SQ_st", "RQ_st")


class PanopticQuality(Metric):
    """Panoptic quality (Kirillov et al.) with panopticapi's `pq_compute` rules, image by image:

    - a predicted and a ground-truth segment of the same class match when IoU > 0.5, where
      the union leaves out the prediction's pixels on void (unlabelled) ground truth; a
      match adds its IoU and a true positive to the class;
    - crowd regions are never matched; an unmatched non-crowd segment of the ground truth is
      a false negative;
    - an unmatched prediction is a false positive unless more than half of it lies on void
      or on the crowd region of its class (panopticapi keeps one crowd region per class and
      image: the last of them in the annotation's order);
    - per class: PQ = sum IoU / (TP + FP/2 + FN/2), SQ = sum IoU / TP (0 without TP),
      RQ = TP / (TP + FP/2 + FN/2); a summary averages the classes with TP + FP + FN > 0
      (NaN when none has: panopticapi divides by zero there).

    The ground truth's segment areas are its masks' pixel counts (COCO panoptic's `area`
    fields are those counts; panopticapi reads them from the JSON). torchmetrics'
    `PanopticQuality` treats void and crowds otherwise.

    The states are per-class sums (IoU, TP, FP, FN) added over processes, so that any
    number of processes, holding any share of the images, gives one process's figures.

    `update(preds, targets)` takes each image's `PanopticSegments` and its `SegmentTargets`
    at the same (original) size; `compute()` returns `PQ_KEYS` as scalars and
    "PQ_per_class", "SQ_per_class", "RQ_per_class" as [K] (0 for a class with neither
    ground truth nor predictions, as panopticapi), all float64 in [0, 1].

    Args:
        num_classes: K.
        is_thing: K flags, True for thing classes (counted in `_th`), False for stuff.
        class_names: K names, for `format_table`; default "0".."K-1".
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True
    iou: torch.Tensor
    tp: torch.Tensor
    fp: torch.Tensor
    fn: torch.Tensor

    def __init__(
        self,
        num_classes: int,
        is_thing: Sequence[bool],
        class_names: Sequence[str] | None = None,
        **kwargs: Any,  # torchmetrics' `Metric` options (compute_on_cpu, process_group, ...)
    ) -> None:
        super().__init__(**kwargs)
        if len(is_thing) != num_classes:
            raise ConfigError(f"PanopticQuality: is_thing has {len(is_thing)} flags for num_classes={num_classes}")
        if class_names is not None and len(class_names) != num_classes:
            raise ConfigError(
                f"PanopticQuality: class_names has {len(class_names)} names for num_classes={num_classes}"
            )
        self.num_classes = num_classes
        self.is_thing = [bool(t) for t in is_thing]
        self.class_names = list(class_names) if class_names is not None else [str(c) for c in range(num_classes)]
        # float64 sums: a dataset's IoU sum and counts stay exact enough to equal panopticapi's Python floats
        self.add_state("iou", torch.zeros(num_classes, dtype=torch.float64), dist_reduce_fx="sum")
        for name in ("tp", "fp", "fn"):
            self.add_state(name, torch.zeros(num_classes, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, preds: Sequence[PanopticSegments], targets: Sequence[SegmentTargets]) -> None:
        """Add images: `preds[i]` and `targets[i]` at the same size (H, W)."""
        if len(preds) != len(targets):
            raise ValueError(f"PanopticQuality.update: {len(preds)} predictions for {len(targets)} targets")
        # every image checked before any is added: a refused call changes nothing
        stats = [
            self._image_stats(pred, target, i) for i, (pred, target) in enumerate(zip(preds, targets, strict=True))
        ]
        for iou, tp, fp, fn in stats:
            self.iou += iou
            self.tp += tp
            self.fp += fp
            self.fn += fn

    def _image_stats(
        self, pred: PanopticSegments, target: SegmentTargets, i: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """[K] IoU sum, TP, FP, FN of one image (panopticapi's `pq_compute_single_core` body)."""
        k, device = self.num_classes, self.iou.device
        gt_index = _segment_index(target, i).to(device)  # [H, W] 0 void, 1..m
        pred_index = _pred_index(pred, tuple(gt_index.shape), i).to(device)  # [H, W] 0 void, 1..n
        gt_labels, pred_labels = target.labels.to(device), pred.labels.to(device)
        for name, labels in (("targets", gt_labels), ("preds", pred_labels)):
            if len(labels) and (labels.min() < 0 or labels.max() >= k):
                raise ValueError(
                    f"PanopticQuality.update: {name}[{i}].labels has {labels.min().item()}..{labels.max().item()}, "
                    f"outside 0..{k - 1}: labels are contiguous class indices (map the dataset's category ids "
                    f"to them when reading annotations)"
                )
        crowd = target.iscrowd.to(device).bool()
        m, n = len(gt_labels), len(pred_labels)

        # pixels of each (gt, pred) pair, row 0 / column 0 void
        joint = torch.bincount((gt_index * (n + 1) + pred_index).flatten(), minlength=(m + 1) * (n + 1))
        joint = joint.reshape(m + 1, n + 1)
        gt_area, pred_area = joint.sum(1)[1:], joint.sum(0)[1:]
        inter = joint[1:, 1:]  # [m, n]
        pred_on_void = joint[0, 1:]  # [n]

        union = pred_area[None, :] + gt_area[:, None] - inter - pred_on_void[None, :]
        iou = inter.double() / union.clamp(min=1).double()
        match = (iou > 0.5) & (gt_labels[:, None] == pred_labels[None, :]) & ~crowd[:, None]
        # IoU > 0.5 makes matches one-to-one (neither side's segments overlap)
        gt_matched, pred_matched = match.any(1), match.any(0)

        image_iou = torch.zeros(k, dtype=torch.float64, device=device)
        image_iou.index_add_(0, gt_labels[gt_matched], torch.where(match, iou, 0.0).sum(1)[gt_matched])
        tp = torch.bincount(gt_labels[gt_matched], minlength=k)
        fn = torch.bincount(gt_labels[~gt_matched & ~crowd], minlength=k)

        # the crowd region of each class: the last one of the class in the annotation
        crowd_rows = torch.full((k,), -1, dtype=torch.int64, device=device)
        rows = torch.arange(m, device=device)
        crowd_rows.scatter_reduce_(0, gt_labels[crowd], rows[crowd], reduce="amax")
        row_of_pred = crowd_rows[pred_labels]  # [n], -1: no crowd of the pred's class
        on_crowd = torch.where(row_of_pred >= 0, inter[row_of_pred.clamp(min=0), torch.arange(n, device=device)], 0)
        ignored = (pred_on_void + on_crowd).double() / pred_area.double() > 0.5
        fp = torch.bincount(pred_labels[~pred_matched & ~ignored], minlength=k)
        return image_iou, tp, fp, fn

    def compute(self) -> dict[str, torch.Tensor]:
        iou, tp, fp, fn = self.iou, self.tp.double(), self.fp.double(), self.fn.double()
        present = (self.tp + self.fp + self.fn) > 0
        denominator = (tp + 0.5 * fp + 0.5 * fn).clamp(min=0.5)  # > 0 wherever the class is present
        pq = torch.where(present, iou / denominator, 0.0)
        sq = torch.where(self.tp > 0, iou / tp.clamp(min=1), 0.0)
        rq = torch.where(present, tp / denominator, 0.0)
        things = torch.tensor(self.is_thing, device=present.device)
        out: dict[str, torch.Tensor] = {}
        for suffix, group in (("", torch.ones_like(things)), ("_th", things), ("_st", ~things)):
            counted = present & group
            for name, values in (("PQ", pq), ("SQ", sq), ("RQ", rq)):
                out[f"{name}{suffix}"] = values[counted].sum() / counted.sum()  # 0 / 0: NaN
        out.update(PQ_per_class=pq, SQ_per_class=sq, RQ_per_class=rq)
        return out

    def format_table(self, result: dict[str, torch.Tensor]) -> str:
        """panopticapi's summary (PQ, SQ, RQ in %, N classes counted) and a row per class."""
        present = ((self.tp + self.fp + self.fn) > 0).tolist()
        counts = {"": sum(present)}
        counts["_th"] = sum(p and t for p, t in zip(present, self.is_thing, strict=True))
        counts["_st"] = counts[""] - counts["_th"]
        rows = [f"{'':<24}{'PQ':>8}{'SQ':>8}{'RQ':>8}{'N':>6}"]
        for title, suffix in (("All", ""), ("Things", "_th"), ("Stuff", "_st")):
            figures = "".join(f"{100 * result[f'{key}{suffix}'].item():8.2f}" for key in ("PQ", "SQ", "RQ"))
            rows.append(f"{title:<24}{figures}{counts[suffix]:6d}")
        rows.append(f"{'class':<24}{'PQ':>8}{'SQ':>8}{'RQ':>8}{'thing':>6}")
        per_class = zip(
            self.class_names,
            result["PQ_per_class"].tolist(),
            result["SQ_per_class"].tolist(),
            result["RQ_per_class"].tolist(),
            self.is_thing,
            strict=True,
        )
        for name, pq, sq, rq, thing in per_class:
            rows.append(f"{name:<24}{100 * pq:8.2f}{100 * sq:8.2f}{100 * rq:8.2f}{'yes' if thing else 'no':>6}")
        return "\n".join(rows)


def _segment_index(target: SegmentTargets, i: int) -> torch.Tensor:
    """[H, W] int64: 0 on void, 1 + the index of the segment covering the pixel."""
    masks = target.masks
    if masks.dim() != 3 or masks.dtype != torch.bool:
        raise ValueError(
            f"PanopticQuality.update: targets[{i}].masks must be [n, H, W] bool; got {masks.dtype} {tuple(masks.shape)}"
        )
    if not len(target.labels) == len(target.iscrowd) == len(masks):
        raise ValueError(
            f"PanopticQuality.update: targets[{i}] has {len(masks)} masks, {len(target.labels)} labels and "
            f"{len(target.iscrowd)} iscrowd flags: one of each per segment"
        )
    if len(masks) == 0:
        return torch.zeros(masks.shape[-2:], dtype=torch.int64, device=masks.device)
    layers = masks.sum(0)
    if layers.max() > 1:
        raise ValueError(
            f"PanopticQuality.update: targets[{i}].masks overlap on {int((layers > 1).sum())} pixels; panoptic "
            f"segments cover each pixel once at most (void: none)"
        )
    return torch.where(layers > 0, masks.byte().argmax(0) + 1, 0)


def _pred_index(pred: PanopticSegments, size: tuple[int, int], i: int) -> torch.Tensor:
    """[H, W] int64: 0 where `pred.id_map` is 0, else 1 + the position of the pixel's id in `pred.ids`."""
    id_map, ids = pred.id_map, pred.ids
    if tuple(id_map.shape) != size:
        raise ValueError(
            f"PanopticQuality.update: preds[{i}].id_map is {tuple(id_map.shape)} but targets[{i}].masks are {size}: "
            f"resize the prediction to the annotation's size (the image's orig_sizes) before the metric"
        )
    if not len(ids) == len(pred.labels):
        raise ValueError(f"PanopticQuality.update: preds[{i}] has {len(ids)} ids for {len(pred.labels)} labels")
    if len(ids) and (ids.min() <= 0 or len(ids.unique()) != len(ids)):
        raise ValueError(f"PanopticQuality.update: preds[{i}].ids must be distinct and > 0 (0 is void); got {ids}")
    flat = id_map.flatten()
    if len(ids):
        order = ids.argsort().to(id_map.device)
        sorted_ids = ids.to(id_map.device)[order]
        pos = torch.searchsorted(sorted_ids, flat).clamp(max=len(ids) - 1)
        known = sorted_ids[pos] == flat
        index = torch.where(known, order[pos] + 1, 0)
    else:
        known, index = torch.zeros_like(flat, dtype=torch.bool), torch.zeros_like(flat)
    if bool(((flat != 0) & ~known).any()):
        stray = flat[(flat != 0) & ~known].unique()[:5].tolist()
        raise ValueError(f"PanopticQuality.update: preds[{i}].id_map has segment ids {stray} not in preds[{i}].ids")
    area = torch.bincount(index, minlength=len(ids) + 1)[1:]
    if bool((area == 0).any()):
        missing = ids[(area == 0).to(ids.device)].tolist()
        raise ValueError(
            f"PanopticQuality.update: preds[{i}] lists segments {missing} that cover no pixel of id_map; drop "
            f"them (panopticapi refuses such a prediction)"
        )
    return index.reshape(size)


class InstanceMeanAP(DetectionMeanAP):
    """COCO's mask AP as pycocotools' COCOeval computes it on a results file (all 12 numbers,
    and per class with `class_metrics`), for `InstanceMasks` against `SegmentTargets`.

    torchmetrics' `MeanAveragePrecision(iou_type="segm")` (1.9) leaves out of its COCO
    ground-truth set every image without a ground-truth mask, and COCOeval evaluates only the
    images of the ground-truth set: the predictions on such an image are dropped instead of
    counted as false positives, and AP comes out higher than COCO's evaluation of the same
    predictions. `update` gives such an image with predictions an empty crowd region of a
    predicted class: the image is then evaluated, and the region, an ignored ground truth
    that no prediction overlaps, changes no count. The rest is `DetectionMeanAP`'s (COCO's
    float64 thresholds; gt `area` the annotation's, as COCOeval reads it; per-image lists
    gathered whole across processes, the masks' RLE tuples included).

    Args: `backend`, `class_metrics` and torchmetrics' `Metric` options, as `DetectionMeanAP`'s.
    """

    def __init__(
        self,
        class_metrics: bool = False,
        backend: Literal["pycocotools", "faster_coco_eval"] = "pycocotools",
        **kwargs: Any,
    ) -> None:
        super().__init__(iou_type="segm", class_metrics=class_metrics, backend=backend, **kwargs)

    def update(  # type: ignore[override]
        self, preds: Sequence[InstanceMasks], targets: Sequence[SegmentTargets]
    ) -> None:
        """Add images: `preds[i]` at the size of `targets[i]` (the annotation's)."""
        tm_preds, tm_targets = instance_ap_inputs(preds, targets)
        super().update(tm_preds, tm_targets)


def instance_ap_inputs(
    preds: Sequence[InstanceMasks], targets: Sequence[SegmentTargets]
) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    """torchmetrics' `MeanAveragePrecision(iou_type="segm")` inputs (CPU tensors) of images'
    instances and annotations, with the empty crowd region `InstanceMeanAP` explains on each
    image that has predictions but no ground truth.

    Args:
        preds: per image, `InstanceMasks` at the annotation's size.
        targets: per image, the annotation (`SegmentTargets` with iscrowd and, for COCO's
            small / medium / large, the annotation's `area`; without it the masks' pixel counts).
    """
    if len(preds) != len(targets):
        raise ValueError(f"InstanceMeanAP.update: {len(preds)} predictions for {len(targets)} targets")
    tm_preds, tm_targets = [], []
    for i, (pred, target) in enumerate(zip(preds, targets, strict=True)):
        masks = target.masks.cpu()
        if masks.dim() != 3 or pred.masks.dim() != 3 or pred.masks.shape[-2:] != masks.shape[-2:]:
            raise ValueError(
                f"InstanceMeanAP.update: preds[{i}].masks {tuple(pred.masks.shape)} and targets[{i}].masks "
                f"{tuple(masks.shape)} must be [k, H, W] and [n, H, W] at the same size: resize the prediction "
                f"to the annotation's size (the image's orig_sizes)"
            )
        labels, iscrowd = target.labels.cpu().long(), target.iscrowd.cpu().long()
        # float64: an annotation's area just above 32² or 96² stays in its COCO size range
        area = target.area.cpu().double() if target.area is not None else masks.flatten(1).sum(1).double()
        if len(labels) == 0 and len(pred.labels) > 0:
            masks = torch.zeros(1, *masks.shape[-2:], dtype=torch.bool)
            labels = pred.labels[:1].cpu().long()
            iscrowd, area = torch.ones(1, dtype=torch.int64), torch.zeros(1, dtype=torch.float64)
        tm_targets.append({"masks": masks.bool(), "labels": labels, "iscrowd": iscrowd, "area": area})
        tm_preds.append(
            {"masks": pred.masks.cpu().bool(), "labels": pred.labels.cpu().long(), "scores": pred.scores.cpu().float()}
        )
    return tm_preds, tm_targets
