"""The one DataModule base (sizes, batch sizes, workers, normalisation, seeding, loaders)
and the loader every image batch goes through."""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Literal

import albumentations as A
import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from vitdense.data.collate import pad_collate
from vitdense.data.images import ImageFiles
from vitdense.data.samplers import EpochSeededDataset, EvalSampler, TrainSampler, data_seed, resume_position
from vitdense.data.transforms import (
    classification_eval_transforms,
    classification_train_transforms,
    process_seed,
    resolve_normalization,
    seed_worker_transforms,
)
from vitdense.errors import DataError
from vitdense.types import LabeledImages

Triple = tuple[float, float, float]

_logger = logging.getLogger(__name__)


class ResumableDataLoader(DataLoader):
    """A training `DataLoader` whose position Lightning saves in checkpoints and restores.

    `state_dict()` records (epoch, batches the training loop has completed in it), read
    from the trainer through `position` — not from the loader itself, which has already
    prefetched batches the loop has not used; `load_state_dict` makes the `TrainSampler`
    skip the completed batches of that epoch.
    """

    def __init__(self, *args: Any, position: Callable[[], tuple[int, int]] | None = None, **kwargs: Any) -> None:
        # DataLoader's own arguments, forwarded (Lightning re-creates loaders from them)
        super().__init__(*args, **kwargs)
        self.position = position

    def state_dict(self) -> dict[str, Any]:
        return {"train_position": list(self.position())} if self.position is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "train_position" in state_dict and isinstance(self.sampler, TrainSampler):
            epoch, batches = state_dict["train_position"]
            self.sampler.resume(epoch, batches * self.batch_size)


def require_positive(**settings: int | float | list | tuple | None) -> None:
    """Raise naming every setting that is not positive (None: unset, allowed; lists and
    tuples: every entry)."""
    bad = [
        f"data.init_args.{name}={value}"
        for name, value in settings.items()
        if value is not None and any(v <= 0 for v in (value if isinstance(value, (list, tuple)) else [value]))
    ]
    if bad:
        raise DataError(f"{', '.join(bad)}: must be positive")


class SkipBadSamples(Dataset):
    """`dataset` whose unreadable samples (a `DataError`: corrupt, truncated or empty file,
    label map that does not fit) become None, each logged with its file, and counted.

    The count lives in shared memory, so the main process reads what every loader worker
    skipped (`take_count`); `skip_collate` drops the Nones from their batch.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.skipped = multiprocessing.get_context().Value("i", 0)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:  # the wrapped dataset's attributes (paths, transform, ...)
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, key: Any) -> Any:
        try:
            return self.dataset[key]
        except DataError as err:
            _logger.warning("skipped a bad sample (on_bad_sample=skip): %s", err)
            with self.skipped.get_lock():
                self.skipped.value += 1
            return None

    def take_count(self) -> int:
        """Samples skipped since the last call."""
        with self.skipped.get_lock():
            count, self.skipped.value = self.skipped.value, 0
        return count


def skip_collate(samples: list[Any], collate: Callable[[list[Any]], Any]) -> Any:
    """`collate` of the samples that are not None; None when none is left (the step is skipped)."""
    kept = [s for s in samples if s is not None]
    return collate(kept) if kept else None


def image_dataloader(
    dataset: Dataset,
    batch_size: int,
    num_workers: int,
    train: bool,
    collate_fn: Callable | None = None,
    position: Callable[[], tuple[int, int]] | None = None,
) -> DataLoader:
    """Loader of image batches (`pad_collate` by default), in a resumable, process-aware order.

    Training shuffles with a `TrainSampler` (seeded per epoch, sharded across processes,
    each sample's augmentation seeded from (seed, epoch, index)) and drops the last partial
    batch: every step has a full batch (Mixup pairs samples, stable loss scale). With
    `position` (the trainer's (epoch, completed batches)), checkpoints record where the
    epoch is and a resumed run continues from the next batch (`ResumableDataLoader`).
    Evaluation keeps every sample once across processes (`EvalSampler`). The loader's own
    generator keeps data loading off the global RNG, which dropout and Mixup draw from.
    """
    seed = data_seed()
    common = dict(
        batch_size=batch_size,
        drop_last=train,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        worker_init_fn=seed_worker_transforms,
        collate_fn=collate_fn or pad_collate,
        generator=torch.Generator().manual_seed(seed),
    )
    if train:
        sampler = TrainSampler(dataset, seed)
        return ResumableDataLoader(EpochSeededDataset(dataset, seed), sampler=sampler, position=position, **common)
    return DataLoader(dataset, sampler=EvalSampler(dataset), **common)


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
        predict_dir: a folder of unlabelled images (any size and format, searched
            recursively) to predict on instead of the dataset's own split; the dataset
            itself need not be present then (classes come from the checkpoint).
        on_bad_sample: what an unreadable sample (corrupt, truncated or empty file, a label
            map that does not fit its image) does: "raise" stops with the file named;
            "skip" leaves it out of its batch, logs the file, and logs the epoch's total
            (`{stage}/skipped_samples`).
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
        predict_dir: str | None = None,
        on_bad_sample: Literal["raise", "skip"] = "raise",
    ) -> None:
        super().__init__()
        if on_bad_sample not in ("raise", "skip"):
            raise DataError(f"on_bad_sample={on_bad_sample!r}: choose raise or skip")
        require_positive(img_size=img_size, batch_size=batch_size, eval_batch_size=eval_batch_size)
        if num_workers < 0:
            raise DataError(f"data.init_args.num_workers={num_workers}: must be 0 (load in the main process) or more")
        self.img_size = img_size
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.mean, self.std = resolve_normalization(backbone, mean, std)
        self.predict_dir = predict_dir
        self.on_bad_sample = on_bad_sample
        self._skipping: dict[str, SkipBadSamples] = {}
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

    def setup(self, stage: str) -> None:
        """The datasets of `stage`: `predict_dir`'s images when predicting on a folder, else
        the subclass's splits (`setup_splits`)."""
        if "mean" in self.hparams:  # checkpoints record the normalisation used, also one taken from the backbone
            self.hparams.update(mean=list(self.mean), std=list(self.std))
        if stage == "predict" and self.predict_dir is not None:
            self.predict_dataset = ImageFiles(self.predict_dir, self.predict_sample())
        else:
            self.setup_splits(stage)

    def setup_splits(self, stage: str) -> None:
        """Fill `train_dataset` / `val_dataset` / `test_dataset` / `predict_dataset` for `stage`."""
        raise NotImplementedError(f"{type(self).__name__} must implement setup_splits")

    def predict_sample(self) -> Callable[[np.ndarray, int], Any]:
        """`f(image [H, W, 3] uint8, index)` -> the unlabelled sample this DataModule's task
        predicts on, preprocessed as in evaluation (`predict_dir`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot predict on a folder of images (no predict_sample)")

    def _loader(self, dataset: Dataset | None, split: str) -> DataLoader:
        if dataset is None:
            raise DataError(f"{type(self).__name__} has no {split} split (setup did not create one)")
        train = split == "train"
        if train:
            check_train_size(dataset, self.batch_size, self.train_location)
        batch_size = self.batch_size if train else self.eval_batch_size
        collate = partial(pad_collate, ignore_index=self.ignore_index)
        if self.on_bad_sample == "skip":
            dataset = self._skipping[split] = SkipBadSamples(dataset)
            collate = partial(skip_collate, collate=collate)
        position = (lambda: resume_position(self.trainer)) if train else None
        return image_dataloader(dataset, batch_size, self.num_workers, train, collate, position)

    def take_skipped(self, stage: str) -> int:
        """Bad samples skipped in `stage` ("train", "val", "test", "predict") since the last
        call (0 unless `on_bad_sample="skip"`)."""
        skipping = self._skipping.get(stage)
        return skipping.take_count() if skipping is not None else 0

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

    def predict_sample(self) -> Callable[[np.ndarray, int], LabeledImages]:
        return partial(labeled_sample, self.eval_transforms(getattr(self, "crop_pct", 1.0)))


def labeled_sample(transform: Callable[..., dict[str, Any]], image: np.ndarray, index: int) -> LabeledImages:
    """An unlabelled image (label -1) for a classification task's `predict_step`."""
    return LabeledImages(transform(image=image)["image"], -1, index)
