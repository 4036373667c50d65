"""YOLO-format data (the layout Ultralytics, most labelling tools and dataset hubs export)
for detection (`YoloDetectionDataModule`) and instance segmentation
(`YoloInstanceMaskDataModule`), and its conversion to COCO JSON for evaluation
(`yolo_to_coco`, `python -m vitdense.data.yolo to-coco`).

The layout:

    <root>/data.yaml            names: [cat, dog] or {0: cat, 1: dog}; train: images/train;
                                val: images/val; optional test, path (the dataset folder,
                                relative to data.yaml's), nc (must equal the names' count)
    <root>/images/train/*.jpg   images (any Pillow format, subfolders allowed)
    <root>/labels/train/*.txt   one line per object: `class cx cy w h` (a box) or
                                `class x1 y1 x2 y2 ... xn yn` (a polygon, n >= 3), every
                                coordinate normalised by the image's width or height

Labels are found as Ultralytics finds them: the image path with its last `images` folder
replaced by `labels` and the suffix by `.txt`.

A keypoint (YOLO-pose) dataset adds to data.yaml `kpt_shape: [K, 3]` (x, y, visibility per
keypoint) or `[K, 2]` (x, y), and optionally `flip_idx` (each keypoint's mirror image),
`kpt_names` (Ultralytics' `{class: [K names]}`; every class must list the same), `skeleton`
(0-based pairs of keypoints) and `kpt_oks_sigmas` (K OKS sigmas, as newer Ultralytics reads
them); its lines are `class cx cy w h x1 y1 v1 ... xK yK vK` (without the v's for
[K, 2]), normalised. Visibility is COCO's (0 not labelled, 1 labelled but hidden, 2
visible); with [K, 2] it is Ultralytics' rule (`verify_image_label`): a keypoint with a
negative x or y is not labelled, any other is (v = 2 here). Keypoints become the COCO
JSON's (pixels, (0, 0, 0) where not labelled; categories with `keypoints` names, "0".."K-1"
without `kpt_names`, and `skeleton`), so `yolo_to_coco` writes a COCO keypoint JSON. OKS
sigmas: `kpt_oks_sigmas`, else COCOeval's when the names are COCO's 17 person keypoints,
else none (Ultralytics' own metric takes COCO's for `kpt_shape: [17, 3]` and 1/K for any
other shape; vitdense does not invent constants: give `keypoint_sigmas`). Without
`flip_idx` training does not flip images (Ultralytics' rule), unless `flip_index` is given.

A split is read into COCO JSON (`read_yolo`) and from there into the COCO readers' indexes
(`coco_index`, `instance_index`), so that a YOLO dataset gives exactly the samples, the
evaluation targets and the AP that its COCO conversion gives. Category ids are the YOLO
class indices (0..K-1); image ids count from 1 in sorted path order; a polygon's box is its
bounds and its area its rasterised pixel count (COCO's own rule); a box's area is w x h.
Image sizes are those of the pixels as stored, as COCO's are: Ultralytics turns
EXIF-rotated photos upright before reading labels, so such images are counted in the log.

The rules (each stops with a `DataError` naming `file:line` and the fix, or is counted in
the log): a line whose field count is neither 5 nor odd >= 7 (5 + K x dim in a keypoint
dataset), a field that is not a number,
a class index that is not an integer in 0..K-1 (K = the `names`' count), a negative box
width or height, a coordinate further than `TOLERANCE` outside [0, 1] — all errors;
coordinates within `TOLERANCE` outside are clipped (counted); in a keypoint dataset also a
visibility outside {0, 1, 2}, a non-finite keypoint value, a malformed `kpt_shape` and a
`flip_idx` that is not a pairing of the K keypoints. An image without a label
file, or with an empty one, has no objects (counted). A label file without an image is
skipped (counted, with an example): labelling tools leave such files (`classes.txt`,
labels of deleted images) and an image whose file is missing has nothing to train on.
For instance segmentation every object must be a polygon: a box line is an error.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vitdense.core.errors import DataError
from vitdense.core.images import _UNREADABLE, IMAGE_SUFFIXES, orientation
from vitdense.data.base import LoaderConfig, Triple
from vitdense.data.coco import COCO_LOADER
from vitdense.data.coco_json import CocoIndex, coco_index
from vitdense.data.detection import DetectionDataModule
from vitdense.data.keypoints import VISIBILITY_RULE, first_bad_visibility, override_schema, schema_from_names
from vitdense.data.transforms.detection import DETR_SCALES
from vitdense.data.transforms.universal import EOMT_SCALE_RANGE
from vitdense.data.universal import (
    COCO_PANOPTIC_LOADER,
    CocoSegmentsDataModule,
    SegmentCategories,
    SegmentIndex,
    instance_index,
)
from vitdense.types.keypoints import KeypointSchema

_logger = logging.getLogger(__name__)

LAYOUT = (
    "<root>/data.yaml (names, train, val), <root>/images/<split>/<image> and <root>/labels/<split>/<image stem>.txt "
    "(YOLO format)"
)
#: how far (in normalised units) a coordinate may lie outside [0, 1] and still be clipped
#: rather than refused: labelling tools round to 6 digits and some snap to the pixel edge
TOLERANCE = 0.01
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class YoloKeypoints:
    """A YOLO-pose data.yaml's keypoint entries, checked.

    Attributes:
        schema: the keypoints (`kpt_names` or "0".."K-1", `skeleton`, `flip_idx` or the
            names' `left_x` <-> `right_x` as a COCO JSON's, `kpt_oks_sigmas` or COCOeval's
            for COCO's 17 names or None).
        dim: values per keypoint on a label line, 3 (x, y, visibility) or 2 (x, y).
        flips: data.yaml gives `flip_idx`: without it nobody knows which keypoints swap in a
            flipped image, and training does not flip (Ultralytics' rule).
    """

    schema: KeypointSchema
    dim: int
    flips: bool


@dataclass(frozen=True)
class YoloConfig:
    """A `data.yaml` read and checked.

    Attributes:
        file: the data.yaml.
        base: the dataset folder split paths are relative to (`path`, or data.yaml's folder).
        names: class names in class-index order.
        splits: {split: its image folder} for the splits data.yaml lists.
        keypoints: a keypoint dataset's entries (`kpt_shape` ...), else None.
    """

    file: Path
    base: Path
    names: list[str]
    splits: dict[str, Path]
    keypoints: YoloKeypoints | None = None

    def images(self, split: str) -> Path:
        """The image folder of `split` (test: val's when data.yaml lists no test)."""
        if split == "test" and "test" not in self.splits:
            split = "val"
        if split not in self.splits:
            raise DataError(f"{self.file}: no {split!r} entry; add `{split}: images/{split}` (a folder of images)")
        return self.splits[split]


def read_data_yaml(file: str | Path) -> YoloConfig:
    """Read and check a YOLO `data.yaml` (see the module docstring)."""
    import yaml

    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"{file}: YOLO data.yaml not found; expected layout {LAYOUT}")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise DataError(f"{file}: not valid YAML ({err})") from err
    if not isinstance(data, dict):
        raise DataError(f"{file}: expected a mapping with names, train and val; expected layout {LAYOUT}")
    if "names" not in data:
        raise DataError(f"{file}: no 'names'; add the class names: `names: [cat, dog]` or `names: {{0: cat, 1: dog}}`")
    names = data["names"]
    if isinstance(names, dict):
        if sorted(names) != list(range(len(names))):
            raise DataError(
                f"{file}: 'names' has keys {sorted(names, key=str)}; expected the class indices 0..{len(names) - 1}"
            )
        names = [names[i] for i in range(len(names))]
    if not isinstance(names, list) or not names:
        raise DataError(f"{file}: 'names' is {names!r}; expected a non-empty list or {{index: name}} mapping")
    if "nc" in data and data["nc"] != len(names):
        raise DataError(f"{file}: nc is {data['nc']} but 'names' lists {len(names)} classes; make them agree")
    base = file.parent / str(data["path"]) if data.get("path") else file.parent
    splits = {}
    for split in SPLITS:
        entry = data.get(split)
        if entry is None:
            continue
        if not isinstance(entry, str) or entry.endswith(".txt"):
            raise DataError(
                f"{file}: {split}: {entry!r}; vitdense reads one folder of images per split "
                f"(`{split}: images/{split}`), not lists of folders or .txt lists of images"
            )
        splits[split] = base / entry
    return YoloConfig(file, base, [str(n) for n in names], splits, _keypoint_entries(data, file))


def _keypoint_entries(data: dict[str, Any], file: Path) -> YoloKeypoints | None:
    """data.yaml's `kpt_shape`, `flip_idx`, `kpt_names`, `skeleton` and `kpt_oks_sigmas`."""
    if data.get("kpt_shape") is None:
        return None
    shape = data["kpt_shape"]
    if not (
        isinstance(shape, list)
        and len(shape) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in shape)
        and shape[0] >= 1
        and shape[1] in (2, 3)
    ):
        raise DataError(
            f"{file}: kpt_shape is {shape!r}; expected [K, 3] (x, y, visibility per keypoint) or [K, 2] (x, y), "
            "K the number of keypoints"
        )
    k, dim = shape
    flip = data.get("flip_idx") or None  # Ultralytics reads [] as no flip_idx
    if flip is not None:
        pairing = (
            isinstance(flip, list)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in flip)
            and sorted(flip) == list(range(k))
            and all(flip[flip[i]] == i for i in range(k))
        )
        if not pairing:
            raise DataError(
                f"{file}: flip_idx {flip!r} is not a pairing of the {k} keypoints; list, for each keypoint, the "
                "index of its mirror image (itself if it has none): K indices, each once, i -> j -> i"
            )
    names = _keypoint_names(data.get("kpt_names"), k, file)
    skeleton = data.get("skeleton") or []
    if not isinstance(skeleton, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(i, int) and 0 <= i < k for i in p) for p in skeleton
    ):
        raise DataError(f"{file}: skeleton {skeleton!r}; expected pairs [i, j] of keypoint indices 0..{k - 1}")
    sigmas = data.get("kpt_oks_sigmas")
    if sigmas is not None and not (isinstance(sigmas, list) and all(isinstance(v, int | float) for v in sigmas)):
        raise DataError(f"{file}: kpt_oks_sigmas {sigmas!r}; expected a list of {k} positive numbers")
    schema = schema_from_names(names, skeleton, flip, sigmas, where=str(file))
    return YoloKeypoints(schema, dim, flip is not None)


def _keypoint_names(given: Any, k: int, file: Path) -> list[str]:
    """`kpt_names` (Ultralytics': {class: [K names]}; also a list of such lists, or one list
    of K names) as one list of K names, or "0".."K-1" without it."""
    if given is None:
        return [str(i) for i in range(k)]
    lists = list(given.values()) if isinstance(given, dict) else given
    if isinstance(lists, list) and lists and all(isinstance(n, str) for n in lists):
        lists = [lists]
    if not (isinstance(lists, list) and lists and all(isinstance(n, list) and len(n) == k for n in lists)):
        raise DataError(f"{file}: kpt_names {given!r}; expected {{class index: [the {k} keypoint names]}}")
    if any([str(n) for n in names] != [str(n) for n in lists[0]] for names in lists):
        raise DataError(
            f"{file}: kpt_names gives different keypoint names to different classes; vitdense reads one set of "
            "keypoints per dataset: give every class the same names"
        )
    return [str(n) for n in lists[0]]


def label_folder(images: Path, config: YoloConfig) -> Path:
    """Ultralytics' rule: the image folder with its last `images` component made `labels`."""
    parts = list(images.parts)
    if "images" not in parts:
        raise DataError(
            f"{config.file}: split folder {images} has no 'images' folder in its path, so its labels cannot be "
            "found; put images in .../images/<split>/ and labels in .../labels/<split>/"
        )
    k = len(parts) - 1 - parts[::-1].index("images")
    parts[k] = "labels"
    return Path(*parts)


@dataclass
class YoloSplit:
    """A YOLO split read as COCO JSON.

    Attributes:
        coco: the COCO JSON (images, annotations with bbox, area, iscrowd 0 and, for
            polygons, segmentation; categories with ids 0..K-1).
        image_dir: the split's image folder (`file_name`s are relative to it).
        sources: `file:line` of each annotation, in order (for messages).
        counts: what was counted (`unlabelled`, `empty`, `orphans`, `clipped`, `rotated`).
        keypoints: a keypoint dataset's data.yaml entries, else None.
    """

    coco: dict[str, Any]
    image_dir: Path
    sources: list[str]
    counts: dict[str, int] = field(default_factory=dict)
    keypoints: YoloKeypoints | None = None


def _image_size(path: Path) -> tuple[int, int, int]:
    """(width, height, EXIF orientation) from the header."""
    try:
        with Image.open(path) as img:
            return img.size[0], img.size[1], orientation(img)
    except _UNREADABLE as err:
        raise DataError(f"{path}: corrupt or unreadable image ({err}); replace or delete the file") from err


def _parse_line(line: str, where: str, num_classes: int, config: YoloConfig) -> tuple[int, np.ndarray, bool, bool]:
    """(class, normalised points [P, 2] (a box: its 2 corners), is_polygon, clipped)."""
    fields = line.split()
    n = len(fields)
    if n != 5 and (n < 7 or n % 2 == 0):
        raise DataError(
            f"{where}: {n} fields; expected `class cx cy w h` (5 fields) or a polygon `class x1 y1 x2 y2 x3 y3 ...` "
            "(7, 9, 11, ... fields); fix or delete the line"
        )
    values = _numbers(line, where)
    cls = _class_index(values[0], fields[0], where, num_classes, config)
    coords = np.asarray(values[1:], dtype=np.float64)
    points = _box_corners(coords, where) if n == 5 else coords.reshape(-1, 2)
    clipped = _in_range(points, where, "coordinates")
    return cls, points.clip(0, 1), n != 5, clipped


def _parse_pose_line(
    line: str, where: str, num_classes: int, config: YoloConfig, keypoints: YoloKeypoints
) -> tuple[int, np.ndarray, np.ndarray, bool]:
    """(class, the box's normalised corners [2, 2], keypoints [K, 3] (x, y normalised, v;
    (0, 0, 0) where not labelled), clipped) of a keypoint dataset's line."""
    fields = line.split()
    k, dim = keypoints.schema.num_keypoints, keypoints.dim
    if len(fields) != 5 + k * dim:
        point = "x y v" if dim == 3 else "x y"
        raise DataError(
            f"{where}: {len(fields)} fields; expected {5 + k * dim} in a keypoint dataset: `class cx cy w h` and "
            f"{k} keypoints `{point}` (kpt_shape [{k}, {dim}] in {config.file}); fix or delete the line"
        )
    values = _numbers(line, where)
    if not np.isfinite(values).all():
        raise DataError(f"{where}: {line.strip()!r} has a non-finite value; fix or delete the line")
    cls = _class_index(values[0], fields[0], where, num_classes, config)
    corners = _box_corners(np.asarray(values[1:5], dtype=np.float64), where)
    clipped = _in_range(corners, where, "coordinates")
    raw = np.asarray(values[5:], dtype=np.float64).reshape(k, dim)
    if dim == 3:
        if (j := first_bad_visibility(raw[:, 2])) is not None:
            raise DataError(f"{where}: keypoint {j} has visibility {fields[5 + 3 * j + 2]}; {VISIBILITY_RULE}")
        v = raw[:, 2]
    else:  # Ultralytics' rule for [K, 2]: a negative coordinate marks a keypoint not labelled
        v = np.where((raw[:, 0] < 0) | (raw[:, 1] < 0), 0.0, 2.0)
    xy = raw[:, :2]
    labelled = v > 0
    if labelled.any():
        clipped |= _in_range(xy[labelled], where, "keypoint coordinates")
    xy = np.where(labelled[:, None], xy.clip(0, 1), 0.0)
    return cls, corners.clip(0, 1), np.concatenate([xy, v[:, None]], 1), clipped


def _numbers(line: str, where: str) -> list[float]:
    try:
        return [float(v) for v in line.split()]
    except ValueError as err:
        raise DataError(f"{where}: {line.strip()!r} is not all numbers ({err}); fix or delete the line") from err


def _class_index(cls: float, field: str, where: str, num_classes: int, config: YoloConfig) -> int:
    if cls != int(cls) or not 0 <= cls < num_classes:
        raise DataError(
            f"{where}: class {field} is not a class index 0..{num_classes - 1} ({config.file} lists "
            f"{num_classes} names); add the class to 'names' or fix the line"
        )
    return int(cls)


def _box_corners(coords: np.ndarray, where: str) -> np.ndarray:
    cx, cy, w, h = coords
    if w < 0 or h < 0:
        raise DataError(f"{where}: negative box width or height ({w:g}, {h:g}); expected `class cx cy w h`")
    return np.array([[cx - w / 2, cy - h / 2], [cx + w / 2, cy + h / 2]])


def _in_range(points: np.ndarray, where: str, what: str) -> bool:
    """Whether `points` need clipping to [0, 1]; an error beyond `TOLERANCE`."""
    low, high = points.min(), points.max()
    if low < -TOLERANCE or high > 1 + TOLERANCE:
        raise DataError(
            f"{where}: {what} reach {low:g}..{high:g}, outside [0, 1]; YOLO labels are normalised by the "
            "image's width and height (pixel coordinates: divide by the image size)"
        )
    return bool(low < 0 or high > 1)


def read_yolo(root: str | Path, split: str, data_yaml: str = "data.yaml") -> YoloSplit:
    """Read and check split `split` of the YOLO dataset at `root` (described by
    `root/data_yaml`) as COCO JSON; the rules are the module docstring's."""
    from pycocotools import mask as mask_utils

    config = read_data_yaml(Path(root) / data_yaml)
    image_dir = config.images(split)
    if not image_dir.is_dir():
        raise FileNotFoundError(f"{image_dir}: image folder of split {split!r} not found (listed by {config.file})")
    labels_dir = label_folder(image_dir, config)
    paths = sorted(
        p
        for p in image_dir.rglob("*")
        if p.is_file()
        and p.suffix.lower() in IMAGE_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(image_dir).parts)
    )
    if not paths:
        raise DataError(f"{image_dir}: no image files in it (looked for {', '.join(IMAGE_SUFFIXES)})")
    counts = dict.fromkeys(("unlabelled", "empty", "orphans", "clipped", "rotated"), 0)
    images, annotations, sources, used = [], [], [], set()
    for image_id, path in enumerate(paths, 1):
        rel = path.relative_to(image_dir)
        width, height, code = _image_size(path)
        counts["rotated"] += code != 1
        images.append({"id": image_id, "file_name": rel.as_posix(), "height": height, "width": width})
        label = labels_dir / rel.with_suffix(".txt")
        used.add(label)
        if not label.is_file():
            counts["unlabelled"] += 1
            continue
        lines = [(k, line) for k, line in enumerate(label.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
        counts["empty"] += not lines
        scale = np.array([width, height], dtype=np.float64)
        for lineno, line in lines:
            where = f"{label}:{lineno}"
            keypoints = None
            if config.keypoints is None:
                cls, points, polygon, clipped = _parse_line(line, where, len(config.names), config)
            else:
                cls, points, keypoints, clipped = _parse_pose_line(
                    line, where, len(config.names), config, config.keypoints
                )
                polygon = False
            counts["clipped"] += clipped
            pixels = points * scale
            (x1, y1), (x2, y2) = pixels.min(0), pixels.max(0)
            ann = {
                "id": len(annotations) + 1,
                "image_id": image_id,
                "category_id": cls,
                "bbox": [float(x1), float(y1), float(x2 - x1), float(y2 - y1)],
                "area": float((x2 - x1) * (y2 - y1)),
                "iscrowd": 0,
            }
            if polygon:
                ann["segmentation"] = [pixels.reshape(-1).tolist()]
                ann["area"] = float(
                    mask_utils.area(mask_utils.merge(mask_utils.frPyObjects(ann["segmentation"], height, width)))
                )
            if keypoints is not None:
                keypoints[:, :2] *= scale
                ann["keypoints"] = keypoints.reshape(-1).tolist()
                ann["num_keypoints"] = int((keypoints[:, 2] > 0).sum())
            annotations.append(ann)
            sources.append(where)
    orphans = sorted(set(labels_dir.rglob("*.txt")) - used) if labels_dir.is_dir() else []
    counts["orphans"] = len(orphans)
    _log(image_dir, labels_dir, len(images), len(annotations), counts, orphans)
    categories = [{"id": i, "name": name, "supercategory": ""} for i, name in enumerate(config.names)]
    if config.keypoints is not None:
        schema = config.keypoints.schema
        for category in categories:  # COCO's keypoint categories: names, and the skeleton 1-based
            category["keypoints"] = list(schema.names)
            category["skeleton"] = [[a + 1, b + 1] for a, b in schema.skeleton]
    coco = {"images": images, "annotations": annotations, "categories": categories}
    return YoloSplit(coco, image_dir, sources, counts, config.keypoints)


def _log(image_dir: Path, labels_dir: Path, images: int, objects: int, counts: dict[str, int], orphans: list) -> None:
    _logger.info(
        "%s: %d images, %d objects; %d images without a label file and %d with an empty one (no objects)",
        image_dir,
        images,
        objects,
        counts["unlabelled"],
        counts["empty"],
    )
    if orphans:
        _logger.warning(
            "%s: %d label files without an image skipped (e.g. %s)", labels_dir, len(orphans), orphans[0].name
        )
    if counts["clipped"]:
        _logger.warning(
            "%s: %d objects with coordinates up to %g outside [0, 1] clipped to the image",
            labels_dir,
            counts["clipped"],
            TOLERANCE,
        )
    if counts["rotated"]:
        _logger.warning(
            "%s: %d images carry an EXIF orientation; their labels are read against the pixels as stored (as COCO's "
            "are), while Ultralytics turns them upright first: check them, or save them upright",
            image_dir,
            counts["rotated"],
        )


def yolo_to_coco(root: str | Path, split: str, data_yaml: str = "data.yaml") -> dict[str, Any]:
    """Split `split` of the YOLO dataset at `root` as COCO JSON (a dict for `json.dump`),
    for COCO tools and evaluation (pycocotools' COCOeval gives the AP vitdense reports).
    Category ids are the class indices; see the module docstring for the rest."""
    return read_yolo(root, split, data_yaml).coco


class YoloDetectionDataModule(DetectionDataModule):
    """A YOLO-format dataset for detection, with DETR's augmentation (polygons give their
    bounding boxes); a YOLO-pose dataset's samples also carry keypoints, and
    `keypoint_schema` (read from data.yaml at construction) describes them.

    Args:
        root: dataset folder.
        data_yaml: the dataset's YOLO data.yaml, under `root`.
        categories: {class index: name}; None: data.yaml's `names` (a checkpoint records
            them, so that predicting on a folder of images needs no dataset).
        keypoint_sigmas: the K OKS sigmas of a keypoint dataset, in place of data.yaml's
            `kpt_oks_sigmas` (without them: COCOeval's for COCO's 17 named keypoints, else
            none, and keypoint AP needs them).
        flip_index: for each keypoint, the index of its mirror image in a flipped image, in
            place of data.yaml's `flip_idx`; without either, training does not flip.
        img_size, scales, max_size, crop_scales, crop_size, eval_short_side, square_resize:
            see `DetectionDataModule`.
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    def __init__(
        self,
        *,
        root: str = "data/yolo",
        data_yaml: str = "data.yaml",
        categories: dict[int, str] | None = None,
        keypoint_sigmas: list[float] | None = None,
        flip_index: list[int] | None = None,
        img_size: int = 224,
        scales: list[int] = list(DETR_SCALES),  # noqa: B006 (jsonargparse reads the default)
        max_size: int | None = 1333,
        crop_scales: list[int] = [400, 500, 600],  # noqa: B006
        crop_size: tuple[int, int] = (384, 600),
        eval_short_side: int = 800,
        square_resize: bool = False,
        loader: LoaderConfig = COCO_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=img_size,
            scales=scales,
            max_size=max_size,
            crop_scales=crop_scales,
            crop_size=crop_size,
            eval_short_side=eval_short_side,
            square_resize=square_resize,
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )
        self.root, self.data_yaml = Path(root), data_yaml
        self.keypoint_sigmas, self.flip_index = keypoint_sigmas, flip_index
        names = _class_names(self.root / data_yaml, categories)
        self.category_ids, self.class_names = list(range(len(names))), names
        self.num_classes = len(names)
        self.record(categories=dict(enumerate(names)))
        self.indexes: dict[str, CocoIndex] = {}
        if categories is None:  # data.yaml was read for the names: its keypoints are known now
            self._keypoints_read(read_data_yaml(self.root / data_yaml).keypoints)

    @property
    def train_location(self) -> str:
        return str(self.root / self.data_yaml) + " (train)"

    def index(self, split: str) -> CocoIndex:
        if split not in self.indexes:
            read = read_yolo(self.root, split, self.data_yaml)
            _same_names(read, self.class_names, self.root / self.data_yaml)
            index = coco_index(read.coco, self.root / self.data_yaml, read.image_dir)
            # data.yaml's flips and sigmas, which COCO JSON has no field for
            index.keypoint_schema = self._keypoints_read(read.keypoints)
            self.indexes[split] = index
        return self.indexes[split]

    def _keypoints_read(self, keypoints: YoloKeypoints | None) -> KeypointSchema | None:
        """Set `keypoint_schema` from data.yaml's keypoint entries and the arguments, and turn
        training flips off when nothing says how the keypoints swap (Ultralytics does the
        same); the schema."""
        schema = override_schema(
            None if keypoints is None else keypoints.schema,
            self.keypoint_sigmas,
            self.flip_index,
            str(self.root / self.data_yaml),
        )
        if keypoints is not None and not keypoints.flips and self.flip_index is None and self.hflip:
            _logger.warning(
                "%s: no flip_idx, so training does not flip images (which keypoints would swap is unknown); add "
                "flip_idx to data.yaml or give data.init_args.flip_index",
                self.root / self.data_yaml,
            )
            self.hflip = 0.0
        self.keypoint_schema = schema
        return schema


class YoloInstanceMaskDataModule(CocoSegmentsDataModule):
    """A YOLO-format segmentation dataset (every object a polygon) for instance segmentation,
    with EoMT's augmentation: `CocoInstanceMaskDataModule`'s samples from YOLO files.

    Args:
        root, data_yaml, categories: see `YoloDetectionDataModule`.
        img_size, scale_range, eval_size: see `CocoSegmentsDataModule`.
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    def __init__(
        self,
        *,
        root: str = "data/yolo",
        data_yaml: str = "data.yaml",
        categories: dict[int, str] | None = None,
        img_size: int = 640,
        scale_range: tuple[float, float] = EOMT_SCALE_RANGE,
        eval_size: int | None = None,
        loader: LoaderConfig = COCO_PANOPTIC_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        # (the splits' "annotation file" is data.yaml: what messages and train_location name)
        splits = {split: ("", data_yaml) for split in SPLITS}
        super().__init__(
            root=root,
            splits=splits,
            img_size=img_size,
            scale_range=scale_range,
            eval_size=eval_size,
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )
        self.data_yaml = data_yaml
        names = _class_names(self.root / data_yaml, categories)
        self.set_categories(SegmentCategories(list(range(len(names))), names, [True] * len(names)))
        self.record(categories=dict(enumerate(names)))

    def read_index(self, split: str) -> SegmentIndex:
        read = read_yolo(self.root, split, self.data_yaml)
        _same_names(read, self.class_names, self.root / self.data_yaml)
        boxes = [
            src for src, ann in zip(read.sources, read.coco["annotations"], strict=True) if "segmentation" not in ann
        ]
        if boxes:
            raise DataError(
                f"{boxes[0]}: a box (`class cx cy w h`) in a dataset read for instance segmentation "
                f"({len(boxes)} such lines); give each object's polygon `class x1 y1 x2 y2 x3 y3 ...`, or read the "
                "dataset with YoloDetectionDataModule"
            )
        return instance_index(read.coco, self.root / self.data_yaml, read.image_dir)


def _class_names(file: Path, categories: dict[int, str] | None) -> list[str]:
    if categories is None:
        return read_data_yaml(file).names
    if sorted(int(k) for k in categories) != list(range(len(categories))):
        raise DataError(f"data.init_args.categories: keys {list(categories)}; expected the class indices 0..K-1")
    return [categories[k] for k in sorted(categories, key=int)]


def _same_names(read: YoloSplit, names: list[str], file: Path) -> None:
    theirs = [c["name"] for c in read.coco["categories"]]
    if theirs != names:
        raise DataError(
            f"{file}: names {theirs} differ from data.init_args.categories {names}; give the same classes or drop "
            "data.init_args.categories"
        )


def main(argv: list[str] | None = None) -> None:
    """`python -m vitdense.data.yolo to-coco --root R --split val --out val.json`."""
    parser = argparse.ArgumentParser(prog="python -m vitdense.data.yolo", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    to_coco = commands.add_parser("to-coco", help="write a split as COCO JSON (category ids = class indices)")
    to_coco.add_argument("--root", required=True, help="the dataset folder (holding data.yaml)")
    to_coco.add_argument("--split", default="val", choices=SPLITS)
    to_coco.add_argument("--data-yaml", default="data.yaml", help="data.yaml's name under --root")
    to_coco.add_argument("--out", required=True, help="the COCO JSON file to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        coco = yolo_to_coco(args.root, args.split, args.data_yaml)
    except (DataError, FileNotFoundError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(coco))
    print(f"{out}: {len(coco['images'])} images, {len(coco['annotations'])} annotations")


if __name__ == "__main__":
    main()
