"""Image classification from folders in the ImageNet layout: `root/<split>/<class>/<image>`.

The class list is the sorted sub-folder names of the train split; every other split is
labelled with that list, so label `i` means the same class in every split even when a
split lacks some classes.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import albumentations as A
from torch.utils.data import Dataset

from vitdense.core.errors import DataError
from vitdense.core.images import IMAGE_SUFFIXES, decode_image
from vitdense.data.base import LoaderConfig, Triple
from vitdense.data.classification import ClassificationDataModule, check_val_fraction, held_out_split
from vitdense.types import LabeledImages

_logger = logging.getLogger(__name__)

LAYOUT = "<root>/<class>/<image>, e.g. train/n01440764/n01440764_10026.JPEG"


def find_classes(root: str | Path) -> list[str]:
    """Sorted names of the class sub-folders of `root` (hidden folders such as .ipynb_checkpoints excluded).

    Raises:
        FileNotFoundError: `root` is not a directory.
        ValueError: `root` holds no class folders.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root}: no such directory; expected the ImageNet layout {LAYOUT} (ImageNet-1k: prepare it from "
            "the official tar files with `python data_scripts/imagenet.py`), or point data.root at your dataset"
        )
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(f"{root}: no class folders in it; expected the ImageNet layout {LAYOUT}")
    return classes


class ImageFolderDataset(Dataset):
    """Labelled images from `root/<class>/<image>`, found recursively within each class folder.

    Args:
        root: folder of one split, holding one sub-folder per class.
        transform: albumentations-style callable, `transform(image=[H, W, 3] uint8)["image"]`
            -> [3, H', W'] float tensor.
        extensions: image file suffixes, compared case-insensitively (".JPEG" is ".jpeg").
        class_names: the label order; defaults to the sorted sub-folder names. Pass the train
            split's list to label another split consistently.

    Raises:
        FileNotFoundError: `root` is missing.
        ValueError: `root` is empty, a class folder holds no images, or a folder is not in
            `class_names`.
    """

    def __init__(
        self,
        root: str | Path,
        transform: Callable[..., dict[str, Any]],
        extensions: Sequence[str] = IMAGE_SUFFIXES,
        class_names: list[str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.transform = transform
        folders = find_classes(self.root)
        self.class_names = list(class_names) if class_names is not None else folders
        if len(set(self.class_names)) != len(self.class_names):
            raise DataError(f"class_names for {self.root} has duplicates: {self.class_names}")
        class_to_idx = {name: i for i, name in enumerate(self.class_names)}
        unknown = [name for name in folders if name not in class_to_idx]
        if unknown:
            raise DataError(
                f"{self.root}: class folders {unknown} are not among the {len(self.class_names)} classes of the "
                "train split; remove them, or add them to the train split"
            )
        absent = len(self.class_names) - len(folders)
        if absent:
            _logger.info("%s: %d of %d classes have no folder here", self.root, absent, len(self.class_names))

        suffixes = {ext.lower() for ext in extensions}
        self.samples: list[tuple[str, int]] = []
        skipped = 0
        for name in folders:
            files = sorted(p for p in (self.root / name).rglob("*") if p.is_file())
            images = [p for p in files if p.suffix.lower() in suffixes and not p.name.startswith(".")]
            if not images:
                raise DataError(
                    f"{self.root / name}: class folder without images (looked for {', '.join(sorted(suffixes))}); "
                    "add images or remove the folder"
                )
            skipped += len(files) - len(images)
            self.samples += [(str(p), class_to_idx[name]) for p in images]
        if skipped:
            _logger.warning("%s: skipped %d files that are not images (%s)", self.root, skipped, ", ".join(suffixes))

    @property
    def targets(self) -> list[int]:
        """Label of every sample, in order."""
        return [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def subset(self, indices: Sequence[int], transform: Callable[..., dict[str, Any]]) -> ImageFolderDataset:
        """The samples at `indices` (re-indexed 0..n-1), read with `transform`; no folder is listed again."""
        part = copy.copy(self)
        part.samples = [self.samples[i] for i in indices]
        part.transform = transform
        return part

    def __getitem__(self, index: int) -> LabeledImages:
        path, label = self.samples[index]
        image = self.transform(image=decode_image(path))["image"]
        return LabeledImages(image, label, index)


IMAGEFOLDER_LOADER = LoaderConfig(batch_size=64)


class ImageFolderDataModule(ClassificationDataModule):
    """ImageNet-style folders: `root/<train_split>/<class>/<image>`, `root/<val_split>/...`.

    `num_classes`, `class_names` and `img_size` are set on construction (a listing of the
    train split's folders, no image is read), so the CLI can link them into the model.

    Args:
        root: dataset folder holding one folder per split.
        img_size: side of the square images fed to the model.
        train_split, val_split, test_split: split folder names under `root`; no test split
            by default.
        val_fraction: hold out this seeded fraction of the train split as the validation set
            instead of `val_split` (choose hyperparameters there, `test` on `test_split`).
        seed: seed of the held-out part.
        predict_split: split folder to predict on; defaults to `val_split`.
        scale: area range of the training random resized crop.
        color_jitter: training colour jitter strength (0 disables it).
        crop_pct: evaluation centre-crop fraction (images are resized to img_size / crop_pct).
        classes: class names in label order; None: the train split's sorted folder names
            (a checkpoint records them, so predicting on a folder needs no dataset).
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    def __init__(
        self,
        *,
        root: str,
        img_size: int = 224,
        train_split: str = "train",
        val_split: str = "val",
        test_split: str | None = None,
        val_fraction: float = 0.0,
        seed: int = 0,
        predict_split: str | None = None,
        scale: tuple[float, float] = (0.08, 1.0),
        color_jitter: float = 0.4,
        crop_pct: float = 0.875,
        classes: list[str] | None = None,
        loader: LoaderConfig = IMAGEFOLDER_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=img_size, loader=loader, backbone=backbone, mean=mean, std=std, predict_dir=predict_dir
        )
        self.root = Path(root)
        self.train_split, self.val_split, self.test_split = train_split, val_split, test_split
        check_val_fraction(val_fraction)
        self.val_fraction, self.seed = val_fraction, seed
        self.predict_split = predict_split or val_split
        self.scale, self.color_jitter, self.crop_pct = tuple(scale), color_jitter, crop_pct
        if classes is None:
            classes = find_classes(self.root / train_split)
        elif (self.root / train_split).is_dir() and find_classes(self.root / train_split) != list(classes):
            raise DataError(
                f"data.init_args.classes differ from the class folders of {self.root / train_split}; "
                "leave classes unset to take the folders' names"
            )
        self.class_names = list(classes)
        self.num_classes = len(self.class_names)
        self.record(classes=self.class_names)  # a checkpoint predicts on a folder without the dataset

    @property
    def train_location(self) -> str:
        return str(self.root / self.train_split)

    def _split(self, split: str, transform: A.Compose) -> ImageFolderDataset:
        return ImageFolderDataset(self.root / split, transform, class_names=self.class_names)

    def setup_splits(self, stage: str) -> None:
        if self.val_fraction > 0 and stage in ("fit", "validate"):
            whole = self._split(self.train_split, self.eval_transforms())
            train_idx, val_idx = held_out_split(len(whole), self.val_fraction, self.seed)
            self.val_dataset = whole.subset(val_idx, self.eval_transforms())
            self.train_dataset = whole.subset(train_idx, self.train_transforms(self.scale, self.color_jitter))
            _logger.info("%s: validation on %d held-out training images (seed %d)", self.root, len(val_idx), self.seed)
            return
        if stage == "fit":
            self.train_dataset = self._split(self.train_split, self.train_transforms(self.scale, self.color_jitter))
        if stage in ("fit", "validate"):
            self.val_dataset = self._split(self.val_split, self.eval_transforms())
        if stage == "test":
            if self.test_split is None:
                raise DataError(
                    f"{self.root}: no test split configured; set data.init_args.test_split to its folder name"
                )
            self.test_dataset = self._split(self.test_split, self.eval_transforms())
        if stage == "predict":
            self.predict_dataset = self._split(self.predict_split, self.eval_transforms())
