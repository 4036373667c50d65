"""BaseTask: a backbone, a head, a loss and per-stage metrics glued into a LightningModule.

A task subclass says what is task-specific by overriding four small hooks:
`build_head`, `build_metrics`, `compute_loss` and `update_metrics` (and `forward` if its
head needs more than the features). Everything else — building the backbone from a timm
name or a file, freezing, parameter groups, the optimizer and per-iteration schedule, the
shared train/val/test step and logging — lives here once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MetricCollection

from vitdense.backbone import VisionTransformer, create_backbone
from vitdense.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER, WarmupCosineLR, param_groups

Stage = Literal["train", "val", "test"]


class BaseTask(L.LightningModule):
    """Shared spine of every vitdense task.

    Args:
        backbone: timm model name of the encoder ("vit_base_patch16_224.augreg_in21k").
        pretrained: load the name's weights from timm's hub (online).
        checkpoint: load the encoder from a local weight file instead (timm format or JAX npz).
        img_size: native input size of the encoder; position embeddings are resampled to it.
        drop_path_rate: stochastic depth of the encoder.
        freeze_backbone: train the head only (the encoder gets no gradients).
        freeze_blocks: freeze the embeddings and the first k blocks.
        grad_checkpointing: recompute encoder activations in backward to save memory.
        backbone_lr_scale: learning-rate multiplier of the whole encoder.
        layer_decay: layer-wise learning-rate decay of the encoder (1 = off).
        optimizer: callable making the optimizer from parameter groups (YAML: class_path).
        lr_scheduler: callable making the per-iteration schedule from the optimizer;
            `WarmupCosineLR` with total_steps None runs for the whole training.
    """

    #: metric that model selection and checkpointing watch, and in which direction
    monitor: str = "val/loss"
    mode: Literal["min", "max"] = "min"

    def __init__(
        self,
        backbone: str = "vit_tiny_patch16_224",
        pretrained: bool = False,
        checkpoint: str | Path | None = None,
        img_size: int | None = None,
        drop_path_rate: float = 0.0,
        freeze_backbone: bool = False,
        freeze_blocks: int = 0,
        grad_checkpointing: bool = False,
        backbone_lr_scale: float = 1.0,
        layer_decay: float = 1.0,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
    ) -> None:
        super().__init__()
        # callables from YAML need not pickle; the CLI's saved config.yaml records them
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.backbone: VisionTransformer = create_backbone(
            backbone, pretrained=pretrained, checkpoint=checkpoint, img_size=img_size, drop_path_rate=drop_path_rate
        )
        if grad_checkpointing:
            self.backbone.set_grad_checkpointing()
        if freeze_backbone:
            self.backbone.freeze()
        elif freeze_blocks:
            self.backbone.freeze(freeze_blocks)
        self.head = self.build_head()
        metrics = self.build_metrics()
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")

    # ------------------------------------------------------------------ hooks to override
    def build_head(self) -> nn.Module:
        raise NotImplementedError

    def build_metrics(self) -> MetricCollection:
        raise NotImplementedError

    def compute_loss(self, output: Any, batch: Any) -> torch.Tensor:
        raise NotImplementedError

    def update_metrics(self, metrics: MetricCollection, output: Any, batch: Any) -> None:
        raise NotImplementedError

    def batch_images(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(images [B, C, H, W], pixel padding mask [B, H, W] or None) of a batch."""
        return batch.image, getattr(batch, "pad_mask", None)

    def forward(self, images: torch.Tensor, pad_mask: torch.Tensor | None = None) -> Any:
        return self.head(self.backbone(images, pad_mask=pad_mask))

    # ------------------------------------------------------------------------ the loop
    def _shared_step(self, batch: Any, stage: Stage) -> torch.Tensor:
        images, pad_mask = self.batch_images(batch)
        output = self(images, pad_mask)
        loss = self.compute_loss(output, batch)
        metrics: MetricCollection = getattr(self, f"{stage}_metrics")
        self.update_metrics(metrics, output, batch)
        batch_size = images.shape[0]
        self.log(f"{stage}/loss", loss, prog_bar=True, on_step=stage == "train", on_epoch=True, batch_size=batch_size)
        # logging the collection object lets Lightning compute and reset it once per epoch
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=batch_size)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    # ------------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> dict:
        hp = self.hparams
        groups = param_groups(self.backbone, self.head, hp.backbone_lr_scale, hp.layer_decay)
        optimizer = self.optimizer(groups)
        for group in optimizer.param_groups:
            group["lr"] *= group["lr_scale"]
        scheduler = self.lr_scheduler(optimizer)
        if isinstance(scheduler, WarmupCosineLR) and scheduler.total_steps is None:
            scheduler.total_steps = int(self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
