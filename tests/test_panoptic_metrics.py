"""Panoptic quality equals cocodataset/panopticapi's `pq_compute` (numbers from
/tmp/pqmetric_ref/pq_ref.py, which writes this file's set as COCO panoptic PNGs + JSON and
runs panopticapi on them); mask AP equals pycocotools' COCOeval run on a results file."""

import contextlib
import io
import json
from functools import partial
from typing import NamedTuple

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from vitdense.core.errors import ConfigError
from vitdense.core.preprocess import LabelInfo
from vitdense.metrics.detection import DetectionMeanAP
from vitdense.metrics.universal import PQ_KEYS, InstanceMeanAP, PanopticQuality, instance_ap_inputs
from vitdense.results.common import ResultContext
from vitdense.results.universal import InstanceResult, instance_results, panoptic_png, rgb2id
from vitdense.types import InstanceMasks, InstancePrediction, PanopticSegments, SegmentTargets

# pycocotools' decode under NumPy 2 (the test's reading of masks, not vitdense's code)
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

# --- a COCO panoptic set ------------------------------------------------------------------------
#: the dataset's categories, in label order: non-dense ids, things and stuff mixed; 50 appears nowhere
CATEGORY_IDS = (1, 3, 7, 20, 44, 50)
IS_THING = (True, False, True, False, True, False)
THINGS, STUFF = (0, 2), (1, 3)  # the labels drawn; 4 (thing) only as a crowd and a false positive
SIZES = ((24, 37), (31, 20), (18, 18), (40, 29), (13, 45), (26, 26))  # (H, W), mixed, not square


class PanopticImage(NamedTuple):
    """One image of the set: segment id maps [H, W] int64 (0: void) and, per segment,
    (id, label) for the prediction and (id, label, iscrowd) for the ground truth."""

    gt_map: np.ndarray
    gt_segments: list[tuple[int, int, bool]]
    pred_map: np.ndarray
    pred_segments: list[tuple[int, int]]


def _rect(rng: np.random.Generator, h: int, w: int, lo: float, hi: float) -> tuple[slice, slice]:
    rh, rw = max(1, int(h * rng.uniform(lo, hi))), max(1, int(w * rng.uniform(lo, hi)))
    y, x = int(rng.integers(0, h - rh + 1)), int(rng.integers(0, w - rw + 1))
    return slice(y, y + rh), slice(x, x + rw)


def _shifted(mask: np.ndarray, dy: int, dx: int) -> np.ndarray:
    out = np.zeros_like(mask)
    h, w = mask.shape
    out[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = mask[
        max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
    ]
    return out


class _GroundTruth(NamedTuple):
    """An image's ground truth while it is drawn."""

    rng: np.random.Generator
    gt: np.ndarray
    segments: list[tuple[int, int, bool]]
    stuff_id: dict[int, int]


def _paint(image: _GroundTruth, where, label: int, crowd: bool = False) -> None:
    """Paint a segment of `label` on the ground truth (a stuff class joins its segment, as COCO's)."""
    if label in STUFF and label in image.stuff_id:
        image.gt[where] = image.stuff_id[label]
        return
    segment = 1000 * (len(image.segments) + 1) + int(image.rng.integers(0, 1000))
    image.gt[where] = segment
    image.segments.append((segment, label, crowd))
    if label in STUFF:
        image.stuff_id[label] = segment


def panoptic_set(seed: int = 0) -> list[PanopticImage]:
    """Ground truth with stuff regions, things, crowds (two of one class in image 0), void
    rectangles; image 2 has no thing, image 3 no prediction, image 5 a match that needs the
    void rule. Predictions are the ground truth's segments shifted by up to 2 pixels (IoUs
    either side of 0.5), some relabelled or missed, plus false positives, some of them
    mostly on void or on a crowd region (of their class or another)."""
    rng = np.random.default_rng(seed)
    images = []
    for index, (h, w) in enumerate(SIZES):
        gt = np.zeros((h, w), np.int64)
        segments: list[tuple[int, int, bool]] = []
        paint = partial(_paint, _GroundTruth(rng, gt, segments, {}))

        paint(np.s_[:, :], int(rng.choice(STUFF)))
        for _ in range(int(rng.integers(1, 3))):
            paint(_rect(rng, h, w, 0.3, 0.7), int(rng.choice(STUFF)))
        if index != 2:
            for _ in range(int(rng.integers(2, 5))):
                paint(_rect(rng, h, w, 0.25, 0.5), int(rng.choice(THINGS)), crowd=bool(rng.random() < 0.2))
        if index == 0:  # two crowd regions of one class, and a crowd of a class seen nowhere else
            paint(_rect(rng, h, w, 0.2, 0.4), 2, crowd=True)
            paint(_rect(rng, h, w, 0.2, 0.4), 2, crowd=True)
            paint(_rect(rng, h, w, 0.2, 0.3), 4, crowd=True)
        for _ in range(int(rng.integers(1, 3))):
            gt[_rect(rng, h, w, 0.1, 0.35)] = 0  # void
        present = set(np.unique(gt).tolist())
        segments = [s for s in segments if s[0] in present]

        pred = np.zeros((h, w), np.int64)
        pred_segments: list[tuple[int, int]] = []
        ids = iter(rng.permutation(np.arange(1, 70000))[:40].tolist())  # any ids > 0, not in order
        if index != 3:
            for segment, label, _ in segments:
                if rng.random() < 0.85:
                    dy, dx = (int(v) for v in rng.choice([-2, -1, 0, 0, 1], 2))
                    if rng.random() < 0.1:
                        label = int(rng.integers(0, 5))
                    pred_segments.append((next(ids), label))
                    pred[_shifted(gt == segment, dy, dx)] = pred_segments[-1][0]
            for _ in range(int(rng.integers(1, 4))):  # false positives, anywhere
                pred_segments.append((next(ids), int(rng.integers(0, 5))))
                pred[_rect(rng, h, w, 0.1, 0.3)] = pred_segments[-1][0]
            for segment, label, crowd in segments:  # on a crowd region (mostly of its class) or on void
                if crowd or rng.random() < 0.15:
                    ys, xs = np.nonzero(gt == segment) if crowd else np.nonzero(gt == 0)
                    if len(ys):
                        other = not crowd or rng.random() < 0.3
                        pred_segments.append((next(ids), int(rng.integers(0, 5)) if other else label))
                        grow = int(rng.integers(0, 3))
                        pred[ys.min() : ys.max() + 1 + grow, xs.min() : xs.max() + 1 + grow] = pred_segments[-1][0]
        if index == 5:  # a thing half void, predicted whole: IoU 1 once the union leaves void out (else 0.5)
            gt[4:12, 4:8], gt[4:12, 8:12], pred[4:12, 4:12] = 99, 0, 98
            segments.append((99, 0, False))
            pred_segments.append((98, 0))
        present = set(np.unique(pred).tolist())
        pred_segments = [s for s in pred_segments if s[0] in present]
        images.append(PanopticImage(gt, segments, pred, pred_segments))
    return images


# --- a COCO instance set ------------------------------------------------------------------------
INSTANCE_CATEGORY_IDS = (2, 5, 11)
#: (H, W); image 4 has no annotation (its predictions are false positives), image 5 no prediction
INSTANCE_SIZES = ((160, 150), (150, 170), (64, 80), (130, 155), (70, 90), (50, 60))


def _polygon(rng: np.random.Generator, cy: float, cx: float, radius: float) -> np.ndarray:
    """[n, 2] (x, y) vertices of a star-shaped polygon around (cx, cy)."""
    n = int(rng.integers(5, 9))
    angles = (np.arange(n) + rng.uniform(-0.3, 0.3, n)) * 2 * np.pi / n
    r = radius * rng.uniform(0.85, 1.0, n)
    return np.stack([cx + r * np.cos(angles), cy + r * np.sin(angles)], 1)


def _polygon_mask(vertices: np.ndarray, h: int, w: int) -> np.ndarray:
    return mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects([vertices.ravel().tolist()], h, w))).astype(bool)


def _uncompressed_rle(mask: np.ndarray) -> dict:
    """COCO's crowd form: run lengths (0s first) of the column-major pixels, counts a list."""
    flat = mask.flatten(order="F").astype(np.int8)
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(flat)) + 1, [flat.size]])
    counts = np.diff(bounds).tolist()
    return {"size": list(mask.shape), "counts": ([0] if flat[0] else []) + counts}


def instance_set(seed: int = 0) -> tuple[dict, list[list[tuple[np.ndarray, int, float]]]]:
    """A COCO instances JSON (polygons with their polygon area; crowd regions as RLE, counts
    a list in image 0 and a string in image 3; objects small, medium and large by COCO's
    ranges) and per image its predictions (mask [H, W] bool, label, score): the objects'
    polygons with jittered vertices, some relabelled, some twice, some on crowd regions,
    and false positives."""
    rng = np.random.default_rng(seed)
    images, annotations, predictions = [], [], []
    for index, (h, w) in enumerate(INSTANCE_SIZES):
        image_id = 100 + 11 * index
        images.append({"id": image_id, "height": h, "width": w, "file_name": f"{image_id}.jpg"})
        found: list[tuple[np.ndarray, int, float]] = []

        for _ in range(0 if index == 4 else int(rng.integers(3, 7))):
            radius = float(rng.choice([rng.uniform(5, 16), rng.uniform(22, 40), rng.uniform(68, 74)]))
            radius = min(radius, min(h, w) / 2 - 1)
            cy, cx = rng.uniform(radius, h - radius), rng.uniform(radius, w - radius)
            vertices = _polygon(rng, cy, cx, radius)
            x, y = vertices[:, 0], vertices[:, 1]
            area = 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))  # the polygon's, not its pixels'
            label = int(rng.integers(0, 3))
            annotations.append(
                {"image_id": image_id, "category_id": INSTANCE_CATEGORY_IDS[label], "iscrowd": 0, "area": area}
            )
            annotations[-1]["segmentation"] = [vertices.ravel().tolist()]
            for _ in range(int(rng.random() < 0.85) + int(rng.random() < 0.2)):  # found, sometimes twice
                jittered = vertices + rng.uniform(-0.25, 0.25, vertices.shape) * radius
                guess = label if rng.random() < 0.9 else int(rng.integers(0, 3))
                found.append((_polygon_mask(jittered, h, w), guess, 0.0))
        if index in (0, 3):  # a crowd region, and predictions on it
            crowd = np.zeros((h, w), bool)
            crowd[h // 2 : h // 2 + 30, 5:60] = True
            rle = mask_utils.encode(np.asfortranarray(crowd.astype(np.uint8)))
            segmentation = (
                _uncompressed_rle(crowd) if index == 0 else {"size": [h, w], "counts": rle["counts"].decode()}
            )
            label = 1
            annotations.append(
                {
                    "image_id": image_id,
                    "category_id": INSTANCE_CATEGORY_IDS[label],
                    "iscrowd": 1,
                    "area": float(crowd.sum()),
                }
            )
            annotations[-1]["segmentation"] = segmentation
            for y, x in ((h // 2 + 2, 8), (h // 2 + 10, 30), (h // 2 + 5, 20)):
                part = np.zeros((h, w), bool)
                part[y : y + 15, x : x + 20] = True
                found.append((part, label, 0.0))
        for _ in range(0 if index == 5 else int(rng.integers(1, 4))):  # false positives
            radius = float(rng.uniform(6, 25))
            cy, cx = rng.uniform(radius, h - radius), rng.uniform(radius, w - radius)
            found.append((_polygon_mask(_polygon(rng, cy, cx, radius), h, w), int(rng.integers(0, 3)), 0.0))
        if index == 5:
            found = []
        predictions.append(found)
    scores = (rng.permutation(1000)[: sum(map(len, predictions))] + 1) / 1024  # exact in float32 and in JSON
    flat = iter(scores.tolist())
    predictions = [[(m, label, next(flat)) for m, label, _ in found] for found in predictions]
    for i, a in enumerate(annotations):
        a["id"] = 1 + 3 * i
    categories = [{"id": c, "name": f"c{c}"} for c in INSTANCE_CATEGORY_IDS]
    return {"images": images, "annotations": annotations, "categories": categories}, predictions


# --- panoptic quality ---------------------------------------------------------------------------
#: panopticapi's pq_compute on `panoptic_set()` written as COCO panoptic PNGs + JSON (/tmp/pqmetric_ref/pq_ref.py):
#: (PQ, SQ, RQ, classes counted) ...
REFERENCE = {
    "": (0.23159053181009798, 0.5449049889197026, 0.3288888888888889, 5),  # All
    "_th": (0.15257810664787408, 0.44136275546159265, 0.2148148148148148, 3),  # Things
    "_st": (0.35010916955343374, 0.7002183391068675, 0.5, 2),  # Stuff
}
#: ... its per_class (category id: PQ, SQ, RQ) and its PQStat sums (category id: IoU sum, TP, FP, FN)
PER_CLASS = {
    1: (0.35075757575757577, 0.7892045454545454, 0.4444444444444444),
    3: (0.290164223132127, 0.580328446264254, 0.5),
    7: (0.1069767441860465, 0.5348837209302325, 0.2),
    20: (0.41005411597474056, 0.8201082319494811, 0.5),
    44: (0.0, 0.0, 0.0),  # false positives only: counted (N), PQ 0
    50: (0.0, 0.0, 0.0),  # nowhere: not counted
}
COUNTS = {
    1: (3.1568181818181817, 4, 4, 6),
    3: (1.160656892528508, 2, 1, 3),
    7: (0.5348837209302325, 1, 5, 3),
    20: (2.4603246958484433, 3, 4, 2),
    44: (0.0, 0, 3, 0),
    50: (0.0, 0, 0, 0),
}


def as_inputs(image: PanopticImage) -> tuple[PanopticSegments, SegmentTargets]:
    """The image as the metric takes it: contiguous labels, ground truth as masks."""
    gt = torch.from_numpy(image.gt_map)
    masks = torch.stack([gt == s for s, _, _ in image.gt_segments])
    labels = torch.tensor([label for _, label, _ in image.gt_segments])
    target = SegmentTargets(masks, labels, torch.tensor([crowd for _, _, crowd in image.gt_segments]))
    ids = torch.tensor([s for s, _ in image.pred_segments], dtype=torch.int64)
    pred_labels = torch.tensor([label for _, label in image.pred_segments], dtype=torch.int64)
    return PanopticSegments(torch.from_numpy(image.pred_map), ids, pred_labels, torch.ones(len(ids))), target


@pytest.fixture(scope="module")
def panoptic_inputs() -> list[tuple[PanopticSegments, SegmentTargets]]:
    return [as_inputs(image) for image in panoptic_set()]


def pq_of(inputs, **kwargs) -> PanopticQuality:
    metric = PanopticQuality(len(CATEGORY_IDS), IS_THING, **kwargs)
    for pred, target in inputs:
        metric.update([pred], [target])
    return metric


def test_pq_equals_panopticapi(panoptic_inputs):
    """Void, crowds (two of one class in an image: panopticapi's last one counts), an image
    without things, one without predictions, predictions on void and crowds."""
    metric = pq_of(panoptic_inputs)
    result = metric.compute()
    for suffix, (pq, sq, rq, _) in REFERENCE.items():
        assert result[f"PQ{suffix}"].item() == pytest.approx(pq, abs=1e-12)
        assert result[f"SQ{suffix}"].item() == pytest.approx(sq, abs=1e-12)
        assert result[f"RQ{suffix}"].item() == pytest.approx(rq, abs=1e-12)
    # per class, by contiguous label: label k is category CATEGORY_IDS[k]
    for label, category in enumerate(CATEGORY_IDS):
        expected = PER_CLASS[category]
        got = [result[f"{name}_per_class"][label].item() for name in ("PQ", "SQ", "RQ")]
        assert got == pytest.approx(expected, abs=1e-12), category
        iou, tp, fp, fn = COUNTS[category]
        assert metric.iou[label].item() == pytest.approx(iou, abs=1e-12)
        assert (metric.tp[label], metric.fp[label], metric.fn[label]) == (tp, fp, fn), category
    table = metric.format_table(result)
    assert "All" in table and f"{100 * REFERENCE[''][0]:8.2f}{100 * REFERENCE[''][1]:8.2f}" in table
    assert table.splitlines()[1].endswith(f"{REFERENCE[''][3]:6d}")  # N, as panopticapi prints it


def test_pq_sums_over_processes_equal_one_process(panoptic_inputs):
    """Per-class sums reduced by "sum": two processes holding 4 and 2 images (their states
    merged as torchmetrics reduces them) give one process's figures."""
    whole = pq_of(panoptic_inputs).compute()
    first, second = pq_of(panoptic_inputs[:4]), pq_of(panoptic_inputs[4:][::-1])
    first.merge_state(second)
    merged = first.compute()
    for key in PQ_KEYS:
        assert merged[key].item() == pytest.approx(whole[key].item(), abs=1e-15), key
    batched = PanopticQuality(len(CATEGORY_IDS), IS_THING)
    batched.update(*zip(*panoptic_inputs, strict=True))  # several images per update
    assert batched.compute()["PQ"].item() == pytest.approx(whole["PQ"].item(), abs=1e-15)


def test_pq_takes_contiguous_labels_not_category_ids(panoptic_inputs):
    """The metric knows classes 0..K-1 only; the dataset's ids are mapped where files are read
    and written (`vitdense.results.universal`), and a category id given as a label is refused."""
    pred, target = panoptic_inputs[0]
    as_ids = target._replace(labels=torch.tensor(CATEGORY_IDS)[target.labels])
    with pytest.raises(ValueError, match=r"targets\[0\]\.labels has 1\.\.44, outside 0\.\.5: .*category ids"):
        PanopticQuality(len(CATEGORY_IDS), IS_THING).update([pred], [as_ids])
    with pytest.raises(ConfigError, match="is_thing has 5 flags for num_classes=6"):
        PanopticQuality(6, IS_THING[:5])

    # the files of a prediction carry the category ids, the metric's per-class figures are by label
    png, info = panoptic_png(pred, IS_THING, CATEGORY_IDS)
    assert np.array_equal(rgb2id(png), pred.id_map.numpy())
    labels = dict(zip(pred.ids.tolist(), pred.labels.tolist(), strict=True))
    assert [s["id"] for s in info] == pred.ids.tolist()
    assert [s["category_id"] for s in info] == [CATEGORY_IDS[labels[s["id"]]] for s in info]
    assert [s["isthing"] for s in info] == [int(IS_THING[labels[s["id"]]]) for s in info]
    assert [s["area"] for s in info] == [int((pred.id_map == s["id"]).sum()) for s in info]
    without_ids = panoptic_png(pred, IS_THING)[1]  # a dataset without ids: label + 1
    assert [s["category_id"] for s in without_ids] == [labels[s["id"]] + 1 for s in info]


def test_pq_rules_on_small_cases():
    """IoU exactly 0.5 is no match; void left out of the union; a class seen nowhere is not
    counted; a summary without any class counted is NaN (panopticapi divides by zero)."""
    gt = torch.zeros(1, 4, 4, dtype=torch.bool)
    gt[0, :2] = True  # 8 pixels
    target = SegmentTargets(gt, torch.tensor([0]), torch.tensor([False]))
    half = torch.zeros(4, 4, dtype=torch.int64)
    half[0] = 5  # 4 of its 8 pixels: IoU 0.5
    metric = PanopticQuality(2, [True, False])
    metric.update([PanopticSegments(half, torch.tensor([5]), torch.tensor([0]), torch.ones(1))], [target])
    assert (metric.tp[0], metric.fp[0], metric.fn[0]) == (0, 1, 1)
    result = metric.compute()
    assert result["PQ"].item() == 0 and result["PQ_th"].item() == 0 and torch.isnan(result["PQ_st"])

    over_void = torch.full((4, 4), 5)  # its 8 pixels beyond the segment are void: IoU 1
    metric = PanopticQuality(2, [True, False])
    metric.update([PanopticSegments(over_void, torch.tensor([5]), torch.tensor([0]), torch.ones(1))], [target])
    assert (metric.tp[0], metric.fp[0], metric.fn[0], metric.iou[0].item()) == (1, 0, 0, 1.0)


def test_pq_refuses_inconsistent_inputs(panoptic_inputs):
    pred, target = panoptic_inputs[1]
    metric = PanopticQuality(len(CATEGORY_IDS), IS_THING)
    with pytest.raises(ValueError, match=r"id_map is \(30, 20\) but targets\[0\]\.masks are \(31, 20\): resize"):
        metric.update([pred._replace(id_map=pred.id_map[:30])], [target])
    overlapping = target.masks.clone()
    overlapping[0] |= overlapping[1]
    with pytest.raises(ValueError, match=r"targets\[0\]\.masks overlap on \d+ pixels"):
        metric.update([pred], [target._replace(masks=overlapping)])
    with pytest.raises(ValueError, match=r"id_map has segment ids \[\d+\] not in preds\[0\]\.ids"):
        metric.update([pred._replace(ids=pred.ids[1:], labels=pred.labels[1:])], [target])
    with pytest.raises(ValueError, match=r"lists segments \[77777\] that cover no pixel"):
        extra = pred._replace(
            ids=torch.cat([pred.ids, torch.tensor([77777])]), labels=torch.cat([pred.labels, pred.labels[:1]])
        )
        metric.update([extra], [target])
    with pytest.raises(ValueError, match=r"preds\[1\]\.id_map is"):  # the first image is fine, the second not
        metric.update([pred, pred._replace(id_map=pred.id_map[:30])], [target, target])
    assert metric.tp.sum() == metric.fp.sum() == metric.fn.sum() == 0  # nothing added by the refused updates


# --- mask AP ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def instance_case(tmp_path_factory):
    """The instance set: the JSON written, read by pycocotools; the predictions as `InstanceMasks`
    and their COCO results file (`instance_results`); the targets read from the JSON."""
    gt, predictions = instance_set()
    folder = tmp_path_factory.mktemp("instances")
    (folder / "gt.json").write_text(json.dumps(gt))
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(folder / "gt.json"))
    preds, targets, results = [], [], []
    for image, found in zip(gt["images"], predictions, strict=True):
        size = (image["height"], image["width"])
        found = sorted(found, key=lambda f: -f[2])
        masks = (
            torch.from_numpy(np.stack([m for m, _, _ in found])) if found else torch.zeros(0, *size, dtype=torch.bool)
        )
        labels = torch.tensor([label for _, label, _ in found], dtype=torch.int64)
        preds.append(InstanceMasks(masks, labels, torch.tensor([s for _, _, s in found], dtype=torch.float32)))
        results += instance_results(preds[-1], image["id"], INSTANCE_CATEGORY_IDS)
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[image["id"]]))  # crowds' RLE: counts a list (frPyObjects) or str
        masks = np.stack([coco.annToMask(a) for a in anns]) if anns else np.zeros((0, *size), np.uint8)
        targets.append(
            SegmentTargets(
                torch.from_numpy(masks).bool(),
                torch.tensor([INSTANCE_CATEGORY_IDS.index(a["category_id"]) for a in anns], dtype=torch.int64),
                torch.tensor([bool(a["iscrowd"]) for a in anns], dtype=torch.bool),
                torch.tensor([a["area"] for a in anns], dtype=torch.float64),  # the annotation's
            )
        )
    (folder / "results.json").write_text(json.dumps(results))
    return folder, preds, targets, results


MAP_KEYS = ["map", "map_50", "map_75", "map_small", "map_medium", "map_large", "mar_1", "mar_10", "mar_100"]
MAP_KEYS += ["mar_small", "mar_medium", "mar_large"]


def cocoeval_segm(folder, category: int | None = None, results: str = "results.json") -> np.ndarray:
    """pycocotools' COCOeval on the files, as COCO's scripts run it (loadRes of the results file)."""
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(folder / "gt.json"))
        evaluator = COCOeval(coco, coco.loadRes(str(folder / results)), "segm")
        if category is not None:
            evaluator.params.catIds = [category]
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator.stats


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_mask_ap_equals_cocoeval(instance_case, backend):
    """All 12 numbers and the per-class AP equal COCOeval's on the results file written by
    `instance_results`: crowds (RLE counts as a list and as a string), the annotations'
    areas, an image without annotations whose predictions are all false positives."""
    pytest.importorskip(backend)
    folder, preds, targets, _ = instance_case
    reference = cocoeval_segm(folder)
    assert all(0.1 < v < 0.9 for v in reference)  # small, medium and large objects, and figures to compare
    metric = InstanceMeanAP(class_metrics=True, backend=backend)
    metric.update(preds[:3], targets[:3])
    metric.update(preds[3:], targets[3:])
    result = metric.compute()
    got = np.array([result[k].item() for k in MAP_KEYS])
    np.testing.assert_array_equal(
        got, reference.astype(np.float32), err_msg=str(dict(zip(MAP_KEYS, got - reference, strict=True)))
    )
    assert result["classes"].tolist() == [0, 1, 2]  # contiguous labels
    for label, category in enumerate(INSTANCE_CATEGORY_IDS):
        assert result["map_per_class"][label].item() == np.float32(cocoeval_segm(folder, category)[0]), category


def test_torchmetrics_segm_map_drops_images_without_ground_truth(instance_case):
    """Why `InstanceMeanAP` adds an empty crowd region: torchmetrics' segm mAP leaves the
    image without annotations out, with its false positives (AP higher than COCOeval's)."""
    folder, preds, targets, _ = instance_case
    tm_preds, tm_targets = instance_ap_inputs(preds, targets)
    empty = [i for i, t in enumerate(targets) if len(t.labels) == 0]
    assert empty == [4] and tm_targets[4]["iscrowd"].tolist() == [1] and not tm_targets[4]["masks"].any()
    tm_targets[4] = {"masks": targets[4].masks, "labels": targets[4].labels, "iscrowd": targets[4].labels}
    tm_targets[4]["area"] = torch.zeros(0, dtype=torch.float64)
    plain = DetectionMeanAP(iou_type="segm")
    plain.update(tm_preds, tm_targets)
    assert plain.compute()["map"].item() > np.float32(cocoeval_segm(folder)[0])


def test_mask_ap_gathers_every_process_images(instance_case, sync_as_two_processes):
    """With the masks' RLE tuples among its list states, the whole-list gathering gives one
    process's figures (two processes simulated: the gather returns both shards)."""
    _, preds, targets, _ = instance_case
    whole = InstanceMeanAP()
    whole.update(preds, targets)
    first, second = InstanceMeanAP(), InstanceMeanAP()
    first.update(preds[:4], targets[:4])
    second.update(preds[4:], targets[4:])
    sync_as_two_processes(first, second)
    assert len(first.detection_mask) == len(whole.detection_mask) == 6
    assert first.compute()["map"].item() == whole.compute()["map"].item()


def test_predicted_instances_file_gives_the_reported_figures(instance_case, tmp_path):
    """`predict`'s instances.json (`InstanceResult.rows`, `write_table`) read by `COCO.loadRes`
    gives the 12 figures the metric reports: its entries carry no bbox, from which loadRes
    would take each prediction's area, and COCOeval would then put a false positive in the
    size range of its box (the set tells them apart: AP_medium 0.4427 for 0.4702)."""
    folder, preds, targets, _ = instance_case
    metric = InstanceMeanAP()
    metric.update(preds, targets)
    result = metric.compute()
    reported = np.array([result[k].item() for k in MAP_KEYS])
    images = json.loads((folder / "gt.json").read_text())["images"]
    context = ResultContext(
        class_names=[f"c{c}" for c in INSTANCE_CATEGORY_IDS],
        labels=LabelInfo(category_ids=tuple(INSTANCE_CATEGORY_IDS)),
        sizes=[(i["height"], i["width"]) for i in images],
        image_ids=[i["id"] for i in images],
    )
    results = InstanceResult.from_prediction(InstancePrediction(torch.arange(len(preds)), preds), context)
    rows = [row for r in results for row in r.rows()]
    InstanceResult.write_table(rows, folder / "instances.json")
    written = cocoeval_segm(folder, results="instances.json")
    np.testing.assert_allclose(reported, written, atol=1e-6, err_msg=str(dict(zip(MAP_KEYS, written, strict=True))))
    # the same rows with each mask's box: loadRes's areas are the boxes', AP_medium another
    boxed = [{**row, "bbox": mask_utils.toBbox(row["segmentation"]).tolist()} for row in rows]
    (folder / "boxed.json").write_text(json.dumps(boxed))
    assert abs(cocoeval_segm(folder, results="boxed.json")[4] - written[4]) > 0.01
    assert "bbox" in results[0].to_dict()["instances"][0]  # the served and Python results keep the box


def test_instance_results_are_coco_results(instance_case):
    """RLE masks with counts as str, the dataset's category ids, the scores as given."""
    _, preds, _, results = instance_case
    rows = instance_results(preds[0], 7, INSTANCE_CATEGORY_IDS)
    assert len(rows) == len(preds[0].scores) and set(rows[0]) == {"image_id", "category_id", "segmentation", "score"}
    assert all(isinstance(r["segmentation"]["counts"], str) for r in rows)
    decoded = mask_utils.decode([r["segmentation"] for r in rows])  # [H, W, k]
    assert np.array_equal(decoded.transpose(2, 0, 1).astype(bool), preds[0].masks.numpy())
    assert [r["category_id"] for r in rows] == [INSTANCE_CATEGORY_IDS[k] for k in preds[0].labels.tolist()]
    assert [r["score"] for r in rows] == preds[0].scores.tolist()
    assert instance_results(preds[5], 7) == []  # no prediction
    with pytest.raises(ValueError, match="class index 3 has no category id"):
        instance_results(preds[0]._replace(labels=torch.full_like(preds[0].labels, 3)), 7, INSTANCE_CATEGORY_IDS)
