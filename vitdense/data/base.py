"""The one DataModule base (sizes, batch sizes, workers, normalisation, seeding, loaders)
and the loader every image batch goes through."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import albumentations as A
import lightning as L
from torch.utils.data import DataLoader, Dataset

from vitdense.data.collate import pad_collate
from vitdense.data.transforms import (
    classification_eval_transforms,
    classification_train_transforms,
    process_seed,
    resolve_normalization,
    seed_worker_transforms,
)
from vitdense.errors import DataError

Triple = tuple[float, float, float]


def image_dataloader(
    dataset: Dataset, batch_size: int, num_workers: int, train: bool, collate_fn: Callable | None = None
) -> DataLoader:
    """Loader of image batches; training shuffles and drops the last partial batch.

    Dropping it keeps every training step at full batch size (Mixup pairs samples, stable
    loss scale); evaluation keeps every sample. Workers reseed their augmentations.
    """
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=train,
        drop_last=train,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        worker_init_fn=seed_worker_transforms,
        collate_fn=collate_fn or pad_collate,
    )


def check_train_size(dataset: Dataset, batch_size: int, where: str | Path) -> None:
    """Fail early when drop_last would leave the training split with no batch at all."""
    if len(dataset) < batch_size:
        raise DataError(
            f"{where}: {len(dataset)} training images but batch_size={batch_size}, so no full batch; "
            "lower batch_size or add images"
        )


class ImageDataModule(L.LightningDataModule):
    """The one base of every vitdense DataModule: image size, batch sizes, workers,
    normalisation, augmentation seeding and the four split loaders live here.

    A subclass sets `num_classes` and `class_names` in `__init__` (the CLI links them, and
    `img_size`, into the task before anything is read from disk) and fills
    `train_dataset` / `val_dataset` / `test_dataset` / `predict_dataset` in `setup`. Every
    loader batches with `pad_collate` (label maps padded with `ignore_index`); training
    shuffles and drops the last partial batch, and fails early naming `train_location` when
    the split holds less than one batch.

    Args:
        img_size: side of the square training images; the task's native input size.
        batch_size: training batch size (per process).
        eval_batch_size: validation/test/predict batch size; None: `batch_size`.
        num_workers: loader worker processes.
        backbone: timm model name whose pretrained normalisation to use (see `normalization`).
        mean, std: explicit normalisation; each wins over the backbone's.
    """

    #: label of unlabelled pixels; label maps are padded with it (segmentation)
    ignore_index: int = 255
    num_classes: int
    class_names: list[str]

    def __init__(
        self,
        img_size: int,
        batch_size: int,
        eval_batch_size: int | None,
        num_workers: int,
        backbone: str | None,
        mean: Triple | None,
        std: Triple | None,
    ) -> None:
        super().__init__()
        if img_size < 1 or batch_size < 1 or (eval_batch_size is not None and eval_batch_size < 1):
            raise DataError(
                f"img_size={img_size}, batch_size={batch_size}, eval_batch_size={eval_batch_size}: must be positive"
            )
        self.img_size = img_size
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.mean, self.std = resolve_normalization(backbone, mean, std)
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self.test_dataset: Dataset | None = None
        self.predict_dataset: Dataset | None = None

    @property
    def train_location(self) -> str:
        """Where the training images come from, for error messages."""
        return f"{type(self).__name__} training split"

    def seeded(self, transform: A.Compose) -> A.Compose:
        """A training pipeline seeded from torch's seed and the rank: albumentations ignores
        torch's seed, so without this `seed_everything` would not reproduce the crops."""
        transform.set_random_seed(process_seed())
        return transform

    def _loader(self, dataset: Dataset | None, split: str) -> DataLoader:
        if dataset is None:
            raise DataError(f"{type(self).__name__} has no {split} split (setup did not create one)")
        train = split == "train"
        if train:
            check_train_size(dataset, self.batch_size, self.train_location)
        batch_size = self.batch_size if train else self.eval_batch_size
        collate = partial(pad_collate, ignore_index=self.ignore_index)
        return image_dataloader(dataset, batch_size, self.num_workers, train, collate)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, "train")

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, "val")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, "test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_dataset, "predict")


class ClassificationDataModule(ImageDataModule):
    """An `ImageDataModule` with timm's ImageNet pipelines (`classification_train_transforms`,
    `classification_eval_transforms`) at `img_size`."""

    def train_transforms(self, scale: tuple[float, float], color_jitter: float) -> A.Compose:
        return self.seeded(
            classification_train_transforms(self.img_size, self.mean, self.std, scale, color_jitter=color_jitter)
        )

    def eval_transforms(self, crop_pct: float) -> A.Compose:
        return classification_eval_transforms(self.img_size, self.mean, self.std, crop_pct=crop_pct)
