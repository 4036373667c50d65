"""Keypoint AP, COCO's definition: pycocotools' `COCOeval(iouType="keypoints")` on the
detections' keypoints and the original annotations (`KeypointMeanAP`), or on COCO files
(`evaluate_keypoints`).

Both run COCOeval itself on the same COCO structures: the ground truth as a keypoint
annotation file holds it and the detections as COCO's keypoint results
(`image_id`, `category_id`, `keypoints` as flat (x, y, score) triplets, `score`), read by
`COCO.loadRes`. COCOeval uses the results' third values (here each keypoint's score) for
nothing: OKS reads x and y only, and loadRes takes a detection's area, which places an
unmatched detection in medium or large, from the extent of all its K points.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torchmetrics import Metric
from torchvision.ops import box_convert

from vitdense.metrics.common import WholeListGather
from vitdense.types.keypoints import COCO_PERSON

#: COCOeval's 10 keypoint figures (`stats`, in its order), named as the box metric's
KEYPOINT_AP_KEYS = (
    "map",
    "map_50",
    "map_75",
    "map_medium",
    "map_large",
    "mar",
    "mar_50",
    "mar_75",
    "mar_medium",
    "mar_large",
)

#: COCOeval's keypoint default (`Params.setKpParams`: maxDets [20])
COCO_KEYPOINT_MAX_DETECTIONS = 20

_PRED_FIELDS = ("scores", "labels", "keypoints")
_TARGET_FIELDS = ("boxes", "labels", "iscrowd", "area", "keypoints")


def checked_sigmas(sigmas: Sequence[float] | None, where: str = "the keypoint schema") -> tuple[float, ...]:
    """`sigmas` as a tuple of positive floats, or the error that says where to find them."""
    if sigmas is None:
        raise ValueError(
            f"keypoint AP needs the dataset's per-keypoint OKS sigmas (COCOeval's kpt_oks_sigmas, one per "
            f"keypoint): {where} gives none. Give them (KeypointSchema(sigmas=...), or sigmas=[...]); COCO's 17 "
            "person keypoints have COCO_PERSON_SIGMAS (vitdense.types.keypoints); another dataset's come from its "
            "authors, not from COCO's"
        )
    values = tuple(float(s) for s in sigmas)
    if not values or any(not s > 0 for s in values):
        raise ValueError(f"keypoint AP: OKS sigmas must be positive, one per keypoint; got {list(values)}")
    return values


class KeypointMeanAP(WholeListGather, Metric):
    """COCO's keypoint AP and AR: the 10 figures of pycocotools' COCOeval with
    `iouType="keypoints"` (OKS thresholds 0.50:0.05:0.95, areas all / medium / large, at most
    `max_detections` per image), run on the images given to `update`.

    `update` takes torchmetrics' detection convention, one dict per image (the lists the
    detection task already makes for `DetectionMeanAP`, each with its "keypoints" added):

    - preds: scores [k], labels [k] int64 class indices, keypoints [k, K, 3] (x, y absolute
      pixels of the original image, and each keypoint's score, which COCOeval does not read);
      "boxes", if there, are not read: COCO's keypoint results hold none.
    - target: boxes [n, 4] absolute (x1, y1, x2, y2), labels [n], iscrowd [n], area [n] (the
      annotation's own, which places an object in medium or large), keypoints [n, K, 3] as
      annotated (v in {0, 1, 2}; crowds all 0).

    As in COCOeval, an object without a labelled keypoint (a crowd region, a person with every
    v = 0, an object of a class that has no keypoints) is ignored: a detection that matches it
    counts neither way; a class with no labelled object (one without keypoints) has no AP and
    is left out of the mean. Labels are the categories' ids; images are numbered in the order
    they arrive (after the gathering across processes, rank by rank).

    `compute` returns `KEYPOINT_AP_KEYS` (map, map_50, map_75, map_medium, map_large, mar, ...)
    as float64 scalars, COCOeval's numbers exactly; -1 where COCOeval gives -1 (no labelled
    object in that area range) and everywhere when no image was given. Images without a
    detection count their objects as missed (0 rather than -1, as COCOeval and `DetectionMeanAP`).

    Processes may hold different numbers of images: every state is a list gathered whole
    (`WholeListGather`).

    Args:
        sigmas: the K per-keypoint OKS constants (`KeypointSchema.sigmas`); None is refused with
            a message saying where they come from.
        max_detections: detections per image evaluated, the best scored (COCOeval's 20).
        key_prefix: put before each figure's name (`"keypoint_"` beside the box metric's `map`).
        (and torchmetrics' `Metric` options: compute_on_cpu, process_group, ...)
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(
        self,
        sigmas: Sequence[float] | None,
        max_detections: int = COCO_KEYPOINT_MAX_DETECTIONS,
        key_prefix: str = "",
        **kwargs: Any,  # torchmetrics' `Metric` options (compute_on_cpu, process_group, ...)
    ) -> None:
        super().__init__(**kwargs)
        self.sigmas = checked_sigmas(sigmas)
        self.key_prefix = key_prefix
        if max_detections < 1:
            raise ValueError(f"KeypointMeanAP: max_detections must be at least 1, got {max_detections}")
        self.max_detections = int(max_detections)
        for name in (*(f"det_{f}" for f in _PRED_FIELDS), *(f"gt_{f}" for f in _TARGET_FIELDS)):
            self.add_state(name, default=[], dist_reduce_fx=None)

    def update(self, preds: list[dict[str, torch.Tensor]], target: list[dict[str, torch.Tensor]]) -> None:
        """Add images: `preds` and `target`, one dict per image (see the class)."""
        if len(preds) != len(target):
            raise ValueError(f"KeypointMeanAP.update: {len(preds)} predictions for {len(target)} targets")
        num_keypoints = len(self.sigmas)
        for i, (pred, truth) in enumerate(zip(preds, target, strict=True)):
            p = _fields(pred, _PRED_FIELDS, f"preds[{i}]")
            t = _fields(truth, _TARGET_FIELDS, f"target[{i}]")
            k, n = p["scores"].reshape(-1).shape[0], t["labels"].reshape(-1).shape[0]
            _check_shape(p["keypoints"], (k, num_keypoints, 3), f"preds[{i}]['keypoints']", "[k, K, 3]")
            _check_shape(p["labels"].reshape(-1), (k,), f"preds[{i}]['labels']", "[k] like its scores")
            _check_shape(t["keypoints"], (n, num_keypoints, 3), f"target[{i}]['keypoints']", "[n, K, 3]")
            _check_shape(t["boxes"], (n, 4), f"target[{i}]['boxes']", "[n, 4] xyxy")
            for name in ("iscrowd", "area"):
                _check_shape(t[name].reshape(-1), (n,), f"target[{i}][{name!r}]", "[n] like its labels")
            # float64: the coordinates COCOeval reads are then the ones given (float32 ones exactly)
            self.det_scores.append(p["scores"].reshape(-1).double())
            self.det_labels.append(p["labels"].reshape(-1).long())
            self.det_keypoints.append(p["keypoints"].double())
            self.gt_boxes.append(t["boxes"].double())
            self.gt_labels.append(t["labels"].reshape(-1).long())
            self.gt_iscrowd.append(t["iscrowd"].reshape(-1).long())
            self.gt_area.append(t["area"].reshape(-1).double())
            self.gt_keypoints.append(t["keypoints"].double())

    def compute(self) -> dict[str, torch.Tensor]:
        if not self.gt_labels:  # no image: nothing to measure, as the box metric's -1
            stats = [-1.0] * len(KEYPOINT_AP_KEYS)
        else:
            ground_truth, results = self.coco_inputs()
            stats = run_cocoeval(_coco(ground_truth), results, self.sigmas, self.max_detections)
        return {
            self.key_prefix + key: torch.tensor(value, dtype=torch.float64)
            for key, value in zip(KEYPOINT_AP_KEYS, stats, strict=True)
        }

    def coco_inputs(self) -> tuple[dict[str, list], list[dict[str, Any]]]:
        """The images given so far as COCO files would hold them: the ground truth (images,
        annotations with `bbox` (x, y, w, h), `area`, `iscrowd`, flat `keypoints` and
        `num_keypoints` = the count of v > 0, categories) and the keypoint results."""
        images: list[dict] = []
        annotations: list[dict] = []
        results: list[dict] = []
        categories: set[int] = set()
        for i in range(len(self.gt_labels)):
            # COCOeval records a match as the matched annotation's id and reads 0 as "none": ids start at 1
            image_id = i + 1
            images.append({"id": image_id})
            keypoints = self.gt_keypoints[i].cpu()
            labelled = (keypoints[..., 2] > 0).sum(-1).tolist()
            boxes = box_convert(self.gt_boxes[i].cpu(), "xyxy", "xywh").tolist()
            labels = self.gt_labels[i].tolist()
            for box, label, crowd, area, points, count in zip(
                boxes,
                labels,
                self.gt_iscrowd[i].tolist(),
                self.gt_area[i].tolist(),
                keypoints.flatten(1).tolist(),
                labelled,
                strict=True,
            ):
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": image_id,
                        "category_id": label,
                        "bbox": box,
                        "area": area,
                        "iscrowd": crowd,
                        "keypoints": points,
                        "num_keypoints": count,
                    }
                )
            det_labels = self.det_labels[i].tolist()
            for score, label, points in zip(
                self.det_scores[i].tolist(),
                det_labels,
                self.det_keypoints[i].cpu().flatten(1).tolist(),
                strict=True,
            ):
                results.append({"image_id": image_id, "category_id": label, "keypoints": points, "score": score})
            categories.update(labels)
            categories.update(det_labels)
        ground_truth = {
            "images": images,
            "annotations": annotations,
            "categories": [{"id": c, "name": str(c)} for c in sorted(categories)],
        }
        return ground_truth, results


def evaluate_keypoints(
    gt_json: str | Path,
    results_json: str | Path,
    sigmas: Sequence[float] | None = None,
    max_detections: int = COCO_KEYPOINT_MAX_DETECTIONS,
) -> dict[str, float]:
    """COCO's keypoint figures of a results file, as COCO's own scripts compute them:
    `COCO(gt_json)`, `loadRes(results_json)`, `COCOeval(..., "keypoints")`.

    Args:
        gt_json: a COCO keypoint annotation file (annotations with `keypoints` and
            `num_keypoints`; the categories with keypoints list their names in `keypoints`).
            When some categories list keypoints, only those are evaluated (a file that also
            holds classes without keypoints; COCOeval would find no `num_keypoints` on them).
        results_json: COCO keypoint results: a list of {image_id, category_id, keypoints
            (K flat triplets), score}, without `bbox` (loadRes would read rows with one as
            box results and take each detection's area from its box).
        sigmas: the K OKS constants; None: COCO's when the categories' keypoints are COCO's
            17 person keypoints, else refused.
        max_detections: detections per image evaluated (COCOeval's 20).

    Returns:
        `KEYPOINT_AP_KEYS` -> COCOeval's figure (-1: no labelled object in that range).
    """
    gt_path, results_path = Path(gt_json), Path(results_json)
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        ground_truth = COCO(str(gt_path))
    keypoint_categories = [c for c in ground_truth.dataset.get("categories", []) if c.get("keypoints")]
    if sigmas is None and {tuple(c["keypoints"]) for c in keypoint_categories} == {COCO_PERSON.names}:
        sigmas = COCO_PERSON.sigmas
    sigmas = checked_sigmas(sigmas, f"{gt_path} (its categories' keypoints are not COCO's 17 person keypoints)")
    category_ids = [c["id"] for c in keypoint_categories] or None
    for annotation in ground_truth.loadAnns(ground_truth.getAnnIds(catIds=category_ids or [])):
        if "num_keypoints" not in annotation or "keypoints" not in annotation:
            raise ValueError(
                f"{gt_path}: annotation {annotation.get('id')} has no 'keypoints' or 'num_keypoints', which COCOeval "
                "reads: give every annotation of a keypoint category both (num_keypoints = its points with v > 0)"
            )
    results = json.loads(results_path.read_text())
    if not isinstance(results, list):
        raise ValueError(f"{results_path}: COCO results are a list of detections, got {type(results).__name__}")
    for row in results:
        if "bbox" in row:
            raise ValueError(
                f"{results_path}: a keypoint result has a 'bbox': pycocotools' loadRes would read the file as box "
                "results (each detection's area from its box rather than its keypoints, which changes the medium and "
                "large figures); write COCO's keypoint results: image_id, category_id, keypoints, score"
            )
        if len(row.get("keypoints", ())) != 3 * len(sigmas):
            raise ValueError(
                f"{results_path}: a result's 'keypoints' holds {len(row.get('keypoints', ()))} values; expected "
                f"{3 * len(sigmas)} (x, y, score for each of the {len(sigmas)} keypoints of the sigmas)"
            )
    stats = run_cocoeval(ground_truth, results, sigmas, max_detections, category_ids)
    return dict(zip(KEYPOINT_AP_KEYS, stats, strict=True))


def run_cocoeval(
    ground_truth: COCO,
    results: list[dict[str, Any]],
    sigmas: Sequence[float],
    max_detections: int = COCO_KEYPOINT_MAX_DETECTIONS,
    category_ids: list[int] | None = None,
) -> list[float]:
    """COCOeval's 10 keypoint figures (`stats`) of `results` (COCO keypoint results, read by
    `loadRes`, which adds their ids, boxes and areas) against `ground_truth`."""
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        if results:
            detections = ground_truth.loadRes(results)
        else:  # loadRes reads the first row to tell the kind of results; none: an empty set, as a file would give
            categories = ground_truth.dataset.get("categories", [])
            detections = _coco({"images": ground_truth.dataset["images"], "categories": categories, "annotations": []})
        evaluator = COCOeval(ground_truth, detections, "keypoints")
        evaluator.params.kpt_oks_sigmas = np.array(sigmas, dtype=np.float64)
        evaluator.params.maxDets = [max_detections]
        if category_ids is not None:
            evaluator.params.catIds = category_ids
        evaluator.evaluate()
        evaluator.accumulate()
    return _summary(evaluator)


def _summary(evaluator: COCOeval) -> list[float]:
    """`COCOeval.summarize`'s keypoint figures, read as it reads them but at the run's own
    `maxDets` (summarize reads the keypoint figures at 20 detections, whatever was run: -1
    for any other count)."""
    params = evaluator.params
    precision = evaluator.eval["precision"]  # [T, R, C, A, M]: OKS thresholds, recall points, classes, areas, maxDets
    recall = evaluator.eval["recall"]  # [T, C, A, M]
    stats = []
    for values in (precision, recall):
        for threshold, area in ((None, "all"), (0.5, "all"), (0.75, "all"), (None, "medium"), (None, "large")):
            s = values if threshold is None else values[np.where(threshold == params.iouThrs)[0]]
            s = s[..., params.areaRngLbl.index(area), -1]
            valid = s[s > -1]  # -1: a class without a labelled object in the range
            stats.append(-1.0 if valid.size == 0 else float(np.mean(valid)))
    return stats


def _coco(dataset: dict[str, Any]) -> COCO:
    """A pycocotools `COCO` of an in-memory annotation file."""
    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def _fields(entry: dict[str, torch.Tensor], names: tuple[str, ...], where: str) -> dict[str, torch.Tensor]:
    missing = [name for name in names if name not in entry]
    if missing:
        raise ValueError(f"KeypointMeanAP.update: {where} has no {missing}; it needs {list(names)}")
    return {name: torch.as_tensor(entry[name]).detach() for name in names}


def _check_shape(value: torch.Tensor, shape: tuple[int, ...], where: str, expected: str) -> None:
    if tuple(value.shape) != shape:
        raise ValueError(f"KeypointMeanAP.update: {where} is {list(value.shape)}, expected {expected} = {list(shape)}")
