"""BaseTask: a backbone, a head, a loss and per-stage metrics glued into a LightningModule.

A task subclass builds its head (from an injected factory) and its metrics in `__init__`
after `super().__init__()`, and says what is task-specific through a few hooks, each told
the stage ("train", "val", "test", "predict") rather than reading it off the trainer:

    forward_batch(batch, stage)                  -> task output (a NamedTuple)
    compute_loss(output, batch, stage)           -> Losses(total, terms)
    update_metrics(metrics, output, batch, stage)
    summarize(result, stage)                     -> {name: scalar} logged once per epoch
    format_table(result, stage)                  -> optional text table for the log
    draw_batch(batch, pixels, palette)           -> pictures of predictions beside the truth

Everything else — building the backbone from a timm name or a file, freezing, parameter
groups, the optimizer and its schedule (per step or per epoch, lengths from the trainer),
the shared step, logging every loss term, computing, logging and resetting metrics at
epoch end — lives here once.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import Any, ClassVar, Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, LearningRateMonitor
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn
from torchmetrics import MetricCollection

from vitdense.backbone import VisionTransformer, create_backbone
from vitdense.errors import ConfigError
from vitdense.metrics import LossMeans
from vitdense.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER, WarmupSchedule, param_groups
from vitdense.types import Losses

Stage = Literal["train", "val", "test", "predict"]

_logger = logging.getLogger(__name__)

#: a head from the backbone's width D and the number of classes K: `head(embed_dim, num_classes)`;
#: in YAML a `class_path` (+ `init_args` for everything but those two), e.g. vitdense.heads.LinearDecoder
HeadFactory = Callable[[int, int], nn.Module]


@dataclass(frozen=True)
class HeadSpec:
    """A head factory as plain data, so that checkpoints rebuild the head they were trained
    with (`load_from_checkpoint`, also under `torch.load(weights_only=True)`).

    `HeadSpec("vitdense.heads.ClassificationHead", {"pool": "avg"})(192, 10)` builds
    `ClassificationHead(192, 10, pool="avg")`.
    """

    class_path: str
    init_args: dict[str, Any]

    def __call__(self, embed_dim: int, num_classes: int) -> nn.Module:
        module, _, name = self.class_path.rpartition(".")
        return getattr(importlib.import_module(module), name)(embed_dim, num_classes, **self.init_args)

    @classmethod
    def of(cls, factory: HeadFactory) -> HeadSpec | None:
        """The spec of a head class, or of a `functools.partial` of one (what `partial(...)`
        defaults and jsonargparse's `class_path`/`init_args` produce); None for other callables."""
        if isinstance(factory, HeadSpec):
            return factory
        func, args, kwargs = (
            (factory.func, factory.args, factory.keywords)
            if isinstance(factory, partial)
            else (
                factory,
                (),
                {},
            )
        )
        # jsonargparse wraps the class: partial(call_without_instantiate_context, instantiator, cls, **init_args)
        classes = [c for c in (func, *args) if inspect.isclass(c) and issubclass(c, nn.Module)]
        if len(classes) != 1 or (args and args[-1] is not classes[0]):
            return None
        return cls(f"{classes[0].__module__}.{classes[0].__qualname__}", dict(kwargs))


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

    def build(self, load_pretrained: bool = True) -> VisionTransformer:
        """The encoder; with `load_pretrained=False` a `pretrained` one is left at its random
        initialisation (tasks load the weights later, once per node; see `BaseTask.prepare_data`)."""
        backbone = create_backbone(
            self.name,
            self.pretrained and load_pretrained,
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


def _mark_weights_loaded(task: nn.Module, incompatible_keys: Any) -> None:
    """After a state dict is loaded into a task: its weights are no longer the hub's to load."""
    task.pretrained_loaded = True


def rng_states() -> dict[str, Any]:
    """The global random states (torch, CUDA, numpy, Python) as tensors and plain values, so
    that checkpoints holding them still load with `torch.load(weights_only=True)`."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what `rng_states` returned."""
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


DEFAULT_BACKBONE = BackboneConfig()
# checkpoints carry it in their hyperparameters; torch.load(weights_only=True) must accept it
torch.serialization.add_safe_globals([BackboneConfig, HeadSpec])


class BaseTask(L.LightningModule):
    """Shared spine of every vitdense task.

    Args:
        backbone: how to build and train the encoder (`BackboneConfig`).
        optimizer: callable making the optimizer from parameter groups (YAML: class_path).
        lr_scheduler: callable making the schedule from the optimizer; a `WarmupSchedule`
            (`WarmupCosineLR`, `WarmupPolyLR`) left without a length runs for the whole
            training, and its warmup may be given in epochs.
        lr_interval: step the schedule every optimizer "step" or every "epoch" (lengths and
            warmups of a `WarmupSchedule` are then counted in that unit).
    """

    #: metric that model selection and checkpointing watch, and in which direction
    monitor: ClassVar[str] = "val/loss"
    mode: ClassVar[Literal["min", "max"]] = "min"
    #: also update and log the metrics on training batches (off: evaluation metrics only)
    log_train_metrics: ClassVar[bool] = False

    def __init__(
        self,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
        lr_interval: Literal["step", "epoch"] = "step",
    ) -> None:
        super().__init__()
        # callables from YAML need not pickle; the CLI's saved config.yaml records them
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.lr_interval = lr_interval
        self.backbone_config = backbone
        # hub weights arrive in prepare_data/setup (fetched once per node, then loaded by every
        # process), and never when a checkpoint's weights replace them anyway
        self.backbone: VisionTransformer = backbone.build(load_pretrained=False)
        self.pretrained_loaded = not backbone.pretrained
        # weights loaded into the task (a checkpoint, a state dict) replace the hub's for good
        self.register_load_state_dict_post_hook(_mark_weights_loaded)
        self.head: nn.Module = nn.Identity()  # the subclass builds its head
        self.set_metrics(MetricCollection({}))

    def set_head(self, head: HeadFactory, in_features: int, num_classes: int, copies: int | None = None) -> None:
        """Build the head (`copies` of it in an `nn.ModuleList`, if given), and record its
        factory as a `HeadSpec` in the hyperparameters so that a checkpoint rebuilds the same
        head (a factory that is not a class or a partial of one cannot be recorded:
        `load_from_checkpoint` then needs `head=` again)."""
        if isinstance(head, dict):  # as recorded in hyperparameters: {class_path, init_args}
            head = HeadSpec(head["class_path"], dict(head.get("init_args") or {}))
        if copies is None:
            self.head = head(in_features, num_classes)
        else:
            self.head = nn.ModuleList(head(in_features, num_classes) for _ in range(copies))
        spec = HeadSpec.of(head)
        if spec is None:
            rank_zero_warn(f"head {head!r} is not a class or a partial of one; pass head= to load_from_checkpoint")
            self.hparams.pop("head", None)
        else:
            # plain data, as YAML writes a class: LightningCLI merges it back into its config
            self.hparams["head"] = {"class_path": spec.class_path, "init_args": spec.init_args}

    def set_classes(self, num_classes: int, class_names: list[str] | None) -> None:
        """Record K (`num_classes`) and the class names (default "0".."K-1"), which must agree."""
        if class_names is not None and len(class_names) != num_classes:
            raise ConfigError(f"class_names has {len(class_names)} entries for num_classes={num_classes}")
        self.num_classes = num_classes
        self.class_names = list(class_names) if class_names is not None else [str(c) for c in range(num_classes)]

    def set_metrics(self, metrics: MetricCollection) -> None:
        """One copy of `metrics` per stage, prefixed `train/`, `val/`, `test/`."""
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")

    # ------------------------------------------------------------------ hooks to override
    def forward_batch(self, batch: Any, stage: Stage) -> Any:
        """Task output for a batch (override to use more of the batch than its images, or
        to behave differently per stage)."""
        return self(batch.image, image_sizes=getattr(batch, "image_sizes", None))

    def compute_loss(self, output: Any, batch: Any, stage: Stage) -> Losses:
        raise NotImplementedError

    def update_metrics(self, metrics: MetricCollection, output: Any, batch: Any, stage: Stage) -> None:
        """Update this stage's metrics with a batch (computed once, at epoch end)."""

    def summarize(self, result: dict[str, Any], stage: Stage) -> dict[str, torch.Tensor]:
        """Scalars to log from a stage's computed metrics (`result`: the collection's
        `compute()`, keys prefixed `{stage}/`). Default: every 0-d value; override to reduce
        tables (per-class IoU, per-class AP, one accuracy per head) to scalars."""
        return {k: v for k, v in result.items() if torch.is_tensor(v) and v.ndim == 0}

    def format_table(self, result: dict[str, Any], stage: Stage) -> str | None:
        """A text table of the epoch's results for the log (val and test), or None."""
        return None

    def draw_batch(self, batch: Any, pixels: list[np.ndarray], palette: np.ndarray) -> list[np.ndarray]:
        """Pictures of the model's predictions on a validation batch beside its ground truth,
        for the logger (`vitdense.viz.callbacks.ValidationImages`); called under `no_grad`
        in evaluation mode.

        Args:
            batch: a collated validation batch, on the model's device.
            pixels: its images un-normalised, [h, w, 3] uint8 each at its own size.
            palette: [K, 3] uint8 class colours (the DataModule's, or fixed random ones).

        Returns [H, W, 3] uint8 pictures (none by default).
        """
        return []

    def forward(
        self,
        images: torch.Tensor,
        pad_mask: torch.Tensor | None = None,
        image_sizes: tuple[tuple[int, int], ...] | None = None,
    ) -> Any:
        return self.head(self.backbone(images, pad_mask=pad_mask, image_sizes=image_sizes))

    def param_groups(self) -> list[dict]:
        """Optimizer parameter groups; a group's `lr_scale` multiplies the optimizer's rate."""
        cfg = self.backbone_config
        return param_groups(self.backbone, self.head, cfg.lr_scale, cfg.layer_decay)

    # ----------------------------------------------------------------- pretrained weights
    def fetch_pretrained(self) -> None:
        """Download the backbone's hub weights into the local cache. Lightning calls
        `prepare_data` on one process per node, before the others start `setup`."""
        cfg = self.backbone_config
        create_backbone(cfg.name, pretrained=True, img_size=self.backbone.img_size, model_args=cfg.model_args)

    def load_pretrained(self) -> None:
        """Load the backbone's hub weights (from the cache once fetched). Called by `setup`;
        call it yourself to use a task with `pretrained: true` outside a Trainer."""
        cfg = self.backbone_config
        weights = create_backbone(cfg.name, pretrained=True, img_size=self.backbone.img_size, model_args=cfg.model_args)
        self.backbone.load_state_dict(weights.state_dict())
        self.pretrained_loaded = True

    def _weights_from_checkpoint(self) -> bool:
        """The trainer will load a checkpoint into this task (vitdense's Trainer knows before
        `prepare_data`; Lightning's sets `ckpt_path` only after `setup`)."""
        return self.trainer.ckpt_path is not None or getattr(self.trainer, "weights_from_checkpoint", False)

    def prepare_data(self) -> None:
        if not self.pretrained_loaded and not self._weights_from_checkpoint():
            self.fetch_pretrained()

    def setup(self, stage: str) -> None:
        # a run restored from a checkpoint gets the checkpoint's weights: no fetch, works offline
        if not self.pretrained_loaded and not self._weights_from_checkpoint():
            self.load_pretrained()

    # ------------------------------------------------------------------------ the loop
    def metrics_of(self, stage: Stage) -> MetricCollection | None:
        """The stage's metric collection, or None where the stage keeps none."""
        if stage == "train" and not self.log_train_metrics:
            return None
        return {"train": self.train_metrics, "val": self.val_metrics, "test": self.test_metrics}.get(stage)

    @cached_property
    def eval_losses(self) -> LossMeans:
        """Validation and test losses, averaged over the dataset (not per process)."""
        return LossMeans()

    def _shared_step(self, batch: Any, stage: Stage) -> torch.Tensor | None:
        if batch is None:  # every sample of the batch was unreadable and skipped (on_bad_sample=skip)
            return None
        output = self.forward_batch(batch, stage)
        losses = self.compute_loss(output, batch, stage)
        metrics = self.metrics_of(stage)
        if metrics is not None:
            self.update_metrics(metrics, output, batch, stage)
        if stage != "train":  # dataset-level means, reduced over processes at epoch end: no collective per step
            self.eval_losses.update(stage, losses, weight=batch.image.shape[0])
            return losses.total
        log = dict(on_step=True, on_epoch=True, batch_size=batch.image.shape[0])  # per rank, no sync
        self.log(f"{stage}/loss", losses.total, prog_bar=True, **log)
        for name, value in losses.terms.items():
            self.log(f"{stage}/{name}", value, **log)
        return losses.total

    def _report_skipped(self, stage: Stage) -> None:
        """Log how many bad samples the DataModule skipped in this epoch of `stage` (with
        `on_bad_sample: skip`; each was logged with its file when it was skipped)."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if getattr(datamodule, "on_bad_sample", "raise") != "skip":
            return
        count = datamodule.take_skipped(stage)
        if count:
            rank = f" on rank {self.global_rank}" if self.trainer.world_size > 1 else ""
            _logger.warning("%s: skipped %d bad samples this epoch%s (files named above)", stage, count, rank)
        if stage != "predict":
            self.log(f"{stage}/skipped_samples", float(count), reduce_fx="sum", sync_dist=True)

    def _end_epoch(self, stage: Stage) -> None:
        """Compute, log and reset a stage's metrics (and evaluation losses) once per epoch."""
        self._report_skipped(stage)
        for name, value in self.eval_losses.pop(stage).items():  # equal on every rank, as the metrics below
            self.log(name, value, prog_bar=name == f"{stage}/loss", sync_dist=True)
        metrics = self.metrics_of(stage)
        if metrics is None or not metrics:
            return
        result = metrics.compute()  # synchronised across processes by torchmetrics
        scalars = self.summarize(result, stage)
        for name, value in scalars.items():
            # identical on every rank already: sync_dist averages equal numbers (and silences Lightning)
            self.log(name, value.float(), prog_bar=name == self.monitor, sync_dist=True)
        table = self.format_table(result, stage)
        if table and stage != "train" and not self.trainer.sanity_checking:
            rank_zero_info(table)
        metrics.reset()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def on_train_start(self) -> None:
        # schedule lengths from the trainer, resolved here rather than in configure_optimizers:
        # by now the train loader exists (and, when resuming, has been restored to its position);
        # asking for it earlier would build it before the checkpoint's loader state is loaded
        for config in self.trainer.lr_scheduler_configs:
            if isinstance(config.scheduler, WarmupSchedule):
                config.scheduler.resolve(*self._schedule_units(config.interval))

    def on_train_epoch_end(self) -> None:
        self._end_epoch("train")

    # ------------------------------------------------------------------ exact resume
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # the global RNGs (dropout, drop path, Mixup's numpy draws) as the next step would find them
        checkpoint["rng_states"] = rng_states()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._rng_to_restore = checkpoint.get("rng_states")

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # restored right before the first resumed step, not at load time: sanity checks and
        # loader start-up between the two could otherwise draw from them
        if getattr(self, "_rng_to_restore", None) is not None:
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None

    def on_validation_epoch_end(self) -> None:
        self._end_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._end_epoch("test")

    def on_predict_epoch_end(self) -> None:
        self._report_skipped("predict")

    # ------------------------------------------------------------------ predictions to files
    def prediction_writer(self, output_dir: Path) -> BasePredictionWriter | None:
        """What `predict` writes under `output_dir` when no prediction writer is configured
        (the task's natural output; None: nothing)."""
        return None

    def configure_callbacks(self) -> list[L.Callback]:
        """`fit` with a logger also logs pictures of validation predictions
        (`ValidationImages`), the learning rates (`LearningRateMonitor`) and the throughput
        (`ImagesPerSecond`), each unless the trainer already has a callback of that kind.
        `predict` without a writer of the user's writes the task's own (`prediction_writer`)
        under `<default_root_dir>/predictions/`, and says where."""
        trainer = self._trainer
        if trainer is not None and trainer.training and trainer.loggers:
            from vitdense.viz.callbacks import ImagesPerSecond, ValidationImages

            defaults = (ValidationImages(), LearningRateMonitor(logging_interval="step"), ImagesPerSecond())
            return [c for c in defaults if not any(isinstance(t, type(c)) for t in trainer.callbacks)]
        if trainer is None or not trainer.predicting:
            return []
        if any(isinstance(c, BasePredictionWriter) for c in trainer.callbacks):
            return []
        output_dir = Path(trainer.default_root_dir) / "predictions"
        writer = self.prediction_writer(output_dir)
        if writer is None:
            return []
        rank_zero_info(f"predictions go to {output_dir}/ (add a writer callback to choose)")
        return [writer]

    # ------------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> dict:
        optimizer = self.optimizer(self.param_groups())
        for group in optimizer.param_groups:
            group["lr"] *= group.get("lr_scale", 1.0)
        scheduler = self.lr_scheduler(optimizer)
        # a plateau schedule watches the validation metric once it exists and counts its patience in epochs
        plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        interval = "epoch" if plateau else self.lr_interval
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": interval, "monitor": self.monitor},
        }

    def _schedule_units(self, interval: str) -> tuple[int, float]:
        """(schedule length, schedule units per epoch) in the unit the schedule steps in."""
        trainer = self.trainer
        if interval == "epoch":
            if trainer.max_epochs is None or trainer.max_epochs < 0:
                raise ConfigError("lr_interval: epoch needs trainer.max_epochs (the schedule's length in epochs)")
            return trainer.max_epochs, 1.0
        total = int(trainer.estimated_stepping_batches)
        per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
        return total, float(per_epoch)
