"""CIFAR-10 and CIFAR-100, upsampled to the ViT's input size, as in the ViT paper's transfer runs.

torchvision reads the official pickled batches (and downloads them when allowed); the
32x32 images go through the same albumentations pipelines as ImageNet-style folders.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from torch.utils.data import Dataset
from torchvision.datasets import CIFAR10, CIFAR100

from vitdense.core.errors import DataError
from vitdense.data.base import LoaderConfig, Triple
from vitdense.data.classification import ClassificationDataModule, check_val_fraction, held_out_split
from vitdense.types import LabeledImages

_logger = logging.getLogger(__name__)

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

#: the fine labels in the order of the official `meta` file (alphabetical), which torchvision reads
CIFAR100_CLASSES = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle",
    "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle",
    "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur",
    "dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard",
    "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain",
    "mouse", "mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree",
    "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road", "rocket",
    "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider",
    "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank", "telephone", "television", "tiger", "tractor",
    "train", "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
)  # fmt: skip

_VARIANTS: dict[str, tuple[type[CIFAR10], tuple[str, ...]]] = {
    "cifar10": (CIFAR10, CIFAR10_CLASSES),
    "cifar100": (CIFAR100, CIFAR100_CLASSES),
}


class CIFARImages(Dataset):
    """Images held in memory as an array, with their labels.

    Args:
        images: [N, 32, 32, 3] uint8 RGB.
        labels: [N] class indices.
        transform: albumentations-style callable, `transform(image=[H, W, 3] uint8)["image"]`
            -> [3, H', W'] float tensor.
        indices: which of the N images this dataset holds (a split of them); all by default.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        transform: Callable[..., dict[str, Any]],
        indices: np.ndarray | None = None,
    ) -> None:
        self.images = images
        self.labels = labels
        self.transform = transform
        self.indices = np.arange(len(images)) if indices is None else indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> LabeledImages:
        i = self.indices[index]
        image = self.transform(image=self.images[i])["image"]
        return LabeledImages(image, int(self.labels[i]), index)


CIFAR_LOADER = LoaderConfig(batch_size=64)


class CIFARDataModule(ClassificationDataModule):
    """CIFAR-10 or CIFAR-100 under `root` (torchvision's layout: `root/cifar-100-python/...`).

    The test split is the official test set. Validation uses it too unless `val_fraction`
    holds out a seeded part of the training set instead. `num_classes` and `class_names`
    are known on construction, before anything is read or downloaded.

    Args:
        root: folder holding (or to receive) the extracted archive.
        variant: "cifar10" or "cifar100" (fine labels).
        img_size: side the 32x32 images are upsampled to.
        download: fetch the archive in `prepare_data` when it is not under `root`.
        val_fraction: fraction of the training set held out for validation (0: validate on
            the test set, as the ViT paper's transfer numbers do).
        seed: seed of the held-out split.
        scale: area range of the training random resized crop.
        color_jitter: training colour jitter strength (0, the default, disables it).
        loader, backbone, mean, std: see `ImageDataModule`.
        predict_dir: predict on this folder of images (resized whole to img_size) instead
            of the test split (see `ImageDataModule`).
    """

    def __init__(
        self,
        *,
        root: str = "data/cifar",
        variant: Literal["cifar10", "cifar100"] = "cifar100",
        img_size: int = 224,
        download: bool = True,
        val_fraction: float = 0.0,
        seed: int = 0,
        scale: tuple[float, float] = (0.08, 1.0),
        color_jitter: float = 0.0,
        loader: LoaderConfig = CIFAR_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=img_size, loader=loader, backbone=backbone, mean=mean, std=std, predict_dir=predict_dir
        )
        if variant not in _VARIANTS:
            raise DataError(f"variant={variant!r}: choose one of {', '.join(_VARIANTS)}")
        check_val_fraction(val_fraction)
        self.root = Path(root)
        self.variant, self.download, self.val_fraction, self.seed = variant, download, val_fraction, seed
        self.scale, self.color_jitter = tuple(scale), color_jitter
        self.dataset_class, names = _VARIANTS[variant]
        self.class_names = list(names)
        self.num_classes = len(names)

    def _missing(self, reason: str) -> FileNotFoundError:
        cls = self.dataset_class
        return FileNotFoundError(
            f"{self.root / cls.base_folder}: {self.variant} {reason}; set data.init_args.download=true, "
            f"or fetch {cls.url} and extract it into {self.root}"
        )

    def prepare_data(self) -> None:
        """Download and extract the archive if `download` and it is not there yet (rank 0 only)."""
        if not self.download:
            return
        try:
            # the test split is the smaller one to load; the archive holds both
            self.dataset_class(str(self.root), train=False, download=True)
        except (OSError, RuntimeError) as err:
            raise self._missing(f"could not be downloaded ({err})") from err

    def _load(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        """([N, 32, 32, 3] uint8 images, [N] int64 labels) of the train or test set."""
        try:
            ds = self.dataset_class(str(self.root), train=train, download=False)
        except RuntimeError as err:
            raise self._missing("files are missing or fail their md5 check") from err
        if list(ds.classes) != self.class_names:
            raise DataError(
                f"{self.root / ds.base_folder / ds.meta['filename']}: class names {ds.classes[:3]}... differ from "
                f"the official {self.variant} list; re-download the dataset"
            )
        return ds.data, np.asarray(ds.targets, dtype=np.int64)

    @property
    def train_location(self) -> str:
        return str(self.root / self.dataset_class.base_folder)

    def setup_splits(self, stage: str) -> None:
        eval_transform = self.eval_transforms()
        if stage in ("fit", "validate"):
            if self.val_fraction > 0:
                images, labels = self._load(train=True)
                train_idx, val_idx = held_out_split(len(images), self.val_fraction, self.seed)
                self.val_dataset = CIFARImages(images, labels, eval_transform, val_idx)
            else:
                self.val_dataset = CIFARImages(*self._load(train=False), eval_transform)
            if stage == "fit":
                train_transform = self.train_transforms(self.scale, self.color_jitter)
                if self.val_fraction > 0:
                    self.train_dataset = CIFARImages(images, labels, train_transform, train_idx)
                else:
                    self.train_dataset = CIFARImages(*self._load(train=True), train_transform)
            _logger.info(
                "%s: %s validation images (%s)",
                self.variant,
                len(self.val_dataset),
                f"{self.val_fraction:.0%} of train, seed {self.seed}" if self.val_fraction > 0 else "the test set",
            )
        if stage in ("test", "predict"):
            # predictions are made on the official test set, in order
            self.test_dataset = self.predict_dataset = CIFARImages(*self._load(train=False), eval_transform)
