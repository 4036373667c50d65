"""One padding collate for every image batch: classification, segmentation, detection and
universal (panoptic / instance) segmentation."""

from __future__ import annotations

import torch

from vitdense.core.errors import DataError
from vitdense.types import DetectedImages, ImageSizes, LabeledImages, PanopticImages, SegmentedImages

Sample = LabeledImages | SegmentedImages | DetectedImages | PanopticImages


def pad_stack(tensors: list[torch.Tensor], fill: float | int = 0) -> tuple[torch.Tensor, ImageSizes]:
    """[..., H_i, W_i] tensors padded right and bottom with `fill` to the largest H and W,
    stacked to [B, ..., H, W], with the batch's `ImageSizes`."""
    sizes = ImageSizes.of([t.shape[-2:] for t in tensors])
    batch = tensors[0].new_full((len(tensors), *tensors[0].shape[:-2], *sizes.padded), fill)
    for i, (t, (h, w)) in enumerate(zip(tensors, sizes.sizes, strict=True)):
        batch[i, ..., :h, :w] = t
    return batch, sizes


def pad_collate(samples: list[Sample], ignore_index: int = 255) -> Sample:
    """Pad a list of samples of different sizes into one batch of the samples' own type.

    Images are zero-padded at the right and bottom to the largest height and width in the
    batch (0 is the mean colour once normalised), and the batch carries their `ImageSizes`,
    the one description of its padding every later stage derives masks from.
    `SegmentedImages` label maps are padded the same way with `ignore_index` to their own
    largest size (their own `ImageSizes` in `mask_sizes`), which differs from the images'
    when evaluation keeps labels at the annotation's resolution; `LabeledImages` labels are
    stacked; `DetectedImages` and `PanopticImages` keep one target (boxes, or segment masks
    at their image's own size) and one original size and evaluation target per image, as
    tuples. A sample type with a `collate(samples)` classmethod (`DepthImages`) batches
    itself. Padding to a multiple of the patch size is left to the model, which knows the
    patch size.

    Args:
        samples: `LabeledImages`, `SegmentedImages`, `DetectedImages` or `PanopticImages`
            with image [3, H_i, W_i] (and mask [h_i, w_i] int64).
        ignore_index: label of padded mask pixels.

    Returns:
        image [B, 3, H, W]; index [B] int64; image_sizes (`ImageSizes`); then label [B]
        int64, or mask [B, h, w] int64 with mask_sizes, or B box targets (B segment
        targets) with orig_sizes and eval_targets.
    """
    if not samples:
        raise DataError("pad_collate got no samples; the loader's batch_size must be at least 1")
    own = getattr(type(samples[0]), "collate", None)
    if own is not None:  # a family's own batch type (depth's `DepthImages`) pads itself
        return own(samples)
    batch, image_sizes = pad_stack([s.image for s in samples])
    index = torch.tensor([int(s.index) for s in samples], dtype=torch.int64)
    if isinstance(samples[0], LabeledImages):
        label = torch.tensor([int(s.label) for s in samples], dtype=torch.int64)
        return LabeledImages(batch, label, index, image_sizes)
    if isinstance(samples[0], DetectedImages | PanopticImages):
        return type(samples[0])(
            batch,
            tuple(s.targets for s in samples),
            index,
            image_sizes,
            tuple(s.orig_sizes for s in samples),
            tuple(s.eval_targets for s in samples),
        )
    masks, mask_sizes = pad_stack([torch.as_tensor(s.mask, dtype=torch.int64) for s in samples], ignore_index)
    return SegmentedImages(batch, masks, index, image_sizes, mask_sizes)
