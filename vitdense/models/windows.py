"""Segmentation over whole images: sliding windows, multi-scale and flip (mmseg semantics),
what `vitdense.models.Segmenter.segment` runs in evaluation and prediction.

`predict` maps an image batch [B, 3, h, w] to logits [B, K, h, w] at the same size (any
size); these functions tile a larger image with it and average where windows overlap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from vitdense.types import ImageSizes

Predict = Callable[[torch.Tensor], torch.Tensor]


def window_starts(length: int, window: int, stride: int) -> list[int]:
    """Start offsets of windows covering [0, length): every `stride`, the last one flush
    with the end (mmseg's slide_inference grid); one window when length <= window."""
    count = max(length - window + stride - 1, 0) // stride + 1
    return sorted({max(min(i * stride + window, length) - window, 0) for i in range(count)})


@torch.no_grad()
def slide_inference(
    predict: Predict, image: torch.Tensor, window: int, stride: int, num_classes: int, batch_size: int = 4
) -> torch.Tensor:
    """Logits [1, K, H, W] of one image [1, 3, H, W] from overlapping windows.

    Windows are `window` x `window` (smaller only where the image is), placed every
    `stride` pixels with the last one flush with the border; logits are summed and divided
    by how many windows cover each pixel. Windows run `batch_size` at a time.
    """
    if stride > window:
        raise ValueError(f"stride {stride} > window {window} would leave pixels uncovered")
    _, _, h, w = image.shape
    boxes = [(y, x) for y in window_starts(h, window, stride) for x in window_starts(w, window, stride)]
    wh, ww = min(window, h), min(window, w)
    logits = image.new_zeros(1, num_classes, h, w)
    count = image.new_zeros(1, 1, h, w)
    for i in range(0, len(boxes), batch_size):
        chunk = boxes[i : i + batch_size]
        crops = torch.cat([image[:, :, y : y + wh, x : x + ww] for y, x in chunk])
        out = predict(crops).float()
        for (y, x), crop_logits in zip(chunk, out, strict=True):
            logits[:, :, y : y + wh, x : x + ww] += crop_logits
            count[:, :, y : y + wh, x : x + ww] += 1
    return logits / count


@torch.no_grad()
def segment_image(
    predict: Predict,
    image: torch.Tensor,
    out_size: tuple[int, int],
    window: int,
    stride: int,
    num_classes: int,
    scales: Sequence[float] = (1.0,),
    flip: bool = False,
    batch_size: int = 4,
) -> torch.Tensor:
    """Class scores [1, K, *out_size] of one image [1, 3, H, W], usable as logits.

    A single scale without flip returns the sliding-window logits resized (bilinear) to
    `out_size`. With several scales (e.g. 0.5..1.75 of the given size) and/or a horizontal
    flip, the softmax probabilities of every view are resized to `out_size` and averaged,
    as mmseg's test-time augmentation does, and their log is returned (so that softmax,
    argmax and cross-entropy treat both cases alike).
    """
    _, _, h, w = image.shape
    views = []
    for scale in scales:
        size = (round(h * scale), round(w * scale))
        scaled = image if size == (h, w) else F.interpolate(image, size=size, mode="bilinear", align_corners=False)
        for flipped in (False, True) if flip else (False,):
            view = scaled.flip(-1) if flipped else scaled
            logits = slide_inference(predict, view, window, stride, num_classes, batch_size)
            logits = logits.flip(-1) if flipped else logits
            views.append(F.interpolate(logits, size=out_size, mode="bilinear", align_corners=False))
    if len(views) == 1:
        return views[0]
    return torch.stack([v.softmax(dim=1) for v in views]).mean(0).clamp_min(1e-12).log()


@torch.no_grad()
def segment_batch(
    predict: Predict,
    images: torch.Tensor,
    image_sizes: ImageSizes | None,
    out_sizes: Sequence[tuple[int, int]] | None,
    window: int,
    stride: int,
    num_classes: int,
    scales: Sequence[float] = (1.0,),
    flip: bool = False,
    batch_size: int = 4,
) -> list[torch.Tensor]:
    """`segment_image` for each image of a padded batch [B, 3, H, W] (its own part, as
    `image_sizes` says; None: none is padded): per image, scores [1, K, h, w] at its
    `out_sizes` entry (default: its own size)."""
    if image_sizes is None:
        image_sizes = ImageSizes.full(images.shape[0], images.shape[-2:])
    out_sizes = out_sizes or image_sizes.sizes
    return [
        segment_image(
            predict, images[i : i + 1, :, :h, :w], tuple(size), window, stride, num_classes, scales, flip, batch_size
        )
        for i, ((h, w), size) in enumerate(zip(image_sizes.sizes, out_sizes, strict=True))
    ]
