"""Image classification fine-tuning (paper section 3.2 and appendix B.1.1)."""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from timm.data import Mixup
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from vitdense.heads import ClassificationHead
from vitdense.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask
from vitdense.types import LabeledImages


class ClassificationOutput(NamedTuple):
    """logits [B, K]; soft_targets [B, K] when Mixup/CutMix mixed the batch, else None."""

    logits: torch.Tensor
    soft_targets: torch.Tensor | None


class ClassPrediction(NamedTuple):
    """Top-k classes of each image: index [B] (in its dataset), probs and classes [B, k]."""

    index: torch.Tensor
    probs: torch.Tensor
    classes: torch.Tensor


def top_k_prediction(logits: torch.Tensor, index: torch.Tensor, k: int = 5) -> ClassPrediction:
    probs, classes = logits.float().softmax(-1).topk(min(k, logits.shape[-1]), dim=-1)
    return ClassPrediction(index, probs, classes)


class ClassificationTask(BaseTask):
    """Fine-tune a ViT with a (zero-initialised) linear head on the class token or the mean
    patch token. Logs `{stage}/loss`, `{stage}/acc1` and `{stage}/acc5`.

    Args:
        num_classes: K (linked from the DataModule by the CLI).
        pool: "token" or "avg" (see `ClassificationHead`).
        head_drop_rate: dropout before the classifier.
        label_smoothing: cross-entropy label smoothing.
        mixup_alpha, cutmix_alpha: timm's Mixup/CutMix on training batches (0 = off); the
            loss then becomes soft-target cross-entropy (smoothing folded into the targets).
        class_names: names of the K classes, for predictions (linked from the DataModule).
        (the rest: see `BaseTask`)
    """

    monitor = "val/acc1"
    mode = "max"

    def __init__(
        self,
        num_classes: int,
        pool: Literal["token", "avg"] = "token",
        head_drop_rate: float = 0.0,
        label_smoothing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        class_names: list[str] | None = None,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
    ) -> None:
        self.num_classes = num_classes
        self.pool = pool
        self.head_drop_rate = head_drop_rate
        self.label_smoothing = label_smoothing
        self.class_names = class_names
        super().__init__(backbone, optimizer, lr_scheduler)
        self.mixup = None
        if mixup_alpha > 0 or cutmix_alpha > 0:
            self.mixup = Mixup(
                mixup_alpha=mixup_alpha,
                cutmix_alpha=cutmix_alpha,
                label_smoothing=label_smoothing,
                num_classes=num_classes,
            )

    def build_head(self) -> nn.Module:
        return ClassificationHead(self.backbone.embed_dim, self.num_classes, self.pool, self.head_drop_rate)

    def build_metrics(self) -> MetricCollection:
        # micro: the fraction of images whose label is in the top k, as the papers report
        # (torchmetrics' default "macro" would average per-class accuracies instead)
        top_k = {"acc1": 1, "acc5": 5}
        return MetricCollection(
            {
                name: MulticlassAccuracy(self.num_classes, top_k=min(k, self.num_classes), average="micro")
                for name, k in top_k.items()
            }
        )

    def forward_batch(self, batch: LabeledImages) -> ClassificationOutput:
        images, pad_mask = self.batch_images(batch)
        if self.mixup is not None and self.training:
            if images.shape[0] % 2:
                raise ValueError("Mixup/CutMix need an even batch size (use drop_last=True in the train loader)")
            images, targets = self.mixup(images, batch.label)
            return ClassificationOutput(self(images, pad_mask), targets)
        return ClassificationOutput(self(images, pad_mask), None)

    def compute_loss(self, output: ClassificationOutput, batch: LabeledImages) -> torch.Tensor:
        if output.soft_targets is not None:
            return torch.sum(-output.soft_targets * F.log_softmax(output.logits, dim=-1), dim=-1).mean()
        return F.cross_entropy(output.logits, batch.label, label_smoothing=self.label_smoothing)

    def update_metrics(self, metrics: MetricCollection, output: ClassificationOutput, batch: LabeledImages) -> None:
        metrics.update(output.logits, batch.label)

    def predict_step(self, batch: LabeledImages, batch_idx: int) -> ClassPrediction:
        return top_k_prediction(self(*self.batch_images(batch)), batch.index)
