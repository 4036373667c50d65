"""The batch, output and prediction types of depth estimation (`vitdense.tasks.depth`),
beside the contract types of `vitdense.types`: NamedTuples of tensors, importable without
any dataset family or transform library."""

from __future__ import annotations

from typing import NamedTuple

import torch

from vitdense.types.common import ImageSizes, Size


class DepthImages(NamedTuple):
    """An image with its depth map, or a batch of them.

    In training the depth map matches the (cropped, flipped) image pixel for pixel. In
    evaluation the image may be resized for the model, but the depth map keeps the size it
    was measured at: metrics are computed there (as BTS's and DPT's evaluations).

    Attributes:
        image: [3, H, W] normalised image; [B, 3, H, W] zero-padded right/bottom in a batch.
        depth: [h, w] float32 metric depth (metres), 0 where there is no measurement;
            [B, h, w] padded with 0 (no measurement) in a batch.
        index: position of the sample in its dataset; [B] int64 in a batch.
        image_sizes: (H, W) of a single image; the batch's `ImageSizes` once collated.
        depth_sizes: (h, w) of a single depth map; the depth maps' `ImageSizes` in a batch.
    """

    image: torch.Tensor
    depth: torch.Tensor
    index: torch.Tensor | int = -1
    image_sizes: ImageSizes | Size | None = None
    depth_sizes: ImageSizes | Size | None = None

    @classmethod
    def of(cls, image: torch.Tensor, depth: torch.Tensor, index: int) -> DepthImages:
        """One sample, its sizes read off the tensors: image [3, H, W], depth [h, w] float32."""
        return cls(image, depth, index, tuple(image.shape[-2:]), tuple(depth.shape[-2:]))

    @classmethod
    def unlabeled(cls, image: torch.Tensor, size: Size, index: int, ignore_index: int = 255) -> DepthImages:
        """An image to predict on: [3, H, W] preprocessed; no measurement (0) at `size`, the
        image's (H0, W0) as given: the size depth is predicted at."""
        return cls.of(image, torch.zeros(int(size[0]), int(size[1])), index)

    @classmethod
    def collate(cls, samples: list[DepthImages]) -> DepthImages:
        """`pad_collate`'s batch of depth samples: images padded with 0 (the mean colour),
        depth maps with 0 (no measurement), each with its own `ImageSizes`."""
        from vitdense.types.collate import pad_stack  # (the collate imports no task family)

        images, image_sizes = pad_stack([s.image for s in samples])
        depths, depth_sizes = pad_stack([torch.as_tensor(s.depth, dtype=torch.float32) for s in samples])
        index = torch.tensor([int(s.index) for s in samples], dtype=torch.int64)
        return cls(images, depths, index, image_sizes, depth_sizes)


class DepthOutput(NamedTuple):
    """Predictions and their targets, as pairs: one pair [B, h, w] / [B, h, w] for a
    training batch (the model's raw output: depth, or inverse depth), one pair [1, h, w] /
    [1, h, w] per image in evaluation, the prediction as metric depth at its target's size.

    Attributes:
        preds: predictions.
        targets: metric depth, 0 where there is no measurement.
        raw: in evaluation, the model's raw output at each target's size (what the loss
            compares); in training the same as `preds`.
    """

    preds: list[torch.Tensor]
    targets: list[torch.Tensor]
    raw: list[torch.Tensor]


class DepthPrediction(NamedTuple):
    """Depth maps at each image's original size: index [B] (in its dataset), depths: B
    float32 tensors [h, w]: metric depth (metres), or relative inverse depth when
    `relative` (a model trained with a scale- and shift-invariant loss: no metric scale).
    `png_scale`: depth units per metre in the 16-bit PNGs `predict` writes."""

    index: torch.Tensor
    depths: list[torch.Tensor]
    relative: bool = False
    png_scale: float = 1000.0
