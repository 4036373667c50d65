"""`eval`: COCO's AP with per-class figures, vitdense vs torchmetrics vs COCOeval directly."""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from vitdense.bench.common import cpu_kind


def synthetic_detections(
    num_images: int, num_classes: int, detections: int, seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """(predictions, targets) in torchmetrics' format (xyxy pixels) for `num_images` 640 x 480
    images: 7 objects each (COCO's mean), `detections` scored boxes each, a third of them
    near an object (a trained detector's mix of hits and misses)."""
    g = torch.Generator().manual_seed(seed)
    preds, targets = [], []
    size = torch.tensor([640.0, 480.0, 640.0, 480.0])
    for _ in range(num_images):
        xy = torch.rand(7, 2, generator=g) * 0.7
        wh = torch.rand(7, 2, generator=g) * 0.25 + 0.02
        boxes = torch.cat([xy, xy + wh], 1) * size
        labels = torch.randint(num_classes, (7,), generator=g)
        hits = detections // 3
        found = torch.randint(7, (hits,), generator=g)  # the objects hit, each a few pixels off
        near = boxes[found] + torch.randn(hits, 4, generator=g) * 8
        xy = torch.rand(detections - hits, 2, generator=g) * 0.8
        far = torch.cat([xy, xy + torch.rand(detections - hits, 2, generator=g) * 0.2 + 0.01], 1) * size
        det_boxes = torch.cat([near, far]).clamp(min=0)
        det_boxes[:, 2:] = torch.maximum(det_boxes[:, 2:], det_boxes[:, :2] + 1)
        det_labels = torch.cat([labels[found], torch.randint(num_classes, (detections - hits,), generator=g)])
        # hits score higher on average, as a detector's do
        scores = torch.cat([torch.rand(hits, generator=g) * 0.5 + 0.5, torch.rand(detections - hits, generator=g)])
        preds.append({"boxes": det_boxes, "scores": scores, "labels": det_labels})
        targets.append({"boxes": boxes, "labels": labels})
    return preds, targets


def cocoeval_directly(preds: list[dict], targets: list[dict], backend: str) -> tuple[float, float]:
    """(seconds, AP) of `backend`'s COCOeval run directly on the same boxes (COCO's xywh), as
    COCO's own scripts run it: the dataset and results built in memory, evaluate, accumulate,
    summarize; all classes at once (no per-class figures)."""
    import io

    if backend == "faster_coco_eval":
        from faster_coco_eval import COCO
        from faster_coco_eval import COCOeval_faster as COCOeval
    else:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    start = time.perf_counter()
    images, annotations, results = [], [], []
    for i, (p, t) in enumerate(zip(preds, targets, strict=True)):
        images.append({"id": i, "width": 640, "height": 480})
        for box, label in zip(t["boxes"].tolist(), t["labels"].tolist(), strict=True):
            w, h = box[2] - box[0], box[3] - box[1]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i,
                    "category_id": label,
                    "bbox": [box[0], box[1], w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
        for box, score, label in zip(p["boxes"].tolist(), p["scores"].tolist(), p["labels"].tolist(), strict=True):
            results.append(
                {
                    "image_id": i,
                    "category_id": label,
                    "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                    "score": score,
                }
            )
    categories = sorted({a["category_id"] for a in annotations} | {r["category_id"] for r in results})
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {"images": images, "annotations": annotations, "categories": [{"id": c} for c in categories]}
        gt.createIndex()
        evaluator = COCOeval(gt, gt.loadRes(results), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return time.perf_counter() - start, float(evaluator.stats[0])


def bench_eval(args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """(seconds, AP) of each way to get COCO's AP with per-class figures on the same set."""
    from torchmetrics.detection import MeanAveragePrecision

    from vitdense.metrics.detection import DetectionMeanAP

    preds, targets = synthetic_detections(args.images, args.classes, args.detections)
    results = {}
    for backend in args.backends:
        results[f"COCOeval ({backend}), no per-class"] = cocoeval_directly(preds, targets, backend)
        metrics = {
            f"torchmetrics ({backend})": MeanAveragePrecision(class_metrics=True, backend=backend),
            f"vitdense DetectionMeanAP ({backend})": DetectionMeanAP(class_metrics=True, backend=backend),
        }
        for name, metric in metrics.items():
            start = time.perf_counter()
            metric.update(preds, targets)
            ap = float(metric.compute()["map"])
            results[name] = (time.perf_counter() - start, ap)
    return results


def print_eval(args: argparse.Namespace, results: dict[str, tuple[float, float]]) -> None:
    print(
        f"COCO AP (bbox) of {args.images} images, 7 objects and {args.detections} detections each, {args.classes} "
        f"classes, per-class AP on except where said, on {cpu_kind()} (one process)"
    )
    first = next(iter(results.values()))[0]
    print(f"{'':44}{'seconds':>10}{'speed-up':>10}{'AP':>10}")
    for name, (seconds, ap) in results.items():
        print(f"{name:44}{seconds:10.1f}{first / seconds:10.2f}{ap:10.4f}")
