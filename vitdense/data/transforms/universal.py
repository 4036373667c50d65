"""Albumentations pipelines for universal (panoptic / instance) segmentation that reproduce
EoMT's COCO recipe (tue-mps/eomt `datasets/transforms.py`, `Transforms`).

EoMT trains with large-scale jitter (LSJ) at the crop size T (640 for COCO):

    drop crowd segments
    RandomHorizontalFlip()
    ScaleJitter(target_size=(T, T), scale_range=(0.1, 2.0))   # torchvision's
    pad right and bottom to T x T with 0 (black; images are normalised later, in the model)
    RandomCrop(T)
    drop segments the crop left without pixels; if none is left, start again

and evaluates on the image resized so that its long side is T (`resize_and_pad_imgs_instance_panoptic`),
predictions being resized back to the original size. Its colour jitter is off for COCO.

Segments travel through the pipeline as albumentations `masks`: one [1, H, W] int32 map
of segment numbers (panoptic segments do not overlap) or [n, H, W] uint8 masks
(instances may), see `vitdense.data.universal.SegmentLayers`.

    out = transform(image=image, masks=layers)  # image [H, W, 3] uint8 RGB, layers [L, H, W]
    out["image"]  # [3, H', W'] float32, normalised
    out["masks"]  # [L, H', W'] (a tensor)

The scale jitter resizes with torch, as torchvision does (bilinear with antialiasing for the
image, nearest for the masks), so that its output equals EoMT's pixel for pixel; the
evaluation resize is cv2's bilinear one of `vitdense.core.preprocess.Preprocess("rescale")`,
which `preprocess()` must equal (see `panoptic_eval_transforms`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from torch.nn import functional as F

from vitdense.core.errors import DataError
from vitdense.data.transforms.common import SharedRandomCompose
from vitdense.data.transforms.segmentation import RescaleKeepRatio

Triple = tuple[float, float, float]

#: EoMT's COCO scale range of the large-scale jitter
EOMT_SCALE_RANGE = (0.1, 2.0)


def scale_jitter_size(
    height: int, width: int, target: int, scale_range: Sequence[float], draw: float
) -> tuple[int, int]:
    """torchvision's `ScaleJitter` size rule, its uniform draw `draw` in [0, 1) given.

    scale = low + draw (high - low); r = min(T / H, T / W) x scale; (int(H r), int(W r)),
    in float32 as torchvision computes it (its draw is a float32 tensor), so that sizes
    agree to the pixel. A side that would round to 0 becomes 1 (torchvision fails there).
    """
    low, high = scale_range
    scale = low + torch.tensor([draw], dtype=torch.float32) * (high - low)
    r = min(target / height, target / width) * scale
    return max(1, int(height * r)), max(1, int(width * r))


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing `array`'s memory, or of a copy when it is read-only (a decoded image
    can be, and torch requires writable memory)."""
    array = np.ascontiguousarray(array)
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def resize_masks(layers: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """[L, H, W] integer masks -> [L, h, w], nearest (torch's "nearest", torchvision's rule for masks)."""
    tensor = _tensor(layers)[None]
    if tensor.dtype == torch.uint8:
        return F.interpolate(tensor, size=shape, mode="nearest")[0].numpy()
    # segment numbers are small integers: exact in float32 (torch has no integer nearest kernel)
    if layers.size and int(np.abs(layers).max()) >= 2**24:
        raise DataError(f"segment numbers up to {int(np.abs(layers).max())} do not fit float32's exact integers")
    return F.interpolate(tensor.float(), size=shape, mode="nearest")[0].numpy().astype(layers.dtype)


class ScaleJitter(A.DualTransform):
    """torchvision's `ScaleJitter(target_size=(T, T), scale_range)` (Copy-Paste's LSJ): the
    image is resized by min(T / H, T / W) x s, s uniform in `scale_range`, keeping its aspect
    ratio (`scale_jitter_size`); bilinear with antialiasing for the image and nearest for the
    masks, with torch's kernels (those torchvision calls). albumentations' `RandomScale`
    scales by a factor of the image itself, not of a target size, hence this transform.

    Args:
        target_size: T, the side of the training crop.
        scale_range: (low, high) of s.
    """

    def __init__(self, target_size: int, scale_range: tuple[float, float] = EOMT_SCALE_RANGE, p: float = 1.0) -> None:
        super().__init__(p=p)
        if not 0 < scale_range[0] <= scale_range[1]:
            raise DataError(f"scale_range={tuple(scale_range)}: expected 0 < low <= high")
        self.target_size = int(target_size)
        self.scale_range = (float(scale_range[0]), float(scale_range[1]))

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        height, width = params["shape"][:2]
        draw = self.py_random.random()
        return {"target_shape": scale_jitter_size(height, width, self.target_size, self.scale_range, draw)}

    def apply(self, img: np.ndarray, target_shape: tuple[int, int], **params: Any) -> np.ndarray:
        if img.dtype != np.uint8 or img.ndim != 3:
            raise DataError(f"ScaleJitter needs a [H, W, C] uint8 image, got {img.dtype} {img.shape}")
        tensor = _tensor(img).permute(2, 0, 1)[None]
        out = F.interpolate(tensor, size=target_shape, mode="bilinear", antialias=True, align_corners=False)
        return out[0].permute(1, 2, 0).contiguous().numpy()

    def apply_to_mask(self, mask: np.ndarray, target_shape: tuple[int, int], **params: Any) -> np.ndarray:
        return resize_masks(mask[None], target_shape)[0]

    def apply_to_masks(self, masks: np.ndarray, target_shape: tuple[int, int], **params: Any) -> np.ndarray:
        return resize_masks(np.asarray(masks), target_shape)


def panoptic_train_transforms(
    img_size: int,
    scale_range: tuple[float, float] = EOMT_SCALE_RANGE,
    mean: Triple = (0.485, 0.456, 0.406),
    std: Triple = (0.229, 0.224, 0.225),
    hflip: float = 0.5,
) -> A.Compose:
    """EoMT's training augmentation (the module docstring): flip, scale jitter, padding to
    `img_size` x `img_size` with black (masks with 0), a random `img_size` crop, then
    normalisation. The caller drops crowds first and empty segments after (`CocoSegments`).

    Args:
        img_size: T, the side of the square output.
        scale_range: the jitter's range of s (EoMT's COCO: (0.1, 2.0)).
        mean, std: per-channel normalisation of pixel values scaled to [0, 1].
        hflip: probability of a horizontal flip.
    """
    return SharedRandomCompose(
        [
            A.HorizontalFlip(p=hflip),
            ScaleJitter(img_size, scale_range),
            # black, before the normalisation: EoMT pads the uint8 image and normalises in the model
            A.PadIfNeeded(
                min_height=img_size,
                min_width=img_size,
                position="top_left",
                border_mode=cv2.BORDER_CONSTANT,
                fill=0,
                fill_mask=0,
            ),
            A.RandomCrop(img_size, img_size),
            A.Normalize(mean=mean, std=std, max_pixel_value=255.0),
            ToTensorV2(),
        ]
    )


def panoptic_eval_transforms(
    eval_size: int, mean: Triple = (0.485, 0.456, 0.406), std: Triple = (0.229, 0.224, 0.225)
) -> A.Compose:
    """Evaluation preprocessing: the image resized so that its long side is `eval_size`
    (keeping its aspect ratio; masks, if given, follow with nearest), then normalised.

    This is `Preprocess("rescale", eval_size, max_size=eval_size)` bit for bit (cv2's
    bilinear resize, sides rounded half up). EoMT resizes with PIL's antialiased bilinear
    and Python's round; the two agree where no resize is needed (COCO's images at 640:
    nearly all have a long side of 640) and differ by the filter elsewhere, and by one
    pixel where a side lands on exactly .5. EoMT pads the image to T x T with black; here
    the batch's collate pads (with 0 after normalisation) and `ImageSizes` says where.
    """
    return SharedRandomCompose(
        [
            RescaleKeepRatio(scale=(eval_size, eval_size), ratio_range=(1.0, 1.0)),
            A.Normalize(mean=mean, std=std, max_pixel_value=255.0),
            ToTensorV2(),
        ]
    )
