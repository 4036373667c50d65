"""Offline synthetic panoptic data, written to disk as a COCO panoptic dataset (JPEG images,
RGB PNGs of segment ids, one JSON per split).

For the CPU demo and the tests, where no dataset can be downloaded: the data goes through
the same files, JSON checks, PNG decoding and augmentation as COCO panoptic. A scene is a
landscape of stuff — sky above a wavy horizon, grass and water below, each with its own
texture — with 0 to 5 things on it: discs, squares and triangles of their own colours and
textures and of different sizes, which may touch and hide one another (the one drawn last
owns the pixels it covers). Some scenes keep a thin void line along the stuff borders, and
some hold a crowd: a cluster of small discs annotated as one `iscrowd` segment. Category ids
are non-dense on purpose (2, 5, 9, 101, 130, 170), so that the mapping to contiguous labels
is exercised wherever this data is used; segment ids are random 24-bit numbers, so that
the PNG's RGB encoding is too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image
from scipy.ndimage import find_objects

from vitdense.data.base import LoaderConfig, Triple
from vitdense.data.synthetic.classification import WrittenOnFirstUse
from vitdense.data.universal import CocoPanopticDataModule, SegmentCategories
from vitdense.results.universal import id2rgb

#: (category id, name, is a thing, colour), in the JSON's (label) order: things first, as COCO's
CATEGORIES = (
    (2, "disc", True, (225, 70, 40)),
    (5, "square", True, (240, 205, 50)),
    (9, "triangle", True, (205, 70, 215)),
    (101, "sky", False, (135, 185, 235)),
    (130, "grass", False, (70, 150, 60)),
    (170, "water", False, (40, 85, 165)),
)
DISC, SQUARE, TRIANGLE, SKY, GRASS, WATER = range(len(CATEGORIES))
#: segments smaller than this (pixels) after occlusion become void (too small to learn)
MIN_PIXELS = 8


def synthetic_categories() -> SegmentCategories:
    """The synthetic set's categories, as its JSON lists them."""
    ids, names, things, colours = zip(*CATEGORIES, strict=True)
    return SegmentCategories(list(ids), list(names), list(things), list(colours))


def _wavy(width: int, level: float, rng: np.random.Generator, amplitude: float) -> np.ndarray:
    """[W] row of a border at `level` that waves by up to `amplitude` rows."""
    x = np.arange(width, dtype=np.float32)
    a, f, phase = rng.uniform(0, amplitude), rng.uniform(0.5, 2.5), rng.uniform(0, 2 * np.pi)
    return level + a * np.sin(2 * np.pi * f * x / width + phase)


def _stuff(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """[H, W] stuff labels (SKY, GRASS, WATER): sky above a horizon (most scenes), grass
    and/or water in bands below it."""
    rows = np.arange(height, dtype=np.float32)[:, None]
    labels = np.full((height, width), GRASS if rng.random() < 0.5 else WATER, dtype=np.int64)
    top = 0.0
    if rng.random() < 0.85:
        horizon = _wavy(width, rng.uniform(0.25, 0.55) * height, rng, 0.06 * height)
        labels[rows < horizon] = SKY
        top = float(horizon.max())
    if rng.random() < 0.5:  # a second band: the other ground below the first
        level = rng.uniform(top + 0.15 * height, 0.9 * height) if top + 0.15 * height < 0.9 * height else top
        border = _wavy(width, level, rng, 0.04 * height)
        first = labels[-1, 0]
        labels[(rows >= border) & (labels != SKY)] = WATER if first == GRASS else GRASS
    return labels


def _paint_stuff(image: np.ndarray, labels: np.ndarray, grid: np.ndarray, rng: np.random.Generator) -> None:
    """Each stuff region's texture: a graded sky, streaky grass, striped water."""
    height, width = labels.shape
    streaks = rng.normal(0, 0.08, width).astype(np.float32)
    for label in np.unique(labels):
        region = labels == label
        yy, xx = grid[0][region], grid[1][region]
        colour = np.asarray(CATEGORIES[label][3], dtype=np.float32) / 255 * rng.uniform(0.85, 1.1)
        noise = rng.normal(0, 1, (len(yy), 1)).astype(np.float32)
        if label == SKY:
            texture = colour * (1.0 + 0.25 * yy / height)[:, None] + 0.02 * noise
        elif label == GRASS:
            texture = colour * (1.0 + streaks[xx.astype(np.int64)])[:, None] + 0.07 * noise
        else:
            stripes = 0.12 * np.sin(yy * rng.uniform(0.6, 1.2) + 0.2 * np.sin(xx * 0.3))
            texture = colour * (1.0 + stripes)[:, None] + 0.03 * noise
        image[region] = texture


def _shape(kind: int, grid: np.ndarray, cy: float, cx: float, radius: float) -> np.ndarray:
    """[H, W] bool of a thing centred at (cy, cx) on `grid` ([2, H, W] pixel rows and columns)."""
    dy, dx = grid[0] - cy, grid[1] - cx
    if kind == DISC:
        return dy**2 + dx**2 <= radius**2
    if kind == SQUARE:
        return (np.abs(dy) <= 0.85 * radius) & (np.abs(dx) <= 0.85 * radius)
    return (dy <= 0.7 * radius) & (dy >= -radius + 2 * np.abs(dx))


def _paint_thing(image: np.ndarray, mask: np.ndarray, kind: int, rng: np.random.Generator) -> None:
    """A thing's look: discs shaded towards their rim, squares checkered, triangles striped."""
    colour = np.asarray(CATEGORIES[kind][3], dtype=np.float32) / 255 * rng.uniform(0.9, 1.1)
    ys, xs = np.nonzero(mask)
    if kind == DISC:
        d = np.hypot(ys - ys.mean(), xs - xs.mean())
        shade = 1.0 - 0.35 * (d / max(d.max(), 1.0))
    elif kind == SQUARE:
        shade = np.where(((ys // 3) + (xs // 3)) % 2 == 0, 1.0, 0.8)
    else:
        shade = np.where(((ys + xs) // 3) % 2 == 0, 1.0, 0.7)
    image[ys, xs] = np.clip(colour * shade[:, None], 0, 1)


def panoptic_scene(
    height: int, width: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, bool]]]:
    """One scene: ([H, W, 3] uint8 image, [H, W] int64 segment numbers (k + 1 on segment k,
    0 void), [(label, iscrowd) of each segment]).

    The stuff regions come first (one segment per stuff class present), then an optional
    crowd of 4-7 small discs (one segment), then 0-5 things (one segment each) over them.
    """
    image = np.zeros((height, width, 3), dtype=np.float32)
    grid = np.mgrid[:height, :width].astype(np.float32)
    stuff = _stuff(height, width, rng)
    _paint_stuff(image, stuff, grid, rng)
    numbers = np.zeros((height, width), dtype=np.int64)
    segments: list[tuple[int, bool]] = []
    for label in np.unique(stuff):
        segments.append((int(label), False))
        numbers[stuff == label] = len(segments)
    if rng.random() < 0.5:  # a thin void line where the stuff changes (COCO leaves borders unlabelled)
        edge = np.zeros_like(stuff, dtype=bool)
        edge[1:] |= stuff[1:] != stuff[:-1]
        numbers[edge] = 0
        image[edge] = rng.uniform(0.0, 0.15)
    side = min(height, width)
    if rng.random() < 0.1:
        crowd = np.zeros((height, width), dtype=bool)
        cy, cx = rng.uniform(0.2, 0.8) * height, rng.uniform(0.2, 0.8) * width
        for _ in range(int(rng.integers(4, 8))):
            dy, dx = rng.normal(0, 0.08 * side, 2)
            crowd |= _shape(DISC, grid, cy + dy, cx + dx, rng.uniform(0.03, 0.06) * side)
        _paint_thing(image, crowd, DISC, rng)
        segments.append((DISC, True))
        numbers[crowd] = len(segments)
    count = int(rng.integers(1, 6)) if rng.random() < 0.85 else 0
    for _ in range(count):
        kind = int(rng.integers(0, 3))
        radius = rng.uniform(0.08, 0.22) * side
        mask = _shape(kind, grid, rng.uniform(0, height), rng.uniform(0, width), radius)
        if not mask.any():
            continue
        _paint_thing(image, mask, kind, rng)
        segments.append((kind, False))
        numbers[mask] = len(segments)
    # segments hidden (nearly) all the way become void: a segment needs pixels to be learnt
    sizes = np.bincount(numbers.ravel(), minlength=len(segments) + 1)[1:]
    keep = sizes >= MIN_PIXELS
    lut = np.zeros(len(segments) + 1, dtype=np.int64)
    lut[1:][keep] = np.arange(1, int(keep.sum()) + 1)
    pixels = np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)
    return pixels, lut[numbers], [s for s, k in zip(segments, keep, strict=True) if k]


def write_synthetic_panoptic(root: str | Path, split: str, num_images: int, img_size: int = 64, seed: int = 0) -> Path:
    """Write `<root>/<split>/NNNNNN.jpg`, `<root>/annotations/panoptic_<split>/NNNNNN.png` and
    `<root>/annotations/panoptic_<split>.json` (written last, whole: its presence means the
    split is complete).

    Image sides are drawn in [0.75, 1.25] x `img_size`; every sample is a pure function of
    (seed, split, index). Returns the JSON path.
    """
    root = Path(root)
    image_dir, png_dir = root / split, root / "annotations" / f"panoptic_{split}"
    image_dir.mkdir(parents=True, exist_ok=True)
    png_dir.mkdir(parents=True, exist_ok=True)
    low, high = round(0.75 * img_size), round(1.25 * img_size)
    images, annotations = [], []
    for i in range(num_images):
        rng = np.random.default_rng([seed, sum(map(ord, split)), i])
        height, width = (int(v) for v in rng.integers(low, high + 1, 2))
        pixels, numbers, segments = panoptic_scene(height, width, rng)
        ids = np.zeros(len(segments) + 1, dtype=np.int64)  # 0 stays void
        ids[1:] = rng.integers(1, 256**3, len(segments))
        while len(np.unique(ids)) < len(ids):  # distinct random 24-bit ids (a repeat is rare)
            ids[1:] = rng.integers(1, 256**3, len(segments))
        segment_ids = ids[numbers]
        name = f"{i:06d}"
        Image.fromarray(pixels).save(image_dir / f"{name}.jpg", quality=95)
        Image.fromarray(id2rgb(segment_ids)).save(png_dir / f"{name}.png")
        areas = np.bincount(numbers.ravel(), minlength=len(segments) + 1)
        info = [
            {
                "id": int(ids[k + 1]),
                "category_id": CATEGORIES[label][0],
                "iscrowd": int(crowd),
                "area": int(areas[k + 1]),
                "bbox": [box[1].start, box[0].start, box[1].stop - box[1].start, box[0].stop - box[0].start],
            }
            for k, ((label, crowd), box) in enumerate(zip(segments, find_objects(numbers), strict=True))
        ]
        images.append({"id": i + 1, "file_name": f"{name}.jpg", "height": height, "width": width})
        annotations.append({"image_id": i + 1, "file_name": f"{name}.png", "segments_info": info})
    categories = [
        {
            "id": cid,
            "name": name,
            "isthing": int(thing),
            "supercategory": "shape" if thing else "scene",
            "color": list(c),
        }
        for cid, name, thing, c in CATEGORIES
    ]
    path = root / "annotations" / f"panoptic_{split}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    tmp.replace(path)
    return path


SYNTHETIC_PANOPTIC_LOADER = LoaderConfig(batch_size=16)


class SyntheticPanopticDataModule(WrittenOnFirstUse, CocoPanopticDataModule):
    """Synthetic landscapes with shapes as a COCO panoptic dataset (3 thing and 3 stuff
    classes), generated on first use under `root` and then read like COCO panoptic.

    The files are written once (by one process per node, in `prepare_data`); a `meta.json`
    beside them records the settings, and different settings regenerate them.

    Args:
        root: where to write the dataset.
        img_size: the training crop's side and the evaluation's long side; images have
            sides in [0.75, 1.25] x img_size.
        train_size, val_size: images per split.
        seed: base seed of the generator.
        scale_range: the large-scale jitter's range (mild by default: a demo learns the
            shapes at the scale it is evaluated at).
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    kind = "panoptic"

    def __init__(
        self,
        *,
        root: str = "data/synthetic_panoptic",
        img_size: int = 64,
        train_size: int = 2000,
        val_size: int = 200,
        seed: int = 0,
        scale_range: tuple[float, float] = (0.75, 1.25),
        loader: LoaderConfig = SYNTHETIC_PANOPTIC_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        self.synthetic = {"img_size": img_size, "train_size": train_size, "val_size": val_size, "seed": seed}
        # the files' layout follows; the base records only the arguments above, so that a
        # checkpoint rebuilds this class
        super().__init__(
            root=root,
            train_images="train",
            train_annotations="annotations/panoptic_train.json",
            train_masks="annotations/panoptic_train",
            val_images="val",
            val_annotations="annotations/panoptic_val.json",
            val_masks="annotations/panoptic_val",
            img_size=img_size,
            scale_range=scale_range,
            eval_size=img_size,
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )

    def read_categories(self) -> SegmentCategories:
        return synthetic_categories()

    def write_splits(self) -> None:
        s = self.synthetic
        for split, size in (("train", s["train_size"]), ("val", s["val_size"])):
            write_synthetic_panoptic(self.root, split, size, s["img_size"], s["seed"])
