"""Image classification fine-tuning (paper section 3.2 and appendix B.1.1)."""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar, Literal

import numpy as np
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from vitdense.core.errors import ConfigError
from vitdense.heads import ClassificationHead
from vitdense.models.classification import ClassifierInference, top_k_prediction
from vitdense.results.classification import ClassificationResult
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask, HeadFactory, Stage
from vitdense.tasks.pictures import draw_classified
from vitdense.training.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.types import ClassificationOutput, ClassPrediction, LabeledImages, Losses

#: the paper's head: a linear layer on the class token, zero-initialised on a pre-trained backbone
DEFAULT_CLASSIFICATION_HEAD = partial(ClassificationHead, pool="token")


def accuracy_metrics(num_classes: int) -> MetricCollection:
    """Top-1 and top-5 accuracy, micro: the fraction of images whose label is in the top k,
    as the papers report (torchmetrics' default "macro" averages per-class accuracies)."""
    top_k = {"acc1": 1, "acc5": 5}
    return MetricCollection(
        {name: MulticlassAccuracy(num_classes, top_k=min(k, num_classes), average="micro") for name, k in top_k.items()}
    )


class ClassificationTask(BaseTask):
    """Fine-tune a ViT with a classification head. Logs `{stage}/loss`, `{stage}/acc1` and
    `{stage}/acc5` (training accuracy too).

    Args:
        num_classes: K (linked from the DataModule by the CLI).
        head: `head(embed_dim, num_classes)`; default `ClassificationHead` on the class token
            (YAML: `class_path: vitdense.heads.ClassificationHead`, `init_args: {pool: avg, drop_rate: 0.1}`).
        label_smoothing: cross-entropy label smoothing.
        mixup_alpha, cutmix_alpha: timm's Mixup/CutMix on training batches (0 = off); the
            loss then becomes soft-target cross-entropy (smoothing folded into the targets).
        class_names: names of the K classes, for predictions (linked from the DataModule).
        (the rest: see `BaseTask`)
    """

    result_type: ClassVar[type] = ClassificationResult
    monitor: ClassVar[str] = "val/acc1"
    mode: ClassVar[Literal["min", "max"]] = "max"
    log_train_metrics: ClassVar[bool] = True

    def __init__(
        self,
        num_classes: int,
        head: HeadFactory = DEFAULT_CLASSIFICATION_HEAD,
        label_smoothing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        class_names: list[str] | None = None,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
        lr_interval: Literal["step", "epoch"] = "step",
        compile: bool | dict[str, Any] = False,
    ) -> None:
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
        self.label_smoothing = label_smoothing
        self.mixup = None
        if mixup_alpha > 0 or cutmix_alpha > 0:
            self.mixup = Mixup(
                mixup_alpha=mixup_alpha,
                cutmix_alpha=cutmix_alpha,
                label_smoothing=label_smoothing,
                num_classes=num_classes,
            )
            self.soft_target_loss = SoftTargetCrossEntropy()

    def configure_metrics(self) -> MetricCollection:
        return accuracy_metrics(self.num_classes)

    def forward_batch(self, batch: LabeledImages, stage: Stage) -> ClassificationOutput:
        images = batch.image
        if self.mixup is not None and stage == "train":
            if images.shape[0] % 2:
                raise ConfigError("Mixup/CutMix need an even batch size (the train loader drops the last batch)")
            images, targets = self.mixup(images, batch.label)
            return ClassificationOutput(self(images, batch.image_sizes), targets)
        return ClassificationOutput(self(images, batch.image_sizes), None)

    def compute_loss(self, output: ClassificationOutput, batch: LabeledImages, stage: Stage) -> Losses:
        if output.soft_targets is not None:
            return Losses(self.soft_target_loss(output.logits, output.soft_targets))
        return Losses(F.cross_entropy(output.logits, batch.label, label_smoothing=self.label_smoothing))

    def update_metrics(
        self, metrics: MetricCollection, output: ClassificationOutput, batch: LabeledImages, stage: Stage
    ) -> None:
        metrics.update(output.logits, batch.label)

    def draw_batch(self, batch: LabeledImages, pixels: list[np.ndarray], palette: np.ndarray) -> list[np.ndarray]:
        """One grid: each image with its true and predicted class (green if right, red if not)."""
        probs = self.forward_batch(batch, "val").logits.softmax(-1)
        return [draw_classified(pixels, batch.label.tolist(), probs, self.class_names)]

    def predict_step(self, batch: LabeledImages | None, batch_idx: int) -> ClassPrediction | None:
        if batch is None:  # every image of the batch was unreadable and skipped (on_bad_sample=skip)
            return None
        return top_k_prediction(self.forward_batch(batch, "predict").logits, batch.index)

    def plain_inference(self) -> ClassifierInference:
        """`predict_step` without the task: the model's top-5 classes (`vitdense.models`)."""
        return ClassifierInference(self.num_classes)
