"""BaseTask: a backbone, a head, a loss and per-stage metrics glued into a LightningModule.

A task subclass says what is task-specific by overriding four small hooks:
`build_head`, `build_metrics`, `compute_loss` and `update_metrics` (and `forward` if its
head needs more than the features). Everything else — building the backbone from a timm
name or a file, freezing, parameter groups, the optimizer and per-iteration schedule, the
shared train/val/test step and logging — lives here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MetricCollection

from vitdense.backbone import VisionTransformer, create_backbone
from vitdense.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER, WarmupCosineLR, param_groups

Stage = Literal["train", "val", "test"]


@dataclass(frozen=True)
class BackboneConfig:
    """How a task builds and trains its encoder (one YAML block, shared by every task).

    Attributes:
        name: timm model name, optionally with a pretrained tag
            ("vit_base_patch16_224.augreg_in21k").
        pretrained: load the tag's weights from timm's hub (online).
        checkpoint: load the encoder from a local file instead (timm format or JAX .npz).
        img_size: native input size; position embeddings are resampled to it on loading.
        drop_path_rate: stochastic depth.
        freeze: give the encoder no gradients (train the head only).
        freeze_blocks: freeze the embeddings and the first k blocks.
        grad_checkpointing: recompute activations in backward to save memory.
        lr_scale: learning-rate multiplier of the whole encoder.
        layer_decay: layer-wise learning-rate decay (1 = off).
        model_args: timm architecture overrides for a model trained from scratch, e.g.
            `{depth: 6, patch_size: 8}` (timm's `create_model` keyword arguments).
    """

    name: str = "vit_tiny_patch16_224"
    pretrained: bool = False
    checkpoint: str | None = None
    img_size: int | None = None
    drop_path_rate: float = 0.0
    freeze: bool = False
    freeze_blocks: int = 0
    grad_checkpointing: bool = False
    lr_scale: float = 1.0
    layer_decay: float = 1.0
    model_args: dict[str, Any] | None = None

    def build(self) -> VisionTransformer:
        backbone = create_backbone(
            self.name,
            self.pretrained,
            self.checkpoint,
            self.img_size,
            drop_path_rate=self.drop_path_rate,
            model_args=self.model_args,
        )
        backbone.set_grad_checkpointing(self.grad_checkpointing)
        if self.freeze:
            backbone.freeze()
        elif self.freeze_blocks:
            backbone.freeze(self.freeze_blocks)
        return backbone


DEFAULT_BACKBONE = BackboneConfig()
# checkpoints carry it in their hyperparameters; torch.load(weights_only=True) must accept it
torch.serialization.add_safe_globals([BackboneConfig])


class BaseTask(L.LightningModule):
    """Shared spine of every vitdense task.

    Args:
        backbone: how to build and train the encoder (`BackboneConfig`).
        optimizer: callable making the optimizer from parameter groups (YAML: class_path).
        lr_scheduler: callable making the per-iteration schedule from the optimizer;
            `WarmupCosineLR` with total_steps None runs for the whole training.
    """

    #: metric that model selection and checkpointing watch, and in which direction
    monitor: str = "val/loss"
    mode: Literal["min", "max"] = "min"

    def __init__(
        self,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
    ) -> None:
        super().__init__()
        # callables from YAML need not pickle; the CLI's saved config.yaml records them
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.backbone_config = backbone
        self.backbone: VisionTransformer = backbone.build()
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

    def forward_batch(self, batch: Any) -> Any:
        """Task output for a batch (override to use more of the batch than its images)."""
        return self(*self.batch_images(batch))

    def param_groups(self) -> list[dict]:
        """Optimizer parameter groups; a group's `lr_scale` multiplies the optimizer's rate."""
        cfg = self.backbone_config
        return param_groups(self.backbone, self.head, cfg.lr_scale, cfg.layer_decay)

    # ------------------------------------------------------------------------ the loop
    def _shared_step(self, batch: Any, stage: Stage) -> torch.Tensor:
        output = self.forward_batch(batch)
        loss = self.compute_loss(output, batch)
        metrics: MetricCollection = getattr(self, f"{stage}_metrics")
        self.update_metrics(metrics, output, batch)
        batch_size = self.batch_images(batch)[0].shape[0]
        train = stage == "train"
        # epoch-level evaluation losses are averaged over processes; training logs stay per rank (no sync per step)
        self.log(
            f"{stage}/loss",
            loss,
            prog_bar=True,
            on_step=train,
            on_epoch=True,
            batch_size=batch_size,
            sync_dist=not train,
        )
        self.log_metrics(metrics, stage, batch_size)
        return loss

    def log_metrics(self, metrics: MetricCollection, stage: Stage, batch_size: int) -> None:
        """Log a stage's metrics after each step's update (override for non-scalar metrics)."""
        # logging the collection object lets Lightning compute and reset it once per epoch
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=batch_size)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    # ------------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> dict:
        optimizer = self.optimizer(self.param_groups())
        for group in optimizer.param_groups:
            group["lr"] *= group.get("lr_scale", 1.0)
        scheduler = self.lr_scheduler(optimizer)
        if isinstance(scheduler, WarmupCosineLR) and scheduler.total_steps is None:
            scheduler.total_steps = int(self.trainer.estimated_stepping_batches)
        # schedules step per iteration, except a plateau schedule, which watches the
        # validation metric once it exists and counts its patience in epochs
        plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        schedule = {"scheduler": scheduler, "interval": "epoch" if plateau else "step", "monitor": self.monitor}
        return {"optimizer": optimizer, "lr_scheduler": schedule}
