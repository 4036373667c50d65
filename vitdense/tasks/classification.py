"""Image classification fine-tuning (paper section 3.2 and appendix B.1.1)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from vitdense.data.types import LabeledImages
from vitdense.heads import ClassificationHead
from vitdense.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask


class ClassificationTask(BaseTask):
    """Fine-tune a ViT with a (zero-initialised) linear head on the class token or the mean
    patch token. Logs `{stage}/loss`, `{stage}/acc1` and `{stage}/acc5`.

    Args:
        num_classes: K (linked from the DataModule by the CLI).
        pool: "token" or "avg" (see `ClassificationHead`).
        head_drop_rate: dropout before the classifier.
        label_smoothing: cross-entropy label smoothing.
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
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
    ) -> None:
        self.num_classes = num_classes
        self.pool = pool
        self.head_drop_rate = head_drop_rate
        self.label_smoothing = label_smoothing
        super().__init__(backbone, optimizer, lr_scheduler)

    def build_head(self) -> nn.Module:
        return ClassificationHead(self.backbone.embed_dim, self.num_classes, self.pool, self.head_drop_rate)

    def build_metrics(self) -> MetricCollection:
        top_k = {"acc1": 1, "acc5": 5}
        return MetricCollection(
            {name: MulticlassAccuracy(self.num_classes, top_k=min(k, self.num_classes)) for name, k in top_k.items()}
        )

    def compute_loss(self, logits: torch.Tensor, batch: LabeledImages) -> torch.Tensor:
        return F.cross_entropy(logits, batch.label, label_smoothing=self.label_smoothing)

    def update_metrics(self, metrics: MetricCollection, logits: torch.Tensor, batch: LabeledImages) -> None:
        metrics.update(logits, batch.label)
