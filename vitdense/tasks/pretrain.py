"""Self-supervised pre-training of the backbone on images without labels: the paper's
masked patch prediction (section 4.6) or MAE, chosen by injecting the objective."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MeanMetric, MetricCollection

from vitdense.backbone import VisionTransformer
from vitdense.models.pretrain import MaskedImageInference, MaskedImageModel
from vitdense.pretrain import MaskedAutoencoder, MaskedImageObjective, MaskedImageOutput
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask, Stage, follow_grad_checkpointing
from vitdense.tasks.pictures import draw_masked_patches
from vitdense.training.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.types import LabeledImages, Losses

#: an objective from the backbone's width, patch size and input channels:
#: `objective(embed_dim, patch_size, in_chans)`; in YAML a `class_path` (+ `init_args` for the rest)
ObjectiveFactory = Callable[[int, tuple[int, int], int], nn.Module]


class MaskedImageModelingTask(BaseTask):
    """Pre-train the backbone by predicting what was hidden from it. Logs `{stage}/loss`
    (and the target's scores: `{stage}/color_acc` for colour targets); validation pictures
    show each image, what the objective hid, and its prediction.

    The result is the backbone: every task loads it with `backbone.checkpoint:
    path/to/last.ckpt` (the `model.backbone.*` tensors are picked out; the objective's
    stay behind), or from `python -m vitdense export --format weights` (timm names).

    Masks are drawn from torch's global generator in training (reproduced by
    `seed_everything`, and by a resumed run, whose random state the checkpoint restores)
    and from a generator seeded by the batch's first sample index in validation and test,
    so that the validation loss of every epoch is measured on the same masks.

    Args:
        objective: `objective(embed_dim, patch_size, in_chans)`: `MaskedAutoencoder`
            (default) or `MaskedPatchPrediction` (YAML: `class_path: vitdense.pretrain.MaskedPatchPrediction`).
        num_classes, class_names: unused (linked from a DataModule that has classes; their
            labels are never read).
        (the rest: see `BaseTask`)
    """

    monitor: ClassVar[str] = "val/loss"
    mode: ClassVar[Literal["min", "max"]] = "min"
    log_train_metrics: ClassVar[bool] = True

    def __init__(
        self,
        objective: ObjectiveFactory = MaskedAutoencoder,
        num_classes: int | None = None,
        class_names: list[str] | None = None,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
        lr_interval: Literal["step", "epoch"] = "step",
        compile: bool | dict[str, Any] = False,
    ) -> None:
        super().__init__(
            num_classes=0,
            head=objective,
            backbone=backbone,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            lr_interval=lr_interval,
            compile=compile,
        )
        record_objective(self.hparams)

    @property
    def objective(self) -> MaskedImageObjective:
        return self.model.objective

    def configure_head(self, head: ObjectiveFactory, backbone: VisionTransformer) -> nn.Module:
        """The objective for this backbone; from scratch, the objective may set up the
        backbone its recipe's way (MAE: fixed sine-cosine position embeddings)."""
        objective = follow_grad_checkpointing(
            head(backbone.embed_dim, backbone.patch_size, backbone.in_chans), backbone
        )
        config = self.backbone_config
        if not config.pretrained and config.checkpoint is None:
            objective.prepare_backbone(backbone)
        cfg = backbone.pretrained_cfg
        if "mean" in cfg and "std" in cfg:  # what the data normalises with unless told otherwise
            objective.set_normalization(cfg["mean"], cfg["std"])
        return objective

    def build_model(self, backbone: VisionTransformer, head: nn.Module) -> MaskedImageModel:
        return MaskedImageModel(backbone, head)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if getattr(datamodule, "mean", None) is not None and getattr(datamodule, "std", None) is not None:
            self.objective.set_normalization(datamodule.mean, datamodule.std)

    def configure_metrics(self) -> MetricCollection:
        return MetricCollection({name: MeanMetric() for name in self.model.objective.target.score_names})

    def forward_batch(self, batch: LabeledImages, stage: Stage) -> MaskedImageOutput:
        generator = None
        if stage != "train":
            generator = torch.Generator(batch.image.device)
            generator.manual_seed(int(batch.index[0]) if torch.is_tensor(batch.index) else int(batch.index))
        return self.model(batch.image, batch.image_sizes, generator)

    def compute_loss(self, output: MaskedImageOutput, batch: LabeledImages, stage: Stage) -> Losses:
        return Losses(self.objective.loss(output))

    def update_metrics(
        self, metrics: MetricCollection, output: MaskedImageOutput, batch: LabeledImages, stage: Stage
    ) -> None:
        for name, (value, weight) in self.objective.scores(output).items():
            metrics[name].update(value, weight)

    def draw_batch(self, batch: LabeledImages, pixels: list[np.ndarray], palette: np.ndarray) -> list[np.ndarray]:
        """Per image: the input, what was hidden (grey), [the true target], the prediction."""
        return draw_masked_patches(self.objective, self.forward_batch(batch, "val"), batch.image)

    def plain_inference(self) -> MaskedImageInference:
        """The model rebuilt without the task (`vitdense.load_model`, `export --format weights`);
        it predicts nothing."""
        return MaskedImageInference()


def record_objective(hparams: dict[str, Any]) -> None:
    """A pre-training task's hparams as its arguments: the base recorded the objective's
    factory (as plain data) under its own name, "head"; the labels' arguments are unused."""
    recorded = hparams.pop("head", None)
    if recorded is not None:
        hparams["objective"] = recorded
    else:
        hparams.pop("objective", None)
    hparams.pop("num_classes", None)
    hparams.pop("class_names", None)
