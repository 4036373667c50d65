"""Segmenter-style semantic segmentation (Strudel et al., ICCV 2021).

pad -> encode -> decode on the backbone's grid -> upsample -> unpad. Training runs on the
batch's crops; validation and test segment each whole image with sliding windows at the
evaluation size and score the logits resized to the label map's original size, so the
figures are those of mmseg/Segmenter's evaluation.
"""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MetricCollection

from vitdense.backbone import VisionTransformer
from vitdense.core.errors import ConfigError
from vitdense.heads.segmenter import MaskTransformerDecoder
from vitdense.losses.segmentation import pixel_cross_entropy
from vitdense.metrics.segmentation import SegmentationMetrics
from vitdense.models.segmentation import Segmenter, SegmenterInference
from vitdense.results.segmentation import SegmentationResult
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask, HeadFactory, Stage
from vitdense.tasks.pictures import draw_segmented
from vitdense.training.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.types import Losses, LossSum, SegmentationOutput, SegmentationPrediction, SegmentedImages, Size

#: Segmenter's mask transformer: 2 layers, dropout 0.1, no drop path
DEFAULT_SEGMENTATION_HEAD = partial(MaskTransformerDecoder, depth=2, drop_rate=0.1, drop_path_rate=0.0)


class SegmentationTask(BaseTask):
    """Semantic segmentation with a Segmenter decoder.

    Logs `{stage}/loss`, and per epoch `{stage}/mIoU`, `{stage}/mAcc`, `{stage}/aAcc`
    (dataset-level, see `SegmentationMetrics`) with a per-class IoU table in the log. The
    evaluation loss is the dataset's too: the cross-entropy summed over every labelled pixel
    of the split over their number (class-weighted), the same for any batch size and number
    of processes.

    Args:
        num_classes: K (linked from the DataModule).
        head: `head(embed_dim, num_classes)` -> a decoder from `ViTFeatures` to patch-level
            logits [B, K, h, w]; default Segmenter's mask transformer
            (`vitdense.heads.MaskTransformerDecoder`, depth 2, dropout 0.1); the linear
            baseline is `class_path: vitdense.heads.LinearDecoder`.
        ignore_index: label of unlabelled pixels (linked from the DataModule).
        class_weights: per-class cross-entropy weights (None: uniform).
        class_names: names of the K classes (linked from the DataModule), for the table.
        window: sliding-window side in evaluation; None: the backbone's native size.
        val_stride: window stride during training-time validation (None: = window,
            Segmenter's 512/512).
        test_stride: window stride for `test` and `predict` (None: = window, Segmenter's
            512/512 on ADE20K; mmseg's configs for other models often overlap, e.g. 512/341).
        test_scales, test_flip: multi-scale / flip test-time augmentation of `test` and
            `predict` (Segmenter's multi-scale: 0.5, 0.75, 1.0, 1.25, 1.5, 1.75 with flip).
        window_batch_size: windows run through the model at once.
        (the rest: see `BaseTask`)
    """

    result_type: ClassVar[type] = SegmentationResult
    monitor: ClassVar[str] = "val/mIoU"
    mode: ClassVar[Literal["min", "max"]] = "max"
    evaluation_settings: ClassVar[tuple[str, ...]] = (
        *BaseTask.evaluation_settings,
        "window",
        "val_stride",
        "test_stride",
        "test_scales",
        "test_flip",
        "window_batch_size",
    )

    def __init__(
        self,
        num_classes: int,
        head: HeadFactory = DEFAULT_SEGMENTATION_HEAD,
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
        lr_interval: Literal["step", "epoch"] = "step",
        compile: bool | dict[str, Any] = False,
    ) -> None:
        if class_weights is not None and len(class_weights) != num_classes:
            raise ConfigError(f"class_weights has {len(class_weights)} entries for {num_classes} classes")
        # read by the hooks the base calls (configure_metrics, build_model)
        self.ignore_index = ignore_index
        self._window = window
        super().__init__(
            num_classes=num_classes,
            head=head,
            class_names=class_names,
            backbone=backbone,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            lr_interval=lr_interval,
            compile=compile,
        )
        self.val_stride = val_stride or self.window
        self.test_stride = test_stride or self.window
        self.test_scales = test_scales or [1.0]
        self.test_flip = test_flip
        self.window_batch_size = window_batch_size
        weights = torch.tensor(class_weights, dtype=torch.float) if class_weights is not None else None
        self.register_buffer("class_weights", weights, persistent=False)

    def configure_metrics(self) -> MetricCollection:
        return MetricCollection({"seg": SegmentationMetrics(self.num_classes, self.ignore_index)})

    def build_model(self, backbone: VisionTransformer, head: nn.Module) -> Segmenter:
        return Segmenter(backbone, head, self.num_classes, self._window or backbone.img_size[0])

    @property
    def window(self) -> int:
        """Side of the sliding windows of evaluation (the model's)."""
        return self.model.window

    def segment(self, batch: SegmentedImages, stride: int, scales: list[float], flip: bool) -> list[torch.Tensor]:
        """Per image, logits [1, K, h, w] at its label map's size, from sliding windows."""
        return self.model.segment(
            batch.image, batch.image_sizes, batch.mask_sizes.sizes, stride, scales, flip, self.window_batch_size
        )

    def forward_batch(self, batch: SegmentedImages, stage: Stage) -> SegmentationOutput:
        """Training: logits of the batch's crops. Validation: whole images in sliding windows
        at `val_stride`. Test and predict: `test_stride` with the test-time augmentation."""
        if stage == "train":
            return SegmentationOutput([self(batch.image, batch.image_sizes)], [batch.mask])
        if stage == "val":
            logits = self.segment(batch, self.val_stride, [1.0], False)
        else:
            logits = self.segment(batch, self.test_stride, self.test_scales, self.test_flip)
        targets = [batch.mask[i : i + 1, :h, :w] for i, (h, w) in enumerate(batch.mask_sizes.sizes)]
        return SegmentationOutput(logits, targets)

    # ------------------------------------------------------------------ loss and metrics
    def compute_loss(self, output: SegmentationOutput, batch: SegmentedImages, stage: Stage) -> Losses:
        """Pixel-averaged cross-entropy over the batch, ignoring `ignore_index` (with class
        weights: weighted sum over weighted pixel count, as torch's weighted mean). Its sum
        and pixel count too (`Losses.sums`), so that evaluation's figure is the split's
        summed cross-entropy over its labelled pixels, whatever the batches."""
        total = torch.zeros((), device=self.device)
        weight_sum = torch.zeros((), device=self.device)
        for logits, target in zip(output.logits, output.targets, strict=True):
            total = total + pixel_cross_entropy(logits, target, self.class_weights, self.ignore_index)
            labelled = target[target != self.ignore_index]
            weight_sum = weight_sum + (
                self.class_weights[labelled].sum() if self.class_weights is not None else labelled.numel()
            )
        return Losses(total / weight_sum.clamp(min=1), sums={"loss": LossSum(total, weight_sum)})

    def update_metrics(
        self, metrics: MetricCollection, output: SegmentationOutput, batch: SegmentedImages, stage: Stage
    ) -> None:
        for logits, target in zip(output.logits, output.targets, strict=True):
            metrics["seg"].update(logits.argmax(1), target)

    def format_table(self, result: dict[str, Any], stage: Stage) -> str:
        """Per-class IoU and accuracy, with the epoch's summary on top."""
        summary = "  ".join(f"{k} {100 * result[f'{stage}/{k}'].item():.2f}" for k in ("mIoU", "mAcc", "aAcc"))
        rows = [f"{stage} epoch {self.current_epoch}: {summary}", f"{'class':<24}{'IoU':>8}{'Acc':>8}"]
        ious, accs = result[f"{stage}/IoU"].tolist(), result[f"{stage}/Acc"].tolist()
        for name, iou, acc in zip(self.class_names, ious, accs, strict=True):
            rows.append(f"{name:<24}{100 * iou:8.2f}{100 * acc:8.2f}")
        return "\n".join(rows)

    def draw_batch(self, batch: SegmentedImages, pixels: list[np.ndarray], palette: np.ndarray) -> list[np.ndarray]:
        """Per image: the image, its ground truth and the prediction (validation's sliding
        windows) as overlays, with a legend of the classes shown."""
        output = self.forward_batch(batch, "val")
        return [
            draw_segmented(
                image,
                target[0].cpu().numpy(),
                logits[0].argmax(0).cpu().numpy(),
                palette,
                self.class_names,
                self.ignore_index,
            )
            for image, logits, target in zip(pixels, output.logits, output.targets, strict=True)
        ]

    def predict_sample(self, image: torch.Tensor, size: Size, index: int) -> SegmentedImages:
        """Its label map all `ignore_index` at (H0, W0): predictions are made at that size."""
        return SegmentedImages.unlabeled(image, size, index, self.ignore_index)

    def predict_step(self, batch: SegmentedImages | None, batch_idx: int) -> SegmentationPrediction | None:
        if batch is None:  # every image of the batch was unreadable and skipped (on_bad_sample=skip)
            return None
        logits = self.forward_batch(batch, "predict").logits
        return SegmentationPrediction(batch.index, [x[0].argmax(0) for x in logits])

    def plain_inference(self) -> SegmenterInference:
        """`predict_step` without the task: sliding windows at `test_stride` with the test-time
        augmentation, labels at each image's size (`vitdense.models`)."""
        return SegmenterInference(
            self.num_classes,
            self.window,
            self.ignore_index,
            self.test_stride,
            list(self.test_scales),
            self.test_flip,
            self.window_batch_size,
        )
