"""What the image-classification DataModules share: normalisation from the encoder,
the albumentations pipelines, and loaders over their datasets."""

from __future__ import annotations

from collections.abc import Callable
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


class SplitsDataModule(L.LightningDataModule):
    """A DataModule whose `setup` fills `train/val/test/predict_dataset`; one loader per
    split through `_loader` (override it for batch sizes or collate functions)."""

    def __init__(self) -> None:
        super().__init__()
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self.test_dataset: Dataset | None = None
        self.predict_dataset: Dataset | None = None

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        raise NotImplementedError

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_dataset, train=False)


class ClassificationDataModule(SplitsDataModule):
    """Base of the classification DataModules: subclasses set `class_names` and
    `num_classes` in `__init__` and the `*_dataset` attributes in `setup`.

    Args:
        img_size: side of the square images fed to the model.
        batch_size, num_workers: loader settings.
        backbone: timm model name whose pretrained normalisation to use (see `normalization`).
        mean, std: explicit normalisation; each wins over the backbone's.
    """

    def __init__(
        self,
        img_size: int,
        batch_size: int,
        num_workers: int,
        backbone: str | None,
        mean: Triple | None,
        std: Triple | None,
    ) -> None:
        super().__init__()
        self.img_size = img_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.mean, self.std = resolve_normalization(backbone, mean, std)

    def train_transforms(self, scale: tuple[float, float], color_jitter: float) -> A.Compose:
        transform = classification_train_transforms(
            self.img_size, self.mean, self.std, scale, color_jitter=color_jitter
        )
        # albumentations ignores torch's seed; tie it to it (and the rank) so seed_everything reproduces the crops
        transform.set_random_seed(process_seed())
        return transform

    def eval_transforms(self, crop_pct: float) -> A.Compose:
        return classification_eval_transforms(self.img_size, self.mean, self.std, crop_pct=crop_pct)

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        return image_dataloader(dataset, self.batch_size, self.num_workers, train)
