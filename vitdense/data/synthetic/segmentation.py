"""Offline synthetic segmentation: bright shapes on textured dark backgrounds, with exact label maps.

For demos and tests, where no dataset can be downloaded. Class 0 is the background and
class k >= 1 is `SHAPES[k - 1]`; every pixel's label is the last shape drawn over it. Every
sample is a pure function of (seed, split, index).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import albumentations as A
import numpy as np
import torch
from torch.utils.data import Dataset

from vitdense.core.errors import DataError
from vitdense.core.preprocess import Preprocess
from vitdense.data.base import ImageDataModule, LoaderConfig, Triple
from vitdense.data.synthetic.classification import SHAPES, draw_shape, split_seed, textured_background
from vitdense.data.transforms.segmentation import segmentation_eval_transforms, segmentation_train_transforms
from vitdense.types import SegmentedImages


def synthetic_scene(
    height: int, width: int, num_classes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """One scene: ([height, width, 3] float image in [0, 1], [height, width] uint8 labels).

    1 to 3 shapes, each of a random class in 1..num_classes-1 and a random bright colour,
    are drawn on a square canvas of the longer side, later ones over earlier ones; the
    top-left `height` x `width` is kept, so a shape may be cut by the border.
    """
    side = max(height, width)
    image = textured_background(side, rng)
    labels = np.zeros((side, side), dtype=np.uint8)
    for _ in range(int(rng.integers(1, 4))):
        label = int(rng.integers(1, num_classes))
        shape = draw_shape(SHAPES[label - 1], side, rng)
        # bright shapes on dark backgrounds: the contrast's sign is fixed, the hues are not
        image[shape] = rng.uniform(0.65, 1.0, 3)
        labels[shape] = label
    return image[:height, :width], labels[:height, :width]


class SyntheticSegmentation(Dataset):
    """Scenes of 1-3 shapes with their label maps.

    Args:
        length: number of samples.
        img_size: side of the square images, unless `size_range` is given.
        num_classes: background plus `num_classes - 1` shapes (2..7).
        seed: base seed; the DataModule mixes in the split so that splits differ.
        mean, std: per-channel normalisation (when there is no `transform`).
        size_range: (min, max) pixels; each image's height and width are drawn from it
            (inclusive), so sizes vary and are rarely multiples of the patch size.
        transform: albumentations-style `transform(image=[H, W, 3] uint8, mask=[H, W] uint8)`
            -> {"image": [3, H', W'], "mask": [h, w]}, e.g. `segmentation_eval_transforms`;
            None normalises the image as it is.
    """

    def __init__(
        self,
        length: int,
        img_size: int = 64,
        num_classes: int = 4,
        seed: int = 0,
        mean: Triple = (0.5, 0.5, 0.5),
        std: Triple = (0.5, 0.5, 0.5),
        size_range: tuple[int, int] | None = None,
        transform: Callable[..., dict[str, Any]] | None = None,
    ) -> None:
        if not 2 <= num_classes <= len(SHAPES) + 1:
            raise DataError(
                f"num_classes={num_classes}: the synthetic data has background plus 1 to {len(SHAPES)} shapes, "
                f"so 2 to {len(SHAPES) + 1} classes"
            )
        if size_range is not None and not 8 <= size_range[0] <= size_range[1]:
            raise DataError(f"size_range={size_range}: expected 8 <= min <= max pixels")
        self.length = length
        self.img_size = img_size
        self.num_classes = num_classes
        self.seed = seed
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)
        self.size_range = size_range
        self.transform = transform

    def __len__(self) -> int:
        return self.length

    def scene(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The raw sample: ([H, W, 3] float image in [0, 1], [H, W] uint8 labels)."""
        rng = np.random.default_rng([self.seed, index])
        if self.size_range is None:
            height = width = self.img_size
        else:
            height, width = (int(v) for v in rng.integers(self.size_range[0], self.size_range[1] + 1, 2))
        return synthetic_scene(height, width, self.num_classes, rng)

    def __getitem__(self, index: int) -> SegmentedImages:
        image, labels = self.scene(index)
        if self.transform is not None:
            out = self.transform(image=np.round(image * 255).astype(np.uint8), mask=labels)
            image_t, mask_t = out["image"], torch.as_tensor(out["mask"], dtype=torch.int64)
        else:
            normalised = (image.astype(np.float32) - self.mean) / self.std
            image_t = torch.from_numpy(normalised).permute(2, 0, 1).contiguous()
            mask_t = torch.from_numpy(labels.astype(np.int64))
        return SegmentedImages.of(image_t, mask_t, index)


SYNTHETIC_SEG_LOADER = LoaderConfig(batch_size=16)


class SyntheticSegmentationDataModule(ImageDataModule):
    """Synthetic scenes for segmentation: train/val/test splits that never overlap
    (predict uses the validation scenes).

    Every split draws images with sides in [0.75, 1.25] x `img_size` (48..80 px for 64),
    so shapes appear at the same scales in training and evaluation. Training resizes them
    to a short side of `img_size` and takes random `img_size` crops with flips and
    photometric distortion (mmseg's ADE20K pipeline at this scale, without the random
    rescale). Validation, test and prediction images are resized to a short side of
    `img_size` like mmseg's evaluation and keep their label maps at the drawn size, so
    evaluation exercises padding, unpadding and resizing to the label map.

    Args:
        num_classes: background plus `num_classes - 1` shapes (2..7).
        img_size: training image side and evaluation short side.
        train_size, val_size: samples per split (test and predict use val_size).
        seed: base seed of the generator.
        loader, mean, std: see `ImageDataModule`.
        backbone: timm name of the encoder (linked by the CLI); images are normalised with
            its pretrained mean and std.
        predict_dir: predict on this folder of images (short side resized to img_size)
            instead of the validation scenes (see `ImageDataModule`).
    """

    sample_type: ClassVar[type] = SegmentedImages

    def __init__(
        self,
        *,
        num_classes: int = 4,
        img_size: int = 64,
        train_size: int = 2000,
        val_size: int = 200,
        seed: int = 0,
        loader: LoaderConfig = SYNTHETIC_SEG_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=img_size, loader=loader, backbone=backbone, mean=mean, std=std, predict_dir=predict_dir
        )
        if not 2 <= num_classes <= len(SHAPES) + 1:
            raise DataError(f"num_classes={num_classes}: expected 2 to {len(SHAPES) + 1} (background plus shapes)")
        self.num_classes = num_classes
        self.class_names = ["background", *SHAPES[: num_classes - 1]]
        self.ignore_index = 255  # no pixel is unlabelled; batches pad label maps with it
        self.train_size, self.val_size, self.seed = train_size, val_size, seed

    def split(self, name: str) -> SyntheticSegmentation:
        """A split's scenes; the split's name is mixed into the seed so that splits never overlap."""
        seed, length = split_seed(self.seed, name, self.train_size, self.val_size)
        size_range = (round(0.75 * self.img_size), round(1.25 * self.img_size))
        if name == "train":
            # the evaluation's resize, then random crops: a shape's scale in training is its
            # scale in evaluation (drawing training squares as they are enlarged no shape,
            # and cost the demo about 2 mIoU on circles against squares)
            transform = segmentation_train_transforms(
                self.img_size,
                scale=(4 * self.img_size, self.img_size),
                ratio_range=(1.0, 1.0),
                cat_max_ratio=1.0,
                ignore_index=self.ignore_index,
                mean=self.mean,
                std=self.std,
            )
        else:
            transform = self.eval_transforms()
        return SyntheticSegmentation(
            length,
            self.img_size,
            self.num_classes,
            seed,
            self.mean,
            self.std,
            size_range=size_range,
            transform=transform,
        )

    def setup_splits(self, stage: str) -> None:
        self.train_dataset = self.split("train")
        self.val_dataset = self.predict_dataset = self.split("val")
        self.test_dataset = self.split("test")

    def eval_transforms(self) -> A.Compose:
        return segmentation_eval_transforms(self.img_size, self.mean, self.std)

    def preprocess(self) -> Preprocess:
        return Preprocess("rescale", self.img_size, self.mean, self.std, max_size=4 * self.img_size)
