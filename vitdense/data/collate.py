"""Batching images of different sizes with their label maps, and loaders that do it."""

from __future__ import annotations

from functools import partial

import torch
from torch.utils.data import DataLoader, Dataset

from vitdense.data.base import image_dataloader
from vitdense.data.types import SegmentedImages
from vitdense.errors import DataError


def pad_collate(samples: list[SegmentedImages], ignore_index: int = 255) -> SegmentedImages:
    """Pad a list of samples of different sizes into one `SegmentedImages` batch.

    Images are zero-padded at the right and bottom to the largest height and width in the
    batch (0 is the mean colour once normalised); label maps are padded the same way with
    `ignore_index` to their own largest size, which differs from the images' when
    evaluation keeps labels at the annotation's resolution. Padding to a multiple of the
    patch size is left to the model, which knows the patch size.

    Args:
        samples: items with image [3, H_i, W_i] and mask [h_i, w_i] (int64).
        ignore_index: label of padded mask pixels.

    Returns:
        image [B, 3, H, W]; mask [B, h, w] int64; index [B] int64; pad_mask [B, H, W] bool,
        True on image padding; image_size [B, 2] and mask_size [B, 2] int64, the (H_i, W_i)
        and (h_i, w_i) before padding.
    """
    if not samples:
        raise DataError("pad_collate got no samples; the loader's batch_size must be at least 1")
    images = [s.image for s in samples]
    masks = [torch.as_tensor(s.mask, dtype=torch.int64) for s in samples]
    image_size = torch.tensor([img.shape[-2:] for img in images], dtype=torch.int64)
    mask_size = torch.tensor([m.shape[-2:] for m in masks], dtype=torch.int64)
    height, width = image_size.max(0).values.tolist()
    mask_height, mask_width = mask_size.max(0).values.tolist()

    batch = images[0].new_zeros((len(samples), images[0].shape[0], height, width))
    pad_mask = torch.ones((len(samples), height, width), dtype=torch.bool)
    mask_batch = torch.full((len(samples), mask_height, mask_width), ignore_index, dtype=torch.int64)
    for i, (img, mask) in enumerate(zip(images, masks, strict=True)):
        h, w = img.shape[-2:]
        batch[i, :, :h, :w] = img
        pad_mask[i, :h, :w] = False
        mask_batch[i, : mask.shape[0], : mask.shape[1]] = mask
    index = torch.tensor([int(s.index) for s in samples], dtype=torch.int64)
    return SegmentedImages(batch, mask_batch, index, pad_mask, image_size, mask_size)


def segmentation_dataloader(
    dataset: Dataset, batch_size: int, num_workers: int, train: bool, ignore_index: int = 255
) -> DataLoader:
    """Loader of padded `SegmentedImages` batches; training shuffles and drops the last partial batch."""
    return image_dataloader(dataset, batch_size, num_workers, train, partial(pad_collate, ignore_index=ignore_index))
