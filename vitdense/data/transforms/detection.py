"""Albumentations pipelines for detection that reproduce DETR's COCO augmentation.

DETR (`datasets/coco.py`, `make_coco_transforms`) trains with

    RandomHorizontalFlip()
    RandomSelect(                                    # one or the other, p = 0.5
        RandomResize(scales, max_size=1333),         # shortest side from 480..800 step 32
        Compose(RandomResize([400, 500, 600]), RandomSizeCrop(384, 600), RandomResize(scales, max_size=1333)),
    )
    Normalize

and evaluates at shortest side 800 (longest <= 1333). Boxes follow every transform through
albumentations' `BboxParams` (absolute (x1, y1, x2, y2) in and out); a box cut to nothing by
a crop is dropped, as in DETR. The short-side resize and the random-size crop are small
custom transforms, because albumentations' `SmallestMaxSize` has no bound on the long side
and its random-sized crops resize to a fixed output.

Given a `KeypointSchema`, the pipelines also move keypoints (`KeypointParams`, format
'xy', nothing removed), called with `keypoints=[n * K, 2]` (object by object, K rows each),
`visibility=[n * K]` and `objects=[n]` (each box's object index, so that the caller knows
which objects' keypoints survive the boxes a crop drops). Keypoints use the boxes' pixel
convention, x in [0, W]: a flip maps x to W - x, where albumentations 2.0's own keypoint
flip gives W - 1 - x, and swaps each object's keypoints by the schema's `flip_index`
(`KeypointHorizontalFlip`; albumentations 2.0.8 has no label mapping for flips). Points a
crop puts outside the image are left for the caller to mark as not labelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import albumentations as A
import cv2
import numpy as np
from albumentations.augmentations.crops.transforms import BaseCrop
from albumentations.augmentations.geometric import functional as fgeometric
from albumentations.pytorch import ToTensorV2

from vitdense.core.errors import DataError
from vitdense.core.preprocess import short_side_size
from vitdense.data.transforms.common import SharedRandomCompose
from vitdense.types.keypoints import KeypointSchema

Triple = tuple[float, float, float]

#: DETR's training shortest sides
DETR_SCALES = tuple(range(480, 801, 32))


class RandomShortSideResize(A.DualTransform):
    """DETR's `RandomResize(sizes, max_size)`: the shorter side becomes one of `short_sides`
    (drawn uniformly), the longer side keeping the aspect ratio but at most `max_size`.
    Boxes scale with the image."""

    def __init__(
        self,
        short_sides: Sequence[int],
        max_size: int | None = None,
        interpolation: int = cv2.INTER_LINEAR,
        p: float = 1.0,
    ) -> None:
        super().__init__(p=p)
        if not short_sides or min(short_sides) < 1:
            raise DataError(f"short_sides={list(short_sides)}: expected one or more positive sizes")
        self.short_sides = tuple(int(s) for s in short_sides)
        self.max_size = max_size
        self.interpolation = interpolation

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        side = self.short_sides[int(self.random_generator.integers(len(self.short_sides)))]
        height, width = params["shape"][:2]
        return {"target_shape": short_side_size(height, width, side, self.max_size)}

    def apply(self, img: np.ndarray, target_shape: tuple[int, int], **params: Any) -> np.ndarray:
        return fgeometric.resize(img, target_shape, self.interpolation)

    def apply_to_bboxes(self, bboxes: np.ndarray, **params: Any) -> np.ndarray:
        return bboxes  # albumentations keeps boxes normalised: a resize leaves them as they are

    def apply_to_keypoints(self, keypoints: np.ndarray, target_shape: tuple[int, int], **params: Any) -> np.ndarray:
        return _scale_keypoints(keypoints, params["shape"], target_shape)


class RandomSquareResize(A.DualTransform):
    """RF-DETR's `SquareResize(sizes)`: the image becomes S x S, S drawn uniformly from
    `sizes`; the aspect ratio is not kept (RF-DETR trains and evaluates its COCO models so,
    at sides that are multiples of its patch size times its windows). Boxes scale with the
    image."""

    def __init__(self, sizes: Sequence[int], interpolation: int = cv2.INTER_LINEAR, p: float = 1.0) -> None:
        super().__init__(p=p)
        if not sizes or min(sizes) < 1:
            raise DataError(f"sizes={list(sizes)}: expected one or more positive sizes")
        self.sizes = tuple(int(s) for s in sizes)
        self.interpolation = interpolation

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        side = self.sizes[int(self.random_generator.integers(len(self.sizes)))]
        return {"target_shape": (side, side)}

    def apply(self, img: np.ndarray, target_shape: tuple[int, int], **params: Any) -> np.ndarray:
        return fgeometric.resize(img, target_shape, self.interpolation)

    def apply_to_bboxes(self, bboxes: np.ndarray, **params: Any) -> np.ndarray:
        return bboxes  # normalised boxes: a resize leaves them as they are

    def apply_to_keypoints(self, keypoints: np.ndarray, target_shape: tuple[int, int], **params: Any) -> np.ndarray:
        return _scale_keypoints(keypoints, params["shape"], target_shape)


def _scale_keypoints(keypoints: np.ndarray, shape: Sequence[int], target_shape: Sequence[int]) -> np.ndarray:
    # albumentations keeps keypoints in pixels: they scale with each side (x in [0, W] -> [0, W'])
    return fgeometric.keypoints_scale(keypoints, target_shape[1] / shape[1], target_shape[0] / shape[0])


class KeypointHorizontalFlip(A.HorizontalFlip):
    """`A.HorizontalFlip` whose keypoints mirror as the boxes do, x -> W - x (albumentations
    2.0's own flip gives W - 1 - x), and trade places by `flip_index` within each object:
    keypoints arrive object by object, K = len(flip_index) rows each, and their label columns
    (the visibility) move with them.

    Args:
        flip_index: for each keypoint, the index of its mirror image (`KeypointSchema.flip_index`).
        p: probability of the flip.
    """

    def __init__(self, flip_index: Sequence[int], p: float = 0.5) -> None:
        super().__init__(p=p)
        self.flip_index = tuple(int(i) for i in flip_index)

    def apply_to_keypoints(self, keypoints: np.ndarray, **params: Any) -> np.ndarray:
        flipped = super().apply_to_keypoints(keypoints, **params)
        flipped[:, 0] = params["shape"][1] - keypoints[:, 0]
        k, columns = len(self.flip_index), flipped.shape[1]
        if len(flipped) % k:
            raise DataError(
                f"KeypointHorizontalFlip: {len(flipped)} keypoints are not whole objects of {k}; pass each "
                "object's K keypoints in order (keypoints=[n * K, 2])"
            )
        return flipped.reshape(-1, k, columns)[:, list(self.flip_index)].reshape(-1, columns)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("flip_index",)


def resize_to(sizes: Sequence[int], max_size: int | None, square: bool) -> A.DualTransform:
    """DETR's shortest-side resize to one of `sizes` (longest <= `max_size`), or with
    `square` RF-DETR's square resize to one of them (`max_size` unused)."""
    return RandomSquareResize(sizes) if square else RandomShortSideResize(sizes, max_size)


class RandomSizeCrop(BaseCrop):
    """DETR's `RandomSizeCrop(min_size, max_size)`: a crop of random width in
    [min_size, min(W, max_size)] and height in [min_size, min(H, max_size)] at a random
    place (the whole side when the image is smaller than `min_size`)."""

    def __init__(self, min_size: int, max_size: int, p: float = 1.0) -> None:
        super().__init__(p=p)
        if not 0 < min_size <= max_size:
            raise DataError(f"RandomSizeCrop({min_size}, {max_size}): expected 0 < min_size <= max_size")
        self.min_size = min_size
        self.max_size = max_size

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        height, width = params["shape"][:2]
        rng = self.random_generator

        def side(length: int) -> int:
            low = min(self.min_size, length)  # an image smaller than min_size keeps that side whole
            return int(rng.integers(low, max(min(length, self.max_size), low) + 1))

        crop_w, crop_h = side(width), side(height)
        x = int(rng.integers(0, width - crop_w + 1))
        y = int(rng.integers(0, height - crop_h + 1))
        return {"crop_coords": (x, y, x + crop_w, y + crop_h)}


def _bbox_params(keypoints: KeypointSchema | None) -> A.BboxParams:
    # absolute corners in and out; boxes left without area by a crop are dropped (DETR's `keep`),
    # with their object index when keypoints must follow the boxes kept
    fields = ["labels"] if keypoints is None else ["labels", "objects"]
    return A.BboxParams(format="pascal_voc", label_fields=fields, clip=True, min_area=0.0, min_visibility=0.0)


def _keypoint_params(keypoints: KeypointSchema | None) -> A.KeypointParams | None:
    # nothing removed: each object keeps its K rows, in order, for the flip and the caller
    if keypoints is None:
        return None
    return A.KeypointParams(format="xy", label_fields=["visibility"], remove_invisible=False)


def _flip(hflip: float, keypoints: KeypointSchema | None) -> A.HorizontalFlip:
    return A.HorizontalFlip(p=hflip) if keypoints is None else KeypointHorizontalFlip(keypoints.flip_index, p=hflip)


def detection_train_transforms(
    mean: Triple,
    std: Triple,
    scales: Sequence[int] = DETR_SCALES,
    max_size: int | None = 1333,
    crop_scales: Sequence[int] = (400, 500, 600),
    crop_size: tuple[int, int] = (384, 600),
    hflip: float = 0.5,
    square: bool = False,
    keypoints: KeypointSchema | None = None,
) -> A.Compose:
    """DETR's training augmentation.

    Called as `transform(image=[H, W, 3] uint8, bboxes=[n, 4] (x1, y1, x2, y2) pixels,
    labels=[n])` -> image [3, H', W'] float32 normalised, bboxes in the new image's pixels;
    with `keypoints` also `objects=[n]`, `keypoints=[n * K, 2]` pixels and `visibility=[n * K]`
    (module docstring), which come back moved (keypoints flipped and swapped, scaled, cropped).

    Args:
        mean, std: per-channel normalisation of pixel values scaled to [0, 1].
        scales: shortest sides to draw from; max_size: bound of the longest side.
        crop_scales, crop_size: the other branch's resize before the random-size crop
            (min, max side) that precedes the final resize.
        hflip: probability of a horizontal flip.
        square: the final resizes are RF-DETR's square ones (`RandomSquareResize`: `scales`
            are sides of S x S images) instead of DETR's shortest-side ones.
        keypoints: the dataset's keypoints (their flips), or None without keypoints.
    """
    return SharedRandomCompose(
        [
            _flip(hflip, keypoints),
            A.OneOf(
                [
                    resize_to(scales, max_size, square),
                    A.Sequential(
                        [
                            RandomShortSideResize(crop_scales),
                            RandomSizeCrop(*crop_size),
                            resize_to(scales, max_size, square),
                        ],
                        # OneOf draws a branch with probability proportional to its p, and
                        # A.Sequential's default p is 0.5: it must be 1 for DETR's 1/2 : 1/2
                        p=1.0,
                    ),
                ],
                p=1.0,
            ),
            A.Normalize(mean=mean, std=std, max_pixel_value=255.0),
            ToTensorV2(),
        ],
        bbox_params=_bbox_params(keypoints),
        keypoint_params=_keypoint_params(keypoints),
    )


def detection_eval_transforms(
    mean: Triple,
    std: Triple,
    short_side: int = 800,
    max_size: int | None = 1333,
    square: bool = False,
    keypoints: KeypointSchema | None = None,
) -> A.Compose:
    """DETR's evaluation preprocessing: shortest side `short_side` (longest <= `max_size`),
    or with `square` RF-DETR's `short_side` x `short_side`; normalised; boxes, if given, follow,
    and with `keypoints` (the dataset's schema) keypoints too, called as the training
    pipeline is."""
    return SharedRandomCompose(
        [
            resize_to([short_side], max_size, square),
            A.Normalize(mean=mean, std=std, max_pixel_value=255.0),
            ToTensorV2(),
        ],
        bbox_params=_bbox_params(keypoints),
        keypoint_params=_keypoint_params(keypoints),
    )
