"""The COCO JSON format (COCO 2017 and anyone's own images + JSON): reading and checking
the JSON (`load_coco` -> `CocoIndex`). Results are written as `vitdense.results.DetectionResult`
rows; the DataModule that reads the format is `vitdense.data.coco.COCODataModule`.

The layout is COCO's, the generic one for users' own datasets:

    <root>/train2017/<file_name>                   images (any folder name; `train_images`)
    <root>/val2017/<file_name>
    <root>/annotations/instances_train2017.json   COCO JSON (`train_annotations`)
    <root>/annotations/instances_val2017.json

Category ids become contiguous labels 0..K-1 in increasing id order (class names from the
JSON) and are mapped back with `category_ids[label]` for evaluation and export. Crowd
annotations are left out of the training targets but kept in the evaluation targets
(COCOeval ignores detections that fall on them); each annotation's own `area` decides
small/medium/large. Training boxes are clipped to their image and those left without area
are dropped, with a count in the log. Images without annotations are kept.

A keypoint JSON (`person_keypoints_*.json`: categories with `keypoints` names and a
`skeleton`) also gives the index its `KeypointSchema` and every object its [K, 3] keypoints,
read and checked by `vitdense.data.keypoints`; a JSON without keypoint names reads as a
plain detection one.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitdense.core.errors import DataError
from vitdense.data.keypoints import annotation_keypoints, coco_keypoint_schema
from vitdense.types.keypoints import KeypointSchema

_logger = logging.getLogger(__name__)

LAYOUT = "<root>/<images folder>/<file_name> with <root>/annotations/instances_<split>.json (COCO JSON)"


@dataclass
class CocoImage:
    """One image entry and its annotations, checked.

    `boxes` are the training targets (x1, y1, x2, y2 pixels, clipped, crowds and empty boxes
    out) with `labels`; `eval_*` are all of the image's annotations as written (COCO
    xywh turned into corners), crowds included, for evaluation. With a keypoint JSON,
    `keypoints` [n, K, 3] float32 are the training objects' (aligned with `boxes`) and
    `eval_keypoints` [m, K, 3] every annotation's (aligned with `eval_boxes`; a crowd's all
    0), as annotated: (x, y) pixels, v in {0, 1, 2}, (0, 0, 0) where not labelled; else None."""

    id: int
    file_name: str
    height: int
    width: int
    boxes: np.ndarray
    labels: np.ndarray
    eval_boxes: np.ndarray
    eval_labels: np.ndarray
    eval_iscrowd: np.ndarray
    eval_area: np.ndarray
    keypoints: np.ndarray | None = None
    eval_keypoints: np.ndarray | None = None


@dataclass
class CocoIndex:
    """A COCO JSON file read and checked: categories in id order and every image's objects;
    `keypoint_schema` the keypoints its categories name (None: a plain detection JSON)."""

    annotation_file: Path
    image_dir: Path
    category_ids: list[int]
    class_names: list[str]
    images: list[CocoImage]
    keypoint_schema: KeypointSchema | None = None

    @property
    def image_ids(self) -> list[int]:
        """The JSON's id of each image, in dataset order."""
        return [image.id for image in self.images]


def image_entries(
    data: dict[str, Any], path: Path, image_dir: Path, check_files: bool, hint: str = ""
) -> dict[int, dict[str, Any]]:
    """The checked `images` of the COCO JSON `data` read from `path`, by id: each with id,
    file_name, height and width, ids unique, and (with `check_files`) its file in
    `image_dir`. `hint` ends the message of a missing image folder (the expected layout)."""
    if not image_dir.is_dir():
        raise FileNotFoundError(f"{image_dir}: image folder not found (listed by {path}){hint}")
    entries: dict[int, dict[str, Any]] = {}
    for i, img in enumerate(data["images"]):
        _require(img, ("id", "file_name", "height", "width"), f"images[{i}]", path)
        if img["id"] in entries:
            raise DataError(f"{path}: images[{i}] repeats image id {img['id']}; image ids must be unique")
        if check_files and not (image_dir / img["file_name"]).is_file():
            raise DataError(
                f"{path}: images[{i}] (id {img['id']}) lists {img['file_name']!r}, which is not in {image_dir}; "
                "add the file or remove the entry"
            )
        entries[img["id"]] = img
    return entries


def _require(entry: Any, keys: tuple[str, ...], where: str, path: Path) -> None:
    if not isinstance(entry, dict):
        raise DataError(f"{path}: {where} is a {type(entry).__name__}, expected an object with {', '.join(keys)}")
    missing = [k for k in keys if k not in entry]
    if missing:
        raise DataError(
            f"{path}: {where} has no {', '.join(repr(k) for k in missing)} (every entry needs {', '.join(keys)})"
        )


def _load_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: COCO annotation file not found; expected layout {LAYOUT}")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a COCO JSON object with images, annotations, categories")
    return data


def read_categories(annotation_file: str | Path) -> tuple[list[int], list[str]]:
    """(category ids in increasing order, their names) from a COCO JSON file."""
    ids, names, _ = read_header(annotation_file)
    return ids, names


def read_header(annotation_file: str | Path) -> tuple[list[int], list[str], KeypointSchema | None]:
    """(category ids in increasing order, their names, the keypoint schema or None) from a
    COCO JSON file: what a DataModule tells its task before reading the images."""
    path = Path(annotation_file)
    data = _load_json(path)
    ids, names = _categories(data, path)
    return ids, names, coco_keypoint_schema(data["categories"], path)[0]


def _categories(data: dict[str, Any], path: Path) -> tuple[list[int], list[str]]:
    _require(data, ("categories",), "the file", path)
    names: dict[int, str] = {}
    for i, cat in enumerate(data["categories"]):
        _require(cat, ("id", "name"), f"categories[{i}]", path)
        if cat["id"] in names:
            raise DataError(f"{path}: categories[{i}] repeats category id {cat['id']}; category ids must be unique")
        names[int(cat["id"])] = str(cat["name"])
    if not names:
        raise DataError(f"{path}: 'categories' is empty; a detection dataset needs at least one category")
    ids = sorted(names)
    return ids, [names[i] for i in ids]


def load_coco(annotation_file: str | Path, image_dir: str | Path, check_files: bool = True) -> CocoIndex:
    """Read and check a COCO JSON file.

    Stops with a `DataError` naming the field and the entry on: a missing key, a repeated
    image or category id, an annotation of an unknown image or category, a bbox that is not
    four numbers, or (with `check_files`) an image listed but absent from `image_dir`; in a
    keypoint JSON also on categories with different keypoints, keypoints on a category that
    names none, and the annotation checks of `vitdense.data.keypoints.annotation_keypoints`.
    """
    path = Path(annotation_file)
    return coco_index(_load_json(path), path, image_dir, check_files)


def coco_index(data: dict[str, Any], path: Path, image_dir: str | Path, check_files: bool = True) -> CocoIndex:
    """`load_coco` of COCO JSON already read (`data`, from `path`): other formats converted
    to COCO's (`vitdense.data.yolo`) give the samples a COCO file of the same boxes gives."""
    image_dir = Path(image_dir)
    _require(data, ("images", "annotations", "categories"), "the file", path)
    category_ids, class_names = _categories(data, path)
    label_of = {cid: label for label, cid in enumerate(category_ids)}
    schema, named = coco_keypoint_schema(data["categories"], path)
    entries = image_entries(data, path, image_dir, check_files, f"; expected layout {LAYOUT}")
    objects: dict[int, list[dict[str, Any]]] = {k: [] for k in entries}
    points: dict[int, list[np.ndarray]] = {k: [] for k in entries}
    unread = 0  # annotations with keypoints in a JSON whose categories name none
    for i, ann in enumerate(data["annotations"]):
        name = f"annotations[{i}] (id {ann.get('id', '?')})" if isinstance(ann, dict) else f"annotations[{i}]"
        _require(ann, ("image_id", "category_id", "bbox"), name, path)
        if ann["image_id"] not in entries:
            raise DataError(f"{path}: {name} refers to image id {ann['image_id']}, which 'images' does not list")
        if ann["category_id"] not in label_of:
            raise DataError(
                f"{path}: {name} has category_id {ann['category_id']}, which 'categories' does not list "
                f"(known ids: {category_ids[0]}..{category_ids[-1]})"
            )
        bbox = ann["bbox"]
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, int | float) for v in bbox)):
            raise DataError(f"{path}: {name} has bbox {bbox!r}; expected [x, y, width, height] in pixels")
        objects[ann["image_id"]].append(ann)
        if schema is None:
            unread += bool(ann.get("keypoints"))
            continue
        kps = annotation_keypoints(ann, schema, f"{path}: {name}")
        if ann["category_id"] not in named and kps[:, 2].any():
            raise DataError(
                f"{path}: {name} has labelled keypoints but its category {ann['category_id']} lists no keypoint "
                f"names; every category whose annotations carry keypoints lists the same 'keypoints' "
                f"({list(schema.names)})"
            )
        points[ann["image_id"]].append(kps)
    if unread:
        _logger.warning(
            "%s: %d annotations carry keypoints but no category names them (no 'keypoints' list): read as boxes only",
            path,
            unread,
        )

    images, dropped, example = [], 0, None
    for img_id, img in entries.items():
        anns = objects[img_id]
        xywh = np.array([a["bbox"] for a in anns], dtype=np.float64).reshape(-1, 4)
        corners = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1)
        labels = np.array([label_of[a["category_id"]] for a in anns], dtype=np.int64)
        iscrowd = np.array([int(a.get("iscrowd", 0)) for a in anns], dtype=np.int64)
        area = np.array([float(a.get("area", w * h)) for a, (_, _, w, h) in zip(anns, xywh, strict=True)])
        clipped = corners.copy()
        clipped[:, 0::2] = clipped[:, 0::2].clip(0, img["width"])
        clipped[:, 1::2] = clipped[:, 1::2].clip(0, img["height"])
        has_area = (clipped[:, 2] > clipped[:, 0]) & (clipped[:, 3] > clipped[:, 1])
        keep = has_area & (iscrowd == 0)
        kps = None
        if schema is not None:
            kps = np.stack(points[img_id]) if anns else np.zeros((0, schema.num_keypoints, 3), np.float32)
        if (~has_area).any():
            dropped += int((~has_area).sum())
            example = example or f"image id {img_id}, annotation id {anns[int(np.argmin(has_area))].get('id', '?')}"
        images.append(
            CocoImage(
                int(img_id),
                str(img["file_name"]),
                int(img["height"]),
                int(img["width"]),
                clipped[keep].astype(np.float32),
                labels[keep],
                corners.astype(np.float32),
                labels,
                iscrowd,
                area.astype(np.float32),
                None if kps is None else kps[keep],
                kps,
            )
        )
    if dropped:
        _logger.warning(
            "%s: %d boxes have no area once clipped to their image and are left out of training (e.g. %s)",
            path,
            dropped,
            example,
        )
    return CocoIndex(path, image_dir, category_ids, class_names, images, schema)
