"""One padding collate for every image batch: classification, segmentation and detection."""

from __future__ import annotations

import torch

from vitdense.errors import DataError
from vitdense.types import DetectedImages, LabeledImages, SegmentedImages

Sample = LabeledImages | SegmentedImages | DetectedImages


def pad_collate(samples: list[Sample], ignore_index: int = 255) -> Sample:
    """Pad a list of samples of different sizes into one batch of the samples' own type.

    Images are zero-padded at the right and bottom to the largest height and width in the
    batch (0 is the mean colour once normalised). `SegmentedImages` label maps are padded
    the same way with `ignore_index` to their own largest size, which differs from the
    images' when evaluation keeps labels at the annotation's resolution; `LabeledImages`
    labels are stacked; `DetectedImages` keep one box target (and original size and
    evaluation target) per image, as tuples. Padding to a multiple of the patch size is left to the model, which
    knows the patch size.

    Args:
        samples: `LabeledImages` or `SegmentedImages` with image [3, H_i, W_i] (and mask
            [h_i, w_i] int64).
        ignore_index: label of padded mask pixels.

    Returns:
        image [B, 3, H, W]; index [B] int64; pad_mask [B, H, W] bool, True on image
        padding; image_sizes, B pairs (H_i, W_i) of Python ints before padding; then
        label [B] int64, or mask [B, h, w] int64 with mask_sizes (h_i, w_i), or B box
        targets with orig_sizes and eval_targets.
    """
    if not samples:
        raise DataError("pad_collate got no samples; the loader's batch_size must be at least 1")
    images = [s.image for s in samples]
    image_sizes = tuple((int(img.shape[-2]), int(img.shape[-1])) for img in images)
    height, width = (max(s[d] for s in image_sizes) for d in (0, 1))
    batch = images[0].new_zeros((len(samples), images[0].shape[0], height, width))
    pad_mask = torch.ones((len(samples), height, width), dtype=torch.bool)
    for i, (img, (h, w)) in enumerate(zip(images, image_sizes, strict=True)):
        batch[i, :, :h, :w] = img
        pad_mask[i, :h, :w] = False
    index = torch.tensor([int(s.index) for s in samples], dtype=torch.int64)
    if isinstance(samples[0], LabeledImages):
        label = torch.tensor([int(s.label) for s in samples], dtype=torch.int64)
        return LabeledImages(batch, label, index, pad_mask, image_sizes)
    if isinstance(samples[0], DetectedImages):
        return DetectedImages(
            batch,
            tuple(s.targets for s in samples),
            index,
            pad_mask,
            image_sizes,
            tuple(s.orig_sizes for s in samples),
            tuple(s.eval_targets for s in samples),
        )

    masks = [torch.as_tensor(s.mask, dtype=torch.int64) for s in samples]
    mask_sizes = tuple((int(m.shape[-2]), int(m.shape[-1])) for m in masks)
    mask_height, mask_width = (max(s[d] for s in mask_sizes) for d in (0, 1))
    mask_batch = torch.full((len(samples), mask_height, mask_width), ignore_index, dtype=torch.int64)
    for i, mask in enumerate(masks):
        mask_batch[i, : mask.shape[0], : mask.shape[1]] = mask
    return SegmentedImages(batch, mask_batch, index, pad_mask, image_sizes, mask_sizes)
