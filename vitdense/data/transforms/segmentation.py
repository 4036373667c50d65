"""Albumentations pipelines for semantic segmentation that reproduce mmseg's ADE20K recipe.

Segmenter trains with mmsegmentation's ADE20K pipeline (configs/_base_/datasets/ade20k.py):

    RandomResize(scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True)
    RandomCrop(crop_size=512, cat_max_ratio=0.75)
    RandomFlip(prob=0.5)
    PhotoMetricDistortion()
    Normalize, Pad(size=512, pad_val=0, seg_pad_val=255)

and evaluates on images resized with the same keep-ratio rule at ratio 1 (short side 512
unless the long side would exceed 2048), comparing predictions with the label map at its
original resolution. The flip, normalisation, padding and tensor conversion are
albumentations' own; the rescale, the crop and the photometric distortion are small
custom transforms below, because albumentations' nearest equivalents follow different
rules (each says how).

Pipelines are called like any albumentations `Compose`:

    out = transform(image=image, mask=mask)   # image [H, W, 3] uint8 RGB, mask [H, W] uint8/int32
    out["image"]  # [3, H', W'] float32, normalised
    out["mask"]   # [H', W'] int64 (training: H' = W' = crop size; evaluation: the input's H, W)

A `Compose` (rather than a bare function) keeps `set_random_seed` and
`seed_worker_transforms` working.
"""

from __future__ import annotations

from typing import Any

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.augmentations.crops.transforms import BaseCrop
from albumentations.augmentations.geometric import functional as fgeometric
from albumentations.pytorch import ToTensorV2
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from vitdense.core.errors import DataError
from vitdense.core.preprocess import rescale_size
from vitdense.data.transforms.common import SharedRandomCompose

Triple = tuple[float, float, float]


class RescaleKeepRatio(A.DualTransform):
    """mmseg's `RandomResize(scale, ratio_range, keep_ratio=True)` (mmseg 0.x: `Resize(img_scale, ratio_range)`).

    Draws r uniformly in `ratio_range`, sets the bound to (int(scale[0] * r), int(scale[1] * r))
    and rescales by `rescale_size`'s rule. albumentations' `RandomScale` scales by a factor
    regardless of the image size and `LongestMaxSize`/`SmallestMaxSize` bound one side only,
    hence this transform.

    Args:
        scale: (long, short) bound at ratio 1, e.g. (2048, 512).
        ratio_range: range of r; (1, 1) is mmseg's deterministic test-time resize.
        interpolation: cv2 flag for the image (mmseg: bilinear).
        mask_interpolation: cv2 flag for the label map (nearest, so labels stay labels).
        resize_mask: False leaves the label map at its input size, as evaluation needs.
    """

    def __init__(
        self,
        scale: tuple[int, int] = (2048, 512),
        ratio_range: tuple[float, float] = (0.5, 2.0),
        interpolation: int = cv2.INTER_LINEAR,
        mask_interpolation: int = cv2.INTER_NEAREST,
        resize_mask: bool = True,
        p: float = 1.0,
    ) -> None:
        super().__init__(p=p)
        if not 0 < ratio_range[0] <= ratio_range[1]:
            raise DataError(f"ratio_range={ratio_range}: expected 0 < low <= high")
        self.scale = tuple(scale)
        self.ratio_range = tuple(ratio_range)
        self.interpolation = interpolation
        self.mask_interpolation = mask_interpolation
        self.resize_mask = resize_mask

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        low, high = self.ratio_range
        ratio = low if low == high else self.py_random.uniform(low, high)
        bound = (int(self.scale[0] * ratio), int(self.scale[1] * ratio))
        height, width = params["shape"][:2]
        return {"target_shape": rescale_size(height, width, bound)}

    def apply(self, img: np.ndarray, target_shape: tuple[int, int], **params: Any) -> np.ndarray:
        return fgeometric.resize(img, target_shape, self.interpolation)

    def apply_to_mask(self, mask: np.ndarray, target_shape: tuple[int, int], **params: Any) -> np.ndarray:
        if not self.resize_mask:
            return mask
        return fgeometric.resize(mask, target_shape, self.mask_interpolation)


class CatMaxRatioCrop(BaseCrop):
    """mmseg's `RandomCrop(crop_size, cat_max_ratio, ignore_index)`.

    A crop offset is drawn uniformly; while the crop's label map is dominated by one class
    (its most frequent non-ignored class covers >= `cat_max_ratio` of the non-ignored pixels,
    or it holds a single class), a new offset is drawn, at most `max_tries` times; the last
    draw is then kept unchecked, as in mmseg. An image smaller than the crop is kept whole
    along that side (pad it afterwards). albumentations' crops do not look at the mask.

    Args:
        height, width: crop size.
        cat_max_ratio: largest share one class may take; 1 disables the check.
        ignore_index: label excluded from the counts.
        max_tries: redraws before giving up (mmseg: 10).
    """

    def __init__(
        self,
        height: int,
        width: int,
        cat_max_ratio: float = 0.75,
        ignore_index: int = 255,
        max_tries: int = 10,
        p: float = 1.0,
    ) -> None:
        super().__init__(p=p)
        self.height = height
        self.width = width
        self.cat_max_ratio = cat_max_ratio
        self.ignore_index = ignore_index
        self.max_tries = max_tries

    def _random_window(self, height: int, width: int) -> tuple[int, int, int, int]:
        y = int(self.random_generator.integers(0, max(height - self.height, 0) + 1))
        x = int(self.random_generator.integers(0, max(width - self.width, 0) + 1))
        return x, y, min(x + self.width, width), min(y + self.height, height)

    def _balanced(self, mask: np.ndarray, window: tuple[int, int, int, int]) -> bool:
        x1, y1, x2, y2 = window
        labels, counts = np.unique(mask[y1:y2, x1:x2], return_counts=True)
        counts = counts[labels != self.ignore_index]
        return len(counts) > 1 and counts.max() / counts.sum() < self.cat_max_ratio

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        height, width = params["shape"][:2]
        window = self._random_window(height, width)
        mask = data.get("mask")
        if self.cat_max_ratio < 1 and mask is not None:
            for _ in range(self.max_tries):
                if self._balanced(mask, window):
                    break
                window = self._random_window(height, width)
        return {"crop_coords": window}


class PhotoMetricDistortion(A.ImageOnlyTransform):
    """mmseg's `PhotoMetricDistortion` on uint8 RGB images.

    In order, each step with probability 0.5: add a brightness offset in
    [-brightness_delta, brightness_delta]; (contrast first, with probability 0.5) multiply
    by a contrast factor; multiply the HSV saturation; shift the hue (OpenCV's 0..179 scale)
    by an integer in [-hue_delta, hue_delta) (numpy's exclusive upper bound, as mmseg draws
    it); (otherwise contrast last). Every step clips to [0, 255] and truncates to uint8.

    albumentations' `ColorJitter`/`RandomBrightnessContrast`/`HueSaturationValue` differ:
    one probability for all steps, contrast blended around the mean or a fixed order,
    additive saturation, rounding instead of truncation. So this transform is written out.
    """

    def __init__(
        self,
        brightness_delta: float = 32,
        contrast_range: tuple[float, float] = (0.5, 1.5),
        saturation_range: tuple[float, float] = (0.5, 1.5),
        hue_delta: int = 18,
        p: float = 1.0,
    ) -> None:
        super().__init__(p=p)
        self.brightness_delta = brightness_delta
        self.contrast_range = tuple(contrast_range)
        self.saturation_range = tuple(saturation_range)
        self.hue_delta = hue_delta

    def get_params(self) -> dict[str, Any]:
        # drawn in mmseg's order so one random stream drives the same decisions
        rnd = self.py_random

        def maybe(draw):
            return draw() if rnd.random() < 0.5 else None

        brightness = maybe(lambda: rnd.uniform(-self.brightness_delta, self.brightness_delta))
        contrast_first = rnd.random() < 0.5
        contrast = maybe(lambda: rnd.uniform(*self.contrast_range)) if contrast_first else None
        saturation = maybe(lambda: rnd.uniform(*self.saturation_range))
        hue = maybe(lambda: int(self.random_generator.integers(-self.hue_delta, self.hue_delta)))
        if not contrast_first:
            contrast = maybe(lambda: rnd.uniform(*self.contrast_range))
        return {
            "brightness": brightness,
            "contrast": contrast,
            "contrast_first": contrast_first,
            "saturation": saturation,
            "hue": hue,
        }

    @staticmethod
    def _affine(img: np.ndarray, alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
        return np.clip(img.astype(np.float32) * alpha + beta, 0, 255).astype(np.uint8)

    def apply(
        self,
        img: np.ndarray,
        brightness: float | None,
        contrast: float | None,
        contrast_first: bool,
        saturation: float | None,
        hue: int | None,
        **params: Any,
    ) -> np.ndarray:
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            raise DataError(
                f"PhotoMetricDistortion needs a [H, W, 3] uint8 RGB image, got {img.dtype} {img.shape}; "
                "place it before Normalize"
            )
        if brightness is not None:
            img = self._affine(img, beta=brightness)
        if contrast_first and contrast is not None:
            img = self._affine(img, alpha=contrast)
        # mmseg converts to HSV separately for saturation and hue; the round trips are kept
        if saturation is not None:
            hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV)
            hsv[..., 1] = self._affine(hsv[..., 1], alpha=saturation)
            img = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
        if hue is not None:
            hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV)
            hsv[..., 0] = (hsv[..., 0].astype(np.int32) + hue) % 180
            img = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
        if not contrast_first and contrast is not None:
            img = self._affine(img, alpha=contrast)
        return img


class ToTensorInt64Mask(ToTensorV2):
    """`ToTensorV2` that also casts the label map to int64 (the loss's target dtype).

    Label maps travel through the pipeline as uint8 or int32, the dtypes cv2 resizes and
    pads; `ToTensorV2` keeps whatever dtype it is given.
    """

    def apply_to_mask(self, mask: np.ndarray, **params: Any) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(mask, dtype=np.int64))


def segmentation_train_transforms(
    crop_size: int = 512,
    scale: tuple[int, int] = (2048, 512),
    ratio_range: tuple[float, float] = (0.5, 2.0),
    cat_max_ratio: float = 0.75,
    ignore_index: int = 255,
    mean: Triple = IMAGENET_DEFAULT_MEAN,
    std: Triple = IMAGENET_DEFAULT_STD,
    hflip: float = 0.5,
) -> A.Compose:
    """Training augmentation: image [H, W, 3] uint8 + mask [H, W] -> [3, c, c] float32 + [c, c] int64.

    mmseg's ADE20K pipeline (see the module docstring). The padding after normalisation
    fills the image with 0 (the mean colour) and the mask with `ignore_index`, at the
    right and bottom.

    Args:
        crop_size: side c of the square output.
        scale: (long, short) resize bound at ratio 1.
        ratio_range: range of the random resize ratio.
        cat_max_ratio: largest share of the crop one class may take (1 disables the retries).
        ignore_index: label of unlabelled pixels, excluded from the crop statistics.
        mean, std: per-channel normalisation of pixel values scaled to [0, 1].
        hflip: probability of a horizontal flip.
    """
    return SharedRandomCompose(
        [
            RescaleKeepRatio(scale=scale, ratio_range=ratio_range),
            CatMaxRatioCrop(crop_size, crop_size, cat_max_ratio=cat_max_ratio, ignore_index=ignore_index),
            A.HorizontalFlip(p=hflip),
            PhotoMetricDistortion(),
            A.Normalize(mean=mean, std=std, max_pixel_value=255.0),
            A.PadIfNeeded(
                min_height=crop_size,
                min_width=crop_size,
                position="top_left",  # the image stays at the top left: padding goes right and bottom
                border_mode=cv2.BORDER_CONSTANT,
                fill=0,
                fill_mask=ignore_index,
            ),
            ToTensorInt64Mask(),
        ]
    )


def segmentation_eval_transforms(
    short_side: int = 512,
    mean: Triple = IMAGENET_DEFAULT_MEAN,
    std: Triple = IMAGENET_DEFAULT_STD,
    long_side: int | None = None,
) -> A.Compose:
    """Evaluation preprocessing: image [H, W, 3] uint8 -> [3, H', W'] float32; mask [H, W] -> [H, W] int64.

    The image is rescaled so its short side is `short_side`, unless its long side would
    then exceed `long_side` (default 4 x short_side: mmseg's (2048, 512)); the mask keeps
    its size, because metrics are computed at the resolution of the annotation. The mask
    is optional (`transform(image=image)` for prediction).
    """
    bound = (long_side if long_side is not None else 4 * short_side, short_side)
    return SharedRandomCompose(
        [
            RescaleKeepRatio(scale=bound, ratio_range=(1.0, 1.0), resize_mask=False),
            A.Normalize(mean=mean, std=std, max_pixel_value=255.0),
            ToTensorInt64Mask(),
        ]
    )
