"""Offline synthetic data: coloured shapes on textured backgrounds, with known classes.

For demos and tests, where no dataset can be downloaded. Every sample is a pure function
of (seed, split, index), so runs are reproducible and workers need no shared state.
"""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from vitdense.data.base import image_dataloader
from vitdense.data.transforms import normalization
from vitdense.errors import DataError
from vitdense.types import LabeledImages

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


class SyntheticClassificationDataModule(L.LightningDataModule):
    """Synthetic shapes for classification: train/val/test splits that never overlap.

    Args:
        num_classes: shapes to tell apart (2..6).
        img_size: image side.
        train_size, val_size: samples per split (test uses val_size).
        batch_size, num_workers: loader settings.
        seed: base seed of the generator.
        backbone: timm name of the encoder (linked by the CLI); images are normalised with
            its pretrained mean and std.
    """

    def __init__(
        self,
        num_classes: int = 4,
        img_size: int = 64,
        train_size: int = 2000,
        val_size: int = 400,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
        backbone: str | None = None,
    ) -> None:
        super().__init__()
        # the encoder name only picks mean and std (kept as attributes); the task logs it already
        self.save_hyperparameters(ignore=["backbone"])
        self.img_size = img_size
        self.mean, self.std = normalization(backbone)
        self.num_classes = num_classes
        self.class_names = list(SHAPES[:num_classes])

    def _split(self, name: str, length: int) -> SyntheticShapes:
        offset = {"train": 0, "val": 1, "test": 2, "predict": 1}[name]
        hp = self.hparams
        return SyntheticShapes(length, hp.img_size, hp.num_classes, hp.seed * 10 + offset, self.mean, self.std)

    def _loader(self, name: str, length: int, shuffle: bool) -> DataLoader:
        # training drops the last partial batch: even, full batches (Mixup pairs samples)
        return image_dataloader(self._split(name, length), self.hparams.batch_size, self.hparams.num_workers, shuffle)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.hparams.train_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.hparams.val_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.hparams.val_size, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict", self.hparams.val_size, shuffle=False)
