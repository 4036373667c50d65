"""Segmenter-style semantic segmentation (Strudel et al., ICCV 2021).

pad -> encode -> decode on the backbone's grid -> upsample -> unpad. Training runs on the
batch's crops; validation and test segment each whole image with sliding windows at the
evaluation size and score the logits resized to the label map's original size, so the
figures are those of mmseg/Segmenter's evaluation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torchmetrics import MetricCollection

from vitdense.heads.segmenter import LinearDecoder, MaskTransformerDecoder
from vitdense.inference import segment_image
from vitdense.metrics import SegmentationMetrics
from vitdense.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask, Stage
from vitdense.types import SegmentedImages


class SegmentationOutput(NamedTuple):
    """Pixel logits and their labels, as pairs: one pair [B, K, H, W] / [B, H, W] for a
    training batch, one pair [1, K, h, w] / [1, h, w] per image in evaluation (sizes differ)."""

    logits: list[torch.Tensor]
    targets: list[torch.Tensor]


class SegmentationPrediction(NamedTuple):
    """Label maps at each image's original size: index [B], labels: B tensors [h, w] int64."""

    index: torch.Tensor
    labels: list[torch.Tensor]


class SegmentationTask(BaseTask):
    """Semantic segmentation with a Segmenter decoder.

    Logs `{stage}/loss`, and per epoch `{stage}/mIoU`, `{stage}/mAcc`, `{stage}/aAcc`
    (dataset-level, see `SegmentationMetrics`) and a per-class IoU table.

    Args:
        num_classes: K (linked from the DataModule).
        decoder: "mask" (mask transformer) or "linear"; for other heads override `build_head`.
        decoder_depth, decoder_drop_rate, decoder_drop_path_rate: mask transformer settings
            (Segmenter: 2 layers, dropout 0.1, drop path 0).
        ignore_index: label of unlabelled pixels (linked from the DataModule).
        class_weights: per-class cross-entropy weights (None: uniform).
        class_names: names of the K classes (linked from the DataModule), for the table.
        window: sliding-window side in evaluation; None: the backbone's native size.
        val_stride: window stride during training-time validation (None: = window,
            Segmenter's 512/512).
        test_stride: window stride for `test` (None: window * 15/16, Segmenter's 512/480).
        test_scales, test_flip: multi-scale / flip test-time augmentation of `test`
            (Segmenter's multi-scale: 0.5, 0.75, 1.0, 1.25, 1.5, 1.75 with flip).
        window_batch_size: windows run through the model at once.
    """

    monitor = "val/mIoU"
    mode = "max"

    def __init__(
        self,
        num_classes: int,
        decoder: str = "mask",
        decoder_depth: int = 2,
        decoder_drop_rate: float = 0.1,
        decoder_drop_path_rate: float = 0.0,
        ignore_index: int = 255,
        class_weights: list[float] | None = None,
        class_names: list[str] | None = None,
        window: int | None = None,
        val_stride: int | None = None,
        test_stride: int | None = None,
        test_scales: list[float] | None = None,
        test_flip: bool = False,
        window_batch_size: int = 4,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
    ) -> None:
        if decoder not in ("mask", "linear"):
            raise ValueError(f"decoder={decoder!r}: use 'mask' or 'linear' (or override build_head)")
        if class_weights is not None and len(class_weights) != num_classes:
            raise ValueError(f"class_weights has {len(class_weights)} entries for {num_classes} classes")
        if class_names is not None and len(class_names) != num_classes:
            raise ValueError(f"class_names has {len(class_names)} entries for {num_classes} classes")
        self.num_classes = num_classes
        self.decoder = decoder
        self.decoder_depth = decoder_depth
        self.decoder_drop_rate = decoder_drop_rate
        self.decoder_drop_path_rate = decoder_drop_path_rate
        self.ignore_index = ignore_index
        self.class_names = class_names or [str(c) for c in range(num_classes)]
        self.test_scales = test_scales or [1.0]
        self.test_flip = test_flip
        self.window_batch_size = window_batch_size
        super().__init__(backbone, optimizer, lr_scheduler)
        self.window = window or self.backbone.img_size[0]
        self.val_stride = val_stride or self.window
        self.test_stride = test_stride or self.window - self.window // 16
        weights = torch.tensor(class_weights, dtype=torch.float) if class_weights is not None else None
        self.register_buffer("class_weights", weights, persistent=False)

    def build_head(self) -> nn.Module:
        if self.decoder == "linear":
            return LinearDecoder(self.backbone.embed_dim, self.num_classes)
        return MaskTransformerDecoder(
            self.backbone.embed_dim,
            self.num_classes,
            depth=self.decoder_depth,
            drop_rate=self.decoder_drop_rate,
            drop_path_rate=self.decoder_drop_path_rate,
        )

    def build_metrics(self) -> MetricCollection:
        return MetricCollection({"seg": SegmentationMetrics(self.num_classes, self.ignore_index)})

    # ---------------------------------------------------------------------------- model
    def forward(self, images: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Pixel logits [B, K, H, W] for images [B, 3, H, W] of any size.

        The decoder's patch-level masks are upsampled (bilinear) to the padded grid's pixels
        and cropped back to H x W: the backbone pads right/bottom to a multiple of the patch.
        """
        masks = self.head(self.backbone(images, pad_mask=pad_mask))
        ph, pw = self.backbone.patch_size
        h, w = masks.shape[-2:]
        logits = F.interpolate(masks, size=(h * ph, w * pw), mode="bilinear", align_corners=False)
        return logits[..., : images.shape[-2], : images.shape[-1]]

    def segment(self, batch: SegmentedImages, stride: int, scales: list[float], flip: bool) -> list[torch.Tensor]:
        """Per image, logits [1, K, h, w] at its label map's size, from sliding windows."""
        out = []
        for i in range(batch.image.shape[0]):
            h, w = batch.image_sizes[i]
            image = batch.image[i : i + 1, :, :h, :w]
            size = tuple(batch.mask_sizes[i])
            out.append(
                segment_image(
                    self, image, size, self.window, stride, self.num_classes, scales, flip, self.window_batch_size
                )
            )
        return out

    def forward_batch(self, batch: SegmentedImages) -> SegmentationOutput:
        if self.training:
            return SegmentationOutput([self(batch.image, batch.pad_mask)], [batch.mask])
        testing = self._trainer is not None and self.trainer.testing
        if testing:
            logits = self.segment(batch, self.test_stride, self.test_scales, self.test_flip)
        else:
            logits = self.segment(batch, self.val_stride, [1.0], False)
        targets = [batch.mask[i : i + 1, :h, :w] for i, (h, w) in enumerate(batch.mask_sizes)]
        return SegmentationOutput(logits, targets)

    # ------------------------------------------------------------------ loss and metrics
    def compute_loss(self, output: SegmentationOutput, batch: SegmentedImages) -> torch.Tensor:
        """Pixel-averaged cross-entropy over the batch, ignoring `ignore_index` (with class
        weights: weighted sum over weighted pixel count, as torch's weighted mean)."""
        total = torch.zeros((), device=self.device)
        weight_sum = torch.zeros((), device=self.device)
        for logits, target in zip(output.logits, output.targets, strict=True):
            total = total + F.cross_entropy(
                logits.float(), target, weight=self.class_weights, ignore_index=self.ignore_index, reduction="sum"
            )
            valid = target[target != self.ignore_index]
            weight_sum = weight_sum + (
                self.class_weights[valid].sum() if self.class_weights is not None else valid.numel()
            )
        return total / weight_sum.clamp(min=1)

    def update_metrics(self, metrics: MetricCollection, output: SegmentationOutput, batch: SegmentedImages) -> None:
        for logits, target in zip(output.logits, output.targets, strict=True):
            metrics["seg"].update(logits.argmax(1), target)

    def log_metrics(self, metrics: MetricCollection, stage: Stage, batch_size: int) -> None:
        pass  # non-scalar results: computed and logged once per epoch, in `_log_epoch`

    def _log_epoch(self, stage: Stage) -> None:
        metric: SegmentationMetrics = getattr(self, f"{stage}_metrics")["seg"]
        result = metric.compute()
        metric.reset()
        for key in ("mIoU", "mAcc", "aAcc"):
            self.log(f"{stage}/{key}", result[key].float(), prog_bar=key == "mIoU")
        if stage != "train" and not (self._trainer is not None and self.trainer.sanity_checking):
            rows = [f"{'class':<24}{'IoU':>8}{'Acc':>8}"]
            for name, iou, acc in zip(self.class_names, result["IoU"].tolist(), result["Acc"].tolist(), strict=True):
                rows.append(f"{name:<24}{100 * iou:8.2f}{100 * acc:8.2f}")
            summary = "  ".join(f"{k} {100 * result[k].item():.2f}" for k in ("mIoU", "mAcc", "aAcc"))
            rank_zero_info(f"{stage} epoch {self.current_epoch}: {summary}\n" + "\n".join(rows))

    def on_train_epoch_end(self) -> None:
        self._log_epoch("train")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def predict_step(self, batch: SegmentedImages, batch_idx: int) -> SegmentationPrediction:
        logits = self.segment(batch, self.test_stride, self.test_scales, self.test_flip)
        return SegmentationPrediction(batch.index, [x[0].argmax(0) for x in logits])
