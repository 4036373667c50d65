"""BaseTask: a backbone, a head, a loss and per-stage metrics glued into a LightningModule.

A subclass stores the settings its hooks read, then calls `super().__init__(...)`, which
builds the task by calling the hooks (so a subclass overrides what it needs and forgets
nothing): `configure_backbone(config)`, `configure_head(head, backbone)` (recorded for
checkpoints), `build_model(backbone, head)` (the plain `vitdense.models` module the task
wraps as `self.model`), `configure_metrics()` (cloned per stage). The loop's hooks are each
told the stage ("train", "val", "test", "predict") rather than reading it off the trainer:

    forward_batch(batch, stage)                  -> task output (a NamedTuple)
    compute_loss(output, batch, stage)           -> Losses(total, terms[, sums for evaluation])
    update_metrics(metrics, output, batch, stage)
    summarize(result, stage)                     -> {name: scalar} logged once per epoch
    format_table(result, stage)                  -> optional text table for the log
    draw_batch(batch, pixels, palette)           -> pictures of predictions beside the truth

and what it predicts becomes results through one declaration, its `result_type`
(`vitdense.results`): `to_results(prediction, context)` for `vitdense.load` and the server,
`prediction_writer(output_dir)` (a `ResultWriter`) for `predict`; `predict_sample(image,
size, index)` is the sample an image becomes for `predict_step`.

The shared step and the epoch-end metrics and losses live here once; the prediction hooks
in `vitdense.tasks.predicting`, compiling and FSDP clipping in `vitdense.tasks.running`,
optimisation in `vitdense.training.optim`, hub weights in `vitdense.tasks.pretrained`, head, class
and inference recording in `vitdense.deploy.checkpoint`, the callbacks every task adds (resume RNG
state among them) in `vitdense.training.callbacks.task_callbacks`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar, Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torchmetrics import MetricCollection

from vitdense.backbone import VisionTransformer
from vitdense.backbone.config import DEFAULT_BACKBONE, BackboneConfig
from vitdense.core.errors import ConfigError
from vitdense.deploy.checkpoint import (
    record_class_paths,
    record_inference,
    record_model,
    refuse_other_optimizer_groups,
    under_model,
)
from vitdense.heads.factory import HeadFactory, HeadSpec, head_factory, record_head
from vitdense.metrics.common import LossMeans
from vitdense.models.classification import ImageClassifier
from vitdense.tasks.predicting import PredictsResults
from vitdense.tasks.pretrained import PretrainedBackbone, PretrainedLoaded
from vitdense.tasks.running import RunsOnTrainer
from vitdense.training.callbacks import task_callbacks
from vitdense.training.optim import (
    DEFAULT_LR_SCHEDULER,
    DEFAULT_OPTIMIZER,
    optimizer_config,
    param_groups,
    resolve_schedules,
)
from vitdense.types import ImageSizes, Losses

Stage = Literal["train", "val", "test", "predict"]
STAGES = ("train", "val", "test")


class BaseTask(PredictsResults, RunsOnTrainer, PretrainedBackbone, L.LightningModule):
    """Shared spine of every vitdense task.

    Args:
        num_classes: K (linked from the DataModule by the CLI).
        head: `head(in_features, num_classes)` -> the head module (YAML: `class_path` +
            `init_args`); built by `configure_head`.
        class_names: names of the K classes (linked from the DataModule); default "0".."K-1".
        backbone: how to build and train the encoder (`BackboneConfig`).
        optimizer: callable making the optimizer from parameter groups (YAML: class_path).
        lr_scheduler: callable making the schedule from the optimizer (`vitdense.training.optim`).
        lr_interval: step the schedule every optimizer "step" or every "epoch" (its unit).
        compile: compile the backbone and the head with `torch.compile` when the trainer
            sets the model up (True, or a dict of `torch.compile`'s arguments, e.g.
            `{mode: max-autotune}` or `{backend: aot_eager}`); each is compiled in place,
            so checkpoints keep their keys. Where torch cannot compile (no TorchDynamo for
            this Python, or no C++ compiler for inductor on a CPU) it warns and runs eager.
    """

    #: metric that model selection and checkpointing watch, and in which direction
    monitor: ClassVar[str] = "val/loss"
    mode: ClassVar[Literal["min", "max"]] = "min"
    #: also update and log the metrics on training batches (off: evaluation metrics only)
    log_train_metrics: ClassVar[bool] = False
    #: settings (constructor arguments) that may differ from a checkpoint's at validate, test
    #: and predict, where the user's value wins: how the model is evaluated and run, not what
    #: it is (`python -m vitdense test --ckpt_path … --model.init_args.<name> …`); the CLI
    #: refuses a different value for any other setting the checkpoint recorded
    evaluation_settings: ClassVar[tuple[str, ...]] = ("compile",)

    def __init__(
        self,
        num_classes: int,
        head: HeadFactory,
        class_names: list[str] | None = None,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
        lr_interval: Literal["step", "epoch"] = "step",
        compile: bool | dict[str, Any] = False,
    ) -> None:
        super().__init__()
        # the subclass's arguments too; callables from YAML need not pickle (the CLI's config.yaml records them)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        if class_names is not None and len(class_names) != num_classes:
            raise ConfigError(f"class_names has {len(class_names)} entries for num_classes={num_classes}")
        self.num_classes = num_classes
        self.class_names = list(class_names) if class_names is not None else [str(c) for c in range(num_classes)]
        self.optimizer, self.lr_scheduler, self.lr_interval = optimizer, lr_scheduler, lr_interval
        #: torch.compile's arguments, or None: not compiled
        self.compile_options: dict[str, Any] | None = None if not compile else {} if compile is True else dict(compile)
        self.backbone_config = backbone
        encoder = self.configure_backbone(backbone)
        head = head_factory(head)
        #: the plain model (`vitdense.models`) that this task trains, callable without Lightning
        self.model: nn.Module = self.build_model(encoder, self.configure_head(head, encoder))
        missing = [name for name in ("backbone", "head") if not isinstance(getattr(self.model, name, None), nn.Module)]
        if missing:  # (read by parameter groups, freezing, layer decay, checkpoints and load_model)
            raise ConfigError(
                f"{type(self).__name__}.build_model returned a {type(self.model).__name__} without "
                f"{' and '.join(missing)}: the task's model must expose its encoder as .backbone and its head as .head"
            )
        self.track_pretrained()
        record_head(self.hparams, head)
        #: the head's factory as plain data (None: not a class or a partial of one), for `record_model`
        self.head_spec = HeadSpec.of(head)
        self.build_metrics()

    def build_metrics(self) -> None:
        """Each stage's metrics from `configure_metrics` (prefixed `train/`, `val/`, `test/`);
        a task that learns what to measure only from its data calls it again in `setup`."""
        metrics = self.configure_metrics()
        self.train_metrics, self.val_metrics, self.test_metrics = (metrics.clone(prefix=f"{s}/") for s in STAGES)

    # ------------------------------------------------------------------ hooks to override
    def configure_backbone(self, config: BackboneConfig) -> VisionTransformer:
        """The encoder (a `pretrained` one without its hub weights: `vitdense.tasks.pretrained`)."""
        return config.build(load_pretrained=False)

    def configure_head(self, head: HeadFactory, backbone: VisionTransformer) -> nn.Module:
        """The head from its factory, for `backbone` (`self.num_classes` exists by now); a
        head with `set_grad_checkpointing` (timm's name) follows the backbone's setting, and
        one with `init_for_backbone(pretrained)` is told whether the backbone starts from
        pre-trained weights (`ClassificationHead` zero-initialises only then)."""
        module = head(backbone.embed_dim, self.num_classes)
        follow_pretrained_start(module, self.backbone_config)
        return follow_grad_checkpointing(module, backbone)

    def build_model(self, backbone: VisionTransformer, head: nn.Module) -> nn.Module:
        """The plain `nn.Module` of the task (backbone, head and the task's own pre- and
        post-processing) that becomes `self.model`; it must expose `backbone` and `head`.
        Default: `ImageClassifier` (images -> head output)."""
        return ImageClassifier(backbone, head)

    @property
    def backbone(self) -> VisionTransformer:
        return self.model.backbone

    @property
    def head(self) -> nn.Module:
        return self.model.head

    def configure_metrics(self) -> MetricCollection:
        """The metrics of one stage; the base keeps a copy per stage, prefixed `train/` etc."""
        return MetricCollection({})

    def forward_batch(self, batch: Any, stage: Stage) -> Any:
        """Task output for a batch (override to use more of the batch than its images, or
        to behave differently per stage)."""
        return self(batch.image, getattr(batch, "image_sizes", None))

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
        """[H, W, 3] uint8 pictures of the predictions on a validation `batch` (on the model's
        device) beside its truth, for `vitdense.viz.callbacks.ValidationImages` (under no_grad,
        in eval mode). `pixels`: its images un-normalised, [h, w, 3] uint8 each at its own size;
        `palette`: [K, 3] uint8 class colours. `vitdense.core.draw` has the pieces. Default: none."""
        return []

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> Any:
        """The model's output for images [B, 3, H, W] padded as `image_sizes` says."""
        return self.model(images, image_sizes)

    def plain_inference(self) -> Any | None:
        """How this task's model predicts without the task, as a dataclass of plain settings
        (`vitdense.models`: `build(backbone, head)`, `sample(image, size, index)`,
        `predict(model, batch)`, `result_type`), recorded in checkpoints so that
        `vitdense.load`, `serve` and `export` rebuild the model without Lightning
        (`vitdense.deploy.checkpoint.record_model`). Each built-in task declares its own; only a
        class that declares it itself is recorded (a subclass may predict otherwise), and a
        task without one is restored through Lightning. Default: None."""
        return None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # a fit from Python names the task's and the data's classes as the CLI does: the checkpoint loads alone
        datamodule = self._trainer.datamodule if self._trainer is not None else None
        record_class_paths(checkpoint, self, datamodule)
        record_inference(checkpoint, datamodule)  # what vitdense.load, serve and export build from
        record_model(checkpoint, self)  # ... and the plain model they run, without this class

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        own = self.state_dict()
        checkpoint["state_dict"] = under_model(checkpoint.get("state_dict", {}), own)  # older keys
        # resuming a fit: its optimizer state must fit the groups configure_optimizers will build, said here before
        # Lightning restores it (left alone: a subclass's own configure_optimizers; weights that do not fit, which
        # Lightning reports next, naming their keys)
        resuming = self._trainer is not None and self.trainer.state.fn == TrainerFn.FITTING
        if resuming and type(self).configure_optimizers is BaseTask.configure_optimizers:
            if set(checkpoint["state_dict"]) == set(own):
                sizes = [len(group["params"]) for group in self.param_groups()]
                refuse_other_optimizer_groups(checkpoint, sizes, self.trainer.ckpt_path)

    def param_groups(self) -> list[dict]:
        """Optimizer parameter groups; a group's `lr_scale` multiplies the optimizer's rate."""
        cfg = self.backbone_config
        return param_groups(self.backbone, self.head, cfg.lr_scale, cfg.layer_decay)

    # ------------------------------------------------------------------------ the loop
    def metrics_of(self, stage: Stage) -> MetricCollection | None:
        """The stage's metric collection, or None where the stage keeps none."""
        kept = {"train": self.train_metrics, "val": self.val_metrics, "test": self.test_metrics}
        return None if stage == "train" and not self.log_train_metrics else kept.get(stage)

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

    def _end_epoch(self, stage: Stage) -> None:
        """Compute, log and reset a stage's metrics (and evaluation losses) once per epoch."""
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

    def on_train_epoch_end(self) -> None:
        self._end_epoch("train")

    def on_validation_epoch_end(self) -> None:
        self._end_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._end_epoch("test")

    def configure_callbacks(self) -> list[L.Callback]:
        """Skipped-sample counts, resume RNG state, the task's own prediction writer (see
        `vitdense.training.callbacks.task_callbacks`), and the check that pretrained weights were
        loaded (`PretrainedLoaded`). (vitdense's `Trainer` adds the pictures.)"""
        if self._trainer is None:
            return []
        return [*task_callbacks(self._trainer, self.prediction_writer), PretrainedLoaded()]

    # ------------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> dict:
        groups = self.param_groups()
        return optimizer_config(self.optimizer, self.lr_scheduler, groups, self.lr_interval, self.monitor)

    def on_train_start(self) -> None:
        # lengths from the trainer, here rather than in configure_optimizers: the train loader exists by
        # now (restored to its position when resuming); asking earlier would build it before its state loads
        resolve_schedules(self.trainer)


def follow_pretrained_start(module: nn.Module, config: BackboneConfig) -> nn.Module:
    """`module` (a head), initialised for a backbone that starts from pre-trained weights or
    from scratch, when it has `init_for_backbone` (the backbone itself is still random here:
    hub weights arrive in `setup`, so the config says which case it is)."""
    if hasattr(module, "init_for_backbone"):
        module.init_for_backbone(config.starts_pretrained)
    return module


def follow_grad_checkpointing(module: nn.Module, backbone: VisionTransformer) -> nn.Module:
    """`module` (a head), recomputing its blocks in backward too when the backbone does and
    it can (`set_grad_checkpointing`, timm's name)."""
    if backbone.grad_checkpointing and hasattr(module, "set_grad_checkpointing"):
        module.set_grad_checkpointing(True)
    return module
