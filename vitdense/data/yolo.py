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

A split is read into COCO JSON (`read_yolo`) and from there into the COCO readers' indexes
(`coco_index`, `instance_index`), so that a YOLO dataset gives exactly the samples, the
evaluation targets and the AP that its COCO conversion gives. Category ids are the YOLO
class indices (0..K-1); image ids count from 1 in sorted path order; a polygon's box is its
bounds and its area its rasterised pixel count (COCO's own rule); a box's area is w x h.
Image sizes are those of the pixels as stored, as COCO's are: Ultralytics turns
EXIF-rotated photos upright before reading labels, so such images are counted in the log.

The rules (each stops with a `DataError` naming `file:line` and the fix, or is counted in
the log): a line whose field count is neither 5 nor odd >= 7, a field that is not a number,
a class index that is not an integer in 0..K-1 (K = the `names`' count), a negative box
width or height, a coordinate further than `TOLERANCE` outside [0, 1] — all errors;
coordinates within `TOLERANCE` outside are clipped (counted). An image without a label
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
from vitdense.data.transforms.detection import DETR_SCALES
from vitdense.data.transforms.universal import EOMT_SCALE_RANGE
from vitdense.data.universal import (
    COCO_PANOPTIC_LOADER,
    CocoSegmentsDataModule,
    SegmentCategories,
    SegmentIndex,
    instance_index,
)

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
class YoloConfig:
    """A `data.yaml` read and checked.

    Attributes:
        file: the data.yaml.
        base: the dataset folder split paths are relative to (`path`, or data.yaml's folder).
        names: class names in class-index order.
        splits: {split: its image folder} for the splits data.yaml lists.
    """

    file: Path
    base: Path
    names: list[str]
    splits: dict[str, Path]

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
    return YoloConfig(file, base, [str(n) for n in names], splits)


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
    """

    coco: dict[str, Any]
    image_dir: Path
    sources: list[str]
    counts: dict[str, int] = field(default_factory=dict)


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
    try:
        values = [float(v) for v in fields]
    except ValueError as err:
        raise DataError(f"{where}: {line.strip()!r} is not all numbers ({err}); fix or delete the line") from err
    cls = values[0]
    if cls != int(cls) or not 0 <= cls < num_classes:
        raise DataError(
            f"{where}: class {fields[0]} is not a class index 0..{num_classes - 1} ({config.file} lists "
            f"{num_classes} names); add the class to 'names' or fix the line"
        )
    coords = np.asarray(values[1:], dtype=np.float64)
    if n == 5:
        cx, cy, w, h = coords
        if w < 0 or h < 0:
            raise DataError(f"{where}: negative box width or height ({w:g}, {h:g}); expected `class cx cy w h`")
        points = np.array([[cx - w / 2, cy - h / 2], [cx + w / 2, cy + h / 2]])
    else:
        points = coords.reshape(-1, 2)
    low, high = points.min(), points.max()
    if low < -TOLERANCE or high > 1 + TOLERANCE:
        raise DataError(
            f"{where}: coordinates reach {low:g}..{high:g}, outside [0, 1]; YOLO labels are normalised by the "
            "image's width and height (pixel coordinates: divide by the image size)"
        )
    clipped = bool(low < 0 or high > 1)
    return int(cls), points.clip(0, 1), n != 5, clipped


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
            cls, points, polygon, clipped = _parse_line(line, where, len(config.names), config)
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
            annotations.append(ann)
            sources.append(where)
    orphans = sorted(set(labels_dir.rglob("*.txt")) - used) if labels_dir.is_dir() else []
    counts["orphans"] = len(orphans)
    _log(image_dir, labels_dir, len(images), len(annotations), counts, orphans)
    categories = [{"id": i, "name": name, "supercategory": ""} for i, name in enumerate(config.names)]
    coco = {"images": images, "annotations": annotations, "categories": categories}
    return YoloSplit(coco, image_dir, sources, counts)


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
    bounding boxes).

    Args:
        root: dataset folder.
        data_yaml: the dataset's YOLO data.yaml, under `root`.
        categories: {class index: name}; None: data.yaml's `names` (a checkpoint records
            them, so that predicting on a folder of images needs no dataset).
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
        names = _class_names(self.root / data_yaml, categories)
        self.category_ids, self.class_names = list(range(len(names))), names
        self.num_classes = len(names)
        self.record(categories=dict(enumerate(names)))
        self.indexes: dict[str, CocoIndex] = {}

    @property
    def train_location(self) -> str:
        return str(self.root / self.data_yaml) + " (train)"

    def index(self, split: str) -> CocoIndex:
        if split not in self.indexes:
            read = read_yolo(self.root, split, self.data_yaml)
            _same_names(read, self.class_names, self.root / self.data_yaml)
            self.indexes[split] = coco_index(read.coco, self.root / self.data_yaml, read.image_dir)
        return self.indexes[split]


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
