"""Segmentation metrics equal a direct NumPy computation of dataset-level IoU (mmseg's definitions);
COCO's AP equals pycocotools' COCOeval run directly."""

import json

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval, Params

from vitdense.metrics.detection import DetectionMeanAP
from vitdense.metrics.segmentation import SegmentationMetrics


def numpy_reference(preds, targets, num_classes, ignore_index):
    """Intersections and unions summed over all images, then divided; NaN classes dropped."""
    inter = np.zeros(num_classes)
    union = np.zeros(num_classes)
    labelled = np.zeros(num_classes)
    for p, t in zip(preds, targets, strict=True):
        keep = t != ignore_index
        p, t = p[keep], t[keep]
        for c in range(num_classes):
            inter[c] += np.sum((p == c) & (t == c))
            union[c] += np.sum((p == c) | (t == c))
            labelled[c] += np.sum(t == c)
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = inter / union
        acc = inter / labelled
    return np.nanmean(iou), np.nanmean(acc), inter.sum() / labelled.sum(), iou


def test_dataset_level_iou_matches_numpy():
    rng = np.random.default_rng(0)
    k, ignore = 6, 255
    preds, targets = [], []
    for h, w in [(17, 23), (40, 31), (8, 9)]:  # images of different sizes, as in evaluation
        t = rng.integers(0, k - 1, (h, w))  # class 5 never labelled ...
        t[rng.random((h, w)) < 0.2] = ignore
        p = np.where(rng.random((h, w)) < 0.6, t, rng.integers(0, k - 1, (h, w)))  # ... nor predicted
        p[p == ignore] = 0
        p[0, 0] = 4  # a prediction on an ignored or mismatched pixel
        preds.append(p)
        targets.append(t)
    metric = SegmentationMetrics(k, ignore)
    for p, t in zip(preds, targets, strict=True):
        metric.update(torch.from_numpy(p), torch.from_numpy(t))
    result = metric.compute()
    miou, macc, aacc, iou = numpy_reference(preds, targets, k, ignore)
    assert np.isnan(iou[5]) and torch.isnan(result["IoU"][5])  # absent class: left out of the mean
    np.testing.assert_allclose(result["IoU"].numpy()[:5], iou[:5], rtol=1e-12)
    np.testing.assert_allclose(result["mIoU"].item(), miou, rtol=1e-12)
    np.testing.assert_allclose(result["mAcc"].item(), macc, rtol=1e-12)
    np.testing.assert_allclose(result["aAcc"].item(), aacc, rtol=1e-12)
    # averaging per-image IoUs would give another number: the metric must not do that
    per_image = np.nanmean([numpy_reference([p], [t], k, ignore)[0] for p, t in zip(preds, targets, strict=True)])
    assert abs(per_image - miou) > 1e-3


# --- COCO's AP ---------------------------------------------------------------------------------

#: COCO's small / medium / large areas (pixels, of the annotation's `area`)
SMALL, MEDIUM, LARGE = (8, 20), (40, 60), (110, 160)


def grid_coco(rng: np.random.Generator) -> tuple[dict, list[dict]]:
    """A COCO-format set whose recalls land on COCOeval's 0.01 grid, and detections for it.

    Non-dense category ids (2, 7, 13), images of mixed sizes with non-dense ids, annotation
    areas that are pixel counts (not w * h), crowd regions, and per class exactly 5, 10 or 4
    objects in one area range (recalls 0.2, 0.1, 0.25, ... are then reached exactly).
    Boxes and scores are integers / multiples of 2^-10, so every backend reads the same values.
    """
    sizes = [(640, 480), (320, 240), (500, 375), (300, 200), (800, 600), (240, 320), (400, 400)]
    images = [{"id": 10 * i + 3, "width": w, "height": h, "file_name": f"{i}.jpg"} for i, (w, h) in enumerate(sizes)]
    # (category id, side range, count): 5 medium, 10 small, 4 large, and a few of the others
    plan = [(2, MEDIUM, 5), (7, SMALL, 10), (13, LARGE, 4), (2, SMALL, 3), (7, MEDIUM, 4), (13, MEDIUM, 2)]
    annotations: list[dict] = []
    for cat, (lo, hi), count in plan:
        for _ in range(count):
            img = images[int(rng.integers(len(images)))]
            w, h = (int(v) for v in rng.integers(lo, hi, 2))
            x, y = int(rng.integers(0, img["width"] - w)), int(rng.integers(0, img["height"] - h))
            area = float(int(w * h * rng.uniform(0.8, 0.95)))  # a mask's pixel count is less than its box
            annotations.append({"image_id": img["id"], "category_id": cat, "bbox": [x, y, w, h], "area": area})
    for img, cat in ((images[0], 2), (images[3], 7)):  # crowd regions, and detections that fall into them
        w, h = img["width"] // 2, img["height"] // 2
        annotations.append({"image_id": img["id"], "category_id": cat, "bbox": [0, 0, w, h], "area": float(w * h)})
        annotations[-1]["iscrowd"] = 1
    for i, a in enumerate(annotations):
        a.update(id=100 + 7 * i, iscrowd=a.get("iscrowd", 0))
    gt = {"images": images, "annotations": annotations, "categories": [{"id": c, "name": f"c{c}"} for c in (2, 7, 13)]}

    results = []
    for a in annotations:  # most objects found, a few pixels off; some twice; crowds hit too
        if rng.random() < 0.8:
            x, y, w, h = a["bbox"]
            dx, dy, dw, dh = (int(v) for v in rng.integers(-3, 4, 4))
            results.append(
                {"image_id": a["image_id"], "category_id": a["category_id"], "bbox": [x + dx, y + dy, w + dw, h + dh]}
            )
    for _ in range(40):  # false positives of every size, scored between the true ones
        img = images[int(rng.integers(len(images)))]
        w, h = (int(v) for v in rng.integers(8, 150, 2))
        w, h = min(w, img["width"] - 1), min(h, img["height"] - 1)
        x, y = int(rng.integers(0, img["width"] - w)), int(rng.integers(0, img["height"] - h))
        results.append({"image_id": img["id"], "category_id": int(rng.choice([2, 7, 13])), "bbox": [x, y, w, h]})
    scores = rng.permutation(1000)[: len(results)] / 1024 + 1 / 1024
    for r, s in zip(results, scores, strict=True):
        r["score"] = float(s)
    return gt, results


def coco_stats(tmp_path, gt: dict, results: list[dict], category: int | None = None) -> np.ndarray:
    """pycocotools' COCOeval, run as COCO's own scripts do: the files written, loadRes; with
    `category`, of that category alone (`params.catIds`)."""
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "dt.json").write_text(json.dumps(results))
    coco = COCO(str(tmp_path / "gt.json"))
    evaluator = COCOeval(coco, coco.loadRes(str(tmp_path / "dt.json")), "bbox")
    if category is not None:
        evaluator.params.catIds = [category]
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return evaluator.stats


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_map_equals_cocoeval_when_recalls_hit_the_grid(tmp_path, backend):
    """All 12 numbers equal COCOeval's; torchmetrics' own float32 thresholds (0.07000000029802322
    for 0.07) read another precision where a recall is exactly on the grid."""
    pytest.importorskip(backend)
    gt, results = grid_coco(np.random.default_rng(0))
    reference = coco_stats(tmp_path, gt, results)
    assert 0.1 < reference[0] < 0.9  # a figure with something to compare

    metric = DetectionMeanAP(box_format="xyxy", iou_type="bbox", class_metrics=True, backend=backend)
    params = Params(iouType="bbox")  # COCOeval's own thresholds, bit for bit
    assert metric.iou_thresholds == params.iouThrs.tolist() and metric.rec_thresholds == params.recThrs.tolist()
    for img in gt["images"]:
        anns = [a for a in gt["annotations"] if a["image_id"] == img["id"]]
        dets = [r for r in results if r["image_id"] == img["id"]]

        def xyxy(entries):
            boxes = torch.tensor([e["bbox"] for e in entries], dtype=torch.float32).reshape(-1, 4)
            return torch.cat([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], 1)

        metric.update(
            [
                {
                    "boxes": xyxy(dets),
                    "scores": torch.tensor([d["score"] for d in dets]),
                    "labels": torch.tensor([d["category_id"] for d in dets], dtype=torch.int64),
                }
            ],
            [
                {
                    "boxes": xyxy(anns),
                    "labels": torch.tensor([a["category_id"] for a in anns], dtype=torch.int64),
                    "iscrowd": torch.tensor([a["iscrowd"] for a in anns]),
                    "area": torch.tensor([a["area"] for a in anns]),
                }
            ],
        )
    ours = metric.compute()
    keys = ["map", "map_50", "map_75", "map_small", "map_medium", "map_large", "mar_1", "mar_10", "mar_100"]
    keys += ["mar_small", "mar_medium", "mar_large"]
    got = np.array([ours[k].item() for k in keys])
    # torchmetrics returns float32: each number is COCOeval's, rounded to float32 (no more than that)
    diff = dict(zip(keys, got - reference, strict=True))
    np.testing.assert_array_equal(got, reference.astype(np.float32), err_msg=str(diff))
    # per class, read from the one run's arrays: COCOeval run for that category alone
    assert ours["classes"].tolist() == [2, 7, 13]
    for i, category in enumerate((2, 7, 13)):
        alone = coco_stats(tmp_path, gt, results, category)
        assert ours["map_per_class"][i].item() == np.float32(alone[0]), category
        assert ours["mar_100_per_class"][i].item() == np.float32(alone[8]), category
    assert "precision" not in ours  # the arrays it read are not handed on unless asked
