"""Semantic segmentation's plain model: `Segmenter` (pixel logits [B, K, H, W]; `segment`
slides windows over whole images), and how it predicts from a checkpoint without its task
(`SegmenterInference`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from vitdense.backbone import VisionTransformer
from vitdense.models.windows import segment_batch
from vitdense.results.segmentation import SegmentationResult
from vitdense.types import ImageSizes, SegmentationPrediction, SegmentedImages, Size


class Segmenter(nn.Module):
    """Segmenter (Strudel et al. 2021): pad -> encode -> decode on the patch grid ->
    upsample -> unpad.

    Args:
        backbone: the encoder.
        decoder: `ViTFeatures` -> patch-level logits [B, K, h, w] (`MaskTransformerDecoder`,
            `LinearDecoder`).
        num_classes: K.
        window: side of the sliding windows of `segment` (Segmenter: the training crop).
    """

    def __init__(self, backbone: VisionTransformer, decoder: nn.Module, num_classes: int, window: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = decoder
        self.num_classes = num_classes
        self.window = window

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """Pixel logits [B, K, H, W] (fp32; channels-last memory for B > 1) for images
        [B, 3, H, W] of any size.

        The decoder's patch-level masks are upsampled (bilinear) to the padded grid's pixels
        and cropped back to H x W: the backbone pads right/bottom to a multiple of the patch.
        Pixels beyond an image's own size (`image_sizes`) are padding.
        """
        # fp32 and channels-last (as the decoders emit it: [B, N, K] transposed) at the patch
        # grid, where it costs nothing: the upsampled logits are then fp32 under autocast (no
        # cast of [B, K, H, W] for the loss) and [B, H, W, K] in memory, the rows
        # `pixel_cross_entropy` reads without a copy. Not for a batch of one: torch cannot
        # tell its memory format from its strides and upsamples it 4x slower than from NCHW
        # (CPU, measured), so it is upsampled as NCHW and copied once by the loss.
        masks = self.head(self.backbone(images, image_sizes)).float()
        masks = masks.contiguous(memory_format=torch.channels_last if len(masks) > 1 else torch.contiguous_format)
        return self.upsample(masks, images.shape[-2:])

    def upsample(self, masks: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
        """Patch-level logits [B, K, h, w] -> pixel logits [B, K, H, W] (`size`): bilinear to
        the padded grid's pixels, then cropped."""
        ph, pw = self.backbone.patch_size
        h, w = masks.shape[-2:]
        logits = F.interpolate(masks, size=(h * ph, w * pw), mode="bilinear", align_corners=False)
        return logits[..., : size[0], : size[1]]

    export_names: ClassVar[tuple[str, ...]] = ("logits",)

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Pixel logits [B, K, H, W] of the whole input (the sliding windows of `segment` are
        the caller's loop). `forward`'s memory-format choice is left out: it branches on
        the batch, which would fix an exported graph's batch to its example's (the values
        are the same in either format)."""
        masks = self.head(self.backbone(images)).float()
        return (self.upsample(masks, images.shape[-2:]),)

    @torch.no_grad()
    def segment(
        self,
        images: torch.Tensor,
        image_sizes: ImageSizes | None = None,
        out_sizes: Sequence[Size] | None = None,
        stride: int | None = None,
        scales: Sequence[float] = (1.0,),
        flip: bool = False,
        window_batch_size: int = 4,
    ) -> list[torch.Tensor]:
        """Whole images in sliding windows (mmseg's and Segmenter's evaluation).

        Args:
            images: [B, 3, H, W], padded, with their `ImageSizes`.
            out_sizes: (h, w) to resize each image's logits to (e.g. its label map's or its
                original size); default: its own size.
            stride: window stride (default: the window, Segmenter's 512/512).
            scales, flip: test-time augmentation (probabilities averaged, log returned).
            window_batch_size: windows run through the model at once.

        Returns:
            per image, logits [1, K, h, w] at its `out_sizes` entry.
        """
        return segment_batch(
            self,
            images,
            image_sizes,
            out_sizes,
            self.window,
            stride or self.window,
            self.num_classes,
            scales,
            flip,
            window_batch_size,
        )


@dataclass(frozen=True)
class SegmenterInference:
    """How `SegmentationTask` predicts, as plain data a checkpoint records (`vitdense.models`):
    its `Segmenter` (sliding windows of side `window`), and each whole image segmented in
    windows every `stride` pixels with the test-time augmentation `scales` / `flip` (the
    task's `test_stride`, `test_scales`, `test_flip`), labels at the image's own size."""

    num_classes: int
    window: int
    ignore_index: int = 255
    stride: int | None = None
    scales: Sequence[float] = (1.0,)
    flip: bool = False
    window_batch_size: int = 4

    result_type: ClassVar[type] = SegmentationResult

    def build(self, backbone: VisionTransformer, head: Callable[..., nn.Module]) -> Segmenter:
        return Segmenter(backbone, head(backbone.embed_dim, self.num_classes), self.num_classes, self.window)

    def sample(self, image: torch.Tensor, size: Size, index: int) -> SegmentedImages:
        return SegmentedImages.unlabeled(image, size, index, self.ignore_index)

    def predict(self, model: Segmenter, batch: Any) -> SegmentationPrediction:
        logits = model.segment(
            batch.image,
            batch.image_sizes,
            batch.mask_sizes.sizes,
            self.stride or self.window,
            self.scales,
            self.flip,
            self.window_batch_size,
        )
        return SegmentationPrediction(batch.index, [x[0].argmax(0) for x in logits])
