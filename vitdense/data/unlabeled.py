"""Images without labels, for pre-training (`MaskedImageModelingTask`): any folder of images,
searched recursively, so ImageNet's layout (its class folders ignored) works as it is."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from vitdense.core.errors import DataError
from vitdense.core.images import IMAGE_SUFFIXES, decode_image, find_images
from vitdense.data.base import LoaderConfig, Triple
from vitdense.data.classification import ClassificationDataModule, held_out_split, labeled_sample
from vitdense.data.transforms.classification import classification_train_transforms
from vitdense.types import LabeledImages

_logger = logging.getLogger(__name__)

UNLABELED_LOADER = LoaderConfig(batch_size=64)


class UnlabeledImages(Dataset):
    """Image files as `LabeledImages` with label -1 (no label), through `transform`.

    Args:
        paths: the image files (any format Pillow reads; `decode_image`).
        transform: albumentations pipeline from [H, W, 3] uint8 to a [3, H, W] tensor.
    """

    def __init__(self, paths: Sequence[Path], transform: Callable[..., dict[str, Any]]) -> None:
        self.paths = list(paths)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> LabeledImages:
        return labeled_sample(self.transform, decode_image(self.paths[index]), index)


class UnlabeledImagesDataModule(ClassificationDataModule):
    """Images without labels under `root`, for self-supervised pre-training.

    Every image file under `root / train_dir` is a training image, found recursively: a flat
    folder of photos, a tree of them, or ImageNet's `train/<class>/<image>` (the class
    folders are only folders here; no label is read). Validation images come from
    `root / val_dir` the same way, or, without one, are a seeded `val_fraction` of the
    training images held out. Test uses the validation images. Samples are
    `LabeledImages` with label -1.

    Training augmentation is MAE's: RandomResizedCrop to `img_size` (area `scale`,
    bicubic) and a horizontal flip, no colour jitter; evaluation resizes and centre-crops.

        data:
          class_path: vitdense.data.UnlabeledImagesDataModule
          init_args: {root: /data/imagenet, train_dir: train, val_dir: val, img_size: 224}

    Args:
        root: folder of the images.
        train_dir: sub-folder of `root` holding the training images ("" : `root` itself).
        val_dir: sub-folder holding validation images; None: hold out `val_fraction`.
        val_fraction: share of the training images held out for validation (no `val_dir`).
        seed: seed of the held-out share.
        img_size: side of the square training crops.
        scale: area range of the random resized crop (MAE: 0.2 to 1).
        hflip: probability of a horizontal flip.
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    num_classes = None
    class_names = None

    def __init__(
        self,
        *,
        root: str,
        train_dir: str = "",
        val_dir: str | None = None,
        val_fraction: float = 0.01,
        seed: int = 0,
        img_size: int = 224,
        scale: tuple[float, float] = (0.2, 1.0),
        hflip: float = 0.5,
        loader: LoaderConfig = UNLABELED_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=img_size, loader=loader, backbone=backbone, mean=mean, std=std, predict_dir=predict_dir
        )
        if val_dir is None and not 0 < val_fraction < 1:
            raise DataError(
                f"data.init_args.val_fraction={val_fraction}: without a val_dir, the held-out share of the "
                "training images must be in (0, 1)"
            )
        self.root = Path(root)
        self.train_dir, self.val_dir = train_dir, val_dir
        self.val_fraction, self.seed = val_fraction, seed
        self.scale, self.hflip = tuple(scale), hflip

    @property
    def train_location(self) -> str:
        return str(self.root / self.train_dir)

    def images_in(self, folder: str, key: str) -> list[Path]:
        """The image files under `root / folder`, or an error naming the setting to fix."""
        path = self.root / folder
        if not path.is_dir():
            raise DataError(f"{path}: no such folder of images (data.init_args.root / {key})")
        try:
            return find_images(path)
        except DataError as err:
            raise DataError(
                f"{path}: no image files in it (looked for {', '.join(IMAGE_SUFFIXES)}, recursively); "
                f"check data.init_args.root and {key}"
            ) from err

    def setup_splits(self, stage: str) -> None:
        train_tf = self.seeded(
            classification_train_transforms(
                self.img_size, self.mean, self.std, self.scale, hflip=self.hflip, color_jitter=0.0
            )
        )
        eval_tf = self.eval_transforms()
        if self.val_dir is not None:
            if stage == "fit":
                self.train_dataset = UnlabeledImages(self.images_in(self.train_dir, "train_dir"), train_tf)
            self.val_dataset = self.test_dataset = UnlabeledImages(self.images_in(self.val_dir, "val_dir"), eval_tf)
            return
        paths = np.array(self.images_in(self.train_dir, "train_dir"), dtype=object)
        train_idx, val_idx = held_out_split(len(paths), self.val_fraction, self.seed)
        _logger.info("%s: validation on %d held-out images (seed %d)", self.train_location, len(val_idx), self.seed)
        self.train_dataset = UnlabeledImages(list(paths[train_idx]), train_tf)
        self.val_dataset = self.test_dataset = UnlabeledImages(list(paths[val_idx]), eval_tf)
