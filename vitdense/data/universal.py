"""COCO panoptic and COCO instance-mask data as `PanopticImages`: the datasets of universal
(semantic / instance / panoptic) segmentation.

Two on-disk formats, each the layout of COCO 2017 and the generic one for users' own data:

    panoptic (`CocoPanopticDataModule`, `load_coco_panoptic`)
    <root>/train2017/<file_name>                          images
    <root>/annotations/panoptic_train2017.json            images, annotations (one per image:
                                                           its PNG and segments_info), categories
    <root>/annotations/panoptic_train2017/<file_name>.png segment ids as RGB (id = R + 256 G + 256² B)

    instances (`CocoInstanceMaskDataModule`, `load_coco_instance_masks`)
    <root>/train2017/<file_name>
    <root>/annotations/instances_train2017.json           `segmentation`: polygons, or RLE with
                                                           list counts (uncompressed) or string counts

The rules:

- Category ids become contiguous labels 0..K-1 in the order the JSON lists its categories
  (COCO's list them by id, as EoMT's `CLASS_MAPPING` does); `category_ids[label]` maps back.
  Panoptic categories say whether they are things (`isthing`); instance categories all are.
- Pixels under no segment (panoptic id 0) are void. Crowd segments (`iscrowd`) are left out
  of the training targets and kept in the evaluation targets, at the original size with
  the annotation's own `area` (PQ and COCOeval ignore predictions on them).
- Polygons are rasterised by pycocotools (`frPyObjects`, `merge`, `decode`, as COCO's API
  and EoMT do), which clips them to the image: COCO's own polygons stray a pixel or so
  outside. Polygon parts of fewer than 3 points are left out with a count in the log
  (pycocotools would take a 2-point part for a box); an annotation left without any is
  left out, counted.

Bad input stops with a `DataError` naming the file, the entry and the fix. Caught when the
JSON is read: a missing key, a repeated id, an unknown image or category, an image without
a panoptic entry, a missing image or PNG, segment id 0 or repeated, an RLE whose `size` is
not its image's. Caught when a sample is read (so `on_bad_sample: skip` skips and counts
it): an unreadable or non-RGB PNG, a PNG of another size than its image, ids in the PNG
that segments_info does not list, segments_info ids without a pixel in the PNG (panopticapi
rejects both), RLE counts that do not add up to the image's pixels, polygon points far
outside the image (more than `POLYGON_SLACK` of its side: made for another image size).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import albumentations as A
import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from vitdense.core.errors import DataError
from vitdense.core.images import apply_orientation, read_image
from vitdense.core.preprocess import Preprocess
from vitdense.data.base import ImageDataModule, LoaderConfig, Triple, require_positive
from vitdense.data.coco_json import _load_json, _require, image_entries
from vitdense.data.transforms.universal import EOMT_SCALE_RANGE, panoptic_eval_transforms, panoptic_train_transforms
from vitdense.results.universal import rgb2id
from vitdense.types import PanopticImages, SegmentTargets

_logger = logging.getLogger(__name__)

PANOPTIC_LAYOUT = (
    "<root>/<images folder>/<file_name> with <root>/annotations/panoptic_<split>.json and its PNGs in "
    "<root>/annotations/panoptic_<split>/ (COCO panoptic)"
)
INSTANCE_LAYOUT = "<root>/<images folder>/<file_name> with <root>/annotations/instances_<split>.json (COCO JSON)"
#: how far a polygon point may lie outside its image, as a fraction of the image's side (and
#: at least 2 px), before it is taken for an annotation of another image size
POLYGON_SLACK = 0.05
#: training draws of the augmentation when one leaves no segment (EoMT draws until one does)
TRAIN_TRIES = 10


@dataclass(frozen=True)
class SegmentCategories:
    """A dataset's categories in label order: the JSON's ids and names, whether each is a
    thing (instances) or stuff (amorphous regions), and their colours when the JSON gives
    them (COCO panoptic's `color`)."""

    ids: list[int]
    names: list[str]
    is_thing: list[bool]
    colours: list[tuple[int, int, int]] | None = None

    @property
    def label_of(self) -> dict[int, int]:
        return {cid: label for label, cid in enumerate(self.ids)}

    def same(self, other: SegmentCategories) -> bool:
        """Whether `other` lists the same categories in the same order (colours aside)."""
        return (self.ids, self.names, self.is_thing) == (other.ids, other.names, other.is_thing)


def _segment_categories(data: dict[str, Any], path: Path, panoptic: bool) -> SegmentCategories:
    _require(data, ("categories",), "the file", path)
    keys = ("id", "name", "isthing") if panoptic else ("id", "name")
    ids, names, things, colours = [], [], [], []
    for i, cat in enumerate(data["categories"]):
        _require(cat, keys, f"categories[{i}]", path)
        if cat["id"] in ids:
            raise DataError(f"{path}: categories[{i}] repeats category id {cat['id']}; category ids must be unique")
        ids.append(int(cat["id"]))
        names.append(str(cat["name"]))
        things.append(bool(cat["isthing"]) if panoptic else True)
        colour = cat.get("color")
        colours.append(tuple(int(c) for c in colour) if isinstance(colour, list) and len(colour) == 3 else None)
    if not ids:
        raise DataError(f"{path}: 'categories' is empty; a segmentation dataset needs at least one category")
    return SegmentCategories(ids, names, things, colours if None not in colours else None)


def read_segment_categories(annotation_file: str | Path, panoptic: bool = True) -> SegmentCategories:
    """The categories of a COCO panoptic (`panoptic`) or instances JSON file, in its order."""
    path = Path(annotation_file)
    _require_file(path, PANOPTIC_LAYOUT if panoptic else INSTANCE_LAYOUT)
    return _segment_categories(_load_json(path), path, panoptic)


def _require_file(path: Path, layout: str) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: annotation file not found; expected layout {layout}")


def _map_dtype(count: int) -> type:
    return np.uint8 if count < 255 else np.int32


@dataclass(frozen=True)
class SegmentLayers:
    """An image's segments in the form the transforms move them.

    Panoptic segments do not overlap: `layers` is one [1, H, W] map holding k + 1 on the
    pixels of segment k and 0 on void, resized once whatever the number of segments (uint8,
    which resizes fastest, unless there are 255 segments or more: int32).
    Instances may overlap: `layers` is [n, H, W] uint8, one mask per instance (one mask of
    zeros when there is none: albumentations cannot stack zero masks).

    Attributes:
        layers: [L, H, W] as above.
        count: n, the number of segments.
        overlapping: instance masks (True) or a panoptic map (False).
    """

    layers: np.ndarray
    count: int
    overlapping: bool

    @classmethod
    def of_map(cls, numbers: np.ndarray, count: int) -> SegmentLayers:
        """[H, W] segment numbers (k + 1 on segment k, 0 void) of `count` segments."""
        return cls(numbers.astype(_map_dtype(count), copy=False)[None], count, False)

    @classmethod
    def of_masks(cls, masks: np.ndarray) -> SegmentLayers:
        """[n, H, W] masks (any integer or bool dtype) of possibly overlapping segments."""
        count = len(masks)
        layers = masks.astype(np.uint8, copy=False) if count else np.zeros((1, *masks.shape[1:]), np.uint8)
        return cls(layers, count, True)

    def select(self, keep: np.ndarray) -> SegmentLayers:
        """The segments where `keep` ([n] bool) is True, renumbered in order; the others'
        pixels become void."""
        if self.overlapping:
            return SegmentLayers.of_masks(self.layers[: self.count][keep])
        lut = np.zeros(self.count + 1, dtype=self.layers.dtype)
        lut[1:][keep] = np.arange(1, int(keep.sum()) + 1)
        return SegmentLayers(lut[self.layers], int(keep.sum()), False)

    def masks(self, layers: np.ndarray | None = None) -> np.ndarray:
        """[n, h, w] bool: one mask per segment, of `layers` (these layers transformed:
        [L, h, w]) or of the layers as read."""
        layers = self.layers if layers is None else np.asarray(layers)
        if self.overlapping:
            return layers[: self.count].astype(bool)
        return layers[0][None] == np.arange(1, self.count + 1, dtype=layers.dtype)[:, None, None]


@dataclass
class SegmentImage:
    """One image entry and its segments as the JSON lists them, checked.

    Attributes:
        id, file_name, height, width: the image entry's.
        labels: [n] int64 contiguous class indices.
        iscrowd: [n] bool.
        area: [n] float32, the annotation's own area (NaN where it gives none: the pixel count).
        segment_ids: [n] int64 ids of the segments in the PNG (panoptic).
        png: the PNG's file name (panoptic).
        segmentations: each instance's polygons or RLE (instances), checked in form.
        ann_ids: each instance's annotation id (instances; for messages).
    """

    id: int
    file_name: str
    height: int
    width: int
    labels: np.ndarray
    iscrowd: np.ndarray
    area: np.ndarray
    segment_ids: np.ndarray | None = None
    png: str | None = None
    segmentations: list[Any] = field(default_factory=list)
    ann_ids: list[Any] = field(default_factory=list)


@dataclass
class SegmentIndex:
    """A COCO panoptic or instances JSON read and checked: categories in label order and
    every image's segments. `layers(i)` reads image i's segments from disk (`SegmentLayers`
    at the image's size)."""

    annotation_file: Path
    image_dir: Path
    categories: SegmentCategories
    images: list[SegmentImage]

    @property
    def image_ids(self) -> list[int]:
        """The JSON's id of each image, in dataset order."""
        return [image.id for image in self.images]

    def layers(self, i: int) -> SegmentLayers:
        raise NotImplementedError


def _unknown_category(path: Path, where: str, category_id: Any, categories: SegmentCategories) -> DataError:
    return DataError(
        f"{path}: {where} has category_id {category_id}, which 'categories' does not list "
        f"(known ids: {', '.join(map(str, categories.ids[:20]))}{', ...' if len(categories.ids) > 20 else ''}); "
        "add the category or fix the id"
    )


@dataclass
class PanopticIndex(SegmentIndex):
    """A COCO panoptic split: the checked JSON and the folder of its PNGs."""

    mask_dir: Path = Path()

    def layers(self, i: int) -> SegmentLayers:
        """Image i's segments from its PNG, checked against segments_info (the module docstring)."""
        entry = self.images[i]
        png = self.mask_dir / str(entry.png)
        try:
            with Image.open(png) as img:
                mode, rgb = img.mode, (np.asarray(img) if img.mode == "RGB" else None)
        except FileNotFoundError as err:
            raise DataError(f"{png}: the panoptic PNG of image id {entry.id} is missing; restore the file") from err
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
            raise DataError(f"{png}: corrupt or unreadable panoptic PNG ({err}); replace the file") from err
        if rgb is None:
            raise DataError(
                f"{png}: a panoptic PNG in PIL mode {mode!r}; COCO panoptic PNGs are RGB, each pixel's segment id "
                "being R + 256 G + 256² B (panopticapi's id2rgb): write them so"
            )
        if rgb.shape[:2] != (entry.height, entry.width):
            raise DataError(
                f"{png} is {rgb.shape[1]}x{rgb.shape[0]} (width x height) but {self.annotation_file} says image id "
                f"{entry.id} ({entry.file_name}) is {entry.width}x{entry.height}; a panoptic PNG must match its image "
                "pixel for pixel: fix the PNG or the image entry"
            )
        ids = rgb2id(rgb)
        present = np.unique(ids)
        inverse = np.searchsorted(present, ids)  # (twice as fast as unique's own inverse: few distinct ids)
        listed = entry.segment_ids
        order = np.argsort(listed, kind="stable")
        where = np.searchsorted(listed[order], present).clip(max=max(len(listed) - 1, 0))
        known = (listed[order][where] == present) if len(listed) else np.zeros(len(present), dtype=bool)
        unknown = present[~known & (present != 0)]
        if unknown.size:
            raise DataError(
                f"{png}: segment ids {unknown[:10].tolist()} are in the PNG but not in the segments_info of image id "
                f"{entry.id} in {self.annotation_file}; add them to segments_info, or set their pixels to 0 (void)"
            )
        absent = np.setdiff1d(listed, present)
        if absent.size:
            raise DataError(
                f"{self.annotation_file}: the segments_info of image id {entry.id} lists segment ids "
                f"{absent[:10].tolist()}, which have no pixel in {png}; remove those entries (a segment needs pixels)"
            )
        lut = np.where(known, order[where] + 1, 0).astype(_map_dtype(len(listed)))
        return SegmentLayers.of_map(lut[inverse], len(listed))


def load_coco_panoptic(
    annotation_file: str | Path, image_dir: str | Path, mask_dir: str | Path, check_files: bool = True
) -> PanopticIndex:
    """Read and check a COCO panoptic JSON file (what is checked: the module docstring).

    Args:
        annotation_file: panoptic_<split>.json.
        image_dir: the folder of the images its `images` list.
        mask_dir: the folder of the PNGs its `annotations` list.
        check_files: require every image and PNG to be present.
    """
    path, image_dir, mask_dir = Path(annotation_file), Path(image_dir), Path(mask_dir)
    _require_file(path, PANOPTIC_LAYOUT)
    data = _load_json(path)
    categories = _segment_categories(data, path, panoptic=True)
    label_of = categories.label_of
    _require(data, ("images", "annotations"), "the file", path)
    entries = image_entries(data, path, image_dir, check_files)
    if not mask_dir.is_dir():
        raise FileNotFoundError(
            f"{mask_dir}: folder of panoptic PNGs not found (listed by {path}); expected layout {PANOPTIC_LAYOUT}"
        )
    found: dict[int, SegmentImage] = {}
    for i, ann in enumerate(data["annotations"]):
        name = (
            f"annotations[{i}] (image id {ann.get('image_id', '?')})" if isinstance(ann, dict) else f"annotations[{i}]"
        )
        _require(ann, ("image_id", "file_name", "segments_info"), name, path)
        img = entries.get(ann["image_id"])
        if img is None:
            raise DataError(f"{path}: {name} refers to image id {ann['image_id']}, which 'images' does not list")
        if ann["image_id"] in found:
            raise DataError(f"{path}: {name} is the second entry of image id {ann['image_id']}; keep one per image")
        if check_files and not (mask_dir / ann["file_name"]).is_file():
            raise DataError(
                f"{path}: {name} names the PNG {ann['file_name']!r}, which is not in {mask_dir}; add the file "
                "(COCO's come zipped in the annotations: extract them with `python data_scripts/coco_panoptic.py`) "
                "or remove the entry"
            )
        if not isinstance(ann["segments_info"], list):
            raise DataError(f"{path}: {name} has segments_info {ann['segments_info']!r}; expected a list of segments")
        ids, labels, iscrowd, area = [], [], [], []
        for j, seg in enumerate(ann["segments_info"]):
            where = f"{name} segments_info[{j}]"
            _require(seg, ("id", "category_id"), where, path)
            if not isinstance(seg["id"], int) or seg["id"] <= 0 or seg["id"] >= 256**3:
                raise DataError(
                    f"{path}: {where} has id {seg['id']!r}; segment ids are integers in 1..256³-1 (0 is void)"
                )
            if seg["id"] in ids:
                raise DataError(f"{path}: {where} repeats segment id {seg['id']}; segment ids must be unique per image")
            if seg["category_id"] not in label_of:
                raise _unknown_category(path, where, seg["category_id"], categories)
            ids.append(seg["id"])
            labels.append(label_of[seg["category_id"]])
            iscrowd.append(bool(seg.get("iscrowd", 0)))
            area.append(float(seg.get("area", np.nan)))
        found[ann["image_id"]] = SegmentImage(
            int(img["id"]),
            str(img["file_name"]),
            int(img["height"]),
            int(img["width"]),
            np.array(labels, dtype=np.int64),
            np.array(iscrowd, dtype=bool),
            np.array(area, dtype=np.float32),
            segment_ids=np.array(ids, dtype=np.int64),
            png=str(ann["file_name"]),
        )
    missing = [img_id for img_id in entries if img_id not in found]
    if missing:
        raise DataError(
            f"{path}: image ids {missing[:10]} have no entry in 'annotations'; give each image one (an empty "
            "segments_info for an image without segments) or remove the images"
        )
    return PanopticIndex(path, image_dir, categories, [found[img_id] for img_id in entries], mask_dir=mask_dir)


def _string_counts(counts: str) -> list[int]:
    """The run lengths of a compressed COCO RLE string (pycocotools' `rleFrString`)."""
    runs: list[int] = []
    p = 0
    while p < len(counts):
        x = k = 0
        more = True
        while more:
            c = ord(counts[p]) - 48
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(runs) > 2:
            x += runs[-2]
        runs.append(x)
    return runs


@dataclass
class InstanceIndex(SegmentIndex):
    """A COCO instances split (things only), masks decoded per sample with pycocotools."""

    def decode(self, entry: SegmentImage, k: int) -> np.ndarray:
        """[H, W] uint8 mask of instance k of `entry` (checks: the module docstring)."""
        from pycocotools import mask as mask_utils

        height, width = entry.height, entry.width
        seg = entry.segmentations[k]
        where = f"{self.annotation_file}: annotation id {entry.ann_ids[k]} (image id {entry.id})"
        if isinstance(seg, list):
            points = np.concatenate([np.asarray(poly, dtype=np.float64) for poly in seg])
            xs, ys = points[0::2], points[1::2]
            sx, sy = max(2.0, POLYGON_SLACK * width), max(2.0, POLYGON_SLACK * height)
            if xs.min() < -sx or xs.max() > width + sx or ys.min() < -sy or ys.max() > height + sy:
                raise DataError(
                    f"{where}: polygon points reach x {xs.min():.0f}..{xs.max():.0f}, y {ys.min():.0f}..{ys.max():.0f} "
                    f"on an image of {width}x{height} (width x height): made for another image or size; "
                    "fix the annotation or the image entry"
                )
            rle = mask_utils.merge(mask_utils.frPyObjects(seg, height, width))
        else:
            counts = seg["counts"]
            try:
                runs = counts if isinstance(counts, list) else _string_counts(counts)
            except IndexError:
                runs = None
            if runs is None or any(r < 0 for r in runs) or sum(runs) != height * width:
                total = "unreadable" if runs is None else f"{sum(runs)} pixels"
                raise DataError(
                    f"{where}: its RLE counts cover {total}, not the {height * width} of its {height}x{width} "
                    "(height x width) image; the RLE is corrupt or of another image: re-encode it"
                )
            rle = mask_utils.frPyObjects(seg, height, width) if isinstance(counts, list) else seg
        return mask_utils.decode(rle)

    def layers(self, i: int) -> SegmentLayers:
        entry = self.images[i]
        masks = np.zeros((len(entry.labels), entry.height, entry.width), dtype=np.uint8)
        for k in range(len(masks)):
            masks[k] = self.decode(entry, k)
        return SegmentLayers.of_masks(masks)


def _check_segmentation(seg: Any, img: dict[str, Any], where: str, path: Path) -> tuple[Any, int]:
    """(the segmentation, checked in form, with its short polygon parts left out or None
    when none is left; how many parts were left out)."""
    if isinstance(seg, list):
        if not all(isinstance(p, list) and all(isinstance(v, int | float) for v in p) for p in seg):
            raise DataError(f"{path}: {where} has a segmentation that is not a list of polygons [x1, y1, x2, y2, ...]")
        if any(len(p) % 2 for p in seg):
            raise DataError(f"{path}: {where} has a polygon with an odd number of coordinates; expected x, y pairs")
        kept = [p for p in seg if len(p) >= 6]
        return (kept or None), len(seg) - len(kept)
    if not isinstance(seg, dict):
        raise DataError(f"{path}: {where} has segmentation {str(seg)[:40]!r}; expected polygons or an RLE object")
    _require(seg, ("size", "counts"), f"{where} segmentation", path)
    if list(seg["size"]) != [img["height"], img["width"]]:
        raise DataError(
            f"{path}: {where} has an RLE of size {seg['size']} (height, width) but image id {img['id']} is "
            f"[{img['height']}, {img['width']}]; the RLE belongs to another image or size: fix the annotation "
            "or the image entry"
        )
    if not isinstance(seg["counts"], list | str):
        raise DataError(f"{path}: {where} has RLE counts that are neither a list of runs nor a compressed string")
    return seg, 0


def load_coco_instance_masks(
    annotation_file: str | Path, image_dir: str | Path, check_files: bool = True
) -> InstanceIndex:
    """Read and check a COCO instances JSON file for its masks (what is checked: the module
    docstring). Every annotation needs `segmentation`; a `bbox` is not read."""
    path = Path(annotation_file)
    _require_file(path, INSTANCE_LAYOUT)
    return instance_index(_load_json(path), path, image_dir, check_files)


def instance_index(data: dict[str, Any], path: Path, image_dir: str | Path, check_files: bool = True) -> InstanceIndex:
    """`load_coco_instance_masks` of COCO JSON already read (`data`, from `path`)."""
    image_dir = Path(image_dir)
    categories = _segment_categories(data, path, panoptic=False)
    label_of = categories.label_of
    _require(data, ("images", "annotations"), "the file", path)
    entries = image_entries(data, path, image_dir, check_files)
    objects: dict[int, list[tuple[Any, dict[str, Any]]]] = {k: [] for k in entries}
    short_parts, dropped, example = 0, 0, None
    for i, ann in enumerate(data["annotations"]):
        name = f"annotations[{i}] (id {ann.get('id', '?')})" if isinstance(ann, dict) else f"annotations[{i}]"
        _require(ann, ("image_id", "category_id", "segmentation"), name, path)
        img = entries.get(ann["image_id"])
        if img is None:
            raise DataError(f"{path}: {name} refers to image id {ann['image_id']}, which 'images' does not list")
        if ann["category_id"] not in label_of:
            raise _unknown_category(path, name, ann["category_id"], categories)
        seg, short = _check_segmentation(ann["segmentation"], img, name, path)
        short_parts += short
        if seg is None:
            dropped += 1
            example = example or name
            continue
        objects[ann["image_id"]].append((seg, ann))
    if short_parts:
        _logger.warning(
            "%s: %d polygon parts of fewer than 3 points left out; %d annotations had no other and are left out%s",
            path,
            short_parts,
            dropped,
            f" (e.g. {example})" if example else "",
        )
    images = []
    for img_id, img in entries.items():
        anns = objects[img_id]
        images.append(
            SegmentImage(
                int(img_id),
                str(img["file_name"]),
                int(img["height"]),
                int(img["width"]),
                np.array([label_of[a["category_id"]] for _, a in anns], dtype=np.int64),
                np.array([bool(a.get("iscrowd", 0)) for _, a in anns], dtype=bool),
                np.array([float(a.get("area", np.nan)) for _, a in anns], dtype=np.float32),
                segmentations=[seg for seg, _ in anns],
                ann_ids=[a.get("id", "?") for _, a in anns],
            )
        )
    return InstanceIndex(path, image_dir, categories, images)


def read_entry_image(index: SegmentIndex, entry: SegmentImage) -> np.ndarray:
    """[H, W, 3] uint8 pixels of an image entry, of the size its JSON gives.

    COCO's sizes and masks are those of the pixels as stored (pycocotools ignores EXIF
    orientation); a dataset annotated on upright photos matches after turning."""
    path = index.image_dir / entry.file_name
    pixels, code = read_image(path)
    if pixels.shape[:2] == (entry.height, entry.width):
        return pixels
    upright = apply_orientation(pixels, code)
    if upright.shape[:2] != (entry.height, entry.width):
        raise DataError(
            f"{path}: the image is {upright.shape[1]}x{upright.shape[0]} (width x height) but {index.annotation_file} "
            f"says {entry.width}x{entry.height}; fix the JSON entry of image id {entry.id}"
        )
    return upright


class CocoSegments(Dataset):
    """A COCO panoptic or instances split as `PanopticImages`.

    Each sample's targets are its non-crowd segments at the transformed image's pixels,
    those the transform left without a pixel dropped; when that drops every one, the
    augmentation is drawn again (EoMT's rule), at most `tries` times. The evaluation
    targets are every segment at the original size, crowds included, with the JSON's areas.

    Args:
        index: the checked JSON (`load_coco_panoptic`, `load_coco_instance_masks`).
        transform: albumentations pipeline called as `transform(image=, masks=)`
            (`panoptic_train_transforms`, `panoptic_eval_transforms`).
        with_eval_targets: attach the original annotation (evaluation).
        tries: augmentation draws per sample at most (training: `TRAIN_TRIES`).
    """

    def __init__(
        self,
        index: SegmentIndex,
        transform: Callable[..., dict[str, Any]],
        with_eval_targets: bool = True,
        tries: int = 1,
    ) -> None:
        self.index = index
        self.transform = transform
        self.with_eval_targets = with_eval_targets
        self.tries = max(1, tries)

    def __len__(self) -> int:
        return len(self.index.images)

    @property
    def image_paths(self) -> list[Path]:
        return [self.index.image_dir / img.file_name for img in self.index.images]

    @property
    def image_ids(self) -> list[int]:
        """Each sample's `image_id` in the JSON (what COCO results name)."""
        return self.index.image_ids

    @property
    def category_ids(self) -> list[int]:
        """The JSON's category id of each class, in label order."""
        return self.index.categories.ids

    def __getitem__(self, i: int) -> PanopticImages:
        entry = self.index.images[i]
        image = read_entry_image(self.index, entry)
        layers = self.index.layers(i)
        learn = ~entry.iscrowd
        train, labels = layers.select(learn), entry.labels[learn]
        for _ in range(self.tries):
            out = self.transform(image=image, masks=train.layers)
            masks = train.masks(out["masks"])
            keep = masks.any(axis=(1, 2))
            if keep.any() or not len(keep):
                break
        img = out["image"]
        height, width = img.shape[-2:]
        targets = SegmentTargets(
            torch.from_numpy(masks[keep]),
            torch.from_numpy(labels[keep]),
            torch.zeros(int(keep.sum()), dtype=torch.bool),
        )
        eval_targets = None
        if self.with_eval_targets:
            full = layers.masks()
            pixels = full.sum(axis=(1, 2)).astype(np.float32)
            area = np.where(np.isnan(entry.area), pixels, entry.area)
            # (copies: a batch's targets must not alias the index a later sample reads)
            labels_all, iscrowd = torch.tensor(entry.labels), torch.tensor(entry.iscrowd)
            eval_targets = SegmentTargets(torch.from_numpy(full), labels_all, iscrowd, torch.from_numpy(area))
        size, orig_size = (int(height), int(width)), (entry.height, entry.width)
        return PanopticImages(img, targets, i, image_sizes=size, orig_sizes=orig_size, eval_targets=eval_targets)


class CocoSegmentsDataModule(ImageDataModule):
    """The base of the COCO segment DataModules (panoptic, instance masks): EoMT's
    augmentation, the categories, and the splits as `CocoSegments` of the checked index a
    subclass reads (`index`).

    Training: flip, large-scale jitter of `img_size` by `scale_range`, black padding and an
    `img_size` x `img_size` crop (`panoptic_train_transforms`); evaluation: the long side
    resized to `eval_size` (`panoptic_eval_transforms`, = `preprocess()`). A subclass sets
    the categories (`set_categories`) in `__init__` and reads a split's files (`read_index`).

    Args:
        root: dataset folder.
        splits: per split ("train", "val", "test"), its image folder and annotation file
            under `root` (then whatever else the subclass's format needs, the PNG folder).
        img_size: side of the square training crops and the jitter's target (EoMT: 640).
        scale_range: the jitter's range (EoMT on COCO: (0.1, 2.0)).
        eval_size: long side of evaluation images (None: img_size, EoMT's).
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    sample_type: ClassVar[type] = PanopticImages

    category_ids: list[int]
    #: whether each class is a thing (countable instances) rather than stuff
    is_thing: list[bool]
    #: [K, 3] colours of the classes when the JSON gives them (COCO panoptic), else None
    palette: tuple[tuple[int, int, int], ...] | None = None

    def __init__(
        self,
        *,
        root: str,
        splits: dict[str, tuple[str, ...]],
        img_size: int,
        scale_range: tuple[float, float],
        eval_size: int | None,
        loader: LoaderConfig,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=img_size, loader=loader, backbone=backbone, mean=mean, std=std, predict_dir=predict_dir
        )
        require_positive(scale_range=scale_range, eval_size=eval_size)
        if scale_range[0] > scale_range[1]:
            raise DataError(f"data.init_args.scale_range={list(scale_range)}: expected [low, high] with low <= high")
        self.scale_range = (float(scale_range[0]), float(scale_range[1]))
        self.eval_size = eval_size or img_size
        self.root = Path(root)
        #: per split ("train", "val", "test"): (image folder, annotation file, ...) under `root`
        self.splits = splits
        self.indexes: dict[str, SegmentIndex] = {}

    def annotation_path(self, split: str) -> Path:
        return self.root / self.splits[split][1]

    @property
    def train_location(self) -> str:
        return str(self.annotation_path("train"))

    def set_categories(self, categories: SegmentCategories) -> None:
        """The classes: labels, names, things, colours (what the CLI links into the task)."""
        self.categories = categories
        self.category_ids, self.class_names = list(categories.ids), list(categories.names)
        self.is_thing = list(categories.is_thing)
        self.num_classes = len(self.class_names)
        self.palette = tuple(categories.colours) if categories.colours is not None else None

    def checked(self, index: SegmentIndex, reference: Path) -> SegmentIndex:
        """`index`, whose categories must be this DataModule's (those of `reference`)."""
        if not index.categories.same(self.categories):
            raise DataError(
                f"{index.annotation_file}: its categories (ids, names, order, things) differ from {reference}'s; "
                "every split must list the same categories"
            )
        return index

    def index(self, split: str) -> SegmentIndex:
        """The checked index of `split` ("train", "val" or "test"), read once; its
        categories must be the validation set's."""
        if split not in self.indexes:
            self.indexes[split] = self.checked(self.read_index(split), self.annotation_path("val"))
        return self.indexes[split]

    def read_index(self, split: str) -> SegmentIndex:
        """The index of `split`, read from its files (a subclass's format)."""
        raise NotImplementedError(f"{type(self).__name__} must implement read_index")

    def train_transforms(self) -> A.Compose:
        return self.seeded(panoptic_train_transforms(self.img_size, self.scale_range, self.mean, self.std))

    def eval_transforms(self) -> A.Compose:
        return panoptic_eval_transforms(self.eval_size, self.mean, self.std)

    def setup_splits(self, stage: str) -> None:
        if stage == "fit":
            train = self.index("train")
            self.train_dataset = CocoSegments(
                train, self.train_transforms(), with_eval_targets=False, tries=TRAIN_TRIES
            )
        if stage in ("fit", "validate", "predict"):
            self.val_dataset = self.predict_dataset = CocoSegments(self.index("val"), self.eval_transforms())
        if stage == "test":
            self.test_dataset = CocoSegments(self.index("test"), self.eval_transforms())

    def preprocess(self) -> Preprocess:
        return Preprocess("rescale", self.eval_size, self.mean, self.std, max_size=self.eval_size)


#: EoMT's 4 images per GPU (on 4 GPUs: 16)
COCO_PANOPTIC_LOADER = LoaderConfig(batch_size=4)


class CocoPanopticDataModule(CocoSegmentsDataModule):
    """COCO 2017 panoptic (133 classes: 80 things, 53 stuff), or any dataset in its layout
    (images + panoptic JSON + PNGs per split), with EoMT's augmentation.

    The classes come from the validation JSON's categories, read at construction so that
    the CLI can give them to the task, unless given (a checkpoint records them, so that
    predicting on a folder of images needs no annotations).

    Args:
        root: dataset folder.
        train_images, val_images, test_images: image folders under `root` (test: the
            validation split unless given).
        train_annotations, val_annotations, test_annotations: panoptic JSON files under `root`.
        train_masks, val_masks, test_masks: folders of the panoptic PNGs under `root`.
        categories: {category id: name} in label order; None: the validation JSON's.
        thing_ids: the category ids of things (needed with `categories`).
        img_size, scale_range, eval_size: see `CocoSegmentsDataModule`.
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    def __init__(
        self,
        *,
        root: str = "data/coco",
        train_images: str = "train2017",
        train_annotations: str = "annotations/panoptic_train2017.json",
        train_masks: str = "annotations/panoptic_train2017",
        val_images: str = "val2017",
        val_annotations: str = "annotations/panoptic_val2017.json",
        val_masks: str = "annotations/panoptic_val2017",
        test_images: str | None = None,
        test_annotations: str | None = None,
        test_masks: str | None = None,
        categories: dict[int, str] | None = None,
        thing_ids: list[int] | None = None,
        img_size: int = 640,
        scale_range: tuple[float, float] = EOMT_SCALE_RANGE,
        eval_size: int | None = None,
        loader: LoaderConfig = COCO_PANOPTIC_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            root=root,
            splits={
                "train": (train_images, train_annotations, train_masks),
                "val": (val_images, val_annotations, val_masks),
                "test": (test_images or val_images, test_annotations or val_annotations, test_masks or val_masks),
            },
            img_size=img_size,
            scale_range=scale_range,
            eval_size=eval_size,
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )
        if categories is None:
            self.set_categories(self.read_categories())
        else:
            if thing_ids is None:
                raise DataError(
                    "data.init_args.categories is given without data.init_args.thing_ids; list the category ids "
                    "of the things (countable objects) too"
                )
            ids = [int(c) for c in categories]
            unknown = sorted(set(map(int, thing_ids)) - set(ids))
            if unknown:
                raise DataError(f"data.init_args.thing_ids {unknown} are not among data.init_args.categories' ids")
            things = set(map(int, thing_ids))
            self.set_categories(SegmentCategories(ids, list(categories.values()), [c in things for c in ids]))
        # a checkpoint records the categories: it predicts on a folder without the JSON
        self.record(
            categories=dict(zip(self.category_ids, self.class_names, strict=True)),
            thing_ids=[c for c, thing in zip(self.category_ids, self.is_thing, strict=True) if thing],
        )

    def read_categories(self) -> SegmentCategories:
        """The dataset's categories, from the validation JSON."""
        path = self.annotation_path("val")
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: COCO panoptic annotations not found; expected layout {PANOPTIC_LAYOUT} (COCO 2017: the "
                f"images with `python data_scripts/coco.py --out {self.root}`, the panoptic annotations with "
                f"`python data_scripts/coco_panoptic.py --out {self.root}`), or point data.init_args.root at your dataset"
            )
        return read_segment_categories(path, panoptic=True)

    def read_index(self, split: str) -> SegmentIndex:
        images, _, masks = self.splits[split]
        return load_coco_panoptic(self.annotation_path(split), self.root / images, self.root / masks)


class CocoInstanceMaskDataModule(CocoSegmentsDataModule):
    """COCO 2017 instance masks (80 things), or any COCO instances JSON with `segmentation`
    polygons or RLEs, with EoMT's augmentation: EoMT's COCO instance segmentation data.

    A class of its own rather than a mode of `CocoPanopticDataModule`: its files (one JSON,
    no PNGs), its masks (which may overlap) and its classes (all things) differ; what both
    share, the augmentation, the samples and the splits, is the base's.

    Args:
        root: dataset folder.
        train_images, val_images, test_images: image folders under `root` (test: the
            validation split unless given).
        train_annotations, val_annotations, test_annotations: COCO instances JSON files under `root`.
        categories: {category id: name} in label order; None: the validation JSON's.
        img_size, scale_range, eval_size: see `CocoSegmentsDataModule`.
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    def __init__(
        self,
        *,
        root: str = "data/coco",
        train_images: str = "train2017",
        train_annotations: str = "annotations/instances_train2017.json",
        val_images: str = "val2017",
        val_annotations: str = "annotations/instances_val2017.json",
        test_images: str | None = None,
        test_annotations: str | None = None,
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
        super().__init__(
            root=root,
            splits={
                "train": (train_images, train_annotations),
                "val": (val_images, val_annotations),
                "test": (test_images or val_images, test_annotations or val_annotations),
            },
            img_size=img_size,
            scale_range=scale_range,
            eval_size=eval_size,
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )
        if categories is None:
            path = self.annotation_path("val")
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path}: COCO instance annotations not found; expected layout {INSTANCE_LAYOUT} (COCO 2017: "
                    f"`python data_scripts/coco.py --out {self.root}`), or point data.init_args.root at your dataset"
                )
            self.set_categories(read_segment_categories(path, panoptic=False))
        else:
            ids = [int(c) for c in categories]
            self.set_categories(SegmentCategories(ids, list(categories.values()), [True] * len(ids)))
        self.record(categories=dict(zip(self.category_ids, self.class_names, strict=True)))

    def read_index(self, split: str) -> SegmentIndex:
        images, _ = self.splits[split]
        return load_coco_instance_masks(self.annotation_path(split), self.root / images)
