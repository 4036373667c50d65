"""Albumentations pipelines for classification, following timm's ImageNet recipe
(`timm.data.transforms_factory`): a random resized crop with bicubic interpolation, a
horizontal flip and colour jitter for training; resize the shorter side to
`img_size / crop_pct` and centre-crop for evaluation. They take a [H, W, 3] uint8 RGB array
(`decode_image`) and return a [3, img_size, img_size] float32 tensor normalised per channel.
"""

from __future__ import annotations

import albumentations as A
import cv2
from albumentations.pytorch import ToTensorV2

from vitdense.core.errors import DataError
from vitdense.data.transforms.common import SharedRandomCompose, Triple


def classification_train_transforms(
    img_size: int,
    mean: Triple,
    std: Triple,
    scale: tuple[float, float] = (0.08, 1.0),
    hflip: float = 0.5,
    color_jitter: float = 0.4,
) -> A.Compose:
    """Training augmentation: [H, W, 3] uint8 -> [3, img_size, img_size] float32, normalised.

    Args:
        img_size: side of the square output.
        mean, std: per-channel normalisation of pixel values scaled to [0, 1].
        scale: range of the crop's area as a fraction of the image's (Inception crop).
        hflip: probability of a horizontal flip.
        color_jitter: strength of brightness, contrast and saturation jitter; 0 turns it off.
    """
    transforms: list[A.BasicTransform] = [
        A.RandomResizedCrop(size=(img_size, img_size), scale=scale, interpolation=cv2.INTER_CUBIC),
        A.HorizontalFlip(p=hflip),
    ]
    if color_jitter > 0:
        # timm jitters every image and leaves the hue alone; albumentations' defaults differ on both
        transforms.append(
            A.ColorJitter(brightness=color_jitter, contrast=color_jitter, saturation=color_jitter, hue=0.0, p=1.0)
        )
    transforms += [A.Normalize(mean=mean, std=std, max_pixel_value=255.0), ToTensorV2()]
    return SharedRandomCompose(transforms)


def classification_eval_transforms(img_size: int, mean: Triple, std: Triple, crop_pct: float = 0.875) -> A.Compose:
    """Evaluation preprocessing: [H, W, 3] uint8 -> [3, img_size, img_size] float32, normalised.

    The shorter side is resized to `int(img_size / crop_pct)` and the centre `img_size`
    square is kept; `crop_pct=1` resizes a square image straight to `img_size`.
    """
    if not 0 < crop_pct <= 1:
        raise DataError(f"crop_pct={crop_pct}: the centre crop is a fraction of the resized image, in (0, 1]")
    return SharedRandomCompose(
        [
            A.SmallestMaxSize(max_size=int(img_size / crop_pct), interpolation=cv2.INTER_CUBIC),
            A.CenterCrop(height=img_size, width=img_size),
            A.Normalize(mean=mean, std=std, max_pixel_value=255.0),
            ToTensorV2(),
        ]
    )
