"""Offline synthetic data: coloured shapes on textured backgrounds, with known classes.

For demos and tests, where no dataset can be downloaded. Every sample is a pure function
of (seed, split, index), so runs are reproducible and workers need no shared state.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from vitdense.core.errors import DataError
from vitdense.data.base import LoaderConfig, Triple
from vitdense.data.classification import ClassificationDataModule
from vitdense.types import LabeledImages

_logger = logging.getLogger(__name__)


class WrittenOnFirstUse:
    """A DataModule mixin for generated datasets written to disk and then read through the
    real reader of their format (COCO detection, COCO panoptic): the files are written once
    under `root` (by one process per node, in `prepare_data`; in `setup` too, for use
    without a Trainer), with a `meta.json` of the settings (`synthetic`) written last;
    different settings, or a split's annotation file gone, write them again. A subclass
    writes its splits (`write_splits`) and names what it writes (`kind`)."""

    root: Path
    synthetic: dict[str, Any]
    #: what is written, for the log ("detection", "panoptic")
    kind: str = "synthetic"

    def write_splits(self) -> None:
        """Write every split's images and annotations under `root`."""
        raise NotImplementedError(f"{type(self).__name__} must implement write_splits")

    def write_if_missing(self) -> None:
        meta = self.root / "meta.json"
        complete = all(self.annotation_path(split).is_file() for split in ("train", "val"))
        if complete and meta.is_file() and json.loads(meta.read_text()) == self.synthetic:
            return
        _logger.info("writing the synthetic %s dataset to %s", self.kind, self.root)
        meta.unlink(missing_ok=True)
        self.write_splits()
        meta.write_text(json.dumps(self.synthetic))

    def prepare_data(self) -> None:
        if not (self.predict_dir is not None and self.trainer is not None and self.trainer.predicting):
            self.write_if_missing()

    def setup_splits(self, stage: str) -> None:
        self.write_if_missing()  # setup without a Trainer (tests, notebooks) skips prepare_data
        super().setup_splits(stage)


SHAPES = ("circle", "square", "triangle", "cross", "ring", "diamond")


def draw_shape(shape: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask [size, size] of one shape at a random place and scale."""
    radius = rng.uniform(0.18, 0.35) * size
    cy, cx = rng.uniform(radius, size - radius, 2)
    yy, xx = np.mgrid[:size, :size].astype(np.float32)
    dy, dx = yy - cy, xx - cx
    if shape == "circle":
        return dy**2 + dx**2 <= radius**2
    if shape == "ring":
        d2 = dy**2 + dx**2
        return (d2 <= radius**2) & (d2 >= (0.6 * radius) ** 2)
    if shape == "square":
        return (np.abs(dy) <= radius * 0.8) & (np.abs(dx) <= radius * 0.8)
    if shape == "diamond":
        return np.abs(dy) + np.abs(dx) <= radius
    if shape == "cross":
        arm = radius * 0.3
        return ((np.abs(dy) <= arm) & (np.abs(dx) <= radius)) | ((np.abs(dx) <= arm) & (np.abs(dy) <= radius))
    if shape == "triangle":
        return (dy <= radius * 0.7) & (dy >= -radius + 2 * np.abs(dx))
    raise DataError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")


def textured_background(size: int, rng: np.random.Generator) -> np.ndarray:
    """[size, size, 3] float in [0, 1]: a dark random colour gradient plus noise."""
    yy, xx = np.mgrid[:size, :size].astype(np.float32) / size
    base = rng.uniform(0, 0.35, 3)
    slope = rng.uniform(-0.15, 0.15, (2, 3))
    img = base + yy[..., None] * slope[0] + xx[..., None] * slope[1]
    return np.clip(img + rng.normal(0, 0.08, (size, size, 3)), 0, 1)


class SyntheticShapes(Dataset):
    """Images of one shape each; the class is the shape.

    Args:
        length: number of samples.
        img_size: side of the square images.
        num_classes: how many of `SHAPES` to use (2..6).
        seed: base seed; the split name is mixed in so that splits differ.
        mean, std: per-channel normalisation.
    """

    def __init__(
        self,
        length: int,
        img_size: int = 64,
        num_classes: int = 4,
        seed: int = 0,
        mean: tuple[float, float, float] = (0.5, 0.5, 0.5),
        std: tuple[float, float, float] = (0.5, 0.5, 0.5),
    ) -> None:
        if not 2 <= num_classes <= len(SHAPES):
            raise DataError(f"num_classes={num_classes}: the synthetic data has 2 to {len(SHAPES)} shapes")
        self.length = length
        self.img_size = img_size
        self.num_classes = num_classes
        self.seed = seed
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> LabeledImages:
        rng = np.random.default_rng([self.seed, index])
        label = index % self.num_classes
        img = textured_background(self.img_size, rng)
        mask = draw_shape(SHAPES[label], self.img_size, rng)
        # bright shapes on dark backgrounds: the contrast's sign is fixed, the hues are not
        img[mask] = rng.uniform(0.65, 1.0, 3)
        img = (img.astype(np.float32) - self.mean) / self.std
        return LabeledImages(torch.from_numpy(img).permute(2, 0, 1).contiguous(), label, index)


SYNTHETIC_LOADER = LoaderConfig(batch_size=32)


class SyntheticClassificationDataModule(ClassificationDataModule):
    """Synthetic shapes for classification: train/val/test splits that never overlap
    (predict uses the validation images).

    Args:
        num_classes: shapes to tell apart (2..6).
        img_size: image side.
        train_size, val_size: samples per split (test uses val_size).
        seed: base seed of the generator.
        loader, mean, std: see `ImageDataModule`.
        backbone: timm name of the encoder (linked by the CLI); images are normalised with
            its pretrained mean and std.
        predict_dir: predict on this folder of images (resized whole to img_size) instead
            of the validation split (see `ImageDataModule`).
    """

    def __init__(
        self,
        *,
        num_classes: int = 4,
        img_size: int = 64,
        train_size: int = 2000,
        val_size: int = 400,
        seed: int = 0,
        loader: LoaderConfig = SYNTHETIC_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=img_size, loader=loader, backbone=backbone, mean=mean, std=std, predict_dir=predict_dir
        )
        if not 2 <= num_classes <= len(SHAPES):
            raise DataError(f"num_classes={num_classes}: the synthetic data has 2 to {len(SHAPES)} shapes")
        self.num_classes = num_classes
        self.class_names = list(SHAPES[:num_classes])
        self.train_size, self.val_size, self.seed = train_size, val_size, seed

    def split(self, name: str) -> SyntheticShapes:
        """A split's images; the split's name is mixed into the seed so that splits never overlap."""
        seed, length = split_seed(self.seed, name, self.train_size, self.val_size)
        return SyntheticShapes(length, self.img_size, self.num_classes, seed, self.mean, self.std)

    def setup_splits(self, stage: str) -> None:
        self.train_dataset = self.split("train")
        self.val_dataset = self.predict_dataset = self.split("val")
        self.test_dataset = self.split("test")


def split_seed(seed: int, split: str, train_size: int, val_size: int) -> tuple[int, int]:
    """(seed, length) of a synthetic split: the split is mixed into the seed so that splits
    never overlap; test is as long as validation."""
    offset, length = {"train": (0, train_size), "val": (1, val_size), "test": (2, val_size)}[split]
    return seed * 10 + offset, length
