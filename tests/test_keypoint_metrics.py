"""COCO's keypoint AP: every figure of `KeypointMeanAP` and `evaluate_keypoints` equals
pycocotools' COCOeval(iouType="keypoints") run directly on COCO files written here."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from vitdense.metrics.keypoints import KEYPOINT_AP_KEYS, KeypointMeanAP, evaluate_keypoints
from vitdense.types.keypoints import COCO_PERSON, KeypointSchema

#: (width, height) of the images; the third has no object
SIZES = [(640, 480), (320, 240), (500, 375), (300, 200), (800, 600), (400, 400)]
#: sides (pixels) of small (< 32^2), medium and large (> 96^2) objects; COCOeval's keypoint
#: figures have no small range, so small objects count in "all" only
SIDES = [(12, 30), (40, 90), (110, 220)]
#: five keypoints of another dataset, and its own OKS constants
HAND = KeypointSchema(("wrist", "thumb", "index", "middle", "little"), sigmas=(0.05, 0.03, 0.08, 0.11, 0.04))


def keypoint_set(rng: np.random.Generator, schema: KeypointSchema) -> tuple[dict, list[dict]]:
    """A COCO keypoint annotation file (one category, id 1) and keypoint results for it.

    Non-dense image and annotation ids, objects of every size with annotation areas smaller
    than their boxes, keypoints not labelled (v = 0, at 0, 0), labelled (v = 1) or visible
    (v = 2), some objects with no labelled keypoint, a crowd region with detections inside it,
    an image with no object, and one with more detections than COCOeval's 20.
    Coordinates are multiples of 1/16 and scores distinct multiples of 2^-10, so float32
    tensors carry the files' values exactly and no two detections tie.
    """
    k = schema.num_keypoints
    images = [{"id": 10 * i + 3, "width": w, "height": h, "file_name": f"{i}.jpg"} for i, (w, h) in enumerate(SIZES)]
    annotations: list[dict] = []
    for index, img in enumerate(images):
        if index == 2:
            continue
        for _ in range(int(rng.integers(2, 6))):
            lo, hi = SIDES[int(rng.integers(len(SIDES)))]
            w = min(int(rng.integers(lo, hi)), img["width"] - 1)
            h = min(int(rng.integers(lo, hi)), img["height"] - 1)
            x, y = int(rng.integers(0, img["width"] - w)), int(rng.integers(0, img["height"] - h))
            v = rng.choice([0, 1, 2], k, p=[0.2, 0.3, 0.5])
            if rng.random() < 0.1:
                v[:] = 0
            px = np.where(v > 0, x + rng.integers(0, w + 1, k), 0)
            py = np.where(v > 0, y + rng.integers(0, h + 1, k), 0)
            annotations.append(
                {
                    "image_id": img["id"],
                    "bbox": [x, y, w, h],
                    "area": float(int(w * h * rng.uniform(0.5, 0.8))),
                    "iscrowd": 0,
                    "keypoints": np.stack([px, py, v], 1).reshape(-1).tolist(),
                    "num_keypoints": int((v > 0).sum()),
                }
            )
    crowd = images[0]
    annotations.append(
        {
            "image_id": crowd["id"],
            "bbox": [0, 0, 200, 150],
            "area": 25000.0,
            "iscrowd": 1,
            "keypoints": [0] * (3 * k),
            "num_keypoints": 0,
        }
    )
    for i, a in enumerate(annotations):
        a.update(id=100 + 7 * i, category_id=1)
    category = {"id": 1, "name": "person", "keypoints": list(schema.names), "skeleton": []}
    gt = {"images": images, "annotations": annotations, "categories": [category]}

    def points(x, y, w, h, spread):
        xs = x + rng.uniform(0, w, k) + rng.normal(0, spread, k)
        ys = y + rng.uniform(0, h, k) + rng.normal(0, spread, k)
        return xs, ys

    results = []
    for a in annotations:  # most objects found, their keypoints a little off
        if a["iscrowd"] or rng.random() < 0.85:
            x, y, w, h = a["bbox"]
            truth = np.array(a["keypoints"], dtype=np.float64).reshape(k, 3)
            for _ in range(1 + int(a["iscrowd"]) * 2 + int(rng.random() < 0.2)):  # some twice; the crowd thrice
                spread = np.sqrt(a["area"]) * rng.uniform(0.0, 0.08)
                xs, ys = points(x, y, w, h, spread)
                labelled = truth[:, 2] > 0
                xs[labelled] = truth[labelled, 0] + rng.normal(0, spread, labelled.sum())
                ys[labelled] = truth[labelled, 1] + rng.normal(0, spread, labelled.sum())
                results.append({"image_id": a["image_id"], "xs": xs, "ys": ys})
    for i in range(40):  # false positives of every size, half of them in one image (more than 20 there)
        img = images[1] if i % 2 else images[int(rng.integers(len(images)))]
        lo, hi = SIDES[int(rng.integers(len(SIDES)))]
        w, h = min(int(rng.integers(lo, hi)), img["width"] - 1), min(int(rng.integers(lo, hi)), img["height"] - 1)
        x, y = int(rng.integers(0, img["width"] - w)), int(rng.integers(0, img["height"] - h))
        xs, ys = points(x, y, w, h, 2.0)
        results.append({"image_id": img["id"], "xs": xs, "ys": ys})
    scores = (rng.permutation(1000)[: len(results)] + 1) / 1024
    for r, score in zip(results, scores, strict=True):
        xs, ys = np.round(r.pop("xs") * 16) / 16, np.round(r.pop("ys") * 16) / 16
        kp_scores = rng.integers(0, 257, k) / 256  # the results' third values, which COCOeval does not read
        r.update(category_id=1, keypoints=np.stack([xs, ys, kp_scores], 1).reshape(-1).tolist(), score=float(score))
    return gt, results


def cocoeval_stats(folder: Path, gt: dict, results: list[dict], sigmas=None) -> np.ndarray:
    """pycocotools' COCOeval run as COCO's own scripts run it: the files written, loadRes;
    with `sigmas`, `params.kpt_oks_sigmas` set to them (else COCOeval's, COCO's person's)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gt.json").write_text(json.dumps(gt))
    (folder / "results.json").write_text(json.dumps(results))
    coco = COCO(str(folder / "gt.json"))
    evaluator = COCOeval(coco, coco.loadRes(str(folder / "results.json")), "keypoints")
    if sigmas is not None:
        evaluator.params.kpt_oks_sigmas = np.array(sigmas)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return evaluator.stats


def metric_inputs(gt: dict, results: list[dict], k: int) -> tuple[list[dict], list[dict]]:
    """Per image of `gt`, the dicts the detection task hands its metrics (float32, xyxy), with keypoints."""
    preds, targets = [], []
    for img in gt["images"]:
        anns = [a for a in gt["annotations"] if a["image_id"] == img["id"]]
        dets = [r for r in results if r["image_id"] == img["id"]]
        det_points = torch.tensor([d["keypoints"] for d in dets], dtype=torch.float32).reshape(-1, k, 3)
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        preds.append(
            {
                "boxes": torch.cat([det_points[:, :, :2].amin(1), det_points[:, :, :2].amax(1)], 1),
                "scores": torch.tensor([d["score"] for d in dets], dtype=torch.float32),
                "labels": torch.tensor([d["category_id"] for d in dets], dtype=torch.int64),
                "keypoints": det_points,
            }
        )
        targets.append(
            {
                "boxes": torch.cat([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], 1),
                "labels": torch.tensor([a["category_id"] for a in anns], dtype=torch.int64),
                "iscrowd": torch.tensor([a["iscrowd"] for a in anns], dtype=torch.int64),
                "area": torch.tensor([a["area"] for a in anns], dtype=torch.float32),
                "keypoints": torch.tensor([a["keypoints"] for a in anns], dtype=torch.float32).reshape(-1, k, 3),
            }
        )
    return preds, targets


def figures(result: dict[str, torch.Tensor]) -> list[float]:
    assert list(result) == list(KEYPOINT_AP_KEYS)
    return [result[key].item() for key in KEYPOINT_AP_KEYS]


@pytest.fixture(scope="module")
def person_case(tmp_path_factory):
    """COCO's person set, its files and COCOeval's figures on them."""
    folder = tmp_path_factory.mktemp("person")
    gt, results = keypoint_set(np.random.default_rng(0), COCO_PERSON)
    reference = cocoeval_stats(folder, gt, results)
    return folder, gt, results, reference


def test_keypoint_ap_equals_cocoeval(person_case):
    """All 10 figures are COCOeval's (float64, exactly), from the metric and from the files."""
    folder, gt, results, reference = person_case
    assert 0.1 < reference[0] < 0.9 and reference[3] > 0 and reference[4] > 0  # medium and large to compare
    per_image = {img["id"]: sum(r["image_id"] == img["id"] for r in results) for img in gt["images"]}
    assert max(per_image.values()) > 20 and per_image[gt["images"][2]["id"]] > 0  # beyond maxDets; an empty image
    assert {a["num_keypoints"] for a in gt["annotations"] if not a["iscrowd"]} >= {0}  # objects COCOeval ignores

    metric = KeypointMeanAP(COCO_PERSON.sigmas)
    preds, targets = metric_inputs(gt, results, 17)
    for start in range(0, len(preds), 2):  # batches of 2 images
        metric.update(preds[start : start + 2], targets[start : start + 2])
    got = figures(metric.compute())
    assert got == reference.tolist(), dict(zip(KEYPOINT_AP_KEYS, np.array(got) - reference, strict=True))
    # the files, with COCO's person sigmas taken from the category's 17 keypoint names
    from_files = evaluate_keypoints(folder / "gt.json", folder / "results.json")
    assert list(from_files.values()) == reference.tolist()


def test_another_schema_uses_its_sigmas(tmp_path):
    """K = 5 with its own sigmas: COCOeval's figures with those sigmas; the files need them given."""
    gt, results = keypoint_set(np.random.default_rng(1), HAND)
    reference = cocoeval_stats(tmp_path, gt, results, HAND.sigmas)
    assert 0.1 < reference[0] < 0.9
    preds, targets = metric_inputs(gt, results, 5)
    metric = KeypointMeanAP(HAND.sigmas)
    metric.update(preds, targets)
    assert figures(metric.compute()) == reference.tolist()
    other = KeypointMeanAP([0.1] * 5)  # the sigmas are used: other constants, other figures
    other.update(preds, targets)
    assert other.compute()["map"].item() != reference[0]

    with pytest.raises(ValueError, match="keypoint AP needs the dataset's per-keypoint OKS sigmas"):
        evaluate_keypoints(tmp_path / "gt.json", tmp_path / "results.json")
    from_files = evaluate_keypoints(tmp_path / "gt.json", tmp_path / "results.json", sigmas=HAND.sigmas)
    assert list(from_files.values()) == reference.tolist()


def test_sigmas_are_required():
    for schema in (KeypointSchema.unnamed(5), KeypointSchema(("a", "b"))):
        with pytest.raises(ValueError, match="keypoint AP needs the dataset's per-keypoint OKS sigmas"):
            KeypointMeanAP(schema.sigmas)
    metric = KeypointMeanAP(HAND.sigmas)
    preds, targets = metric_inputs(*keypoint_set(np.random.default_rng(2), COCO_PERSON), 17)
    with pytest.raises(ValueError, match=r"preds\[0\]\['keypoints'\] is \[\d+, 17, 3\], expected \[k, K, 3\]"):
        metric.update(preds, targets)  # 17 keypoints for 5 sigmas


def test_max_detections_keeps_each_image_best(person_case, tmp_path):
    """max_detections=5: COCOeval's figures on the results cut to each image's 5 best."""
    _, gt, results, reference = person_case
    best: list[dict] = []
    for img in gt["images"]:
        mine = sorted((r for r in results if r["image_id"] == img["id"]), key=lambda r: -r["score"])
        best += mine[:5]
    cut = cocoeval_stats(tmp_path, gt, best)
    metric = KeypointMeanAP(COCO_PERSON.sigmas, max_detections=5)
    metric.update(*metric_inputs(gt, results, 17))
    got = figures(metric.compute())
    assert got == cut.tolist() and got != reference.tolist()


def test_states_gathered_from_two_processes(person_case, sync_as_two_processes):
    """Two processes holding 4 and 2 images (the gathering simulated: it returns both shards)
    give one process's figures; the order of the images does not change them."""
    _, gt, results, reference = person_case
    preds, targets = metric_inputs(gt, results, 17)
    first, second = KeypointMeanAP(COCO_PERSON.sigmas), KeypointMeanAP(COCO_PERSON.sigmas)
    first.update(preds[:4], targets[:4])
    second.update(preds[4:], targets[4:])
    sync_as_two_processes(first, second)
    assert len(first.gt_labels) == len(first.det_keypoints) == 6
    assert figures(first.compute()) == reference.tolist()
    backwards = KeypointMeanAP(COCO_PERSON.sigmas)
    backwards.update(preds[::-1], targets[::-1])
    assert figures(backwards.compute()) == reference.tolist()


def test_empty_inputs(person_case, tmp_path):
    """No image: -1 everywhere; images without detections: their objects missed (0, -1 where
    no object is labelled), the same from an empty results file; no labelled object: -1."""
    _, gt, results, reference = person_case
    assert figures(KeypointMeanAP(COCO_PERSON.sigmas).compute()) == [-1.0] * 10
    preds, targets = metric_inputs(gt, [], 17)
    metric = KeypointMeanAP(COCO_PERSON.sigmas)
    metric.update(preds, targets)
    got = figures(metric.compute())
    assert got == [0.0 if r > -1 else -1.0 for r in reference]
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "results.json").write_text("[]")
    assert list(evaluate_keypoints(tmp_path / "gt.json", tmp_path / "results.json").values()) == got
    # detections on images without a labelled object
    metric = KeypointMeanAP(COCO_PERSON.sigmas)
    preds, targets = metric_inputs(gt, results, 17)
    metric.update(preds[2:3], targets[2:3])
    assert figures(metric.compute()) == [-1.0] * 10


def test_classes_without_keypoints_change_nothing(person_case, tmp_path):
    """Objects of a class without keypoints (all v = 0 in the metric's targets; no keypoints at
    all in a file whose category lists none) and detections of that class: COCOeval ignores
    such objects, the class has no AP, and the person figures are COCOeval's on persons alone."""
    _, gt, results, reference = person_case
    rng = np.random.default_rng(3)
    balls, ball_results = [], []
    for i, img in enumerate(gt["images"]):
        x, y = int(rng.integers(0, 150)), int(rng.integers(0, 150))
        balls.append({"id": 9000 + i, "image_id": img["id"], "category_id": 5, "bbox": [x, y, 40, 40]})
        balls[-1].update(area=1200.0, iscrowd=0)
        ball_results.append({**results[i], "image_id": img["id"], "category_id": 5, "score": (1000.5 + i) / 1024})
    mixed = {
        **gt,
        "annotations": gt["annotations"] + balls,
        "categories": [*gt["categories"], {"id": 5, "name": "ball"}],
    }
    (tmp_path / "gt.json").write_text(json.dumps(mixed))
    (tmp_path / "results.json").write_text(json.dumps(results + ball_results))
    from_files = evaluate_keypoints(tmp_path / "gt.json", tmp_path / "results.json")
    assert list(from_files.values()) == reference.tolist()

    with_zeros = {**mixed, "annotations": gt["annotations"] + [{**b, "keypoints": [0] * 51} for b in balls]}
    metric = KeypointMeanAP(COCO_PERSON.sigmas)
    metric.update(*metric_inputs(with_zeros, results + ball_results, 17))
    assert figures(metric.compute()) == reference.tolist()


def test_results_with_boxes_are_refused(person_case, tmp_path):
    """loadRes reads rows with a bbox as box results, each detection's area its box's: COCOeval
    then puts unmatched detections in other size ranges (AP medium and large change here)."""
    folder, gt, results, reference = person_case
    boxed = []
    for r in results:  # a box around each detection's keypoints, as a detector's would be
        points = np.array(r["keypoints"]).reshape(-1, 3)[:, :2]
        (x0, y0), (x1, y1) = points.min(0), points.max(0)
        w, h = x1 - x0, y1 - y0
        boxed.append({**r, "bbox": [x0 - 0.3 * w, y0 - 0.3 * h, 1.6 * w, 1.6 * h]})
    (tmp_path / "results.json").write_text(json.dumps(boxed))
    with pytest.raises(ValueError, match="has a 'bbox'"):
        evaluate_keypoints(folder / "gt.json", tmp_path / "results.json")
    as_boxes = cocoeval_stats(tmp_path, gt, boxed)
    assert as_boxes[0] == reference[0] and (as_boxes[3] != reference[3] or as_boxes[4] != reference[4])
