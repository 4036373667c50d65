"""Offline synthetic detection data, written to disk as a COCO dataset (PNG images + JSON).

For the demo and the tests, where no dataset can be downloaded: the data goes through the
same files, JSON checks and loaders as COCO. Each image holds 0 to 4 shapes that do not
overlap, each of a random class and size; its box is the tight box of the shape's pixels
and its area their count. Category ids are 1, 3, 5, ... on purpose, so that the mapping
between category ids and contiguous labels is exercised wherever this data is used.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from vitdense.core.errors import DataError
from vitdense.data.base import LoaderConfig, Triple
from vitdense.data.coco import COCODataModule
from vitdense.data.synthetic.classification import SHAPES, WrittenOnFirstUse, draw_shape, textured_background


def synthetic_objects(
    height: int, width: int, num_classes: int, rng: np.random.Generator, max_objects: int = 4
) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """One scene: ([H, W, 3] uint8 image, [(label, [H, W] bool mask), ...]).

    Shapes are drawn on sub-canvases of 40-80% of the longer side placed at random, so
    objects span about 15-55% of the image's side; a shape that would overlap an earlier one (or
    keep fewer than 16 pixels inside the image) is redrawn, at most 20 times.
    """
    side = max(height, width)
    image = textured_background(side, rng)
    occupied = np.zeros((side, side), dtype=bool)
    objects = []
    for _ in range(int(rng.integers(0, max_objects + 1))):
        for _try in range(20):
            label = int(rng.integers(0, num_classes))
            sub = int(rng.uniform(0.4, 0.8) * side)
            y0, x0 = (int(v) for v in rng.integers(0, side - sub + 1, 2))
            mask = np.zeros((side, side), dtype=bool)
            mask[y0 : y0 + sub, x0 : x0 + sub] = draw_shape(SHAPES[label], sub, rng)
            if (mask & occupied).any() or mask[:height, :width].sum() < 16:
                continue
            occupied |= mask
            image[mask] = rng.uniform(0.65, 1.0, 3)
            objects.append((label, mask[:height, :width]))
            break
    return np.round(image[:height, :width] * 255).astype(np.uint8), objects


def category_id(label: int) -> int:
    """The synthetic set's COCO category id of a contiguous label (1, 3, 5, ...)."""
    return 2 * label + 1


def write_synthetic_coco(
    root: str | Path, split: str, num_images: int, img_size: int = 64, num_classes: int = 3, seed: int = 0
) -> Path:
    """Write `<root>/<split>/NNNNNN.png` and `<root>/annotations/instances_<split>.json`.

    Image sides are drawn in [0.75, 1.25] x `img_size`; every sample is a pure function of
    (seed, split, index). Returns the JSON path.
    """
    if not 1 <= num_classes <= len(SHAPES):
        raise DataError(f"num_classes={num_classes}: the synthetic data has 1 to {len(SHAPES)} shape classes")
    root = Path(root)
    image_dir = root / split
    image_dir.mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    low, high = round(0.75 * img_size), round(1.25 * img_size)
    for i in range(num_images):
        rng = np.random.default_rng([seed, sum(map(ord, split)), i])
        height, width = (int(v) for v in rng.integers(low, high + 1, 2))
        image, objects = synthetic_objects(height, width, num_classes, rng)
        file_name = f"{i:06d}.png"
        Image.fromarray(image).save(image_dir / file_name)
        images.append({"id": i + 1, "file_name": file_name, "height": height, "width": width})
        for label, mask in objects:
            ys, xs = np.nonzero(mask)
            x1, y1, x2, y2 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": category_id(label),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": int(mask.sum()),
                    "iscrowd": 0,
                }
            )
    categories = [{"id": category_id(k), "name": SHAPES[k], "supercategory": "shape"} for k in range(num_classes)]
    path = root / "annotations" / f"instances_{split}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    tmp.replace(path)  # the JSON appears last and whole: its presence means the split is complete
    return path


SYNTHETIC_DET_LOADER = LoaderConfig(batch_size=16)


def generated_coco(annotations: str, img_size: int, scales: list[int] | None, max_size: int | None) -> dict:
    """`COCODataModule`'s layout and sizes for a generated COCO set: `<split>/` images with
    `annotations/<annotations>_<split>.json`, augmentation sizes from `img_size` (training
    shortest sides `scales`, default img_size - 16 to img_size, step 8; longest side at most
    `max_size`, default img_size; evaluation at img_size)."""
    return {
        "train_images": "train",
        "train_annotations": f"annotations/{annotations}_train.json",
        "val_images": "val",
        "val_annotations": f"annotations/{annotations}_val.json",
        "img_size": img_size,
        "scales": scales or list(range(img_size - 16, img_size + 1, 8)),
        "max_size": max_size or img_size,
        "crop_scales": [round(0.8 * img_size)],
        "crop_size": (round(0.5 * img_size), round(0.8 * img_size)),
        "eval_short_side": img_size,
    }


class SyntheticDetectionDataModule(WrittenOnFirstUse, COCODataModule):
    """Synthetic shapes as a COCO dataset, generated on first use under `root`.

    The files are written once (by one process per node, in `prepare_data`) and then read
    like any COCO dataset; a `meta.json` beside them records the settings, and different
    settings regenerate them.

    Args:
        root: where to write the dataset.
        num_classes: shape classes (1..6).
        img_size: the backbone's native size, and the images' typical side (sides in
            [0.75, 1.25] x img_size); evaluation resizes the shortest side to it.
        train_size, val_size: images per split.
        seed: base seed of the generator.
        scales: training shortest sides (None: img_size - 16 to img_size, step 8).
        max_size: bound of the longest side in training and evaluation (None: img_size, so
            every image fits in an img_size square; evaluation resizes the shortest side to
            img_size unless that bound is hit).
        square_resize: RF-DETR's square resize instead (training images S x S, S from
            `scales`; evaluation img_size x img_size): a batch then holds at most
            len(scales) sizes, which a hybrid stem encodes in as many calls.
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    kind = "detection"

    def __init__(
        self,
        *,
        root: str = "data/synthetic_det",
        num_classes: int = 3,
        img_size: int = 64,
        train_size: int = 2000,
        val_size: int = 200,
        seed: int = 0,
        scales: list[int] | None = None,
        max_size: int | None = None,
        square_resize: bool = False,
        loader: LoaderConfig = SYNTHETIC_DET_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        if not 1 <= num_classes <= len(SHAPES):
            raise DataError(f"num_classes={num_classes}: the synthetic data has 1 to {len(SHAPES)} shape classes")
        self.synthetic = {
            "num_classes": num_classes,
            "img_size": img_size,
            "train_size": train_size,
            "val_size": val_size,
            "seed": seed,
        }
        # the files' layout and the augmentation's sizes follow from img_size; the base
        # records only the arguments above, so that a checkpoint rebuilds this class
        super().__init__(
            root=root,
            **generated_coco("instances", img_size, scales, max_size),
            square_resize=square_resize,
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )

    def read_categories(self) -> tuple[list[int], list[str]]:
        k = self.synthetic["num_classes"]
        return [category_id(i) for i in range(k)], list(SHAPES[:k])

    def write_splits(self) -> None:
        s = self.synthetic
        for split, size in (("train", s["train_size"]), ("val", s["val_size"])):
            write_synthetic_coco(self.root, split, size, s["img_size"], s["num_classes"], s["seed"])
